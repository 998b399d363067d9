/* Unit tests for the router (srv_session_handle on a real server with the none backend,
 * answers recorded by a sink) and for the server's pure parts: JSON-RPC envelope, output
 * formatting, config. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

#include "envstore/envstore.h"
#include "interp/interp.h"
#include "pystd/pystd.h"
#include "server/core/core-internal.h"
#include "server/server.h"

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
  classify("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\",\"params\":{}}", SRV_MSG_REQUEST,
           true);
  classify("{\"jsonrpc\":\"2.0\",\"method\":\"x\"}", SRV_MSG_NOTIFICATION, false);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}", SRV_MSG_RESPONSE, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"error\":{}}", SRV_MSG_INVALID, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", SRV_MSG_INVALID, false);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", SRV_MSG_INVALID, false);
  classify("{\"jsonrpc\":\"2.1\",\"id\":1,\"method\":\"ping\"}", SRV_MSG_INVALID, true);
  classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":3}", SRV_MSG_INVALID,
           true);
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
  srv_exec_summary_t s = {
      .stdout_text = "hello\n", .stderr_text = "", .exit_code = 0, .duration_ms = 42};
  char *t = srv_format_result(&s);
  assert_string_equal(t, "--- stdout ---\nhello\n\n--- exit_code: 0 ---\n--- duration_ms: 42 ---");
  free(t);
  srv_exec_summary_t e = {
      .stdout_text = "", .stderr_text = "error message\n", .exit_code = 1, .duration_ms = 5};
  t = srv_format_result(&e);
  assert_string_equal(
      t, "--- stderr ---\nerror message\n\n--- exit_code: 1 ---\n--- duration_ms: 5 ---");
  free(t);
  srv_exec_summary_t to = {.exit_code = -9, .duration_ms = 2000, .timed_out = true};
  t = srv_format_result(&to);
  assert_string_equal(t,
                      "--- exit_code: -9 ---\n--- duration_ms: 2000 ---\n--- timed_out: true ---");
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
  char *argv[] = {"x",
                  "--python-version",
                  "3.14",
                  "--sandbox-backend",
                  "docker",
                  "--max-timeout",
                  "600",
                  "--default-timeout=60",
                  "--max-output-bytes",
                  "200000",
                  "--no-warm-cache",
                  "--memory-limit",
                  "512M",
                  NULL};
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

/* --help prints each default from the table the config is made from: every "(X)" it shows
 * for a flag that takes a value is accepted by that flag, and a few are what the config
 * holds. */
static void test_config_help_defaults(void **state) {
  /* The defaults themselves, not what the environment makes of them (test.sh turns the
   * cache warming off for every server it starts). */
  cleanup_free char *warm =
      getenv("MCP_PY_SANDBOX_WARM_CACHE") ? xstrdup(getenv("MCP_PY_SANDBOX_WARM_CACHE")) : NULL;
  unsetenv("MCP_PY_SANDBOX_WARM_CACHE");
  FILE *out = tmpfile();
  assert_non_null(out);
  fflush(stdout);
  int saved = dup(STDOUT_FILENO);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(out), STDOUT_FILENO) >= 0);
  srv_config_t c;
  srv_config_defaults(&c);
  cm_error_t err = CM_ERROR_INIT;
  char *help_argv[] = {"x", "--help", NULL};
  int rc = srv_config_parse(&c, 2, help_argv, &err);
  fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  assert_int_equal(rc, 1);
  rewind(out);
  char line[1024];
  size_t checked = 0;
  bool saw_timeout = false, saw_cache = false, saw_warm = false, saw_log = false;
  while (fgets(line, sizeof line, out)) {
    line[strcspn(line, "\n")] = '\0';
    char flag[128], meta[128];
    if (sscanf(line, " --%127s %127s", flag, meta) != 2 || meta[0] == '\0') continue;
    size_t n = strlen(line);
    char *open = strrchr(line, '(');
    if (n == 0 || line[n - 1] != ')' || !open) continue;
    cleanup_free char *def = xstrndup(open + 1, (size_t)(line + n - 1 - (open + 1)));
    if (!strcmp(flag, "warm-cache")) saw_warm = !strcmp(def, "the default");
    if (strchr(def, ' ')) continue; /* a flag without a value, or a note */
    if (!strcmp(flag, "max-timeout")) saw_timeout = !strcmp(def, "300") && c.max_timeout == 300;
    if (!strcmp(flag, "max-cache-bytes"))
      saw_cache = !strcmp(def, "10G") && c.max_cache_bytes == 10ull << 30;
    if (!strcmp(flag, "log-level")) saw_log = !strcmp(def, "info") && c.log_level == CM_LOG_INFO;
    srv_config_t d;
    srv_config_defaults(&d);
    cleanup_free char *arg = xasprintf("--%s=%s", flag, def);
    char *argv[] = {"x", arg, NULL};
    if (srv_config_parse(&d, 2, argv, &err) != 0) fail_msg("%s: %s", arg, cm_error_message(&err));
    srv_config_release(&d);
    checked++;
  }
  fclose(out);
  assert_true(checked > 50);
  assert_true(saw_timeout);
  assert_true(saw_cache);
  assert_true(saw_warm && c.warm_cache);
  assert_true(saw_log);
  srv_config_release(&c);
  if (warm) setenv("MCP_PY_SANDBOX_WARM_CACHE", warm, 1);
}

