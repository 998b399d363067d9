/* Unit tests for the router's extension points (server/router.c): an extension's
 * capabilities, methods and tools, srv_request_fail's error mapping, and server -> client
 * requests (fresh ids, routing of the client's response, refusal without the client's
 * capability, failure on cancellation and when the session goes).  Over in-memory sinks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/stat.h>

#include "server/server.h"

/* ---------------------------------------------------------------- an in-memory sink */

typedef struct mem_sink {
  tr_sink_t sink; /* first: the sink pointer is the mem_sink pointer */
  json_t *sent;   /* every message sent, parsed */
} mem_sink_t;

static void mem_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags) {
  mem_sink_t *m = (mem_sink_t *)s;
  json_t *msg = json_loadb(json, len, 0, NULL);
  assert_non_null(msg);
  json_array_append_new(m->sent, msg);
}

static void mem_release(tr_sink_t *s) {}

static const tr_sink_ops_t mem_ops = {.send = mem_send, .release = mem_release};

static void mem_init(mem_sink_t *m) {
  memset(m, 0, sizeof *m);
  m->sink.ops = &mem_ops;
  m->sink.refs = 1;
  m->sent = json_array();
}

static void mem_release_all(mem_sink_t *m) {
  assert_int_equal(m->sink.refs, 1); /* nothing still holds it */
  json_decref(m->sent);
}

static size_t mem_count(mem_sink_t *m) {
  return json_array_size(m->sent);
}
static json_t *mem_at(mem_sink_t *m, size_t i) {
  return json_array_get(m->sent, i);
}
static json_t *mem_last(mem_sink_t *m) {
  assert_true(mem_count(m) > 0);
  return mem_at(m, mem_count(m) - 1);
}

/* ---------------------------------------------------------------- fixture */

typedef struct world {
  char dir[64];
  cm_loop_t *loop;
  srv_config_t cfg;
  srv_server_t *server;
} world_t;

static world_t w;

static void send_text(srv_session_t *ss, mem_sink_t *reply, const char *text) {
  srv_session_handle(ss, text, strlen(text), &reply->sink);
}

/* The "result" of the last message on m, checking its id. */
static json_t *last_result(mem_sink_t *m, json_int_t id) {
  json_t *msg = mem_last(m);
  assert_int_equal(json_integer_value(json_object_get(msg, "id")), id);
  json_t *result = json_object_get(msg, "result");
  if (!result) fail_msg("no result: %s", json_dumps(msg, JSON_COMPACT));
  return result;
}

static int last_error_code(mem_sink_t *m, json_int_t id) {
  json_t *msg = mem_last(m);
  assert_int_equal(json_integer_value(json_object_get(msg, "id")), id);
  json_t *error = json_object_get(msg, "error");
  if (!error) fail_msg("no error: %s", json_dumps(msg, JSON_COMPACT));
  return (int)json_integer_value(json_object_get(error, "code"));
}

/* A session of its own, initialized with the given client capabilities (JSON text). */
static srv_session_t *open_session(mem_sink_t *standalone, const char *client_caps) {
  srv_session_t *ss = srv_session_new(w.server, &standalone->sink);
  mem_sink_t reply;
  mem_init(&reply);
  cleanup_free char *init = xasprintf(
      "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
      "\"2025-11-25\",\"capabilities\":%s,\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}",
      client_caps);
  send_text(ss, &reply, init);
  last_result(&reply, 0);
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
  assert_int_equal(mem_count(&reply), 1);
  mem_release_all(&reply);
  return ss;
}

/* ---------------------------------------------------------------- a fake extension */

typedef struct fake_state {
  srv_request_t *held; /* fake/later: answered when the test says */
  int answers;         /* client_cb calls */
  char *last_error;    /* the message of the last error client_cb got */
} fake_state_t;

static fake_state_t fake;

static json_t *fake_capabilities(void *data) {
  return json_pack("{s:{s:b}, s:{s:b, s:b}}", "prompts", "listChanged", 0, "resources", "subscribe",
                   1, "listChanged", 0);
}

static void client_cb(void *data, json_t *result, json_t *error) {
  srv_request_t *r = data;
  fake.answers++;
  free(fake.last_error);
  fake.last_error = NULL;
  if (error) {
    fake.last_error = xstrdup(json_string_value(json_object_get(error, "message")));
    srv_request_finish(r, srv_tool_error_result("client said: %s", fake.last_error));
    return;
  }
  json_t *text = json_object_get(json_object_get(result, "content"), "text");
  srv_request_finish(r, srv_tool_text_result(json_string_value(text), false));
}

