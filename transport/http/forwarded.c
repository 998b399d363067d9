/* The client behind trusted proxies (transport-internal.h): addresses, --trusted-proxy
 * ranges, and the walk over X-Forwarded-For or Forwarded (RFC 7239) from the right.
 *
 * The header is tokenised left to right (a quoted string may hold a comma) into the last
 * TR_HTTP_FORWARDED_MAX_HOPS entries, each already judged (an address, or why not), and
 * walked from the right.  Nothing is allocated: a header's size costs time only, bounded by
 * TR_HTTP_FORWARDED_MAX_BYTES. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>

#include "transport/transport-internal.h"

/* Longest entry (or for= value) that can be an address with a port: "[v6]:port" is 54. */
#define FWD_ENTRY_MAX 128

static bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

static void trim(const char **p, size_t *n) {
  while (*n && is_ows(**p)) (*p)++, (*n)--;
  while (*n && is_ows((*p)[*n - 1])) (*n)--;
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool is_alnum(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* RFC 7230 tchar. */
static bool is_tchar(char c) {
  return is_alnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool ieq(const char *a, size_t alen, const char *b) {
  size_t blen = strlen(b);
  return alen == blen && strncasecmp(a, b, alen) == 0;
}

/* ================================================================ addresses */

static void normalise(tr_http_addr_t *a) {
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (a->family == AF_INET6 && memcmp(a->bytes, mapped, 12) == 0) {
    memmove(a->bytes, a->bytes + 12, 4);
    memset(a->bytes + 4, 0, 12);
    a->family = AF_INET;
  }
}

int tr_http_addr_parse(const char *buf, size_t len, tr_http_addr_t *out) {
  char text[TR_HTTP_ADDR_MAX];
  if (len == 0 || len >= sizeof text) return -1;
  memcpy(text, buf, len);
  text[len] = '\0';
  if (strlen(text) != len) return -1; /* a NUL inside */
  tr_http_addr_t a = {0};
  if (inet_pton(AF_INET, text, a.bytes) == 1) {
    a.family = AF_INET;
  } else if (inet_pton(AF_INET6, text, a.bytes) == 1) {
    a.family = AF_INET6;
    normalise(&a);
  } else {
    return -1;
  }
  *out = a;
  return 0;
}

int tr_http_addr_from_sockaddr(const struct sockaddr *sa, tr_http_addr_t *out) {
  memset(out, 0, sizeof *out);
  if (!sa) return -1;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
    out->family = AF_INET;
    memcpy(out->bytes, &in->sin_addr, 4);
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
    out->family = AF_INET6;
    memcpy(out->bytes, &in6->sin6_addr, 16);
    normalise(out);
    return 0;
  }
  return -1;
}

void tr_http_addr_format(const tr_http_addr_t *a, char out[TR_HTTP_ADDR_MAX]) {
  if (!inet_ntop(a->family == AF_INET6 ? AF_INET6 : AF_INET, a->bytes, out, TR_HTTP_ADDR_MAX))
    snprintf(out, TR_HTTP_ADDR_MAX, "%s", "unknown");
}

/* ================================================================ trusted ranges */

static bool prefix_matches(const unsigned char *a, const unsigned char *net, unsigned prefix) {
  unsigned whole = prefix / 8, rest = prefix % 8;
  if (memcmp(a, net, whole) != 0) return false;
  if (!rest) return true;
  unsigned char mask = (unsigned char)(0xff << (8 - rest));
  return (a[whole] & mask) == (net[whole] & mask);
}

/* Whether any bit below the prefix is set. */
static bool host_bits(const tr_http_addr_t *a, unsigned prefix) {
  unsigned bits = a->family == AF_INET ? 32 : 128;
  for (unsigned i = prefix; i < bits; i++)
    if (a->bytes[i / 8] & (0x80 >> (i % 8))) return true;
  return false;
}

static int parse_cidr(const char *p, size_t n, tr_http_cidr_t *out, cm_error_t *err) {
  const char *slash = memchr(p, '/', n);
  size_t an = slash ? (size_t)(slash - p) : n;
  tr_http_addr_t a;
  /* An IPv4-mapped range is written as IPv6 but kept as IPv4: its prefix shrinks by 96. */
  bool mapped_form = false;
  if (tr_http_addr_parse(p, an, &a) < 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "'%.*s' is not an IP address or ADDRESS/PREFIX (e.g. 10.0.0.0/8, ::1)",
                        (int)CM_MIN(n, (size_t)80), p);
  if (a.family == AF_INET && memchr(p, ':', an)) mapped_form = true;
  unsigned bits = a.family == AF_INET ? 32 : 128;
  unsigned prefix = bits;
  if (slash) {
    const char *d = slash + 1;
    size_t dn = n - an - 1;
    uint64_t v = 0;
    if (dn == 0 || dn > 3) goto bad_prefix;
    for (size_t i = 0; i < dn; i++) {
      if (!is_digit(d[i])) goto bad_prefix;
      v = v * 10 + (uint64_t)(d[i] - '0');
    }
    if (mapped_form) {
      if (v < 96 || v > 128) goto bad_prefix;
      v -= 96;
    }
    if (v > bits) goto bad_prefix;
    prefix = (unsigned)v;
  }
  if (host_bits(&a, prefix))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "'%.*s' has bits set past its prefix (write the network's first address)",
                        (int)CM_MIN(n, (size_t)80), p);
  out->addr = a;
  out->prefix = prefix;
  return 0;
bad_prefix:
  return cm_error_set(err, 0, CM_ERR_INVALID, "'%.*s': the prefix must be %s",
                      (int)CM_MIN(n, (size_t)80), p,
                      mapped_form           ? "96-128"
                      : a.family == AF_INET ? "0-32"
                                            : "0-128");
}

int tr_http_parse_trusted(const char *buf, size_t len, tr_http_cidr_t *v, size_t cap, size_t *n,
                          cm_error_t *err) {
  size_t have = *n;
  const char *p = buf;
  size_t left = len;
  for (;;) {
    const char *comma = memchr(p, ',', left);
    size_t item = comma ? (size_t)(comma - p) : left;
    const char *q = p;
    size_t qn = item;
    trim(&q, &qn);
    if (qn) {
      if (have >= cap)
        return cm_error_set(err, 0, CM_ERR_LIMIT, "more than %zu trusted proxy ranges", cap);
      if (parse_cidr(q, qn, &v[have], err) < 0) return -1;
      have++;
    }
    if (!comma) break;
    p += item + 1;
    left -= item + 1;
  }
  if (have == *n)
    return cm_error_set(err, 0, CM_ERR_INVALID, "no address or ADDRESS/PREFIX in '%.*s'",
                        (int)CM_MIN(len, (size_t)80), buf);
  *n = have;
  return 0;
}

bool tr_http_trusted(const tr_http_cidr_t *v, size_t n, const tr_http_addr_t *a) {
  for (size_t i = 0; i < n; i++)
    if (v[i].addr.family == a->family && prefix_matches(a->bytes, v[i].addr.bytes, v[i].prefix))
      return true;
  return false;
}

/* ================================================================ entries */

typedef struct fwd_entry {
  tr_http_forwarded_status_t kind; /* TR_HTTP_FWD_OK: addr is an address */
  tr_http_addr_t addr;
} fwd_entry_t;

/* "1"-"65535". */
static bool valid_port(const char *p, size_t n) {
  if (n == 0 || n > 5) return false;
  uint32_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(p[i])) return false;
    v = v * 10 + (uint32_t)(p[i] - '0');
  }
  return v >= 1 && v <= 65535;
}

