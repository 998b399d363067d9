/* The key of an environment: what it was built from, hashed. */
#include <stdio.h>

#include "envstore/envstore-internal.h"

bool env_requirement_pinned(const char *req) {
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

char *env_key(env_store_t *s, const py_interp_t *py, char *const *reqs, size_t n,
              const char *uv_config) {
  const env_options_t *cfg = &s->opts;
  /* The index settings as they are, but never the secret of a credential: a rotated
   * password must not rebuild every environment. */
  env_index_settings(s);
  cleanup_free char *index_url = s->index_url ? eg_url_redact(s->index_url) : NULL;
  cleanup_free char *extra_index_urls = env_redacted_join(s->extra_index_urls);
  cleanup_free char *find_links = env_redacted_join(s->find_links);
  json_t *id =
      json_pack("{s:i, s:{s:s, s:s, s:s, s:b}, s:o, s:s, s:{s:s?, s:s?, s:s?, s:b}}", "format",
                ENV_FORMAT, "python", "executable", py->executable, "version", py->version,
                "implementation", py->implementation, "free_threaded", py->free_threaded,
                "requirements", canonical_requirements(reqs, n), "installer", s->uv ? "uv" : "pip",
                "index", "index_url", index_url, "extra_index_urls", extra_index_urls, "find_links",
                find_links, "offline", cfg->offline);
  if (uv_config) json_object_set_new(id, "tool_uv", json_string(uv_config));
  char *text = json_dumps(id, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(id);
  char hex[65];
  cm_sha256_hex(text, strlen(text), hex);
  free(text);
  return xstrndup(hex, 32);
}
