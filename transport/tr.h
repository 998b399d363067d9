/* transport/: framing of JSON-RPC texts over stdio and HTTP.  A transport delivers one
 * complete JSON text with a reply sink, and writes what the router gives it.  It knows no
 * MCP method and never includes a sandbox/ header.
 *
 * Files: jsonrpc.c (the JSON-RPC message rules), sink.c, stdio.c, tls.c (the self-signed
 * certificate, key/certificate checks), http/parse.c (headers, hosts, origins, event ids, tokens:
 * pure), http/envelope.c (a POST body's JSON-RPC envelope: pure), http/mhd.c (libmicrohttpd, opened
 * on demand), and the transport itself in layers (http/http-internal.h): http/daemon.c (the daemon
 * in our loop), http/stream.c (streams, replay memory), http/session.c (the session table),
 * http/respond.c (answers and checks), http/routes.c (request routing), http/http.c
 * (options, start, shutdown).
 *
 * May use: common/. */
#ifndef MPS_TRANSPORT_TR_H
#define MPS_TRANSPORT_TR_H

#include <jansson.h>

#include "common/cm.h"

/* ---------------------------------------------------------------- JSON-RPC messages */

typedef enum tr_msg_kind {
  TR_MSG_INVALID = 0,
  TR_MSG_REQUEST,
  TR_MSG_NOTIFICATION,
  TR_MSG_RESPONSE,
} tr_msg_kind_t;

typedef struct tr_msg {
  tr_msg_kind_t kind;
  const char *method; /* borrowed from the message */
  json_t *id;         /* borrowed; NULL for notifications and for invalid ids */
  json_t *params;     /* borrowed; NULL when absent */
  const char *error;  /* why it is invalid (a static -32600 message) */
} tr_msg_t;

/* Classifies one parsed JSON-RPC 2.0 message (a batch's element, or a whole text): a
 * request, a notification, a response, or invalid with the reason.  The one copy of these
 * rules: the HTTP transport judges a POST body with it (400 vs 202 vs 200) and the router
 * dispatches with it, so the two can never disagree. */
void tr_jsonrpc_classify(json_t *msg, tr_msg_t *out);

/* ---------------------------------------------------------------- sinks */

/* Where the router writes messages related to one incoming text (its responses and the
 * notifications tied to its requests).  Reference-counted: the transport holds one
 * reference while it hands the text to the router, the router one per pending request.
 * When the last reference goes, nothing more will be sent on it (for HTTP: the end of that
 * POST's answer). */
typedef struct tr_sink tr_sink_t;

typedef enum tr_send_flags {
  TR_SEND_DEFAULT = 0,
  /* May be dropped under back-pressure (progress, log notifications); responses never are. */
  TR_SEND_DROPPABLE = 1,
  /* A JSON-RPC response (or a batch of them); without it, a notification or a request. */
  TR_SEND_RESPONSE = 2,
} tr_send_flags_t;

/* A formatted IP address with its NUL (INET6_ADDRSTRLEN). */
#define TR_ADDR_MAX 46

/* Who sent a text (HTTP; all empty on stdio).  peer: the TCP peer's address.  client: the
 * client's, which is the peer's unless the peer is a trusted proxy (tr_http_options_t
 * trusted_proxies), in which case it is the one the proxies' header names (see tr_http_new).
 * forwarded: NULL when the peer is no trusted proxy (the header was not read), else how
 * the client was found: "ok", "absent", "all-trusted", "unknown", "obfuscated",
 * "malformed", "too-many-hops" or "too-long" (static strings). */
typedef struct tr_remote {
  char peer[TR_ADDR_MAX];
  char client[TR_ADDR_MAX];
  const char *forwarded;
} tr_remote_t;

typedef struct tr_sink_ops {
  void (*send)(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags);
  /* Called when the last reference goes. */
  void (*release)(tr_sink_t *s);
  /* Optional: see tr_sink_close_stream. */
  void (*close_stream)(tr_sink_t *s);
} tr_sink_ops_t;

struct tr_sink {
  const tr_sink_ops_t *ops;
  int refs;
  bool closed; /* the peer is gone: sends are dropped */
  /* See tr_sink_on_peer_gone. */
  void (*peer_gone)(void *data);
  void *peer_gone_data;
  /* Who sent the text this sink answers (for the audit log): set by the transport before
   * it hands the text over; a session's standalone sink (HTTP+SSE messages) has the latest
   * message's, so read it during the hand-over. */
  tr_remote_t remote;
};

