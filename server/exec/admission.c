/* Admission: the caps of a session and a principal, the slots, the start gate and the
 * per-principal round-robin queue (see struct exec_tenant in exec-internal.h). */
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

static size_t session_jobs(exec_state_t *x, srv_session_t *ss) {
  size_t n = 0;
  /* The request's session, not the one it was submitted on: a task's run outlives its
   * session (core/tasks.c), and a freed session's address may be a new session's. */
  for (exec_job_t *j = x->all_jobs; j; j = j->all_next)
    n += j->req && srv_request_session(j->req) == ss;
  return n;
}

static exec_tenant_t *tenant_find(exec_state_t *x, const char *principal) {
  for (exec_tenant_t *t = x->tenants; t; t = t->next)
    if (strcmp(t->principal, principal) == 0) return t;
  return NULL;
}

/* A principal's tenant, with one more job (made on its first). */
static exec_tenant_t *tenant_hold(exec_state_t *x, const char *principal) {
  exec_tenant_t *t = tenant_find(x, principal);
  if (!t) {
    t = xcalloc(1, sizeof *t);
    t->principal = xstrdup(principal);
    exec_tenant_t **link = &x->tenants;
    while (*link) link = &(*link)->next;
    *link = t;
  }
  t->jobs++;
  return t;
}

/* One job fewer; a tenant without jobs goes (the round then goes on from the one before
 * it). */
static void tenant_release(exec_state_t *x, exec_tenant_t *t) {
  if (--t->jobs > 0) return;
  exec_tenant_t *prev = NULL;
  for (exec_tenant_t *o = x->tenants; o != t; o = o->next) prev = o;
  if (prev)
    prev->next = t->next;
  else
    x->tenants = t->next;
  if (x->last_served == t) x->last_served = prev;
  free(t->principal);
  free(t);
}

static bool tenant_may_run(const exec_tenant_t *t, const srv_config_t *cfg) {
  return t->queue_head && (!cfg->max_token_running || t->running < cfg->max_token_running);
}

/* The tenant whose turn it is: the first after last_served (going round) with a call it
 * may start; NULL if there is none. */
static exec_tenant_t *tenant_next(exec_state_t *x, const srv_config_t *cfg) {
  if (!x->tenants) return NULL;
  exec_tenant_t *start = x->last_served && x->last_served->next ? x->last_served->next : x->tenants;
  exec_tenant_t *t = start;
  do {
    if (tenant_may_run(t, cfg)) return t;
    t = t->next ? t->next : x->tenants;
  } while (t != start);
  return NULL;
}

bool exec_hold(exec_state_t *x, const char *principal) {
  const srv_config_t *cfg = srv_server_config(x->server);
  const exec_tenant_t *known = tenant_find(x, principal);
  if (cfg->max_token_concurrent && known && known->jobs >= cfg->max_token_concurrent) return false;
  tenant_hold(x, principal);
  return true;
}

void exec_release(exec_state_t *x, const char *principal) {
  exec_tenant_t *t = tenant_find(x, principal);
  if (t) tenant_release(x, t);
}

void exec_usage(exec_state_t *x, const char *principal, exec_usage_t *out) {
  memset(out, 0, sizeof *out);
  const exec_tenant_t *t = principal ? tenant_find(x, principal) : NULL;
  if (!t) return;
  out->calls = t->jobs;
  out->running = t->running;
  out->queued = t->queued;
}

void exec_admission_metrics(exec_state_t *x, exec_metrics_t *out) {
  memset(out, 0, sizeof *out);
  for (const exec_tenant_t *t = x->tenants; t; t = t->next) {
    out->total.calls += t->jobs;
    out->total.running += t->running;
    out->total.queued += t->queued;
  }
  out->starting = x->n_starting;
  out->wait_buckets = x->wait_buckets;
  out->wait_ms_sum = x->wait_ms_sum;
  out->wait_count = x->wait_count;
}

json_t *exec_admission_refusal(exec_state_t *x, srv_session_t *session, const char *principal) {
  const srv_config_t *cfg = srv_server_config(x->server);
  if (cfg->max_session_concurrent && session &&
      session_jobs(x, session) >= cfg->max_session_concurrent)
    return srv_tool_error_result(
        "This session already has %llu executions running or waiting (the server's "
        "per-session limit, --max-session-concurrent). Wait for one to finish and call again.",
        (unsigned long long)cfg->max_session_concurrent);
  const exec_tenant_t *known = tenant_find(x, principal);
  if (cfg->max_token_concurrent && known && known->jobs >= cfg->max_token_concurrent)
    return srv_tool_error_result(
        "The token '%s' already has %llu executions running or waiting across its sessions "
        "(the server's per-token limit, --max-token-concurrent). Wait for one to finish and call "
        "again.",
        principal, (unsigned long long)cfg->max_token_concurrent);
  return NULL;
}

void exec_admission_join(exec_job_t *job) {
  exec_state_t *x = job->exec;
  job->tenant = tenant_hold(x, job->spec.principal);
  job->all_next = x->all_jobs;
  if (x->all_jobs) x->all_jobs->all_prev = job;
  x->all_jobs = job;
}

