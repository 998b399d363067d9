/* Unit tests for the client's address behind trusted proxies (transport/http/forwarded.c):
 * addresses, --trusted-proxy ranges, and the walk over X-Forwarded-For and Forwarded
 * (RFC 7239) from the right, with spoofed, malformed and oversized chains. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <stdio.h>

#include "transport/transport-internal.h"

static tr_http_addr_t addr(const char *s) {
  tr_http_addr_t a;
  if (tr_http_addr_parse(s, strlen(s), &a) < 0) fail_msg("not an address: %s", s);
  return a;
}

static const char *fmt(const tr_http_addr_t *a) {
  static char out[4][TR_HTTP_ADDR_MAX];
  static int k;
  char *o = out[k++ % 4];
  tr_http_addr_format(a, o);
  return o;
}

/* The ranges of most cases: the proxy on loopback and a LAN of proxies. */
static size_t trusted_of(const char *spec, tr_http_cidr_t *v) {
  size_t n = 0;
  cm_error_t err = CM_ERROR_INIT;
  if (tr_http_parse_trusted(spec, strlen(spec), v, TR_HTTP_MAX_TRUSTED_PROXIES, &n, &err) < 0)
    fail_msg("%s: %s", spec, cm_error_message(&err));
  return n;
}

static void walk_is_n(tr_http_forwarded_header_t h, const char *peer, const char *buf, size_t len,
                      tr_http_forwarded_status_t want, const char *want_client) {
  tr_http_cidr_t v[TR_HTTP_MAX_TRUSTED_PROXIES];
  size_t n = trusted_of("127.0.0.0/8, 10.0.0.0/8, ::1, fd00::/8", v);
  tr_http_addr_t p = addr(peer), client;
  tr_http_forwarded_status_t got = tr_http_forwarded_client(v, n, &p, h, buf, len, &client);
  if (got != want || strcmp(fmt(&client), want_client) != 0)
    fail_msg("peer %s, %s '%.*s': got %s %s, want %s %s", peer,
             h == TR_HTTP_FORWARDED_XFF ? "X-Forwarded-For" : "Forwarded",
             (int)CM_MIN(len, (size_t)200), buf ? buf : "(none)",
             tr_http_forwarded_status_name(got), fmt(&client), tr_http_forwarded_status_name(want),
             want_client);
}

static void xff_is(const char *peer, const char *buf, tr_http_forwarded_status_t want,
                   const char *client) {
  walk_is_n(TR_HTTP_FORWARDED_XFF, peer, buf, buf ? strlen(buf) : 0, want, client);
}

static void fwd_is(const char *peer, const char *buf, tr_http_forwarded_status_t want,
                   const char *client) {
  walk_is_n(TR_HTTP_FORWARDED_RFC7239, peer, buf, buf ? strlen(buf) : 0, want, client);
}

static void test_addresses(void **state) {
  assert_string_equal(fmt(&(tr_http_addr_t){0}), "0.0.0.0");
  tr_http_addr_t a = addr("192.0.2.1");
  assert_int_equal(a.family, AF_INET);
  a = addr("2001:DB8:0:0::1");
  assert_int_equal(a.family, AF_INET6);
  assert_string_equal(fmt(&a), "2001:db8::1");
  /* IPv4-mapped: one client, one form. */
  a = addr("::ffff:192.0.2.9");
  assert_int_equal(a.family, AF_INET);
  assert_string_equal(fmt(&a), "192.0.2.9");
  struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6};
  inet_pton(AF_INET6, "::ffff:127.0.0.2", &sa6.sin6_addr);
  assert_int_equal(tr_http_addr_from_sockaddr((struct sockaddr *)&sa6, &a), 0);
  assert_string_equal(fmt(&a), "127.0.0.2");
  struct sockaddr_in sa4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  assert_int_equal(tr_http_addr_from_sockaddr((struct sockaddr *)&sa4, &a), 0);
  assert_string_equal(fmt(&a), "127.0.0.1");
  struct sockaddr su = {.sa_family = AF_UNIX};
  assert_int_equal(tr_http_addr_from_sockaddr(&su, &a), -1);
  const char *bad[] = {"",
                       "1.2.3",
                       "1.2.3.4.5",
                       "256.1.1.1",
                       "[::1]",
                       "::1%lo",
                       "fe80::1%eth0",
                       "1.2.3.4:80",
                       "0x7f.0.0.1",
                       " 1.2.3.4",
                       "host.example",
                       "::1::2",
                       "1111:2222:3333:4444:5555:6666:7777:8888:9999"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (tr_http_addr_parse(bad[i], strlen(bad[i]), &a) == 0) fail_msg("accepted '%s'", bad[i]);
  /* Never past len, and never with a NUL inside. */
  assert_int_equal(tr_http_addr_parse("10.0.0.1junk", 8, &a), 0);
  assert_string_equal(fmt(&a), "10.0.0.1");
  assert_int_equal(tr_http_addr_parse("10.0.0.1\0", 9, &a), -1);
}

