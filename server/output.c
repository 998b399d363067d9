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

/* Valid UTF-8, with every NUL byte replaced by U+FFFD: the text travels on as a C string,
 * and a NUL would silently cut off everything after it. */
static char *text_of(const char *buf, size_t len, size_t *out_len) {
  size_t n;
  cleanup_free char *clean = cm_utf8_sanitize(buf, len, &n);
  size_t nuls = 0;
  for (size_t i = 0; i < n; i++) nuls += clean[i] == '\0';
  if (nuls == 0) {
    *out_len = n;
    return steal_pointer(&clean);
  }
  char *out = xmalloc(n + 2 * nuls + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (clean[i] == '\0') {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
    } else {
      out[o++] = clean[i];
    }
  }
  out[o] = '\0';
  *out_len = o;
  return out;
}

char *srv_truncate_output(const char *head, size_t head_len, const char *tail, size_t tail_len,
                          uint64_t total, uint64_t max) {
  size_t h_len, t_len;
  cleanup_free char *h = text_of(head, head_len, &h_len);
  cleanup_free char *t = text_of(tail, tail_len, &t_len);
  bool complete = total == head_len && tail_len == 0;
  if (complete && h_len <= max) return steal_pointer(&h);

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
    return xasprintf("%.*s%s", (int)keep, h, seed_marker);
  }
  size_t budget = max - marker_len;
  size_t tail_keep = t_len ? CM_MIN(t_len, budget / 4) : 0;
  size_t head_keep = cm_utf8_clip(h, CM_MIN(h_len, budget - tail_keep));
  if (tail_keep == 0) {
    return xasprintf("%.*s%s", (int)head_keep, h, seed_marker);
  }
  const char *tail_start = t + t_len - tail_keep;
  size_t skip = utf8_skip_partial(tail_start, tail_keep);
  tail_start += skip;
  tail_keep -= skip;
  snprintf(note, sizeof note, " ... (%llu bytes in all; the last %zu bytes follow)\n",
           (unsigned long long)total, tail_keep);
  return xasprintf("%.*s%s%s%.*s", (int)head_keep, h, seed_marker, note, (int)tail_keep, tail_start);
}

char *srv_format_result(const srv_exec_summary_t *s) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  bool first = true;
#define PART(...)                           \
  do {                                      \
    if (!first) cm_buf_append(&b, "\n", 1); \
    first = false;                          \
    cm_buf_printf(&b, __VA_ARGS__);         \
  } while (0)
  if (s->stdout_text && *s->stdout_text) {
    PART("--- stdout ---");
    PART("%s", s->stdout_text);
  }
  if (s->stderr_text && *s->stderr_text) {
    PART("--- stderr ---");
    PART("%s", s->stderr_text);
  }
  PART("--- exit_code: %d ---", s->exit_code);
  PART("--- duration_ms: %llu ---", (unsigned long long)s->duration_ms);
  if (s->timed_out) PART("--- timed_out: true ---");
#undef PART
  return cm_buf_steal(&b);
}