void tr_sink_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags);
tr_sink_t *tr_sink_ref(tr_sink_t *s);
void tr_sink_unref(tr_sink_t *s);
/* Ends the peer's current connection to this sink's stream while the sink stays usable:
 * what is sent later is kept for the peer to resume with (HTTP: an SSE POST stream of a
 * 2025-11-25 session, resumed by GET + Last-Event-ID; SEP-1699 polling).  A no-op where
 * the peer could not resume (stdio, JSON answers, older protocol versions). */
void tr_sink_close_stream(tr_sink_t *s);
/* Registers cb(data) (NULL: none) to run once when the peer gives up on this sink's stream
 * before the sink is done with: for HTTP the connection of a stateless (2026-07-28) POST
 * closing before its answer, which that revision makes the request's cancellation; in the
 * handshake era a POST's connection closed by its client before the answer (a JSON answer
 * at once; an SSE stream when no GET with Last-Event-ID resumed it within a few seconds).
 * Stdio never calls it.  The callee must clear it before it lets go of its reference. */
void tr_sink_on_peer_gone(tr_sink_t *s, void (*cb)(void *data), void *data);
/* For transports: the peer is gone; runs and clears the callback. */
void tr_sink_peer_gone(tr_sink_t *s);

/* ---------------------------------------------------------------- stdio */

typedef struct tr_stdio tr_stdio_t;

typedef struct tr_stdio_callbacks {
  /* One complete line (without its line ending), at most max_message_bytes. */
  void (*on_message)(void *data, const char *buf, size_t len, tr_sink_t *reply);
  /* A line longer than max_message_bytes was discarded. */
  void (*on_oversize)(void *data, size_t len, tr_sink_t *reply);
  /* stdin reached EOF (or failed). */
  void (*on_eof)(void *data);
} tr_stdio_callbacks_t;

/* Newline-delimited JSON on in_fd/out_fd (both made non-blocking).  Output is queued and
 * written as the peer reads; droppable messages are dropped while more than
 * max_pending_bytes are queued. */
tr_stdio_t *tr_stdio_new(cm_loop_t *loop, int in_fd, int out_fd, size_t max_message_bytes,
                         const tr_stdio_callbacks_t *cbs, void *data, cm_error_t *err);
tr_sink_t *tr_stdio_sink(tr_stdio_t *t);
/* Stops reading stdin (shutdown). */
void tr_stdio_stop_reading(tr_stdio_t *t);
/* Bytes still queued for stdout. */
size_t tr_stdio_pending(const tr_stdio_t *t);
/* Writes what is queued, waiting at most timeout_ms. */
void tr_stdio_flush(tr_stdio_t *t, int timeout_ms);
void tr_stdio_free(tr_stdio_t *t);

/* ---------------------------------------------------------------- Streamable HTTP */

