/* The life of one run: spawn through a backend, stream both pipes, enforce the wall
 * clock, kill the whole tree (SIGTERM, grace, SIGKILL), reap through the pidfd, and
 * report exactly once when the tree is gone and the pipes are drained.
 *
 * With a supervisor in the sandbox (bubblewrap), the report comes on its status record: it
 * writes that once everything else in the sandbox has exited and been reaped (so all the
 * output is in the pipes), as its last act before its own exit.  What is left then, the
 * sandbox's teardown (the pid, mount and network namespaces go as the supervisor exits,
 * milliseconds of RCU grace periods in the kernel), happens after the report: the run is
 * reaped, and what it holds (its cgroup, the backend's reservation) released, when the
 * launcher exits, even after sbx_run_free (a detached run). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"

/* After the main process exits, how long stray holders of the pipes may keep them open
 * before we stop reading.  Everything in the process group was killed by then. */
#define SBX_DRAIN_MS 500
#define SBX_READ_CHUNK 65536
/* Per readiness event, so one flooding stream cannot starve the loop. */
#define SBX_READ_BUDGET (4 * SBX_READ_CHUNK)
/* After the record, how long the sandbox's teardown may take before it is killed. */
#define SBX_TEARDOWN_MS 10000

/* A run's stage.  Two things end a run, in either order: the launcher's exit (reaped through
 * its pidfd) and the end of its output (both pipes at EOF); with a supervisor its status
 * record (the report) may come before the launcher's exit, which then follows the sandbox's
 * teardown.  The stage moves on only forward:
 *
 *   SPAWNED -> RUNNING -> KILLING -> EXITED -> REAPED    (reaped first, then drained)
 *                                 \-> DRAINED -> REAPED   (the record first, then reaped)
 *
 * (RUNNING or SPAWNED may skip KILLING.)  docs/architecture.md has the table. */
enum run_stage {
  RUN_SPAWNED, /* held (spec.hold): set up, the command waits for sbx_run_release */
  RUN_RUNNING, /* the command runs, under its deadline */
  RUN_KILLING, /* the tree is being killed: SIGTERM (or the control fd closed), SIGKILL after
                * the grace */
  RUN_EXITED,  /* the launcher is reaped: the pipes' drain is left (SBX_DRAIN_MS at most) */
  RUN_DRAINED, /* reported on the supervisor's record (the pipes read to their end): the
                * sandbox's teardown is left, the launcher not reaped yet */
  RUN_REAPED,  /* reported (unless freed first) and reaped: nothing is left but the memory */
};

/* What the stage does not say (struct sbx_run's flags). */
enum {
  RUN_HELD = 1u << 0,            /* not released: output is the set-up's (logged), also
                                  * when the held sandbox dies */
  RUN_HOLD_IN_COMMAND = 1u << 1, /* spec.hold_in_command: the release sends nothing */
  RUN_FREED = 1u << 2,           /* sbx_run_free was called: no callback any more; a launcher
                                  * still running is in `detached` until it is reaped */
};

struct sbx_run {
  cm_loop_t *loop;
  sbx_backend_t *backend;
  sbx_launch_t launch;
  sbx_cgroup_run_t *cgroup; /* NULL when runs get none */
  sbx_child_t child;
  sbx_limits_t limits;
  cm_watch_t *w_pid, *w_out, *w_err, *w_status;
  cm_timer_t *t_deadline, *t_grace, *t_drain, *t_teardown;
  sbx_run_callbacks_t cbs;
  void *data;
  uint64_t start_us;
  enum run_stage stage;
  unsigned flags;           /* RUN_HELD, RUN_HOLD_IN_COMMAND, RUN_FREED */
  sbx_run_t *detached_next; /* freed before its launcher exited: in `detached` */
  sbx_result_t result;
  /* How sbx_run_freeze froze it last (nothing while it runs). */
  enum { RUN_THAWED, RUN_FROZEN_CGROUP, RUN_STOPPED } frozen;
};

/* Runs freed before their launcher was reaped (RUN_FREED: still running, or DRAINED and in
 * their teardown), reaped by on_pidfd, or at sbx_run_reap_detached. */
static sbx_run_t *detached;

static void run_maybe_finish(sbx_run_t *run);

