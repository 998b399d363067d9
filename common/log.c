#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "common/cm.h"

static cm_log_level_t current_level = CM_LOG_INFO;
/* Whether stderr is the journal's stream (systemd's JOURNAL_STREAM names it): each line then
 * starts with its sd-daemon priority ("<4>" for a warning) instead of a timestamp and the
 * program's name, which the journal records itself, so `journalctl -p warning` finds it. */
static bool to_journal;
/* sd-daemon.h's SD_DEBUG, SD_INFO, SD_WARNING, SD_ERR. */
static const char journal_priorities[] = {'7', '6', '4', '3'};

static const char *const level_names[] = {"debug", "info", "warning", "error", "off"};

void cm_log_set_level(cm_log_level_t level) {
  current_level = level;
}
cm_log_level_t cm_log_get_level(void) {
  return current_level;
}

bool cm_log_detect_journal(void) {
  to_journal = false;
  const char *stream = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  int end = 0;
  struct stat st;
  if (stream && sscanf(stream, "%llu:%llu%n", &dev, &ino, &end) == 2 && stream[end] == '\0' &&
      fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
      (unsigned long long)st.st_ino == ino)
    to_journal = true;
  return to_journal;
}

bool cm_log_journal(void) {
  return to_journal;
}

int cm_log_parse_level(const char *name, cm_log_level_t *level) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(level_names); i++) {
    if (strcmp(name, level_names[i]) == 0) {
      *level = (cm_log_level_t)i;
      return 0;
    }
  }
  if (strcmp(name, "warn") == 0) {
    *level = CM_LOG_WARNING;
    return 0;
  }
  return -1;
}

void cm_log(cm_log_level_t level, const char *fmt, ...) {
  if (level < current_level || level >= CM_LOG_OFF) return;
  char line[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = to_journal ? snprintf(line, sizeof line, "<%c>%s: ", journal_priorities[level],
                                level_names[level])
                     : snprintf(line, sizeof line,
                                "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s mcp-python-exec-sandbox: ",
                                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                                tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  size_t len = (size_t)n + CM_MIN((size_t)m, sizeof line - (size_t)n - 2);
  line[len++] = '\n';
  /* One write per line so concurrent writers do not interleave mid-line.  Never stdout. */
  (void)!write(STDERR_FILENO, line, len);
}

char *cm_log_excerpt(const char *buf, size_t len, size_t max) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  size_t n = CM_MIN(len, max);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      cm_buf_append(&b, &buf[i], 1);
    } else {
      cm_buf_printf(&b, "\\x%02x", c);
    }
  }
  if (len > max) cm_buf_printf(&b, "...(%zu bytes)", len);
  return cm_buf_steal(&b);
}
