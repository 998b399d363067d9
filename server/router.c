/* The JSON-RPC/MCP router: envelope checks, lifecycle, dispatch, requests in flight,
 * progress, logging and cancellation.  Transport-neutral: everything goes out through
 * tr_sink_t. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "envstore/envstore.h"
#include "server/files/files.h"
#include "server/network.h"
#include "server/server-internal.h"

static const char *const mcp_log_levels[] = {"debug",    "info",  "notice", "warning",
                                             "error",    "critical", "alert", "emergency"};

typedef struct srv_batch {
  tr_sink_t *sink;
  json_t *responses; /* array; a slot per element that gets an answer (json null until then) */
  size_t pending;
  size_t bytes;     /* of the answers so far, as sent (compact JSON) */
  size_t max_bytes; /* --max-message-bytes: the answer is one message too */
} srv_batch_t;

/* A batch is one message whose answers are built in memory before any is sent: a few
 * bytes per element could ask for megabytes each (resources/read, tools/list).  So it
 * has at most this many elements, and its answers together at most max_bytes; past that
 * an element gets an error (and no work is done for it). */
#define SRV_MAX_BATCH 256

#define SRV_PROBE_DELAY_MS 20

struct srv_server {
  cm_loop_t *loop;
  srv_config_t *cfg;
  sbx_backend_t *backend;
  sbx_cgroups_t *cgroups;
  srv_prestart_t *prestart;
  sbx_backend_t *host;
  py_registry_t *pythons;
  char **python_dirs; /* --python-dir, as the registry's vector */
  char **extra_index_urls, **find_links, **build_network_allow; /* the store's vectors */
  env_store_t *envs;
  srv_network_t *network;
  art_store_t *artifacts;
  tr_http_t *http; /* the HTTP transport, if any */
  void *warm_wait;
  void *warm_probe_wait;
  py_interp_t *warm_python;
  bool probed;                    /* the backend's probe has finished */
  sbx_probe_t *probe;             /* in flight */
  struct probe_wait *probe_waits; /* callers waiting for it */
  cm_timer_t *probe_flush;        /* calls the waiters: a timer, so freeing the server cancels it */
  cm_timer_t *probe_timer;
  char *state_dir;
  char *runs_dir; /* work/srv-XXXXXX, locked while we live */
  int runs_lock;
  srv_request_t *inflight;
  size_t n_inflight;
  const srv_extension_t *ext;    /* NULL in the product */
  struct srv_client_call *calls; /* server -> client requests awaiting a response */
};

struct srv_session {
  srv_server_t *server;
  tr_sink_t *sink;
  char *principal;    /* who owns it (srv.h) */
  char *protocol;     /* negotiated version; NULL before initialize */
  bool ready;         /* notifications/initialized received */
  int log_level;      /* index into mcp_log_levels; -1 = not set: no log notifications */
  json_t *client_info;
  json_t *client_capabilities; /* from initialize; NULL if none were sent */
  uint64_t next_call;          /* numbers the ids of our requests to the client */
};

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
  char *method; /* a request taken by the extension: its method and params */
  json_t *params;
  bool done; /* answered (or dropped); freed once nothing on the stack uses it */
  int busy;  /* callbacks running on it: srv_request_finish then only marks it done */
  srv_request_t *prev, *next;
};

/* ---------------------------------------------------------------- server */

/* "a b c" -> {"a", "b", "c", NULL} (the flags keep repeatable values joined by spaces). */
static char **split_spaces(const char *s) {
  cm_strv_builder_t b = {0};
  cleanup_free char *copy = s ? xstrdup(s) : NULL;
  char *save = NULL;
  for (char *t = copy ? strtok_r(copy, " ", &save) : NULL; t; t = strtok_r(NULL, " ", &save))
    cm_strv_add(&b, t);
  return cm_strv_steal(&b);
}

static eg_proxy_t *network_proxy(void *data, cm_error_t *err) { return srv_network_proxy(data, err); }

static char *default_state_dir(void) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return xasprintf("%s/%s", xdg, SRV_NAME);
  const char *home = getenv("HOME");
  if (home && *home == '/') return xasprintf("%s/.cache/%s", home, SRV_NAME);
  return xasprintf("/tmp/%s-%u", SRV_NAME, (unsigned)getuid());
}

/* The sandbox backend is probed like every other child process is run: started from the
 * loop, its outcome arriving by callback.  Calls that need the backend before then wait
 * (srv_server_when_probed) without blocking the loop. */
typedef struct probe_wait {
  struct probe_wait *next;
  void (*cb)(void *data);
  void *data;
} probe_wait_t;

static void flush_probe_waits(cm_loop_t *loop, cm_timer_t *t, void *data) {
  srv_server_t *s = data;
  s->probe_flush = NULL;
  /* One at a time from the head: a callback may cancel or add others. */
  while (s->probed && s->probe_waits) {
    probe_wait_t *w = s->probe_waits;
    s->probe_waits = w->next;
    w->cb(w->data);
    free(w);
  }
}

static void queue_probe_flush(srv_server_t *s) {
  if (s->probe_flush || !s->probe_waits) return;
  s->probe_flush = cm_loop_timer(s->loop, 0, flush_probe_waits, s);
}

