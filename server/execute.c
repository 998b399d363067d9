/* execute_python: validate, wait for the interpreter and a free slot, run the script in
 * the configured sandbox, stream its output as progress, and answer in the seed's text
 * format plus structuredContent. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/envcache.h"
#include "server/files.h"
#include "server/network.h"
#include "server/script.h"
#include "server/server-internal.h"

/* Progress notifications: at most one per interval per call, each carrying at most this
 * much text; what a flood produces beyond that is counted and skipped (the final result
 * still has the head and tail). */
#define EXEC_COALESCE_MS 2
#define EXEC_PROGRESS_BURST 8.0
#define EXEC_PROGRESS_PER_SECOND 20.0
#define EXEC_PROGRESS_MAX_TEXT 4096
#define EXEC_MAX_DEPENDENCIES 256
/* A run counts as starting (sandbox set-up and interpreter start-up) for this long. */
#define EXEC_START_WINDOW_MS 100

typedef struct exec_job exec_job_t;
typedef struct exec_tenant exec_tenant_t;

struct exec_job {
  srv_request_t *req;
  srv_server_t *server;
  const srv_config_t *cfg;
  char *script;
  size_t script_len;
  uint64_t timeout_s;
  char *timeout_note;
  char *python_request;   /* the call's python_version, or NULL */
  char *requires_python;  /* the script's PEP 723 requires-python, or NULL */
  char **requirements;    /* merged PEP 723 + argument requirements (NULL-terminated) */
  char *uv_config;        /* the script's [tool.uv] table as TOML, or NULL */
  size_t n_requirements;
  void *env_wait;
  env_handle_t *env;
  bool download_tried, downloading;
  bool workdir_mounted;
  double setup_progress;  /* progress counter while the environment is prepared */
  void *py_wait;
  void *probe_wait; /* waiting for the sandbox's probe (srv_server_when_probed) */
  py_interp_t *py;
  bool queued; /* waiting for a slot */
  exec_job_t *queue_next;
  exec_job_t *all_prev, *all_next; /* every job, for per-session counts */
  srv_session_t *session;          /* compared, never dereferenced (it may be gone) */
  exec_tenant_t *tenant;           /* whose call it is (the session's principal) */
  bool holds_slot;
  uint64_t starting_since; /* ms; 0 = not (or no longer) starting */
  char *workdir;
  files_inputs_t inputs; /* the files argument, written before the script starts */
  bool network;          /* this call's network (never more than the server allows) */
  srv_net_call_t net;    /* the same, with the call's own list of destinations */
  eg_session_t *egress;  /* the run's egress proxy session, or NULL */
  sbx_run_t *run;
  bool prestarted; /* run is the prestarted sandbox */
  cm_headtail_t out, err;
  /* progress */
  cm_buf_t pending;
  uint64_t skipped;
  uint64_t streamed;
  cm_buf_t pending_err; /* stderr for notifications/message */
  double tokens;
  uint64_t last_refill_ms;
  cm_timer_t *flush_timer;
};

/* Slots: at most cfg->max_concurrent scripts run at once; the rest wait.  Of those, at
 * most max_starting (cfg->max_starting, or one per CPU) may be in their first
 * EXEC_START_WINDOW_MS at once: starting a run is the CPU-heavy part (bubblewrap's set-up,
 * the interpreter's start-up, ~40 ms of CPU for print('hi')), and a burst of calls that all
 * start together only makes each start slower (more processes fighting for the caches and
 * the CPUs) without finishing any sooner.  A run leaves its start-up when it ends or when
 * the window is over, whichever comes first, so scripts that sleep or wait still overlap
 * as before, a window later.
 *
 * Waiting calls are queued per principal (a tenant: a bearer token's name, "local",
 * "stdio"), oldest first, and admitted round-robin across principals: a free slot goes to
 * the next principal after the one served last that has a call waiting and is under its
 * --max-token-running, so one principal's backlog never delays another's call by more than
 * one turn.  A job holds its slot from admission to its end, building its dependency
 * environment included.  With one principal (stdio) this is the plain FIFO it always was. */
struct exec_tenant {
  char *principal;
  size_t jobs;    /* its calls from validation to the answer (--max-token-concurrent) */
  size_t running; /* of those, holding a slot (--max-token-running) */
  size_t queued;  /* of those, waiting for a slot */
  exec_job_t *queue_head, *queue_tail;
  exec_tenant_t *next; /* tenants, in the order they came: the round's order */
};

static size_t slots_used;
static size_t n_starting;
static cm_timer_t *start_gate_timer;
static exec_job_t *all_jobs;
static exec_tenant_t *tenants;
static exec_tenant_t *last_served; /* the round goes on after it; NULL: from the first */

static size_t session_jobs(srv_session_t *ss) {
  size_t n = 0;
  for (exec_job_t *j = all_jobs; j; j = j->all_next) n += j->session == ss;
  return n;
}

static exec_tenant_t *tenant_find(const char *principal) {
  for (exec_tenant_t *t = tenants; t; t = t->next)
    if (strcmp(t->principal, principal) == 0) return t;
  return NULL;
}

/* A principal's tenant, with one more job (made on its first). */
static exec_tenant_t *tenant_hold(const char *principal) {
  exec_tenant_t *t = tenant_find(principal);
  if (!t) {
    t = xcalloc(1, sizeof *t);
    t->principal = xstrdup(principal);
    exec_tenant_t **link = &tenants;
    while (*link) link = &(*link)->next;
    *link = t;
  }
  t->jobs++;
  return t;
}

/* One job fewer; a tenant without jobs goes (the round then goes on from the one before
 * it). */
static void tenant_release(exec_tenant_t *t) {
  if (--t->jobs > 0) return;
  exec_tenant_t *prev = NULL;
  for (exec_tenant_t *x = tenants; x != t; x = x->next) prev = x;
  if (prev)
    prev->next = t->next;
  else
    tenants = t->next;
  if (last_served == t) last_served = prev;
  free(t->principal);
  free(t);
}

static bool tenant_may_run(const exec_tenant_t *t, const srv_config_t *cfg) {
  return t->queue_head && (!cfg->max_token_running || t->running < cfg->max_token_running);
}

/* The tenant whose turn it is: the first after last_served (going round) with a call it
 * may start; NULL if there is none. */
static exec_tenant_t *tenant_next(const srv_config_t *cfg) {
  if (!tenants) return NULL;
  exec_tenant_t *start = last_served && last_served->next ? last_served->next : tenants;
  exec_tenant_t *t = start;
  do {
    if (tenant_may_run(t, cfg)) return t;
    t = t->next ? t->next : tenants;
  } while (t != start);
  return NULL;
}

bool srv_exec_hold(const srv_config_t *cfg, const char *principal) {
  const exec_tenant_t *known = tenant_find(principal);
  if (cfg->max_token_concurrent && known && known->jobs >= cfg->max_token_concurrent) return false;
  tenant_hold(principal);
  return true;
}

void srv_exec_release(const char *principal) {
  exec_tenant_t *t = tenant_find(principal);
  if (t) tenant_release(t);
}

void srv_exec_usage(const char *principal, srv_exec_usage_t *out) {
  memset(out, 0, sizeof *out);
  const exec_tenant_t *t = principal ? tenant_find(principal) : NULL;
  if (!t) return;
  out->calls = t->jobs;
  out->running = t->running;
  out->queued = t->queued;
}

static void job_start(exec_job_t *job);
static void remove_workdir(const char *workdir, bool mounted);

static void job_free(exec_job_t *job) {
  if (job->all_prev)
    job->all_prev->all_next = job->all_next;
  else if (all_jobs == job)
    all_jobs = job->all_next;
  if (job->all_next) job->all_next->all_prev = job->all_prev;
  if (!all_jobs && start_gate_timer) { /* nothing left to admit (and the loop may be going away) */
    cm_timer_cancel(start_gate_timer);
    start_gate_timer = NULL;
  }
  eg_session_close(job->egress);
  srv_net_call_release(&job->net);
  tenant_release(job->tenant);
  free(job->script);
  free(job->timeout_note);
  free(job->python_request);
  free(job->requires_python);
  cm_strv_free(job->requirements);
  free(job->uv_config);
  env_release(job->env);
  free(job->workdir);
  files_inputs_release(&job->inputs);
  cm_headtail_release(&job->out);
  cm_headtail_release(&job->err);
  cm_buf_release(&job->pending);
  cm_buf_release(&job->pending_err);
  free(job);
}

static size_t max_starting(const srv_config_t *cfg) {
  if (cfg->max_starting) return (size_t)cfg->max_starting;
  static size_t cpus;
  if (!cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cpus = n > 0 ? (size_t)n : 1;
  }
  return cpus;
}