/* RFC 7239 obfnode / obfport: "_" 1*( ALPHA / DIGIT / "." / "_" / "-" ). */
static bool valid_obfuscated(const char *p, size_t n) {
  if (n < 2 || p[0] != '_') return false;
  for (size_t i = 1; i < n; i++)
    if (!is_alnum(p[i]) && p[i] != '.' && p[i] != '_' && p[i] != '-') return false;
  return true;
}

/* "[v6]" with an optional ":port" after it (obf: an obfuscated port is allowed).  Returns
 * 1 (an address in *a), 0 (not of that form), -1 (of that form, malformed). */
static int bracketed(const char *p, size_t n, bool obf, tr_http_addr_t *a) {
  if (!n || p[0] != '[') return 0;
  const char *close = memchr(p, ']', n);
  if (!close) return -1;
  size_t an = (size_t)(close - p) - 1;
  const char *rest = close + 1;
  size_t rn = n - an - 2;
  if (rn && (rest[0] != ':' ||
             !(valid_port(rest + 1, rn - 1) || (obf && valid_obfuscated(rest + 1, rn - 1)))))
    return -1;
  /* Only IPv6 in brackets: "[1.2.3.4]" is no address form of either header. */
  if (memchr(p + 1, '.', an) && !memchr(p + 1, ':', an)) return -1;
  if (tr_http_addr_parse(p + 1, an, a) < 0) return -1;
  return 1;
}

/* "v4:port" (obf: or an obfuscated port). */
static bool v4_with_port(const char *p, size_t n, bool obf, tr_http_addr_t *a) {
  const char *colon = memchr(p, ':', n);
  if (!colon || memchr(colon + 1, ':', n - (size_t)(colon - p) - 1)) return false;
  size_t an = (size_t)(colon - p), pn = n - an - 1;
  if (!(valid_port(colon + 1, pn) || (obf && valid_obfuscated(colon + 1, pn)))) return false;
  if (tr_http_addr_parse(p, an, a) < 0 || memchr(p, '.', an) == NULL) return false;
  return true;
}

