/* mps-conformance-fixture: the product's router and Streamable HTTP transport, plus the
 * tools, resources, prompts and completions that the MCP conformance suite
 * (@modelcontextprotocol/conformance 0.1.16 and 0.2.0-alpha.12, server mode) calls by fixed
 * names.  A test target only (tests/conformance/fixture.cmake): the product binary never
 * carries these.
 *
 * Same flags as the product (srv_config_parse); the transport is always HTTP.  The fixtures
 * follow the suite's reference server (examples/servers/typescript/everything-server.ts)
 * in names and texts, and for protocol 2026-07-28 the scenarios' own descriptions (see the
 * section of that name); the code is ours, built on the router's extension points
 * (srv_server_set_extension, srv_request_call_client, srv_request_close_stream). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/signalfd.h>

#include "server/server.h"

#define FIXTURE_NAME "mps-conformance-fixture"

/* A 1x1 PNG and a minimal WAV, as in the reference server. */
static const char test_png[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg"
    "==";
static const char test_wav[] = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

/* Steps of the tools that report as they go (logging, progress). */
#define STEP_MS 50
/* test_reconnection: how long the call runs after it closed the client's stream. */
#define RECONNECT_DELAY_MS 100

/* ---------------------------------------------------------------- helpers */

/* Fixed JSON texts of this file: a parse failure is a bug. */
static json_t *json_text(const char *text) {
  json_error_t jerr;
  json_t *v = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
  if (!v) {
    fprintf(stderr, "%s: bad built-in JSON: %s\n", FIXTURE_NAME, jerr.text);
    abort();
  }
  return v;
}

static json_t *tool_object(const char *name, const char *description, const char *input_schema) {
  return json_pack("{s:s, s:s, s:o}", "name", name, "description", description, "inputSchema",
                   json_text(input_schema));
}

static json_t *text_block(const char *text) {
  return json_pack("{s:s, s:s}", "type", "text", "text", text);
}

static json_t *image_block(void) {
  return json_pack("{s:s, s:s, s:s}", "type", "image", "data", test_png, "mimeType", "image/png");
}

static json_t *content_result(json_t *blocks) {
  return json_pack("{s:o}", "content", blocks);
}

static json_t *text_result(const char *text) {
  return content_result(json_pack("[o]", text_block(text)));
}

/* A string argument, or NULL after finishing r with an isError result. */
static const char *required_string(srv_request_t *r, json_t *args, const char *name) {
  json_t *v = json_object_get(args, name);
  if (json_is_string(v)) return json_string_value(v);
  srv_request_finish(r, srv_tool_error_result("argument \"%s\" (a string) is required", name));
  return NULL;
}

/* ---------------------------------------------------------------- content tools */

static json_t *simple_text_describe(srv_server_t *s) {
  return tool_object("test_simple_text", "Tests simple text content response",
                     "{\"type\":\"object\"}");
}
static void simple_text_call(srv_request_t *r, json_t *args) {
  srv_request_finish(r, text_result("This is a simple text response for testing."));
}

static json_t *image_describe(srv_server_t *s) {
  return tool_object("test_image_content", "Tests image content response", "{\"type\":\"object\"}");
}
static void image_call(srv_request_t *r, json_t *args) {
  srv_request_finish(r, content_result(json_pack("[o]", image_block())));
}

static json_t *audio_describe(srv_server_t *s) {
  return tool_object("test_audio_content", "Tests audio content response", "{\"type\":\"object\"}");
}
static void audio_call(srv_request_t *r, json_t *args) {
  srv_request_finish(r, content_result(json_pack("[{s:s, s:s, s:s}]", "type", "audio", "data",
                                                 test_wav, "mimeType", "audio/wav")));
}

static json_t *embedded_describe(srv_server_t *s) {
  return tool_object("test_embedded_resource", "Tests embedded resource content response",
                     "{\"type\":\"object\"}");
}
static void embedded_call(srv_request_t *r, json_t *args) {
  srv_request_finish(
      r, content_result(json_pack("[{s:s, s:{s:s, s:s, s:s}}]", "type", "resource", "resource",
                                  "uri", "test://embedded-resource", "mimeType", "text/plain",
                                  "text", "This is an embedded resource content.")));
}

static json_t *mixed_describe(srv_server_t *s) {
  return tool_object("test_multiple_content_types",
                     "Tests response with multiple content types (text, image, resource)",
                     "{\"type\":\"object\"}");
}
static void mixed_call(srv_request_t *r, json_t *args) {
  srv_request_finish(
      r, content_result(json_pack(
             "[o, o, {s:s, s:{s:s, s:s, s:s}}]", text_block("Multiple content types test:"),
             image_block(), "type", "resource", "resource", "uri", "test://mixed-content-resource",
             "mimeType", "application/json", "text", "{\"test\":\"data\",\"value\":123}")));
}

static json_t *error_describe(srv_server_t *s) {
  return tool_object("test_error_handling", "Tests error response handling",
                     "{\"type\":\"object\"}");
}
static void error_call(srv_request_t *r, json_t *args) {
  srv_request_finish(
      r, srv_tool_text_result("This tool intentionally returns an error for testing", true));
}

static json_t *schema_2020_12_describe(srv_server_t *s) {
  return tool_object(
      "json_schema_2020_12_tool",
      "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
      /* 2020-12 keywords a server must pass through untouched (SEP-1613, SEP-2106):
       * $schema, $defs with $anchor, $ref, composition (allOf with a nested anyOf),
       * conditionals (if/then/else), additionalProperties. */
      "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\","
      "\"$defs\":{\"address\":{\"$anchor\":\"address\",\"type\":\"object\",\"properties\":{"
      "\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"}}}},"
      "\"properties\":{\"name\":{\"type\":\"string\"},\"address\":{\"$ref\":\"#/$defs/"
      "address\"},\"kind\":{\"type\":\"string\"}},"
      "\"allOf\":[{\"anyOf\":[{\"required\":[\"name\"]},{\"required\":[\"address\"]}]}],"
      "\"if\":{\"properties\":{\"kind\":{\"const\":\"business\"}}},"
      "\"then\":{\"required\":[\"address\"]},\"else\":{\"required\":[]},"
      "\"additionalProperties\":false}");
}
static void schema_2020_12_call(srv_request_t *r, json_t *args) {
  cleanup_free char *dump = json_dumps(args, JSON_COMPACT);
  cleanup_free char *text =
      xasprintf("JSON Schema 2020-12 tool called with: %s", dump ? dump : "{}");
  srv_request_finish(r, text_result(text));
}

/* ---------------------------------------------------------------- timed tools */

/* A tool that does its work in steps STEP_MS apart (or once, after a delay), then
 * answers; cancellation stops the timer and drops the answer. */
typedef struct timed_call timed_call_t;
struct timed_call {
  srv_request_t *r;
  cm_timer_t *timer;
  unsigned step;
  /* Runs step `step`; returns the result (new ref) when the call is done, else NULL: then
   * the call goes on, STEP_MS later, unless run set fail_kind (the call then ends with
   * that JSON-RPC error, fail_message). */
  json_t *(*run)(timed_call_t *c);
  cm_error_kind_t fail_kind;
  const char *fail_message;
  double seconds; /* the tool's own argument, for the tools that wait once */
  char *text;     /* likewise */
};

static void timed_free(timed_call_t *c) {
  free(c->text);
  free(c);
}

static void timed_cancel(void *data) {
  timed_call_t *c = data;
  cm_timer_cancel(c->timer);
  srv_request_t *r = c->r;
  timed_free(c);
  srv_request_finish(r, json_object());
}

static void timed_fire(cm_loop_t *loop, cm_timer_t *t, void *data) {
  timed_call_t *c = data;
  c->timer = NULL;
  json_t *result = c->run(c);
  c->step++;
  srv_request_t *r = c->r;
  if (!result && c->fail_kind != CM_ERR_NONE) {
    cm_error_t err = CM_ERROR_INIT;
    cm_error_set(&err, 0, c->fail_kind, "%s", c->fail_message);
    timed_free(c);
    srv_request_fail(r, &err);
    cm_error_release(&err);
    return;
  }
  if (!result) {
    c->timer = cm_loop_timer(loop, STEP_MS, timed_fire, c);
    return;
  }
  timed_free(c);
  srv_request_finish(r, result);
}

/* Starts a timed call; returns it for the caller to set its arguments before the first
 * step (which runs at once when first_ms is 0). */
static timed_call_t *timed_prepare(srv_request_t *r, json_t *(*run)(timed_call_t *c)) {
  timed_call_t *c = xcalloc(1, sizeof *c);
  c->r = r;
  c->run = run;
  srv_request_on_cancel(r, timed_cancel, c);
  return c;
}

static void timed_go(timed_call_t *c, uint64_t first_ms) {
  cm_loop_t *loop = srv_server_loop(srv_request_server(c->r));
  if (first_ms) {
    c->timer = cm_loop_timer(loop, first_ms, timed_fire, c);
  } else {
    timed_fire(loop, NULL, c);
  }
}

static void timed_start(srv_request_t *r, json_t *(*run)(timed_call_t *c), uint64_t first_ms) {
  timed_go(timed_prepare(r, run), first_ms);
}

static json_t *logging_describe(srv_server_t *s) {
  return tool_object("test_tool_with_logging",
                     "Tests tool that emits log messages during execution",
                     "{\"type\":\"object\"}");
}
static json_t *logging_step(timed_call_t *c) {
  static const char *const messages[] = {"Tool execution started", "Tool processing data",
                                         "Tool execution completed"};
  srv_request_log(c->r, "info", NULL, json_string(messages[c->step]));
  if (c->step + 1 < CM_ARRAY_SIZE(messages)) return NULL;
  return text_result("Tool with logging executed successfully");
}
static void logging_call(srv_request_t *r, json_t *args) {
  timed_start(r, logging_step, 0);
}