static void starting_end(exec_job_t *job) {
  if (!job->starting_since) return;
  job->starting_since = 0;
  n_starting--;
}

static void admit_queued(cm_loop_t *loop, const srv_config_t *cfg);

static const srv_config_t *start_gate_cfg;

static void on_start_gate(cm_loop_t *loop, cm_timer_t *t, void *data) {
  (void)t;
  (void)data;
  start_gate_timer = NULL;
  admit_queued(loop, start_gate_cfg);
}

/* Starts waiting jobs, in turn across tenants, while there is a slot and room to start;
 * when only the start gate holds them back, wakes up when the oldest start-up window is
 * over. */
static void admit_queued(cm_loop_t *loop, const srv_config_t *cfg) {
  uint64_t now = cm_now_ms();
  uint64_t oldest = 0;
  for (exec_job_t *j = all_jobs; j; j = j->all_next) {
    if (j->starting_since && now >= j->starting_since + EXEC_START_WINDOW_MS) starting_end(j);
    if (j->starting_since && (!oldest || j->starting_since < oldest)) oldest = j->starting_since;
  }
  exec_tenant_t *t;
  while (slots_used < cfg->max_concurrent && n_starting < max_starting(cfg) && (t = tenant_next(cfg))) {
    exec_job_t *next = t->queue_head;
    t->queue_head = next->queue_next;
    if (!t->queue_head) t->queue_tail = NULL;
    next->queue_next = NULL;
    t->queued--;
    last_served = t;
    next->queued = false;
    next->holds_slot = true;
    next->starting_since = now ? now : 1;
    slots_used++;
    t->running++;
    n_starting++;
    if (!oldest) oldest = next->starting_since;
    job_start(next); /* may finish the job, and come back here */
  }
  if (slots_used < cfg->max_concurrent && !start_gate_timer && oldest && tenant_next(cfg)) {
    uint64_t at = oldest + EXEC_START_WINDOW_MS;
    start_gate_cfg = cfg;
    start_gate_timer = cm_loop_timer(loop, at > now ? at - now : 1, on_start_gate, NULL);
  }
}

static void slot_release(exec_job_t *job) {
  if (!job->holds_slot) return;
  job->holds_slot = false;
  slots_used--;
  job->tenant->running--;
  starting_end(job);
  admit_queued(srv_server_loop(job->server), job->cfg);
}

static void queue_remove(exec_job_t *job) {
  exec_tenant_t *t = job->tenant;
  exec_job_t *prev = NULL;
  for (exec_job_t *j = t->queue_head; j; prev = j, j = j->queue_next) {
    if (j != job) continue;
    if (prev) prev->queue_next = j->queue_next;
    else t->queue_head = j->queue_next;
    if (t->queue_tail == j) t->queue_tail = prev;
    t->queued--;
    job->queued = false;
    return;
  }
}

/* Ends the request with result (stolen) and frees the job. */
static void job_finish(exec_job_t *job, json_t *result) {
  cm_timer_cancel(job->flush_timer);
  job->flush_timer = NULL;
  if (job->queued) queue_remove(job);
  srv_request_t *req = job->req;
  bool had_slot = job->holds_slot;
  job->holds_slot = false;
  /* The answer first: removing the work directory costs milliseconds on some disks, and
   * the next waiting script may start before it, too. */
  srv_request_finish(req, result);
  if (had_slot) {
    job->holds_slot = true;
    slot_release(job);
  }
  if (job->workdir) remove_workdir(job->workdir, job->workdir_mounted);
  job_free(job);
}

/* ---------------------------------------------------------------- progress */

/* Output streams as notifications/progress (and stderr also as notifications/message when
 * the client enabled logging at info): coalesced for EXEC_COALESCE_MS so that a print's text
 * and its newline travel together, and rate-limited by a token bucket (a burst of
 * EXEC_PROGRESS_BURST, then EXEC_PROGRESS_PER_SECOND), each message at most
 * EXEC_PROGRESS_MAX_TEXT; what a flood produces beyond that is counted and skipped (the
 * final result still has the head and tail). */
static void refill(exec_job_t *job, uint64_t now) {
  if (job->last_refill_ms == 0) {
    job->tokens = EXEC_PROGRESS_BURST;
  } else if (now > job->last_refill_ms) {
    job->tokens += (double)(now - job->last_refill_ms) * EXEC_PROGRESS_PER_SECOND / 1000.0;
    if (job->tokens > EXEC_PROGRESS_BURST) job->tokens = EXEC_PROGRESS_BURST;
  }
  job->last_refill_ms = now;
}

static void flush_progress(exec_job_t *job) {
  if (job->pending.len || job->skipped) {
    cm_buf_t msg;
    cm_buf_init(&msg, 0);
    size_t keep = cm_utf8_clip(job->pending.data, job->pending.len);
    cm_buf_append(&msg, job->pending.data, keep);
    if (job->skipped)
      cm_buf_printf(&msg, "\n... [%llu bytes of output skipped in progress; see the result]\n",
                    (unsigned long long)job->skipped);
    job->streamed += keep + job->skipped;
    /* A partial UTF-8 character at the end waits for the next chunk. */
    cm_buf_consume(&job->pending, keep);
    job->skipped = 0;
    srv_request_progress(job->req, (double)job->streamed, msg.data, msg.len);
    cm_buf_release(&msg);
  }
  if (job->pending_err.len) {
    size_t keep = cm_utf8_clip(job->pending_err.data, job->pending_err.len);
    srv_request_log(job->req, "info", "stderr", srv_json_string_lossy(job->pending_err.data, keep));
    cm_buf_consume(&job->pending_err, keep);
  }
}

static void schedule_flush(exec_job_t *job);

static void on_flush_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_job_t *job = data;
  job->flush_timer = NULL;
  refill(job, cm_now_ms());
  if (job->tokens >= 1.0) {
    job->tokens -= 1.0;
    flush_progress(job);
  } else {
    schedule_flush(job);
  }
}

static void schedule_flush(exec_job_t *job) {
  if (job->flush_timer || (!job->pending.len && !job->skipped && !job->pending_err.len)) return;
  refill(job, cm_now_ms());
  uint64_t wait = EXEC_COALESCE_MS;
  if (job->tokens < 1.0) {
    uint64_t until_token = (uint64_t)((1.0 - job->tokens) * 1000.0 / EXEC_PROGRESS_PER_SECOND) + 1;
    wait = CM_MAX(wait, until_token);
  }
  job->flush_timer = cm_loop_timer(srv_server_loop(job->server), wait, on_flush_timer, job);
}

static void stream_output(exec_job_t *job, sbx_stream_t stream, const char *buf, size_t len) {
  bool progress = srv_request_has_progress(job->req);
  bool log = stream == SBX_STDERR && srv_request_log_enabled(job->req, "info");
  if (progress) {
    size_t room = EXEC_PROGRESS_MAX_TEXT > job->pending.len ? EXEC_PROGRESS_MAX_TEXT - job->pending.len : 0;
    size_t take = CM_MIN(room, len);
    cm_buf_append(&job->pending, buf, take);
    job->skipped += len - take;
  }
  if (log) {
    size_t room = EXEC_PROGRESS_MAX_TEXT > job->pending_err.len ? EXEC_PROGRESS_MAX_TEXT - job->pending_err.len : 0;
    cm_buf_append(&job->pending_err, buf, CM_MIN(room, len));
  }
  if (progress || log) schedule_flush(job);
}

/* ---------------------------------------------------------------- the run */

static void on_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  exec_job_t *job = data;
  cm_headtail_append(stream == SBX_STDOUT ? &job->out : &job->err, buf, len);
  stream_output(job, stream, buf, len);
}

/* A stream's text for the result: bytes (NULs kept), invalid UTF-8 as U+FFFD, cut to max;
 * its length and whether anything was cut. */
static char *stream_text(const cm_headtail_t *h, uint64_t max, size_t *len, bool *cut) {
  cleanup_free char *head = NULL, *tail = NULL;
  size_t head_len, tail_len;
  cm_headtail_get(h, &head, &head_len, &tail, &tail_len);
  return srv_truncate_output_n(head, head_len, tail, tail_len, h->total, max, len, cut);
}

/* The address-space limit shows as Python's MemoryError (the kernel refuses the mapping; no
 * signal is involved), so the end of stderr tells. */
static bool hit_memory_limit(const exec_job_t *job, const sbx_result_t *res, const char *err, size_t n) {
  if (res->exit_code == 0 || res->timed_out || !job->cfg->memory_bytes) return false;
  const char *tail = err + (n > 2048 ? n - 2048 : 0);
  return memmem(tail, (size_t)(err + n - tail), "MemoryError", 11) != NULL;
}

