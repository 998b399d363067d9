/* The environment store (see envcache.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "server/envcache.h"
#include "server/pep440.h"
#include "server/server-internal.h"

extern char **environ;

#define ENV_FORMAT 1
#define ENV_MANIFEST "mps-manifest.json"
#define ENV_TARGET "/env"
#define ENV_CACHE_TARGET "/cache"
#define ENV_LOCK_RETRY_MS 200
#define ENV_STEP_OUTPUT_TAIL (64u << 10)
#define ENV_PROGRESS_LINE_MAX 2048
#define ENV_MAX_FIND_LINKS 16

typedef struct env_waiter env_waiter_t;
typedef struct env_build env_build_t;

struct env_waiter {
  env_store_t *store;
  env_build_t *build; /* NULL once answered (or while answered from the cache) */
  env_ready_cb cb;
  env_progress_cb progress;
  void *data;
  env_handle_t *hit; /* a cache hit waiting for its deferred answer */
  bool cancelled;
  env_waiter_t *next;
};

typedef enum build_step { STEP_VENV = 0, STEP_INSTALL, STEP_INSPECT, STEP_DONE } build_step_t;

struct env_build {
  env_store_t *store;
  char *key;
  char *final_dir, *staging, *workdir, *lock_path;
  int lock_fd;
  py_interp_t py; /* a copy of what is needed (the registry entry outlives us anyway) */
  char **requirements;
  size_t n_requirements;
  bool pinned;     /* every requirement is ==version or a URL */
  char *uv_config; /* the script's [tool.uv] table as TOML, or NULL */
  build_step_t step;
  sbx_run_t *run;
  cm_headtail_t output; /* the current step's output, for error messages */
  cm_buf_t line;        /* a partial output line, for progress */
  cm_buf_t inspect;     /* STEP_INSPECT's stdout */
  cm_timer_t *lock_retry;
  env_waiter_t *waiters;
  uint64_t started_ms;
  env_build_t *next;
};

struct env_store {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  sbx_backend_t *backend;
  char *envs_dir, *downloads_dir, *work_dir;
  char *uv; /* resolved uv path when the installer is uv */
  char *installer_desc;
  env_build_t *builds;
  env_waiter_t *pending_hits;
  bool hits_scheduled;
  struct warm_job *warm;
  unsigned serial;
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

static int chown_tree(int dirfd_, uid_t uid, gid_t gid, int depth) {
  if (depth > 128) return -1;
  int fd = fcntl(dirfd_, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (fchownat(dirfd(d), e->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) rc = -1;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    if (S_ISDIR(st.st_mode)) {
      cleanup_close int sub =
          openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0 && chown_tree(sub, uid, gid, depth + 1) < 0) rc = -1;
    } else if (S_ISREG(st.st_mode) && (st.st_mode & (S_ISUID | S_ISGID))) {
      /* No set-id bits survive into an environment. */
      (void)!fchmodat(dirfd(d), e->d_name, st.st_mode & 0777 & ~(mode_t)022, 0);
    }
  }
  closedir(d);
  return rc;
}

/* Takes the finished tree back from the builder identity: a later build (which runs as
 * that identity and may run foreign code) must not be able to change it. */
static int reclaim(const char *dir, cm_error_t *err) {
  cleanup_close int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "open %s", dir);
  if (fchown(fd, getuid(), getgid()) < 0 || chown_tree(fd, getuid(), getgid(), 0) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "taking back %s", dir);
  fchmod(fd, 0755);
  return 0;
}

static uint64_t tree_size(int dirfd_, int depth) {
  if (depth > 128) return 0;
  int fd = fcntl(dirfd_, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return 0;
  }
  uint64_t total = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    total += (uint64_t)st.st_blocks * 512;
    if (S_ISDIR(st.st_mode)) {
      cleanup_close int sub =
          openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) total += tree_size(sub, depth + 1);
    }
  }
  closedir(d);
  return total;
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
  qsort(sorted, n, sizeof *sorted, cmp_str);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_string(sorted[i]));
  cm_strv_free(sorted);
  return arr;
}

