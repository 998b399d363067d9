/* The audit log: lines are formatted on the loop, queued under a mutex, and written by one
 * thread of the log's own, which is the only code that touches the file. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "server/audit/audit.h"

/* Of a record over SRV_AUDIT_LINE_MAX, strings up to this many bytes stay (a digest, a
 * principal, an environment key); a record has a few dozen fields, so what stays fits. */
#define AUDIT_SHRUNK_STRING_MAX 512

struct srv_audit {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  pthread_t thread;
  /* Under mu: */
  cm_buf_t queue;
  uint64_t dropped;  /* lines lost, in all */
  uint64_t reported; /* of them, already said in the log */
  bool reopen;
  bool stop;
  bool finished; /* the thread wrote what was queued and ended */
  pthread_cond_t done;
  /* The thread's own: */
  char *path; /* NULL: stderr */
  int fd;
  uint64_t size;
  uint64_t max_bytes;
  unsigned keep;
};

static void format_time(char *out, size_t cap) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, cap, "%.20s.%03uZ", day, (unsigned)(ts.tv_nsec / 1000000) % 1000u);
}

/* Opens the file for appending: never a FIFO (O_NONBLOCK keeps open itself from waiting for a
 * reader), a device or a symbolic link. */
static int open_log(const char *path, uint64_t *size, cm_error_t *err) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0 && errno == ENXIO) {
    /* A FIFO nobody reads. */
    cm_error_set(err, 0, CM_ERR_INVALID, "the audit log %s is not a regular file", path);
    return -1;
  }
  if (fd < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "the audit log %s", path);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    cm_error_set(err, 0, CM_ERR_INVALID, "the audit log %s is not a regular file", path);
    return -1;
  }
  *size = (uint64_t)st.st_size;
  return fd;
}

static void reopen_log(srv_audit_t *a) {
  if (!a->path) return;
  cm_error_t err = CM_ERROR_INIT;
  uint64_t size = 0;
  int fd = open_log(a->path, &size, &err);
  if (fd < 0) {
    /* Keep writing to the old one: a line in a moved file beats a line lost. */
    cm_warn("audit log: %s", cm_error_message(&err));
    cm_error_release(&err);
    return;
  }
  if (a->fd >= 0) close(a->fd);
  a->fd = fd;
  a->size = size;
}

/* FILE.<keep-1> -> FILE.<keep>, ..., FILE -> FILE.1, and a new FILE. */
static void rotate(srv_audit_t *a) {
  for (unsigned i = a->keep; i > 1; i--) {
    cleanup_free char *from = xasprintf("%s.%u", a->path, i - 1);
    cleanup_free char *to = xasprintf("%s.%u", a->path, i);
    if (rename(from, to) < 0 && errno != ENOENT) cm_warn("audit log: rename %s: %m", from);
  }
  cleanup_free char *first = xasprintf("%s.1", a->path);
  if (rename(a->path, first) < 0) {
    cm_warn("audit log: rename %s: %m", a->path);
    return;
  }
  reopen_log(a);
}

static size_t count_lines(const char *p, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) n += p[i] == '\n';
  return n;
}

/* Writes all of it, or counts its lines as dropped. */
static void write_out(srv_audit_t *a, const char *p, size_t len) {
  int fd = a->path ? a->fd : STDERR_FILENO;
  const char *q = p;
  size_t left = len;
  while (left) {
    ssize_t n = write(fd, q, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      pthread_mutex_lock(&a->mu);
      a->dropped += count_lines(q, left);
      pthread_mutex_unlock(&a->mu);
      return;
    }
    q += n;
    left -= (size_t)n;
  }
  a->size += len;
}

static void *writer(void *data) {
  srv_audit_t *a = data;
  cm_buf_t batch;
  cm_buf_init(&batch, 0);
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->queue.len && !a->stop && !a->reopen) pthread_cond_wait(&a->wake, &a->mu);
    bool reopen = a->reopen;
    a->reopen = false;
    /* Take the whole queue: the loop goes on queueing into an empty buffer meanwhile. */
    cm_buf_t taken = a->queue;
    a->queue = batch;
    uint64_t lost = a->dropped - a->reported;
    a->reported = a->dropped;
    bool stop = a->stop && !taken.len;
    pthread_mutex_unlock(&a->mu);

    if (reopen) reopen_log(a);
    if (lost) {
      char t[40], line[160];
      format_time(t, sizeof t);
      int n = snprintf(line, sizeof line,
                       "{\"time\":\"%s\",\"event\":\"audit_lines_dropped\",\"count\":%llu}\n", t,
                       (unsigned long long)lost);
      write_out(a, line, (size_t)n);
    }
    if (taken.len) write_out(a, taken.data, taken.len);
    if (a->path && a->max_bytes && a->size >= a->max_bytes) rotate(a);
    taken.len = 0;
    batch = taken;

    pthread_mutex_lock(&a->mu);
    if (stop || (a->stop && !a->queue.len)) break;
  }
  a->finished = true;
  pthread_cond_broadcast(&a->done);
  pthread_mutex_unlock(&a->mu);
  cm_buf_release(&batch);
  return NULL;
}

