/* Sessions (execute_python's `session` argument): a kernel (profiles/kernel.py, one
 * long-lived interpreter in a sandbox of its own: its own uid, /tmp, cgroup) and a work
 * directory that outlive a call.
 *
 * The server talks to the kernel through two FIFOs in a control directory of the session's
 * (mounted read-only at EXEC_KERNEL_CTL_TARGET), which the server holds open read-write (so
 * neither end ever sees the other go, and opening never blocks): `req` carries requests, each
 * under PIPE_BUF (a script that fits goes in its request; a longer one is a file the server
 * writes next to them and removes at the call's end), `res` the
 * kernel's results (kframe.c: length-prefixed, capped, parsed as hostile input: the kernel
 * runs the user's code, which may write anything there).  The kernel's stdout and stderr are
 * its run's pipes: the call's output, streamed and bounded as a run's.  A result is acted on
 * a loop turn after it arrived, so that what the kernel wrote to its stdout before it (in the
 * pipes already) is read first.
 *
 * A session holds for its life: the work directory, the control directory, a sandbox
 * identity (bwrap as root: a uid of its own, so files one kernel wrote are the next one's),
 * the interpreter and the dependency environment (a locked handle, so it is never evicted
 * under a kernel).  A kernel that dies (OOM, a signal, os._exit, the timeout's escalation)
 * takes the namespace with it; the next call starts a fresh one on the same work directory.
 * Nothing of a session survives the server: on restart its id is unknown. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

#define SESSION_ID_BYTES 10
#define SESSION_MAX_ID 64
/* The least time a KeyboardInterrupt gets before the kernel is killed. */
#define SESSION_MIN_GRACE_MS 500

struct session_finish {
  exec_session_t *ks; /* NULL once detached */
};

/* A session's life (session_settle moves a closed one on; see docs/architecture.md):
 *   OPEN     made for its first call, which holds it; no kernel yet
 *   BUSY     a call holds it (its kernel, if it has one, thawed once the call runs)
 *   IDLE     between calls: its kernel frozen, the idle timer running
 *   CLOSING  out of the table: waiting for its call's answer and its kernel's exit
 *   DEAD     nothing refers to it: freed by the loop's deferred pass (exec_reap_soon), never
 *            under a caller that still uses it */
typedef enum { KS_OPEN, KS_BUSY, KS_IDLE, KS_CLOSING, KS_DEAD } ks_stage_t;

struct exec_session {
  exec_state_t *exec;
  ks_stage_t stage;
  exec_session_t *next;
  char id[SRV_ROUTE_MAX + 1 + 2 + 2 * SESSION_ID_BYTES + 1]; /* [<route>.]s-<hex> */
  char *principal;
  uint64_t created_ms, last_used_ms;
  uint64_t calls;
  py_interp_t *py; /* the registry's; NULL until the first kernel */
  env_handle_t *env;
  char **requirements; /* the environment's set (NULL-terminated), or NULL */
  char *uv_config;
  bool network, network_set;
  srv_net_call_t net; /* the first call's network: the kernel's */
  char *workdir;
  bool workdir_mounted;
  char *ctl_dir;
  sbx_identity_t *identity;
  /* the kernel */
  sbx_run_t *run;
  eg_session_t *egress;
  int req_fd, res_fd;
  cm_watch_t *w_res;
  cm_buf_t inbuf;
  uint64_t kernels; /* started so far */
  uint64_t kernel_started_ms;
  uint64_t memory_bytes; /* the kernel's resident memory after its last call (its own word) */
  char *why_killed;      /* why the server killed the kernel, once it did */
  char *lost;            /* what ended the last kernel, for the next call's result */
  /* the call */
  /* A call holds the session, from its claim to its answer (OPEN and BUSY; a CLOSING one
   * may still be held by the call that closed it, or that was running then). */
  bool held;
  bool frozen;     /* the kernel is frozen (IDLE) */
  exec_job_t *job; /* the call in the session (from exec_session_run) */
  uint64_t call_id;
  bool sent, timed_out, interrupt_sent, restarting, have_done;
  bool code_in_file; /* the call's script is ctl_dir/call-N.py (too long for its request) */
  uint64_t call_start_ms;
  /* The kernel's cgroup counters when they were last read (at the end of the last call that
   * failed; zero for a new kernel): a failed call, or a death, with more OOM kills or refused
   * forks than that hit the limit (the kernel may live on, its children killed).  They are
   * read only when the kernel reports a failure (a call that succeeded does not need them,
   * and reading costs four file operations), so a failure also counts what struck in
   * earlier calls that succeeded anyway (a child killed, a refused fork caught).  The
   * counters are the kernel's whole life's, so a death is judged by them too, not by
   * sbx_result_t's. */
  sbx_run_events_t call_events;
  /* The counters read as the kernel exited (ks->run is gone then): a call whose answer came
   * before the kernel died is judged by them. */
  sbx_run_events_t exit_events;
  exec_kresult_t done;
  cm_timer_t *t_deadline, *t_grace, *t_idle, *t_life;
  /* A result came: the call finishes after this loop iteration (a deferral that
   * stop_call_timers and session_free detach, so it never reaches a stale session). */
  struct session_finish *finish;
  bool expire_after_call;
  bool exported; /* the last call's export was written (the kernel said so) */
};

static const srv_config_t *cfg_of(exec_session_t *ks) {
  return srv_server_config(ks->exec->server);
}

/* ---------------------------------------------------------------- the table */

static exec_session_t *find(exec_state_t *x, const char *principal, const char *id) {
  for (exec_session_t *ks = x->sessions; ks; ks = ks->next)
    if (strcmp(ks->id, id) == 0 && strcmp(ks->principal, principal) == 0) return ks;
  return NULL;
}

static void unlink_from(exec_session_t **head, exec_session_t *ks) {
  for (exec_session_t **p = head; *p; p = &(*p)->next)
    if (*p == ks) {
      *p = ks->next;
      ks->next = NULL;
      return;
    }
}

