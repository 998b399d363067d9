/* server/core/ internals shared by its files (and the router's unit tests). */
#ifndef MPS_SERVER_CORE_INTERNAL_H
#define MPS_SERVER_CORE_INTERNAL_H

#include "server/core/core.h"

struct probe_wait;
struct srv_client_call;

/* The server (core.h's srv_server_t): its parts (srv_parts_t, the assembly's), and what the
 * core keeps of its own. */
struct srv_server {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  sbx_backend_t *backend;
  sbx_cgroups_t *cgroups;
  struct exec_state *exec; /* server/exec/: jobs, admission, prestarted sandboxes, the runner */
  sbx_backend_t *host;
  py_registry_t *pythons;
  env_store_t *envs;
  struct srv_network *network; /* server/net/net.h */
  art_store_t *artifacts;
  tr_http_t *http;    /* the HTTP transport, if any */
  srv_audit_t *audit; /* --audit-log, or NULL */
  const char *state_dir;
  const char *runs_dir;
  void *owner;                    /* the assembly's (srv_parts_t.owner) */
  bool probed;                    /* the backend's probe has finished */
  sbx_probe_t *probe;             /* in flight */
  struct probe_wait *probe_waits; /* callers waiting for it */
  cm_timer_t *probe_flush;        /* calls the waiters: a timer, so freeing the server cancels it */
  cm_timer_t *probe_timer;
  srv_request_t *inflight;
  size_t n_inflight;
  const struct srv_extension *ext; /* NULL in the product */
  const struct srv_tool *tools;    /* the built-in tool table (server/tools/) */
  size_t n_tools;
  const struct srv_app *app;      /* the MCP App of a tool (server/tools/app.c), or NULL */
  struct srv_recent *recent;      /* recent calls by principal (recent.c) */
  struct srv_client_call *calls;  /* server -> client requests awaiting a response */
  struct srv_tasks *tasks;        /* core/tasks.c: made with the first task */
  struct srv_listener *listeners; /* core/listen.c: subscriptions/listen streams */
  size_t n_listeners;
  srv_counters_t counters; /* for /metrics */
  bool draining;           /* SIGTERM: new tool calls are refused */
  uint64_t session_serial; /* the last session's number (srv_session_new) */
  /* tools/list's tools, built once per era (handshake, 2026-07-28) and MCP Apps or not: the
   * descriptions depend only on the configuration, which does not change while we run. */
  json_t *tools_list[2][2];
};

/* JSON-RPC 2.0 error codes. */
#define JSONRPC_PARSE_ERROR -32700
#define JSONRPC_INVALID_REQUEST -32600
#define JSONRPC_METHOD_NOT_FOUND -32601
#define JSONRPC_INVALID_PARAMS -32602
#define JSONRPC_INTERNAL_ERROR -32603

#define SRV_MAX_JSON_DEPTH 64

/* One parsed message: the transport's classification (tr_jsonrpc_classify, the one copy of
 * the JSON-RPC rules, which the HTTP transport also judges POST bodies with). */
typedef tr_msg_kind_t srv_msg_kind_t;
#define SRV_MSG_INVALID TR_MSG_INVALID
#define SRV_MSG_REQUEST TR_MSG_REQUEST
#define SRV_MSG_NOTIFICATION TR_MSG_NOTIFICATION
#define SRV_MSG_RESPONSE TR_MSG_RESPONSE
typedef tr_msg_t srv_msg_t;

/* Parses one JSON text with the limits (depth, duplicate keys rejected, no trailing
 * data).  On failure returns NULL with a message for a -32700/-32600 error in *why and
 * the code in *code. */
json_t *srv_jsonrpc_parse(const char *buf, size_t len, int *code, char **why);
/* Classifies one element (an object) of a parsed text (tr_jsonrpc_classify). */
void srv_jsonrpc_classify(json_t *msg, srv_msg_t *out);
/* Builders; each returns a new reference.  id and result are borrowed (id keeps its type). */
json_t *srv_jsonrpc_error(json_t *id, int code, const char *message, json_t *data);
json_t *srv_jsonrpc_result(json_t *id, json_t *result);
json_t *srv_jsonrpc_notification(const char *method, json_t *params);
/* Compact one-line serialisation (heap). */
char *srv_jsonrpc_dump(json_t *msg, size_t *len);