static const char *limit_hit(const sbx_result_t *res, bool memory) {
  if (res->timed_out) return "timeout";
  if (res->cpu_limit) return "cpu";
  if (res->file_size_limit) return "file_size";
  if (memory) return "memory";
  if (res->process_limit) return "processes";
  return NULL;
}

static void on_exit_cb(void *data, const sbx_result_t *res) {
  exec_job_t *job = data;
  sbx_run_free(job->run);
  job->run = NULL;
  /* The run is over: so are its connections (what they did is counted in the session). */
  sbx_backend_t *nb = srv_server_backend(job->server);
  json_t *network = srv_network_result(job->cfg, nb, &job->net, job->egress);
  cm_buf_t net_text;
  cm_buf_init(&net_text, 0);
  srv_network_text(job->cfg, nb, &job->net, job->egress, &net_text);
  eg_session_close(job->egress);
  job->egress = NULL;
  if (srv_request_cancelled(job->req)) {
    json_decref(network);
    cm_buf_release(&net_text);
    job_finish(job, json_object());
    return;
  }
  if (job->pending.len || job->skipped) flush_progress(job);
  const srv_config_t *cfg = job->cfg;
  size_t out_len, err_len;
  bool out_cut, err_cut;
  cleanup_free char *out = stream_text(&job->out, cfg->max_output_bytes, &out_len, &out_cut);
  cleanup_free char *err = stream_text(&job->err, cfg->max_output_bytes, &err_len, &err_cut);
  srv_exec_summary_t sum = {
      .stdout_text = out,
      .stderr_text = err,
      .stdout_len = out_len,
      .stderr_len = err_len,
      .exit_code = res->exit_code,
      .duration_ms = res->duration_ms,
      .timed_out = res->timed_out,
  };
  size_t text_len;
  cleanup_free char *text = srv_format_result_n(&sum, &text_len);
  sbx_backend_t *b = srv_server_backend(job->server);
  cm_buf_t t;
  cm_buf_init(&t, 0);
  cm_buf_append(&t, text, text_len);
  /* Additive lines after the seed's block: which sandbox and interpreter ran, what killed it. */
  /* The interpreter that really ran: the image's, with docker and podman. */
  sbx_interp_t interp = {job->py->version, job->py->executable, job->py->implementation};
  sbx_backend_interpreter(b, job->py->executable, &interp);
  cm_buf_printf(&t, "\n--- sandbox: %s ---\n--- python: %s (%s) ---", sbx_backend_name(b), interp.version,
                interp.path);
  if (res->term_signal && !res->timed_out)
    cm_buf_printf(&t, "\n--- killed_by_signal: %d ---", res->term_signal);
  if (res->status_unknown)
    cm_buf_appends(&t, "\n--- note: the sandbox could not confirm the script's own exit status; the exit code is the sandbox's ---");
  if (res->cpu_limit) cm_buf_appends(&t, "\n--- limit: cpu time exceeded ---");
  /* Either the address-space rlimit (a MemoryError) or the cgroup's OOM killer. */
  bool memory = res->memory_limit || hit_memory_limit(job, res, err, err_len);
  if (memory) {
    cleanup_free char *mem = xasprintf("%llu", (unsigned long long)(job->cfg->memory_bytes >> 20));
    cm_buf_printf(&t, "\n--- limit: out of memory (the %s MiB memory limit%s) ---", mem,
                  res->memory_limit ? " of the whole process tree" : "");
  }
  if (res->process_limit)
    cm_buf_printf(&t, "\n--- limit: process limit reached (%llu processes; a fork was refused) ---",
                  (unsigned long long)cfg->max_processes);
  if (res->file_size_limit) cm_buf_appends(&t, "\n--- limit: file size exceeded ---");
  if (job->env)
    cm_buf_printf(&t, "\n--- environment: %s (%s, %zu packages) ---", job->env->key,
                  job->env->cached ? "cached" : "built for this call", json_object_size(job->env->packages));
  if (job->timeout_note) cm_buf_printf(&t, "\n--- note: %s ---", job->timeout_note);
  if (!job->network && cfg->network && !sbx_backend_maps_paths(b))
    cm_buf_printf(&t,
                  "\n--- note: the %s backend cannot isolate the network; network: false was not "
                  "enforced ---",
                  sbx_backend_name(b));
  if (net_text.len) cm_buf_append(&t, net_text.data, net_text.len);
  cm_buf_release(&net_text);
  /* Whatever the script left in outputs/, also after a failure or a timeout. */
  files_collection_t files;
  art_store_collect(srv_server_artifacts(job->server), job->tenant->principal, job->workdir, &files);
  files_result_append(&files, &t, NULL, NULL);
  size_t full_len = t.len;
  cleanup_free char *full = cm_buf_steal(&t);
  bool truncated = out_cut || err_cut;
  bool is_error = res->exit_code != 0 || res->timed_out;
  json_t *result = srv_tool_text_resultn(full, full_len, is_error);
  json_t *sc = json_pack("{s:s%, s:s%, s:i, s:I, s:b, s:b, s:I, s:I, s:s, s:{s:s, s:s, s:s}, s:I, s:I}",
                         "stdout", out, out_len, "stderr", err, err_len, "exit_code", res->exit_code, "duration_ms",
                         (json_int_t)res->duration_ms, "timed_out", res->timed_out, "truncated", truncated,
                         "stdout_bytes", (json_int_t)job->out.total, "stderr_bytes", (json_int_t)job->err.total,
                         "sandbox", sbx_backend_name(b), "python", "version", interp.version, "path",
                         interp.path, "implementation", interp.implementation, "cpu_user_ms",
                         (json_int_t)res->cpu_user_ms, "cpu_system_ms", (json_int_t)res->cpu_system_ms);
  if (!sc) {
    /* Only invalid UTF-8 could make packing fail, and the texts were sanitized. */
    cm_err("building structuredContent failed");
    sc = json_object();
  }
  const char *limit = limit_hit(res, memory);
  json_object_set_new(sc, "limit", limit ? json_string(limit) : json_null());
  json_object_set_new(sc, "signal", res->term_signal ? json_integer(res->term_signal) : json_null());
  json_object_set_new(sc, "status_confirmed", json_boolean(!res->status_unknown));
  json_object_set_new(sc, "prestarted", json_boolean(job->prestarted));
  json_object_set_new(sc, "max_rss_kib", json_integer((json_int_t)res->max_rss_kib));
  json_object_set_new(sc, "memory_peak_bytes",
                      res->memory_peak_bytes ? json_integer((json_int_t)res->memory_peak_bytes) : json_null());
  json_object_set_new(sc, "environment",
                      job->env ? json_pack("{s:s, s:b, s:O}", "key", job->env->key, "cached", job->env->cached,
                                           "packages", job->env->packages)
                               : json_null());
  json_object_set_new(sc, "network", network);
  files_result_append(&files, NULL, json_object_get(result, "content"), sc);
  files_collection_release(&files);
  json_object_set_new(result, "structuredContent", sc);
  job_finish(job, result);
}

static char *make_workdir(srv_server_t *s, bool *mounted, cm_error_t *err) {
  char *tmpl = xasprintf("%s/run-XXXXXX", srv_server_runs_dir(s));
  if (!mkdtemp(tmpl)) {
    cm_error_set(err, errno, CM_ERR_IO, "creating a work directory");
    free(tmpl);
    return NULL;
  }
  /* A size-capped tmpfs of its own (when we may mount): the whole work directory, not just
   * each file, is bounded, and nothing touches the disk. */
  *mounted = srv_workdir_mount(tmpl, srv_server_config(s)->work_bytes);
  return tmpl;
}

static void remove_workdir(const char *workdir, bool mounted) {
  cm_error_t err = CM_ERROR_INIT;
  if (mounted) srv_workdir_unmount(workdir);
  if (cm_rm_rf(workdir, &err) < 0) cm_warn("cleaning up: %s", cm_error_message(&err));
  cm_error_release(&err);
}

static void job_run(exec_job_t *job);

static void on_env_progress(void *data, const char *message, size_t len) {
  exec_job_t *job = data;
  job->setup_progress += 1;
  srv_request_progress(job->req, job->setup_progress, message, len);
}

static void on_env(void *data, env_handle_t *env, const char *error) {
  exec_job_t *job = data;
  job->env_wait = NULL;
  if (!env) {
    job_finish(job, srv_tool_error_result("%s", error ? error : "The environment could not be built."));
    return;
  }
  job->env = env;
  job_run(job);
}

/* With a slot: the dependency environment first (cached or built), then the script. */
static void job_start(exec_job_t *job) {
  if (job->n_requirements == 0) {
    job_run(job);
    return;
  }
  /* The answer comes from the loop, never from inside this call (envcache.h), so job is
   * still alive to hold the handle. */
  job->env_wait = env_store_ensure(srv_server_envs(job->server), job->py, job->requirements, job->n_requirements,
                                   job->uv_config, job->tenant->principal, on_env, on_env_progress, job);
}

