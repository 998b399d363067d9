/* Unit tests for the HTTP transport's pure parts: Accept / Content-Type / Host / Origin
 * parsing, event ids, SSE framing, bearer tokens and the JSON-RPC envelope; and, last, a
 * server that starts (loading libmicrohttpd on demand) and answers an initialize. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>

#include "transport/transport-internal.h"

static void accept_is(const char *v, bool json, bool sse) {
  bool j = !json, s = !sse;
  tr_http_parse_accept(v, strlen(v), &j, &s);
  if (j != json || s != sse) fail_msg("Accept '%s': json %d sse %d", v, j, s);
}

static void test_accept(void **state) {
  accept_is("application/json, text/event-stream", true, true);
  accept_is("text/event-stream", false, true);
  accept_is("application/json", true, false);
  accept_is("*/*", true, true);
  accept_is("application/*", true, false);
  accept_is("text/*;q=0.5", false, true);
  accept_is("TEXT/Event-Stream ; charset=utf-8", false, true);
  accept_is("text/html", false, false);
  accept_is("", false, false);
  accept_is("application/json;q=0, text/event-stream", false, true);
  accept_is("application/json;q=0.0", false, false);
  accept_is("application/json; q=0.1", true, false);
  accept_is(",,, ,application/json,", true, false);
  accept_is("application/jsonx", false, false);
}

static void test_media_type(void **state) {
  const char *yes[] = {"application/json", "Application/JSON", " application/json ; charset=utf-8",
                       "application/json;"};
  const char *no[] = {"text/plain", "application/json-seq", "", "application/jso", "json"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(yes); i++)
    assert_true(tr_http_media_type_is(yes[i], strlen(yes[i]), "application/json"));
  for (size_t i = 0; i < CM_ARRAY_SIZE(no); i++)
    assert_false(tr_http_media_type_is(no[i], strlen(no[i]), "application/json"));
}

static void host_is(const char *v, const char *want) {
  char out[TR_HTTP_HOST_MAX];
  int rc = tr_http_host_name(v, strlen(v), out, sizeof out);
  if (!want) {
    if (rc == 0) fail_msg("Host '%s' should be refused, got '%s'", v, out);
    return;
  }
  if (rc != 0) fail_msg("Host '%s' refused", v);
  assert_string_equal(out, want);
}

static void test_host(void **state) {
  host_is("localhost", "localhost");
  host_is("LocalHost:8765", "localhost");
  host_is("127.0.0.1:80", "127.0.0.1");
  host_is("[::1]:8765", "::1");
  host_is("[::1]", "::1");
  host_is("example.com.", "example.com");
  host_is("a_b.example", "a_b.example");
  host_is("", NULL);
  host_is(":80", NULL);
  host_is("evil.com:80:90", NULL);
  host_is("::1", NULL); /* IPv6 must be bracketed */
  host_is("[::1", NULL);
  host_is("[::1]x", NULL);
  host_is("[::1]:", "::1");
  host_is("exa mple.com", NULL);
  host_is("example.com:8o", NULL);
  host_is("example.com:1234567", NULL);
  host_is("user@host", NULL);
  char big[400];
  memset(big, 'a', sizeof big);
  char out[TR_HTTP_HOST_MAX];
  assert_int_equal(tr_http_host_name(big, sizeof big, out, sizeof out), -1);
  assert_int_equal(tr_http_host_name("abc", 3, out, 3), -1);
  assert_int_equal(tr_http_host_name("abc", 3, out, 4), 0);
}

static void origin_is(const char *v, const char *want) {
  char out[TR_HTTP_HOST_MAX];
  int rc = tr_http_origin_host(v, strlen(v), out, sizeof out);
  if (!want) {
    if (rc == 0) fail_msg("Origin '%s' should be refused, got '%s'", v, out);
    return;
  }
  if (rc != 0) fail_msg("Origin '%s' refused", v);
  assert_string_equal(out, want);
}

