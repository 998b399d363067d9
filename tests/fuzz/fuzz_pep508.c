/* libFuzzer target for pystd/pep508.c.  The whole input is parsed as a requirement and
 * as a marker (render, parse the rendering again, evaluate, free); its lines are also
 * used as marker environment values and as two dependency lists to merge.  Checks,
 * beyond memory safety: rendering is a fixed point of parse+render, evaluation does
 * not depend on rendering, the merge keeps one entry per normalised name, and every
 * failure carries an error of the documented kinds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "pystd/pystd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_LINES 16

static void check_error(int rc, cm_error_t *err) {
  if (rc == 0) {
    if (err->msg != NULL) abort();
    return;
  }
  if (err->msg == NULL || (err->kind != CM_ERR_INVALID && err->kind != CM_ERR_LIMIT)) abort();
  cm_error_release(err);
}

static void fuzz_requirement(const char *buf, size_t len, const pep508_env_t *envs, size_t nenv) {
  cm_error_t err = CM_ERROR_INIT;
  pep508_requirement_t *req = NULL;
  int rc = pep508_requirement_parse(buf, len, &req, &err);
  check_error(rc, &err);
  if (rc != 0) {
    if (req != NULL) abort();
    return;
  }
  if (!pep508_name_is_valid(req->name, strlen(req->name)) || req->specifiers == NULL ||
      req->extras == NULL || req->extras[req->extras_len] != NULL ||
      req->extras_len > PEP508_MAX_EXTRAS)
    abort();
  char *text = pep508_requirement_render(req);
  pep508_requirement_t *again = NULL;
  rc = pep508_requirement_parse(text, strlen(text), &again, &err);
  if (rc != 0) {
    /* Canonical spacing and versions may lengthen the text past a limit, nothing else. */
    if (err.kind != CM_ERR_LIMIT) abort();
    cm_error_release(&err);
  } else {
    char *text2 = pep508_requirement_render(again);
    if (strcmp(text, text2) != 0 || strcmp(req->normalized_name, again->normalized_name) != 0)
      abort();
    for (size_t i = 0; i < nenv; i++)
      if (pep508_marker_evaluate(req->marker, &envs[i]) !=
          pep508_marker_evaluate(again->marker, &envs[i]))
        abort();
    free(text2);
    pep508_requirement_free(again);
  }
  free(text);
  pep508_requirement_free(req);
}

static void fuzz_marker(const char *buf, size_t len, const pep508_env_t *envs, size_t nenv) {
  cm_error_t err = CM_ERROR_INIT;
  pep508_marker_t *m = NULL;
  int rc = pep508_marker_parse(buf, len, &m, &err);
  check_error(rc, &err);
  if (rc != 0) {
    if (m != NULL) abort();
    return;
  }
  char *text = pep508_marker_render(m);
  pep508_marker_t *again = NULL;
  rc = pep508_marker_parse(text, strlen(text), &again, &err);
  if (rc != 0) {
    if (err.kind != CM_ERR_LIMIT) abort();
    cm_error_release(&err);
  } else {
    char *text2 = pep508_marker_render(again);
    if (strcmp(text, text2) != 0) abort();
    free(text2);
  }
  for (size_t i = 0; i < nenv; i++) {
    bool r = pep508_marker_evaluate(m, &envs[i]);
    if (again && pep508_marker_evaluate(again, &envs[i]) != r) abort();
  }
  pep508_marker_free(again);
  free(text);
  pep508_marker_free(m);
}

static void fuzz_merge(char **lines, size_t n) {
  size_t split = n / 2;
  cm_error_t err = CM_ERROR_INIT;
  char **out = NULL;
  int rc = pep508_merge_dependencies((const char *const *)lines, split,
                                     (const char *const *)lines + split, n - split, &out, &err);
  check_error(rc, &err);
  if (rc != 0) {
    if (out != NULL) abort();
    return;
  }
  size_t m = cm_strv_len(out);
  if (m > n || (n > 0 && m == 0)) abort();
  char *names[MAX_LINES];
  for (size_t i = 0; i < m; i++) {
    pep508_requirement_t *req = NULL;
    if (pep508_requirement_parse(out[i], strlen(out[i]), &req, &err) != 0) abort();
    names[i] = steal_pointer(&req->normalized_name);
    pep508_requirement_free(req);
    for (size_t j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0) abort();
  }
  for (size_t i = 0; i < m; i++) free(names[i]);
  cm_strv_free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;

  /* Lines, as NUL-terminated strings (an embedded NUL just shortens a line). */
  char *lines[MAX_LINES];
  size_t nlines = 0;
  for (size_t start = 0; start <= size && nlines < MAX_LINES;) {
    const char *nl = memchr(buf + start, '\n', size - start);
    size_t end = nl ? (size_t)(nl - buf) : size;
    lines[nlines++] = xstrndup(buf + start, end - start);
    if (nl == NULL) break;
    start = end + 1;
  }
  const char *v[12];
  for (size_t i = 0; i < 12; i++) v[i] = i + 1 < nlines ? lines[i + 1] : "";

  pep508_env_t envs[3] = {
      {
          .implementation_name = "cpython",
          .implementation_version = "3.12.1",
          .os_name = "posix",
          .platform_machine = "x86_64",
          .platform_python_implementation = "CPython",
          .platform_release = "6.1.0-18-amd64",
          .platform_system = "Linux",
          .platform_version = "#1 SMP PREEMPT_DYNAMIC",
          .python_full_version = "3.12.1",
          .python_version = "3.12",
          .sys_platform = "linux",
          .extra = "test",
      },
      {0},
      {
          .implementation_name = v[0],
          .implementation_version = v[1],
          .os_name = v[2],
          .platform_machine = v[3],
          .platform_python_implementation = v[4],
          .platform_release = v[5],
          .platform_system = v[6],
          .platform_version = v[7],
          .python_full_version = v[8],
          .python_version = v[9],
          .sys_platform = v[10],
          .extra = v[11],
      },
  };

  fuzz_requirement(buf, size, envs, 3);
  fuzz_marker(buf, size, envs, 3);
  if (nlines > 1) {
    fuzz_requirement(lines[0], strlen(lines[0]), envs, 3);
    fuzz_marker(lines[0], strlen(lines[0]), envs, 3);
  }
  fuzz_merge(lines, nlines);

  for (size_t i = 0; i < nlines; i++) free(lines[i]);
  return 0;
}