/* The oldest session of principal that no call holds, or NULL. */
static exec_session_t *oldest_idle(exec_state_t *x, const char *principal) {
  for (exec_session_t *ks = x->sessions; ks; ks = ks->next)
    if (!ks->held && strcmp(ks->principal, principal) == 0) return ks;
  return NULL;
}

/* At the server's cap, for a principal holding less than its fair share (the cap divided among
 * the principals that hold sessions, it included): the oldest idle session of the principal
 * holding the most, if that one holds more than its share; else NULL.  So no tenant's idle
 * sessions keep another out for good, and none loses one while it holds no more than its
 * share. */
static size_t held_by(exec_state_t *x, const char *principal) {
  size_t n = 0;
  for (exec_session_t *o = x->sessions; o; o = o->next) n += strcmp(o->principal, principal) == 0;
  return n;
}

static exec_session_t *fair_share_victim(exec_state_t *x, const char *principal, size_t mine) {
  uint64_t cap = srv_server_config(x->server)->max_exec_sessions;
  size_t principals = mine ? 0 : 1; /* the caller, when it holds none yet */
  const char *biggest = NULL;
  size_t most = 0;
  for (exec_session_t *ks = x->sessions; ks; ks = ks->next) {
    bool first = true; /* each principal counted once, at its first session in the list */
    for (exec_session_t *o = x->sessions; o != ks; o = o->next)
      if (strcmp(o->principal, ks->principal) == 0) first = false;
    if (!first) continue;
    principals++;
    size_t held = held_by(x, ks->principal);
    if (held > most && strcmp(ks->principal, principal) != 0) most = held, biggest = ks->principal;
  }
  uint64_t share = principals ? cap / principals : cap;
  if (!biggest || mine >= share || most <= share) return NULL;
  return oldest_idle(x, biggest);
}

void exec_sessions_count(exec_state_t *x, const char *principal, size_t *mine, size_t *all) {
  *mine = *all = 0;
  for (exec_session_t *ks = x->sessions; ks; ks = ks->next) {
    (*all)++;
    if (principal && strcmp(ks->principal, principal) == 0) (*mine)++;
  }
}

bool exec_sessions_available(exec_state_t *x, const char **why) {
  *why = NULL;
  if (!srv_server_config(x->server)->max_exec_sessions) {
    *why = "sessions are off on this server (--max-exec-sessions 0)";
    return false;
  }
  return true;
}

/* ---------------------------------------------------------------- closing */

static void kernel_close_channel(exec_session_t *ks) {
  cm_watch_remove(ks->w_res);
  ks->w_res = NULL;
  if (ks->req_fd >= 0) close(ks->req_fd);
  if (ks->res_fd >= 0) close(ks->res_fd);
  ks->req_fd = ks->res_fd = -1;
  cm_buf_reset(&ks->inbuf);
}

static void stop_call_timers(exec_session_t *ks) {
  cm_timer_cancel(ks->t_deadline);
  cm_timer_cancel(ks->t_grace);
  ks->t_deadline = ks->t_grace = NULL;
  if (ks->finish) ks->finish->ks = NULL;
  ks->finish = NULL;
}

/* Everything of a session that is closed and whose kernel is gone. */
static void session_free(exec_session_t *ks) {
  exec_state_t *x = ks->exec;
  unlink_from(&x->dying, ks);
  stop_call_timers(ks);
  cm_timer_cancel(ks->t_idle);
  cm_timer_cancel(ks->t_life);
  kernel_close_channel(ks);
  cm_buf_release(&ks->inbuf);
  eg_session_close(ks->egress);
  if (ks->ctl_dir) {
    cm_error_t err = CM_ERROR_INIT;
    if (cm_rm_rf(ks->ctl_dir, &err) < 0) {
      cm_warn("removing %s: %s", ks->ctl_dir, cm_error_message(&err));
      cm_error_release(&err);
    }
  }
  if (ks->workdir) exec_workdir_remove(ks->workdir, ks->workdir_mounted);
  sbx_identity_free(ks->identity);
  env_release(ks->env);
  cm_strv_free(ks->requirements);
  srv_net_call_release(&ks->net);
  exec_kresult_release(&ks->done);
  free(ks->uv_config);
  free(ks->workdir);
  free(ks->ctl_dir);
  free(ks->principal);
  free(ks->why_killed);
  free(ks->lost);
  free(ks);
}

/* The loop's deferred pass (exec_reap_soon, queued by session_settle): frees every DEAD
 * session. */
void exec_sessions_reap(exec_state_t *x) {
  for (exec_session_t **p = &x->dying; *p;) {
    exec_session_t *ks = *p;
    if (ks->stage != KS_DEAD) {
      p = &ks->next;
      continue;
    }
    *p = ks->next;
    session_free(ks);
  }
}

/* A closed session whose call answered and whose kernel exited becomes DEAD and is freed
 * after this loop iteration: whoever is on the stack may still use it until then. */
static void session_settle(exec_session_t *ks) {
  if (ks->stage != KS_CLOSING || ks->held || ks->run) return;
  ks->stage = KS_DEAD;
  exec_reap_soon(ks->exec);
}

/* The kernel frozen between calls (IDLE), thawed for the next one: a thread or process the
 * user's code left running uses no CPU outside the calls the scheduler admitted. */
static void kernel_freeze(exec_session_t *ks, bool frozen) {
  if (!ks->run || ks->frozen == frozen) return;
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_run_freeze(ks->run, frozen, NULL, &err) < 0) {
    cm_log(err.kind == CM_ERR_UNSUPPORTED ? CM_LOG_DEBUG : CM_LOG_WARNING,
           "session %s: %s the kernel: %s", ks->id, frozen ? "freezing" : "thawing",
           cm_error_message(&err));
    cm_error_release(&err);
    return;
  }
  ks->frozen = frozen;
}

