/* wait_run and cancel_run: a background run's (execute_python's background: true) result,
 * output so far, and end.  The runs themselves are the core's (srv_run_wait, srv_run_cancel:
 * tasks of their principal's). */
#include "server/tools/tools-internal.h"

/* Below the 60 s after which common clients give up on a call. */
#define WAIT_RUN_DEFAULT_S 45

/* The run_id argument, or NULL after answering r with the error. */
static const char *run_id_arg(srv_request_t *r, json_t *args, const char *tool) {
  json_t *id = json_object_get(args, "run_id");
  if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > 64) {
    srv_request_finish(r, srv_tool_error_result("%s needs 'run_id': the run_id an execute_python "
                                                "call with background: true answered.",
                                                tool));
    return NULL;
  }
  return json_string_value(id);
}

void srv_tool_wait_run(srv_request_t *r, json_t *args) {
  const char *id = run_id_arg(r, args, "wait_run");
  if (!id) return;
  uint64_t max = srv_server_config(srv_request_server(r))->max_timeout;
  json_t *t = json_object_get(args, "timeout_seconds");
  uint64_t timeout = WAIT_RUN_DEFAULT_S;
  if (t && !json_is_null(t)) {
    if (!json_is_number(t) || json_number_value(t) < 0) {
      srv_request_finish(r, srv_tool_error_result("'timeout_seconds' must be a number of seconds "
                                                  "(0: answer at once)."));
      return;
    }
    double v = json_number_value(t);
    timeout = v > (double)max ? max : (uint64_t)v;
  }
  srv_run_wait(r, id, timeout * 1000);
}

void srv_tool_cancel_run(srv_request_t *r, json_t *args) {
  const char *id = run_id_arg(r, args, "cancel_run");
  if (id) srv_run_cancel(r, id);
}

json_t *srv_tool_wait_run_describe(srv_server_t *s) {
  (void)s;
  return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s, s:I}}, s:[s]}, s:{s:b}}", "name",
                   "wait_run", "title", "Wait for a run", "description",
                   "Waits up to timeout_seconds (default 45) for a background run: its result "
                   "once it ends, else its new output.",
                   "inputSchema", "type", "object", "properties", "run_id", "type", "string",
                   "timeout_seconds", "type", "integer", "minimum", (json_int_t)0, "required",
                   "run_id", "annotations", "readOnlyHint", 1);
}

json_t *srv_tool_cancel_run_describe(srv_server_t *s) {
  (void)s;
  return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}, s:{s:b}}", "name", "cancel_run",
                   "title", "Cancel a run", "description", "Stops a background run.", "inputSchema",
                   "type", "object", "properties", "run_id", "type", "string", "required", "run_id",
                   "annotations", "readOnlyHint", 0);
}