static char *env_key(env_store_t *s, const py_interp_t *py, char *const *reqs, size_t n,
                     const char *uv_config) {
  const srv_config_t *cfg = s->cfg;
  json_t *id =
      json_pack("{s:i, s:{s:s, s:s, s:s, s:b}, s:o, s:s, s:{s:s?, s:s?, s:s?, s:b}}", "format",
                ENV_FORMAT, "python", "executable", py->executable, "version", py->version,
                "implementation", py->implementation, "free_threaded", py->free_threaded,
                "requirements", canonical_requirements(reqs, n), "installer", s->uv ? "uv" : "pip",
                "index", "index_url", cfg->index_url, "extra_index_urls", cfg->extra_index_urls,
                "find_links", cfg->find_links, "offline", cfg->offline);
  if (uv_config) json_object_set_new(id, "tool_uv", json_string(uv_config));
  char *text = json_dumps(id, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(id);
  char hex[65];
  cm_sha256_hex(text, strlen(text), hex);
  free(text);
  return xstrndup(hex, 32);
}

/* ---------------------------------------------------------------- handles */

static env_handle_t *handle_open(env_store_t *s, const char *key, json_t *manifest, bool cached) {
  env_handle_t *h = xcalloc(1, sizeof *h);
  h->key = xstrdup(key);
  h->host_dir = xasprintf("%s/%s", s->envs_dir, key);
  h->mount_target = backend_maps(s) ? xstrdup(ENV_TARGET) : NULL;
  h->python = xasprintf("%s/bin/python", h->mount_target ? h->mount_target : h->host_dir);
  h->cached = cached;
  json_t *pk = json_object_get(manifest, "packages");
  h->packages = json_is_object(pk) ? json_incref(pk) : json_object();
  cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, key);
  h->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  /* Shared while in use, so another server's eviction leaves it alone. */
  if (h->lock_fd >= 0) flock(h->lock_fd, LOCK_SH | LOCK_NB);
  cleanup_free char *m = xasprintf("%s/" ENV_MANIFEST, h->host_dir);
  utimensat(AT_FDCWD, m, NULL, 0); /* last use, for eviction */
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

/* A finished environment for key, if it exists, is complete, and is not too old to reuse. */
static json_t *load_manifest(env_store_t *s, const char *key, bool pinned) {
  cleanup_free char *path = xasprintf("%s/%s/" ENV_MANIFEST, s->envs_dir, key);
  cleanup_free char *text = NULL;
  size_t len;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_read_file(path, 1u << 20, &text, &len, &err) < 0) {
    cm_error_release(&err);
    return NULL;
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
  return m;
}

/* ---------------------------------------------------------------- waiters */

static void answer(env_waiter_t *w, env_handle_t *env, const char *error) {
  if (!w->cancelled) {
    w->cb(w->data, env, error);
  } else {
    env_release(env);
  }
  free(w);
}

static void flush_hits(void *data) {
  env_store_t *s = data;
  s->hits_scheduled = false;
  while (s->pending_hits) {
    env_waiter_t *w = s->pending_hits;
    s->pending_hits = w->next;
    answer(w, w->hit, NULL);
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
  cm_error_t err = CM_ERROR_INIT;
  if (b->staging) cm_rm_rf(b->staging, &err);
  cm_error_release(&err);
  if (b->workdir) cm_rm_rf(b->workdir, &err);
  cm_error_release(&err);
  if (b->lock_fd >= 0) close(b->lock_fd);
  free(b->key);
  free(b->final_dir);
  free(b->staging);
  free(b->workdir);
  free(b->lock_path);
  free(b->py.executable);
  free(b->py.version);
  free(b->py.implementation);
  free(b->py.prefix);
  cm_strv_free(b->requirements);
  free(b->uv_config);
  cm_headtail_release(&b->output);
  cm_buf_release(&b->line);
  cm_buf_release(&b->inspect);
  free(b);
}

/* Ends the build: every waiter gets the environment (opened anew) or the error. */
static void build_finish(env_build_t *b, json_t *manifest, const char *error) {
  env_waiter_t *w = b->waiters;
  b->waiters = NULL;
  env_store_t *s = b->store;
  cleanup_free char *key = xstrdup(b->key);
  build_free(b);
  while (w) {
    env_waiter_t *next = w->next;
    answer(w, error ? NULL : handle_open(s, key, manifest, false), error);
    w = next;
  }
  json_decref(manifest);
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
      "it is the sandbox's /tmp, see --tmp-size.)",
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
    cleanup_free char *msg =
        res->timed_out
            ? xasprintf("Building the environment failed: %s took longer than %llus.\n%s", what,
                        (unsigned long long)(b->store->cfg->build_timeout_ms / 1000), tail)
            : xasprintf("Building the environment failed while %s (exit code %d):\n%s%s", what,
                        res->exit_code, tail, disk);
    cm_warn("environment %s: %s", b->key, msg);
    build_finish(b, NULL, msg);
    return;
  }
  b->step++;
  build_next_step(b);
}

static void index_args(env_store_t *s, bool uv, cm_strv_builder_t *a) {
  const srv_config_t *cfg = s->cfg;
  if (cfg->offline && !uv) cm_strv_add(a, "--no-index");
  if (cfg->offline && uv) cm_strv_add(a, "--offline");
  if (cfg->index_url) {
    cm_strv_add(a, "--index-url");
    cm_strv_add(a, cfg->index_url);
  }
  cleanup_strv char **extra = split_spaces(cfg->extra_index_urls);
  for (char **e = extra; *e; e++) {
    cm_strv_add(a, "--extra-index-url");
    cm_strv_add(a, *e);
  }
  cleanup_strv char **links = split_spaces(cfg->find_links);
  for (char **l = links; *l; l++) {
    cm_strv_add(a, "--find-links");
    cm_strv_add(a, *l);
  }
}

/* The environment of installer runs: PATH and locale, the cache, and the installers' own
 * settings from the server's environment (index credentials, proxies, certificates). */
static void installer_env(env_store_t *s, cm_strv_builder_t *env) {
  const char *cache = backend_maps(s) ? ENV_CACHE_TARGET : s->downloads_dir;
  cm_strv_add(env, "PATH=/usr/local/bin:/usr/bin:/bin");
  cm_strv_add(env, "LANG=C.UTF-8");
  cm_strv_add(env, "HOME=/tmp");
  cm_strv_add(env, "PYTHONDONTWRITEBYTECODE=1");
  cm_strv_add(env, "PIP_DISABLE_PIP_VERSION_CHECK=1");
  cm_strv_add(env, "PIP_NO_INPUT=1");
  cm_strv_add(env, "PIP_PROGRESS_BAR=off");
  cm_strv_addf(env, "PIP_CACHE_DIR=%s/pip", cache);
  cm_strv_addf(env, "UV_CACHE_DIR=%s/uv", cache);
  cm_strv_add(env, "UV_NO_PROGRESS=1");
  for (char **e = environ; *e; e++) {
    if ((!strncmp(*e, "PIP_", 4) || !strncmp(*e, "UV_", 3)) && strncmp(*e, "PIP_CACHE_DIR=", 14) &&
        strncmp(*e, "UV_CACHE_DIR=", 13))
      cm_strv_add(env, *e);
    static const char *const pass[] = {
        "HTTP_PROXY=", "HTTPS_PROXY=",   "NO_PROXY=",     "http_proxy=",        "https_proxy=",
        "no_proxy=",   "SSL_CERT_FILE=", "SSL_CERT_DIR=", "REQUESTS_CA_BUNDLE="};
    for (size_t i = 0; i < CM_ARRAY_SIZE(pass); i++)
      if (!strncmp(*e, pass[i], strlen(pass[i]))) cm_strv_add(env, *e);
  }
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
 * network per --offline, as the builder identity, with the download cache writable and, for
 * a build, the staging directory writable at /env. */
static int start_installer_run(env_store_t *s, const char *prefix, char **argv, const char *workdir,
                               const char *staging, const sbx_run_callbacks_t *cbs, void *data,
                               sbx_run_t **run, cm_error_t *err) {
  const srv_config_t *cfg = s->cfg;
  cm_strv_builder_t env = {0};
  installer_env(s, &env);
  cm_strv_builder_t binds = {0};
  installer_binds(s, prefix, &binds);
  sbx_mount_t mounts[2];
  size_t n_mounts = 0;
  mounts[n_mounts++] =
      (sbx_mount_t){.host = s->downloads_dir, .target = ENV_CACHE_TARGET, .writable = true};
  if (staging)
    mounts[n_mounts++] = (sbx_mount_t){.host = staging, .target = ENV_TARGET, .writable = true};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = env.v,
      .workdir = workdir,
      .ro_binds = binds.v,
      .mounts = mounts,
      .n_mounts = backend_maps(s) ? n_mounts : 0,
      .network = !cfg->offline,
      .builder = true,
      .limits =
          {
              .timeout_ms = cfg->build_timeout_ms,
              .grace_ms = cfg->kill_grace_ms,
              .memory_bytes = CM_MAX(cfg->memory_bytes, 4ull << 30),
              .max_processes = CM_MAX(cfg->max_processes, 512),
              .file_size_bytes = CM_MAX(cfg->file_size_bytes, 2ull << 30),
              .open_files = CM_MAX(cfg->open_files, 4096),
              .tmp_bytes = CM_MAX(cfg->tmp_bytes, 1ull << 30),
          },
  };
  int rc = sbx_run_start(s->loop, s->backend, &spec, cbs, data, run, err);
  cm_strv_free(env.v);
  cm_strv_free(binds.v);
  return rc;
}

static void build_run(env_build_t *b, char **argv) {
  cm_headtail_release(&b->output);
  cm_headtail_init(&b->output, ENV_STEP_OUTPUT_TAIL / 4, ENV_STEP_OUTPUT_TAIL);
  sbx_run_callbacks_t cbs = {.on_output = on_step_output, .on_exit = on_step_exit};
  cm_error_t err = CM_ERROR_INIT;
  if (start_installer_run(b->store, b->py.prefix, argv, b->workdir, b->staging, &cbs, b, &b->run,
                          &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    build_finish(b, NULL, msg);
  }
}

static void relocate_bin(env_build_t *b) {
  cleanup_free char *bin = xasprintf("%s/bin", b->staging);
  DIR *d = opendir(bin);
  if (!d) return;
  size_t from_len = strlen(b->staging);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    cleanup_free char *p = xasprintf("%s/%s", bin, e->d_name);
    struct stat st;
    if (lstat(p, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) continue;
    cleanup_free char *text = NULL;
    size_t len;
    cm_error_t err = CM_ERROR_INIT;
    if (cm_read_file(p, 1u << 20, &text, &len, &err) < 0 || memchr(text, '\0', len)) {
      cm_error_release(&err);
      continue;
    }
    if (!memmem(text, len, b->staging, from_len)) continue;
    cm_buf_t out;
    cm_buf_init(&out, 0);
    const char *cur = text, *end = text + len, *hit;
    while ((hit = memmem(cur, (size_t)(end - cur), b->staging, from_len))) {
      cm_buf_append(&out, cur, (size_t)(hit - cur));
      cm_buf_appends(&out, b->final_dir);
      cur = hit + from_len;
    }
    cm_buf_append(&out, cur, (size_t)(end - cur));
    cm_write_file(p, out.data, out.len, st.st_mode & 0777, &err);
    chmod(p, st.st_mode & 0777);
    cm_error_release(&err);
    cm_buf_release(&out);
  }
  closedir(d);
}

static void write_manifest_and_publish(env_build_t *b) {
  env_store_t *s = b->store;
  json_t *packages = b->inspect.len ? json_loadb(b->inspect.data, b->inspect.len, 0, NULL) : NULL;
  if (!json_is_object(packages)) {
    json_decref(packages);
    packages = json_object();
  }
  json_t *requested = json_array();
  for (size_t i = 0; i < b->n_requirements; i++)
    json_array_append_new(requested, json_string(b->requirements[i]));
  cm_error_t err = CM_ERROR_INIT;
  if (reclaim(b->staging, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    json_decref(packages);
    json_decref(requested);
    build_finish(b, NULL, msg);
    return;
  }
  if (!backend_maps(s)) relocate_bin(b);
  cleanup_close int sfd = open(b->staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  uint64_t size = sfd >= 0 ? tree_size(sfd, 0) : 0;
  json_t *m = json_pack(
      "{s:i, s:s, s:{s:s, s:s, s:s}, s:o, s:O, s:s, s:I, s:I, s:b, s:I}", "format", ENV_FORMAT,
      "key", b->key, "python", "executable", b->py.executable, "version", b->py.version,
      "implementation", b->py.implementation, "requested", requested, "packages", packages,
      "installer", s->uv ? "uv" : "pip", "created", (json_int_t)time(NULL), "size",
      (json_int_t)size, "pinned", b->pinned, "build_ms", (json_int_t)(cm_now_ms() - b->started_ms));
  json_decref(packages);
  cleanup_free char *text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
  cleanup_free char *mpath = xasprintf("%s/" ENV_MANIFEST, b->staging);
  if (cm_write_file(mpath, text, strlen(text), 0644, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    json_decref(m);
    build_finish(b, NULL, msg);
    return;
  }
  /* Publish atomically.  An older environment with the same key (re-resolved because it
   * was too old) moves aside first; runs that still use it keep their mount. */
  if (access(b->final_dir, F_OK) == 0) {
    cleanup_free char *old =
        xasprintf("%s/.old-%s-%d-%u", s->envs_dir, b->key, (int)getpid(), s->serial++);
    if (rename(b->final_dir, old) == 0) {
      cm_rm_rf(old, &err);
      cm_error_release(&err);
    }
  }
  if (rename(b->staging, b->final_dir) < 0) {
    cleanup_free char *msg = xasprintf("Publishing the environment failed: %s", strerror(errno));
    json_decref(m);
    build_finish(b, NULL, msg);
    return;
  }
  free(b->staging);
  b->staging = NULL;
  cm_info("environment %s built in %llums (%zu requirements, %llu bytes)", b->key,
          (unsigned long long)(cm_now_ms() - b->started_ms), b->n_requirements,
          (unsigned long long)size);
  build_progress(b, "environment ready");
  build_finish(b, m, NULL);
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
  const char *env_path = maps ? ENV_TARGET : b->staging;
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
      index_args(s, s->uv != NULL, &a);
      cm_strv_add(&a, "--");
      for (size_t i = 0; i < b->n_requirements; i++) cm_strv_add(&a, b->requirements[i]);
      break;
    case STEP_INSPECT:
      cm_strv_addv(&a, env_python, "-I", "-c", inspect_code, NULL);
      break;
    case STEP_DONE:
      write_manifest_and_publish(b);
      return;
  }
  build_run(b, a.v);
  cm_strv_free(a.v);
}

static int prepare_dirs(env_build_t *b, cm_error_t *err) {
  env_store_t *s = b->store;
  b->staging = xasprintf("%s/.staging-%s-%d-%u", s->envs_dir, b->key, (int)getpid(), s->serial++);
  if (mkdir(b->staging, 0755) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "creating %s", b->staging);
  b->workdir = xasprintf("%s/build-XXXXXX", s->work_dir);
  if (!mkdtemp(b->workdir)) {
    free(b->workdir);
    b->workdir = NULL;
    return cm_error_set(err, errno, CM_ERR_IO, "creating a build directory");
  }
  if (b->uv_config && s->uv) {
    cleanup_free char *path = xasprintf("%s/uv.toml", b->workdir);
    if (cm_write_file(path, b->uv_config, strlen(b->uv_config), 0644, err) < 0) return -1;
  }
  return 0;
}

/* uv reads the script's [tool.uv] settings from a file in the build's work directory. */
static void add_uv_config(env_build_t *b, cm_strv_builder_t *a) {
  if (!b->uv_config || !b->store->uv) return;
  cm_strv_add(a, "--config-file");
  if (backend_maps(b->store))
    cm_strv_add(a, "/work/uv.toml");
  else
    cm_strv_addf(a, "%s/uv.toml", b->workdir);
}

/* Removes staging directories that a crashed build of this key left behind (we hold the
 * key's exclusive lock, so no live build owns them). */
static void remove_stale_staging(env_store_t *s, const char *key) {
  DIR *d = opendir(s->envs_dir);
  if (!d) return;
  cleanup_free char *prefix = xasprintf(".staging-%s-", key);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    cleanup_free char *p = xasprintf("%s/%s", s->envs_dir, e->d_name);
    cm_error_t err = CM_ERROR_INIT;
    cm_warn("removing an unfinished environment build left behind: %s", p);
    cm_rm_rf(p, &err);
    cm_error_release(&err);
  }
  closedir(d);
}

static void evict(env_store_t *s);

static void try_lock(cm_loop_t *loop, cm_timer_t *t, void *data) {
  env_build_t *b = data;
  b->lock_retry = NULL;
  if (flock(b->lock_fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      cleanup_free char *msg = xasprintf("Locking the environment failed: %s", strerror(errno));
      build_finish(b, NULL, msg);
      return;
    }
    /* Another server is building it: wait, without blocking the loop. */
    b->lock_retry = cm_loop_timer(b->store->loop, ENV_LOCK_RETRY_MS, try_lock, b);
    return;
  }
  /* Another server may have finished it while we waited. */
  json_t *m = load_manifest(b->store, b->key, b->pinned);
  if (m) {
    env_waiter_t *w = b->waiters;
    b->waiters = NULL;
    env_store_t *s = b->store;
    cleanup_free char *key = xstrdup(b->key);
    build_free(b);
    while (w) {
      env_waiter_t *next = w->next;
      answer(w, handle_open(s, key, m, true), NULL);
      w = next;
    }
    json_decref(m);
    return;
  }
  remove_stale_staging(b->store, b->key);
  evict(b->store);
  cm_error_t err = CM_ERROR_INIT;
  if (prepare_dirs(b, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_release(&err);
    build_finish(b, NULL, msg);
    return;
  }
  b->started_ms = cm_now_ms();
  b->step = STEP_VENV;
  build_next_step(b);
}

/* ---------------------------------------------------------------- eviction */

typedef struct env_entry {
  char *key;
  uint64_t size;
  int64_t used;
} env_entry_t;

static int by_use(const void *a, const void *b) {
  const env_entry_t *x = a, *y = b;
  return x->used < y->used ? -1 : x->used > y->used;
}

/* Least recently used environments go until the store fits --max-cache-bytes; one in use
 * (here or in another server: its lock is held shared) or being built is never touched. */
static void evict(env_store_t *s) {
  DIR *d = opendir(s->envs_dir);
  if (!d) return;
  env_entry_t *entries = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    cleanup_free char *mpath = xasprintf("%s/%s/" ENV_MANIFEST, s->envs_dir, e->d_name);
    struct stat st;
    if (stat(mpath, &st) < 0) continue;
    cleanup_free char *text = NULL;
    size_t len;
    cm_error_t err = CM_ERROR_INIT;
    uint64_t size = 0;
    if (cm_read_file(mpath, 1u << 20, &text, &len, &err) == 0) {
      json_t *m = json_loadb(text, len, 0, NULL);
      size = (uint64_t)json_integer_value(json_object_get(m, "size"));
      json_decref(m);
    }
    cm_error_release(&err);
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      entries = xrealloc(entries, cap * sizeof *entries);
    }
    entries[n++] = (env_entry_t){xstrdup(e->d_name), size, (int64_t)st.st_mtim.tv_sec};
    total += size;
  }
  closedir(d);
  if (n) qsort(entries, n, sizeof *entries, by_use);
  for (size_t i = 0; i < n && total > s->cfg->max_cache_bytes; i++) {
    cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, entries[i].key);
    cleanup_close int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) continue; /* in use or building */
    cleanup_free char *dir = xasprintf("%s/%s", s->envs_dir, entries[i].key);
    cleanup_free char *trash =
        xasprintf("%s/.evicted-%s-%d-%u", s->envs_dir, entries[i].key, (int)getpid(), s->serial++);
    if (rename(dir, trash) == 0) {
      cm_error_t err = CM_ERROR_INIT;
      cm_rm_rf(trash, &err);
      cm_error_release(&err);
      total -= CM_MIN(total, entries[i].size);
      cm_info("evicted environment %s (%llu bytes)", entries[i].key,
              (unsigned long long)entries[i].size);
    }
  }
  for (size_t i = 0; i < n; i++) free(entries[i].key);
  free(entries);
}

