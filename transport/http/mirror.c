/* The headers of a stateless (2026-07-28) POST that mirror its body (docs/protocol-2026.md
 * section 3, H2, H3, H6; SEP-2243): Mcp-Method = method; Mcp-Name = params.name, .uri or
 * .taskId, by method; Mcp-Param-<Name> = the tools/call argument a tool's inputSchema marks
 * with x-mcp-header (the table tr_http_options_t.param_headers gave).  Intermediaries route
 * on these headers, so a request whose headers say something its body does not is refused:
 * 400 with -32020 (HeaderMismatch), with the request's id. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "transport/http/http-internal.h"

#define MCP_HEADER_MISMATCH -32020

/* Which params member Mcp-Name mirrors for a method, or NULL (none). */
static const char *name_source(const char *method) {
  static const struct {
    const char *method, *member;
  } map[] = {{"tools/call", "name"},  {"prompts/get", "name"},    {"resources/read", "uri"},
             {"tasks/get", "taskId"}, {"tasks/update", "taskId"}, {"tasks/cancel", "taskId"}};
  for (size_t i = 0; i < CM_ARRAY_SIZE(map); i++)
    if (strcmp(method, map[i].method) == 0) return map[i].member;
  return NULL;
}

__attribute__((format(printf, 2, 3))) static enum MHD_Result mismatch(hs_conn_t *c, const char *fmt,
                                                                      ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tr_hs_respond_error(c, 400, MCP_HEADER_MISMATCH, msg, NULL, NULL);
}

#define INVALID_VALUE                                                                  \
  "Header mismatch: %s is not a valid header value (visible ASCII, space and tab, or " \
  "=?base64?...?= of UTF-8 text)"

/* Header `name` decoded (tr_http_mcp_header_value) into a buffer of its own length (the
 * header is bounded by MHD's connection memory); NULL and *bad = false when absent, NULL
 * and *bad = true when it cannot be decoded. */
static char *decoded(hs_conn_t *c, const char *name, size_t *len, bool *bad) {
  *bad = false;
  const char *v = tr_hs_header(c, name);
  if (!v) return NULL;
  size_t n = strlen(v);
  char *out = xmalloc(n + 1);
  if (tr_http_mcp_header_value(v, n, out, n + 1, len) < 0) {
    free(out);
    *bad = true;
    return NULL;
  }
  return out;
}

static bool same_text(const char *v, size_t len, json_t *s) {
  return json_is_string(s) && json_string_length(s) == len &&
         memcmp(json_string_value(s), v, len) == 0;
}

/* An argument and its header's text: strings exactly, numbers numerically, booleans as
 * true/false.  Objects and arrays cannot be mirrored: never equal. */
static bool same_value(const char *v, size_t len, json_t *arg) {
  if (json_is_string(arg)) return same_text(v, len, arg);
  if (json_is_boolean(arg)) return strcmp(v, json_is_true(arg) ? "true" : "false") == 0;
  if (json_is_number(arg)) {
    if (!len) return false;
    char *end;
    double d = strtod(v, &end);
    return *end == '\0' && isfinite(d) && d == json_number_value(arg);
  }
  return false;
}

/* Mcp-<what> must be present and say `want` (a string of the body). */
static bool check_one(hs_conn_t *c, const char *header, const char *field, json_t *want,
                      enum MHD_Result *ret) {
  size_t len;
  bool bad;
  cleanup_free char *v = decoded(c, header, &len, &bad);
  if (bad) {
    *ret = mismatch(c, INVALID_VALUE, header);
    return false;
  }
  if (!v) {
    *ret = mismatch(c, "Header mismatch: %s is required and must match %s", header, field);
    return false;
  }
  if (!same_text(v, len, want)) {
    *ret = mismatch(c, "Header mismatch: %s does not match %s", header, field);
    return false;
  }
  return true;
}

/* H6 for one marked argument. */
static bool check_param(hs_conn_t *c, const struct hs_param_header *ph, json_t *args,
                        enum MHD_Result *ret) {
  cleanup_free char *header = xasprintf("Mcp-Param-%s", ph->header);
  cleanup_free char *field = xasprintf("arguments.%s", ph->property);
  json_t *arg = json_is_object(args) ? json_object_get(args, ph->property) : NULL;
  size_t len;
  bool bad;
  cleanup_free char *v = decoded(c, header, &len, &bad);
  if (bad) {
    *ret = mismatch(c, INVALID_VALUE, header);
    return false;
  }
  if (!arg || json_is_null(arg)) {
    if (!v) return true;
    *ret = mismatch(c, "Header mismatch: %s is given but %s is not", header, field);
    return false;
  }
  if (!v) {
    *ret = mismatch(c, "Header mismatch: %s is required and must match %s", header, field);
    return false;
  }
  if (!same_value(v, len, arg)) {
    *ret = mismatch(c, "Header mismatch: %s does not match %s", header, field);
    return false;
  }
  return true;
}

bool tr_hs_check_mirrored(hs_conn_t *c, json_t *message, enum MHD_Result *ret) {
  tr_msg_t m;
  tr_jsonrpc_classify(message, &m);
  if (m.kind != TR_MSG_REQUEST) return true; /* the router answers it */
  if (!check_one(c, "Mcp-Method", "the body's method", json_object_get(message, "method"), ret))
    return false;
  const char *member = name_source(m.method);
  json_t *want = member && json_is_object(m.params) ? json_object_get(m.params, member) : NULL;
  /* A missing or malformed member is the router's -32602. */
  if (json_is_string(want)) {
    cleanup_free char *field = xasprintf("params.%s", member);
    if (!check_one(c, "Mcp-Name", field, want, ret)) return false;
  }
  if (strcmp(m.method, "tools/call") != 0 || !json_is_string(want)) return true;
  json_t *args = json_object_get(m.params, "arguments");
  const tr_http_t *h = c->h;
  for (size_t i = 0; i < h->n_param_headers; i++) {
    const struct hs_param_header *ph = &h->param_headers[i];
    if (strcmp(ph->tool, json_string_value(want)) == 0 && !check_param(c, ph, args, ret))
      return false;
  }
  return true;
}