/* The launcher has exited and was waited for. */
static bool launcher_reaped(const sbx_run_t *run) {
  return run->stage == RUN_EXITED || run->stage == RUN_REAPED;
}

static void close_stream(sbx_run_t *run, sbx_stream_t s) {
  cm_watch_t **w = s == SBX_STDOUT ? &run->w_out : &run->w_err;
  int *fd = s == SBX_STDOUT ? &run->child.stdout_fd : &run->child.stderr_fd;
  cm_watch_remove(*w);
  *w = NULL;
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void deliver(sbx_run_t *run, sbx_stream_t s, const char *buf, size_t n) {
  /* Nothing runs in a held sandbox but the set-up, whose complaints (a failed mount) end it
   * anyway: they are logged, not given to a caller that has none. */
  if (run->flags & RUN_HELD) {
    cleanup_free char *excerpt = cm_log_excerpt(buf, n, 200);
    cm_debug("held sandbox: %s", excerpt);
  } else if (run->cbs.on_output && !run->result.cancelled) {
    run->cbs.on_output(run->data, s, buf, n);
  }
}

static void on_readable(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  sbx_run_t *run = data;
  sbx_stream_t s = fd == run->child.stdout_fd ? SBX_STDOUT : SBX_STDERR;
  char buf[SBX_READ_CHUNK];
  size_t budget = SBX_READ_BUDGET;
  while (budget > 0) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      deliver(run, s, buf, (size_t)n);
      budget -= CM_MIN(budget, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_stream(run, s); /* EOF or error */
    run_maybe_finish(run);
    return;
  }
}

static void kill_tree(sbx_run_t *run, int sig) {
  if (run->backend && run->backend->ops->kill && run->launch.kill_name)
    run->backend->ops->kill(run->backend, &run->launch, sig);
  /* Also what left the process group (setsid): the cgroup holds the whole tree. */
  if (sig == SIGKILL) sbx_cgroup_run_kill(run->cgroup);
  if (!launcher_reaped(run)) {
    sbx_child_kill_tree(&run->child, sig);
  } else if (run->child.pid > 0) {
    kill(-run->child.pid, sig);
  }
}

static void on_grace(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_run_t *run = data;
  run->t_grace = NULL;
  kill_tree(run, SIGKILL);
}

static void begin_kill(sbx_run_t *run) {
  if (run->stage != RUN_SPAWNED && run->stage != RUN_RUNNING) return;
  run->stage = RUN_KILLING;
  if (run->launch.control_fd >= 0) {
    /* A supervisor inside the sandbox SIGTERMs the script's processes when the control fd
     * closes.  A SIGTERM to the launcher instead would tear the sandbox down at once
     * (bwrap dies, and the pid namespace with it): no grace at all. */
    close(run->launch.control_fd);
    run->launch.control_fd = -1;
  } else {
    kill_tree(run, SIGTERM);
  }
  uint64_t grace = run->limits.grace_ms ? run->limits.grace_ms : 1;
  run->t_grace = cm_loop_timer(run->loop, grace, on_grace, run);
}

static void on_deadline(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_run_t *run = data;
  run->t_deadline = NULL;
  if (launcher_reaped(run)) return;
  run->result.timed_out = true;
  begin_kill(run);
}

static void on_drain_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_run_t *run = data;
  run->t_drain = NULL;
  /* Something outside the process group (a daemon that called setsid) still holds a pipe:
   * stop listening.  Backends with a pid namespace never get here. */
  kill_tree(run, SIGKILL);
  if (run->w_out) close_stream(run, SBX_STDOUT);
  if (run->w_err) close_stream(run, SBX_STDERR);
  run_maybe_finish(run);
}

