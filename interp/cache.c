/* The identity cache: what each interpreter said about itself, so that a warm start asks
 * none of them again. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "interp/interp-internal.h"

bool py_interp_fill(py_interp_t *p, json_t *info) {
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
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:b}", "version", p->version, "executable",
                   p->executable, "base_prefix", p->prefix, "implementation", p->implementation,
                   "releaselevel", p->prerelease ? "pre" : "final", "free_threaded",
                   p->free_threaded);
}

void py_cache_load(py_registry_t *r) {
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
    if (info && py_interp_fill(&c->info, info)) continue;
    if (error) c->info.error = xstrdup(error);
  }
  json_decref(root);
}

void py_cache_save(py_registry_t *r) {
  json_t *all = json_object();
  for (size_t i = 0; i < r->n_cands; i++) {
    py_candidate_t *c = r->cands[i];
    json_t *e =
        json_pack("{s:I, s:I}", "mtime_ns", (json_int_t)c->mtime_ns, "size", (json_int_t)c->size);
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