/* Repeatable flags are string vectors: each value as given (a --find-links path may hold
 * spaces), --python-dir values split at ':'; a rule or URL with a space is still refused. */
static void test_config_lists(void **state) {
  srv_config_t c;
  srv_config_defaults(&c);
  cm_error_t err = CM_ERROR_INIT;
  char *argv[] = {"x",
                  "--find-links",
                  "/tmp/wheel house",
                  "--find-links=/srv/w",
                  "--python-dir",
                  "/a:/b",
                  "--python-dir",
                  "/c",
                  "--network-allow",
                  "example.com",
                  "--network-allow",
                  "*.example.org:443",
                  "--extra-index-url",
                  "http://127.0.0.1:1/simple",
                  NULL};
  assert_int_equal(srv_config_parse(&c, 14, argv, &err), 0);
  assert_int_equal(cm_strv_len(c.find_links), 2);
  assert_string_equal(c.find_links[0], "/tmp/wheel house");
  assert_string_equal(c.find_links[1], "/srv/w");
  assert_int_equal(cm_strv_len(c.python_dirs), 3);
  assert_string_equal(c.python_dirs[0], "/a");
  assert_string_equal(c.python_dirs[1], "/b");
  assert_string_equal(c.python_dirs[2], "/c");
  assert_int_equal(cm_strv_len(c.network_allow), 2);
  assert_string_equal(c.network_allow[1], "*.example.org:443");
  assert_int_equal(cm_strv_len(c.extra_index_urls), 1);
  assert_int_equal(srv_config_validate(&c, &err), 0);
  char *bad[] = {"x", "--network-allow", "a b", NULL};
  assert_int_equal(srv_config_parse(&c, 3, bad, &err), -1);
  assert_non_null(strstr(cm_error_message(&err), "no spaces"));
  cm_error_release(&err);
  char *empty[] = {"x", "--find-links", "", NULL};
  assert_int_equal(srv_config_parse(&c, 3, empty, &err), -1);
  cm_error_release(&err);
  srv_config_release(&c);
}

/* ---------------------------------------------------------------- async errors */

/* What an async completion handed over: its error's kind and message, copied. */
typedef struct {
  bool called;
  cm_error_kind_t kind;
  char *message;
} async_answer_t;

static void async_record(async_answer_t *a, const cm_error_t *error) {
  a->called = true;
  a->kind = error ? error->kind : CM_ERR_NONE;
  a->message = error ? xstrdup(cm_error_message(error)) : NULL;
}

static void on_env_answer(void *data, env_handle_t *env, const cm_error_t *error) {
  assert_null(env);
  async_record(data, error);
}

