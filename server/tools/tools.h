/* server/tools/: the built-in tools and their table: execute_python (its arguments become a
 * run spec for server/exec/), check_environment (what a call would get) and validate_script
 * (a script checked without running it), and the script's PEP 723 metadata merged with a
 * call's dependencies (script.c), which execute_python and validate_script share.
 *
 * Files: table.c, execute.c, check_environment.c, validate.c, script.c, sessions.c
 * (list_sessions, close_session), environments.c (evict_environment), runs.c (wait_run,
 * cancel_run: background runs), app.c (execute_python's MCP App).
 *
 * May use: server/exec/, server/core/ (requests, tool results), server/net/, server/files/,
 * server/config/, envstore/, interp/, sandbox/, transport/ (check_environment's HTTP usage),
 * pystd/, common/. */
#ifndef MPS_SERVER_TOOLS_TOOLS_H
#define MPS_SERVER_TOOLS_TOOLS_H

#include <jansson.h>

#include "pystd/pystd.h"
#include "server/core/core.h"

/* The built-in tool table (the server gives it to the router). */
const srv_tool_t *srv_tools(size_t *count);
const srv_tool_t *srv_tool_find(const char *name);
/* execute_python's MCP App (app.c). */
const srv_app_t *srv_tool_app(void);

/* ---------------------------------------------------------------- a call's script */

typedef struct srv_script {
  pep723_metadata_t meta; /* requires_python, the tool table, the block's lines */
  char **requirements;    /* merged block + argument, as written (NULL-terminated) */
  size_t n_requirements;
  pep508_requirement_t **parsed; /* one per requirement */
} srv_script_t;

/* Parses the PEP 723 block, merges `extra` (a JSON array of strings, or NULL) into its
 * dependencies with the seed's rule, and parses every requirement.  Errors are
 * CM_ERR_INVALID/CM_ERR_LIMIT with a message that names the bad part; on failure *out
 * holds nothing (releasing it is harmless). */
int srv_script_prepare(const char *script, size_t len, json_t *extra, srv_script_t *out,
                       cm_error_t *err);
void srv_script_release(srv_script_t *s);

/* Where the server's own files come from (the drop helper, the container init, the start-up
 * runner, the profiles): one "label: path" line each into t (NULL: none), and an object of
 * them into *obj (NULL: none).  --version and check_environment show it. */
void srv_describe_installation(cm_buf_t *t, json_t **obj);

#endif