static void kill_kernel(exec_session_t *ks, const char *why) {
  if (!ks->run) return;
  if (why && !ks->why_killed) ks->why_killed = xstrdup(why);
  sbx_run_cancel(ks->run); /* kernel_exit follows */
}

static void session_close(exec_session_t *ks, const char *why) {
  if (ks->stage >= KS_CLOSING) return;
  exec_state_t *x = ks->exec;
  cm_debug("session %s closed: %s", ks->id, why);
  ks->stage = KS_CLOSING;
  unlink_from(&x->sessions, ks);
  x->n_sessions--;
  ks->next = x->dying;
  x->dying = ks;
  cm_timer_cancel(ks->t_idle);
  cm_timer_cancel(ks->t_life);
  ks->t_idle = ks->t_life = NULL;
  kill_kernel(ks, why);
  session_settle(ks);
}

bool exec_session_close(exec_state_t *x, const char *principal, const char *id) {
  exec_session_t *ks = find(x, principal, id);
  if (!ks) return false;
  session_close(ks, "closed by close_session");
  return true;
}

void exec_sessions_free(exec_state_t *x) {
  while (x->sessions) session_close(x->sessions, "the server stops");
  /* (A deferred pass still queued finds none of them.) */
  while (x->dying) {
    exec_session_t *ks = x->dying;
    if (ks->run) sbx_run_free(ks->run); /* kills and reaps, now */
    ks->run = NULL;
    session_free(ks);
  }
}

static void on_idle(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_session_t *ks = data;
  ks->t_idle = NULL;
  if (!ks->held)
    session_close(ks, ks->expire_after_call ? "its maximum lifetime is over" : "idle too long");
}

static void on_life(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_session_t *ks = data;
  ks->t_life = NULL;
  ks->expire_after_call = true;
  if (!ks->held) session_close(ks, "its maximum lifetime is over");
}

/* ---------------------------------------------------------------- claiming */

static exec_session_t *session_new(exec_state_t *x, const char *principal, cm_error_t *err) {
  srv_server_t *s = x->server;
  const srv_config_t *cfg = srv_server_config(s);
  exec_session_t *ks = xcalloc(1, sizeof *ks);
  ks->exec = x;
  ks->req_fd = ks->res_fd = -1;
  cm_buf_init(&ks->inbuf, 4 + EXEC_KFRAME_MAX);
  unsigned char raw[SESSION_ID_BYTES];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno != EINTR) abort(); /* an unguessable id is a must */
    if (n > 0) got += (size_t)n;
  }
  /* --route: "<route>.s-<hex>", so that a front sends the calls naming it to this replica. */
  char *p = ks->id;
  if (cfg->route) p += snprintf(p, SRV_ROUTE_MAX + 2, "%s.", cfg->route);
  p[0] = 's';
  p[1] = '-';
  for (size_t i = 0; i < sizeof raw; i++) snprintf(p + 2 + 2 * i, 3, "%02x", raw[i]);
  ks->principal = xstrdup(principal);
  ks->created_ms = ks->last_used_ms = cm_now_ms();
  ks->workdir = exec_workdir_make(x, &ks->workdir_mounted, err);
  if (!ks->workdir) goto fail;
  ks->ctl_dir = xasprintf("%s/ses-XXXXXX", srv_server_runs_dir(s));
  if (!mkdtemp(ks->ctl_dir)) {
    cm_error_set(err, errno, CM_ERR_IO, "creating %s", ks->ctl_dir);
    free(ks->ctl_dir);
    ks->ctl_dir = NULL;
    goto fail;
  }
  chmod(ks->ctl_dir, 0711); /* the kernel's uid opens the FIFOs by name, lists nothing */
  ks->identity = sbx_identity_new(srv_server_backend(s));
  if (cfg->exec_session_max_ms)
    ks->t_life = cm_loop_timer(srv_server_loop(s), cfg->exec_session_max_ms, on_life, ks);
  /* Oldest first: the list's order is the listing's and the cap's. */
  exec_session_t **tail = &x->sessions;
  while (*tail) tail = &(*tail)->next;
  *tail = ks;
  x->n_sessions++;
  return ks;
fail:
  ks->stage = KS_DEAD; /* never in the table: nobody saw it */
  ks->next = x->dying;
  x->dying = ks;
  session_free(ks);
  return NULL;
}

/* Whether two calls' network lists name the same destinations (as sets of canonical rules). */
static bool rules_within(const srv_net_call_t *a, const srv_net_call_t *b) {
  for (size_t i = 0; i < a->n_rules; i++) {
    bool found = false;
    for (size_t j = 0; j < b->n_rules && !found; j++)
      found = strcmp(a->rules[i].text, b->rules[j].text) == 0;
    if (!found) return false;
  }
  return true;
}

static bool same_rules(const srv_net_call_t *a, const srv_net_call_t *b) {
  return a->on == b->on && rules_within(a, b) && rules_within(b, a);
}

static char *rules_text(const srv_net_call_t *c) {
  if (!c->on) return xstrdup("no network");
  if (!c->rules) return xstrdup("the server's policy");
  cm_buf_t t;
  cm_buf_init(&t, 0);
  cm_buf_appends(&t, "only ");
  for (size_t i = 0; i < c->n_rules; i++)
    cm_buf_printf(&t, "%s%s", i ? ", " : "", c->rules[i].text);
  return cm_buf_steal(&t);
}

