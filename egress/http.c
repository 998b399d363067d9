/* The proxy's parsers: HTTP/1.x request and response heads, SOCKS5 greetings and requests,
 * http(s) URLs and a URL as an allow rule (see egress.h).  Pure: every input by (buf, len), never
 * trusting a terminator; heads are bounded by EG_HEAD_MAX and EG_MAX_HEADERS. */
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/socket.h>

#include "egress/egress-internal.h"

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* RFC 9110 tchar. */
static bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c)) return true;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool span_ieq(const char *buf, eg_span_t s, const char *lit) {
  size_t n = strlen(lit);
  if (s.len != n) return false;
  for (size_t i = 0; i < n; i++)
    if (lower(buf[s.off + i]) != lit[i]) return false;
  return true;
}

/* The end of the head (the offset after CRLF CRLF) within the first EG_HEAD_MAX bytes:
 * >0 found, 0 not yet, -1 too large. */
static long find_head_end(const char *buf, size_t len) {
  size_t lim = len < EG_HEAD_MAX ? len : EG_HEAD_MAX;
  for (size_t i = 0; i < lim; i++) {
    if (buf[i] != '\n') continue;
    if (i == 0 || buf[i - 1] != '\r') return -1; /* a bare LF: not from an HTTP client of ours */
    if (i >= 3 && buf[i - 2] == '\n' && buf[i - 3] == '\r') return (long)(i + 1);
  }
  return len >= EG_HEAD_MAX ? -1 : 0;
}

/* Header lines from off to the end of the head (end points after the blank line). */
static int parse_headers(const char *buf, size_t off, size_t end, eg_header_t *hs, size_t *n,
                         size_t max) {
  *n = 0;
  while (off + 2 <= end) {
    if (buf[off] == '\r' && buf[off + 1] == '\n') return off + 2 == end ? 0 : -1;
    size_t eol = off;
    while (eol + 1 < end && !(buf[eol] == '\r' && buf[eol + 1] == '\n')) eol++;
    if (eol + 1 >= end) return -1;
    size_t colon = off;
    while (colon < eol && is_tchar(buf[colon])) colon++;
    if (colon == off || colon >= eol || buf[colon] != ':') return -1; /* also obs-fold */
    if (*n >= max) return -1;
    size_t v = colon + 1, ve = eol;
    while (v < ve && (buf[v] == ' ' || buf[v] == '\t')) v++;
    while (ve > v && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t')) ve--;
    for (size_t i = v; i < ve; i++) {
      unsigned char c = (unsigned char)buf[i];
      if ((c < 0x20 && c != '\t') || c == 0x7f) return -1;
    }
    hs[*n] = (eg_header_t){{off, colon - off}, {v, ve - v}};
    (*n)++;
    off = eol + 2;
  }
  return -1;
}

static int parse_port_text(const char *p, size_t n, uint16_t *port) {
  if (n == 0 || n > 5) return -1;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(p[i])) return -1;
    v = v * 10 + (unsigned)(p[i] - '0');
  }
  if (v == 0 || v > 65535) return -1;
  *port = (uint16_t)v;
  return 0;
}

/* host[:port] or [v6][:port]; default_port 0 = the port is required. */
static int parse_authority(const char *p, size_t n, uint16_t default_port, char *host,
                           size_t host_size, uint16_t *port) {
  const char *h = p;
  size_t hl;
  const char *rest;
  if (n > 0 && p[0] == '[') {
    const char *close = memchr(p, ']', n);
    if (!close) return -1;
    h = p + 1;
    hl = (size_t)(close - p) - 1;
    rest = close + 1;
    if (!memchr(h, ':', hl)) return -1;
  } else {
    const char *c = memchr(p, ':', n);
    hl = c ? (size_t)(c - p) : n;
    rest = p + hl;
  }
  size_t rl = n - (size_t)(rest - p);
  if (rl > 0) {
    if (rest[0] != ':' || parse_port_text(rest + 1, rl - 1, port) < 0) return -1;
  } else {
    if (!default_port) return -1;
    *port = default_port;
  }
  if (hl == 0 || eg_host_parse(h, hl, host, host_size) < 0) return -1;
  return 0;
}

