/* The seed's text result format and truncation, with the tail kept as well: a traceback
 * at the end of a flood is what a model needs most. */
#include <stdio.h>
#include <string.h>

#include "server/srv.h"

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