static void test_origin(void **state) {
  origin_is("http://localhost:6274", "localhost");
  origin_is("https://App.Example", "app.example");
  origin_is("http://[::1]:3000", "::1");
  origin_is("http://127.0.0.1/", "127.0.0.1");
  origin_is("chrome-extension://abcdef", "abcdef");
  origin_is("null", NULL);
  origin_is("http://", NULL);
  origin_is("localhost:80", NULL);
  origin_is("http://user@localhost", NULL);
  origin_is("http://localhost/path", NULL);
  origin_is("://localhost", NULL);
}

static void test_loopback(void **state) {
  assert_true(tr_http_loopback_name("localhost"));
  assert_true(tr_http_loopback_name("127.0.0.1"));
  assert_true(tr_http_loopback_name("127.1.2.3"));
  assert_true(tr_http_loopback_name("::1"));
  assert_true(tr_http_loopback_name("::ffff:127.0.0.1"));
  assert_false(tr_http_loopback_name("128.0.0.1"));
  assert_false(tr_http_loopback_name("localhost.evil.com"));
  assert_false(tr_http_loopback_name("0.0.0.0"));
  assert_false(tr_http_loopback_name("::"));
  assert_false(tr_http_loopback_name("evil.com"));
}

static void test_event_id(void **state) {
  uint64_t a, b;
  assert_int_equal(tr_http_parse_event_id("3-17", 4, &a, &b), 0);
  assert_int_equal(a, 3);
  assert_int_equal(b, 17);
  assert_int_equal(tr_http_parse_event_id(" 12-0 ", 6, &a, &b), 0);
  assert_int_equal(a, 12);
  assert_int_equal(b, 0);
  const char *bad[] = {"",     "-",    "1-",   "-1",   "1--1",
                       "a-1",  "1-1a", "+1-1", "1 -1", "99999999999999999999-1",
                       "1-2-3"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (tr_http_parse_event_id(bad[i], strlen(bad[i]), &a, &b) == 0)
      fail_msg("accepted '%s'", bad[i]);
  assert_int_equal(tr_http_parse_event_id("1844674407370955161-1", 21, &a, &b), 0);
}

static void sse_is(const char *event, bool with_id, const char *data, const char *want) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  tr_http_sse_event(&b, event, with_id, 4, 2, data, strlen(data));
  assert_string_equal(b.data, want);
  cm_buf_release(&b);
}

static void test_sse_framing(void **state) {
  sse_is("message", true, "{\"a\":1}", "id: 4-2\nevent: message\ndata: {\"a\":1}\n\n");
  sse_is(NULL, false, "x", "data: x\n\n");
  sse_is(NULL, false, "", "data: \n\n");
  sse_is(NULL, false, "a\nb", "data: a\ndata: b\n\n");
  sse_is(NULL, false, "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n");
  sse_is(NULL, false, "a\n", "data: a\ndata: \n\n");
  sse_is("endpoint", false, "/messages?sessionId=x",
         "event: endpoint\ndata: /messages?sessionId=x\n\n");
}