static bool target_char_ok(unsigned char c) {
  return c > 0x20 && c != 0x7f;
}

int eg_http_parse_request(const char *buf, size_t len, eg_request_t *req) {
  memset(req, 0, sizeof *req);
  long end = find_head_end(buf, len);
  if (end <= 0) return (int)end;
  req->head_len = (size_t)end;
  size_t i = 0;
  while (i < (size_t)end && is_tchar(buf[i])) i++;
  if (i == 0 || i > 32 || buf[i] != ' ') return -1;
  req->method = (eg_span_t){0, i};
  size_t t = ++i;
  while (i < (size_t)end && target_char_ok((unsigned char)buf[i])) i++;
  if (i == t || buf[i] != ' ') return -1;
  eg_span_t target = {t, i - t};
  i++;
  if ((size_t)end - i < 10 || memcmp(buf + i, "HTTP/1.", 7) != 0 || !is_digit(buf[i + 7]) ||
      buf[i + 8] != '\r' || buf[i + 9] != '\n')
    return -1;
  req->minor_version = buf[i + 7] - '0';
  const char *tp = buf + target.off;
  if (span_ieq(buf, req->method, "connect")) {
    req->form = EG_FORM_AUTHORITY;
    if (parse_authority(tp, target.len, 0, req->host, sizeof req->host, &req->port) < 0) return -1;
  } else if (target.len >= 7 && span_ieq(buf, (eg_span_t){target.off, 7}, "http://")) {
    req->form = EG_FORM_ABSOLUTE;
    size_t a = 7, ae = a;
    while (ae < target.len && tp[ae] != '/' && tp[ae] != '?' && tp[ae] != '#') ae++;
    if (memchr(tp + a, '@', ae - a)) return -1; /* no credentials in a proxied URI */
    if (parse_authority(tp + a, ae - a, 80, req->host, sizeof req->host, &req->port) < 0) return -1;
    size_t pe = ae;
    while (pe < target.len && tp[pe] != '#') pe++;
    req->path = (eg_span_t){target.off + ae, pe - ae};
  } else if (tp[0] == '/') {
    req->form = EG_FORM_ORIGIN;
    req->path = target;
  } else {
    return -1; /* https:// (clients CONNECT for TLS), '*', other schemes */
  }
  if (parse_headers(buf, i + 10, (size_t)end, req->headers, &req->n_headers, EG_MAX_HEADERS) < 0)
    return -1;
  return 1;
}

int eg_http_parse_response_limit(const char *buf, size_t len, eg_response_t *resp,
                                 size_t max_headers) {
  if (max_headers > EG_MAX_HEADERS) max_headers = EG_MAX_HEADERS;
  memset(resp, 0, sizeof *resp);
  long end = find_head_end(buf, len);
  if (end <= 0) return (int)end;
  resp->head_len = (size_t)end;
  if (end < 14 || memcmp(buf, "HTTP/1.", 7) != 0 || !is_digit(buf[7]) || buf[8] != ' ' ||
      !is_digit(buf[9]) || !is_digit(buf[10]) || !is_digit(buf[11]))
    return -1;
  resp->status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
  size_t i = 12;
  while (i + 1 < (size_t)end && !(buf[i] == '\r' && buf[i + 1] == '\n')) {
    unsigned char c = (unsigned char)buf[i];
    if ((c < 0x20 && c != '\t') || c == 0x7f) return -1;
    i++;
  }
  if (i + 1 >= (size_t)end) return -1;
  if (parse_headers(buf, i + 2, (size_t)end, resp->headers, &resp->n_headers, max_headers) < 0)
    return -1;
  return 1;
}

int eg_http_parse_response(const char *buf, size_t len, eg_response_t *resp) {
  /* One fewer than a request may have: the head the proxy forwards adds "Connection: close",
   * and must still be a head within the limits (it is parsed again by whoever checks it). */
  return eg_http_parse_response_limit(buf, len, resp, EG_MAX_HEADERS - 1);
}

