/* The pure parts of the HTTP transport (transport-internal.h): headers, host and origin
 * names, event ids, bearer tokens, session ids.  They take (buf, len) and touch neither
 * libmicrohttpd nor the loop, so fuzz targets call them directly. */
#include <arpa/inet.h>
#include <stdio.h>

#include "transport/transport-internal.h"

static bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

static void trim(const char **p, size_t *n) {
  while (*n && is_ows(**p)) (*p)++, (*n)--;
  while (*n && is_ows((*p)[*n - 1])) (*n)--;
}

static bool ieq(const char *a, size_t alen, const char *b) {
  size_t blen = strlen(b);
  return alen == blen && strncasecmp(a, b, alen) == 0;
}

/* q=0 (or 0.0, 0.00, 0.000) in the parameters of one Accept element. */
static bool q_is_zero(const char *p, size_t n) {
  while (n) {
    const char *semi = memchr(p, ';', n);
    size_t seg = semi ? (size_t)(semi - p) : n;
    const char *s = p;
    size_t sn = seg;
    trim(&s, &sn);
    if (sn >= 2 && (s[0] == 'q' || s[0] == 'Q') && s[1] == '=') {
      const char *v = s + 2;
      size_t vn = sn - 2;
      if (vn == 0 || v[0] != '0') return false;
      for (size_t i = 1; i < vn; i++)
        if (v[i] != '0' && v[i] != '.') return false;
      return true;
    }
    if (!semi) break;
    p += seg + 1;
    n -= seg + 1;
  }
  return false;
}

void tr_http_parse_accept(const char *buf, size_t len, bool *json, bool *sse) {
  *json = false;
  *sse = false;
  while (len) {
    const char *comma = memchr(buf, ',', len);
    size_t el = comma ? (size_t)(comma - buf) : len;
    const char *e = buf;
    size_t en = el;
    const char *semi = memchr(e, ';', en);
    size_t tn = semi ? (size_t)(semi - e) : en;
    const char *t = e;
    trim(&t, &tn);
    bool zero = semi ? q_is_zero(semi + 1, en - (size_t)(semi - e) - 1) : false;
    if (!zero) {
      if (ieq(t, tn, "*/*")) *json = *sse = true;
      if (ieq(t, tn, "application/json") || ieq(t, tn, "application/*")) *json = true;
      if (ieq(t, tn, "text/event-stream") || ieq(t, tn, "text/*")) *sse = true;
    }
    if (!comma) break;
    buf += el + 1;
    len -= el + 1;
  }
}

bool tr_http_media_type_is(const char *buf, size_t len, const char *type) {
  const char *semi = memchr(buf, ';', len);
  size_t n = semi ? (size_t)(semi - buf) : len;
  trim(&buf, &n);
  return ieq(buf, n, type);
}

static bool host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

static bool all_digits(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] < '0' || p[i] > '9') return false;
  return true;
}

int tr_http_host_name(const char *buf, size_t len, char *out, size_t out_size) {
  const char *name;
  size_t n;
  trim(&buf, &len);
  if (len == 0) return -1;
  if (buf[0] == '[') {
    const char *close = memchr(buf, ']', len);
    if (!close) return -1;
    name = buf + 1;
    n = (size_t)(close - name);
    size_t rest = len - (size_t)(close - buf) - 1;
    const char *r = close + 1;
    if (rest && (r[0] != ':' || !all_digits(r + 1, rest - 1) || rest > 6)) return -1;
    for (size_t i = 0; i < n; i++) {
      char c = name[i];
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
            c == ':' || c == '.'))
        return -1;
    }
  } else {
    const char *colon = memchr(buf, ':', len);
    name = buf;
    n = colon ? (size_t)(colon - buf) : len;
    if (colon) {
      size_t rest = len - n - 1;
      if (!all_digits(colon + 1, rest) || rest > 5) return -1;
    }
    for (size_t i = 0; i < n; i++)
      if (!host_char(name[i])) return -1;
    if (n > 1 && name[n - 1] == '.') n--;
  }
  if (n == 0 || n >= out_size) return -1;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    out[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
  }
  out[n] = '\0';
  return 0;
}