static void test_bearer(void **state) {
  const char *t;
  size_t n;
  assert_int_equal(tr_http_bearer_token("Bearer abc", 10, &t, &n), 0);
  assert_int_equal(n, 3);
  assert_memory_equal(t, "abc", 3);
  assert_int_equal(tr_http_bearer_token("  bearer \t abc.DEF-_~+/=  ", 26, &t, &n), 0);
  assert_int_equal(n, 13);
  const char *bad[] = {"",          "Bearer",     "Bearer ",  "Basic abc",
                       "Bearerabc", "Bearer a b", "Token abc"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (tr_http_bearer_token(bad[i], strlen(bad[i]), &t, &n) == 0)
      fail_msg("accepted '%s'", bad[i]);
}

static void test_tokens(void **state) {
  const char *file =
      "# comment\n\nalice: tok-a\r\n   tok-b   \n  # indented comment\nbob:tok:with:colons\n";
  tr_http_token_t *tokens = NULL;
  size_t n = 0;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(tr_http_parse_tokens(file, strlen(file), &tokens, &n, &err), 0);
  assert_int_equal(n, 3);
  assert_string_equal(tokens[0].name, "alice");
  assert_string_equal(tokens[1].name, "line 4");
  assert_string_equal(tokens[2].name, "bob");
  assert_ptr_equal(tr_http_token_match(tokens, n, "tok-a", 5), &tokens[0]);
  assert_ptr_equal(tr_http_token_match(tokens, n, "tok-b", 5), &tokens[1]);
  assert_ptr_equal(tr_http_token_match(tokens, n, "tok:with:colons", 15), &tokens[2]);
  assert_null(tr_http_token_match(tokens, n, "tok-c", 5));
  assert_null(tr_http_token_match(tokens, n, "alice: tok-a", 12));
  assert_null(tr_http_token_match(tokens, n, "", 0));
  tr_http_tokens_free(tokens, n);

  const char *bad[] = {
      "",          "# only a comment\n",     "alice:\n",     "tok with space\n", "a: b c\n",
      "tok\x01\n", "tok-a\nline 1: tok-b\n", "line 9:tok\n", "stdio: tok-s\n"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++) {
    tokens = NULL;
    if (tr_http_parse_tokens(bad[i], strlen(bad[i]), &tokens, &n, &err) == 0)
      fail_msg("accepted token file '%s'", bad[i]);
    assert_null(tokens);
    cm_error_release(&err);
  }
}

static void test_session_id(void **state) {
  assert_true(tr_http_session_id_valid("abc", 3));
  assert_true(tr_http_session_id_valid("!~", 2));
  assert_false(tr_http_session_id_valid("", 0));
  assert_false(tr_http_session_id_valid("a b", 3));
  assert_false(tr_http_session_id_valid("a\x7f", 2));
  char big[129];
  memset(big, 'a', sizeof big);
  assert_true(tr_http_session_id_valid(big, 128));
  assert_false(tr_http_session_id_valid(big, 129));
}

/* The envelope without its id (released here: these tests look at the rest). */
static tr_http_envelope_t classify(const char *text) {
  tr_http_envelope_t env;
  tr_http_classify(text, strlen(text), &env);
  tr_http_envelope_release(&env);
  return env;
}

/* The id classify gives back, as compact JSON, or "" for none. */
static char *classify_id(const char *text) {
  tr_http_envelope_t env;
  tr_http_classify(text, strlen(text), &env);
  char *out = env.id ? json_dumps(env.id, JSON_COMPACT | JSON_ENCODE_ANY) : xstrdup("");
  tr_http_envelope_release(&env);
  assert_null(env.id);
  return out;
}

static void id_is(const char *text, const char *want) {
  cleanup_free char *got = classify_id(text);
  if (strcmp(got, want) != 0) fail_msg("'%s': id '%s', want '%s'", text, got, want);
}

/* Every error answer to a request whose id could be read carries it (issue 16.5). */
static void test_classify_id(void **state) {
  id_is("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", "1");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":\"a-b\",\"method\":\"initialize\",\"params\":{}}", "\"a-b\"");
  /* invalid, but the id is readable */
  id_is("{\"jsonrpc\":\"1.0\",\"id\":7,\"method\":\"a\"}", "7");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":9}", "8");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"a\",\"params\":1}", "9");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":10}", "10");
  /* none: no id, an invalid id, a notification, a response, a batch, not JSON */
  id_is("{\"jsonrpc\":\"2.0\",\"method\":\"n\"}", "");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"a\"}", "");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"a\"}", "");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"a\"}", "");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", "");
  id_is("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}]", "");
  id_is("{\"jsonrpc\":\"2.0\",\"id\":1,", "");
  id_is("5", "");
}

