/* stdio transport: newline-delimited JSON-RPC on stdin/stdout.  Nothing else ever writes
 * to stdout; logs go to stderr. */
#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>

#include "transport/transport-internal.h"

#define TR_STDIO_READ_CHUNK 65536
/* Input buffer kept between messages (larger ones are freed once handled). */
#define TR_STDIO_KEEP_BYTES (1u << 20)
/* Progress and log notifications are dropped while this much output waits for the client. */
#define TR_STDIO_MAX_PENDING (4u << 20)
/* Back-pressure: past this much output waiting for the client, stdin is not read (nor its
 * lines already read handled) until the backlog is down to TR_STDIO_RESUME_BACKLOG.  A
 * client that writes requests and never reads their answers cannot grow the server's
 * memory: its requests wait in the pipe. */
#define TR_STDIO_MAX_BACKLOG (8u << 20)
#define TR_STDIO_RESUME_BACKLOG (4u << 20)
/* A client that has closed stdin and reads none of the answers held back for this long is
 * taken for gone: the server ends as at its EOF (the lines held back are not handled). */
#define TR_STDIO_HANGUP_STALL_MS 10000

struct tr_stdio {
  cm_loop_t *loop;
  int in_fd, out_fd;
  size_t max_message;
  tr_stdio_callbacks_t cbs;
  void *data;
  cm_watch_t *w_in, *w_out;
  cm_timer_t *t_poll;  /* stdin is a regular file: poll it instead of epoll */
  bool polled;         /* (so t_poll, not w_in, reads it) */
  bool paused;         /* back-pressure: stdin is not read (TR_STDIO_MAX_BACKLOG) */
  bool hung_up;        /* the client closed stdin during a pause (so it is not watched then) */
  cm_timer_t *t_stall; /* hung up and paused: is the client still reading? */
  uint64_t written, stall_mark;
  cm_timer_t *t_resume;
  cm_buf_t in;
  /* The first in_scanned bytes of `in` hold no newline: a long line arriving in many reads
   * is searched once (linear), not from its start at every read. */
  size_t in_scanned;
  uint64_t searched; /* bytes searched for a newline so far (tr_stdio_bytes_searched) */
  bool discarding;
  size_t discarded;
  cm_buf_t out;
  size_t out_off;
  bool eof, out_broken, stopped;
  tr_sink_t sink;
};

static void sink_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags);
static void sink_release(tr_sink_t *s) {}
static const tr_sink_ops_t stdio_sink_ops = {.send = sink_send, .release = sink_release};

static void try_write(tr_stdio_t *t);
static void pressure(tr_stdio_t *t);

/* The client is gone (EPIPE, or its end of stdout closed): nothing more is written, and
 * stdin is read again if the backlog had paused it, so that its EOF is seen. */
static void out_gone(tr_stdio_t *t) {
  t->out_broken = true;
  t->sink.closed = true;
  cm_buf_reset(&t->out);
  t->out_off = 0;
  pressure(t);
}

static void on_writable(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  tr_stdio_t *t = data;
  if (revents & (EPOLLERR | EPOLLHUP) && !(revents & EPOLLOUT)) {
    /* (A full pipe whose reader closed: EPOLLERR without EPOLLOUT.) */
    cm_watch_remove(t->w_out);
    t->w_out = NULL;
    out_gone(t);
    return;
  }
  try_write(t);
}

static void try_write(tr_stdio_t *t) {
  while (t->out_off < t->out.len) {
    ssize_t n = write(t->out_fd, t->out.data + t->out_off, t->out.len - t->out_off);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      /* EPIPE: the client is gone.  Keep running so children get cleaned up on EOF. */
      out_gone(t);
      break;
    }
    t->out_off += (size_t)n;
    t->written += (uint64_t)n;
  }
  if (t->out_off == t->out.len) {
    cm_buf_reset(&t->out);
    t->out_off = 0;
  } else if (t->out_off > (1u << 20)) {
    cm_buf_consume(&t->out, t->out_off);
    t->out_off = 0;
  }
  pressure(t);
  bool want = t->out.len > t->out_off && !t->out_broken;
  if (want && !t->w_out) {
    cm_error_t err = CM_ERROR_INIT;
    t->w_out = cm_loop_watch(t->loop, t->out_fd, EPOLLOUT, on_writable, t, &err);
    cm_error_release(&err);
  } else if (!want && t->w_out) {
    cm_watch_remove(t->w_out);
    t->w_out = NULL;
  }
}

