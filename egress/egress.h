/* egress/: the server's egress proxy, the only way out of a sandbox's network namespace.
 *
 * Each sandbox (a run or a build) has a network namespace of its own with nothing in it but
 * loopback.  Its supervisor (sandbox/drop.c) listens on 127.0.0.1:EG_SANDBOX_PORT inside it
 * and passes every connection it accepts, as a file descriptor, over a per-run unix
 * SOCK_SEQPACKET socket pair to this proxy (an eg_session_t per run).  The proxy reads one
 * request head (HTTP CONNECT, a plain-HTTP absolute-URI request, an index request of a
 * build, or a SOCKS5 CONNECT), resolves the name itself (c-ares, on the server's event
 * loop), judges every resolved address against the policy, connects from the host's
 * namespace and relays bytes both ways with bounded buffers.  The socket pair identifies the
 * run: the policy, the counters and the caps are the run's.
 *
 * Pure parts (rules, address classes, the policy decision, request heads, URLs) take
 * (buf, len) and are fuzzed (tests/fuzz/fuzz_egress_*.c).
 *
 * Links only common/ and c-ares; OpenSSL's libssl is opened at run time (dlopen) the first
 * time an index request needs TLS, so a server that never needs it never maps it. */
#ifndef MPS_EGRESS_EGRESS_H
#define MPS_EGRESS_EGRESS_H

#include "common/cm.h"

/* The port of the forwarder inside every sandbox with network (on every loopback address of
 * the sandbox's namespace, 127.0.0.0/8 and ::1; it has nothing but loopback). */
#define EG_SANDBOX_PORT 3128
/* Index n of a build is http://127.0.1.<n+1>:EG_SANDBOX_PORT inside the sandbox: an origin of
 * its own, so that the index's root-relative links stay on it. */
#define EG_INDEX_NET_A 127
#define EG_INDEX_NET_B 0
#define EG_INDEX_NET_C 1

/* ---------------------------------------------------------------- addresses */

typedef struct eg_addr {
  int family;        /* AF_INET or AF_INET6 */
  uint8_t bytes[16]; /* network byte order; the first 4 for AF_INET */
} eg_addr_t;

/* Parses a literal address: IPv4 in strict dotted-quad form (four decimal parts, no leading
 * zeros) or IPv6 (RFC 4291 text, optionally with a dotted-quad tail), without brackets or
 * zone.  0 on success, -1 if it is not one. */
int eg_addr_parse(const char *buf, size_t len, eg_addr_t *out);
/* IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d, except :: and ::1) and NAT64
 * (64:ff9b::a.b.c.d) IPv6 addresses as the IPv4 address they carry; others unchanged. */
void eg_addr_normalise(const eg_addr_t *in, eg_addr_t *out);
/* Text form ("198.51.100.1", "2001:db8::1") into buf (at least 46 bytes); returns buf. */
const char *eg_addr_format(const eg_addr_t *a, char *buf, size_t size);
bool eg_addr_equal(const eg_addr_t *a, const eg_addr_t *b);
/* Is a within net/prefix (same family; prefix in bits)? */
bool eg_addr_in(const eg_addr_t *a, const eg_addr_t *net, unsigned prefix);

/* Why an address is not on the public internet, judged after eg_addr_normalise: "loopback",
 * "unspecified", "private", "shared (CGNAT)", "link-local", "cloud metadata", "multicast",
 * "broadcast", "reserved", "unique local (ULA)", "site-local", "documentation",
 * "benchmarking", "IETF protocol assignments", ... (every range IANA's special-purpose
 * registries mark not globally reachable); NULL when it is public. */
const char *eg_addr_class(const eg_addr_t *a);
/* When net/prefix lies wholly within one denied range (the most specific that holds it), that
 * range's class: the class a rule for that net names.  A prefix only partly in a denied range,
 * or in several, or within a globally reachable exception, gets NULL.  A NAT64 or mapped
 * prefix of at least /96 is judged as the IPv4 net it carries. */
const char *eg_net_class(const eg_addr_t *net, unsigned prefix);

