/* The environment store (see envcache.h).
 *
 * What a build may touch, and what the server touches of it.  A build (and a warm-up, a
 * dry-run resolution) gets a space of its own: <runs>/build-XXXXXX with env/ (the venv
 * being built, /env in the sandbox), work/ (its cwd), cache/ (a private, empty download
 * cache) and tmp/ (its /tmp), all on one size-capped tmpfs of its own when the server is
 * root (--max-build-bytes: a build that writes more gets ENOSPC), on disk otherwise (each
 * file bounded by RLIMIT_FSIZE).  Every step of a build runs as one fresh uid of its own
 * (sbx_identity_t) in a cgroup of its own per step.  Nothing another build reads is
 * writable by it: the only thing builds share is the wheelhouse (<state>/downloads/wheels),
 * which only the server writes (binary wheels the warm-up downloaded: no package code ran
 * to make them) and builds see read-only.
 *
 * The server never works inside a space on the event loop: once the last step is over
 * (every process of the sandbox is gone), a forked child (sbx_call) copies the environment
 * out of the space into <state>/envs/.staging-<key>-<pid>-<n>, a tree the server made and
 * owns (regular files, directories and symlinks only, never following one; a FIFO, socket
 * or device fails the build; set-id bits gone; the total bounded).  The manifest is then
 * written into that copy and the copy renamed into place; the space is dropped with its
 * tmpfs.  Big removals (an evicted environment, a space on disk) run in such a child too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "server/envcache.h"
#include "server/network.h"
#include "pystd/pystd.h"
#include "server/server-internal.h"

extern char **environ;

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
  env_handle_t *hit; /* the answer, queued for the loop */
  char *error;
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
  const srv_config_t *cfg;
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
  /* Index settings and builds' network (index_settings(), build_net_prepare()). */
  struct srv_network *network;
  bool index_loaded;
  char *index_url;                         /* effective, with credentials; NULL = the default */
  char **extra_index_urls, **find_links;   /* effective */
  bool build_net_prepared, build_net_ok;   /* builds go through the egress proxy */
  char *b_index_url;                       /* what builders get: credentialed URLs mapped */
  char **b_extra_index_urls, **b_find_links;
  eg_policy_t build_policy;
  struct installer_net *nets;              /* installer runs with a proxy session */
  /* Sizes of the manifests read by list_entries, by name and sorted: a manifest never
   * changes once published (only its time, the last use), so each is parsed once, not at
   * every eviction or check_environment. */
  struct env_known *known;
  size_t n_known;
};

/* ---------------------------------------------------------------- small helpers */

static bool backend_maps(env_store_t *s) {
  return sbx_backend_maps_paths(s->backend);
}

static char **split_spaces(const char *s) {
  size_t n = 0, cap = 4;
  char **v = xcalloc(cap + 1, sizeof *v);
  if (!s) return v;
  cleanup_free char *copy = xstrdup(s);
  char *save = NULL;
  for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    if (n == cap) {
      cap *= 2;
      v = xrealloc(v, (cap + 1) * sizeof *v);
    }
    v[n++] = xstrdup(t);
    v[n] = NULL;
  }
  return v;
}

static char *human_bytes(uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0)
    return xasprintf("%lluG", (unsigned long long)(n >> 30));
  if (n >= (1ull << 20) && n % (1ull << 20) == 0)
    return xasprintf("%lluM", (unsigned long long)(n >> 20));
  return xasprintf("%llu bytes", (unsigned long long)n);
}

static bool requirement_pinned(const char *req) {
  pep508_requirement_t *q = NULL;
  if (pep508_requirement_parse(req, strlen(req), &q, NULL) < 0) return false;
  bool pinned = q->url != NULL;
  for (size_t i = 0; i < q->specifiers->len && !pinned; i++) {
    const pep440_clause_t *c = &q->specifiers->clauses[i];
    if ((c->op == PEP440_OP_EQ && !c->wildcard) || c->op == PEP440_OP_ARBITRARY) pinned = true;
  }
  pep508_requirement_free(q);
  return pinned;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The canonical form of a requirement set: rendered (normalised) and sorted. */
static json_t *canonical_requirements(char *const *reqs, size_t n) {
  char **sorted = xcalloc(n + 1, sizeof *sorted);
  for (size_t i = 0; i < n; i++) {
    pep508_requirement_t *q = NULL;
    sorted[i] = pep508_requirement_parse(reqs[i], strlen(reqs[i]), &q, NULL) == 0
                    ? pep508_requirement_render(q)
                    : xstrdup(reqs[i]);
    pep508_requirement_free(q);
  }
  if (n) qsort(sorted, n, sizeof *sorted, cmp_str);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_string(sorted[i]));
  cm_strv_free(sorted);
  return arr;
}

static void index_settings(env_store_t *s);
static char *redacted_join(char *const *urls);

static char *env_key(env_store_t *s, const py_interp_t *py, char *const *reqs, size_t n,
                     const char *uv_config) {
  const srv_config_t *cfg = s->cfg;
  /* The index settings as they are, but never the secret of a credential: a rotated
   * password must not rebuild every environment. */
  index_settings(s);
  cleanup_free char *index_url = s->index_url ? eg_url_redact(s->index_url) : NULL;
  cleanup_free char *extra_index_urls = redacted_join(s->extra_index_urls);
  cleanup_free char *find_links = redacted_join(s->find_links);
  json_t *id =
      json_pack("{s:i, s:{s:s, s:s, s:s, s:b}, s:o, s:s, s:{s:s?, s:s?, s:s?, s:b}}", "format",
                ENV_FORMAT, "python", "executable", py->executable, "version", py->version,
                "implementation", py->implementation, "free_threaded", py->free_threaded,
                "requirements", canonical_requirements(reqs, n), "installer", s->uv ? "uv" : "pip",
                "index", "index_url", index_url, "extra_index_urls", extra_index_urls,
                "find_links", find_links, "offline", cfg->offline);
  if (uv_config) json_object_set_new(id, "tool_uv", json_string(uv_config));
  char *text = json_dumps(id, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(id);
  char hex[65];
  cm_sha256_hex(text, strlen(text), hex);
  free(text);
  return xstrndup(hex, 32);
}

/* A wheel's file name as the warm-up may bring it into the wheelhouse:
 * name-version(-build)?-python-abi-platform.whl in the characters wheel names use. */
static bool wheel_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n < 10 || n > 255 || name[0] == '.' || name[0] == '-' || strcmp(name + n - 4, ".whl") != 0)
    return false;
  size_t dashes = 0;
  for (size_t i = 0; i < n - 4; i++) {
    char c = name[i];
    if (c == '-')
      dashes++;
    else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '+' || c == '!'))
      return false;
  }
  return dashes == 4 || dashes == 5;
}

/* Lists a directory through a new fd of its own: a duplicate would share the offset of
 * fd, left at the end by the last listing. */
static DIR *list_dir(int fd) {
  int dup = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
  DIR *d = dup >= 0 ? fdopendir(dup) : NULL;
  if (!d) {
    if (dup >= 0) close(dup);
    return NULL;
  }
  rewinddir(d);
  return d;
}

/* ---------------------------------------------------------------- removal in a child */

static int remove_in_child(void *arg, cm_buf_t *out, cm_error_t *err) {
  env_removal_t *r = arg;
  return cm_rm_rf_at(r->dir_fd, r->name, err);
}

static void removal_free(env_removal_t *r) {
  for (env_removal_t **p = &r->store->removals; *p; p = &(*p)->next) {
    if (*p == r) {
      *p = r->next;
      break;
    }
  }
  if (r->dir_fd >= 0) close(r->dir_fd);
  free(r->name);
  free(r);
}

static void removal_done(void *data, int rc, const char *text) {
  env_removal_t *r = data;
  r->call = NULL;
  if (rc < 0) cm_warn("removing %s: %s", r->name, text);
  removal_free(r);
}

/* Removes name in dir_fd (renamed there by the caller, never used again) in a child, so a
 * big tree never blocks the loop.  If no child can be had it stays for the next start-up's
 * sweep (names starting with '.') or the next sweep of the work directory. */
static void remove_later(env_store_t *s, int dir_fd, const char *name) {
  if (s->closing) return;
  env_removal_t *r = xcalloc(1, sizeof *r);
  r->store = s;
  r->dir_fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 3);
  r->name = xstrdup(name);
  r->next = s->removals;
  s->removals = r;
  cm_error_t err = CM_ERROR_INIT;
  if (r->dir_fd < 0 || sbx_call_start(s->loop, remove_in_child, r, &r->dir_fd, 1, 0, removal_done,
                                      r, &r->call, &err) < 0) {
    cm_warn("removing %s later: %s", name,
            r->dir_fd < 0 ? strerror(errno) : cm_error_message(&err));
    cm_error_release(&err);
    removal_free(r);
  }
}

/* Moves name in dir_fd aside to a trash name of the envs directory's kind and removes it. */
static void discard(env_store_t *s, int dir_fd, const char *name, const char *kind) {
  cleanup_free char *trash =
      xasprintf(".%s-%s-%d-%u", kind, name[0] == '.' ? name + 1 : name, (int)getpid(), s->serial++);
  if (renameat(dir_fd, name, dir_fd, trash) < 0) {
    if (errno != ENOENT) cm_warn("moving %s aside: %s", name, strerror(errno));
    return;
  }
  remove_later(s, dir_fd, trash);
}

/* ---------------------------------------------------------------- spaces */

static void space_init(env_space_t *sp) {
  memset(sp, 0, sizeof *sp);
  sp->fd = -1;
}

static void space_remove(env_store_t *s, env_space_t *sp) {
  if (!sp->dir) return;
  if (sp->fd >= 0) close(sp->fd);
  sp->fd = -1;
  if (sp->mounted) {
    /* The tmpfs goes with everything in it; the mount point is left empty. */
    if (umount2(sp->dir, MNT_DETACH) < 0) cm_warn("unmounting %s: %s", sp->dir, strerror(errno));
    if (rmdir(sp->dir) < 0 && errno != ENOENT) cm_warn("removing %s: %s", sp->dir, strerror(errno));
  } else if (!s->closing) {
    remove_later(s, s->runs_fd, sp->name); /* on disk: as big as the build made it */
  } /* closing: the server's directory goes as a whole (srv_workdir_release) */
  free(sp->dir);
  free(sp->env);
  free(sp->work);
  free(sp->cache);
  free(sp->tmp);
  space_init(sp);
}

/* Makes a space for one build (with_env), warm-up or resolution. */
static int space_make(env_store_t *s, const char *kind, bool with_env, env_space_t *sp,
                      cm_error_t *err) {
  space_init(sp);
  sp->dir = xasprintf("%s/%s-XXXXXX", s->runs_dir, kind);
  if (!mkdtemp(sp->dir)) {
    int e = errno;
    free(sp->dir);
    sp->dir = NULL;
    return cm_error_set(err, e, CM_ERR_IO, "creating a directory for the build");
  }
  sp->name = strrchr(sp->dir, '/') + 1;
  uint64_t bytes = s->cfg->max_build_bytes;
  if (geteuid() == 0) {
    cm_error_t merr = CM_ERROR_INIT;
    static bool warned;
    if (srv_space_mount(sp->dir, bytes, CM_MAX(bytes / 16384, 8192), &merr) == 0) {
      sp->mounted = true;
    } else {
      if (!warned) cm_warn("build spaces are not size-capped: %s", cm_error_message(&merr));
      warned = true;
      cm_error_release(&merr);
    }
  }
  sp->fd = open(sp->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sp->fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "open %s", sp->dir);
  sp->work = xasprintf("%s/work", sp->dir);
  sp->cache = xasprintf("%s/cache", sp->dir);
  sp->tmp = xasprintf("%s/tmp", sp->dir);
  if (with_env) sp->env = xasprintf("%s/env", sp->dir);
  const char *parts[] = {sp->work, sp->cache, sp->tmp, sp->env};
  for (size_t i = 0; i < CM_ARRAY_SIZE(parts); i++)
    if (parts[i] && mkdir(parts[i], 0700) < 0)
      return cm_error_set(err, errno, CM_ERR_IO, "creating %s", parts[i]);
  return 0;
}

