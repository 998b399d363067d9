/* Fuzz target: the HTTP transport's POST body classification and the token file parser.
 * The body is classified as given and, because its JSON parser (jansson) is not
 * instrumented, also as a structured message built from the input (jsongen.h) and
 * serialised, so the transport's envelope rules see well-formed JSON-RPC of every shape.
 * Checks: a single valid message is exactly one request, notification or response; a
 * batch's counts add up to its length; a rejected body says why. */
#include <stdint.h>
#include <string.h>

#include "tests/fuzz/jsongen.h"
#include "transport/transport-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void classify(const char *buf, size_t len, const json_t *built) {
  tr_http_envelope_t env;
  tr_http_classify(buf, len, &env);
  if (env.status == TR_HTTP_BODY_OK && !env.batch &&
      env.requests + env.notifications + env.responses != 1)
    __builtin_trap();
  if (env.status != TR_HTTP_BODY_OK && !env.why[0]) __builtin_trap();
  if (env.status == TR_HTTP_BODY_OK && env.batch && built && json_is_array(built) &&
      env.requests + env.notifications + env.responses > json_array_size(built))
    __builtin_trap();
  /* What we built is JSON: never a parse error. */
  if (built && env.status == TR_HTTP_BODY_PARSE_ERROR) __builtin_trap();
  /* An id comes back only for a single message, and only a string or an integer. */
  if (env.id && (env.batch || !(json_is_string(env.id) || json_is_integer(env.id))))
    __builtin_trap();
  tr_http_envelope_release(&env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  classify(buf, size, NULL);

  jg_reader_t r = {data, size};
  json_t *msg;
  if (jg_take(&r) % 4 == 0) {
    msg = json_array();
    for (unsigned n = jg_take(&r) % 5; n > 0 && r.left; n--)
      json_array_append_new(msg, jg_message(&r));
  } else {
    msg = jg_message(&r);
  }
  char *text = json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY);
  /* A NUL in a string is dumped as \u0000, which the strict parser refuses: not ours. */
  if (text && !strstr(text, "\\u0000")) classify(text, strlen(text), msg);
  free(text);
  json_decref(msg);

  tr_http_token_t *tokens = NULL;
  size_t n = 0;
  cm_error_t err = CM_ERROR_INIT;
  if (tr_http_parse_tokens(buf, size, &tokens, &n, &err) == 0) {
    (void)tr_http_token_match(tokens, n, buf, size < 64 ? size : 64);
    tr_http_tokens_free(tokens, n);
  }
  cm_error_release(&err);
  return 0;
}
