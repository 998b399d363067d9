/* Addresses, their classes, rules and the policy decision (see egress.h).  Pure: no system
 * state, every input by (buf, len). */
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/socket.h>

#include "egress/egress-internal.h"

/* ---------------------------------------------------------------- addresses */

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static int parse_ipv4(const char *buf, size_t len, uint8_t out[4]) {
  size_t i = 0;
  for (int part = 0; part < 4; part++) {
    if (part > 0) {
      if (i >= len || buf[i] != '.') return -1;
      i++;
    }
    size_t start = i;
    unsigned v = 0;
    while (i < len && is_digit(buf[i]) && i - start < 3) v = v * 10 + (unsigned)(buf[i++] - '0');
    size_t n = i - start;
    /* No leading zeros: "010" is octal to inet_aton and decimal to others. */
    if (n == 0 || v > 255 || (n > 1 && buf[start] == '0')) return -1;
    out[part] = (uint8_t)v;
  }
  return i == len ? 0 : -1;
}

int eg_addr_parse(const char *buf, size_t len, eg_addr_t *out) {
  memset(out, 0, sizeof *out);
  if (len == 0) return -1;
  if (parse_ipv4(buf, len, out->bytes) == 0) {
    out->family = AF_INET;
    return 0;
  }
  char text[64];
  if (len >= sizeof text || memchr(buf, '\0', len)) return -1;
  for (size_t i = 0; i < len; i++) {
    char c = buf[i];
    if (!(is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.'))
      return -1;
  }
  memcpy(text, buf, len);
  text[len] = '\0';
  if (!memchr(buf, ':', len) || inet_pton(AF_INET6, text, out->bytes) != 1) return -1;
  out->family = AF_INET6;
  return 0;
}

static bool bytes_zero(const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

void eg_addr_normalise(const eg_addr_t *in, eg_addr_t *out) {
  *out = *in;
  if (in->family != AF_INET6) return;
  const uint8_t *b = in->bytes;
  static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b};
  bool mapped = bytes_zero(b, 10) && b[10] == 0xff && b[11] == 0xff;
  bool compat = bytes_zero(b, 12) && !(bytes_zero(b + 12, 3) && b[15] <= 1);
  bool is_nat64 = memcmp(b, nat64, 12) == 0;
  if (!mapped && !compat && !is_nat64) return;
  memset(out, 0, sizeof *out);
  out->family = AF_INET;
  memcpy(out->bytes, b + 12, 4);
}

const char *eg_addr_format(const eg_addr_t *a, char *buf, size_t size) {
  if (!inet_ntop(a->family == AF_INET ? AF_INET : AF_INET6, a->bytes, buf, (socklen_t)size))
    snprintf(buf, size, "?");
  return buf;
}

bool eg_addr_equal(const eg_addr_t *a, const eg_addr_t *b) {
  return a->family == b->family && memcmp(a->bytes, b->bytes, a->family == AF_INET ? 4 : 16) == 0;
}

bool eg_addr_in(const eg_addr_t *a, const eg_addr_t *net, unsigned prefix) {
  if (a->family != net->family) return false;
  unsigned bits = a->family == AF_INET ? 32 : 128;
  if (prefix > bits) return false;
  unsigned full = prefix / 8, rest = prefix % 8;
  if (memcmp(a->bytes, net->bytes, full) != 0) return false;
  if (rest == 0) return true;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a->bytes[full] & mask) == (net->bytes[full] & mask);
}

static void mask_addr(eg_addr_t *a, unsigned prefix) {
  unsigned bits = a->family == AF_INET ? 32 : 128;
  for (unsigned i = prefix; i < bits; i++) a->bytes[i / 8] &= (uint8_t) ~(0x80 >> (i % 8));
}

typedef struct addr_range {
  int family;
  uint8_t bytes[16];
  unsigned prefix;
  const char *why;
} addr_range_t;

/* The ranges IANA's special-purpose address registries mark not globally reachable (plus
 * cloud metadata, and the deprecated ranges that were), most specific first: the first
 * range that holds an address names its class.  An entry with a NULL class is an exception
 * the registry marks globally reachable inside a wider denied range (192.0.0.9, the Teredo
 * prefix whose addresses are judged by the IPv4 address they carry, AS112, ...). */
static const addr_range_t denied_ranges[] = {
    {AF_INET, {169, 254, 169, 254}, 32, "cloud metadata"},
    {AF_INET, {100, 100, 100, 200}, 32, "cloud metadata"},
    {AF_INET, {255, 255, 255, 255}, 32, "broadcast"},
    {AF_INET, {192, 0, 0, 9}, 32, NULL},  /* PCP anycast */
    {AF_INET, {192, 0, 0, 10}, 32, NULL}, /* TURN anycast */
    {AF_INET, {0}, 8, "unspecified"},
    {AF_INET, {127}, 8, "loopback"},
    {AF_INET, {10}, 8, "private"},
    {AF_INET, {172, 16}, 12, "private"},
    {AF_INET, {192, 168}, 16, "private"},
    {AF_INET, {100, 64}, 10, "shared (CGNAT)"},
    {AF_INET, {169, 254}, 16, "link-local"},
    {AF_INET, {192, 0, 0}, 24, "IETF protocol assignments"},
    {AF_INET, {192, 0, 2}, 24, "documentation"},
    {AF_INET, {198, 51, 100}, 24, "documentation"},
    {AF_INET, {203, 0, 113}, 24, "documentation"},
    {AF_INET, {198, 18}, 15, "benchmarking"},
    {AF_INET, {192, 88, 99}, 24, "6to4 relay anycast (deprecated)"},
    {AF_INET, {224}, 4, "multicast"},
    {AF_INET, {240}, 4, "reserved"},
    {AF_INET6, {0}, 128, "unspecified"},
    {AF_INET6, {[15] = 1}, 128, "loopback"},
    {AF_INET6, {0x20, 0x01, 0x00, 0x01, [15] = 1}, 128, NULL},  /* PCP anycast */
    {AF_INET6, {0x20, 0x01, 0x00, 0x01, [15] = 2}, 128, NULL},  /* TURN anycast */
    {AF_INET6, {0x20, 0x01, 0x00, 0x01, [15] = 3}, 128, NULL},  /* DNS-SD SRP anycast */
    {AF_INET6, {0x20, 0x01, 0x00, 0x04, 0x01, 0x12}, 48, NULL}, /* AS112 */
    {AF_INET6, {0x20, 0x01, 0x00, 0x00}, 32, NULL},             /* Teredo */
    {AF_INET6, {0x20, 0x01, 0x00, 0x03}, 32, NULL},             /* AMT */
    {AF_INET6, {0x20, 0x01, 0x00, 0x20}, 28, NULL},             /* ORCHIDv2 */
    {AF_INET6, {0x20, 0x01, 0x00, 0x30}, 28, NULL},             /* Drone Remote ID */
    {AF_INET6, {0x20, 0x01, 0x00, 0x02, 0x00, 0x00}, 48, "benchmarking"},
    {AF_INET6, {0x20, 0x01, 0x00, 0x10}, 28, "ORCHID (deprecated)"},
    {AF_INET6, {0x20, 0x01}, 23, "IETF protocol assignments"},
    {AF_INET6, {0x20, 0x01, 0x0d, 0xb8}, 32, "documentation"},
    {AF_INET6, {0x3f, 0xff}, 20, "documentation"},
    {AF_INET6, {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01}, 48, "local-use IPv4/IPv6 translation"},
    {AF_INET6, {0x01, 0x00, [8] = 0}, 64, "discard-only"},
    {AF_INET6, {0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01}, 64, "dummy prefix"},
    {AF_INET6, {0x5f, 0x00}, 16, "segment routing (SRv6 SIDs)"},
    {AF_INET6, {0xfe, 0x80}, 10, "link-local"},
    {AF_INET6, {0xfe, 0xc0}, 10, "site-local"},
    {AF_INET6, {0xfc}, 7, "unique local (ULA)"},
    {AF_INET6, {0xff}, 8, "multicast"},
};

/* fd00:ec2::254 is fd00:0ec2:0000:...:0254: bytes 14-15 = 0x02 0x54. */
static const uint8_t aws_v6_metadata[16] = {0xfd, 0x00, 0x0e, 0xc2, [14] = 0x02, [15] = 0x54};

static const char *range_of(const eg_addr_t *a) {
  if (a->family == AF_INET6 && memcmp(a->bytes, aws_v6_metadata, 16) == 0) return "cloud metadata";
  for (size_t i = 0; i < CM_ARRAY_SIZE(denied_ranges); i++) {
    const addr_range_t *r = &denied_ranges[i];
    eg_addr_t net = {.family = r->family};
    memcpy(net.bytes, r->bytes, 16);
    if (eg_addr_in(a, &net, r->prefix)) return r->why;
  }
  /* IPv6 outside 2000::/3 (global unicast) and the ranges above is reserved or unassigned. */
  if (a->family == AF_INET6 && (a->bytes[0] & 0xe0) != 0x20) return "reserved";
  return NULL;
}

/* The IPv4 address a 6to4 (2002:V4ADDR::/48) or Teredo (2001:0::/32, the client's address
 * in the last 32 bits, inverted) address leads to: a relay or tunnel on the way delivers to
 * it, so 2002:7f00:1:: is as much the host's loopback as 127.0.0.1 is.  false for others. */
static bool tunnel_ipv4(const eg_addr_t *a, eg_addr_t *v4) {
  if (a->family != AF_INET6) return false;
  const uint8_t *b = a->bytes;
  memset(v4, 0, sizeof *v4);
  v4->family = AF_INET;
  if (b[0] == 0x20 && b[1] == 0x02) {
    memcpy(v4->bytes, b + 2, 4);
    return true;
  }
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) {
    for (int i = 0; i < 4; i++) v4->bytes[i] = (uint8_t)~b[12 + i];
    return true;
  }
  return false;
}