/* Is a (normalised first: an IPv4-mapped, -compatible or NAT64 address as the IPv4 address it
 * carries) one of this host's own addresses, as the kernel of the caller's network namespace
 * sees it?  Asked of the kernel, not read from a list: the route lookup for it (RTM_GETROUTE)
 * says RTN_LOCAL.  That covers every interface address however many there are, IPv6 ones,
 * and addresses local through a route (AnyIP: `ip route add local ... dev lo`).  1 = own, 0 =
 * not (or no route at all), -1 = cannot tell (errno). */
int eg_addr_is_local(const eg_addr_t *a);

/* ---------------------------------------------------------------- rules */

typedef enum eg_rule_kind {
  EG_RULE_HOST = 1, /* one host name: "pypi.org" */
  EG_RULE_SUFFIX,   /* "*.example.com": every name below example.com (not example.com) */
  EG_RULE_NET,      /* an address or a prefix: "127.0.0.1", "10.0.0.0/8", "[fd00::]/8" */
} eg_rule_kind_t;

#define EG_HOST_MAX 253
#define EG_RULE_TEXT_MAX 300

typedef struct eg_rule {
  eg_rule_kind_t kind;
  char host[EG_HOST_MAX + 2];  /* HOST: the lower-case name; SUFFIX: ".example.com" */
  eg_addr_t addr;              /* NET: the network, masked, normalised */
  unsigned prefix;             /* NET: the prefix length in bits */
  uint16_t port;               /* 0 = every port */
  char text[EG_RULE_TEXT_MAX]; /* canonical text, for messages */
} eg_rule_t;

/* Parses one rule: NAME, *.SUFFIX, IPV4[/LEN], IPV6[/LEN] or [IPV6[/LEN]], each with an
 * optional :PORT (IPv6 only in brackets then).  Names are LDH labels (and '_') of at most
 * 63 characters, 253 in all, matched case-insensitively; a trailing dot is dropped.  On
 * failure -1 with CM_ERR_INVALID and a message naming the rule. */
int eg_rule_parse(const char *buf, size_t len, eg_rule_t *out, cm_error_t *err);
/* Does the rule name this host (a lower-case name without trailing dot) and port?  Only
 * HOST and SUFFIX rules match names. */
bool eg_rule_match_name(const eg_rule_t *r, const char *host, uint16_t port);
/* Does the rule cover this (normalised) address and port?  Only NET rules match addresses. */
bool eg_rule_match_addr(const eg_rule_t *r, const eg_addr_t *a, uint16_t port);

/* ---------------------------------------------------------------- policy */

/* What a sandbox may reach.  Deny rules win over everything.  An allow rule that names a
 * destination opens it even in a denied range: an address rule for the addresses it covers
 * where it names their range (it lies within it: eg_net_class of the rule is the address's
 * class; so 0.0.0.0/0 or 64:ff9b::/96 opens public addresses only, and only a rule of that one
 * address opens the server's own), a host rule for whatever that name resolves to (the
 * operator named that host).  A *.suffix
 * rule opens only public addresses below the suffix: anyone who controls a name under it
 * could point that name anywhere.  With public_internet, every public address (eg_addr_class
 * NULL, and not one of the server's own addresses) is allowed as well. */
typedef struct eg_policy {
  bool public_internet;
  eg_rule_t *allow;
  size_t n_allow;
  eg_rule_t *deny;
  size_t n_deny;
  /* Why a destination no rule allows is refused when !public_internet, e.g. "not an index
   * host"; NULL: "not allowed". */
  const char *closed_reason;
} eg_policy_t;

#define EG_REASON_MAX 200

/* The decision before resolving host (a lower-case name or an address literal) at port:
 * -1 = refused (reason in why: a deny rule, or a name no rule can allow under a closed
 * policy or narrowing, which is then never sent to a resolver), 0 = resolve and judge each
 * address.  narrow (NULL = none) is a call's own list: only what it names, within base. */
int eg_policy_precheck(const eg_policy_t *base, const eg_rule_t *narrow, size_t n_narrow,
                       const char *host, uint16_t port, char *why, size_t why_size);
/* The decision for one resolved address of host: true = allowed; false with why.  own: the
 * server host's own addresses (normalised), refused like a private range unless an address
 * rule names them. */
bool eg_policy_allows(const eg_policy_t *base, const eg_rule_t *narrow, size_t n_narrow,
                      const char *host, const eg_addr_t *addr, uint16_t port, const eg_addr_t *own,
                      size_t n_own, char *why, size_t why_size);
