/* Unit tests for pystd/toml.c: the toml-test corpus (TOML 1.0 file list) read in place
 * from ../shared/toml-test, plus hand-written cases for messages, limits and the API. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/cm.h"
#include "pystd/pystd.h"

/* ---------------------------------------------------------------- helpers */

static toml_value_t *parse_ok(const char *text) {
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = NULL;
  int rc = toml_parse(text, strlen(text), NULL, &root, &err);
  if (rc != 0) fail_msg("unexpected error for %s: %s", text, cm_error_message(&err));
  assert_non_null(root);
  cm_error_release(&err);
  return root;
}

/* Parses text that must fail; returns the message (heap) and checks the kind. */
static char *parse_fail_opts(const char *text, size_t len, const toml_options_t *opts,
                             cm_error_kind_t kind) {
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = (toml_value_t *)1;
  int rc = toml_parse(text, len, opts, &root, &err);
  if (rc == 0) fail_msg("expected an error for: %.*s", (int)len, text);
  assert_int_equal(rc, -1);
  assert_null(root);
  assert_int_equal(err.kind, kind);
  assert_non_null(err.msg);
  return steal_pointer(&err.msg);
}

static char *parse_fail(const char *text) {
  return parse_fail_opts(text, strlen(text), NULL, CM_ERR_INVALID);
}

static void expect_message(const char *text, const char *message) {
  cleanup_free char *msg = parse_fail(text);
  if (strcmp(msg, message) != 0) fail_msg("for %s\n  got:  %s\n  want: %s", text, msg, message);
}

static void expect_message_contains(const char *text, const char *part) {
  cleanup_free char *msg = parse_fail(text);
  if (strstr(msg, part) == NULL) fail_msg("for %s\n  got:  %s\n  want: ...%s...", text, msg, part);
}

/* ---------------------------------------------------------------- corpus */

static char *corpus_dir(void) {
  const char *src = getenv("MPS_SOURCE_DIR");
#ifdef MPS_SOURCE_DIR
  if (src == NULL || *src == '\0') src = MPS_SOURCE_DIR;
#endif
  if (src == NULL) src = ".";
  return xasprintf("%s/../shared/toml-test/tests", src);
}

static char *read_whole(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = xmalloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) buf = xrealloc(buf, cap *= 2);
  }
  fclose(f);
  *len = n;
  return buf;
}

/* jansson cannot load object keys containing NUL, and toml-test has a "\u0000" key.  So
 * the expected JSON is loaded with every \u0000 escape replaced by U+F0000 (a private-use
 * character the corpus does not use), and decoded TOML bytes are compared with NUL mapped
 * the same way. */
static const char nul_stand_in[] = "\xF3\xB0\x80\x80";

static json_t *load_expected(const char *path, char *why, size_t why_size) {
  size_t len = 0;
  cleanup_free char *text = read_whole(path, &len);
  if (text == NULL) {
    snprintf(why, why_size, "cannot read %s", path);
    return NULL;
  }
  cleanup_free char *fixed = xmalloc(len * 2 + 1);
  size_t o = 0;
  bool in_string = false;
  for (size_t i = 0; i < len; i++) {
    if (in_string && text[i] == '\\' && i + 1 < len) {
      if (len - i >= 6 && memcmp(text + i, "\\u0000", 6) == 0) {
        memcpy(fixed + o, "\\uDB80\\uDC00", 12);
        o += 12;
        i += 5;
      } else {
        fixed[o++] = text[i++];
        fixed[o++] = text[i];
      }
      continue;
    }
    if (text[i] == '"') in_string = !in_string;
    fixed[o++] = text[i];
  }
  json_error_t jerr;
  json_t *j = json_loadb(fixed, o, JSON_ALLOW_NUL, &jerr);
  if (j == NULL) snprintf(why, why_size, "bad expected JSON: %s", jerr.text);
  return j;
}

static char *map_nul(const char *s, size_t n, size_t *out_len) {
  char *out = xmalloc(n * 4 + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\0') {
      memcpy(out + o, nul_stand_in, 4);
      o += 4;
    } else {
      out[o++] = s[i];
    }
  }
  out[o] = '\0';
  *out_len = o;
  return out;
}

static bool json_is_tagged(json_t *j) {
  return json_is_object(j) && json_object_size(j) == 2 &&
         json_is_string(json_object_get(j, "type")) && json_is_string(json_object_get(j, "value"));
}