const char *eg_addr_class(const eg_addr_t *a) {
  eg_addr_t n;
  eg_addr_normalise(a, &n);
  if (n.family != AF_INET && n.family != AF_INET6) return "unspecified";
  const char *cls = range_of(&n);
  eg_addr_t v4;
  if (!cls && tunnel_ipv4(&n, &v4)) cls = range_of(&v4);
  return cls;
}

static bool nets_overlap(const eg_addr_t *a, unsigned pa, const eg_addr_t *b, unsigned pb);

const char *eg_net_class(const eg_addr_t *net, unsigned prefix) {
  unsigned bits = net->family == AF_INET ? 32 : 128;
  if (prefix >= bits) return eg_addr_class(net);
  if (net->family == AF_INET6 && prefix >= 96) {
    /* Within the IPv4 space a NAT64 (or mapped) prefix carries: judged as that IPv4 net. */
    eg_addr_t v4;
    eg_addr_normalise(net, &v4);
    if (v4.family == AF_INET) return eg_net_class(&v4, prefix - 96);
  }
  for (size_t i = 0; i < CM_ARRAY_SIZE(denied_ranges); i++) {
    const addr_range_t *r = &denied_ranges[i];
    eg_addr_t rn = {.family = r->family};
    memcpy(rn.bytes, r->bytes, 16);
    if (r->prefix <= prefix && eg_addr_in(net, &rn, r->prefix)) return r->why;
  }
  if (net->family == AF_INET6 && prefix >= 3 && (net->bytes[0] & 0xe0) != 0x20) {
    /* Outside global unicast: reserved, unless it holds IPv4 space (mapped, compatible,
     * NAT64), which is judged as IPv4 and so is mixed. */
    static const eg_addr_t embedded[] = {
        {AF_INET6, {[10] = 0xff, [11] = 0xff}},
        {AF_INET6, {0}},
        {AF_INET6, {0x00, 0x64, 0xff, 0x9b}},
    };
    for (size_t i = 0; i < CM_ARRAY_SIZE(embedded); i++)
      if (nets_overlap(net, prefix, &embedded[i], 96)) return NULL;
    return "reserved";
  }
  return NULL;
}