json_t *exec_session_claim(exec_state_t *x, exec_spec_t *spec, exec_session_t **out, char **note) {
  const srv_config_t *cfg = srv_server_config(x->server);
  *out = NULL;
  *note = NULL;
  const char *why;
  if (!exec_sessions_available(x, &why))
    return srv_tool_error_result("This server keeps no sessions: %s.", why);
  const char *principal = spec->principal;
  if (strcmp(spec->session, "new") != 0) {
    exec_session_t *ks =
        strlen(spec->session) <= SESSION_MAX_ID ? find(x, principal, spec->session) : NULL;
    if (!ks) {
      cleanup_free char *shown = cm_log_excerpt(spec->session, strlen(spec->session), 64);
      if (srv_route_foreign(cfg, spec->session)) {
        cleanup_free char *whose = srv_route_unknown(cfg, "session", spec->session);
        return srv_tool_error_result(
            "Session '%s': %s. Start a new one with session: \"new\" "
            "(files written in the old one are gone if its replica is).",
            shown, whose);
      }
      return srv_tool_error_result(
          "Session '%s': session expired or unknown. Sessions end when closed, after %llu s "
          "without a call, %llu s after they started, or when the server restarts; start a new "
          "one with session: \"new\" (files written in the old one are gone).",
          shown, (unsigned long long)(cfg->exec_session_idle_ms / 1000),
          (unsigned long long)(cfg->exec_session_max_ms / 1000));
    }
    if (spec->net.rules && ks->network_set && !same_rules(&spec->net, &ks->net)) {
      cleanup_free char *mine = rules_text(&ks->net);
      return srv_tool_error_result(
          "Session %s: its network was set by its first call (%s) and stays for its life; this "
          "call's network list was not applied, and the call did not run. Call again without "
          "`network` (or with the same list), or start a new session with this list.",
          ks->id, mine);
    }
    if (ks->held)
      return srv_tool_error_result(
          "Session %s is running another call: a session runs one call at a time. Wait for "
          "that call's answer (or cancel it), then call again.",
          ks->id);
    ks->held = true;
    ks->stage = KS_BUSY;
    /* (The kernel stays frozen until the call runs, exec_session_run: a call waiting for a
     * slot or its environment was not admitted yet.) */
    cm_timer_cancel(ks->t_idle);
    ks->t_idle = NULL;
    *out = ks;
    return NULL;
  }
  /* Room for one more: the principal's own oldest idle session makes it, never another's. */
  size_t mine, all;
  exec_sessions_count(x, principal, &mine, &all);
  uint64_t per = cfg->max_exec_sessions_per_token;
  if ((per && mine >= per) || all >= cfg->max_exec_sessions) {
    exec_session_t *victim = oldest_idle(x, principal);
    bool others = false;
    if (!victim && !(per && mine >= per)) {
      victim = fair_share_victim(x, principal, mine);
      others = victim != NULL;
    }
    if (others) {
      *note = xasprintf(
          "the server was at its cap of %llu sessions: the oldest idle session of a principal "
          "holding more than its fair share was closed to make room",
          (unsigned long long)cfg->max_exec_sessions);
      cm_info("session %s of %s closed: %s holds less than its share of --max-exec-sessions",
              victim->id, victim->principal, principal);
      session_close(victim, "closed to give another principal its fair share of sessions");
    } else if (!victim) {
      if (per && mine >= per)
        return srv_tool_error_result(
            "You have %zu sessions, the most this server allows (--max-exec-sessions-per-token "
            "%llu), and all are running a call. Close one with close_session, or wait.",
            mine, (unsigned long long)per);
      return srv_tool_error_result(
          "The server holds the most sessions it allows (%llu, --max-exec-sessions) and none of "
          "yours is idle to make room. Try again later, or run without a session.",
          (unsigned long long)cfg->max_exec_sessions);
    }
    if (!others) {
      *note = xasprintf(
          "session %s (your oldest idle one) was closed to make room: at most %llu "
          "sessions %s",
          victim->id, (unsigned long long)(per && mine >= per ? per : cfg->max_exec_sessions),
          per && mine >= per ? "per principal" : "on this server");
      session_close(victim, "closed for a new session (cap)");
    }
  }
  cm_error_t err = CM_ERROR_INIT;
  exec_session_t *ks = session_new(x, principal, &err);
  if (!ks) {
    free(*note);
    *note = NULL;
    json_t *r = srv_tool_error_result("Cannot start a session: %s", cm_error_message(&err));
    cm_error_release(&err);
    return r;
  }
  ks->held = true; /* (KS_OPEN) */
  *out = ks;
  return NULL;
}

py_interp_t *exec_session_python(exec_session_t *ks) {
  return ks->py;
}

/* ---------------------------------------------------------------- the environment */

static bool strv_has(char *const *v, const char *s) {
  for (; v && *v; v++)
    if (strcmp(*v, s) == 0) return true;
  return false;
}

bool exec_session_prepare(exec_job_t *job) {
  exec_session_t *ks = job->ksession;
  exec_spec_t *spec = &job->spec;
  if (!ks->env) return spec->n_requirements == 0;
  bool more = spec->uv_config && (!ks->uv_config || strcmp(spec->uv_config, ks->uv_config) != 0);
  for (size_t i = 0; i < spec->n_requirements && !more; i++)
    more = !strv_has(ks->requirements, spec->requirements[i]);
  if (!more) {
    job->env = ks->env;
    job->env_borrowed = true;
    return true;
  }
  /* A new environment of both sets: never a write into the cached one the kernel uses. */
  cm_strv_builder_t b = {0};
  for (char **r = ks->requirements; r && *r; r++) cm_strv_add(&b, *r);
  for (size_t i = 0; i < spec->n_requirements; i++)
    if (!strv_has(ks->requirements, spec->requirements[i])) cm_strv_add(&b, spec->requirements[i]);
  cm_strv_free(spec->requirements);
  spec->requirements = cm_strv_steal(&b);
  spec->n_requirements = cm_strv_len(spec->requirements);
  if (!spec->uv_config && ks->uv_config) spec->uv_config = xstrdup(ks->uv_config);
  return false;
}

/* ---------------------------------------------------------------- notes */