static uint64_t tv_ms(struct timeval tv) {
  return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* Decodes a wait status the way siginfo reports it. */
static void set_status(sbx_result_t *r, bool exited, int value) {
  r->exit_code = exited ? value : -value;
  r->term_signal = exited ? 0 : value;
}

/* (Before the stage moves on from KILLING: a kill of ours is no limit's.) */
static void judge_limits(sbx_run_t *run, uint64_t main_cpu_ms) {
  sbx_result_t *r = &run->result;
  if (r->term_signal == SIGXCPU ||
      (r->term_signal == SIGKILL && run->stage != RUN_KILLING && run->limits.cpu_seconds &&
       main_cpu_ms >= run->limits.cpu_seconds * 1000))
    r->cpu_limit = true;
  if (r->term_signal == SIGXFSZ) r->file_size_limit = true;
}

/* The supervisor's record: the command's real status and the tree's usage. */
static void record_status(sbx_run_t *run, const sbx_status_record_t *rec) {
  sbx_result_t *r = &run->result;
  r->duration_ms = (cm_now_us() - run->start_us + 500) / 1000;
  int ws = rec->wait_status;
  set_status(r, WIFEXITED(ws),
             WIFEXITED(ws)     ? WEXITSTATUS(ws)
             : WIFSIGNALED(ws) ? WTERMSIG(ws)
                               : 0);
  r->cpu_user_ms = rec->tree_user_us / 1000;
  r->cpu_system_ms = rec->tree_system_us / 1000;
  r->max_rss_kib = rec->tree_max_rss_kib;
  if (rec->flags & SBX_STATUS_OOM_KILL) r->memory_limit = true;
  judge_limits(run, (rec->main_user_us + rec->main_system_us) / 1000);
}

static void record_exit(sbx_run_t *run, const siginfo_t *si, const struct rusage *ru) {
  sbx_result_t *r = &run->result;
  r->duration_ms = (cm_now_us() - run->start_us + 500) / 1000;
  uint64_t main_cpu_ms;
  sbx_status_record_t rec;
  bool launcher_ok = si->si_code == CLD_EXITED && si->si_status == 0;
  if (run->launch.status_fd < 0) {
    /* The command is our own child: its status and usage are the real ones. */
    set_status(r, si->si_code == CLD_EXITED, si->si_status);
    r->cpu_user_ms = tv_ms(ru->ru_utime);
    r->cpu_system_ms = tv_ms(ru->ru_stime);
    r->max_rss_kib = (uint64_t)ru->ru_maxrss;
    main_cpu_ms = r->cpu_user_ms + r->cpu_system_ms;
  } else if (launcher_ok && sbx_status_read(run->launch.status_fd, &rec) == 1) {
    /* The supervisor's report, trusted only when the supervisor itself exited 0 (bwrap
     * passes its exit code on): a supervisor that was killed wrote nothing, and anything
     * more than its one record means someone else wrote too. */
    record_status(run, &rec);
    return;
  } else {
    set_status(r, si->si_code == CLD_EXITED, si->si_status);
    r->status_unknown = true;
    r->cpu_user_ms = r->cpu_system_ms = r->max_rss_kib = 0; /* the launcher's would mislead */
    main_cpu_ms = 0;
  }
  judge_limits(run, main_cpu_ms);
}

static void detached_release(sbx_run_t *run);

static void on_pidfd(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  sbx_run_t *run = data;
  siginfo_t si;
  struct rusage ru;
  if (sbx_child_reap(&run->child, &si, &ru) == 0) return;
  /* (Drained: answered on the record already.  Freed: nobody to tell.) */
  bool told = run->stage == RUN_DRAINED || (run->flags & RUN_FREED);
  if (!told) record_exit(run, &si, &ru);
  run->stage = told ? RUN_REAPED : RUN_EXITED;
  cm_watch_remove(run->w_pid);
  run->w_pid = NULL;
  /* The main process is gone: whatever it left behind in its group goes too. */
  kill(-run->child.pid, SIGKILL);
  sbx_cgroup_run_kill(run->cgroup);
  if (run->backend && run->backend->ops->kill && run->launch.kill_name)
    run->backend->ops->kill(run->backend, &run->launch, SIGKILL);
  if (told) {
    cm_timer_cancel(run->t_teardown);
    run->t_teardown = NULL;
    if (run->flags & RUN_FREED) detached_release(run);
    return;
  }
  cm_timer_cancel(run->t_deadline);
  run->t_deadline = NULL;
  if (run->w_out || run->w_err)
    run->t_drain = cm_loop_timer(loop, SBX_DRAIN_MS, on_drain_timeout, run);
  run_maybe_finish(run);
}

/* The report: from EXITED once drained (-> REAPED), or on the record (-> DRAINED). */
static void run_finish(sbx_run_t *run) {
  run->stage = launcher_reaped(run) ? RUN_REAPED : RUN_DRAINED;
  cm_timer_cancel(run->t_deadline);
  cm_timer_cancel(run->t_grace);
  cm_timer_cancel(run->t_drain);
  run->t_deadline = run->t_grace = run->t_drain = NULL;
  sbx_cgroup_run_collect(run->cgroup, &run->result);
  if (run->cbs.on_exit) run->cbs.on_exit(run->data, &run->result);
}

static void run_maybe_finish(sbx_run_t *run) {
  if (run->stage != RUN_EXITED || run->w_out || run->w_err) return;
  run_finish(run);
}

static void drain_stream(sbx_run_t *run, sbx_stream_t s) {
  int fd = s == SBX_STDOUT ? run->child.stdout_fd : run->child.stderr_fd;
  char buf[SBX_READ_CHUNK];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      deliver(run, s, buf, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break; /* EAGAIN: what was written is read (nothing that writes is left), or EOF */
  }
  close_stream(run, s);
}

static void on_teardown_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_run_t *run = data;
  cm_warn("a sandbox's teardown took over %d ms: killed (again)", SBX_TEARDOWN_MS);
  kill_tree(run, SIGKILL);
  run->t_teardown = cm_loop_timer(loop, SBX_TEARDOWN_MS, on_teardown_timeout, run);
}

