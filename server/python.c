/* Interpreters: find the default one and identify it by asking it once, in the
 * background (start-up never waits for it). */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/server-internal.h"

extern char **environ;

#define PY_PROBE_MAX_OUTPUT 16384
#define PY_PROBE_TIMEOUT_MS 20000

static char py_probe_code[] =
    "import sys, json, platform, sysconfig\n"
    "print(json.dumps({'version': platform.python_version(),"
    " 'implementation': sys.implementation.name,"
    " 'executable': sys.executable, 'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
    " 'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))\n";

typedef struct py_waiter {
  py_ready_cb cb;
  void *data;
  struct py_waiter *next;
} py_waiter_t;

struct py_registry {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  sbx_backend_t *host; /* the none backend: probes run trusted host binaries */
  py_interp_t def;
  bool ready;
  bool flush_scheduled;
  sbx_run_t *probe;
  cm_buf_t probe_out;
  py_waiter_t *waiters;
};

static void interp_release(py_interp_t *p) {
  free(p->path);
  free(p->executable);
  free(p->version);
  free(p->implementation);
  free(p->prefix);
  free(p->error);
  memset(p, 0, sizeof *p);
}

/* Newest pyenv build matching X.Y (or exactly X.Y.Z). */
static char *find_in_pyenv(const char *version) {
  const char *root = getenv("PYENV_ROOT");
  cleanup_free char *dflt = NULL;
  if (!root) {
    const char *home = getenv("HOME");
    if (!home) return NULL;
    dflt = xasprintf("%s/.pyenv", home);
    root = dflt;
  }
  cleanup_free char *vdir = xasprintf("%s/versions", root);
  DIR *d = opendir(vdir);
  if (!d) return NULL;
  char *best = NULL;
  unsigned best_patch = 0;
  size_t vlen = strlen(version);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, version, vlen) != 0) continue;
    const char *rest = e->d_name + vlen;
    unsigned patch = 0;
    if (*rest == '.') {
      char *end;
      patch = (unsigned)strtoul(rest + 1, &end, 10);
      if (*end) continue; /* 3.13.0t and the like: not a plain build */
    } else if (*rest) {
      continue;
    }
    char *cand = xasprintf("%s/%s/bin/python", vdir, e->d_name);
    if (access(cand, X_OK) == 0 && (!best || patch > best_patch)) {
      free(best);
      best = cand;
      best_patch = patch;
    } else {
      free(cand);
    }
  }
  closedir(d);
  return best;
}

static char *find_default(const srv_config_t *cfg) {
  if (cfg->python) return cm_find_executable(cfg->python);
  if (cfg->python_version) {
    cleanup_free char *name = xasprintf("python%s", cfg->python_version);
    char *p = cm_find_executable(name);
    if (p) return p;
    return find_in_pyenv(cfg->python_version);
  }
  return cm_find_executable("python3");
}

py_registry_t *py_registry_new(cm_loop_t *loop, const srv_config_t *cfg) {
  py_registry_t *r = xcalloc(1, sizeof *r);
  r->loop = loop;
  r->cfg = cfg;
  cm_error_t err = CM_ERROR_INIT;
  r->host = sbx_backend_new("none", &err);
  sbx_backend_probe(r->host);
  cm_buf_init(&r->probe_out, PY_PROBE_MAX_OUTPUT);
  return r;
}

static void flush_waiters(py_registry_t *r) {
  r->flush_scheduled = false;
  while (r->waiters) {
    py_waiter_t *w = r->waiters;
    r->waiters = w->next;
    py_ready_cb cb = w->cb;
    void *data = w->data;
    free(w);
    cb(data, r->def.ok ? &r->def : NULL, r->def.ok ? NULL : r->def.error);
  }
}

static void flush_deferred(void *data) { flush_waiters(data); }

static void set_ready(py_registry_t *r) {
  r->ready = true;
  flush_waiters(r);
}

static void probe_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  py_registry_t *r = data;
  if (stream == SBX_STDOUT) cm_buf_append(&r->probe_out, buf, len);
}

static void probe_exit(void *data, const sbx_result_t *res) {
  py_registry_t *r = data;
  sbx_run_free(r->probe);
  r->probe = NULL;
  json_error_t jerr;
  json_t *info = res->exit_code == 0 && r->probe_out.data
                     ? json_loadb(r->probe_out.data, r->probe_out.len, 0, &jerr)
                     : NULL;
  const char *version = json_string_value(json_object_get(info, "version"));
  const char *exe = json_string_value(json_object_get(info, "executable"));
  const char *base = json_string_value(json_object_get(info, "base_prefix"));
  if (!version || !exe || !base) {
    r->def.error = xasprintf("interpreter %s could not be identified (exit code %d)", r->def.path, res->exit_code);
    cm_err("%s", r->def.error);
  } else {
    char real[PATH_MAX];
    r->def.executable = xstrdup(realpath(exe, real) ? real : exe);
    r->def.version = xstrdup(version);
    r->def.implementation = xstrdup(json_string_value(json_object_get(info, "implementation")) ?: "cpython");
    r->def.prefix = xstrdup(realpath(base, real) ? real : base);
    r->def.free_threaded = json_is_true(json_object_get(info, "free_threaded"));
    r->def.ok = true;
    cm_info("default interpreter: Python %s (%s)", r->def.version, r->def.executable);
  }
  json_decref(info);
  cm_buf_release(&r->probe_out);
  set_ready(r);
}

void py_registry_start(py_registry_t *r) {
  r->def.path = find_default(r->cfg);
  if (!r->def.path) {
    r->def.error = r->cfg->python || r->cfg->python_version
                       ? xasprintf("no interpreter found for %s", r->cfg->python ? r->cfg->python : r->cfg->python_version)
                       : xstrdup("no python3 found on PATH");
    cm_err("%s", r->def.error);
    set_ready(r);
    return;
  }
  char *argv[] = {r->def.path, "-I", "-c", py_probe_code, NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = environ, /* a trusted host binary; pyenv shims need the host environment */
      .workdir = "/",
      .network = true,
      .limits = {.timeout_ms = PY_PROBE_TIMEOUT_MS, .grace_ms = 500},
  };
  sbx_run_callbacks_t cbs = {.on_output = probe_output, .on_exit = probe_exit};
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_run_start(r->loop, r->host, &spec, &cbs, r, &r->probe, &err) < 0) {
    r->def.error = xasprintf("cannot run %s: %s", r->def.path, cm_error_message(&err));
    cm_error_release(&err);
    cm_err("%s", r->def.error);
    set_ready(r);
  }
}

void *py_registry_when_ready(py_registry_t *r, py_ready_cb cb, void *data) {
  py_waiter_t *w = xcalloc(1, sizeof *w);
  w->cb = cb;
  w->data = data;
  /* Appended, so callers are answered in order. */
  py_waiter_t **p = &r->waiters;
  while (*p) p = &(*p)->next;
  *p = w;
  /* Never call back from inside this call: the caller is still setting up. */
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

py_interp_t *py_registry_default(py_registry_t *r) { return r->ready && r->def.ok ? &r->def : NULL; }

void py_registry_free(py_registry_t *r) {
  if (!r) return;
  if (r->probe) sbx_run_free(r->probe);
  while (r->waiters) {
    py_waiter_t *w = r->waiters;
    r->waiters = w->next;
    free(w);
  }
  cm_buf_release(&r->probe_out);
  interp_release(&r->def);
  sbx_backend_free(r->host);
  free(r);
}