static void fake_tool_call(srv_request_t *r, json_t *args) {
  cm_error_t err = CM_ERROR_INIT;
  json_t *params = json_pack("{s:[], s:i}", "messages", "maxTokens", 10);
  if (srv_request_call_client(r, "sampling/createMessage", params, client_cb, r, &err) < 0) {
    free(fake.last_error);
    fake.last_error = xstrdup(cm_error_message(&err));
    srv_request_finish(r, srv_tool_error_result("%s", cm_error_message(&err)));
  }
  cm_error_release(&err);
}

static json_t *fake_tool_describe(srv_server_t *s) {
  return json_pack("{s:s, s:s, s:{s:s}}", "name", "fake_tool", "description", "asks the client",
                   "inputSchema", "type", "object");
}

static const srv_tool_t fake_tools[] = {{"fake_tool", NULL, fake_tool_describe, fake_tool_call}};

static bool fake_handle(void *data, srv_request_t *r, const char *method, json_t *params) {
  cm_error_t err = CM_ERROR_INIT;
  if (strcmp(method, "fake/echo") == 0) {
    srv_request_finish(r, json_pack("{s:O?}", "echo", params));
  } else if (strcmp(method, "fake/later") == 0) {
    fake.held = r;
  } else if (strcmp(method, "fake/invalid") == 0) {
    cm_error_set(&err, 0, CM_ERR_INVALID, "bad thing");
    srv_request_fail(r, &err);
  } else if (strcmp(method, "resources/read") == 0) {
    /* Ahead of the router's own resources/read. */
    cm_error_set(&err, 0, CM_ERR_NOT_FOUND, "nothing here");
    srv_request_fail(r, &err);
  } else {
    return false;
  }
  cm_error_release(&err);
  return true;
}

static const srv_extension_t fake_extension = {
    .tools = fake_tools,
    .n_tools = 1,
    .capabilities = fake_capabilities,
    .handle = fake_handle,
};

/* ---------------------------------------------------------------- tests */

static json_t *initialize_capabilities(void) {
  mem_sink_t standalone, reply;
  mem_init(&standalone);
  mem_init(&reply);
  srv_session_t *ss = srv_session_new(w.server, &standalone.sink);
  send_text(
      ss, &reply,
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
      "\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}");
  json_t *caps = json_incref(json_object_get(last_result(&reply, 1), "capabilities"));
  srv_session_free(ss);
  mem_release_all(&reply);
  mem_release_all(&standalone);
  return caps;
}

static void test_capabilities_merged(void **state) {
  srv_server_set_extension(w.server, NULL);
  json_t *plain = initialize_capabilities();
  srv_server_set_extension(w.server, &fake_extension);
  json_t *merged = initialize_capabilities();
  json_t *want = json_deep_copy(plain);
  json_t *extra = fake_capabilities(NULL);
  json_object_update(want, extra);
  json_decref(extra);
  if (!json_equal(want, merged))
    fail_msg("merged %s, want %s", json_dumps(merged, JSON_COMPACT),
             json_dumps(want, JSON_COMPACT));
  /* The built-in keys survive; a key the extension gives replaces the built-in one. */
  assert_non_null(json_object_get(merged, "tools"));
  assert_non_null(json_object_get(merged, "logging"));
  assert_true(json_is_true(json_object_get(json_object_get(merged, "resources"), "subscribe")));
  assert_null(json_object_get(plain, "prompts"));
  json_decref(want);
  json_decref(plain);
  json_decref(merged);
}