static void on_probed(void *data, sbx_backend_t *b) {
  srv_server_t *s = data;
  s->probe = NULL;
  s->probed = true;
  if (!b->available)
    cm_warn("sandbox backend %s is not available: %s; executions will be refused (no fall back)",
            sbx_backend_name(b), b->unavailable);
  else
    srv_prestart_start(s);
  queue_probe_flush(s);
}

static void ensure_probed(srv_server_t *s) {
  if (s->probed || s->probe) return;
  cm_timer_cancel(s->probe_timer);
  s->probe_timer = NULL;
  s->probe = sbx_backend_probe_start(s->backend, s->loop, on_probed, s);
}

bool srv_server_probed(srv_server_t *s) {
  return s->probed;
}

void *srv_server_when_probed(srv_server_t *s, void (*cb)(void *data), void *data) {
  probe_wait_t *w = xcalloc(1, sizeof *w);
  w->cb = cb;
  w->data = data;
  probe_wait_t **tail = &s->probe_waits;
  while (*tail) tail = &(*tail)->next;
  *tail = w;
  ensure_probed(s);
  if (s->probed) queue_probe_flush(s);
  return w;
}

void srv_server_cancel_probe_wait(srv_server_t *s, void *wait) {
  for (probe_wait_t **p = &s->probe_waits; *p; p = &(*p)->next) {
    if (*p == wait) {
      *p = ((probe_wait_t *)wait)->next;
      free(wait);
      return;
    }
  }
}

static void probe_soon(cm_loop_t *loop, cm_timer_t *t, void *data) {
  srv_server_t *s = data;
  s->probe_timer = NULL;
  ensure_probed(s);
}

/* Once the interpreters are known and the sandbox probed: warm the download cache in the
 * background. */
static void warm_when_probed(void *data) {
  srv_server_t *s = data;
  s->warm_probe_wait = NULL;
  py_interp_t *def = s->warm_python;
  s->warm_python = NULL;
  if (!s->backend->available) return;
  cleanup_free char *list = srv_find_profile_file("warmup.txt");
  if (def && list) env_store_warm(s->envs, def, list);
}

static void start_warming(void *data, py_interp_t *def, const char *error) {
  srv_server_t *s = data;
  s->warm_wait = NULL;
  if (!def) return;
  s->warm_python = def;
  s->warm_probe_wait = srv_server_when_probed(s, warm_when_probed, s);
}

/* Absolute, no empty, "." or ".." component, no trailing slash: what the sandboxes accept
 * as the root of their mounts. */
static bool state_path_is_clean(const char *p) {
  if (p[0] != '/') return false;
  if (p[1] == '\0') return true;
  for (const char *c = p; *c;) {
    c++;
    const char *e = strchrnul(c, '/');
    size_t n = (size_t)(e - c);
    if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return false;
    c = e;
  }
  return true;
}