static json_t *progress_describe(srv_server_t *s) {
  return tool_object("test_tool_with_progress", "Tests tool that reports progress notifications",
                     "{\"type\":\"object\"}");
}
static json_t *progress_step(timed_call_t *c) {
  /* The router sends only growing progress, starting above 0. */
  static const double steps[] = {1, 50, 100};
  cleanup_free char *msg = xasprintf("Completed step %.0f of 100", steps[c->step]);
  srv_request_progress(c->r, steps[c->step], msg, strlen(msg), NULL);
  if (c->step + 1 < CM_ARRAY_SIZE(steps)) return NULL;
  return text_result("Tool with progress executed successfully");
}
static void progress_call(srv_request_t *r, json_t *args) {
  timed_start(r, progress_step, 0);
}

static json_t *reconnection_describe(srv_server_t *s) {
  return tool_object(
      "test_reconnection",
      "Tests SSE stream disconnection and client reconnection (SEP-1699). The server "
      "closes the stream mid-call and sends the result after the client reconnects.",
      "{\"type\":\"object\"}");
}
static json_t *reconnection_step(timed_call_t *c) {
  return text_result(
      "Reconnection test completed successfully. If you received this, the client "
      "properly reconnected after stream closure.");
}
static void reconnection_call(srv_request_t *r, json_t *args) {
  /* The client's POST stream ends after its priming event; the result waits for GET +
   * Last-Event-ID. */
  srv_request_close_stream(r);
  timed_start(r, reconnection_step, RECONNECT_DELAY_MS);
}

/* ---------------------------------------------------------------- tools that ask the client */

typedef struct client_call {
  srv_request_t *r;
  const char *what; /* "Sampling", "Elicitation" */
  char *(*format)(json_t *result);
} client_call_t;

static void client_answered(void *data, json_t *result, json_t *error) {
  client_call_t *c = data;
  srv_request_t *r = c->r;
  json_t *out;
  if (error) {
    const char *msg = json_string_value(json_object_get(error, "message"));
    out = srv_tool_error_result("%s not supported or error: %s", c->what,
                                msg ? msg : "unknown error");
  } else {
    cleanup_free char *text = c->format(result);
    out = text_result(text);
  }
  free(c);
  srv_request_finish(r, out);
}

static void ask_client(srv_request_t *r, const char *what, const char *method, json_t *params,
                       char *(*format)(json_t *result)) {
  client_call_t *c = xcalloc(1, sizeof *c);
  c->r = r;
  c->what = what;
  c->format = format;
  cm_error_t err = CM_ERROR_INIT;
  if (srv_request_call_client(r, method, params, client_answered, c, &err) < 0) {
    free(c);
    srv_request_finish(
        r, srv_tool_error_result("%s not supported or error: %s", what, cm_error_message(&err)));
  }
  cm_error_release(&err);
}

static char *format_sampling(json_t *result) {
  json_t *content = json_object_get(result, "content");
  const char *text = json_string_value(json_object_get(content, "text"));
  return xasprintf("LLM response: %s", text ? text : "No response");
}

static char *format_elicitation(const char *prefix, json_t *result) {
  const char *action = json_string_value(json_object_get(result, "action"));
  json_t *content = json_object_get(result, "content");
  cleanup_free char *dump = content ? json_dumps(content, JSON_COMPACT) : NULL;
  return xasprintf("%s: action=%s, content=%s", prefix, action ? action : "unknown",
                   dump ? dump : "{}");
}
static char *format_user_response(json_t *result) {
  return format_elicitation("User response", result);
}
static char *format_elicitation_done(json_t *result) {
  return format_elicitation("Elicitation completed", result);
}

static json_t *sampling_describe(srv_server_t *s) {
  return tool_object(
      "test_sampling", "Tests server-initiated sampling (LLM completion request)",
      "{\"type\":\"object\",\"properties\":{\"prompt\":{\"type\":\"string\","
      "\"description\":\"The prompt to send to the LLM\"}},\"required\":[\"prompt\"]}");
}
static void sampling_call(srv_request_t *r, json_t *args) {
  const char *prompt = required_string(r, args, "prompt");
  if (!prompt) return;
  json_t *params = json_pack("{s:[{s:s, s:{s:s, s:s}}], s:i}", "messages", "role", "user",
                             "content", "type", "text", "text", prompt, "maxTokens", 100);
  ask_client(r, "Sampling", "sampling/createMessage", params, format_sampling);
}

static json_t *elicitation_describe(srv_server_t *s) {
  return tool_object(
      "test_elicitation", "Tests server-initiated elicitation (user input request)",
      "{\"type\":\"object\",\"properties\":{\"message\":{\"type\":\"string\","
      "\"description\":\"The message to show the user\"}},\"required\":[\"message\"]}");
}
static void elicitation_call(srv_request_t *r, json_t *args) {
  const char *message = required_string(r, args, "message");
  if (!message) return;
  json_t *params = json_pack(
      "{s:s, s:o}", "message", message, "requestedSchema",
      json_text("{\"type\":\"object\",\"properties\":{"
                "\"username\":{\"type\":\"string\",\"description\":\"User's response\"},"
                "\"email\":{\"type\":\"string\",\"description\":\"User's email address\"}},"
                "\"required\":[\"username\",\"email\"]}"));
  ask_client(r, "Elicitation", "elicitation/create", params, format_user_response);
}

static json_t *defaults_describe(srv_server_t *s) {
  return tool_object("test_elicitation_sep1034_defaults",
                     "Tests elicitation with default values per SEP-1034", "{\"type\":\"object\"}");
}
static void defaults_call(srv_request_t *r, json_t *args) {
  json_t *params = json_pack(
      "{s:s, s:o}", "message", "Please review and update the form fields with defaults",
      "requestedSchema",
      json_text(
          "{\"type\":\"object\",\"properties\":{"
          "\"name\":{\"type\":\"string\",\"description\":\"User name\",\"default\":\"John Doe\"},"
          "\"age\":{\"type\":\"integer\",\"description\":\"User age\",\"default\":30},"
          "\"score\":{\"type\":\"number\",\"description\":\"User score\",\"default\":95.5},"
          "\"status\":{\"type\":\"string\",\"description\":\"User status\","
          "\"enum\":[\"active\",\"inactive\",\"pending\"],\"default\":\"active\"},"
          "\"verified\":{\"type\":\"boolean\",\"description\":\"Verification "
          "status\",\"default\":true}},"
          "\"required\":[]}"));
  ask_client(r, "Elicitation", "elicitation/create", params, format_elicitation_done);
}

static json_t *enums_describe(srv_server_t *s) {
  return tool_object("test_elicitation_sep1330_enums",
                     "Tests elicitation with enum schema improvements per SEP-1330",
                     "{\"type\":\"object\"}");
}
static void enums_call(srv_request_t *r, json_t *args) {
  json_t *params = json_pack(
      "{s:s, s:o}", "message", "Please select options from the enum fields", "requestedSchema",
      json_text(
          "{\"type\":\"object\",\"properties\":{"
          "\"untitledSingle\":{\"type\":\"string\",\"description\":\"Select one option\","
          "\"enum\":[\"option1\",\"option2\",\"option3\"]},"
          "\"titledSingle\":{\"type\":\"string\",\"description\":\"Select one option with titles\","
          "\"oneOf\":[{\"const\":\"value1\",\"title\":\"First Option\"},"
          "{\"const\":\"value2\",\"title\":\"Second Option\"},"
          "{\"const\":\"value3\",\"title\":\"Third Option\"}]},"
          "\"legacyEnum\":{\"type\":\"string\",\"description\":\"Select one option (legacy)\","
          "\"enum\":[\"opt1\",\"opt2\",\"opt3\"],"
          "\"enumNames\":[\"Option One\",\"Option Two\",\"Option Three\"]},"
          "\"untitledMulti\":{\"type\":\"array\",\"description\":\"Select multiple options\","
          "\"minItems\":1,\"maxItems\":3,"
          "\"items\":{\"type\":\"string\",\"enum\":[\"option1\",\"option2\",\"option3\"]}},"
          "\"titledMulti\":{\"type\":\"array\",\"description\":\"Select multiple options with "
          "titles\","
          "\"minItems\":1,\"maxItems\":3,\"items\":{\"anyOf\":["
          "{\"const\":\"value1\",\"title\":\"First Choice\"},"
          "{\"const\":\"value2\",\"title\":\"Second Choice\"},"
          "{\"const\":\"value3\",\"title\":\"Third Choice\"}]}}},"
          "\"required\":[]}"));
  ask_client(r, "Elicitation", "elicitation/create", params, format_elicitation_done);
}

/* ================================================================ protocol 2026-07-28
 *
 * The fixtures of the stateless revision's scenarios (conformance 0.2.0-alpha.12, run by
 * run.sh with --requirements 2026-07-28): multi-round-trip tools and a prompt that answer
 * with input_required results, the diagnostics of server-stateless, a tool with an
 * x-mcp-header parameter, and the tasks extension's tools.  Names, keys and texts follow
 * the scenarios' descriptions (src/scenarios/server/{stateless,input-required-result,
 * http-standard-headers}.ts and the tasks directory, modelcontextprotocol/conformance).
 *
 * What the router does not offer yet is marked ROUTER SUPPORT, with the item of the
 * checklist in docs/protocol-2026.md that provides it; until then these fixtures do what
 * the current API allows (docs/protocol-2026.md lists what each scenario still needs). */