/* MCP Streamable HTTP (2025-11-25) on opts->path, driven from the loop (libmicrohttpd in
 * external epoll mode; no threads), plus the 2024-11-05 HTTP+SSE endpoints next to it:
 * GET <dir>/sse and POST <dir>/messages?sessionId=, where <dir> is path's parent
 * ("/mcp" -> "/sse" and "/messages"; "/a/mcp" -> "/a/sse" and "/a/messages").
 *
 * Checks, in order: Origin (403; absent is fine; see below), Host (403; only when bound to
 * loopback or when allowed_hosts is set), bearer token (401 + WWW-Authenticate), method
 * (405 + Allow), Content-Type (415), body size (413), JSON / JSON-RPC envelope (400 with
 * -32700 / -32600), Accept (406, lenient, requests only), session (400 without
 * Mcp-Session-Id, 404 for an unknown one), MCP-Protocol-Version (400 unless in
 * protocol_versions; absent is fine).  Protocol errors are the router's: its answers pass
 * through in 200 bodies.  The transport's own error answers are JSON-RPC errors that carry
 * the id of the request when the body was a single request whose id could be read.
 *
 * Origins: one of allowed_origins (exactly); the server's own origin (its scheme and port,
 * and a host the Host check accepts: a loopback name when bound to loopback, or an allowed
 * host, or the bound address itself); or, with loopback_origins on, any http(s) origin on
 * a loopback name (local web clients on other ports).  "null" (sandboxed pages, files) is
 * never allowed.  CORS headers echo only an origin so accepted.
 *
 * Client addresses: a request's TCP peer is its client, unless the peer lies in
 * trusted_proxies.  Then the header those proxies write (every line of it, in order) is
 * walked from the right: trusted addresses are skipped and the first untrusted one is the
 * client, so that a client cannot choose its address by sending the header itself (its
 * entries end up left of what the proxies append).  An entry that names no address
 * ("unknown", an obfuscated node, a malformed entry) ends the walk: the client is then the
 * last address reached.  Bounds: 32 KiB of header, 32 hops (transport-internal.h).  The
 * result reaches the server with each text (tr_sink_t.remote) and each authentication
 * failure; nothing in the transport limits by address.
 *
 * Principals: a request's principal is the name of its bearer token, or "local" when
 * there are no tokens.  A session belongs to the principal that opened it; a request of
 * another principal naming it is answered exactly as for an unknown session (404
 * "Session not found"), on every method and endpoint, Last-Event-ID resumption included.
 * Per principal: at most max_sessions_per_principal sessions (the least recently used idle
 * one of its own makes room, else 429 + Retry-After) and max_streams_per_principal GET
 * streams open at once (429 + Retry-After).  What its clients have yet to read (answers
 * queued for its connections and bodies not yet written to them, what waits in its HTTP+SSE
 * streams) is bounded by max_unread_bytes_per_principal: past it, a body with a request gets 429 +
 * Retry-After (notifications and responses, cancellations among them, still pass; so do GET
 * streams, through which it reads).
 *
 * Answers: 202 for a body without requests; otherwise the form is chosen lazily: one
 * application/json body if the first thing sent is the final response, text/event-stream
 * as soon as a notification comes first.  SSE events carry ids "<stream>-<seq>", unique in
 * the session; a 2025-11-25 session's streams start with a priming event (id, retry, empty
 * data).  A lost connection is not a cancellation: events are kept (bounded, droppable
 * ones dropped first) and GET + Last-Event-ID replays them and re-attaches to the stream.
 * One standalone GET stream per session (a second one: 409).
 *
 * Sessions: a random UUIDv4 issued on a successful initialize; closed by DELETE (200),
 * after session_idle_ms with no request, open stream or running request, or at shutdown;
 * later 404.  At max_sessions an idle session (nothing open or running) makes room: the
 * least recently used one of the principal with the most sessions, taken only from the
 * newcomer's own principal or from one holding more sessions than it; if there is none,
 * initialize gets 503 + Retry-After.
 *
 * Replay memory: events kept for resumption count against max_replay_bytes_per_session
 * and max_replay_bytes (all sessions).  Past either (for the latter, first the principal
 * keeping the most, its session idle the longest), events go
 * in this order: progress
 * and other droppable events and events already written once, of finished streams nobody
 * reads (oldest first), then of the other streams; then whole finished streams nobody
 * reads (oldest first).  A resumption of a stream that lost its response this way gets,
 * in its place, a JSON-RPC error with the request's id saying so, and the stream ends.  On
 * a stream a client is reading only droppable events and events already written go: what
 * it has yet to read of the rest is the answer being delivered. */
typedef struct tr_http tr_http_t;

typedef struct tr_http_callbacks {
  /* A client sent initialize without a session: open a session.  `standalone` is where
   * messages not tied to a request go (the session's GET stream); the callee keeps a
   * reference if it wants one.  `principal` is who opened it (the bearer token's name, or
   * "local" without tokens; valid during the call).  Returns the caller's session object,
   * or NULL to refuse. */
  void *(*session_open)(void *data, tr_sink_t *standalone, const char *principal);
  /* One complete POST body for `session`.  Answers go to `reply`. */
  void (*on_message)(void *data, void *session, const char *buf, size_t len, tr_sink_t *reply);
  /* Optional: one complete POST body of the stateless revision (2026-07-28), a single
   * request, for `principal` (valid during the call); no session.  Answers go to `reply`,
   * whose stream ends with the POST: what is sent after its connection went is dropped.
   * Without it, such bodies are handled as the handshake era's. */
  void (*on_stateless)(void *data, const char *principal, const char *buf, size_t len,
                       tr_sink_t *reply);
  /* The session's negotiated protocol version, or NULL before initialize was answered. */
  const char *(*session_protocol)(void *data, void *session);
  /* DELETE, idle expiry or shutdown: the session is gone (cancel what it runs). */
  void (*session_close)(void *data, void *session);
  /* Optional: GET <path>/runs/<rest> downloads a file the server keeps (a run's output)
   * for `principal` (rest percent-decoded, without "." or ".." segments): opens it (fd read-only,
   * the transport's to close) with its MIME type (static or owned by the server) and size; -1 when
   * there is no such file for that principal (another's is no such file).  It is served as an
   * attachment, with nosniff and a sandboxing Content-Security-Policy, never as a page of the
   * server's origin. */
  int (*open_download)(void *data, const char *principal, const char *rest, int *fd,
                       const char **mime, uint64_t *size);
  /* Optional: GET <base>/readyz answers 200 when it returns true (503 before, and while
   * draining). */
  bool (*ready)(void *data);
  /* Optional: GET <base>/metrics: the server's Prometheus text (heap), to which the
   * transport adds its own families (requests by status, sessions, connections). */
  char *(*metrics)(void *data);
  /* Optional: a request was refused for want of a valid bearer token (remote: who sent it;
   * reason: "missing" or "invalid"; both valid during the call). */
  void (*auth_failed)(void *data, const tr_remote_t *remote, const char *reason);
} tr_http_callbacks_t;

