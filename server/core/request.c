/* Requests in flight: their replies (straight, or into a batch), progress, log messages,
 * cancellation, and the server's own requests to the client. */
#include <stdio.h>

#include "server/core/core-internal.h"

static const char *const mcp_log_levels[] = {"debug", "info",     "notice", "warning",
                                             "error", "critical", "alert",  "emergency"};
static void request_free(srv_request_t *r);

static void fail_client_calls(srv_request_t *r, const char *why);

static void abandon_client_calls(srv_request_t *r);

static void request_peer_gone(void *data) {
  srv_request_t *r = data;
  cm_debug("the client closed the request's stream: cancelled");
  srv_request_cancel_one(r);
}

void srv_send_json(tr_sink_t *sink, json_t *msg, tr_send_flags_t flags) {
  size_t len;
  cleanup_free char *text = srv_jsonrpc_dump(msg, &len);
  tr_sink_send(sink, text, len, flags);
}

void srv_batch_release(srv_batch_t *batch) {
  if (--batch->pending > 0) return;
  /* Drop the slots of cancelled requests (they stay null). */
  json_t *out = json_array();
  size_t i;
  json_t *v;
  json_array_foreach(batch->responses, i, v) if (!json_is_null(v)) json_array_append(out, v);
  if (json_array_size(out) > 0) srv_send_json(batch->sink, out, TR_SEND_RESPONSE);
  json_decref(out);
  json_decref(batch->responses);
  tr_sink_unref(batch->sink);
  free(batch);
}

bool srv_batch_full(const srv_batch_t *batch) {
  return batch && batch->bytes >= batch->max_bytes;
}

json_t *srv_batch_full_error(const srv_batch_t *batch, json_t *id) {
  cleanup_free char *msg = xasprintf(
      "The batch's answers would exceed %zu bytes (--max-message-bytes): send this "
      "request again on its own",
      batch->max_bytes);
  return srv_jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, msg, NULL);
}

/* Delivers a response: straight to the sink, or into its batch slot (an error in its place
 * if it does not fit in what is left of the batch's bytes). */
void srv_deliver(tr_sink_t *sink, srv_batch_t *batch, size_t slot, json_t *response) {
  if (!batch) {
    srv_send_json(sink, response, TR_SEND_RESPONSE);
    json_decref(response);
    return;
  }
  if (!json_is_null(response)) {
    size_t n = json_dumpb(response, NULL, 0, JSON_COMPACT);
    if (batch->bytes + n > batch->max_bytes) {
      json_t *small = srv_batch_full_error(batch, json_object_get(response, "id"));
      json_decref(response);
      response = small;
      n = json_dumpb(response, NULL, 0, JSON_COMPACT);
    }
    batch->bytes += n + 1;
  }
  json_array_set_new(batch->responses, slot, response);
  srv_batch_release(batch);
}

size_t srv_batch_reserve(srv_batch_t *batch) {
  if (!batch) return 0;
  json_array_append_new(batch->responses, json_null());
  batch->pending++;
  return json_array_size(batch->responses) - 1;
}

void srv_reply_error(tr_sink_t *sink, srv_batch_t *batch, json_t *id, int code,
                     const char *message) {
  srv_deliver(sink, batch, srv_batch_reserve(batch), srv_jsonrpc_error(id, code, message, NULL));
}

void srv_reply_result(tr_sink_t *sink, srv_batch_t *batch, json_t *id, json_t *result) {
  srv_deliver(sink, batch, srv_batch_reserve(batch), srv_jsonrpc_result(id, result));
  json_decref(result);
}

/* ---------------------------------------------------------------- requests */

srv_server_t *srv_request_server(srv_request_t *r) {
  return r->server;
}
srv_session_t *srv_request_session(srv_request_t *r) {
  return r->session;
}
bool srv_request_cancelled(const srv_request_t *r) {
  return r->cancelled;
}
bool srv_request_has_progress(const srv_request_t *r) {
  return r->progress_token != NULL;
}

void srv_request_on_cancel(srv_request_t *r, void (*cancel_cb)(void *data), void *data) {
  r->cancel_cb = cancel_cb;
  r->cancel_data = data;
}

