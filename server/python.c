/* Interpreters: discover every Python on the machine, identify each by asking it once
 * (in the background: start-up never waits), cache the answers, and choose one per call. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "pystd/pystd.h"
#include "server/server-internal.h"

extern char **environ;

#define PY_PROBE_MAX_OUTPUT 16384
#define PY_PROBE_TIMEOUT_MS 20000
#define PY_MAX_CANDIDATES 256
#define PY_PROBES_AT_ONCE 2
#define PY_CACHE_FILE "interpreters.json"
#define PY_CACHE_MAX_BYTES (4u << 20)

static char py_probe_code[] =
    "import sys, json, platform, sysconfig\n"
    "print(json.dumps({'version': platform.python_version(),"
    " 'implementation': sys.implementation.name,"
    " 'releaselevel': sys.version_info.releaselevel,"
    " 'executable': sys.executable, 'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
    " 'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))\n";

typedef struct py_waiter {
  py_ready_cb cb;
  void *data;
  struct py_waiter *next;
} py_waiter_t;

typedef struct py_candidate {
  py_interp_t info;
  char *real;       /* realpath of the candidate file */
  int64_t mtime_ns; /* of the real file, for the cache */
  int64_t size;
  sbx_run_t *probe;
  cm_buf_t out;
  py_registry_t *reg;
} py_candidate_t;

struct py_registry {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  char *cache_path;
  sbx_backend_t *host; /* the none backend: probes run trusted host binaries */
  py_candidate_t *cands[PY_MAX_CANDIDATES];
  size_t n_cands;
  size_t next_probe, probes_running;
  py_interp_t **list; /* usable and broken, deduplicated, newest first */
  size_t n_list;
  py_interp_t *def;
  char *def_error;
  bool ready, flush_scheduled;
  bool cache_dirty; /* something was probed, or the cache lists other files: rewrite it */
  char *uv_dir;     /* where uv installs interpreters */
  /* A download in progress (uv python install): at most one at a time. */
  sbx_run_t *download;
  cm_headtail_t download_out;
  py_download_cb download_cb;
  void *download_data;
  bool rescanning;
  py_waiter_t *waiters;
};

/* ---------------------------------------------------------------- helpers */

static void interp_release(py_interp_t *p) {
  free(p->path);
  free(p->source);
  free(p->executable);
  free(p->version);
  free(p->implementation);
  free(p->prefix);
  free(p->error);
  memset(p, 0, sizeof *p);
}

static int version_cmp(const char *a, const char *b) {
  pep440_version_t va = PEP440_VERSION_INIT, vb = PEP440_VERSION_INIT;
  bool ok_a = pep440_version_parse(a, strlen(a), &va, NULL) == 0;
  bool ok_b = pep440_version_parse(b, strlen(b), &vb, NULL) == 0;
  int c = ok_a && ok_b ? pep440_version_compare(&va, &vb) : strcmp(a, b);
  pep440_version_release(&va);
  pep440_version_release(&vb);
  return c;
}

/* Is this executable a candidate name: python3, python3.N, python3.Nt, pypy3, pypy3.N? */
static bool interesting_name(const char *n) {
  const char *rest;
  if (strncmp(n, "python3", 7) == 0)
    rest = n + 7;
  else if (strncmp(n, "pypy3", 5) == 0)
    rest = n + 5;
  else
    return false;
  if (*rest == '\0') return true;
  if (*rest != '.') return false;
  rest++;
  if (*rest < '0' || *rest > '9') return false;
  while (*rest >= '0' && *rest <= '9') rest++;
  return *rest == '\0' || (rest[0] == 't' && rest[1] == '\0');
}

static void add_candidate(py_registry_t *r, const char *path, const char *source) {
  if (r->n_cands >= PY_MAX_CANDIDATES) return;
  struct stat st;
  if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || access(path, X_OK) < 0) return;
  char real[PATH_MAX];
  if (!realpath(path, real)) return;
  for (size_t i = 0; i < r->n_cands; i++)
    if (strcmp(r->cands[i]->real, real) == 0) return;
  py_candidate_t *c = xcalloc(1, sizeof *c);
  c->reg = r;
  c->real = xstrdup(real);
  c->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  c->size = (int64_t)st.st_size;
  c->info.path = xstrdup(path);
  c->info.source = xstrdup(source);
  cm_buf_init(&c->out, PY_PROBE_MAX_OUTPUT);
  r->cands[r->n_cands++] = c;
}

