/* PEP 508 requirements and markers: real-life requirements, canonical rendering,
 * marker evaluation, error messages, limits, and the dependency merge rule. */
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

static pep508_requirement_t *parse_req(const char *s) {
  cm_error_t err = CM_ERROR_INIT;
  pep508_requirement_t *req = NULL;
  if (pep508_requirement_parse(s, strlen(s), &req, &err) != 0)
    fail_msg("requirement \"%s\" did not parse: %s", s, cm_error_message(&err));
  cm_error_release(&err);
  return req;
}

static pep508_marker_t *parse_marker(const char *s) {
  cm_error_t err = CM_ERROR_INIT;
  pep508_marker_t *m = NULL;
  if (pep508_marker_parse(s, strlen(s), &m, &err) != 0)
    fail_msg("marker \"%s\" did not parse: %s", s, cm_error_message(&err));
  cm_error_release(&err);
  return m;
}

static const pep508_env_t linux_env = {
    .implementation_name = "cpython",
    .implementation_version = "3.11.7",
    .os_name = "posix",
    .platform_machine = "x86_64",
    .platform_python_implementation = "CPython",
    .platform_release = "6.1.0-18-amd64",
    .platform_system = "Linux",
    .platform_version = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)",
    .python_full_version = "3.11.7",
    .python_version = "3.11",
    .sys_platform = "linux",
    .extra = NULL,
};

/* ---------------------------------------------------------------- names */

