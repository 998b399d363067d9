/* The seed's text result format and truncation, with the tail kept as well: a traceback
 * at the end of a flood is what a model needs most. */
#include <stdio.h>
#include <string.h>

#include "server/exec/exec-internal.h"

/* Kept output (stdout and stderr together) up to this many bytes is in both the text block and
 * structuredContent: every host shows it, whichever of the two it gives its model (Claude
 * Code and Codex show structuredContent, the AI SDK and LangChain the text block), and the
 * seed's clients, which read the text block, see it whole as before (a table, a report, a
 * traceback: what scripts print is seldom more).  16 KiB doubled is a small price; past it
 * the output goes once. */
#define EXEC_RESULT_TEXT_OUTPUT_MAX (16 * 1024)
/* Past it, the text block has the beginning and the end: this share (percent), at most
 * EXEC_RESULT_EXCERPT_MAX bytes a stream (a result stays under 1.25 times its output). */
#define EXEC_RESULT_EXCERPT_SHARE 15
#define EXEC_RESULT_EXCERPT_MAX (16 * 1024)

char *srv_truncation_marker(uint64_t max) {
  /* The seed formats max/1024 with Python's "{:.0f}" (round half to even), as printf does. */
  return xasprintf("\n... [truncated at %.0fKB]", (double)max / 1024.0);
}

/* Skips continuation bytes at the start of a tail cut in the middle of a character. */
static size_t utf8_skip_partial(const char *s, size_t len) {
  size_t i = 0;
  while (i < len && i < 3 && ((unsigned char)s[i] & 0xc0) == 0x80) i++;
  return i;
}

/* The n parts ((pointer, length) pairs, NULs and all) one after the other: heap, with a
 * NUL after them. */
static char *join(size_t *out_len, size_t n, ...) {
  va_list ap;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  va_start(ap, n);
  for (size_t i = 0; i < n; i++) {
    const char *p = va_arg(ap, const char *);
    size_t len = va_arg(ap, size_t);
    cm_buf_append(&b, p, len);
  }
  va_end(ap);
  *out_len = b.len;
  return cm_buf_steal(&b);
}

char *srv_truncate_output(const char *head, size_t head_len, const char *tail, size_t tail_len,
                          uint64_t total, uint64_t max) {
  size_t len;
  bool cut;
  return srv_truncate_output_n(head, head_len, tail, tail_len, total, max, &len, &cut);
}

char *srv_truncate_output_n(const char *head, size_t head_len, const char *tail, size_t tail_len,
                            uint64_t total, uint64_t max, size_t *out_len, bool *cut) {
  size_t h_len, t_len;
  cleanup_free char *h = cm_utf8_sanitize(head, head_len, &h_len);
  cleanup_free char *t = cm_utf8_sanitize(tail, tail_len, &t_len);
  bool complete = total == head_len && tail_len == 0;
  *cut = true;
  if (complete && h_len <= max) {
    *cut = false;
    *out_len = h_len;
    return steal_pointer(&h);
  }

  cleanup_free char *seed_marker = srv_truncation_marker(max);
  /* Room for the tail note; it names the sizes so a model knows what it is looking at. */
  char note[160];
  size_t budget_guess = max / 4;
  snprintf(note, sizeof note, " ... (%llu bytes in all; the last %zu bytes follow)\n",
           (unsigned long long)total, budget_guess);
  size_t marker_len = strlen(seed_marker) + strlen(note);
  if (marker_len >= max) {
    /* max is tiny (the seed allows 1024): head only, as the seed does. */
    size_t keep = max > strlen(seed_marker) ? max - strlen(seed_marker) : 0;
    keep = cm_utf8_clip(h, CM_MIN(keep, h_len));
    return join(out_len, 2, h, keep, seed_marker, strlen(seed_marker));
  }
  size_t budget = max - marker_len;
  size_t tail_keep = t_len ? CM_MIN(t_len, budget / 4) : 0;
  size_t head_keep = cm_utf8_clip(h, CM_MIN(h_len, budget - tail_keep));
  if (tail_keep == 0) return join(out_len, 2, h, head_keep, seed_marker, strlen(seed_marker));
  const char *tail_start = t + t_len - tail_keep;
  size_t skip = utf8_skip_partial(tail_start, tail_keep);
  tail_start += skip;
  tail_keep -= skip;
  snprintf(note, sizeof note, " ... (%llu bytes in all; the last %zu bytes follow)\n",
           (unsigned long long)total, tail_keep);
  return join(out_len, 4, h, head_keep, seed_marker, strlen(seed_marker), note, strlen(note),
              tail_start, tail_keep);
}

