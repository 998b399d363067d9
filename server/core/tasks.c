/* Tasks: a tools/call answered at once with a task while its run goes on (2025-11-25
 * utilities/tasks; docs/protocol-2026.md, section 5).
 *
 * The run is a request of its own (srv_request_t.task set): the tool runs on it as on any
 * call, and its answer goes to the task instead of a client.  In the handshake era it runs
 * on the calling session, so that the session's admission caps count it and its progress
 * reaches the client under the call's own token; when the session ends (DELETE, idle
 * expiry) the run loses its session and its stream and goes on, because a task belongs to
 * its principal, not to a session: another session of the same principal reads it.
 *
 * The store keeps tasks in creation order (tasks/list pages through it) and in order of
 * expiry, with one timer on the loop for the first to expire.  A task is kept until its
 * TTL from creation; one still working then is cancelled (its process tree killed).  The
 * count per principal is capped (--max-tasks-per-principal); a result is bounded like any
 * call's (--max-output-bytes and the artifact limits).  Lookups walk the store: it holds at
 * most that cap per principal. */
#include <errno.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

#include "server/core/core-internal.h"

#define TASK_POLL_INTERVAL_MS 1000
#define TASK_MIN_TTL_MS 1000
#define TASK_LIST_PAGE 50
/* tasks/result requests waiting for one task at once: each is a request in flight. */
#define TASK_MAX_WAITERS 16

typedef enum task_status {
  TASK_WORKING = 0,
  TASK_COMPLETED,
  TASK_FAILED,
  TASK_CANCELLED,
  TASK_INPUT_REQUIRED, /* the run waits for answers (the extension's inputRequests) */
} task_status_t;

static const char *const status_names[] = {"working", "completed", "failed", "cancelled",
                                           "input_required"};

/* What a task's run may ask its client at once (the extension's inputRequests). */
#define TASK_MAX_ASKS 16

/* One question of a task's run to its client, waiting in inputRequests for tasks/update. */
typedef struct task_ask {
  char key[24];
  srv_client_cb cb;
  void *data;
  struct task_ask *next;
} task_ask_t;

typedef struct task_waiter task_waiter_t;

typedef struct srv_task {
  struct srv_tasks *store;
  char id[SRV_ROUTE_MAX + 1 + 33]; /* [<route>.]128 random bits, hex */
  char *principal;
  task_status_t status;
  char *status_message;
  uint64_t created_wall_ms, updated_wall_ms;
  uint64_t ttl_ms;
  uint64_t expires_at;   /* monotonic (cm_now_ms) */
  srv_request_t *run;    /* until it ends */
  srv_session_t *origin; /* where notifications/tasks/status go (the handshake era), or NULL */
  json_t *result;        /* completed: the call's result */
  json_t *error;         /* failed: the call's JSON-RPC error object */
  size_t bytes;          /* of result or error, as JSON: what the store holds for it */
  task_waiter_t *waiters;
  /* The modern era: what the run asks (inputRequests: key -> {method, params}), the
   * callbacks waiting for the answers, and the client capabilities the call declared. */
  json_t *inputs;
  task_ask_t *asks;
  uint64_t next_ask;
  uint64_t told; /* changes its listen streams were told of (notify_listeners) */
  json_t *client_caps;
  /* A background run (execute_python's background: true): its output since the last
   * wait_run (what its progress carried), bounded; what did not fit is counted. */
  bool background;
  cm_buf_t news;
  uint64_t news_dropped;
  struct srv_task *prev, *next; /* creation order */
  struct srv_task *exp_next;    /* expiry order */
} srv_task_t;

struct task_waiter {
  srv_request_t *r;
  srv_task_t *task;
  task_waiter_t *next;
  /* A wait_run: it answers "still running" at its deadline (its progress token, if any, hears
   * the tools/call heartbeat meanwhile). */
  bool run_wait;
  cm_timer_t *deadline;
};

typedef struct srv_tasks {
  srv_server_t *server;
  srv_task_t *head, *tail;
  srv_task_t *expiring; /* soonest first */
  cm_timer_t *timer;
  uint64_t timer_at;
  uint64_t bytes; /* of every task's kept result */
} srv_tasks_t;

/* ---------------------------------------------------------------- the store */

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ISO 8601 in UTC with milliseconds. */
static json_t *iso_time(uint64_t ms) {
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, sizeof buf - n, ".%03uZ", (unsigned)(ms % 1000));
  return json_string(buf);
}

static bool terminal(const srv_task_t *t) {
  return t->status != TASK_WORKING && t->status != TASK_INPUT_REQUIRED;
}

static srv_tasks_t *store_of(srv_server_t *s) {
  if (!s->tasks) {
    s->tasks = xcalloc(1, sizeof *s->tasks);
    s->tasks->server = s;
  }
  return s->tasks;
}

static void arm_timer(srv_tasks_t *ts);

/* The run's questions go unanswered: with an error to each callback (the run is being
 * cancelled: the callbacks come before its cancel, as srv_request_call_client promises), or
 * silently (the run is over: nobody waits). */
static void asks_drop(srv_task_t *t, bool tell) {
  task_ask_t *a = t->asks;
  t->asks = NULL;
  json_decref(t->inputs);
  t->inputs = NULL;
  json_t *error = tell ? json_pack("{s:i, s:s}", "code", JSONRPC_INTERNAL_ERROR, "message",
                                   "the task was cancelled")
                       : NULL;
  while (a) {
    task_ask_t *next = a->next;
    if (tell) a->cb(a->data, NULL, error);
    free(a);
    a = next;
  }
  json_decref(error);
}

static void task_free(srv_task_t *t) {
  asks_drop(t, false);
  cm_buf_release(&t->news);
  json_decref(t->client_caps);
  t->store->bytes -= t->bytes;
  free(t->principal);
  free(t->status_message);
  json_decref(t->result);
  json_decref(t->error);
  free(t);
}

