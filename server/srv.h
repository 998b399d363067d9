/* server/: configuration, the JSON-RPC/MCP router, the tools, interpreters and jobs.
 * The only layer that turns internal errors into JSON-RPC errors. */
#ifndef MPS_SERVER_SRV_H
#define MPS_SERVER_SRV_H

#include <jansson.h>

#include "common/cm.h"
#include "server/config/config.h"
#include "server/core/core.h"
#include "interp/interp.h"
#include "sandbox/sbx.h"
#include "server/exec/exec.h"
#include "transport/tr.h"

/* ---------------------------------------------------------------- tools */


const srv_tool_t *srv_tools(size_t *count);
const srv_tool_t *srv_tool_find(const char *name);

void srv_tool_execute_python(srv_request_t *r, json_t *arguments);
json_t *srv_tool_execute_python_describe(srv_server_t *s);
void srv_tool_validate_script(srv_request_t *r, json_t *arguments);
json_t *srv_tool_validate_script_describe(srv_server_t *s);

#endif