void srv_request_progress(srv_request_t *r, double progress, const char *message, size_t len,
                          json_t *meta) {
  if (!r->progress_token || r->cancelled || progress <= r->last_progress) {
    json_decref(meta);
    return;
  }
  r->last_progress = progress;
  r->last_progress_ms = cm_now_ms();
  /* A background run's output (the progress that carries the streams' _meta; a set-up note
   * has none) waits for wait_run. */
  bool output = meta && message;
  if (r->task && srv_task_capture(r->task, output ? message : "", output ? len : 0)) {
    json_decref(meta);
    return;
  }
  json_t *params =
      json_pack("{s:O, s:f}", "progressToken", r->progress_token, "progress", progress);
  if (message) json_object_set_new(params, "message", srv_json_string_lossy(message, len));
  if (meta) json_object_set_new(params, "_meta", meta);
  json_t *n = srv_jsonrpc_notification("notifications/progress", params);
  srv_send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

void srv_request_heartbeat(srv_request_t *r) {
  /* A thousandth: the next byte count of output is still larger after a thousand beats. */
  srv_request_progress(r, r->last_progress + 0.001, "still running", strlen("still running"), NULL);
}

static void on_heartbeat(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  (void)timer;
  srv_request_t *r = data;
  r->heartbeat = NULL;
  uint64_t now = cm_now_ms(), quiet = now - r->last_progress_ms;
  if (quiet >= SRV_HEARTBEAT_MS) {
    srv_request_heartbeat(r);
    quiet = 0;
  }
  r->heartbeat = cm_loop_timer(loop, SRV_HEARTBEAT_MS - quiet, on_heartbeat, r);
}

void srv_request_start_heartbeat(srv_request_t *r) {
  if (!r->progress_token || r->heartbeat || r->task) return;
  r->last_progress_ms = cm_now_ms();
  r->heartbeat = cm_loop_timer(r->server->loop, SRV_HEARTBEAT_MS, on_heartbeat, r);
}

void srv_request_stop_heartbeat(srv_request_t *r) {
  if (r->heartbeat) cm_timer_cancel(r->heartbeat);
  r->heartbeat = NULL;
}

int srv_log_level_index(const char *level) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(mcp_log_levels); i++)
    if (strcmp(level, mcp_log_levels[i]) == 0) return (int)i;
  return -1;
}

/* The level r's log messages start at: its own (modern), else its session's; -1 = none. */
static int request_log_level(const srv_request_t *r) {
  if (r->modern) return r->log_level;
  return r->session ? r->session->log_level : -1;
}

bool srv_request_log_enabled(const srv_request_t *r, const char *level) {
  int min = request_log_level(r);
  int idx = srv_log_level_index(level);
  return !r->cancelled && min >= 0 && idx >= min;
}