static void scan_dir(py_registry_t *r, const char *dir, const char *source) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char *names[128];
  size_t n = 0;
  while ((e = readdir(d)) && n < CM_ARRAY_SIZE(names))
    if (interesting_name(e->d_name)) names[n++] = xstrdup(e->d_name);
  closedir(d);
  /* Stable order: shortest (python3) first, then by name. */
  for (size_t i = 0; i < n; i++) {
    for (size_t j = i + 1; j < n; j++) {
      if (strlen(names[j]) < strlen(names[i]) ||
          (strlen(names[j]) == strlen(names[i]) && strcmp(names[j], names[i]) < 0)) {
        char *t = names[i];
        names[i] = names[j];
        names[j] = t;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    cleanup_free char *p = xasprintf("%s/%s", dir, names[i]);
    add_candidate(r, p, source);
    free(names[i]);
  }
}

/* DIR/<version>/bin, as pyenv and uv lay out their installs. */
static void scan_installs(py_registry_t *r, const char *dir, const char *source) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char *subs[256];
  size_t n = 0;
  while ((e = readdir(d)) && n < CM_ARRAY_SIZE(subs))
    if (e->d_name[0] != '.') subs[n++] = xstrdup(e->d_name);
  closedir(d);
  for (size_t i = 0; i < n; i++) {
    for (size_t j = i + 1; j < n; j++) {
      if (strcmp(subs[j], subs[i]) < 0) {
        char *t = subs[i];
        subs[i] = subs[j];
        subs[j] = t;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    cleanup_free char *bin = xasprintf("%s/%s/bin", dir, subs[i]);
    scan_dir(r, bin, source);
    free(subs[i]);
  }
}

static void discover(py_registry_t *r) {
  const srv_config_t *cfg = r->cfg;
  if (cfg->python) {
    cleanup_free char *p = cm_find_executable(cfg->python);
    if (p) add_candidate(r, p, "--python");
  }
  const char *path = getenv("PATH");
  if (path) {
    cleanup_free char *copy = xstrdup(path);
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
      size_t len = strlen(dir);
      /* pyenv's shims are scripts that pick a version by context: its versions are scanned
       * directly below instead. */
      if (len >= 6 && strcmp(dir + len - 6, "/shims") == 0) continue;
      if (dir[0] == '/') scan_dir(r, dir, "PATH");
    }
  }
  const char *pyenv = getenv("PYENV_ROOT");
  const char *home = getenv("HOME");
  cleanup_free char *pyenv_default = home ? xasprintf("%s/.pyenv", home) : NULL;
  if (!pyenv) pyenv = pyenv_default;
  if (pyenv) {
    cleanup_free char *v = xasprintf("%s/versions", pyenv);
    scan_installs(r, v, "pyenv");
  }
  const char *uv_dir = getenv("UV_PYTHON_INSTALL_DIR");
  cleanup_free char *uv_default = NULL;
  if (!uv_dir && home) {
    const char *xdg = getenv("XDG_DATA_HOME");
    uv_default = xdg ? xasprintf("%s/uv/python", xdg) : xasprintf("%s/.local/share/uv/python", home);
    uv_dir = uv_default;
  }
  if (uv_dir) {
    scan_installs(r, uv_dir, "uv");
    free(r->uv_dir);
    r->uv_dir = xstrdup(uv_dir);
  }
  if (cfg->python_dirs) {
    cleanup_free char *copy = xstrdup(cfg->python_dirs);
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
      scan_dir(r, dir, "--python-dir");
      cleanup_free char *bin = xasprintf("%s/bin", dir);
      scan_dir(r, bin, "--python-dir");
      scan_installs(r, dir, "--python-dir");
    }
  }
}

/* ---------------------------------------------------------------- identity cache */

