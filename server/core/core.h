/* server/core/: what every part of the server shares.  The server's parts (srv_server_t,
 * assembled by server/server.c), the sandbox backend's probe, sessions, requests (what a
 * tool answers through: results, progress, log messages, cancellation, requests to the
 * client), the tool interface, and the router, which dispatches to the tool table and the
 * extension it is given, so that it knows the interface of tools but not the tools.
 *
 * Files: parts.c (the server's parts: srv_core_new, the accessors), probe.c, session.c,
 * request.c (requests in flight, batches, client calls),
 * router.c (envelope, lifecycle, methods), jsonrpc.c (the JSON-RPC envelope), result.c (tool
 * results), tasks.c (the task store and the tasks/ methods).
 *
 * The only room that turns internal errors into JSON-RPC errors (srv_request_fail).
 *
 * May use: server/files/ (resources/ are artifacts), server/audit/, server/config/, envstore/,
 * interp/, sandbox/, transport/, pystd/, common/. */
#ifndef MPS_SERVER_CORE_CORE_H
#define MPS_SERVER_CORE_CORE_H

#include <jansson.h>

#include "common/cm.h"
#include "envstore/envstore.h"
#include "interp/interp.h"
#include "sandbox/sbx.h"
#include "server/audit/audit.h"
#include "server/config/config.h"
#include "server/files/files.h"
#include "transport/tr.h"

/* A JSON value owned by a scope: released when the scope ends, unless taken with
 * steal_pointer(). */
static inline void srv_cleanup_jsonp(json_t **j) {
  json_decref(*j);
  *j = NULL;
}
#define cleanup_json __attribute__((cleanup(srv_cleanup_jsonp)))

/* ---------------------------------------------------------------- the server's parts */

typedef struct srv_server srv_server_t;
typedef struct srv_session srv_session_t;
typedef struct srv_request srv_request_t;
struct exec_state;  /* server/exec/exec.h */
struct srv_network; /* server/net/net.h */

/* What /metrics counts (server/metrics.c renders it): fixed label sets only, so that no
 * caller can grow them (a tool name the server does not have is "other"). */
enum { SRV_M_TOOL_EXECUTE, SRV_M_TOOL_CHECK, SRV_M_TOOL_VALIDATE, SRV_M_TOOL_OTHER, SRV_M_TOOLS };
enum { SRV_M_OK, SRV_M_TOOL_ERROR, SRV_M_LIMIT, SRV_M_ERROR, SRV_M_CANCELLED, SRV_M_OUTCOMES };
enum {
  SRV_M_LIMIT_TIMEOUT,
  SRV_M_LIMIT_MEMORY,
  SRV_M_LIMIT_CPU,
  SRV_M_LIMIT_FILE_SIZE,
  SRV_M_LIMIT_PROCESSES,
  SRV_M_LIMITS
};
#define SRV_M_BUCKETS 14 /* seconds: 0.01 ... 300, then +Inf */
typedef struct srv_counters {
  uint64_t calls[SRV_M_TOOLS][SRV_M_OUTCOMES];
  uint64_t duration_buckets[SRV_M_TOOLS][SRV_M_BUCKETS + 1]; /* not cumulative; last is +Inf */
  uint64_t duration_ms_sum[SRV_M_TOOLS];
  uint64_t limits[SRV_M_LIMITS]; /* runs stopped by each limit */
  uint64_t started_ms;           /* the server's start (wall clock) */
} srv_counters_t;
extern const double srv_metric_buckets[SRV_M_BUCKETS];
extern const char *const srv_metric_tools[SRV_M_TOOLS];
extern const char *const srv_metric_outcomes[SRV_M_OUTCOMES];
extern const char *const srv_metric_limits[SRV_M_LIMITS];

/* The parts of a server, made by its assembly (server/server.c) before the server itself:
 * borrowed (the assembly frees them as it takes the server apart, srv_core_free last).  The
 * exec state and the HTTP transport, made later, are set with their setters below. */