static void origin_parts_are(const char *v, const char *scheme, const char *host, unsigned port) {
  char s[32], h[TR_HTTP_HOST_MAX];
  unsigned p = 12345;
  int rc = tr_http_origin_parse(v, strlen(v), s, h, sizeof h, &p);
  if (!scheme) {
    if (rc == 0) fail_msg("'%s' parsed as %s %s %u", v, s, h, p);
    return;
  }
  if (rc != 0) fail_msg("'%s' refused", v);
  assert_string_equal(s, scheme);
  assert_string_equal(h, host);
  assert_int_equal(p, port);
}

static void test_origin_parse(void **state) {
  origin_parts_are("http://localhost:6274", "http", "localhost", 6274);
  origin_parts_are("HTTPS://App.Example", "https", "app.example", 443);
  origin_parts_are("http://127.0.0.1/", "http", "127.0.0.1", 80);
  origin_parts_are("http://[::1]:3000", "http", "::1", 3000);
  origin_parts_are("http://[::1]", "http", "::1", 80);
  origin_parts_are("chrome-extension://abcdef", "chrome-extension", "abcdef", 0);
  origin_parts_are("http://localhost:", "http", "localhost", 80);
  origin_parts_are("null", NULL, NULL, 0);
  origin_parts_are("http://localhost:0", NULL, NULL, 0);
  origin_parts_are("http://localhost:65536", NULL, NULL, 0);
  origin_parts_are("http://localhost:99999", NULL, NULL, 0);
  origin_parts_are("http://a@localhost", NULL, NULL, 0);
  origin_parts_are("abcdefghijklmnopqrstuvwxyzabcdefg://x", NULL, NULL, 0);
}

static void attachment_is(const char *rest, const char *want) {
  char out[160];
  tr_http_attachment_name(rest, strlen(rest), out, sizeof out);
  if (strcmp(out, want) != 0) fail_msg("'%s' -> '%s', want '%s'", rest, out, want);
}

static void test_attachment_name(void **state) {
  attachment_is("0123/outputs/report.html", "report.html");
  attachment_is("0123/outputs/a%20b%22c.svg", "a_b_c.svg");
  attachment_is("0123/outputs/%2e%2e%2fx", "_x");
  attachment_is("0123/outputs/..evil", "evil");
  attachment_is("0123/outputs/", "download");
  attachment_is("", "download");
  attachment_is("0123/outputs/%e2%82%ac.txt", "___.txt");
  attachment_is("0123/outputs/bad%zz", "bad_zz");
  attachment_is("0123/outputs/trail%4", "trail_4");
  attachment_is("x\r\nSet-Cookie: a=b", "x__Set-Cookie__a_b");
  char long_name[400] = "r/";
  memset(long_name + 2, 'a', 300);
  long_name[302] = '\0';
  char out[160];
  tr_http_attachment_name(long_name, strlen(long_name), out, sizeof out);
  assert_int_equal(strlen(out), 128);
  char tiny[4];
  tr_http_attachment_name("r/abcdef", 8, tiny, sizeof tiny);
  assert_string_equal(tiny, "abc");
}