/* Whether a failed step ran out of the space's bytes. */
static bool space_full(const env_space_t *sp, const char *output) {
  if (output && strstr(output, "No space left on device")) return true;
  struct statvfs v;
  return sp->mounted && sp->fd >= 0 && fstatvfs(sp->fd, &v) == 0 &&
         ((uint64_t)v.f_bavail * v.f_frsize < ENV_SPACE_FULL_BYTES || v.f_favail == 0);
}

/* ---------------------------------------------------------------- manifests and handles */

/* A finished environment's manifest, if it is one of ours (a regular file of the server's
 * own, not too big, for this key) and, for unpinned requirements, not too old to reuse.
 * With touch, its time is set to now: the last use, for eviction.  st gets the manifest's
 * status (before the touch). */
static json_t *load_manifest(env_store_t *s, const char *key, bool pinned, bool touch,
                             struct stat *st_out) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(s->envs_fd, key, &err);
  struct stat st;
  cleanup_close int fd = dfd < 0 ? -1
                                 : cm_open_regular_at(dfd, ENV_MANIFEST, O_RDONLY, geteuid(),
                                                      ENV_MANIFEST_MAX, &st, &err);
  if (fd < 0) {
    if (err.kind != CM_ERR_NOT_FOUND) cm_warn("environment %s: %s", key, cm_error_message(&err));
    cm_error_release(&err);
    return NULL;
  }
  cleanup_free char *text = xmalloc((size_t)st.st_size + 1);
  size_t len = 0;
  while (len < (size_t)st.st_size) {
    ssize_t n = read(fd, text + len, (size_t)st.st_size - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  json_t *m = json_loadb(text, len, 0, NULL);
  if (!json_is_object(m) || strcmp(json_string_value(json_object_get(m, "key")) ?: "", key) != 0) {
    json_decref(m);
    return NULL;
  }
  if (!pinned && s->cfg->env_max_age_ms) {
    json_int_t created = json_integer_value(json_object_get(m, "created"));
    if ((uint64_t)time(NULL) * 1000 > (uint64_t)created * 1000 + s->cfg->env_max_age_ms) {
      cm_info(
          "environment %s has unpinned requirements and is older than its maximum age: "
          "re-resolving",
          key);
      json_decref(m);
      return NULL;
    }
  }
  if (st_out) *st_out = st;
  if (touch) (void)futimens(fd, NULL);
  return m;
}

/* A handle on a finished environment, or NULL when there is none to use: the shared lock
 * comes first (another server's eviction or rebuild holds it exclusively while it renames
 * the directory away), then the manifest is read again under it. */
static env_handle_t *handle_open(env_store_t *s, const char *key, bool pinned, bool cached) {
  cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, key);
  cleanup_close int lock_fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    cm_warn("environment %s: open %s: %s", key, lock, strerror(errno));
    return NULL;
  }
  if (flock(lock_fd, LOCK_SH | LOCK_NB) < 0) {
    cm_debug("environment %s is locked by another server: not a hit", key);
    return NULL;
  }
  json_t *m = load_manifest(s, key, pinned, true, NULL);
  if (!m) return NULL;
  env_handle_t *h = xcalloc(1, sizeof *h);
  h->key = xstrdup(key);
  h->host_dir = xasprintf("%s/%s", s->envs_dir, key);
  h->mount_target = backend_maps(s) ? xstrdup(ENV_TARGET) : NULL;
  h->python = xasprintf("%s/bin/python", h->mount_target ? h->mount_target : h->host_dir);
  h->cached = cached;
  json_t *pk = json_object_get(m, "packages");
  h->packages = json_is_object(pk) ? json_incref(pk) : json_object();
  json_decref(m);
  h->lock_fd = steal_fd(&lock_fd);
  return h;
}

env_handle_t *env_handle_copy_unlocked(const env_handle_t *env) {
  env_handle_t *h = xcalloc(1, sizeof *h);
  h->key = xstrdup(env->key);
  h->host_dir = xstrdup(env->host_dir);
  h->python = xstrdup(env->python);
  h->mount_target = env->mount_target ? xstrdup(env->mount_target) : NULL;
  h->cached = env->cached;
  h->packages = json_incref(env->packages);
  h->lock_fd = -1;
  return h;
}

void env_release(env_handle_t *h) {
  if (!h) return;
  if (h->lock_fd >= 0) close(h->lock_fd);
  free(h->key);
  free(h->host_dir);
  free(h->python);
  free(h->mount_target);
  json_decref(h->packages);
  free(h);
}

/* ---------------------------------------------------------------- waiters */

static void flush_answers(void *data) {
  env_store_t *s = data;
  s->answers_scheduled = false;
  while (s->answers) {
    env_waiter_t *w = s->answers;
    s->answers = w->next;
    if (!w->cancelled)
      w->cb(w->data, w->hit, w->hit ? NULL : w->error);
    else
      env_release(w->hit);
    free(w->error);
    free(w);
  }
}

/* Every answer goes through here and reaches its callback from the loop, never from inside
 * the call that produced it (env_store_ensure keeps its promise whatever path answers). */
static void answer(env_waiter_t *w, env_handle_t *env, const char *error) {
  env_store_t *s = w->store;
  w->build = NULL;
  w->hit = env;
  /* Valid UTF-8 whatever the build made: an error may name its files (a JSON string of
   * anything else would leave the call without an answer). */
  if (!error) error = "The environment could not be built.";
  size_t n;
  w->error = env ? NULL : cm_utf8_sanitize(error, strlen(error), &n);
  w->next = NULL;
  env_waiter_t **p = &s->answers;
  while (*p) p = &(*p)->next;
  *p = w;
  if (!s->answers_scheduled) {
    s->answers_scheduled = true;
    cm_loop_defer(s->loop, flush_answers, s);
  }
}

static void build_progress(env_build_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void build_progress(env_build_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *msg = xvasprintf(fmt, ap);
  va_end(ap);
  for (env_waiter_t *w = b->waiters; w; w = w->next)
    if (!w->cancelled && w->progress) w->progress(w->data, msg, strlen(msg));
}

/* ---------------------------------------------------------------- building */

static void build_next_step(env_build_t *b);
static void add_uv_config(env_build_t *b, cm_strv_builder_t *a);

static void build_free(env_build_t *b) {
  env_store_t *s = b->store;
  for (env_build_t **p = &s->builds; *p; p = &(*p)->next) {
    if (*p == b) {
      *p = b->next;
      break;
    }
  }
  cm_timer_cancel(b->lock_retry);
  if (b->run) sbx_run_free(b->run);
  sbx_call_free(b->copy);
  if (b->copy_name) discard(s, s->envs_fd, b->copy_name, "trash"); /* a copy never published */
  space_remove(s, &b->space);
  sbx_identity_free(b->identity); /* after the run: nothing of it is left */
  if (b->lock_fd >= 0) close(b->lock_fd);
  free(b->key);
  free(b->final_dir);
  free(b->copy_name);
  free(b->lock_path);
  free(b->py.executable);
  free(b->py.version);
  free(b->py.implementation);
  free(b->py.prefix);
  cm_strv_free(b->requirements);
  free(b->uv_config);
  free(b->owner);
  cm_headtail_release(&b->output);
  cm_buf_release(&b->line);
  cm_buf_release(&b->inspect);
  free(b);
}

/* Ends the build with an error for every waiter. */
static void build_fail(env_build_t *b, const char *error) {
  env_waiter_t *w = b->waiters;
  b->waiters = NULL;
  build_free(b);
  while (w) {
    env_waiter_t *next = w->next;
    answer(w, NULL, error);
    w = next;
  }
}

/* Ends the build with the finished environment (published here or by another server) for
 * every waiter.  We hold the key's lock exclusively; each waiter's handle needs it shared,
 * so ours becomes shared first (not atomically: should another server take it in between,
 * the handles find that and the waiters get an error rather than a vanishing environment). */
static void build_ready(env_build_t *b, bool cached) {
  env_store_t *s = b->store;
  bool shared = flock(b->lock_fd, LOCK_SH | LOCK_NB) == 0;
  env_waiter_t *w = b->waiters;
  b->waiters = NULL;
  cleanup_free char *key = xstrdup(b->key);
  bool pinned = b->pinned;
  while (w) {
    env_waiter_t *next = w->next;
    env_handle_t *h = shared ? handle_open(s, key, pinned, cached) : NULL;
    answer(w, h,
           "The environment was removed by another server as it became ready; please try again.");
    w = next;
  }
  build_free(b);
}

static char *output_tail(env_build_t *b) {
  cleanup_free char *head = NULL, *tail = NULL;
  size_t hl, tl;
  cm_headtail_get(&b->output, &head, &hl, &tail, &tl);
  cm_buf_t out;
  cm_buf_init(&out, 0);
  cm_buf_append(&out, head, hl);
  if (tl) {
    cm_buf_appends(&out, "\n...\n");
    cm_buf_append(&out, tail, tl);
  }
  char *raw = cm_buf_steal(&out);
  size_t n;
  char *clean = cm_utf8_sanitize(raw, strlen(raw), &n);
  free(raw);
  /* Trim trailing blank lines. */
  while (n && (clean[n - 1] == '\n' || clean[n - 1] == ' ')) clean[--n] = '\0';
  return clean;
}

static void on_step_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  env_build_t *b = data;
  if (b->step == STEP_INSPECT && stream == SBX_STDOUT) {
    cm_buf_append(&b->inspect, buf, len);
    return;
  }
  cm_headtail_append(&b->output, buf, len);
  /* Whole lines become progress messages ("Collecting x", "Installing collected ..."). */
  for (size_t i = 0; i < len; i++) {
    if (buf[i] == '\n' || buf[i] == '\r') {
      if (b->line.len) build_progress(b, "%s", b->line.data);
      cm_buf_reset(&b->line);
    } else if (b->line.len < ENV_PROGRESS_LINE_MAX) {
      cm_buf_append(&b->line, &buf[i], 1);
    }
  }
}

/* The message for a build that hit --max-build-bytes, or NULL. */
static char *bound_message(env_store_t *s, const env_space_t *sp, const sbx_result_t *res,
                           const char *tail) {
  cleanup_free char *limit = human_bytes(s->cfg->max_build_bytes);
  if (sp->mounted && space_full(sp, tail))
    return xasprintf(
        "the build wrote more than %s (--max-build-bytes: everything one build may write, its "
        "environment, downloads, caches and temporary files together)",
        limit);
  if (res && res->file_size_limit)
    return xasprintf("the build wrote a file larger than %s (--max-build-bytes)", limit);
  return NULL;
}

/* When the installer ran out of space, which disk: the cache's, or (when that one has room)
 * the sandbox's own /tmp. */
