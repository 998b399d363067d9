/* Probing a backend without blocking: the checks a backend makes (bwrap --version, one
 * trivial sandbox, `docker version`, ...) run as child processes watched by the event loop
 * like every other child, one command at a time, each continuing the backend's probe from
 * a callback.  The outcome lands in b->available / b->unavailable and is announced by a
 * callback that never runs inside sbx_backend_probe_start, so callers need no special
 * case for a probe that fails at once. */
#include <errno.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"

typedef struct probe_command {
  sbx_probe_t *probe;
  sbx_child_t child;
  cm_watch_t *w_out, *w_err, *w_pid;
  cm_timer_t *t_timeout;
  cm_buf_t out, errout;
  int timeout_ms;
  char *what; /* "argv[0] argv[1]", for the timeout message */
  bool reaped, timed_out;
  int status;
  sbx_probe_step_cb next;
} probe_command_t;

struct sbx_probe {
  cm_loop_t *loop;
  sbx_backend_t *backend;
  sbx_probe_done_cb done;
  void *data;
  probe_command_t *cmd; /* in flight, or NULL */
  void *state;          /* the backend's, between its steps */
  void (*state_free)(void *state);
  bool finished;  /* the outcome is recorded; the callback is deferred */
  bool cancelled; /* the owner is gone: no callback */
};

