/* Fuzz target: the client's address behind trusted proxies (transport/http/forwarded.c).
 * The first byte chooses the header (bit 0) and the peer (bits 1-2: a trusted IPv4, a
 * trusted IPv6, a trusted IPv4 seen mapped, an untrusted one); the rest is the header's
 * lines, and is also parsed as a --trusted-proxy value.
 *
 * Contracts: the client is the peer unless the peer is trusted and the header named
 * someone; an "ok" client is untrusted and every other a trusted address (or the peer);
 * the client's text parses back to itself; and a client cannot choose the result: what
 * the proxy appends on a line of its own (and for X-Forwarded-For, on the same line
 * after a comma) is the client, whatever came before it. */
#include <stdint.h>
#include <stdio.h>

#include "transport/transport-internal.h"

static const char *const trusted_spec = "127.0.0.0/8, 10.0.0.0/8, ::1, fd00::/8";
static const char *const peers[] = {"127.0.0.1", "fd00::1", "::ffff:10.1.2.3", "192.0.2.50"};
/* The address a proxy appends, and how. */
static const char *const appended = "203.0.113.7";

static void check(const tr_http_cidr_t *v, size_t n, const tr_http_addr_t *peer,
                  tr_http_forwarded_header_t header, const char *buf, size_t len) {
  tr_http_addr_t client;
  tr_http_forwarded_status_t s = tr_http_forwarded_client(v, n, peer, header, buf, len, &client);
  bool peer_trusted = tr_http_trusted(v, n, peer);
  if ((s == TR_HTTP_FWD_NONE) != !peer_trusted) __builtin_trap();
  if ((s == TR_HTTP_FWD_NONE || s == TR_HTTP_FWD_ABSENT || s == TR_HTTP_FWD_TOO_LONG) &&
      memcmp(&client, peer, sizeof client) != 0)
    __builtin_trap();
  if (s == TR_HTTP_FWD_OK && tr_http_trusted(v, n, &client)) __builtin_trap();
  if (s != TR_HTTP_FWD_OK && s != TR_HTTP_FWD_NONE && !tr_http_trusted(v, n, &client))
    __builtin_trap();
  if (s != TR_HTTP_FWD_NONE && !tr_http_forwarded_status_name(s)) __builtin_trap();
  char text[TR_HTTP_ADDR_MAX];
  tr_http_addr_format(&client, text);
  tr_http_addr_t again;
  if (tr_http_addr_parse(text, strlen(text), &again) < 0 ||
      memcmp(&again, &client, sizeof again) != 0)
    __builtin_trap();
}

static void appended_wins(const tr_http_cidr_t *v, size_t n, const tr_http_addr_t *peer,
                          tr_http_forwarded_header_t header, const char *buf, size_t len,
                          const char *sep) {
  const char *entry = header == TR_HTTP_FORWARDED_RFC7239 ? "for=" : "";
  size_t need = len + strlen(sep) + strlen(entry) + strlen(appended);
  if (need > TR_HTTP_FORWARDED_MAX_BYTES || !tr_http_trusted(v, n, peer)) return;
  char *joined = xmalloc(need + 1);
  memcpy(joined, buf, len);
  snprintf(joined + len, need + 1 - len, "%s%s%s", sep, entry, appended);
  tr_http_addr_t client, want;
  tr_http_addr_parse(appended, strlen(appended), &want);
  if (tr_http_forwarded_client(v, n, peer, header, joined, need, &client) != TR_HTTP_FWD_OK ||
      memcmp(&client, &want, sizeof want) != 0)
    __builtin_trap();
  free(joined);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tr_http_cidr_t v[TR_HTTP_MAX_TRUSTED_PROXIES];
  size_t n = 0;
  cm_error_t err = CM_ERROR_INIT;
  if (tr_http_parse_trusted(trusted_spec, strlen(trusted_spec), v, CM_ARRAY_SIZE(v), &n, &err) < 0)
    __builtin_trap();
  uint8_t sel = size ? data[0] : 0;
  const char *buf = size ? (const char *)data + 1 : "";
  size_t len = size ? size - 1 : 0;
  tr_http_forwarded_header_t header = sel & 1 ? TR_HTTP_FORWARDED_RFC7239 : TR_HTTP_FORWARDED_XFF;
  tr_http_addr_t peer;
  const char *p = peers[(sel >> 1) & 3];
  if (tr_http_addr_parse(p, strlen(p), &peer) < 0) __builtin_trap();
  check(v, n, &peer, header, buf, len);
  check(v, n, &peer, header, NULL, 0);
  appended_wins(v, n, &peer, header, buf, len, "\n");
  if (header == TR_HTTP_FORWARDED_XFF) appended_wins(v, n, &peer, header, buf, len, ", ");

  /* The same bytes as a --trusted-proxy value: either ranges, or an error that says so. */
  tr_http_cidr_t w[4];
  size_t m = 0;
  int rc = tr_http_parse_trusted(buf, len, w, CM_ARRAY_SIZE(w), &m, &err);
  if (rc == 0) {
    if (m == 0 || m > CM_ARRAY_SIZE(w)) __builtin_trap();
    for (size_t i = 0; i < m; i++) {
      if (w[i].prefix > (w[i].addr.family == AF_INET ? 32u : 128u)) __builtin_trap();
      /* A range holds its own first address. */
      if (!tr_http_trusted(&w[i], 1, &w[i].addr)) __builtin_trap();
    }
    check(w, m, &peer, header, buf, len);
  } else {
    if (m != 0 || (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT)) __builtin_trap();
    cm_error_release(&err);
  }
  return 0;
}