static bool datetimes_equal(const toml_value_t *v, const char *expected, char *why,
                            size_t why_size) {
  /* Decode the expected text with the decoder itself (toml-test writes valid TOML
   * date-times) and compare the parts, as toml-test compares parsed times. */
  cleanup_free char *doc = xasprintf("v = %s", expected);
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = NULL;
  if (toml_parse(doc, strlen(doc), NULL, &root, &err) < 0) {
    snprintf(why, why_size, "cannot decode expected datetime %s: %s", expected, err.msg);
    cm_error_release(&err);
    return false;
  }
  toml_datetime_t want, have;
  bool ok = toml_datetime(toml_table_get(root, "v"), &want) && toml_datetime(v, &have);
  ok = ok && want.type == have.type && want.year == have.year && want.month == have.month &&
       want.day == have.day && want.hour == have.hour && want.minute == have.minute &&
       want.second == have.second && want.nanosecond == have.nanosecond &&
       want.offset_minutes == have.offset_minutes;
  if (!ok) snprintf(why, why_size, "datetime %s, expected %s", toml_datetime_text(v), expected);
  toml_free(root);
  return ok;
}

static bool compare(const toml_value_t *v, json_t *j, const char *path, char *why, size_t why_size);

static bool compare_tagged(const toml_value_t *v, json_t *j, const char *path, char *why,
                           size_t why_size) {
  const char *type = json_string_value(json_object_get(j, "type"));
  json_t *jvalue = json_object_get(j, "value");
  const char *value = json_string_value(jvalue);
  static const struct {
    const char *name;
    toml_type_t type;
  } types[] = {
      {"string", TOML_STRING},
      {"integer", TOML_INTEGER},
      {"float", TOML_FLOAT},
      {"bool", TOML_BOOLEAN},
      {"datetime", TOML_OFFSET_DATETIME},
      {"datetime-local", TOML_LOCAL_DATETIME},
      {"date-local", TOML_LOCAL_DATE},
      {"time-local", TOML_LOCAL_TIME},
  };
  toml_type_t want = TOML_NONE;
  for (size_t i = 0; i < CM_ARRAY_SIZE(types); i++)
    if (strcmp(types[i].name, type) == 0) want = types[i].type;
  if (want == TOML_NONE) {
    snprintf(why, why_size, "%s: unknown expected type %s", path, type);
    return false;
  }
  if (toml_type(v) != want) {
    snprintf(why, why_size, "%s: got %s, expected %s", path, toml_type_name(toml_type(v)), type);
    return false;
  }
  switch (want) {
    case TOML_STRING: {
      size_t n = 0, mapped_len = 0;
      const char *s = toml_string(v, &n);
      cleanup_free char *mapped = map_nul(s, n, &mapped_len);
      size_t want_len = json_string_length(jvalue);
      if (mapped_len != want_len || memcmp(mapped, value, want_len) != 0) {
        snprintf(why, why_size, "%s: string \"%s\", expected \"%s\"", path, mapped, value);
        return false;
      }
      return true;
    }
    case TOML_INTEGER: {
      int64_t i = 0;
      toml_integer(v, &i);
      errno = 0;
      long long w = strtoll(value, NULL, 10);
      if (errno != 0 || w != i) {
        snprintf(why, why_size, "%s: integer %lld, expected %s", path, (long long)i, value);
        return false;
      }
      return true;
    }
    case TOML_FLOAT: {
      double f = 0;
      toml_float(v, &f);
      const char *w = value;
      bool ok;
      if (strstr(w, "nan")) {
        ok = isnan(f);
      } else if (strstr(w, "inf")) {
        ok = isinf(f) && ((w[0] == '-') == (f < 0));
      } else {
        ok = strtod(w, NULL) == f;
      }
      if (!ok) snprintf(why, why_size, "%s: float %.17g, expected %s", path, f, value);
      return ok;
    }
    case TOML_BOOLEAN: {
      bool b = false;
      toml_boolean(v, &b);
      if (strcmp(value, b ? "true" : "false") != 0) {
        snprintf(why, why_size, "%s: boolean %d, expected %s", path, b, value);
        return false;
      }
      return true;
    }
    default: {
      char inner[256];
      if (!datetimes_equal(v, value, inner, sizeof inner)) {
        snprintf(why, why_size, "%s: %s", path, inner);
        return false;
      }
      return true;
    }
  }
}