int tr_http_origin_parse(const char *buf, size_t len, char scheme[32], char *host, size_t host_size,
                         unsigned *port) {
  trim(&buf, &len);
  size_t i = 0;
  while (i < len && ((buf[i] >= 'a' && buf[i] <= 'z') || (buf[i] >= 'A' && buf[i] <= 'Z') ||
                     (i > 0 && ((buf[i] >= '0' && buf[i] <= '9') || buf[i] == '+' ||
                                buf[i] == '-' || buf[i] == '.'))))
    i++;
  if (i == 0 || i > 31 || len - i < 3 || memcmp(buf + i, "://", 3) != 0) return -1;
  for (size_t k = 0; k < i; k++)
    scheme[k] = (buf[k] >= 'A' && buf[k] <= 'Z') ? (char)(buf[k] - 'A' + 'a') : buf[k];
  scheme[i] = '\0';
  const char *auth = buf + i + 3;
  size_t an = len - i - 3;
  if (an && auth[an - 1] == '/') an--; /* some clients send "http://host/" */
  if (memchr(auth, '@', an) || memchr(auth, '/', an)) return -1;
  if (tr_http_host_name(auth, an, host, host_size) < 0) return -1;
  /* tr_http_host_name checked the port's digits (and that there are at most 5). */
  const char *close = an && auth[0] == '[' ? memchr(auth, ']', an) : NULL;
  const char *colon = close ? (close + 1 < auth + an ? close + 1 : NULL) : memchr(auth, ':', an);
  uint64_t p = 0;
  if (colon && colon + 1 < auth + an) {
    for (const char *d = colon + 1; d < auth + an; d++) p = p * 10 + (uint64_t)(*d - '0');
    if (p == 0 || p > 65535) return -1;
  } else if (strcmp(scheme, "http") == 0) {
    p = 80;
  } else if (strcmp(scheme, "https") == 0) {
    p = 443;
  }
  *port = (unsigned)p;
  return 0;
}