#define META_PROTOCOL_VERSION "io.modelcontextprotocol/protocolVersion"
#define META_CLIENT_CAPABILITIES "io.modelcontextprotocol/clientCapabilities"

/* params._meta, or NULL. */
static json_t *request_meta(json_t *params) {
  json_t *meta = json_object_get(params, "_meta");
  return json_is_object(meta) ? meta : NULL;
}

/* Whether the request claims the per-request envelope (a modern request).  The router has
 * already checked the claim (-32602 when malformed, -32022 for a version it does not
 * serve) before an extension sees the request. */
static bool modern_request(json_t *params) {
  return json_is_string(json_object_get(request_meta(params), META_PROTOCOL_VERSION));
}

/* Whether a modern request declared client capability `cap` (sampling, elicitation, roots). */
static bool client_declared(json_t *params, const char *cap) {
  json_t *caps = json_object_get(request_meta(params), META_CLIENT_CAPABILITIES);
  return json_is_object(json_object_get(caps, cap));
}

/* Completes r with a JSON-RPC error of the spec's own code and data (stolen), such as -32021
 * with data.requiredCapabilities, which the HTTP transport answers with 400 on the modern
 * era. */
static void fail_rpc(srv_request_t *r, int code, const char *message, json_t *data) {
  srv_request_fail_rpc(r, code, message, data);
}

/* -32021: the request needs client capability `cap`, which it did not declare. */
static void fail_missing_capability(srv_request_t *r, const char *cap) {
  cleanup_free char *msg = xasprintf("Missing required client capability: %s", cap);
  fail_rpc(r, -32021, msg, json_pack("{s:{s:{}}}", "requiredCapabilities", cap));
}

/* ---------------------------------------------------------------- requestState
 *
 * requestState passes through the client, so it is attacker-controlled input (the MRTR
 * page, Server Requirements 4 and 5): it is "v1." hex(payload) "." hex(HMAC-SHA256), the
 * key random per process, the payload a JSON object naming the tool it was issued for and
 * an expiry.  A state that fails any check is refused (-32602). */

#define STATE_KEY_BYTES 32
#define STATE_TTL_MS (10 * 60 * 1000)
#define STATE_MAX_BYTES 4096 /* a state this fixture issues is far smaller */

static unsigned char state_key[STATE_KEY_BYTES];
static bool state_key_ready;

static void hmac_sha256(const void *data, size_t len, unsigned char out[CM_SHA256_SIZE]) {
  if (!state_key_ready) {
    /* getrandom(2) blocks only before the pool is seeded at boot, never later. */
    if (getrandom(state_key, sizeof state_key, 0) != (ssize_t)sizeof state_key) abort();
    state_key_ready = true;
  }
  unsigned char pad[64], inner[CM_SHA256_SIZE];
  cm_sha256_t ctx;
  for (int round = 0; round < 2; round++) {
    memset(pad, round == 0 ? 0x36 : 0x5c, sizeof pad);
    for (size_t i = 0; i < sizeof state_key; i++) pad[i] ^= state_key[i];
    cm_sha256_init(&ctx);
    cm_sha256_update(&ctx, pad, sizeof pad);
    if (round == 0) {
      cm_sha256_update(&ctx, data, len);
      cm_sha256_final(&ctx, inner);
    } else {
      cm_sha256_update(&ctx, inner, sizeof inner);
      cm_sha256_final(&ctx, out);
    }
  }
}

static void hex_encode(cm_buf_t *out, const unsigned char *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    char two[2] = {digits[p[i] >> 4], digits[p[i] & 15]};
    cm_buf_append(out, two, 2);
  }
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* payload (stolen) with the tool's name and an expiry (this process's monotonic clock:
 * the key dies with the process anyway), signed. */
static char *state_sign(const char *tool, json_t *payload) {
  json_object_set_new(payload, "tool", json_string(tool));
  json_object_set_new(payload, "exp", json_integer((json_int_t)(cm_now_ms() + STATE_TTL_MS)));
  cleanup_free char *text = json_dumps(payload, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(payload);
  if (!text) abort();
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_append(&b, "v1.", 3);
  hex_encode(&b, (const unsigned char *)text, strlen(text));
  unsigned char mac[CM_SHA256_SIZE];
  hmac_sha256(b.data, b.len, mac);
  cm_buf_append(&b, ".", 1);
  hex_encode(&b, mac, sizeof mac);
  return cm_buf_steal(&b);
}

/* The payload of a state issued for `tool` that is intact and unexpired (new ref), or NULL. */
static json_t *state_verify(const char *tool, json_t *jstate) {
  if (!json_is_string(jstate)) return NULL;
  const char *s = json_string_value(jstate);
  size_t n = json_string_length(jstate);
  const char *dot = n > 3 && n <= STATE_MAX_BYTES ? memrchr(s, '.', n) : NULL;
  if (!dot || strncmp(s, "v1.", 3) != 0 || dot < s + 3) return NULL;
  size_t signed_len = (size_t)(dot - s), mac_hex = n - signed_len - 1;
  unsigned char mac[CM_SHA256_SIZE], want[CM_SHA256_SIZE];
  if (mac_hex != 2 * sizeof mac) return NULL;
  for (size_t i = 0; i < sizeof mac; i++) {
    int hi = hex_digit(dot[1 + 2 * i]), lo = hex_digit(dot[2 + 2 * i]);
    if (hi < 0 || lo < 0) return NULL;
    mac[i] = (unsigned char)(hi << 4 | lo);
  }
  hmac_sha256(s, signed_len, want);
  unsigned char diff = 0;
  for (size_t i = 0; i < sizeof mac; i++) diff |= (unsigned char)(mac[i] ^ want[i]);
  size_t payload_hex = signed_len - 3;
  if (diff || payload_hex % 2) return NULL;
  cleanup_free char *text = xmalloc(payload_hex / 2 + 1);
  for (size_t i = 0; i < payload_hex / 2; i++) {
    int hi = hex_digit(s[3 + 2 * i]), lo = hex_digit(s[4 + 2 * i]);
    if (hi < 0 || lo < 0) return NULL;
    text[i] = (char)(hi << 4 | lo);
  }
  json_error_t jerr;
  json_t *payload = json_loadb(text, payload_hex / 2, JSON_REJECT_DUPLICATES, &jerr);
  const char *issued_for = json_string_value(json_object_get(payload, "tool"));
  json_t *exp = json_object_get(payload, "exp");
  if (!json_is_object(payload) || !issued_for || strcmp(issued_for, tool) != 0 ||
      !json_is_integer(exp) || json_integer_value(exp) < (json_int_t)cm_now_ms()) {
    json_decref(payload);
    return NULL;
  }
  return payload;
}

/* ---------------------------------------------------------------- multi-round-trip requests
 *
 * On the modern era a server asks the client for input by answering with an
 * InputRequiredResult; the client retries the request with inputResponses (and the
 * requestState, echoed).  These handlers need the whole params (inputResponses,
 * requestState, _meta), which srv_tool_t's call does not get, so the extension's handle
 * hook takes their tools/call and prompts/get (ROUTER SUPPORT, checklist R10,
 * srv_request_params, would let them be plain tools).  On the handshake era they are
 * listed but answer with an isError result: that era asks with server -> client requests
 * instead (test_elicitation and friends). */

/* {method: "elicitation/create", params: {mode: form, message, requestedSchema: one
 * required property}}. */
static json_t *elicit_request(const char *message, const char *property, const char *type) {
  return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}}}", "method",
                   "elicitation/create", "params", "mode", "form", "message", message,
                   "requestedSchema", "type", "object", "properties", property, "type", type,
                   "required", property);
}

static json_t *sampling_request(const char *prompt, int max_tokens) {
  return json_pack("{s:s, s:{s:[{s:s, s:{s:s, s:s}}], s:i}}", "method", "sampling/createMessage",
                   "params", "messages", "role", "user", "content", "type", "text", "text", prompt,
                   "maxTokens", max_tokens);
}

static json_t *roots_request(void) {
  return json_pack("{s:s, s:{}}", "method", "roots/list", "params");
}

/* An InputRequiredResult: requests (stolen, an object or NULL) and state (or NULL). */
static json_t *input_required(json_t *requests, const char *state) {
  json_t *result = json_pack("{s:s}", "resultType", "input_required");
  if (requests) json_object_set_new(result, "inputRequests", requests);
  if (state) json_object_set_new(result, "requestState", json_string(state));
  return result;
}

/* An answered elicitation's content.<field> (a string), or NULL. */
static const char *elicited_string(json_t *response, const char *field) {
  if (!json_is_object(response)) return NULL;
  const char *action = json_string_value(json_object_get(response, "action"));
  if (!action || strcmp(action, "accept") != 0) return NULL;
  return json_string_value(json_object_get(json_object_get(response, "content"), field));
}

/* The text of an answered sampling request, or NULL. */
static const char *sampled_text(json_t *response) {
  return json_string_value(json_object_get(json_object_get(response, "content"), "text"));
}

/* What a multi-round-trip handler is given. */
typedef struct mrtr_call {
  srv_request_t *r;
  const char *name;
  json_t *params;    /* the whole params (borrowed) */
  json_t *responses; /* params.inputResponses when an object, else NULL */
  json_t *state;     /* params.requestState (borrowed; unverified), or NULL */
} mrtr_call_t;

/* A response the client sent for `key` that is not even an object is malformed input
 * (-32602; the scenario input-required-result-validate-input); a missing one is asked
 * for again. */
static bool response_malformed(mrtr_call_t *m, const char *key) {
  json_t *v = json_object_get(m->responses, key);
  if (!v || json_is_object(v)) return false;
  cleanup_free char *msg =
      xasprintf("inputResponses.%s must be an object (the client's result)", key);
  fail_rpc(m->r, -32602, msg, NULL);
  return true;
}