/* MCP's "resource not found" (resources/read, protocol versions 2024-11-05 to 2025-11-25). */
#define MCP_RESOURCE_NOT_FOUND -32002
/* The errors of the 2026-07-28 revision (basic/index.mdx). */
#define MCP_HEADER_MISMATCH -32020
#define MCP_MISSING_CAPABILITY -32021
#define MCP_UNSUPPORTED_VERSION -32022

/* The per-request _meta keys of the 2026-07-28 revision. */
#define MCP_META_PROTOCOL "io.modelcontextprotocol/protocolVersion"
#define MCP_META_CLIENT_CAPS "io.modelcontextprotocol/clientCapabilities"
#define MCP_META_CLIENT_INFO "io.modelcontextprotocol/clientInfo"
#define MCP_META_LOG_LEVEL "io.modelcontextprotocol/logLevel"
#define MCP_META_SERVER_INFO "io.modelcontextprotocol/serverInfo"

/* What the envelope of a modern (2026-07-28) request told (router.c): borrowed from it. */
typedef struct srv_modern {
  const char *version;
  json_t *client_caps;
  int log_level; /* index into the MCP log levels; -1 = none asked: no notifications/message */
} srv_modern_t;

/* Adds what every modern result carries (R4): resultType "complete" unless the handler
 * set one, and the server's identity in _meta. */
void srv_modern_decorate(json_t *result);
/* R5: the caching hints (SEP-2549) a modern result of method must carry, ttlMs and
 * cacheScope, unless its handler set them: what this server lists depends on its
 * configuration or on the caller (its artifacts), so "private". */
void srv_modern_cache_hints(json_t *result, const char *method, json_int_t ttl_ms);

/* A batch is one message whose answers are built in memory before any is sent (router.c
 * bounds it; request.c fills its slots). */
typedef struct srv_batch {
  tr_sink_t *sink;
  json_t *responses; /* array; a slot per element that gets an answer (json null until then) */
  size_t pending;
  size_t bytes;     /* of the answers so far, as sent (compact JSON) */
  size_t max_bytes; /* --max-message-bytes: the answer is one message too */
} srv_batch_t;

struct srv_session {
  srv_server_t *server;
  tr_sink_t *sink;
  char *principal; /* who owns it (core.h) */
  char *protocol;  /* negotiated version; NULL before initialize */
  bool ready;      /* notifications/initialized received */
  int log_level;   /* index into mcp_log_levels; -1 = not set: no log notifications */
  json_t *client_info;
  json_t *client_capabilities; /* from initialize; NULL if none were sent */
  uint64_t next_call;          /* numbers the ids of our requests to the client */
  /* The stdio process pinned to the 2026-07-28 revision (router.c, "eras"): requests
   * without its _meta are modern requests that lack it, and initialize is gone. */
  bool modern;
  /* Made for one stateless request (an HTTP POST of the 2026-07-28 revision): freed with
   * that request, or right after dispatch when no request took it (owned). */
  bool ephemeral;
  bool owned;
  int refs;        /* an ephemeral session's: the router's during dispatch, its request's */
  uint64_t serial; /* numbers the server's sessions (the audit log names them so) */
};

struct srv_task;
typedef struct srv_listener srv_listener_t;