int tr_http_origin_host(const char *buf, size_t len, char *out, size_t out_size) {
  char scheme[32];
  unsigned port;
  return tr_http_origin_parse(buf, len, scheme, out, out_size, &port);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void tr_http_attachment_name(const char *buf, size_t len, char *out, size_t out_size) {
  size_t max = out_size ? CM_MIN(out_size - 1, (size_t)128) : 0;
  if (!out_size) return;
  const char *slash = len ? memrchr(buf, '/', len) : NULL;
  const char *p = slash ? slash + 1 : buf;
  size_t n = len - (size_t)(p - buf);
  size_t o = 0;
  for (size_t i = 0; i < n && o < max; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c == '%' && i + 2 < n && hex_value(p[i + 1]) >= 0 && hex_value(p[i + 2]) >= 0) {
      c = (unsigned char)(hex_value(p[i + 1]) * 16 + hex_value(p[i + 2]));
      i += 2;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '+' || c == '-';
    if (c == '.' && o == 0) continue; /* no hidden or "..": a leading dot goes */
    out[o++] = ok ? (char)c : '_';
  }
  out[o] = '\0';
  if (o == 0) snprintf(out, out_size, "%s", "download");
}

bool tr_http_loopback_name(const char *name) {
  if (strcmp(name, "localhost") == 0) return true;
  struct in_addr a4;
  if (inet_pton(AF_INET, name, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  struct in6_addr a6;
  if (inet_pton(AF_INET6, name, &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return false;
}

static int parse_dec(const char *p, size_t n, uint64_t *out) {
  if (n == 0 || n > 19 || !all_digits(p, n)) return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) v = v * 10 + (uint64_t)(p[i] - '0');
  *out = v;
  return 0;
}

int tr_http_parse_event_id(const char *buf, size_t len, uint64_t *stream, uint64_t *seq) {
  trim(&buf, &len);
  const char *dash = memchr(buf, '-', len);
  if (!dash) return -1;
  size_t a = (size_t)(dash - buf);
  if (parse_dec(buf, a, stream) < 0) return -1;
  return parse_dec(dash + 1, len - a - 1, seq);
}

void tr_http_sse_event(cm_buf_t *out, const char *event, bool with_id, uint64_t stream,
                       uint64_t seq, const char *data, size_t len) {
  if (with_id)
    cm_buf_printf(out, "id: %llu-%llu\n", (unsigned long long)stream, (unsigned long long)seq);
  if (event) cm_buf_printf(out, "event: %s\n", event);
  size_t i = 0;
  for (;;) {
    size_t j = i;
    while (j < len && data[j] != '\n' && data[j] != '\r') j++;
    cm_buf_append(out, "data: ", 6);
    cm_buf_append(out, data + i, j - i);
    cm_buf_append(out, "\n", 1);
    if (j >= len) break;
    if (data[j] == '\r' && j + 1 < len && data[j + 1] == '\n') j++;
    i = j + 1;
  }
  cm_buf_append(out, "\n", 1);
}

int tr_http_bearer_token(const char *buf, size_t len, const char **token, size_t *token_len) {
  trim(&buf, &len);
  if (len < 7 || strncasecmp(buf, "bearer", 6) != 0 || !is_ows(buf[6])) return -1;
  const char *t = buf + 7;
  size_t n = len - 7;
  trim(&t, &n);
  if (n == 0) return -1;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)t[i] <= 0x20 || (unsigned char)t[i] >= 0x7f) return -1;
  *token = t;
  *token_len = n;
  return 0;
}

void tr_http_tokens_free(tr_http_token_t *tokens, size_t count) {
  if (!tokens) return;
  for (size_t i = 0; i < count; i++) free(tokens[i].name);
  explicit_bzero(tokens, count * sizeof *tokens);
  free(tokens);
}

int tr_http_parse_tokens(const char *buf, size_t len, tr_http_token_t **tokens, size_t *count,
                         cm_error_t *err) {
  tr_http_token_t *out = NULL;
  size_t n = 0, cap = 0;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < len) {
    const char *nl = memchr(buf + pos, '\n', len - pos);
    size_t ln = nl ? (size_t)(nl - (buf + pos)) : len - pos;
    const char *line = buf + pos;
    pos += ln + 1;
    line_no++;
    if (ln && line[ln - 1] == '\r') ln--;
    trim(&line, &ln);
    if (ln == 0 || line[0] == '#') continue;
    const char *colon = memchr(line, ':', ln);
    const char *tok = line;
    size_t tn = ln;
    const char *name = NULL;
    size_t nn = 0;
    if (colon) {
      name = line;
      nn = (size_t)(colon - line);
      trim(&name, &nn);
      tok = colon + 1;
      tn = (size_t)(line + ln - tok);
      trim(&tok, &tn);
    }
    if (tn == 0) {
      tr_http_tokens_free(out, n);
      return cm_error_set(err, 0, CM_ERR_INVALID, "token file line %zu: empty token", line_no);
    }
    for (size_t i = 0; i < tn; i++) {
      if ((unsigned char)tok[i] <= 0x20 || (unsigned char)tok[i] >= 0x7f) {
        tr_http_tokens_free(out, n);
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "token file line %zu: a token must be visible ASCII", line_no);
      }
    }
    /* "line N" names the unnamed token of line N: given to another, it would make the two
     * one tenant. */
    if (nn > 5 && memcmp(name, "line ", 5) == 0 && all_digits(name + 5, nn - 5)) {
      tr_http_tokens_free(out, n);
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "token file line %zu: the name '%.*s' is the one an unnamed token gets; "
                          "choose another",
                          line_no, (int)nn, name);
    }
    /* "stdio" is the stdio client's principal, which the server also names what has no
     * session any more: a token of that name would be that tenant. */
    if (nn == 5 && memcmp(name, "stdio", 5) == 0) {
      tr_http_tokens_free(out, n);
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "token file line %zu: the name 'stdio' is the stdio client's; choose "
                          "another",
                          line_no);
    }
    if (n == TR_HTTP_MAX_TOKENS) {
      tr_http_tokens_free(out, n);
      return cm_error_set(err, 0, CM_ERR_LIMIT, "token file: more than %d tokens",
                          TR_HTTP_MAX_TOKENS);
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      out = xrealloc(out, cap * sizeof *out);
    }
    out[n].name = nn ? xstrndup(name, nn) : xasprintf("line %zu", line_no);
    out[n].unnamed = nn == 0;
    cm_sha256(tok, tn, out[n].sha256);
    n++;
  }
  if (n == 0) {
    free(out);
    return cm_error_set(err, 0, CM_ERR_INVALID, "token file holds no token");
  }
  *tokens = out;
  *count = n;
  return 0;
}

