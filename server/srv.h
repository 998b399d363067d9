/* server/: configuration, the JSON-RPC/MCP router, the tools, interpreters and jobs.
 * The only layer that turns internal errors into JSON-RPC errors. */
#ifndef MPS_SERVER_SRV_H
#define MPS_SERVER_SRV_H

#include <jansson.h>

#include "common/cm.h"
#include "server/config/config.h"
#include "interp/interp.h"
#include "sandbox/sbx.h"
#include "transport/tr.h"

/* ---------------------------------------------------------------- the server and router */

typedef struct srv_server srv_server_t;
typedef struct srv_session srv_session_t;
typedef struct srv_request srv_request_t;

srv_server_t *srv_server_new(cm_loop_t *loop, srv_config_t *cfg, cm_error_t *err);
void srv_server_free(srv_server_t *s);
cm_loop_t *srv_server_loop(srv_server_t *s);
const srv_config_t *srv_server_config(srv_server_t *s);
/* The sandbox backend.  Starts its probe if it has not started yet (never waits for it):
 * until srv_server_probed(), b->available says nothing. */
sbx_backend_t *srv_server_backend(srv_server_t *s);
/* The same without probing it first (the probe runs a whole sandbox): for what its kind
 * alone tells, such as sbx_backend_can_egress(), where a probe would be premature. */
sbx_backend_t *srv_server_backend_kind(srv_server_t *s);
/* Whether the backend's probe has finished (b->available then holds its outcome). */
bool srv_server_probed(srv_server_t *s);
/* Calls cb(data) once the probe has finished (starting it if need be), never from inside
 * this call.  The handle is for srv_server_cancel_probe_wait until cb has run. */
void *srv_server_when_probed(srv_server_t *s, void (*cb)(void *data), void *data);
void srv_server_cancel_probe_wait(srv_server_t *s, void *wait);
/* The none backend, for trusted host helpers (interpreter probes, syntax checks). */
sbx_backend_t *srv_server_host_backend(srv_server_t *s);
sbx_cgroups_t *srv_server_cgroups(srv_server_t *s);
/* The sandbox prestarted for the next call (server/execute.c). */
typedef struct srv_prestart srv_prestart_t;
srv_prestart_t **srv_server_prestart(srv_server_t *s);
/* Starts keeping one sandbox ready (with --prestart on and a backend that can hold one). */
void srv_prestart_start(srv_server_t *s);
void srv_prestart_free(srv_server_t *s);
/* Whether sandboxes are being prestarted; *taken: calls that ran in one. */
bool srv_prestart_describe(srv_server_t *s, uint64_t *taken);
py_registry_t *srv_server_pythons(srv_server_t *s);
struct env_store;
struct env_store *srv_server_envs(srv_server_t *s);
struct art_store;
struct art_store *srv_server_artifacts(srv_server_t *s);
const char *srv_server_state_dir(srv_server_t *s);
/* This server's own directory for its runs' work directories (see srv_workdir_claim). */
const char *srv_server_runs_dir(srv_server_t *s);
/* The HTTP transport serving s (srv_serve_http sets it), for what check_environment tells
 * a principal about its own sessions and streams; NULL on stdio. */
void srv_server_set_http(srv_server_t *s, tr_http_t *h);
tr_http_t *srv_server_http(srv_server_t *s);
/* Cancels every request in flight (shutdown). */
void srv_server_cancel_all(srv_server_t *s);
size_t srv_server_inflight(srv_server_t *s);

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

/* ---------------------------------------------------------------- requests (for tools) */

srv_server_t *srv_request_server(srv_request_t *r);
srv_session_t *srv_request_session(srv_request_t *r);
bool srv_request_has_progress(const srv_request_t *r);
/* Sends notifications/progress (if the client asked for progress).  progress must grow. */
void srv_request_progress(srv_request_t *r, double progress, const char *message, size_t len);
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
/* Completes the request with a JSON-RPC error, the router's mapping of err (borrowed):
 * CM_ERR_NOT_FOUND of a resources/... request whose params name a "uri" -> -32002
 * "Resource not found" with data {uri}; CM_ERR_INVALID, CM_ERR_LIMIT and other
 * CM_ERR_NOT_FOUND -> -32602; CM_ERR_UNSUPPORTED -> -32601; anything else -> -32603.
 * Nothing is sent if it was cancelled.  The request is freed. */
void srv_request_fail(srv_request_t *r, const cm_error_t *err);

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

/* ---------------------------------------------------------------- tools */

typedef struct srv_tool {
  const char *name;
  const char *title;
  json_t *(*describe)(srv_server_t *s); /* the Tool object for tools/list (new ref) */
  /* Runs the tool; must eventually call srv_request_finish(r, result). */
  void (*call)(srv_request_t *r, json_t *arguments);
} srv_tool_t;