typedef struct srv_parts {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  sbx_backend_t *backend; /* the sandbox backend, probed later (srv_probe_schedule) */
  sbx_backend_t *host;    /* "none", for what runs on the host */
  sbx_cgroups_t *cgroups;
  py_registry_t *pythons;
  env_store_t *envs;
  struct srv_network *network; /* server/net/net.h */
  art_store_t *artifacts;
  srv_audit_t *audit; /* --audit-log, or NULL */
  const char *state_dir;
  const char *runs_dir;         /* work/srv-XXXXXX, locked while the server lives */
  const struct srv_tool *tools; /* the built-in tool table (server/tools/) */
  size_t n_tools;
  const struct srv_app *app; /* the MCP App of a tool (server/tools/app.c), or NULL */
  /* The assembly's own state, opaque to the core: srv_server_owner() gives it back. */
  void *owner;
} srv_parts_t;

/* A server of these parts (copied), its start time now.  Nothing starts: the assembly
 * schedules the probe (srv_probe_schedule) once the server is whole. */
srv_server_t *srv_core_new(const srv_parts_t *parts);
/* Frees what the core holds of its own (the parts are the assembly's; srv_probe_release,
 * srv_tasks_free and srv_recent_free come first, in the assembly's order). */
void srv_core_free(srv_server_t *s);

cm_loop_t *srv_server_loop(srv_server_t *s);
const srv_config_t *srv_server_config(srv_server_t *s);
sbx_backend_t *srv_server_backend_kind(srv_server_t *s);
sbx_backend_t *srv_server_host_backend(srv_server_t *s);
sbx_cgroups_t *srv_server_cgroups(srv_server_t *s);
py_registry_t *srv_server_pythons(srv_server_t *s);
env_store_t *srv_server_envs(srv_server_t *s);
art_store_t *srv_server_artifacts(srv_server_t *s);
struct srv_network *srv_server_network(srv_server_t *s);
const char *srv_server_state_dir(srv_server_t *s);
/* This server's own directory for its runs' work directories (see srv_workdir_claim). */
const char *srv_server_runs_dir(srv_server_t *s);
/* The audit log (--audit-log), or NULL. */
srv_audit_t *srv_server_audit(srv_server_t *s);
/* What /metrics counts (read-only: the router counts). */
const srv_counters_t *srv_server_counters(srv_server_t *s);
/* srv_parts_t.owner. */
void *srv_server_owner(srv_server_t *s);
/* server/exec/'s state (jobs, admission, prestarted sandboxes, the runner): made by the
 * assembly once the server exists (it needs the server), and unset before it is freed. */
void srv_server_set_exec(srv_server_t *s, struct exec_state *x);
struct exec_state *srv_server_exec(srv_server_t *s);
/* The HTTP transport serving s (srv_serve_http sets it), for what check_environment tells
 * a principal about its own sessions and streams; NULL on stdio. */
void srv_server_set_http(srv_server_t *s, tr_http_t *h);
tr_http_t *srv_server_http(srv_server_t *s);
/* SIGTERM's drain, the core's part: new tool calls are refused (a tool error saying so), a
 * new listen stream ends at once, and those open end now (srv_listen_end_all). */
void srv_core_drain(srv_server_t *s);

/* ---------------------------------------------------------------- the backend's probe */

/* The sandbox backend.  Starts its probe if it has not started yet (never waits for it):
 * until srv_server_probed(), b->available says nothing.  srv_server_backend_kind() is the
 * same without probing it first (the probe runs a whole sandbox): for what its kind alone
 * tells, such as sbx_backend_can_egress(), where a probe would be premature. */
sbx_backend_t *srv_server_backend(srv_server_t *s);
/* Whether the backend's probe has finished (b->available then holds its outcome). */
bool srv_server_probed(srv_server_t *s);
/* Calls cb(data) once the probe has finished (starting it if need be), never from inside
 * this call.  The handle is for srv_server_cancel_probe_wait until cb has run.  Waiters run
 * in the order they came; whether the backend is available is theirs to check. */
void *srv_server_when_probed(srv_server_t *s, void (*cb)(void *data), void *data);
/* The same without starting the probe: cb waits for whatever starts it (srv_probe_schedule's
 * delay, or a call that needs the backend).  The assembly's own waiter (server/server.c:
 * the environment store and the prestarted sandboxes start after a probe that passed),
 * registered before any call's, so it runs first. */