srv_server_t *srv_server_new(cm_loop_t *loop, srv_config_t *cfg, cm_error_t *err) {
  cleanup_free char *state = cfg->state_dir ? xstrdup(cfg->state_dir) : default_state_dir();
  if (cm_mkdir_p(state, 0700, err) < 0) {
    cm_error_wrap(err, "creating the state directory");
    return NULL;
  }
  /* Every path under the state directory ends up in a mount of the sandbox, which takes
   * clean absolute paths only: a relative --state-dir (or one with "..") is resolved here,
   * once, against the directory the server started in. */
  if (!state_path_is_clean(state)) {
    cleanup_free char *resolved = realpath(state, NULL);
    if (!resolved) {
      cm_error_set(err, errno, CM_ERR_IO, "resolving the state directory %s", state);
      return NULL;
    }
    cm_info("state directory: %s (given as %s)", resolved, state);
    free(state);
    state = steal_pointer(&resolved);
  }
  cleanup_free char *work = xasprintf("%s/work", state);
  if (cm_mkdir_p(work, 0711, err) < 0) {
    cm_error_wrap(err, "creating the work directory");
    return NULL;
  }
  chmod(work, 0711);
  srv_workdir_sweep(work, cfg->max_timeout + cfg->kill_grace_ms / 1000 + 600);
  int runs_lock = -1;
  cleanup_free char *runs_dir = srv_workdir_claim(work, &runs_lock, err);
  if (!runs_dir) {
    cm_error_wrap(err, "creating the work directory");
    return NULL;
  }
  const char *backend_name = cfg->sandbox_backend;
  sbx_backend_t *backend = sbx_backend_new(backend_name, err);
  if (!backend) {
    srv_workdir_release(runs_dir, runs_lock);
    return NULL;
  }
  sbx_cgroups_t *cgroups = sbx_cgroups_open(cfg->cgroup, err);
  if (!cgroups) {
    sbx_backend_free(backend);
    srv_workdir_release(runs_dir, runs_lock);
    return NULL;
  }
  cleanup_free char *cg_text = sbx_cgroups_describe(cgroups);
  cm_info("cgroups: %s", cg_text);
  sbx_backend_set_cgroups(backend, cgroups);
  sbx_cgroups_set_loop(cgroups, loop);
  art_store_t *artifacts = art_store_new(loop, cfg, state, err);
  if (!artifacts) {
    sbx_backend_free(backend);
    sbx_cgroups_free(cgroups);
    srv_workdir_release(runs_dir, runs_lock);
    return NULL;
  }
  srv_server_t *s = xcalloc(1, sizeof *s);
  s->artifacts = artifacts;
  s->loop = loop;
  s->cfg = cfg;
  s->backend = backend;
  s->cgroups = cgroups;
  s->host = sbx_backend_new("none", err);
  sbx_backend_probe(s->host);
  s->state_dir = steal_pointer(&state);
  s->runs_dir = steal_pointer(&runs_dir);
  s->runs_lock = runs_lock;
  cm_strv_builder_t dirs = {0};
  cleanup_free char *dirs_copy = cfg->python_dirs ? xstrdup(cfg->python_dirs) : NULL;
  char *save = NULL;
  for (char *d = dirs_copy ? strtok_r(dirs_copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save))
    cm_strv_add(&dirs, d);
  s->python_dirs = cm_strv_steal(&dirs);
  py_options_t py_opts = {
      .python = cfg->python,
      .python_dirs = s->python_dirs,
      .python_version = cfg->python_version,
      .allow_downloads = cfg->allow_python_downloads,
      .uv_path = cfg->uv_path,
      .download_timeout_ms = cfg->build_timeout_ms,
  };
  s->pythons = py_registry_new(loop, &py_opts, s->state_dir);
  s->extra_index_urls = split_spaces(cfg->extra_index_urls);
  s->find_links = split_spaces(cfg->find_links);
  s->build_network_allow = split_spaces(cfg->build_network_allow);
  env_options_t env_opts = {
      .installer = cfg->installer,
      .uv_path = cfg->uv_path,
      .index_url = cfg->index_url,
      .extra_index_urls = s->extra_index_urls,
      .find_links = s->find_links,
      .build_network_allow = s->build_network_allow,
      .offline = cfg->offline,
      .max_cache_bytes = cfg->max_cache_bytes,
      .env_max_age_ms = cfg->env_max_age_ms,
      .build_timeout_ms = cfg->build_timeout_ms,
      .max_build_bytes = cfg->max_build_bytes,
      .kill_grace_ms = cfg->kill_grace_ms,
      .memory_bytes = cfg->memory_bytes,
      .max_processes = cfg->max_processes,
      .open_files = cfg->open_files,
      .tmp_bytes = cfg->tmp_bytes,
      .max_resolutions = cfg->max_concurrent,
      .max_resolutions_per_owner = cfg->max_token_running,
  };
  s->envs = env_store_new(loop, &env_opts, s->state_dir, s->runs_dir, backend);
  s->network = srv_network_new(loop, cfg);
  env_network_t env_net = {.proxy = network_proxy,
                           .deny = srv_network_deny_policy(s->network),
                           .data = s->network};
  env_store_set_network(s->envs, &env_net);
  /* The sandbox is probed right after start-up, once the handshake had its chance (or at
   * the first call that needs it, whichever comes first): it runs a whole trivial sandbox. */
  s->probe_timer = cm_loop_timer(loop, SRV_PROBE_DELAY_MS, probe_soon, s);
  if (cfg->warm_cache && !cfg->offline)
    s->warm_wait = py_registry_when_ready(s->pythons, start_warming, s);
  py_registry_start(s->pythons);
  return s;
}

void srv_server_free(srv_server_t *s) {
  if (!s) return;
  if (s->warm_wait) py_registry_cancel_wait(s->pythons, s->warm_wait);
  if (s->warm_probe_wait) srv_server_cancel_probe_wait(s, s->warm_probe_wait);
  cm_timer_cancel(s->probe_timer);
  sbx_probe_cancel(s->probe);
  s->probe = NULL;
  cm_timer_cancel(s->probe_flush);
  while (s->probe_waits) {
    probe_wait_t *w = s->probe_waits;
    s->probe_waits = w->next;
    free(w);
  }
  srv_prestart_free(s);
  art_store_free(s->artifacts);
  env_store_free(s->envs);
  srv_network_free(s->network); /* after the runs and builds: it closes what they left */
  py_registry_free(s->pythons);
  cm_strv_free(s->python_dirs);
  cm_strv_free(s->extra_index_urls);
  cm_strv_free(s->find_links);
  cm_strv_free(s->build_network_allow);
  sbx_backend_free(s->backend);
  sbx_backend_free(s->host);
  sbx_cgroups_free(s->cgroups); /* after the runs: it removes their directories */
  srv_workdir_release(s->runs_dir, s->runs_lock);
  free(s->runs_dir);
  free(s->state_dir);
  free(s);
}