/* Whether http(s) origins on loopback names (any port) are accepted: AUTO = when the
 * server is bound to a loopback address. */
typedef enum tr_http_loopback_origins {
  TR_HTTP_LOOPBACK_ORIGINS_AUTO = 0,
  TR_HTTP_LOOPBACK_ORIGINS_ON,
  TR_HTTP_LOOPBACK_ORIGINS_OFF,
} tr_http_loopback_origins_t;

#define TR_HTTP_REPLAY_SESSION_DEFAULT (16u << 20)
#define TR_HTTP_REPLAY_TOTAL_DEFAULT (128u << 20)
#define TR_HTTP_UNREAD_DEFAULT (256u << 20)

/* A tools/call argument a tool mirrors into a header (its inputSchema property carries
 * "x-mcp-header": header): on a stateless (2026-07-28) POST calling `tool`, the header
 * Mcp-Param-<header> must be present exactly when arguments[property] is (and not null), and
 * say the same (strings exactly, numbers numerically, booleans as true/false; the
 * =?base64?...?= form decoded), else 400 -32020.  Top-level properties only. */
typedef struct tr_http_param_header {
  const char *tool;
  const char *property;
  const char *header; /* the name after "Mcp-Param-" */
} tr_http_param_header_t;

/* Everything is copied by tr_http_new (the PEM texts are only used during the call). */
typedef struct tr_http_options {
  const char *host;                   /* address to bind (IPv4 or IPv6 literal, or a name) */
  uint16_t port;                      /* 0 = an ephemeral port (tests); see tr_http_port() */
  const char *path;                   /* the MCP endpoint, e.g. "/mcp" */
  const char *const *allowed_hosts;   /* extra Host names (NULL-terminated, may be NULL) */
  const char *const *allowed_origins; /* extra Origins (NULL-terminated, may be NULL) */
  const char *auth_token_file;        /* bearer tokens; NULL = no auth */
  bool allow_insecure_remote;         /* listen on a non-loopback address without tokens (else
                                         tr_http_new fails before binding) */
  const char *tls_cert_pem;           /* PEM text (not paths); NULL = plain HTTP */
  const char *tls_key_pem;
  size_t max_body_bytes;
  size_t max_sessions;
  uint64_t session_idle_ms;
  uint64_t stall_ms; /* an SSE stream whose client reads nothing this long is cut; 0 = 60 s */
  size_t max_connections;
  const char *const *protocol_versions;  /* supported MCP-Protocol-Version values */
  size_t max_sessions_per_principal;     /* 0 = no cap */
  size_t max_streams_per_principal;      /* open GET streams; 0 = no cap */
  size_t max_replay_bytes_per_session;   /* 0 = TR_HTTP_REPLAY_SESSION_DEFAULT */
  size_t max_replay_bytes;               /* 0 = TR_HTTP_REPLAY_TOTAL_DEFAULT */
  size_t max_unread_bytes_per_principal; /* 0 = TR_HTTP_UNREAD_DEFAULT */
  tr_http_loopback_origins_t loopback_origins;
  const tr_http_param_header_t *param_headers; /* n_param_headers entries (may be NULL) */
  size_t n_param_headers;
  bool health_auth; /* /healthz and /readyz need a token too (they do not by default) */
  /* --trusted-proxy values (NULL-terminated, may be NULL): comma-separated addresses and
   * ADDRESS/PREFIX ranges, IPv4 and IPv6, at most 64 in all; a malformed one fails
   * tr_http_new.  trusted_proxy_header: the header they write, "x-forwarded-for" (NULL) or
   * "forwarded" (RFC 7239); the other one is never read. */
  const char *const *trusted_proxies;
  const char *trusted_proxy_header;
  /* --metrics-token values (NULL-terminated, may be NULL): comma-separated names of the
   * principals (token names) that may read /metrics, the operators.  With tokens, every other
   * token gets 403 there (none named: every token; the start-up log says so once); without
   * tokens (the one local principal) /metrics is open as the MCP endpoint is.  /healthz and
   * /readyz are not concerned (health_auth). */
  const char *const *metrics_principals;
  /* When set, a token file naming more than one principal (distinct token names) is refused,
   * at start (tr_http_new fails) and on reload (the tokens stay as they were), with this text
   * as the reason: the server cannot keep principals apart (--sandbox-backend none). */
  const char *one_principal_only;
} tr_http_options_t;