static bool fill_from_json(py_interp_t *p, json_t *info) {
  const char *version = json_string_value(json_object_get(info, "version"));
  const char *exe = json_string_value(json_object_get(info, "executable"));
  const char *base = json_string_value(json_object_get(info, "base_prefix"));
  if (!version || !exe || !*exe || !base) return false;
  char real[PATH_MAX];
  p->executable = xstrdup(realpath(exe, real) ? real : exe);
  p->version = xstrdup(version);
  const char *impl = json_string_value(json_object_get(info, "implementation"));
  p->implementation = xstrdup(impl ? impl : "cpython");
  p->prefix = xstrdup(realpath(base, real) ? real : base);
  p->free_threaded = json_is_true(json_object_get(info, "free_threaded"));
  const char *level = json_string_value(json_object_get(info, "releaselevel"));
  p->prerelease = level && strcmp(level, "final") != 0;
  p->ok = true;
  return true;
}

static json_t *to_json(const py_interp_t *p) {
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:b}", "version", p->version, "executable", p->executable,
                   "base_prefix", p->prefix, "implementation", p->implementation, "releaselevel",
                   p->prerelease ? "pre" : "final", "free_threaded", p->free_threaded);
}

static void load_cache(py_registry_t *r) {
  cleanup_free char *text = NULL;
  size_t len;
  cm_error_t err = CM_ERROR_INIT;
  r->cache_dirty = true;
  if (cm_read_file(r->cache_path, PY_CACHE_MAX_BYTES, &text, &len, &err) < 0) {
    cm_error_release(&err);
    return;
  }
  json_t *root = json_loadb(text, len, 0, NULL);
  r->cache_dirty = json_object_size(json_object_get(root, "interpreters")) != r->n_cands;
  for (size_t i = 0; i < r->n_cands; i++) {
    py_candidate_t *c = r->cands[i];
    json_t *e = json_object_get(json_object_get(root, "interpreters"), c->real);
    if (!json_is_object(e)) continue;
    if (json_integer_value(json_object_get(e, "mtime_ns")) != c->mtime_ns ||
        json_integer_value(json_object_get(e, "size")) != c->size)
      continue; /* the binary changed: ask it again */
    json_t *info = json_object_get(e, "info");
    const char *error = json_string_value(json_object_get(e, "error"));
    if (info && fill_from_json(&c->info, info)) continue;
    if (error) c->info.error = xstrdup(error);
  }
  json_decref(root);
}

static void save_cache(py_registry_t *r) {
  json_t *all = json_object();
  for (size_t i = 0; i < r->n_cands; i++) {
    py_candidate_t *c = r->cands[i];
    json_t *e = json_pack("{s:I, s:I}", "mtime_ns", (json_int_t)c->mtime_ns, "size", (json_int_t)c->size);
    if (c->info.ok)
      json_object_set_new(e, "info", to_json(&c->info));
    else
      json_object_set_new(e, "error", json_string(c->info.error ? c->info.error : "unknown"));
    json_object_set_new(all, c->real, e);
  }
  json_t *root = json_pack("{s:i, s:o}", "format", 1, "interpreters", all);
  cleanup_free char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
  json_decref(root);
  cleanup_free char *tmp = xasprintf("%s.%d.tmp", r->cache_path, (int)getpid());
  cm_error_t err = CM_ERROR_INIT;
  if (cm_write_file(tmp, text, strlen(text), 0600, &err) < 0 || rename(tmp, r->cache_path) < 0) {
    cm_warn("saving the interpreter cache: %s", err.msg ? err.msg : strerror(errno));
    unlink(tmp);
  }
  cm_error_release(&err);
}

/* ---------------------------------------------------------------- readiness */

static void flush_waiters(py_registry_t *r) {
  r->flush_scheduled = false;
  while (r->waiters) {
    py_waiter_t *w = r->waiters;
    r->waiters = w->next;
    py_ready_cb cb = w->cb;
    void *data = w->data;
    free(w);
    cb(data, r->def, r->def ? NULL : r->def_error);
  }
}

static void flush_deferred(void *data) { flush_waiters(data); }

static int interp_order(const void *a, const void *b) {
  const py_interp_t *x = *(py_interp_t *const *)a, *y = *(py_interp_t *const *)b;
  if (x->ok != y->ok) return x->ok ? -1 : 1;
  if (!x->ok) return strcmp(x->path, y->path);
  int c = version_cmp(y->version, x->version); /* newest first */
  if (c) return c;
  if (x->free_threaded != y->free_threaded) return x->free_threaded ? 1 : -1;
  return strcmp(x->executable, y->executable);
}