/* ---------------------------------------------------------------- rules */

static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* A host name: LDH labels (and '_'), 1-63 characters each, at most 253 in all, not all
 * digits and dots (that would be a malformed address).  Lower-cased into out. */
static int parse_name(const char *buf, size_t len, char *out, size_t out_size) {
  if (len > 0 && buf[len - 1] == '.') len--;
  if (len == 0 || len > EG_HOST_MAX || len >= out_size) return -1;
  size_t label = 0;
  bool alpha = false;
  for (size_t i = 0; i < len; i++) {
    char c = lower(buf[i]);
    if (c == '.') {
      if (label == 0 || buf[i - 1] == '-') return -1;
      label = 0;
    } else if ((c >= 'a' && c <= 'z') || is_digit(c) || c == '-' || c == '_') {
      if (c == '-' && label == 0) return -1;
      if (++label > 63) return -1;
      if (!is_digit(c)) alpha = true;
    } else {
      return -1;
    }
    out[i] = c;
  }
  if (label == 0 || buf[len - 1] == '-' || !alpha) return -1;
  out[len] = '\0';
  return 0;
}

int eg_host_parse(const char *buf, size_t len, char *out, size_t out_size) {
  eg_addr_t a;
  if (eg_addr_parse(buf, len, &a) == 0) {
    if (len >= out_size) return -1;
    memcpy(out, buf, len);
    out[len] = '\0';
    return 0;
  }
  return parse_name(buf, len, out, out_size);
}