static char *disk_note(const char *tail, const char *envs_dir) {
  if (!strstr(tail, "No space left on device")) return xstrdup("");
  struct statvfs v;
  if (statvfs(envs_dir, &v) < 0) return xstrdup("");
  double free_mib = (double)v.f_bavail * (double)v.f_frsize / (1024.0 * 1024.0);
  double size_mib = (double)v.f_blocks * (double)v.f_frsize / (1024.0 * 1024.0);
  return xasprintf(
      "\n(The disk of the environment cache, %s, has %.1f MiB free of %.1f MiB; with room there, "
      "it is the build's own space, see --max-build-bytes.)",
      envs_dir, free_mib, size_mib);
}

static void on_step_exit(void *data, const sbx_result_t *res) {
  env_build_t *b = data;
  sbx_run_free(b->run);
  b->run = NULL;
  if (res->exit_code != 0 || res->timed_out || res->cancelled) {
    cleanup_free char *tail = output_tail(b);
    cleanup_free char *disk = disk_note(tail, b->store->envs_dir);
    const char *what = b->step == STEP_VENV      ? "creating the virtual environment"
                       : b->step == STEP_INSTALL ? "installing the dependencies"
                                                 : "inspecting the environment";
    cleanup_free char *bound =
        res->timed_out ? NULL : bound_message(b->store, &b->space, res, tail);
    cleanup_free char *msg =
        res->timed_out
            ? xasprintf("Building the environment failed: %s took longer than %llus.\n%s", what,
                        (unsigned long long)(b->store->cfg->build_timeout_ms / 1000), tail)
        : bound ? xasprintf("Building the environment failed while %s: %s.\n%s", what, bound, tail)
                : xasprintf("Building the environment failed while %s (exit code %d):\n%s%s", what,
                            res->exit_code, tail, disk);
    cm_warn("environment %s: %s", b->key, msg);
    build_fail(b, msg);
    return;
  }
  b->step++;
  build_next_step(b);
}

/* ---------------------------------------------------------------- index settings and builds' network */

/* The installers' own index variables of the server's environment: index settings, read
 * by the server (a flag wins), never handed to a sandbox that can keep them out. */
static const char *const index_env_vars[] = {"PIP_INDEX_URL=",     "UV_INDEX_URL=",   "PIP_EXTRA_INDEX_URL=",
                                             "UV_EXTRA_INDEX_URL=", "PIP_FIND_LINKS=", "UV_FIND_LINKS="};

static char **env_list(const char *a, const char *b) {
  const char *v = getenv(a);
  if (!v || !*v) v = getenv(b);
  return split_spaces(v && *v ? v : NULL);
}

static void index_settings(env_store_t *s) {
  if (s->index_loaded) return;
  s->index_loaded = true;
  const srv_config_t *cfg = s->cfg;
  const char *iu = cfg->index_url;
  if (!iu) iu = getenv("PIP_INDEX_URL");
  if (!iu || !*iu) iu = getenv("UV_INDEX_URL");
  s->index_url = iu && *iu ? xstrdup(iu) : NULL;
  s->extra_index_urls =
      cfg->extra_index_urls ? split_spaces(cfg->extra_index_urls) : env_list("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL");
  s->find_links = cfg->find_links ? split_spaces(cfg->find_links) : env_list("PIP_FIND_LINKS", "UV_FIND_LINKS");
}

static char *redacted_join(char *const *urls) {
  if (!urls || !urls[0]) return NULL;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (char *const *u = urls; *u; u++) {
    cleanup_free char *r = eg_url_redact(*u);
    if (b.len) cm_buf_appends(&b, " ");
    cm_buf_appends(&b, r);
  }
  return cm_buf_steal(&b);
}

void env_store_set_network(env_store_t *s, struct srv_network *network) { s->network = network; }

/* What a builder gets for url: the forwarder's mapping when it carries credentials (the
 * proxy adds them), else url itself. */
static char *builder_url(env_store_t *s, eg_proxy_t *p, const char *url) {
  eg_url_t u;
  if (eg_url_parse(url, strlen(url), &u) < 0) return xstrdup(url); /* a local directory */
  bool secret = u.user != NULL;
  eg_url_release(&u);
  if (!secret) return xstrdup(url);
  cm_error_t err = CM_ERROR_INIT;
  int n = eg_proxy_add_index(p, url, &err);
  if (n < 0) {
    cm_warn("index %s: %s", url, cm_error_message(&err));
    cm_error_release(&err);
    return NULL;
  }
  return eg_proxy_index_url(p, n);
}

static char **builder_urls(env_store_t *s, eg_proxy_t *p, char *const *urls) {
  cm_strv_builder_t b = {0};
  for (char *const *u = urls; u && *u; u++) {
    char *m = builder_url(s, p, *u);
    if (m) cm_strv_add(&b, m);
    free(m);
  }
  return cm_strv_steal(&b);
}

/* Whether builds go through the egress proxy (a backend with a namespace and a forwarder),
 * and their policy and URLs, once. */
static bool build_net_prepare(env_store_t *s) {
  if (s->build_net_prepared) return s->build_net_ok;
  s->build_net_prepared = true;
  index_settings(s);
  if (!s->network || !sbx_backend_can_egress(s->backend)) return false;
  cm_error_t err = CM_ERROR_INIT;
  eg_proxy_t *p = srv_network_proxy(s->network, &err);
  cm_error_release(&err);
  /* Without a proxy a build on such a backend has no network at all (never the host's). */
  s->build_net_ok = true;
  eg_policy_t *bp = &s->build_policy;
  bp->public_internet = false;
  bp->closed_reason = "not an index host (allow it with --build-network-allow)";
  const eg_policy_t *deny = srv_network_deny_policy(s->network);
  for (size_t i = 0; i < deny->n_deny; i++) eg_policy_add_deny(bp, &deny->deny[i]);
  if (s->index_url) {
    srv_network_allow_url(bp, s->index_url);
  } else {
    /* The installers' default index and its file host. */
    srv_network_allow_url(bp, "https://pypi.org/simple");
    srv_network_allow_url(bp, "https://files.pythonhosted.org/");
  }
  for (char **u = s->extra_index_urls; u && *u; u++) srv_network_allow_url(bp, *u);
  for (char **u = s->find_links; u && *u; u++) srv_network_allow_url(bp, *u);
  for (const char *r = s->cfg->build_network_allow; r && *r;) {
    size_t n = strcspn(r, " ");
    eg_rule_t rule;
    if (n && eg_rule_parse(r, n, &rule, &err) == 0) eg_policy_add_allow(bp, &rule);
    cm_error_release(&err);
    r += n;
    while (*r == ' ') r++;
  }
  if (p) {
    s->b_index_url = s->index_url ? builder_url(s, p, s->index_url) : NULL;
    s->b_extra_index_urls = builder_urls(s, p, s->extra_index_urls);
    s->b_find_links = builder_urls(s, p, s->find_links);
  }
  return true;
}

static void index_args(env_store_t *s, bool uv, bool wheelhouse, cm_strv_builder_t *a) {
  const srv_config_t *cfg = s->cfg;
  if (cfg->offline && !uv) cm_strv_add(a, "--no-index");
  if (cfg->offline && uv) cm_strv_add(a, "--offline");
  /* Through the proxy: the effective settings, credentials mapped.  Otherwise (a backend
   * that cannot keep them out) the flags, and the environment's variables pass as they are. */
  bool proxied = build_net_prepare(s);
  const char *index_url = proxied ? s->b_index_url : cfg->index_url;
  cleanup_strv char **extra_own = proxied ? NULL : split_spaces(cfg->extra_index_urls);
  cleanup_strv char **links_own = proxied ? NULL : split_spaces(cfg->find_links);
  char **extra = proxied ? s->b_extra_index_urls : extra_own;
  char **links = proxied ? s->b_find_links : links_own;
  if (index_url) {
    cm_strv_add(a, "--index-url");
    cm_strv_add(a, index_url);
  }
  for (char **e = extra; e && *e; e++) {
    cm_strv_add(a, "--extra-index-url");
    cm_strv_add(a, *e);
  }
  for (char **l = links; l && *l; l++) {
    cm_strv_add(a, "--find-links");
    cm_strv_add(a, *l);
  }
  if (wheelhouse && s->wheels_fd >= 0) {
    /* The server's own wheelhouse (binary wheels the warm-up downloaded), read-only. */
    cm_strv_add(a, "--find-links");
    cm_strv_add(a, backend_maps(s) ? ENV_WHEELS_TARGET : s->wheels_dir);
  }
}

/* The environment of installer runs: PATH and locale, the space's private cache and /tmp,
 * harmless settings of the installers from the server's environment (an allowlist: nothing
 * else of PIP_* / UV_*, whose variables may hold index credentials, tokens or keyring
 * settings), and the proxy.  Package code runs in a build (setup.py, build backends), so
 * nothing secret may be here. */
static void installer_env(env_store_t *s, const env_space_t *sp, bool proxied, cm_strv_builder_t *env) {
  bool maps = backend_maps(s);
  const char *cache = maps ? ENV_CACHE_TARGET : sp->cache;
  const char *tmp = maps ? "/tmp" : sp->tmp;
  cm_strv_add(env, "PATH=/usr/local/bin:/usr/bin:/bin");
  cm_strv_add(env, "LANG=C.UTF-8");
  cm_strv_addf(env, "HOME=%s", tmp);
  cm_strv_addf(env, "TMPDIR=%s", tmp);
  cm_strv_add(env, "PYTHONDONTWRITEBYTECODE=1");
  cm_strv_add(env, "PIP_DISABLE_PIP_VERSION_CHECK=1");
  cm_strv_add(env, "PIP_NO_INPUT=1");
  cm_strv_add(env, "PIP_PROGRESS_BAR=off");
  cm_strv_addf(env, "PIP_CACHE_DIR=%s/pip", cache);
  cm_strv_addf(env, "UV_CACHE_DIR=%s/uv", cache);
  cm_strv_add(env, "UV_NO_PROGRESS=1");
  static const char *const harmless[] = {
      "PIP_DEFAULT_TIMEOUT=",  "PIP_TIMEOUT=",        "PIP_RETRIES=",           "PIP_PREFER_BINARY=",
      "PIP_ONLY_BINARY=",      "PIP_NO_BINARY=",      "PIP_PRE=",               "PIP_TRUSTED_HOST=",
      "UV_HTTP_TIMEOUT=",      "UV_CONCURRENT_DOWNLOADS=", "UV_CONCURRENT_BUILDS=", "UV_CONCURRENT_INSTALLS=",
      "UV_PRERELEASE=",        "UV_RESOLUTION=",      "UV_INDEX_STRATEGY=",     "UV_NATIVE_TLS=",
      "SSL_CERT_FILE=",        "SSL_CERT_DIR=",       "REQUESTS_CA_BUNDLE=",
  };
  static const char *const host_proxy[] = {"HTTP_PROXY=", "HTTPS_PROXY=", "NO_PROXY=",
                                           "http_proxy=", "https_proxy=", "no_proxy="};
  for (char **e = environ; *e; e++) {
    for (size_t i = 0; i < CM_ARRAY_SIZE(harmless); i++)
      if (!strncmp(*e, harmless[i], strlen(harmless[i]))) cm_strv_add(env, *e);
    if (proxied) continue;
    /* A backend without the proxy: the host's proxy settings, and the index variables as
     * before (it cannot keep them from the installer's processes anyway). */
    for (size_t i = 0; i < CM_ARRAY_SIZE(host_proxy); i++)
      if (!strncmp(*e, host_proxy[i], strlen(host_proxy[i]))) cm_strv_add(env, *e);
    for (size_t i = 0; i < CM_ARRAY_SIZE(index_env_vars); i++)
      if (!strncmp(*e, index_env_vars[i], strlen(index_env_vars[i]))) cm_strv_add(env, *e);
  }
  if (proxied) srv_network_env(s->network, env, true);
}