static bool compare(const toml_value_t *v, json_t *j, const char *path, char *why,
                    size_t why_size) {
  if (json_is_tagged(j)) return compare_tagged(v, j, path, why, why_size);
  if (json_is_array(j)) {
    if (toml_type(v) != TOML_ARRAY) {
      snprintf(why, why_size, "%s: got %s, expected an array", path, toml_type_name(toml_type(v)));
      return false;
    }
    if (toml_array_len(v) != json_array_size(j)) {
      snprintf(why, why_size, "%s: array of %zu, expected %zu", path, toml_array_len(v),
               json_array_size(j));
      return false;
    }
    for (size_t i = 0; i < json_array_size(j); i++) {
      cleanup_free char *sub = xasprintf("%s[%zu]", path, i);
      if (!compare(toml_array_at(v, i), json_array_get(j, i), sub, why, why_size)) return false;
    }
    return true;
  }
  if (!json_is_object(j)) {
    snprintf(why, why_size, "%s: unexpected JSON in expected file", path);
    return false;
  }
  if (toml_type(v) != TOML_TABLE) {
    snprintf(why, why_size, "%s: got %s, expected a table", path, toml_type_name(toml_type(v)));
    return false;
  }
  if (toml_table_len(v) != json_object_size(j)) {
    snprintf(why, why_size, "%s: table of %zu keys, expected %zu", path, toml_table_len(v),
             json_object_size(j));
    return false;
  }
  for (size_t i = 0; i < toml_table_len(v); i++) {
    const char *key;
    size_t key_len, mapped_len;
    const toml_value_t *child = toml_table_at(v, i, &key, &key_len);
    cleanup_free char *mapped = map_nul(key, key_len, &mapped_len);
    json_t *jchild = json_object_getn(j, mapped, mapped_len);
    cleanup_free char *sub = xasprintf("%s.%s", path, mapped);
    if (jchild == NULL) {
      snprintf(why, why_size, "%s: unexpected key", sub);
      return false;
    }
    if (!compare(child, jchild, sub, why, why_size)) return false;
  }
  return true;
}

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool corpus_present(void) {
  cleanup_free char *dir = corpus_dir();
  cleanup_free char *list = xasprintf("%s/files-toml-1.0.0", dir);
  struct stat st;
  return stat(list, &st) == 0;
}

static void test_corpus(void **state) {
  (void)state;
  cleanup_free char *dir = corpus_dir();
  cleanup_free char *list_path = xasprintf("%s/files-toml-1.0.0", dir);
  size_t list_len = 0;
  cleanup_free char *list = read_whole(list_path, &list_len);
  assert_non_null(list);
  list = xrealloc(list, list_len + 1);
  list[list_len] = '\0';

  int valid = 0, valid_ok = 0, invalid = 0, invalid_ok = 0;
  char *save = NULL;
  for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (!has_suffix(line, ".toml")) continue;
    bool is_valid = strncmp(line, "valid/", 6) == 0;
    bool is_invalid = strncmp(line, "invalid/", 8) == 0;
    if (!is_valid && !is_invalid) continue;
    cleanup_free char *path = xasprintf("%s/%s", dir, line);
    size_t len = 0;
    cleanup_free char *text = read_whole(path, &len);
    if (text == NULL) {
      printf("FAIL %s: cannot read\n", line);
      is_valid ? valid++ : invalid++;
      continue;
    }
    /* An exact-size copy, so a read past the end is caught under ASan. */
    cleanup_free char *exact = xmemdup(text, len ? len : 1);
    cm_error_t err = CM_ERROR_INIT;
    toml_value_t *root = NULL;
    int rc = toml_parse(exact, len, NULL, &root, &err);
    if (is_invalid) {
      invalid++;
      if (rc == 0) {
        printf("FAIL %s: accepted an invalid document\n", line);
      } else if (err.kind != CM_ERR_INVALID || strncmp(err.msg, "line ", 5) != 0) {
        printf("FAIL %s: kind %d, message %s\n", line, err.kind, err.msg);
      } else {
        invalid_ok++;
      }
    } else {
      valid++;
      char why[512] = "";
      if (rc != 0) {
        printf("FAIL %s: %s\n", line, cm_error_message(&err));
      } else {
        cleanup_free char *json_path = xasprintf("%.*s.json", (int)(strlen(path) - 5), path);
        json_t *expected = load_expected(json_path, why, sizeof why);
        if (expected == NULL) {
          printf("FAIL %s: %s\n", line, why);
        } else if (!compare(root, expected, "$", why, sizeof why)) {
          printf("FAIL %s: %s\n", line, why);
        } else {
          valid_ok++;
        }
        json_decref(expected);
      }
    }
    toml_free(root);
    cm_error_release(&err);
  }
  printf("toml-test 1.0.0: valid %d/%d decoded as expected, invalid %d/%d rejected\n", valid_ok,
         valid, invalid_ok, invalid);
  assert_true(valid > 0 && invalid > 0);
  assert_int_equal(valid_ok, valid);
  assert_int_equal(invalid_ok, invalid);
}

/* ---------------------------------------------------------------- messages */

/* toml_write() over the whole valid corpus: what it writes decodes again, and to the same
 * values (writing the re-decoded tree gives the same text). */