/* Needs each capability of caps (a NULL-terminated list); fails m with -32021 naming all
 * the missing ones and returns false otherwise. */
static bool require_capabilities(mrtr_call_t *m, const char *const *caps) {
  json_t *missing = json_object();
  for (const char *const *c = caps; *c; c++)
    if (!client_declared(m->params, *c)) json_object_set_new(missing, *c, json_object());
  if (json_object_size(missing) == 0) {
    json_decref(missing);
    return true;
  }
  fail_rpc(m->r, -32021, "Missing required client capability",
           json_pack("{s:o}", "requiredCapabilities", missing));
  return false;
}

static void mrtr_elicitation(mrtr_call_t *m) {
  static const char *const caps[] = {"elicitation", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "user_name")) return;
  const char *name = elicited_string(json_object_get(m->responses, "user_name"), "name");
  if (!name) {
    srv_request_finish(
        m->r, input_required(json_pack("{s:o}", "user_name",
                                       elicit_request("What is your name?", "name", "string")),
                             NULL));
    return;
  }
  cleanup_free char *text = xasprintf("Hello, %s!", name);
  srv_request_finish(m->r, text_result(text));
}

static void mrtr_sampling(mrtr_call_t *m) {
  static const char *const caps[] = {"sampling", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "capital_question")) return;
  const char *answer = sampled_text(json_object_get(m->responses, "capital_question"));
  if (!answer) {
    srv_request_finish(
        m->r, input_required(json_pack("{s:o}", "capital_question",
                                       sampling_request("What is the capital of France?", 100)),
                             NULL));
    return;
  }
  cleanup_free char *text = xasprintf("Sampling result: %s", answer);
  srv_request_finish(m->r, text_result(text));
}

static void mrtr_list_roots(mrtr_call_t *m) {
  static const char *const caps[] = {"roots", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "client_roots")) return;
  json_t *roots = json_object_get(json_object_get(m->responses, "client_roots"), "roots");
  if (!json_is_array(roots)) {
    srv_request_finish(m->r,
                       input_required(json_pack("{s:o}", "client_roots", roots_request()), NULL));
    return;
  }
  cleanup_free char *text = xasprintf("Found %zu root(s)", json_array_size(roots));
  srv_request_finish(m->r, text_result(text));
}

/* Fails m with -32602 when it carries a requestState that does not verify; else sets
 * *payload (NULL without a state) and returns true. */
static bool verified_state(mrtr_call_t *m, json_t **payload) {
  *payload = NULL;
  if (!m->state) return true;
  *payload = state_verify(m->name, m->state);
  if (*payload) return true;
  fail_rpc(m->r, -32602, "requestState integrity check failed", NULL);
  return false;
}

static const char *state_kind(json_t *payload) {
  return json_string_value(json_object_get(payload, "kind"));
}

static bool kind_is(json_t *payload, const char *kind) {
  return state_kind(payload) && strcmp(state_kind(payload), kind) == 0;
}

/* request_state and tampered_state: a confirmation plus a signed state; complete only when
 * both come back, intact. */
static void mrtr_confirm_with_state(mrtr_call_t *m, const char *kind, const char *ok_text) {
  static const char *const caps[] = {"elicitation", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "confirm")) return;
  json_t *payload;
  if (!verified_state(m, &payload)) return;
  json_t *confirm = json_object_get(m->responses, "confirm");
  json_t *ok =
      json_is_object(confirm) ? json_object_get(json_object_get(confirm, "content"), "ok") : NULL;
  bool done = kind_is(payload, kind) && json_is_true(ok);
  json_decref(payload);
  if (done) {
    srv_request_finish(m->r, text_result(ok_text));
    return;
  }
  cleanup_free char *state = state_sign(m->name, json_pack("{s:s}", "kind", kind));
  srv_request_finish(
      m->r,
      input_required(
          json_pack("{s:o}", "confirm", elicit_request("Please confirm", "ok", "boolean")), state));
}

static void mrtr_request_state(mrtr_call_t *m) {
  mrtr_confirm_with_state(m, "request-state", "state-ok: requestState validated");
}

static void mrtr_tampered_state(mrtr_call_t *m) {
  mrtr_confirm_with_state(m, "tamper-test", "integrity-ok: state verified");
}

static void mrtr_multiple_inputs(mrtr_call_t *m) {
  static const char *const caps[] = {"elicitation", "sampling", "roots", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "user_name") ||
      response_malformed(m, "greeting") || response_malformed(m, "client_roots"))
    return;
  json_t *payload;
  if (!verified_state(m, &payload)) return;
  const char *name = elicited_string(json_object_get(m->responses, "user_name"), "name");
  const char *greeting = sampled_text(json_object_get(m->responses, "greeting"));
  json_t *roots = json_object_get(json_object_get(m->responses, "client_roots"), "roots");
  bool done = kind_is(payload, "multiple-inputs") && name && greeting && json_is_array(roots);
  json_decref(payload);
  if (done) {
    cleanup_free char *text =
        xasprintf("Name: %s; Greeting: %s; Roots: %zu", name, greeting, json_array_size(roots));
    srv_request_finish(m->r, text_result(text));
    return;
  }
  cleanup_free char *state = state_sign(m->name, json_pack("{s:s}", "kind", "multiple-inputs"));
  srv_request_finish(
      m->r, input_required(json_pack("{s:o, s:o, s:o}", "user_name",
                                     elicit_request("What is your name?", "name", "string"),
                                     "greeting", sampling_request("Generate a greeting", 50),
                                     "client_roots", roots_request()),
                           state));
}

static void mrtr_multi_round(mrtr_call_t *m) {
  static const char *const caps[] = {"elicitation", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "step1") ||
      response_malformed(m, "step2"))
    return;
  json_t *payload;
  if (!verified_state(m, &payload)) return;
  json_int_t round = json_integer_value(json_object_get(payload, "round"));
  const char *name = elicited_string(json_object_get(m->responses, "step1"), "name");
  const char *color = elicited_string(json_object_get(m->responses, "step2"), "color");
  const char *known = json_string_value(json_object_get(payload, "name"));
  json_t *result;
  if (round == 2 && known && color) {
    cleanup_free char *text = xasprintf("Multi-round complete for %s who likes %s", known, color);
    result = text_result(text);
  } else if (round == 1 && name) {
    cleanup_free char *state =
        state_sign(m->name, json_pack("{s:I, s:s}", "round", (json_int_t)2, "name", name));
    result = input_required(
        json_pack("{s:o}", "step2",
                  elicit_request("Step 2: What is your favorite color?", "color", "string")),
        state);
  } else {
    /* No state, or not what this round needs: start over. */
    cleanup_free char *state = state_sign(m->name, json_pack("{s:I}", "round", (json_int_t)1));
    result = input_required(
        json_pack("{s:o}", "step1", elicit_request("Step 1: What is your name?", "name", "string")),
        state);
  }
  json_decref(payload);
  srv_request_finish(m->r, result);
}

/* Asks only for what the client declared it can answer. */
static void mrtr_capabilities(mrtr_call_t *m) {
  if (json_object_size(m->responses) > 0) {
    cm_buf_t keys;
    cm_buf_init(&keys, 0);
    const char *key;
    json_t *v;
    json_object_foreach(m->responses, key, v) {
      if (keys.len) cm_buf_append(&keys, ",", 1);
      cm_buf_append(&keys, key, strlen(key));
    }
    cleanup_free char *text = xasprintf("capabilities-ok: received %s", keys.data);
    cm_buf_release(&keys);
    srv_request_finish(m->r, text_result(text));
    return;
  }
  json_t *requests = json_object();
  if (client_declared(m->params, "elicitation"))
    json_object_set_new(requests, "elicit_input",
                        elicit_request("Elicitation input", "value", "string"));
  if (client_declared(m->params, "sampling"))
    json_object_set_new(requests, "sample_input", sampling_request("Sample request", 50));
  if (json_object_size(requests) == 0) {
    json_decref(requests);
    srv_request_finish(m->r, text_result("No supported capabilities declared"));
    return;
  }
  cleanup_free char *state = state_sign(m->name, json_pack("{s:s}", "kind", "capabilities-test"));
  srv_request_finish(m->r, input_required(requests, state));
}

/* server-stateless: a tool that needs sampling; without it, -32021 naming it. */
static void mrtr_missing_capability(mrtr_call_t *m) {
  if (!client_declared(m->params, "sampling")) {
    fail_missing_capability(m->r, "sampling");
    return;
  }
  srv_request_finish(m->r, text_result("Success"));
}

/* server-stateless: a call that streams (progress, when the client asked for it) and then
 * needs input: the stream carries notifications and the InputRequiredResult, never a
 * request of the server's own. */
static void mrtr_streaming_elicitation(mrtr_call_t *m) {
  static const char *const caps[] = {"elicitation", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "confirm")) return;
  static const char msg[] = "Preparing the question";
  srv_request_progress(m->r, 50, msg, sizeof msg - 1, NULL);
  if (elicited_string(json_object_get(m->responses, "confirm"), "answer")) {
    srv_request_finish(m->r, text_result("Streaming complete"));
    return;
  }
  srv_request_finish(
      m->r, input_required(json_pack("{s:o}", "confirm",
                                     elicit_request("Continue streaming?", "answer", "string")),
                           NULL));
}

/* Ends the client's wait for r with a CreateTaskResult and lets the call go on as a task
 * whose result is what r finishes with (srv_request_promote_task); false when it cannot:
 * the call then completes in place. */
static bool promote_to_task(srv_request_t *r) {
  return srv_request_promote_task(r);
}