/* An installer run with a proxy session: the session lives as long as the run. */
typedef struct installer_net {
  env_store_t *store;
  eg_session_t *session;
  sbx_run_callbacks_t cbs;
  void *data;
  struct installer_net *next;
} installer_net_t;

static void installer_net_unlink(installer_net_t *n) {
  for (installer_net_t **l = &n->store->nets; *l; l = &(*l)->next)
    if (*l == n) {
      *l = n->next;
      break;
    }
}

static void installer_net_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  installer_net_t *n = data;
  if (n->cbs.on_output) n->cbs.on_output(n->data, stream, buf, len);
}

static void installer_net_exit(void *data, const sbx_result_t *res) {
  installer_net_t *n = data;
  eg_session_close(n->session);
  installer_net_unlink(n);
  sbx_run_callbacks_t cbs = n->cbs;
  void *d = n->data;
  free(n);
  if (cbs.on_exit) cbs.on_exit(d, res);
}

static void build_net_release(env_store_t *s) {
  while (s->nets) {
    installer_net_t *n = s->nets;
    s->nets = n->next;
    eg_session_close(n->session);
    free(n);
  }
  free(s->index_url);
  cm_strv_free(s->extra_index_urls);
  cm_strv_free(s->find_links);
  free(s->b_index_url);
  cm_strv_free(s->b_extra_index_urls);
  cm_strv_free(s->b_find_links);
  eg_policy_release(&s->build_policy);
}

/* Read-only in installer runs: the interpreter's prefix, local wheel directories, uv. */
static void installer_binds(env_store_t *s, const char *prefix, cm_strv_builder_t *binds) {
  cm_strv_add(binds, prefix);
  cleanup_strv char **links = split_spaces(s->cfg->find_links);
  for (char **l = links; *l; l++)
    if ((*l)[0] == '/') cm_strv_add(binds, *l);
  if (s->uv) cm_strv_add(binds, s->uv);
}

/* Starts one installer run (a build step, a warm-up, a dry-run resolution) in the sandbox:
 * network per --offline (through the egress proxy, allowed the index hosts only, where the
 * backend can), as identity (NULL: a fresh one), writing only its space (the work
 * directory, the private cache at /cache, /tmp and, for a build, the environment at /env),
 * with the wheelhouse read-only at /wheels. */
static int start_installer_run(env_store_t *s, const char *prefix, char **argv,
                               const env_space_t *sp, const sbx_identity_t *identity,
                               const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **run,
                               cm_error_t *err) {
  const srv_config_t *cfg = s->cfg;
  bool proxied = !cfg->offline && build_net_prepare(s);
  eg_proxy_t *proxy = proxied ? srv_network_proxy(s->network, err) : NULL;
  if (proxied && !proxy) return cm_error_wrap(err, "the build's network (the egress proxy)");
  int sandbox_fd = -1;
  installer_net_t *net = NULL;
  if (proxied) {
    net = xcalloc(1, sizeof *net);
    net->session = eg_session_new(proxy, &s->build_policy, EG_SESSION_INDEX, &sandbox_fd, err);
    if (!net->session) {
      free(net);
      return cm_error_wrap(err, "the build's network");
    }
    net->store = s;
    net->cbs = *cbs;
    net->data = data;
  }
  sbx_egress_t egress = {.fd = sandbox_fd, .port = EG_SANDBOX_PORT};
  sbx_run_callbacks_t net_cbs = {.on_output = installer_net_output, .on_exit = installer_net_exit};
  cm_strv_builder_t env = {0};
  installer_env(s, sp, proxied, &env);
  cm_strv_builder_t binds = {0};
  installer_binds(s, prefix, &binds);
  sbx_mount_t mounts[4];
  size_t n_mounts = 0;
  mounts[n_mounts++] =
      (sbx_mount_t){.host = sp->cache, .target = ENV_CACHE_TARGET, .writable = true};
  mounts[n_mounts++] = (sbx_mount_t){.host = sp->tmp, .target = "/tmp", .writable = true};
  if (sp->env)
    mounts[n_mounts++] = (sbx_mount_t){.host = sp->env, .target = ENV_TARGET, .writable = true};
  if (s->wheels_fd >= 0)
    mounts[n_mounts++] =
        (sbx_mount_t){.host = s->wheels_dir, .target = ENV_WHEELS_TARGET, .writable = false};
  /* On its tmpfs, what a build writes is memory its cgroup is charged for: the memory limit
   * leaves room for a full space on top of the installer's own.  What earlier steps wrote
   * there is memory already (charged to their cgroups, gone with them): only the rest of the
   * space is room, so that a build never holds more than the installer's own and one space. */
  uint64_t memory = CM_MAX(cfg->memory_bytes, 4ull << 30);
  struct statvfs v;
  if (sp->mounted) {
    uint64_t used = fstatvfs(sp->fd, &v) == 0 ? (uint64_t)(v.f_blocks - v.f_bfree) * v.f_frsize : 0;
    memory += cfg->max_build_bytes - CM_MIN(used, cfg->max_build_bytes);
  }
  sbx_spec_t spec = {
      .argv = argv,
      .envp = env.v,
      .workdir = sp->work,
      .ro_binds = binds.v,
      .mounts = mounts,
      .n_mounts = backend_maps(s) ? n_mounts : 0,
      .network = !cfg->offline,
      .egress = proxied ? &egress : NULL,
      .identity = identity,
      .limits =
          {
              .timeout_ms = cfg->build_timeout_ms,
              .grace_ms = cfg->kill_grace_ms,
              .memory_bytes = memory,
              .max_processes = CM_MAX(cfg->max_processes, 512),
              .file_size_bytes = cfg->max_build_bytes,
              .open_files = CM_MAX(cfg->open_files, 4096),
              .tmp_bytes = CM_MAX(cfg->tmp_bytes, 1ull << 30),
          },
  };
  int rc = net ? sbx_run_start(s->loop, s->backend, &spec, &net_cbs, net, run, err)
               : sbx_run_start(s->loop, s->backend, &spec, cbs, data, run, err);
  if (sandbox_fd >= 0) close(sandbox_fd); /* the sandbox has its own copy */
  if (net && rc < 0) {
    eg_session_close(net->session);
    free(net);
  } else if (net) {
    net->next = s->nets;
    s->nets = net;
  }
  cm_strv_free(env.v);
  cm_strv_free(binds.v);
  return rc;
}

/* Each step after the first gets a /tmp of its own, made here and empty: bwrap (as root)
 * creates the mount points of read-only binds below /tmp (a --find-links directory there)
 * inside it, following symlinks, so a /tmp an earlier step wrote could steer those mkdirs
 * anywhere on the host.  The old one stays in the space, counted, until the space goes. */
static int step_tmp(env_space_t *sp, build_step_t step, cm_error_t *err) {
  if (step == STEP_VENV) return 0;
  char *tmp = xasprintf("%s/tmp-%d", sp->dir, (int)step);
  if (mkdir(tmp, 0700) < 0) {
    int e = errno;
    free(tmp);
    return cm_error_set(err, e, CM_ERR_IO, "creating the build's /tmp");
  }
  free(sp->tmp);
  sp->tmp = tmp;
  return 0;
}

static void build_run(env_build_t *b, char **argv) {
  cm_headtail_release(&b->output);
  cm_headtail_init(&b->output, ENV_STEP_OUTPUT_TAIL / 4, ENV_STEP_OUTPUT_TAIL);
  sbx_run_callbacks_t cbs = {.on_output = on_step_output, .on_exit = on_step_exit};
  cm_error_t err = CM_ERROR_INIT;
  if (step_tmp(&b->space, b->step, &err) < 0 ||
      start_installer_run(b->store, b->py.prefix, argv, &b->space, b->identity, &cbs, b, &b->run,
                          &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    build_fail(b, msg);
  }
}

/* ---------------------------------------------------------------- the copy (in a child) */

typedef struct env_copy {
  int src_fd;           /* the space's env/ */
  int dst_parent_fd;    /* envs/ */
  const char *dst_name; /* .staging-... */
  uint64_t max_bytes;
  const char *reloc_from, *reloc_to; /* host paths, for backends that do not map /env */
  uint64_t total;
} env_copy_t;

static int copy_charge(env_copy_t *c, uint64_t bytes, const char *rel, cm_error_t *err) {
  uint64_t rounded = (bytes + ENV_BLOCK - 1) / ENV_BLOCK * ENV_BLOCK;
  c->total += CM_MAX(rounded, ENV_BLOCK);
  if (c->total > c->max_bytes)
    return cm_error_set(err, 0, CM_ERR_LIMIT,
                        "the environment is larger than %llu bytes (--max-build-bytes) at %s",
                        (unsigned long long)c->max_bytes, rel);
  return 0;
}

/* Rewrites the build-time path of the environment into its final one in a small text file
 * of bin/ (console scripts' shebangs), when the backend runs installers at host paths. */
static char *relocated(const env_copy_t *c, const char *text, size_t len, size_t *out_len) {
  size_t from_len = strlen(c->reloc_from);
  if (memchr(text, '\0', len) || !memmem(text, len, c->reloc_from, from_len)) return NULL;
  cm_buf_t out;
  cm_buf_init(&out, 0);
  const char *cur = text, *end = text + len, *hit;
  while ((hit = memmem(cur, (size_t)(end - cur), c->reloc_from, from_len))) {
    cm_buf_append(&out, cur, (size_t)(hit - cur));
    cm_buf_appends(&out, c->reloc_to);
    cur = hit + from_len;
  }
  cm_buf_append(&out, cur, (size_t)(end - cur));
  *out_len = out.len;
  return cm_buf_steal(&out);
}

static int copy_file(env_copy_t *c, int src_dir, int dst_dir, const char *name,
                     const struct stat *lst, bool in_bin, const char *rel, cm_error_t *err) {
  struct stat st;
  cleanup_close int in =
      cm_open_regular_at(src_dir, name, O_RDONLY, CM_ANY_OWNER, c->max_bytes, &st, err);
  if (in < 0) return cm_error_wrap(err, "copying %s", rel);
  if (st.st_ino != lst->st_ino || st.st_dev != lst->st_dev)
    return cm_error_set(err, 0, CM_ERR_INVALID, "%s changed while it was copied", rel);
  if (copy_charge(c, (uint64_t)st.st_size, rel, err) < 0) return -1;
  mode_t mode = (st.st_mode & 0111) ? 0755 : 0644; /* readable by every run; no set-id bits */
  cleanup_close int out =
      openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", rel);
  bool relocate = c->reloc_from && in_bin && (uint64_t)st.st_size <= ENV_RELOCATE_MAX;
  cm_buf_t whole;
  cm_buf_init(&whole, relocate ? ENV_RELOCATE_MAX + 1 : 0);
  char buf[65536];
  uint64_t copied = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      cm_buf_release(&whole);
      return cm_error_set(err, errno, CM_ERR_IO, "reading %s", rel);
    }
    if (n == 0) break;
    copied += (uint64_t)n;
    if (copied > (uint64_t)st.st_size) {
      cm_buf_release(&whole);
      return cm_error_set(err, 0, CM_ERR_INVALID, "%s grew while it was copied", rel);
    }
    if (relocate) {
      cm_buf_append(&whole, buf, (size_t)n);
    } else if (cm_write_all(out, buf, (size_t)n) < 0) {
      return cm_error_set(err, errno, CM_ERR_IO, "writing %s", rel);
    }
  }
  if (relocate) {
    size_t new_len = 0;
    cleanup_free char *moved = relocated(c, whole.data ? whole.data : "", whole.len, &new_len);
    int rc = moved ? cm_write_all(out, moved, new_len)
                   : cm_write_all(out, whole.data ? whole.data : "", whole.len);
    cm_buf_release(&whole);
    if (rc < 0) return cm_error_set(err, errno, CM_ERR_IO, "writing %s", rel);
  }
  if (fchmod(out, mode) < 0) return cm_error_set(err, errno, CM_ERR_IO, "chmod %s", rel);
  /* The installers' byte-code caches are checked against their sources' mtimes. */
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  (void)futimens(out, times);
  return 0;
}