static void test_write_roundtrip(void **state) {
  (void)state;
  if (!corpus_present()) skip();
  cleanup_free char *dir = corpus_dir();
  cleanup_free char *list_path = xasprintf("%s/files-toml-1.0.0", dir);
  size_t list_len = 0;
  cleanup_free char *list = read_whole(list_path, &list_len);
  assert_non_null(list);
  list = xrealloc(list, list_len + 1);
  list[list_len] = '\0';
  int files = 0, failures = 0;
  char *save = NULL;
  for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (!has_suffix(line, ".toml") || strncmp(line, "valid/", 6) != 0) continue;
    cleanup_free char *path = xasprintf("%s/%s", dir, line);
    size_t len = 0;
    cleanup_free char *text = read_whole(path, &len);
    if (!text) continue;
    toml_value_t *doc = NULL;
    cm_error_t err = CM_ERROR_INIT;
    if (toml_parse(text, len, NULL, &doc, &err) < 0) {
      cm_error_release(&err);
      continue;
    }
    files++;
    cleanup_free char *once = toml_write(doc);
    toml_value_t *again = NULL;
    if (toml_parse(once, strlen(once), NULL, &again, &err) < 0) {
      printf("write roundtrip: %s: %s\n", line, cm_error_message(&err));
      cm_error_release(&err);
      failures++;
    } else {
      cleanup_free char *twice = toml_write(again);
      if (strcmp(once, twice) != 0) {
        printf("write roundtrip: %s: different values after writing\n", line);
        failures++;
      }
    }
    toml_free(again);
    toml_free(doc);
  }
  printf("toml_write roundtrip: %d files, %d failures\n", files, failures);
  assert_true(files > 100);
  assert_int_equal(failures, 0);
}

static void test_messages(void **state) {
  (void)state;
  expect_message("a = 1\nb = 2\na = 3\n", "line 3, column 1: duplicate key \"a\"");
  expect_message("[a]\nx = 1\n[a]\n", "line 3, column 2: table [a] is defined twice");
  expect_message("a.b = 1\n[a]\n",
                 "line 2, column 2: cannot define table [a]: it was already created by dotted "
                 "keys");
  expect_message("a = {b = 1}\na.c = 2\n",
                 "line 2, column 1: cannot add keys to inline table \"a\"");
  expect_message("[a.b]\n[a]\nb.c = 1\n",
                 "line 3, column 1: cannot add keys to table \"b\" with a dotted key: it is "
                 "defined by a [header]");
  expect_message("a = 1\na.b = 2\n",
                 "line 2, column 1: key \"a\" is already an integer, not a table");
  expect_message("x = \"abc\n",
                 "line 1, column 9: string is not closed before the end of the line");
  expect_message("x = 'abc", "line 1, column 5: string is not closed before the end of the file");
  expect_message("x = \"a\\qb\"",
                 "line 1, column 7: invalid escape sequence: backslash followed by 'q'");
  expect_message("x = \"\\uD800\"", "line 1, column 6: \\u escape is not a Unicode scalar value");
  expect_message("x = 2021-02-29",
                 "line 1, column 13: invalid date: day 29 is out of range for 2021-02");
  expect_message("x = 12:60:00", "line 1, column 8: invalid time: minute 60 is out of range");
  expect_message("x = 12:00:60", "line 1, column 11: invalid time: second 60 is out of range");
  expect_message("x = 012", "line 1, column 5: leading zeros are not allowed in 012");
  expect_message("x = 1__0",
                 "line 1, column 5: invalid number 1__0: an underscore must be between two digits");
  expect_message("x = 9223372036854775808",
                 "line 1, column 5: integer 9223372036854775808 does not fit in 64 bits");
  expect_message(
      "x = -0x1",
      "line 1, column 5: a sign is not allowed on a hexadecimal, octal or binary integer");
  expect_message("x = hello", "line 1, column 5: invalid value hello (strings must be quoted)");
  expect_message("x = >=3.11",
                 "line 1, column 5: expected a value, found '>' (strings must be quoted)");
  expect_message("x =", "line 1, column 4: expected a value, found end of file");
  expect_message("x = [1, 2", "line 1, column 5: array is not closed before the end of the file");
  expect_message("x = [1 2]",
                 "line 1, column 8: expected ',' or ']' after an array element, found '2'");
  expect_message("x = {a = 1,}",
                 "line 1, column 12: a trailing comma is not allowed in an inline table");
  expect_message("x = {a = 1\n}", "line 1, column 11: an inline table must be on one line");
  expect_message(
      "x = 1 y = 2",
      "line 1, column 7: unexpected 'y' after a value (expected a newline or a comment)");
  expect_message("x = 1\r",
                 "line 1, column 6: carriage return (U+000D) not followed by a line feed");
  expect_message("# bell \a\n", "line 1, column 8: U+0007 is not allowed in a comment");
  expect_message("[[a]]\n[a]\n",
                 "line 2, column 2: cannot define table [a]: it is an array of tables");
  expect_message(
      "a = [1]\n[[a]]\n",
      "line 2, column 3: cannot extend \"a\": it is an array value, not an array of tables");
  expect_message("\"\"\"k\"\"\" = 1", "line 1, column 1: a multi-line string cannot be a key");
  expect_message("k = \"\"\"a\"\"\"\"\"\"",
                 "line 1, column 14: too many quotes at the end of a multi-line string");
  /* Columns count characters, not bytes. */
  expect_message("\xC3\xA9 = 1", "line 1, column 1: expected a key, found U+00E9");
  expect_message(
      "x = \"\xC3\xA9\" y",
      "line 1, column 9: unexpected 'y' after a value (expected a newline or a comment)");
  /* Invalid UTF-8 names the line. */
  expect_message("a = 1\nb = \"\xC3\x28\"\n", "line 2, column 6: invalid UTF-8 (byte 0xC3)");
  expect_message("a = \"\xED\xA0\x80\"", "line 1, column 6: invalid UTF-8 (byte 0xED)");
  expect_message("a = \"\xC0\xAF\"", "line 1, column 6: invalid UTF-8 (byte 0xC0)");
  /* Key text in messages is escaped and shortened. */
  expect_message_contains("\"a\\nb\" = 1\n\"a\\nb\" = 2", "duplicate key \"a\\u000Ab\"");
  char long_key[300];
  memset(long_key, 'k', 200);
  strcpy(long_key + 200, " = 1\n");
  cleanup_free char *twice = xasprintf("%s%s", long_key, long_key);
  cleanup_free char *msg = parse_fail(twice);
  assert_non_null(strstr(msg, "kkk...\""));
  assert_true(strlen(msg) < 160);
}