static json_t *task_greeting_step(timed_call_t *c) {
  cleanup_free char *text = xasprintf("Hello, %s! (from the task)", c->text);
  return text_result(text);
}

/* tasks-mrtr-composition: the input is gathered by multi-round trips, then the work goes
 * on as a task (taskSupport required: without the tasks extension, -32021). */
static void mrtr_tool_with_task(mrtr_call_t *m) {
  static const char *const caps[] = {"elicitation", NULL};
  if (!require_capabilities(m, caps) || response_malformed(m, "user_name")) return;
  const char *name = elicited_string(json_object_get(m->responses, "user_name"), "name");
  if (!name) {
    srv_request_finish(
        m->r, input_required(json_pack("{s:o}", "user_name",
                                       elicit_request("What is your name?", "name", "string")),
                             NULL));
    return;
  }
  promote_to_task(m->r);
  timed_call_t *c = timed_prepare(m->r, task_greeting_step);
  c->text = xstrdup(name);
  timed_go(c, 200);
}

static const struct {
  const char *name;
  void (*handle)(mrtr_call_t *m);
} mrtr_tools[] = {
    {"test_input_required_result_elicitation", mrtr_elicitation},
    {"test_input_required_result_sampling", mrtr_sampling},
    {"test_input_required_result_list_roots", mrtr_list_roots},
    {"test_input_required_result_request_state", mrtr_request_state},
    {"test_input_required_result_multiple_inputs", mrtr_multiple_inputs},
    {"test_input_required_result_multi_round", mrtr_multi_round},
    {"test_input_required_result_tampered_state", mrtr_tampered_state},
    {"test_input_required_result_capabilities", mrtr_capabilities},
    {"test_missing_capability", mrtr_missing_capability},
    {"test_streaming_elicitation", mrtr_streaming_elicitation},
    {"test_tool_with_task", mrtr_tool_with_task},
};