static void on_py_answer(void *data, py_interp_t *def, const cm_error_t *error) {
  assert_null(def);
  async_record(data, error);
}

static void run_until_called(cm_loop_t *loop, const async_answer_t *a) {
  uint64_t deadline = cm_now_ms() + 120000;
  while (!a->called && cm_now_ms() < deadline) cm_loop_run_once(loop, 100, NULL);
  assert_true(a->called);
}

/* The environment store's answer carries a kind the router can map: --installer uv without
 * uv is CM_ERR_UNAVAILABLE, with the message users have always seen. */
static void test_env_error_kind(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  char tmpl[] = "/tmp/mps-test-envkind-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  cleanup_rmtree char *dir = xstrdup(tmpl);
  cleanup_free char *runs = xasprintf("%s/runs", dir);
  assert_int_equal(mkdir(runs, 0700), 0);
  cm_loop_t *loop = cm_loop_new(&err);
  assert_non_null(loop);
  sbx_backend_t *none = sbx_backend_new("none", &err);
  assert_non_null(none);
  sbx_backend_probe(none);
  env_options_t opts = {.installer = "uv",
                        .uv_path = "/nonexistent/mps-uv",
                        .max_cache_bytes = 1ull << 30,
                        .build_timeout_ms = 60000,
                        .max_build_bytes = 1ull << 30,
                        .max_resolutions = 1};
  env_store_t *s = env_store_new(loop, &opts, dir, runs, none);
  py_interp_t py = {.path = "/usr/bin/python3",
                    .executable = "/usr/bin/python3",
                    .version = "3.11.2",
                    .implementation = "cpython",
                    .prefix = "/usr",
                    .ok = true};
  char *reqs[] = {"attrs", NULL};
  async_answer_t a = {0};
  assert_non_null(env_store_ensure(s, &py, reqs, 1, NULL, NULL, on_env_answer, NULL, &a));
  assert_false(a.called); /* never from inside the call */
  run_until_called(loop, &a);
  assert_int_equal(a.kind, CM_ERR_UNAVAILABLE);
  assert_string_equal(a.message,
                      "The server is configured with --installer uv, but uv was not "
                      "found at '/nonexistent/mps-uv'.");
  free(a.message);
  env_store_free(s);
  sbx_backend_free(none);
  cm_loop_free(loop);
}

/* The registry's readiness carries why there is no default, with a kind: --python naming
 * nothing is CM_ERR_NOT_FOUND. */
static void test_python_error_kind(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  char tmpl[] = "/tmp/mps-test-pykind-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  cleanup_rmtree char *dir = xstrdup(tmpl);
  cm_loop_t *loop = cm_loop_new(&err);
  assert_non_null(loop);
  py_options_t opts = {.python = "/nonexistent/mps-python",
                       .uv_path = "/nonexistent/mps-uv",
                       .download_timeout_ms = 60000};
  py_registry_t *r = py_registry_new(loop, &opts, dir);
  py_registry_start(r);
  async_answer_t a = {0};
  assert_non_null(py_registry_when_ready(r, on_py_answer, &a));
  run_until_called(loop, &a);
  assert_int_equal(a.kind, CM_ERR_NOT_FOUND);
  assert_string_equal(a.message, "no interpreter found at /nonexistent/mps-python (--python)");
  free(a.message);
  /* The choice of a call's interpreter says why it failed with a kind too: what nothing
   * installed matches is CM_ERR_NOT_FOUND (a download may help), a malformed request
   * CM_ERR_INVALID, and no default the default's own kind. */
  cm_error_t why = CM_ERROR_INIT;
  assert_null(py_registry_select(r, "3.99", NULL, &why));
  assert_int_equal(why.kind, CM_ERR_NOT_FOUND);
  assert_non_null(strstr(cm_error_message(&why), "No Python interpreter matches '3.99'"));
  assert_null(py_registry_select(r, NULL, ">=3.99", &why));
  assert_int_equal(why.kind, CM_ERR_NOT_FOUND);
  assert_null(py_registry_select(r, "3.x.y", NULL, &why));
  assert_int_equal(why.kind, CM_ERR_INVALID);
  assert_null(py_registry_select(r, NULL, "not a specifier", &why));
  assert_int_equal(why.kind, CM_ERR_INVALID);
  assert_null(py_registry_select(r, NULL, NULL, &why));
  assert_int_equal(why.kind, CM_ERR_NOT_FOUND);
  cm_error_release(&why);
  py_registry_free(r);
  cm_loop_free(loop);
}

