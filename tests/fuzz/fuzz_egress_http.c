/* libFuzzer target for egress/http.c: the input as a request head, a response head, a SOCKS5
 * greeting and request, and a URL.  Beyond memory safety: spans stay inside the input, a
 * forwarded request head parses again as an origin-form request with the same method and
 * without hop-by-hop headers, a forwarded response head parses again within the header
 * limit, and a redacted URL never keeps the password. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "egress/egress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_span(eg_span_t s, size_t size) {
  if (s.off > size || s.len > size - s.off) abort();
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  fuzz_request(buf, size);
  fuzz_response(buf, size);
  fuzz_socks(data, size);
  fuzz_url(buf, size);
  return 0;
}
