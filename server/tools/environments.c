/* evict_environment: a principal removes one of the cached dependency environments its own
 * calls built (check_environment lists them in tenant.environments.items).  Another
 * principal's is no such environment; one in use or being built stays. */
#include "server/tools/tools-internal.h"

void srv_tool_evict_environment(srv_request_t *r, json_t *args) {
  const char *key;
  json_t *value;
  json_object_foreach(args, key, value) {
    if (strcmp(key, "key") != 0) {
      srv_request_finish(
          r, srv_tool_error_result("Unknown argument. evict_environment accepts: key."));
      return;
    }
  }
  json_t *k = json_object_get(args, "key");
  if (!json_is_string(k) || json_string_length(k) == 0 || json_string_length(k) > 128 ||
      strlen(json_string_value(k)) != json_string_length(k)) {
    srv_request_finish(r,
                       srv_tool_error_result(
                           "'key' must be the key of one of your environments (check_environment "
                           "lists them)."));
    return;
  }
  srv_session_t *ss = srv_request_session(r);
  const char *principal = ss ? srv_session_principal(ss) : SRV_PRINCIPAL_STDIO;
  cm_error_t err = CM_ERROR_INIT;
  cleanup_free char *shown = cm_log_excerpt(json_string_value(k), json_string_length(k), 128);
  if (env_store_evict_owned(srv_server_envs(srv_request_server(r)), principal, json_string_value(k),
                            &err) < 0) {
    srv_request_finish(
        r, srv_tool_error_result("Environment %s: %s.", shown,
                                 err.kind == CM_ERR_NOT_FOUND ? "not one of yours (or already gone)"
                                                              : cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  cleanup_free char *text =
      xasprintf("Environment %s removed: the next call that needs it builds it again.", shown);
  json_t *result = srv_tool_text_result(text, false);
  json_object_set_new(result, "structuredContent", json_pack("{s:O, s:b}", "key", k, "evicted", 1));
  srv_request_finish(r, result);
}

json_t *srv_tool_evict_environment_describe(srv_server_t *s) {
  (void)s;
  return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s, s:I}}, s:[s]}, s:{s:b}}", "name",
                   "evict_environment", "title", "Remove an environment", "description",
                   "Removes one of your cached dependency environments (check_environment lists "
                   "them).",
                   "inputSchema", "type", "object", "properties", "key", "type", "string",
                   "maxLength", (json_int_t)128, "required", "key", "annotations", "readOnlyHint",
                   0);
}