static int copy_tree(env_copy_t *c, int src, int dst, int depth, const char *rel, cm_error_t *err) {
  if (depth > ENV_COPY_DEPTH_MAX)
    return cm_error_set(err, 0, CM_ERR_LIMIT,
                        "the environment is nested deeper than %d directories at %s",
                        ENV_COPY_DEPTH_MAX, rel);
  DIR *d = list_dir(src);
  if (!d) return cm_error_set(err, errno, CM_ERR_IO, "listing %s", rel);
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    cleanup_free char *path = xasprintf("%s/%s", rel, e->d_name);
    if (depth == 0 && strcmp(e->d_name, ENV_MANIFEST) == 0) {
      rc = cm_error_set(err, 0, CM_ERR_INVALID,
                        "the build made %s itself (a name the server keeps for its own)", path);
      break;
    }
    struct stat st;
    if (fstatat(src, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      rc = cm_error_set(err, errno, CM_ERR_IO, "stat %s", path);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      if ((rc = copy_charge(c, 0, path, err)) < 0) break;
      if (mkdirat(dst, e->d_name, 0700) < 0) {
        rc = cm_error_set(err, errno, CM_ERR_IO, "creating %s", path);
        break;
      }
      cleanup_close int sub_src = cm_open_dir_at(src, e->d_name, err);
      cleanup_close int sub_dst = sub_src < 0 ? -1 : cm_open_dir_at(dst, e->d_name, err);
      if (sub_dst < 0) {
        rc = cm_error_wrap(err, "copying %s", path);
        break;
      }
      rc = copy_tree(c, sub_src, sub_dst, depth + 1, path, err);
      if (rc == 0 && fchmod(sub_dst, 0755) < 0)
        rc = cm_error_set(err, errno, CM_ERR_IO, "chmod %s", path);
      if (rc == 0) {
        struct timespec times[2] = {st.st_atim, st.st_mtim};
        (void)futimens(sub_dst, times);
      }
    } else if (S_ISREG(st.st_mode)) {
      rc = copy_file(c, src, dst, e->d_name, &st, depth == 1 && strcmp(rel, "./bin") == 0, path,
                     err);
    } else if (S_ISLNK(st.st_mode)) {
      /* Copied as it is, never followed: a run resolves it inside its own sandbox. */
      char target[PATH_MAX];
      ssize_t n = readlinkat(src, e->d_name, target, sizeof target);
      if (n < 0 || (size_t)n >= sizeof target) {
        rc = cm_error_set(err, n < 0 ? errno : ENAMETOOLONG, CM_ERR_IO, "reading the symlink %s",
                          path);
        break;
      }
      target[n] = '\0';
      if ((rc = copy_charge(c, (uint64_t)n, path, err)) < 0) break;
      if (symlinkat(target, dst, e->d_name) < 0)
        rc = cm_error_set(err, errno, CM_ERR_IO, "creating %s", path);
    } else {
      rc = cm_error_set(
          err, 0, CM_ERR_INVALID,
          "the build left %s at %s: a FIFO, socket or device is never part of an environment",
          S_ISFIFO(st.st_mode)   ? "a FIFO"
          : S_ISSOCK(st.st_mode) ? "a socket"
                                 : "a device node",
          path);
    }
  }
  closedir(d);
  return rc;
}

/* Runs in a child: the environment out of the space into a new directory of the server's. */
static int copy_env(void *arg, cm_buf_t *out, cm_error_t *err) {
  env_copy_t *c = arg;
  struct stat st;
  if (fstatat(c->src_fd, ENV_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "the build made %s itself (%s; the name is the server's own)", ENV_MANIFEST,
                        S_ISLNK(st.st_mode)    ? "a symlink"
                        : S_ISFIFO(st.st_mode) ? "a FIFO"
                        : S_ISREG(st.st_mode)  ? "a file"
                                               : "not a regular file");
  if (mkdirat(c->dst_parent_fd, c->dst_name, 0700) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "creating %s", c->dst_name);
  int rc = -1;
  int dst = cm_open_dir_at(c->dst_parent_fd, c->dst_name, err);
  if (dst >= 0) {
    rc = copy_tree(c, c->src_fd, dst, 0, ".", err);
    if (rc == 0 && fchmod(dst, 0755) < 0)
      rc = cm_error_set(err, errno, CM_ERR_IO, "chmod %s", c->dst_name);
    close(dst);
  }
  if (rc < 0) {
    cm_error_t rm = CM_ERROR_INIT;
    cm_rm_rf_at(c->dst_parent_fd, c->dst_name, &rm);
    cm_error_release(&rm);
    return -1;
  }
  cm_buf_printf(out, "%llu", (unsigned long long)c->total);
  return 0;
}

static void publish(env_build_t *b, uint64_t size);

static void on_copied(void *data, int rc, const char *text) {
  env_build_t *b = data;
  b->copy = NULL;
  if (rc < 0) {
    /* The child removed its partial copy (or it is removed as trash by build_free). */
    cleanup_free char *disk = disk_note(text, b->store->envs_dir);
    cleanup_free char *msg = xasprintf("Building the environment failed: %s.%s", text, disk);
    cm_warn("environment %s: %s", b->key, msg);
    build_fail(b, msg);
    return;
  }
  uint64_t size = 0;
  (void)cm_parse_u64(text, UINT64_MAX, &size);
  publish(b, size);
}

static void start_copy(env_build_t *b) {
  env_store_t *s = b->store;
  build_progress(b, "storing the environment");
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int src =
      open(b->space.env, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (src < 0) {
    cleanup_free char *msg = xasprintf(
        "Building the environment failed: the environment's directory: %s", strerror(errno));
    build_fail(b, msg);
    return;
  }
  b->copy_name = xasprintf(".staging-%s-%d-%u", b->key, (int)getpid(), s->serial++);
  /* The child has its own copy of this (and of every string it points to). */
  env_copy_t c = {
      .src_fd = src,
      .dst_parent_fd = s->envs_fd,
      .dst_name = b->copy_name,
      .max_bytes = s->cfg->max_build_bytes,
      .reloc_from = backend_maps(s) ? NULL : b->space.env,
      .reloc_to = backend_maps(s) ? NULL : b->final_dir,
  };
  int keep[] = {src, s->envs_fd};
  if (sbx_call_start(s->loop, copy_env, &c, keep, CM_ARRAY_SIZE(keep), s->cfg->build_timeout_ms,
                     on_copied, b, &b->copy, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    free(b->copy_name);
    b->copy_name = NULL;
    build_fail(b, msg);
  }
}

/* The copy is the server's: the manifest goes into it, then it is renamed into place. */
static void publish(env_build_t *b, uint64_t size) {
  env_store_t *s = b->store;
  json_t *packages = b->inspect.len ? json_loadb(b->inspect.data, b->inspect.len, 0, NULL) : NULL;
  if (!json_is_object(packages)) {
    json_decref(packages);
    packages = json_object();
  }
  json_t *requested = json_array();
  size_t requested_bytes = 0;
  for (size_t i = 0; i < b->n_requirements; i++) requested_bytes += strlen(b->requirements[i]);
  for (size_t i = 0; i < b->n_requirements && requested_bytes <= ENV_MANIFEST_PART_MAX; i++)
    json_array_append_new(requested, json_string(b->requirements[i]));
  json_t *m =
      json_pack("{s:i, s:s, s:{s:s, s:s, s:s}, s:o, s:o, s:s, s:I, s:I, s:b, s:I, s:s?}", "format",
                ENV_FORMAT, "key", b->key, "python", "executable", b->py.executable, "version",
                b->py.version, "implementation", b->py.implementation, "requested", requested,
                "packages", packages, "installer", s->uv ? "uv" : "pip", "created",
                (json_int_t)time(NULL), "size", (json_int_t)size, "pinned", b->pinned, "build_ms",
                (json_int_t)(cm_now_ms() - b->started_ms), "built_by", b->owner);
  if (json_array_size(requested) < b->n_requirements)
    json_object_set_new(m, "requested_count", json_integer((json_int_t)b->n_requirements));
  cleanup_free char *text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
  json_decref(m);
  if (strlen(text) > ENV_MANIFEST_MAX) {
    /* It could never be read back (load_manifest): every call would build it again. */
    cleanup_free char *msg = xasprintf(
        "Building the environment failed: its manifest would be %zu bytes, more than %u",
        strlen(text), ENV_MANIFEST_MAX);
    build_fail(b, msg);
    return;
  }
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(s->envs_fd, b->copy_name, &err);
  if (dfd < 0 || cm_create_file_at(dfd, ENV_MANIFEST, text, strlen(text), 0644, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    build_fail(b, msg);
    return;
  }
  /* Publish atomically.  An older environment with the same key (re-resolved because it
   * was too old) moves aside first: we hold the key's lock exclusively, so no run uses it. */
  struct stat st;
  if (fstatat(s->envs_fd, b->key, &st, AT_SYMLINK_NOFOLLOW) == 0)
    discard(s, s->envs_fd, b->key, "old");
  if (renameat(s->envs_fd, b->copy_name, s->envs_fd, b->key) < 0) {
    cleanup_free char *msg = xasprintf("Publishing the environment failed: %s", strerror(errno));
    build_fail(b, msg);
    return;
  }
  free(b->copy_name);
  b->copy_name = NULL;
  b->step = STEP_DONE;
  cm_info("environment %s built in %llums (%zu requirements, %llu bytes)", b->key,
          (unsigned long long)(cm_now_ms() - b->started_ms), b->n_requirements,
          (unsigned long long)size);
  build_progress(b, "environment ready");
  build_ready(b, false);
}

static char inspect_code[] =
    "import json\n"
    "try:\n"
    "    import importlib.metadata as md\n"
    "except ImportError:\n"
    "    print('{}'); raise SystemExit(0)\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in md.distributions() if "
    "d.metadata['Name']}))\n";

static void build_next_step(env_build_t *b) {
  env_store_t *s = b->store;
  bool maps = backend_maps(s);
  const char *env_path = maps ? ENV_TARGET : b->space.env;
  cleanup_free char *env_python = xasprintf("%s/bin/python", env_path);
  cm_strv_builder_t a = {0};
  switch (b->step) {
    case STEP_VENV:
      build_progress(b, "creating an environment for Python %s", b->py.version);
      if (s->uv) {
        cm_strv_add(&a, s->uv);
        cm_strv_add(&a, "venv");
        add_uv_config(b, &a);
        cm_strv_addv(&a, "--quiet", "--python", b->py.executable, env_path, NULL);
      } else {
        cm_strv_addv(&a, b->py.executable, "-m", "venv", "--without-pip", env_path, NULL);
      }
      break;
    case STEP_INSTALL:
      build_progress(b, "installing %zu requirement%s", b->n_requirements,
                     b->n_requirements == 1 ? "" : "s");
      if (b->uv_config && !s->uv)
        build_progress(
            b,
            "note: the script's [tool.uv] settings apply only when uv installs; pip ignores them");
      if (s->uv) {
        cm_strv_addv(&a, s->uv, "pip", "install", NULL);
        add_uv_config(b, &a);
        cm_strv_add(&a, "--python");
        cm_strv_add(&a, env_python);
      } else {
        /* The interpreter's own pip, installing into the environment (pip >= 22.3). */
        cm_strv_addv(&a, b->py.executable, "-m", "pip", "--python", env_python, "install",
                     "--no-input", NULL);
      }
      index_args(s, s->uv != NULL, true, &a);
      cm_strv_add(&a, "--");
      for (size_t i = 0; i < b->n_requirements; i++) cm_strv_add(&a, b->requirements[i]);
      break;
    case STEP_INSPECT:
      cm_strv_addv(&a, env_python, "-I", "-c", inspect_code, NULL);
      break;
    case STEP_COPY:
      start_copy(b);
      return;
    case STEP_DONE:
      return;
  }
  build_run(b, a.v);
  cm_strv_free(a.v);
}

static int prepare_build(env_build_t *b, cm_error_t *err) {
  env_store_t *s = b->store;
  if (space_make(s, "build", true, &b->space, err) < 0) return -1;
  if (b->uv_config && s->uv) {
    cleanup_free char *path = xasprintf("%s/uv.toml", b->space.work);
    if (cm_write_file(path, b->uv_config, strlen(b->uv_config), 0644, err) < 0) return -1;
  }
  b->identity = sbx_identity_new(s->backend);
  return 0;
}

/* uv reads the script's [tool.uv] settings from a file in the build's work directory. */
static void add_uv_config(env_build_t *b, cm_strv_builder_t *a) {
  if (!b->uv_config || !b->store->uv) return;
  cm_strv_add(a, "--config-file");
  if (backend_maps(b->store))
    cm_strv_add(a, "/work/uv.toml");
  else
    cm_strv_addf(a, "%s/uv.toml", b->space.work);
}

/* Removes copies that a crashed build of this key left behind (we hold the key's
 * exclusive lock, so no live build owns them). */
static void remove_stale_staging(env_store_t *s, const char *key) {
  DIR *d = list_dir(s->envs_fd);
  if (!d) return;
  cleanup_free char *prefix = xasprintf(".staging-%s-", key);
  cm_strv_builder_t stale = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) cm_strv_add(&stale, e->d_name);
  closedir(d);
  for (size_t i = 0; i < stale.n; i++) {
    cm_warn("removing an unfinished environment build left behind: %s/%s", s->envs_dir, stale.v[i]);
    discard(s, s->envs_fd, stale.v[i], "trash");
  }
  cm_strv_free(stale.v);
}

static void evict(env_store_t *s);

static void try_lock(cm_loop_t *loop, cm_timer_t *t, void *data) {
  env_build_t *b = data;
  b->lock_retry = NULL;
  if (flock(b->lock_fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      cleanup_free char *msg = xasprintf("Locking the environment failed: %s", strerror(errno));
      build_fail(b, msg);
      return;
    }
    /* Another server is building or evicting it, or a run uses the one that is too old to
     * keep: wait, without blocking the loop. */
    if (!b->said_waiting) cm_info("environment %s is locked elsewhere: waiting for it", b->key);
    b->said_waiting = true;
    b->lock_retry = cm_loop_timer(b->store->loop, ENV_LOCK_RETRY_MS, try_lock, b);
    return;
  }
  /* Another server may have finished it while we waited. */
  json_t *m = load_manifest(b->store, b->key, b->pinned, false, NULL);
  if (m) {
    json_decref(m);
    build_ready(b, true);
    return;
  }
  remove_stale_staging(b->store, b->key);
  evict(b->store);
  cm_error_t err = CM_ERROR_INIT;
  if (prepare_build(b, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    build_fail(b, msg);
    return;
  }
  b->started_ms = cm_now_ms();
  b->step = STEP_VENV;
  build_next_step(b);
}

/* ---------------------------------------------------------------- eviction */

typedef struct env_entry {
  char *name;
  bool wheel;
  uint64_t size;
  int64_t used;
} env_entry_t;

static int by_use(const void *a, const void *b) {
  const env_entry_t *x = a, *y = b;
  return x->used < y->used ? -1 : x->used > y->used;
}

typedef struct entry_list {
  env_entry_t *v;
  size_t n, cap;
  uint64_t total;
} entry_list_t;

static void entry_add(entry_list_t *l, const char *name, bool wheel, uint64_t size, int64_t used) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = (env_entry_t){xstrdup(name), wheel, size, used};
  l->total += size;
}

typedef struct env_known {
  char *name;
  dev_t dev;
  ino_t ino;
  uint64_t size;
} env_known_t;

static int by_known_name(const void *a, const void *b) {
  return strcmp(((const env_known_t *)a)->name, ((const env_known_t *)b)->name);
}

static int name_vs_known(const void *name, const void *k) {
  return strcmp(name, ((const env_known_t *)k)->name);
}

static void known_release(env_known_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i].name);
  free(v);
}

/* An environment's size from its manifest: from what was read before when the manifest is
 * the same file (its status now, in st), else read and parsed.  false: not one of ours. */
static bool entry_size(env_store_t *s, const char *name, struct stat *st, uint64_t *size) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(s->envs_fd, name, &err);
  cm_error_release(&err);
  if (dfd < 0 || fstatat(dfd, ENV_MANIFEST, st, AT_SYMLINK_NOFOLLOW) < 0) return false;
  env_known_t *k = s->known ? bsearch(name, s->known, s->n_known, sizeof *k, name_vs_known) : NULL;
  if (k && k->dev == st->st_dev && k->ino == st->st_ino && S_ISREG(st->st_mode) &&
      st->st_uid == geteuid()) {
    *size = k->size;
    return true;
  }
  json_t *m = load_manifest(s, name, true, false, st);
  if (!m) return false;
  *size = (uint64_t)json_integer_value(json_object_get(m, "size"));
  json_decref(m);
  return true;
}