static int parse_port(const char *buf, size_t len, uint16_t *port) {
  if (len == 0 || len > 5) return -1;
  unsigned v = 0;
  for (size_t i = 0; i < len; i++) {
    if (!is_digit(buf[i])) return -1;
    v = v * 10 + (unsigned)(buf[i] - '0');
  }
  if (v == 0 || v > 65535) return -1;
  *port = (uint16_t)v;
  return 0;
}

/* "ADDR" or "ADDR/LEN" into a normalised, masked network. */
static int parse_net(const char *buf, size_t len, eg_rule_t *r) {
  const char *slash = memchr(buf, '/', len);
  size_t alen = slash ? (size_t)(slash - buf) : len;
  eg_addr_t a;
  if (eg_addr_parse(buf, alen, &a) < 0) return -1;
  unsigned bits = a.family == AF_INET ? 32 : 128, prefix = bits;
  if (slash) {
    const char *p = slash + 1;
    size_t plen = len - alen - 1;
    if (plen == 0 || plen > 3) return -1;
    prefix = 0;
    for (size_t i = 0; i < plen; i++) {
      if (!is_digit(p[i])) return -1;
      prefix = prefix * 10 + (unsigned)(p[i] - '0');
    }
    if (prefix > bits || (plen > 1 && p[0] == '0')) return -1;
  }
  /* A rule in IPv4-mapped or -compatible space means the IPv4 addresses it carries: the
   * kernel reaches exactly those.  A NAT64 rule (64:ff9b::/96) stays in its own family: it
   * names the addresses of the translator's prefix, not every IPv4 destination (what it may
   * open of a denied range is judged on the IPv4 space it carries, see eg_net_class). */
  eg_addr_t n;
  eg_addr_normalise(&a, &n);
  static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b};
  if (n.family == AF_INET && a.family == AF_INET6) {
    if (prefix < 96 || memcmp(a.bytes, nat64, 12) == 0) {
      n = a; /* wider than the embedded space, or NAT64: keep it as IPv6 */
    } else {
      prefix -= 96;
    }
  }
  mask_addr(&n, prefix);
  r->kind = EG_RULE_NET;
  r->addr = n;
  r->prefix = prefix;
  return 0;
}