/* ---------------------------------------------------------------- the runner's bytecode */

/* A run starts through the start-up runner (profiles/runner.py), and compiling it costs
 * every call about a millisecond.  So each interpreter compiles it once, in the background
 * (py_compile, run by that interpreter on the host backend), into <state>/runner/, which
 * runs then mount in its place and start as a .pyc.  Until that is done, or if it fails,
 * runs use runner.py itself.  The name carries the interpreter and the runner's size and
 * mtime, so an upgrade of either compiles anew. */
typedef struct runner_pyc {
  struct runner_pyc *next;
  srv_server_t *server;
  char *name; /* runner-<implementation>-<version>-<size>-<mtime>.pyc */
  bool ready, failed;
  sbx_run_t *run; /* compiling */
} runner_pyc_t;

static runner_pyc_t *runner_pycs;

static char *runner_pyc_dir(srv_server_t *s) { return xasprintf("%s/runner", srv_server_state_dir(s)); }

static void runner_pyc_done(void *data, const sbx_result_t *res) {
  runner_pyc_t *rp = data;
  sbx_run_free(rp->run);
  rp->run = NULL;
  cleanup_free char *dir = runner_pyc_dir(rp->server);
  cleanup_free char *tmp = xasprintf("%s/.%s.tmp", dir, rp->name);
  cleanup_free char *dst = xasprintf("%s/%s", dir, rp->name);
  if (res->exit_code == 0 && !res->timed_out && chmod(tmp, 0644) == 0 && rename(tmp, dst) == 0) {
    rp->ready = true;
    return;
  }
  cm_debug("compiling the start-up runner for %s failed (exit %d); runs use runner.py", rp->name, res->exit_code);
  unlink(tmp);
  rp->failed = true;
}

static void runner_pyc_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {}

/* The compiled runner for py, when it is ready (its file name in <state>/runner); else
 * NULL, and its compilation starts if it has not. */
static const char *runner_pyc_for(srv_server_t *s, const py_interp_t *py, const char *runner) {
  struct stat st;
  if (!runner || stat(runner, &st) < 0) return NULL;
  cleanup_free char *name = xasprintf("runner-%s-%s-%lld-%lld.pyc", py->implementation, py->version,
                                      (long long)st.st_size, (long long)st.st_mtime);
  for (char *c = name; *c; c++)
    if (*c == '/') *c = '_';
  runner_pyc_t *rp;
  for (rp = runner_pycs; rp; rp = rp->next) {
    if (rp->server == s && strcmp(rp->name, name) == 0) break;
  }
  if (rp) return rp->ready ? rp->name : NULL;
  rp = xcalloc(1, sizeof *rp);
  rp->server = s;
  rp->name = steal_pointer(&name);
  rp->next = runner_pycs;
  runner_pycs = rp;
  cleanup_free char *dir = runner_pyc_dir(s);
  cleanup_free char *dst = xasprintf("%s/%s", dir, rp->name);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(dir, 0755, &err) < 0 || chmod(dir, 0755) < 0) {
    cm_error_release(&err);
    rp->failed = true;
    return NULL;
  }
  if (stat(dst, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
    rp->ready = true; /* compiled by an earlier server */
    return rp->name;
  }
  cleanup_free char *tmp = xasprintf("%s/.%s.tmp", dir, rp->name);
  cleanup_free char *src = xstrdup(runner);
  char *argv[] = {py->executable, "-I", "-c",
                  "import py_compile, sys\n"
                  "py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile='" FILES_RUNNER_TARGET "/runner.py', "
                  "doraise=True)",
                  src, tmp, NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = dir, .limits = {.timeout_ms = 60000, .grace_ms = 1000}};
  sbx_run_callbacks_t cbs = {.on_output = runner_pyc_output, .on_exit = runner_pyc_done};
  if (sbx_run_start(srv_server_loop(s), srv_server_host_backend(s), &spec, &cbs, rp, &rp->run, &err) < 0) {
    cm_debug("compiling the start-up runner: %s", cm_error_message(&err));
    cm_error_release(&err);
    rp->failed = true;
  }
  return NULL;
}

static void runner_pycs_release(srv_server_t *s) {
  runner_pyc_t **link = &runner_pycs;
  while (*link) {
    runner_pyc_t *rp = *link;
    if (rp->server != s) {
      link = &rp->next;
      continue;
    }
    *link = rp->next;
    if (rp->run) sbx_run_free(rp->run);
    free(rp->name);
    free(rp);
  }
}

/* Starts a script run in workdir (script.py is there, or will be before a held run is
 * released): the interpreter (or the environment's), the start-up runner, the limits. */
static int start_sandbox(srv_server_t *s, py_interp_t *py, env_handle_t *env, bool network, const char *workdir,
                         uint64_t timeout_ms, bool hold, const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out,
                         eg_session_t **egress_out, cm_error_t *err) {
  const srv_config_t *cfg = srv_server_config(s);
  /* Through the start-up runner when there is one (it saves open matplotlib figures;
   * profiles/runner.py), mounted read-only where the backend maps paths. */
  sbx_backend_t *backend = srv_server_backend(s);
  const char *runner = files_runner_path();
  /* Only where the host's interpreter runs it (not docker's image). */
  const char *pyc = runner && sbx_backend_host_processes(backend) ? runner_pyc_for(s, py, runner) : NULL;
  cleanup_free char *pyc_dir = pyc ? runner_pyc_dir(s) : NULL;
  cleanup_free char *runner_dir =
      pyc ? xstrdup(pyc_dir) : runner ? xstrndup(runner, (size_t)(strrchr(runner, '/') - runner)) : NULL;
  bool maps = sbx_backend_maps_paths(backend);
  cleanup_free char *runner_arg =
      !runner ? NULL
      : pyc   ? (maps ? xasprintf(FILES_RUNNER_TARGET "/%s", pyc) : xasprintf("%s/%s", pyc_dir, pyc))
              : (maps ? xasprintf(FILES_RUNNER_TARGET "%s", strrchr(runner, '/')) : xstrdup(runner));
  char *python = env ? env->python : py->executable;
  char *argv_plain[] = {python, "-s", "script.py", NULL};
  char *argv_runner[] = {python, "-s", runner_arg, "script.py", NULL};
  char **argv = runner ? argv_runner : argv_plain;
  /* With an environment, its bin/ comes first (console scripts) and VIRTUAL_ENV names it. */
  const char *env_root = env ? (env->mount_target ? env->mount_target : env->host_dir) : NULL;
  cleanup_free char *path_var = env_root ? xasprintf("PATH=%s/bin:/usr/local/bin:/usr/bin:/bin", env_root)
                                         : xstrdup("PATH=/usr/local/bin:/usr/bin:/bin");
  cleanup_free char *venv_var = env_root ? xasprintf("VIRTUAL_ENV=%s", env_root) : NULL;
  /* With the network on, a namespace of its own whose one way out is the egress proxy
   * (server/network.h), unless the operator chose the host's (--network host). */
  *egress_out = NULL;
  int egress_fd = -1;
  bool proxied = network && srv_network_proxied(cfg, backend);
  if (proxied) {
    eg_proxy_t *proxy = srv_network_proxy(srv_server_network(s), err);
    eg_session_t *session =
        proxy ? eg_session_new(proxy, srv_network_script_policy(srv_server_network(s)), 0, &egress_fd, err) : NULL;
    if (!session) return cm_error_wrap(err, "the network of the sandbox (the egress proxy)");
    *egress_out = session;
  }
  sbx_egress_t egress = {.fd = egress_fd, .port = EG_SANDBOX_PORT};
  cm_strv_builder_t envb = {0};
  cm_strv_addv(&envb, path_var, "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1",
               "PYTHONIOENCODING=utf-8", "MPLBACKEND=Agg", NULL);
  if (venv_var) cm_strv_add(&envb, venv_var);
  if (proxied) srv_network_env(srv_server_network(s), &envb, false);
  cleanup_strv char **envp = cm_strv_steal(&envb);
  char *binds[] = {py->prefix, NULL};
  sbx_mount_t mounts[2];
  size_t n_mounts = 0;
  if (env && env->mount_target) mounts[n_mounts++] = (sbx_mount_t){.host = env->host_dir, .target = env->mount_target};
  if (runner && maps) mounts[n_mounts++] = (sbx_mount_t){.host = runner_dir, .target = FILES_RUNNER_TARGET};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = workdir,
      .ro_binds = binds,
      .mounts = mounts,
      .n_mounts = n_mounts,
      .network = network,
      .egress = proxied ? &egress : NULL,
      .hold = hold,
      .limits =
          {
              .timeout_ms = timeout_ms,
              .grace_ms = cfg->kill_grace_ms,
              .memory_bytes = cfg->memory_bytes,
              .cpu_seconds = cfg->cpu_seconds,
              .max_processes = cfg->max_processes,
              .file_size_bytes = cfg->file_size_bytes,
              .open_files = cfg->open_files,
              .tmp_bytes = cfg->tmp_bytes,
              .cpu_millis = cfg->cpu_millis,
          },
  };
  int rc = sbx_run_start(srv_server_loop(s), backend, &spec, cbs, data, out, err);
  if (egress_fd >= 0) close(egress_fd); /* the sandbox has its own copy */
  if (rc < 0) {
    eg_session_close(*egress_out);
    *egress_out = NULL;
  }
  return rc;
}

