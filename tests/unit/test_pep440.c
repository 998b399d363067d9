/* PEP 440 versions and specifiers: normalisation, ordering, every operator and its
 * exclusion rules, requires-python matching, and error messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm.h"
#include "pystd/pystd.h"

static void parse_version(const char *s, pep440_version_t *v) {
  cm_error_t err = CM_ERROR_INIT;
  if (pep440_version_parse(s, strlen(s), v, &err) != 0)
    fail_msg("version \"%s\" did not parse: %s", s, cm_error_message(&err));
  cm_error_release(&err);
}

static pep440_specifier_set_t *parse_set(const char *s) {
  cm_error_t err = CM_ERROR_INIT;
  pep440_specifier_set_t *set = NULL;
  if (pep440_specifier_set_parse(s, strlen(s), &set, &err) != 0)
    fail_msg("specifier \"%s\" did not parse: %s", s, cm_error_message(&err));
  cm_error_release(&err);
  return set;
}

/* ---------------------------------------------------------------- normalisation */

static void test_normalize_table(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"1.0", "1.0"},
      {"1", "1"},
      {"v1.0", "1.0"},
      {"V1.0", "1.0"},
      {"  1.0\t\n", "1.0"},
      {"01.002.0003", "1.2.3"},
      {"2012.04", "2012.4"},
      {"1.0.0.0.0", "1.0.0.0.0"},
      {"0!1.0", "1.0"},
      {"1!1.0", "1!1.0"},
      {"007!1.0", "7!1.0"},
      /* pre-releases */
      {"1.0a1", "1.0a1"},
      {"1.0A1", "1.0a1"},
      {"1.0alpha1", "1.0a1"},
      {"1.0ALPHA1", "1.0a1"},
      {"1.0-a1", "1.0a1"},
      {"1.0_a1", "1.0a1"},
      {"1.0.a1", "1.0a1"},
      {"1.0a.1", "1.0a1"},
      {"1.0a-1", "1.0a1"},
      {"1.0a_1", "1.0a1"},
      {"1.0a01", "1.0a1"},
      {"1.0a", "1.0a0"},
      {"1.0a.", "1.0a0"},
      {"1.0b2", "1.0b2"},
      {"1.0beta2", "1.0b2"},
      {"1.0-beta.2", "1.0b2"},
      {"1.0c1", "1.0rc1"},
      {"1.0rc1", "1.0rc1"},
      {"1.0RC1", "1.0rc1"},
      {"1.0pre1", "1.0rc1"},
      {"1.0preview1", "1.0rc1"},
      {"1.0-c1", "1.0rc1"},
      {"1.0c", "1.0rc0"},
      /* post-releases */
      {"1.0.post1", "1.0.post1"},
      {"1.0post1", "1.0.post1"},
      {"1.0-post1", "1.0.post1"},
      {"1.0_post1", "1.0.post1"},
      {"1.0.POST1", "1.0.post1"},
      {"1.0.post.1", "1.0.post1"},
      {"1.0.rev1", "1.0.post1"},
      {"1.0r1", "1.0.post1"},
      {"1.0-r1", "1.0.post1"},
      {"1.0-1", "1.0.post1"},
      {"1.0-01", "1.0.post1"},
      {"1.0.post", "1.0.post0"},
      {"1.0-r", "1.0.post0"},
      {"1.0a1-1", "1.0a1.post1"},
      /* dev releases */
      {"1.0.dev1", "1.0.dev1"},
      {"1.0dev1", "1.0.dev1"},
      {"1.0-dev1", "1.0.dev1"},
      {"1.0_dev_1", "1.0.dev1"},
      {"1.0.DEV1", "1.0.dev1"},
      {"1.0.dev", "1.0.dev0"},
      {"1.0a1.dev2", "1.0a1.dev2"},
      {"1.0.post1.dev2", "1.0.post1.dev2"},
      {"1.0rc1.post2.dev3", "1.0rc1.post2.dev3"},
      /* local versions */
      {"1.0+abc", "1.0+abc"},
      {"1.0+ABC", "1.0+abc"},
      {"1.0+abc.5", "1.0+abc.5"},
      {"1.0+abc-5_x", "1.0+abc.5.x"},
      {"1.0+007", "1.0+7"},
      {"1.0+000", "1.0+0"},
      {"1.0+abc007", "1.0+abc007"},
      {"1!1.0rc1.post2.dev3+ubuntu-1", "1!1.0rc1.post2.dev3+ubuntu.1"},
      {"v1.0a1.post2.dev3+Local.Version", "1.0a1.post2.dev3+local.version"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cm_error_t err = CM_ERROR_INIT;
    char *out = NULL;
    if (pep440_normalize(cases[i][0], strlen(cases[i][0]), &out, &err) != 0)
      fail_msg("normalize(\"%s\") failed: %s", cases[i][0], cm_error_message(&err));
    if (strcmp(out, cases[i][1]) != 0)
      fail_msg("normalize(\"%s\") = \"%s\", want \"%s\"", cases[i][0], out, cases[i][1]);
    /* The normal form is a fixed point. */
    char *again = NULL;
    assert_int_equal(pep440_normalize(out, strlen(out), &again, &err), 0);
    assert_string_equal(again, out);
    free(again);
    free(out);
    cm_error_release(&err);
  }
}