cm_loop_t *srv_server_loop(srv_server_t *s) { return s->loop; }
const srv_config_t *srv_server_config(srv_server_t *s) { return s->cfg; }
sbx_backend_t *srv_server_backend(srv_server_t *s) {
  ensure_probed(s);
  return s->backend;
}
sbx_backend_t *srv_server_backend_kind(srv_server_t *s) { return s->backend; }
sbx_backend_t *srv_server_host_backend(srv_server_t *s) { return s->host; }
sbx_cgroups_t *srv_server_cgroups(srv_server_t *s) { return s->cgroups; }
srv_prestart_t **srv_server_prestart(srv_server_t *s) { return &s->prestart; }
py_registry_t *srv_server_pythons(srv_server_t *s) { return s->pythons; }
env_store_t *srv_server_envs(srv_server_t *s) { return s->envs; }
srv_network_t *srv_server_network(srv_server_t *s) { return s->network; }
art_store_t *srv_server_artifacts(srv_server_t *s) { return s->artifacts; }
const char *srv_server_state_dir(srv_server_t *s) { return s->state_dir; }
const char *srv_server_runs_dir(srv_server_t *s) { return s->runs_dir; }
size_t srv_server_inflight(srv_server_t *s) { return s->n_inflight; }
void srv_server_set_http(srv_server_t *s, tr_http_t *h) { s->http = h; }
tr_http_t *srv_server_http(srv_server_t *s) { return s->http; }

static void fail_client_calls(srv_request_t *r, const char *why);
static void request_free(srv_request_t *r);

static void request_cancel(srv_request_t *r) {
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
    request_cancel(r);
  }
}

/* ---------------------------------------------------------------- sessions */

srv_session_t *srv_session_new(srv_server_t *s, tr_sink_t *sink) {
  srv_session_t *ss = xcalloc(1, sizeof *ss);
  ss->server = s;
  ss->sink = tr_sink_ref(sink);
  ss->log_level = -1;
  ss->principal = xstrdup(SRV_PRINCIPAL_STDIO);
  return ss;
}

const char *srv_session_protocol(const srv_session_t *ss) { return ss->protocol; }

void srv_session_set_principal(srv_session_t *ss, const char *principal) {
  free(ss->principal);
  ss->principal = xstrdup(principal ? principal : SRV_PRINCIPAL_STDIO);
}

const char *srv_session_principal(const srv_session_t *ss) { return ss ? ss->principal : NULL; }

void srv_session_free(srv_session_t *ss) {
  if (!ss) return;
  /* Requests of this session lose their session pointer and are cancelled (which may
   * finish and free them). */
  srv_request_t *next;
  for (srv_request_t *r = ss->server->inflight; r; r = next) {
    next = r->next;
    if (r->session != ss) continue;
    r->session = NULL;
    request_cancel(r);
  }
  tr_sink_unref(ss->sink);
  free(ss->principal);
  free(ss->protocol);
  json_decref(ss->client_info);
  json_decref(ss->client_capabilities);
  free(ss);
}

static void send_json(tr_sink_t *sink, json_t *msg, tr_send_flags_t flags) {
  size_t len;
  cleanup_free char *text = srv_jsonrpc_dump(msg, &len);
  tr_sink_send(sink, text, len, flags);
}

static void batch_release(srv_batch_t *batch) {
  if (--batch->pending > 0) return;
  /* Drop the slots of cancelled requests (they stay null). */
  json_t *out = json_array();
  size_t i;
  json_t *v;
  json_array_foreach(batch->responses, i, v) if (!json_is_null(v)) json_array_append(out, v);
  if (json_array_size(out) > 0) send_json(batch->sink, out, TR_SEND_RESPONSE);
  json_decref(out);
  json_decref(batch->responses);
  tr_sink_unref(batch->sink);
  free(batch);
}

static bool batch_full(const srv_batch_t *batch) { return batch && batch->bytes >= batch->max_bytes; }

static json_t *batch_full_error(const srv_batch_t *batch, json_t *id) {
  cleanup_free char *msg = xasprintf("The batch's answers would exceed %zu bytes (--max-message-bytes): send this "
                                     "request again on its own", batch->max_bytes);
  return srv_jsonrpc_error(id, JSONRPC_INTERNAL_ERROR, msg, NULL);
}

/* Delivers a response: straight to the sink, or into its batch slot (an error in its place
 * if it does not fit in what is left of the batch's bytes). */
static void deliver(tr_sink_t *sink, srv_batch_t *batch, size_t slot, json_t *response) {
  if (!batch) {
    send_json(sink, response, TR_SEND_RESPONSE);
    json_decref(response);
    return;
  }
  if (!json_is_null(response)) {
    size_t n = json_dumpb(response, NULL, 0, JSON_COMPACT);
    if (batch->bytes + n > batch->max_bytes) {
      json_t *small = batch_full_error(batch, json_object_get(response, "id"));
      json_decref(response);
      response = small;
      n = json_dumpb(response, NULL, 0, JSON_COMPACT);
    }
    batch->bytes += n + 1;
  }
  json_array_set_new(batch->responses, slot, response);
  batch_release(batch);
}

static size_t batch_reserve(srv_batch_t *batch) {
  if (!batch) return 0;
  json_array_append_new(batch->responses, json_null());
  batch->pending++;
  return json_array_size(batch->responses) - 1;
}

