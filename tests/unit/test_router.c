/* Unit tests for the server's pure parts: JSON-RPC envelope, output formatting, config. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "server/jsonscan.h"
#include "server/server-internal.h"

static void test_depth_scan(void **state) {
  assert_int_equal(srv_json_depth("{}", 2, 64), 1);
  assert_int_equal(srv_json_depth("[[[]]]", 6, 64), 3);
  assert_int_equal(srv_json_depth("\"[[[[\"", 6, 64), 0);
  assert_int_equal(srv_json_depth("[\"\\\"[[\"]", 8, 64), 1);
  assert_int_equal(srv_json_depth("[[[[", 4, 2), 3);
  assert_int_equal(srv_json_depth("[", 1, 64), 1); /* jansson reports the syntax error */
}

static void classify(const char *text, srv_msg_kind_t kind, bool has_id) {
  int code;
  char *why = NULL;
  json_t *j = srv_jsonrpc_parse(text, strlen(text), &code, &why);
  assert_non_null(j);
  srv_msg_t m;
  srv_jsonrpc_classify(j, &m);
  assert_int_equal(m.kind, kind);
  assert_int_equal(m.id != NULL, has_id);
  json_decref(j);
}

static void test_classify(void **state) {
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", SRV_MSG_REQUEST, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\",\"params\":{}}", SRV_MSG_REQUEST, true);
  classify("{\"jsonrpc\":\"2.0\",\"method\":\"x\"}", SRV_MSG_NOTIFICATION, false);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}", SRV_MSG_RESPONSE, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"error\":{}}", SRV_MSG_INVALID, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", SRV_MSG_INVALID, false);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", SRV_MSG_INVALID, false);
  classify("{\"jsonrpc\":\"2.1\",\"id\":1,\"method\":\"ping\"}", SRV_MSG_INVALID, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":3}", SRV_MSG_INVALID, true);
  classify("[1]", SRV_MSG_INVALID, false);
}

static void test_parse_errors(void **state) {
  int code;
  char *why = NULL;
  assert_null(srv_jsonrpc_parse("{\"a\":1,\"a\":2}", 13, &code, &why));
  assert_int_equal(code, JSONRPC_PARSE_ERROR);
  free(why);
  assert_null(srv_jsonrpc_parse("{} x", 4, &code, &why));
  assert_int_equal(code, JSONRPC_PARSE_ERROR);
  free(why);
  char deep[200];
  memset(deep, '[', 100);
  memset(deep + 100, ']', 100);
  assert_null(srv_jsonrpc_parse(deep, 200, &code, &why));
  assert_int_equal(code, JSONRPC_INVALID_REQUEST);
  free(why);
  assert_null(srv_jsonrpc_parse("\"a\\u0000b\"", 10, &code, &why));
  free(why);
}

static void test_marker(void **state) {
  char *m = srv_truncation_marker(102400);
  assert_string_equal(m, "\n... [truncated at 100KB]");
  free(m);
  m = srv_truncation_marker(1024);
  assert_string_equal(m, "\n... [truncated at 1KB]");
  free(m);
  m = srv_truncation_marker(1500);
  assert_string_equal(m, "\n... [truncated at 1KB]");
  free(m);
  m = srv_truncation_marker(2560); /* 2.5 rounds half to even, as Python does */
  assert_string_equal(m, "\n... [truncated at 2KB]");
  free(m);
}

static void test_truncate(void **state) {
  char *t = srv_truncate_output("hello world", 11, "", 0, 11, 1024);
  assert_string_equal(t, "hello world");
  free(t);
  char big[2000];
  memset(big, 'x', sizeof big);
  t = srv_truncate_output(big, 1024, big, 976, 2000, 1024);
  assert_true(strlen(t) <= 1024);
  assert_non_null(strstr(t, "truncated"));
  free(t);
  /* head and tail: a long output keeps its end */
  char head[4096], tail[4096];
  memset(head, 'h', sizeof head);
  memset(tail, 't', sizeof tail);
  tail[4095] = 'Z';
  t = srv_truncate_output(head, 4096, tail, 4096, 1000000, 4096);
  assert_true(strlen(t) <= 4096);
  assert_non_null(strstr(t, "truncated at 4KB"));
  assert_non_null(strstr(t, "1000000 bytes in all"));
  assert_int_equal(t[strlen(t) - 1], 'Z');
  free(t);
  /* UTF-8 stays valid when the cut falls inside a character */
  char u[3000];
  size_t n = 0;
  while (n + 3 <= sizeof u) {
    memcpy(u + n, "\xe4\xb8\x96", 3);
    n += 3;
  }
  t = srv_truncate_output(u, 1024, u + n - 1024, 1024, n, 1024);
  assert_true(cm_utf8_valid(t, strlen(t)));
  assert_true(strlen(t) <= 1024);
  free(t);
}

static void test_format(void **state) {
  srv_exec_summary_t s = {.stdout_text = "hello\n", .stderr_text = "", .exit_code = 0, .duration_ms = 42};
  char *t = srv_format_result(&s);
  assert_string_equal(t, "--- stdout ---\nhello\n\n--- exit_code: 0 ---\n--- duration_ms: 42 ---");
  free(t);
  srv_exec_summary_t e = {.stdout_text = "", .stderr_text = "error message\n", .exit_code = 1, .duration_ms = 5};
  t = srv_format_result(&e);
  assert_string_equal(t, "--- stderr ---\nerror message\n\n--- exit_code: 1 ---\n--- duration_ms: 5 ---");
  free(t);
  srv_exec_summary_t to = {.exit_code = -9, .duration_ms = 2000, .timed_out = true};
  t = srv_format_result(&to);
  assert_string_equal(t, "--- exit_code: -9 ---\n--- duration_ms: 2000 ---\n--- timed_out: true ---");
  free(t);
}

static void test_config(void **state) {
  srv_config_t c;
  srv_config_defaults(&c);
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(srv_config_validate(&c, &err), 0);
  assert_int_equal(c.max_timeout, 300);
  assert_int_equal(c.default_timeout, 30);
  assert_int_equal(c.max_output_bytes, 102400);
  assert_true(c.warm_cache);
  assert_string_equal(c.uv_path, "uv");
  char *argv[] = {"x", "--python-version", "3.14", "--sandbox-backend", "docker", "--max-timeout", "600",
                  "--default-timeout=60", "--max-output-bytes", "200000", "--no-warm-cache", "--memory-limit",
                  "512M", NULL};
  assert_int_equal(srv_config_parse(&c, 13, argv, &err), 0);
  assert_string_equal(c.python_version, "3.14");
  assert_string_equal(c.sandbox_backend, "docker");
  assert_int_equal(c.max_timeout, 600);
  assert_int_equal(c.default_timeout, 60);
  assert_int_equal(c.max_output_bytes, 200000);
  assert_false(c.warm_cache);
  assert_int_equal(c.memory_bytes, 512ull << 20);
  assert_int_equal(srv_config_validate(&c, &err), 0);
  srv_config_release(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_depth_scan), cmocka_unit_test(test_classify), cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_marker),     cmocka_unit_test(test_truncate), cmocka_unit_test(test_format),
      cmocka_unit_test(test_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