/* The supervisor's record arrived (once; see the top of this file).  A record that does not
 * parse is left to the launcher's exit, which then finds none: the status is unknown. */
static void on_status(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  sbx_run_t *run = data;
  cm_watch_remove(run->w_status);
  run->w_status = NULL;
  sbx_status_record_t rec;
  if (run->stage >= RUN_EXITED || sbx_status_read(fd, &rec) != 1) return;
  /* Read: the channel has nothing more to say, and a run in its teardown holds its pidfd
   * only (descriptors are a budget: --max-open-files of the server's own). */
  sbx_launch_close_channel(&run->launch);
  record_status(run, &rec);
  if (run->w_out) drain_stream(run, SBX_STDOUT);
  if (run->w_err) drain_stream(run, SBX_STDERR);
  run->t_teardown = cm_loop_timer(loop, SBX_TEARDOWN_MS, on_teardown_timeout, run);
  run_finish(run);
}

/* The drop helper, which joins a run's cgroups v1 after the spawn's exec (see
 * sbx_spawn_opts_t.cgroup_joiner): looked up once; NULL (the child joins them itself,
 * suspending the server meanwhile) where it cannot be found. */
static const char *cgroup_joiner(void) {
  static char *path;
  static bool looked;
  if (!looked) {
    looked = true;
    cleanup_error cm_error_t err = CM_ERROR_INIT;
    path = sbx_helper_path(SBX_HELPER_DROP, &err);
    if (!path)
      cm_warn(
          "cgroup v1: runs join their cgroups in the server's spawn, which waits for each "
          "join: %s",
          cm_error_message(&err));
  }
  return path;
}