static void add_note(exec_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(exec_job_t *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *s = xvasprintf(fmt, ap);
  va_end(ap);
  char *joined = job->session_note ? xasprintf("%s; %s", job->session_note, s) : xstrdup(s);
  free(job->session_note);
  job->session_note = joined;
}

/* ---------------------------------------------------------------- the kernel */

static void call_finish(exec_session_t *ks, const sbx_result_t *death);
static void call_send(exec_session_t *ks);

static void kernel_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  exec_session_t *ks = data;
  exec_job_t *job = ks->sent ? ks->job : NULL;
  if (!job) {
    /* A thread or a process the user left running writes between calls: no call to give
     * it to. */
    cm_debug("session %s: %zu bytes of output between calls dropped", ks->id, len);
    return;
  }
  cm_headtail_append(stream == SBX_STDOUT ? &job->out : &job->err, buf, len);
  exec_progress_output(job, stream, buf, len);
}

static char *death_text(exec_session_t *ks, const sbx_result_t *res) {
  if (ks->why_killed) return xasprintf("was killed: %s", ks->why_killed);
  if (res->memory_limit)
    return xstrdup(
        "was killed by the out-of-memory killer (the memory limit of the session's "
        "process tree)");
  if (res->term_signal) return xasprintf("was killed by signal %d", res->term_signal);
  return xasprintf("exited with code %d (os._exit, sys.exit in a thread, or a crash)",
                   res->exit_code);
}

static void kernel_exit(void *data, const sbx_result_t *exit_res) {
  exec_session_t *ks = data;
  /* The run's own result says whether the memory or process limit struck in the kernel's
   * whole life; what counts is since the call began (or the last one ended). */
  sbx_run_events(ks->run, &ks->exit_events);
  sbx_result_t fixed = *exit_res;
  const sbx_result_t *res = &fixed;
  if (ks->exit_events.known) {
    fixed.memory_limit = ks->exit_events.oom_kills > ks->call_events.oom_kills;
    fixed.process_limit = ks->exit_events.forks_refused > ks->call_events.forks_refused;
  }
  sbx_run_free(ks->run);
  ks->run = NULL;
  ks->frozen = false;
  kernel_close_channel(ks);
  cleanup_free char *how = death_text(ks, res);
  free(ks->why_killed);
  ks->why_killed = NULL;
  ks->memory_bytes = 0;
  if (ks->job && ks->sent) {
    if (ks->have_done) {
      call_finish(ks, NULL); /* its answer came; the kernel died after it */
    } else {
      add_note(ks->job,
               "the kernel %s during this call: everything in its memory is lost (variables, "
               "imports, open files, threads); the files in /work are kept, and the next call "
               "starts a fresh kernel",
               how);
      call_finish(ks, res);
    }
  } else if (!ks->restarting && ks->stage != KS_CLOSING) {
    free(ks->lost);
    ks->lost = xasprintf("the previous kernel %s between calls", how);
  }
  /* The next kernel counts from zero. */
  ks->call_events = ks->exit_events = (sbx_run_events_t){0};
  eg_session_close(ks->egress);
  ks->egress = NULL;
  if (ks->restarting) {
    ks->restarting = false;
    if (ks->job) call_send(ks); /* on the new environment */
  }
  session_settle(ks);
}

/* Deferred (after the loop iteration in which the result arrived): what the kernel wrote to
 * its stdout and stderr before it (it flushes them first) is read now, then the call ends. */
static void on_finish(void *data) {
  struct session_finish *f = data;
  exec_session_t *ks = f->ks;
  free(f);
  if (!ks) return;
  ks->finish = NULL;
  sbx_run_read_pending(ks->run);
  call_finish(ks, NULL);
}

static void kernel_broken(exec_session_t *ks, const char *why) {
  cm_debug("session %s: %s", ks->id, why);
  cm_watch_remove(ks->w_res);
  ks->w_res = NULL;
  kill_kernel(ks, why);
}

static void read_results(exec_session_t *ks, int fd);

static void handle_frame(exec_session_t *ks, json_t *frame) {
  exec_kresult_t r;
  cm_error_t err = CM_ERROR_INIT;
  if (exec_kresult_from_json(frame, &r, &err) < 0) {
    cleanup_free char *why = xasprintf("it sent a malformed result (%s)", cm_error_message(&err));
    cm_error_release(&err);
    kernel_broken(ks, why);
    return;
  }
  if (!ks->sent || ks->have_done || r.id != ks->call_id) {
    cm_debug("session %s: a result for call %llu ignored", ks->id, (unsigned long long)r.id);
    exec_kresult_release(&r);
    return;
  }
  exec_kresult_release(&ks->done);
  ks->done = r;
  ks->have_done = true;
  ks->memory_bytes = r.rss_bytes;
  cm_timer_cancel(ks->t_deadline);
  cm_timer_cancel(ks->t_grace);
  ks->t_deadline = ks->t_grace = NULL;
  /* Not from inside the frame reader; a timer would cost a millisecond. */
  ks->finish = xcalloc(1, sizeof *ks->finish);
  ks->finish->ks = ks;
  cm_loop_defer(srv_server_loop(ks->exec->server), on_finish, ks->finish);
}

static void on_res(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  read_results(data, fd);
}

static void read_results(exec_session_t *ks, int fd) {
  char buf[4096];
  for (size_t budget = 0; budget < 16 && ks->w_res; budget++) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return; /* EAGAIN (the server holds a writer too: never EOF) */
    if (cm_buf_append(&ks->inbuf, buf, (size_t)n) < 0) {
      kernel_broken(ks, "it sent a result frame over the size limit");
      return;
    }
    for (;;) {
      size_t used;
      json_t *frame;
      cm_error_t err = CM_ERROR_INIT;
      int rc = exec_kframe_parse(ks->inbuf.data, ks->inbuf.len, &used, &frame, &err);
      if (rc < 0) {
        cleanup_free char *why =
            xasprintf("it sent a malformed frame (%s)", cm_error_message(&err));
        cm_error_release(&err);
        kernel_broken(ks, why);
        return;
      }
      if (rc == 0) break;
      cm_buf_consume(&ks->inbuf, used);
      handle_frame(ks, frame);
      json_decref(frame);
      if (!ks->w_res) return;
    }
  }
}