char *srv_format_result(const srv_exec_summary_t *s) {
  size_t len;
  return srv_format_result_n(s, &len);
}

char *srv_format_result_n(const srv_exec_summary_t *s, size_t *len) {
  size_t out_len = s->stdout_text ? (s->stdout_len ? s->stdout_len : strlen(s->stdout_text)) : 0;
  size_t err_len = s->stderr_text ? (s->stderr_len ? s->stderr_len : strlen(s->stderr_text)) : 0;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  bool first = true;
#define PART(...)                           \
  do {                                      \
    if (!first) cm_buf_append(&b, "\n", 1); \
    first = false;                          \
    cm_buf_printf(&b, __VA_ARGS__);         \
  } while (0)
  if (out_len) {
    PART("--- stdout ---");
    cm_buf_append(&b, "\n", 1);
    cm_buf_append(&b, s->stdout_text, out_len);
  }
  if (err_len) {
    PART("--- stderr ---");
    cm_buf_append(&b, "\n", 1);
    cm_buf_append(&b, s->stderr_text, err_len);
  }
  PART("--- exit_code: %d ---", s->exit_code);
  PART("--- duration_ms: %llu ---", (unsigned long long)s->duration_ms);
  if (s->timed_out) PART("--- timed_out: true ---");
#undef PART
  *len = b.len;
  return cm_buf_steal(&b);
}

/* ---------------------------------------------------------------- a finished run's result */

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
static bool hit_memory_limit(const exec_job_t *job, const sbx_result_t *res, const char *err,
                             size_t n) {
  if (res->exit_code == 0 || res->timed_out || !job->cfg->memory_bytes) return false;
  const char *tail = err + (n > 2048 ? n - 2048 : 0);
  return memmem(tail, (size_t)(err + n - tail), "MemoryError", 11) != NULL;
}

/* A script without network sees only the resolver's failure ("Temporary failure in name
 * resolution", a socket.gaierror): when its stderr shows one and the call had no network that
 * the backend enforces, the result says why. */
static bool network_off_hit(const exec_job_t *job, sbx_backend_t *b, const char *err, size_t n) {
  if (job->spec.net.on || !sbx_backend_maps_paths(b) || !n) return false;
  static const char *const marks[] = {"Temporary failure in name resolution", "gaierror",
                                      "Name or service not known"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(marks); i++)
    if (memmem(err, n, marks[i], strlen(marks[i]))) return true;
  return false;
}

static const char *limit_hit(const sbx_result_t *res, bool memory) {
  if (res->timed_out) return "timeout";
  if (res->cpu_limit) return "cpu";
  if (res->file_size_limit) return "file_size";
  if (memory) return "memory";
  if (res->process_limit) return "processes";
  return NULL;
}

/* A stream's text in the text block of a result whose output is in structuredContent only:
 * its beginning and end, EXEC_RESULT_EXCERPT_SHARE of it (at most EXEC_RESULT_EXCERPT_MAX
 * bytes), and where the whole is.  NULL for an empty stream. */
static char *excerpt(const char *text, size_t len, const char *field, size_t *out_len) {
  if (!len) return NULL;
  uint64_t budget =
      CM_MIN((uint64_t)len * EXEC_RESULT_EXCERPT_SHARE / 100, (uint64_t)EXEC_RESULT_EXCERPT_MAX);
  size_t half = len / 2, cut_len;
  bool cut;
  cleanup_free char *part = srv_truncate_output_n(text, half, text + half, len - half, len,
                                                  CM_MAX(budget, (uint64_t)256), &cut_len, &cut);
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_append(&b, part, cut_len);
  cm_buf_printf(&b, "\n[all %zu bytes: structuredContent.%s]\n", len, field);
  *out_len = b.len;
  return cm_buf_steal(&b);
}

/* "what went wrong", in a line: the limit hit, the signal, or the exception (the last line of
 * stderr that starts a line at its left edge: "ZeroDivisionError: division by zero"). */