int sbx_run_start(cm_loop_t *loop, sbx_backend_t *backend, const sbx_spec_t *spec,
                  const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out, cm_error_t *err) {
  if (!backend->available)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "sandbox backend %s is not available: %s",
                        sbx_backend_name(backend),
                        backend->unavailable ? backend->unavailable : "not probed");
  sbx_run_t *run = xcalloc(1, sizeof *run);
  run->loop = loop;
  run->backend = backend;
  run->limits = spec->limits;
  run->cbs = *cbs;
  run->data = data;
  run->child.pid = -1;
  run->child.pidfd = run->child.stdout_fd = run->child.stderr_fd = -1;
  run->launch = (sbx_launch_t)SBX_LAUNCH_INIT;

  if (backend->ops->build(backend, spec, &run->launch, err) < 0 ||
      (sbx_cgroups_active(backend->cgroups) && sbx_backend_host_processes(backend) &&
       sbx_cgroup_run_new(backend->cgroups, &spec->limits, &run->cgroup, err) < 0)) {
    /* A server that limits runs with cgroups does not run one without. */
    sbx_launch_close_channel(&run->launch);
    sbx_launch_release(&run->launch);
    free(run);
    return -1;
  }
  const int *cgroup_fds = NULL;
  int cgroup_dir_fd = -1;
  size_t n_cgroup_fds =
      run->cgroup ? sbx_cgroup_run_join_fds(run->cgroup, &cgroup_fds, &cgroup_dir_fd) : 0;
  size_t n_pass = 0;
  while (n_pass < CM_ARRAY_SIZE(run->launch.pass_fds) && run->launch.pass_fds[n_pass] >= 0)
    n_pass++;
  sbx_spawn_opts_t opts = {
      .argv = run->launch.argv,
      .envp = run->launch.envp,
      .cwd = spec->workdir,
      .capture_output = true,
      .limits = run->launch.set_rlimits ? &run->limits : NULL,
      .pass_fds = run->launch.pass_fds,
      .n_pass_fds = n_pass,
      .cgroup_fds = cgroup_fds,
      .n_cgroup_fds = n_cgroup_fds,
      .cgroup_joiner = n_cgroup_fds && cgroup_dir_fd < 0 ? cgroup_joiner() : NULL,
      .cgroup_dir_fd = cgroup_dir_fd,
  };
  run->start_us = cm_now_us();
  if (sbx_spawn(&opts, &run->child, err) < 0) {
    sbx_launch_close_channel(&run->launch);
    sbx_launch_release(&run->launch);
    sbx_cgroup_run_free(run->cgroup);
    free(run);
    return -1;
  }
  /* The fds passed to the child are not needed here any more. */
  for (size_t i = 0; i < n_pass; i++) {
    close(run->launch.pass_fds[i]);
    run->launch.pass_fds[i] = -1;
  }
  sbx_cgroup_run_spawned(run->cgroup);
  run->w_pid = cm_loop_watch(loop, run->child.pidfd, EPOLLIN, on_pidfd, run, err);
  run->w_out =
      run->w_pid ? cm_loop_watch(loop, run->child.stdout_fd, EPOLLIN, on_readable, run, err) : NULL;
  run->w_err =
      run->w_out ? cm_loop_watch(loop, run->child.stderr_fd, EPOLLIN, on_readable, run, err) : NULL;
  /* The supervisor's record, as soon as it is written (a backend whose processes are the
   * host's: bubblewrap's supervisor is pid 1 of the sandbox, and only it has the pipe). */
  bool watch_status =
      run->w_err && run->launch.status_fd >= 0 && sbx_backend_host_processes(backend);
  if (watch_status) {
    cm_set_nonblock(run->launch.status_fd, true);
    run->w_status = cm_loop_watch(loop, run->launch.status_fd, EPOLLIN, on_status, run, err);
  }
  run->stage = spec->hold ? RUN_SPAWNED : RUN_RUNNING;
  if (spec->hold) run->flags |= RUN_HELD;
  if (spec->hold && spec->hold_in_command) run->flags |= RUN_HOLD_IN_COMMAND;
  if (!run->w_err || (watch_status && !run->w_status)) {
    sbx_run_free(run);
    return -1;
  }
  if (spec->limits.timeout_ms && !spec->hold)
    run->t_deadline = cm_loop_timer(loop, spec->limits.timeout_ms, on_deadline, run);
  *out = run;
  return 0;
}

int sbx_run_release(sbx_run_t *run, const sbx_run_callbacks_t *cbs, void *data, uint64_t timeout_ms,
                    cm_error_t *err) {
  if (run->stage != RUN_SPAWNED ||
      (run->launch.control_fd < 0 && !(run->flags & RUN_HOLD_IN_COMMAND)))
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the prestarted sandbox is gone");
  if (!(run->flags & RUN_HOLD_IN_COMMAND)) {
    /* One byte into an empty pipe: never blocks. */
    ssize_t n;
    do n = write(run->launch.control_fd, "G", 1);
    while (n < 0 && errno == EINTR);
    if (n != 1)
      return cm_error_set(err, n < 0 ? errno : EIO, CM_ERR_UNAVAILABLE,
                          "releasing the prestarted sandbox");
  }
  run->stage = RUN_RUNNING;
  run->flags &= ~RUN_HELD;
  if (run->backend->ops->reserve)
    run->backend->ops->reserve(
        run->backend, &run->launch,
        timeout_ms ? cm_now_ms() + timeout_ms + run->limits.grace_ms : UINT64_MAX);
  run->cbs = *cbs;
  run->data = data;
  run->limits.timeout_ms = timeout_ms;
  run->start_us = cm_now_us();
  if (timeout_ms) run->t_deadline = cm_loop_timer(run->loop, timeout_ms, on_deadline, run);
  return 0;
}