/* What one principal holds right now (check_environment). */
typedef struct tr_http_usage {
  size_t sessions;     /* open sessions */
  size_t streams;      /* open GET streams */
  size_t replay_bytes; /* kept for resumption in its sessions */
  size_t unread_bytes; /* queued for its connections, not yet written to them */
} tr_http_usage_t;
void tr_http_usage(const tr_http_t *h, const char *principal, tr_http_usage_t *out);

/* SIGHUP: reads --auth-token-file again.  A token no longer in it (or no longer under the
 * same name) is refused from the next request on, and what it opened ends, soon after the
 * call returns (from the loop): its requests in progress (each records the SHA-256 of its
 * token, never the token) stop counting against their principal (GET streams, unread
 * bytes) and end after what is queued (a stateless one is cancelled: a listen stream, a wait;
 * one that waits for its answer gets 401; one streaming gets a JSON-RPC error with its id as
 * its last event), and its sessions close (a session goes with the token that opened it or
 * last named it).  A connection whose client does not take that end is cut a second later.
 * Unchanged tokens keep everything.  Calls running as tasks go on (tasks are their
 * principal's).  A new name is a new principal.  On an error (an unreadable or malformed
 * file) the tokens stay as they were, and so does everything else. */
int tr_http_reload_tokens(tr_http_t *h, cm_error_t *err);
/* Whether name was a token's principal on h and no token names it any more (it was removed
 * from the token file): what it left running is to be stopped. */
bool tr_http_principal_revoked(const tr_http_t *h, const char *name);
/* The drain (SIGTERM): new sessions and new tool calls get 503 with Retry-After, /readyz
 * 503; everything else (the calls already running, their streams, tasks/get) goes on until
 * tr_http_shutdown. */
void tr_http_drain(tr_http_t *h, unsigned retry_after_s);

/* Binds, starts serving and returns the transport; NULL with err set on a bad option, an
 * unreadable or empty token file, a refused address, a failed bind, or when
 * libmicrohttpd.so.12 cannot be loaded (it is opened here, on first use, not linked). */
tr_http_t *tr_http_new(cm_loop_t *loop, const tr_http_options_t *opts,
                       const tr_http_callbacks_t *cbs, void *data, cm_error_t *err);
uint16_t tr_http_port(const tr_http_t *h);
/* Stops accepting, ends every stream and closes every session (graceful shutdown);
 * requests still waiting for the router are answered when it lets go of them.  Idempotent. */
void tr_http_shutdown(tr_http_t *h);
/* Shuts down if needed and closes every connection.  Sinks the router still holds stay
 * valid (sends are dropped) until it lets go of them. */
void tr_http_free(tr_http_t *h);

/* ---------------------------------------------------------------- TLS material */

/* At most this many --tls-san names; the certificate holds at most TR_TLS_MAX_NAMES in all
 * (interface addresses beyond that are left out, with a warning). */
#define TR_TLS_MAX_EXTRA_NAMES 32
#define TR_TLS_MAX_NAMES 128
/* Whether s is an IP address or a DNS name (letters, digits, '-', '.', an optional leading
 * "*."; under 254 bytes): what a certificate's subjectAltName may hold. */
bool tr_tls_name_ok(const char *s);

/* Loads (or creates, then reuses) the self-signed certificate under dir: an EC P-256 key
 * (key.pem, 0600) and a certificate (cert.pem) whose CN is name and whose subjectAltName
 * holds localhost, 127.0.0.1, ::1, this host's name and FQDN (when it has one), host (an
 * address or a name), or every interface's address when host is a wildcard (0.0.0.0: IPv4;
 * :: or empty: IPv4 and IPv6 but link-local), and extra_names (NULL-terminated, or NULL).
 * A certificate on disk that lacks one of them is replaced (a new fingerprint, logged); one
 * naming more is kept.
 * Returns both PEM texts (heap) and the certificate's SHA-256 fingerprint as upper-case
 * hex pairs joined by ':' (96 bytes with the NUL). */
int tr_tls_self_signed(const char *dir, const char *name, const char *host,
                       const char *const *extra_names, char **cert_pem, char **key_pem,
                       char fingerprint[96], cm_error_t *err);
/* Parses both PEM texts, checks that they belong together, and gives the certificate's
 * fingerprint (as above). */
int tr_tls_check_pair(const char *cert_pem, const char *key_pem, char fingerprint[96],
                      cm_error_t *err);

#endif