static void trusted_fails(const char *spec, cm_error_kind_t kind) {
  tr_http_cidr_t v[4];
  size_t n = 1;
  v[0].prefix = 7;
  cm_error_t err = CM_ERROR_INIT;
  if (tr_http_parse_trusted(spec, strlen(spec), v, CM_ARRAY_SIZE(v), &n, &err) == 0)
    fail_msg("accepted --trusted-proxy '%s'", spec);
  assert_int_equal(err.kind, kind);
  assert_int_equal(n, 1); /* unchanged */
  cm_error_release(&err);
}

static void test_trusted_ranges(void **state) {
  tr_http_cidr_t v[TR_HTTP_MAX_TRUSTED_PROXIES];
  size_t n = trusted_of(" 10.0.0.0/8 ,192.0.2.7,2001:db8::/32, ::ffff:172.16.0.0/108,0.0.0.0/0", v);
  assert_int_equal(n, 5);
  assert_int_equal(v[0].prefix, 8);
  assert_int_equal(v[1].prefix, 32);
  assert_int_equal(v[2].prefix, 32);
  assert_int_equal(v[3].addr.family, AF_INET); /* the mapped form is kept as IPv4 */
  assert_int_equal(v[3].prefix, 12);
  tr_http_addr_t a = addr("172.31.255.255");
  assert_true(tr_http_trusted(v + 3, 1, &a));
  a = addr("172.32.0.0");
  assert_false(tr_http_trusted(v + 3, 1, &a));
  a = addr("10.255.0.1");
  assert_true(tr_http_trusted(v, 1, &a));
  a = addr("11.0.0.1");
  assert_false(tr_http_trusted(v, 3, &a));
  assert_true(tr_http_trusted(v, 5, &a)); /* 0.0.0.0/0 */
  a = addr("192.0.2.7");
  assert_true(tr_http_trusted(v + 1, 1, &a));
  a = addr("192.0.2.8");
  assert_false(tr_http_trusted(v + 1, 1, &a));
  a = addr("2001:db8:ffff::1");
  assert_true(tr_http_trusted(v, 4, &a));
  a = addr("2001:db9::1");
  assert_false(tr_http_trusted(v, 4, &a));
  /* A family never matches the other's ranges. */
  a = addr("::");
  assert_false(tr_http_trusted(v, 1, &a));
  assert_false(tr_http_trusted(v, 0, &a));

  trusted_fails("", CM_ERR_INVALID);
  trusted_fails(" , ", CM_ERR_INVALID);
  trusted_fails("10.0.0.1/8", CM_ERR_INVALID); /* host bits: a typo for 10.0.0.0/8? */
  trusted_fails("10.0.0.0/33", CM_ERR_INVALID);
  trusted_fails("10.0.0.0/", CM_ERR_INVALID);
  trusted_fails("10.0.0.0/-1", CM_ERR_INVALID);
  trusted_fails("10.0.0.0/08x", CM_ERR_INVALID);
  trusted_fails("fd00::/129", CM_ERR_INVALID);
  trusted_fails("::ffff:10.0.0.0/95", CM_ERR_INVALID);
  trusted_fails("localhost", CM_ERR_INVALID);
  trusted_fails("[::1]", CM_ERR_INVALID);
  trusted_fails("10.0.0.0/8 10.1.0.0/16", CM_ERR_INVALID);
  trusted_fails("10.0.0.0/8,bogus", CM_ERR_INVALID);
  trusted_fails("1.1.1.1,2.2.2.2,3.3.3.3,4.4.4.4", CM_ERR_LIMIT); /* cap 4, one already there */
}