static void test_extension_methods(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, reply;
  mem_init(&standalone);
  mem_init(&reply);
  srv_session_t *ss = open_session(&standalone, "{}");

  send_text(ss, &reply,
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"fake/echo\",\"params\":{\"a\":1}}");
  assert_int_equal(
      json_integer_value(json_object_get(json_object_get(last_result(&reply, 2), "echo"), "a")), 1);

  /* Not the extension's: the router's own answer. */
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"fake/unknown\"}");
  assert_int_equal(last_error_code(&reply, 3), -32601);
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}");
  assert_int_equal(json_object_size(last_result(&reply, 4)), 0);

  /* Its tools come after the built-in ones. */
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/list\"}");
  json_t *tools = json_object_get(last_result(&reply, 5), "tools");
  size_t builtin;
  srv_tools(&builtin);
  assert_int_equal(json_array_size(tools), builtin + 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(tools, builtin), "name")),
                      "fake_tool");

  /* Error mapping: not found under resources/ -> -32002 with the uri; invalid -> -32602. */
  send_text(ss, &reply,
            "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"resources/"
            "read\",\"params\":{\"uri\":\"test://x\"}}");
  assert_int_equal(last_error_code(&reply, 6), -32002);
  json_t *data = json_object_get(json_object_get(mem_last(&reply), "error"), "data");
  assert_string_equal(json_string_value(json_object_get(data, "uri")), "test://x");
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"fake/invalid\"}");
  assert_int_equal(last_error_code(&reply, 7), -32602);

  /* Answered later; a request with the same id is refused meanwhile. */
  size_t before = mem_count(&reply);
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"fake/later\"}");
  assert_int_equal(mem_count(&reply), before);
  assert_non_null(fake.held);
  assert_int_equal(srv_server_inflight(w.server), 1);
  send_text(ss, &reply, "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/list\"}");
  assert_int_equal(last_error_code(&reply, 8), -32600);
  srv_request_finish(steal_pointer(&fake.held), json_pack("{s:b}", "late", 1));
  assert_true(json_is_true(json_object_get(last_result(&reply, 8), "late")));
  assert_int_equal(srv_server_inflight(w.server), 0);

  assert_int_equal(mem_count(&standalone), 0);
  srv_session_free(ss);
  mem_release_all(&reply);
  mem_release_all(&standalone);
}

static void test_client_call_routed(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, call, answer;
  mem_init(&standalone);
  mem_init(&call);
  mem_init(&answer);
  srv_session_t *ss = open_session(&standalone, "{\"sampling\":{}}");
  fake.answers = 0;

  for (int round = 1; round <= 2; round++) {
    send_text(ss, &call,
              "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"tools/"
              "call\",\"params\":{\"name\":\"fake_tool\"}}");
    /* The request went out on the call's own sink, with a fresh id. */
    json_t *req = mem_last(&call);
    assert_string_equal(json_string_value(json_object_get(req, "method")),
                        "sampling/createMessage");
    cleanup_free char *want_id = xasprintf("mps-%d", round);
    assert_string_equal(json_string_value(json_object_get(req, "id")), want_id);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(req, "params"), "maxTokens")), 10);
    assert_int_equal(srv_server_inflight(w.server), 1);

    /* The client's response arrives as a separate text: routed to the callback. */
    cleanup_free char *resp = xasprintf(
        "{\"jsonrpc\":\"2.0\",\"id\":\"%s\",\"result\":{\"role\":\"assistant\",\"content\":"
        "{\"type\":\"text\",\"text\":\"answer %d\"},\"model\":\"m\"}}",
        want_id, round);
    send_text(ss, &answer, resp);
    assert_int_equal(mem_count(&answer), 0);
    assert_int_equal(fake.answers, round);
    json_t *result = last_result(&call, 10);
    cleanup_free char *want_text = xasprintf("answer %d", round);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(result, "content"), 0), "text")),
                        want_text);
    assert_int_equal(srv_server_inflight(w.server), 0);
  }

  /* A response to nothing of ours is ignored. */
  size_t before = mem_count(&call);
  send_text(ss, &answer, "{\"jsonrpc\":\"2.0\",\"id\":\"mps-1\",\"result\":{}}");
  send_text(ss, &answer,
            "{\"jsonrpc\":\"2.0\",\"id\":77,\"error\":{\"code\":1,\"message\":\"x\"}}");
  assert_int_equal(mem_count(&answer), 0);
  assert_int_equal(mem_count(&call), before);
  assert_int_equal(fake.answers, 2);

  /* An error response reaches the callback as an error. */
  send_text(ss, &call,
            "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"tools/"
            "call\",\"params\":{\"name\":\"fake_tool\"}}");
  send_text(ss, &answer,
            "{\"jsonrpc\":\"2.0\",\"id\":\"mps-3\",\"error\":{\"code\":-1,\"message\":\"user "
            "rejected\"}}");
  assert_string_equal(fake.last_error, "user rejected");
  assert_true(json_is_true(json_object_get(last_result(&call, 11), "isError")));

  assert_int_equal(mem_count(&standalone), 0);
  srv_session_free(ss);
  mem_release_all(&call);
  mem_release_all(&answer);
  mem_release_all(&standalone);
}