static void test_nul_and_unterminated_input(void **state) {
  (void)state;
  /* NUL is a control character, wherever it is. */
  cleanup_free char *m1 = parse_fail_opts("a = \"x\0y\"", 9, NULL, CM_ERR_INVALID);
  assert_string_equal(
      m1, "line 1, column 7: U+0000 is not allowed in a string (use an escape sequence)");
  cleanup_free char *m2 = parse_fail_opts("a = 1\0", 6, NULL, CM_ERR_INVALID);
  assert_non_null(strstr(m2, "U+0000"));
  /* The length is what counts, not a terminator: "a = 12" cut after "1". */
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = NULL;
  assert_int_equal(toml_parse("a = 12", 5, NULL, &root, &err), 0);
  int64_t i = 0;
  assert_true(toml_integer(toml_table_get(root, "a"), &i));
  assert_int_equal(i, 1);
  toml_free(root);
  /* Empty input (even a NULL pointer with length 0) is an empty table. */
  assert_int_equal(toml_parse(NULL, 0, NULL, &root, &err), 0);
  assert_int_equal(toml_table_len(root), 0);
  toml_free(root);
}

/* ---------------------------------------------------------------- limits */

static void test_limits(void **state) {
  (void)state;
  /* Input size. */
  toml_options_t small = {.max_input_bytes = 8};
  cleanup_free char *m1 = parse_fail_opts("a = 12345", 9, &small, CM_ERR_LIMIT);
  assert_string_equal(m1, "TOML document of 9 bytes exceeds the limit of 8");
  cleanup_free char *big = xmalloc(TOML_MAX_INPUT_BYTES + 1);
  memset(big, '#', TOML_MAX_INPUT_BYTES + 1);
  cleanup_free char *m2 = parse_fail_opts(big, TOML_MAX_INPUT_BYTES + 1, NULL, CM_ERR_LIMIT);
  assert_string_equal(m2, "TOML document of 1048577 bytes exceeds the limit of 1048576");

  /* Depth through arrays, inline tables, dotted keys and headers. */
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_appends(&b, "a = ");
  for (int i = 0; i < 100; i++) cm_buf_appends(&b, "[");
  cleanup_free char *m3 = parse_fail_opts(b.data, b.len, NULL, CM_ERR_LIMIT);
  assert_string_equal(m3, "line 1, column 69: nesting deeper than 64 levels");
  cm_buf_reset(&b);
  cm_buf_appends(&b, "a = ");
  for (int i = 0; i < 100; i++) cm_buf_appends(&b, "{b = ");
  cleanup_free char *m4 = parse_fail_opts(b.data, b.len, NULL, CM_ERR_LIMIT);
  assert_non_null(strstr(m4, "nesting deeper than 64 levels"));
  cm_buf_reset(&b);
  for (int i = 0; i < 100; i++) cm_buf_appends(&b, "a.");
  cm_buf_appends(&b, "a = 1");
  cleanup_free char *m5 = parse_fail_opts(b.data, b.len, NULL, CM_ERR_LIMIT);
  assert_non_null(strstr(m5, "dotted key with more than 64 parts"));
  cm_buf_reset(&b);
  cm_buf_appends(&b, "[x");
  for (int i = 0; i < 40; i++) cm_buf_appends(&b, ".y");
  cm_buf_appends(&b, "]\n");
  for (int i = 0; i < 30; i++) cm_buf_appends(&b, "z.");
  cm_buf_appends(&b, "z = 1\n");
  cleanup_free char *m6 = parse_fail_opts(b.data, b.len, NULL, CM_ERR_LIMIT);
  assert_non_null(strstr(m6, "nesting deeper than 64 levels"));
  /* Exactly at the limit is fine. */
  toml_options_t depth3 = {.max_depth = 3};
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = NULL;
  assert_int_equal(toml_parse("a = [[1]]", 9, &depth3, &root, &err), 0);
  toml_free(root);
  cleanup_free char *m7 = parse_fail_opts("a = [[[1]]]", 11, &depth3, CM_ERR_LIMIT);
  assert_string_equal(m7, "line 1, column 8: nesting deeper than 3 levels");

  /* Values: table entries and array items together. */
  toml_options_t five = {.max_values = 5};
  assert_int_equal(toml_parse("a = [1, 2, 3]\nb = 1", 19, &five, &root, &err), 0);
  toml_free(root);
  cleanup_free char *m8 = parse_fail_opts("a = [1, 2, 3]\nb.c = 1", 21, &five, CM_ERR_LIMIT);
  assert_string_equal(m8, "line 2, column 7: more than 5 keys and array items");
  cm_buf_reset(&b);
  cm_buf_appends(&b, "a = [");
  for (int i = 0; i < TOML_MAX_VALUES; i++) cm_buf_appends(&b, "0,");
  cm_buf_appends(&b, "]");
  cleanup_free char *m9 = parse_fail_opts(b.data, b.len, NULL, CM_ERR_LIMIT);
  assert_non_null(strstr(m9, "more than 100000 keys and array items"));
  cm_buf_release(&b);
}