/* ---------------------------------------------------------------- the prestarted sandbox */

/* Sandboxes set up ahead for the next call: bubblewrap's namespaces and mounts, the work
 * directory, the cgroup and the uid drop are done, and the supervisor waits for the go
 * (mps-sandbox-drop --wait-go).  A call that matches one takes it, writes its script into
 * its work directory and releases it: only the interpreter's start-up is left on the call's
 * path.  The next one of that shape is set up at once, beside the call.  Two shapes are
 * kept: the commonest (no dependencies, the default interpreter, the server's network
 * policy), and the last other one a call used (its dependency environment, interpreter or
 * network), so an agent that repeats a call with dependencies gets the same speed-up.
 * --prestart off turns it off. */
#define PRESTART_MAX_FAILURES 3
#define PRESTART_RETRY_MS 1000
#define PRESTART_SLOTS 2

typedef struct prestart_slot {
  srv_prestart_t *owner;
  bool used;         /* has a shape */
  py_interp_t *py;   /* the shape: interpreter, environment, network */
  env_handle_t *env; /* a copy without a lock (a held sandbox must not keep an environment
                      * from being evicted or rebuilt), and the identity of its directory
                      * when the sandbox was set up: a rebuilt one is another directory */
  dev_t env_dev;
  ino_t env_ino;
  bool network;
  sbx_run_t *run;    /* held, or NULL */
  eg_session_t *egress; /* the held sandbox's egress session, or NULL */
  char *workdir;
  bool workdir_mounted;
  unsigned failures; /* held sandboxes that died in a row; it stops trying after a few */
  cm_timer_t *timer; /* a fill is due */
} prestart_slot_t;

struct srv_prestart {
  srv_server_t *server;
  prestart_slot_t slots[PRESTART_SLOTS]; /* [0]: the commonest shape; [1]: the last other */
  void *py_wait;
  uint64_t taken; /* calls that ran in a prestarted sandbox */
};

static void prestart_fill_now(prestart_slot_t *slot);

static void slot_drop_run(prestart_slot_t *slot) {
  if (slot->run) sbx_run_free(slot->run); /* kills it: its supervisor never started anything */
  slot->run = NULL;
  eg_session_close(slot->egress);
  slot->egress = NULL;
  if (slot->workdir) remove_workdir(slot->workdir, slot->workdir_mounted);
  free(slot->workdir);
  slot->workdir = NULL;
}

static void slot_clear(prestart_slot_t *slot) {
  cm_timer_cancel(slot->timer);
  slot->timer = NULL;
  slot_drop_run(slot);
  env_release(slot->env);
  slot->env = NULL;
  slot->py = NULL;
  slot->used = false;
  slot->failures = 0;
}

static void prestart_on_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  prestart_slot_t *slot = data;
  slot->timer = NULL;
  prestart_fill_now(slot);
}

static void prestart_schedule(prestart_slot_t *slot, uint64_t ms) {
  if (!slot->used || slot->timer || slot->run || slot->failures >= PRESTART_MAX_FAILURES) return;
  slot->timer = cm_loop_timer(srv_server_loop(slot->owner->server), ms, prestart_on_timer, slot);
}

/* A held sandbox died before any call took it. */
static void prestart_on_exit(void *data, const sbx_result_t *res) {
  prestart_slot_t *slot = data;
  if (++slot->failures >= PRESTART_MAX_FAILURES)
    cm_warn("prestarted sandboxes keep ending before use (exit %d); not prestarting this shape any more", res->exit_code);
  slot_drop_run(slot); /* frees the run from inside its callback, which sbx_run allows */
  prestart_schedule(slot, PRESTART_RETRY_MS);
}

static void prestart_on_python(void *data, py_interp_t *def, const char *error) {
  srv_prestart_t *p = data;
  p->py_wait = NULL;
  if (!def) return;
  p->slots[0].py = def;
  p->slots[0].network = srv_server_config(p->server)->network;
  p->slots[0].used = true;
  prestart_fill_now(&p->slots[0]);
}

static void prestart_fill_now(prestart_slot_t *slot) {
  srv_server_t *s = slot->owner->server;
  if (!slot->used || slot->run || slot->failures >= PRESTART_MAX_FAILURES) return;
  if (!sbx_backend_can_hold(srv_server_backend(s))) return;
  struct stat st;
  if (slot->env) {
    if (stat(slot->env->host_dir, &st) < 0) return; /* evicted: the next call of this shape rebuilds it */
    slot->env_dev = st.st_dev;
    slot->env_ino = st.st_ino;
  }
  cm_error_t err = CM_ERROR_INIT;
  slot->workdir = make_workdir(s, &slot->workdir_mounted, &err);
  sbx_run_callbacks_t cbs = {.on_exit = prestart_on_exit};
  if (!slot->workdir ||
      start_sandbox(s, slot->py, slot->env, slot->network, slot->workdir, 0, true, &cbs, slot, &slot->run,
                    &slot->egress, &err) < 0) {
    cm_warn("prestarting a sandbox: %s", cm_error_message(&err));
    cm_error_release(&err);
    slot->run = NULL;
    slot_drop_run(slot);
    slot->failures++;
    prestart_schedule(slot, PRESTART_RETRY_MS);
  }
}

void srv_prestart_start(srv_server_t *s) {
  if (!srv_server_config(s)->prestart || *srv_server_prestart(s)) return;
  srv_prestart_t *p = xcalloc(1, sizeof *p);
  p->server = s;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) p->slots[i].owner = p;
  *srv_server_prestart(s) = p;
  /* The commonest shape needs the default interpreter: once discovery is done. */
  p->py_wait = py_registry_when_ready(srv_server_pythons(s), prestart_on_python, p);
}

void srv_prestart_free(srv_server_t *s) {
  runner_pycs_release(s);
  srv_prestart_t *p = *srv_server_prestart(s);
  if (!p) return;
  *srv_server_prestart(s) = NULL;
  if (p->py_wait) py_registry_cancel_wait(srv_server_pythons(s), p->py_wait);
  for (size_t i = 0; i < PRESTART_SLOTS; i++) slot_clear(&p->slots[i]);
  free(p);
}

bool srv_prestart_describe(srv_server_t *s, uint64_t *taken) {
  srv_prestart_t *p = *srv_server_prestart(s);
  *taken = p ? p->taken : 0;
  return p && p->slots[0].failures < PRESTART_MAX_FAILURES && sbx_backend_can_hold(srv_server_backend(s));
}

static bool slot_matches(const prestart_slot_t *slot, const exec_job_t *job) {
  return slot->used && slot->py == job->py && slot->network == job->network && !slot->env == !job->env &&
         (!job->env || strcmp(slot->env->key, job->env->key) == 0);
}

static bool same_dir(const char *path, dev_t dev, ino_t ino) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* A held sandbox of the job's shape, when there is one: its run and work directory become
 * the job's.  Otherwise the job's shape becomes the second slot's (when it is not the
 * commonest), so that the next such call finds one. */
static bool prestart_take(exec_job_t *job) {
  srv_prestart_t *p = *srv_server_prestart(job->server);
  if (!p || !p->slots[0].used || !sbx_backend_can_hold(srv_server_backend(job->server))) return false;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    if (!slot_matches(slot, job)) continue;
    if (slot->run && job->env && !same_dir(job->env->host_dir, slot->env_dev, slot->env_ino))
      slot_drop_run(slot); /* set up with an environment since evicted or rebuilt */
    if (!slot->run) {
      prestart_schedule(slot, 0); /* (already due, or given up on) */
      return false;
    }
    job->run = slot->run;
    job->egress = slot->egress;
    job->workdir = slot->workdir;
    job->workdir_mounted = slot->workdir_mounted;
    slot->run = NULL;
    slot->egress = NULL;
    slot->workdir = NULL;
    slot->failures = 0;
    p->taken++;
    job->prestarted = true;
    prestart_schedule(slot, 0); /* the next one, beside this call */
    return true;
  }
  prestart_slot_t *other = &p->slots[1];
  slot_clear(other);
  other->used = true;
  other->py = job->py;
  other->network = job->network;
  other->env = job->env ? env_handle_copy_unlocked(job->env) : NULL;
  prestart_schedule(other, 0);
  return false;
}

