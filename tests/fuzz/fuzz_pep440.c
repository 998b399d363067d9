/* libFuzzer target for pystd/pep440.c.  The whole input is parsed as a version and as
 * a specifier set; it is also split at newlines into "version \n specifier \n version"
 * to exercise contains() and compare() with related values.  Checks, beyond memory
 * safety: rendering is a fixed point of parse+render, a version equals its rendering,
 * compare is antisymmetric, allowing pre-releases never shrinks a match, and every
 * failure carries an error of the documented kinds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "pystd/pystd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(int rc, cm_error_t *err) {
  if (rc == 0) {
    if (err->msg != NULL) abort();
    return;
  }
  if (err->msg == NULL || (err->kind != CM_ERR_INVALID && err->kind != CM_ERR_LIMIT)) abort();
  cm_error_release(err);
}

static int sign(int c) {
  return (c > 0) - (c < 0);
}

/* Parses a version; if it parses, checks the round trip.  Returns whether v holds one. */
static bool version_roundtrip(const char *buf, size_t len, pep440_version_t *v) {
  cm_error_t err = CM_ERROR_INIT;
  int rc = pep440_version_parse(buf, len, v, &err);
  check_error(rc, &err);
  if (rc != 0) {
    if (v->release != NULL || v->local != NULL) abort();
    return false;
  }
  if (v->release_len == 0 || v->release_len > PEP440_MAX_RELEASE_PARTS) abort();
  char *text = pep440_version_render(v);
  pep440_version_t again;
  rc = pep440_version_parse(text, strlen(text), &again, &err);
  if (rc != 0) {
    /* Normalising may lengthen ("1c" -> "1rc0") past the limit, nothing else. */
    if (err.kind != CM_ERR_LIMIT) abort();
    cm_error_release(&err);
  } else {
    char *text2 = pep440_version_render(&again);
    if (strcmp(text, text2) != 0 || pep440_version_compare(v, &again) != 0) abort();
    free(text2);
    pep440_version_release(&again);
  }
  cm_error_release(&err);
  if (pep440_version_compare(v, v) != 0) abort();
  free(text);
  return true;
}

static pep440_specifier_set_t *set_roundtrip(const char *buf, size_t len) {
  cm_error_t err = CM_ERROR_INIT;
  pep440_specifier_set_t *set = NULL;
  int rc = pep440_specifier_set_parse(buf, len, &set, &err);
  check_error(rc, &err);
  if (rc != 0) {
    if (set != NULL) abort();
    return NULL;
  }
  if (set->len > PEP440_MAX_CLAUSES) abort();
  char *text = pep440_specifier_set_render(set);
  pep440_specifier_set_t *again = NULL;
  rc = pep440_specifier_set_parse(text, strlen(text), &again, &err);
  if (rc != 0) {
    if (err.kind != CM_ERR_LIMIT) abort();
    cm_error_release(&err);
  } else {
    char *text2 = pep440_specifier_set_render(again);
    if (strcmp(text, text2) != 0 || again->len != set->len) abort();
    free(text2);
    pep440_specifier_set_free(again);
  }
  free(text);
  return set;
}

static void check_contains(const pep440_specifier_set_t *set, const pep440_version_t *v) {
  bool strict = pep440_specifier_contains(set, v, false);
  bool loose = pep440_specifier_contains(set, v, true);
  if (strict && !loose) abort();
  if (set->len == 0 && !loose) abort();
  for (size_t i = 0; i < set->len; i++) {
    bool c = pep440_clause_contains(&set->clauses[i], v, true);
    if (loose && !c) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  pep440_version_t whole = PEP440_VERSION_INIT;
  bool have_whole = version_roundtrip(buf, size, &whole);
  pep440_specifier_set_t *whole_set = set_roundtrip(buf, size);

  /* version \n specifier \n version */
  const char *part[3] = {buf, "", ""};
  size_t len[3] = {size, 0, 0};
  for (int k = 0; k < 2; k++) {
    const char *nl = memchr(part[k], '\n', len[k]);
    if (nl == NULL) break;
    part[k + 1] = nl + 1;
    len[k + 1] = len[k] - (size_t)(nl + 1 - part[k]);
    len[k] = (size_t)(nl - part[k]);
  }
  pep440_version_t a = PEP440_VERSION_INIT, b = PEP440_VERSION_INIT;
  bool have_a = version_roundtrip(part[0], len[0], &a);
  bool have_b = version_roundtrip(part[2], len[2], &b);
  pep440_specifier_set_t *set = set_roundtrip(part[1], len[1]);

  if (have_a && have_b) {
    int ab = pep440_version_compare(&a, &b), ba = pep440_version_compare(&b, &a);
    if (sign(ab) != -sign(ba)) abort();
  }
  if (set != NULL) {
    if (have_a) check_contains(set, &a);
    if (have_b) check_contains(set, &b);
    if (have_whole) check_contains(set, &whole);
    cm_error_t err = CM_ERROR_INIT;
    bool ok = false;
    int rc = pep440_specifier_allows_python(set, part[0], len[0], &ok, &err);
    check_error(rc, &err);
    if ((rc == 0) != have_a) abort();
    /* An interpreter version that satisfies the set is certainly allowed. */
    if (have_a && pep440_specifier_contains(set, &a, true) && !ok) abort();
  }
  if (whole_set != NULL) {
    if (have_a) check_contains(whole_set, &a);
    if (have_b) check_contains(whole_set, &b);
  }

  pep440_version_release(&whole);
  pep440_version_release(&a);
  pep440_version_release(&b);
  pep440_specifier_set_free(set);
  pep440_specifier_set_free(whole_set);
  return 0;
}