/* ---------------------------------------------------------------- API */

static void test_tables_and_lookup(void **state) {
  (void)state;
  toml_value_t *root = parse_ok(
      "zeta = 1\nalpha = \"two\"\nmid.x = true\n\"\\u0000k\" = 3\n[tool.uv]\nindex-url = 'u'\n"
      "[[tool.other]]\nn = 1\n[[tool.other]]\nn = 2\n");
  assert_int_equal(toml_type(root), TOML_TABLE);
  assert_int_equal(toml_table_len(root), 5);
  const char *names[] = {"zeta", "alpha", "mid", "\0k", "tool"};
  for (size_t i = 0; i < 5; i++) {
    const char *key;
    size_t key_len;
    assert_non_null(toml_table_at(root, i, &key, &key_len));
    assert_int_equal(key_len, i == 3 ? 2 : strlen(names[i]));
    assert_memory_equal(key, names[i], key_len);
    assert_int_equal(key[key_len], '\0');
  }
  assert_null(toml_table_at(root, 5, NULL, NULL));
  assert_non_null(toml_table_getn(root, "\0k", 2));
  assert_null(toml_table_get(root, "k"));
  const toml_value_t *uv = toml_table_get(toml_table_get(root, "tool"), "uv");
  size_t len = 0;
  assert_string_equal(toml_string(toml_table_get(uv, "index-url"), &len), "u");
  assert_int_equal(len, 1);
  const toml_value_t *other = toml_table_get(toml_table_get(root, "tool"), "other");
  assert_int_equal(toml_type(other), TOML_ARRAY);
  assert_int_equal(toml_array_len(other), 2);
  int64_t n = 0;
  assert_true(toml_integer(toml_table_get(toml_array_at(other, 1), "n"), &n));
  assert_int_equal(n, 2);
  assert_null(toml_array_at(other, 2));
  /* Lines. */
  assert_int_equal(toml_line(root), 1);
  assert_int_equal(toml_line(toml_table_get(root, "alpha")), 2);
  assert_int_equal(toml_line(uv), 5);
  assert_int_equal(toml_line(toml_array_at(other, 1)), 9);
  /* Type mismatches and NULLs are harmless. */
  assert_null(toml_string(toml_table_get(root, "zeta"), NULL));
  assert_false(toml_integer(toml_table_get(root, "alpha"), &n));
  assert_false(toml_boolean(NULL, NULL));
  assert_null(toml_table_get(NULL, "x"));
  assert_null(toml_table_get(root, NULL));
  assert_int_equal(toml_table_len(other), 0);
  assert_int_equal(toml_array_len(root), 0);
  assert_int_equal(toml_type(NULL), TOML_NONE);
  assert_null(toml_datetime_text(root));
  toml_free(root);
  toml_free(NULL);
}