/* Unlinks t from both orders (its waiters are answered already). */
static void task_unlink(srv_task_t *t) {
  srv_tasks_t *ts = t->store;
  if (t->prev)
    t->prev->next = t->next;
  else
    ts->head = t->next;
  if (t->next)
    t->next->prev = t->prev;
  else
    ts->tail = t->prev;
  for (srv_task_t **p = &ts->expiring; *p; p = &(*p)->exp_next)
    if (*p == t) {
      *p = t->exp_next;
      break;
    }
}

static void random_id(const srv_config_t *cfg, char out[SRV_ROUTE_MAX + 1 + 33]) {
  if (cfg->route) {
    size_t n = strlen(cfg->route);
    memcpy(out, cfg->route, n);
    out[n] = '.';
    out += n + 1;
  }
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    /* A guessable id would let anyone who guesses it poll, read or cancel the task's run
     * (ownership is checked, but ids must not be the only defence either way). */
    if (n < 0) abort();
    got += (size_t)n;
  }
  for (size_t i = 0; i < sizeof raw; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static srv_task_t *task_new(srv_tasks_t *ts, const char *principal, uint64_t ttl_ms) {
  srv_task_t *t = xcalloc(1, sizeof *t);
  t->store = ts;
  random_id(ts->server->cfg, t->id);
  t->principal = xstrdup(principal);
  t->created_wall_ms = t->updated_wall_ms = wall_ms();
  t->ttl_ms = ttl_ms;
  t->expires_at = cm_now_ms() + ttl_ms;
  t->prev = ts->tail;
  if (ts->tail)
    ts->tail->next = t;
  else
    ts->head = t;
  ts->tail = t;
  srv_task_t **p = &ts->expiring;
  while (*p && (*p)->expires_at <= t->expires_at) p = &(*p)->exp_next;
  t->exp_next = *p;
  *p = t;
  arm_timer(ts);
  return t;
}

static size_t principal_count(const srv_tasks_t *ts, const char *principal) {
  size_t n = 0;
  for (const srv_task_t *t = ts->head; t; t = t->next) n += strcmp(t->principal, principal) == 0;
  return n;
}

bool srv_tasks_room(srv_server_t *s, const char *principal) {
  const srv_config_t *cfg = s->cfg;
  return !cfg->max_tasks_per_principal || !s->tasks ||
         principal_count(s->tasks, principal) < cfg->max_tasks_per_principal;
}

/* The error of a task id that task_find does not find: whose it is when another replica
 * minted it (--route), or that it does not exist (for this principal) any more. */
static char *not_found(srv_server_t *s, const char *id) {
  cleanup_free char *why = srv_route_unknown(s->cfg, "task", id);
  return xasprintf("Invalid params: task not found: %s", why);
}

/* The task of this id, if principal owns it: another's is no task at all. */
static srv_task_t *task_find(srv_server_t *s, const char *principal, json_t *id) {
  if (!s->tasks || !json_is_string(id)) return NULL;
  for (srv_task_t *t = s->tasks->head; t; t = t->next)
    if (strcmp(t->id, json_string_value(id)) == 0)
      return strcmp(t->principal, principal) == 0 ? t : NULL;
  return NULL;
}

/* ---------------------------------------------------------------- the Task object */

/* modern: the tasks extension's names (ttlMs, pollIntervalMs) instead of 2025-11-25's. */
static json_t *task_json_era(const srv_task_t *t, bool modern) {
  json_t *j =
      json_pack("{s:s, s:s, s:o, s:o, s:I, s:i}", "taskId", t->id, "status",
                status_names[t->status], "createdAt", iso_time(t->created_wall_ms), "lastUpdatedAt",
                iso_time(t->updated_wall_ms), modern ? "ttlMs" : "ttl", (json_int_t)t->ttl_ms,
                modern ? "pollIntervalMs" : "pollInterval", TASK_POLL_INTERVAL_MS);
  if (t->status_message) json_object_set_new(j, "statusMessage", json_string(t->status_message));
  return j;
}

static json_t *task_json(const srv_task_t *t) {
  return task_json_era(t, false);
}

/* The extension's DetailedTask (tasks/get): the result or the error inline. */
static json_t *detailed_task(const srv_task_t *t) {
  json_t *j = task_json_era(t, true);
  if (t->status == TASK_INPUT_REQUIRED && t->inputs) json_object_set(j, "inputRequests", t->inputs);
  if (t->status == TASK_COMPLETED) json_object_set(j, "result", t->result);
  if (t->status == TASK_FAILED) json_object_set(j, "error", t->error);
  return j;
}

/* ---------------------------------------------------------------- answers from a task */

/* The result of tasks/result for a terminal task: exactly the call's result, naming its
 * task; or NULL with *error set (a new reference) for the call's error. */
static json_t *stored_answer(const srv_task_t *t, json_t **error) {
  *error = NULL;
  if (t->status == TASK_COMPLETED) {
    json_t *result = json_deep_copy(t->result);
    json_t *meta = json_object_get(result, "_meta");
    if (!json_is_object(meta)) {
      meta = json_object();
      json_object_set_new(result, "_meta", meta);
    }
    json_object_set_new(meta, "io.modelcontextprotocol/related-task",
                        json_pack("{s:s}", "taskId", t->id));
    return result;
  }
  if (t->status == TASK_FAILED) {
    *error = json_deep_copy(t->error);
  } else {
    cleanup_free char *msg =
        xasprintf("Task %s was cancelled%s%s", t->id, t->status_message ? ": " : "",
                  t->status_message ? t->status_message : "");
    *error = json_pack("{s:i, s:s}", "code", JSONRPC_INTERNAL_ERROR, "message", msg);
  }
  return NULL;
}

static json_t *error_response(json_t *id, json_t *error) {
  json_t *code = json_object_get(error, "code");
  json_t *message = json_object_get(error, "message");
  json_t *data = json_object_get(error, "data");
  return srv_jsonrpc_error(
      id, json_is_integer(code) ? (int)json_integer_value(code) : JSONRPC_INTERNAL_ERROR,
      json_is_string(message) ? json_string_value(message) : "Internal error",
      data ? json_incref(data) : NULL);
}

/* Answers a waiting tasks/result request r from its (terminal) task. */
static void answer_waiter(srv_request_t *r, const srv_task_t *t) {
  json_t *error;
  json_t *result = stored_answer(t, &error);
  if (result) {
    srv_request_finish(r, result);
    return;
  }
  json_t *response = error_response(r->id, error);
  json_decref(error);
  srv_request_complete(r, response);
}

static void notify_status(const srv_task_t *t) {
  if (!t->origin) return;
  json_t *n = srv_jsonrpc_notification("notifications/tasks/status", task_json(t));
  srv_send_json(t->origin->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

/* t's status (or its questions) changed: the listen streams that watch it hear of it. */
static void notify_listeners(srv_task_t *t) {
  srv_server_t *s = t->store->server;
  t->told++;
  if (!s->listeners) return;
  json_t *d = detailed_task(t);
  srv_listen_task_changed(s, t->principal, t->id, d);
  json_decref(d);
}

json_t *srv_tasks_detailed(srv_server_t *s, const char *principal, const char *id) {
  json_t *jid = json_string(id);
  srv_task_t *t = jid ? task_find(s, principal, jid) : NULL;
  json_decref(jid);
  return t ? detailed_task(t) : NULL;
}

static void run_wait_end(task_waiter_t *w, bool answer);

/* t becomes terminal: its waiters get their answers. */
static void task_settle(srv_task_t *t, task_status_t status, const char *message) {
  t->status = status;
  free(t->status_message);
  t->status_message = message ? xstrdup(message) : NULL;
  t->updated_wall_ms = wall_ms();
  notify_status(t);
  notify_listeners(t);
  task_waiter_t *w = t->waiters;
  t->waiters = NULL;
  while (w) {
    task_waiter_t *next = w->next;
    srv_request_on_cancel(w->r, NULL, NULL);
    if (w->run_wait)
      run_wait_end(w, true);
    else {
      answer_waiter(w->r, t);
      free(w);
    }
    w = next;
  }
}

/* Stops t's run, if it still has one: the run no longer answers t. */
static void task_stop_run(srv_task_t *t) {
  srv_request_t *run = t->run;
  if (!run) return;
  asks_drop(t, true);
  if (t->run != run) return; /* (a callback finished it) */
  t->run = NULL;
  run->task = NULL;
  srv_request_cancel_one(run); /* kills the script's process tree (the tool's cancel) */
}

static uint64_t principal_bytes(const srv_tasks_t *ts, const char *principal) {
  uint64_t n = 0;
  for (const srv_task_t *t = ts->head; t; t = t->next)
    if (strcmp(t->principal, principal) == 0) n += t->bytes;
  return n;
}

/* Removes the oldest finished task of principal (NULL: of the principal that keeps the most
 * bytes) other than keep; false when there is none. */
static bool drop_oldest(srv_tasks_t *ts, const char *principal, const srv_task_t *keep) {
  if (!principal) {
    uint64_t most = 0;
    for (const srv_task_t *t = ts->head; t; t = t->next) {
      if (!terminal(t) || t == keep || !t->bytes) continue;
      uint64_t b = principal_bytes(ts, t->principal);
      if (b > most) most = b, principal = t->principal;
    }
    if (!principal) return false;
  }
  for (srv_task_t *t = ts->head; t; t = t->next) {
    if (t == keep || !terminal(t) || !t->bytes || strcmp(t->principal, principal) != 0) continue;
    cm_info(
        "task %s of %s: its result (%zu bytes) is dropped to keep the task store within its "
        "bounds (--max-task-result-bytes%s)",
        t->id, t->principal, t->bytes, principal == keep->principal ? "-per-principal" : "");
    task_unlink(t);
    task_free(t);
    return true;
  }
  return false;
}

/* A finished task's result counts against the store's bytes: first the principal's own
 * oldest results go (--max-task-result-bytes-per-principal), then, past the total
 * (--max-task-result-bytes), the oldest of whoever keeps the most.  A result that alone is
 * over the principal's bound is not kept: the task fails, saying so. */
static void task_keep(srv_task_t *t, json_t *value) {
  srv_tasks_t *ts = t->store;
  const srv_config_t *cfg = ts->server->cfg;
  size_t bytes = json_dumpb(value, NULL, 0, JSON_COMPACT);
  uint64_t per = cfg->max_task_result_bytes_per_principal, total = cfg->max_task_result_bytes;
  if ((per && bytes > per) || (total && bytes > total)) {
    bool own = per && bytes > per;
    cleanup_free char *msg = xasprintf(
        "the call's result (%zu bytes) is larger than the tasks' store keeps (%s %llu); call "
        "without a task to get it",
        bytes, own ? "--max-task-result-bytes-per-principal" : "--max-task-result-bytes",
        (unsigned long long)(own ? per : total));
    t->error = json_pack("{s:i, s:s}", "code", JSONRPC_INTERNAL_ERROR, "message", msg);
    t->bytes = strlen(msg) + 64;
  } else {
    t->bytes = bytes;
  }
  ts->bytes += t->bytes;
  while (per && principal_bytes(ts, t->principal) > per && drop_oldest(ts, t->principal, t)) {
  }
  while (total && ts->bytes > total && drop_oldest(ts, NULL, t)) {
  }
}

void srv_task_run_ended(srv_request_t *r, json_t *response) {
  srv_task_t *t = r->task;
  r->task = NULL;
  t->run = NULL;
  asks_drop(t, false);
  if (terminal(t)) return; /* cancelled meanwhile */
  json_t *result = response ? json_object_get(response, "result") : NULL;
  json_t *error = response ? json_object_get(response, "error") : NULL;
  if (result) {
    task_keep(t, result);
    if (t->error) {
      json_t *msg = json_object_get(t->error, "message");
      task_settle(t, TASK_FAILED, json_string_value(msg));
    } else {
      t->result = json_incref(result);
      task_settle(t, TASK_COMPLETED, NULL);
    }
  } else if (error) {
    task_keep(t, error);
    if (!t->error) t->error = json_incref(error);
    json_t *msg = json_object_get(t->error, "message");
    task_settle(t, TASK_FAILED, json_is_string(msg) ? json_string_value(msg) : NULL);
  } else {
    task_settle(t, TASK_CANCELLED, "the run was cancelled (the server is shutting down)");
  }
}

/* ---------------------------------------------------------------- expiry */

static void on_expiry(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  srv_tasks_t *ts = data;
  ts->timer = NULL;
  uint64_t now = cm_now_ms();
  while (ts->expiring && ts->expiring->expires_at <= now) {
    srv_task_t *t = ts->expiring;
    ts->expiring = t->exp_next;
    t->exp_next = NULL;
    cm_debug("task %s expired", t->id);
    if (!terminal(t)) {
      task_stop_run(t);
      task_settle(t, TASK_CANCELLED, "its TTL expired before it finished");
    }
    task_unlink(t);
    task_free(t);
  }
  arm_timer(ts);
}

/* One timer for the store, for the first task to expire. */
static void arm_timer(srv_tasks_t *ts) {
  if (!ts->expiring) {
    if (ts->timer) cm_timer_cancel(ts->timer);
    ts->timer = NULL;
    return;
  }
  uint64_t at = ts->expiring->expires_at;
  if (ts->timer && ts->timer_at <= at) return;
  if (ts->timer) cm_timer_cancel(ts->timer);
  uint64_t now = cm_now_ms();
  ts->timer_at = at;
  ts->timer = cm_loop_timer(ts->server->loop, at > now ? at - now : 1, on_expiry, ts);
}

void srv_tasks_free(srv_server_t *s) {
  srv_tasks_t *ts = s->tasks;
  if (!ts) return;
  if (ts->timer) cm_timer_cancel(ts->timer);
  srv_task_t *next;
  for (srv_task_t *t = ts->head; t; t = next) {
    next = t->next;
    if (t->run) t->run->task = NULL;
    task_free(t);
  }
  free(ts);
  s->tasks = NULL;
}

/* ---------------------------------------------------------------- sessions */

/* A sink that drops everything: the stream of a run whose session is gone. */
static void null_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags) {
  (void)s, (void)json, (void)len, (void)flags;
}
static const tr_sink_ops_t null_sink_ops = {.send = null_send};
static tr_sink_t null_sink = {.ops = &null_sink_ops, .refs = 1};

/* ss ends while r, a task's run, goes on: r loses its session and its stream. */
static void task_run_detach(srv_request_t *r) {
  r->session = NULL;
  tr_sink_unref(r->sink);
  r->sink = tr_sink_ref(&null_sink);
  if (r->task) r->task->origin = NULL;
}

/* ss ends (srv_session_free): its tasks' runs are detached, and no notification goes to it. */
void srv_tasks_session_gone(srv_session_t *ss) {
  srv_tasks_t *ts = ss->server->tasks;
  if (!ts) return;
  for (srv_task_t *t = ts->head; t; t = t->next) {
    if (t->origin != ss) continue;
    t->origin = NULL;
    if (t->run && t->run->session == ss) task_run_detach(t->run);
  }
}

/* ---------------------------------------------------------------- tools/call as a task */

json_t *srv_tasks_capability(void) {
  return json_pack("{s:{}, s:{}, s:{s:{s:{}}}}", "list", "cancel", "requests", "tools", "call");
}

bool srv_tasks_requested(json_t *params) {
  return json_is_object(params) && json_object_get(params, "task") != NULL;
}

static void reply(tr_sink_t *sink, srv_batch_t *batch, json_t *id, json_t *result,
                  const srv_modern_t *mm) {
  if (mm) srv_modern_decorate(result);
  srv_reply_result(sink, batch, id, result);
}

void srv_task_call(srv_session_t *ss, const srv_tool_t *tool, json_t *id, json_t *params,
                   json_t *arguments, tr_sink_t *sink, srv_batch_t *batch, const srv_modern_t *mm) {
  srv_server_t *s = ss->server;
  const srv_config_t *cfg = s->cfg;
  /* The handshake era asks with params.task: {ttl}; the modern era's server decides, and
   * the client names no TTL. */
  json_t *task = mm ? NULL : json_object_get(params, "task");
  json_t *ttl = json_is_object(task) ? json_object_get(task, "ttl") : NULL;
  if ((!mm && !json_is_object(task)) ||
      (ttl && !json_is_null(ttl) && (!json_is_number(ttl) || json_number_value(ttl) < 0))) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: \"task\" must be an object whose \"ttl\" is a number of "
                    "milliseconds");
    return;
  }
  srv_tasks_t *ts = store_of(s);
  if (!srv_tasks_room(s, ss->principal)) {
    cleanup_free char *msg = xasprintf(
        "Invalid params: this principal already has %llu tasks (the server's limit, "
        "--max-tasks-per-principal); a task is kept until its TTL, so wait for one to expire",
        (unsigned long long)cfg->max_tasks_per_principal);
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, msg);
    return;
  }
  uint64_t ttl_ms = cfg->max_task_ttl_ms;
  if (json_is_number(ttl) && json_number_value(ttl) < (double)ttl_ms)
    ttl_ms = (uint64_t)json_number_value(ttl);
  if (ttl_ms < TASK_MIN_TTL_MS) ttl_ms = TASK_MIN_TTL_MS;
  srv_task_t *t = task_new(ts, ss->principal, ttl_ms);
  srv_request_t *r;
  json_t *created;
  if (!mm) {
    /* The run: a request of the calling session's that no client waits for. */
    r = srv_request_new(ss, id, ss->sink, NULL, NULL);
    t->origin = ss;
    srv_request_set_progress_token(r, params);
    created = json_pack("{s:o}", "task", task_json(t));
  } else {
    /* The modern era has no session to run on, and the call's stream ends with its
     * answer (closing it must not cancel the task): the run gets a session of its own,
     * of the principal's, which goes with it, and a stream that goes nowhere (progress
     * is not part of the extension's tasks). */
    srv_session_t *own = srv_session_new(s, &null_sink);
    srv_session_set_principal(own, ss->principal);
    r = srv_request_new(own, id, &null_sink, NULL, mm);
    own->ephemeral = true;
    own->owned = true;
    r->own_session = true;
    created = task_json_era(t, true);
    json_object_set_new(created, "resultType", json_string("task"));
    t->client_caps = json_deep_copy(mm->client_caps);
  }
  r->task = t;
  t->run = r;
  /* (srv_request_params: an extension's tool gets the whole params, as the router gives them) */
  if (s->ext && tool >= s->ext->tools && tool < s->ext->tools + s->ext->n_tools)
    r->params = json_incref(params);
  srv_request_audit_begin(r, tool->name, t->id, sink);
  cm_debug("task %s: %s for %s", t->id, tool->name, ss->principal);
  /* The answer before the run starts: a call may end (and settle the task) at once. */
  reply(sink, batch, id, created, mm);
  tool->call(r, arguments);
}