const tr_http_token_t *tr_http_token_match(const tr_http_token_t *tokens, size_t count,
                                           const char *token, size_t token_len) {
  unsigned char digest[CM_SHA256_SIZE];
  cm_sha256(token, token_len, digest);
  const tr_http_token_t *found = NULL;
  for (size_t i = 0; i < count; i++) {
    /* No early exit: the time taken does not depend on which token matched. */
    if (cm_memeq_ct(digest, tokens[i].sha256, CM_SHA256_SIZE) && !found) found = &tokens[i];
  }
  return found;
}

bool tr_http_session_id_valid(const char *buf, size_t len) {
  if (len == 0 || len > 128) return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)buf[i] < 0x21 || (unsigned char)buf[i] > 0x7e) return false;
  return true;
}

/* A base64 digit's value, or -1. */
static int base64_digit(unsigned char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

/* Strict RFC 4648 base64 (padded, no line breaks, zero pad bits) into out; -1 when it is
 * not that or when the decoded bytes would not fit out_size - 1. */
static int base64_decode(const char *buf, size_t len, char *out, size_t out_size, size_t *out_len) {
  if (len == 0 || len % 4 != 0) return -1;
  size_t pad = buf[len - 1] == '=' ? (buf[len - 2] == '=' ? 2 : 1) : 0;
  size_t n = len / 4 * 3 - pad;
  if (n >= out_size) return -1;
  size_t o = 0;
  for (size_t i = 0; i < len; i += 4) {
    int d[4];
    for (size_t k = 0; k < 4; k++) {
      bool padding = i + k >= len - pad;
      d[k] = padding ? (buf[i + k] == '=' ? 0 : -1) : base64_digit((unsigned char)buf[i + k]);
      if (d[k] < 0) return -1;
    }
    uint32_t v = (uint32_t)d[0] << 18 | (uint32_t)d[1] << 12 | (uint32_t)d[2] << 6 | (uint32_t)d[3];
    /* Bits the padding hides must be zero: one text per value. */
    if ((pad == 1 && i + 4 == len && (v & 0xff)) || (pad == 2 && i + 4 == len && (v & 0xffff)))
      return -1;
    out[o++] = (char)(v >> 16);
    if (o < n) out[o++] = (char)(v >> 8 & 0xff);
    if (o < n) out[o++] = (char)(v & 0xff);
  }
  *out_len = n;
  out[n] = '\0';
  return 0;
}

int tr_http_mcp_header_value(const char *buf, size_t len, char *out, size_t out_size,
                             size_t *out_len) {
  if (out_size == 0) return -1;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)buf[i];
    if (ch != '\t' && (ch < 0x20 || ch > 0x7e)) return -1;
  }
  /* Optional whitespace around a field value is not part of it (RFC 9110, 5.5). */
  while (len && (buf[0] == ' ' || buf[0] == '\t')) buf++, len--;
  while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t')) len--;
  static const char prefix[] = "=?base64?", suffix[] = "?=";
  size_t pl = sizeof prefix - 1, sl = sizeof suffix - 1;
  if (len >= pl + sl && memcmp(buf, prefix, pl) == 0 && memcmp(buf + len - sl, suffix, sl) == 0) {
    if (base64_decode(buf + pl, len - pl - sl, out, out_size, out_len) < 0) return -1;
    /* Text: UTF-8, and no NUL (the value is compared as a C string's bytes). */
    if (!cm_utf8_valid(out, *out_len) || memchr(out, '\0', *out_len)) return -1;
    return 0;
  }
  if (len >= out_size) return -1;
  memcpy(out, buf, len);
  out[len] = '\0';
  *out_len = len;
  return 0;
}