static void test_version_fields(void **state) {
  (void)state;
  pep440_version_t v;
  parse_version("2!1.2.3rc4.post5.dev6+abc.7", &v);
  assert_int_equal(v.epoch, 2);
  assert_int_equal(v.release_len, 3);
  assert_int_equal(v.release[0], 1);
  assert_int_equal(v.release[1], 2);
  assert_int_equal(v.release[2], 3);
  assert_int_equal(v.pre_kind, PEP440_PRE_RC);
  assert_int_equal(v.pre, 4);
  assert_true(v.has_post);
  assert_int_equal(v.post, 5);
  assert_true(v.has_dev);
  assert_int_equal(v.dev, 6);
  assert_string_equal(v.local, "abc.7");
  assert_true(pep440_version_is_prerelease(&v));
  assert_true(pep440_version_is_postrelease(&v));

  pep440_version_t copy;
  pep440_version_copy(&copy, &v);
  assert_int_equal(pep440_version_compare(&copy, &v), 0);
  pep440_version_release(&v);
  char *s = pep440_version_render(&copy);
  assert_string_equal(s, "2!1.2.3rc4.post5.dev6+abc.7");
  free(s);
  pep440_version_release(&copy);
  pep440_version_release(&copy); /* releasing twice is harmless */

  parse_version("1.0", &v);
  assert_false(pep440_version_is_prerelease(&v));
  assert_false(pep440_version_is_postrelease(&v));
  assert_null(v.local);
  pep440_version_release(&v);
  parse_version("1.0.dev0", &v);
  assert_true(pep440_version_is_prerelease(&v));
  pep440_version_release(&v);

  /* Large numbers up to 2^64 - 1 are fine. */
  parse_version("18446744073709551615.20240101123456", &v);
  assert_true(v.release[0] == UINT64_MAX);
  pep440_version_release(&v);
}

static void test_version_not_nul_terminated(void **state) {
  (void)state;
  /* Only len bytes are read: "1.0" out of a longer buffer. */
  char buf[6] = {'1', '.', '0', 'x', 'y', 'z'};
  pep440_version_t v;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(pep440_version_parse(buf, 3, &v, &err), 0);
  char *s = pep440_version_render(&v);
  assert_string_equal(s, "1.0");
  free(s);
  pep440_version_release(&v);
  /* An embedded NUL is just an unexpected byte. */
  assert_int_equal(pep440_version_parse("1.0\0", 4, &v, &err), -1);
  assert_int_equal(err.kind, CM_ERR_INVALID);
  assert_string_equal(cm_error_message(&err),
                      "invalid version \"1.0\\x00\": unexpected byte 0x00 at column 4");
  cm_error_release(&err);
}

