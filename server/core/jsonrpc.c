#include <stdio.h>

#include "pystd/pystd.h"
#include "server/core/core-internal.h"

const char *const srv_protocol_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                             "2024-11-05"};
const size_t srv_protocol_versions_count = CM_ARRAY_SIZE(srv_protocol_versions);

const char *const srv_modern_versions[] = {"2026-07-28"};
const size_t srv_modern_versions_count = CM_ARRAY_SIZE(srv_modern_versions);

bool srv_modern_supported(const char *v) {
  for (size_t i = 0; i < srv_modern_versions_count; i++)
    if (strcmp(v, srv_modern_versions[i]) == 0) return true;
  return false;
}

bool srv_protocol_supported(const char *v) {
  for (size_t i = 0; i < srv_protocol_versions_count; i++)
    if (strcmp(v, srv_protocol_versions[i]) == 0) return true;
  return false;
}

json_t *srv_jsonrpc_parse(const char *buf, size_t len, int *code, char **why) {
  if (srv_json_depth(buf, len, SRV_MAX_JSON_DEPTH) > SRV_MAX_JSON_DEPTH) {
    *code = JSONRPC_INVALID_REQUEST;
    *why = xasprintf("Invalid Request: JSON nested deeper than %d levels", SRV_MAX_JSON_DEPTH);
    return NULL;
  }
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!root) {
    *code = JSONRPC_PARSE_ERROR;
    *why = xasprintf("Parse error: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    return NULL;
  }
  return root;
}

void srv_jsonrpc_classify(json_t *msg, srv_msg_t *out) {
  tr_jsonrpc_classify(msg, out);
}

json_t *srv_jsonrpc_error(json_t *id, int code, const char *message, json_t *data) {
  json_t *err = json_pack("{s:i, s:s}", "code", code, "message", message);
  if (data) json_object_set_new(err, "data", data);
  return json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", err);
}

json_t *srv_jsonrpc_result(json_t *id, json_t *result) {
  return json_pack("{s:s, s:O, s:O}", "jsonrpc", "2.0", "id", id, "result", result);
}

json_t *srv_jsonrpc_notification(const char *method, json_t *params) {
  if (params)
    return json_pack("{s:s, s:s, s:o}", "jsonrpc", "2.0", "method", method, "params", params);
  return json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
}

char *srv_jsonrpc_dump(json_t *msg, size_t *len) {
  char *s = json_dumps(msg, JSON_COMPACT);
  if (!s) abort(); /* only fails on allocation */
  if (len) *len = strlen(s);
  return s;
}

void srv_modern_decorate(json_t *result) {
  if (!json_is_object(result)) return;
  if (!json_object_get(result, "resultType"))
    json_object_set_new(result, "resultType", json_string("complete"));
  json_t *meta = json_object_get(result, "_meta");
  if (!meta) {
    meta = json_object();
    json_object_set_new(result, "_meta", meta);
  }
  if (json_is_object(meta) && !json_object_get(meta, MCP_META_SERVER_INFO))
    json_object_set_new(meta, MCP_META_SERVER_INFO,
                        json_pack("{s:s, s:s, s:s}", "name", SRV_NAME, "title",
                                  "Python Exec Sandbox", "version", srv_version()));
}

void srv_modern_cache_hints(json_t *result, const char *method, json_int_t ttl_ms) {
  static const char *const cached[] = {"server/discover", "tools/list",
                                       "resources/list",  "resources/templates/list",
                                       "resources/read",  "prompts/list"};
  if (!json_is_object(result) || !method || json_object_get(result, "ttlMs")) return;
  for (size_t i = 0; i < CM_ARRAY_SIZE(cached); i++) {
    if (strcmp(method, cached[i]) != 0) continue;
    json_object_set_new(result, "ttlMs", json_integer(ttl_ms));
    if (!json_object_get(result, "cacheScope"))
      json_object_set_new(result, "cacheScope", json_string("private"));
    return;
  }
}

json_t *srv_json_string_lossy(const char *buf, size_t len) {
  if (cm_utf8_valid(buf, len)) return json_stringn(buf, len);
  size_t n;
  cleanup_free char *clean = cm_utf8_sanitize(buf, len, &n);
  return json_stringn(clean, n);
}