/* The finished environments (size from their manifests, last use from the manifests'
 * time) and the wheelhouse's wheels (their size on disk, last download). */
static void list_entries(env_store_t *s, entry_list_t *l, bool wheels) {
  DIR *d = list_dir(s->envs_fd);
  struct dirent *e;
  env_known_t *known = NULL;
  size_t n_known = 0, cap_known = 0;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    struct stat st;
    uint64_t size;
    if (!entry_size(s, e->d_name, &st, &size)) continue;
    entry_add(l, e->d_name, false, size, (int64_t)st.st_mtim.tv_sec);
    if (n_known == cap_known) {
      cap_known = cap_known ? cap_known * 2 : 16;
      known = xrealloc(known, cap_known * sizeof *known);
    }
    known[n_known++] = (env_known_t){xstrdup(e->d_name), st.st_dev, st.st_ino, size};
  }
  if (d) closedir(d);
  /* What is gone is forgotten with the old list. */
  if (n_known) qsort(known, n_known, sizeof *known, by_known_name);
  known_release(s->known, s->n_known);
  s->known = known;
  s->n_known = n_known;
  if (!wheels || s->wheels_fd < 0) return;
  d = list_dir(s->wheels_fd);
  while (d && (e = readdir(d))) {
    struct stat st;
    if (!wheel_name_ok(e->d_name) ||
        fstatat(s->wheels_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
      continue;
    entry_add(l, e->d_name, true, (uint64_t)st.st_blocks * 512, (int64_t)st.st_mtim.tv_sec);
  }
  if (d) closedir(d);
}

static void entries_release(entry_list_t *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].name);
  free(l->v);
}

/* Least recently used environments and wheels go until the store fits --max-cache-bytes;
 * an environment in use (here or in another server: its lock is held shared) or being
 * built is never touched, and no wheel goes while an installer of ours may be reading the
 * wheelhouse. */
static void evict(env_store_t *s) {
  bool installing = s->resolving > 0;
  for (env_build_t *b = s->builds; b; b = b->next) installing |= b->run != NULL;
  entry_list_t l = {0};
  list_entries(s, &l, !installing);
  if (l.n) qsort(l.v, l.n, sizeof *l.v, by_use);
  uint64_t total = l.total;
  for (size_t i = 0; i < l.n && total > s->cfg->max_cache_bytes; i++) {
    env_entry_t *en = &l.v[i];
    if (en->wheel) {
      if (unlinkat(s->wheels_fd, en->name, 0) == 0) {
        total -= CM_MIN(total, en->size);
        cm_info("evicted wheel %s (%llu bytes)", en->name, (unsigned long long)en->size);
      }
      continue;
    }
    cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, en->name);
    cleanup_close int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) { /* in use or building */
      cm_debug("environment %s is in use: not evicted", en->name);
      continue;
    }
    cleanup_free char *trash = xasprintf(".evicted-%s-%d-%u", en->name, (int)getpid(), s->serial++);
    if (renameat(s->envs_fd, en->name, s->envs_fd, trash) == 0) {
      remove_later(s, s->envs_fd, trash);
      total -= CM_MIN(total, en->size);
      cm_info("evicted environment %s (%llu bytes)", en->name, (unsigned long long)en->size);
    }
  }
  entries_release(&l);
}

/* ---------------------------------------------------------------- warming */

typedef struct warm_job {
  env_store_t *store;
  sbx_run_t *run;
  sbx_call_t *import;
  env_space_t space;
  cm_headtail_t output;
  uint64_t started_ms;
} warm_job_t;

typedef struct wheel_import {
  int src_fd, dst_fd;
  uint64_t max_bytes;
} wheel_import_t;

/* Runs in a child: the downloaded wheels into the wheelhouse, each under a temporary name
 * first, so a build never sees half a wheel.  A wheel already there stays (it came from
 * the same kind of download) and counts as used now. */
static int import_wheels(void *arg, cm_buf_t *out, cm_error_t *err) {
  wheel_import_t *w = arg;
  DIR *d = list_dir(w->src_fd);
  if (!d) return cm_error_set(err, errno, CM_ERR_IO, "listing the downloads");
  uint64_t total = 0;
  unsigned added = 0, kept = 0, skipped = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!wheel_name_ok(e->d_name)) {
      skipped += e->d_name[0] != '.';
      continue;
    }
    struct stat st;
    cleanup_close int in = cm_open_regular_at(w->src_fd, e->d_name, O_RDONLY, CM_ANY_OWNER,
                                              w->max_bytes - CM_MIN(total, w->max_bytes), &st, err);
    if (in < 0) {
      cm_warn("wheelhouse: not taking %s: %s", e->d_name, cm_error_message(err));
      cm_error_release(err);
      skipped++;
      continue;
    }
    total += (uint64_t)st.st_size;
    if (utimensat(w->dst_fd, e->d_name, NULL, AT_SYMLINK_NOFOLLOW) == 0) {
      kept++;
      continue;
    }
    cleanup_free char *tmp = xasprintf(".tmp-%d-%s", (int)getpid(), e->d_name);
    cleanup_close int outfd =
        openat(w->dst_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (outfd < 0) {
      closedir(d);
      return cm_error_set(err, errno, CM_ERR_IO, "creating %s in the wheelhouse", tmp);
    }
    char buf[65536];
    uint64_t copied = 0;
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) != 0) {
      if (n < 0 && errno == EINTR) continue;
      copied += n > 0 ? (uint64_t)n : 0;
      if (n < 0 || copied > (uint64_t)st.st_size || cm_write_all(outfd, buf, (size_t)n) < 0) {
        rc = -1;
        break;
      }
    }
    if (rc < 0 || fchmod(outfd, 0644) < 0 ||
        renameat2(w->dst_fd, tmp, w->dst_fd, e->d_name, RENAME_NOREPLACE) < 0) {
      unlinkat(w->dst_fd, tmp, 0);
      skipped++;
      continue;
    }
    added++;
  }
  closedir(d);
  cm_buf_printf(out, "%u new, %u already there, %u not taken", added, kept, skipped);
  return 0;
}

