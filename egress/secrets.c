/* Secrets: their values' memory, placeholders, and the rewriting of a request head (see
 * egress.h).  The rewriting is pure ((buf, len) in, a buffer out) and fuzzed
 * (tests/fuzz/fuzz_egress_http.c). */
#include <errno.h>
#include <stdio.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "egress/egress.h"

void eg_secret_value_wipe(eg_secret_value_t *v) {
  if (v->data) {
    explicit_bzero(v->data, v->mapped);
    munmap(v->data, v->mapped);
  }
  memset(v, 0, sizeof *v);
}

void eg_secret_value_set(eg_secret_value_t *v, const char *value, size_t len) {
  eg_secret_value_wipe(v);
  if (len > EG_SECRET_VALUE_MAX) len = EG_SECRET_VALUE_MAX;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t mapped = (len + 1 + page - 1) / page * page;
  void *m = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) abort(); /* like any allocation failure */
  /* Out of core dumps, and (where the limit allows) never swapped out. */
  (void)madvise(m, mapped, MADV_DONTDUMP);
  (void)mlock(m, mapped);
  memcpy(m, value, len);
  ((char *)m)[len] = '\0';
  v->data = m;
  v->len = len;
  v->mapped = mapped;
}

bool eg_secret_name_ok(const char *name, size_t len) {
  if (len < 1 || len > EG_SECRET_NAME_MAX || !(name[0] >= 'A' && name[0] <= 'Z')) return false;
  for (size_t i = 1; i < len; i++) {
    char c = name[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

void eg_secret_placeholder(const char *name, char *out, size_t out_size) {
  uint8_t rnd[16];
  size_t got = 0;
  while (got < sizeof rnd) {
    ssize_t r = getrandom(rnd + got, sizeof rnd - got, 0);
    if (r < 0 && errno != EINTR) abort(); /* no randomness: nothing may be guessed */
    if (r > 0) got += (size_t)r;
  }
  char hex[33];
  for (size_t i = 0; i < sizeof rnd; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  snprintf(out, out_size, EG_SECRET_PREFIX "%s:%s", name, hex);
}

/* ---------------------------------------------------------------- matching */

/* Does a placeholder start at hay[i]?  With pct, a ':' of it may also be spelt "%3A" (a
 * percent-encoded query parameter).  The length matched in *mlen. */
static bool match_at(const char *hay, size_t len, size_t i, const char *ph, size_t ph_len, bool pct,
                     size_t *mlen) {
  size_t j = i;
  for (size_t k = 0; k < ph_len; k++) {
    if (j < len && hay[j] == ph[k]) {
      j++;
      continue;
    }
    if (pct && ph[k] == ':' && j + 3 <= len && hay[j] == '%' && hay[j + 1] == '3' &&
        (hay[j + 2] == 'A' || hay[j + 2] == 'a')) {
      j += 3;
      continue;
    }
    return false;
  }
  *mlen = j - i;
  return true;
}

static size_t count(const char *hay, size_t len, const char *ph, size_t ph_len, bool pct) {
  size_t m, n = 0;
  for (size_t i = 0; i < len; i++)
    if (hay[i] == ph[0] && match_at(hay, len, i, ph, ph_len, pct, &m)) n++;
  return n;
}

static bool contains(const char *hay, size_t len, const char *ph, size_t ph_len, bool pct) {
  return count(hay, len, ph, ph_len, pct) > 0;
}

typedef enum { ENC_NONE, ENC_TARGET, ENC_PCT } enc_t;

static void append_value(cm_buf_t *out, const char *v, size_t n, enc_t enc) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)v[i];
    bool plain = enc == ENC_NONE || (enc == ENC_TARGET && c > 0x20 && c < 0x7f && c != '#') ||
                 (enc == ENC_PCT &&
                  ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '.' || c == '_' || c == '~'));
    if (plain)
      cm_buf_append(out, v + i, 1);
    else
      cm_buf_printf(out, "%%%02X", c);
  }
}

/* hay with every bound placeholder replaced, appended to out.  -1 (and *refused) when an unbound
 * one is in it. */