/* The call goes on without its client: its stream is over (closing it must not cancel the
 * call), and it runs on an ephemeral session of its own, of the same principal, with a
 * stream that goes nowhere (as srv_task_call makes them). */
static void detach_to_own_session(srv_request_t *r) {
  srv_session_t *ss = r->session;
  if (r->sink->peer_gone_data == r) tr_sink_on_peer_gone(r->sink, NULL, NULL);
  tr_sink_unref(r->sink);
  r->sink = tr_sink_ref(&null_sink);
  srv_session_t *own = srv_session_new(r->server, &null_sink);
  srv_session_set_principal(own, ss->principal);
  own->ephemeral = true;
  own->owned = true;
  if (r->own_session) srv_session_release(ss);
  r->session = own;
  r->own_session = true;
}

bool srv_request_promote_task(srv_request_t *r) {
  srv_session_t *ss = r->session;
  srv_server_t *s = r->server;
  if (!r->modern || r->task || r->batch || r->cancelled || r->done || !ss ||
      !srv_tasks_room(s, ss->principal))
    return false;
  srv_tasks_t *ts = store_of(s);
  srv_task_t *t = task_new(ts, ss->principal, s->cfg->max_task_ttl_ms);
  json_t *meta = json_is_object(r->params) ? json_object_get(r->params, "_meta") : NULL;
  json_t *caps = json_is_object(meta) ? json_object_get(meta, MCP_META_CLIENT_CAPS) : NULL;
  if (json_is_object(caps)) t->client_caps = json_deep_copy(caps);
  /* The client's wait ends with the CreateTaskResult... */
  json_t *created = task_json_era(t, true);
  json_object_set_new(created, "resultType", json_string("task"));
  srv_modern_decorate(created);
  srv_reply_result(r->sink, NULL, r->id, created);
  /* ...and the call goes on as the task's run, on a session of its own with a stream that
   * goes nowhere (as srv_task_call makes them): the call's stream is over, and closing it
   * must not cancel the task. */
  detach_to_own_session(r);
  r->task = t;
  t->run = r;
  cm_debug("task %s: a call of %s goes on as a task", t->id, ss->principal);
  return true;
}

