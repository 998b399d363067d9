/* Choosing the interpreter of a call: the request, else requires-python, else the default. */
#include <stdio.h>

#include "interp/interp-internal.h"

char *py_registry_describe_available(py_registry_t *r) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = r->n_list; i-- > 0;) {
    py_interp_t *p = r->list[i];
    if (!p->ok) continue;
    if (b.len) cm_buf_appends(&b, ", ");
    cm_buf_printf(&b, "%s%s%s%s", strcmp(p->implementation, "cpython") ? p->implementation : "",
                  p->version, p->free_threaded ? "t" : "", p->is_default ? " (default)" : "");
  }
  if (!b.len) cm_buf_appends(&b, "none");
  return cm_buf_steal(&b);
}

typedef struct py_request {
  const char *impl; /* "cpython"/"pypy" or NULL for any */
  pep440_specifier_set_t *spec;
  const char *exact_prefix; /* "3.12" or "3.12.1": version must equal or start with it + '.' */
  int free_threaded;        /* 1 = must, 0 = must not, -1 = prefer not */
  const char *path;
} py_request_t;

static bool version_has_prefix(const char *version, const char *prefix) {
  size_t n = strlen(prefix);
  return strncmp(version, prefix, n) == 0 && (version[n] == '\0' || version[n] == '.');
}

static int parse_request(const char *req, py_request_t *out, cm_error_t *err) {
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
      return cm_error_set(
          err, 0, CM_ERR_INVALID,
          "'%s' is not a Python version request (e.g. 3.12, 3.12.1, 3.13t, >=3.11,<3.13)", req);
    }
    out->exact_prefix = v;
    return 0;
  }
  cleanup_error cm_error_t why = CM_ERROR_INIT;
  if (pep440_specifier_set_parse(v, strlen(v), &out->spec, &why) < 0)
    return cm_error_set(err, 0, CM_ERR_INVALID, "'%s' is not a Python version request: %s", req,
                        cm_error_message(&why));
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
  if (pep440_specifier_set_parse(requires_python, strlen(requires_python), &set, NULL) < 0)
    return false;
  bool ok = false;
  if (pep440_specifier_allows_python(set, p->version, strlen(p->version), &ok, NULL) < 0)
    ok = false;
  pep440_specifier_set_free(set);
  return ok;
}

py_interp_t *py_registry_select(py_registry_t *r, const char *request, const char *requires_python,
                                cm_error_t *err) {
  if (requires_python) {
    pep440_specifier_set_t *set = NULL;
    cleanup_error cm_error_t why = CM_ERROR_INIT;
    if (pep440_specifier_set_parse(requires_python, strlen(requires_python), &set, &why) < 0) {
      cm_error_set(err, 0, CM_ERR_INVALID, "requires-python: %s", cm_error_message(&why));
      return NULL;
    }
    pep440_specifier_set_free(set);
  }
  if (!request && !requires_python) {
    if (!r->def) {
      if (r->def_error.msg)
        cm_error_set(err, 0, r->def_error.kind, "%s", r->def_error.msg);
      else
        cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "no default interpreter");
    }
    return r->def;
  }
  py_interp_t *best = NULL;
  if (request) {
    py_request_t q;
    if (parse_request(request, &q, err) < 0) return NULL;
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
        if (pass == 0 &&
            ((q.free_threaded == -1 && p->free_threaded) || (p->prerelease && !q.exact_prefix)))
          continue;
        best = p;
      }
    }
    pep440_specifier_set_free(q.spec);
    if (!best) {
      cleanup_free char *avail = py_registry_describe_available(r);
      cm_error_set(err, 0, CM_ERR_NOT_FOUND, "No Python interpreter matches '%s'. Available: %s.",
                   request, avail);
      return NULL;
    }
    if (!satisfies_requires(requires_python, best)) {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "Python %s (chosen by python_version '%s') does not satisfy the script's "
                   "requires-python '%s'.",
                   best->version, request, requires_python);
      return NULL;
    }
    return best;
  }
  for (int pass = 0; pass < 2 && !best; pass++) {
    for (size_t i = 0; i < r->n_list && !best; i++) {
      py_interp_t *p = r->list[i];
      if (!p->ok || !satisfies_requires(requires_python, p)) continue;
      if (pass == 0 &&
          (p->free_threaded || p->prerelease || strcmp(p->implementation, "cpython") != 0))
        continue;
      best = p;
    }
  }
  if (!best) {
    cleanup_free char *avail = py_registry_describe_available(r);
    cm_error_set(
        err, 0, CM_ERR_NOT_FOUND,
        "No Python interpreter satisfies the script's requires-python '%s'. Available: %s.",
        requires_python, avail);
  }
  return best;
}