int sbx_run_freeze(sbx_run_t *run, bool frozen, const char **how, cm_error_t *err) {
  if (how) *how = NULL;
  if (!run) return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "no run");
  if (!frozen && run->frozen == RUN_THAWED) return 0;
  /* (A thaw is always let through: a kill needs it.) */
  if (frozen && run->stage != RUN_SPAWNED && run->stage != RUN_RUNNING)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the run is over or being killed");
  if (frozen && !run->cgroup && !sbx_backend_host_processes(run->backend))
    return cm_error_set(err, 0, CM_ERR_UNSUPPORTED,
                        "the engine owns the run's processes: they are not frozen");
  if (run->frozen == RUN_STOPPED || (frozen && !run->cgroup)) {
    if (run->child.pid <= 0 || kill(-run->child.pid, frozen ? SIGSTOP : SIGCONT) < 0)
      return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "signalling the run's process group");
    run->frozen = frozen ? RUN_STOPPED : RUN_THAWED;
    if (how) *how = "signal";
    return 0;
  }
  if (!frozen) {
    if (sbx_cgroup_run_freeze(run->cgroup, false, err) < 0) return -1;
    run->frozen = RUN_THAWED;
    if (how) *how = "cgroup";
    return 0;
  }
  cm_error_t e = CM_ERROR_INIT;
  if (sbx_cgroup_run_freeze(run->cgroup, true, &e) == 0) {
    run->frozen = RUN_FROZEN_CGROUP;
    if (how) *how = "cgroup";
    return 0;
  }
  /* No freezer of ours (cgroup v1 without a writable freezer): the process group. */
  cm_debug("freezing a run: %s; stopping its process group instead", cm_error_message(&e));
  cm_error_release(&e);
  if (run->child.pid <= 0 || kill(-run->child.pid, SIGSTOP) < 0)
    return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "signalling the run's process group");
  run->frozen = RUN_STOPPED;
  if (how) *how = "signal";
  return 0;
}

/* A frozen run takes no SIGTERM and gives no grace: thawed before it is killed. */
static void thaw_for_kill(sbx_run_t *run) {
  if (run->frozen == RUN_THAWED) return;
  if (sbx_run_freeze(run, false, NULL, NULL) < 0 && run->child.pid > 0)
    kill(-run->child.pid, SIGCONT);
  run->frozen = RUN_THAWED;
}

void sbx_run_cancel(sbx_run_t *run) {
  if (!run) return;
  thaw_for_kill(run);
  switch (run->stage) {
    case RUN_SPAWNED:
    case RUN_RUNNING:
    case RUN_KILLING: /* (already: the kill goes on) */
      run->result.cancelled = true;
      begin_kill(run);
      return;
    case RUN_EXITED:
      /* Only the drain is left: stop it now. */
      run->result.cancelled = true;
      if (run->w_out) close_stream(run, SBX_STDOUT);
      if (run->w_err) close_stream(run, SBX_STDERR);
      run_maybe_finish(run);
      return;
    case RUN_DRAINED:
    case RUN_REAPED: /* reported already */
      return;
  }
}

void sbx_run_read_pending(sbx_run_t *run) {
  /* Once reaped, an EOF may finish (and free) the run: the loop takes it from there. */
  if (!run || run->stage >= RUN_EXITED) return;
  if (run->w_out) on_readable(run->loop, run->child.stdout_fd, EPOLLIN, run);
  if (!launcher_reaped(run) && run->w_err)
    on_readable(run->loop, run->child.stderr_fd, EPOLLIN, run);
}

void sbx_run_events(const sbx_run_t *run, sbx_run_events_t *ev) {
  sbx_cgroup_run_events(run ? run->cgroup : NULL, ev);
}

pid_t sbx_run_pid(const sbx_run_t *run) {
  return run->child.pid;
}

static void run_destroy(void *p) {
  sbx_run_t *run = p;
  sbx_launch_close_channel(&run->launch);
  sbx_launch_release(&run->launch);
  free(run);
}