/* ---------------------------------------------------------------- the router */

/* A sink that keeps every message sent to it, parsed, with its flags. */
typedef struct {
  tr_sink_t base;
  json_t *messages; /* array */
  json_t *flags;    /* array of integers, one per message */
} record_sink_t;

static void record_send(tr_sink_t *s, const char *text, size_t len, tr_send_flags_t flags) {
  record_sink_t *r = (record_sink_t *)s;
  json_error_t e;
  json_t *msg = json_loadb(text, len, 0, &e);
  if (!msg) fail_msg("the router sent something that is not JSON: %.*s", (int)len, text);
  json_array_append_new(r->messages, msg);
  json_array_append_new(r->flags, json_integer(flags));
}

static void record_release(tr_sink_t *s) {}

static const tr_sink_ops_t record_ops = {.send = record_send, .release = record_release};

typedef struct {
  cm_loop_t *loop;
  srv_config_t cfg;
  srv_server_t *server;
  record_sink_t sink;
  srv_session_t *session;
  char *state;
} router_fixture_t;

static router_fixture_t rf;

static int router_setup(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  memset(&rf, 0, sizeof rf);
  char tmpl[] = "/tmp/mps-test-router-XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  rf.state = xstrdup(tmpl);
  rf.loop = cm_loop_new(&err);
  srv_config_defaults(&rf.cfg);
  free(rf.cfg.sandbox_backend);
  rf.cfg.sandbox_backend = xstrdup("none");
  free(rf.cfg.cgroup);
  rf.cfg.cgroup = xstrdup("off");
  rf.cfg.state_dir = xstrdup(rf.state);
  rf.cfg.prestart = false;
  rf.cfg.warm_cache = false;
  rf.server = srv_server_new(rf.loop, &rf.cfg, &err);
  if (!rf.server) fail_msg("srv_server_new: %s", cm_error_message(&err));
  rf.sink = (record_sink_t){
      .base = {.ops = &record_ops, .refs = 1}, .messages = json_array(), .flags = json_array()};
  rf.session = srv_session_new(rf.server, &rf.sink.base);
  return 0;
}

static int router_teardown(void **state) {
  srv_session_free(rf.session);
  for (int i = 0; i < 10; i++) cm_loop_run_once(rf.loop, 0, NULL);
  /* Every reference the router took on the sink is given back. */
  assert_int_equal(rf.sink.base.refs, 1);
  srv_server_free(rf.server);
  cm_loop_free(rf.loop);
  srv_config_release(&rf.cfg);
  json_decref(rf.sink.messages);
  json_decref(rf.sink.flags);
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(rf.state, &err);
  cm_error_release(&err);
  free(rf.state);
  return 0;
}

/* Hands text to the router; returns how many messages it sent from inside the call. */
static size_t handle(const char *text) {
  size_t before = json_array_size(rf.sink.messages);
  srv_session_handle(rf.session, text, strlen(text), &rf.sink.base);
  return json_array_size(rf.sink.messages) - before;
}

static json_t *last(void) {
  size_t n = json_array_size(rf.sink.messages);
  assert_true(n > 0);
  return json_array_get(rf.sink.messages, n - 1);
}

static json_int_t error_code(const json_t *msg) {
  return json_integer_value(json_object_get(json_object_get(msg, "error"), "code"));
}

