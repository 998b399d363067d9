#include <stdio.h>

#include "common/cm.h"

void cm_buf_init(cm_buf_t *b, size_t max) {
  b->data = NULL;
  b->len = 0;
  b->cap = 0;
  b->max = max;
}

void cm_buf_release(cm_buf_t *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

static int buf_reserve(cm_buf_t *b, size_t extra) {
  if (extra > SIZE_MAX - b->len - 1) return -1;
  size_t need = b->len + extra;
  if (b->max && need > b->max) return -1;
  if (need + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need + 1) cap = cap > SIZE_MAX / 2 ? need + 1 : cap * 2;
  if (b->max && cap > b->max + 1) cap = b->max + 1;
  b->data = xrealloc(b->data, cap);
  b->cap = cap;
  return 0;
}

int cm_buf_append(cm_buf_t *b, const void *data, size_t len) {
  if (buf_reserve(b, len) < 0) return -1;
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
  return 0;
}

int cm_buf_appends(cm_buf_t *b, const char *s) {
  return cm_buf_append(b, s, strlen(s));
}

int cm_buf_printf(cm_buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = xvasprintf(fmt, ap);
  va_end(ap);
  int rc = cm_buf_appends(b, s);
  free(s);
  return rc;
}

void cm_buf_consume(cm_buf_t *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

void cm_buf_reset(cm_buf_t *b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

char *cm_buf_steal(cm_buf_t *b) {
  char *d = b->data ? b->data : xstrdup("");
  b->data = NULL;
  b->len = b->cap = 0;
  return d;
}

/* ------------------------------------------------------------ head + tail */

void cm_headtail_init(cm_headtail_t *h, size_t head_max, size_t tail_max) {
  memset(h, 0, sizeof *h);
  h->head_max = head_max;
  h->tail_max = tail_max;
}

/* Room for at least `need` head bytes: doubling, from a small start, never past head_max. */
static void headtail_grow_head(cm_headtail_t *h, size_t need) {
  if (need <= h->head_cap) return;
  size_t cap = h->head_cap ? h->head_cap : 1024;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  cap = CM_MIN(cap, h->head_max);
  h->head = xrealloc(h->head, cap);
  h->head_cap = cap;
}

void cm_headtail_release(cm_headtail_t *h) {
  free(h->head);
  free(h->tail);
  h->head = h->tail = NULL;
}

void cm_headtail_append(cm_headtail_t *h, const char *data, size_t len) {
  h->total += len;
  size_t room = h->head_max - h->head_len;
  size_t n = CM_MIN(room, len);
  if (n) {
    headtail_grow_head(h, h->head_len + n);
    memcpy(h->head + h->head_len, data, n);
    h->head_len += n;
    data += n;
    len -= n;
  }
  if (len == 0 || h->tail_max == 0) return;
  if (!h->tail) h->tail = xmalloc(h->tail_max);
  /* Only the last tail_max bytes of what is left can matter. */
  if (len >= h->tail_max) {
    memcpy(h->tail, data + len - h->tail_max, h->tail_max);
    h->tail_start = 0;
    h->tail_len = h->tail_max;
    return;
  }
  for (size_t i = 0; i < len;) {
    size_t end = (h->tail_start + h->tail_len) % h->tail_max;
    if (h->tail_len < h->tail_max) {
      size_t chunk = CM_MIN(len - i, h->tail_max - end);
      chunk = CM_MIN(chunk, h->tail_max - h->tail_len);
      memcpy(h->tail + end, data + i, chunk);
      h->tail_len += chunk;
      i += chunk;
    } else {
      /* Full: overwrite the oldest bytes. */
      size_t chunk = CM_MIN(len - i, h->tail_max - h->tail_start);
      memcpy(h->tail + h->tail_start, data + i, chunk);
      h->tail_start = (h->tail_start + chunk) % h->tail_max;
      i += chunk;
    }
  }
}

bool cm_headtail_truncated(const cm_headtail_t *h) {
  return h->total > (uint64_t)h->head_len + h->tail_len;
}

void cm_headtail_get(const cm_headtail_t *h, char **head, size_t *head_len, char **tail,
                     size_t *tail_len) {
  /* Bytes, not a C string: a NUL in the output is kept like any other byte. */
  char *hd = xmalloc(h->head_len + 1);
  if (h->head_len) memcpy(hd, h->head, h->head_len);
  hd[h->head_len] = '\0';
  *head = hd;
  *head_len = h->head_len;
  char *t = xmalloc(h->tail_len + 1);
  size_t first = CM_MIN(h->tail_len, h->tail_max - h->tail_start);
  if (h->tail_len) {
    memcpy(t, h->tail + h->tail_start, first);
    memcpy(t + first, h->tail, h->tail_len - first);
  }
  t[h->tail_len] = '\0';
  *tail = t;
  *tail_len = h->tail_len;
}