/* Does the comma-separated list in value name `name` (case-insensitive)? */
static bool list_has(const char *buf, eg_span_t value, const char *name, size_t name_len) {
  size_t i = value.off, end = value.off + value.len;
  while (i < end) {
    while (i < end && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == ',')) i++;
    size_t s = i;
    while (i < end && buf[i] != ',') i++;
    size_t e = i;
    while (e > s && (buf[e - 1] == ' ' || buf[e - 1] == '\t')) e--;
    if (e - s == name_len) {
      bool eq = true;
      for (size_t k = 0; k < name_len && eq; k++) eq = lower(buf[s + k]) == lower(name[k]);
      if (eq) return true;
    }
  }
  return false;
}

bool eg_http_hop_header(const char *buf, const eg_header_t *headers, size_t n_headers,
                        const eg_header_t *h) {
  /* ("Close" is reserved (RFC 9110 16.3.2.1): in a head that says "Connection: close" it
   * would be a connection option's field.) */
  static const char *const hop[] = {"connection",
                                    "keep-alive",
                                    "proxy-connection",
                                    "proxy-authenticate",
                                    "proxy-authorization",
                                    "te",
                                    "trailer",
                                    "upgrade",
                                    "close"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(hop); i++)
    if (span_ieq(buf, h->name, hop[i])) return true;
  if (h->name.len > 6 && span_ieq(buf, (eg_span_t){h->name.off, 6}, "proxy-")) return true;
  /* The body's framing stays whatever a Connection header says: the bytes are relayed. */
  if (span_ieq(buf, h->name, "content-length") || span_ieq(buf, h->name, "transfer-encoding"))
    return false;
  for (size_t i = 0; i < n_headers; i++) {
    if (!span_ieq(buf, headers[i].name, "connection")) continue;
    if (list_has(buf, headers[i].value, buf + h->name.off, h->name.len)) return true;
  }
  return false;
}

/* The headers a page request goes without (EG_FORWARD_PAGE). */
static bool page_drops(const char *buf, const eg_header_t *h) {
  static const char *const names[] = {"accept-encoding", "if-none-match", "if-modified-since",
                                      "if-range", "range"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(names); i++)
    if (span_ieq(buf, h->name, names[i])) return true;
  return false;
}

void eg_http_forward_head(const char *buf, const eg_request_t *req, const char *path,
                          size_t path_len, const char *host_header, const char *authorization,
                          unsigned flags, cm_buf_t *out) {
  if (!path) {
    path = buf + req->path.off;
    path_len = req->path.len;
  }
  cm_buf_append(out, buf + req->method.off, req->method.len);
  cm_buf_appends(out, " ");
  if (path_len == 0 || path[0] != '/') cm_buf_appends(out, "/");
  cm_buf_append(out, path, path_len);
  cm_buf_printf(out, " HTTP/1.%d\r\n", req->minor_version);
  for (size_t i = 0; i < req->n_headers; i++) {
    const eg_header_t *h = &req->headers[i];
    if (eg_http_hop_header(buf, req->headers, req->n_headers, h)) continue;
    if (span_ieq(buf, h->name, "host")) continue;
    /* With the server's credentials: a read without a body, which expects no 100 Continue
     * (and gets no interim answer the proxy would have to pass on for it). */
    if (authorization &&
        (span_ieq(buf, h->name, "authorization") || span_ieq(buf, h->name, "expect")))
      continue;
    if ((flags & EG_FORWARD_PAGE) && page_drops(buf, h)) continue;
    cm_buf_append(out, buf + h->name.off, h->name.len);
    cm_buf_appends(out, ": ");
    cm_buf_append(out, buf + h->value.off, h->value.len);
    cm_buf_appends(out, "\r\n");
  }
  cm_buf_printf(out, "Host: %s\r\n", host_header);
  if (authorization) cm_buf_printf(out, "Authorization: %s\r\n", authorization);
  cm_buf_appends(out, "Connection: close\r\n\r\n");
}