static int make_fifo(exec_session_t *ks, const char *name, int *fd, cm_error_t *err) {
  cleanup_free char *path = xasprintf("%s/%s", ks->ctl_dir, name);
  if (unlink(path) < 0 && errno != ENOENT)
    return cm_error_set(err, errno, CM_ERR_IO, "removing %s", path);
  /* Whatever an earlier kernel left unread in it is gone with it. */
  if (mkfifo(path, 0600) < 0 || chmod(path, 0666) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "creating the FIFO %s", path);
  *fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "opening the FIFO %s", path);
  return 0;
}

static int kernel_start(exec_session_t *ks, cm_error_t *err) {
  exec_job_t *job = ks->job;
  srv_server_t *s = ks->exec->server;
  if (make_fifo(ks, "req", &ks->req_fd, err) < 0 || make_fifo(ks, "res", &ks->res_fd, err) < 0) {
    kernel_close_channel(ks);
    return -1;
  }
  sbx_run_callbacks_t cbs = {.on_output = kernel_output, .on_exit = kernel_exit};
  if (exec_sandbox_start_kernel(ks->exec, ks->py, ks->env, ks->network, ks->workdir, ks->ctl_dir,
                                ks->identity, &cbs, ks, &ks->run, &ks->egress, err) < 0) {
    kernel_close_channel(ks);
    return -1;
  }
  if (ks->egress && ks->net.rules) eg_session_narrow(ks->egress, ks->net.rules, ks->net.n_rules);
  ks->w_res = cm_loop_watch(srv_server_loop(s), ks->res_fd, EPOLLIN, on_res, ks, err);
  if (!ks->w_res) {
    kill_kernel(ks, "its result channel could not be watched");
    return -1;
  }
  ks->kernels++;
  ks->kernel_started_ms = cm_now_ms();
  if (ks->lost) {
    add_note(job,
             "a fresh kernel was started (%s; variables and imports from before are gone, "
             "the files in /work are kept)",
             ks->lost);
    free(ks->lost);
    ks->lost = NULL;
  }
  return 0;
}

static void on_grace(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_session_t *ks = data;
  ks->t_grace = NULL;
  cleanup_free char *why = xasprintf(
      "the call did not stop within %llu ms of its KeyboardInterrupt",
      (unsigned long long)CM_MAX(cfg_of(ks)->kill_grace_ms, (uint64_t)SESSION_MIN_GRACE_MS));
  kill_kernel(ks, why);
}

/* KeyboardInterrupt in the running call, and the kernel killed if it does not come back. */
static void interrupt_call(exec_session_t *ks) {
  if (ks->interrupt_sent || !ks->sent || ks->have_done) return;
  ks->interrupt_sent = true;
  json_t *req = json_pack("{s:s, s:I}", "op", "interrupt", "id", (json_int_t)ks->call_id);
  size_t len;
  cleanup_free char *frame = exec_kframe_encode(req, &len);
  json_decref(req);
  if (ks->req_fd < 0 || write(ks->req_fd, frame, len) != (ssize_t)len) {
    kill_kernel(ks, "it stopped reading its requests");
    return;
  }
  ks->t_grace = cm_loop_timer(srv_server_loop(ks->exec->server),
                              CM_MAX(cfg_of(ks)->kill_grace_ms, (uint64_t)SESSION_MIN_GRACE_MS),
                              on_grace, ks);
}

static void on_deadline(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_session_t *ks = data;
  ks->t_deadline = NULL;
  ks->timed_out = true;
  interrupt_call(ks);
}