static void test_version_invalid(void **state) {
  (void)state;
  static const struct {
    const char *in;
    const char *msg;
  } cases[] = {
      {"", "invalid version \"\": empty version at column 1"},
      {"   ", "invalid version \"   \": empty version at column 4"},
      {"1.0x", "invalid version \"1.0x\": unexpected 'x' at column 4"},
      {"1.0.", "invalid version \"1.0.\": unexpected '.' at column 4"},
      {"1..0", "invalid version \"1..0\": unexpected '.' at column 2"},
      {"1.0-", "invalid version \"1.0-\": unexpected '-' at column 4"},
      {"abc", "invalid version \"abc\": expected a release number (like 1.0) at column 1"},
      {"v", "invalid version \"v\": expected a release number (like 1.0) at column 2"},
      {".1", "invalid version \".1\": expected a release number (like 1.0) at column 1"},
      {"1!", "invalid version \"1!\": expected a release number after the epoch '!' at column 3"},
      {"1.0+",
       "invalid version \"1.0+\": a local version label is letters and digits "
       "separated by '.', '-' or '_' at column 5"},
      {"1.0+a..b",
       "invalid version \"1.0+a..b\": a local version label is letters and digits "
       "separated by '.', '-' or '_' at column 7"},
      {"1.0 a1", "invalid version \"1.0 a1\": unexpected space at column 4"},
      {"1.0*",
       "invalid version \"1.0*\": unexpected '*' (a wildcard needs == or != and .*) at "
       "column 4"},
      {"1.0\"", "invalid version \"1.0\\\"\": unexpected '\"' at column 4"},
      {"1.0a1a2", "invalid version \"1.0a1a2\": unexpected 'a' at column 6"},
      {"1.0.post1.post2", "invalid version \"1.0.post1.post2\": unexpected '.' at column 10"},
      {"1.0.dev1a1", "invalid version \"1.0.dev1a1\": unexpected 'a' at column 9"},
      {"1.0prev", "invalid version \"1.0prev\": unexpected 'v' at column 7"},
      {"1.0-1-1", "invalid version \"1.0-1-1\": unexpected '-' at column 6"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cm_error_t err = CM_ERROR_INIT;
    pep440_version_t v;
    if (pep440_version_parse(cases[i].in, strlen(cases[i].in), &v, &err) == 0)
      fail_msg("\"%s\" parsed but should not", cases[i].in);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    assert_null(v.release);
    if (strcmp(cm_error_message(&err), cases[i].msg) != 0)
      fail_msg("\"%s\": got message\n  %s\nwant\n  %s", cases[i].in, cm_error_message(&err),
               cases[i].msg);
    cm_error_release(&err);
  }
}

static void test_version_limits(void **state) {
  (void)state;
  cm_error_t err = CM_ERROR_INIT;
  pep440_version_t v;

  assert_int_equal(pep440_version_parse("18446744073709551616", 20, &v, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "number is larger than"));
  cm_error_release(&err);

  char big[PEP440_MAX_VERSION_LEN + 2];
  memset(big, '1', sizeof big);
  assert_int_equal(pep440_version_parse(big, sizeof big, &v, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "the limit is 256"));
  cm_error_release(&err);

  /* 32 release numbers are fine, 33 are not. */
  char parts[200] = "1";
  for (int i = 1; i < PEP440_MAX_RELEASE_PARTS; i++) strcat(parts, ".1");
  assert_int_equal(pep440_version_parse(parts, strlen(parts), &v, &err), 0);
  assert_int_equal(v.release_len, PEP440_MAX_RELEASE_PARTS);
  pep440_version_release(&v);
  strcat(parts, ".1");
  assert_int_equal(pep440_version_parse(parts, strlen(parts), &v, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "more than 32 release numbers"));
  cm_error_release(&err);
}

/* ---------------------------------------------------------------- ordering */

static void test_ordering(void **state) {
  (void)state;
  /* Strictly increasing. */
  static const char *const sorted[] = {
      "1.0.dev456",
      "1.0a1",
      "1.0a2.dev456",
      "1.0a12.dev456",
      "1.0a12",
      "1.0b1.dev456",
      "1.0b2",
      "1.0b2.post345.dev456",
      "1.0b2.post345",
      "1.0b2-346",
      "1.0c1.dev456",
      "1.0c1",
      "1.0rc2",
      "1.0c3",
      "1.0",
      "1.0+abc",
      "1.0+abc.1",
      "1.0+1",
      "1.0.post456.dev34",
      "1.0.post456",
      "1.0.post457",
      "1.0.1",
      "1.1.dev1",
      "1.1a1",
      "1.1",
      "1.2+123abc",
      "1.2+123abc456",
      "1.2+abc",
      "1.2+abc123",
      "1.2+abc123def",
      "1.2+1234.abc",
      "1.2+123456",
      "1.2.r32+123456",
      "1.2.rev33+123456",
      "1.10",
      "2.0.dev0",
      "2.0",
      "10.0",
      "18446744073709551615",
      "1!0.1",
      "1!1.0.dev456",
      "1!1.0a1",
      "1!1.0",
      "1!1.0.post1",
      "1!1.2+123456",
      "2!0.0.1",
  };
  size_t n = CM_ARRAY_SIZE(sorted);
  pep440_version_t *v = calloc(n, sizeof *v);
  for (size_t i = 0; i < n; i++) parse_version(sorted[i], &v[i]);
  for (size_t i = 0; i < n; i++) {
    for (size_t j = 0; j < n; j++) {
      int c = pep440_version_compare(&v[i], &v[j]);
      int want = i < j ? -1 : i > j ? 1 : 0;
      if ((c > 0) - (c < 0) != want)
        fail_msg("compare(%s, %s) = %d, want %d", sorted[i], sorted[j], c, want);
    }
  }
  for (size_t i = 0; i < n; i++) pep440_version_release(&v[i]);
  free(v);
}

static void test_equal_versions(void **state) {
  (void)state;
  static const char *const same[][2] = {
      {"1.0", "1.0.0"},       {"1", "1.0.0.0"}, {"1.0a1", "1.0alpha1"},  {"1.0c1", "1.0rc1"},
      {"1.0-1", "1.0.post1"}, {"0!1.0", "1.0"}, {"1.0+01", "1.0+1"},     {"1.0+ABC", "1.0+abc"},
      {"1.0+a-b", "1.0+a.b"}, {"v1.0", "1.0"},  {"1.0.dev", "1.0.dev0"}, {"1.0a", "1.0a0"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(same); i++) {
    pep440_version_t a, b;
    parse_version(same[i][0], &a);
    parse_version(same[i][1], &b);
    if (pep440_version_compare(&a, &b) != 0)
      fail_msg("%s and %s should compare equal", same[i][0], same[i][1]);
    pep440_version_release(&a);
    pep440_version_release(&b);
  }
}

/* ---------------------------------------------------------------- specifiers */

typedef struct contains_case {
  const char *spec;
  const char *version;
  bool allow_pre;
  bool want;
} contains_case_t;

static void check_contains(const contains_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    pep440_specifier_set_t *set = parse_set(cases[i].spec);
    pep440_version_t v;
    parse_version(cases[i].version, &v);
    bool got = pep440_specifier_contains(set, &v, cases[i].allow_pre);
    if (got != cases[i].want)
      fail_msg("\"%s\" contains %s (allow pre-releases: %d) = %d, want %d", cases[i].spec,
               cases[i].version, cases[i].allow_pre, got, cases[i].want);
    if (set->len == 1) {
      /* A one-clause set behaves like its clause. */
      assert_int_equal(pep440_clause_contains(&set->clauses[0], &v, cases[i].allow_pre), got);
    }
    pep440_version_release(&v);
    pep440_specifier_set_free(set);
  }
}

static void test_operators(void **state) {
  (void)state;
  /* Mostly the matching tables of the reference implementation (pre-releases allowed, so
   * only the operators are tested). */
  static const contains_case_t cases[] = {
      /* == */
      {"==2", "2.0", true, true},
      {"==2.0", "2.0", true, true},
      {"==2.0.0", "2.0", true, true},
      {"==2", "2.0+deadbeef", true, true},
      {"==2.0", "2.0+deadbeef", true, true},
      {"==2+deadbeef", "2.0+deadbeef", true, true},
      {"==2.0.0+deadbeef", "2.0+deadbeef", true, true},
      {"==2.0.0+deadbeef.00", "2.0+deadbeef.0", true, true},
      {"==2", "2.1", true, false},
      {"==2.0", "2.1", true, false},
      {"==2.0+deadbeef", "2.0", true, false},
      {"==2.0+deadbeef", "2.0+deadbeef.1", true, false},
      {"==1.0a1", "1.0a1", true, true},
      {"==1.0a1", "1.0", true, false},
      {"==1.0.post1", "1.0", true, false},
      /* == with a prefix */
      {"==2.*", "2.dev1", true, true},
      {"==2.*", "2a1", true, true},
      {"==2.*", "2a1.post1", true, true},
      {"==2.*", "2b1.dev1", true, true},
      {"==2.*", "2c1.post1.dev1", true, true},
      {"==2.0.*", "2c1.post1.dev1", true, true},
      {"==2.0.*", "2rc1", true, true},
      {"==2.*", "2", true, true},
      {"==2.0.*", "2", true, true},
      {"==0!2.*", "2", true, true},
      {"==2.*", "0!2", true, true},
      {"==2.*", "2.0.0", true, true},
      {"==2.1.*", "2.1+local.version", true, true},
      {"==2.*", "2.9.9.post1", true, true},
      {"==3.*", "2.0", true, false},
      {"==2.0.*", "2.1", true, false},
      {"==2.0.*", "20.0", true, false},
      {"==1.*", "1!1.0", true, false},
      {"==2!1.*", "2!1.0", true, true},
      {"==2!1.*", "1.0", true, false},
      /* != */
      {"!=2", "2.1", true, true},
      {"!=2.0", "2.0.1", true, true},
      {"!=2.0.0", "2.0.1", true, true},
      {"!=2.0+deadbeef", "2.0", true, true},
      {"!=2", "2.0", true, false},
      {"!=2.0.0", "2.0", true, false},
      {"!=2", "2.0+deadbeef", true, false},
      {"!=2.0+deadbeef", "2.0+deadbeef", true, false},
      {"!=2.0.0+deadbeef.00", "2.0+deadbeef.0", true, false},
      {"!=3.*", "2.0", true, true},
      {"!=2.0.*", "2.1", true, true},
      {"!=2.*", "2.dev1", true, false},
      {"!=2.*", "2c1.post1.dev1", true, false},
      {"!=2.0.*", "2rc1", true, false},
      {"!=2.*", "2.0.0", true, false},
      {"!=2!1.0", "2!1.0", true, false},
      /* >= */
      {">=2", "2.0", true, true},
      {">=2.0.0", "2.0", true, true},
      {">=2", "2.0.post1", true, true},
      {">=2", "2.0.post1.dev1", true, true},
      {">=2", "3", true, true},
      {">=2", "2.0+local", true, true},
      {">=2", "2.0.dev1", true, false},
      {">=2", "2.0a1", true, false},
      {">=2", "2.0rc1", true, false},
      {">=2", "1", true, false},
      {">=2.0", "2!1.0", true, true},
      /* <= */
      {"<=2", "2.0", true, true},
      {"<=2.0.0", "2.0", true, true},
      {"<=2", "2.0.dev1", true, true},
      {"<=2", "2.0a1", true, true},
      {"<=2", "2.0c1.post1.dev1", true, true},
      {"<=2", "1", true, true},
      {"<=2", "2.0+local", true, true},
      {"<=2", "2.0.post1", true, false},
      {"<=2", "2.0.post1.dev1", true, false},
      {"<=2", "3", true, false},
      {"<=2!0.1", "1.0", true, true},
      /* > : excludes post-releases and local versions of V */
      {">2", "3", true, true},
      {">2.0", "2.1", true, true},
      {">2", "2.0.1", true, true},
      {">2", "2.1.post1", true, true},
      {">2", "2.1+local.version", true, true},
      {">2", "1", true, false},
      {">2", "2.0.dev1", true, false},
      {">2", "2.0rc1", true, false},
      {">2", "2.0", true, false},
      {">2", "2.0.post1", true, false},
      {">2", "2.0.post1.dev1", true, false},
      {">2", "2.0+local.version", true, false},
      {">1.7", "1.7.post2", true, false},
      {">1.7", "1.7.1", true, true},
      {">1.7.post2", "1.7.post3", true, true},
      {">1.7.post2", "1.7.post2", true, false},
      {">1.7.post2", "1.7.1", true, true},
      {">2.0dev", "2.0.5", true, true},
      {">2.0", "2!1.0", true, true},
      /* < : excludes pre-releases of V unless V is one */
      {"<2", "1", true, true},
      {"<2.1", "2.0", true, true},
      {"<2.1", "2.0.dev0", true, true},
      {"<2", "2.0.dev1", true, false},
      {"<2", "2.0a1", true, false},
      {"<2", "2.0b2.dev1", true, false},
      {"<2", "2.0rc1", true, false},
      {"<2", "2.0", true, false},
      {"<2", "2.post1", true, false},
      {"<2", "3", true, false},
      {"<3.0", "3.0rc1", true, false},
      {"<3.0rc2", "3.0rc1", true, true},
      {"<3.0rc2", "3.0.dev1", true, true},
      {"<2!0.1", "1.0", true, true},
      /* ~= */
      {"~=1.0", "1", true, true},
      {"~=1.0", "1.0.1", true, true},
      {"~=1.0", "1.1", true, true},
      {"~=1.0", "1.9999999", true, true},
      {"~=1.0a1", "1.1", true, true},
      {"~=2022.01.01", "2022.01.01", true, true},
      {"~=1.0", "2.0", true, false},
      {"~=1.0", "0.9", true, false},
      {"~=1.0.0", "1.1.0", true, false},
      {"~=1.0.0", "1.1.post1", true, false},
      {"~=2.2", "2.3", true, true},
      {"~=2.2", "2.1", true, false},
      {"~=2.2", "3.0", true, false},
      {"~=1.4.5", "1.4.9", true, true},
      {"~=1.4.5", "1.4.4", true, false},
      {"~=1.4.5", "1.5.0", true, false},
      {"~=2.2.post3", "2.2.post4", true, true},
      {"~=2.2.post3", "2.3", true, true},
      {"~=2.2.post3", "2.2", true, false},
      {"~=1.4.5a4", "1.4.5", true, true},
      {"~=1.4.5a4", "1.4.5a3", true, false},
      {"~=1.0", "1.0+local", true, true},
      {"~=2!1.0", "2!1.0", true, true},
      {"~=2!1.0", "1.0", true, false},
      {"~=1.0", "2!1.0", true, false},
      /* === */
      {"===1.0", "1.0", true, true},
      {"===1.0.0", "1.0", true, false},
      {"===1.0A1", "1.0a1", true, true},
      {"===1.0+local", "1.0+LOCAL", true, true},
      {"===foobar", "1.0", true, false},
  };
  check_contains(cases, CM_ARRAY_SIZE(cases));
}

static void test_prerelease_rules(void **state) {
  (void)state;
  static const contains_case_t cases[] = {
      /* Excluded by default... */
      {">=1.0", "1.1a1", false, false},
      {">=1.0", "1.1a1", true, true},
      {">=1.0", "1.1.dev1", false, false},
      {"", "1.0a1", false, false},
      {"", "1.0a1", true, true},
      {"", "1.0", false, true},
      {"!=1.0", "1.1.dev1", false, false},
      {"==1.0.*", "1.0rc1", false, false},
      {"==1.0.*", "1.0rc1", true, true},
      {"<2.0rc2", "2.0rc1", false, false},
      {"<2.0rc2", "2.0rc1", true, true},
      {">0.9a1", "1.0a1", false, false},
      /* ...unless an inclusive clause names a pre-release. */
      {">=1.0a1", "1.0b1", false, true},
      {"<=2.0b1", "2.0a1", false, true},
      {"==1.0rc1", "1.0rc1", false, true},
      {"~=1.4.5a4", "1.4.5b1", false, true},
      {">=1.0,!=1.1.dev1,<=3.0a1", "2.0b1", false, true},
      {"===1.0rc1", "1.0rc1", false, true},
      /* Finals and post-releases are never filtered. */
      {">=1.0", "1.0.post1", false, true},
      {"", "5.0.post3+local", false, true},
  };
  check_contains(cases, CM_ARRAY_SIZE(cases));
}

static void test_multiple_clauses(void **state) {
  (void)state;
  static const contains_case_t cases[] = {
      {">=2.8.1,==2.8.*", "2.8.1", false, true},
      {">=2.8.1,==2.8.*", "2.8.5", false, true},
      {">=2.8.1,==2.8.*", "2.8.0", false, false},
      {">=2.8.1,==2.8.*", "2.9", false, false},
      {">=3.8, <4, !=3.9.*", "3.9.1", false, false},
      {">=3.8, <4, !=3.9.*", "3.10", false, true},
      {">=3.8, <4, !=3.9.*", "4.0", false, false},
      {">=3.8, <4, !=3.9.*", "4.0rc1", true, false},
      {">1.0,<1.0", "1.0", false, false},
  };
  check_contains(cases, CM_ARRAY_SIZE(cases));
}

static void test_specifier_render(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"", ""},
      {"   ", ""},
      {">=1.0", ">=1.0"},
      {" >= 01.0 , ==2.8.* , ~=1.4.5a4, ===Foo-Bar ", ">=1.0,==2.8.*,~=1.4.5a4,===Foo-Bar"},
      {"==v1.0.POST1+Local", "==1.0.post1+local"},
      {"!=2!1.0.*", "!=2!1.0.*"},
      {"<2,>1", "<2,>1"},
      {">2.0dev", ">2.0.dev0"},
      /* Arbitrary text that starts like an operator keeps its separating space. */
      {"=== !x", "=== !x"},
      {"===  !x ,<2", "=== !x,<2"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    pep440_specifier_set_t *set = parse_set(cases[i][0]);
    char *s = pep440_specifier_set_render(set);
    if (strcmp(s, cases[i][1]) != 0)
      fail_msg("render(\"%s\") = \"%s\", want \"%s\"", cases[i][0], s, cases[i][1]);
    free(s);
    pep440_specifier_set_free(set);
  }

  pep440_specifier_set_t *set = parse_set("==1.2.*, ===odd, ~=3.4");
  assert_int_equal(set->len, 3);
  assert_int_equal(set->clauses[0].op, PEP440_OP_EQ);
  assert_true(set->clauses[0].wildcard);
  assert_string_equal(set->clauses[0].text, "1.2.*");
  assert_int_equal(set->clauses[0].version.release_len, 2);
  assert_int_equal(set->clauses[1].op, PEP440_OP_ARBITRARY);
  assert_false(set->clauses[1].has_version);
  assert_string_equal(set->clauses[1].text, "odd");
  assert_int_equal(set->clauses[2].op, PEP440_OP_COMPATIBLE);
  assert_string_equal(pep440_op_string(PEP440_OP_COMPATIBLE), "~=");
  assert_string_equal(pep440_op_string(PEP440_OP_ARBITRARY), "===");
  pep440_specifier_set_free(set);
  pep440_specifier_set_free(NULL);
}