static void test_client_call_needs_capability(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, call;
  mem_init(&standalone);
  mem_init(&call);
  srv_session_t *ss = open_session(&standalone, "{\"elicitation\":{}}");
  send_text(ss, &call,
            "{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"tools/"
            "call\",\"params\":{\"name\":\"fake_tool\"}}");
  /* Nothing sent to the client: only the tool's error result. */
  assert_int_equal(mem_count(&call), 1);
  assert_true(json_is_true(json_object_get(last_result(&call, 12), "isError")));
  assert_non_null(strstr(fake.last_error, "sampling"));
  srv_session_free(ss);

  /* Nor before notifications/initialized. */
  ss = srv_session_new(w.server, &standalone.sink);
  send_text(
      ss, &call,
      "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
      "\"2025-11-25\",\"capabilities\":{\"sampling\":{}},\"clientInfo\":{\"name\":\"t\","
      "\"version\":\"1\"}}}");
  send_text(ss, &call,
            "{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"tools/call\",\"params\":{\"name\":"
            "\"fake_tool\"}}");
  assert_int_equal(mem_count(&call), 3);
  assert_true(json_is_true(json_object_get(last_result(&call, 16), "isError")));
  assert_non_null(strstr(fake.last_error, "initialized"));
  srv_session_free(ss);
  mem_release_all(&call);
  mem_release_all(&standalone);
}

static void test_client_call_cancelled(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, call, other;
  mem_init(&standalone);
  mem_init(&call);
  mem_init(&other);
  srv_session_t *ss = open_session(&standalone, "{\"sampling\":{}}");
  fake.answers = 0;
  send_text(ss, &call,
            "{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"tools/"
            "call\",\"params\":{\"name\":\"fake_tool\"}}");
  assert_int_equal(mem_count(&call), 1);
  const char *id = json_string_value(json_object_get(mem_last(&call), "id"));
  cleanup_free char *call_id = xstrdup(id);

  send_text(
      ss, &other,
      "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":13}}");
  /* The pending call failed into the callback, the client was told, the request is gone
   * and its (dropped) result never sent. */
  assert_int_equal(fake.answers, 1);
  assert_non_null(strstr(fake.last_error, "cancelled"));
  assert_int_equal(srv_server_inflight(w.server), 0);
  assert_int_equal(mem_count(&call), 2);
  json_t *n = mem_last(&call);
  assert_string_equal(json_string_value(json_object_get(n, "method")), "notifications/cancelled");
  assert_string_equal(json_string_value(json_object_get(json_object_get(n, "params"), "requestId")),
                      call_id);
  assert_int_equal(mem_count(&other), 0);

  /* The client's late answer is ignored. */
  cleanup_free char *late = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":\"%s\",\"result\":{}}", call_id);
  send_text(ss, &other, late);
  assert_int_equal(fake.answers, 1);
  assert_int_equal(mem_count(&call), 2);

  srv_session_free(ss);
  mem_release_all(&call);
  mem_release_all(&other);
  mem_release_all(&standalone);
}

static void test_client_call_session_gone(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, call;
  mem_init(&standalone);
  mem_init(&call);
  srv_session_t *ss = open_session(&standalone, "{\"sampling\":{}}");
  fake.answers = 0;
  send_text(ss, &call,
            "{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"tools/"
            "call\",\"params\":{\"name\":\"fake_tool\"}}");
  assert_int_equal(srv_server_inflight(w.server), 1);
  srv_session_free(ss);
  assert_int_equal(fake.answers, 1);
  assert_int_equal(srv_server_inflight(w.server), 0);
  mem_release_all(&call);
  mem_release_all(&standalone);
}

/* An unanswered call when the request finishes on its own: abandoned, the client told. */
static void finish_now(void *data, json_t *result, json_t *error) {
  fail_msg("callback of an abandoned call");
}