static void rule_text(eg_rule_t *r) {
  char addr[64], port[8] = "";
  if (r->port) snprintf(port, sizeof port, ":%u", (unsigned)r->port);
  switch (r->kind) {
    case EG_RULE_HOST:
      snprintf(r->text, sizeof r->text, "%s%s", r->host, port);
      break;
    case EG_RULE_SUFFIX:
      snprintf(r->text, sizeof r->text, "*%s%s", r->host, port);
      break;
    case EG_RULE_NET: {
      eg_addr_format(&r->addr, addr, sizeof addr);
      unsigned bits = r->addr.family == AF_INET ? 32 : 128;
      char pfx[8] = "";
      if (r->prefix != bits) snprintf(pfx, sizeof pfx, "/%u", r->prefix);
      if (r->addr.family == AF_INET6 && r->port)
        snprintf(r->text, sizeof r->text, "[%s%s]%s", addr, pfx, port);
      else
        snprintf(r->text, sizeof r->text, "%s%s%s", addr, pfx, port);
      break;
    }
  }
}

int eg_rule_parse(const char *buf, size_t len, eg_rule_t *out, cm_error_t *err) {
  memset(out, 0, sizeof *out);
  cleanup_free char *shown = cm_log_excerpt(buf, len, 80);
  if (len == 0 || len > EG_RULE_TEXT_MAX - 16)
    return cm_error_set(err, 0, CM_ERR_INVALID, "network rule '%s': empty or too long", shown);
  const char *body = buf;
  size_t body_len = len;
  uint16_t port = 0;
  if (buf[0] == '[') {
    const char *close = memchr(buf, ']', len);
    if (!close) goto bad;
    body = buf + 1;
    body_len = (size_t)(close - buf) - 1;
    size_t rest = len - (size_t)(close - buf) - 1;
    if (rest > 0) {
      if (close[1] != ':' || parse_port(close + 2, rest - 1, &port) < 0) goto bad;
    }
    if (parse_net(body, body_len, out) < 0) goto bad;
    /* Brackets hold IPv6 only. */
    if (memchr(body, ':', body_len) == NULL) goto bad;
    out->port = port;
    rule_text(out);
    return 0;
  }
  size_t colons = 0;
  for (size_t i = 0; i < len; i++) colons += buf[i] == ':';
  if (colons == 1) {
    const char *c = memchr(buf, ':', len);
    body_len = (size_t)(c - buf);
    if (parse_port(c + 1, len - body_len - 1, &port) < 0) goto bad;
  } else if (colons > 1) {
    /* Bare IPv6 (no port). */
    if (parse_net(buf, len, out) < 0) goto bad;
    rule_text(out);
    return 0;
  }
  if (parse_net(body, body_len, out) == 0) {
    out->port = port;
    rule_text(out);
    return 0;
  }
  if (body_len > 2 && body[0] == '*' && body[1] == '.') {
    out->host[0] = '.';
    if (parse_name(body + 2, body_len - 2, out->host + 1, sizeof out->host - 1) < 0) goto bad;
    out->kind = EG_RULE_SUFFIX;
  } else {
    if (parse_name(body, body_len, out->host, sizeof out->host) < 0) goto bad;
    out->kind = EG_RULE_HOST;
  }
  out->port = port;
  rule_text(out);
  return 0;
bad:
  memset(out, 0, sizeof *out);
  return cm_error_set(err, 0, CM_ERR_INVALID,
                      "network rule '%s' is not a host name, *.suffix, address or prefix with an "
                      "optional :port (e.g. pypi.org, *.example.com:443, 10.0.0.0/8, [::1]:8080)",
                      shown);
}

bool eg_rule_match_name(const eg_rule_t *r, const char *host, uint16_t port) {
  if (r->port && r->port != port) return false;
  if (r->kind == EG_RULE_HOST) return strcmp(r->host, host) == 0;
  if (r->kind == EG_RULE_SUFFIX) {
    size_t n = strlen(host), s = strlen(r->host);
    return n > s && strcmp(host + n - s, r->host) == 0;
  }
  return false;
}