static void test_specifier_invalid(void **state) {
  (void)state;
  static const struct {
    const char *in;
    const char *msg;
  } cases[] = {
      {">=", "invalid version specifier \">=\": expected a version after \">=\" at column 3"},
      {">= ", "invalid version specifier \">= \": expected a version after \">=\" at column 4"},
      {"===", "invalid version specifier \"===\": expected a version after \"===\" at column 4"},
      {"=>1.0",
       "invalid version specifier \"=>1.0\": unknown version operator \"=>\" (use ==, "
       "!=, <, <=, >, >=, ~= or ===) at column 1"},
      {"=1.0",
       "invalid version specifier \"=1.0\": unknown version operator \"=\" (use ==, !=, "
       "<, <=, >, >=, ~= or ===) at column 1"},
      {"====1",
       "invalid version specifier \"====1\": unknown version operator \"====\" (use ==, "
       "!=, <, <=, >, >=, ~= or ===) at column 1"},
      {"1.0",
       "invalid version specifier \"1.0\": expected a version operator (==, !=, <, <=, >, "
       ">=, ~= or ===), found '1' at column 1"},
      {">=1.0,",
       "invalid version specifier \">=1.0,\": expected a version operator after ',' "
       "(==, !=, <, <=, >, >=, ~= or ===) at column 7"},
      {">=1.0,,<2",
       "invalid version specifier \">=1.0,,<2\": expected a version operator after "
       "',' (==, !=, <, <=, >, >=, ~= or ===), found ',' at column 7"},
      {"~=1",
       "invalid version specifier \"~=1\": ~= needs at least two release numbers (like "
       "~=2.2) at column 3"},
      {">=1.*",
       "invalid version specifier \">=1.*\": a '.*' wildcard is only allowed with == "
       "and !=, not \">=\" at column 5"},
      {"~=1.0.*",
       "invalid version specifier \"~=1.0.*\": a '.*' wildcard is only allowed with "
       "== and !=, not \"~=\" at column 7"},
      {"==1.*.0",
       "invalid version specifier \"==1.*.0\": '*' is only allowed as a trailing '.*' "
       "(like ==1.2.*) at column 5"},
      {"==1*",
       "invalid version specifier \"==1*\": '*' is only allowed as a trailing '.*' (like "
       "==1.2.*) at column 4"},
      {"==*",
       "invalid version specifier \"==*\": '*' is only allowed as a trailing '.*' (like "
       "==1.2.*) at column 3"},
      {"==1.0a1.*",
       "invalid version specifier \"==1.0a1.*\": '.*' can only follow a release "
       "number (like ==1.2.*) at column 3"},
      {"!=1.0+abc.*",
       "invalid version specifier \"!=1.0+abc.*\": '.*' can only follow a release "
       "number (like !=1.2.*) at column 3"},
      {">=1.0+local",
       "invalid version specifier \">=1.0+local\": a local version label is only "
       "allowed with == and !=, not \">=\" at column 6"},
      {"~=1.0+local",
       "invalid version specifier \"~=1.0+local\": a local version label is only "
       "allowed with == and !=, not \"~=\" at column 6"},
      {"==1.0x",
       "invalid version specifier \"==1.0x\": bad version after \"==\": unexpected 'x' "
       "at column 6"},
      {">= 1.0 <2",
       "invalid version specifier \">= 1.0 <2\": unexpected '<' after a version "
       "(separate clauses with ',') at column 8"},
      {">=1.0;",
       "invalid version specifier \">=1.0;\": unexpected ';' after a version (separate "
       "clauses with ',') at column 6"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cm_error_t err = CM_ERROR_INIT;
    pep440_specifier_set_t *set = (pep440_specifier_set_t *)1;
    if (pep440_specifier_set_parse(cases[i].in, strlen(cases[i].in), &set, &err) == 0)
      fail_msg("\"%s\" parsed but should not", cases[i].in);
    assert_null(set);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    if (strcmp(cm_error_message(&err), cases[i].msg) != 0)
      fail_msg("\"%s\": got message\n  %s\nwant\n  %s", cases[i].in, cm_error_message(&err),
               cases[i].msg);
    cm_error_release(&err);
  }
}

static void test_specifier_limits(void **state) {
  (void)state;
  cm_error_t err = CM_ERROR_INIT;
  pep440_specifier_set_t *set;
  char buf[PEP440_MAX_SPECIFIER_LEN + 8] = "";

  /* 32 clauses parse, 33 hit the limit. */
  for (int i = 0; i < PEP440_MAX_CLAUSES; i++) strcat(buf, i ? ",!=1.0" : "!=1.0");
  assert_int_equal(pep440_specifier_set_parse(buf, strlen(buf), &set, &err), 0);
  assert_int_equal(set->len, PEP440_MAX_CLAUSES);
  pep440_specifier_set_free(set);
  strcat(buf, ",!=1.0");
  assert_int_equal(pep440_specifier_set_parse(buf, strlen(buf), &set, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "more than 32 version clauses"));
  cm_error_release(&err);

  memset(buf, ' ', sizeof buf);
  assert_int_equal(pep440_specifier_set_parse(buf, sizeof buf, &set, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "the limit is 4096"));
  /* The message quotes a shortened excerpt, not the whole input. */
  assert_true(strlen(cm_error_message(&err)) < 300);
  cm_error_release(&err);

  /* A version longer than PEP440_MAX_VERSION_LEN inside a specifier. */
  memset(buf, 0, sizeof buf);
  strcpy(buf, ">=");
  memset(buf + 2, '1', PEP440_MAX_VERSION_LEN + 1);
  assert_int_equal(pep440_specifier_set_parse(buf, strlen(buf), &set, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  cm_error_release(&err);
}

static void test_parse_at(void **state) {
  (void)state;
  /* Embedded use: stops after the last clause, before blanks and foreign text. */
  const char *req = "foo >=1.0 , <2 ; os_name == 'posix'";
  size_t pos = 4;
  cm_error_t err = CM_ERROR_INIT;
  pep440_specifier_set_t *set;
  assert_int_equal(pep440_specifier_set_parse_at(req, strlen(req), &pos, "requirement", &set, &err),
                   0);
  assert_int_equal(pos, 14);
  assert_int_equal(set->len, 2);
  pep440_specifier_set_free(set);

  const char *bad = "foo>=";
  pos = 3;
  assert_int_equal(pep440_specifier_set_parse_at(bad, strlen(bad), &pos, "requirement", &set, &err),
                   -1);
  assert_string_equal(cm_error_message(&err),
                      "invalid requirement \"foo>=\": expected a version after \">=\" at column 6");
  cm_error_release(&err);

  /* Clause API, with and without an error. */
  pep440_clause_t c;
  assert_int_equal(pep440_clause_init(&c, PEP440_OP_GE, "3.8", 3, NULL), 0);
  pep440_version_t v;
  parse_version("3.10", &v);
  assert_true(pep440_clause_contains(&c, &v, false));
  pep440_version_release(&v);
  pep440_clause_release(&c);
  assert_int_equal(pep440_clause_init(&c, PEP440_OP_GE, "linux", 5, NULL), -1);
  assert_int_equal(pep440_clause_init(&c, PEP440_OP_COMPATIBLE, "3", 1, &err), -1);
  assert_string_equal(cm_error_message(&err),
                      "invalid version \"3\": ~= needs at least two release numbers (like ~=2.2) "
                      "at column 1");
  cm_error_release(&err);
}

/* ---------------------------------------------------------------- requires-python */

static void test_allows_python(void **state) {
  (void)state;
  static const struct {
    const char *spec;
    const char *python;
    bool want;
  } cases[] = {
      {">=3.8", "3.11", true},
      {">=3.8", "3.7", false},
      {">=3.8", "3.8.0", true},
      {">=3.8", "3.13.0rc1", true},
      {">=3.11.4", "3.11", true},
      {">=3.11.4", "3.11.3", false},
      {">=3.11.4", "3.11.4", true},
      {">=3.11.4", "3.10", false},
      {"<3.11.2", "3.11", true},
      {"<3.11.0", "3.11", false},
      {"==3.11.4.*", "3.11", true},
      {"==3.11.4", "3.11", true},
      {">=3.11.4,<3.11.5", "3.11", true},
      {">3.11.4,<3.11.5", "3.11", false},
      {">3.11.4,<=3.11.5", "3.11", true},
      {"!=3.11.*", "3.11", false},
      {"!=3.11.*", "3.12", true},
      {"!=3.11.0", "3.11", true},
      {"~=3.10", "3.12", true},
      {"~=3.10", "4.0", false},
      {"~=3.10.2", "3.10", true},
      {"~=3.10.2", "3.11", false},
      {">=3.9,<3.13", "3.13", false},
      {">=3.9,<3.13", "3.12", true},
      {"==3.*", "3.6", true},
      {"==2.7.*", "3.6", false},
      {"", "3.12", true},
      {"", "2.7.18", true},
      {"===3.12", "3.12", true},
      {">=3.12.18446744073709551615", "3.12", true},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    pep440_specifier_set_t *set = parse_set(cases[i].spec);
    bool ok = !cases[i].want;
    cm_error_t err = CM_ERROR_INIT;
    assert_int_equal(
        pep440_specifier_allows_python(set, cases[i].python, strlen(cases[i].python), &ok, &err),
        0);
    if (ok != cases[i].want)
      fail_msg("\"%s\" allows Python %s = %d, want %d", cases[i].spec, cases[i].python, ok,
               cases[i].want);
    pep440_specifier_set_free(set);
  }

  pep440_specifier_set_t *set = parse_set(">=3.8");
  cm_error_t err = CM_ERROR_INIT;
  bool ok = true;
  assert_int_equal(pep440_specifier_allows_python(set, "three", 5, &ok, &err), -1);
  assert_false(ok);
  assert_int_equal(err.kind, CM_ERR_INVALID);
  assert_string_equal(cm_error_message(&err),
                      "checking a Python version against \"requires-python\": invalid version "
                      "\"three\": expected a release number (like 1.0) at column 1");
  cm_error_release(&err);
  pep440_specifier_set_free(set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_normalize_table),
      cmocka_unit_test(test_version_fields),
      cmocka_unit_test(test_version_not_nul_terminated),
      cmocka_unit_test(test_version_invalid),
      cmocka_unit_test(test_version_limits),
      cmocka_unit_test(test_ordering),
      cmocka_unit_test(test_equal_versions),
      cmocka_unit_test(test_operators),
      cmocka_unit_test(test_prerelease_rules),
      cmocka_unit_test(test_multiple_clauses),
      cmocka_unit_test(test_specifier_render),
      cmocka_unit_test(test_specifier_invalid),
      cmocka_unit_test(test_specifier_limits),
      cmocka_unit_test(test_parse_at),
      cmocka_unit_test(test_allows_python),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