static int write_inputs(exec_session_t *ks, exec_job_t *job, cm_error_t *err) {
  if (!job->spec.inputs.n) return 0;
  cleanup_close int wfd = open(ks->workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (wfd < 0)
    return cm_error_set(err, errno, CM_ERR_IO,
                        "Cannot write the input files: opening the work directory");
  if (files_write_inputs_over(wfd, &job->spec.inputs, err) < 0)
    return cm_error_wrap(err, "Cannot write the input files");
  files_inputs_release(&job->spec.inputs);
  return 0;
}

/* The job's script to the kernel (started first when there is none). */
static void call_send(exec_session_t *ks) {
  exec_job_t *job = ks->job;
  cm_error_t err = CM_ERROR_INIT;
  if (!ks->run && kernel_start(ks, &err) < 0) {
    ks->job = NULL;
    exec_job_finish(job, srv_tool_error_result("The session's kernel could not start: %s",
                                               cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  ks->call_id++;
  ks->code_in_file = false;
  if (write_inputs(ks, job, &err) < 0) {
    ks->job = NULL;
    exec_job_finish(job, srv_tool_error_result("%s", cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  cleanup_free char *code_name = xasprintf("call-%llu.py", (unsigned long long)ks->call_id);
  bool maps = sbx_backend_maps_paths(srv_server_backend(ks->exec->server));
  cleanup_free char *filename = xasprintf("%s/%s", maps ? "/work" : ks->workdir, code_name);
  /* The script in the request when the frame stays under PIPE_BUF (most cells): no file to
   * create, write and remove on the server's disk. */
  json_t *req = json_pack("{s:s, s:I, s:s%, s:s, s:b}", "op", "run", "id", (json_int_t)ks->call_id,
                          "code", job->spec.script, job->spec.script_len, "filename", filename,
                          "export", job->spec.export_workspace);
  size_t len = 0;
  cleanup_free char *frame = req ? exec_kframe_encode(req, &len) : NULL;
  json_decref(req);
  if (!frame || len > PIPE_BUF) {
    free(steal_pointer(&frame));
    cleanup_free char *code_path = xasprintf("%s/%s", ks->ctl_dir, code_name);
    if (cm_write_file(code_path, job->spec.script, job->spec.script_len, 0644, &err) < 0) {
      ks->job = NULL;
      exec_job_finish(job, srv_tool_error_result("%s", cm_error_message(&err)));
      cm_error_release(&err);
      return;
    }
    ks->code_in_file = true;
    cleanup_free char *code_file =
        maps ? xasprintf(EXEC_KERNEL_CTL_TARGET "/%s", code_name) : xstrdup(code_path);
    req = json_pack("{s:s, s:I, s:s, s:s, s:b}", "op", "run", "id", (json_int_t)ks->call_id,
                    "code_file", code_file, "filename", filename, "export",
                    job->spec.export_workspace);
    frame = exec_kframe_encode(req, &len);
    json_decref(req);
  }
  ks->sent = true;
  ks->timed_out = ks->interrupt_sent = ks->have_done = false;
  ks->call_start_ms = cm_now_ms();
  /* Under PIPE_BUF: written whole, or the FIFO is full because the user's code filled it. */
  if (write(ks->req_fd, frame, len) != (ssize_t)len) {
    kill_kernel(ks, "it stopped reading its requests");
    return;
  }
  ks->t_deadline =
      cm_loop_timer(srv_server_loop(ks->exec->server), job->spec.timeout_ms, on_deadline, ks);
}

void exec_session_run(exec_job_t *job) {
  exec_session_t *ks = job->ksession;
  if (ks->stage == KS_CLOSING) {
    exec_job_finish(
        job, srv_tool_error_result("Session %s was closed before the call could run.", ks->id));
    return;
  }
  ks->job = job;
  kernel_freeze(ks, false);            /* admitted: the kernel runs again */
  job->workdir = xstrdup(ks->workdir); /* where the call's outputs/ is collected */
  if (!ks->py) ks->py = job->py;
  if (!ks->network_set) {
    ks->network_set = true;
    ks->network = job->spec.net.on;
    ks->net = job->spec.net;
    memset(&job->spec.net, 0, sizeof job->spec.net);
    job->spec.net.on = ks->network;
  } else if (job->spec.net.on != ks->network) {
    add_note(job, "network: %s was ignored: a session's network is set by its first call (%s)",
             job->spec.net.on ? "on" : "off", ks->network ? "on" : "off");
    job->spec.net.on = ks->network;
  }
  bool restart = false;
  if (job->env && !job->env_borrowed) {
    /* A new environment: the session's from now on, and a kernel on it. */
    restart = ks->run != NULL;
    if (ks->env) {
      add_note(job, "the session's environment now has %zu packages%s", job->spec.n_requirements,
               restart ? ": the kernel was restarted on it (variables and imports from before "
                         "are gone, the files in /work are kept)"
                       : "");
    }
    env_release(ks->env);
    ks->env = job->env;
    job->env_borrowed = true;
    cm_strv_free(ks->requirements);
    ks->requirements = cm_strv_dup(job->spec.requirements);
    free(ks->uv_config);
    ks->uv_config = job->spec.uv_config ? xstrdup(job->spec.uv_config) : NULL;
  }
  if (restart) {
    ks->restarting = true;
    kill_kernel(ks, "restarted on a new environment");
    return; /* kernel_exit sends the call */
  }
  call_send(ks);
}

bool exec_session_cancel(exec_job_t *job) {
  exec_session_t *ks = job->ksession;
  if (ks->job != job || !ks->sent) return false;
  interrupt_call(ks); /* its answer (or the kernel's death) ends the job */
  return true;
}

/* ---------------------------------------------------------------- a call's end */

/* The call's script, once it ended: on the server's disk (outside the work directory's
 * size limit), so it must not stay for the session's life; the kernel keeps its text in
 * linecache for tracebacks. */
static void remove_code_file(exec_session_t *ks) {
  if (!ks->code_in_file) return;
  ks->code_in_file = false;
  cleanup_free char *path =
      xasprintf("%s/call-%llu.py", ks->ctl_dir, (unsigned long long)ks->call_id);
  if (unlink(path) < 0 && errno != ENOENT) cm_warn("removing %s: %s", path, strerror(errno));
}

static void call_finish(exec_session_t *ks, const sbx_result_t *death) {
  exec_job_t *job = ks->job;
  stop_call_timers(ks);
  remove_code_file(ks);
  sbx_result_t res = {0};
  if (death) {
    res = *death;
    res.cancelled = false;
  } else {
    res.exit_code = ks->done.exit_code;
    if (ks->done.status != EXEC_KSTATUS_OK || ks->done.exit_code != 0) {
      sbx_run_events_t now = ks->exit_events;
      if (ks->run) sbx_run_events(ks->run, &now);
      res.memory_limit = now.known && now.oom_kills > ks->call_events.oom_kills;
      res.process_limit = now.known && now.forks_refused > ks->call_events.forks_refused;
      /* From now on, a failure or a death is judged from here. */
      if (ks->run) ks->call_events = now;
    }
  }
  res.timed_out = ks->timed_out;
  res.duration_ms = cm_now_ms() - ks->call_start_ms;
  cleanup_free char *display = ks->have_done && ks->done.display ? xstrdup(ks->done.display) : NULL;
  const char *status = ks->have_done ? exec_kstatus_name(ks->done.status) : "kernel_died";
  ks->exported = job->spec.export_workspace && ks->have_done && !ks->done.export_error;
  if (job->spec.export_workspace && !ks->exported)
    add_note(job, "the export failed (%s): no outputs/workspace.tar",
             ks->have_done ? ks->done.export_error : "the kernel did not finish the call");
  ks->sent = ks->have_done = false;
  exec_kresult_release(&ks->done);
  if (srv_request_cancelled(job->req)) {
    exec_job_finish(job, json_object());
    return;
  }
  if (job->pending.len || job->skipped) exec_progress_flush(job);
  const srv_config_t *cfg = job->cfg;
  sbx_backend_t *nb = srv_server_backend(job->server);
  json_t *network = srv_network_result(cfg, nb, &ks->net, ks->egress);
  cm_buf_t net_text;
  cm_buf_init(&net_text, 0);
  srv_network_text(cfg, nb, &ks->net, ks->egress, &net_text);
  json_t *result = exec_output_result(job, &res, network, &net_text);
  cm_buf_release(&net_text);
  json_t *sc = json_object_get(result, "structuredContent");
  if (sc) {
    json_object_set_new(sc, "display", display ? json_string(display) : json_null());
    json_object_set_new(sc, "call_status", json_string(status));
  }
  exec_job_finish(job, result);
}

static json_t *session_json(exec_session_t *ks) {
  uint64_t now = cm_now_ms();
  const char *state = ks->stage >= KS_CLOSING ? "closed" : ks->held ? "busy" : "idle";
  json_t *o = json_pack("{s:s, s:s, s:b, s:b, s:I, s:I, s:I, s:I}", "id", ks->id, "state", state,
                        "kernel_running", ks->run != NULL, "kernel_frozen", ks->frozen, "calls",
                        (json_int_t)ks->calls, "kernels_started", (json_int_t)ks->kernels,
                        "age_seconds", (json_int_t)((now - ks->created_ms) / 1000), "idle_seconds",
                        (json_int_t)(ks->held ? 0 : (now - ks->last_used_ms) / 1000));
  json_object_set_new(o, "python", ks->py ? json_string(ks->py->version) : json_null());
  json_object_set_new(
      o, "environment",
      ks->env ? json_pack("{s:s, s:O}", "key", ks->env->key, "packages", ks->env->packages)
              : json_null());
  json_object_set_new(
      o, "memory_bytes",
      ks->run && ks->memory_bytes ? json_integer((json_int_t)ks->memory_bytes) : json_null());
  json_t *bytes = json_null();
  struct statvfs sv;
  if (ks->workdir_mounted && statvfs(ks->workdir, &sv) == 0)
    bytes = json_integer((json_int_t)((uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize));
  json_object_set_new(o, "workdir_bytes", bytes);
  const srv_config_t *cfg = cfg_of(ks);
  uint64_t idle_left = cfg->exec_session_idle_ms / 1000;
  json_object_set_new(o, "idle_timeout_seconds", json_integer((json_int_t)idle_left));
  return o;
}

json_t *exec_sessions_list(exec_state_t *x, const char *principal) {
  json_t *a = json_array();
  for (exec_session_t *ks = x->sessions; ks; ks = ks->next)
    if (strcmp(ks->principal, principal) == 0) json_array_append_new(a, session_json(ks));
  return a;
}

void exec_session_job_done(exec_job_t *job, json_t *result) {
  exec_session_t *ks = job->ksession;
  if (ks->job == job) {
    ks->job = NULL;
    ks->sent = ks->restarting = false;
    stop_call_timers(ks);
  }
  ks->held = false;
  ks->calls++;
  ks->last_used_ms = cm_now_ms();
  /* A session whose first call never reached a kernel (no interpreter, a failed build) has
   * nothing to keep. */
  bool never_started = ks->kernels == 0 && !ks->run;
  /* close_session's export: a session whose files did not come back is kept, not lost. */
  bool export_failed = job->spec.export_workspace && !ks->exported && !never_started;
  ks->exported = false;
  if (job->spec.close_session && export_failed) {
    add_note(job,
             "the session was not closed, so that its files are not lost: free room in "
             "/work (or fix what failed) and export again, or close it without export");
    json_object_set_new(result, "isError", json_true());
  }
  bool close_now = never_started || (job->spec.close_session && !export_failed);
  if (!close_now && ks->stage != KS_CLOSING) {
    /* Frozen before the answer is written, which says so. */
    ks->stage = KS_IDLE;
    kernel_freeze(ks, true);
  }
  json_t *content = json_object_get(result, "content");
  json_t *first = json_array_get(content, 0);
  if (json_is_object(first) && json_is_string(json_object_get(first, "text"))) {
    const char *text = json_string_value(json_object_get(first, "text"));
    size_t text_len = json_string_length(json_object_get(first, "text"));
    cm_buf_t t;
    cm_buf_init(&t, 0);
    cm_buf_append(&t, text, text_len);
    if (close_now)
      cm_buf_printf(
          &t, "\n--- session: %s (closed%s) ---", ks->id,
          never_started && !job->spec.close_session ? ": its first call did not start" : "");
    else
      cm_buf_printf(
          &t, "\n--- session: %s (call %llu; kernel %s; pass session: \"%s\" to go on) ---", ks->id,
          (unsigned long long)ks->calls, ks->run ? "running" : "not running", ks->id);
    if (job->session_note) cm_buf_printf(&t, "\n--- session note: %s ---", job->session_note);
    json_object_set_new(first, "text", json_stringn(t.data, t.len));
    cm_buf_release(&t);
  }
  json_t *sc = json_object_get(result, "structuredContent");
  if (sc) {
    json_t *o = session_json(ks);
    if (close_now) json_object_set_new(o, "state", json_string("closed"));
    json_object_set_new(o, "note",
                        job->session_note ? json_string(job->session_note) : json_null());
    json_object_set_new(sc, "session", o);
  }
  if (close_now) {
    session_close(ks, job->spec.close_session ? "closed by close_session" : "never started");
  } else if (ks->stage == KS_CLOSING) {
    /* closed while the call ran: session_settle below */
  } else if (ks->expire_after_call) {
    ks->t_idle = cm_loop_timer(srv_server_loop(ks->exec->server), 0, on_idle, ks);
  } else {
    cm_timer_cancel(ks->t_idle);
    ks->t_idle = cfg_of(ks)->exec_session_idle_ms
                     ? cm_loop_timer(srv_server_loop(ks->exec->server),
                                     cfg_of(ks)->exec_session_idle_ms, on_idle, ks)
                     : NULL;
  }
  session_settle(ks);
}