/* Runs the loop until a response with this (integer) id was sent; returns it. */
static json_t *wait_response(json_int_t id) {
  uint64_t until = cm_now_ms() + 60000;
  cm_error_t err = CM_ERROR_INIT;
  while (cm_now_ms() < until) {
    size_t i;
    json_t *m;
    json_array_foreach(rf.sink.messages, i, m) {
      json_t *mid = json_object_get(m, "id");
      if (json_is_integer(mid) && json_integer_value(mid) == id &&
          (json_object_get(m, "result") || json_object_get(m, "error")))
        return m;
    }
    assert_int_equal(cm_loop_run_once(rf.loop, 100, &err), 0);
  }
  fail_msg("no response to %lld", (long long)id);
  return NULL;
}

static size_t count_responses(json_int_t id) {
  size_t i, n = 0;
  json_t *m;
  json_array_foreach(rf.sink.messages, i, m) {
    json_t *mid = json_object_get(m, "id");
    if (json_is_integer(mid) && json_integer_value(mid) == id && !json_object_get(m, "method")) n++;
  }
  return n;
}

static void initialize(const char *version) {
  char text[256];
  snprintf(text, sizeof text,
           "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{"
           "\"protocolVersion\":\"%s\","
           "\"capabilities\":{},\"clientInfo\":{\"name\":\"unit\",\"version\":\"0\"}}}",
           version);
  assert_int_equal(handle(text), 1);
  json_t *res = json_object_get(last(), "result");
  assert_non_null(res);
  assert_string_equal(json_string_value(json_object_get(res, "protocolVersion")), version);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(res, "serverInfo"), "name")), SRV_NAME);
  assert_int_equal(
      json_integer_value(json_array_get(rf.sink.flags, json_array_size(rf.sink.flags) - 1)),
      TR_SEND_RESPONSE);
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}"), 0);
  assert_string_equal(srv_session_protocol(rf.session), version);
}

static void test_router_lifecycle(void **state) {
  /* Before initialize: only ping. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/list\"}"), 1);
  assert_int_equal(error_code(last()), -32600);
  assert_non_null(
      strstr(json_string_value(json_object_get(json_object_get(last(), "error"), "message")),
             "initialize"));
  assert_null(srv_session_protocol(rf.session));
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"}"), 1);
  json_t *want = json_pack("{s:s, s:i, s:{}}", "jsonrpc", "2.0", "id", 6, "result");
  assert_true(json_equal(last(), want));
  json_decref(want);
  initialize("2025-06-18");
  /* A second initialize is refused. */
  assert_int_equal(
      handle(
          "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
          "\"2025-06-18\",\"capabilities\":{}}}"),
      1);
  assert_int_equal(error_code(last()), -32600);
  assert_string_equal(srv_session_protocol(rf.session), "2025-06-18");
}

