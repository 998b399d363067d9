/* list_sessions and close_session: a principal's execute_python sessions (server/exec/
 * session.c).  Another principal's sessions are invisible: closing one of them fails exactly
 * as an unknown id does. */
#include "server/exec/exec.h"
#include "server/tools/tools-internal.h"

static const char *principal_of(srv_request_t *r) {
  srv_session_t *session = srv_request_session(r);
  return session ? srv_session_principal(session) : SRV_PRINCIPAL_STDIO;
}

void srv_tool_list_sessions(srv_request_t *r, json_t *args) {
  if (json_object_size(args) > 0) {
    srv_request_finish(r, srv_tool_error_result("list_sessions takes no arguments"));
    return;
  }
  exec_state_t *x = srv_server_exec(srv_request_server(r));
  json_t *list = exec_sessions_list(x, principal_of(r));
  cm_buf_t t;
  cm_buf_init(&t, 0);
  if (json_array_size(list) == 0) cm_buf_appends(&t, "No sessions.");
  size_t i;
  json_t *o;
  json_array_foreach(list, i, o) {
    json_t *env = json_object_get(o, "environment");
    json_t *mem = json_object_get(o, "memory_bytes");
    json_t *bytes = json_object_get(o, "workdir_bytes");
    json_t *py = json_object_get(o, "python");
    cm_buf_printf(&t, "%s%s: %s, %lld calls, age %llds, idle %llds, python %s, environment %s",
                  i ? "\n" : "", json_string_value(json_object_get(o, "id")),
                  json_string_value(json_object_get(o, "state")),
                  (long long)json_integer_value(json_object_get(o, "calls")),
                  (long long)json_integer_value(json_object_get(o, "age_seconds")),
                  (long long)json_integer_value(json_object_get(o, "idle_seconds")),
                  json_is_string(py) ? json_string_value(py) : "(none yet)",
                  json_is_object(env) ? json_string_value(json_object_get(env, "key")) : "(none)");
    if (json_is_integer(mem))
      cm_buf_printf(&t, ", memory %lld bytes", (long long)json_integer_value(mem));
    else
      cm_buf_appends(&t, ", memory unknown (no kernel running)");
    if (json_is_integer(bytes))
      cm_buf_printf(&t, ", work directory %lld bytes", (long long)json_integer_value(bytes));
    if (json_is_true(json_object_get(o, "kernel_frozen")))
      cm_buf_appends(&t, ", kernel frozen until the next call");
  }
  cleanup_free char *text = cm_buf_steal(&t);
  json_t *result = srv_tool_text_result(text, false);
  json_object_set_new(result, "structuredContent", json_pack("{s:o}", "sessions", list));
  srv_request_finish(r, result);
}

json_t *srv_tool_list_sessions_describe(srv_server_t *s) {
  (void)s;
  return json_pack("{s:s, s:s, s:s, s:{s:s}, s:{s:b}}", "name", "list_sessions", "title",
                   "List sessions", "description", "Lists your execute_python sessions.",
                   "inputSchema", "type", "object", "annotations", "readOnlyHint", 1);
}

void srv_tool_close_session(srv_request_t *r, json_t *args) {
  const char *key;
  json_t *value;
  json_object_foreach(args, key, value) {
    if (strcmp(key, "session") != 0 && strcmp(key, "export") != 0) {
      srv_request_finish(
          r, srv_tool_error_result("Unknown argument. close_session accepts: session, export."));
      return;
    }
  }
  json_t *id = json_object_get(args, "session");
  if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > 64) {
    srv_request_finish(r,
                       srv_tool_error_result("'session' must be the id of one of your sessions."));
    return;
  }
  json_t *exp = json_object_get(args, "export");
  if (exp && !json_is_null(exp) && !json_is_boolean(exp)) {
    srv_request_finish(r, srv_tool_error_result("'export' must be true or false."));
    return;
  }
  srv_server_t *s = srv_request_server(r);
  exec_state_t *x = srv_server_exec(s);
  if (json_is_true(exp)) {
    /* The export is a last call in the session: the kernel (the session's own uid, in its
     * sandbox) writes the tar, and the call's outputs/ brings it back. */
    cleanup_exec_spec exec_spec_t spec = {0};
    spec.script = xstrdup("");
    spec.script_len = 0;
    spec.session = xstrdup(json_string_value(id));
    spec.export_workspace = true;
    spec.close_session = true;
    spec.principal = xstrdup(principal_of(r));
    exec_spec_set_timeout(&spec, srv_server_config(s), 0);
    exec_submit(r, &spec);
    return;
  }
  if (!exec_session_close(x, principal_of(r), json_string_value(id))) {
    cleanup_free char *shown = cm_log_excerpt(json_string_value(id), json_string_length(id), 64);
    const srv_config_t *cfg = srv_server_config(s);
    if (srv_route_foreign(cfg, json_string_value(id))) {
      cleanup_free char *why = srv_route_unknown(cfg, "session", json_string_value(id));
      srv_request_finish(r, srv_tool_error_result("Session '%s': %s.", shown, why));
      return;
    }
    srv_request_finish(r,
                       srv_tool_error_result("Session '%s': session expired or unknown.", shown));
    return;
  }
  cleanup_free char *text =
      xasprintf("Session %s closed: its kernel was stopped and its working directory removed.",
                json_string_value(id));
  json_t *result = srv_tool_text_result(text, false);
  json_object_set_new(result, "structuredContent",
                      json_pack("{s:s, s:b}", "session", json_string_value(id), "closed", 1));
  srv_request_finish(r, result);
}

json_t *srv_tool_close_session_describe(srv_server_t *s) {
  (void)s;
  return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s}}, s:[s]}, s:{s:b}}", "name",
                   "close_session", "title", "Close a session", "description",
                   "Closes a session (its process and files); export: true returns its files "
                   "first as outputs/workspace.tar.",
                   "inputSchema", "type", "object", "properties", "session", "type", "string",
                   "export", "type", "boolean", "required", "session", "annotations",
                   "readOnlyHint", 0);
}