/* ---------------------------------------------------------------- tasks/ methods */

static void waiter_cancelled(void *data) {
  task_waiter_t *w = data;
  if (w->run_wait) {
    run_wait_end(w, false);
    return;
  }
  for (task_waiter_t **p = &w->task->waiters; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  srv_request_complete(w->r, NULL);
  free(w);
}

static void handle_result(srv_session_t *ss, const srv_msg_t *m, srv_task_t *t, tr_sink_t *sink,
                          srv_batch_t *batch, const srv_modern_t *mm) {
  if (terminal(t)) {
    json_t *error;
    json_t *result = stored_answer(t, &error);
    if (result) {
      reply(sink, batch, m->id, result, mm);
    } else {
      srv_deliver(sink, batch, srv_batch_reserve(batch), error_response(m->id, error));
      json_decref(error);
    }
    return;
  }
  size_t n = 0;
  for (task_waiter_t *w = t->waiters; w; w = w->next) n++;
  if (n >= TASK_MAX_WAITERS) {
    cleanup_free char *msg = xasprintf(
        "Internal error: %d tasks/result requests already wait for this task", TASK_MAX_WAITERS);
    srv_reply_error(sink, batch, m->id, JSONRPC_INTERNAL_ERROR, msg);
    return;
  }
  /* It waits as a request of the caller's session: cancelled with it, or by the client. */
  task_waiter_t *w = xcalloc(1, sizeof *w);
  w->r = srv_request_new(ss, m->id, sink, batch, mm);
  w->task = t;
  w->next = t->waiters;
  t->waiters = w;
  srv_request_on_cancel(w->r, waiter_cancelled, w);
}

static void handle_list(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink, srv_batch_t *batch,
                        const srv_modern_t *mm) {
  json_t *cursor = json_is_object(m->params) ? json_object_get(m->params, "cursor") : NULL;
  srv_task_t *t = ss->server->tasks ? ss->server->tasks->head : NULL;
  if (cursor && !json_is_null(cursor)) {
    /* A cursor is the id of the last task of the page before (gone: invalid). */
    srv_task_t *after = task_find(ss->server, ss->principal, cursor);
    if (!after) {
      srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS,
                      "Invalid params: unknown cursor (its task may have expired)");
      return;
    }
    t = after->next;
  }
  json_t *list = json_array();
  const srv_task_t *last = NULL;
  for (; t; t = t->next) {
    if (strcmp(t->principal, ss->principal) != 0) continue;
    if (json_array_size(list) == TASK_LIST_PAGE) break;
    json_array_append_new(list, task_json(t));
    last = t;
  }
  json_t *result = json_pack("{s:o}", "tasks", list);
  if (t && last) json_object_set_new(result, "nextCursor", json_string(last->id));
  reply(sink, batch, m->id, result, mm);
}