static char *what_went_wrong(const exec_job_t *job, const sbx_result_t *res, const char *limit,
                             const char *err, size_t err_len) {
  if (res->timed_out)
    return xasprintf("timed out after %llu s: the script and its processes were killed",
                     (unsigned long long)(job->spec.timeout_ms / 1000));
  if (limit && strcmp(limit, "memory") == 0) return xstrdup("out of memory (the memory limit)");
  if (limit && strcmp(limit, "cpu") == 0) return xstrdup("the CPU time limit was exceeded");
  if (limit && strcmp(limit, "file_size") == 0) return xstrdup("the file size limit was exceeded");
  if (limit && strcmp(limit, "processes") == 0)
    return xstrdup("the process limit was reached (a fork was refused)");
  if (res->term_signal) return xasprintf("killed by signal %d", res->term_signal);
  /* The last line that does not start with a space: a traceback's exception line. */
  size_t end = err_len;
  while (end > 0) {
    while (end > 0 && (err[end - 1] == '\n' || err[end - 1] == '\r')) end--;
    size_t start = end;
    while (start > 0 && err[start - 1] != '\n') start--;
    if (end > start && err[start] != ' ' && err[start] != '\t') {
      size_t n = cm_utf8_clip(err + start, CM_MIN(end - start, (size_t)200));
      return xasprintf("exit code %d: %.*s", res->exit_code, (int)n, err + start);
    }
    end = start;
  }
  return xasprintf("exit code %d", res->exit_code);
}