/* An address that the name of a --network-deny NAME rule (base->deny[deny]) resolved to, at
 * connect time. */
typedef struct eg_name_addr {
  size_t deny;
  eg_addr_t addr;
} eg_name_addr_t;
/* Does a name rule deny this destination by its address?  A rule for a name denies the
 * destination that name is: the addresses it resolves to, whatever name or literal a client
 * uses to reach them.  Returns the deny rule (a host rule whose port applies) one of whose
 * resolved addresses (resolved[0..n)) equals addr (both normalised), or NULL.  A *.suffix
 * rule cannot be resolved: it denies names only. */
const eg_rule_t *eg_policy_deny_resolved(const eg_policy_t *base, const eg_name_addr_t *resolved,
                                         size_t n, const eg_addr_t *addr, uint16_t port);
/* Must the name of this deny rule be resolved to judge a destination at port? */
bool eg_rule_deny_resolves(const eg_rule_t *r, uint16_t port);
/* Can a call's rule reach anything base allows?  false (and why) when base denies it
 * entirely: an address rule wholly in a denied range that no allow rule of base overlaps, or
 * covered by a deny rule; a name a deny rule of base names. */
bool eg_policy_narrowing_ok(const eg_policy_t *base, const eg_rule_t *rule, char *why,
                            size_t why_size);
/* Frees the rule arrays of a policy built with eg_policy_add_*; the struct is zeroed. */
void eg_policy_release(eg_policy_t *p);
/* Appends a copy of r. */
void eg_policy_add_allow(eg_policy_t *p, const eg_rule_t *r);
void eg_policy_add_deny(eg_policy_t *p, const eg_rule_t *r);
/* A deep copy (closed_reason is a static string and is shared). */
void eg_policy_copy(eg_policy_t *dst, const eg_policy_t *src);
/* Adds to p an allow rule for the host and port of an http(s) URL (exact name or address);
 * -1 when it is not one. */
int eg_policy_allow_url(eg_policy_t *p, const char *url);

/* ---------------------------------------------------------------- HTTP request heads */

#define EG_HEAD_MAX 16384
#define EG_MAX_HEADERS 96

typedef struct eg_span {
  size_t off, len;
} eg_span_t;

typedef struct eg_header {
  eg_span_t name, value; /* value without surrounding blanks */
} eg_header_t;

typedef enum eg_form {
  EG_FORM_AUTHORITY = 1, /* CONNECT host:port */
  EG_FORM_ABSOLUTE,      /* GET http://host[:port]/path */
  EG_FORM_ORIGIN,        /* GET /path (an index request on the forwarder) */
} eg_form_t;

typedef struct eg_request {
  size_t head_len; /* through the blank line */
  eg_span_t method;
  eg_form_t form;
  char host[EG_HOST_MAX + 1]; /* lower-case; an IPv6 literal without brackets; "" for origin form */
  uint16_t port;              /* explicit or the scheme's default */
  eg_span_t path;    /* origin form: the target; absolute: after the authority ("" = "/") */
  int minor_version; /* HTTP/1.<minor> */
  eg_header_t headers[EG_MAX_HEADERS];
  size_t n_headers;
} eg_request_t;

/* Parses a request head from the start of buf.  1 = complete (req filled), 0 = not yet
 * complete (more bytes may follow: len < EG_HEAD_MAX), -1 = malformed, too large, or a
 * form this proxy does not take (an https:// absolute URI: clients use CONNECT for TLS). */
int eg_http_parse_request(const char *buf, size_t len, eg_request_t *req);

typedef struct eg_response {
  size_t head_len;
  int status;
  eg_header_t headers[EG_MAX_HEADERS];
  size_t n_headers;
} eg_response_t;
/* The same for a response head (status line, headers) from upstream: at most
 * EG_MAX_HEADERS - 1 headers, so that the head forwarded with "Connection: close" added
 * stays within EG_MAX_HEADERS. */
int eg_http_parse_response(const char *buf, size_t len, eg_response_t *resp);
/* The same with a header limit of one's own (at most EG_MAX_HEADERS): a forwarded head is
 * checked with EG_MAX_HEADERS. */
int eg_http_parse_response_limit(const char *buf, size_t len, eg_response_t *resp,
                                 size_t max_headers);