bool srv_tasks_declared(const srv_modern_t *mm) {
  json_t *ext = mm ? json_object_get(mm->client_caps, "extensions") : NULL;
  return json_is_object(json_object_get(ext, SRV_TASKS_EXTENSION));
}

void srv_tasks_reply_missing(tr_sink_t *sink, json_t *id, const char *what) {
  cleanup_free char *msg =
      xasprintf("Missing required client capability: %s needs the " SRV_TASKS_EXTENSION
                " extension in the request's clientCapabilities",
                what);
  srv_deliver(sink, NULL, 0,
              srv_jsonrpc_error(id, MCP_MISSING_CAPABILITY, msg,
                                json_pack("{s:{s:{s:{}}}}", "requiredCapabilities", "extensions",
                                          SRV_TASKS_EXTENSION)));
}

/* tasks/update's inputResponses (borrowed; NULL for none): each answer to an outstanding
 * question goes to its callback; keys that are not outstanding are ignored, as the extension
 * says.  With none left, the task works again.  The listen streams that watch t hear the
 * change of status at once, and questions answered while others still wait once the update
 * is done (unless what the answers did, a new question or the end, told them already). */
static void task_answer(srv_task_t *t, json_t *responses) {
  const char *key;
  json_t *value;
  bool untold = false;
  json_object_foreach(responses, key, value) {
    for (task_ask_t **p = &t->asks; *p; p = &(*p)->next) {
      task_ask_t *a = *p;
      if (strcmp(a->key, key) != 0) continue;
      *p = a->next;
      json_object_del(t->inputs, key);
      t->updated_wall_ms = wall_ms();
      untold = true;
      if (!t->asks && t->status == TASK_INPUT_REQUIRED) {
        t->status = TASK_WORKING;
        notify_listeners(t);
        untold = false;
      }
      /* May finish the run, settle the task, or ask again. */
      uint64_t told = t->told;
      a->cb(a->data, value, NULL);
      if (t->told != told) untold = false;
      free(a);
      break;
    }
    if (terminal(t) || !t->run) return;
  }
  if (untold) notify_listeners(t);
}

