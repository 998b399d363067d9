/* The interpreter registry: discovers every Python on the machine, identifies each by asking
 * it once (in the background: start-up never waits), caches the answers, and tells waiters
 * when it is ready. */
#include <stdio.h>

#include "interp/interp-internal.h"

extern char **environ;

static char py_probe_code[] =
    "import sys, json, platform, sysconfig\n"
    "print(json.dumps({'version': platform.python_version(),"
    " 'implementation': sys.implementation.name,"
    " 'releaselevel': sys.version_info.releaselevel,"
    " 'executable': sys.executable, 'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
    " 'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))\n";

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

/* ---------------------------------------------------------------- readiness */

static void flush_waiters(py_registry_t *r) {
  r->flush_scheduled = false;
  while (r->waiters) {
    py_waiter_t *w = r->waiters;
    r->waiters = w->next;
    py_ready_cb cb = w->cb;
    void *data = w->data;
    free(w);
    cb(data, r->def, r->def ? NULL : &r->def_error);
  }
}

static void flush_deferred(void *data) {
  flush_waiters(data);
}

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
  if (r->opts.python) {
    for (size_t i = 0; i < r->n_cands; i++) {
      py_interp_t *p = &r->cands[i]->info;
      if (strcmp(p->source, "--python") == 0) {
        if (p->ok) {
          /* It may be a duplicate of a listed one: use the listed one. */
          for (size_t j = 0; j < r->n_list; j++)
            if (r->list[j]->ok && strcmp(r->list[j]->executable, p->executable) == 0)
              r->def = r->list[j];
        } else {
          cm_error_set(&r->def_error, 0, CM_ERR_UNAVAILABLE,
                       "the interpreter given with --python (%s) is broken: %s", p->path, p->error);
        }
      }
    }
    if (!r->def && !r->def_error.msg)
      cm_error_set(&r->def_error, 0, CM_ERR_NOT_FOUND, "no interpreter found at %s (--python)",
                   r->opts.python);
  } else if (r->opts.python_version) {
    cleanup_error cm_error_t why = CM_ERROR_INIT;
    r->def = py_registry_select(r, r->opts.python_version, NULL, &why);
    if (!r->def)
      cm_error_set(&r->def_error, 0, CM_ERR_NOT_FOUND, "--python-version %s: %s",
                   r->opts.python_version, cm_error_message(&why));
  } else {
    /* The newest stable CPython with the GIL; else anything that works. */
    for (size_t i = 0; i < r->n_list && !r->def; i++) {
      py_interp_t *p = r->list[i];
      if (p->ok && !p->prerelease && !p->free_threaded && strcmp(p->implementation, "cpython") == 0)
        r->def = p;
    }
    for (size_t i = 0; i < r->n_list && !r->def; i++)
      if (r->list[i]->ok) r->def = r->list[i];
    if (!r->def)
      cm_error_set(&r->def_error, 0, CM_ERR_UNAVAILABLE,
                   "no working Python interpreter was found (PATH, pyenv, uv, --python-dir)");
  }
  if (r->def) {
    r->def->is_default = true;
    cm_info("%zu interpreters; default: %s %s (%s)", r->n_list, r->def->implementation,
            r->def->version, r->def->executable);
  } else {
    cm_err("%s", cm_error_message(&r->def_error));
  }
  if (r->cache_dirty) py_cache_save(r);
  r->ready = true;
  flush_waiters(r);
}

/* ---------------------------------------------------------------- probing */

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
  json_t *info =
      res->exit_code == 0 && c->out.data ? json_loadb(c->out.data, c->out.len, 0, NULL) : NULL;
  if (!info || !py_interp_fill(&c->info, info)) {
    c->info.error = res->timed_out
                        ? xstrdup("timed out while identifying it")
                        : xasprintf("could not be identified (exit code %d)", res->exit_code);
    cm_warn("interpreter %s %s", c->info.path, c->info.error);
  }
  json_decref(info);
  cm_buf_release(&c->out);
  py_probe_next(r);
}

void py_probe_next(py_registry_t *r) {
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
      if (r->cache_dirty) py_cache_save(r);
      py_download_cb cb = r->download_cb;
      r->download_cb = NULL;
      if (cb) cb(r->download_data, NULL);
    }
  }
}

/* ---------------------------------------------------------------- public */

py_registry_t *py_registry_new(cm_loop_t *loop, const py_options_t *opts, const char *state_dir) {
  py_registry_t *r = xcalloc(1, sizeof *r);
  r->loop = loop;
  r->opts = *opts;
  r->cache_path = xasprintf("%s/%s", state_dir, PY_CACHE_FILE);
  cm_error_t err = CM_ERROR_INIT;
  r->host = sbx_backend_new("none", &err);
  sbx_backend_probe(r->host);
  return r;
}

void py_registry_start(py_registry_t *r) {
  py_discover(r);
  py_cache_load(r);
  py_probe_next(r);
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

py_interp_t *py_registry_default(py_registry_t *r) {
  return r->ready ? r->def : NULL;
}

py_interp_t *const *py_registry_list(py_registry_t *r, size_t *count) {
  *count = r->ready ? r->n_list : 0;
  return r->list;
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
  cm_error_release(&r->def_error);
  free(r->cache_path);
  sbx_backend_free(r->host);
  free(r);
}