static void warm_free(warm_job_t *w) {
  env_store_t *s = w->store;
  if (s->warm == w) s->warm = NULL;
  if (w->run) sbx_run_free(w->run);
  sbx_call_free(w->import);
  space_remove(s, &w->space);
  cm_headtail_release(&w->output);
  free(w);
}

static void warm_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  warm_job_t *w = data;
  cm_headtail_append(&w->output, buf, len);
}

static void warm_imported(void *data, int rc, const char *text) {
  warm_job_t *w = data;
  w->import = NULL;
  if (rc == 0)
    cm_info("package cache warmed in %llums (wheelhouse: %s)",
            (unsigned long long)(cm_now_ms() - w->started_ms), text);
  else
    cm_info("package cache warming did not complete: %s", text);
  env_store_t *s = w->store;
  warm_free(w);
  evict(s);
}

static void warm_exit(void *data, const sbx_result_t *res) {
  warm_job_t *w = data;
  env_store_t *s = w->store;
  sbx_run_free(w->run);
  w->run = NULL;
  if (res->exit_code != 0) {
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&w->output, &head, &hl, &tail, &tl);
    cleanup_free char *excerpt = cm_log_excerpt(tl ? tail : head, tl ? tl : hl, 300);
    cm_info("package cache warming did not complete (exit code %d): %s", res->exit_code, excerpt);
    warm_free(w);
    return;
  }
  cleanup_free char *dl = xasprintf("%s/dl", w->space.work);
  cleanup_close int src = open(dl, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  cm_error_t err = CM_ERROR_INIT;
  wheel_import_t imp = {
      .src_fd = src, .dst_fd = s->wheels_fd, .max_bytes = s->cfg->max_build_bytes};
  int keep[] = {src, s->wheels_fd};
  if (src < 0 || s->wheels_fd < 0 ||
      sbx_call_start(s->loop, import_wheels, &imp, keep, 2, s->cfg->build_timeout_ms, warm_imported,
                     w, &w->import, &err) < 0) {
    cm_info("package cache warming did not complete: %s", src < 0 ? "no downloads"
                                                          : s->wheels_fd < 0
                                                              ? "no wheelhouse"
                                                              : cm_error_message(&err));
    cm_error_release(&err);
    warm_free(w);
  }
}

void env_store_warm(env_store_t *s, const py_interp_t *py, const char *warmup_file) {
  if (s->warm || !py) return;
  cleanup_free char *text = NULL;
  size_t len;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_read_file(warmup_file, 1u << 20, &text, &len, &err) < 0) {
    cm_info("cache warming: %s", cm_error_message(&err));
    cm_error_release(&err);
    return;
  }
  warm_job_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->started_ms = cm_now_ms();
  cm_headtail_init(&w->output, 2048, 2048);
  space_init(&w->space);
  if (space_make(s, "warm", false, &w->space, &err) < 0) {
    cm_info("cache warming: %s", cm_error_message(&err));
    cm_error_release(&err);
    warm_free(w);
    return;
  }
  /* Binary wheels only: no package code runs to make what builds will share. */
  cleanup_free char *dest = xasprintf("%s/dl", backend_maps(s) ? "/work" : w->space.work);
  cm_strv_builder_t a = {0};
  cm_strv_addv(&a, py->executable, "-m", "pip", "download", "--quiet", "--no-input",
               "--only-binary=:all:", "--dest", dest, NULL);
  index_args(s, false, false, &a);
  size_t n_pkgs = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    while (*line == ' ' || *line == '\t') line++;
    char *end = line + strlen(line);
    while (end > line && (end[-1] == ' ' || end[-1] == '\r' || end[-1] == '\t')) *--end = '\0';
    if (!*line || *line == '#') continue;
    pep508_requirement_t *q = NULL;
    if (pep508_requirement_parse(line, strlen(line), &q, NULL) < 0) continue;
    pep508_requirement_free(q);
    if (n_pkgs++ == 0) cm_strv_add(&a, "--");
    cm_strv_add(&a, line);
  }
  if (n_pkgs == 0) {
    cm_strv_free(a.v);
    warm_free(w);
    return;
  }
  sbx_run_callbacks_t cbs = {.on_output = warm_output, .on_exit = warm_exit};
  if (start_installer_run(s, py->prefix, a.v, &w->space, NULL, &cbs, w, &w->run, &err) < 0) {
    cm_info("cache warming could not start: %s", cm_error_message(&err));
    cm_error_release(&err);
    warm_free(w);
  } else {
    s->warm = w;
    cm_info("warming the package cache with %zu packages in the background", n_pkgs);
  }
  cm_strv_free(a.v);
}

/* ---------------------------------------------------------------- dry-run resolution */

typedef struct resolve_job {
  env_store_t *store;
  sbx_run_t *run;
  env_space_t space;
  cm_buf_t report;
  cm_headtail_t errors;
  env_resolved_cb cb;
  void *data;
  char *owner;
  bool cancelled;
  struct resolve_job *next;
} resolve_job_t;

static void resolve_free(resolve_job_t *j) {
  for (resolve_job_t **p = &j->store->resolves; *p; p = &(*p)->next) {
    if (*p == j) {
      *p = j->next;
      break;
    }
  }
  if (j->run) sbx_run_free(j->run);
  j->store->resolving--;
  space_remove(j->store, &j->space);
  cm_buf_release(&j->report);
  cm_headtail_release(&j->errors);
  free(j->owner);
  free(j);
}

static void resolve_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  resolve_job_t *j = data;
  if (stream == SBX_STDOUT)
    cm_buf_append(&j->report, buf, len);
  else
    cm_headtail_append(&j->errors, buf, len);
}

static void resolve_exit(void *data, const sbx_result_t *res) {
  resolve_job_t *j = data;
  sbx_run_free(j->run);
  j->run = NULL;
  json_t *report = res->exit_code == 0 && j->report.len
                       ? json_loadb(j->report.data, j->report.len, 0, NULL)
                       : NULL;
  json_t *resolved = NULL;
  cleanup_free char *error = NULL;
  if (json_is_object(report)) {
    resolved = json_object();
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(report, "install"), i, item) {
      json_t *md = json_object_get(item, "metadata");
      const char *name = json_string_value(json_object_get(md, "name"));
      const char *version = json_string_value(json_object_get(md, "version"));
      if (name && version) json_object_set_new(resolved, name, json_string(version));
    }
  } else {
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&j->errors, &head, &hl, &tail, &tl);
    size_t n;
    cleanup_free char *clean = cm_utf8_sanitize(tl ? tail : head, tl ? tl : hl, &n);
    while (n && (clean[n - 1] == '\n' || clean[n - 1] == ' ')) clean[--n] = '\0';
    cleanup_free char *bound =
        res->timed_out ? NULL : bound_message(j->store, &j->space, res, clean);
    error = res->timed_out ? xstrdup("the resolution took too long")
            : bound        ? xasprintf("the resolution failed: %s:\n%s", bound, clean)
                    : xasprintf("the resolution failed (exit code %d):\n%s", res->exit_code, clean);
  }
  json_decref(report);
  if (!j->cancelled) j->cb(j->data, resolved, error);
  json_decref(resolved);
  resolve_free(j);
}

void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        const char *owner, env_resolved_cb cb, void *data, cm_error_t *err) {
  /* A resolution runs package code in a space of its own like a build, but holds no slot of
   * the executions': bounded here, in all and per principal, with an immediate answer. */
  const srv_config_t *cfg = s->cfg;
  uint64_t own = 0, own_max = cfg->max_token_running;
  for (resolve_job_t *r = s->resolves; r; r = r->next) own += strcmp(r->owner, owner) == 0;
  if (own_max && own >= own_max) {
    cm_error_set(err, 0, CM_ERR_LIMIT,
                 "%llu dependency resolutions of yours are running already (at most %llu at once); "
                 "try again when one has finished",
                 (unsigned long long)own, (unsigned long long)own_max);
    return NULL;
  }
  if (s->resolving >= cfg->max_concurrent) {
    cm_error_set(err, 0, CM_ERR_LIMIT,
                 "%u dependency resolutions are running already (at most %llu at once, "
                 "--max-concurrent); try again when one has finished",
                 s->resolving, (unsigned long long)cfg->max_concurrent);
    return NULL;
  }
  resolve_job_t *j = xcalloc(1, sizeof *j);
  j->store = s;
  j->cb = cb;
  j->data = data;
  j->owner = xstrdup(owner);
  j->next = s->resolves;
  s->resolves = j;
  s->resolving++;
  cm_buf_init(&j->report, 16u << 20);
  cm_headtail_init(&j->errors, 4096, 8192);
  cm_strv_builder_t a = {0};
  /* pip resolves for the interpreter it runs under: the interpreter of the call. */
  cm_strv_addv(&a, py->executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--no-input", "--report", "-", NULL);
  index_args(s, false, true, &a);
  cm_strv_add(&a, "--");
  for (size_t i = 0; i < n; i++) cm_strv_add(&a, requirements[i]);
  sbx_run_callbacks_t cbs = {.on_output = resolve_output, .on_exit = resolve_exit};
  int rc = space_make(s, "resolve", false, &j->space, err) == 0
               ? start_installer_run(s, py->prefix, a.v, &j->space, NULL, &cbs, j, &j->run, err)
               : -1;
  cm_strv_free(a.v);
  if (rc < 0) {
    cm_warn("resolution: %s", cm_error_message(err));
    resolve_free(j);
    return NULL;
  }
  return j;
}

void env_store_cancel_resolve(env_store_t *s, void *handle) {
  resolve_job_t *j = handle;
  if (!j) return;
  j->cancelled = true;
  sbx_run_cancel(j->run);
}

/* ---------------------------------------------------------------- start-up */

/* What servers that are gone may have left in envs/ (or the state directory): trees moved
 * aside for removal. */
static void sweep_dir(env_store_t *s, int dir_fd) {
  DIR *d = list_dir(dir_fd);
  if (!d) return;
  cm_strv_builder_t gone = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, ".old-", 5) || !strncmp(e->d_name, ".evicted-", 9) ||
        !strncmp(e->d_name, ".trash-", 7))
      cm_strv_add(&gone, e->d_name);
  closedir(d);
  for (size_t i = 0; i < gone.n; i++) remove_later(s, dir_fd, gone.v[i]);
  cm_strv_free(gone.v);
}

/* Copies of builds that a server killed while copying left in envs/ (never published, never
 * counted): gone unless a live server builds that key (it holds the key's lock). */