/* Is this header (by name) one that a proxy must not pass on: Connection, Keep-Alive,
 * Proxy-*, TE, Trailer, Upgrade, Close, or one the head's Connection header lists? */
bool eg_http_hop_header(const char *buf, const eg_header_t *headers, size_t n_headers,
                        const eg_header_t *h);

/* What eg_http_forward_head leaves out besides hop-by-hop headers. */
typedef enum eg_forward_flags {
  /* A page of an index whose links are read from the answer: no Accept-Encoding, no
   * conditional (If-None-Match, If-Modified-Since, If-Range) and no Range, so that the
   * answer is the whole page, as it is. */
  EG_FORWARD_PAGE = 1,
} eg_forward_flags_t;

/* Appends the head to send upstream for req (parsed from buf): the request line in origin
 * form with path (NULL = req's own), the headers without hop-by-hop ones (and what flags
 * say), Host, and Authorization (NULL = the client's own, if any) replaced by the given
 * values, and "Connection: close".  With authorization (the server's credentials, which go
 * with reads without a body only) also without Expect. */
void eg_http_forward_head(const char *buf, const eg_request_t *req, const char *path,
                          size_t path_len, const char *host_header, const char *authorization,
                          unsigned flags, cm_buf_t *out);
/* Appends a response head with the hop-by-hop headers dropped and "Connection: close" (not
 * to an interim, 1xx, head); with drop_cookies also Set-Cookie (an answer from a credentialed
 * index's origin: a session cookie issued for the credentials is as good as they are). */
void eg_http_forward_response(const char *buf, const eg_response_t *resp, bool drop_cookies,
                              cm_buf_t *out);
/* Every response head at the start of buf up to the final one: interim (1xx) heads come
 * first, as many as upstream sends, and each is rewritten like the final one
 * (eg_http_forward_response) and appended to out.  1 = the final head was rewritten too:
 * *consumed is the length of all the heads, *final the final head parsed (its spans relative
 * to buf + *final_off); 0 = no final head yet: the complete interim heads were appended and
 * *consumed covers them (the caller drops them and keeps the rest for later); -1 = a
 * malformed or oversized head, or 101 Switching Protocols (the proxy never forwards an
 * Upgrade). */
int eg_http_rewrite_heads(const char *buf, size_t len, bool drop_cookies, cm_buf_t *out,
                          size_t *consumed, eg_response_t *final, size_t *final_off);

/* ---------------------------------------------------------------- SOCKS5 */

/* A SOCKS5 client's greeting (RFC 1928) at the start of buf: 1 = complete and it offers "no
 * authentication" (*consumed bytes; answer 05 00), 0 = need more, -1 = malformed or no
 * acceptable method. */
int eg_socks5_greeting(const uint8_t *buf, size_t len, size_t *consumed);
/* The request that follows: 1 = a complete CONNECT (*consumed bytes; host gets a domain name
 * lower-cased or an address in text form), 0 = need more, -1 = malformed, another command,
 * or a bad name. */
int eg_socks5_request(const uint8_t *buf, size_t len, size_t *consumed, char *host,
                      size_t host_size, uint16_t *port);

/* ---------------------------------------------------------------- URLs */

typedef struct eg_url {
  bool https;
  char host[EG_HOST_MAX + 1]; /* lower-case; IPv6 without brackets */
  uint16_t port;              /* explicit or the scheme's default */
  bool explicit_port;
  char *user, *password; /* percent-decoded, heap; NULL when absent */
  char *path;            /* from the first '/' on (with the query); "/" when empty; heap */
} eg_url_t;

/* Parses an http:// or https:// URL.  0, or -1 when it is neither or malformed. */
int eg_url_parse(const char *buf, size_t len, eg_url_t *out);
void eg_url_release(eg_url_t *u);
/* The URL without its password (user kept), for keys and messages.  Heap. */
char *eg_url_redact(const char *url);

/* ---------------------------------------------------------------- an index's pages and links */

/* What the server's index credentials may go with (egress/links.c).  A build reaches its
 * index through the forwarder; the proxy adds the credentials only to requests below the index
 * URL's path and to the files the index's own pages linked to, never to anything else on the
 * index's host (an API, another project's packages, ...). */

/* The longest link a page may carry and still be remembered. */
#define EG_LINK_MAX 4096

