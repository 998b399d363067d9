/* Dry-run resolutions (pip install --dry-run --report) for validate_script. */
#include <stdio.h>

#include "envstore/envstore-internal.h"

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
  char *executable; /* the interpreter whose pip resolves */
  bool cancelled;
  struct resolve_job *next;
} resolve_job_t;

void env_resolve_free(resolve_job_t *j) {
  for (resolve_job_t **p = &j->store->resolves; *p; p = &(*p)->next) {
    if (*p == j) {
      *p = j->next;
      break;
    }
  }
  if (j->run) sbx_run_free(j->run);
  j->store->resolving--;
  env_space_remove(j->store, &j->space);
  cm_buf_release(&j->report);
  cm_headtail_release(&j->errors);
  free(j->owner);
  free(j->executable);
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
  cleanup_error cm_error_t error = CM_ERROR_INIT;
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
        res->timed_out ? NULL : env_bound_message(j->store, &j->space, res, clean);
    cleanup_free char *why =
        res->timed_out || bound ? NULL : env_no_pip_message(j->store, true, j->executable, clean);
    if (!why && !res->timed_out && !bound) why = env_unreachable_message(j->store, clean);
    if (res->timed_out)
      cm_error_set(&error, 0, CM_ERR_LIMIT, "the resolution took too long");
    else if (why)
      cm_error_set(&error, 0, CM_ERR_UNAVAILABLE, "the resolution failed: %s", why);
    else if (bound)
      cm_error_set(&error, 0, CM_ERR_LIMIT, "the resolution failed: %s:\n%s", bound, clean);
    else
      cm_error_set(&error, 0, CM_ERR_UNAVAILABLE, "the resolution failed (exit code %d):\n%s",
                   res->exit_code, clean);
  }
  json_decref(report);
  if (!j->cancelled) j->cb(j->data, resolved, resolved ? NULL : &error);
  json_decref(resolved);
  env_resolve_free(j);
}

void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        const char *owner, env_resolved_cb cb, void *data, cm_error_t *err) {
  /* A resolution runs package code in a space of its own like a build, but holds no slot of
   * the executions': bounded here, in all and per principal, with an immediate answer. */
  const env_options_t *cfg = &s->opts;
  uint64_t own = 0, own_max = cfg->max_resolutions_per_owner;
  for (resolve_job_t *r = s->resolves; r; r = r->next) own += strcmp(r->owner, owner) == 0;
  if (own_max && own >= own_max) {
    cm_error_set(err, 0, CM_ERR_LIMIT,
                 "%llu dependency resolutions of yours are running already (at most %llu at once); "
                 "try again when one has finished",
                 (unsigned long long)own, (unsigned long long)own_max);
    return NULL;
  }
  if (s->resolving >= cfg->max_resolutions) {
    cm_error_set(err, 0, CM_ERR_LIMIT,
                 "%u dependency resolutions are running already (at most %llu at once, "
                 "--max-concurrent); try again when one has finished",
                 s->resolving, (unsigned long long)cfg->max_resolutions);
    return NULL;
  }
  resolve_job_t *j = xcalloc(1, sizeof *j);
  j->store = s;
  j->cb = cb;
  j->data = data;
  j->owner = xstrdup(owner);
  j->executable = xstrdup(py->executable);
  j->next = s->resolves;
  s->resolves = j;
  s->resolving++;
  cm_buf_init(&j->report, 16u << 20);
  cm_headtail_init(&j->errors, 4096, 8192);
  cm_strv_builder_t a = {0};
  /* pip resolves for the interpreter it runs under: the interpreter of the call. */
  cm_strv_addv(&a, py->executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--no-input", "--report", "-", NULL);
  env_index_args(s, false, true, &a);
  cm_strv_add(&a, "--");
  for (size_t i = 0; i < n; i++) cm_strv_add(&a, requirements[i]);
  sbx_run_callbacks_t cbs = {.on_output = resolve_output, .on_exit = resolve_exit};
  int rc = env_space_make(s, "resolve", false, &j->space, err) == 0
               ? env_start_installer_run(s, py->prefix, a.v, &j->space, NULL, &cbs, j, &j->run, err)
               : -1;
  cm_strv_free(a.v);
  if (rc < 0) {
    cm_warn("resolution: %s", cm_error_message(err));
    env_resolve_free(j);
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