static void test_big_table(void **state) {
  (void)state;
  /* Enough keys for the hash index; order, lookups and duplicates must still hold. */
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (int i = 0; i < 5000; i++) cm_buf_printf(&b, "k%d = %d\n", (i * 7919) % 5000, i);
  toml_value_t *root = parse_ok(b.data);
  assert_int_equal(toml_table_len(root), 5000);
  for (int i = 0; i < 5000; i++) {
    char key[16];
    snprintf(key, sizeof key, "k%d", (i * 7919) % 5000);
    int64_t v = -1;
    assert_true(toml_integer(toml_table_get(root, key), &v));
    assert_int_equal(v, i);
    const char *k0;
    toml_table_at(root, (size_t)i, &k0, NULL);
    assert_string_equal(k0, key);
  }
  toml_free(root);
  cm_buf_appends(&b, "k4999 = 0\n");
  cleanup_free char *msg = parse_fail(b.data);
  assert_string_equal(msg, "line 5001, column 1: duplicate key \"k4999\"");
  cm_buf_release(&b);
}

static void test_scalars(void **state) {
  (void)state;
  toml_value_t *root = parse_ok(
      "min = -9_223_372_036_854_775_808\nmax = 0x7FFF_FFFF_FFFF_FFFF\noct = 0o755\n"
      "bin = 0b1010\nf = 6.626e-34\nni = -inf\nnan = nan\nt = true\n"
      "s = \"tab\\there\\u00E9\\U0001F600\"\nml = \"\"\"\nline1\\\n    line2\r\nline3\"\"\"\n"
      "lit = '''\n'quoted' ''\"\"'''\n");
  int64_t i = 0;
  assert_true(toml_integer(toml_table_get(root, "min"), &i));
  assert_true(i == INT64_MIN);
  assert_true(toml_integer(toml_table_get(root, "max"), &i));
  assert_true(i == INT64_MAX);
  assert_true(toml_integer(toml_table_get(root, "oct"), &i));
  assert_int_equal(i, 0755);
  assert_true(toml_integer(toml_table_get(root, "bin"), &i));
  assert_int_equal(i, 10);
  double f = 0;
  assert_true(toml_float(toml_table_get(root, "f"), &f));
  assert_true(f == 6.626e-34);
  assert_true(toml_float(toml_table_get(root, "ni"), &f));
  assert_true(isinf(f) && f < 0);
  assert_true(toml_float(toml_table_get(root, "nan"), &f));
  assert_true(isnan(f));
  bool b = false;
  assert_true(toml_boolean(toml_table_get(root, "t"), &b));
  assert_true(b);
  assert_string_equal(toml_string(toml_table_get(root, "s"), NULL),
                      "tab\there\xC3\xA9\xF0\x9F\x98\x80");
  assert_string_equal(toml_string(toml_table_get(root, "ml"), NULL), "line1line2\nline3");
  assert_string_equal(toml_string(toml_table_get(root, "lit"), NULL), "'quoted' ''\"\"");
  toml_free(root);
}

static void test_datetimes(void **state) {
  (void)state;
  toml_value_t *root = parse_ok(
      "a = 1979-05-27 07:32:00.1234567891z\nb = 1979-05-27t07:32:00-07:30\n"
      "c = 2024-02-29\nd = 23:59:59.5\ne = 2000-01-01T00:00:00\n");
  toml_datetime_t dt;
  const toml_value_t *a = toml_table_get(root, "a");
  assert_string_equal(toml_datetime_text(a), "1979-05-27T07:32:00.123456789Z");
  assert_true(toml_datetime(a, &dt));
  assert_int_equal(dt.type, TOML_OFFSET_DATETIME);
  assert_int_equal(dt.nanosecond, 123456789);
  assert_true(dt.offset_z);
  const toml_value_t *bv = toml_table_get(root, "b");
  assert_string_equal(toml_datetime_text(bv), "1979-05-27T07:32:00-07:30");
  assert_true(toml_datetime(bv, &dt));
  assert_int_equal(dt.offset_minutes, -450);
  assert_int_equal(toml_type(toml_table_get(root, "c")), TOML_LOCAL_DATE);
  assert_string_equal(toml_datetime_text(toml_table_get(root, "c")), "2024-02-29");
  assert_true(toml_datetime(toml_table_get(root, "d"), &dt));
  assert_int_equal(dt.type, TOML_LOCAL_TIME);
  assert_int_equal(dt.nanosecond, 500000000);
  assert_string_equal(toml_datetime_text(toml_table_get(root, "d")), "23:59:59.5");
  assert_int_equal(toml_type(toml_table_get(root, "e")), TOML_LOCAL_DATETIME);
  toml_free(root);
  expect_message_contains("a = 1900-02-29", "day 29 is out of range for 1900-02");
  toml_free(parse_ok("a = 2000-02-29"));
  expect_message_contains("a = 1979-05-27T07:32", "seconds are required");
  expect_message_contains("a = 1979-05-27T07:32:00+24:00", "offset: +24:00 is out of range");
  expect_message_contains("a = 07:32:00Z", "unexpected 'Z' after a value");
}