static json_t *mrtr_describe(const char *name) {
  static const struct {
    const char *name, *description;
  } descriptions[] = {
      {"test_input_required_result_elicitation",
       "MRTR: returns InputRequiredResult with an elicitation request (key user_name)"},
      {"test_input_required_result_sampling",
       "MRTR: returns InputRequiredResult with a sampling request (key capital_question)"},
      {"test_input_required_result_list_roots",
       "MRTR: returns InputRequiredResult with a roots/list request (key client_roots)"},
      {"test_input_required_result_request_state",
       "MRTR: returns InputRequiredResult with requestState"},
      {"test_input_required_result_multiple_inputs",
       "MRTR: returns InputRequiredResult with elicitation, sampling and roots requests"},
      {"test_input_required_result_multi_round", "MRTR: a three-round InputRequiredResult flow"},
      {"test_input_required_result_tampered_state",
       "MRTR: HMAC-signed requestState; a tampered one is refused"},
      {"test_input_required_result_capabilities",
       "MRTR: asks only for what the client's capabilities declare"},
      {"test_missing_capability", "Needs the client's sampling capability (-32021 without it)"},
      {"test_streaming_elicitation",
       "Streams progress, then needs input: only notifications and the result on its stream"},
      {"test_tool_with_task",
       "Gathers a name by multi-round trips, then goes on as a task (taskSupport required)"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(descriptions); i++)
    if (strcmp(descriptions[i].name, name) == 0)
      return tool_object(name, descriptions[i].description, "{\"type\":\"object\"}");
  abort();
}

/* srv_tool_t wants a describe per tool: one line each. */
#define MRTR_DESCRIBE(fn, tool)        \
  static json_t *fn(srv_server_t *s) { \
    return mrtr_describe(tool);        \
  }
MRTR_DESCRIBE(mrtr_describe_elicitation, "test_input_required_result_elicitation")
MRTR_DESCRIBE(mrtr_describe_sampling, "test_input_required_result_sampling")
MRTR_DESCRIBE(mrtr_describe_list_roots, "test_input_required_result_list_roots")
MRTR_DESCRIBE(mrtr_describe_request_state, "test_input_required_result_request_state")
MRTR_DESCRIBE(mrtr_describe_multiple_inputs, "test_input_required_result_multiple_inputs")
MRTR_DESCRIBE(mrtr_describe_multi_round, "test_input_required_result_multi_round")
MRTR_DESCRIBE(mrtr_describe_tampered_state, "test_input_required_result_tampered_state")
MRTR_DESCRIBE(mrtr_describe_capabilities, "test_input_required_result_capabilities")
MRTR_DESCRIBE(mrtr_describe_missing_capability, "test_missing_capability")
MRTR_DESCRIBE(mrtr_describe_streaming_elicitation, "test_streaming_elicitation")

static json_t *tool_with_task_describe(srv_server_t *s) {
  json_t *tool = mrtr_describe("test_tool_with_task");
  json_object_set_new(tool, "execution", json_pack("{s:s}", "taskSupport", "required"));
  return tool;
}

/* The handshake era reaches these tools through srv_tool_t: they need the stateless one. */
static void modern_only_call(srv_request_t *r, json_t *args) {
  srv_request_finish(
      r, srv_tool_error_result("this tool needs protocol revision 2026-07-28 (multi-round-trip "
                               "requests); in the handshake era a server asks with requests of its "
                               "own (see test_elicitation)"));
}

/* Takes a modern tools/call of a multi-round-trip tool; false for any other. */
static bool mrtr_tools_call(srv_request_t *r, json_t *params) {
  const char *name = json_string_value(json_object_get(params, "name"));
  if (!name || !modern_request(params)) return false;
  for (size_t i = 0; i < CM_ARRAY_SIZE(mrtr_tools); i++) {
    if (strcmp(mrtr_tools[i].name, name) != 0) continue;
    json_t *args = json_object_get(params, "arguments");
    json_t *responses = json_object_get(params, "inputResponses");
    if ((args && !json_is_object(args) && !json_is_null(args)) ||
        (responses && !json_is_object(responses))) {
      fail_rpc(r, -32602, "\"arguments\" and \"inputResponses\" must be objects", NULL);
      return true;
    }
    mrtr_call_t m = {r, name, params, responses, json_object_get(params, "requestState")};
    mrtr_tools[i].handle(&m);
    return true;
  }
  return false;
}

/* ---------------------------------------------------------------- more 2026-07-28 tools */

/* server-stateless: logs once; the router sends notifications/message only for a request
 * whose _meta asked for a logLevel (on the handshake era: after logging/setLevel). */
static json_t *logging_tool_describe(srv_server_t *s) {
  return tool_object("test_logging_tool", "Diagnostic logging validator tool",
                     "{\"type\":\"object\"}");
}
static void logging_tool_call(srv_request_t *r, json_t *args) {
  srv_request_log(r, "info", NULL, json_string("Diagnostic trace logging activated"));
  srv_request_finish(r, text_result("Logging evaluated"));
}

/* server-stateless's list-changed diagnostics: each "changes" a list, which the listen
 * streams that asked for it hear of (subscriptions/listen, core/listen.c).  Nothing really
 * changes: the lists are fixed. */
static json_t *trigger_tool_describe(srv_server_t *s) {
  return tool_object("test_trigger_tool_change",
                     "Announces a change of the tool list on subscriptions/listen streams",
                     "{\"type\":\"object\"}");
}
static void trigger_tool_call(srv_request_t *r, json_t *args) {
  srv_listen_list_changed(srv_request_server(r), SRV_LISTEN_TOOLS, NULL);
  srv_request_finish(r, text_result("Tool list change announced"));
}
static json_t *trigger_prompt_describe(srv_server_t *s) {
  return tool_object("test_trigger_prompt_change",
                     "Announces a change of the prompt list on subscriptions/listen streams",
                     "{\"type\":\"object\"}");
}
static void trigger_prompt_call(srv_request_t *r, json_t *args) {
  srv_listen_list_changed(srv_request_server(r), SRV_LISTEN_PROMPTS, NULL);
  srv_request_finish(r, text_result("Prompt list change announced"));
}

/* http-custom-header-server-validation: a string parameter mirrored into the
 * Mcp-Param-Region header.  The HTTP transport checks the header against the body
 * (checklist H6: transport/http/mirror.c, with the table srv_server_param_headers reads
 * from this description when the server starts); the tool only echoes. */
static json_t *custom_header_describe(srv_server_t *s) {
  return tool_object(
      "test_custom_header",
      "Echoes its region, which clients mirror into the Mcp-Param-Region header (SEP-2243)",
      "{\"type\":\"object\",\"properties\":{\"region\":{\"type\":\"string\","
      "\"description\":\"Where to run\",\"x-mcp-header\":\"Region\"}},"
      "\"required\":[\"region\"]}");
}
static void custom_header_call(srv_request_t *r, json_t *args) {
  const char *region = required_string(r, args, "region");
  if (!region) return;
  cleanup_free char *text = xasprintf("Region: %s", region);
  srv_request_finish(r, text_result(text));
}

/* ---------------------------------------------------------------- the tasks extension's tools
 *
 * Ordinary tools as far as the fixture is concerned: whether a call becomes a task is the
 * router's decision (core/tasks.c), from the task support each declares in its srv_tool_t
 * (the router lists it as execution.taskSupport; the Tool objects say the same).  A tool
 * of optional support becomes a task of the server's accord in the modern era
 * (prefers_task) for a client that declared the extension. */

static bool always_task(srv_server_t *s, json_t *arguments) {
  return true;
}

#define MAX_COMPUTE_SECONDS 120

static json_t *task_tool(const char *name, const char *description, const char *schema,
                         const char *task_support) {
  json_t *tool = tool_object(name, description, schema);
  if (task_support)
    json_object_set_new(tool, "execution", json_pack("{s:s}", "taskSupport", task_support));
  return tool;
}

static json_t *greet_describe(srv_server_t *s) {
  return task_tool("greet", "Says hello (synchronous only)",
                   "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
                   "\"required\":[\"name\"]}",
                   NULL);
}
static void greet_call(srv_request_t *r, json_t *args) {
  const char *name = required_string(r, args, "name");
  if (!name) return;
  cleanup_free char *text = xasprintf("Hello, %s!", name);
  srv_request_finish(r, text_result(text));
}

static json_t *slow_compute_step(timed_call_t *c) {
  cleanup_free char *text = xasprintf("Computed %s after %g s", c->text, c->seconds);
  return text_result(text);
}
static json_t *slow_compute_describe(srv_server_t *s) {
  return task_tool(
      "slow_compute", "Waits `seconds` (at most 120), then answers; a cancelled call stops",
      "{\"type\":\"object\",\"properties\":{\"seconds\":{\"type\":\"number\",\"minimum\":0,"
      "\"maximum\":120},\"label\":{\"type\":\"string\"}}}",
      "optional");
}
static void slow_compute_call(srv_request_t *r, json_t *args) {
  json_t *seconds = json_object_get(args, "seconds");
  json_t *label = json_object_get(args, "label");
  double s = json_is_number(seconds) ? json_number_value(seconds) : 1;
  if (!(s >= 0 && s <= MAX_COMPUTE_SECONDS) || (label && !json_is_string(label))) {
    srv_request_finish(r,
                       srv_tool_error_result("\"seconds\" must be 0 to %d and \"label\" a string",
                                             MAX_COMPUTE_SECONDS));
    return;
  }
  timed_call_t *c = timed_prepare(r, slow_compute_step);
  c->seconds = s;
  c->text = xstrdup(label ? json_string_value(label) : "the answer");
  timed_go(c, (uint64_t)(s * 1000));
}

static json_t *failing_job_step(timed_call_t *c) {
  return srv_tool_error_result("the job failed, as it always does");
}
static json_t *failing_job_describe(srv_server_t *s) {
  return task_tool("failing_job", "Runs for a second, then reports a tool error (a task only)",
                   "{\"type\":\"object\"}", "required");
}
static void failing_job_call(srv_request_t *r, json_t *args) {
  timed_start(r, failing_job_step, 1000);
}

static json_t *protocol_error_step(timed_call_t *c) {
  c->fail_kind = CM_ERR_INTERNAL;
  c->fail_message = "the job crashed (a protocol error, not a tool error)";
  return NULL;
}
static json_t *protocol_error_describe(srv_server_t *s) {
  return task_tool("protocol_error_job", "Fails with a JSON-RPC error (-32603) after a moment",
                   "{\"type\":\"object\"}", "optional");
}
static void protocol_error_call(srv_request_t *r, json_t *args) {
  timed_start(r, protocol_error_step, 200);
}

/* confirm_delete and multi_input ask the client while they run: with
 * srv_request_call_client, which the handshake era sends as a server -> client request on
 * the call's stream, and which a task of the modern era surfaces as the task's
 * inputRequests, answered by tasks/update (core/tasks.c). */
typedef struct asking_call {
  srv_request_t *r;
  char *filename;
  unsigned pending;   /* answers still to come */
  unsigned confirmed; /* of those that came, accepted with confirm true */
  char *failure;      /* the first error, if any */
} asking_call_t;

static json_t *confirm_request_params(const char *message) {
  return json_pack("{s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}}", "mode", "form", "message", message,
                   "requestedSchema", "type", "object", "properties", "confirm", "type", "boolean",
                   "required", "confirm");
}

static void asking_answered(void *data, json_t *result, json_t *error) {
  asking_call_t *a = data;
  if (error && !a->failure) {
    const char *msg = json_string_value(json_object_get(error, "message"));
    a->failure = xstrdup(msg ? msg : "the client failed the request");
  } else if (result) {
    const char *action = json_string_value(json_object_get(result, "action"));
    json_t *confirm = json_object_get(json_object_get(result, "content"), "confirm");
    if (action && strcmp(action, "accept") == 0 && json_is_true(confirm)) a->confirmed++;
  }
  /* Every pending call answers (a cancelled request's calls get an error each), so the
   * call ends with the last of them. */
  if (--a->pending > 0) return;
  json_t *out;
  if (a->failure) {
    out = srv_tool_error_result("asking the client failed: %s", a->failure);
  } else if (a->filename) {
    cleanup_free char *text =
        xasprintf(a->confirmed ? "Deleted %s" : "Kept %s (not confirmed)", a->filename);
    out = text_result(text);
  } else {
    cleanup_free char *text = xasprintf("%u of 2 confirmed", a->confirmed);
    out = text_result(text);
  }
  srv_request_t *r = a->r;
  free(a->filename);
  free(a->failure);
  free(a);
  srv_request_finish(r, out);
}

/* Sends the questions (stolen); finishes r at once if none could be sent. */
static void ask_all(srv_request_t *r, asking_call_t *a, json_t **questions, unsigned n) {
  a->r = r;
  cm_error_t err = CM_ERROR_INIT;
  for (unsigned i = 0; i < n; i++) {
    a->pending++;
    if (srv_request_call_client(r, "elicitation/create", questions[i], asking_answered, a, &err) <
        0) {
      a->pending--;
      if (!a->failure) a->failure = xstrdup(cm_error_message(&err));
      cm_error_release(&err);
    }
  }
  if (a->pending == 0) {
    a->pending = 1;
    asking_answered(a, NULL, NULL);
  }
}

static json_t *confirm_delete_describe(srv_server_t *s) {
  return task_tool("confirm_delete", "Asks the client to confirm, then pretends to delete a file",
                   "{\"type\":\"object\",\"properties\":{\"filename\":{\"type\":\"string\"}},"
                   "\"required\":[\"filename\"]}",
                   "optional");
}
static void confirm_delete_call(srv_request_t *r, json_t *args) {
  const char *filename = required_string(r, args, "filename");
  if (!filename) return;
  asking_call_t *a = xcalloc(1, sizeof *a);
  a->filename = xstrdup(filename);
  cleanup_free char *msg = xasprintf("Delete %s?", filename);
  json_t *q[] = {confirm_request_params(msg)};
  ask_all(r, a, q, 1);
}

static json_t *multi_input_describe(srv_server_t *s) {
  return task_tool("multi_input", "Asks the client two questions at once", "{\"type\":\"object\"}",
                   "optional");
}
static void multi_input_call(srv_request_t *r, json_t *args) {
  asking_call_t *a = xcalloc(1, sizeof *a);
  json_t *q[] = {confirm_request_params("First question: go on?"),
                 confirm_request_params("Second question: really?")};
  ask_all(r, a, q, 2);
}

static const srv_tool_t fixture_tools[] = {
    {"test_simple_text", NULL, simple_text_describe, simple_text_call},
    {"test_image_content", NULL, image_describe, image_call},
    {"test_audio_content", NULL, audio_describe, audio_call},
    {"test_embedded_resource", NULL, embedded_describe, embedded_call},
    {"test_multiple_content_types", NULL, mixed_describe, mixed_call},
    {"test_tool_with_logging", NULL, logging_describe, logging_call},
    {"test_tool_with_progress", NULL, progress_describe, progress_call},
    {"test_error_handling", NULL, error_describe, error_call},
    {"test_reconnection", NULL, reconnection_describe, reconnection_call},
    {"test_sampling", NULL, sampling_describe, sampling_call},
    {"test_elicitation", NULL, elicitation_describe, elicitation_call},
    {"test_elicitation_sep1034_defaults", NULL, defaults_describe, defaults_call},
    {"test_elicitation_sep1330_enums", NULL, enums_describe, enums_call},
    {"json_schema_2020_12_tool", NULL, schema_2020_12_describe, schema_2020_12_call},
    /* 2026-07-28: multi-round-trip requests and the diagnostics of server-stateless (their
     * modern calls go through fixture_handle, see mrtr_tools_call). */
    {"test_input_required_result_elicitation", NULL, mrtr_describe_elicitation, modern_only_call},
    {"test_input_required_result_sampling", NULL, mrtr_describe_sampling, modern_only_call},
    {"test_input_required_result_list_roots", NULL, mrtr_describe_list_roots, modern_only_call},
    {"test_input_required_result_request_state", NULL, mrtr_describe_request_state,
     modern_only_call},
    {"test_input_required_result_multiple_inputs", NULL, mrtr_describe_multiple_inputs,
     modern_only_call},
    {"test_input_required_result_multi_round", NULL, mrtr_describe_multi_round, modern_only_call},
    {"test_input_required_result_tampered_state", NULL, mrtr_describe_tampered_state,
     modern_only_call},
    {"test_input_required_result_capabilities", NULL, mrtr_describe_capabilities, modern_only_call},
    {"test_missing_capability", NULL, mrtr_describe_missing_capability, modern_only_call},
    {"test_streaming_elicitation", NULL, mrtr_describe_streaming_elicitation, modern_only_call},
    {"test_logging_tool", NULL, logging_tool_describe, logging_tool_call},
    {"test_trigger_tool_change", NULL, trigger_tool_describe, trigger_tool_call},
    {"test_trigger_prompt_change", NULL, trigger_prompt_describe, trigger_prompt_call},
    {"test_custom_header", NULL, custom_header_describe, custom_header_call},
    /* The tasks extension's fixtures (tasks-* scenarios). */
    {"greet", NULL, greet_describe, greet_call},
    {"slow_compute", NULL, slow_compute_describe, slow_compute_call, SRV_TASK_OPTIONAL,
     always_task},
    {"failing_job", NULL, failing_job_describe, failing_job_call, SRV_TASK_REQUIRED},
    {"protocol_error_job", NULL, protocol_error_describe, protocol_error_call, SRV_TASK_OPTIONAL,
     always_task},
    {"confirm_delete", NULL, confirm_delete_describe, confirm_delete_call, SRV_TASK_OPTIONAL,
     always_task},
    {"multi_input", NULL, multi_input_describe, multi_input_call, SRV_TASK_OPTIONAL, always_task},
    {"test_tool_with_task", NULL, tool_with_task_describe, modern_only_call},
};

/* ---------------------------------------------------------------- resources */

typedef struct fixture_resource {
  const char *uri, *name, *title, *description, *mime_type;
  const char *text; /* or */
  const char *blob; /* base64 */
} fixture_resource_t;

static const fixture_resource_t resources[] = {
    {"test://static-text", "static-text", "Static Text Resource",
     "A static text resource for testing", "text/plain",
     "This is the content of the static text resource.", NULL},
    {"test://static-binary", "static-binary", "Static Binary Resource",
     "A static binary resource (image) for testing", "image/png", NULL, test_png},
    {"test://watched-resource", "watched-resource", "Watched Resource",
     "A resource that clients may subscribe to", "text/plain", "Watched resource content", NULL},
};

#define TEMPLATE_PREFIX "test://template/"
#define TEMPLATE_SUFFIX "/data"
#define TEMPLATE_MAX_ID 128

/* The id of a test://template/{id}/data URI (one non-empty path segment), or NULL. */
static char *template_id(const char *uri) {
  size_t n = strlen(uri), pre = strlen(TEMPLATE_PREFIX), suf = strlen(TEMPLATE_SUFFIX);
  if (n <= pre + suf || strncmp(uri, TEMPLATE_PREFIX, pre) != 0 ||
      strcmp(uri + n - suf, TEMPLATE_SUFFIX) != 0)
    return NULL;
  size_t id_len = n - pre - suf;
  if (id_len > TEMPLATE_MAX_ID || memchr(uri + pre, '/', id_len)) return NULL;
  return xstrndup(uri + pre, id_len);
}

static const fixture_resource_t *resource_find(const char *uri) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(resources); i++)
    if (strcmp(resources[i].uri, uri) == 0) return &resources[i];
  return NULL;
}

