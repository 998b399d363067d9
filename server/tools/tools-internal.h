/* server/tools/ internals: each tool's call and description, for the table. */
#ifndef MPS_SERVER_TOOLS_INTERNAL_H
#define MPS_SERVER_TOOLS_INTERNAL_H

#include "server/tools/tools.h"

void srv_tool_execute_python(srv_request_t *r, json_t *arguments);
json_t *srv_tool_execute_python_describe(srv_server_t *s);
bool srv_tool_execute_python_prefers_task(srv_server_t *s, json_t *arguments);
void srv_tool_check_environment(srv_request_t *r, json_t *arguments);
json_t *srv_tool_check_environment_describe(srv_server_t *s);
void srv_tool_validate_script(srv_request_t *r, json_t *arguments);
json_t *srv_tool_validate_script_describe(srv_server_t *s);
void srv_tool_list_sessions(srv_request_t *r, json_t *arguments);
json_t *srv_tool_list_sessions_describe(srv_server_t *s);
void srv_tool_close_session(srv_request_t *r, json_t *arguments);
json_t *srv_tool_close_session_describe(srv_server_t *s);
void srv_tool_evict_environment(srv_request_t *r, json_t *arguments);
json_t *srv_tool_evict_environment_describe(srv_server_t *s);
void srv_tool_wait_run(srv_request_t *r, json_t *arguments);
json_t *srv_tool_wait_run_describe(srv_server_t *s);
void srv_tool_cancel_run(srv_request_t *r, json_t *arguments);
json_t *srv_tool_cancel_run_describe(srv_server_t *s);

#endif