/* A freed run's last steps, once its launcher has exited (or was killed and waited for). */
static void run_release(sbx_run_t *run) {
  cm_timer_cancel(run->t_deadline);
  cm_timer_cancel(run->t_grace);
  cm_timer_cancel(run->t_drain);
  cm_timer_cancel(run->t_teardown);
  run->t_deadline = run->t_grace = run->t_drain = run->t_teardown = NULL;
  cm_watch_remove(run->w_pid);
  cm_watch_remove(run->w_out);
  cm_watch_remove(run->w_err);
  cm_watch_remove(run->w_status);
  run->w_pid = run->w_out = run->w_err = run->w_status = NULL;
  sbx_child_close(&run->child);
  /* Everything of it is gone: what the backend reserved may be reused (after its margin). */
  if (run->backend && run->backend->ops->reserve)
    run->backend->ops->reserve(run->backend, &run->launch, cm_now_ms());
  /* Now, not deferred: the cgroups may be freed before the loop runs again. */
  sbx_cgroup_run_free(run->cgroup);
  run->cgroup = NULL;
  cm_loop_defer(run->loop, run_destroy, run);
}

static void detached_release(sbx_run_t *run) {
  for (sbx_run_t **p = &detached; *p; p = &(*p)->detached_next)
    if (*p == run) {
      *p = run->detached_next;
      break;
    }
  run_release(run);
}

/* Kills and reaps the detached runs of backend b (NULL: all). */
static void reap_detached(sbx_backend_t *b) {
  sbx_run_t **p = &detached;
  while (*p) {
    sbx_run_t *run = *p;
    if (b && run->backend != b) {
      p = &run->detached_next;
      continue;
    }
    kill_tree(run, SIGKILL);
    siginfo_t si;
    struct rusage ru;
    while (sbx_child_reap(&run->child, &si, &ru) == 0) {
      struct pollfd pfd = {run->child.pidfd, POLLIN, 0};
      poll(&pfd, 1, 100);
    }
    run->stage = RUN_REAPED;
    kill(-run->child.pid, SIGKILL);
    detached_release(run); /* (takes it out of the list: *p is the next one now) */
  }
}

static void end_detached_of(sbx_backend_t *b) {
  reap_detached(b);
}

void sbx_run_reap_detached(void) {
  reap_detached(NULL);
}

size_t sbx_run_detached_count(void) {
  size_t n = 0;
  for (const sbx_run_t *run = detached; run; run = run->detached_next) n++;
  return n;
}

void sbx_run_free(sbx_run_t *run) {
  if (!run || (run->flags & RUN_FREED)) return;
  run->flags |= RUN_FREED;
  thaw_for_kill(run);
  if (!launcher_reaped(run) && run->child.pid > 0 && run->w_pid) {
    /* Answered on its record while its sandbox is being torn down, or still running (a held
     * one no call took, a cancelled call): killed now, and reaped and released by on_pidfd
     * when the launcher exits, never waited for here (a sandbox's teardown takes
     * milliseconds of RCU grace periods).  Nothing of it reaches its callbacks any more. */
    if (run->stage != RUN_DRAINED) kill_tree(run, SIGKILL);
    if (run->w_out) close_stream(run, SBX_STDOUT);
    if (run->w_err) close_stream(run, SBX_STDERR);
    cm_watch_remove(run->w_status);
    run->w_status = NULL;
    sbx_launch_close_channel(&run->launch);
    cm_timer_cancel(run->t_deadline);
    cm_timer_cancel(run->t_grace);
    cm_timer_cancel(run->t_drain);
    run->t_deadline = run->t_grace = run->t_drain = NULL;
    if (!run->t_teardown)
      run->t_teardown = cm_loop_timer(run->loop, SBX_TEARDOWN_MS, on_teardown_timeout, run);
    run->detached_next = detached;
    detached = run;
    if (run->backend) run->backend->end_detached = end_detached_of;
    return;
  }
  if (!launcher_reaped(run) && run->child.pid > 0) {
    /* (No pidfd watch: a run whose start failed half-way.) */
    kill_tree(run, SIGKILL);
    siginfo_t si;
  syscall_waitid_blocking:;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)run->child.pid, &si, WEXITED) < 0 && errno == EINTR)
      goto syscall_waitid_blocking;
    kill(-run->child.pid, SIGKILL);
    run->stage = RUN_REAPED;
  }
  run_release(run);
}