static int replace(const char *hay, size_t len, const eg_secret_binding_t *b, size_t n, bool target,
                   cm_buf_t *out, uint64_t *used, size_t *refused, size_t *replaced) {
  for (size_t k = 0; k < n; k++)
    if ((!b[k].bound || !b[k].value) &&
        contains(hay, len, b[k].placeholder, b[k].placeholder_len, target)) {
      *refused = k;
      return -1;
    }
  size_t i = 0, from = 0;
  while (i < len) {
    size_t m = 0, k = n;
    if (hay[i] == 'm')
      for (k = 0; k < n; k++)
        if (match_at(hay, len, i, b[k].placeholder, b[k].placeholder_len, target, &m)) break;
    if (k == n) {
      i++;
      continue;
    }
    cm_buf_append(out, hay + from, i - from);
    bool pct = m != b[k].placeholder_len;
    append_value(out, b[k].value, b[k].value_len, !target ? ENC_NONE : pct ? ENC_PCT : ENC_TARGET);
    if (k < 64) *used |= 1ull << k;
    if (replaced) replaced[k]++;
    i += m;
    from = i;
  }
  cm_buf_append(out, hay + from, len - from);
  return 0;
}

/* ---------------------------------------------------------------- base64 */

static int b64_val(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decodes standard base64 (padding optional); -1 when it is not. */
static int b64_decode(const char *s, size_t n, cm_buf_t *out) {
  while (n && s[n - 1] == '=') n--;
  if (n % 4 == 1) return -1;
  unsigned acc = 0, bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64_val(s[i]);
    if (v < 0) return -1;
    acc = (acc << 6) | (unsigned)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      char c = (char)((acc >> bits) & 0xff);
      cm_buf_append(out, &c, 1);
    }
  }
  return 0;
}

static void b64_encode(const char *s, size_t n, cm_buf_t *out) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned)(unsigned char)s[i] << 16;
    if (i + 1 < n) v |= (unsigned)(unsigned char)s[i + 1] << 8;
    if (i + 2 < n) v |= (unsigned char)s[i + 2];
    char q[4] = {tbl[(v >> 18) & 63], tbl[(v >> 12) & 63], i + 1 < n ? tbl[(v >> 6) & 63] : '=',
                 i + 2 < n ? tbl[v & 63] : '='};
    cm_buf_append(out, q, 4);
  }
}

static void wipe_buf(cm_buf_t *b) {
  if (b->data) explicit_bzero(b->data, b->len);
  cm_buf_release(b);
}

/* An `Authorization: Basic` value: the placeholders inside its base64 replaced (and it
 * re-encoded), appended to out.  0 = nothing inside (out untouched), 1 = appended, -1 = refused. */
static int basic_value(const char *v, size_t len, const eg_secret_binding_t *b, size_t n,
                       cm_buf_t *out, uint64_t *used, size_t *refused) {
  if (len < 6 || strncasecmp(v, "basic ", 6) != 0) return 0;
  size_t start = 6;
  while (start < len && v[start] == ' ') start++;
  cm_buf_t plain, replaced;
  cm_buf_init(&plain, 0);
  cm_buf_init(&replaced, 0);
  int rc = 0;
  if (b64_decode(v + start, len - start, &plain) == 0 && plain.len) {
    bool any = false;
    for (size_t k = 0; k < n && !any; k++)
      any = contains(plain.data, plain.len, b[k].placeholder, b[k].placeholder_len, false);
    if (any) {
      rc = replace(plain.data, plain.len, b, n, false, &replaced, used, refused, NULL);
      if (rc == 0) {
        cm_buf_append(out, v, start);
        b64_encode(replaced.data, replaced.len, out);
        rc = 1;
      }
    }
  }
  wipe_buf(&plain);
  wipe_buf(&replaced);
  return rc;
}

static bool span_is(const char *buf, eg_span_t s, const char *name) {
  return s.len == strlen(name) && strncasecmp(buf + s.off, name, s.len) == 0;
}