void *srv_server_after_probe(srv_server_t *s, void (*cb)(void *data), void *data);
void srv_server_cancel_probe_wait(srv_server_t *s, void *wait);
/* Probes the backend SRV_PROBE_DELAY_MS after start-up, once the handshake had its chance
 * (or at the first call that needs it, whichever comes first): it runs a whole trivial
 * sandbox.  Then the waiters run. */
void srv_probe_schedule(srv_server_t *s);
/* Cancels the probe and forgets its waiters (freeing the server). */
void srv_probe_release(srv_server_t *s);

/* ---------------------------------------------------------------- sessions */

/* Cancels every request in flight (shutdown), and counts them. */
void srv_server_cancel_all(srv_server_t *s);
size_t srv_server_inflight(srv_server_t *s);
/* Of those, the tool calls (task runs included): what the drain waits for. */
size_t srv_server_calls(srv_server_t *s);

/* A session: the stdio connection, or one Mcp-Session-Id.  `sink` is where messages not
 * tied to a request go (stdout, or the standalone GET stream). */
srv_session_t *srv_session_new(srv_server_t *s, tr_sink_t *sink);
void srv_session_free(srv_session_t *ss);
/* Who opened the session, and owns what it makes (runs, artifacts): over HTTP the name of
 * its bearer token ("local" without tokens), "stdio" for the stdio client (the default). */
#define SRV_PRINCIPAL_STDIO "stdio"
void srv_session_set_principal(srv_session_t *ss, const char *principal);
/* Never NULL for a session; NULL for NULL. */
const char *srv_session_principal(const srv_session_t *ss);
/* The negotiated protocol version; NULL before initialize. */
const char *srv_session_protocol(const srv_session_t *ss);
/* Handles one complete JSON text; answers go to reply. */
void srv_session_handle(srv_session_t *ss, const char *buf, size_t len, tr_sink_t *reply);
/* A text that was too large to read. */
void srv_session_oversize(srv_session_t *ss, size_t len, tr_sink_t *reply);
/* One complete JSON text of a stateless (2026-07-28) HTTP POST, for principal: served on a
 * session of its own that lives as long as its request (nothing of it stays), every
 * request in it modern, whether or not its _meta says so (the transport decided, from
 * the _meta claim or the MCP-Protocol-Version header of a POST without a session). */
void srv_server_handle_stateless(srv_server_t *s, const char *principal, const char *buf,
                                 size_t len, tr_sink_t *reply);
/* The tools/call arguments that tools mirror into headers (2026-07-28, SEP-2243): from the
 * tool descriptions as tools/list gives them (the table's and the extension's), every
 * top-level inputSchema property with "x-mcp-header": a token name (letters, digits, '-';
 * others are ignored), as a new array of {"tool", "property", "header"} objects.  For the
 * HTTP transport's Mcp-Param-* check (tr_http_options_t.param_headers), computed once when
 * it starts: set the extension first. */
json_t *srv_server_param_headers(srv_server_t *s);

/* ---------------------------------------------------------------- requests (for tools) */

srv_server_t *srv_request_server(srv_request_t *r);
srv_session_t *srv_request_session(srv_request_t *r);
bool srv_request_has_progress(const srv_request_t *r);
/* Sends notifications/progress (if the client asked for progress).  progress must grow.
 * meta (stolen, or NULL) becomes the notification's _meta. */
void srv_request_progress(srv_request_t *r, double progress, const char *message, size_t len,
                          json_t *meta);
/* Would notifications/message at this level reach the client (it enabled logging)? */
bool srv_request_log_enabled(const srv_request_t *r, const char *level);
/* Sends notifications/message if the session's log level admits it. */
void srv_request_log(srv_request_t *r, const char *level, const char *logger, json_t *data);
/* Completes the request with a result (stolen).  Nothing is sent if it was cancelled.
 * The request is freed. */
void srv_request_finish(srv_request_t *r, json_t *result);
/* Registers what to do on notifications/cancelled.  After cancel_cb runs the tool must
 * still call srv_request_finish (its result is dropped). */
