/* The one spawn helper every backend uses (see sbx.h for what the child gets). */
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#include "sandbox/sbx.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#define SBX_CLONE_INTO_CGROUP 0x200000000ULL
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

typedef struct spawn_failure {
  int errnum;
  char stage[48];
} spawn_failure_t;

static void child_fail(int errpipe, const char *stage) {
  spawn_failure_t f = {.errnum = errno};
  strncpy(f.stage, stage, sizeof f.stage - 1);
  (void)!write(errpipe, &f, sizeof f);
  _exit(127);
}

/* Sets cur/max; where that would raise the hard limit the server runs under and the
 * process may not (no CAP_SYS_RESOURCE, as under `ulimit -Hn 64`), the server's own hard
 * limit is the tighter one anyway: both are capped at it, and the run starts. */
static int set_limits(int resource, rlim_t cur, rlim_t max) {
  struct rlimit rl = {.rlim_cur = cur, .rlim_max = max};
  if (setrlimit(resource, &rl) == 0) return 0;
  struct rlimit now;
  if (errno != EPERM || getrlimit(resource, &now) < 0 || now.rlim_max == RLIM_INFINITY ||
      max <= now.rlim_max)
    return -1;
  rl.rlim_max = now.rlim_max;
  if (rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
  return setrlimit(resource, &rl);
}

static int set_limit(int resource, uint64_t value) {
  if (value == 0) return 0;
  return set_limits(resource, (rlim_t)value, (rlim_t)value);
}

static int apply_rlimits(const sbx_limits_t *l) {
  if (set_limit(RLIMIT_AS, l->memory_bytes) < 0) return -1;
  if (l->cpu_seconds) {
    /* Soft limit sends SIGXCPU; the hard limit one second later is SIGKILL. */
    if (set_limits(RLIMIT_CPU, (rlim_t)l->cpu_seconds, (rlim_t)l->cpu_seconds + 1) < 0) return -1;
  }
  if (set_limit(RLIMIT_NPROC, l->max_processes) < 0) return -1;
  if (set_limit(RLIMIT_FSIZE, l->file_size_bytes) < 0) return -1;
  if (set_limit(RLIMIT_NOFILE, l->open_files) < 0) return -1;
  struct rlimit core = {0, 0};
  return setrlimit(RLIMIT_CORE, &core);
}

/* Closes every fd above 2 but the ones in keep (any order; duplicates allowed).  In a
 * child before exec: no allocation. */
static void close_all_but(int *keep, size_t n) {
  for (size_t i = 1; i < n; i++) /* insertion sort: a few dozen at most */
    for (size_t j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  unsigned from = 3;
  for (size_t i = 0; i <= n; i++) {
    unsigned to = i < n ? (unsigned)keep[i] : ~0U; /* close [from, to) */
    if (i < n && (unsigned)keep[i] < from) continue;
    if (to > from) {
      unsigned last = i < n ? to - 1 : ~0U;
      if (syscall(SYS_close_range, from, last, 0) < 0)
        for (unsigned fd = from; fd <= last && fd < 65536; fd++) close((int)fd);
    }
    if (i < n) from = to + 1;
  }
}

static void child_main(const sbx_spawn_opts_t *o, bool in_cgroup, char *const *joiner_argv,
                       pid_t parent, int errpipe, int out_w, int err_w, const sigset_t *oldmask) {
  /* Reset every signal disposition, then unblock. */
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  (void)oldmask;

  /* A process group of its own is all the tree kill needs.  A new session would also do,
   * but a session leader's exit costs about 1-2 ms of wall clock per run on our machines,
   * so it is only paid when there is a controlling terminal to leave: the child must never
   * have one (stdin is /dev/null and the output goes to pipes, but a terminal would still
   * be reachable through /dev/tty, for TIOCSTI or job-control signals).  ENXIO is the one
   * answer that proves there is none; anything else takes the safe way. */
  int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (tty >= 0 || errno != ENXIO) {
    if (tty >= 0) close(tty);
    if (setsid() < 0) child_fail(errpipe, "setsid");
  } else if (setpgid(0, 0) < 0) {
    child_fail(errpipe, "setpgid");
  }
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail(errpipe, "prctl(PDEATHSIG)");
  if (getppid() != parent) _exit(127); /* the server died before the prctl */

  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) child_fail(errpipe, "open /dev/null");
  if (dup2(devnull, 0) < 0) child_fail(errpipe, "dup2 stdin");
  if (dup2(out_w >= 0 ? out_w : devnull, 1) < 0) child_fail(errpipe, "dup2 stdout");
  if (dup2(err_w >= 0 ? err_w : devnull, 2) < 0) child_fail(errpipe, "dup2 stderr");

  /* Everything else is closed now, not at exec: the steps below can take milliseconds
   * (joining a cgroup v1 waits for an RCU grace period), and a copy of one of the server's
   * fds must not outlive the server meanwhile (the flock on its run directory would, and
   * the next server could not tell it is gone). */
  int keep[64];
  size_t n_keep = 0;
  keep[n_keep++] = errpipe;
  for (size_t i = 0; i < o->n_pass_fds && n_keep < CM_ARRAY_SIZE(keep); i++)
    if (o->pass_fds[i] > 2) keep[n_keep++] = o->pass_fds[i];
  for (size_t i = 0; !in_cgroup && i < o->n_cgroup_fds && n_keep < CM_ARRAY_SIZE(keep); i++)
    if (o->cgroup_fds[i] > 2) keep[n_keep++] = o->cgroup_fds[i];
  close_all_but(keep, n_keep);
  for (size_t i = 0; i < o->n_pass_fds; i++) {
    int fd = o->pass_fds[i];
    if (fd < 0) continue;
    if (fcntl(fd, F_SETFD, 0) < 0) child_fail(errpipe, "pass fd");
  }
  fcntl(errpipe, F_SETFD, FD_CLOEXEC);

  /* Into the run's cgroup before anything else runs: every descendant inherits it.  A
   * cgroup v1 join waits for an RCU grace period, which here would keep the server
   * suspended: the joiner does it after our exec instead (sbx_spawn_opts_t.cgroup_joiner). */
  for (size_t i = 0; !in_cgroup && i < o->n_cgroup_fds; i++) {
    if (joiner_argv ? fcntl(o->cgroup_fds[i], F_SETFD, 0) < 0
                    : write(o->cgroup_fds[i], "0", 1) != 1)
      child_fail(errpipe, "joining the run's cgroup");
  }
  /* With a joiner, it applies them after its joins: it runs under them otherwise. */
  bool joins = joiner_argv && !in_cgroup;
  if (o->limits && !joins && apply_rlimits(o->limits) < 0) child_fail(errpipe, "setrlimit");
  if (o->cwd && chdir(o->cwd) < 0) child_fail(errpipe, "chdir");
  if (joins) {
    execve(joiner_argv[0], joiner_argv, o->envp);
    child_fail(errpipe, "exec the cgroup joiner");
  }
  execve(o->argv[0], o->argv, o->envp);
  child_fail(errpipe, "exec");
}

/* What a child needs to know (a vfork-style one finds it in our memory; a fork-like one
 * has its copy). */
typedef struct spawn_child_args {
  const sbx_spawn_opts_t *o;
  bool in_cgroup;
  char *const *joiner_argv; /* NULL: the child joins its cgroups itself */
  pid_t parent;
  int failp[2], outp[2], errp[2];
  const sigset_t *oldmask;
} spawn_child_args_t;

static int spawn_child(void *data) {
  const spawn_child_args_t *a = data;
  close(a->failp[0]);
  if (a->outp[0] >= 0) close(a->outp[0]);
  if (a->errp[0] >= 0) close(a->errp[0]);
  child_main(a->o, a->in_cgroup, a->joiner_argv, a->parent, a->failp[1], a->outp[1], a->errp[1],
             a->oldmask);
  return 127; /* not reached */
}

typedef struct spawn_clone_args {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
} spawn_clone_args_t;

#if defined(__x86_64__)
/* clone3() whose child starts fn(arg) on the stack args gives it, then exits with what fn
 * returns: the raw system call cannot come back into C in a child on another stack (glibc
 * has this for itself, but exports no clone3).  Returns the child's pid, or -errno.  The
 * child finds fn and arg in r8 and r9, which the system call leaves as they were. */
long sbx_clone3_call(spawn_clone_args_t *args, size_t size, int (*fn)(void *), void *arg);
__asm__(
    ".text\n"
    ".type sbx_clone3_call, @function\n"
    "sbx_clone3_call:\n"
    "  mov %rdx, %r8\n"
    "  mov %rcx, %r9\n"
    "  mov $435, %eax\n" /* SYS_clone3 */
    "  syscall\n"
    "  test %rax, %rax\n"
    "  jz 1f\n"
    "  ret\n"
    "1:\n"
    "  xor %ebp, %ebp\n"
    "  mov %r9, %rdi\n"
    "  call *%r8\n"
    "  mov %eax, %edi\n"
    "  mov $60, %eax\n" /* SYS_exit */
    "  syscall\n"
    "  hlt\n"
    ".size sbx_clone3_call, .-sbx_clone3_call\n");
#define SBX_HAVE_CLONE3_CALL 1
#endif

/* The stack the child of a vfork-style clone() runs on until it execs: one per thread,
 * made on first use and kept (the parent is suspended until the exec, so one is enough). */
#define SPAWN_STACK_BYTES (256u * 1024u)
static _Thread_local char *spawn_stack;

static char *spawn_stack_top(void) {
  if (!spawn_stack) {
    void *m = mmap(NULL, SPAWN_STACK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return NULL;
    spawn_stack = m;
  }
#ifdef __SANITIZE_ADDRESS__
  /* A child never returns from the frames it made here (it execs or exits), so
   * AddressSanitizer's shadow keeps their redzones poisoned: the next child, whose frames lie
   * elsewhere, would trip over them (a "stack-buffer-overflow" in its own locals). */
  ASAN_UNPOISON_MEMORY_REGION(spawn_stack, SPAWN_STACK_BYTES);
#endif
  return spawn_stack + SPAWN_STACK_BYTES; /* the stack grows down; mmap is page-aligned */
}

static void joiner_limit(cm_strv_builder_t *b, const char *flag, uint64_t value, bool always) {
  if (!value && !always) return;
  cm_strv_add(b, flag);
  cm_strv_addf(b, "%llu", (unsigned long long)value);
}

/* [joiner, --join-cgroup, FD, ..., --, argv...] for a child that joins cgroups v1, or NULL
 * when it joins none or joins them itself.  Made here: the child may not allocate. */
static char **joiner_argv_new(const sbx_spawn_opts_t *o) {
  if (!o->cgroup_joiner || !o->n_cgroup_fds || o->cgroup_dir_fd > 2) return NULL;
  cm_strv_builder_t b = {0};
  cm_strv_add(&b, o->cgroup_joiner);
  for (size_t i = 0; i < o->n_cgroup_fds; i++) {
    cm_strv_add(&b, "--join-cgroup");
    cm_strv_addf(&b, "%d", o->cgroup_fds[i]);
  }
  /* The rlimits too, which the joiner applies after its joins (see child_main); --nofile
   * always (0 = as it is), for the joiner applies the rest (a core size of 0) when given any. */
  const sbx_limits_t *l = o->limits;
  if (l) {
    joiner_limit(&b, "--nofile", l->open_files, true);
    joiner_limit(&b, "--as", l->memory_bytes, false);
    joiner_limit(&b, "--cpu", l->cpu_seconds, false);
    joiner_limit(&b, "--nproc", l->max_processes, false);
    joiner_limit(&b, "--fsize", l->file_size_bytes, false);
  }
  cm_strv_add(&b, "--");
  for (char *const *a = o->argv; *a; a++) cm_strv_add(&b, *a);
  return cm_strv_steal(&b);
}

int sbx_spawn(const sbx_spawn_opts_t *o, sbx_child_t *child, cm_error_t *err) {
  cleanup_strv char **joiner_argv = NULL; /* (before the first goto fail) */
  child->pid = -1;
  child->pidfd = child->stdout_fd = child->stderr_fd = -1;
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, failp[2] = {-1, -1};
  if (o->capture_output) {
    if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
      cm_error_set(err, errno, CM_ERR_IO, "pipe2");
      goto fail;
    }
  }
  if (pipe2(failp, O_CLOEXEC) < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "pipe2");
    goto fail;
  }

  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid_t parent = getpid();
  bool in_cgroup = false;
  pid_t pid = -1;
  joiner_argv = joiner_argv_new(o);
  spawn_child_args_t ca = {.o = o, .joiner_argv = joiner_argv, .parent = parent, .oldmask = &old};
  memcpy(ca.failp, failp, sizeof failp);
  memcpy(ca.outp, outp, sizeof outp);
  memcpy(ca.errp, errp, sizeof errp);
  /* A vfork-style child that shares our memory until it execs: on our machines copying the
   * server's page tables for a fork() and the child's copy-on-write faults cost more than
   * the rest of the spawn.  The child only makes system calls on a stack of its own, with
   * every signal blocked until its handlers are reset, and we are suspended until it execs
   * or exits. */
  char *top = spawn_stack_top();
  if (o->cgroup_dir_fd > 2) {
    /* Born in the run's cgroup: moving a process there afterwards waits for an RCU grace
     * period in the kernel (milliseconds); starting it there does not. */
    spawn_clone_args_t args = {.flags = SBX_CLONE_INTO_CGROUP,
                               .exit_signal = SIGCHLD,
                               .cgroup = (uint64_t)o->cgroup_dir_fd};
#ifdef SBX_HAVE_CLONE3_CALL
    if (top) {
      spawn_clone_args_t vargs = args;
      vargs.flags |= CLONE_VM | CLONE_VFORK;
      vargs.stack = (uint64_t)(uintptr_t)(top - SPAWN_STACK_BYTES);
      vargs.stack_size = SPAWN_STACK_BYTES;
      ca.in_cgroup = true;
      long r = sbx_clone3_call(&vargs, sizeof vargs, spawn_child, &ca);
      if (r > 0) pid = (pid_t)r;
    }
#endif
    if (pid < 0) pid = (pid_t)syscall(SYS_clone3, &args, sizeof args); /* fork-like */
    in_cgroup = pid >= 0;
  } else if (top) {
    pid = clone(spawn_child, top, CLONE_VM | CLONE_VFORK | SIGCHLD, &ca);
  }
  if (pid < 0) pid = fork(); /* no clone3 or no CLONE_INTO_CGROUP: the child joins itself */
  if (pid == 0) {            /* a fork-like child (the vfork-style ones start in spawn_child) */
    ca.in_cgroup = in_cgroup;
    spawn_child(&ca);
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    cm_error_set(err, fork_errno, CM_ERR_IO, "fork");
    goto fail;
  }
  close(failp[1]);
  failp[1] = -1;
  if (outp[1] >= 0) close(outp[1]), outp[1] = -1;
  if (errp[1] >= 0) close(errp[1]), errp[1] = -1;

  {
    /* Until the child is handed over, leaving this block kills and reaps it. */
    cleanup_pid pid_t guard = pid;
    /* Blocks only until the child execs (the pipe is close-on-exec). */
    spawn_failure_t f;
    ssize_t n;
    do n = read(failp[0], &f, sizeof f);
    while (n < 0 && errno == EINTR);
    close(failp[0]);
    failp[0] = -1;
    if (n == (ssize_t)sizeof f) { /* it never exec'd, and has exited */
      f.stage[sizeof f.stage - 1] = '\0';
      cm_error_set(err, f.errnum, f.errnum == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_UNAVAILABLE,
                   "cannot start %s (%s)", o->argv[0], f.stage);
      goto fail;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
      cm_error_set(err, errno, CM_ERR_IO, "pidfd_open");
      goto fail;
    }
    fcntl(pidfd, F_SETFD, FD_CLOEXEC);
    child->pid = steal_pid(&guard);
    child->pidfd = pidfd;
  }
  if (o->capture_output) {
    cm_set_nonblock(outp[0], true);
    cm_set_nonblock(errp[0], true);
    child->stdout_fd = outp[0];
    child->stderr_fd = errp[0];
  }
  return 0;

fail:
  for (int i = 0; i < 2; i++) {
    if (outp[i] >= 0) close(outp[i]);
    if (errp[i] >= 0) close(errp[i]);
    if (failp[i] >= 0) close(failp[i]);
  }
  return -1;
}

