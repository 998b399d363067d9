/* The built-in tool table. */
#include "server/tools/tools-internal.h"

static const srv_tool_t tools[] = {
    {"execute_python", "Run Python in a sandbox", srv_tool_execute_python_describe,
     srv_tool_execute_python, SRV_TASK_OPTIONAL, srv_tool_execute_python_prefers_task},
    {"check_environment", "Check the Python sandbox environment",
     srv_tool_check_environment_describe, srv_tool_check_environment, SRV_TASK_FORBIDDEN, NULL},
    {"wait_run", "Wait for a run", srv_tool_wait_run_describe, srv_tool_wait_run,
     SRV_TASK_FORBIDDEN, NULL},
    {"cancel_run", "Cancel a run", srv_tool_cancel_run_describe, srv_tool_cancel_run,
     SRV_TASK_FORBIDDEN, NULL},
    {"validate_script", "Check a Python script without running it",
     srv_tool_validate_script_describe, srv_tool_validate_script, SRV_TASK_FORBIDDEN, NULL},
    {"list_sessions", "List your Python sessions", srv_tool_list_sessions_describe,
     srv_tool_list_sessions, SRV_TASK_FORBIDDEN, NULL},
    {"close_session", "Close a Python session", srv_tool_close_session_describe,
     srv_tool_close_session, SRV_TASK_FORBIDDEN, NULL},
    {"evict_environment", "Remove a cached environment", srv_tool_evict_environment_describe,
     srv_tool_evict_environment, SRV_TASK_FORBIDDEN, NULL},
};

const srv_tool_t *srv_tools(size_t *count) {
  *count = CM_ARRAY_SIZE(tools);
  return tools;
}

const srv_tool_t *srv_tool_find(const char *name) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(tools); i++)
    if (strcmp(tools[i].name, name) == 0) return &tools[i];
  return NULL;
}