static void test_classify(void **state) {
  tr_http_envelope_t e = classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
  assert_int_equal(e.status, TR_HTTP_BODY_OK);
  assert_int_equal(e.requests, 1);
  assert_false(e.batch || e.initialize);
  e = classify("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"initialize\",\"params\":{}}");
  assert_true(e.initialize);
  e = classify("{\"jsonrpc\":\"2.0\",\"method\":\"initialize\"}"); /* a notification */
  assert_false(e.initialize);
  assert_int_equal(e.notifications, 1);
  e = classify("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
  assert_int_equal(e.notifications, 1);
  assert_int_equal(e.requests, 0);
  e = classify("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}");
  assert_int_equal(e.responses, 1);
  e = classify("{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":1,\"message\":\"x\"}}");
  assert_int_equal(e.responses, 1);
  e = classify(
      "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"},{\"jsonrpc\":\"2.0\",\"method\":\"b\"},"
      "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":1},7]");
  assert_int_equal(e.status, TR_HTTP_BODY_OK);
  assert_true(e.batch);
  assert_int_equal(e.requests, 2); /* the 7 is answered by the router */
  assert_int_equal(e.notifications, 1);
  assert_int_equal(e.responses, 1);

  const char *parse_errors[] = {"", "{", "{\"a\":1,\"a\":2}", "{} {}", "\xff", "nul"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(parse_errors); i++) {
    e = classify(parse_errors[i]);
    if (e.status != TR_HTTP_BODY_PARSE_ERROR) fail_msg("'%s' parsed", parse_errors[i]);
    assert_non_null(strstr(e.why, "Parse error"));
  }
  const char *invalid[] = {"1",
                           "\"x\"",
                           "[]",
                           "{}",
                           "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"a\"}",
                           "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"a\"}",
                           "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"a\"}",
                           "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":7}",
                           "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"params\":1}",
                           "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1,\"error\":{}}",
                           "{\"jsonrpc\":\"2.0\",\"result\":1}"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(invalid); i++) {
    e = classify(invalid[i]);
    if (e.status != TR_HTTP_BODY_INVALID) fail_msg("'%s': status %d", invalid[i], (int)e.status);
    assert_non_null(strstr(e.why, "Invalid Request"));
  }
  /* no terminator is relied on */
  char buf[] = "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}GARBAGE";
  tr_http_envelope_t env;
  tr_http_classify(buf, strlen(buf) - 7, &env);
  assert_int_equal(env.status, TR_HTTP_BODY_OK);
  tr_http_envelope_release(&env);
}

/* SEP-2243 header values: literal, trimmed, base64 (strict), visible ASCII only, bounded. */
static void header_value_is(const char *v, const char *want) {
  char out[64];
  size_t n = 0;
  int rc = tr_http_mcp_header_value(v, strlen(v), out, sizeof out, &n);
  if (!want) {
    if (rc == 0) fail_msg("'%s' was accepted as '%s'", v, out);
    return;
  }
  if (rc != 0) fail_msg("'%s' was refused", v);
  assert_int_equal(n, strlen(want));
  assert_string_equal(out, want);
}

static void test_mcp_header_value(void **state) {
  header_value_is("tools/call", "tools/call");
  header_value_is("  tools/call\t ", "tools/call");
  header_value_is("a b", "a b");
  header_value_is("", "");
  header_value_is("=?base64?SGVsbG8=?=", "Hello");
  header_value_is("=?base64?SGk=?=", "Hi");
  header_value_is("=?base64?SGVs?=", "Hel");
  header_value_is("=?base64?5pel5pys?=", "\xe6\x97\xa5\xe6\x9c\xac"); /* UTF-8 */
  header_value_is(" =?base64?SGVsbG8=?= ", "Hello");
  /* Not exactly the form: a literal. */
  header_value_is("=?base64?SGVsbG8=", "=?base64?SGVsbG8=");
  header_value_is("SGVsbG8=?=", "SGVsbG8=?=");
  header_value_is("=?BASE64?SGVsbG8=?=", "=?BASE64?SGVsbG8=?=");
  /* Bad base64: padding, alphabet, length, non-zero pad bits, empty. */
  header_value_is("=?base64?SGVsbG8?=", NULL);
  header_value_is("=?base64?SGVs!!!bG8=?=", NULL);
  header_value_is("=?base64?SGVsbG8==?=", NULL);
  header_value_is("=?base64?S=Vs?=", NULL);
  header_value_is("=?base64?SGVsbG9=?=", NULL);
  header_value_is("=?base64?SGk?=", NULL);
  header_value_is("=?base64?\?=", NULL);
  header_value_is("=?base64?====?=", NULL);
  /* Decoded bytes that are not UTF-8 text, or a NUL. */
  header_value_is("=?base64?/w==?=", NULL);
  header_value_is("=?base64?AA==?=", NULL);
  /* Outside visible ASCII, space and tab. */
  header_value_is("caf\xc3\xa9", NULL);
  header_value_is("a\rb", NULL);
  header_value_is("a\x7f", NULL);
  /* Bounded by the caller's buffer, encoded or not. */
  char small[4];
  size_t n;
  assert_int_equal(tr_http_mcp_header_value("abc", 3, small, sizeof small, &n), 0);
  assert_int_equal(tr_http_mcp_header_value("abcd", 4, small, sizeof small, &n), -1);
  assert_int_equal(tr_http_mcp_header_value("=?base64?SGk=?=", 15, small, sizeof small, &n), 0);
  assert_int_equal(tr_http_mcp_header_value("=?base64?SGVsbA==?=", 19, small, sizeof small, &n),
                   -1);
  assert_int_equal(tr_http_mcp_header_value("a", 1, small, 0, &n), -1);
}

