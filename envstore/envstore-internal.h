/* envstore/ internals shared by its files. */
#ifndef MPS_ENVSTORE_INTERNAL_H
#define MPS_ENVSTORE_INTERNAL_H

#include <dirent.h>
#include <sys/stat.h>

#include "envstore/envstore.h"
#include "pystd/pystd.h"

/* 2: environments copied out of the build's space by the server, with built_by. */
#define ENV_FORMAT 2
#define ENV_MANIFEST "mps-manifest.json"
#define ENV_MANIFEST_MAX (1u << 20)
/* What a new manifest holds of the package list (printed by the inspect step, where a .pth
 * of the build runs first) and of the requested list: every listing of the store reads the
 * manifests it has not read yet, on the loop. */
#define ENV_MANIFEST_PART_MAX (64u << 10)
#define ENV_TARGET "/env"
#define ENV_CACHE_TARGET "/cache"
#define ENV_WHEELS_TARGET "/wheels"
#define ENV_LOCK_RETRY_MS 200
#define ENV_STEP_OUTPUT_TAIL (64u << 10)
#define ENV_PROGRESS_LINE_MAX 2048
#define ENV_MAX_FIND_LINKS 16
/* A file, directory or symlink counts as at least this much against --max-build-bytes
 * (and files are rounded up to it): empty files cost inodes too. */
#define ENV_BLOCK 4096u
#define ENV_COPY_DEPTH_MAX 128
/* Files in bin/ the copy rewrites for backends that do not map /env (shebangs). */
#define ENV_RELOCATE_MAX (1u << 20)
/* A space with less free than this after a failed step was filled by it. */
#define ENV_SPACE_FULL_BYTES (1u << 20)
#define ENV_WHEELHOUSE "wheels"
/* In the state directory (which no sandbox ever sees): downloads/ was emptied of what
 * versions before the wheelhouse left there (a cache every build could write). */
#define ENV_DOWNLOADS_MARK ".downloads-format-2"

typedef struct env_waiter env_waiter_t;
typedef struct env_build env_build_t;

struct env_waiter {
  env_store_t *store;
  env_build_t *build; /* NULL once answered */
  env_ready_cb cb;
  env_progress_cb progress;
  void *data;
  char *owner;       /* the principal asking, or NULL */
  env_handle_t *hit; /* the answer, queued for the loop */
  cm_error_t error;  /* or why there is none */
  bool cancelled;
  env_waiter_t *next;
};

/* A build's (warm-up's, resolution's) own bounded space; see the top of the file. */
typedef struct env_space {
  char *dir;  /* <runs>/<kind>-XXXXXX */
  char *name; /* its last component */
  bool mounted;
  int fd; /* dir, for fstatvfs */
  char *env, *work, *cache, *tmp;
} env_space_t;

typedef enum build_step {
  STEP_VENV = 0,
  STEP_INSTALL,
  STEP_INSPECT,
  STEP_COPY,
  STEP_DONE
} build_step_t;

struct env_build {
  env_store_t *store;
  char *key;
  char *final_dir, *lock_path;
  char *copy_name; /* .staging-<key>-<pid>-<n> in envs/, while the copy exists */
  int lock_fd;
  py_interp_t py; /* a copy of what is needed (the registry entry outlives us anyway) */
  char **requirements;
  size_t n_requirements;
  bool pinned;     /* every requirement is ==version or a URL */
  char *uv_config; /* the script's [tool.uv] table as TOML, or NULL */
  char *owner;     /* the principal the build is made for, or NULL */
  build_step_t step;
  env_space_t space;
  sbx_identity_t *identity;
  sbx_run_t *run;
  sbx_call_t *copy;
  cm_headtail_t output; /* the current step's output, for error messages */
  cm_buf_t line;        /* a partial output line, for progress */
  cm_buf_t inspect;     /* STEP_INSPECT's stdout */
  cm_timer_t *lock_retry;
  bool said_waiting;
  env_waiter_t *waiters;
  uint64_t started_ms;
  env_build_t *next;
};

/* A tree being removed by a child (an evicted or replaced environment, a space on disk). */
typedef struct env_removal {
  env_store_t *store;
  int dir_fd; /* the parent */
  char *name;
  sbx_call_t *call;
  struct env_removal *next;
} env_removal_t;