static void reply_error(tr_sink_t *sink, srv_batch_t *batch, json_t *id, int code, const char *message) {
  deliver(sink, batch, batch_reserve(batch), srv_jsonrpc_error(id, code, message, NULL));
}

static void reply_result(tr_sink_t *sink, srv_batch_t *batch, json_t *id, json_t *result) {
  deliver(sink, batch, batch_reserve(batch), srv_jsonrpc_result(id, result));
  json_decref(result);
}

/* ---------------------------------------------------------------- requests */

srv_server_t *srv_request_server(srv_request_t *r) { return r->server; }
srv_session_t *srv_request_session(srv_request_t *r) { return r->session; }
bool srv_request_cancelled(const srv_request_t *r) { return r->cancelled; }
bool srv_request_has_progress(const srv_request_t *r) { return r->progress_token != NULL; }

void srv_request_on_cancel(srv_request_t *r, void (*cancel_cb)(void *data), void *data) {
  r->cancel_cb = cancel_cb;
  r->cancel_data = data;
}

void srv_request_progress(srv_request_t *r, double progress, const char *message, size_t len) {
  if (!r->progress_token || r->cancelled || progress <= r->last_progress) return;
  r->last_progress = progress;
  json_t *params = json_pack("{s:O, s:f}", "progressToken", r->progress_token, "progress", progress);
  if (message) json_object_set_new(params, "message", srv_json_string_lossy(message, len));
  json_t *n = srv_jsonrpc_notification("notifications/progress", params);
  send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

static int level_index(const char *level) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(mcp_log_levels); i++)
    if (strcmp(level, mcp_log_levels[i]) == 0) return (int)i;
  return -1;
}

bool srv_request_log_enabled(const srv_request_t *r, const char *level) {
  const srv_session_t *ss = r->session;
  int idx = level_index(level);
  return ss && !r->cancelled && ss->log_level >= 0 && idx >= ss->log_level;
}