static void rebuild_list(py_registry_t *r) {
  /* Deduplicate by the resolved executable (python3 and python3.11 are one interpreter). */
  free(r->list);
  r->n_list = 0;
  r->list = xcalloc(r->n_cands + 1, sizeof *r->list);
  for (size_t i = 0; i < r->n_cands; i++) {
    py_interp_t *p = &r->cands[i]->info;
    bool dup = false;
    for (size_t j = 0; j < r->n_list && p->ok; j++)
      if (r->list[j]->ok && strcmp(r->list[j]->executable, p->executable) == 0) dup = true;
    if (!dup) r->list[r->n_list++] = p;
  }
  qsort(r->list, r->n_list, sizeof *r->list, interp_order);
}

static void finish_discovery(py_registry_t *r) {
  rebuild_list(r);
  const srv_config_t *cfg = r->cfg;
  if (cfg->python) {
    for (size_t i = 0; i < r->n_cands; i++) {
      py_interp_t *p = &r->cands[i]->info;
      if (strcmp(p->source, "--python") == 0) {
        if (p->ok) {
          /* It may be a duplicate of a listed one: use the listed one. */
          for (size_t j = 0; j < r->n_list; j++)
            if (r->list[j]->ok && strcmp(r->list[j]->executable, p->executable) == 0) r->def = r->list[j];
        } else {
          r->def_error = xasprintf("the interpreter given with --python (%s) is broken: %s", p->path, p->error);
        }
      }
    }
    if (!r->def && !r->def_error) r->def_error = xasprintf("no interpreter found at %s (--python)", cfg->python);
  } else if (cfg->python_version) {
    char *why = NULL;
    r->def = py_registry_select(r, cfg->python_version, NULL, &why);
    if (!r->def) r->def_error = xasprintf("--python-version %s: %s", cfg->python_version, why);
    free(why);
  } else {
    /* The newest stable CPython with the GIL; else anything that works. */
    for (size_t i = 0; i < r->n_list && !r->def; i++) {
      py_interp_t *p = r->list[i];
      if (p->ok && !p->prerelease && !p->free_threaded && strcmp(p->implementation, "cpython") == 0) r->def = p;
    }
    for (size_t i = 0; i < r->n_list && !r->def; i++)
      if (r->list[i]->ok) r->def = r->list[i];
    if (!r->def) r->def_error = xstrdup("no working Python interpreter was found (PATH, pyenv, uv, --python-dir)");
  }
  if (r->def) {
    r->def->is_default = true;
    cm_info("%zu interpreters; default: %s %s (%s)", r->n_list, r->def->implementation, r->def->version,
            r->def->executable);
  } else {
    cm_err("%s", r->def_error);
  }
  if (r->cache_dirty) save_cache(r);
  r->ready = true;
  flush_waiters(r);
}

/* ---------------------------------------------------------------- probing */

static void probe_next(py_registry_t *r);

static void probe_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  py_candidate_t *c = data;
  if (stream == SBX_STDOUT) cm_buf_append(&c->out, buf, len);
}

static void probe_exit(void *data, const sbx_result_t *res) {
  py_candidate_t *c = data;
  py_registry_t *r = c->reg;
  sbx_run_free(c->probe);
  c->probe = NULL;
  r->probes_running--;
  json_t *info = res->exit_code == 0 && c->out.data ? json_loadb(c->out.data, c->out.len, 0, NULL) : NULL;
  if (!info || !fill_from_json(&c->info, info)) {
    c->info.error = res->timed_out ? xstrdup("timed out while identifying it")
                                   : xasprintf("could not be identified (exit code %d)", res->exit_code);
    cm_warn("interpreter %s %s", c->info.path, c->info.error);
  }
  json_decref(info);
  cm_buf_release(&c->out);
  probe_next(r);
}