static void test_names(void **state) {
  (void)state;
  static const char *const valid[] = {"a",           "A",    "9",  "numpy",         "Foo_Bar",
                                      "foo.bar-baz", "a--b", "x1", "zope.interface"};
  static const char *const invalid[] = {"", "-a", "a-", "_a", "a_", ".a", "a.", "a b", "a+b", "é"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(valid); i++)
    if (!pep508_name_is_valid(valid[i], strlen(valid[i]))) fail_msg("\"%s\" is valid", valid[i]);
  for (size_t i = 0; i < CM_ARRAY_SIZE(invalid); i++)
    if (pep508_name_is_valid(invalid[i], strlen(invalid[i])))
      fail_msg("\"%s\" is not valid", invalid[i]);

  static const char *const norm[][2] = {
      {"numpy", "numpy"},
      {"Django", "django"},
      {"Foo_Bar", "foo-bar"},
      {"foo.bar", "foo-bar"},
      {"Foo__Bar..Baz", "foo-bar-baz"},
      {"a-_.-b", "a-b"},
      {"zope.interface", "zope-interface"},
      {"ABC123", "abc123"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(norm); i++) {
    char *s = pep508_normalize_name(norm[i][0], strlen(norm[i][0]));
    assert_string_equal(s, norm[i][1]);
    free(s);
  }
}

/* ---------------------------------------------------------------- requirements */

static void test_real_life(void **state) {
  (void)state;
  pep508_requirement_t *r =
      parse_req("requests[security,socks]>=2.8.1,==2.8.*; python_version < \"2.7\"");
  assert_string_equal(r->name, "requests");
  assert_string_equal(r->normalized_name, "requests");
  assert_int_equal(r->extras_len, 2);
  assert_string_equal(r->extras[0], "security");
  assert_string_equal(r->extras[1], "socks");
  assert_null(r->extras[2]);
  assert_int_equal(r->specifiers->len, 2);
  assert_int_equal(r->specifiers->clauses[0].op, PEP440_OP_GE);
  assert_int_equal(r->specifiers->clauses[1].op, PEP440_OP_EQ);
  assert_true(r->specifiers->clauses[1].wildcard);
  assert_null(r->url);
  assert_non_null(r->marker);
  assert_int_equal(r->marker->kind, PEP508_MARKER_COMPARE);
  assert_true(r->marker->lhs.is_var);
  assert_int_equal(r->marker->lhs.var, PEP508_VAR_PYTHON_VERSION);
  assert_int_equal(r->marker->op, PEP508_OP_LT);
  assert_false(r->marker->rhs.is_var);
  assert_string_equal(r->marker->rhs.str, "2.7");
  assert_false(pep508_marker_evaluate(r->marker, &linux_env));
  pep508_requirement_free(r);

  r = parse_req("name @ https://example.com/x.whl ; os_name==\"posix\"");
  assert_string_equal(r->name, "name");
  assert_string_equal(r->url, "https://example.com/x.whl");
  assert_int_equal(r->specifiers->len, 0);
  assert_int_equal(r->extras_len, 0);
  assert_non_null(r->extras);
  assert_true(pep508_marker_evaluate(r->marker, &linux_env));
  pep508_requirement_free(r);

  r = parse_req("pydantic>=2.0");
  assert_string_equal(r->name, "pydantic");
  assert_int_equal(r->specifiers->len, 1);
  assert_null(r->marker);
  pep508_requirement_free(r);

  r = parse_req("numpy");
  assert_string_equal(r->name, "numpy");
  assert_int_equal(r->specifiers->len, 0);
  assert_null(r->url);
  assert_null(r->marker);
  pep508_requirement_free(r);

  r = parse_req("Foo_Bar.baz [ Extra_One , b, B ,extra-one] ( >=1.0 , <2 ) ; extra == 'Test_X'");
  assert_string_equal(r->name, "Foo_Bar.baz");
  assert_string_equal(r->normalized_name, "foo-bar-baz");
  assert_int_equal(r->extras_len, 2);
  assert_string_equal(r->extras[0], "b");
  assert_string_equal(r->extras[1], "extra-one");
  assert_int_equal(r->specifiers->len, 2);
  assert_string_equal(r->marker->rhs.str, "test-x");
  pep508_requirement_free(r);
}

static void test_render(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"numpy", "numpy"},
      {"  NumPy  ", "numpy"},
      {"pydantic>=2.0", "pydantic>=2.0"},
      {"requests[security,socks]>=2.8.1,==2.8.*; python_version < \"2.7\"",
       "requests[security,socks]>=2.8.1,==2.8.*; python_version < \"2.7\""},
      {"requests [socks , security] >= 2.8.1 , == 2.8.* ;python_version<'2.7'",
       "requests[security,socks]>=2.8.1,==2.8.*; python_version < \"2.7\""},
      {"name @ https://example.com/x.whl ; os_name==\"posix\"",
       "name @ https://example.com/x.whl ; os_name == \"posix\""},
      {"name@https://example.com/x.whl", "name @ https://example.com/x.whl"},
      {"Name[Ex] @ git+https://github.com/o/r.git@v1#egg=name",
       "name[ex] @ git+https://github.com/o/r.git@v1#egg=name"},
      {"foo (>=1.0, <2)", "foo>=1.0,<2"},
      {"foo(==1.0a)", "foo==1.0a0"},
      {"foo[]", "foo"},
      {"foo===1.0.Weird", "foo===1.0.Weird"},
      {"foo; os_name=='a' and (sys_platform=='b' or sys_platform=='c')",
       "foo; os_name == \"a\" and (sys_platform == \"b\" or sys_platform == \"c\")"},
      {"foo; (os_name=='a' and sys_platform=='b') or sys_platform=='c'",
       "foo; os_name == \"a\" and sys_platform == \"b\" or sys_platform == \"c\""},
      {"foo; os_name=='a' and (sys_platform=='b' and sys_platform=='c')",
       "foo; os_name == \"a\" and (sys_platform == \"b\" and sys_platform == \"c\")"},
      {"foo; ((os_name=='a'))", "foo; os_name == \"a\""},
      {"foo; os_name == 'it\"s'", "foo; os_name == 'it\"s'"},
      {"foo; \"win\" not  in sys_platform", "foo; \"win\" not in sys_platform"},
      {"foo; os.name == 'posix' and python_implementation == 'CPython'",
       "foo; os_name == \"posix\" and platform_python_implementation == \"CPython\""},
      {"foo\t>=1\t;\tos_name=='x'", "foo>=1; os_name == \"x\""},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    pep508_requirement_t *r = parse_req(cases[i][0]);
    char *s = pep508_requirement_render(r);
    if (strcmp(s, cases[i][1]) != 0)
      fail_msg("render(%s) = %s, want %s", cases[i][0], s, cases[i][1]);
    /* The rendering is canonical: it renders to itself. */
    pep508_requirement_t *again = parse_req(s);
    char *s2 = pep508_requirement_render(again);
    assert_string_equal(s2, s);
    free(s2);
    pep508_requirement_free(again);
    free(s);
    pep508_requirement_free(r);
  }
}