/* params.uri as a C string (no NUL inside), or NULL after failing r. */
static const char *uri_param(srv_request_t *r, json_t *params) {
  json_t *uri = json_object_get(params, "uri");
  if (json_is_string(uri) && strlen(json_string_value(uri)) == json_string_length(uri))
    return json_string_value(uri);
  cm_error_t err = CM_ERROR_INIT;
  cm_error_set(&err, 0, CM_ERR_INVALID, "\"uri\" (a string) is required");
  srv_request_fail(r, &err);
  cm_error_release(&err);
  return NULL;
}

static void fail_not_found(srv_request_t *r, const char *what, const char *name) {
  cleanup_free char *excerpt = cm_log_excerpt(name, strlen(name), 200);
  cm_error_t err = CM_ERROR_INIT;
  cm_error_set(&err, 0, CM_ERR_NOT_FOUND, "%s%s", what, excerpt);
  srv_request_fail(r, &err);
  cm_error_release(&err);
}

static void fail_invalid(srv_request_t *r, const char *message) {
  cm_error_t err = CM_ERROR_INIT;
  cm_error_set(&err, 0, CM_ERR_INVALID, "%s", message);
  srv_request_fail(r, &err);
  cm_error_release(&err);
}

static void resources_list(srv_request_t *r, json_t *params) {
  if (json_object_get(params, "cursor")) {
    fail_invalid(r, "unknown cursor");
    return;
  }
  json_t *list = json_array();
  for (size_t i = 0; i < CM_ARRAY_SIZE(resources); i++) {
    const fixture_resource_t *res = &resources[i];
    json_array_append_new(
        list, json_pack("{s:s, s:s, s:s, s:s, s:s}", "uri", res->uri, "name", res->name, "title",
                        res->title, "description", res->description, "mimeType", res->mime_type));
  }
  srv_request_finish(r, json_pack("{s:o}", "resources", list));
}

static void resources_templates_list(srv_request_t *r, json_t *params) {
  if (json_object_get(params, "cursor")) {
    fail_invalid(r, "unknown cursor");
    return;
  }
  srv_request_finish(r, json_pack("{s:[{s:s, s:s, s:s, s:s, s:s}]}", "resourceTemplates",
                                  "uriTemplate", TEMPLATE_PREFIX "{id}" TEMPLATE_SUFFIX, "name",
                                  "template", "title", "Resource Template", "description",
                                  "A resource template with parameter substitution", "mimeType",
                                  "application/json"));
}

static void resources_read(srv_request_t *r, json_t *params) {
  const char *uri = uri_param(r, params);
  if (!uri) return;
  const fixture_resource_t *res = resource_find(uri);
  json_t *content;
  if (res) {
    content = json_pack("{s:s, s:s, s:s}", "uri", res->uri, "mimeType", res->mime_type,
                        res->text ? "text" : "blob", res->text ? res->text : res->blob);
  } else {
    cleanup_free char *id = template_id(uri);
    if (!id) {
      fail_not_found(r, "", uri);
      return;
    }
    cleanup_free char *data = xasprintf("Data for ID: %s", id);
    json_t *doc = json_pack("{s:s, s:b, s:s}", "id", id, "templateTest", 1, "data", data);
    cleanup_free char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    content =
        json_pack("{s:s, s:s, s:s}", "uri", uri, "mimeType", "application/json", "text", text);
  }
  srv_request_finish(r, json_pack("{s:[o]}", "contents", content));
}

/* subscribe and unsubscribe: known resources only.  The fixture never changes them, so a
 * subscription never produces notifications/resources/updated. */
static void resources_subscription(srv_request_t *r, json_t *params) {
  const char *uri = uri_param(r, params);
  if (!uri) return;
  cleanup_free char *id = template_id(uri);
  if (!resource_find(uri) && !id) {
    fail_not_found(r, "", uri);
    return;
  }
  srv_request_finish(r, json_object());
}

/* ---------------------------------------------------------------- prompts */

static json_t *prompts_catalogue(void) {
  return json_text(
      "[{\"name\":\"test_simple_prompt\",\"title\":\"Simple Test Prompt\","
      "\"description\":\"A simple prompt without arguments\"},"
      "{\"name\":\"test_prompt_with_arguments\",\"title\":\"Prompt With Arguments\","
      "\"description\":\"A prompt with required arguments\",\"arguments\":["
      "{\"name\":\"arg1\",\"description\":\"First test argument\",\"required\":true},"
      "{\"name\":\"arg2\",\"description\":\"Second test argument\",\"required\":true}]},"
      "{\"name\":\"test_prompt_with_embedded_resource\",\"title\":\"Prompt With Embedded "
      "Resource\","
      "\"description\":\"A prompt that includes an embedded resource\",\"arguments\":["
      "{\"name\":\"resourceUri\",\"description\":\"URI of the resource to "
      "embed\",\"required\":true}]},"
      "{\"name\":\"test_prompt_with_image\",\"title\":\"Prompt With Image\","
      "\"description\":\"A prompt that includes image content\"},"
      "{\"name\":\"test_input_required_result_prompt\",\"title\":\"Prompt Needing Input\","
      "\"description\":\"MRTR: a prompt that asks for its context (2026-07-28)\"}]");
}

static void prompts_list(srv_request_t *r, json_t *params) {
  if (json_object_get(params, "cursor")) {
    fail_invalid(r, "unknown cursor");
    return;
  }
  srv_request_finish(r, json_pack("{s:o}", "prompts", prompts_catalogue()));
}

static json_t *user_message(json_t *content) {
  return json_pack("{s:s, s:o}", "role", "user", "content", content);
}

/* A prompt argument (a string), or NULL after failing r. */
static const char *prompt_argument(srv_request_t *r, json_t *args, const char *name) {
  json_t *v = json_object_get(args, name);
  if (json_is_string(v)) return json_string_value(v);
  cleanup_free char *msg = xasprintf("missing required argument \"%s\"", name);
  fail_invalid(r, msg);
  return NULL;
}