static void probe_next(py_registry_t *r) {
  while (r->next_probe < r->n_cands && r->probes_running < PY_PROBES_AT_ONCE) {
    py_candidate_t *c = r->cands[r->next_probe++];
    if (c->info.ok || c->info.error) continue; /* from the cache */
    r->cache_dirty = true;
    char *argv[] = {c->real, "-I", "-c", py_probe_code, NULL};
    sbx_spec_t spec = {
        .argv = argv,
        .envp = environ,
        .workdir = "/",
        .network = true,
        .limits = {.timeout_ms = PY_PROBE_TIMEOUT_MS, .grace_ms = 500},
    };
    sbx_run_callbacks_t cbs = {.on_output = probe_output, .on_exit = probe_exit};
    cm_error_t err = CM_ERROR_INIT;
    if (sbx_run_start(r->loop, r->host, &spec, &cbs, c, &c->probe, &err) < 0) {
      c->info.error = xasprintf("cannot run: %s", cm_error_message(&err));
      cm_error_release(&err);
      continue;
    }
    r->probes_running++;
  }
  if (r->probes_running == 0 && r->next_probe >= r->n_cands) {
    if (!r->ready) {
      finish_discovery(r);
    } else if (r->rescanning) {
      /* After a download: the new interpreters join the list (the default stays). */
      r->rescanning = false;
      rebuild_list(r);
      if (r->cache_dirty) save_cache(r);
      py_download_cb cb = r->download_cb;
      r->download_cb = NULL;
      if (cb) cb(r->download_data, NULL);
    }
  }
}

/* ---------------------------------------------------------------- downloads (uv) */

bool py_registry_can_download(py_registry_t *r) {
  if (!r->cfg->allow_python_downloads) return false;
  cleanup_free char *uv = cm_find_executable(r->cfg->uv_path);
  return uv != NULL;
}

static void download_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  py_registry_t *r = data;
  cm_headtail_append(&r->download_out, buf, len);
}

static void download_exit(void *data, const sbx_result_t *res) {
  py_registry_t *r = data;
  sbx_run_free(r->download);
  r->download = NULL;
  if (res->exit_code != 0) {
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&r->download_out, &head, &hl, &tail, &tl);
    size_t n;
    cleanup_free char *clean = cm_utf8_sanitize(tl ? tail : head, tl ? tl : hl, &n);
    cleanup_free char *msg = xasprintf("uv could not install that Python (exit code %d): %s", res->exit_code, clean);
    cm_headtail_release(&r->download_out);
    py_download_cb cb = r->download_cb;
    r->download_cb = NULL;
    if (cb) cb(r->download_data, msg);
    return;
  }
  cm_headtail_release(&r->download_out);
  /* Find and identify what uv installed. */
  r->rescanning = true;
  if (r->uv_dir) scan_installs(r, r->uv_dir, "uv");
  probe_next(r);
}

int py_registry_download(py_registry_t *r, const char *request, py_download_cb cb, void *data, cm_error_t *err) {
  if (r->download) return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "another interpreter download is in progress; try again shortly");
  cleanup_free char *uv = cm_find_executable(r->cfg->uv_path);
  if (!uv) return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "uv was not found at '%s'", r->cfg->uv_path);
  char *argv[] = {uv, "python", "install", (char *)(uintptr_t)request, NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = environ, /* uv's own settings (install dir, mirrors, proxies) */
      .workdir = "/",
      .network = true,
      .limits = {.timeout_ms = r->cfg->build_timeout_ms, .grace_ms = 1000},
  };
  cm_headtail_init(&r->download_out, 2048, 4096);
  sbx_run_callbacks_t cbs = {.on_output = download_output, .on_exit = download_exit};
  if (sbx_run_start(r->loop, r->host, &spec, &cbs, r, &r->download, err) < 0) {
    cm_headtail_release(&r->download_out);
    return -1;
  }
  r->download_cb = cb;
  r->download_data = data;
  cm_info("downloading Python %s with uv", request);
  return 0;
}

void py_registry_cancel_download(py_registry_t *r) {
  r->download_cb = NULL;
}

/* ---------------------------------------------------------------- public */

py_registry_t *py_registry_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir) {
  py_registry_t *r = xcalloc(1, sizeof *r);
  r->loop = loop;
  r->cfg = cfg;
  r->cache_path = xasprintf("%s/%s", state_dir, PY_CACHE_FILE);
  cm_error_t err = CM_ERROR_INIT;
  r->host = sbx_backend_new("none", &err);
  sbx_backend_probe(r->host);
  return r;
}

void py_registry_start(py_registry_t *r) {
  discover(r);
  load_cache(r);
  probe_next(r);
}