/* ---------------------------------------------------------------- a running server */

static const char t_answer[] =
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":\"2025-06-18\","
    "\"capabilities\":{},\"serverInfo\":{\"name\":\"unit\",\"version\":\"1\"}}}";

static void *t_session_open(void *data, tr_sink_t *standalone, const char *principal) {
  return data;
}

static void t_on_message(void *data, void *session, const char *buf, size_t len, tr_sink_t *reply) {
  tr_sink_send(reply, t_answer, strlen(t_answer), TR_SEND_RESPONSE);
}

static const char *t_session_protocol(void *data, void *session) {
  return "2025-06-18";
}

static void t_session_close(void *data, void *session) {}

/* The stateless revision's claim and version (the era of a POST), and the statuses of its
 * answers (H4). */
static void test_classify_modern(void **state) {
  tr_http_envelope_t env;
  static const char modern[] =
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"_meta\":{"
      "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}";
  tr_http_classify(modern, strlen(modern), &env);
  assert_true(env.modern);
  assert_false(env.discover);
  assert_string_equal(json_string_value(env.meta_version), "2026-07-28");
  tr_http_envelope_release(&env);
  assert_null(env.meta_version);
  /* A claim that is not a string: modern still, and the router says what is wrong. */
  static const char bad[] =
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\",\"params\":{\"_meta\":{"
      "\"io.modelcontextprotocol/protocolVersion\":7}}}";
  tr_http_classify(bad, strlen(bad), &env);
  assert_true(env.modern);
  assert_true(env.discover);
  assert_null(env.meta_version);
  tr_http_envelope_release(&env);
  /* The handshake era: no claim; and batches and notifications are never modern. */
  assert_false(classify("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}").modern);
  assert_false(classify("{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":{\"_meta\":{"
                        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}")
                   .modern);
  assert_false(classify("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"_meta\":{"
                        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}]")
                   .modern);

  static const struct {
    const char *body;
    unsigned status;
  } cases[] = {
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}", 200},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"isError\":true}}", 200},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32602,\"message\":\"m\"}}", 400},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32020,\"message\":\"m\"}}", 400},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32021,\"message\":\"m\"}}", 400},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32022,\"message\":\"m\"}}", 400},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32601,\"message\":\"m\"}}", 404},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32603,\"message\":\"m\"}}", 200},
      {"not json", 200},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++)
    if (tr_http_modern_status(cases[i].body, strlen(cases[i].body)) != cases[i].status)
      fail_msg("%s: not %u", cases[i].body, cases[i].status);
}

/* libmicrohttpd is not linked: it is opened by the first tr_http_new, and the pure parts
 * above ran without it.  Then a real request goes through the daemon and back. */