int sbx_child_reap(sbx_child_t *child, siginfo_t *info, struct rusage *ru) {
  if (child->pid <= 0) return 1;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  struct rusage r;
  memset(&r, 0, sizeof r);
  long rc = syscall(SYS_waitid, P_PIDFD, child->pidfd, &si, WEXITED | WNOHANG, &r);
  if (rc < 0) {
    if (errno == EINTR) return 0;
    /* ECHILD: already reaped elsewhere; treat as gone. */
    si.si_code = CLD_KILLED;
    si.si_status = SIGKILL;
  } else if (si.si_pid == 0) {
    return 0;
  }
  if (info) *info = si;
  if (ru) *ru = r;
  return 1;
}

void sbx_child_kill_tree(const sbx_child_t *child, int sig) {
  if (child->pid <= 0) return;
  /* The child made its own process group (setpgid or setsid), so its pid names it. */
  kill(-child->pid, sig);
  if (child->pidfd >= 0) syscall(SYS_pidfd_send_signal, child->pidfd, sig, NULL, 0);
}

void sbx_child_close(sbx_child_t *child) {
  if (child->pidfd >= 0) close(child->pidfd);
  if (child->stdout_fd >= 0) close(child->stdout_fd);
  if (child->stderr_fd >= 0) close(child->stderr_fd);
  child->pidfd = child->stdout_fd = child->stderr_fd = -1;
  child->pid = -1;
}