bool eg_rule_match_addr(const eg_rule_t *r, const eg_addr_t *a, uint16_t port) {
  if (r->kind != EG_RULE_NET || (r->port && r->port != port)) return false;
  /* In either form: an IPv6 rule wider than the embedded IPv4 space it covers still names
   * those addresses as written. */
  eg_addr_t n;
  eg_addr_normalise(a, &n);
  return eg_addr_in(&n, &r->addr, r->prefix) || eg_addr_in(a, &r->addr, r->prefix);
}

/* ---------------------------------------------------------------- policy */

static bool is_literal(const char *host, eg_addr_t *a) {
  return eg_addr_parse(host, strlen(host), a) == 0;
}

static void set_why(char *why, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t size, const char *fmt, ...) {
  if (!why || !size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, size, fmt, ap);
  va_end(ap);
}

static const eg_rule_t *deny_match(const eg_policy_t *p, const char *host, const eg_addr_t *a,
                                   uint16_t port) {
  for (size_t i = 0; i < p->n_deny; i++) {
    const eg_rule_t *r = &p->deny[i];
    if (host && eg_rule_match_name(r, host, port)) return r;
    if (a && eg_rule_match_addr(r, a, port)) return r;
  }
  return NULL;
}

static bool any_name_rule(const eg_rule_t *rules, size_t n, const char *host, uint16_t port) {
  for (size_t i = 0; i < n; i++)
    if (eg_rule_match_name(&rules[i], host, port)) return true;
  return false;
}

static const char *closed(const eg_policy_t *p) {
  return p->closed_reason ? p->closed_reason : "not allowed";
}

int eg_policy_precheck(const eg_policy_t *base, const eg_rule_t *narrow, size_t n_narrow,
                       const char *host, uint16_t port, char *why, size_t why_size) {
  eg_addr_t a;
  if (is_literal(host, &a)) {
    const eg_rule_t *d = deny_match(base, NULL, &a, port);
    if (d) {
      set_why(why, why_size, "denied by --network-deny %s", d->text);
      return -1;
    }
    return 0;
  }
  const eg_rule_t *d = deny_match(base, host, NULL, port);
  if (d) {
    set_why(why, why_size, "denied by --network-deny %s", d->text);
    return -1;
  }
  /* Under a list of rules, only names a rule names are resolved: nothing else leaves the
   * host as a DNS query either. */
  if (narrow && !any_name_rule(narrow, n_narrow, host, port)) {
    set_why(why, why_size, "not in this call's network list");
    return -1;
  }
  if (!base->public_internet && !any_name_rule(base->allow, base->n_allow, host, port)) {
    set_why(why, why_size, "%s", closed(base));
    return -1;
  }
  return 0;
}

/* Does an address rule open an address of class cls (NULL: public) that it matches?  Only
 * when it names that class: the rule lies wholly within the range of that class (127.0.0.1,
 * 10.0.0.0/8, 169.254.169.254), so a wide rule (0.0.0.0/0, ::ffff:0:0/96, 64:ff9b::/96)
 * opens the public addresses it covers and never widens into loopback, link-local, metadata
 * or another denied range.  The server's own (otherwise public) addresses only for a rule
 * that names that one address. */
static bool net_rule_opens(const eg_rule_t *r, const char *cls, bool own_only) {
  if (!cls) return true;
  unsigned bits = r->addr.family == AF_INET ? 32 : 128;
  if (own_only) return r->prefix == bits;
  const char *rc = eg_net_class(&r->addr, r->prefix);
  return rc && strcmp(rc, cls) == 0;
}