void srv_request_log(srv_request_t *r, const char *level, const char *logger, json_t *data) {
  srv_session_t *ss = r->session;
  int idx = level_index(level);
  if (!ss || r->cancelled || ss->log_level < 0 || idx < ss->log_level) {
    json_decref(data);
    return;
  }
  json_t *params = json_pack("{s:s, s:o}", "level", level, "data", data);
  if (logger) json_object_set_new(params, "logger", json_string(logger));
  json_t *n = srv_jsonrpc_notification("notifications/message", params);
  send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

static srv_request_t *request_new(srv_session_t *ss, json_t *id, tr_sink_t *sink, srv_batch_t *batch) {
  srv_request_t *r = xcalloc(1, sizeof *r);
  r->server = ss->server;
  r->session = ss;
  r->id = json_incref(id);
  r->sink = tr_sink_ref(sink);
  r->batch = batch;
  r->batch_slot = batch_reserve(batch);
  srv_server_t *s = ss->server;
  r->next = s->inflight;
  if (s->inflight) s->inflight->prev = r;
  s->inflight = r;
  s->n_inflight++;
  return r;
}

static void request_free(srv_request_t *r) {
  json_decref(r->id);
  json_decref(r->progress_token);
  json_decref(r->params);
  free(r->method);
  tr_sink_unref(r->sink);
  free(r);
}

static void abandon_client_calls(srv_request_t *r);

/* Sends response (stolen; NULL for none) unless r was cancelled, and retires r. */
static void request_complete(srv_request_t *r, json_t *response) {
  srv_server_t *s = r->server;
  abandon_client_calls(r);
  if (r->cancelled) {
    json_decref(response);
    /* A cancelled request sends nothing; its batch slot stays null. */
    if (r->batch) deliver(r->sink, r->batch, r->batch_slot, json_null());
  } else if (response) {
    deliver(r->sink, r->batch, r->batch_slot, response);
  } else if (r->batch) {
    deliver(r->sink, r->batch, r->batch_slot, json_null());
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
  json_t *response = r->cancelled ? NULL : srv_jsonrpc_result(r->id, result);
  json_decref(result);
  request_complete(r, response);
}

/* MCP's "resource not found" (resources/read, protocol versions 2024-11-05 to 2025-11-25). */
#define MCP_RESOURCE_NOT_FOUND -32002

void srv_request_fail(srv_request_t *r, const cm_error_t *err) {
  if (r->cancelled) {
    request_complete(r, NULL);
    return;
  }
  const char *text = cm_error_message(err);
  json_t *uri = json_is_object(r->params) ? json_object_get(r->params, "uri") : NULL;
  json_t *response;
  if (err->kind == CM_ERR_NOT_FOUND && r->method && strncmp(r->method, "resources/", 10) == 0 &&
      json_is_string(uri)) {
    cleanup_free char *msg = xasprintf("Resource not found: %s", text);
    response =
        srv_jsonrpc_error(r->id, MCP_RESOURCE_NOT_FOUND, msg, json_pack("{s:O}", "uri", uri));
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
  request_complete(r, response);
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
  send_json(r->sink, n, TR_SEND_DROPPABLE);
  json_decref(n);
}

static void fail_client_calls(srv_request_t *r, const char *why) {
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
  send_json(r->sink, msg, TR_SEND_DEFAULT);
  json_decref(msg);
  return 0;
}

void srv_request_close_stream(srv_request_t *r) {
  if (!r->cancelled && !r->done) tr_sink_close_stream(r->sink);
}

/* A response from the client: to one of our requests, or ignored. */
static void handle_response(srv_session_t *ss, json_t *msg, const srv_msg_t *m) {
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

static srv_request_t *find_inflight(srv_session_t *ss, json_t *id) {
  for (srv_request_t *r = ss->server->inflight; r; r = r->next)
    if (r->session == ss && json_equal(r->id, id)) return r;
  return NULL;
}

/* ---------------------------------------------------------------- extensions */

void srv_server_set_extension(srv_server_t *s, const srv_extension_t *ext) {
  s->ext = ext;
}

static const srv_tool_t *extension_tool_find(const srv_extension_t *ext, const char *name) {
  for (size_t i = 0; ext && i < ext->n_tools; i++)
    if (strcmp(ext->tools[i].name, name) == 0) return &ext->tools[i];
  return NULL;
}

static void set_progress_token(srv_request_t *r, json_t *params) {
  json_t *meta = json_is_object(params) ? json_object_get(params, "_meta") : NULL;
  json_t *token = json_is_object(meta) ? json_object_get(meta, "progressToken") : NULL;
  if (json_is_string(token) || json_is_integer(token)) r->progress_token = json_incref(token);
}

/* Offers the request to the extension; true if it took it. */
static bool extension_request(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                              srv_batch_t *batch) {
  const srv_extension_t *ext = ss->server->ext;
  if (!ext || !ext->handle) return false;
  srv_request_t *r = request_new(ss, m->id, sink, batch);
  r->method = xstrdup(m->method);
  r->params = json_incref(m->params);
  set_progress_token(r, m->params);
  if (ext->handle(ext->data, r, m->method, m->params)) return true;
  /* Not its method: r goes without a trace (its batch slot stays null). */
  r->cancelled = true;
  request_complete(r, NULL);
  return false;
}

/* ---------------------------------------------------------------- methods */

static json_t *server_capabilities(void) {
  return json_pack("{s:{s:b}, s:{s:b, s:b}, s:{}}", "tools", "listChanged", 0, "resources",
                   "listChanged", 0, "subscribe", 0, "logging");
}

static void handle_initialize(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink, srv_batch_t *batch) {
  if (ss->protocol) {
    reply_error(sink, batch, id, JSONRPC_INVALID_REQUEST, "Invalid Request: the session is already initialized");
    return;
  }
  json_t *pv = params ? json_object_get(params, "protocolVersion") : NULL;
  if (!json_is_object(params) || !json_is_string(pv)) {
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, "Invalid params: initialize needs a string \"protocolVersion\"");
    return;
  }
  const char *requested = json_string_value(pv);
  const char *chosen = srv_protocol_supported(requested) ? requested : srv_protocol_versions[0];
  ss->protocol = xstrdup(chosen);
  json_t *ci = json_object_get(params, "clientInfo");
  if (json_is_object(ci)) ss->client_info = json_incref(ci);
  json_t *client_caps = json_object_get(params, "capabilities");
  if (json_is_object(client_caps)) ss->client_capabilities = json_incref(client_caps);
  json_t *caps = server_capabilities();
  const srv_extension_t *ext = ss->server->ext;
  if (ext && ext->capabilities) {
    json_t *extra = ext->capabilities(ext->data);
    if (json_is_object(extra)) json_object_update(caps, extra);
    json_decref(extra);
  }
  json_t *result = json_pack(
      "{s:s, s:o, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", chosen, "capabilities", caps,
      "serverInfo", "name", SRV_NAME, "title", "Python Exec Sandbox", "version", srv_version(), "instructions",
      "Runs Python scripts in a sandbox. Use execute_python to run a script (declare third-party packages "
      "in a PEP 723 '# /// script' block or the dependencies argument), validate_script to check one "
      "without running it, and check_environment to see the interpreters, sandbox and limits.");
  reply_result(sink, batch, id, result);
}

static void handle_tools_list(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink, srv_batch_t *batch) {
  json_t *cursor = params && json_is_object(params) ? json_object_get(params, "cursor") : NULL;
  if (cursor) {
    /* Everything fits on one page, so no cursor we could have issued exists. */
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, "Invalid params: unknown cursor");
    return;
  }
  size_t n;
  const srv_tool_t *tools = srv_tools(&n);
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(list, tools[i].describe(ss->server));
  const srv_extension_t *ext = ss->server->ext;
  for (size_t i = 0; ext && i < ext->n_tools; i++)
    json_array_append_new(list, ext->tools[i].describe(ss->server));
  reply_result(sink, batch, id, json_pack("{s:o}", "tools", list));
}

static void handle_tools_call(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink, srv_batch_t *batch) {
  json_t *name = json_is_object(params) ? json_object_get(params, "name") : NULL;
  if (!json_is_string(name)) {
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, "Invalid params: tools/call needs a string \"name\"");
    return;
  }
  json_t *args = json_object_get(params, "arguments");
  if (args && !json_is_object(args) && !json_is_null(args)) {
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, "Invalid params: \"arguments\" must be an object");
    return;
  }
  const srv_tool_t *tool = srv_tool_find(json_string_value(name));
  if (!tool) tool = extension_tool_find(ss->server->ext, json_string_value(name));
  if (!tool) {
    cleanup_free char *excerpt = cm_log_excerpt(json_string_value(name), json_string_length(name), 64);
    cleanup_free char *msg = xasprintf("Invalid params: unknown tool '%s'", excerpt);
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, msg);
    return;
  }
  srv_request_t *r = request_new(ss, id, sink, batch);
  set_progress_token(r, params);
  json_t *arguments = json_is_object(args) ? json_incref(args) : json_object();
  tool->call(r, arguments);
  json_decref(arguments);
}