void eg_http_forward_response(const char *buf, const eg_response_t *resp, bool drop_cookies,
                              cm_buf_t *out) {
  size_t eol = 0;
  while (eol + 1 < resp->head_len && !(buf[eol] == '\r' && buf[eol + 1] == '\n')) eol++;
  cm_buf_append(out, buf, eol + 2);
  for (size_t i = 0; i < resp->n_headers; i++) {
    const eg_header_t *h = &resp->headers[i];
    if (eg_http_hop_header(buf, resp->headers, resp->n_headers, h)) continue;
    if (drop_cookies &&
        (span_ieq(buf, h->name, "set-cookie") || span_ieq(buf, h->name, "set-cookie2")))
      continue;
    cm_buf_append(out, buf + h->name.off, h->name.len);
    cm_buf_appends(out, ": ");
    cm_buf_append(out, buf + h->value.off, h->value.len);
    cm_buf_appends(out, "\r\n");
  }
  /* An interim answer (1xx) says nothing of the connection: the final one does. */
  if (resp->status >= 100 && resp->status < 200)
    cm_buf_appends(out, "\r\n");
  else
    cm_buf_appends(out, "Connection: close\r\n\r\n");
}

int eg_http_rewrite_heads(const char *buf, size_t len, bool drop_cookies, cm_buf_t *out,
                          size_t *consumed, eg_response_t *final, size_t *final_off) {
  size_t off = 0;
  *consumed = 0;
  *final_off = 0;
  for (;;) {
    int rc = eg_http_parse_response(buf + off, len - off, final);
    if (rc <= 0) return rc;
    /* The proxy forwards no Upgrade: a switch of protocols is an answer to nothing it sent. */
    if (final->status == 101) return -1;
    eg_http_forward_response(buf + off, final, drop_cookies, out);
    bool interim = final->status >= 100 && final->status < 200;
    *final_off = off;
    off += final->head_len;
    *consumed = off;
    if (!interim) return 1;
  }
}

/* ---------------------------------------------------------------- SOCKS5 */

int eg_socks5_greeting(const uint8_t *buf, size_t len, size_t *consumed) {
  if (len < 2) return len >= 1 && buf[0] != 5 ? -1 : 0;
  if (buf[0] != 5 || buf[1] == 0) return -1;
  size_t n = 2 + (size_t)buf[1];
  if (len < n) return 0;
  for (size_t i = 2; i < n; i++) {
    if (buf[i] == 0) {
      *consumed = n;
      return 1;
    }
  }
  return -1;
}

int eg_socks5_request(const uint8_t *buf, size_t len, size_t *consumed, char *host,
                      size_t host_size, uint16_t *port) {
  if (len < 4) return len >= 1 && buf[0] != 5 ? -1 : 0;
  if (buf[0] != 5 || buf[1] != 1 || buf[2] != 0) return -1;
  size_t alen, aoff = 4;
  switch (buf[3]) {
    case 1:
      alen = 4;
      break;
    case 4:
      alen = 16;
      break;
    case 3:
      if (len < 5) return 0;
      alen = buf[4];
      aoff = 5;
      if (alen == 0) return -1;
      break;
    default:
      return -1;
  }
  size_t n = aoff + alen + 2;
  if (len < n) return 0;
  if (buf[3] == 3) {
    if (eg_host_parse((const char *)buf + aoff, alen, host, host_size) < 0) return -1;
  } else {
    char text[64];
    if (!inet_ntop(buf[3] == 1 ? AF_INET : AF_INET6, buf + aoff, text, sizeof text)) return -1;
    if (strlen(text) >= host_size) return -1;
    strcpy(host, text);
  }
  *port = (uint16_t)((buf[aoff + alen] << 8) | buf[aoff + alen + 1]);
  if (*port == 0) return -1;
  *consumed = n;
  return 1;
}

/* ---------------------------------------------------------------- URLs */