static void prompts_get(srv_request_t *r, json_t *params) {
  json_t *jname = json_object_get(params, "name");
  json_t *args = json_object_get(params, "arguments");
  if (!json_is_string(jname)) {
    fail_invalid(r, "\"name\" (a string) is required");
    return;
  }
  if (args && !json_is_object(args) && !json_is_null(args)) {
    fail_invalid(r, "\"arguments\" must be an object");
    return;
  }
  const char *name = json_string_value(jname);
  json_t *messages;
  if (strcmp(name, "test_simple_prompt") == 0) {
    messages = json_pack("[o]", user_message(text_block("This is a simple prompt for testing.")));
  } else if (strcmp(name, "test_prompt_with_arguments") == 0) {
    const char *arg1 = prompt_argument(r, args, "arg1");
    const char *arg2 = arg1 ? prompt_argument(r, args, "arg2") : NULL;
    if (!arg2) return;
    cleanup_free char *text = xasprintf("Prompt with arguments: arg1='%s', arg2='%s'", arg1, arg2);
    messages = json_pack("[o]", user_message(text_block(text)));
  } else if (strcmp(name, "test_prompt_with_embedded_resource") == 0) {
    const char *uri = prompt_argument(r, args, "resourceUri");
    if (!uri) return;
    json_t *resource =
        json_pack("{s:s, s:{s:s, s:s, s:s}}", "type", "resource", "resource", "uri", uri,
                  "mimeType", "text/plain", "text", "Embedded resource content for testing.");
    messages = json_pack("[o, o]", user_message(resource),
                         user_message(text_block("Please process the embedded resource above.")));
  } else if (strcmp(name, "test_prompt_with_image") == 0) {
    messages = json_pack("[o, o]", user_message(image_block()),
                         user_message(text_block("Please analyze the image above.")));
  } else if (strcmp(name, "test_input_required_result_prompt") == 0) {
    /* input-required-result-non-tool-request: multi-round trips on prompts/get. */
    json_t *responses = json_object_get(params, "inputResponses");
    if (!modern_request(params)) {
      fail_invalid(r, "test_input_required_result_prompt needs protocol revision 2026-07-28");
      return;
    }
    if (!client_declared(params, "elicitation")) {
      fail_missing_capability(r, "elicitation");
      return;
    }
    json_t *answer = json_object_get(responses, "user_context");
    if (answer && !json_is_object(answer)) {
      fail_invalid(r, "inputResponses.user_context must be an object (the client's result)");
      return;
    }
    const char *context = elicited_string(answer, "context");
    if (!context) {
      srv_request_finish(
          r, input_required(json_pack("{s:o}", "user_context",
                                      elicit_request("What context should the prompt use?",
                                                     "context", "string")),
                            NULL));
      return;
    }
    cleanup_free char *text = xasprintf("Prompt with context: %s", context);
    messages = json_pack("[o]", user_message(text_block(text)));
  } else {
    fail_not_found(r, "unknown prompt ", name);
    return;
  }
  srv_request_finish(r, json_pack("{s:o}", "messages", messages));
}

/* ---------------------------------------------------------------- completion */

/* completion/complete: candidates for test_prompt_with_arguments' arguments and the
 * template's {id}, filtered by the typed prefix. */
static void completion_complete(srv_request_t *r, json_t *params) {
  static const char *const prompt_values[] = {"testValue1", "testValue2", "testValue3"};
  static const char *const id_values[] = {"1", "2", "123"};
  json_t *ref = json_object_get(params, "ref");
  json_t *argument = json_object_get(params, "argument");
  const char *type = json_string_value(json_object_get(ref, "type"));
  const char *arg_name = json_string_value(json_object_get(argument, "name"));
  json_t *jvalue = json_object_get(argument, "value");
  if (!type || !arg_name || !json_is_string(jvalue)) {
    fail_invalid(r, "completion/complete needs \"ref\" {type, ...} and \"argument\" {name, value}");
    return;
  }
  const char *const *candidates = NULL;
  size_t n = 0;
  if (strcmp(type, "ref/prompt") == 0) {
    const char *name = json_string_value(json_object_get(ref, "name"));
    json_t *catalogue = prompts_catalogue();
    bool known = false;
    size_t i;
    json_t *p;
    json_array_foreach(catalogue, i, p) known |=
        name && strcmp(json_string_value(json_object_get(p, "name")), name) == 0;
    json_decref(catalogue);
    if (!known) {
      fail_not_found(r, "unknown prompt ", name ? name : "(none)");
      return;
    }
    if (strcmp(name, "test_prompt_with_arguments") == 0) {
      candidates = prompt_values;
      n = CM_ARRAY_SIZE(prompt_values);
    }
  } else if (strcmp(type, "ref/resource") == 0) {
    const char *uri = json_string_value(json_object_get(ref, "uri"));
    if (uri && strcmp(uri, TEMPLATE_PREFIX "{id}" TEMPLATE_SUFFIX) == 0 &&
        strcmp(arg_name, "id") == 0) {
      candidates = id_values;
      n = CM_ARRAY_SIZE(id_values);
    }
  } else {
    fail_invalid(r, "\"ref.type\" must be ref/prompt or ref/resource");
    return;
  }
  const char *value = json_string_value(jvalue);
  json_t *values = json_array();
  for (size_t i = 0; i < n; i++)
    if (strncmp(candidates[i], value, strlen(value)) == 0)
      json_array_append_new(values, json_string(candidates[i]));
  size_t total = json_array_size(values);
  srv_request_finish(r, json_pack("{s:{s:o, s:I, s:b}}", "completion", "values", values, "total",
                                  (json_int_t)total, "hasMore", 0));
}

/* ---------------------------------------------------------------- the extension */

static json_t *fixture_capabilities(void *data) {
  return json_text(
      "{\"tools\":{\"listChanged\":true},\"resources\":{\"subscribe\":true,\"listChanged\":false},"
      "\"prompts\":{\"listChanged\":true},\"completions\":{}}");
}

static bool fixture_handle(void *data, srv_request_t *r, const char *method, json_t *params) {
  if (strcmp(method, "tools/call") == 0)
    return json_is_object(params) && mrtr_tools_call(r, params);
  /* Removed in 2026-07-28 (subscriptions/listen replaces them): a modern request for them
   * is the router's -32601, should it ever offer one here. */
  if (strncmp(method, "resources/", 10) == 0 && strstr(method, "subscribe") &&
      modern_request(params))
    return false;
  static const struct {
    const char *method;
    void (*handle)(srv_request_t *r, json_t *params);
  } methods[] = {
      {"resources/list", resources_list},
      {"resources/templates/list", resources_templates_list},
      {"resources/read", resources_read},
      {"resources/subscribe", resources_subscription},
      {"resources/unsubscribe", resources_subscription},
      {"prompts/list", prompts_list},
      {"prompts/get", prompts_get},
      {"completion/complete", completion_complete},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(methods); i++) {
    if (strcmp(methods[i].method, method) != 0) continue;
    if (params && !json_is_object(params)) {
      fail_invalid(r, "params must be an object");
      return true;
    }
    json_t *p = params ? json_incref(params) : json_object();
    methods[i].handle(r, p);
    json_decref(p);
    return true;
  }
  return false;
}

static const srv_extension_t fixture_extension = {
    .tools = fixture_tools,
    .n_tools = CM_ARRAY_SIZE(fixture_tools),
    .capabilities = fixture_capabilities,
    .handle = fixture_handle,
};

/* ---------------------------------------------------------------- main */

typedef struct app {
  cm_loop_t *loop;
  srv_server_t *server;
  tr_http_t *http;
  bool shutting_down;
  cm_timer_t *shutdown_timer;
} app_t;

static void check_drained(app_t *app);

static void on_shutdown_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  app_t *app = data;
  app->shutdown_timer = NULL;
  cm_loop_stop(loop);
}

static void poll_drained(cm_loop_t *loop, cm_timer_t *t, void *data) {
  check_drained(data);
}

static void check_drained(app_t *app) {
  if (srv_server_inflight(app->server) == 0) {
    cm_loop_stop(app->loop);
    return;
  }
  cm_loop_timer(app->loop, 10, poll_drained, app);
}

static void on_signal(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  app_t *app = data;
  struct signalfd_siginfo si;
  while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (app->shutting_down) continue;
    app->shutting_down = true;
    tr_http_shutdown(app->http);
    srv_server_cancel_all(app->server);
    app->shutdown_timer = cm_loop_timer(loop, 3000, on_shutdown_timeout, app);
    check_drained(app);
  }
}

int main(int argc, char **argv) {
  srv_config_t cfg;
  srv_config_defaults(&cfg);
  cm_error_t err = CM_ERROR_INIT;
  int rc = srv_config_parse(&cfg, argc, argv, &err);
  if (rc == 0) {
    free(cfg.transport);
    cfg.transport = xstrdup("http");
    cfg.warm_cache = false; /* no fixture runs Python: nothing to download */
    rc = srv_config_validate(&cfg, &err);
  }
  if (rc != 0) {
    if (rc < 0) fprintf(stderr, "%s: error: %s\n", FIXTURE_NAME, cm_error_message(&err));
    cm_error_release(&err);
    srv_config_release(&cfg);
    return rc < 0 ? 2 : 0;
  }
  cm_log_set_level(cfg.log_level);
  signal(SIGPIPE, SIG_IGN);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  app_t app = {0};
  app.loop = cm_loop_new(&err);
  if (!app.loop || sfd < 0) {
    fprintf(stderr, "%s: error: %s\n", FIXTURE_NAME,
            app.loop ? "signalfd failed" : cm_error_message(&err));
    return 1;
  }
  app.server = srv_server_new(app.loop, &cfg, &err);
  if (!app.server) {
    fprintf(stderr, "%s: error: %s\n", FIXTURE_NAME, cm_error_message(&err));
    cm_error_release(&err);
    return 1;
  }
  srv_server_set_extension(app.server, &fixture_extension);
  if (srv_serve_http(app.loop, app.server, &cfg, &app.http, &err) < 0) {
    fprintf(stderr, "%s: error: %s\n", FIXTURE_NAME, cm_error_message(&err));
    cm_error_release(&err);
    srv_server_free(app.server);
    cm_loop_free(app.loop);
    srv_config_release(&cfg);
    return 1;
  }
  cleanup_free char *url = srv_http_url(&cfg, tr_http_port(app.http));
  fprintf(stderr, "%s (%s %s) listening on %s\n", FIXTURE_NAME, SRV_NAME, srv_version(), url);
  cm_watch_t *sw = cm_loop_watch(app.loop, sfd, EPOLLIN, on_signal, &app, &err);

  if (cm_loop_run(app.loop, &err) < 0) cm_err("event loop: %s", cm_error_message(&err));
  cm_timer_cancel(app.shutdown_timer);
  tr_http_free(app.http);
  srv_server_free(app.server);
  cm_watch_remove(sw);
  cm_loop_free(app.loop);
  close(sfd);
  srv_config_release(&cfg);
  cm_error_release(&err);
  return 0;
}