static void sweep_staging(env_store_t *s) {
  DIR *d = list_dir(s->envs_fd);
  if (!d) return;
  cm_strv_builder_t stale = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, ".staging-", 9)) cm_strv_add(&stale, e->d_name);
  closedir(d);
  for (size_t i = 0; i < stale.n; i++) {
    cleanup_free char *key = xstrndup(stale.v[i] + 9, strcspn(stale.v[i] + 9, "-"));
    cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, key);
    cleanup_close int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) continue;
    cm_warn("removing an unfinished environment build left behind: %s/%s", s->envs_dir, stale.v[i]);
    discard(s, s->envs_fd, stale.v[i], "trash");
  }
  cm_strv_free(stale.v);
}

/* downloads/ holds the wheelhouse and nothing else.  Versions before it let every build
 * write there (it was their shared download cache), so what such a version left may be a
 * tenant's forgery: the first start of this version clears it all (marked in the state
 * directory, which no sandbox ever saw).  After that, every start keeps only wheels that
 * are regular files of the server's own, written by nobody else. */
static void clean_downloads(env_store_t *s) {
  struct stat st;
  if (fstatat(s->state_fd, ENV_DOWNLOADS_MARK, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
      !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    if (fstatat(s->state_fd, "downloads", &st, AT_SYMLINK_NOFOLLOW) == 0) {
      cm_info("clearing %s: builds of earlier versions could write there", s->downloads_dir);
      discard(s, s->state_fd, "downloads", "trash");
    }
    unlinkat(s->state_fd, ENV_DOWNLOADS_MARK, 0);
    cm_error_t err = CM_ERROR_INIT;
    if (cm_create_file_at(s->state_fd, ENV_DOWNLOADS_MARK, "", 0, 0600, &err) < 0) {
      cm_warn("environment store: %s", cm_error_message(&err));
      cm_error_release(&err);
    }
  }
  if (mkdirat(s->state_fd, "downloads", 0755) < 0 && errno != EEXIST)
    cm_warn("environment store: creating %s: %s", s->downloads_dir, strerror(errno));
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dl = cm_open_dir_at(s->state_fd, "downloads", &err);
  if (dl < 0 || fstat(dl, &st) < 0 || st.st_uid != geteuid()) {
    cm_warn("environment store: %s is not the server's: no wheelhouse", s->downloads_dir);
    cm_error_release(&err);
    return;
  }
  (void)fchmod(dl, 0755);
  /* Anything but the wheelhouse goes. */
  DIR *d = list_dir(dl);
  cm_strv_builder_t gone = {0};
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ENV_WHEELHOUSE))
      cm_strv_add(&gone, e->d_name);
  if (d) closedir(d);
  for (size_t i = 0; i < gone.n; i++) discard(s, dl, gone.v[i], "trash");
  cm_strv_free(gone.v);
  if (mkdirat(dl, ENV_WHEELHOUSE, 0755) < 0 && errno != EEXIST)
    cm_warn("environment store: creating %s: %s", s->wheels_dir, strerror(errno));
  int wfd = cm_open_dir_at(dl, ENV_WHEELHOUSE, &err);
  if (wfd < 0 || fstat(wfd, &st) < 0 || st.st_uid != geteuid()) {
    cm_warn("environment store: %s is not the server's: no wheelhouse", s->wheels_dir);
    cm_error_release(&err);
    if (wfd >= 0) close(wfd);
    return;
  }
  (void)fchmod(wfd, 0755);
  d = list_dir(wfd);
  time_t now = time(NULL);
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat ws;
    if (fstatat(wfd, e->d_name, &ws, AT_SYMLINK_NOFOLLOW) < 0) continue;
    /* Another server's import in progress (a day is far beyond any). */
    if (!strncmp(e->d_name, ".tmp-", 5) && now - ws.st_mtime < 86400) continue;
    bool ok = wheel_name_ok(e->d_name) && S_ISREG(ws.st_mode) && ws.st_uid == geteuid() &&
              !(ws.st_mode & 022) && ws.st_nlink == 1;
    if (ok) continue;
    cm_warn("wheelhouse: removing %s (not a wheel the server stored)", e->d_name);
    if (S_ISDIR(ws.st_mode))
      discard(s, wfd, e->d_name, "trash");
    else
      unlinkat(wfd, e->d_name, 0);
  }
  if (d) closedir(d);
  s->wheels_fd = wfd;
}

/* ---------------------------------------------------------------- public */

env_store_t *env_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir,
                           const char *runs_dir, sbx_backend_t *backend) {
  env_store_t *s = xcalloc(1, sizeof *s);
  s->loop = loop;
  s->cfg = cfg;
  s->backend = backend;
  s->state_dir = xstrdup(state_dir);
  s->envs_dir = xasprintf("%s/envs", state_dir);
  s->downloads_dir = xasprintf("%s/downloads", state_dir);
  s->wheels_dir = xasprintf("%s/" ENV_WHEELHOUSE, s->downloads_dir);
  s->runs_dir = xstrdup(runs_dir);
  s->state_fd = s->envs_fd = s->wheels_fd = s->runs_fd = -1;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(s->envs_dir, 0755, &err) < 0)
    cm_warn("environment store: %s", cm_error_message(&err));
  cm_error_release(&err);
  /* envs/ is traversable so that an environment can be mounted; the state dir above it is not. */
  chmod(s->envs_dir, 0755);
  s->state_fd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  s->envs_fd = open(s->envs_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  s->runs_fd = open(runs_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (s->state_fd < 0 || s->envs_fd < 0 || s->runs_fd < 0)
    cm_warn("environment store: cannot open its directories: %s", strerror(errno));
  /* The sweeps first: what clean_downloads moves aside is already on its way out. */
  if (s->envs_fd >= 0) sweep_dir(s, s->envs_fd);
  if (s->envs_fd >= 0) sweep_staging(s);
  if (s->state_fd >= 0) sweep_dir(s, s->state_fd);
  if (s->state_fd >= 0) clean_downloads(s);
  bool want_uv = strcmp(cfg->installer, "pip") != 0;
  if (want_uv) {
    char *uv = cm_find_executable(cfg->uv_path);
    char real[4096];
    if (uv && realpath(uv, real)) {
      free(uv);
      uv = xstrdup(real);
    }
    s->uv = uv;
    if (!uv && strcmp(cfg->installer, "uv") == 0)
      cm_warn("--installer uv: uv not found at '%s'; dependency installs will fail", cfg->uv_path);
  }
  s->installer_desc =
      s->uv ? xasprintf("uv (%s)", s->uv) : xstrdup("pip (the interpreter's own, into a venv)");
  return s;
}

void *env_store_ensure(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                       const char *uv_config, const char *owner, env_ready_cb cb,
                       env_progress_cb progress, void *data) {
  env_waiter_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->cb = cb;
  w->progress = progress;
  w->data = data;
  if (!s->uv && strcmp(s->cfg->installer, "uv") == 0) {
    cleanup_free char *msg =
        xasprintf("The server is configured with --installer uv, but uv was not found at '%s'.",
                  s->cfg->uv_path);
    answer(w, NULL, msg); /* from the loop, like every answer */
    return w;
  }
  bool pinned = true;
  for (size_t i = 0; i < n; i++) pinned = pinned && requirement_pinned(requirements[i]);
  cleanup_free char *key = env_key(s, py, requirements, n, uv_config);
  /* A build of this key in progress here: join it. */
  for (env_build_t *b = s->builds; b; b = b->next) {
    if (strcmp(b->key, key) == 0) {
      w->build = b;
      w->next = b->waiters;
      b->waiters = w;
      return w;
    }
  }
  env_handle_t *hit = s->envs_fd >= 0 ? handle_open(s, key, pinned, true) : NULL;
  if (hit) {
    answer(w, hit, NULL);
    return w;
  }
  env_build_t *b = xcalloc(1, sizeof *b);
  b->store = s;
  b->key = xstrdup(key);
  b->final_dir = xasprintf("%s/%s", s->envs_dir, key);
  b->lock_path = xasprintf("%s/%s.lock", s->envs_dir, key);
  b->lock_fd = open(b->lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  b->py.executable = xstrdup(py->executable);
  b->py.version = xstrdup(py->version);
  b->py.implementation = xstrdup(py->implementation);
  b->py.prefix = xstrdup(py->prefix);
  b->requirements = xcalloc(n + 1, sizeof *b->requirements);
  for (size_t i = 0; i < n; i++) b->requirements[i] = xstrdup(requirements[i]);
  b->n_requirements = n;
  b->pinned = pinned;
  b->uv_config = uv_config ? xstrdup(uv_config) : NULL;
  b->owner = owner ? xstrdup(owner) : NULL;
  space_init(&b->space);
  cm_headtail_init(&b->output, 1024, 1024);
  cm_buf_init(&b->line, ENV_PROGRESS_LINE_MAX + 1);
  /* What the inspect step prints goes into the manifest (ENV_MANIFEST_PART_MAX). */
  cm_buf_init(&b->inspect, ENV_MANIFEST_PART_MAX);
  b->next = s->builds;
  s->builds = b;
  w->build = b;
  b->waiters = w;
  b->lock_retry = cm_loop_timer(s->loop, 0, try_lock, b);
  return w;
}

void env_store_cancel(env_store_t *s, void *handle) {
  if (!handle) return;
  env_waiter_t *w = handle;
  w->cancelled = true;
  /* A build goes on for its other waiters (and for the cache); with none left, stop it. */
  env_build_t *b = w->build;
  if (!b) return;
  bool others = false;
  for (env_waiter_t *x = b->waiters; x; x = x->next) others |= !x->cancelled;
  if (others) return;
  if (b->run) {
    sbx_run_cancel(b->run); /* its exit fails the build */
    return;
  }
  /* Waiting for the lock, or copying: it would go on with no call (and no slot) of anyone's
   * behind it, its space and copy kept meanwhile. */
  build_fail(b, "The environment's build was cancelled.");
}

const char *env_store_installer(env_store_t *s) {
  return s->installer_desc;
}

void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes) {
  *count = 0;
  *bytes = 0;
  if (s->envs_fd < 0) return;
  entry_list_t l = {0};
  list_entries(s, &l, true);
  for (size_t i = 0; i < l.n; i++) *count += !l.v[i].wheel;
  *bytes = l.total;
  entries_release(&l);
}

void env_store_free(env_store_t *s) {
  if (!s) return;
  s->closing = true;
  if (s->warm) warm_free(s->warm);
  while (s->resolves) resolve_free(s->resolves); /* no callback: the callers are going too */
  while (s->builds) {
    env_build_t *b = s->builds;
    env_waiter_t *w = b->waiters;
    b->waiters = NULL;
    while (w) {
      env_waiter_t *next = w->next;
      free(w);
      w = next;
    }
    build_free(b);
  }
  while (s->answers) {
    env_waiter_t *w = s->answers;
    s->answers = w->next;
    env_release(w->hit);
    free(w->error);
    free(w);
  }
  while (s->removals) {
    env_removal_t *r = s->removals;
    sbx_call_free(r->call); /* what it did not remove is swept at the next start */
    removal_free(r);
  }
  int fds[] = {s->state_fd, s->envs_fd, s->wheels_fd, s->runs_fd};
  for (size_t i = 0; i < CM_ARRAY_SIZE(fds); i++)
    if (fds[i] >= 0) close(fds[i]);
  free(s->state_dir);
  free(s->envs_dir);
  free(s->downloads_dir);
  free(s->wheels_dir);
  free(s->runs_dir);
  free(s->uv);
  free(s->installer_desc);
  known_release(s->known, s->n_known);
  build_net_release(s);
  free(s);
}