struct env_store {
  cm_loop_t *loop;
  env_options_t opts; /* strings and vectors are the server's */
  sbx_backend_t *backend;
  char *state_dir, *envs_dir, *downloads_dir, *wheels_dir, *runs_dir;
  int state_fd, envs_fd, wheels_fd, runs_fd;
  char *uv; /* resolved uv path when the installer is uv */
  char *installer_desc;
  env_build_t *builds;
  env_waiter_t *answers; /* answered waiters, for the loop to call back */
  bool answers_scheduled;
  env_removal_t *removals;
  struct warm_job *warm;
  struct resolve_job *resolves; /* running dry-run resolutions */
  unsigned resolving;
  bool closing;
  unsigned serial;
  bool warned_uncapped; /* said once that build spaces are not size-capped */
  env_counters_t counters;
  /* Index settings and builds' network (env_index_settings(), build_net_prepare()). */
  env_network_t net; /* what the server gave (env_store_set_network), or all NULL */
  bool index_loaded;
  char *index_url;                       /* effective, with credentials; NULL = the default */
  char **extra_index_urls, **find_links; /* effective */
  bool build_net_prepared, build_net_ok; /* builds go through the egress proxy */
  char *b_index_url;                     /* what builders get: credentialed URLs mapped */
  char **b_extra_index_urls, **b_find_links;
  eg_policy_t build_policy;
  struct installer_net *nets; /* installer runs with a proxy session */
  /* Sizes of the manifests read by list_entries, by name and sorted: a manifest never
   * changes once published (only its time, the last use), so each is parsed once, not at
   * every eviction or check_environment. */
  struct env_known *known;
  size_t n_known;
  /* The last listing of envs/ for the readers a client may call in a loop (the usage and
   * stats of check_environment, list_environments, /metrics): listed again at most every
   * ENV_LISTING_MS, or when this process changed envs/ (listing_at_ms = 0 then). */
  struct entry_list *listing;
  uint64_t listing_at_ms;
  bool listing_wheels; /* (with the wheelhouse's wheels) */
  /* A listing older than ENV_LISTING_MS is made again by the background worker (cm_bg_run),
   * while the readers keep the old one: a store of 10,000 environments costs the event loop
   * no directory read.  listing_gen counts this process's changes to envs/: a background
   * listing begun before one is dropped. */
  struct env_lister *lister;
  unsigned listing_gen;
};

/* ---------------------------------------------------------------- the copy (in a child) */

typedef struct env_copy {
  int src_fd;           /* the space's env/ */
  int dst_parent_fd;    /* envs/ */
  const char *dst_name; /* .staging-... */
  uint64_t max_bytes;
  const char *reloc_from, *reloc_to; /* host paths, for backends that do not map /env */
  uint64_t total;
} env_copy_t;

static inline bool env_backend_maps(env_store_t *s) {
  return sbx_backend_maps_paths(s->backend);
}

/* space.c */
DIR *env_list_dir(int fd);
void env_removal_free(env_removal_t *r);
void env_remove_later(env_store_t *s, int dir_fd, const char *name);
void env_discard(env_store_t *s, int dir_fd, const char *name, const char *kind);
void env_space_init(env_space_t *sp);
void env_space_remove(env_store_t *s, env_space_t *sp);
int env_space_make(env_store_t *s, const char *kind, bool with_env, env_space_t *sp,
                   cm_error_t *err);
bool env_space_full(const env_space_t *sp, const char *output);
char *env_bound_message(env_store_t *s, const env_space_t *sp, const sbx_result_t *res,
                        const char *tail);

/* wheelhouse.c */
bool env_wheel_name_ok(const char *name);
void env_clean_downloads(env_store_t *s);

/* key.c */
bool env_requirement_pinned(const char *req);
char *env_key(env_store_t *s, const py_interp_t *py, char *const *reqs, size_t n,
              const char *uv_config);

/* manifest.c */
json_t *env_load_manifest(env_store_t *s, const char *key, bool pinned, bool touch,
                          struct stat *st_out);
env_handle_t *env_handle_open(env_store_t *s, const char *key, bool pinned, bool cached);

/* installer.c */
void env_index_settings(env_store_t *s);
char *env_redacted_join(char *const *urls);
void env_index_args(env_store_t *s, bool uv, bool wheelhouse, cm_strv_builder_t *a);
void env_installer_release(env_store_t *s);
/* When output (an installer's) says the index's host could not be resolved or reached: one
 * short paragraph, which index and what to do (a wheelhouse with --find-links DIR --offline, a
 * private index).  Heap; NULL when it says nothing of the kind. */
char *env_unreachable_message(env_store_t *s, const char *output);
/* When output says the interpreter (executable) has no pip and pip ran (a resolution, or a
 * build without uv): what to install.  Heap; NULL otherwise. */
char *env_no_pip_message(env_store_t *s, bool resolving, const char *executable,
                         const char *output);
int env_start_installer_run(env_store_t *s, const char *prefix, char **argv, const env_space_t *sp,
                            const sbx_identity_t *identity, const sbx_run_callbacks_t *cbs,
                            void *data, sbx_run_t **run, cm_error_t *err);

/* copy.c */
int env_copy_run(void *arg, cm_buf_t *out, cm_error_t *err);

/* build.c */
void env_build_free(env_build_t *b);

/* manifest.c: a finished environment's manifest, if it is one of ours (a regular file of the
 * server's own, not too big, for this key), and its status; with fd_out, its open file (the
 * caller closes it).  Touches nothing of a store's: the background listing reads with it. */
json_t *env_manifest_read(int envs_fd, const char *key, struct stat *st_out, int *fd_out);

/* evict.c */
void env_known_release(struct env_known *v, size_t n);
/* Frees the kept listing (env_store_free), and lets go of a background listing. */
void env_listing_free(env_store_t *s);
/* This process changed envs/: the kept listing (and one being made) is stale. */
void env_listing_changed(env_store_t *s);
/* Starts a listing in the background (the store's start: the readers find one ready). */
void env_listing_prime(env_store_t *s);
void env_evict(env_store_t *s);

/* warm.c */
void env_warm_free(struct warm_job *w);

/* resolve.c */
void env_resolve_free(struct resolve_job *j);

#endif