/* Is target (a request's path and query, (buf, len)) below base, the index URL's path (query
 * ignored; "/simple" and "/simple/" cover "/simple", "/simple/" and everything under
 * "/simple/"), and is what follows base spelled plainly: no "." or ".." segment (also with
 * ";params"), no backslash, no encoded dot, slash, backslash, percent sign or NUL (which a
 * server may decode into a way out of base)? */
bool eg_index_path_below(const char *base, const char *target, size_t len);

/* The canonical form of a target for comparing links: every percent-escape of a byte other
 * than '/', '?', '#', '%' and '.' decoded, and every byte outside RFC 3986's unreserved,
 * sub-delims, ':', '@', '/' and '?' encoded (upper-case hex), so that the spellings clients
 * make of one link (pip re-quotes a link's path) compare equal.  Heap. */
char *eg_path_canon(const char *target, size_t len);

/* A page's link (an href, or a JSON "url"), (buf, len), resolved against the page's target
 * on the index's origin: the absolute target (path with dot segments removed, query kept,
 * fragment dropped) when the link stays on that origin (relative, root-relative, or absolute
 * or scheme-relative with the origin's scheme, host and port, without credentials); NULL for
 * anything else (another origin or scheme, control characters, longer than EG_LINK_MAX).
 * Heap. */
char *eg_link_resolve(const eg_url_t *origin, const char *page_target, const char *link,
                      size_t len);

/* The links an index's pages named, remembered for the credentials of the requests that
 * follow: at most max_links of them and max_bytes of text; the oldest go first. */
typedef struct eg_link_set eg_link_set_t;
eg_link_set_t *eg_link_set_new(size_t max_links, size_t max_bytes);
void eg_link_set_free(eg_link_set_t *s);
/* Remembers a resolved target (stored in canonical form). */
void eg_link_set_add(eg_link_set_t *s, const char *target, size_t len);
/* Is target (canonicalised here) remembered? */
bool eg_link_set_has(const eg_link_set_t *s, const char *target, size_t len);
size_t eg_link_set_count(const eg_link_set_t *s);

/* May the credentials of an index whose URL's path is base (and whose pages named links, NULL
 * = none) go with a request for target: below base (eg_index_path_below), or a link its pages
 * named (or that link's PEP 658 metadata, the link with ".metadata" appended), asked for
 * without a dot segment or a backslash? */
bool eg_index_credentials_apply(const char *base, const eg_link_set_t *links, const char *target,
                                size_t len);

/* Is a response to a page request one whose links are learnt: a 2xx with a body (not 204 or
 * 206), of an index page's type (text/html, application/xhtml+xml, application/json,
 * application/vnd.pypi.simple.*), without a content coding (identity), and framed by its
 * length, by the connection's end or chunked (*chunked)? */
bool eg_page_response_learnable(const char *buf, const eg_response_t *resp, bool *chunked);

/* A page's body scanned for links as it streams past, in pieces of any size: the values of
 * href attributes (quoted or not; "&amp;" decoded) and of JSON "url" members ("\/", "\\" and
 * "\"" decoded; a link with another escape is skipped), undone from chunked framing first when
 * chunked.  Links longer than EG_LINK_MAX are skipped. */
typedef void eg_link_fn(void *data, const char *link, size_t len);
typedef struct eg_page_scan {
  bool chunked;
  int chunk_state;
  uint64_t chunk_left;
  unsigned chunk_digits;
  int state;
  int kind;
  unsigned match_href, match_url;
  char quote;
  bool skip;
  size_t len;
  char value[EG_LINK_MAX];
} eg_page_scan_t;
void eg_page_scan_init(eg_page_scan_t *s, bool chunked);
/* 0, or -1 once the chunked framing is broken (nothing more is scanned). */
int eg_page_scan_feed(eg_page_scan_t *s, const char *buf, size_t len, eg_link_fn *fn, void *data);

/* The variables that point a sandbox's clients at its forwarder (HTTP_PROXY, HTTPS_PROXY,
 * ALL_PROXY and their lower-case forms, all http://127.0.0.1:EG_SANDBOX_PORT). */
void eg_proxy_env(cm_strv_builder_t *env);

/* ---------------------------------------------------------------- secrets (egress/secrets.c) */