static void test_crlf_bom_and_options(void **state) {
  (void)state;
  toml_value_t *root = parse_ok(
      "\xEF\xBB\xBF"
      "a = 1\r\n# c\r\nb = '''\r\nx\r\ny'''\r\n");
  assert_string_equal(toml_string(toml_table_get(root, "b"), NULL), "x\ny");
  assert_int_equal(toml_line(toml_table_get(root, "b")), 3);
  toml_free(root);
  /* A byte order mark does not count as a column. */
  cleanup_free char *bom = parse_fail(
      "\xEF\xBB\xBF"
      "a = 1 2");
  assert_string_equal(
      bom, "line 1, column 7: unexpected '2' after a value (expected a newline or a comment)");
  /* first_line and column_offset move positions in messages and toml_line(). */
  toml_options_t at = {.first_line = 10, .column_offset = 2};
  cleanup_free char *msg = parse_fail_opts("x = 1\nx = 2\n", 12, &at, CM_ERR_INVALID);
  assert_string_equal(msg, "line 11, column 3: duplicate key \"x\"");
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(toml_parse("x = 1\ny = 2\n", 12, &at, &root, &err), 0);
  assert_int_equal(toml_line(toml_table_get(root, "y")), 11);
  toml_free(root);
}

static void test_table_rules(void **state) {
  (void)state;
  /* Valid combinations. */
  toml_free(parse_ok("[a.b.c]\n[a]\n[a.b]\n"));
  toml_free(parse_ok("[fruit]\napple.color = 'red'\n[fruit.apple.texture]\nsmooth = true\n"));
  toml_free(parse_ok("[a.b.c]\n[a]\nb.d = 1\n"));
  toml_free(parse_ok("[[a]]\n[a.b]\n[[a]]\n[a.b]\n"));
  toml_free(parse_ok("a = {b.c = 1, b.d = 2}\n"));
  /* Invalid ones. */
  expect_message_contains("[a.b.c]\n[a]\nb.d = 1\n[a.b]\n",
                          "[a.b]: it was already created by dotted keys");
  expect_message_contains("[a.b.c]\n[a.b]\n[a.b]\n", "table [a.b] is defined twice");
  expect_message_contains("[fruit]\napple.color = 'red'\n[fruit.apple]\n",
                          "already created by dotted keys");
  expect_message_contains("a = {b = 1}\n[a.c]\n", "inline tables cannot be extended");
  expect_message_contains("a = {b = {}, b.c = 1}\n", "cannot add keys to inline table \"b\"");
  expect_message_contains("[a]\n[[a]]\n",
                          "cannot define array of tables [[a]]: it is already a table");
}

int main(void) {
  const struct CMUnitTest unit[] = {
      cmocka_unit_test(test_messages),    cmocka_unit_test(test_nul_and_unterminated_input),
      cmocka_unit_test(test_limits),      cmocka_unit_test(test_tables_and_lookup),
      cmocka_unit_test(test_big_table),   cmocka_unit_test(test_scalars),
      cmocka_unit_test(test_datetimes),   cmocka_unit_test(test_crlf_bom_and_options),
      cmocka_unit_test(test_table_rules), cmocka_unit_test(test_write_roundtrip),
  };
  const struct CMUnitTest corpus[] = {
      cmocka_unit_test(test_corpus),
  };
  int failed = cmocka_run_group_tests_name("toml", unit, NULL, NULL);
  if (!corpus_present()) {
    cleanup_free char *dir = corpus_dir();
    printf("toml-test corpus not found at %s: skipping the corpus tests\n", dir);
    return failed ? 1 : 77;
  }
  failed += cmocka_run_group_tests_name("toml-test corpus", corpus, NULL, NULL);
  return failed ? 1 : 0;
}