struct srv_request {
  srv_server_t *server;
  srv_session_t *session;
  json_t *id;
  tr_sink_t *sink;
  json_t *progress_token;
  srv_batch_t *batch;
  size_t batch_slot;
  bool cancelled;
  void (*cancel_cb)(void *data);
  void *cancel_data;
  double last_progress;
  /* A tool call with a progress token: a heartbeat after every SRV_HEARTBEAT_MS without
   * progress (srv_request_start_heartbeat). */
  cm_timer_t *heartbeat;
  uint64_t last_progress_ms;
  char *method; /* a request taken by the extension: its method and params */
  json_t *params;
  /* A request of the 2026-07-28 revision: its results carry resultType and serverInfo,
   * its log level is its own (_meta's logLevel, -1 = none), it asks the client nothing. */
  bool modern;
  int log_level;
  bool own_session; /* its session is ephemeral and goes with it */
  bool done;        /* answered (or dropped); freed once nothing on the stack uses it */
  /* The run of a task (tasks.c): its answer goes to the task, not to a client, it is no
   * request of its session's that an id names, and its session's end does not cancel it. */
  struct srv_task *task;
  int busy; /* callbacks running on it: srv_request_finish then only marks it done */
  /* A tool call (srv_request_audit_begin): counted in /metrics and, with an audit log,
   * written as a line (audit) when it is answered. */
  int call_tool;  /* SRV_M_TOOL_*, or -1: not a tool call */
  int call_limit; /* SRV_M_LIMIT_*, or -1 */
  json_t *audit;  /* the audit line, or NULL */
  uint64_t call_start_ms;
  char *
      call_principal; /* the caller's, kept for the call's end: a task's run may lose its session */
  srv_request_t *prev, *next;
};

/* What a session holds, freed (srv_session_free first cancels its requests; an ephemeral
 * session has none left when its last reference goes).  Inline, so that request.c, which
 * frees ephemeral sessions, and session.c, which cancels requests, do not call each other. */
static inline void srv_session_destroy(srv_session_t *ss) {
  tr_sink_unref(ss->sink);
  free(ss->principal);
  free(ss->protocol);
  json_decref(ss->client_info);
  json_decref(ss->client_capabilities);
  free(ss);
}

/* Drops a reference to an ephemeral session (freed with the last, which comes after its
 * request left the requests in flight). */
static inline void srv_session_release(srv_session_t *ss) {
  if (--ss->refs == 0) srv_session_destroy(ss);
}

/* ---------------------------------------------------------------- tasks.c
 *
 * Tasks (2025-11-25 utilities/tasks, and the 2026-07-28 tasks extension): a tools/call
 * answered at once with a task, its run going on as a request of its own that no client
 * waits for; the store keeps each task for its principal until its TTL. */

#define SRV_TASKS_EXTENSION "io.modelcontextprotocol/tasks"

/* Whether a modern request's clientCapabilities declare the tasks extension. */
bool srv_tasks_declared(const srv_modern_t *mm);
/* -32021 naming the tasks extension in data.requiredCapabilities. */
void srv_tasks_reply_missing(tr_sink_t *sink, json_t *id, const char *what);
/* The tasks capability (2025-11-25): list, cancel and tools/call. */
json_t *srv_tasks_capability(void);
/* Whether principal may have one more task (--max-tasks-per-principal). */
bool srv_tasks_room(srv_server_t *s, const char *principal);
/* Whether a tools/call's params ask for a task (a "task" member). */
bool srv_tasks_requested(json_t *params);
/* Starts tool's call (arguments borrowed) as a task of ss's principal and answers the
 * request (id) with its CreateTaskResult, or with an error (the principal's cap, a bad
 * "task").  params are the call's (its progressToken is the run's).  mm: a modern request
 * (the tasks extension's flat CreateTaskResult; the run on a session of its own). */
void srv_task_call(srv_session_t *ss, const srv_tool_t *tool, json_t *id, json_t *params,
                   json_t *arguments, tr_sink_t *sink, srv_batch_t *batch, const srv_modern_t *mm);
/* tasks/get, tasks/result, tasks/list, tasks/cancel (the modern era: the extension's
 * tasks/get, tasks/cancel, tasks/update); false (nothing sent) for another method. */
bool srv_tasks_handle(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink, srv_batch_t *batch,
                      const srv_modern_t *mm);
/* The modern era's DetailedTask of principal's task id (what tasks/get answers), or NULL
 * when principal has no such task (another's answers the same as an unknown one). */
json_t *srv_tasks_detailed(srv_server_t *s, const char *principal, const char *id);
/* A task's run (r->task) ended: its response (borrowed; NULL when cancelled) goes to the
 * task, not to a client (srv_request_complete). */