static void test_router_dispatch(void **state) {
  initialize("2025-11-25");
  /* tools/list answers in the call, with the two tools first. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"tools/list\"}"), 1);
  json_t *tools = json_object_get(json_object_get(last(), "result"), "tools");
  assert_true(json_array_size(tools) >= 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(tools, 0), "name")),
                      "execute_python");
  assert_string_equal(json_string_value(json_object_get(json_array_get(tools, 1), "name")),
                      "check_environment");
  /* Ids come back exactly. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"method\":\"ping\"}"), 1);
  assert_string_equal(json_string_value(json_object_get(last(), "id")), "abc");
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":9007199254740993,\"method\":\"ping\"}"), 1);
  assert_int_equal(json_integer_value(json_object_get(last(), "id")), 9007199254740993LL);
  /* Unknown method, bad params, bad cursor. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"nope/nothing\"}"), 1);
  assert_int_equal(error_code(last()), -32601);
  assert_int_equal(json_integer_value(json_object_get(last(), "id")), 11);
  assert_int_equal(
      handle("{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"tools/call\",\"params\":{\"name\":5}}"),
      1);
  assert_int_equal(error_code(last()), -32602);
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"tools/"
                          "list\",\"params\":{\"cursor\":\"x\"}}"),
                   1);
  assert_int_equal(error_code(last()), -32602);
  /* Notifications and responses from the client: never answered. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/whatever\"}"), 0);
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"method\":\"tools/list\"}"), 0);
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}"), 0);
  assert_int_equal(
      handle("{\"jsonrpc\":\"2.0\",\"id\":98,\"error\":{\"code\":1,\"message\":\"x\"}}"), 0);
  /* Malformed texts: a parse error or an invalid request, with a null id... */
  assert_int_equal(handle("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\""), 1);
  assert_int_equal(error_code(last()), -32700);
  assert_true(json_is_null(json_object_get(last(), "id")));
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}"), 1);
  assert_int_equal(error_code(last()), -32700);
  assert_int_equal(handle("42"), 1);
  assert_int_equal(error_code(last()), -32600);
  /* ...or the request's own id when it could be read. */
  assert_int_equal(handle("{\"jsonrpc\":\"1.0\",\"id\":77,\"method\":\"ping\"}"), 1);
  assert_int_equal(error_code(last()), -32600);
  assert_int_equal(json_integer_value(json_object_get(last(), "id")), 77);
  /* Batches are refused after 2025-03-26. */
  assert_int_equal(handle("[{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"ping\"}]"), 1);
  assert_int_equal(error_code(last()), -32600);
  /* An oversize text. */
  size_t before = json_array_size(rf.sink.messages);
  srv_session_oversize(rf.session, 1u << 30, &rf.sink.base);
  assert_int_equal(json_array_size(rf.sink.messages), before + 1);
  assert_non_null(json_object_get(last(), "error"));
  /* logging/setLevel. */
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"logging/"
                          "setLevel\",\"params\":{\"level\":\"debug\"}}"),
                   1);
  assert_non_null(json_object_get(last(), "result"));
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"logging/"
                          "setLevel\",\"params\":{\"level\":\"warn\"}}"),
                   1);
  assert_int_equal(error_code(last()), -32602);
}

/* A tool call is answered later, from the loop, exactly once; one cancelled while it runs
 * gets no answer at all; a batch of 2025-03-26 comes back as one array with a slot per
 * request. */
static void test_router_calls(void **state) {
  initialize("2025-03-26");
  assert_int_equal(
      handle("{\"jsonrpc\":\"2.0\",\"id\":20,\"method\":\"tools/call\",\"params\":{\"name\":"
             "\"execute_python\",\"arguments\":{\"script\":\"print(6 * 7)\"}}}"),
      0);
  json_t *r = wait_response(20);
  json_t *sc = json_object_get(json_object_get(r, "result"), "structuredContent");
  assert_string_equal(json_string_value(json_object_get(sc, "stdout")), "42\n");
  assert_int_equal(json_integer_value(json_object_get(sc, "exit_code")), 0);
  for (int i = 0; i < 20; i++) cm_loop_run_once(rf.loop, 5, NULL);
  assert_int_equal(count_responses(20), 1);

  /* Cancelled while it runs: no response. */
  assert_int_equal(
      handle(
          "{\"jsonrpc\":\"2.0\",\"id\":21,\"method\":\"tools/call\",\"params\":{\"name\":"
          "\"execute_python\",\"arguments\":{\"script\":\"import time\\nprint('up', flush=True)\\n"
          "time.sleep(60)\"},\"_meta\":{\"progressToken\":\"t21\"}}}"),
      0);
  /* Wait for its output as progress: then it runs. */
  uint64_t until = cm_now_ms() + 60000;
  bool running = false;
  while (!running && cm_now_ms() < until) {
    size_t i;
    json_t *m;
    json_array_foreach(rf.sink.messages, i, m) {
      const char *method = json_string_value(json_object_get(m, "method"));
      json_t *params = json_object_get(m, "params");
      const char *token = json_string_value(json_object_get(params, "progressToken"));
      if (method && strcmp(method, "notifications/progress") == 0 && token &&
          strcmp(token, "t21") == 0)
        running = true;
    }
    cm_loop_run_once(rf.loop, 50, NULL);
  }
  assert_true(running);
  assert_int_equal(srv_server_inflight(rf.server), 1);
  assert_int_equal(handle("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/"
                          "cancelled\",\"params\":{\"requestId\":21}}"),
                   0);
  until = cm_now_ms() + 30000;
  while (srv_server_inflight(rf.server) > 0 && cm_now_ms() < until)
    cm_loop_run_once(rf.loop, 50, NULL);
  assert_int_equal(srv_server_inflight(rf.server), 0);
  for (int i = 0; i < 20; i++) cm_loop_run_once(rf.loop, 5, NULL);
  assert_int_equal(count_responses(21), 0);

  /* A batch: one array, a slot per request, none for the notification. */
  size_t before = json_array_size(rf.sink.messages);
  handle(
      "[{\"jsonrpc\":\"2.0\",\"id\":30,\"method\":\"ping\"},{\"jsonrpc\":\"2.0\",\"method\":\"x\"},"
      "{\"jsonrpc\":\"2.0\",\"id\":31,\"method\":\"tools/"
      "call\",\"params\":{\"name\":\"execute_python\","
      "\"arguments\":{\"script\":\"print(1)\"}}},{\"jsonrpc\":\"2.0\",\"id\":32,\"method\":"
      "\"nope\"}]");
  until = cm_now_ms() + 60000;
  while (json_array_size(rf.sink.messages) == before && cm_now_ms() < until)
    cm_loop_run_once(rf.loop, 50, NULL);
  assert_int_equal(json_array_size(rf.sink.messages), before + 1);
  json_t *batch = last();
  assert_true(json_is_array(batch));
  assert_int_equal(json_array_size(batch), 3);
  size_t i;
  json_t *m;
  int seen = 0;
  json_array_foreach(batch, i, m) {
    json_int_t id = json_integer_value(json_object_get(m, "id"));
    if (id == 30) seen |= 1, assert_non_null(json_object_get(m, "result"));
    if (id == 31) seen |= 2, assert_non_null(json_object_get(m, "result"));
    if (id == 32) seen |= 4, assert_int_equal(error_code(m), -32601);
  }
  assert_int_equal(seen, 7);
  /* A batch of notifications only: nothing. */
  assert_int_equal(handle("[{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}]"), 0);
  assert_int_equal(handle("[]"), 1);
  assert_int_equal(error_code(last()), -32600);
}