static void test_server_starts(void **state) {
  static const char soname[] = "libmicrohttpd.so.12";
  void *lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (lib) dlclose(lib);
  assert_null(lib);

  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  assert_non_null(loop);
  static const char *const versions[] = {"2025-06-18", NULL};
  tr_http_options_t opts = {.host = "127.0.0.1", .path = "/mcp", .protocol_versions = versions};
  static const tr_http_callbacks_t cbs = {
      .session_open = t_session_open,
      .on_message = t_on_message,
      .session_protocol = t_session_protocol,
      .session_close = t_session_close,
  };
  int session = 0;
  tr_http_t *h = tr_http_new(loop, &opts, &cbs, &session, &err);
  if (!h) fail_msg("tr_http_new: %s", cm_error_message(&err));
  lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib);
  dlclose(lib);
  assert_int_not_equal(tr_http_port(h), 0);

  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(tr_http_port(h))};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  static const char body[] =
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{"
      "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},"
      "\"clientInfo\":{\"name\":\"unit\",\"version\":\"1\"}}}";
  cleanup_free char *request = xasprintf(
      "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Type: application/json\r\n"
      "Accept: application/json, text/event-stream\r\nContent-Length: %zu\r\n"
      "Connection: close\r\n\r\n%s",
      (unsigned)tr_http_port(h), strlen(body), body);
  assert_int_equal(cm_write_all(fd, request, strlen(request)), 0);
  assert_int_equal(cm_set_nonblock(fd, true), 0);

  /* Bounded: at most 5 s, though it takes a few milliseconds. */
  char reply[4096] = "";
  size_t got = 0;
  for (int i = 0; i < 250 && !strstr(reply, t_answer); i++) {
    assert_int_equal(cm_loop_run_once(loop, 20, &err), 0);
    ssize_t n = read(fd, reply + got, sizeof reply - 1 - got);
    if (n > 0) got += (size_t)n;
    reply[got] = '\0';
  }
  close(fd);
  if (strncmp(reply, "HTTP/1.1 200", 12) != 0) fail_msg("reply: %s", reply);
  assert_non_null(strcasestr(reply, "\r\nMcp-Session-Id: "));
  assert_non_null(strstr(reply, t_answer));

  tr_http_free(h);
  /* Run the deferred work tr_http_free may leave (it frees h then). */
  for (int i = 0; i < 3; i++) cm_loop_run_once(loop, 0, &err);
  cm_loop_free(loop);
  cm_error_release(&err);
}

/* What --tls-san accepts: an IP address or a DNS name (a leading "*." too), nothing that
 * could smuggle another subjectAltName entry (a comma, a colon-typed prefix, a space). */
static void test_tls_name_ok(void **state) {
  (void)state;
  const char *good[] = {"localhost", "mps.example.test", "*.example.test", "10.0.0.1",
                        "::1",       "2001:db8::7",      "host-1.lan",     "A.B"};
  const char *bad[] = {"",           "bad_name!", "a,IP:1.2.3.4", "DNS:x",       "a b",
                       "*.",         ".leading",  "-leading",     "*.*.example", "x\n",
                       "1.2.3.4/24", "email@host"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(good); i++) assert_true(tr_tls_name_ok(good[i]));
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++) assert_false(tr_tls_name_ok(bad[i]));
  char long_name[300];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  assert_false(tr_tls_name_ok(long_name));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accept),
      cmocka_unit_test(test_media_type),
      cmocka_unit_test(test_host),
      cmocka_unit_test(test_origin),
      cmocka_unit_test(test_loopback),
      cmocka_unit_test(test_event_id),
      cmocka_unit_test(test_sse_framing),
      cmocka_unit_test(test_bearer),
      cmocka_unit_test(test_tokens),
      cmocka_unit_test(test_session_id),
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_classify_id),
      cmocka_unit_test(test_origin_parse),
      cmocka_unit_test(test_attachment_name),
      cmocka_unit_test(test_server_starts),
      cmocka_unit_test(test_classify_modern),
      cmocka_unit_test(test_mcp_header_value),
      cmocka_unit_test(test_tls_name_ok),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