void *py_registry_when_ready(py_registry_t *r, py_ready_cb cb, void *data) {
  py_waiter_t *w = xcalloc(1, sizeof *w);
  w->cb = cb;
  w->data = data;
  py_waiter_t **p = &r->waiters;
  while (*p) p = &(*p)->next;
  *p = w;
  if (r->ready && !r->flush_scheduled) {
    r->flush_scheduled = true;
    cm_loop_defer(r->loop, flush_deferred, r);
  }
  return w;
}

void py_registry_cancel_wait(py_registry_t *r, void *handle) {
  for (py_waiter_t **p = &r->waiters; *p; p = &(*p)->next) {
    if (*p == handle) {
      py_waiter_t *w = *p;
      *p = w->next;
      free(w);
      return;
    }
  }
}

py_interp_t *py_registry_default(py_registry_t *r) { return r->ready ? r->def : NULL; }

py_interp_t *const *py_registry_list(py_registry_t *r, size_t *count) {
  *count = r->ready ? r->n_list : 0;
  return r->list;
}

char *py_registry_describe_available(py_registry_t *r) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = r->n_list; i-- > 0;) {
    py_interp_t *p = r->list[i];
    if (!p->ok) continue;
    if (b.len) cm_buf_appends(&b, ", ");
    cm_buf_printf(&b, "%s%s%s%s", strcmp(p->implementation, "cpython") ? p->implementation : "", p->version,
                  p->free_threaded ? "t" : "", p->is_default ? " (default)" : "");
  }
  if (!b.len) cm_buf_appends(&b, "none");
  return cm_buf_steal(&b);
}

typedef struct py_request {
  const char *impl;          /* "cpython"/"pypy" or NULL for any */
  pep440_specifier_set_t *spec;
  const char *exact_prefix;  /* "3.12" or "3.12.1": version must equal or start with it + '.' */
  int free_threaded;         /* 1 = must, 0 = must not, -1 = prefer not */
  const char *path;
} py_request_t;

static bool version_has_prefix(const char *version, const char *prefix) {
  size_t n = strlen(prefix);
  return strncmp(version, prefix, n) == 0 && (version[n] == '\0' || version[n] == '.');
}

static int parse_request(const char *req, py_request_t *out, char **error) {
  memset(out, 0, sizeof *out);
  out->free_threaded = -1;
  while (*req == ' ') req++;
  if (req[0] == '/') {
    out->path = req;
    return 0;
  }
  const char *v = req;
  if (strncmp(v, "cpython", 7) == 0) {
    out->impl = "cpython";
    v += 7;
  } else if (strncmp(v, "pypy", 4) == 0) {
    out->impl = "pypy";
    v += 4;
  } else if (strncmp(v, "python", 6) == 0) {
    v += 6;
  }
  if (*v == '@' || *v == '-') v++;
  if (*v >= '0' && *v <= '9') {
    /* X.Y, X.Y.Z, optionally with a free-threaded 't'. */
    const char *p = v;
    int dots = 0;
    while ((*p >= '0' && *p <= '9') || *p == '.') dots += *p++ == '.';
    if (*p == 't' && p[1] == '\0') {
      out->free_threaded = 1;
    } else if (*p != '\0' || dots > 2 || p[-1] == '.') {
      *error = xasprintf("'%s' is not a Python version request (e.g. 3.12, 3.12.1, 3.13t, >=3.11,<3.13)", req);
      return -1;
    }
    out->exact_prefix = v;
    return 0;
  }
  cm_error_t err = CM_ERROR_INIT;
  if (pep440_specifier_set_parse(v, strlen(v), &out->spec, &err) < 0) {
    *error = xasprintf("'%s' is not a Python version request: %s", req, cm_error_message(&err));
    cm_error_release(&err);
    return -1;
  }
  return 0;
}

static bool request_matches(const py_request_t *q, const py_interp_t *p, size_t prefix_len) {
  if (!p->ok) return false;
  if (q->path) return strcmp(q->path, p->path) == 0 || strcmp(q->path, p->executable) == 0;
  if (q->impl && strcmp(q->impl, p->implementation) != 0) return false;
  if (q->free_threaded == 1 && !p->free_threaded) return false;
  if (q->exact_prefix) {
    cleanup_free char *prefix = xstrndup(q->exact_prefix, prefix_len);
    return version_has_prefix(p->version, prefix);
  }
  if (q->spec) {
    pep440_version_t v = PEP440_VERSION_INIT;
    if (pep440_version_parse(p->version, strlen(p->version), &v, NULL) < 0) return false;
    bool ok = pep440_specifier_contains(q->spec, &v, true);
    pep440_version_release(&v);
    return ok;
  }
  return true;
}