static bool abandon_handle(void *data, srv_request_t *r, const char *method, json_t *params) {
  if (strcmp(method, "fake/abandon") != 0) return false;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(srv_request_call_client(r, "ping", NULL, finish_now, NULL, &err), 0);
  srv_request_finish(r, json_object());
  return true;
}

static void test_client_call_abandoned(void **state) {
  static const srv_extension_t ext = {.handle = abandon_handle};
  srv_server_set_extension(w.server, &ext);
  mem_sink_t standalone, call;
  mem_init(&standalone);
  mem_init(&call);
  srv_session_t *ss = open_session(&standalone, "{}");
  send_text(ss, &call, "{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"fake/abandon\"}");
  /* ping (no capability needed), notifications/cancelled, the result. */
  assert_int_equal(mem_count(&call), 3);
  assert_string_equal(json_string_value(json_object_get(mem_at(&call, 0), "method")), "ping");
  assert_string_equal(json_string_value(json_object_get(mem_at(&call, 1), "method")),
                      "notifications/cancelled");
  last_result(&call, 15);
  send_text(ss, &call, "{\"jsonrpc\":\"2.0\",\"id\":\"mps-1\",\"result\":{}}");
  assert_int_equal(mem_count(&call), 3);
  srv_session_free(ss);
  mem_release_all(&call);
  mem_release_all(&standalone);
}

/* In a batch (2025-03-26), a method the extension declines leaves no trace of it. */
static void test_extension_batch(void **state) {
  srv_server_set_extension(w.server, &fake_extension);
  mem_sink_t standalone, reply;
  mem_init(&standalone);
  mem_init(&reply);
  srv_session_t *ss = srv_session_new(w.server, &standalone.sink);
  send_text(
      ss, &reply,
      "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
      "\"2025-03-26\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}");
  send_text(ss, &reply,
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fake/echo\"},"
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"fake/unknown\"},"
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}]");
  assert_int_equal(mem_count(&reply), 2);
  json_t *batch = mem_last(&reply);
  assert_true(json_is_array(batch));
  assert_int_equal(json_array_size(batch), 3);
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(json_integer_value(json_object_get(json_array_get(batch, i), "id")), i + 1);
  assert_non_null(json_object_get(json_array_get(batch, 0), "result"));
  assert_int_equal(json_integer_value(
                       json_object_get(json_object_get(json_array_get(batch, 1), "error"), "code")),
                   -32601);
  srv_session_free(ss);
  mem_release_all(&reply);
  mem_release_all(&standalone);
}

/* ---------------------------------------------------------------- main */

static int setup(void **state) {
  /* No interpreter discovery: nothing on PATH, no pyenv, no uv. */
  strcpy(w.dir, "/tmp/mps-test-extension.XXXXXX");
  if (!mkdtemp(w.dir)) return -1;
  cleanup_free char *empty = xasprintf("%s/empty", w.dir);
  mkdir(empty, 0700);
  setenv("PATH", empty, 1);
  setenv("HOME", w.dir, 1);
  setenv("PYENV_ROOT", empty, 1);
  setenv("UV_PYTHON_INSTALL_DIR", empty, 1);
  setenv("XDG_DATA_HOME", empty, 1);
  cm_log_set_level(CM_LOG_OFF); /* "no working Python interpreter" is expected here */
  cm_error_t err = CM_ERROR_INIT;
  w.loop = cm_loop_new(&err);
  srv_config_defaults(&w.cfg);
  free(w.cfg.sandbox_backend);
  w.cfg.sandbox_backend = xstrdup("none");
  w.cfg.warm_cache = false;
  w.cfg.state_dir = xasprintf("%s/state", w.dir);
  w.server = srv_server_new(w.loop, &w.cfg, &err);
  if (!w.server) {
    fprintf(stderr, "srv_server_new: %s\n", cm_error_message(&err));
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  srv_server_free(w.server);
  cm_loop_free(w.loop);
  srv_config_release(&w.cfg);
  free(fake.last_error);
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(w.dir, &err);
  cm_error_release(&err);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capabilities_merged),
      cmocka_unit_test(test_extension_methods),
      cmocka_unit_test(test_extension_batch),
      cmocka_unit_test(test_client_call_routed),
      cmocka_unit_test(test_client_call_needs_capability),
      cmocka_unit_test(test_client_call_cancelled),
      cmocka_unit_test(test_client_call_session_gone),
      cmocka_unit_test(test_client_call_abandoned),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
