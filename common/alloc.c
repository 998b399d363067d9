#include <stdio.h>

#include "common/cm.h"

static void oom(size_t n) {
  /* Nothing sensible can continue without memory; every input-controlled size is
   * capped before it reaches an allocation, so this is a true exhaustion. */
  char msg[96];
  int len = snprintf(msg, sizeof msg, "fatal: out of memory allocating %zu bytes\n", n);
  if (len > 0) (void)!write(2, msg, (size_t)len);
  abort();
}

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) oom(n);
  return p;
}

void *xcalloc(size_t count, size_t n) {
  void *p = calloc(count ? count : 1, n ? n : 1);
  if (p == NULL) oom(count * n);
  return p;
}

void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (q == NULL) oom(n);
  return q;
}

char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  if (p == NULL) oom(strlen(s));
  return p;
}

char *xstrndup(const char *s, size_t n) {
  char *p = xmalloc(n + 1);
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

void *xmemdup(const void *src, size_t n) {
  void *p = xmalloc(n);
  if (n) memcpy(p, src, n);
  return p;
}

char *xvasprintf(const char *fmt, va_list ap) {
  char *out = NULL;
  if (vasprintf(&out, fmt, ap) < 0) oom(0);
  return out;
}

char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *out = xvasprintf(fmt, ap);
  va_end(ap);
  return out;
}

void cm_strv_free(char **v) {
  if (v == NULL) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

size_t cm_strv_len(char *const *v) {
  size_t n = 0;
  while (v && v[n]) n++;
  return n;
}

char **cm_strv_dup(char *const *v) {
  size_t n = cm_strv_len(v);
  char **out = xcalloc(n + 1, sizeof *out);
  for (size_t i = 0; i < n; i++) out[i] = xstrdup(v[i]);
  return out;
}

void cm_strv_add(cm_strv_builder_t *b, const char *s) {
  if (b->n + 2 > b->cap) {
    b->cap = b->cap ? b->cap * 2 : 16;
    b->v = xrealloc(b->v, b->cap * sizeof *b->v);
  }
  b->v[b->n++] = xstrdup(s);
  b->v[b->n] = NULL;
}

void cm_strv_addv(cm_strv_builder_t *b, ...) {
  va_list ap;
  va_start(ap, b);
  for (const char *s; (s = va_arg(ap, const char *));) cm_strv_add(b, s);
  va_end(ap);
}

void cm_strv_addf(cm_strv_builder_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = xvasprintf(fmt, ap);
  va_end(ap);
  cm_strv_add(b, s);
  free(s);
}

char **cm_strv_steal(cm_strv_builder_t *b) {
  char **v = b->v ? b->v : xcalloc(1, sizeof(char *));
  b->v = NULL;
  b->n = b->cap = 0;
  return v;
}
