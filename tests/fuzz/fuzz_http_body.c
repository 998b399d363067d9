/* Fuzz target: the HTTP transport's POST body classification and the token file parser. */
#include <stdint.h>

#include "transport/transport-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  tr_http_envelope_t env;
  tr_http_classify(buf, size, &env);
  if (env.status == TR_HTTP_BODY_OK && !env.batch &&
      env.requests + env.notifications + env.responses != 1)
    __builtin_trap();
  /* An id comes back only for a single message, and only a string or an integer. */
  if (env.id && (env.batch || !(json_is_string(env.id) || json_is_integer(env.id))))
    __builtin_trap();
  tr_http_envelope_release(&env);
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
