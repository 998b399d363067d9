/* A run's output as progress: coalesced, rate-limited, capped (see below). */
#include "server/exec/exec-internal.h"

/* Output streams as notifications/progress, stdout and stderr in the order printed, each
 * message's _meta saying which of its text came from which stream (and stderr also as
 * notifications/message when the client enabled logging at info): coalesced for EXEC_COALESCE_MS,
 * and a line begun waits up to EXEC_PARTIAL_LINE_MS for its end, so that a print's text and its
 * newline travel together (an unbuffered stdout writes them apart), and rate-limited by a token
 * bucket (a burst of EXEC_PROGRESS_BURST, then EXEC_PROGRESS_PER_SECOND), each message at most
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

/* Length of valid UTF-8 text in UTF-16 code units (a 4-byte character is two). */
static size_t utf16_length(const char *s, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if ((c & 0xc0) != 0x80) n += c >= 0xf0 ? 2 : 1;
  }
  return n;
}

/* Appends one run's text to msg (sanitised on its own, so that the message is the runs'
 * texts end to end) and its entry to streams. */
static void append_run(cm_buf_t *msg, json_t *streams, const char *name, const char *buf,
                       size_t len) {
  if (!len) return;
  size_t n = len;
  cleanup_free char *clean = cm_utf8_valid(buf, len) ? NULL : cm_utf8_sanitize(buf, len, &n);
  const char *text = clean ? clean : buf;
  cm_buf_append(msg, text, n);
  json_array_append_new(streams, json_pack("[s, I]", name, (json_int_t)utf16_length(text, n)));
}

/* Sends the first n bytes of pending (fewer at a partial UTF-8 character) and what was
 * skipped, with the streams the bytes came from in _meta. */
static void flush_stdout(exec_job_t *job, size_t n) {
  if (n || job->skipped) {
    cm_buf_t msg;
    cm_buf_init(&msg, 0);
    json_t *streams = json_array();
    size_t keep = cm_utf8_clip(job->pending.data, n);
    size_t at = 0, used = 0;
    while (used < job->n_runs && at < keep) {
      size_t len = CM_MIN((size_t)job->runs[used].len, keep - at);
      append_run(&msg, streams, job->runs[used].stream == SBX_STDERR ? "stderr" : "stdout",
                 job->pending.data + at, len);
      at += len;
      job->runs[used].len = (uint16_t)(job->runs[used].len - len);
      if (job->runs[used].len == 0) used++;
    }
    memmove(job->runs, job->runs + used, (job->n_runs - used) * sizeof job->runs[0]);
    job->n_runs -= used;
    if (job->skipped) {
      cleanup_free char *note =
          xasprintf("\n... [%llu bytes of output skipped in progress; see the result]\n",
                    (unsigned long long)job->skipped);
      append_run(&msg, streams, "note", note, strlen(note));
    }
    job->streamed += keep + job->skipped;
    /* A partial UTF-8 character at the end waits for the next chunk. */
    cm_buf_consume(&job->pending, keep);
    job->skipped = 0;
    srv_request_progress(job->req, (double)job->streamed, msg.data, msg.len,
                         json_pack("{s:o}", EXEC_PROGRESS_STREAMS_META, streams));
    cm_buf_release(&msg);
  }
}

static void flush_stderr(exec_job_t *job) {
  if (job->pending_err.len) {
    size_t keep = cm_utf8_clip(job->pending_err.data, job->pending_err.len);
    srv_request_log(job->req, "info", "stderr", srv_json_string_lossy(job->pending_err.data, keep));
    cm_buf_consume(&job->pending_err, keep);
  }
}

void exec_progress_flush(exec_job_t *job) {
  flush_stdout(job, job->pending.len);
  flush_stderr(job);
}

/* How much of pending may go now: through its last line end ('\n', or a progress bar's
 * '\r'); all of it once its unended last line has waited EXEC_PARTIAL_LINE_MS, or when
 * output was skipped (the message says so at once).  *wait: how long the rest may wait. */
static size_t stdout_ready(exec_job_t *job, uint64_t now, uint64_t *wait) {
  *wait = 0;
  size_t n = job->pending.len;
  if (!n || job->skipped) return n;
  size_t end = n;
  while (end && job->pending.data[end - 1] != '\n' && job->pending.data[end - 1] != '\r') end--;
  if (end == n) return n;
  uint64_t waited = now - CM_MIN(now, job->pending_tail_ms);
  if (waited >= EXEC_PARTIAL_LINE_MS) return n;
  *wait = EXEC_PARTIAL_LINE_MS - waited;
  return end;
}

static void schedule_flush(exec_job_t *job);

static void on_flush_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_job_t *job = data;
  job->flush_timer = NULL;
  job->line_wait = false;
  uint64_t now = cm_now_ms(), wait;
  size_t n = stdout_ready(job, now, &wait);
  if (!n && !job->skipped && !job->pending_err.len) {
    /* Only a line begun: it waits for its end, or for its time. */
    if (job->pending.len) {
      job->flush_timer =
          cm_loop_timer(srv_server_loop(job->server), CM_MAX(wait, 1), on_flush_timer, job);
      job->line_wait = true;
    }
    return;
  }
  refill(job, now);
  if (job->tokens >= 1.0) {
    job->tokens -= 1.0;
    flush_stdout(job, n);
    flush_stderr(job);
    if (job->pending.len) job->pending_tail_ms = now; /* the line begun after the last end */
  }
  schedule_flush(job);
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

void exec_progress_output(exec_job_t *job, sbx_stream_t stream, const char *buf, size_t len) {
  bool progress = srv_request_has_progress(job->req);
  bool log = stream == SBX_STDERR && srv_request_log_enabled(job->req, "info");
  if (progress) {
    size_t room =
        EXEC_PROGRESS_MAX_TEXT > job->pending.len ? EXEC_PROGRESS_MAX_TEXT - job->pending.len : 0;
    size_t take = CM_MIN(room, len);
    if (take && job->n_runs && job->runs[job->n_runs - 1].stream == stream) {
      job->runs[job->n_runs - 1].len = (uint16_t)(job->runs[job->n_runs - 1].len + take);
    } else if (take && job->n_runs < EXEC_PROGRESS_MAX_RUNS) {
      job->runs[job->n_runs].len = (uint16_t)take;
      job->runs[job->n_runs].stream = (uint8_t)stream;
      job->n_runs++;
    } else {
      take = 0; /* one stream switch too many before a flush: skipped, as a flood is */
    }
    if (!job->pending.len) job->pending_tail_ms = cm_now_ms();
    cm_buf_append(&job->pending, buf, take);
    if (job->line_wait && (memchr(buf, '\n', take) || memchr(buf, '\r', take))) {
      /* The line waited for has ended: it goes after the usual coalescing. */
      cm_timer_cancel(job->flush_timer);
      job->flush_timer = NULL;
      job->line_wait = false;
    }
    job->skipped += len - take;
  }
  if (log) {
    size_t room = EXEC_PROGRESS_MAX_TEXT > job->pending_err.len
                      ? EXEC_PROGRESS_MAX_TEXT - job->pending_err.len
                      : 0;
    cm_buf_append(&job->pending_err, buf, CM_MIN(room, len));
  }
  if (progress || log) schedule_flush(job);
}

void exec_progress_stop(exec_job_t *job) {
  cm_timer_cancel(job->flush_timer);
  job->flush_timer = NULL;
  job->line_wait = false;
}