static void handle_set_level(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink, srv_batch_t *batch) {
  json_t *level = json_is_object(params) ? json_object_get(params, "level") : NULL;
  int idx = json_is_string(level) ? level_index(json_string_value(level)) : -1;
  if (idx < 0) {
    reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                "Invalid params: \"level\" must be one of debug, info, notice, warning, error, critical, alert, emergency");
    return;
  }
  ss->log_level = idx;
  reply_result(sink, batch, id, json_object());
}

/* MCP's "resource not found" (resources/read, protocol versions 2024-11-05 to 2025-11-25). */

/* resources/list, resources/read, resources/templates/list: the artifacts of runs. */
static void handle_resources(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                             srv_batch_t *batch) {
  json_t *params = json_is_object(m->params) ? m->params : NULL;
  if (m->params && !params && !json_is_null(m->params)) {
    reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS,
                "Invalid params: params must be an object");
    return;
  }
  json_t *cursor = params ? json_object_get(params, "cursor") : NULL;
  if (cursor && !json_is_null(cursor) && !json_is_string(cursor)) {
    reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS,
                "Invalid params: \"cursor\" must be a string");
    return;
  }
  const char *cursor_text = json_is_string(cursor) ? json_string_value(cursor) : NULL;
  json_t *uri = params ? json_object_get(params, "uri") : NULL;
  json_t *result = NULL;
  cm_error_t err = CM_ERROR_INIT;
  int rc = 0;
  if (strcmp(m->method, "resources/templates/list") == 0) {
    if (cursor_text)
      rc = cm_error_set(&err, 0, CM_ERR_INVALID, "unknown cursor");
    else
      result = art_store_templates();
  } else if (strcmp(m->method, "resources/list") == 0) {
    rc = art_store_list(ss->server->artifacts, ss->principal, cursor_text, &result, &err);
  } else if (!json_is_string(uri) || strlen(json_string_value(uri)) != json_string_length(uri)) {
    rc = cm_error_set(&err, 0, CM_ERR_INVALID, "resources/read needs a string \"uri\"");
  } else {
    /* In a batch, a file whose answer cannot fit is not even read. */
    rc = art_store_read(ss->server->artifacts, ss->principal, json_string_value(uri),
                        batch ? batch->max_bytes - batch->bytes : 0, &result, &err);
  }
  if (rc == 0) {
    reply_result(sink, batch, m->id, result);
    return;
  }
  if (err.kind == CM_ERR_NOT_FOUND) {
    cleanup_free char *excerpt =
        cm_log_excerpt(json_string_value(uri), json_string_length(uri), 200);
    cleanup_free char *msg = xasprintf("Resource not found: %s", excerpt);
    deliver(sink, batch, batch_reserve(batch),
            srv_jsonrpc_error(m->id, MCP_RESOURCE_NOT_FOUND, msg, json_pack("{s:O}", "uri", uri)));
  } else if (err.kind == CM_ERR_LIMIT && batch) {
    deliver(sink, batch, batch_reserve(batch), batch_full_error(batch, m->id));
  } else if (err.kind == CM_ERR_INVALID || err.kind == CM_ERR_LIMIT) {
    cleanup_free char *msg = xasprintf("Invalid params: %s", cm_error_message(&err));
    reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS, msg);
  } else {
    cm_warn("%s: %s", m->method, cm_error_message(&err));
    cleanup_free char *msg = xasprintf("Internal error: %s", cm_error_message(&err));
    reply_error(sink, batch, m->id, JSONRPC_INTERNAL_ERROR, msg);
  }
  cm_error_release(&err);
}

