/* The environment store: requirement sets resolved into cached, immutable virtual
 * environments, built once (in the sandbox) and mounted read-only into runs.
 *
 * Layout under <state>/envs/:
 *   <key>/                 a finished environment (a venv) with mps-manifest.json
 *   <key>.lock             flock: exclusive while building, shared while a run uses it
 *   .staging-<key>-<pid>-<n>/   a build in progress (never used; removed if left over)
 * and <state>/downloads/ (the installers' download cache, shared by builds).
 *
 * The key is a SHA-256 over the interpreter identity, the normalised sorted requirements,
 * the installer and the index settings.  A build is renamed into place only when it
 * succeeded, so a crash, a kill or a full disk never leaves an environment that is used. */
#ifndef MPS_SERVER_ENVCACHE_H
#define MPS_SERVER_ENVCACHE_H

#include "server/script.h"

typedef struct env_store env_store_t; /* struct env_store, also named in srv.h */

/* A ready environment, held for the duration of a run (env_release). */
typedef struct env_handle {
  char *key;
  char *host_dir;     /* <state>/envs/<key> */
  char *python;       /* the interpreter as the sandbox sees it (/env/bin/python or host path) */
  char *mount_target; /* where the sandbox sees host_dir ("/env"), or NULL when paths are not mapped */
  bool cached;        /* a hit: nothing was built for this call */
  json_t *packages;   /* {"name": "version"} as installed */
  int lock_fd;        /* shared flock on <key>.lock while in use */
} env_handle_t;

typedef void (*env_ready_cb)(void *data, env_handle_t *env, const char *error);
typedef void (*env_progress_cb)(void *data, const char *message, size_t len);

env_store_t *env_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir,
                           sbx_backend_t *backend);
/* Where builds, warm-ups and resolutions make their work directories (default
 * <state>/work): the server's own directory there, which the next server removes even after
 * a crash. */
void env_store_set_work_dir(env_store_t *s, const char *dir);
/* Finds or builds the environment for (py, requirements).  uv_config is the script's
 * [tool.uv] table as TOML text (part of the key; handed to uv with --config-file), or NULL.  cb runs exactly once (never
 * from inside this call) with the environment or an error message a model can act on
 * (the installer's own words).  progress may be NULL.  Returns a handle for
 * env_store_cancel (which stops the callbacks; a shared build goes on for the others). */
void *env_store_ensure(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                       const char *uv_config, env_ready_cb cb, env_progress_cb progress, void *data);
void env_store_cancel(env_store_t *s, void *handle);
void env_release(env_handle_t *env);
/* A copy of the handle's description that holds no lock: the environment may be evicted
 * or rebuilt meanwhile (compare the directory's identity before relying on it). */
env_handle_t *env_handle_copy_unlocked(const env_handle_t *env);
/* The installer in use ("pip" or "uv <path>") for check_environment. */
const char *env_store_installer(env_store_t *s);
/* Number of finished environments and their total size. */
void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes);
/* Starts warming the package cache from profiles/warmup.txt in the background (never
 * delays anything; failures are logged). */
void env_store_warm(env_store_t *s, const py_interp_t *py, const char *warmup_file);
/* A dry-run resolution (pip install --dry-run --report) with the server's index settings,
 * for validate_script: cb gets {"name": "version"} of everything that would be installed,
 * or an error.  Returns NULL (and never calls cb) if it could not even start. */
typedef void (*env_resolved_cb)(void *data, json_t *resolved, const char *error);
void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        env_resolved_cb cb, void *data);
void env_store_cancel_resolve(env_store_t *s, void *handle);
void env_store_free(env_store_t *s);

#endif