int eg_secret_rewrite_head(const char *buf, const eg_request_t *req, const eg_secret_binding_t *b,
                           size_t n, cm_buf_t *out, uint64_t *used, size_t *refused) {
  *used = 0;
  *refused = n;
  if (n > EG_SECRET_BINDINGS_MAX) n = EG_SECRET_BINDINGS_MAX;
  /* A placeholder that may not go here, anywhere in the head (however the head's syntax cuts
   * it up): refused. */
  for (size_t k = 0; k < n; k++)
    if ((!b[k].bound || !b[k].value) &&
        contains(buf, req->head_len, b[k].placeholder, b[k].placeholder_len, true)) {
      *refused = k;
      return -1;
    }
  bool any = false;
  for (size_t k = 0; k < n && !any; k++)
    any = contains(buf, req->head_len, b[k].placeholder, b[k].placeholder_len, true);
  /* Inside a Basic value (base64 hides it from a plain search). */
  for (size_t i = 0; i < req->n_headers && !any; i++) {
    const eg_header_t *h = &req->headers[i];
    if (!span_is(buf, h->name, "authorization")) continue;
    cm_buf_t probe;
    cm_buf_init(&probe, 0);
    uint64_t u = 0;
    size_t r = n;
    int rc = basic_value(buf + h->value.off, h->value.len, b, n, &probe, &u, &r);
    wipe_buf(&probe);
    any = rc != 0;
  }
  if (!any) return 0;
  cm_buf_t tmp;
  cm_buf_init(&tmp, 0);
  size_t replaced[EG_SECRET_BINDINGS_MAX] = {0};
  /* The request line: up to the target, the target, the rest of the line. */
  size_t eol = 0;
  while (eol + 1 < req->head_len && !(buf[eol] == '\r' && buf[eol + 1] == '\n')) eol++;
  size_t t_off = req->path.len ? req->path.off : eol, t_len = req->path.len;
  int rc = 0;
  /* An absolute-form target's authority may not carry one either. */
  if (req->form == EG_FORM_ABSOLUTE) {
    for (size_t k = 0; k < n && rc == 0; k++)
      if (contains(buf, t_off, b[k].placeholder, b[k].placeholder_len, true)) {
        *refused = k;
        rc = -1;
      }
  }
  if (rc == 0) {
    cm_buf_append(&tmp, buf, t_off);
    rc = replace(buf + t_off, t_len, b, n, true, &tmp, used, refused, replaced);
  }
  if (rc == 0) {
    cm_buf_append(&tmp, buf + t_off + t_len, eol - t_off - t_len);
    cm_buf_appends(&tmp, "\r\n");
  }
  for (size_t i = 0; i < req->n_headers && rc == 0; i++) {
    const eg_header_t *h = &req->headers[i];
    for (size_t k = 0; k < n && rc == 0; k++)
      if (contains(buf + h->name.off, h->name.len, b[k].placeholder, b[k].placeholder_len, false)) {
        *refused = k;
        rc = -1;
      }
    if (rc < 0) break;
    cm_buf_append(&tmp, buf + h->name.off, h->name.len);
    cm_buf_appends(&tmp, ": ");
    int brc = span_is(buf, h->name, "authorization")
                  ? basic_value(buf + h->value.off, h->value.len, b, n, &tmp, used, refused)
                  : 0;
    if (brc < 0) {
      rc = -1;
      break;
    }
    if (brc == 0)
      rc = replace(buf + h->value.off, h->value.len, b, n, false, &tmp, used, refused, replaced);
    cm_buf_appends(&tmp, "\r\n");
  }
  /* Every occurrence was replaced: none sat where nothing is substituted (a header's name,
   * across a name and its value). */
  for (size_t k = 0; k < n && rc == 0; k++)
    if (count(buf, req->head_len, b[k].placeholder, b[k].placeholder_len, true) != replaced[k]) {
      *refused = k;
      rc = -1;
    }
  if (rc == 0) {
    cm_buf_appends(&tmp, "\r\n");
    if (tmp.len > EG_HEAD_MAX) {
      *refused = n;
      rc = -1;
    } else {
      cm_buf_append(out, tmp.data, tmp.len);
      rc = 1;
    }
  }
  wipe_buf(&tmp);
  return rc;
}