const srv_tool_t *srv_tools(size_t *count);
const srv_tool_t *srv_tool_find(const char *name);

/* A tool result with one text block. isError as given.  _n: len bytes of valid UTF-8,
 * which may hold NULs. */
json_t *srv_tool_text_result(const char *text, bool is_error);
json_t *srv_tool_text_resultn(const char *text, size_t len, bool is_error);
json_t *srv_tool_error_result(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void srv_tool_execute_python(srv_request_t *r, json_t *arguments);
/* A principal's execute_python calls right now (check_environment). */
typedef struct srv_exec_usage {
  size_t calls;   /* from validation to the answer (--max-token-concurrent counts these) */
  size_t running; /* holding a slot, building its environment included (--max-token-running) */
  size_t queued;  /* waiting for a slot */
} srv_exec_usage_t;
void srv_exec_usage(const char *principal, srv_exec_usage_t *out);
/* Another call that runs a process for principal (validate_script's compile or resolution)
 * counts against --max-token-concurrent like an execution, without a slot: false, holding
 * nothing, when the principal is at that cap; else held until srv_exec_release. */
bool srv_exec_hold(const srv_config_t *cfg, const char *principal);
void srv_exec_release(const char *principal);
json_t *srv_tool_execute_python_describe(srv_server_t *s);
void srv_tool_validate_script(srv_request_t *r, json_t *arguments);
json_t *srv_tool_validate_script_describe(srv_server_t *s);

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

/* ---------------------------------------------------------------- the runner */

/* The start-up runner (profiles/runner.py, installed as mps-runner/runner.py next to the
 * binary): $MPS_RUNNER, <bindir>/mps-runner/runner.py,
 * <bindir>/../share/mcp-python-exec-sandbox/runner/runner.py or <bindir>/../profiles/runner.py.
 * Found once; NULL (and a warning, once) when there is none or, for a root server, when
 * it or its directory is writable by anyone but root.  Then scripts run without it. */
const char *files_runner_path(void);
/* The sandbox path of the runner's directory when the backend maps paths. */
#define FILES_RUNNER_TARGET "/opt/mps"

/* ---------------------------------------------------------------- work directories */

/* Mounts a size-capped tmpfs on dir when the server may (root): true if it did.  0 = no. */
bool srv_workdir_mount(const char *dir, uint64_t bytes);
void srv_workdir_unmount(const char *dir);
/* Unmounts and removes what crashed servers left in work_root: the directories of servers
 * that are gone (work/srv-*, see below), and runs and builds older than any can be. */
void srv_workdir_sweep(const char *work_root, uint64_t older_than_s);
/* A directory of this server's own for its runs' work directories (work_root/srv-XXXXXX),
 * locked (flock) for as long as the server lives: however the server ends, the next one to
 * sweep the state directory can tell it is gone and remove it, mounts and all.  Returns it
 * (to free) and the lock's fd, or NULL. */
char *srv_workdir_claim(const char *work_root, int *lock_fd, cm_error_t *err);
/* Unmounts what is left in dir, removes it and drops the lock. */
void srv_workdir_release(const char *dir, int lock_fd);
/* Whether work directories are size-capped here (for check_environment). */
bool srv_workdir_capped(uint64_t bytes);

/* ---------------------------------------------------------------- output formatting */

/* The seed's truncation: at most max bytes of valid UTF-8, with its marker
 * "\n... [truncated at NKB]" when cut.  Ours keeps the tail too (see output.c).  Output
 * is bytes: a NUL is kept like any other byte (JSON carries it as \u0000), and invalid
 * UTF-8 becomes U+FFFD.  _n gives the length of the result (which may hold NULs) and
 * whether anything was cut; the plain form is for texts without NUL. */
char *srv_truncate_output_n(const char *head, size_t head_len, const char *tail, size_t tail_len,
                            uint64_t total, uint64_t max, size_t *out_len, bool *cut);
char *srv_truncate_output(const char *head, size_t head_len, const char *tail, size_t tail_len,
                          uint64_t total, uint64_t max);
char *srv_truncation_marker(uint64_t max);

typedef struct srv_exec_summary {
  const char *stdout_text; /* already truncated */
  const char *stderr_text;
  int exit_code;
  uint64_t duration_ms;
  bool timed_out;
  size_t stdout_len; /* bytes of stdout_text, which may hold NULs; 0 = strlen */
  size_t stderr_len;
} srv_exec_summary_t;

/* The seed's text block: "--- stdout ---\n...\n--- exit_code: N ---\n--- duration_ms: N ---".
 * _n also gives its length (the outputs' NULs are in it). */
char *srv_format_result_n(const srv_exec_summary_t *s, size_t *len);
char *srv_format_result(const srv_exec_summary_t *s);

#endif
