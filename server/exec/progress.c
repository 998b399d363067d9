/* A run's output as progress: coalesced, rate-limited, capped (see below). */
#include "server/exec/exec-internal.h"

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

void exec_progress_flush(exec_job_t *job) {
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
    exec_progress_flush(job);
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

void exec_progress_output(exec_job_t *job, sbx_stream_t stream, const char *buf, size_t len) {
  bool progress = srv_request_has_progress(job->req);
  bool log = stream == SBX_STDERR && srv_request_log_enabled(job->req, "info");
  if (progress) {
    size_t room =
        EXEC_PROGRESS_MAX_TEXT > job->pending.len ? EXEC_PROGRESS_MAX_TEXT - job->pending.len : 0;
    size_t take = CM_MIN(room, len);
    cm_buf_append(&job->pending, buf, take);
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
}