static void sink_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags) {
  tr_stdio_t *t = (tr_stdio_t *)((char *)s - offsetof(tr_stdio_t, sink));
  if (t->out_broken) return;
  if ((flags & TR_SEND_DROPPABLE) && t->out.len - t->out_off > TR_STDIO_MAX_PENDING) return;
  cm_buf_append(&t->out, json, len);
  cm_buf_append(&t->out, "\n", 1);
  try_write(t);
}

static bool blank(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return false;
  return true;
}

/* Hands every complete line in the input buffer to the router. */
static void process_lines(tr_stdio_t *t) {
  size_t start = 0, from = CM_MIN(t->in_scanned, t->in.len);
  bool partial = false; /* (what is left is the start of a line, not lines held back) */
  t->in_scanned = 0;
  while (!t->stopped && !t->paused) {
    char *nl = memchr(t->in.data + from, '\n', t->in.len - from);
    t->searched += nl ? (uint64_t)(nl - (t->in.data + from)) + 1 : t->in.len - from;
    if (!nl) {
      partial = true;
      t->in_scanned = t->in.len - start;
      break;
    }
    size_t len = (size_t)(nl - (t->in.data + start));
    const char *line = t->in.data + start;
    if (t->discarding) {
      t->discarding = false;
      size_t total = t->discarded + len;
      t->discarded = 0;
      if (t->cbs.on_oversize) t->cbs.on_oversize(t->data, total, &t->sink);
    } else {
      size_t l = len;
      if (l > 0 && line[l - 1] == '\r') l--;
      if (l > t->max_message) {
        if (t->cbs.on_oversize) t->cbs.on_oversize(t->data, l, &t->sink);
      } else if (!blank(line, l)) {
        t->cbs.on_message(t->data, line, l, &t->sink);
      }
    }
    start += len + 1;
    from = start;
  }
  cm_buf_consume(&t->in, start);
  if (partial && t->in.len > t->max_message + 1) {
    /* A line longer than the limit: drop what we have and skip to its end. */
    t->discarding = true;
    t->discarded += t->in.len;
    cm_buf_reset(&t->in);
    t->in_scanned = 0;
  }
  /* A large message grew the buffer: once it is handled, its memory goes back (a server
   * that accepted one 100 MB input file does not keep 128 MiB for its life). */
  if (t->in.cap > TR_STDIO_KEEP_BYTES && t->in.len < TR_STDIO_KEEP_BYTES / 2) {
    cm_buf_t small;
    cm_buf_init(&small, t->in.max);
    cm_buf_append(&small, t->in.data, t->in.len);
    cm_buf_release(&t->in);
    t->in = small;
  }
}

/* Nothing reads stdin any more. */
static void unwatch_stdin(tr_stdio_t *t) {
  cm_watch_remove(t->w_in);
  t->w_in = NULL;
  cm_timer_cancel(t->t_poll);
  t->t_poll = NULL;
  cm_timer_cancel(t->t_resume);
  t->t_resume = NULL;
  cm_timer_cancel(t->t_stall);
  t->t_stall = NULL;
}

static void handle_eof(tr_stdio_t *t) {
  if (t->eof) return;
  t->eof = true;
  unwatch_stdin(t);
  /* A last line without a newline still counts (unless lines are held back). */
  if (t->in.len && !t->discarding && !t->stopped) {
    cm_buf_append(&t->in, "\n", 1);
    process_lines(t);
  }
  if (t->cbs.on_eof && !t->stopped) t->cbs.on_eof(t->data);
}