void srv_request_log(srv_request_t *r, const char *level, const char *logger, json_t *data) {
  if (!srv_request_log_enabled(r, level)) {
    json_decref(data);
    return;
  }
  json_t *params = json_pack("{s:s, s:o}", "level", level, "data", data);
  if (logger) json_object_set_new(params, "logger", json_string(logger));
  json_t *n = srv_jsonrpc_notification("notifications/message", params);
  srv_send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

srv_request_t *srv_request_new(srv_session_t *ss, json_t *id, tr_sink_t *sink, srv_batch_t *batch,
                               const srv_modern_t *mm) {
  srv_request_t *r = xcalloc(1, sizeof *r);
  r->server = ss->server;
  r->session = ss;
  r->log_level = -1;
  r->call_tool = -1;
  r->call_limit = -1;
  if (mm) {
    r->modern = true;
    r->log_level = mm->log_level;
  }
  if (ss->ephemeral && !ss->owned) {
    ss->owned = true;
    ss->refs++;
    r->own_session = true;
    /* Its client closing the stream is its cancellation (2026-07-28 over HTTP). */
    tr_sink_on_peer_gone(sink, request_peer_gone, r);
  } else if (!batch && sink != ss->sink && !sink->peer_gone) {
    /* A handshake-era POST's own stream (HTTP): its client closing it for good cancels it
     * too (the AI SDK's abort does only that).  Not the session's stream (stdio, a task's
     * run), and not a stream several requests share. */
    tr_sink_on_peer_gone(sink, request_peer_gone, r);
  }
  r->id = json_incref(id);
  r->sink = tr_sink_ref(sink);
  r->batch = batch;
  r->batch_slot = srv_batch_reserve(batch);
  srv_server_t *s = ss->server;
  r->next = s->inflight;
  if (s->inflight) s->inflight->prev = r;
  s->inflight = r;
  s->n_inflight++;
  return r;
}

static void request_free(srv_request_t *r) {
  srv_request_stop_heartbeat(r);
  /* Nothing of a stateless request outlives it. */
  if (r->sink && r->sink->peer_gone_data == r) tr_sink_on_peer_gone(r->sink, NULL, NULL);
  if (r->own_session && r->session) srv_session_release(r->session);
  json_decref(r->id);
  json_decref(r->progress_token);
  json_decref(r->params);
  json_decref(r->audit);
  free(r->call_principal);
  free(r->method);
  tr_sink_unref(r->sink);
  free(r);
}

const double srv_metric_buckets[SRV_M_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                  2.5,  5,     10,   30,  60,   120, 300};
const char *const srv_metric_tools[SRV_M_TOOLS] = {"execute_python", "check_environment",
                                                   "validate_script", "other"};
const char *const srv_metric_outcomes[SRV_M_OUTCOMES] = {"ok", "tool_error", "limit", "error",
                                                         "cancelled"};
const char *const srv_metric_limits[SRV_M_LIMITS] = {"timeout", "memory", "cpu", "file_size",
                                                     "processes"};

void srv_request_audit_begin(srv_request_t *r, const char *tool, const char *task_id,
                             const tr_sink_t *from) {
  r->call_tool = SRV_M_TOOL_OTHER;
  for (int i = 0; i < SRV_M_TOOL_OTHER; i++)
    if (strcmp(tool, srv_metric_tools[i]) == 0) r->call_tool = i;
  r->call_start_ms = cm_now_ms();
  free(r->call_principal);
  r->call_principal = r->session && r->session->principal ? xstrdup(r->session->principal) : NULL;
  if (!r->server->audit) return;
  json_decref(r->audit);
  /* The session by the server's number for it: its id over HTTP is a credential. */
  r->audit =
      json_pack("{s:s, s:s, s:I, s:s, s:s*}", "event", "tool_call", "principal",
                r->session && r->session->principal ? r->session->principal : "", "session",
                (json_int_t)(r->session ? r->session->serial : 0), "tool", tool, "task", task_id);
  if (r->modern) json_object_set_new(r->audit, "era", json_string("2026-07-28"));
  /* Over HTTP: the TCP peer, and the client behind the trusted proxies. */
  if (from && from->remote.peer[0]) {
    json_object_set_new(r->audit, "remote", json_string(from->remote.peer));
    json_object_set_new(r->audit, "client", json_string(from->remote.client));
    if (from->remote.forwarded)
      json_object_set_new(r->audit, "forwarded", json_string(from->remote.forwarded));
  }
}

void srv_request_audit(srv_request_t *r, const char *key, json_t *value) {
  if (!r->audit || !value) {
    json_decref(value);
    return;
  }
  json_object_set_new(r->audit, key, value);
}

void srv_request_note_limit(srv_request_t *r, const char *limit) {
  for (int i = 0; i < SRV_M_LIMITS; i++)
    if (strcmp(limit, srv_metric_limits[i]) == 0) r->call_limit = i;
  srv_request_audit(r, "limit", json_string(limit));
}

/* The call's outcome (the audit line's and /metrics'): cancelled, error (JSON-RPC), limit (a
 * run that hit one: "limit" says which), tool_error (another isError result), or ok.  A
 * task's is its run's. */
static void call_finish(srv_request_t *r, json_t *response) {
  srv_counters_t *c = &r->server->counters;
  int outcome = SRV_M_OK;
  json_t *error = response ? json_object_get(response, "error") : NULL;
  json_t *result = response ? json_object_get(response, "result") : NULL;
  if (r->cancelled || !response)
    outcome = SRV_M_CANCELLED;
  else if (error)
    outcome = SRV_M_ERROR;
  else if (json_is_true(json_object_get(result, "isError")))
    outcome = r->call_limit >= 0 ? SRV_M_LIMIT : SRV_M_TOOL_ERROR;
  uint64_t ms = cm_now_ms() - r->call_start_ms;
  int t = r->call_tool;
  c->calls[t][outcome]++;
  size_t b = 0;
  while (b < SRV_M_BUCKETS && (double)ms / 1000.0 > srv_metric_buckets[b]) b++;
  c->duration_buckets[t][b]++;
  c->duration_ms_sum[t] += ms;
  if (r->call_limit >= 0 && outcome == SRV_M_LIMIT) c->limits[r->call_limit]++;
  if (t == SRV_M_TOOL_EXECUTE || t == SRV_M_TOOL_VALIDATE)
    srv_recent_note(
        r->server, r->call_principal, srv_metric_tools[t], srv_metric_outcomes[outcome],
        outcome == SRV_M_LIMIT && r->call_limit >= 0 ? srv_metric_limits[r->call_limit] : NULL, ms);
  r->call_tool = -1;
  json_t *a = r->audit;
  r->audit = NULL;
  if (!a) return;
  if (error) json_object_set(a, "error_code", json_object_get(error, "code"));
  json_object_set_new(a, "outcome", json_string(srv_metric_outcomes[outcome]));
  json_object_set_new(a, "duration_ms", json_integer((json_int_t)ms));
  srv_audit_write(r->server->audit, a);
  json_decref(a);
}

void srv_request_complete(srv_request_t *r, json_t *response) {
  srv_server_t *s = r->server;
  srv_request_stop_heartbeat(r);
  abandon_client_calls(r);
  if (r->call_tool >= 0) call_finish(r, response);
  if (r->task) {
    /* A task's run answers its task; no client waits for it here. */
    srv_task_run_ended(r, r->cancelled ? NULL : response);
    json_decref(response);
  } else if (r->cancelled) {
    json_decref(response);
    /* A cancelled request sends nothing; its batch slot stays null. */
    if (r->batch) srv_deliver(r->sink, r->batch, r->batch_slot, json_null());
  } else if (response) {
    srv_deliver(r->sink, r->batch, r->batch_slot, response);
  } else if (r->batch) {
    srv_deliver(r->sink, r->batch, r->batch_slot, json_null());
  }
  if (r->prev)
    r->prev->next = r->next;
  else
    s->inflight = r->next;
  if (r->next) r->next->prev = r->prev;
  s->n_inflight--;
  r->done = true;
  if (r->busy == 0) request_free(r);
}

void srv_request_finish(srv_request_t *r, json_t *result) {
  if (r->modern && !r->cancelled) {
    srv_modern_decorate(result);
    /* (an extension's lists and reads: the router's own set theirs) */
    srv_modern_cache_hints(result, r->method, 0);
  }
  json_t *response = r->cancelled ? NULL : srv_jsonrpc_result(r->id, result);
  json_decref(result);
  srv_request_complete(r, response);
}

void srv_request_fail(srv_request_t *r, const cm_error_t *err) {
  if (r->cancelled) {
    srv_request_complete(r, NULL);
    return;
  }
  const char *text = cm_error_message(err);
  json_t *uri = json_is_object(r->params) ? json_object_get(r->params, "uri") : NULL;
  json_t *response;
  if (err->kind == CM_ERR_NOT_FOUND && r->method && strncmp(r->method, "resources/", 10) == 0 &&
      json_is_string(uri)) {
    /* -32002 is gone in 2026-07-28: there it is invalid params, still with data.uri. */
    cleanup_free char *msg = xasprintf("Resource not found: %s", text);
    response = srv_jsonrpc_error(r->id, r->modern ? JSONRPC_INVALID_PARAMS : MCP_RESOURCE_NOT_FOUND,
                                 msg, json_pack("{s:O}", "uri", uri));
  } else if (err->kind == CM_ERR_INVALID || err->kind == CM_ERR_LIMIT ||
             err->kind == CM_ERR_NOT_FOUND) {
    cleanup_free char *msg = xasprintf("Invalid params: %s", text);
    response = srv_jsonrpc_error(r->id, JSONRPC_INVALID_PARAMS, msg, NULL);
  } else if (err->kind == CM_ERR_UNSUPPORTED) {
    cleanup_free char *msg = xasprintf("Method not found: %s", text);
    response = srv_jsonrpc_error(r->id, JSONRPC_METHOD_NOT_FOUND, msg, NULL);
  } else {
    cleanup_free char *msg = xasprintf("Internal error: %s", text);
    response = srv_jsonrpc_error(r->id, JSONRPC_INTERNAL_ERROR, msg, NULL);
  }
  srv_request_complete(r, response);
}

void srv_request_fail_rpc(srv_request_t *r, int code, const char *message, json_t *data) {
  if (r->cancelled) {
    json_decref(data);
    srv_request_complete(r, NULL);
    return;
  }
  srv_request_complete(r, srv_jsonrpc_error(r->id, code, message, data));
}

json_t *srv_request_params(const srv_request_t *r) {
  return r->params;
}

/* ---------------------------------------------------------------- server -> client requests */

/* Bounds what one session may have outstanding with its client. */
#define SRV_MAX_CLIENT_CALLS 64

typedef struct srv_client_call {
  srv_request_t *request; /* the request it serves; its session is the client asked */
  srv_session_t *session;
  char id[32];
  srv_client_cb cb;
  void *data;
  struct srv_client_call *next;
} srv_client_call_t;

/* Unlinks r's pending calls, oldest first. */
static srv_client_call_t *take_client_calls(srv_request_t *r) {
  srv_client_call_t *mine = NULL, **tail = &mine;
  for (srv_client_call_t **p = &r->server->calls; *p;) {
    srv_client_call_t *c = *p;
    if (c->request != r) {
      p = &c->next;
      continue;
    }
    *p = c->next;
    c->next = NULL;
    *tail = c;
    tail = &c->next;
  }
  return mine;
}

/* Tells the client we no longer wait for its answer. */
static void send_client_cancel(srv_request_t *r, const srv_client_call_t *c, const char *why) {
  json_t *n = srv_jsonrpc_notification("notifications/cancelled",
                                       json_pack("{s:s, s:s}", "requestId", c->id, "reason", why));
  srv_send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

static void fail_client_calls(srv_request_t *r, const char *why) {
  /* A task's run in the modern era asks through its task: those questions fail too. */
  if (r->task) srv_task_asks_fail(r);
  srv_client_call_t *c = take_client_calls(r);
  if (!c) return;
  json_t *error = json_pack("{s:i, s:s}", "code", JSONRPC_INTERNAL_ERROR, "message", why);
  while (c) {
    srv_client_call_t *next = c->next;
    send_client_cancel(r, c, why);
    c->cb(c->data, NULL, error);
    free(c);
    c = next;
  }
  json_decref(error);
}

static void abandon_client_calls(srv_request_t *r) {
  srv_client_call_t *c = take_client_calls(r);
  while (c) {
    srv_client_call_t *next = c->next;
    send_client_cancel(r, c, "the request finished");
    free(c);
    c = next;
  }
}

/* The client capability a server -> client method needs, or NULL. */
static const char *client_capability_for(const char *method) {
  if (strcmp(method, "sampling/createMessage") == 0) return "sampling";
  if (strcmp(method, "elicitation/create") == 0) return "elicitation";
  if (strcmp(method, "roots/list") == 0) return "roots";
  return NULL;
}

int srv_request_call_client(srv_request_t *r, const char *method, json_t *params, srv_client_cb cb,
                            void *data, cm_error_t *err) {
  srv_session_t *ss = r->session;
  if (r->cancelled || r->done || !ss) {
    json_decref(params);
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s: the request is no longer in flight",
                        method);
  }
  if (r->modern && r->task) {
    /* A task's run asks through its task: tasks/get shows the question, tasks/update
     * brings the answer (the tasks extension's input_required). */
    return srv_task_ask(r, method, params, cb, data, err);
  }
  if (r->modern) {
    /* The stateless revision has no server -> client requests: a handler that needs input
     * answers an InputRequiredResult instead (docs/protocol-2026.md, section 6). */
    json_decref(params);
    return cm_error_set(err, 0, CM_ERR_UNSUPPORTED,
                        "%s: protocol revision 2026-07-28 has no requests to the client", method);
  }
  if (!ss->ready && strcmp(method, "ping") != 0) {
    json_decref(params);
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "%s: the client has not sent notifications/initialized", method);
  }
  const char *cap = client_capability_for(method);
  if (cap && !json_object_get(ss->client_capabilities, cap)) {
    json_decref(params);
    return cm_error_set(err, 0, CM_ERR_UNSUPPORTED,
                        "%s: the client did not declare the \"%s\" capability", method, cap);
  }
  size_t pending = 0;
  for (srv_client_call_t *c = r->server->calls; c; c = c->next) pending += c->session == ss;
  if (pending >= SRV_MAX_CLIENT_CALLS) {
    json_decref(params);
    return cm_error_set(err, 0, CM_ERR_LIMIT, "%s: %d requests to the client are already pending",
                        method, SRV_MAX_CLIENT_CALLS);
  }
  srv_client_call_t *c = xcalloc(1, sizeof *c);
  c->request = r;
  c->session = ss;
  snprintf(c->id, sizeof c->id, "mps-%llu", (unsigned long long)++ss->next_call);
  c->cb = cb;
  c->data = data;
  c->next = r->server->calls;
  r->server->calls = c;
  json_t *msg = json_pack("{s:s, s:s, s:s}", "jsonrpc", "2.0", "id", c->id, "method", method);
  if (params) json_object_set_new(msg, "params", params);
  srv_send_json(r->sink, msg, TR_SEND_DEFAULT);
  json_decref(msg);
  return 0;
}