/* ---------------------------------------------------------------- warming */

typedef struct warm_job {
  env_store_t *store;
  sbx_run_t *run;
  char *workdir;
  cm_headtail_t output;
  uint64_t started_ms;
} warm_job_t;

static void warm_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  warm_job_t *w = data;
  cm_headtail_append(&w->output, buf, len);
}

static void warm_exit(void *data, const sbx_result_t *res) {
  warm_job_t *w = data;
  sbx_run_free(w->run);
  w->store->warm = NULL;
  if (res->exit_code == 0) {
    cm_info("package cache warmed in %llums", (unsigned long long)(cm_now_ms() - w->started_ms));
  } else {
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&w->output, &head, &hl, &tail, &tl);
    cleanup_free char *excerpt = cm_log_excerpt(tl ? tail : head, tl ? tl : hl, 300);
    cm_info("package cache warming did not complete (exit code %d): %s", res->exit_code, excerpt);
  }
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(w->workdir, &err);
  cm_error_release(&err);
  free(w->workdir);
  cm_headtail_release(&w->output);
  free(w);
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
  cm_strv_builder_t a = {0};
  cm_strv_addv(&a, py->executable, "-m", "pip", "download", "--quiet", "--no-input", "--dest",
               "/tmp/warm", NULL);
  index_args(s, false, &a);
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
    return;
  }
  warm_job_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->started_ms = cm_now_ms();
  cm_headtail_init(&w->output, 2048, 2048);
  w->workdir = xasprintf("%s/warm-XXXXXX", s->work_dir);
  if (!mkdtemp(w->workdir)) {
    cm_strv_free(a.v);
    free(w->workdir);
    cm_headtail_release(&w->output);
    free(w);
    return;
  }
  sbx_run_callbacks_t cbs = {.on_output = warm_output, .on_exit = warm_exit};
  if (start_installer_run(s, py->prefix, a.v, w->workdir, NULL, &cbs, w, &w->run, &err) < 0) {
    cm_info("cache warming could not start: %s", cm_error_message(&err));
    cm_error_release(&err);
    cm_rm_rf(w->workdir, &err);
    cm_error_release(&err);
    free(w->workdir);
    cm_headtail_release(&w->output);
    free(w);
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
  char *workdir;
  cm_buf_t report;
  cm_headtail_t errors;
  env_resolved_cb cb;
  void *data;
  bool cancelled;
} resolve_job_t;

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
    error = res->timed_out
                ? xstrdup("the resolution took too long")
                : xasprintf("the resolution failed (exit code %d):\n%s", res->exit_code, clean);
  }
  json_decref(report);
  if (!j->cancelled) j->cb(j->data, resolved, error);
  json_decref(resolved);
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(j->workdir, &err);
  cm_error_release(&err);
  free(j->workdir);
  cm_buf_release(&j->report);
  cm_headtail_release(&j->errors);
  free(j);
}

