/* transport/ internals shared between the HTTP transport, its unit tests and its fuzz
 * targets: the pure parsers and formatters of the Streamable HTTP transport.  Every
 * parser takes (buf, len) and never relies on a terminator. */
#ifndef MPS_TRANSPORT_INTERNAL_H
#define MPS_TRANSPORT_INTERNAL_H

#include <jansson.h>
#include <sys/socket.h>

#include "transport/tr.h"

/* Bytes the stdio transport has searched for line ends so far: linear in what it read, however
 * the lines were split across reads (the unit test's measure). */
uint64_t tr_stdio_bytes_searched(const tr_stdio_t *t);

/* Longest host name we keep (a DNS name is at most 253 characters). */
#define TR_HTTP_HOST_MAX 256

/* Which of JSON and SSE an Accept header admits.  Lenient, as the MCP notes advise:
 * application/json, application/ * and * / * admit JSON; text/event-stream, text/ * and
 * * / * admit SSE; a range with q=0 admits nothing.  The caller treats an absent header
 * as admitting both. */
void tr_http_parse_accept(const char *buf, size_t len, bool *json, bool *sse);

/* Is the media type of a Content-Type value `type` (case-insensitive, parameters such as
 * "; charset=utf-8" ignored)? */
bool tr_http_media_type_is(const char *buf, size_t len, const char *type);

/* The host name of a Host header value ("name[:port]" or "[v6][:port]"), lower-cased,
 * without brackets, port or one trailing dot, into out (NUL-terminated).  Returns 0, or
 * -1 if the value is malformed or longer than out_size - 1. */
int tr_http_host_name(const char *buf, size_t len, char *out, size_t out_size);

/* The host name of an Origin value ("scheme://host[:port]"), as tr_http_host_name.
 * "null", user info, paths and empty hosts are refused (-1). */
int tr_http_origin_host(const char *buf, size_t len, char *out, size_t out_size);

/* An Origin value split into its scheme (lower-cased, at most 31 characters), host name
 * (as tr_http_origin_host) and port (the scheme's default, 80 for http and 443 for https,
 * when absent; 0 for another scheme without one).  Returns 0, or -1 as tr_http_origin_host. */
int tr_http_origin_parse(const char *buf, size_t len, char scheme[32], char *host, size_t host_size,
                         unsigned *port);

/* The file name for "Content-Disposition: attachment" of a download path
 * ("<run-id>/outputs/a%20b.html"): its last component, percent-decoded, with every byte
 * outside [A-Za-z0-9._+-] replaced by '_', leading dots dropped, at most out_size - 1
 * (and at most 128) bytes; "download" when nothing is left.  out is NUL-terminated, and
 * the name never needs quoting or escaping in a quoted-string. */
void tr_http_attachment_name(const char *buf, size_t len, char *out, size_t out_size);

/* localhost, 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (a host name as returned above). */
bool tr_http_loopback_name(const char *name);

/* Event ids are "<stream>-<seq>" (decimal, no sign, no leading garbage).  Returns 0 or -1. */
int tr_http_parse_event_id(const char *buf, size_t len, uint64_t *stream, uint64_t *seq);

/* Appends one SSE event to out: "id: <stream>-<seq>" when with_id, "event: <event>" when
 * event is not NULL, one "data: " line per line of data (CR, LF and CRLF all end a line,
 * so the client's reassembly gives back data with LF line ends), then a blank line. */
void tr_http_sse_event(cm_buf_t *out, const char *event, bool with_id, uint64_t stream,
                       uint64_t seq, const char *data, size_t len);

/* The token of an Authorization value "Bearer <token>" (scheme case-insensitive).
 * Returns 0 with *token pointing into buf, or -1. */
int tr_http_bearer_token(const char *buf, size_t len, const char **token, size_t *token_len);

/* Bearer tokens, kept only as SHA-256 digests. */
typedef struct tr_http_token {
  char *name;   /* the "name:" prefix, or "line N" */
  bool unnamed; /* "line N": named after its place in the file, not by the file */
  unsigned char sha256[32];
} tr_http_token_t;

#define TR_HTTP_MAX_TOKENS 4096

/* Parses a token file: one token per line, an optional "name:" prefix, blank lines and
 * lines starting with '#' ignored, surrounding blanks trimmed.  A token must be visible
 * ASCII.  Fails (CM_ERR_INVALID) on a malformed line, on no token at all and on more than
 * TR_HTTP_MAX_TOKENS. */
int tr_http_parse_tokens(const char *buf, size_t len, tr_http_token_t **tokens, size_t *count,
                         cm_error_t *err);