bool eg_policy_allows(const eg_policy_t *base, const eg_rule_t *narrow, size_t n_narrow,
                      const char *host, const eg_addr_t *addr, uint16_t port, const eg_addr_t *own,
                      size_t n_own, char *why, size_t why_size) {
  eg_addr_t a;
  eg_addr_normalise(addr, &a);
  eg_addr_t lit;
  const char *name = host && !is_literal(host, &lit) ? host : NULL;
  /* Rules see the address as given (they match its IPv4 form too); the class is judged on
   * the IPv4 form of an embedding one. */
  const eg_rule_t *d = deny_match(base, name, addr, port);
  if (d) {
    set_why(why, why_size, "denied by --network-deny %s", d->text);
    return false;
  }
  const char *cls = eg_addr_class(&a);
  bool own_only = false;
  for (size_t i = 0; !cls && i < n_own; i++) {
    eg_addr_t o;
    eg_addr_normalise(&own[i], &o);
    if (eg_addr_equal(&o, &a)) {
      cls = "this server's own address";
      own_only = true;
    }
  }
  bool ok = base->public_internet && !cls;
  for (size_t i = 0; !ok && i < base->n_allow; i++) {
    const eg_rule_t *r = &base->allow[i];
    if (r->kind == EG_RULE_NET)
      ok = eg_rule_match_addr(r, addr, port) && net_rule_opens(r, cls, own_only);
    else if (name && eg_rule_match_name(r, name, port))
      ok = r->kind == EG_RULE_HOST || !cls;
  }
  if (!ok) {
    if (base->public_internet || !cls)
      set_why(why, why_size, "%s", cls ? cls : closed(base));
    else
      set_why(why, why_size, "%s (%s)", closed(base), cls);
    return false;
  }
  if (narrow) {
    bool listed = false;
    for (size_t i = 0; !listed && i < n_narrow; i++) {
      const eg_rule_t *r = &narrow[i];
      listed = r->kind == EG_RULE_NET ? eg_rule_match_addr(r, addr, port)
                                      : name && eg_rule_match_name(r, name, port);
    }
    if (!listed) {
      set_why(why, why_size, "not in this call's network list");
      return false;
    }
  }
  return true;
}

bool eg_rule_deny_resolves(const eg_rule_t *r, uint16_t port) {
  return r->kind == EG_RULE_HOST && (!r->port || r->port == port);
}

const eg_rule_t *eg_policy_deny_resolved(const eg_policy_t *base, const eg_name_addr_t *resolved,
                                         size_t n, const eg_addr_t *addr, uint16_t port) {
  eg_addr_t a;
  eg_addr_normalise(addr, &a);
  for (size_t i = 0; i < n; i++) {
    if (resolved[i].deny >= base->n_deny) continue;
    const eg_rule_t *r = &base->deny[resolved[i].deny];
    if (!eg_rule_deny_resolves(r, port)) continue;
    eg_addr_t d;
    eg_addr_normalise(&resolved[i].addr, &d);
    if (eg_addr_equal(&a, &d)) return r;
  }
  return NULL;
}

/* Do two networks share an address? */
static bool nets_overlap(const eg_addr_t *a, unsigned pa, const eg_addr_t *b, unsigned pb) {
  if (a->family != b->family) return false;
  unsigned p = pa < pb ? pa : pb;
  return eg_addr_in(a, b, p) && eg_addr_in(b, a, p);
}

static bool ports_overlap(uint16_t a, uint16_t b) {
  return !a || !b || a == b;
}
/* Does a rule with port `cover` apply to every port of a rule with port `of`? */
static bool port_covers(uint16_t cover, uint16_t of) {
  return !cover || cover == of;
}