/* A secret's value is held by the proxy only; a sandbox sees a placeholder
 * ("mps-secret:NAME:<32 hex>", one per call and secret) that the proxy replaces by the value in
 * the header values and the request target of a request that goes to a host the secret is
 * bound to (over TLS the proxy terminates), and refuses (403) anywhere else it sees it. */
#define EG_SECRET_NAME_MAX 64
#define EG_SECRET_VALUE_MAX 8192
#define EG_SECRET_PREFIX "mps-secret:"
#define EG_SECRET_PLACEHOLDER_MAX (sizeof EG_SECRET_PREFIX + EG_SECRET_NAME_MAX + 1 + 32)

/* A value's memory: mmap'd, kept out of core dumps (MADV_DONTDUMP) and wiped when freed. */
typedef struct eg_secret_value {
  char *data;
  size_t len, mapped;
} eg_secret_value_t;
/* Copies value (at most EG_SECRET_VALUE_MAX bytes) into v, wiping what v held. */
void eg_secret_value_set(eg_secret_value_t *v, const char *value, size_t len);
void eg_secret_value_wipe(eg_secret_value_t *v);

/* Is name a secret's name: [A-Z][A-Z0-9_]{0,63}? */
bool eg_secret_name_ok(const char *name, size_t len);
/* A new placeholder for name into out (EG_SECRET_PLACEHOLDER_MAX bytes): the prefix, the name,
 * ':' and 32 random hex digits. */
void eg_secret_placeholder(const char *name, char *out, size_t out_size);

/* One placeholder a request may carry: what replaces it (value) where bound says it may go. */
typedef struct eg_secret_binding {
  const char *placeholder;
  size_t placeholder_len;
  const char *value; /* NULL: never replaced here (only looked for) */
  size_t value_len;
  bool bound; /* the request goes to a host (and port) the secret is bound to */
} eg_secret_binding_t;

#define EG_SECRET_BINDINGS_MAX 64
/* The request head buf (parsed as req) with every placeholder of a bound binding replaced by
 * its value in the request target and in header values (also inside the base64 of an
 * `Authorization: Basic` value), written whole into out (the request line and the headers as
 * they came; the caller re-parses it).  *used gets a bit per binding (of the first 64)
 * replaced.  1 = something was replaced, 0 = no placeholder at all (out untouched), -1 = a
 * placeholder of a binding that is not bound here is in the head (anywhere, or inside a Basic
 * value), or one of a bound binding sits where nothing is replaced (a header's name, across a
 * name and its value): refuse the request (*refused = that binding's index).  At most
 * EG_SECRET_BINDINGS_MAX bindings are looked at.  A head that would grow past
 * EG_HEAD_MAX is -1 with *refused = n. */
int eg_secret_rewrite_head(const char *buf, const eg_request_t *req, const eg_secret_binding_t *b,
                           size_t n, cm_buf_t *out, uint64_t *used, size_t *refused);

/* ---------------------------------------------------------------- the proxy */

typedef struct eg_proxy eg_proxy_t;
typedef struct eg_session eg_session_t;

typedef struct eg_proxy_config {
  /* c-ares server list ("127.0.0.1:5353,[::1]:53"), or NULL for the host's resolv.conf. */
  const char *dns_servers;
  uint64_t max_connections;       /* per run at once (more wait in the sandbox); 0 = 64 */
  uint64_t max_total_connections; /* per run in all (more are refused); 0 = 4096 */
  uint64_t rate_bytes;            /* per run, bytes per second both ways together; 0 = none */
  const char *ca_file; /* PEM trusted besides the system store for upstream TLS, or NULL */
} eg_proxy_config_t;

/* Creates the proxy on loop (c-ares channel, no sockets yet).  Fails when the resolver
 * cannot be set up (a malformed dns_servers, say). */
eg_proxy_t *eg_proxy_new(cm_loop_t *loop, const eg_proxy_config_t *cfg, cm_error_t *err);
/* Closes every session's connections and frees the proxy (sessions must be closed first by
 * their owners, or are closed here). */
void eg_proxy_free(eg_proxy_t *p);
/* Registers an index URL (credentials included) that build sessions may reach through the
 * forwarder as http://127.0.1.<n+1>:EG_SANDBOX_PORT/<path> (directly, or as a proxied
 * absolute URI); the proxy adds the credentials (Basic) itself, to reads (GET, HEAD) below the
 * URL's path and of the files its pages linked to only (eg_index_credentials_apply), and
 * speaks TLS to an https index.  Returns n, or -1. */