void tr_http_tokens_free(tr_http_token_t *tokens, size_t count);
/* The matching token, or NULL.  Compares SHA-256 digests in constant time and always looks
 * at every token. */
const tr_http_token_t *tr_http_token_match(const tr_http_token_t *tokens, size_t count,
                                           const char *token, size_t token_len);

/* A session id as the spec allows it: 1 to 128 visible ASCII characters (0x21-0x7E). */
bool tr_http_session_id_valid(const char *buf, size_t len);

/* The value of an Mcp-Method, Mcp-Name or Mcp-Param-* header (2026-07-28, SEP-2243) as the
 * body would say it: optional whitespace around it dropped; "=?base64?<b64>?=" (exactly
 * that prefix and suffix) decoded from strict, padded base64 to UTF-8 text; anything else
 * literal.  Into out (NUL-terminated, *out_len bytes).  Returns -1, with out unspecified,
 * for a byte outside visible ASCII, space and tab, bad base64 (alphabet, length,
 * padding), decoded bytes that are not UTF-8 or hold a NUL, or a value that does not fit
 * out_size - 1 bytes: nothing is allocated, so the caller's buffer bounds it. */
int tr_http_mcp_header_value(const char *buf, size_t len, char *out, size_t out_size,
                             size_t *out_len);

/* What a POST body holds, as far as the transport must know (200 vs 202, sessions). */
typedef enum tr_http_body_status {
  TR_HTTP_BODY_OK = 0,
  TR_HTTP_BODY_PARSE_ERROR, /* not JSON (-32700) */
  TR_HTTP_BODY_INVALID,     /* JSON but not a JSON-RPC message or batch (-32600) */
} tr_http_body_status_t;

typedef struct tr_http_envelope {
  tr_http_body_status_t status;
  bool batch;
  size_t requests, notifications, responses;
  bool initialize; /* some element is an initialize request */
  /* A single message that is not a response and has a valid id (a string or an integer):
   * that id (a new reference), also when the message is otherwise invalid, so that every
   * error answer to it can carry it; NULL otherwise (batches, notifications, no id). */
  json_t *id;
  /* A single request of the stateless revision (2026-07-28): its params._meta claims a
   * protocol version (modern), and that claim when it is a string (a new reference, else
   * NULL); discover: its method is server/discover, which only that revision has. */
  bool modern;
  json_t *meta_version;
  bool discover;
  /* A single valid request: the message itself (a new reference), so that what the
   * transport checks against it (the 2026-07-28 headers) reads the one parse. */
  json_t *message;
  char why[256]; /* the reason when status != OK */
} tr_http_envelope_t;

/* Classifies a POST body with the router's envelope rules.  A batch's elements are only
 * counted (the router answers bad elements); a single message must be valid.  Release
 * out with tr_http_envelope_release. */
void tr_http_classify(const char *buf, size_t len, tr_http_envelope_t *out);
void tr_http_envelope_release(tr_http_envelope_t *env);
/* The HTTP status of a stateless (2026-07-28) request's answer, one JSON-RPC response
 * (H4): 400 for the errors of a request the server refuses to read (-32602 invalid params,
 * -32020 header mismatch, -32021 missing client capability, -32022 unsupported version),
 * 404 for -32601 (method not found: the body tells it from a legacy server's 404), 200
 * for everything else, a result or a tool's error among it. */
unsigned tr_http_modern_status(const char *buf, size_t len);

/* ---------------------------------------------------------------- the client behind proxies
 *
 * forwarded.c: the client's address when the TCP peer is a trusted proxy (--trusted-proxy),
 * from X-Forwarded-For or Forwarded (RFC 7239).  Pure, allocation-free, bounded. */

/* An IP address; an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is always kept as the IPv4
 * address it carries, so that one client has one form (a dual-stack socket reports IPv4
 * peers mapped). */
typedef struct tr_http_addr {
  int family;              /* AF_INET or AF_INET6 */
  unsigned char bytes[16]; /* network order; the first 4 for AF_INET */
} tr_http_addr_t;

/* A formatted address with its NUL (INET6_ADDRSTRLEN). */
#define TR_HTTP_ADDR_MAX TR_ADDR_MAX

typedef struct tr_http_cidr {
  tr_http_addr_t addr;
  unsigned prefix; /* 0..32 or 0..128 */
} tr_http_cidr_t;

/* Trusted ranges in all, header bytes read (every line of the header together), and hops
 * looked at, from the right. */
#define TR_HTTP_MAX_TRUSTED_PROXIES 64
#define TR_HTTP_FORWARDED_MAX_BYTES (32u << 10)
#define TR_HTTP_FORWARDED_MAX_HOPS 32

/* A literal address: dotted-quad IPv4 (exactly four decimal parts) or IPv6 (no brackets,
 * no zone, no port).  Returns 0 or -1. */
