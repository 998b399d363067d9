/* A call's script and dependency arguments turned into what a run needs: the PEP 723
 * metadata (never by rewriting the script, so tracebacks keep their line numbers), the
 * merged requirement list, and their parsed forms. */
#include <stdio.h>

#include "pystd/pystd.h"
#include "server/tools/tools.h"

void srv_script_release(srv_script_t *s) {
  pep723_metadata_release(&s->meta);
  cm_strv_free(s->requirements);
  for (size_t i = 0; i < s->n_requirements; i++) pep508_requirement_free(s->parsed[i]);
  free(s->parsed);
  memset(s, 0, sizeof *s);
}

int srv_script_prepare(const char *script, size_t len, json_t *extra, srv_script_t *out,
                       cm_error_t *err) {
  memset(out, 0, sizeof *out);
  if (pep723_parse_metadata(script, len, &out->meta, err) < 0) return -1;
  /* The extra list, as C strings. */
  size_t n_extra = json_is_array(extra) ? json_array_size(extra) : 0;
  cleanup_free const char **extras = xcalloc(n_extra + 1, sizeof *extras);
  for (size_t i = 0; i < n_extra; i++) {
    json_t *d = json_array_get(extra, i);
    if (!json_is_string(d) || strlen(json_string_value(d)) != json_string_length(d)) {
      srv_script_release(out); /* on failure nothing is left to release */
      return cm_error_set(err, 0, CM_ERR_INVALID, "dependencies[%zu] must be a string", i);
    }
    extras[i] = json_string_value(d);
  }
  char **merged = NULL;
  if (pep508_merge_dependencies((const char *const *)out->meta.dependencies,
                                out->meta.n_dependencies, extras, n_extra, &merged, err) < 0) {
    srv_script_release(out);
    return -1;
  }
  out->requirements = merged;
  out->n_requirements = cm_strv_len(merged);
  out->parsed = xcalloc(out->n_requirements + 1, sizeof *out->parsed);
  for (size_t i = 0; i < out->n_requirements; i++) {
    if (pep508_requirement_parse(merged[i], strlen(merged[i]), &out->parsed[i], err) < 0) {
      srv_script_release(out);
      return -1;
    }
  }
  return 0;
}