void srv_task_asks_fail(srv_request_t *r) {
  asks_drop(r->task, true);
}

int srv_task_ask(srv_request_t *r, const char *method, json_t *params, srv_client_cb cb, void *data,
                 cm_error_t *err) {
  srv_task_t *t = r->task;
  static const struct {
    const char *method, *capability;
  } needs[] = {{"elicitation/create", "elicitation"},
               {"sampling/createMessage", "sampling"},
               {"roots/list", "roots"}};
  const char *cap = NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(needs); i++)
    if (strcmp(method, needs[i].method) == 0) cap = needs[i].capability;
  size_t n = 0;
  for (task_ask_t *a = t->asks; a; a = a->next) n++;
  int rc = 0;
  if (!cap)
    rc = cm_error_set(err, 0, CM_ERR_UNSUPPORTED, "%s: a task cannot ask its client that", method);
  else if (!json_object_get(t->client_caps, cap))
    rc = cm_error_set(err, 0, CM_ERR_UNSUPPORTED,
                      "%s: the client did not declare the \"%s\" capability", method, cap);
  else if (n >= TASK_MAX_ASKS)
    rc = cm_error_set(err, 0, CM_ERR_LIMIT, "%s: %d questions of the task are already pending",
                      method, TASK_MAX_ASKS);
  if (rc < 0) {
    json_decref(params);
    return rc;
  }
  task_ask_t *a = xcalloc(1, sizeof *a);
  snprintf(a->key, sizeof a->key, "input-%llu", (unsigned long long)++t->next_ask);
  a->cb = cb;
  a->data = data;
  task_ask_t **p = &t->asks;
  while (*p) p = &(*p)->next;
  *p = a;
  if (!t->inputs) t->inputs = json_object();
  json_t *q = json_pack("{s:s}", "method", method);
  if (params) json_object_set_new(q, "params", params);
  json_object_set_new(t->inputs, a->key, q);
  t->status = TASK_INPUT_REQUIRED;
  t->updated_wall_ms = wall_ms();
  notify_listeners(t);
  return 0;
}

/* The tasks extension's methods (2026-07-28): tasks/get (the result inline), tasks/cancel
 * and tasks/update (empty acknowledgements); no tasks/list, no tasks/result. */
static bool handle_modern(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                          const srv_modern_t *mm) {
  const char *method = m->method;
  bool get = strcmp(method, "tasks/get") == 0, cancel = strcmp(method, "tasks/cancel") == 0,
       update = strcmp(method, "tasks/update") == 0;
  if (!get && !cancel && !update) return false;
  if (!srv_tasks_declared(mm)) {
    srv_tasks_reply_missing(sink, m->id, method);
    return true;
  }
  json_t *id = json_is_object(m->params) ? json_object_get(m->params, "taskId") : NULL;
  srv_task_t *t = json_is_string(id) ? task_find(ss->server, ss->principal, id) : NULL;
  if (!t) {
    cleanup_free char *why =
        json_is_string(id) ? not_found(ss->server, json_string_value(id)) : NULL;
    srv_reply_error(sink, NULL, m->id, JSONRPC_INVALID_PARAMS,
                    why ? why : "Invalid params: a string \"taskId\" is needed");
    return true;
  }
  if (get) {
    reply(sink, NULL, m->id, detailed_task(t), mm);
    return true;
  }
  if (cancel && !terminal(t)) {
    cm_debug("task %s cancelled by its client", t->id);
    task_stop_run(t);
    task_settle(t, TASK_CANCELLED, "cancelled by tasks/cancel");
  }
  if (update) {
    json_t *responses = json_object_get(m->params, "inputResponses");
    if (responses && !json_is_object(responses)) {
      srv_reply_error(sink, NULL, m->id, JSONRPC_INVALID_PARAMS,
                      "Invalid params: \"inputResponses\" must be an object");
      return true;
    }
    /* The acknowledgement first: what the answers make the run do (finish, ask again) is
     * for the next tasks/get to see. */
    reply(sink, NULL, m->id, json_object(), mm);
    task_answer(t, responses);
    return true;
  }
  reply(sink, NULL, m->id, json_object(), mm);
  return true;
}