int tr_http_addr_parse(const char *buf, size_t len, tr_http_addr_t *out);
/* From a socket address (AF_INET, AF_INET6); -1 for another family. */
int tr_http_addr_from_sockaddr(const struct sockaddr *sa, tr_http_addr_t *out);
/* The canonical text (inet_ntop: lower-case, compressed IPv6). */
void tr_http_addr_format(const tr_http_addr_t *a, char out[TR_HTTP_ADDR_MAX]);

/* One --trusted-proxy value: comma-separated ADDRESS or ADDRESS/PREFIX items (IPv4 or
 * IPv6; surrounding blanks ignored; an IPv4-mapped prefix of /96 or longer is kept as the
 * IPv4 prefix it covers), appended to v[*n..cap).  Fails (CM_ERR_INVALID) on a malformed
 * item, a prefix too long for its family or with host bits set ("10.0.0.1/8"), and
 * (CM_ERR_LIMIT) past cap items in all; *n is then unchanged. */
int tr_http_parse_trusted(const char *buf, size_t len, tr_http_cidr_t *v, size_t cap, size_t *n,
                          cm_error_t *err);
/* Whether a lies in one of the n ranges. */
bool tr_http_trusted(const tr_http_cidr_t *v, size_t n, const tr_http_addr_t *a);

/* Which header a trusted proxy writes: only that one is read (a client could send the
 * other, and the proxy would pass it on untouched). */
typedef enum tr_http_forwarded_header {
  TR_HTTP_FORWARDED_XFF = 0, /* X-Forwarded-For: addr, addr, ... */
  TR_HTTP_FORWARDED_RFC7239, /* Forwarded: for=...;by=..., for=... */
} tr_http_forwarded_header_t;

/* How the client was found; after the first two, the peer was a trusted proxy. */
typedef enum tr_http_forwarded_status {
  TR_HTTP_FWD_NONE = 0,    /* no trusted proxies, or the peer is not one: the client is
                              the peer, the header is not read */
  TR_HTTP_FWD_ABSENT,      /* the peer is trusted but sent no entry: the peer */
  TR_HTTP_FWD_OK,          /* the first untrusted address from the right */
  TR_HTTP_FWD_ALL_TRUSTED, /* every hop is trusted: the leftmost */
  /* The walk stopped at an entry that names no address; the client is the last address it
   * reached (a trusted hop, or the peer): */
  TR_HTTP_FWD_UNKNOWN,    /* "unknown", or a Forwarded element without for= */
  TR_HTTP_FWD_OBFUSCATED, /* an obfuscated node ("_hidden", RFC 7239 section 6.3) */
  TR_HTTP_FWD_MALFORMED,  /* not an address, or a syntax error in its element */
  TR_HTTP_FWD_TOO_MANY,   /* more than TR_HTTP_FORWARDED_MAX_HOPS trusted hops */
  TR_HTTP_FWD_TOO_LONG,   /* the header is over TR_HTTP_FORWARDED_MAX_BYTES: the peer */
} tr_http_forwarded_status_t;

/* "ok", "absent", "all-trusted", "unknown", "obfuscated", "malformed", "too-many-hops",
 * "too-long"; NULL for TR_HTTP_FWD_NONE. */
const char *tr_http_forwarded_status_name(tr_http_forwarded_status_t s);

/* The client's address of a request from peer.  buf holds every line of the `header` the
 * request carried, in order, each line's value ended or separated by '\n' (a quoted string
 * never spans lines); NULL when it carried none.  Only when peer lies in trusted is buf
 * read: its entries are walked from the right, each trusted address skipped, and the
 * first untrusted one is the client (a client's own entries are to the left of what the
 * proxies appended, so it cannot choose the result).  Empty list elements are ignored.
 *
 * X-Forwarded-For entries: an IPv4 or IPv6 address, "[v6]", "[v6]:port", "v4:port", or
 * "unknown".  Forwarded (RFC 7239): forwarded-pairs separated by ';' (blanks around ';'
 * tolerated), names case-insensitive, values tokens or quoted strings, no name twice in an
 * element; a for= node is IPv4, "[IPv6]" (quoted, as the grammar requires), "unknown" or an
 * obfuscated "_name", with an optional port (1-65535) or obfuscated port.  Returns the
 * status; *client is always set. */
tr_http_forwarded_status_t tr_http_forwarded_client(const tr_http_cidr_t *trusted, size_t n_trusted,
                                                    const tr_http_addr_t *peer,
                                                    tr_http_forwarded_header_t header,
                                                    const char *buf, size_t len,
                                                    tr_http_addr_t *client);

#endif