bool eg_policy_narrowing_ok(const eg_policy_t *base, const eg_rule_t *rule, char *why,
                            size_t why_size) {
  for (size_t i = 0; i < base->n_deny; i++) {
    const eg_rule_t *d = &base->deny[i];
    if (!port_covers(d->port, rule->port)) continue;
    bool covered = false;
    if (rule->kind == EG_RULE_NET && d->kind == EG_RULE_NET)
      covered = d->prefix <= rule->prefix && eg_addr_in(&rule->addr, &d->addr, d->prefix);
    else if (rule->kind == EG_RULE_HOST)
      covered = d->kind != EG_RULE_NET &&
                eg_rule_match_name(d, rule->host, rule->port ? rule->port : d->port);
    else if (rule->kind == EG_RULE_SUFFIX && d->kind == EG_RULE_SUFFIX) {
      size_t n = strlen(rule->host), s = strlen(d->host);
      covered = n >= s && strcmp(rule->host + n - s, d->host) == 0;
    }
    if (covered) {
      set_why(why, why_size, "the server denies it (--network-deny %s)", d->text);
      return false;
    }
  }
  bool host_rules = false;
  for (size_t i = 0; i < base->n_allow; i++) host_rules |= base->allow[i].kind == EG_RULE_HOST;
  if (rule->kind == EG_RULE_NET) {
    const char *cls = eg_net_class(&rule->addr, rule->prefix);
    if (!cls && base->public_internet) return true;
    for (size_t i = 0; i < base->n_allow; i++) {
      const eg_rule_t *r = &base->allow[i];
      /* An allow rule opens a denied range only where it names it (net_rule_opens). */
      const char *rc = r->kind == EG_RULE_NET ? eg_net_class(&r->addr, r->prefix) : NULL;
      if (r->kind == EG_RULE_NET && ports_overlap(r->port, rule->port) &&
          nets_overlap(&r->addr, r->prefix, &rule->addr, rule->prefix) &&
          (!cls || (rc && strcmp(rc, cls) == 0)))
        return true;
      /* A host rule may resolve anywhere; a suffix rule only to public addresses. */
      if (r->kind == EG_RULE_HOST && ports_overlap(r->port, rule->port)) return true;
      if (r->kind == EG_RULE_SUFFIX && !cls && ports_overlap(r->port, rule->port)) return true;
    }
    (void)host_rules;
    if (cls)
      set_why(why, why_size, "%s, a range the server denies and no --network-allow rule opens",
              cls);
    else
      set_why(why, why_size, "%s", closed(base));
    return false;
  }
  if (base->public_internet) return true;
  for (size_t i = 0; i < base->n_allow; i++) {
    const eg_rule_t *r = &base->allow[i];
    if (r->kind == EG_RULE_NET) continue;
    if (!ports_overlap(r->port, rule->port)) continue;
    if (rule->kind == EG_RULE_HOST && eg_rule_match_name(r, rule->host, r->port)) return true;
    if (rule->kind == EG_RULE_SUFFIX) {
      /* Some name below rule's suffix can match r. */
      size_t n = strlen(rule->host), s = strlen(r->host);
      if (r->kind == EG_RULE_HOST && n < s && strcmp(r->host + s - n, rule->host) == 0) return true;
      if (r->kind == EG_RULE_SUFFIX && ((n >= s && strcmp(rule->host + n - s, r->host) == 0) ||
                                        (s >= n && strcmp(r->host + s - n, rule->host) == 0)))
        return true;
    }
  }
  set_why(why, why_size, "%s", closed(base));
  return false;
}

void eg_policy_release(eg_policy_t *p) {
  free(p->allow);
  free(p->deny);
  memset(p, 0, sizeof *p);
}

static void append_rule(eg_rule_t **v, size_t *n, const eg_rule_t *r) {
  *v = xrealloc(*v, (*n + 1) * sizeof **v);
  (*v)[(*n)++] = *r;
}

void eg_policy_add_allow(eg_policy_t *p, const eg_rule_t *r) {
  append_rule(&p->allow, &p->n_allow, r);
}
void eg_policy_add_deny(eg_policy_t *p, const eg_rule_t *r) {
  append_rule(&p->deny, &p->n_deny, r);
}

void eg_policy_copy(eg_policy_t *dst, const eg_policy_t *src) {
  *dst = *src;
  dst->allow = src->n_allow ? xmemdup(src->allow, src->n_allow * sizeof *src->allow) : NULL;
  dst->deny = src->n_deny ? xmemdup(src->deny, src->n_deny * sizeof *src->deny) : NULL;
}
