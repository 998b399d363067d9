/* Unit tests for server/exec/kframe.c: the session kernel's frames (a 4-byte big-endian
 * length and one JSON object) and its results, which the server parses as hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/exec/exec-internal.h"

/* A frame of body (len bytes) with its length prefix; the caller frees it. */
static char *frame_of(const char *body, size_t len, size_t *out_len) {
  char *f = malloc(len + 4);
  f[0] = (char)(len >> 24);
  f[1] = (char)(len >> 16);
  f[2] = (char)(len >> 8);
  f[3] = (char)len;
  memcpy(f + 4, body, len);
  *out_len = len + 4;
  return f;
}

static int parse(const char *buf, size_t len, size_t *used, json_t **out) {
  cm_error_t err = CM_ERROR_INIT;
  int rc = exec_kframe_parse(buf, len, used, out, &err);
  cm_error_release(&err);
  return rc;
}

static void test_whole_and_partial_frames(void **state) {
  (void)state;
  const char *body = "{\"id\":3,\"status\":\"ok\"}";
  size_t n;
  char *f = frame_of(body, strlen(body), &n);
  size_t used;
  json_t *o;
  /* Every prefix is "more please", never an error. */
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(parse(f, i, &used, &o), 0);
    assert_null(o);
  }
  assert_int_equal(parse(f, n, &used, &o), 1);
  assert_int_equal(used, n);
  assert_int_equal(json_integer_value(json_object_get(o, "id")), 3);
  json_decref(o);
  free(f);
}

static void test_two_frames_in_one_buffer(void **state) {
  (void)state;
  size_t n1, n2;
  char *a = frame_of("{\"a\":1}", 7, &n1), *b = frame_of("{\"b\":2}", 7, &n2);
  char buf[64];
  memcpy(buf, a, n1);
  memcpy(buf + n1, b, n2);
  size_t used;
  json_t *o;
  assert_int_equal(parse(buf, n1 + n2, &used, &o), 1);
  assert_int_equal(used, n1);
  assert_non_null(json_object_get(o, "a"));
  json_decref(o);
  assert_int_equal(parse(buf + used, n1 + n2 - used, &used, &o), 1);
  assert_non_null(json_object_get(o, "b"));
  json_decref(o);
  free(a);
  free(b);
}

static void test_hostile_frames_are_refused(void **state) {
  (void)state;
  size_t used;
  json_t *o;
  /* Too long: refused from its header alone, before any body is buffered. */
  const char huge[4] = {0x7f, 0, 0, 0};
  assert_int_equal(parse(huge, 4, &used, &o), -1);
  const char *bad[] = {"[1,2]", "not json", "{\"a\":1,\"a\":2}", "\"str\"", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t n;
    char *f = frame_of(bad[i], strlen(bad[i]), &n);
    assert_int_equal(parse(f, n, &used, &o), -1);
    assert_null(o);
    free(f);
  }
}

static json_t *j(const char *text) {
  json_t *o = json_loads(text, 0, NULL);
  assert_non_null(o);
  return o;
}

static void test_results_are_checked(void **state) {
  (void)state;
  exec_kresult_t r;
  cm_error_t err = CM_ERROR_INIT;
  json_t *o =
      j("{\"id\":5,\"status\":\"error\",\"exit_code\":1,\"error\":\"ValueError\","
        "\"display\":null,\"rss_bytes\":1234}");
  assert_int_equal(exec_kresult_from_json(o, &r, &err), 0);
  assert_int_equal(r.id, 5);
  assert_int_equal(r.status, EXEC_KSTATUS_ERROR);
  assert_int_equal(r.exit_code, 1);
  assert_string_equal(r.error, "ValueError");
  assert_null(r.display);
  assert_int_equal(r.rss_bytes, 1234);
  exec_kresult_release(&r);
  json_decref(o);
  /* ok is always exit code 0, whatever the kernel claims */
  o = j("{\"id\":1,\"status\":\"ok\",\"exit_code\":9}");
  assert_int_equal(exec_kresult_from_json(o, &r, &err), 0);
  assert_int_equal(r.exit_code, 0);
  exec_kresult_release(&r);
  json_decref(o);
  const char *bad[] = {
      "{\"status\":\"ok\"}",                              /* no id */
      "{\"id\":-1,\"status\":\"ok\"}",                    /* negative id */
      "{\"id\":1,\"status\":\"fine\"}",                   /* unknown status */
      "{\"id\":1,\"status\":\"exit\",\"exit_code\":300}", /* out of range */
      "{\"id\":1,\"status\":\"ok\",\"display\":5}",       /* not a string */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    o = j(bad[i]);
    assert_int_equal(exec_kresult_from_json(o, &r, &err), -1);
    cm_error_release(&err);
    json_decref(o);
  }
}

static void test_display_is_capped_on_a_character_boundary(void **state) {
  (void)state;
  /* 3-byte characters: the cap falls inside one. */
  size_t n = EXEC_KRESULT_MAX_DISPLAY + 300;
  char *s = malloc(n + 1);
  for (size_t i = 0; i + 3 <= n; i += 3) memcpy(s + i, "\xe2\x82\xac", 3);
  n -= n % 3;
  s[n] = '\0';
  json_t *o = json_pack("{s:i, s:s, s:s}", "id", 1, "status", "ok", "display", s);
  exec_kresult_t r;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(exec_kresult_from_json(o, &r, &err), 0);
  size_t got = strlen(r.display);
  assert_true(got <= EXEC_KRESULT_MAX_DISPLAY && got % 3 == 0 && got > 0);
  exec_kresult_release(&r);
  json_decref(o);
  free(s);
}

static void test_encode_round_trip(void **state) {
  (void)state;
  json_t *req = json_pack("{s:s, s:i}", "op", "interrupt", "id", 7);
  size_t len, used;
  char *f = exec_kframe_encode(req, &len);
  json_t *back;
  assert_int_equal(parse(f, len, &used, &back), 1);
  assert_int_equal(used, len);
  assert_true(json_equal(req, back));
  json_decref(back);
  json_decref(req);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_whole_and_partial_frames),
      cmocka_unit_test(test_two_frames_in_one_buffer),
      cmocka_unit_test(test_hostile_frames_are_refused),
      cmocka_unit_test(test_results_are_checked),
      cmocka_unit_test(test_display_is_capped_on_a_character_boundary),
      cmocka_unit_test(test_encode_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
