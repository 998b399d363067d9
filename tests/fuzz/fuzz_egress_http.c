/* libFuzzer target for egress/http.c and egress/links.c: the input as a request head, a response
 * head, a series of response heads (interim 1xx ones, then the final one), a SOCKS5 greeting and
 * request, and a URL.  Beyond memory safety: spans stay inside the input, a forwarded request head
 * parses again as an origin-form request with the same method and without hop-by-hop headers, a
 * forwarded response head parses again within the header limit, every rewritten head of a
 * series parses again, interim ones first, without a cookie (when they are dropped) or a
 * hop-by-hop header, and the same whether the series came at once or in two pieces, a
 * redacted URL never keeps the password; and as an index page's body (plain and chunked) whose
 * links resolve to targets without dot segments, and as a target whose canonical form is a
 * fixed point. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cm.h"
#include "egress/egress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_span(eg_span_t s, size_t size) {
  if (s.off > size || s.len > size - s.off) abort();
}

/* A request head's secrets (egress/secrets.c): two placeholders, one bound (its value has
 * bytes a target must encode) and one not.  Beyond memory safety: a head that carries the
 * unbound one is refused; a rewritten head parses again, carries no placeholder of either
 * (raw) and is within EG_HEAD_MAX; a head without either is left alone. */
#define PH_BOUND "mps-secret:A:0123456789abcdef0123456789abcdef"
#define PH_OTHER "mps-secret:B:fedcba9876543210fedcba9876543210"

static void fuzz_secrets(const char *buf, const eg_request_t *req) {
  eg_secret_binding_t b[2] = {
      {PH_BOUND, sizeof PH_BOUND - 1, "v al%ue:#", 9, true},
      {PH_OTHER, sizeof PH_OTHER - 1, "other", 5, false},
  };
  cm_buf_t out;
  cm_buf_init(&out, 0);
  uint64_t used = 0;
  size_t refused = 0;
  int rc = eg_secret_rewrite_head(buf, req, b, 2, &out, &used, &refused);
  bool other = memmem(buf, req->head_len, PH_OTHER, sizeof PH_OTHER - 1) != NULL;
  if (other && rc != -1) abort();
  if (rc == 0 && (out.len || used)) abort();
  if (rc == -1 && refused > 2) abort();
  if (rc == 1) {
    if (out.len > EG_HEAD_MAX || (used & ~1ull)) abort();
    if (memmem(out.data, out.len, PH_BOUND, sizeof PH_BOUND - 1)) abort();
    eg_request_t *again = malloc(sizeof *again);
    int prc = eg_http_parse_request(out.data, out.len, again);
    /* A value may make a target the parser refuses only through its encoding: never. */
    if (prc != 1 || again->n_headers != req->n_headers || again->form != req->form) abort();
    free(again);
  }
  cm_buf_release(&out);
}

static void fuzz_request(const char *buf, size_t size) {
  eg_request_t *req = malloc(sizeof *req);
  int rc = eg_http_parse_request(buf, size, req);
  if (rc == 1) {
    if (req->head_len > size || req->head_len > EG_HEAD_MAX) abort();
    check_span(req->method, req->head_len);
    check_span(req->path, req->head_len);
    for (size_t i = 0; i < req->n_headers; i++) {
      check_span(req->headers[i].name, req->head_len);
      check_span(req->headers[i].value, req->head_len);
    }
    if (req->form != EG_FORM_ORIGIN && (req->host[0] == '\0' || req->port == 0)) abort();
    fuzz_secrets(buf, req);
    if (req->form == EG_FORM_AUTHORITY) { /* CONNECT is answered, never forwarded */
      free(req);
      return;
    }
    cm_buf_t out;
    cm_buf_init(&out, 0);
    eg_http_forward_head(buf, req, NULL, 0, "example.test",
                         "Basic eA==", size & 2 ? EG_FORWARD_PAGE : 0, &out);
    eg_request_t *again = malloc(sizeof *again);
    /* (It may carry three headers more than it had: Host, Authorization, Connection.) */
    if (out.len <= EG_HEAD_MAX && req->n_headers + 3 <= EG_MAX_HEADERS) {
      if (eg_http_parse_request(out.data, out.len, again) != 1) abort();
      if (again->form != EG_FORM_ORIGIN || again->method.len != req->method.len ||
          memcmp(out.data, buf + req->method.off, req->method.len) != 0)
        abort();
      for (size_t i = 0; i < again->n_headers; i++) {
        const eg_header_t *h = &again->headers[i];
        if (eg_http_hop_header(out.data, again->headers, again->n_headers, h) &&
            !(h->name.len == 10 && strncasecmp(out.data + h->name.off, "connection", 10) == 0))
          abort();
      }
    }
    free(again);
    cm_buf_release(&out);
  } else if (rc != 0 && rc != -1) {
    abort();
  }
  free(req);
}