static int hexval(char c) {
  if (is_digit(c)) return c - '0';
  c = lower(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static char *percent_decode(const char *p, size_t n) {
  char *out = xmalloc(n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '%' && i + 2 < n && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
      out[o++] = (char)(hexval(p[i + 1]) * 16 + hexval(p[i + 2]));
      i += 2;
    } else {
      out[o++] = p[i];
    }
  }
  out[o] = '\0';
  return out;
}

int eg_url_parse(const char *buf, size_t len, eg_url_t *out) {
  memset(out, 0, sizeof *out);
  size_t s;
  if (len >= 7 && strncasecmp(buf, "http://", 7) == 0) {
    s = 7;
  } else if (len >= 8 && strncasecmp(buf, "https://", 8) == 0) {
    s = 8;
    out->https = true;
  } else {
    return -1;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c <= 0x20 || c == 0x7f) return -1;
  }
  size_t ae = s;
  while (ae < len && buf[ae] != '/' && buf[ae] != '?' && buf[ae] != '#') ae++;
  size_t hs = s;
  for (size_t i = s; i < ae; i++)
    if (buf[i] == '@') hs = i + 1;
  if (hs > s) {
    const char *ui = buf + s;
    size_t ul = hs - 1 - s;
    const char *c = memchr(ui, ':', ul);
    out->user = percent_decode(ui, c ? (size_t)(c - ui) : ul);
    if (c) out->password = percent_decode(c + 1, ul - (size_t)(c - ui) - 1);
  }
  uint16_t def = out->https ? 443 : 80;
  if (parse_authority(buf + hs, ae - hs, def, out->host, sizeof out->host, &out->port) < 0) {
    eg_url_release(out);
    return -1;
  }
  /* An explicit port is one that the authority spells out. */
  const char *auth = buf + hs;
  size_t al = ae - hs;
  const char *close = al && auth[0] == '[' ? memchr(auth, ']', al) : NULL;
  out->explicit_port = close ? (size_t)(close - auth) + 1 < al : memchr(auth, ':', al) != NULL;
  size_t pe = ae;
  while (pe < len && buf[pe] != '#') pe++;
  if (pe == ae)
    out->path = xstrdup("/");
  else if (buf[ae] == '?')
    out->path = xasprintf("/%.*s", (int)(pe - ae), buf + ae);
  else
    out->path = xstrndup(buf + ae, pe - ae);
  return 0;
}

void eg_url_release(eg_url_t *u) {
  free(u->user);
  free(u->password);
  free(u->path);
  memset(u, 0, sizeof *u);
}

char *eg_url_redact(const char *url) {
  const char *scheme = strstr(url, "://");
  if (!scheme) return xstrdup(url);
  const char *a = scheme + 3;
  size_t al = strcspn(a, "/?#");
  const char *at = NULL;
  for (size_t i = 0; i < al; i++)
    if (a[i] == '@') at = a + i;
  if (!at) return xstrdup(url);
  const char *colon = memchr(a, ':', (size_t)(at - a));
  if (!colon) return xstrdup(url);
  return xasprintf("%.*s%s", (int)(colon - url), url, at);
}

/* A URL's host and port as an allow rule: with the URLs rather than the rules, so that the
 * parsers call the rules (host names) and never the other way. */
int eg_policy_allow_url(eg_policy_t *p, const char *url) {
  eg_url_t u;
  if (eg_url_parse(url, strlen(url), &u) < 0) return -1;
  bool v6 = strchr(u.host, ':') != NULL;
  cleanup_free char *text = xasprintf(v6 ? "[%s]:%u" : "%s:%u", u.host, (unsigned)u.port);
  eg_url_release(&u);
  eg_rule_t r;
  cm_error_t err = CM_ERROR_INIT;
  int rc = eg_rule_parse(text, strlen(text), &r, &err);
  cm_error_release(&err);
  if (rc == 0) eg_policy_add_allow(p, &r);
  return rc;
}

void eg_proxy_env(cm_strv_builder_t *env) {
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", EG_SANDBOX_PORT);
  static const char *const names[] = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                      "http_proxy", "https_proxy", "all_proxy"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(names); i++) cm_strv_addf(env, "%s=%s", names[i], url);
}