/* One X-Forwarded-For entry (trimmed, not empty). */
static void xff_entry(const char *p, size_t n, fwd_entry_t *e) {
  e->kind = TR_HTTP_FWD_MALFORMED;
  if (n > FWD_ENTRY_MAX) return;
  if (ieq(p, n, "unknown")) {
    e->kind = TR_HTTP_FWD_UNKNOWN;
    return;
  }
  int b = bracketed(p, n, false, &e->addr);
  if (b) {
    if (b > 0) e->kind = TR_HTTP_FWD_OK;
    return;
  }
  /* A bare address (IPv6 has colons of its own), or IPv4 with a port. */
  if (tr_http_addr_parse(p, n, &e->addr) == 0 || v4_with_port(p, n, false, &e->addr))
    e->kind = TR_HTTP_FWD_OK;
}

/* A Forwarded for= node (the value, unquoted). */
static void forwarded_node(const char *p, size_t n, fwd_entry_t *e) {
  e->kind = TR_HTTP_FWD_MALFORMED;
  if (n == 0 || n > FWD_ENTRY_MAX) return;
  int b = bracketed(p, n, true, &e->addr);
  if (b) {
    if (b > 0) e->kind = TR_HTTP_FWD_OK;
    return;
  }
  /* nodename [ ":" node-port ]: the name ends at the first ':' (IPv6 is bracketed). */
  const char *colon = memchr(p, ':', n);
  size_t nn = colon ? (size_t)(colon - p) : n;
  if (colon) {
    size_t pn = n - nn - 1;
    if (!valid_port(colon + 1, pn) && !valid_obfuscated(colon + 1, pn)) return;
  }
  if (ieq(p, nn, "unknown")) {
    e->kind = TR_HTTP_FWD_UNKNOWN;
  } else if (p[0] == '_') {
    if (valid_obfuscated(p, nn)) e->kind = TR_HTTP_FWD_OBFUSCATED;
  } else if (tr_http_addr_parse(p, nn, &e->addr) == 0) {
    /* (nn ends at the first ':': an unbracketed IPv6 never gets here whole) */
    e->kind = TR_HTTP_FWD_OK;
  }
}

/* One Forwarded element (between commas outside quoted strings; trimmed, not empty):
 * forwarded-pair *( ";" forwarded-pair ), value = token / quoted-string. */
static void forwarded_entry(const char *p, size_t n, fwd_entry_t *e) {
  e->kind = TR_HTTP_FWD_MALFORMED;
  /* Each name once (RFC 7239 section 4): for, by, host, proto, and an extension's. */
  static const char *const known[] = {"for", "by", "host", "proto"};
  bool seen[4] = {false};
  char ext_seen[8][32];
  size_t n_ext = 0;
  bool have_for = false;
  fwd_entry_t node = {.kind = TR_HTTP_FWD_UNKNOWN};
  size_t i = 0;
  for (;;) {
    /* Empty pairs are allowed: "for=a;;proto=https", and a trailing ';'. */
    while (i < n && (is_ows(p[i]) || p[i] == ';')) i++;
    if (i == n) break;
    size_t name = i;
    while (i < n && is_tchar(p[i])) i++;
    size_t name_len = i - name;
    if (name_len == 0 || i >= n || p[i] != '=') return;
    i++;
    char value[FWD_ENTRY_MAX + 1];
    size_t vn = 0;
    if (i < n && p[i] == '"') {
      i++;
      bool closed = false;
      while (i < n) {
        char c = p[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= n) return;
          c = p[i++];
        }
        /* qdtext and quoted-pair: HTAB, SP, VCHAR, obs-text; never a control. */
        if ((unsigned char)c < 0x20 && c != '\t') return;
        if (c == 0x7f) return;
        if (vn >= FWD_ENTRY_MAX) return;
        value[vn++] = c;
      }
      if (!closed) return;
    } else {
      while (i < n && is_tchar(p[i])) {
        if (vn >= FWD_ENTRY_MAX) return;
        value[vn++] = p[i++];
      }
      if (vn == 0) return;
    }
    int k = -1;
    for (int j = 0; j < 4; j++)
      if (ieq(p + name, name_len, known[j])) k = j;
    if (k >= 0) {
      if (seen[k]) return;
      seen[k] = true;
    } else {
      /* An extension's name: at most a few, each once (longer names are compared by
       * their first 31 bytes, which only ever refuses more). */
      if (n_ext >= CM_ARRAY_SIZE(ext_seen)) return;
      size_t cn = CM_MIN(name_len, sizeof ext_seen[0] - 1);
      for (size_t j = 0; j < n_ext; j++)
        if (strlen(ext_seen[j]) == cn && strncasecmp(ext_seen[j], p + name, cn) == 0) return;
      memcpy(ext_seen[n_ext], p + name, cn);
      ext_seen[n_ext++][cn] = '\0';
    }
    if (k == 0) {
      have_for = true;
      forwarded_node(value, vn, &node);
    }
    while (i < n && is_ows(p[i])) i++;
    if (i == n) break;
    if (p[i] != ';') return;
    i++;
  }
  *e = have_for ? node : (fwd_entry_t){.kind = TR_HTTP_FWD_UNKNOWN};
}