static void command_free(probe_command_t *c) {
  cm_watch_remove(c->w_out);
  cm_watch_remove(c->w_err);
  cm_watch_remove(c->w_pid);
  cm_timer_cancel(c->t_timeout);
  if (!c->reaped && c->child.pid > 0) {
    /* Cancelled mid-command: the child is ours to end, and SIGKILL ends it at once. */
    sbx_child_kill_tree(&c->child, SIGKILL);
    while (waitpid(c->child.pid, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  c->child.pid = -1;
  sbx_child_close(&c->child);
  cm_buf_release(&c->out);
  cm_buf_release(&c->errout);
  free(c->what);
  free(c);
}

static void command_maybe_done(probe_command_t *c) {
  if (!c->reaped || c->child.stdout_fd >= 0 || c->child.stderr_fd >= 0) return;
  sbx_probe_t *p = c->probe;
  p->cmd = NULL;
  cm_error_t err = CM_ERROR_INIT;
  int rc = 0;
  if (c->timed_out)
    rc = cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "`%s` did not finish within %d ms", c->what,
                      c->timeout_ms);
  sbx_probe_result_t r = {
      .rc = rc, .status = c->status, .out = &c->out, .errout = &c->errout, .err = &err};
  c->next(p, &r);
  cm_error_release(&err);
  command_free(c);
}

static void close_pipe(probe_command_t *c, int *fd, cm_watch_t **w) {
  cm_watch_remove(*w);
  *w = NULL;
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void on_pipe(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  probe_command_t *c = data;
  bool is_out = fd == c->child.stdout_fd;
  cm_buf_t *dst = is_out ? &c->out : &c->errout;
  char buf[4096];
  for (int rounds = 0; rounds < 16; rounds++) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      /* Beyond the buffer's limit the rest is read and dropped, so the child never blocks. */
      (void)cm_buf_append(dst, buf, CM_MIN((size_t)n, dst->max - CM_MIN(dst->max, dst->len)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (is_out)
      close_pipe(c, &c->child.stdout_fd, &c->w_out);
    else
      close_pipe(c, &c->child.stderr_fd, &c->w_err);
    command_maybe_done(c);
    return;
  }
}

static void on_exit_fd(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  probe_command_t *c = data;
  siginfo_t si;
  int r = sbx_child_reap(&c->child, &si, NULL);
  if (r == 0) return;
  c->reaped = true;
  cm_watch_remove(c->w_pid);
  c->w_pid = NULL;
  if (si.si_code == CLD_EXITED)
    c->status = W_EXITCODE(si.si_status, 0);
  else
    c->status = si.si_status & 0x7f; /* WIFSIGNALED, WTERMSIG = the signal */
  command_maybe_done(c);
}

static void on_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  probe_command_t *c = data;
  c->t_timeout = NULL;
  c->timed_out = true;
  if (!c->reaped) sbx_child_kill_tree(&c->child, SIGKILL);
  /* Whatever still holds the pipes (a daemon of the command's) is not waited for. */
  close_pipe(c, &c->child.stdout_fd, &c->w_out);
  close_pipe(c, &c->child.stderr_fd, &c->w_err);
  command_maybe_done(c);
}

int sbx_probe_command(sbx_probe_t *p, char *const *argv, char *const *envp, int *pass_fds,
                      size_t n_pass, int timeout_ms, size_t output_max, sbx_probe_step_cb next,
                      cm_error_t *err) {
  char *const no_env[] = {NULL};
  sbx_spawn_opts_t opts = {
      .argv = argv,
      .envp = envp ? envp : no_env,
      .capture_output = true,
      .pass_fds = pass_fds,
      .n_pass_fds = n_pass,
  };
  probe_command_t *c = xcalloc(1, sizeof *c);
  c->probe = p;
  c->next = next;
  c->timeout_ms = timeout_ms;
  c->what = xasprintf("%s%s%s", argv[0], argv[1] ? " " : "", argv[1] ? argv[1] : "");
  cm_buf_init(&c->out, output_max);
  cm_buf_init(&c->errout, output_max);
  int rc = sbx_spawn(&opts, &c->child, err);
  for (size_t i = 0; i < n_pass; i++) {
    if (pass_fds[i] >= 0) close(pass_fds[i]);
    pass_fds[i] = -1;
  }
  if (rc < 0) {
    c->reaped = true;
    command_free(c);
    return -1;
  }
  if (!(c->w_out = cm_loop_watch(p->loop, c->child.stdout_fd, EPOLLIN, on_pipe, c, err)) ||
      !(c->w_err = cm_loop_watch(p->loop, c->child.stderr_fd, EPOLLIN, on_pipe, c, err)) ||
      !(c->w_pid = cm_loop_watch(p->loop, c->child.pidfd, EPOLLIN, on_exit_fd, c, err))) {
    command_free(c); /* kills and reaps it */
    return -1;
  }
  c->t_timeout = cm_loop_timer(p->loop, (uint64_t)timeout_ms, on_timeout, c);
  p->cmd = c;
  return 0;
}

void *sbx_probe_state(sbx_probe_t *p) {
  return p->state;
}

void sbx_probe_set_state(sbx_probe_t *p, void *state, void (*state_free)(void *state)) {
  if (p->state && p->state_free) p->state_free(p->state);
  p->state = state;
  p->state_free = state_free;
}

cm_loop_t *sbx_probe_loop(sbx_probe_t *p) {
  return p->loop;
}

static void probe_deliver(void *data) {
  sbx_probe_t *p = data;
  if (!p->cancelled && p->done) p->done(p->data, p->backend);
  free(p);
}

void sbx_probe_finish(sbx_probe_t *p, cm_error_t *err) {
  sbx_backend_t *b = p->backend;
  free(b->unavailable);
  b->unavailable = NULL;
  if (err && err->msg) {
    b->available = false;
    b->unavailable = xstrdup(cm_error_message(err));
    cm_error_release(err);
  } else {
    b->available = true;
  }
  b->probing = false;
  sbx_probe_set_state(p, NULL, NULL);
  p->finished = true;
  /* Never from inside sbx_backend_probe_start or a step's caller: from the loop. */
  cm_loop_defer(p->loop, probe_deliver, p);
}

sbx_probe_t *sbx_backend_probe_start(sbx_backend_t *b, cm_loop_t *loop, sbx_probe_done_cb done,
                                     void *data) {
  sbx_probe_t *p = xcalloc(1, sizeof *p);
  p->loop = loop;
  p->backend = b;
  p->done = done;
  p->data = data;
  b->probing = true;
  b->ops->probe(b, p);
  return p;
}

void sbx_probe_cancel(sbx_probe_t *p) {
  if (!p) return;
  if (p->finished) {
    p->cancelled = true; /* probe_deliver frees it */
    return;
  }
  if (p->cmd) command_free(p->cmd);
  p->cmd = NULL;
  sbx_probe_set_state(p, NULL, NULL);
  p->backend->probing = false;
  free(p);
}

bool sbx_backend_probing(const sbx_backend_t *b) {
  return b->probing;
}

static void sync_done(void *data, sbx_backend_t *b) {
  *(bool *)data = true;
}

void sbx_backend_probe(sbx_backend_t *b) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  if (!loop) {
    free(b->unavailable);
    b->available = false;
    b->unavailable = xasprintf("cannot probe: %s", cm_error_message(&err));
    cm_error_release(&err);
    return;
  }
  bool done = false;
  sbx_backend_probe_start(b, loop, sync_done, &done);
  while (!done) {
    if (cm_loop_run_once(loop, -1, &err) < 0) {
      cm_error_release(&err);
      break;
    }
  }
  cm_loop_free(loop);
}