int eg_proxy_add_index(eg_proxy_t *p, const char *url, cm_error_t *err);
/* The URL the builder gets for index n: the forwarder's origin of the index plus its path.  Heap.
 */
char *eg_proxy_index_url(eg_proxy_t *p, int n);
/* The certificate (PEM) of the CA the proxy makes leaf certificates with for the connections
 * it intercepts (a secret's hosts): made at the first call, its key kept in memory only.
 * NULL (and err) when libcrypto cannot make it. */
const char *eg_proxy_ca_pem(eg_proxy_t *p, cm_error_t *err);
/* "resolver: the host's resolv.conf" or the servers, for check_environment.  Heap. */
char *eg_proxy_describe(eg_proxy_t *p);

typedef enum eg_session_flags {
  EG_SESSION_INDEX = 1, /* a build: index requests are served (with their credentials) */
  /* A held sandbox (prestarted, waiting for a call): no egress at all until eg_session_open.
   * Its socket pair is not even read: what the sandbox opens (a .pth of its environment runs
   * before any call) waits in the sandbox, holding none of the server's descriptors and
   * nothing of the connection caps. */
  EG_SESSION_HELD = 2,
} eg_session_flags_t;

/* A run's session: policy is copied.  *sandbox_fd gets the sandbox's end of the socket pair
 * (close-on-exec; the caller passes it to the supervisor and closes it once the sandbox
 * runs).  The session serves until eg_session_close() (a held one from eg_session_open). */
eg_session_t *eg_session_new(eg_proxy_t *p, const eg_policy_t *policy, unsigned flags,
                             int *sandbox_fd, cm_error_t *err);
/* The go of a held session (a no-op, 0, for one that is not held): the connections the sandbox
 * opened while held that wait in the socket pair are closed (at most 1024; their number is
 * returned), then the session serves.  Narrow it first (eg_session_narrow): every connection
 * it takes from then on, one opened before the go that was still on its way included, is
 * judged by the narrowed policy; none was ever judged by another. */
size_t eg_session_open(eg_session_t *s);
/* Narrows the session to a call's rules (copied): only what they name, within the policy.
 * n = 0 removes a narrowing.  It judges the connections taken from then on: narrow a held
 * session before its go, and a running one never (what it has open stays open). */
void eg_session_narrow(eg_session_t *s, const eg_rule_t *rules, size_t n);

/* Gives the session a secret (at most EG_SESSION_SECRETS_MAX): placeholder (copied) stands for
 * value, which is not copied (the caller keeps it alive, and may change it, until the session
 * is closed), on requests to a destination hosts names (copied; a name rule without a port
 * binds port 443 only).  The proxy terminates TLS for a CONNECT to such a destination.
 * Returns the secret's index in the session (its bit in eg_stats_t.secrets_used), or -1. */
#define EG_SESSION_SECRETS_MAX 32
int eg_session_add_secret(eg_session_t *s, const char *name, const char *placeholder,
                          const eg_secret_value_t *value, const eg_rule_t *hosts, size_t n_hosts);

#define EG_DENIED_MAX 20

typedef struct eg_denied {
  char host[EG_HOST_MAX + 1];
  uint16_t port;
  char reason[EG_REASON_MAX];
} eg_denied_t;

typedef struct eg_stats {
  uint64_t connections; /* connections the sandbox opened to the forwarder */
  uint64_t bytes_in;    /* from destinations to the sandbox */
  uint64_t bytes_out;   /* from the sandbox to destinations */
  size_t n_denied;      /* distinct destinations denied, as far as kept */
  eg_denied_t denied[EG_DENIED_MAX];
  uint64_t denied_more;     /* denials beyond the kept ones */
  uint64_t secrets_used;    /* bit i: the session's secret i was substituted at least once */
  uint64_t secrets_refused; /* bit i: a request carrying secret i's placeholder was refused */
} eg_stats_t;

void eg_session_stats(const eg_session_t *s, eg_stats_t *out);
/* Closes every connection of the session and its socket pair end, and frees it. */
void eg_session_close(eg_session_t *s);

#endif