void srv_request_on_cancel(srv_request_t *r, void (*cancel_cb)(void *data), void *data);
bool srv_request_cancelled(const srv_request_t *r);
/* Adds key = value (stolen) to the audit line of r's tool call (--audit-log): what the tool
 * knows of the call (the script's digest, the run's exit code and limits, ...).  Nothing
 * when there is no audit log or r is not a tool call. */
void srv_request_audit(srv_request_t *r, const char *key, json_t *value);
/* The run of r's call was stopped by a limit: "timeout", "memory", "cpu", "file_size" or
 * "processes" (its outcome is then "limit", in the audit line and in /metrics). */
void srv_request_note_limit(srv_request_t *r, const char *limit);
/* Completes the request with a JSON-RPC error, the router's mapping of err (borrowed):
 * CM_ERR_NOT_FOUND of a resources/... request whose params name a "uri" -> -32002
 * "Resource not found" with data {uri}; CM_ERR_INVALID, CM_ERR_LIMIT and other
 * CM_ERR_NOT_FOUND -> -32602; CM_ERR_UNSUPPORTED -> -32601; anything else -> -32603.
 * Nothing is sent if it was cancelled.  The request is freed. */
void srv_request_fail(srv_request_t *r, const cm_error_t *err);

/* Completes the request with a JSON-RPC error of the protocol's own code and data (stolen;
 * NULL for none), such as -32021 with data.requiredCapabilities: what srv_request_fail's
 * mapping of error kinds cannot say.  The HTTP transport answers the modern era's -32020,
 * -32021, -32022 and -32602 with status 400.  Nothing is sent if r was cancelled.  The
 * request is freed. */
void srv_request_fail_rpc(srv_request_t *r, int code, const char *message, json_t *data);
/* The whole params of r (borrowed; NULL when absent): inputResponses, requestState and _meta
 * of a multi-round-trip call (2026-07-28), which a tool's arguments do not carry.  Set for
 * an extension's tools/call and for requests an extension takes (the built-in tools' are
 * not kept). */
json_t *srv_request_params(const srv_request_t *r);

/* Server -> client requests (sampling/createMessage, elicitation/create, roots/list,
 * ping).  cb gets exactly one of result (the response's "result") and error (a JSON-RPC
 * error object {code, message, data?}), both borrowed for the duration of the call; it
 * may finish the request. */
typedef void (*srv_client_cb)(void *data, json_t *result, json_t *error);
/* Sends `method` with params (stolen; NULL for none) to the client as a request with a
 * fresh id ("mps-<n>", unique in the session) on r's own sink, so over HTTP it travels on
 * r's SSE stream, and routes the client's response to cb.  If r is cancelled or its
 * session closes first, cb gets an error (-32603) before r's cancel callback (which is
 * skipped if cb finished r), and the client gets notifications/cancelled; if r finishes
 * first, the call is abandoned
 * (cb is not called, the client is told, a late response is ignored).
 * Fails without sending (cb never called): CM_ERR_UNSUPPORTED when the method needs a
 * client capability (sampling, elicitation, roots) the client did not declare at
 * initialize; CM_ERR_UNAVAILABLE when r is cancelled, finished or has no session, or
 * (for all but ping) before the client's notifications/initialized;
 * CM_ERR_LIMIT when the session already has 64 requests to its client pending. */
int srv_request_call_client(srv_request_t *r, const char *method, json_t *params, srv_client_cb cb,
                            void *data, cm_error_t *err);
/* Ends the client's current connection to r's stream while r goes on; what r sends later
 * waits for the client to resume (tr_sink_close_stream: HTTP SSE polling, SEP-1699). */
void srv_request_close_stream(srv_request_t *r);

/* A json string from arbitrary bytes: invalid UTF-8 is replaced by U+FFFD. */
json_t *srv_json_string_lossy(const char *buf, size_t len);

/* MCP protocol versions of the handshake era (initialize) we speak, newest first. */
extern const char *const srv_protocol_versions[];
extern const size_t srv_protocol_versions_count;
bool srv_protocol_supported(const char *v);
/* Revisions of the stateless era (per-request _meta, server/discover) we speak. */
extern const char *const srv_modern_versions[];
extern const size_t srv_modern_versions_count;
bool srv_modern_supported(const char *v);