void srv_request_close_stream(srv_request_t *r) {
  if (!r->cancelled && !r->done) tr_sink_close_stream(r->sink);
}

/* A response from the client: to one of our requests, or ignored. */
void srv_client_response(srv_session_t *ss, json_t *msg, const srv_msg_t *m) {
  if (!json_is_string(m->id)) return;
  for (srv_client_call_t **p = &ss->server->calls; *p; p = &(*p)->next) {
    srv_client_call_t *c = *p;
    if (c->session != ss || strcmp(c->id, json_string_value(m->id)) != 0) continue;
    *p = c->next;
    json_t *result = json_object_get(msg, "result");
    json_t *error = json_object_get(msg, "error");
    srv_request_t *r = c->request;
    /* The callback may finish r: keep it until the callback returns. */
    r->busy++;
    if (error) {
      json_t *e = json_is_object(error) ? json_incref(error)
                                        : json_pack("{s:i, s:s}", "code", JSONRPC_INTERNAL_ERROR,
                                                    "message", "malformed error from the client");
      c->cb(c->data, NULL, e);
      json_decref(e);
    } else {
      c->cb(c->data, result, NULL);
    }
    free(c);
    if (--r->busy == 0 && r->done) request_free(r);
    return;
  }
  cm_debug("ignored a response to no request of ours");
}