static void test_not_nul_terminated(void **state) {
  (void)state;
  const char text[] = "numpy>=1.0garbage";
  pep508_requirement_t *r;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(pep508_requirement_parse(text, 10, &r, &err), 0);
  char *s = pep508_requirement_render(r);
  assert_string_equal(s, "numpy>=1.0");
  free(s);
  pep508_requirement_free(r);
  pep508_requirement_free(NULL);

  pep508_marker_t *m;
  const char marker[] = "os_name == 'posix' or garbage";
  assert_int_equal(pep508_marker_parse(marker, 18, &m, &err), 0);
  assert_true(pep508_marker_evaluate(m, &linux_env));
  pep508_marker_free(m);
  pep508_marker_free(NULL);
}

static void test_requirement_invalid(void **state) {
  (void)state;
  static const struct {
    const char *in;
    const char *msg;
  } cases[] = {
      {"foo>=", "invalid requirement \"foo>=\": expected a version after \">=\" at column 6"},
      {"",
       "invalid requirement \"\": expected a package name (letters, digits, '.', '-', '_'), "
       "reached the end at column 1"},
      {">=1.0",
       "invalid requirement \">=1.0\": expected a package name (letters, digits, '.', "
       "'-', '_'), found '>' at column 1"},
      {"foo-",
       "invalid requirement \"foo-\": a package name must end with a letter or digit at "
       "column 4"},
      {"foo- >=1",
       "invalid requirement \"foo- >=1\": a package name must end with a letter or "
       "digit at column 4"},
      {"foo bar",
       "invalid requirement \"foo bar\": expected '[', a version specifier, \"@ URL\" "
       "or ';' after the name, found 'b' at column 5"},
      {"foo[bar",
       "invalid requirement \"foo[bar\": expected ',' or ']' after an extra name, "
       "reached the end at column 8"},
      {"foo[bar,]",
       "invalid requirement \"foo[bar,]\": expected an extra name, found ']' at "
       "column 9"},
      {"foo[bar-]",
       "invalid requirement \"foo[bar-]\": an extra name must end with a letter or "
       "digit at column 8"},
      {"foo[bar] baz",
       "invalid requirement \"foo[bar] baz\": expected a version specifier, \"@ "
       "URL\" or ';' after the extras, found 'b' at column 10"},
      {"foo>=1.0 bar",
       "invalid requirement \"foo>=1.0 bar\": expected ',', ';' or the end after "
       "the version specifier, found 'b' at column 10"},
      {"foo>=1.0 @ https://x.y/z",
       "invalid requirement \"foo>=1.0 @ https://x.y/z\": expected "
       "',', ';' or the end after the version specifier, found '@' "
       "at column 10"},
      {"foo>=1.0,",
       "invalid requirement \"foo>=1.0,\": expected a version operator after ',' "
       "(==, !=, <, <=, >, >=, ~= or ===) at column 10"},
      {"foo=1.0",
       "invalid requirement \"foo=1.0\": unknown version operator \"=\" (use ==, !=, "
       "<, <=, >, >=, ~= or ===) at column 4"},
      {"foo>=1.0x",
       "invalid requirement \"foo>=1.0x\": bad version after \">=\": unexpected 'x' "
       "at column 9"},
      {"foo (>=1",
       "invalid requirement \"foo (>=1\": expected ',' or ')' after the version "
       "specifier in parentheses, reached the end at column 9"},
      {"foo ()",
       "invalid requirement \"foo ()\": expected a version operator (==, !=, <, <=, >, "
       ">=, ~= or ===), found ')' at column 6"},
      {"foo (>=1) bar",
       "invalid requirement \"foo (>=1) bar\": expected ';' or the end after the "
       "version specifier, found 'b' at column 11"},
      {"foo @ ", "invalid requirement \"foo @ \": expected a URL after '@' at column 7"},
      {"foo @ file:x",
       "invalid requirement \"foo @ file:x\": expected a URL like "
       "https://host/path after '@' (scheme://...) at column 7"},
      {"foo @ /local/path",
       "invalid requirement \"foo @ /local/path\": expected a URL like "
       "https://host/path after '@' at column 7"},
      {"foo @ https://",
       "invalid requirement \"foo @ https://\": the URL has nothing after "
       "\"://\" at column 15"},
      {"foo @ https://x/{a}",
       "invalid requirement \"foo @ https://x/{a}\": invalid character "
       "'{' in the URL at column 17"},
      {"foo @ https://x/é",
       "invalid requirement \"foo @ https://x/\\xc3\\xa9\": invalid "
       "character byte 0xc3 in the URL at column 17"},
      {"x @ https://a/b;os_name==\"posix\"",
       "invalid requirement \"x @ https://a/b;os_name==\\\"posix\\\"\": invalid character '\"' in "
       "the URL (a marker after a URL needs a space before its ';') at column 26"},
      {"foo @ https://x.y/z q",
       "invalid requirement \"foo @ https://x.y/z q\": expected ';' or "
       "the end after the URL, found 'q' at column 21"},
      {"foo;",
       "invalid requirement \"foo;\": expected a marker variable (like python_version) or "
       "a quoted string, reached the end at column 5"},
      {"foo; os_name == 'a' xor",
       "invalid requirement \"foo; os_name == 'a' xor\": expected "
       "\"and\", \"or\" or the end in the marker, found 'x' at column "
       "21"},
      {"foo\n",
       "invalid requirement \"foo\\x0a\": expected '[', a version specifier, \"@ URL\" or "
       "';' after the name, found byte 0x0a at column 4"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cm_error_t err = CM_ERROR_INIT;
    pep508_requirement_t *r = (pep508_requirement_t *)1;
    if (pep508_requirement_parse(cases[i].in, strlen(cases[i].in), &r, &err) == 0)
      fail_msg("\"%s\" parsed but should not", cases[i].in);
    assert_null(r);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    if (strcmp(cm_error_message(&err), cases[i].msg) != 0)
      fail_msg("%s: got message\n  %s\nwant\n  %s", cases[i].in, cm_error_message(&err),
               cases[i].msg);
    cm_error_release(&err);
  }
}

static void test_requirement_limits(void **state) {
  (void)state;
  cm_error_t err = CM_ERROR_INIT;
  pep508_requirement_t *r;
  char *buf = calloc(PEP508_MAX_REQUIREMENT_LEN + 16, 1);

  /* Length. */
  memset(buf, 'a', PEP508_MAX_REQUIREMENT_LEN);
  assert_int_equal(pep508_requirement_parse(buf, PEP508_MAX_REQUIREMENT_LEN, &r, &err), 0);
  pep508_requirement_free(r);
  buf[PEP508_MAX_REQUIREMENT_LEN] = 'a';
  assert_int_equal(pep508_requirement_parse(buf, PEP508_MAX_REQUIREMENT_LEN + 1, &r, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "requirement is 4097 bytes, the limit is 4096"));
  assert_true(strlen(cm_error_message(&err)) < 300);
  cm_error_release(&err);

  /* Extras: 64 fine, 65 not. */
  strcpy(buf, "foo[");
  for (int i = 0; i < PEP508_MAX_EXTRAS; i++) sprintf(buf + strlen(buf), "%se%d", i ? "," : "", i);
  strcat(buf, "]");
  assert_int_equal(pep508_requirement_parse(buf, strlen(buf), &r, &err), 0);
  assert_int_equal(r->extras_len, PEP508_MAX_EXTRAS);
  pep508_requirement_free(r);
  strcpy(buf + strlen(buf) - 1, ",one_more]");
  assert_int_equal(pep508_requirement_parse(buf, strlen(buf), &r, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "more than 64 extras"));
  cm_error_release(&err);

  /* Clauses. */
  strcpy(buf, "foo");
  for (int i = 0; i <= PEP440_MAX_CLAUSES; i++) strcat(buf, i ? ",!=1" : "!=1");
  assert_int_equal(pep508_requirement_parse(buf, strlen(buf), &r, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "more than 32 version clauses"));
  cm_error_release(&err);

  /* Marker nesting: 32 levels fine, 33 not. */
  for (int depth = PEP508_MAX_MARKER_DEPTH; depth <= PEP508_MAX_MARKER_DEPTH + 1; depth++) {
    strcpy(buf, "foo; ");
    for (int i = 0; i < depth; i++) strcat(buf, "(");
    strcat(buf, "os_name == 'posix'");
    for (int i = 0; i < depth; i++) strcat(buf, ")");
    int rc = pep508_requirement_parse(buf, strlen(buf), &r, &err);
    if (depth == PEP508_MAX_MARKER_DEPTH) {
      assert_int_equal(rc, 0);
      assert_true(pep508_marker_evaluate(r->marker, &linux_env));
      pep508_requirement_free(r);
    } else {
      assert_int_equal(rc, -1);
      assert_int_equal(err.kind, CM_ERR_LIMIT);
      assert_non_null(strstr(cm_error_message(&err), "parentheses nest deeper than 32 levels"));
      cm_error_release(&err);
    }
  }
  free(buf);
}

/* ---------------------------------------------------------------- markers */

static void test_marker_evaluate(void **state) {
  (void)state;
  static const struct {
    const char *marker;
    bool want;
  } cases[] = {
      {"python_version >= \"3.8\"", true},
      {"python_version < \"3.8\"", false},
      /* Version comparison, not string comparison ("3.11" < "3.9" as strings). */
      {"python_version > \"3.9\"", true},
      {"python_version >= '3.11'", true},
      {"python_version == '3.11'", true},
      {"python_version == '3.11.0'", true},
      {"python_version != '3.11'", false},
      {"python_full_version >= \"3.11.7\"", true},
      {"python_full_version < \"3.11.7\"", false},
      {"python_full_version == \"3.11.*\"", true},
      {"python_full_version != \"3.11.*\"", false},
      {"python_version ~= \"3.8\"", true},
      {"python_version ~= \"3.12\"", false},
      {"python_full_version ~= \"3.11.2\"", true},
      {"python_version === \"3.11\"", true},
      {"python_version === \"3.11.0\"", false},
      {"\"3.11\" == python_version", true},
      {"\"3.10\" < python_version", true},
      {"implementation_version >= '3'", true},
      {"python_version >= ' 3.8 '", true},
      /* Strings. */
      {"os_name == \"posix\"", true},
      {"os_name == 'nt'", false},
      {"os_name != 'nt'", true},
      {"sys_platform == \"win32\"", false},
      {"platform_system == 'Linux'", true},
      {"platform_machine == 'x86_64'", true},
      {"platform_python_implementation == 'CPython'", true},
      {"implementation_name == 'cpython'", true},
      {"implementation_name < 'd'", true},
      {"implementation_name > 'd'", false},
      {"implementation_name <= 'cpython'", true},
      {"implementation_name >= 'cpythoo'", false},
      {"platform_release >= '5'", true},
      {"implementation_name === 'CPython'", true},
      {"os_name ~= os_name", false},
      {"'linux' in sys_platform", true},
      {"'lin' in sys_platform", true},
      {"'' in sys_platform", true},
      {"sys_platform in 'linux2 darwin'", true},
      {"sys_platform in 'win32 cygwin'", false},
      {"'z' not in os_name", true},
      {"'os' not in os_name", false},
      {"'Debian' in platform_version", true},
      /* Boolean structure. */
      {"os_name == 'posix' and python_version >= '3.8'", true},
      {"os_name == 'posix' and python_version >= '3.12'", false},
      {"os_name == 'nt' or python_version >= '3'", true},
      {"os_name == 'nt' or python_version >= '4'", false},
      {"os_name == 'nt' and python_version >= '3' or sys_platform == 'linux'", true},
      {"os_name == 'nt' and (python_version >= '3' or sys_platform == 'linux')", false},
      {"python_version == '3.11' and (os_name == 'nt' or (sys_platform == 'linux' and "
       "platform_machine == 'aarch64'))",
       false},
      {"python_version == '3.11' and (os_name == 'nt' or (sys_platform == 'linux' and "
       "platform_machine == 'x86_64'))",
       true},
      /* extra is "" when not installing an extra. */
      {"extra == 'test'", false},
      {"extra == ''", true},
      {"extra != 'test'", true},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    pep508_marker_t *m = parse_marker(cases[i].marker);
    bool got = pep508_marker_evaluate(m, &linux_env);
    if (got != cases[i].want)
      fail_msg("%s evaluated to %d, want %d", cases[i].marker, got, cases[i].want);
    pep508_marker_free(m);
  }

  /* A NULL marker is true; a NULL env has only empty values. */
  assert_true(pep508_marker_evaluate(NULL, &linux_env));
  pep508_marker_t *m = parse_marker("os_name == ''");
  assert_true(pep508_marker_evaluate(m, NULL));
  pep508_marker_free(m);
}

static void test_marker_extra(void **state) {
  (void)state;
  pep508_env_t env = linux_env;
  env.extra = "Test_X";
  static const struct {
    const char *marker;
    bool want;
  } cases[] = {
      {"extra == 'test-x'", true},  {"extra == 'TEST.X'", true},  {"extra == 'test_x'", true},
      {"'Test__X' == extra", true}, {"extra != 'test-x'", false}, {"extra == 'test'", false},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    pep508_marker_t *m = parse_marker(cases[i].marker);
    bool got = pep508_marker_evaluate(m, &env);
    if (got != cases[i].want)
      fail_msg("%s with extra %s evaluated to %d, want %d", cases[i].marker, env.extra, got,
               cases[i].want);
    pep508_marker_free(m);
  }
}

static void test_marker_prerelease_interpreter(void **state) {
  (void)state;
  /* Version comparisons allow pre-releases, with the PEP 440 exclusion rules. */
  pep508_env_t env = linux_env;
  env.python_full_version = "3.13.0rc1";
  env.python_version = "3.13";
  pep508_marker_t *m = parse_marker("python_full_version >= '3.13.0rc1'");
  assert_true(pep508_marker_evaluate(m, &env));
  pep508_marker_free(m);
  m = parse_marker("python_full_version >= '3.13'");
  assert_false(pep508_marker_evaluate(m, &env));
  pep508_marker_free(m);
  m = parse_marker("python_full_version > '3.12'");
  assert_true(pep508_marker_evaluate(m, &env));
  pep508_marker_free(m);
  /* A value that is not a version falls back to string comparison. */
  env.python_full_version = "3.13.0+";
  m = parse_marker("python_full_version >= '3.13'");
  assert_true(pep508_marker_evaluate(m, &env));
  pep508_marker_free(m);
}

static void test_marker_structure(void **state) {
  (void)state;
  pep508_marker_t *m =
      parse_marker("os_name == 'a' or os_name == 'b' and os_name == 'c' or os_name == 'd'");
  assert_int_equal(m->kind, PEP508_MARKER_OR);
  assert_int_equal(m->nchildren, 3);
  assert_int_equal(m->children[0]->kind, PEP508_MARKER_COMPARE);
  assert_int_equal(m->children[1]->kind, PEP508_MARKER_AND);
  assert_int_equal(m->children[1]->nchildren, 2);
  assert_int_equal(m->children[2]->kind, PEP508_MARKER_COMPARE);
  char *s = pep508_marker_render(m);
  assert_string_equal(s,
                      "os_name == \"a\" or os_name == \"b\" and os_name == \"c\" or "
                      "os_name == \"d\"");
  free(s);
  pep508_marker_free(m);

  /* Long chains stay flat (no deep recursion). */
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (int i = 0; i < 150; i++) cm_buf_printf(&b, "%sos_name == '%d'", i ? " or " : "", i);
  m = parse_marker(b.data);
  assert_int_equal(m->kind, PEP508_MARKER_OR);
  assert_int_equal(m->nchildren, 150);
  assert_false(pep508_marker_evaluate(m, &linux_env));
  pep508_marker_free(m);
  cm_buf_release(&b);

  assert_string_equal(pep508_var_name(PEP508_VAR_PYTHON_FULL_VERSION), "python_full_version");
  assert_string_equal(pep508_marker_op_string(PEP508_OP_NOT_IN), "not in");
  s = pep508_marker_render(NULL);
  assert_string_equal(s, "");
  free(s);
}

static void test_marker_invalid(void **state) {
  (void)state;
  static const struct {
    const char *in;
    const char *msg;
  } cases[] = {
      {"",
       "invalid marker \"\": expected a marker variable (like python_version) or a quoted "
       "string, reached the end at column 1"},
      {"python_version >= ",
       "invalid marker \"python_version >= \": expected a marker variable "
       "(like python_version) or a quoted string, reached the end at "
       "column 19"},
      {"python_version = '3'",
       "invalid marker \"python_version = '3'\": unknown comparison "
       "operator \"=\" at column 16"},
      {"python_version '3'",
       "invalid marker \"python_version '3'\": expected a comparison "
       "operator (==, !=, <, <=, >, >=, ~=, ===, in, not in), found ''' at "
       "column 16"},
      {"foo == '1'", "invalid marker \"foo == '1'\": unknown marker variable \"foo\" at column 1"},
      {"os_name == \"posix",
       "invalid marker \"os_name == \\\"posix\": unterminated string (no "
       "closing \") at column 12"},
      {"os_name == 'a\\b'",
       "invalid marker \"os_name == 'a\\\\b'\": invalid character '\\' in a "
       "marker string at column 14"},
      {"(os_name == 'a'",
       "invalid marker \"(os_name == 'a'\": expected ')' to close a "
       "parenthesis in the marker, reached the end at column 16"},
      {"os_name == 'a' and",
       "invalid marker \"os_name == 'a' and\": expected a marker variable "
       "(like python_version) or a quoted string, reached the end at column "
       "19"},
      {"os_name == 'a' xor os_name == 'b'",
       "invalid marker \"os_name == 'a' xor os_name == "
       "'b'\": expected \"and\", \"or\" or the end, found "
       "'x' at column 16"},
      {"os_name=='a'andos_name=='b'",
       "invalid marker \"os_name=='a'andos_name=='b'\": expected "
       "\"and\", \"or\" or the end, found 'a' at column 13"},
      {"os_name not 'a'",
       "invalid marker \"os_name not 'a'\": expected \"in\" after \"not\" at "
       "column 13"},
      {"os_name notin 'a'",
       "invalid marker \"os_name notin 'a'\": expected a comparison "
       "operator (==, !=, <, <=, >, >=, ~=, ===, in, not in), found 'n' at "
       "column 9"},
      {"python_version ~= '3'",
       "invalid marker \"python_version ~= '3'\": ~= needs a version "
       "with at least two numbers (like \"3.8\") at column 19"},
      {"os_name ~= 'posix'",
       "invalid marker \"os_name ~= 'posix'\": ~= needs a version with at "
       "least two numbers (like \"3.8\") at column 12"},
      {"os_name == 'a')",
       "invalid marker \"os_name == 'a')\": expected \"and\", \"or\" or the "
       "end, found ')' at column 15"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cm_error_t err = CM_ERROR_INIT;
    pep508_marker_t *m = (pep508_marker_t *)1;
    if (pep508_marker_parse(cases[i].in, strlen(cases[i].in), &m, &err) == 0)
      fail_msg("\"%s\" parsed but should not", cases[i].in);
    assert_null(m);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    if (strcmp(cm_error_message(&err), cases[i].msg) != 0)
      fail_msg("%s: got message\n  %s\nwant\n  %s", cases[i].in, cm_error_message(&err),
               cases[i].msg);
    cm_error_release(&err);
  }
}

/* ---------------------------------------------------------------- merging */

static void check_merge(const char *const *existing, size_t ne, const char *const *extra, size_t nx,
                        const char *const *want, size_t nwant) {
  cm_error_t err = CM_ERROR_INIT;
  char **out = NULL;
  if (pep508_merge_dependencies(existing, ne, extra, nx, &out, &err) != 0)
    fail_msg("merge failed: %s", cm_error_message(&err));
  assert_non_null(out);
  if (cm_strv_len(out) != nwant) fail_msg("merged %zu entries, want %zu", cm_strv_len(out), nwant);
  for (size_t i = 0; i < nwant; i++)
    if (strcmp(out[i], want[i]) != 0) fail_msg("entry %zu is %s, want %s", i, out[i], want[i]);
  assert_null(out[nwant]);
  cm_strv_free(out);
}

static void test_merge(void **state) {
  (void)state;
  {
    const char *existing[] = {"requests>=2.28", "Requests_X", "requests>=2.30"};
    const char *want[] = {"requests>=2.30", "Requests_X"};
    check_merge(existing, 3, NULL, 0, want, 2);
    check_merge(NULL, 0, existing, 3, want, 2);
  }
  {
    const char *existing[] = {"requests>=2.28", "Requests_X"};
    const char *extra[] = {"requests>=2.30"};
    const char *want[] = {"requests>=2.30", "Requests_X"};
    check_merge(existing, 2, extra, 1, want, 2);
  }
  {
    /* Case, '_', '.' and '-' variants are the same package; spelling is kept. */
    const char *existing[] = {"Foo_Bar==1", "numpy", "pandas"};
    const char *extra[] = {"foo.bar>=2", "NumPy[extra]", "scipy"};
    const char *want[] = {"foo.bar>=2", "NumPy[extra]", "pandas", "scipy"};
    check_merge(existing, 3, extra, 3, want, 4);
  }
  {
    /* The last spec wins even if it has a marker or a URL. */
    const char *existing[] = {"foo>=2", "bar"};
    const char *extra[] = {"FOO @ https://example.com/foo.whl", "foo ; os_name == 'nt'"};
    const char *want[] = {"foo ; os_name == 'nt'", "bar"};
    check_merge(existing, 2, extra, 2, want, 2);
  }
  {
    const char *extra[] = {"a", "b", "A", "c", "B", "a"};
    const char *want[] = {"a", "B", "c"};
    check_merge(NULL, 0, extra, 6, want, 3);
  }
  {
    const char *existing[] = {"only"};
    const char *want[] = {"only"};
    check_merge(existing, 1, NULL, 0, want, 1);
    check_merge(NULL, 0, existing, 1, want, 1);
  }
  check_merge(NULL, 0, NULL, 0, NULL, 0);
}

static void test_merge_errors(void **state) {
  (void)state;
  cm_error_t err = CM_ERROR_INIT;
  char **out = (char **)1;
  const char *existing[] = {"ok", "foo>="};
  assert_int_equal(pep508_merge_dependencies(existing, 2, NULL, 0, &out, &err), -1);
  assert_null(out);
  assert_int_equal(err.kind, CM_ERR_INVALID);
  assert_string_equal(cm_error_message(&err),
                      "script dependency 2: invalid requirement \"foo>=\": expected a version "
                      "after \">=\" at column 6");
  cm_error_release(&err);

  const char *extra[] = {"not a requirement"};
  assert_int_equal(pep508_merge_dependencies(existing, 1, extra, 1, &out, &err), -1);
  assert_string_equal(cm_error_message(&err),
                      "extra dependency 1: invalid requirement \"not a requirement\": expected "
                      "'[', a version specifier, \"@ URL\" or ';' after the name, found 'a' at "
                      "column 5");
  cm_error_release(&err);

  const char *missing[] = {NULL};
  assert_int_equal(pep508_merge_dependencies(missing, 1, NULL, 0, &out, &err), -1);
  assert_string_equal(cm_error_message(&err), "script dependency 1 is missing");
  cm_error_release(&err);

  /* Too many entries: refused before parsing anything. */
  const char **many = calloc(PEP508_MAX_DEPENDENCIES + 1, sizeof *many);
  for (size_t i = 0; i <= PEP508_MAX_DEPENDENCIES; i++) many[i] = "numpy";
  assert_int_equal(pep508_merge_dependencies(many, PEP508_MAX_DEPENDENCIES, many, 1, &out, &err),
                   -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_string_equal(cm_error_message(&err), "1025 dependencies, the limit is 1024");
  cm_error_release(&err);
  assert_int_equal(pep508_merge_dependencies(many, PEP508_MAX_DEPENDENCIES, NULL, 0, &out, &err),
                   0);
  assert_int_equal(cm_strv_len(out), 1);
  cm_strv_free(out);
  free(many);

  /* An over-long entry is a limit error naming the entry. */
  char *big = malloc(PEP508_MAX_REQUIREMENT_LEN + 100);
  memset(big, 'a', PEP508_MAX_REQUIREMENT_LEN + 99);
  big[PEP508_MAX_REQUIREMENT_LEN + 99] = '\0';
  const char *bigs[] = {big};
  assert_int_equal(pep508_merge_dependencies(NULL, 0, bigs, 1, &out, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(cm_error_message(&err), "extra dependency 1: requirement \"aaa"));
  cm_error_release(&err);
  free(big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_real_life),
      cmocka_unit_test(test_render),
      cmocka_unit_test(test_not_nul_terminated),
      cmocka_unit_test(test_requirement_invalid),
      cmocka_unit_test(test_requirement_limits),
      cmocka_unit_test(test_marker_evaluate),
      cmocka_unit_test(test_marker_extra),
      cmocka_unit_test(test_marker_prerelease_interpreter),
      cmocka_unit_test(test_marker_structure),
      cmocka_unit_test(test_marker_invalid),
      cmocka_unit_test(test_merge),
      cmocka_unit_test(test_merge_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