/* ================================================================ the walk */

typedef struct fwd_ring {
  fwd_entry_t e[TR_HTTP_FORWARDED_MAX_HOPS];
  size_t total; /* entries seen; the last min(total, MAX_HOPS) are kept */
} fwd_ring_t;

static void ring_push(fwd_ring_t *r, const fwd_entry_t *e) {
  r->e[r->total % TR_HTTP_FORWARDED_MAX_HOPS] = *e;
  r->total++;
}

/* Splits one header line into its list elements (commas outside quoted strings, for
 * Forwarded) and judges each. */
static void tokenise_line(const char *p, size_t n, tr_http_forwarded_header_t header,
                          fwd_ring_t *r) {
  size_t i = 0;
  while (i <= n) {
    size_t start = i;
    bool quoted = false;
    while (i < n) {
      char c = p[i];
      if (header == TR_HTTP_FORWARDED_RFC7239 && quoted && c == '\\' && i + 1 < n) {
        i += 2;
        continue;
      }
      if (header == TR_HTTP_FORWARDED_RFC7239 && c == '"') quoted = !quoted;
      if (c == ',' && !quoted) break;
      i++;
    }
    const char *el = p + start;
    size_t en = i - start;
    trim(&el, &en);
    if (en) {
      fwd_entry_t e = {0};
      if (header == TR_HTTP_FORWARDED_RFC7239)
        forwarded_entry(el, en, &e);
      else
        xff_entry(el, en, &e);
      ring_push(r, &e);
    }
    i++; /* past the comma (or the end) */
  }
}

const char *tr_http_forwarded_status_name(tr_http_forwarded_status_t s) {
  switch (s) {
    case TR_HTTP_FWD_NONE:
      return NULL;
    case TR_HTTP_FWD_ABSENT:
      return "absent";
    case TR_HTTP_FWD_OK:
      return "ok";
    case TR_HTTP_FWD_ALL_TRUSTED:
      return "all-trusted";
    case TR_HTTP_FWD_UNKNOWN:
      return "unknown";
    case TR_HTTP_FWD_OBFUSCATED:
      return "obfuscated";
    case TR_HTTP_FWD_MALFORMED:
      return "malformed";
    case TR_HTTP_FWD_TOO_MANY:
      return "too-many-hops";
    case TR_HTTP_FWD_TOO_LONG:
      return "too-long";
  }
  return NULL;
}

tr_http_forwarded_status_t tr_http_forwarded_client(const tr_http_cidr_t *trusted, size_t n_trusted,
                                                    const tr_http_addr_t *peer,
                                                    tr_http_forwarded_header_t header,
                                                    const char *buf, size_t len,
                                                    tr_http_addr_t *client) {
  *client = *peer;
  if (!n_trusted || !tr_http_trusted(trusted, n_trusted, peer)) return TR_HTTP_FWD_NONE;
  if (!buf) return TR_HTTP_FWD_ABSENT;
  if (len > TR_HTTP_FORWARDED_MAX_BYTES) return TR_HTTP_FWD_TOO_LONG;
  fwd_ring_t r;
  r.total = 0;
  for (size_t i = 0; i < len;) {
    const char *nl = memchr(buf + i, '\n', len - i);
    size_t ln = nl ? (size_t)(nl - (buf + i)) : len - i;
    tokenise_line(buf + i, ln, header, &r);
    i += ln + 1;
  }
  if (r.total == 0) return TR_HTTP_FWD_ABSENT;
  size_t kept = CM_MIN(r.total, (size_t)TR_HTTP_FORWARDED_MAX_HOPS);
  for (size_t k = 0; k < kept; k++) {
    const fwd_entry_t *e = &r.e[(r.total - 1 - k) % TR_HTTP_FORWARDED_MAX_HOPS];
    if (e->kind != TR_HTTP_FWD_OK) return e->kind;
    *client = e->addr;
    if (!tr_http_trusted(trusted, n_trusted, &e->addr)) return TR_HTTP_FWD_OK;
  }
  return r.total > kept ? TR_HTTP_FWD_TOO_MANY : TR_HTTP_FWD_ALL_TRUSTED;
}