static bool satisfies_requires(const char *requires_python, const py_interp_t *p) {
  if (!requires_python) return true;
  pep440_specifier_set_t *set = NULL;
  if (pep440_specifier_set_parse(requires_python, strlen(requires_python), &set, NULL) < 0) return false;
  bool ok = false;
  if (pep440_specifier_allows_python(set, p->version, strlen(p->version), &ok, NULL) < 0) ok = false;
  pep440_specifier_set_free(set);
  return ok;
}

py_interp_t *py_registry_select(py_registry_t *r, const char *request, const char *requires_python,
                                char **error) {
  *error = NULL;
  if (requires_python) {
    pep440_specifier_set_t *set = NULL;
    cm_error_t err = CM_ERROR_INIT;
    if (pep440_specifier_set_parse(requires_python, strlen(requires_python), &set, &err) < 0) {
      *error = xasprintf("requires-python: %s", cm_error_message(&err));
      cm_error_release(&err);
      return NULL;
    }
    pep440_specifier_set_free(set);
  }
  if (!request && !requires_python) {
    if (!r->def) *error = xstrdup(r->def_error ? r->def_error : "no default interpreter");
    return r->def;
  }
  py_interp_t *best = NULL;
  if (request) {
    py_request_t q;
    if (parse_request(request, &q, error) < 0) return NULL;
    size_t prefix_len = 0;
    if (q.exact_prefix) {
      prefix_len = strlen(q.exact_prefix);
      if (q.free_threaded == 1) prefix_len--;
    }
    /* The list is newest first: the first match wins, preferring GIL builds unless a free-
     * threaded one was asked for, and stable releases unless the request names a pre-release. */
    for (int pass = 0; pass < 2 && !best; pass++) {
      for (size_t i = 0; i < r->n_list && !best; i++) {
        py_interp_t *p = r->list[i];
        if (!request_matches(&q, p, prefix_len)) continue;
        if (pass == 0 && ((q.free_threaded == -1 && p->free_threaded) || (p->prerelease && !q.exact_prefix)))
          continue;
        best = p;
      }
    }
    pep440_specifier_set_free(q.spec);
    if (!best) {
      cleanup_free char *avail = py_registry_describe_available(r);
      *error = xasprintf("No Python interpreter matches '%s'. Available: %s.", request, avail);
      return NULL;
    }
    if (!satisfies_requires(requires_python, best)) {
      *error = xasprintf("Python %s (chosen by python_version '%s') does not satisfy the script's requires-python '%s'.",
                         best->version, request, requires_python);
      return NULL;
    }
    return best;
  }
  for (int pass = 0; pass < 2 && !best; pass++) {
    for (size_t i = 0; i < r->n_list && !best; i++) {
      py_interp_t *p = r->list[i];
      if (!p->ok || !satisfies_requires(requires_python, p)) continue;
      if (pass == 0 && (p->free_threaded || p->prerelease || strcmp(p->implementation, "cpython") != 0)) continue;
      best = p;
    }
  }
  if (!best) {
    cleanup_free char *avail = py_registry_describe_available(r);
    *error = xasprintf("No Python interpreter satisfies the script's requires-python '%s'. Available: %s.",
                       requires_python, avail);
  }
  return best;
}

void py_registry_free(py_registry_t *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_cands; i++) {
    py_candidate_t *c = r->cands[i];
    if (c->probe) sbx_run_free(c->probe);
    cm_buf_release(&c->out);
    interp_release(&c->info);
    free(c->real);
    free(c);
  }
  while (r->waiters) {
    py_waiter_t *w = r->waiters;
    r->waiters = w->next;
    free(w);
  }
  if (r->download) {
    sbx_run_free(r->download);
    cm_headtail_release(&r->download_out);
  }
  free(r->uv_dir);
  free(r->list);
  free(r->def_error);
  free(r->cache_path);
  sbx_backend_free(r->host);
  free(r);
}