/* ---------------------------------------------------------------- the tool interface */

/* Whether a tools/call of a tool may run as a task (2025-11-25 Tool.execution.taskSupport,
 * and the 2026-07-28 tasks extension): the router decides from this, and lists it. */
typedef enum srv_task_support {
  SRV_TASK_FORBIDDEN = 0, /* the default: never a task (nothing is listed) */
  SRV_TASK_OPTIONAL,
  SRV_TASK_REQUIRED,
} srv_task_support_t;

/* A tool: the router lists and calls the table server/tools/ gives it (srv_tools()) and
 * the extension's. */
typedef struct srv_tool {
  const char *name;
  const char *title;
  json_t *(*describe)(srv_server_t *s); /* the Tool object for tools/list (new ref) */
  /* Runs the tool; must eventually call srv_request_finish(r, result).  For a task, r is
   * the task's own request, detached from the call's (core/tasks.c): the tool cannot tell. */
  void (*call)(srv_request_t *r, json_t *arguments);
  /* Set: the router adds execution.taskSupport to the Tool object describe gives. */
  srv_task_support_t task_support;
  /* Optional, for an optional task support: whether a call with these arguments is long
   * enough to become a task of its own accord (the 2026-07-28 tasks extension, where the
   * server decides: only for a client that declared the extension). */
  bool (*prefers_task)(srv_server_t *s, json_t *arguments);
} srv_tool_t;

/* A tool result with one text block. isError as given.  _n: len bytes of valid UTF-8,
 * which may hold NULs.  (Here, with the tool interface, because tools, the execution of a
 * run and extensions all answer with them: server/core/result.c.) */