static void fuzz_response(const char *buf, size_t size) {
  eg_response_t resp;
  if (eg_http_parse_response(buf, size, &resp) != 1) return;
  if (resp.status < 0 || resp.status > 999 || resp.head_len > size) abort();
  cm_buf_t out;
  cm_buf_init(&out, 0);
  eg_http_forward_response(buf, &resp, size & 1, &out);
  eg_response_t again;
  /* The forwarded head is a response head within the full header limit (upstream's may
   * have one fewer: "Connection: close" is added). */
  if (out.len <= EG_HEAD_MAX &&
      eg_http_parse_response_limit(out.data, out.len, &again, EG_MAX_HEADERS) != 1)
    abort();
  cm_buf_release(&out);
}

static bool is_interim(int status) {
  return status >= 100 && status < 200;
}

/* The rewritten heads in out: interim heads, then (final) one final head, each parsing again
 * within the full header limit, without a cookie (drop_cookies) or a hop-by-hop header but the
 * final head's own "Connection: close". */
static void check_heads(const cm_buf_t *out, bool final, bool drop_cookies) {
  size_t off = 0;
  bool seen_final = false;
  while (off < out->len) {
    eg_response_t h;
    size_t left = out->len - off;
    /* (A rewritten head may be a little longer than EG_HEAD_MAX allows a parse.) */
    if (left >= EG_HEAD_MAX) return;
    if (eg_http_parse_response_limit(out->data + off, left, &h, EG_MAX_HEADERS) != 1) abort();
    if (seen_final || h.status == 101) abort();
    if (!is_interim(h.status)) seen_final = true;
    const char *b = out->data + off;
    for (size_t i = 0; i < h.n_headers; i++) {
      const eg_header_t *x = &h.headers[i];
      bool conn = x->name.len == 10 && strncasecmp(b + x->name.off, "connection", 10) == 0;
      if (conn && (is_interim(h.status) || i + 1 != h.n_headers)) abort();
      if (!conn && eg_http_hop_header(b, h.headers, h.n_headers, x)) abort();
      bool cookie = (x->name.len == 10 || (x->name.len == 11 && b[x->name.off + 10] == '2')) &&
                    strncasecmp(b + x->name.off, "set-cookie", 10) == 0;
      if (drop_cookies && cookie) abort();
    }
    off += h.head_len;
  }
  if (seen_final != final) abort();
}

/* Every head up to the final one (interim 1xx heads first), rewritten as a whole and as the proxy
 * gets it: the input cut in two at a place its first byte chooses, the interim heads of the
 * first part passed on and dropped before the rest comes.  Both ways give the same heads. */
static void fuzz_heads(const char *buf, size_t size) {
  bool drop = size & 1;
  cm_buf_t whole;
  cm_buf_init(&whole, 0);
  eg_response_t resp;
  size_t used = 0, final_off = 0;
  int rc = eg_http_rewrite_heads(buf, size, drop, &whole, &used, &resp, &final_off);
  if (rc < -1 || rc > 1 || used > size) abort();
  if (rc >= 0) check_heads(&whole, rc == 1, drop);
  if (rc == 1) {
    if (final_off >= used || resp.head_len != used - final_off || is_interim(resp.status)) abort();
    size_t cut = size ? (size_t)(unsigned char)buf[0] * 257 % (size + 1) : 0;
    char *piece = malloc(size ? size : 1);
    memcpy(piece, buf, cut);
    cm_buf_t parts;
    cm_buf_init(&parts, 0);
    size_t used1 = 0;
    int rc1 = eg_http_rewrite_heads(piece, cut, drop, &parts, &used1, &resp, &final_off);
    if (rc1 == 0) {
      size_t have = cut - used1;
      memmove(piece, piece + used1, have);
      memcpy(piece + have, buf + cut, size - cut);
      rc1 =
          eg_http_rewrite_heads(piece, have + size - cut, drop, &parts, &used1, &resp, &final_off);
    }
    if (rc1 != 1 || parts.len != whole.len || memcmp(parts.data, whole.data, whole.len) != 0)
      abort();
    cm_buf_release(&parts);
    free(piece);
  }
  cm_buf_release(&whole);
}