/* Returns true if more may be readable right away. */
static bool read_some(tr_stdio_t *t) {
  char chunk[TR_STDIO_READ_CHUNK];
  for (int i = 0; i < 16 && !t->stopped && !t->paused; i++) {
    ssize_t n = read(t->in_fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return false;
    if (n <= 0) {
      handle_eof(t);
      return false;
    }
    if (t->discarding) {
      char *nl = memchr(chunk, '\n', (size_t)n);
      if (!nl) {
        t->discarded += (size_t)n;
        continue;
      }
    }
    cm_buf_append(&t->in, chunk, (size_t)n);
    process_lines(t);
  }
  return !t->stopped && !t->eof && !t->paused;
}

static void on_stall(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  tr_stdio_t *t = data;
  t->t_stall = NULL;
  if (!t->paused || t->stopped || t->eof) return;
  if (t->written != t->stall_mark) {
    t->stall_mark = t->written;
    t->t_stall = cm_loop_timer(loop, TR_STDIO_HANGUP_STALL_MS, on_stall, t);
    return;
  }
  cm_info("stdio: stdin closed and no answer read for %d s: taken for its end",
          TR_STDIO_HANGUP_STALL_MS / 1000);
  handle_eof(t);
}

/* The client closed stdin during a pause.  The pause holds (the client may be slow, not
 * gone: `producer | server | consumer`, the producer done), so stdin is not watched (its
 * hang-up would wake the loop at once, again and again) until the backlog is down; only a
 * client that reads none of its answers for TR_STDIO_HANGUP_STALL_MS is taken for gone. */
static void hang_up(tr_stdio_t *t) {
  t->hung_up = true;
  cm_watch_remove(t->w_in);
  t->w_in = NULL;
  if (!t->t_stall) {
    t->stall_mark = t->written;
    t->t_stall = cm_loop_timer(t->loop, TR_STDIO_HANGUP_STALL_MS, on_stall, t);
  }
}

static void on_readable(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  tr_stdio_t *t = data;
  if (t->paused) {
    /* Paused, stdin is watched for its hang-up only (EPOLLHUP, which epoll reports whatever
     * the events, for a pipe; EPOLLRDHUP for a socket's half-close). */
    if (revents & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) hang_up(t);
    return;
  }
  read_some(t);
}

static void on_poll(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  tr_stdio_t *t = data;
  t->t_poll = NULL;
  if (read_some(t)) t->t_poll = cm_loop_timer(loop, 1, on_poll, t);
}

/* The backlog is down again: the lines held back first, then stdin (from the loop, never
 * from inside a send). */
static void on_resume(cm_loop_t *loop, cm_timer_t *timer, void *data) {
  tr_stdio_t *t = data;
  t->t_resume = NULL;
  if (t->paused || t->stopped || t->eof) return;
  process_lines(t);
  if (t->paused || t->stopped) return;
  cm_error_t serr = CM_ERROR_INIT;
  if (t->polled) {
    if (!t->t_poll) t->t_poll = cm_loop_timer(loop, 1, on_poll, t);
  } else if (t->w_in && cm_watch_set_events(t->w_in, EPOLLIN, &serr) == 0) {
    return;
  } else {
    cm_error_release(&serr);
    cm_watch_remove(t->w_in);
    cm_error_t err = CM_ERROR_INIT;
    t->w_in = cm_loop_watch(loop, t->in_fd, EPOLLIN, on_readable, t, &err);
    if (!t->w_in) {
      /* (It was watched before: only out of memory gets here.) */
      cm_err("stdio: watching stdin again: %s", err.msg ? err.msg : "?");
      cm_error_release(&err);
      handle_eof(t);
    }
  }
}

/* Stops reading stdin while too much output waits for the client, and starts again once
 * it has read enough of it. */
static void pressure(tr_stdio_t *t) {
  size_t backlog = t->out_broken ? 0 : t->out.len - t->out_off;
  if (!t->paused && backlog > TR_STDIO_MAX_BACKLOG && !t->stopped && !t->eof) {
    t->paused = true;
    cm_timer_cancel(t->t_poll);
    t->t_poll = NULL;
    cm_timer_cancel(t->t_resume);
    t->t_resume = NULL;
    /* Watched still, for a hang-up (on_readable), unless it was seen already. */
    cm_error_t err = CM_ERROR_INIT;
    if (t->hung_up) {
      if (!t->polled) hang_up(t);
    } else if (t->w_in && cm_watch_set_events(t->w_in, EPOLLRDHUP, &err) < 0) {
      cm_error_release(&err);
      cm_watch_remove(t->w_in);
      t->w_in = NULL;
    }
  } else if (t->paused && backlog <= TR_STDIO_RESUME_BACKLOG) {
    t->paused = false;
    if (!t->t_resume) t->t_resume = cm_loop_timer(t->loop, 0, on_resume, t);
  }
}

tr_stdio_t *tr_stdio_new(cm_loop_t *loop, int in_fd, int out_fd, size_t max_message_bytes,
                         const tr_stdio_callbacks_t *cbs, void *data, cm_error_t *err) {
  tr_stdio_t *t = xcalloc(1, sizeof *t);
  t->loop = loop;
  t->in_fd = in_fd;
  t->out_fd = out_fd;
  t->max_message = max_message_bytes;
  t->cbs = *cbs;
  t->data = data;
  t->sink.ops = &stdio_sink_ops;
  t->sink.refs = 1;
  cm_buf_init(&t->in, 0);
  cm_buf_init(&t->out, 0);
  cm_set_nonblock(in_fd, true);
  cm_set_nonblock(out_fd, true);
  cm_error_t werr = CM_ERROR_INIT;
  t->w_in = cm_loop_watch(loop, in_fd, EPOLLIN, on_readable, t, &werr);
  if (!t->w_in) {
    if (werr.errnum != EPERM) {
      *err = werr;
      cm_error_wrap(err, "watching stdin");
      free(t);
      return NULL;
    }
    /* A regular file or /dev/null: epoll refuses it, so read it on a timer. */
    cm_error_release(&werr);
    t->polled = true;
    t->t_poll = cm_loop_timer(loop, 1, on_poll, t);
  }
  return t;
}

tr_sink_t *tr_stdio_sink(tr_stdio_t *t) {
  return &t->sink;
}

void tr_stdio_stop_reading(tr_stdio_t *t) {
  t->stopped = true;
  unwatch_stdin(t);
}

uint64_t tr_stdio_bytes_searched(const tr_stdio_t *t) {
  return t->searched;
}

size_t tr_stdio_pending(const tr_stdio_t *t) {
  return t->out_broken ? 0 : t->out.len - t->out_off;
}

void tr_stdio_flush(tr_stdio_t *t, int timeout_ms) {
  uint64_t deadline = cm_now_ms() + (uint64_t)timeout_ms;
  while (tr_stdio_pending(t)) {
    uint64_t now = cm_now_ms();
    if (now >= deadline) break;
    struct pollfd p = {.fd = t->out_fd, .events = POLLOUT};
    if (poll(&p, 1, (int)(deadline - now)) <= 0) break;
    ssize_t n = write(t->out_fd, t->out.data + t->out_off, t->out.len - t->out_off);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      break;
    }
    t->out_off += (size_t)n;
  }
}

void tr_stdio_free(tr_stdio_t *t) {
  if (!t) return;
  cm_watch_remove(t->w_in);
  cm_watch_remove(t->w_out);
  cm_timer_cancel(t->t_poll);
  cm_timer_cancel(t->t_resume);
  cm_timer_cancel(t->t_stall);
  cm_buf_release(&t->in);
  cm_buf_release(&t->out);
  cm_set_nonblock(t->in_fd, false);
  cm_set_nonblock(t->out_fd, false);
  free(t);
}