static void test_xff_untrusted_peer_is_the_client(void **state) {
  /* The header is never read from an untrusted peer. */
  xff_is("192.0.2.50", "203.0.113.7", TR_HTTP_FWD_NONE, "192.0.2.50");
  xff_is("192.0.2.50", NULL, TR_HTTP_FWD_NONE, "192.0.2.50");
  xff_is("2001:db8::50", "10.0.0.1", TR_HTTP_FWD_NONE, "2001:db8::50");
  tr_http_addr_t p = addr("127.0.0.1"), c;
  assert_int_equal(
      tr_http_forwarded_client(NULL, 0, &p, TR_HTTP_FORWARDED_XFF, "203.0.113.7", 11, &c),
      TR_HTTP_FWD_NONE);
  assert_string_equal(fmt(&c), "127.0.0.1");
}

static void test_xff_walk(void **state) {
  xff_is("127.0.0.1", NULL, TR_HTTP_FWD_ABSENT, "127.0.0.1");
  xff_is("127.0.0.1", "", TR_HTTP_FWD_ABSENT, "127.0.0.1");
  xff_is("127.0.0.1", " , ,\t", TR_HTTP_FWD_ABSENT, "127.0.0.1");
  xff_is("127.0.0.1", "203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  /* A client's own entries are left of the proxy's: the rightmost untrusted one wins. */
  xff_is("127.0.0.1", "6.6.6.6, 203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  xff_is("127.0.0.1", "10.0.0.9, 203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  xff_is("127.0.0.1", "garbage!!, \"x\", 203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  /* Trusted hops are skipped, from the right. */
  xff_is("127.0.0.1", "198.51.100.1, 203.0.113.7, 10.0.0.2, 10.1.2.3", TR_HTTP_FWD_OK,
         "203.0.113.7");
  xff_is("::1", "203.0.113.7,fd00::1", TR_HTTP_FWD_OK, "203.0.113.7");
  xff_is("::1", "2001:db8::7", TR_HTTP_FWD_OK, "2001:db8::7");
  xff_is("::ffff:127.0.0.1", "203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  /* Every hop trusted: the leftmost is the client. */
  xff_is("127.0.0.1", "10.0.0.5, 10.0.0.2", TR_HTTP_FWD_ALL_TRUSTED, "10.0.0.5");
  /* Empty elements are no hops. */
  xff_is("127.0.0.1", " , 203.0.113.7 ,, ", TR_HTTP_FWD_OK, "203.0.113.7");
  /* Header lines in order, the last line's entries the rightmost. */
  xff_is("127.0.0.1", "6.6.6.6\n203.0.113.7", TR_HTTP_FWD_OK, "203.0.113.7");
  xff_is("127.0.0.1", "203.0.113.7\n10.0.0.3\n", TR_HTTP_FWD_OK, "203.0.113.7");
}

static void test_xff_entry_forms(void **state) {
  xff_is("127.0.0.1", "[2001:db8::1]:4711", TR_HTTP_FWD_OK, "2001:db8::1");
  xff_is("127.0.0.1", "[2001:db8::1]", TR_HTTP_FWD_OK, "2001:db8::1");
  xff_is("127.0.0.1", "192.0.2.1:8080", TR_HTTP_FWD_OK, "192.0.2.1");
  xff_is("127.0.0.1", "::ffff:192.0.2.9", TR_HTTP_FWD_OK, "192.0.2.9");
  xff_is("127.0.0.1", "2001:DB8::A", TR_HTTP_FWD_OK, "2001:db8::a");
  /* The walk stops at what is no address; the client is the last address reached. */
  xff_is("127.0.0.1", "203.0.113.7, unknown", TR_HTTP_FWD_UNKNOWN, "127.0.0.1");
  xff_is("127.0.0.1", "203.0.113.7, 10.0.0.2, UNKNOWN, 10.0.0.3", TR_HTTP_FWD_UNKNOWN, "10.0.0.3");
  const char *bad[] = {"203.0.113.7, garbage", "[2001:db8::1",    "[192.0.2.1]",
                       "[2001:db8::1]:",       "[2001:db8::1]x",  "[2001:db8::1]:0",
                       "192.0.2.1:0",          "192.0.2.1:65536", "192.0.2.1:123456",
                       "192.0.2.1:_obf",       "_hidden",         "for=192.0.2.1",
                       "\"192.0.2.1\"",        "fe80::1%eth0",    "192.0.2.1 192.0.2.2",
                       "host.example"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    xff_is("127.0.0.1", bad[i], TR_HTTP_FWD_MALFORMED, "127.0.0.1");
  walk_is_n(TR_HTTP_FORWARDED_XFF, "127.0.0.1", "203.0.113.7\0", 12, TR_HTTP_FWD_MALFORMED,
            "127.0.0.1");
  /* An entry too long to be an address is not read as one. */
  char big[400];
  memset(big, '1', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  xff_is("127.0.0.1", big, TR_HTTP_FWD_MALFORMED, "127.0.0.1");
}

static void test_xff_caps(void **state) {
  /* Over the byte cap: not read at all (the peer). */
  size_t n = TR_HTTP_FORWARDED_MAX_BYTES + 1;
  char *big = xmalloc(n + 1);
  memset(big, ' ', n);
  memcpy(big + n - 11, "203.0.113.7", 11);
  big[n] = '\0';
  xff_is("127.0.0.1", big, TR_HTTP_FWD_TOO_LONG, "127.0.0.1");
  /* At the cap it is read, however much sits left of the proxy's entry. */
  walk_is_n(TR_HTTP_FORWARDED_XFF, "127.0.0.1", big + 1, n - 1, TR_HTTP_FWD_OK, "203.0.113.7");
  free(big);
  /* Hops: exactly the cap of trusted ones is all of them; one more is too many. */
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (int i = 0; i < TR_HTTP_FORWARDED_MAX_HOPS; i++) cm_buf_printf(&b, "10.0.0.%d, ", i + 1);
  xff_is("127.0.0.1", b.data, TR_HTTP_FWD_ALL_TRUSTED, "10.0.0.1");
  cm_buf_t more;
  cm_buf_init(&more, 0);
  cm_buf_printf(&more, "203.0.113.7, %s", b.data);
  xff_is("127.0.0.1", more.data, TR_HTTP_FWD_TOO_MANY, "10.0.0.1");
  /* An untrusted client right of many spoofed trusted entries: found at once. */
  cm_buf_appends(&more, "192.0.2.99");
  xff_is("127.0.0.1", more.data, TR_HTTP_FWD_OK, "192.0.2.99");
  cm_buf_release(&b);
  cm_buf_release(&more);
}

static void test_forwarded_rfc7239(void **state) {
  /* The RFC's own examples (section 4 and 7.1). */
  fwd_is("127.0.0.1", "for=\"_gazonk\"", TR_HTTP_FWD_OBFUSCATED, "127.0.0.1");
  fwd_is("127.0.0.1", "For=\"[2001:db8:cafe::17]:4711\"", TR_HTTP_FWD_OK, "2001:db8:cafe::17");
  fwd_is("127.0.0.1", "for=192.0.2.60;proto=http;by=203.0.113.43", TR_HTTP_FWD_OK, "192.0.2.60");
  fwd_is("127.0.0.1", "for=192.0.2.43, for=198.51.100.17", TR_HTTP_FWD_OK, "198.51.100.17");
  fwd_is("127.0.0.1", "for=192.0.2.43,for=\"[2001:db8:cafe::17]\",for=unknown", TR_HTTP_FWD_UNKNOWN,
         "127.0.0.1");
  /* Trusted hops skipped; the client's own elements on the left never win. */
  fwd_is("127.0.0.1", "for=6.6.6.6, for=198.51.100.17;proto=https, for=10.0.0.2", TR_HTTP_FWD_OK,
         "198.51.100.17");
  fwd_is("::1", "for=\"[fd00::2]\", for=10.9.9.9", TR_HTTP_FWD_ALL_TRUSTED, "fd00::2");
  /* Node forms. */
  fwd_is("127.0.0.1", "for=\"192.0.2.1:8443\"", TR_HTTP_FWD_OK, "192.0.2.1");
  fwd_is("127.0.0.1", "for=\"192.0.2.1:_p1\"", TR_HTTP_FWD_OK, "192.0.2.1");
  fwd_is("127.0.0.1", "for=\"[2001:db8::1]:_p\"", TR_HTTP_FWD_OK, "2001:db8::1");
  fwd_is("127.0.0.1", "for=\"\\[2001:db8::1\\]\"", TR_HTTP_FWD_OK, "2001:db8::1");
  fwd_is("127.0.0.1", "for=\"unknown:80\"", TR_HTTP_FWD_UNKNOWN, "127.0.0.1");
  fwd_is("127.0.0.1", "for=unknown:80", TR_HTTP_FWD_MALFORMED, "127.0.0.1"); /* unquoted */
  fwd_is("127.0.0.1", "for=_hidden", TR_HTTP_FWD_OBFUSCATED, "127.0.0.1");
  fwd_is("127.0.0.1", "for=\"_a.b-c_d:_e\"", TR_HTTP_FWD_OBFUSCATED, "127.0.0.1");
  fwd_is("127.0.0.1", "203.0.113.1, for=10.0.0.7, for=\"_x\"", TR_HTTP_FWD_OBFUSCATED, "127.0.0.1");
  fwd_is("127.0.0.1", "for=203.0.113.9, for=_x, for=10.0.0.7", TR_HTTP_FWD_OBFUSCATED, "10.0.0.7");
  /* An element without for= tells nothing of the hop before. */
  fwd_is("127.0.0.1", "for=203.0.113.9, proto=https;by=10.0.0.1", TR_HTTP_FWD_UNKNOWN, "127.0.0.1");
  /* Blanks around ';' and empty pairs are tolerated; around '=' not. */
  fwd_is("127.0.0.1", "for=192.0.2.1 ; proto=https", TR_HTTP_FWD_OK, "192.0.2.1");
  fwd_is("127.0.0.1", ";for=192.0.2.1;;", TR_HTTP_FWD_OK, "192.0.2.1");
  fwd_is("127.0.0.1", "ext=\"a,b;c\";for=192.0.2.1", TR_HTTP_FWD_OK, "192.0.2.1");
  /* A quoted comma is no element boundary. */
  fwd_is("127.0.0.1", "for=\"_a,b\", for=198.51.100.17", TR_HTTP_FWD_OK, "198.51.100.17");
  fwd_is("127.0.0.1", "for=198.51.100.17, host=\"a,for=10.0.0.1\"", TR_HTTP_FWD_UNKNOWN,
         "127.0.0.1");
  /* An unterminated quote swallows the rest of its line, not the next line. */
  fwd_is("127.0.0.1", "for=\"6.6.6.6, for=198.51.100.17", TR_HTTP_FWD_MALFORMED, "127.0.0.1");
  fwd_is("127.0.0.1", "for=\"6.6.6.6\nfor=198.51.100.17", TR_HTTP_FWD_OK, "198.51.100.17");
  fwd_is("127.0.0.1", "for=\"6.6.6.6\", for=198.51.100.17\n", TR_HTTP_FWD_OK, "198.51.100.17");
  fwd_is("127.0.0.1", NULL, TR_HTTP_FWD_ABSENT, "127.0.0.1");
  fwd_is("127.0.0.1", " ,, ", TR_HTTP_FWD_ABSENT, "127.0.0.1");
  fwd_is("192.0.2.50", "for=198.51.100.17", TR_HTTP_FWD_NONE, "192.0.2.50");
}

static void test_forwarded_malformed(void **state) {
  const char *bad[] = {
      "for=[2001:db8::1]",        /* IPv6 must be quoted (':' and '[' are no token) */
      "for=\"2001:db8::1\"",      /* and bracketed */
      "for=\"[192.0.2.1]\"",      /* IPv4 is not */
      "for=\"::ffff:192.0.2.1\"", /* nor is a mapped one bare */
      "for=192.0.2.1:80",         /* a port needs quotes */
      "for=\"192.0.2.1:0\"",
      "for=\"192.0.2.1:65536\"",
      "for=\"192.0.2.1:\"",
      "for=\"[2001:db8::1\"",
      "for=\"[2001:db8::1]:\"",
      "for=\"[fe80::1%25eth0]\"",
      "for=\"_\"",
      "for=\"_a b\"",
      "for=\"_a:_\"",
      "for=host.example",
      "for=192.0.2.1;for=192.0.2.2", /* a name twice */
      "FOR=192.0.2.1;for=192.0.2.2",
      "proto=http;for=192.0.2.1;Proto=https",
      "x=1;x=2;for=192.0.2.1",
      "for =192.0.2.1",
      "for= 192.0.2.1",
      "for=",
      "for=\"\"",
      "=192.0.2.1",
      "for",
      "for=192.0.2.1 proto=http",
      "for=192.0.2.1;proto",
      "for=\"192.0.2.1\"x",
      "for=\"192.0.2.1\\",
      "for=\"192.0.2.1\x01\"",
      "for=192.0.2.1\"",
      "192.0.2.1",
      "a=1;b=2;c=3;d=4;e=5;f=6;g=7;h=8;i=9;for=192.0.2.1", /* more extension names than we keep */
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    fwd_is("127.0.0.1", bad[i], TR_HTTP_FWD_MALFORMED, "127.0.0.1");
  /* The malformed one is where the walk stops: right of it still counts. */
  fwd_is("127.0.0.1", "for=[::1], for=198.51.100.17", TR_HTTP_FWD_OK, "198.51.100.17");
  fwd_is("127.0.0.1", "for=198.51.100.17, for=10.0.0.1;for=10.0.0.2", TR_HTTP_FWD_MALFORMED,
         "127.0.0.1");
  fwd_is("127.0.0.1", "for=198.51.100.17, for=[::1], for=10.0.0.3", TR_HTTP_FWD_MALFORMED,
         "10.0.0.3");
  char big[300];
  int k = snprintf(big, sizeof big, "for=\"_");
  memset(big + k, 'a', 200);
  snprintf(big + k + 200, sizeof big - (size_t)k - 200, "\"");
  fwd_is("127.0.0.1", big, TR_HTTP_FWD_MALFORMED, "127.0.0.1");
}

static void test_status_names(void **state) {
  assert_null(tr_http_forwarded_status_name(TR_HTTP_FWD_NONE));
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_OK), "ok");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_ABSENT), "absent");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_ALL_TRUSTED), "all-trusted");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_UNKNOWN), "unknown");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_OBFUSCATED), "obfuscated");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_MALFORMED), "malformed");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_TOO_MANY), "too-many-hops");
  assert_string_equal(tr_http_forwarded_status_name(TR_HTTP_FWD_TOO_LONG), "too-long");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addresses),
      cmocka_unit_test(test_trusted_ranges),
      cmocka_unit_test(test_xff_untrusted_peer_is_the_client),
      cmocka_unit_test(test_xff_walk),
      cmocka_unit_test(test_xff_entry_forms),
      cmocka_unit_test(test_xff_caps),
      cmocka_unit_test(test_forwarded_rfc7239),
      cmocka_unit_test(test_forwarded_malformed),
      cmocka_unit_test(test_status_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
