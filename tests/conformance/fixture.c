/* mps-conformance-fixture: the product's router and Streamable HTTP transport, plus the
 * tools, resources, prompts and completions that the MCP conformance suite
 * (@modelcontextprotocol/conformance 0.1.16, server mode) calls by fixed names.  A test
 * target only (tests/conformance/fixture.cmake): the product binary never carries these.
 *
 * Same flags as the product (srv_config_parse); the transport is always HTTP.  The fixtures
 * follow the suite's reference server (examples/servers/typescript/everything-server.ts)
 * in names and texts; the code is ours, built on the router's extension points
 * (srv_server_set_extension, srv_request_call_client, srv_request_close_stream). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
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
      "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\","
      "\"$defs\":{\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"}"
      ","
      "\"city\":{\"type\":\"string\"}}}},\"properties\":{\"name\":{\"type\":\"string\"},"
      "\"address\":{\"$ref\":\"#/$defs/address\"}},\"additionalProperties\":false}");
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
  /* Runs step `step`; returns the result (new ref) when the call is done, else NULL. */
  json_t *(*run)(timed_call_t *c);
};

static void timed_cancel(void *data) {
  timed_call_t *c = data;
  cm_timer_cancel(c->timer);
  srv_request_t *r = c->r;
  free(c);
  srv_request_finish(r, json_object());
}

static void timed_fire(cm_loop_t *loop, cm_timer_t *t, void *data) {
  timed_call_t *c = data;
  c->timer = NULL;
  json_t *result = c->run(c);
  c->step++;
  if (!result) {
    c->timer = cm_loop_timer(loop, STEP_MS, timed_fire, c);
    return;
  }
  srv_request_t *r = c->r;
  free(c);
  srv_request_finish(r, result);
}

static void timed_start(srv_request_t *r, json_t *(*run)(timed_call_t *c), uint64_t first_ms) {
  timed_call_t *c = xcalloc(1, sizeof *c);
  c->r = r;
  c->run = run;
  srv_request_on_cancel(r, timed_cancel, c);
  cm_loop_t *loop = srv_server_loop(srv_request_server(r));
  if (first_ms) {
    c->timer = cm_loop_timer(loop, first_ms, timed_fire, c);
  } else {
    timed_fire(loop, NULL, c);
  }
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
  srv_request_progress(c->r, steps[c->step], msg, strlen(msg));
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
      "\"description\":\"A prompt that includes image content\"}]");
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
      "{\"resources\":{\"subscribe\":true,\"listChanged\":false},"
      "\"prompts\":{\"listChanged\":false},\"completions\":{}}");
}

static bool fixture_handle(void *data, srv_request_t *r, const char *method, json_t *params) {
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