srv_audit_t *srv_audit_open(const char *path, uint64_t max_bytes, unsigned keep, cm_error_t *err) {
  srv_audit_t *a = xcalloc(1, sizeof *a);
  a->fd = -1;
  a->keep = keep ? keep : 1;
  a->max_bytes = max_bytes;
  cm_buf_init(&a->queue, 0);
  if (strcmp(path, "-") != 0) {
    a->path = xstrdup(path);
    a->fd = open_log(path, &a->size, err);
    if (a->fd < 0) {
      free(a->path);
      cm_buf_release(&a->queue);
      free(a);
      return NULL;
    }
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->wake, NULL);
  pthread_cond_init(&a->done, NULL);
  /* The thread takes no signal: the loop receives them all through its signalfd. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&a->thread, NULL, writer, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    cm_error_set(err, rc, CM_ERR_IO, "starting the audit log's writer");
    if (a->fd >= 0) close(a->fd);
    free(a->path);
    cm_buf_release(&a->queue);
    free(a);
    return NULL;
  }
  return a;
}

/* A record too large for a line: its scalars stay (who, what, how it ended: the caller
 * decides the size of a list or a long string, and must not thereby wipe its own line),
 * the rest goes and "omitted" names it. */
static json_t *shrunk(json_t *line, size_t len) {
  json_t *out = json_object();
  json_t *omitted = json_array();
  const char *key;
  json_t *v;
  json_object_foreach(line, key, v) {
    bool keep = json_is_number(v) || json_is_boolean(v) || json_is_null(v) ||
                (json_is_string(v) && json_string_length(v) <= AUDIT_SHRUNK_STRING_MAX);
    if (keep)
      json_object_set(out, key, v);
    else
      json_array_append_new(omitted, json_string(key));
  }
  json_object_set_new(out, "omitted", omitted);
  json_object_set_new(out, "error", json_string("record too large"));
  json_object_set_new(out, "bytes", json_integer((json_int_t)len));
  return out;
}

void srv_audit_write(srv_audit_t *a, json_t *record) {
  if (!a || !record) return;
  char t[40];
  format_time(t, sizeof t);
  json_auto_t *line = json_pack("{s:s}", "time", t);
  json_object_update_missing(line, record);
  char *text = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
  size_t len = text ? strlen(text) : 0;
  if (text && len > SRV_AUDIT_LINE_MAX) {
    free(text);
    json_auto_t *small = shrunk(line, len);
    text = json_dumps(small, JSON_COMPACT | JSON_ENSURE_ASCII);
  }
  len = text ? strlen(text) : 0;
  if (!text || len > SRV_AUDIT_LINE_MAX) {
    free(text);
    json_t *ev = json_object_get(record, "event");
    json_auto_t *note = json_pack("{s:s, s:s?, s:s, s:I}", "time", t, "event",
                                  json_is_string(ev) ? json_string_value(ev) : NULL, "error",
                                  "record too large", "bytes", (json_int_t)len);
    text = json_dumps(note, JSON_COMPACT | JSON_ENSURE_ASCII);
    len = text ? strlen(text) : 0;
  }
  pthread_mutex_lock(&a->mu);
  if (!text || a->stop || a->queue.len + len + 1 > SRV_AUDIT_QUEUE_MAX) {
    a->dropped++;
  } else {
    cm_buf_append(&a->queue, text, len);
    cm_buf_append(&a->queue, "\n", 1);
    pthread_cond_signal(&a->wake);
  }
  pthread_mutex_unlock(&a->mu);
  free(text);
}

void srv_audit_reopen(srv_audit_t *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->reopen = true;
  pthread_cond_signal(&a->wake);
  pthread_mutex_unlock(&a->mu);
}

uint64_t srv_audit_dropped(srv_audit_t *a) {
  if (!a) return 0;
  pthread_mutex_lock(&a->mu);
  uint64_t n = a->dropped;
  pthread_mutex_unlock(&a->mu);
  return n;
}

void srv_audit_close(srv_audit_t *a, uint64_t timeout_ms) {
  if (!a) return;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(timeout_ms / 1000);
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&a->mu);
  a->stop = true;
  pthread_cond_signal(&a->wake);
  int rc = 0;
  while (!a->finished && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&a->done, &a->mu, &until);
  bool finished = a->finished;
  pthread_mutex_unlock(&a->mu);
  if (!finished) {
    /* A disk that does not answer: the thread keeps the log (and this memory) until the
     * process exits, which is next. */
    cm_warn("audit log: the disk did not take the last lines within %llums",
            (unsigned long long)timeout_ms);
    pthread_detach(a->thread);
    return;
  }
  pthread_join(a->thread, NULL);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->wake);
  pthread_cond_destroy(&a->done);
  if (a->fd >= 0) close(a->fd);
  free(a->path);
  cm_buf_release(&a->queue);
  free(a);
}