json_t *srv_tool_text_result(const char *text, bool is_error);
json_t *srv_tool_text_resultn(const char *text, size_t len, bool is_error);
json_t *srv_tool_error_result(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- recent calls */

/* Each principal's last calls of execute_python and validate_script (the calls that run
 * something; check_environment and the session tools, which a page polls, would crowd them
 * out), as their audit lines tell them: recent.c. */
#define SRV_RECENT_PER_PRINCIPAL 20
#define SRV_RECENT_PRINCIPALS 64
typedef struct srv_recent srv_recent_t;
/* tool, outcome, limit: static strings (srv_metric_tools/_outcomes/_limits; limit NULL: none). */
void srv_recent_note(srv_server_t *s, const char *principal, const char *tool, const char *outcome,
                     const char *limit, uint64_t duration_ms);
/* The principal's, newest first: [{time (UTC, RFC 3339), tool, outcome, duration_ms, limit?}]. */
json_t *srv_recent_json(srv_server_t *s, const char *principal);
void srv_recent_free(srv_server_t *s);

/* ---------------------------------------------------------------- MCP Apps */

/* The io.modelcontextprotocol/ui extension (MCP Apps, @modelcontextprotocol/ext-apps 2.x): a
 * ui:// resource of type text/html;profile=mcp-app that a host renders for the calls of one
 * tool.  Declared only to a client that advertises the extension (its
 * capabilities.extensions, with our MIME type among its mimeTypes when it lists them): the
 * tool's _meta.ui.resourceUri in tools/list, the resource in resources/list and the
 * extension in the server's capabilities.  resources/read serves it to anyone (reading a
 * URI is no declaration); a call's result is the same for every client. */
#define SRV_UI_EXTENSION "io.modelcontextprotocol/ui"
#define SRV_APP_MIME "text/html;profile=mcp-app"

typedef struct srv_app {
  const char *uri;  /* ui://... */
  const char *name; /* resources/list's name and title */
  const char *title;
  const char *description;
  const char *tool; /* the tool whose calls it shows */
  const char *html; /* UTF-8 */
  size_t len;
} srv_app_t;

/* ---------------------------------------------------------------- extensions */

/* What an embedding program adds to the router: the conformance fixture server
 * (tests/conformance/fixture.c) uses it; the product binary sets none. */
typedef struct srv_extension {
  /* More tools: listed by tools/list after the built-in ones; tools/call finds one when
   * no built-in tool has the name. */
  const srv_tool_t *tools;
  size_t n_tools;
  /* Capabilities merged into initialize's result: each top-level key replaces the
   * built-in one (e.g. "resources"), or adds one ("prompts", "completions").  Returns a
   * new reference (an object) or NULL. */
  json_t *(*capabilities)(void *data);
  /* Offered every request of an initialized session before the router's own methods
   * (tools/..., logging/setLevel, resources/...; only ping, initialize and the envelope
   * checks come first).  Returns false, without touching r, for a method it does not
   * handle; true when it takes r, which it must then complete, at once or later, with
   * srv_request_finish or srv_request_fail.  params is borrowed (NULL when absent); a
   * params._meta.progressToken is honoured as for tools/call. */
  bool (*handle)(void *data, srv_request_t *r, const char *method, json_t *params);
  void *data;
} srv_extension_t;

/* Installs ext (not copied: it must outlive s), or removes it (NULL).  Set it before the
 * first session opens. */
void srv_server_set_extension(srv_server_t *s, const srv_extension_t *ext);

/* ---------------------------------------------------------------- subscriptions/listen */

/* What a listen stream (2026-07-28) may carry besides resources/updated: one bit each. */
enum {
  SRV_LISTEN_TOOLS = 1,     /* notifications/tools/list_changed */
  SRV_LISTEN_PROMPTS = 2,   /* notifications/prompts/list_changed */
  SRV_LISTEN_RESOURCES = 4, /* notifications/resources/list_changed */
};
/* Sends the list-changed notification of kind (one SRV_LISTEN_* bit) on every listen stream
 * that agreed to it: principal's only, or everyone's (NULL) for what is the same for all. */
void srv_listen_list_changed(srv_server_t *s, unsigned kind, const char *principal);
/* notifications/resources/updated {uri} on the listen streams subscribed to uri (principal's
 * only, or everyone's: NULL). */
void srv_listen_resource_updated(srv_server_t *s, const char *uri, const char *principal);
/* Ends every listen stream with its result (the server drains or stops). */
void srv_listen_end_all(srv_server_t *s);

/* ---------------------------------------------------------------- tasks */

/* A modern request in flight (an extension's, e.g. a multi-round-trip call that has its
 * input) becomes a task of its principal's: its client gets the CreateTaskResult now, and
 * what r finishes with later is the task's result.  False (nothing changes) when it cannot:
 * not a modern request, already a task, or the principal has no room for another. */
bool srv_request_promote_task(srv_request_t *r);

/* Background runs (execute_python's background: true; wait_run, cancel_run): a run is a task
 * of its principal's (bounded by --max-tasks-per-principal, kept for --max-task-ttl, its
 * process tree killed at the TTL), outside the tasks protocol.
 *
 * srv_request_background: r, a tools/call in flight, answers its client now with the run's
 * id and goes on as the run, detached from its session and stream (the client may go); what
 * it finishes with later is the run's result.  False when it cannot: r is already a task or
 * in a batch (*refusal NULL: run it plainly), or the principal has no room (*refusal: the
 * tool error to answer).
 * srv_run_wait: r (wait_run) answers the run's result once it has ended, or, after timeout_ms,
 * "still running" with the output since the last answer; its progress token gets a heartbeat
 * while it waits.  Another principal's run is unknown.
 * srv_run_cancel: r (cancel_run) ends the run (its process tree killed); a later wait_run
 * answers that it was cancelled. */
bool srv_request_background(srv_request_t *r, json_t **refusal);
void srv_run_wait(srv_request_t *r, const char *run_id, uint64_t timeout_ms);
void srv_run_cancel(srv_request_t *r, const char *run_id);
/* A progress notification that says only "still working" (the progress value barely grows),
 * when r has a progress token: clients that reset their timeout on progress keep waiting. */
void srv_request_heartbeat(srv_request_t *r);

/* Forgets every task (freeing the server, after every request ended). */
void srv_tasks_free(srv_server_t *s);
/* Cancels the live tasks and background runs (their scripts killed) of every principal
 * revoked(ctx, principal) names: a token removed from the token file leaves nothing running. */
void srv_tasks_stop_revoked(srv_server_t *s, bool (*revoked)(void *ctx, const char *principal),
                            void *ctx);

#endif