void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        env_resolved_cb cb, void *data) {
  resolve_job_t *j = xcalloc(1, sizeof *j);
  j->store = s;
  j->cb = cb;
  j->data = data;
  cm_buf_init(&j->report, 16u << 20);
  cm_headtail_init(&j->errors, 4096, 8192);
  j->workdir = xasprintf("%s/resolve-XXXXXX", s->work_dir);
  cm_strv_builder_t a = {0};
  /* pip resolves for the interpreter it runs under: the interpreter of the call. */
  cm_strv_addv(&a, py->executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--no-input", "--report", "-", NULL);
  index_args(s, false, &a);
  cm_strv_add(&a, "--");
  for (size_t i = 0; i < n; i++) cm_strv_add(&a, requirements[i]);
  sbx_run_callbacks_t cbs = {.on_output = resolve_output, .on_exit = resolve_exit};
  cm_error_t err = CM_ERROR_INIT;
  int rc = mkdtemp(j->workdir)
               ? start_installer_run(s, py->prefix, a.v, j->workdir, NULL, &cbs, j, &j->run, &err)
               : cm_error_set(&err, errno, CM_ERR_IO, "creating a directory");
  cm_strv_free(a.v);
  if (rc < 0) {
    /* Answer from the loop, never from inside this call. */
    cm_warn("resolution: %s", cm_error_message(&err));
    cm_error_release(&err);

    cm_rm_rf(j->workdir, &err);
    cm_error_release(&err);
    free(j->workdir);
    cm_buf_release(&j->report);
    cm_headtail_release(&j->errors);
    free(j);
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

/* ---------------------------------------------------------------- public */

void env_store_set_work_dir(env_store_t *s, const char *dir) {
  free(s->work_dir);
  s->work_dir = xstrdup(dir);
}

env_store_t *env_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir,
                           sbx_backend_t *backend) {
  env_store_t *s = xcalloc(1, sizeof *s);
  s->loop = loop;
  s->cfg = cfg;
  s->backend = backend;
  s->envs_dir = xasprintf("%s/envs", state_dir);
  s->downloads_dir = xasprintf("%s/downloads", state_dir);
  s->work_dir = xasprintf("%s/work", state_dir);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(s->envs_dir, 0755, &err) < 0 || cm_mkdir_p(s->downloads_dir, 0700, &err) < 0)
    cm_warn("environment store: %s", cm_error_message(&err));
  cm_error_release(&err);
  /* envs/ is traversable so that an environment can be mounted; the state dir above it is not. */
  chmod(s->envs_dir, 0755);
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
                       const char *uv_config, env_ready_cb cb, env_progress_cb progress,
                       void *data) {
  env_waiter_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->cb = cb;
  w->progress = progress;
  w->data = data;
  if (!s->uv && strcmp(s->cfg->installer, "uv") == 0) {
    w->hit = NULL;
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
  json_t *m = load_manifest(s, key, pinned);
  if (m) {
    w->hit = handle_open(s, key, m, true);
    json_decref(m);
    env_waiter_t **p = &s->pending_hits;
    while (*p) p = &(*p)->next;
    *p = w;
    if (!s->hits_scheduled) {
      s->hits_scheduled = true;
      cm_loop_defer(s->loop, flush_hits, s);
    }
    return w;
  }
  env_build_t *b = xcalloc(1, sizeof *b);
  b->store = s;
  b->key = xstrdup(key);
  b->final_dir = xasprintf("%s/%s", s->envs_dir, key);
  b->lock_path = xasprintf("%s/%s.lock", s->envs_dir, key);
  b->lock_fd = open(b->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  b->py.executable = xstrdup(py->executable);
  b->py.version = xstrdup(py->version);
  b->py.implementation = xstrdup(py->implementation);
  b->py.prefix = xstrdup(py->prefix);
  b->requirements = xcalloc(n + 1, sizeof *b->requirements);
  for (size_t i = 0; i < n; i++) b->requirements[i] = xstrdup(requirements[i]);
  b->n_requirements = n;
  b->pinned = pinned;
  b->uv_config = uv_config ? xstrdup(uv_config) : NULL;
  cm_headtail_init(&b->output, 1024, 1024);
  cm_buf_init(&b->line, ENV_PROGRESS_LINE_MAX + 1);
  cm_buf_init(&b->inspect, 4u << 20);
  b->next = s->builds;
  s->builds = b;
  w->build = b;
  b->waiters = w;
  if (!s->uv && strcmp(s->cfg->installer, "uv") == 0) {
    cleanup_free char *msg =
        xasprintf("The server is configured with --installer uv, but uv was not found at '%s'.",
                  s->cfg->uv_path);
    b->lock_retry = NULL;
    build_finish(b, NULL, msg); /* answers w now: callers must not rely on deferral here */
    return NULL;
  }
  /* Start from the loop, so the caller is never called back from inside this call. */
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
  if (!others && b->run) sbx_run_cancel(b->run);
}

const char *env_store_installer(env_store_t *s) {
  return s->installer_desc;
}

void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes) {
  *count = 0;
  *bytes = 0;
  DIR *d = opendir(s->envs_dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    cleanup_free char *mpath = xasprintf("%s/%s/" ENV_MANIFEST, s->envs_dir, e->d_name);
    cleanup_free char *text = NULL;
    size_t len;
    cm_error_t err = CM_ERROR_INIT;
    if (cm_read_file(mpath, 1u << 20, &text, &len, &err) == 0) {
      json_t *m = json_loadb(text, len, 0, NULL);
      (*count)++;
      *bytes += (uint64_t)json_integer_value(json_object_get(m, "size"));
      json_decref(m);
    }
    cm_error_release(&err);
  }
  closedir(d);
}

void env_store_free(env_store_t *s) {
  if (!s) return;
  if (s->warm) {
    sbx_run_free(s->warm->run);
    cm_error_t err = CM_ERROR_INIT;
    cm_rm_rf(s->warm->workdir, &err);
    cm_error_release(&err);
    free(s->warm->workdir);
    cm_headtail_release(&s->warm->output);
    free(s->warm);
  }
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
  while (s->pending_hits) {
    env_waiter_t *w = s->pending_hits;
    s->pending_hits = w->next;
    env_release(w->hit);
    free(w);
  }
  free(s->envs_dir);
  free(s->downloads_dir);
  free(s->work_dir);
  free(s->uv);
  free(s->installer_desc);
  free(s);
}