/* ---------------------------------------------------------------- functions in a child */

#define SBX_CALL_REPORT_MAX 4000 /* one write below PIPE_BUF into an empty pipe: never blocks */

struct sbx_call {
  cm_loop_t *loop;
  sbx_child_t child;
  int report_fd; /* read end, non-blocking */
  cm_watch_t *watch;
  cm_timer_t *deadline;
  bool timed_out, done;
  sbx_call_done_cb cb;
  void *data;
};

/* In the child: [status byte]['\0'-free text], then _exit (no atexit handlers, no stdio
 * flush of the server's buffers, no leak report for memory that is the server's). */
static void call_child(sbx_call_fn fn, void *arg, int report_w, const int *keep, size_t n_keep,
                       pid_t parent) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent) _exit(127);
  int fds[64];
  size_t n = 0;
  fds[n++] = report_w;
  for (size_t i = 0; i < n_keep && n < CM_ARRAY_SIZE(fds); i++)
    if (keep[i] > 2) fds[n++] = keep[i];
  close_all_but(fds, n);
  /* stdout may be the protocol (stdio transport): never ours to write. */
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    if (devnull > 2) close(devnull);
  }
  cm_buf_t out;
  cm_buf_init(&out, SBX_CALL_REPORT_MAX - 1);
  cm_error_t err = CM_ERROR_INIT;
  int rc = fn(arg, &out, &err);
  char report[SBX_CALL_REPORT_MAX];
  report[0] = rc < 0 ? 'E' : 'K';
  const char *text = rc < 0 ? cm_error_message(&err) : (out.data ? out.data : "");
  size_t len = CM_MIN(strlen(text), sizeof report - 1);
  memcpy(report + 1, text, len);
  (void)!write(report_w, report, len + 1);
  _exit(rc < 0 ? 1 : 0);
}