/* ---------------------------------------------------------------- tasks */

/* Hands text to another session. */
static size_t handle_on(srv_session_t *ss, const char *text) {
  size_t before = json_array_size(rf.sink.messages);
  srv_session_handle(ss, text, strlen(text), &rf.sink.base);
  return json_array_size(rf.sink.messages) - before;
}

static srv_session_t *session_of(const char *principal) {
  srv_session_t *ss = srv_session_new(rf.server, &rf.sink.base);
  srv_session_set_principal(ss, principal);
  assert_int_equal(handle_on(ss,
                             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{"
                             "\"protocolVersion\":\"2025-11-25\",\"capabilities\":{}}}"),
                   1);
  handle_on(ss, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
  return ss;
}

/* A task-augmented call on ss; returns its (new) task id. */
static char *start_task(srv_session_t *ss, int id, const char *script, int ttl) {
  char text[512];
  snprintf(text, sizeof text,
           "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"tools/call\",\"params\":{\"name\":"
           "\"execute_python\",\"arguments\":{\"script\":\"%s\"},\"task\":{\"ttl\":%d}}}",
           id, script, ttl);
  assert_int_equal(handle_on(ss, text), 1);
  json_t *task = json_object_get(json_object_get(last(), "result"), "task");
  assert_non_null(task);
  assert_int_equal(json_integer_value(json_object_get(last(), "id")), id);
  assert_string_equal(json_string_value(json_object_get(task, "status")), "working");
  const char *tid = json_string_value(json_object_get(task, "taskId"));
  assert_int_equal(strlen(tid), 32);
  assert_int_equal(strspn(tid, "0123456789abcdef"), 32);
  return xstrdup(tid);
}

static json_t *task_rpc(srv_session_t *ss, int id, const char *method, const char *tid) {
  char text[256];
  snprintf(text, sizeof text,
           "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"%s\",\"params\":{\"taskId\":\"%s\"}}", id,
           method, tid);
  handle_on(ss, text);
  return wait_response(id);
}

static const char *task_status(srv_session_t *ss, int id, const char *tid) {
  json_t *r = task_rpc(ss, id, "tasks/get", tid);
  return json_string_value(json_object_get(json_object_get(r, "result"), "status"));
}

static void test_router_tasks(void **state) {
  rf.cfg.max_tasks_per_principal = 2;
  initialize("2025-11-25");
  srv_session_t *mine = session_of(SRV_PRINCIPAL_STDIO);
  srv_session_t *other = session_of("someone-else");
  cleanup_free char *a = start_task(rf.session, 40, "print(6 * 7)", 60000);
  /* Runs detached: tasks/result waits for it, then answers with its result. */
  json_t *res = json_object_get(task_rpc(rf.session, 41, "tasks/result", a), "result");
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(res, "structuredContent"), "stdout")),
      "42\n");
  assert_string_equal(
      json_string_value(json_object_get(
          json_object_get(json_object_get(res, "_meta"), "io.modelcontextprotocol/related-task"),
          "taskId")),
      a);
  assert_int_equal(count_responses(40), 1); /* the CreateTaskResult only */
  /* Another session of the principal sees it; another principal does not, anywhere. */
  assert_string_equal(task_status(mine, 42, a), "completed");
  assert_int_equal(error_code(task_rpc(other, 43, "tasks/get", a)), -32602);
  assert_int_equal(error_code(task_rpc(other, 44, "tasks/result", a)), -32602);
  assert_int_equal(error_code(task_rpc(other, 45, "tasks/cancel", a)), -32602);
  handle_on(other, "{\"jsonrpc\":\"2.0\",\"id\":46,\"method\":\"tasks/list\"}");
  assert_int_equal(json_array_size(json_object_get(json_object_get(last(), "result"), "tasks")), 0);
  /* A terminal task is not cancelled. */
  assert_int_equal(error_code(task_rpc(rf.session, 47, "tasks/cancel", a)), -32602);
  /* The per-principal cap counts kept tasks; the other principal has its own. */
  cleanup_free char *b = start_task(mine, 48, "import time\\ntime.sleep(60)", 1000);
  assert_int_equal(
      handle("{\"jsonrpc\":\"2.0\",\"id\":49,\"method\":\"tools/call\",\"params\":{"
             "\"name\":\"execute_python\",\"arguments\":{\"script\":\"1\"},\"task\":{}}}"),
      1);
  assert_int_equal(error_code(last()), -32602);
  cleanup_free char *c = start_task(other, 50, "print(1)", 60000);
  /* Its session ends: b goes on (it belongs to the principal) until its TTL ends it. */
  srv_session_free(mine);
  assert_string_equal(task_status(rf.session, 51, b), "working");
  uint64_t until = cm_now_ms() + 20000;
  while (srv_server_inflight(rf.server) > 0 && cm_now_ms() < until)
    cm_loop_run_once(rf.loop, 50, NULL);
  assert_int_equal(srv_server_inflight(rf.server), 0);
  assert_int_equal(error_code(task_rpc(rf.session, 52, "tasks/get", b)), -32602);
  /* A's TTL is a minute: it is still there, and so is c. */
  assert_string_equal(task_status(rf.session, 53, a), "completed");
  assert_string_equal(task_status(other, 54, c), "completed");
  srv_session_free(other);
  rf.cfg.max_tasks_per_principal = 32;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_depth_scan),
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_marker),
      cmocka_unit_test(test_truncate),
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_config_lists),
      cmocka_unit_test(test_config_help_defaults),
      cmocka_unit_test(test_env_error_kind),
      cmocka_unit_test(test_python_error_kind),
      cmocka_unit_test_setup_teardown(test_router_lifecycle, router_setup, router_teardown),
      cmocka_unit_test_setup_teardown(test_router_dispatch, router_setup, router_teardown),
      cmocka_unit_test_setup_teardown(test_router_calls, router_setup, router_teardown),
      cmocka_unit_test_setup_teardown(test_router_tasks, router_setup, router_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