bool srv_tasks_handle(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink, srv_batch_t *batch,
                      const srv_modern_t *mm) {
  const char *method = m->method;
  if (strncmp(method, "tasks/", 6) != 0) return false;
  if (mm) return handle_modern(ss, m, sink, mm);
  bool get = strcmp(method, "tasks/get") == 0, result = strcmp(method, "tasks/result") == 0,
       cancel = strcmp(method, "tasks/cancel") == 0;
  if (strcmp(method, "tasks/list") == 0) {
    handle_list(ss, m, sink, batch, mm);
    return true;
  }
  if (!get && !result && !cancel) return false;
  json_t *id = json_is_object(m->params) ? json_object_get(m->params, "taskId") : NULL;
  if (!json_is_string(id)) {
    cleanup_free char *msg = xasprintf("Invalid params: %s needs a string \"taskId\"", method);
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS, msg);
    return true;
  }
  srv_task_t *t = task_find(ss->server, ss->principal, id);
  if (!t) {
    /* Another principal's task is answered exactly like one that does not exist. */
    cleanup_free char *why = not_found(ss->server, json_string_value(id));
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS, why);
    return true;
  }
  if (get) {
    reply(sink, batch, m->id, task_json(t), mm);
  } else if (result) {
    handle_result(ss, m, t, sink, batch, mm);
  } else if (terminal(t)) {
    cleanup_free char *msg = xasprintf("Invalid params: cannot cancel a task in terminal status %s",
                                       status_names[t->status]);
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS, msg);
  } else {
    cm_debug("task %s cancelled by its client", t->id);
    task_stop_run(t);
    task_settle(t, TASK_CANCELLED, "cancelled by tasks/cancel");
    reply(sink, batch, m->id, task_json(t), mm);
  }
  return true;
}

/* ---------------------------------------------------------------- background runs */

/* What a background run's output since the last wait_run keeps (the result has it all). */
#define RUN_NEWS_MAX (64 * 1024)

static json_t *run_result(const char *text, json_t *sc, bool is_error) {
  json_t *r = srv_tool_text_result(text, is_error);
  json_object_set_new(r, "structuredContent", sc);
  return r;
}

/* The structuredContent of an answer without the run's result: the same required fields. */
static json_t *run_sc(const srv_task_t *t, const char *status, json_t *out) {
  return json_pack("{s:s, s:s, s:o, s:s, s:n}", "run_id", t->id, "status", status, "stdout",
                   out ? out : json_string(""), "stderr", "", "exit_code");
}

bool srv_task_capture(srv_task_t *t, const char *text, size_t len) {
  if (!t->background) return false;
  size_t room = RUN_NEWS_MAX > t->news.len ? RUN_NEWS_MAX - t->news.len : 0;
  size_t take = cm_utf8_clip(text, CM_MIN(room, len));
  cm_buf_append(&t->news, text, take);
  t->news_dropped += len - take;
  return true;
}

/* "Still running", with the output since the last answer (which it consumes). */
static json_t *running_answer(srv_task_t *t) {
  cm_buf_t text;
  cm_buf_init(&text, 0);
  cm_buf_printf(&text, "--- run %s: still running ---\n", t->id);
  if (t->news.len || t->news_dropped) {
    cm_buf_appends(&text, "--- new output ---\n");
    cm_buf_append(&text, t->news.data, t->news.len);
    if (t->news_dropped)
      cm_buf_printf(&text, "\n... [%llu more bytes; the result has the beginning and the end]",
                    (unsigned long long)t->news_dropped);
  } else {
    cm_buf_appends(&text, "--- no new output ---");
  }
  cm_buf_appends(&text, "\nCall wait_run again to keep waiting, or cancel_run to stop it.");
  json_t *out = srv_json_string_lossy(t->news.data, t->news.len);
  cm_buf_reset(&t->news);
  t->news_dropped = 0;
  cleanup_free char *s = cm_buf_steal(&text);
  return run_result(s, run_sc(t, "running", out), false);
}

/* A finished run's answer: its result (run_id and status added), or why it has none. */
static json_t *ended_answer(const srv_task_t *t) {
  if (t->status == TASK_COMPLETED) {
    json_t *result = json_deep_copy(t->result);
    json_t *sc = json_object_get(result, "structuredContent");
    if (json_is_object(sc)) {
      json_object_set_new(sc, "run_id", json_string(t->id));
      json_object_set_new(sc, "status", json_string("completed"));
    }
    return result;
  }
  bool cancelled = t->status == TASK_CANCELLED;
  json_t *msg = t->error ? json_object_get(t->error, "message") : NULL;
  const char *why = cancelled             ? (t->status_message ? t->status_message : "cancelled")
                    : json_is_string(msg) ? json_string_value(msg)
                                          : "the call failed";
  cleanup_free char *text =
      xasprintf("--- run %s: %s: %s ---", t->id, cancelled ? "cancelled" : "failed", why);
  json_t *sc = run_sc(t, cancelled ? "cancelled" : "failed", NULL);
  json_object_set_new(sc, "error", json_string(why));
  return run_result(text, sc, true);
}