static void call_finish(sbx_call_t *c, const siginfo_t *si) {
  char buf[SBX_CALL_REPORT_MAX + 1];
  ssize_t n;
  do n = read(c->report_fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  int rc = -1;
  cleanup_free char *text = NULL;
  if (c->timed_out) {
    text = xstrdup("it took too long and was stopped");
  } else if (n > 0 && (buf[0] == 'K' || buf[0] == 'E') && si->si_code == CLD_EXITED &&
             si->si_status == (buf[0] == 'K' ? 0 : 1)) {
    buf[n] = '\0';
    rc = buf[0] == 'K' ? 0 : -1;
    text = xstrdup(buf + 1);
  } else if (si->si_code == CLD_EXITED) {
    text = xasprintf("the child process exited with status %d without a report", si->si_status);
  } else {
    text = xasprintf("the child process was killed by signal %d", si->si_status);
  }
  c->done = true;
  cm_watch_remove(c->watch);
  c->watch = NULL;
  cm_timer_cancel(c->deadline);
  c->deadline = NULL;
  sbx_call_done_cb cb = c->cb;
  void *data = c->data;
  sbx_call_free(c);
  cb(data, rc, text);
}

static void on_call_exit(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  sbx_call_t *c = data;
  siginfo_t si;
  if (sbx_child_reap(&c->child, &si, NULL) == 0) return;
  c->child.pid = -1; /* reaped */
  call_finish(c, &si);
}

static void on_call_deadline(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_call_t *c = data;
  c->deadline = NULL;
  c->timed_out = true;
  if (c->child.pidfd >= 0) syscall(SYS_pidfd_send_signal, c->child.pidfd, SIGKILL, NULL, 0);
}

int sbx_call_start(cm_loop_t *loop, sbx_call_fn fn, void *arg, const int *keep_fds, size_t n_keep,
                   uint64_t timeout_ms, sbx_call_done_cb done, void *data, sbx_call_t **out,
                   cm_error_t *err) {
  *out = NULL;
  int rp[2];
  if (pipe2(rp, O_CLOEXEC) < 0) return cm_error_set(err, errno, CM_ERR_IO, "pipe2");
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(rp[0]);
    close(rp[1]);
    return cm_error_set(err, e, CM_ERR_IO, "fork");
  }
  if (pid == 0) {
    close(rp[0]);
    call_child(fn, arg, rp[1], keep_fds, n_keep, parent);
  }
  close(rp[1]);
  sbx_call_t *c = xcalloc(1, sizeof *c);
  c->loop = loop;
  c->cb = done;
  c->data = data;
  c->report_fd = rp[0];
  c->child.pid = pid;
  c->child.stdout_fd = c->child.stderr_fd = -1;
  c->child.pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  cm_set_nonblock(c->report_fd, true);
  if (c->child.pidfd < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "pidfd_open");
    sbx_call_free(c);
    return -1;
  }
  fcntl(c->child.pidfd, F_SETFD, FD_CLOEXEC);
  c->watch = cm_loop_watch(loop, c->child.pidfd, EPOLLIN, on_call_exit, c, err);
  if (!c->watch) {
    sbx_call_free(c);
    return -1;
  }
  if (timeout_ms) c->deadline = cm_loop_timer(loop, timeout_ms, on_call_deadline, c);
  *out = c;
  return 0;
}

void sbx_call_free(sbx_call_t *c) {
  if (!c) return;
  if (c->child.pid > 0) {
    /* Still running: stop it now (it is ours and holds no other process). */
    kill(c->child.pid, SIGKILL);
    while (waitpid(c->child.pid, NULL, 0) < 0 && errno == EINTR) {
    }
    c->child.pid = -1;
  }
  cm_watch_remove(c->watch);
  cm_timer_cancel(c->deadline);
  if (c->child.pidfd >= 0) close(c->child.pidfd);
  if (c->report_fd >= 0) close(c->report_fd);
  free(c);
}