void srv_task_run_ended(srv_request_t *r, json_t *response);
/* A background run's progress text is kept for wait_run (true), not sent. */
bool srv_task_capture(struct srv_task *t, const char *text, size_t len);
/* ss ends (srv_session_free): its tasks go on without it, their runs detached first. */
void srv_tasks_session_gone(srv_session_t *ss);
/* srv_request_call_client of a task's run (r->task) in the modern era: the question waits in
 * the task's inputRequests for tasks/update. */
int srv_task_ask(srv_request_t *r, const char *method, json_t *params, srv_client_cb cb, void *data,
                 cm_error_t *err);
/* Such a run is cancelled: its questions' callbacks get an error first. */
void srv_task_asks_fail(srv_request_t *r);

/* ---------------------------------------------------------------- listen.c */

/* subscriptions/listen (a modern request; params borrowed): acknowledges the part of its
 * filter that capabilities (the modern era's, borrowed) can honour, and keeps the request
 * open as a listener of ss's principal until it is cancelled or srv_listen_end_all; a
 * malformed filter or a principal at its cap is answered with an error. */
void srv_listen_start(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                      const srv_modern_t *mm, json_t *capabilities);
/* A task of principal changed its status (or its questions): detailed, its DetailedTask
 * (borrowed), goes as notifications/tasks to the listen streams of that principal that
 * watch task_id. */
void srv_listen_task_changed(srv_server_t *s, const char *principal, const char *task_id,
                             json_t *detailed);

/* ---------------------------------------------------------------- request.c */

/* Sends msg (borrowed), compact, on sink. */
void srv_send_json(tr_sink_t *sink, json_t *msg, tr_send_flags_t flags);
/* A batch's slots: reserve one per answer, deliver into it (or straight to the sink when
 * batch is NULL; an error in its place when it does not fit), release the hold. */
size_t srv_batch_reserve(srv_batch_t *batch);
void srv_deliver(tr_sink_t *sink, srv_batch_t *batch, size_t slot, json_t *response);
void srv_batch_release(srv_batch_t *batch);
bool srv_batch_full(const srv_batch_t *batch);
json_t *srv_batch_full_error(const srv_batch_t *batch, json_t *id);
void srv_reply_error(tr_sink_t *sink, srv_batch_t *batch, json_t *id, int code,
                     const char *message);
/* result is stolen. */
void srv_reply_result(tr_sink_t *sink, srv_batch_t *batch, json_t *id, json_t *result);
/* An index into the MCP log levels, or -1. */
int srv_log_level_index(const char *level);
/* A request in flight (its batch slot reserved).  mm: a modern request's envelope (NULL for
 * the handshake era).  A request on an ephemeral session owns it. */
srv_request_t *srv_request_new(srv_session_t *ss, json_t *id, tr_sink_t *sink, srv_batch_t *batch,
                               const srv_modern_t *mm);
/* Sends response (stolen; NULL for none) unless r was cancelled, and retires r. */
void srv_request_complete(srv_request_t *r, json_t *response);
/* The request of ss with this id still in flight, or NULL. */
srv_request_t *srv_request_find(srv_session_t *ss, json_t *id);
/* Cancels r (its client calls fail first, then its cancel callback runs). */
void srv_request_cancel_one(srv_request_t *r);
/* r is a call of tool (the task's id, or NULL): its answer is counted for /metrics and, with
 * an audit log, writes a line (principal, tool, outcome, duration and what the tool added;
 * from: the sink of the text that asked for it, whose sender the line names). */
void srv_request_audit_begin(srv_request_t *r, const char *tool, const char *task_id,
                             const tr_sink_t *from);
/* A params._meta.progressToken makes r report progress. */
void srv_request_set_progress_token(srv_request_t *r, json_t *params);
/* A tools/call with a progress token hears a heartbeat (srv_request_heartbeat) when its run
 * said nothing for SRV_HEARTBEAT_MS, until it is answered. */
#define SRV_HEARTBEAT_MS 10000
void srv_request_start_heartbeat(srv_request_t *r);
void srv_request_stop_heartbeat(srv_request_t *r);
/* A response from the client: to one of our requests, or ignored. */
void srv_client_response(srv_session_t *ss, json_t *msg, const srv_msg_t *m);

#endif