json_t *exec_output_result(exec_job_t *job, const sbx_result_t *res, json_t *network,
                           cm_buf_t *net_text) {
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
  /* Which sandbox, interpreter and set-up ran it: with details (a model seldom needs them, and
   * every host shows it the text block or structuredContent on every call). */
  if (job->spec.details) {
    cm_buf_printf(&t, "\n--- sandbox: %s ---\n--- python: %s (%s) ---", sbx_backend_name(b),
                  interp.version, interp.path);
    /* Session calls run in their kernel: nothing was prestarted for them. */
    if (!job->ksession)
      cm_buf_printf(&t, "\n--- prestarted: %s ---", exec_prestarted_name(job->prestarted));
  }
  if (res->term_signal && !res->timed_out)
    cm_buf_printf(&t, "\n--- killed_by_signal: %d ---", res->term_signal);
  if (res->status_unknown)
    cm_buf_appends(&t,
                   "\n--- note: the sandbox could not confirm the script's own exit status; the "
                   "exit code is the sandbox's ---");
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
                  job->env->cached ? "cached" : "built for this call",
                  json_object_size(job->env->packages));
  if (job->spec.timeout_note) cm_buf_printf(&t, "\n--- note: %s ---", job->spec.timeout_note);
  if (!job->spec.net.on && cfg->network && !sbx_backend_maps_paths(b))
    cm_buf_printf(&t,
                  "\n--- note: the %s backend cannot isolate the network; network: false was not "
                  "enforced ---",
                  sbx_backend_name(b));
  if (network_off_hit(job, b, err, err_len))
    cm_buf_appends(&t,
                   "\n--- note: the network is off for this call (network: false, or the server's "
                   "--network off): no name resolves and nothing can be reached ---");
  if (net_text->len) cm_buf_append(&t, net_text->data, net_text->len);
  /* Whatever the script left in outputs/, also after a failure or a timeout. */
  files_collection_t files;
  art_store_collect(srv_server_artifacts(job->server), job->tenant->principal, job->workdir,
                    &files);
  /* The principal's resources/list changed: its listen streams that asked are told. */
  if (files.stored_files)
    srv_listen_list_changed(job->server, SRV_LISTEN_RESOURCES, job->tenant->principal);
  files_result_append(&files, &t, NULL, NULL);
  bool truncated = out_cut || err_cut;
  bool is_error = res->exit_code != 0 || res->timed_out;
  /* The kept output goes once into the response when it is more than a few lines: in
   * structuredContent (which the hosts that show one of the two show), the text block saying
   * where it is. */
  bool one_copy = out_len + err_len > EXEC_RESULT_TEXT_OUTPUT_MAX;
  size_t full_len = t.len;
  cleanup_free char *full = cm_buf_steal(&t);
  if (one_copy) {
    /* The seed's block again, each stream's text cut to its beginning and end (hosts that
     * show only the text block, as the AI SDK and LangChain do, still see a traceback) and a
     * line saying where the whole is. */
    size_t out_line_len = 0, err_line_len = 0;
    cleanup_free char *out_line = excerpt(out, out_len, "stdout", &out_line_len);
    cleanup_free char *err_line = excerpt(err, err_len, "stderr", &err_line_len);
    srv_exec_summary_t brief = sum;
    brief.stdout_text = out_line;
    brief.stdout_len = out_line_len;
    brief.stderr_text = err_line;
    brief.stderr_len = err_line_len;
    size_t brief_len;
    cleanup_free char *block = srv_format_result_n(&brief, &brief_len);
    cm_buf_t nt;
    cm_buf_init(&nt, 0);
    cm_buf_append(&nt, block, brief_len);
    cm_buf_append(&nt, full + text_len, full_len - text_len);
    free(full);
    full_len = nt.len;
    full = cm_buf_steal(&nt);
  }
  json_t *result = srv_tool_text_resultn(full, full_len, is_error);
  json_t *sc =
      json_pack("{s:s%, s:s%, s:i, s:I, s:b, s:b}", "stdout", out, out_len, "stderr", err, err_len,
                "exit_code", res->exit_code, "duration_ms", (json_int_t)res->duration_ms,
                "timed_out", res->timed_out, "truncated", truncated);
  if (!sc) {
    /* Only invalid UTF-8 could make packing fail, and the texts were sanitized. */
    cm_err("building structuredContent failed");
    sc = json_object();
  }
  const char *limit = limit_hit(res, memory);
  if (is_error || limit) {
    cleanup_free char *what = what_went_wrong(job, res, limit, err, err_len);
    json_object_set_new(sc, "error", json_string(what));
  }
  /* What a program may want and a model seldom does: with details: true. */
  if (job->spec.details) {
    json_t *d =
        json_pack("{s:I, s:I, s:s, s:{s:s, s:s, s:s}, s:I, s:I}", "stdout_bytes",
                  (json_int_t)job->out.total, "stderr_bytes", (json_int_t)job->err.total, "sandbox",
                  sbx_backend_name(b), "python", "version", interp.version, "path", interp.path,
                  "implementation", interp.implementation, "cpu_user_ms",
                  (json_int_t)res->cpu_user_ms, "cpu_system_ms", (json_int_t)res->cpu_system_ms);
    if (d) json_object_update_new(sc, d);
    json_object_set_new(sc, "limit", limit ? json_string(limit) : json_null());
    json_object_set_new(sc, "signal",
                        res->term_signal ? json_integer(res->term_signal) : json_null());
    json_object_set_new(sc, "status_confirmed", json_boolean(!res->status_unknown));
    json_object_set_new(sc, "prestarted", json_string(exec_prestarted_name(job->prestarted)));
    json_object_set_new(sc, "max_rss_kib", json_integer((json_int_t)res->max_rss_kib));
    json_object_set_new(
        sc, "memory_peak_bytes",
        res->memory_peak_bytes ? json_integer((json_int_t)res->memory_peak_bytes) : json_null());
    json_object_set_new(sc, "environment",
                        job->env ? json_pack("{s:s, s:b, s:O}", "key", job->env->key, "cached",
                                             job->env->cached, "packages", job->env->packages)
                                 : json_null());
    json_object_set_new(sc, "network", network);
  } else if (job->spec.secrets.n) {
    /* A call with secrets is told which were substituted (network.secrets_used) and what was
     * refused, details or not. */
    json_object_set_new(sc, "network", network);
  } else {
    json_decref(network);
  }
  files_result_append(&files, NULL, json_object_get(result, "content"), sc);
  if (!job->spec.details && json_array_size(json_object_get(sc, "files")) == 0)
    json_object_del(sc, "files");
  srv_request_audit(job->req, "artifacts", json_integer((json_int_t)files.stored_files));
  srv_request_audit(job->req, "artifact_bytes", json_integer((json_int_t)files.stored_bytes));
  files_collection_release(&files);
  json_object_set_new(result, "structuredContent", sc);
  return result;
}