/* Ends a wait_run waiter: its timers stopped, answered (answer) or not (it was cancelled). */
static void run_wait_end(task_waiter_t *w, bool answer) {
  srv_task_t *t = w->task;
  for (task_waiter_t **p = &t->waiters; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  if (w->deadline) cm_timer_cancel(w->deadline);
  srv_request_on_cancel(w->r, NULL, NULL);
  if (!answer)
    srv_request_complete(w->r, NULL);
  else
    srv_request_finish(w->r, terminal(t) ? ended_answer(t) : running_answer(t));
  free(w);
}

static void on_wait_deadline(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  (void)loop, (void)timer;
  task_waiter_t *w = data;
  w->deadline = NULL;
  run_wait_end(w, true);
}

static srv_task_t *run_find(srv_request_t *r, const char *run_id) {
  const char *principal = r->session ? r->session->principal : SRV_PRINCIPAL_STDIO;
  json_t *id = json_string(run_id);
  srv_task_t *t = id ? task_find(r->server, principal, id) : NULL;
  json_decref(id);
  return t && t->background ? t : NULL;
}

/* (with --route: an id of another replica is said to be that replica's, as tasks/get says) */
static json_t *unknown_run(const srv_server_t *s, const char *run_id) {
  cleanup_free char *id = cm_log_excerpt(run_id, strlen(run_id), 40);
  cleanup_free char *why = srv_route_unknown(s->cfg, "run", run_id);
  return srv_tool_error_result(
      "Unknown run_id '%s': %s (runs are kept for a while after they end, then forgotten).", id,
      why);
}

bool srv_request_background(srv_request_t *r, json_t **refusal) {
  srv_session_t *ss = r->session;
  srv_server_t *s = r->server;
  *refusal = NULL;
  if (r->task || r->batch || r->cancelled || r->done || !ss) return false;
  if (!srv_tasks_room(s, ss->principal)) {
    *refusal = srv_tool_error_result(
        "You have %llu runs and tasks already (the server's limit); a finished one is kept "
        "until its TTL. Run this one without background, or wait.",
        (unsigned long long)s->cfg->max_tasks_per_principal);
    return false;
  }
  srv_tasks_t *ts = store_of(s);
  srv_task_t *t = task_new(ts, ss->principal, s->cfg->max_task_ttl_ms);
  t->background = true;
  cm_buf_init(&t->news, 0);
  /* The client's answer now: the run's id. */
  cleanup_free char *text = xasprintf(
      "--- run %s: started in the background ---\nCall wait_run with run_id \"%s\" for its "
      "output and its result; cancel_run stops it.",
      t->id, t->id);
  json_t *answer = run_result(text, run_sc(t, "running", NULL), false);
  if (r->modern) srv_modern_decorate(answer);
  srv_reply_result(r->sink, NULL, r->id, answer);
  /* The call goes on as the run, on a session of its own with a stream that goes nowhere:
   * the client may go (its stream, its session) and come back with wait_run. Its progress
   * (its output) is kept for wait_run. */
  detach_to_own_session(r);
  srv_request_stop_heartbeat(r);
  json_decref(r->progress_token);
  r->progress_token = json_string("background");
  r->task = t;
  t->run = r;
  cm_debug("run %s: a background execute_python of %s", t->id, ss->principal);
  return true;
}

void srv_run_wait(srv_request_t *r, const char *run_id, uint64_t timeout_ms) {
  srv_task_t *t = run_find(r, run_id);
  if (!t) {
    srv_request_finish(r, unknown_run(r->server, run_id));
    return;
  }
  if (terminal(t)) {
    srv_request_finish(r, ended_answer(t));
    return;
  }
  size_t n = 0;
  for (task_waiter_t *w = t->waiters; w; w = w->next) n++;
  if (n >= TASK_MAX_WAITERS || timeout_ms == 0) {
    srv_request_finish(r, running_answer(t));
    return;
  }
  task_waiter_t *w = xcalloc(1, sizeof *w);
  w->r = r;
  w->task = t;
  w->run_wait = true;
  w->next = t->waiters;
  t->waiters = w;
  w->deadline = cm_loop_timer(r->server->loop, timeout_ms, on_wait_deadline, w);
  srv_request_on_cancel(r, waiter_cancelled, w);
}

void srv_tasks_stop_revoked(srv_server_t *s, bool (*revoked)(void *ctx, const char *principal),
                            void *ctx) {
  srv_tasks_t *ts = s->tasks;
  if (!ts) return;
  size_t n = 0;
  for (srv_task_t *t = ts->head; t; t = t->next) {
    if (terminal(t) || !revoked(ctx, t->principal)) continue;
    cm_debug("task %s of %s: cancelled, its token was removed", t->id, t->principal);
    task_stop_run(t);
    task_settle(t, TASK_CANCELLED, "cancelled: its principal's token was removed");
    n++;
  }
  if (n) cm_info("SIGHUP: %zu tasks and background runs of removed tokens cancelled", n);
}

void srv_run_cancel(srv_request_t *r, const char *run_id) {
  srv_task_t *t = run_find(r, run_id);
  if (!t) {
    srv_request_finish(r, unknown_run(r->server, run_id));
    return;
  }
  if (terminal(t)) {
    cleanup_free char *text =
        xasprintf("--- run %s had already ended (%s) ---", t->id, status_names[t->status]);
    srv_request_finish(r, run_result(text, run_sc(t, status_names[t->status], NULL), false));
    return;
  }
  cm_debug("run %s cancelled by cancel_run", t->id);
  task_stop_run(t);
  task_settle(t, TASK_CANCELLED, "cancelled by cancel_run");
  cleanup_free char *text = xasprintf("--- run %s: cancelled ---", t->id);
  srv_request_finish(r, run_result(text, run_sc(t, "cancelled", NULL), false));
}