void exec_admission_leave(exec_job_t *job) {
  exec_state_t *x = job->exec;
  if (job->all_prev)
    job->all_prev->all_next = job->all_next;
  else if (x->all_jobs == job)
    x->all_jobs = job->all_next;
  if (job->all_next) job->all_next->all_prev = job->all_prev;
  if (!x->all_jobs &&
      x->start_gate_timer) { /* nothing left to admit (and the loop may be going away) */
    cm_timer_cancel(x->start_gate_timer);
    x->start_gate_timer = NULL;
  }
  tenant_release(x, job->tenant);
  job->tenant = NULL;
}

static size_t max_starting(exec_state_t *x, const srv_config_t *cfg) {
  if (cfg->max_starting) return (size_t)cfg->max_starting;
  if (!x->cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    x->cpus = n > 0 ? (size_t)n : 1;
  }
  return x->cpus;
}

static void starting_end(exec_job_t *job) {
  if (!job->starting_since) return;
  job->starting_since = 0;
  job->exec->n_starting--;
}

static void admit_queued(exec_state_t *x);

static void on_start_gate(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_state_t *x = data;
  x->start_gate_timer = NULL;
  admit_queued(x);
}

/* Starts waiting jobs, in turn across tenants, while there is a slot and room to start;
 * when only the start gate holds them back, wakes up when the oldest start-up window is
 * over. */
static void admit_queued(exec_state_t *x) {
  const srv_config_t *cfg = srv_server_config(x->server);
  uint64_t now = cm_now_ms();
  uint64_t oldest = 0;
  for (exec_job_t *j = x->all_jobs; j; j = j->all_next) {
    if (j->starting_since && now >= j->starting_since + EXEC_START_WINDOW_MS) starting_end(j);
    if (j->starting_since && (!oldest || j->starting_since < oldest)) oldest = j->starting_since;
  }
  exec_tenant_t *t;
  while (x->slots_used < cfg->max_concurrent && x->n_starting < max_starting(x, cfg) &&
         (t = tenant_next(x, cfg))) {
    exec_job_t *next = t->queue_head;
    t->queue_head = next->queue_next;
    if (!t->queue_head) t->queue_tail = NULL;
    next->queue_next = NULL;
    t->queued--;
    x->last_served = t;
    /* How long it waited for its slot (/metrics). */
    uint64_t waited = now - next->queued_at;
    size_t b = 0;
    while (b < SRV_M_BUCKETS && (double)waited / 1000.0 > srv_metric_buckets[b]) b++;
    x->wait_buckets[b]++;
    x->wait_ms_sum += waited;
    x->wait_count++;
    next->holds_slot = true;
    next->starting_since = now ? now : 1;
    x->slots_used++;
    t->running++;
    x->n_starting++;
    if (!oldest) oldest = next->starting_since;
    exec_job_start(next); /* may finish the job, and come back here */
  }
  if (x->slots_used < cfg->max_concurrent && !x->start_gate_timer && oldest &&
      tenant_next(x, cfg)) {
    uint64_t at = oldest + EXEC_START_WINDOW_MS;
    x->start_gate_timer =
        cm_loop_timer(srv_server_loop(x->server), at > now ? at - now : 1, on_start_gate, x);
  }
}

void exec_admission_started(exec_job_t *job) {
  if (!job->starting_since) return;
  starting_end(job);
  admit_queued(job->exec);
}

bool exec_admission_busy(exec_state_t *x) {
  if (x->n_starting >= exec_admission_max_starting(x)) return true;
  /* Only calls that wait for a slot or the gate: those queued behind their own token's
   * --max-token-running wait for nothing a set-up takes, and one token could otherwise keep
   * every other token's pool from refilling by keeping its queue full. */
  const srv_config_t *cfg = srv_server_config(x->server);
  for (const exec_tenant_t *t = x->tenants; t; t = t->next)
    if (tenant_may_run(t, cfg)) return true;
  return false;
}

size_t exec_admission_max_starting(exec_state_t *x) {
  return max_starting(x, srv_server_config(x->server));
}

void exec_admission_release_slot(exec_job_t *job) {
  if (!job->holds_slot) return;
  job->holds_slot = false;
  job->exec->slots_used--;
  job->tenant->running--;
  starting_end(job);
  admit_queued(job->exec);
}

void exec_admission_dequeue(exec_job_t *job) {
  if (job->stage != JOB_QUEUED) return;
  exec_tenant_t *t = job->tenant;
  exec_job_t *prev = NULL;
  for (exec_job_t *j = t->queue_head; j; prev = j, j = j->queue_next) {
    if (j != job) continue;
    if (prev)
      prev->queue_next = j->queue_next;
    else
      t->queue_head = j->queue_next;
    if (t->queue_tail == j) t->queue_tail = prev;
    t->queued--;
    return;
  }
}

void exec_admission_enqueue(exec_job_t *job) {
  exec_state_t *x = job->exec;
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
  } else if (x->slots_used >= cfg->max_concurrent) {
    snprintf(reason, sizeof reason,
             "waiting for a free slot: %llu executions are running (the server's limit, "
             "--max-concurrent); waiting calls are started in turn across tokens",
             (unsigned long long)cfg->max_concurrent);
    wait_note = reason;
  }
  if (wait_note) {
    job->setup_progress += 1;
    srv_request_progress(job->req, job->setup_progress, wait_note, strlen(wait_note), NULL);
  }
  job->queued_at = cm_now_ms();
  if (t->queue_tail)
    t->queue_tail->queue_next = job;
  else
    t->queue_head = job;
  t->queue_tail = job;
  t->queued++;
  admit_queued(x); /* may start and even finish the job */
}