/* ---------------------------------------------------------------- starting the script */

static int write_job_files(exec_job_t *job, cm_error_t *err) {
  cleanup_free char *script_path = xasprintf("%s/script.py", job->workdir);
  if (cm_write_file(script_path, job->script, job->script_len, 0644, err) < 0)
    return cm_error_wrap(err, "Cannot prepare the run");
  if (job->inputs.n) {
    cleanup_close int wfd = open(job->workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (wfd < 0) return cm_error_set(err, errno, CM_ERR_IO, "Cannot write the input files: opening the work directory");
    if (files_write_inputs(wfd, &job->inputs, err) < 0) return cm_error_wrap(err, "Cannot write the input files");
    files_inputs_release(&job->inputs); /* on disk now: no need to hold them during the run */
  }
  return 0;
}

static void job_run(exec_job_t *job) {
  /* Script output progress continues from where environment progress stopped. */
  job->streamed = (uint64_t)job->setup_progress;
  cm_error_t err = CM_ERROR_INIT;
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  if (prestart_take(job)) {
    /* The call's own list narrows the session before anything can connect. */
    if (job->egress && job->net.rules) eg_session_narrow(job->egress, job->net.rules, job->net.n_rules);
    if (write_job_files(job, &err) == 0 && sbx_run_release(job->run, &cbs, job, job->timeout_s * 1000, &err) == 0)
      return;
    /* It died meanwhile (or the files could not be written): do it the long way. */
    cm_debug("prestarted sandbox not used: %s", cm_error_message(&err));
    cm_error_release(&err);
    sbx_run_free(job->run);
    job->run = NULL;
    eg_session_close(job->egress);
    job->egress = NULL;
    remove_workdir(job->workdir, job->workdir_mounted);
    free(job->workdir);
    job->workdir = NULL;
    job->prestarted = false;
  }
  job->workdir = make_workdir(job->server, &job->workdir_mounted, &err);
  if (!job->workdir || write_job_files(job, &err) < 0) {
    job_finish(job, job->workdir ? srv_tool_error_result("%s", cm_error_message(&err))
                                 : srv_tool_error_result("Cannot prepare the run: %s", cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  if (start_sandbox(job->server, job->py, job->env, job->network, job->workdir, job->timeout_s * 1000, false, &cbs,
                    job, &job->run, &job->egress, &err) < 0) {
    job_finish(job, srv_tool_error_result("The sandbox could not start the script: %s", cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  /* Before the loop runs again, so before any connection of the script reaches the proxy. */
  if (job->egress && job->net.rules) eg_session_narrow(job->egress, job->net.rules, job->net.n_rules);
}

static void on_cancel(void *data) {
  exec_job_t *job = data;
  if (job->run) {
    sbx_run_cancel(job->run); /* on_exit_cb follows and finishes */
    return;
  }
  if (job->py_wait) {
    py_registry_cancel_wait(srv_server_pythons(job->server), job->py_wait);
    job->py_wait = NULL;
  }
  if (job->probe_wait) {
    srv_server_cancel_probe_wait(job->server, job->probe_wait);
    job->probe_wait = NULL;
  }
  if (job->env_wait) {
    env_store_cancel(srv_server_envs(job->server), job->env_wait);
    job->env_wait = NULL;
  }
  if (job->downloading) py_registry_cancel_download(srv_server_pythons(job->server));
  job_finish(job, json_object());
}

static void on_python(void *data, py_interp_t *def, const char *def_error);
static void on_probed(void *data);

static void on_downloaded(void *data, const char *error) {
  exec_job_t *job = data;
  job->downloading = false;
  if (error) {
    job_finish(job, srv_tool_error_result("%s", error));
    return;
  }
  on_python(job, NULL, NULL);
}

static void on_python(void *data, py_interp_t *def, const char *def_error) {
  exec_job_t *job = data;
  job->py_wait = NULL;
  cleanup_free char *why = NULL;
  py_registry_t *reg = srv_server_pythons(job->server);
  py_interp_t *py = py_registry_select(reg, job->python_request, job->requires_python, &why);
  if (!py && !job->download_tried && py_registry_can_download(reg) &&
      (job->python_request || job->requires_python) && why && strncmp(why, "No Python interpreter", 21) == 0) {
    /* --allow-python-downloads: uv installs what was asked for, then we choose again. */
    const char *want = job->python_request ? job->python_request : job->requires_python;
    job->download_tried = true;
    cm_error_t err = CM_ERROR_INIT;
    cleanup_free char *msg = xasprintf("downloading Python %s with uv", want);
    job->setup_progress += 1;
    srv_request_progress(job->req, job->setup_progress, msg, strlen(msg));
    if (py_registry_download(reg, want, on_downloaded, job, &err) == 0) {
      job->downloading = true;
      return;
    }
    job_finish(job, srv_tool_error_result("%s (and it could not be downloaded: %s)", why, cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  if (!py) {
    job_finish(job, srv_tool_error_result("%s", why ? why : "No Python interpreter is available."));
    return;
  }
  job->py = py;
  on_probed(job);
}

/* The sandbox must be probed before anything runs in it (environment builds included):
 * until then the job waits, and the loop serves others. */
static void on_probed(void *data) {
  exec_job_t *job = data;
  job->probe_wait = NULL;
  if (!srv_server_probed(job->server)) {
    job->probe_wait = srv_server_when_probed(job->server, on_probed, job);
    return;
  }
  sbx_backend_t *b = srv_server_backend(job->server);
  if (!b->available) {
    job_finish(job, srv_tool_error_result(
                        "The %s sandbox is not available on this server, so the script was not run "
                        "(the server never falls back to running without a sandbox): %s",
                        sbx_backend_name(b), b->unavailable ? b->unavailable : "unknown reason"));
    return;
  }
  exec_tenant_t *t = job->tenant;
  const srv_config_t *cfg = job->cfg;
  /* Say why it waits (it may: behind the principal's own runs, or for a free slot). */
  const char *wait_note = NULL;
  char reason[256];
  if (cfg->max_token_running && t->running >= cfg->max_token_running) {
    snprintf(reason, sizeof reason,
             "waiting: %zu executions of this token are running (its limit, --max-token-running); "
             "this one starts when one of them ends",
             t->running);
    wait_note = reason;
  } else if (slots_used >= cfg->max_concurrent) {
    snprintf(reason, sizeof reason,
             "waiting for a free slot: %llu executions are running (the server's limit, "
             "--max-concurrent); waiting calls are started in turn across tokens",
             (unsigned long long)cfg->max_concurrent);
    wait_note = reason;
  }
  if (wait_note) {
    job->setup_progress += 1;
    srv_request_progress(job->req, job->setup_progress, wait_note, strlen(wait_note));
  }
  job->queued = true;
  if (t->queue_tail) t->queue_tail->queue_next = job;
  else t->queue_head = job;
  t->queue_tail = job;
  t->queued++;
  admit_queued(srv_server_loop(job->server), cfg); /* may start and even finish the job */
}

/* ---------------------------------------------------------------- the tool */

static const char *const known_args[] = {"script",         "dependencies", "timeout_seconds",
                                         "python_version", "files",        "network"};

void srv_tool_execute_python(srv_request_t *r, json_t *args) {
  srv_server_t *s = srv_request_server(r);
  const srv_config_t *cfg = srv_server_config(s);
  const char *key;
  json_t *value;
  json_object_foreach(args, key, value) {
    bool known = false;
    for (size_t i = 0; i < CM_ARRAY_SIZE(known_args); i++) known |= strcmp(key, known_args[i]) == 0;
    if (!known) {
      cleanup_free char *k = cm_log_excerpt(key, strlen(key), 40);
      srv_request_finish(r, srv_tool_error_result("Unknown argument '%s'. execute_python accepts: "
                                                  "script, dependencies, timeout_seconds, "
                                                  "python_version, files, network.",
                                                  k));
      return;
    }
  }
  json_t *script = json_object_get(args, "script");
  if (!json_is_string(script)) {
    srv_request_finish(r, srv_tool_error_result("'script' is required and must be a string of Python code."));
    return;
  }
  if (json_string_length(script) > cfg->max_script_bytes) {
    srv_request_finish(r, srv_tool_error_result("The script is %zu bytes; the limit is %llu bytes.",
                                                json_string_length(script), (unsigned long long)cfg->max_script_bytes));
    return;
  }
  __attribute__((cleanup(srv_net_call_release))) srv_net_call_t net;
  cleanup_free char *net_error = NULL;
  if (srv_network_parse_call(srv_server_network(s), cfg, srv_server_backend_kind(s), json_object_get(args, "network"), &net,
                             &net_error) < 0) {
    srv_request_finish(r, srv_tool_error_result("%s", net_error));
    return;
  }
  json_t *deps = json_object_get(args, "dependencies");
  if (deps && !json_is_null(deps)) {
    if (!json_is_array(deps)) {
      srv_request_finish(r, srv_tool_error_result("'dependencies' must be a list of requirement strings or null."));
      return;
    }
    if (json_array_size(deps) > EXEC_MAX_DEPENDENCIES) {
      srv_request_finish(r, srv_tool_error_result("At most %d dependencies are accepted.", EXEC_MAX_DEPENDENCIES));
      return;
    }
  }
  /* The PEP 723 block is read, never rewritten: line numbers in tracebacks stay true. */
  srv_script_t prepared;
  cm_error_t perr = CM_ERROR_INIT;
  if (srv_script_prepare(json_string_value(script), json_string_length(script), deps, &prepared, &perr) < 0) {
    srv_request_finish(r, srv_tool_error_result("Invalid script metadata or dependencies: %s", cm_error_message(&perr)));
    cm_error_release(&perr);
    return;
  }
  const toml_value_t *tool_uv = toml_table_get(prepared.meta.tool, "uv");
  char *uv_config = toml_type(tool_uv) == TOML_TABLE ? toml_write(tool_uv) : NULL;
  char **requirements = prepared.requirements;
  size_t n_requirements = prepared.n_requirements;
  prepared.requirements = NULL;
  char *requires_python = prepared.meta.requires_python ? xstrdup(prepared.meta.requires_python) : NULL;
  srv_script_release(&prepared);
  uint64_t timeout = cfg->default_timeout;
  char *note = NULL;
  json_t *t = json_object_get(args, "timeout_seconds");
  if (t && !json_is_null(t)) {
    if (!json_is_integer(t) && !(json_is_real(t) && json_real_value(t) == (double)(json_int_t)json_real_value(t))) {
      free(requires_python);
    cm_strv_free(requirements);
    free(uv_config);
      srv_request_finish(r, srv_tool_error_result("'timeout_seconds' must be an integer number of seconds."));
      return;
    }
    json_int_t v = json_is_integer(t) ? json_integer_value(t) : (json_int_t)json_real_value(t);
    if (v < 1) {
      free(requires_python);
    cm_strv_free(requirements);
    free(uv_config);
      srv_request_finish(r, srv_tool_error_result("'timeout_seconds' must be at least 1 (got %lld).", (long long)v));
      return;
    }
    if ((uint64_t)v > cfg->max_timeout) {
      note = xasprintf("timeout_seconds %lld exceeds the server maximum; %llu was used", (long long)v,
                       (unsigned long long)cfg->max_timeout);
      v = (json_int_t)cfg->max_timeout;
    }
    timeout = (uint64_t)v;
  }
  json_t *pv = json_object_get(args, "python_version");
  if (pv && !json_is_null(pv) && (!json_is_string(pv) || json_string_length(pv) == 0 || json_string_length(pv) > 200)) {
    free(note);
    free(requires_python);
    cm_strv_free(requirements);
    free(uv_config);
    srv_request_finish(r, srv_tool_error_result("'python_version' must be a version string such as \"3.12\", \"3.13t\" or \">=3.11,<3.13\"."));
    return;
  }
  files_inputs_t inputs;
  cm_error_t ferr = CM_ERROR_INIT;
  if (files_inputs_parse(json_object_get(args, "files"), cfg, &inputs, &ferr) < 0) {
    free(note);
    free(requires_python);
    cm_strv_free(requirements);
    free(uv_config);
    srv_request_finish(r, srv_tool_error_result("%s", cm_error_message(&ferr)));
    cm_error_release(&ferr);
    return;
  }
  srv_session_t *session = srv_request_session(r);
  if (cfg->max_session_concurrent && session && session_jobs(session) >= cfg->max_session_concurrent) {
    free(note);
    free(requires_python);
    free(uv_config);
    cm_strv_free(requirements);
    srv_request_finish(r, srv_tool_error_result(
                              "This session already has %llu executions running or waiting (the server's "
                              "per-session limit, --max-session-concurrent). Wait for one to finish and call again.",
                              (unsigned long long)cfg->max_session_concurrent));
    return;
  }
  const char *principal = session ? srv_session_principal(session) : SRV_PRINCIPAL_STDIO;
  exec_tenant_t *known = tenant_find(principal);
  if (cfg->max_token_concurrent && known && known->jobs >= cfg->max_token_concurrent) {
    free(note);
    free(requires_python);
    free(uv_config);
    cm_strv_free(requirements);
    srv_request_finish(r, srv_tool_error_result(
                              "The token '%s' already has %llu executions running or waiting across its sessions "
                              "(the server's per-token limit, --max-token-concurrent). Wait for one to finish and call again.",
                              principal, (unsigned long long)cfg->max_token_concurrent));
    return;
  }
  exec_job_t *job = xcalloc(1, sizeof *job);
  job->session = session;
  job->tenant = tenant_hold(principal);
  job->all_next = all_jobs;
  if (all_jobs) all_jobs->all_prev = job;
  all_jobs = job;
  job->inputs = inputs;
  job->net = net;
  memset(&net, 0, sizeof net); /* the job's now */
  job->network = job->net.on;
  job->python_request = json_is_string(pv) ? xstrdup(json_string_value(pv)) : NULL;
  job->requires_python = requires_python;
  job->requirements = requirements;
  job->uv_config = uv_config;
  job->n_requirements = n_requirements;
  job->req = r;
  job->server = s;
  job->cfg = cfg;
  job->script = xstrndup(json_string_value(script), json_string_length(script));
  job->script_len = json_string_length(script);
  job->timeout_s = timeout;
  job->timeout_note = note;
  cm_headtail_init(&job->out, cfg->max_output_bytes, cfg->max_output_bytes);
  cm_headtail_init(&job->err, cfg->max_output_bytes, cfg->max_output_bytes);
  cm_buf_init(&job->pending, EXEC_PROGRESS_MAX_TEXT + 16);
  cm_buf_init(&job->pending_err, EXEC_PROGRESS_MAX_TEXT + 16);
  srv_request_on_cancel(r, on_cancel, job);
  job->py_wait = py_registry_when_ready(srv_server_pythons(s), on_python, job);
}

/* The structuredContent declaration: every field with its type. */
static json_t *output_schema(void) {
  static const struct {
    const char *name, *type, *description;
  } fields[] = {
      {"stdout", "string",
       "Standard output (the beginning and the end when it was longer than the limit)."},
      {"stderr", "string", "Standard error, same rules: the traceback of a failed script is here."},
      {"exit_code", "integer", "The exit status; -N when killed by signal N."},
      {"duration_ms", "integer", "Wall-clock run time."},
      {"timed_out", "boolean", "The timeout killed it."},
      {"truncated", "boolean", "Some output was cut to the limit."},
      {"stdout_bytes", "integer", "Bytes written to stdout in all."},
      {"stderr_bytes", "integer", "Bytes written to stderr in all."},
      {"sandbox", "string", "The sandbox backend that ran it."},
      {"cpu_user_ms", "integer", "User CPU time."},
      {"cpu_system_ms", "integer", "System CPU time."},
      {"max_rss_kib", "integer", "Peak resident memory of the largest process."},
      {"prestarted", "boolean", "It ran in a sandbox set up before the call (--prestart)."},
      {"status_confirmed", "boolean",
       "The sandbox reported the script's own exit status and usage (false: the sandbox's own)."},
  };
  json_t *props = json_object();
  for (size_t i = 0; i < CM_ARRAY_SIZE(fields); i++)
    json_object_set_new(
        props, fields[i].name,
        json_pack("{s:s, s:s}", "type", fields[i].type, "description", fields[i].description));
  json_object_set_new(
      props, "python",
      json_pack("{s:s, s:{s:{s:s}, s:{s:s}, s:{s:s}}}", "type", "object", "properties", "version",
                "type", "string", "path", "type", "string", "implementation", "type", "string"));
  json_object_set_new(
      props, "limit",
      json_pack(
          "{s:[s, s], s:s}", "type", "string", "null", "description",
          "The limit the run hit: \"timeout\", \"cpu\", \"file_size\", \"memory\" or \"processes\" (a fork "
          "was refused); null if none."));
  json_object_set_new(props, "memory_peak_bytes",
                      json_pack("{s:[s, s], s:s}", "type", "integer", "null", "description",
                                "Peak memory of the whole process tree (from its cgroup); null when not measured."));
  json_object_set_new(props, "signal",
                      json_pack("{s:[s, s], s:s}", "type", "integer", "null", "description",
                                "The signal that killed the script, or null."));
  json_object_set_new(
      props, "environment",
      json_pack("{s:[s, s], s:s, s:{s:{s:s}, s:{s:s}, s:{s:s, s:{s:s}}}}", "type", "object", "null",
                "description",
                "The cached dependency environment used, or null without dependencies.",
                "properties", "key", "type", "string", "cached", "type", "boolean", "packages",
                "type", "object", "additionalProperties", "type", "string"));
  json_object_set_new(props, "files", files_output_schema());
  json_object_set_new(props, "network", srv_network_output_schema());
  return json_pack("{s:s, s:o, s:[s, s, s, s, s, s]}", "type", "object", "properties", props,
                   "required", "stdout", "stderr", "exit_code", "duration_ms", "timed_out",
                   "truncated");
}

json_t *srv_tool_execute_python_describe(srv_server_t *s) {
  const srv_config_t *cfg = srv_server_config(s);
  /* docker and none: the network is on, but no policy of ours applies to it. */
  bool unfiltered = cfg->network && !cfg->network_host && !srv_network_proxied(cfg, srv_server_backend_kind(s));
  cleanup_free char *desc = xasprintf(
      "Run a Python script in a sandbox and get back its output, its exit code and the files it "
      "writes to outputs/.\n"
      "\n"
      "How it runs: the script is saved as script.py in a fresh, empty working directory (deleted "
      "afterwards) and run with no standard input, a clean environment and these limits: "
      "timeout_seconds (default %llu, at most %llu; the whole process tree is killed when it "
      "expires), %llu bytes of stdout and of stderr kept (the beginning and the end of longer "
      "output), and the server's memory and process limits. %s\n"
      "\n"
      "Dependencies: the standard library needs nothing. Declare third-party packages in a PEP "
      "723 block at the top of the script:\n"
      "# /// script\n"
      "# requires-python = \">=3.11\"\n"
      "# dependencies = [\"requests<3\", \"rich\"]\n"
      "# ///\n"
      "or in the dependencies argument ([\"numpy\", \"pandas>=2\"]). They are installed once into "
      "a cached environment; the first call with a new set takes longer.\n"
      "\n"
      "Python version: python_version picks one (\"3.12\", \"3.13t\", \">=3.11\"); "
      "check_environment lists them.\n"
      "\n"
      "Files in: files=[{\"path\": \"data/input.csv\", \"content\": \"...\", \"encoding\": "
      "\"utf-8\" or \"base64\"}] are written into the working directory before the script starts "
      "(relative paths only; at most %llu files, %llu bytes each, %llu bytes in all).\n"
      "\n"
      "Files and plots out: write what you want back into the outputs/ directory (create it "
      "first: os.makedirs(\"outputs\", exist_ok=True)). Images (PNG, JPEG, GIF, WebP, SVG) up to "
      "%llu bytes come back as images, UTF-8 text files up to %llu bytes as embedded resources, "
      "anything else as a resource_link (sandbox://runs/...) to read with resources/read within "
      "%llu seconds; at most %llu files and %llu bytes per run. Matplotlib figures still open "
      "when the script ends are saved as outputs/figure-N.png (the Agg backend is preset; close a "
      "figure you saved yourself, or it comes back twice).\n"
      "\n"
      "Result: a text block with '--- stdout ---', '--- stderr ---', '--- exit_code: N ---' and "
      "'--- duration_ms: N ---' sections (plus '--- timed_out: true ---' on timeout) and a line "
      "per returned file, then the images and resources, and the same data as structured content. "
      "A non-zero exit, a timeout or a kill is an error result: the traceback in stderr has your "
      "script's line numbers. Output is streamed as progress notifications when the client asks "
      "for progress.",
      (unsigned long long)cfg->default_timeout, (unsigned long long)cfg->max_timeout,
      (unsigned long long)cfg->max_output_bytes,
      !cfg->network       ? "Network access is off on this server."
      : cfg->network_host ? "Network access is on (the host's own network); pass network: false to run without it."
      : unfiltered        ? "Network access is on, not filtered: this sandbox backend does not apply the server's "
                            "egress policy; pass network: false to run without it."
                          : "Network access is on through the server's egress proxy (HTTP_PROXY/HTTPS_PROXY are set; "
                            "loopback, private and metadata addresses are refused); pass network: false to run "
                            "without it, or a list of destinations to allow only those.",
      (unsigned long long)cfg->max_input_files, (unsigned long long)cfg->max_input_file_bytes,
      (unsigned long long)cfg->max_input_bytes, (unsigned long long)cfg->max_inline_bytes,
      (unsigned long long)cfg->max_inline_text_bytes,
      (unsigned long long)(cfg->artifact_ttl_ms / 1000), (unsigned long long)cfg->max_output_files,
      (unsigned long long)cfg->max_artifact_bytes);
  json_t *input = json_pack(
      "{s:s, s:{s:{s:s, s:s}, s:{s:[{s:s, s:{s:s}}, {s:s}], s:n, s:s}, s:{s:s, s:I, s:I, s:I, s:s}}, s:[s], s:b}",
      "type", "object", "properties", "script", "type", "string", "description",
      "The Python source code to run. It may start with a PEP 723 '# /// script' metadata block.",
      "dependencies", "anyOf", "type", "array", "items", "type", "string", "type", "null", "default",
      "description", "Extra requirement strings (PEP 508), merged with the script's PEP 723 dependencies.",
      "timeout_seconds", "type", "integer", "minimum", (json_int_t)1, "maximum", (json_int_t)cfg->max_timeout,
      "default", (json_int_t)cfg->default_timeout, "description",
      "Wall-clock limit in seconds; the script and everything it started are killed when it expires.",
      "required", "script", "additionalProperties", 0);
  json_t *props = json_object_get(input, "properties");
  json_object_set_new(
      props, "python_version",
      json_pack(
          "{s:s, s:s}", "type", "string", "description",
          "Which Python to run: \"3.12\", \"3.12.1\", \"3.13t\" (free-threaded), \"pypy3.10\" or "
          "a specifier such as \">=3.11,<3.13\"; the newest match wins. Default: the script's "
          "requires-python, else the server's default. check_environment lists them."));
  json_t *file_item = json_pack(
      "{s:s, s:{s:{s:s, s:s}, s:{s:s}, s:{s:s, s:[s, s], s:s}}, s:[s, s], s:b}", "type", "object",
      "properties", "path", "type", "string", "description",
      "Relative path, e.g. \"data/input.csv\"; parent directories are created.", "content", "type",
      "string", "encoding", "type", "string", "enum", "utf-8", "base64", "default", "utf-8",
      "required", "path", "content", "additionalProperties", 0);
  json_object_set_new(props, "files",
                      json_pack("{s:s, s:I, s:s, s:o}", "type", "array", "maxItems",
                                (json_int_t)cfg->max_input_files, "description",
                                "Input files written into the working directory before the "
                                "script starts.",
                                "items", file_item));
  const char *net_desc =
      !cfg->network ? "The network is off on this server; true or a list is refused."
      : cfg->network_host
          ? "false runs this call without any network access. (This server shares its own network with scripts.)"
      : unfiltered ? "false runs this call without any network access where the backend can isolate it. (This "
                     "backend does not filter the network: a list of destinations is refused.)"
          : "false: no network at all. true (the default): the public internet through the server's egress proxy "
            "(the sandbox's HTTP_PROXY/HTTPS_PROXY/ALL_PROXY; loopback, private, link-local and metadata addresses "
            "are refused unless the server allows them). A list of destinations (\"api.github.com\", "
            "\"*.example.com:443\", \"198.51.100.0/24\") allows only those, within what the server allows; an entry "
            "the server denies entirely is an error. Refused destinations are listed in the result.";
  json_object_set_new(props, "network",
                      json_pack("{s:[{s:s}, {s:s, s:{s:s}, s:I}], s:b, s:s}", "anyOf", "type", "boolean", "type", "array",
                                "items", "type", "string", "maxItems", (json_int_t)SRV_NET_MAX_CALL_RULES, "default",
                                cfg->network, "description", net_desc));
  return json_pack("{s:s, s:s, s:s, s:o, s:o, s:{s:s, s:b, s:b, s:b, s:b}}", "name",
                   "execute_python", "title", "Run Python in a sandbox", "description", desc,
                   "inputSchema", input, "outputSchema", output_schema(), "annotations", "title",
                   "Run Python in a sandbox", "readOnlyHint", 0, "destructiveHint", 0,
                   "idempotentHint", 0, "openWorldHint", cfg->network);
}
