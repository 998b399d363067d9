/* Fuzz target: the HTTP transport's header parsers (Accept, Content-Type, Host, Origin,
 * Last-Event-ID, Authorization, Mcp-Session-Id, the mirrored Mcp-Method/Mcp-Name/Mcp-Param-*
 * values with their base64 form) and the SSE framer, on the same input. */
#include <stdint.h>

#include "transport/transport-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  bool json, sse;
  tr_http_parse_accept(buf, size, &json, &sse);
  (void)tr_http_media_type_is(buf, size, "application/json");
  char name[TR_HTTP_HOST_MAX];
  if (tr_http_host_name(buf, size, name, sizeof name) == 0) {
    if (strlen(name) >= sizeof name) __builtin_trap();
    (void)tr_http_loopback_name(name);
  }
  if (tr_http_origin_host(buf, size, name, sizeof name) == 0) (void)tr_http_loopback_name(name);
  char scheme[32];
  unsigned port;
  if (tr_http_origin_parse(buf, size, scheme, name, sizeof name, &port) == 0 &&
      (strlen(scheme) >= sizeof scheme || port > 65535))
    __builtin_trap();
  /* A download's attachment name: never empty, never anything a header would mind. */
  char file[160];
  tr_http_attachment_name(buf, size, file, sizeof file);
  if (!file[0] || strlen(file) > 128) __builtin_trap();
  for (const char *p = file; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '.' || *p == '_' || *p == '+' || *p == '-'))
      __builtin_trap();
  uint64_t stream, seq;
  (void)tr_http_parse_event_id(buf, size, &stream, &seq);
  const char *tok;
  size_t tok_len;
  if (tr_http_bearer_token(buf, size, &tok, &tok_len) == 0 &&
      (tok < buf || tok + tok_len > buf + size))
    __builtin_trap();
  (void)tr_http_session_id_valid(buf, size);
  /* A mirrored header value: within the buffer given, NUL-terminated, and text. */
  char value[256];
  size_t value_len = 0;
  if (tr_http_mcp_header_value(buf, size, value, sizeof value, &value_len) == 0 &&
      (value_len >= sizeof value || value[value_len] != '\0' || memchr(value, '\0', value_len) ||
       !cm_utf8_valid(value, value_len)))
    __builtin_trap();
  /* Framing: every line of the output starts with a field name or is the final blank. */
  cm_buf_t out;
  cm_buf_init(&out, 0);
  tr_http_sse_event(&out, "message", true, 1, 2, buf, size);
  if (out.len < 2 || out.data[out.len - 1] != '\n' || out.data[out.len - 2] != '\n')
    __builtin_trap();
  for (size_t i = 0; i + 1 < out.len; i++)
    if (out.data[i] == '\r') __builtin_trap();
  cm_buf_release(&out);
  return 0;
}