static void fuzz_socks(const uint8_t *data, size_t size) {
  size_t used = 0;
  if (eg_socks5_greeting(data, size, &used) != 1) return;
  if (used > size) abort();
  char host[EG_HOST_MAX + 1];
  uint16_t port;
  size_t used2 = 0;
  if (eg_socks5_request(data + used, size - used, &used2, host, sizeof host, &port) == 1) {
    if (used2 > size - used || port == 0 || strlen(host) == 0) abort();
  }
}

static void fuzz_url(const char *buf, size_t size) {
  eg_url_t u;
  if (eg_url_parse(buf, size, &u) == 0) {
    if (!u.path || u.path[0] != '/' || u.port == 0 || u.host[0] == '\0') abort();
    eg_url_release(&u);
  }
  if (memchr(buf, '\0', size)) return;
  char *s = strndup(buf, size);
  char *r = eg_url_redact(s);
  eg_url_t a, b;
  if (eg_url_parse(s, strlen(s), &a) == 0) {
    if (eg_url_parse(r, strlen(r), &b) == 0) {
      if (b.password) abort();
      eg_url_release(&b);
    }
    eg_url_release(&a);
  }
  free(r);
  free(s);
}

/* ---------------------------------------------------------------- an index's links */

static bool has_dot_segment(const char *t) {
  size_t n = strcspn(t, "?");
  size_t seg = 1;
  for (size_t i = 1; i <= n; i++) {
    if (i == n || t[i] == '/') {
      size_t l = i - seg;
      if ((l == 1 && t[seg] == '.') || (l == 2 && t[seg] == '.' && t[seg + 1] == '.')) return true;
      seg = i + 1;
    }
  }
  return false;
}

static void on_link(void *data, const char *link, size_t len) {
  size_t *n = data;
  (*n)++;
  if (len == 0 || len > EG_LINK_MAX) abort();
  static eg_url_t origin;
  static bool made;
  if (!made) {
    const char *u = "https://index.test:8443/api/v4/projects/1/packages/pypi/simple";
    if (eg_url_parse(u, strlen(u), &origin) < 0) abort();
    made = true;
  }
  char *t = eg_link_resolve(&origin, "/api/v4/projects/1/packages/pypi/simple/x/", link, len);
  if (t) {
    /* Resolved: an absolute target without dot segments, fragment or control bytes. */
    if (t[0] != '/' || has_dot_segment(t) || strchr(t, '#')) abort();
    for (const char *p = t; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f) abort();
    free(t);
  }
}

/* The input as a page's body (plain and chunked), its links resolved; as a target, below a base
 * or not, and canonical (a fixed point: canonical twice is canonical once). */
static void fuzz_links(const char *buf, size_t size) {
  eg_page_scan_t *scan = malloc(sizeof *scan);
  for (int chunked = 0; chunked < 2; chunked++) {
    size_t n = 0;
    eg_page_scan_init(scan, chunked);
    size_t half = size / 2;
    if (eg_page_scan_feed(scan, buf, half, on_link, &n) == 0)
      (void)eg_page_scan_feed(scan, buf + half, size - half, on_link, &n);
  }
  free(scan);
  bool below = eg_index_path_below("/simple", buf, size);
  if (below && (size < 7 || memcmp(buf, "/simple", 7) != 0)) abort();
  char *c1 = eg_path_canon(buf, size);
  char *c2 = eg_path_canon(c1, strlen(c1));
  if (strcmp(c1, c2) != 0) abort();
  free(c2);
  free(c1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  fuzz_request(buf, size);
  fuzz_response(buf, size);
  fuzz_heads(buf, size);
  fuzz_socks(data, size);
  fuzz_url(buf, size);
  fuzz_links(buf, size);
  return 0;
}