srv_request_t *srv_request_find(srv_session_t *ss, json_t *id) {
  for (srv_request_t *r = ss->server->inflight; r; r = r->next)
    if (r->session == ss && !r->task && json_equal(r->id, id)) return r;
  return NULL;
}

void srv_request_cancel_one(srv_request_t *r) {
  if (r->cancelled || r->done) return;
  r->cancelled = true;
  /* The callbacks below may finish r: it is freed only after the last of them. */
  r->busy++;
  fail_client_calls(r, "the request was cancelled");
  if (!r->done && r->cancel_cb) r->cancel_cb(r->cancel_data);
  if (--r->busy == 0 && r->done) request_free(r);
}

void srv_server_cancel_all(srv_server_t *s) {
  srv_request_t *next;
  for (srv_request_t *r = s->inflight; r; r = next) {
    next = r->next;
    srv_request_cancel_one(r);
  }
}
size_t srv_server_inflight(srv_server_t *s) {
  return s->n_inflight;
}

size_t srv_server_calls(srv_server_t *s) {
  size_t n = 0;
  for (srv_request_t *r = s->inflight; r; r = r->next) n += r->call_tool >= 0;
  return n;
}

void srv_request_set_progress_token(srv_request_t *r, json_t *params) {
  json_t *meta = json_is_object(params) ? json_object_get(params, "_meta") : NULL;
  json_t *token = json_is_object(meta) ? json_object_get(meta, "progressToken") : NULL;
  if (json_is_string(token) || json_is_integer(token)) r->progress_token = json_incref(token);
}