static void handle_request(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink, srv_batch_t *batch) {
  const char *method = m->method;
  if (strcmp(method, "ping") == 0) {
    reply_result(sink, batch, m->id, json_object());
    return;
  }
  if (strcmp(method, "initialize") == 0) {
    handle_initialize(ss, m->id, m->params, sink, batch);
    return;
  }
  if (!ss->protocol) {
    reply_error(sink, batch, m->id, JSONRPC_INVALID_REQUEST,
                "Invalid Request: the session is not initialized; send initialize first");
    return;
  }
  if (find_inflight(ss, m->id)) {
    reply_error(sink, batch, m->id, JSONRPC_INVALID_REQUEST, "Invalid Request: a request with this id is still in flight");
    return;
  }
  if (batch_full(batch)) {
    deliver(sink, batch, batch_reserve(batch), batch_full_error(batch, m->id));
    return;
  }
  if (extension_request(ss, m, sink, batch)) return;
  if (strcmp(method, "tools/list") == 0) {
    handle_tools_list(ss, m->id, m->params, sink, batch);
  } else if (strcmp(method, "tools/call") == 0) {
    handle_tools_call(ss, m->id, m->params, sink, batch);
  } else if (strcmp(method, "logging/setLevel") == 0) {
    handle_set_level(ss, m->id, m->params, sink, batch);
  } else if (strcmp(method, "resources/list") == 0 || strcmp(method, "resources/read") == 0 ||
             strcmp(method, "resources/templates/list") == 0) {
    handle_resources(ss, m, sink, batch);
  } else {
    cleanup_free char *excerpt = cm_log_excerpt(method, strlen(method), 64);
    cleanup_free char *msg = xasprintf("Method not found: %s", excerpt);
    reply_error(sink, batch, m->id, JSONRPC_METHOD_NOT_FOUND, msg);
  }
}

static void handle_notification(srv_session_t *ss, const srv_msg_t *m) {
  if (strcmp(m->method, "notifications/initialized") == 0) {
    ss->ready = true;
  } else if (strcmp(m->method, "notifications/cancelled") == 0) {
    json_t *rid = json_is_object(m->params) ? json_object_get(m->params, "requestId") : NULL;
    if (!rid) return;
    srv_request_t *r = find_inflight(ss, rid);
    /* Unknown or finished ids are ignored: the race with a response is allowed. */
    if (r) {
      cm_debug("request cancelled by the client");
      request_cancel(r);
    }
  }
  /* Other notifications need nothing from us. */
}

static void handle_one(srv_session_t *ss, json_t *msg, tr_sink_t *sink, srv_batch_t *batch) {
  srv_msg_t m;
  srv_jsonrpc_classify(msg, &m);
  switch (m.kind) {
    case SRV_MSG_REQUEST:
      handle_request(ss, &m, sink, batch);
      break;
    case SRV_MSG_NOTIFICATION:
      handle_notification(ss, &m);
      break;
    case SRV_MSG_RESPONSE:
      handle_response(ss, msg, &m);
      break;
    default:
      reply_error(sink, batch, m.id, JSONRPC_INVALID_REQUEST, m.error);
      break;
  }
}

/* The id of a single request in a text refused before it was parsed (too deep for us,
 * not for jansson), so that the error can carry it; NULL when there is none to read. */
static json_t *refused_request_id(const char *buf, size_t len) {
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!root) return NULL;
  srv_msg_t m;
  srv_jsonrpc_classify(root, &m);
  json_t *id = m.kind != SRV_MSG_RESPONSE && m.id ? json_incref(m.id) : NULL;
  json_decref(root);
  return id;
}

void srv_session_handle(srv_session_t *ss, const char *buf, size_t len, tr_sink_t *reply) {
  int code;
  cleanup_free char *why = NULL;
  json_t *root = srv_jsonrpc_parse(buf, len, &code, &why);
  if (!root) {
    cleanup_free char *excerpt = cm_log_excerpt(buf, len, 80);
    cm_debug("refused message: %s: %s", why, excerpt);
    json_t *id = code == JSONRPC_INVALID_REQUEST ? refused_request_id(buf, len) : NULL;
    reply_error(reply, NULL, id, code, why);
    json_decref(id);
    return;
  }
  if (json_is_array(root)) {
    if (!ss->protocol || strcmp(ss->protocol, "2025-03-26") != 0) {
      /* A batch, refused as a whole: no one id to answer with (JSON-RPC's null). */
      reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST,
                  "Invalid Request: batches are only accepted in protocol version 2025-03-26");
    } else if (json_array_size(root) == 0) {
      reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, "Invalid Request: empty batch");
    } else if (json_array_size(root) > SRV_MAX_BATCH) {
      cleanup_free char *msg = xasprintf("Invalid Request: a batch of %zu messages exceeds the limit of %d",
                                         json_array_size(root), SRV_MAX_BATCH);
      reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, msg);
    } else {
      srv_batch_t *batch = xcalloc(1, sizeof *batch);
      batch->sink = tr_sink_ref(reply);
      batch->responses = json_array();
      batch->bytes = 2; /* the brackets */
      batch->max_bytes = (size_t)ss->server->cfg->max_message_bytes;
      batch->pending = 1; /* held until every element is dispatched */
      size_t i;
      json_t *el;
      json_array_foreach(root, i, el) handle_one(ss, el, reply, batch);
      /* Release the hold; sends the array if every answer is already in. */
      batch_release(batch);
    }
  } else {
    handle_one(ss, root, reply, NULL);
  }
  json_decref(root);
}

void srv_session_oversize(srv_session_t *ss, size_t len, tr_sink_t *reply) {
  cleanup_free char *msg = xasprintf("Invalid Request: message of %zu bytes exceeds the limit of %llu bytes", len,
                                     (unsigned long long)ss->server->cfg->max_message_bytes);
  cm_warn("%s", msg);
  reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, msg);
}
