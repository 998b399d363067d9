/* transport/http/ internals: the objects of the Streamable HTTP transport and the calls
 * between its files, which call each other directly:
 *
 *   http.c     the transport's life: options, binding, tr_http_new/shutdown/free
 *   routes.c   request routing: the endpoints (POST/GET/DELETE on the MCP path, the
 *              2024-11-05 HTTP+SSE pair, downloads), MHD's request and completion callbacks
 *   mirror.c   the 2026-07-28 headers that mirror a POST's body (Mcp-Method, Mcp-Name,
 *              Mcp-Param-*)
 *   respond.c  answers (JSON, 202, errors, SSE bodies) and the checks a request passes
 *              (Origin, Host, token, protocol version, Accept, caps that answer 429/503)
 *   session.c  the session table: ids, lookup by principal, creation, closing, fair
 *              eviction, idle expiry
 *   stream.c   streams (the reply sinks), their events and replay memory with its bounds,
 *              and the request context attached to a stream (suspend, wake, fill, count)
 *   daemon.c   libmicrohttpd in our loop: runs it on readiness, on its timeout and soon
 *              after a resume (replay bounds first); the tick timer (idle expiry,
 *              keep-alives).
 *
 * Below them the pure parts (parse.c, envelope.c: transport-internal.h) and mhd.c. */
#ifndef MPS_TRANSPORT_HTTP_INTERNAL_H
#define MPS_TRANSPORT_HTTP_INTERNAL_H

#include <jansson.h>

#include "transport/http/mhd.h"
#include "transport/transport-internal.h"

/* --stall-seconds' default: see tr_http's stall_ms. */
#define HTTP_STALL_DEFAULT_MS (60u * 1000)

typedef struct hs_session hs_session_t;
typedef struct hs_stream hs_stream_t;
typedef struct hs_conn hs_conn_t;
typedef struct hs_event hs_event_t;
typedef struct hs_principal hs_principal_t;

/* Who a request is: one per distinct token name, or the one HTTP_PRINCIPAL_LOCAL without
 * tokens.  Made at start-up (their number is bounded by the token file), kept to the end:
 * sessions and requests point at them, and what each holds is counted here. */
struct hs_principal {
  char *name;
  /* A "line N" principal: the digest of the unnamed token it was made for.  Once another
   * token sits on line N (after a reload), it is not that tenant. */
  bool unnamed;
  unsigned char unnamed_sha256[32];
  size_t sessions;     /* open sessions */
  size_t streams;      /* open GET streams */
  size_t replay_bytes; /* events kept in its sessions' streams */
  size_t unread_bytes; /* queued for its connections and not yet written (conn_count) */
};

typedef enum endpoint {
  EP_NONE = 0,
  EP_MCP,
  EP_SSE,
  EP_MESSAGES,
  EP_DOWNLOAD,
  EP_HEALTHZ,
  EP_READYZ,
  EP_METRICS,
  EP_UI
} endpoint_t;

/* A request or session against the token reload (tr_http_reload_tokens): its token
 * (the SHA-256 of the bearer token, never the token) is no longer in the file under its
 * principal's name.  MARKED by the reload, DONE once tr_hs_revoke_pass ended what it
 * holds (from the loop, after the reload returned). */
typedef enum hs_revoke { REVOKE_NONE = 0, REVOKE_MARKED, REVOKE_DONE } hs_revoke_t;

typedef enum stream_kind { STREAM_POST, STREAM_STANDALONE, STREAM_LEGACY } stream_kind_t;

typedef enum stream_mode {
  MODE_PENDING = 0, /* nothing decided: waiting for the router */
  MODE_JSON,        /* answered (or to be answered) with one application/json body */
  MODE_SSE,         /* answered with text/event-stream */
  MODE_ACCEPTED,    /* no request in the body: 202, anything sent is dropped */
  MODE_EMPTY,       /* finished without sending anything (a cancelled request) */
} stream_mode_t;

struct hs_event {
  hs_event_t *next;
  uint64_t seq;
  bool droppable;
  bool sent;     /* copied to a connection at least once */
  bool response; /* a JSON-RPC response: dropping it loses the answer */
  size_t len;
  char text[];
};

struct hs_stream {
  tr_sink_t sink; /* first: the sink pointer is the stream pointer */
  tr_http_t *h;   /* NULL once orphaned by tr_http_free */
  hs_session_t *session;
  stream_kind_t kind;
  stream_mode_t mode;
  uint64_t number;
  bool accept_json, accept_sse;
  bool finished; /* the last sink reference went */
  bool listed;   /* in session->streams (findable by Last-Event-ID) */
  uint64_t finished_at;
  hs_event_t *head, *tail;
  size_t n_events, bytes;
  uint64_t next_seq;    /* seq of the next message event (the priming event is 0) */
  uint64_t unsent_from; /* first seq not yet copied to any connection */
  char *held;           /* the response while JSON vs SSE is undecided */
  size_t held_len;
  hs_conn_t *conn;    /* the attached request, if any */
  json_t *request_id; /* a POST of one request: its id (for `lost`) */
  bool lost;          /* its response was dropped to save memory */
  bool lost_noticed;  /* the error saying so is queued */
  /* A handshake-era POST whose client closed the connection before the answer: when (0:
   * not), so that the tick cancels its request once no resumption came for
   * HTTP_ABANDON_GRACE_MS (an AI SDK abort closes the stream and sends nothing else). */
  uint64_t abandoned_at;
  hs_stream_t *prev, *next;         /* session->streams */
  hs_stream_t *all_prev, *all_next; /* h->streams */
};

struct hs_session {
  tr_http_t *h;
  int refs;
  bool open; /* in the table; false once closed */
  bool legacy;
  /* The stand-in of one stateless (2026-07-28) POST: in no table, without an id, counted
   * nowhere; it closes when that POST's request context completes, and what the router
   * sends later is dropped.  Its stream keeps nothing for replay (no event ids). */
  bool stateless;
  char id[37];
  hs_principal_t *principal; /* who opened it: only that principal finds it */
  /* The token that opened it or last sent a request naming it (a client that moved to a new
   * token of its principal takes its session along); has_token: there are tokens. */
  unsigned char token_sha256[32];
  bool has_token;
  hs_revoke_t revoke;
  void *app;
  size_t replay_bytes; /* events kept in its streams */
  uint64_t last_active;
  unsigned conns; /* requests naming this session right now */
  uint64_t next_stream;
  hs_stream_t *streams;
  hs_stream_t *standalone;
  hs_session_t *hnext;               /* hash chain */
  hs_session_t *prev, *next;         /* h->sessions (open ones) */
  hs_session_t *all_prev, *all_next; /* h->all_sessions */
};

struct hs_conn {
  hs_principal_t *principal;      /* set by check_auth */
  unsigned char token_sha256[32]; /* its bearer token's digest (set by check_auth) */
  bool has_token;
  hs_revoke_t revoke;  /* a revoked request counts nothing and ends (tr_hs_conn_revoke) */
  uint64_t revoked_at; /* when it was ended: cut if it is still there a moment later */
  size_t counted;      /* what it counts in principal->unread_bytes */
  size_t body_out;     /* a body handed to MHD, until the request completes */
  json_t *req_id;      /* the body's single request id, for error answers */
  bool get_stream;     /* a GET stream (standalone, resumed or /sse): counted per principal */
  tr_http_t *h;
  struct MHD_Connection *mc;
  int refs;
  endpoint_t ep;
  bool is_post;
  bool deferred; /* judged on the final call (no body to wait for) */
  cm_buf_t body;
  bool oversize;
  size_t discarded;
  hs_session_t *session;
  hs_stream_t *stream;
  cm_watch_t *w_hup; /* peer hang-up while suspended */
  bool suspended;
  bool responded;
  bool dispatched;
  bool lost;          /* the peer hung up while we were suspended */
  bool kicked;        /* another request took over the stream */
  bool ending;        /* end the stream after what is queued */
  bool streaming;     /* an SSE response reads from this context */
  bool legacy_stream; /* the GET /sse request: its end closes the session */
  bool has_request;
  bool accept_json, accept_sse;
  bool completed;
  uint64_t next_seq;
  cm_buf_t out;
  size_t out_off;
  uint64_t last_write;
  /* Who sent it (tr_hs_conn_remote), once remote_known. */
  tr_remote_t remote;
  bool remote_known;
  char *origin; /* an allowed Origin to echo in CORS headers */
  hs_conn_t *prev, *next;
};

struct tr_http {
  cm_loop_t *loop;
  tr_http_callbacks_t cbs;
  void *data;
  struct MHD_Daemon *daemon;
  int listen_fd;
  uint16_t port;
  bool loopback;
  bool tls;
  cm_watch_t *w_epoll;
  cm_timer_t *t_mhd;
  uint64_t t_mhd_deadline;
  bool soon_pending;
  bool dead; /* freed by the pending deferred run */
  cm_timer_t *t_tick;
  bool shutting_down;
  /* options */
  char *path, *sse_path, *messages_path;
  char *healthz_path, *readyz_path, *metrics_path;
  bool health_auth;
  char **metrics_principals; /* who may read /metrics when there are tokens (NULL: nobody) */
  char *token_file;          /* --auth-token-file, read again by tr_http_reload_tokens */
  char *one_principal_only;  /* tr_http_options_t.one_principal_only: why one principal at most */
  size_t principals_cap;
  bool draining;
  unsigned retry_after_s;
  /* Answers by status class, for /metrics (index: status / 100 - 1, 1xx..5xx). */
  uint64_t status_counts[5];
  uint64_t auth_failures;
  tr_http_cidr_t *trusted; /* --trusted-proxy ranges */
  size_t n_trusted;
  tr_http_forwarded_header_t forwarded_header;
  char **allowed_hosts;   /* normalised host names */
  char **allowed_origins; /* as given, lower-cased, without a trailing '/' */
  char **versions;
  struct hs_param_header {
    char *tool, *property, *header;
  } * param_headers; /* tr_http_options_t's, copied */
  size_t n_param_headers;
  size_t max_body;
  size_t max_sessions;
  size_t max_sessions_per_principal, max_streams_per_principal;
  size_t max_replay_session, max_replay_total;
  size_t max_unread; /* per principal: see conn_count */
  bool loopback_origins;
  char *bound_host; /* the --host as a host name, unless it is a wildcard address */
  uint64_t idle_ms;
  /* An SSE answer (a GET stream, a listen stream, a POST's stream) whose client reads nothing
   * of what waits for it this long loses its connection (tr_hs_conns_cut_stalled): what it
   * holds (a stream slot, a listen slot, unread bytes) goes back to its token.  A client that
   * reads, however slowly, or that has nothing to read (keep-alives are tiny) is never cut.
   * --stall-seconds, HTTP_STALL_DEFAULT_MS by default. */
  uint64_t stall_ms;
  tr_http_token_t *tokens;
  size_t n_tokens;
  hs_principal_t *principals; /* see hs_principal_t */
  size_t n_principals;
  size_t *token_principal; /* tokens[i] is principals[token_principal[i]] */
  bool revoke_pending;     /* a reload marked requests or sessions: tr_hs_revoke_pass soon */
  /* state */
  hs_session_t **buckets;
  size_t n_buckets;
  hs_session_t *sessions; /* open, most recently created first */
  size_t n_sessions;
  hs_session_t *all_sessions;
  hs_stream_t *streams;
  hs_conn_t *conns;
  size_t replay_bytes;       /* events kept in all streams */
  bool replay_over;          /* a push went past a bound: enforce it soon */
  size_t replay_dropped;     /* bytes dropped since the last log line about it */
  uint64_t replay_logged_at; /* that line (one every HTTP_REPLAY_LOG_MS at most) */
};

/* ================================================================ daemon.c */

/* Runs MHD after the current callbacks (a resumed connection, a queued response), with the
 * replay bounds enforced first. */
void tr_hs_soon(tr_http_t *h);
/* Re-arms the timer for MHD's own timeout; from_soon: called from the deferred run. */
void tr_hs_rearm(tr_http_t *h, bool from_soon);
/* Watches MHD's epoll fd (h->w_epoll). */
int tr_hs_daemon_watch(tr_http_t *h, int epoll_fd, cm_error_t *err);
/* Starts the periodic tick (idle expiry, keep-alives) while there are sessions or
 * requests. */
void tr_hs_tick_arm(tr_http_t *h);

/* ================================================================ stream.c */

/* A POST stream of session s (its sink holds the one reference the caller owns), or its
 * standalone/legacy stream. */
hs_stream_t *tr_hs_stream_new(hs_session_t *s, stream_kind_t kind);
/* Takes the stream out of its session's list (no resumption finds it); frees it if nothing
 * else holds it. */
void tr_hs_stream_unlist(hs_stream_t *st);
/* Queues the error that replaces a response dropped to save replay memory. */
void tr_hs_stream_lost_notice(hs_stream_t *st);
/* Unlists the finished POST streams of s nobody resumed within their retention. */
void tr_hs_streams_expire(hs_session_t *s, uint64_t now);
/* Brings every session within max_replay_session and all within max_replay_total. */
void tr_hs_replay_enforce(tr_http_t *h);
/* tr_http_free: every stream the router still holds becomes an orphan (sends dropped,
 * freed by its last release); the others go now. */
void tr_hs_streams_orphan(tr_http_t *h);
/* The session's negotiated protocol version (the router's), or NULL. */
const char *tr_hs_session_protocol(hs_session_t *s);
/* Drops a reference to a session (the table, a request and each stream hold one). */
void tr_hs_session_unref(hs_session_t *s);

void tr_hs_conn_suspend(hs_conn_t *c);
void tr_hs_conn_wake(hs_conn_t *c);
void tr_hs_conn_attach(hs_conn_t *c, hs_stream_t *st);
/* The request is over (or another took its stream); completed_ok: its answer went out. */
void tr_hs_conn_detach(hs_conn_t *c, bool completed_ok);
/* Recounts what c holds for its client in its principal's unread bytes. */
void tr_hs_conn_count(hs_conn_t *c);
/* Copies queued events into c's output buffer (at least `want` bytes if there are). */
void tr_hs_conn_fill(hs_conn_t *c, size_t want);
/* Keep-alive comments on SSE answers that wrote nothing for a while. */
void tr_hs_conns_keepalive(tr_http_t *h, uint64_t now);
/* Cuts the connection of a request whose client read nothing of what waits for it for
 * stall_ms (an SSE answer: GET and listen streams alike), and of a revoked request
 * still there HTTP_REVOKE_GRACE_MS after it was ended. */
void tr_hs_conns_cut_stalled(tr_http_t *h, uint64_t now);
/* Ends a request whose token was revoked (REVOKE_MARKED): it counts nothing any more (GET
 * stream, unread bytes), a stateless request is cancelled (its listen stream, its wait)
 * with an error as its last event, and its stream ends after what is queued. */
void tr_hs_conn_revoke(hs_conn_t *c);

/* ================================================================ session.c */

/* The open session `id` of principal p (another principal's is not found). */
hs_session_t *tr_hs_session_find(tr_http_t *h, const char *id, size_t len, const hs_principal_t *p);
/* A new session in the table (legacy: HTTP+SSE), opened by the router; NULL if it refused. */
hs_session_t *tr_hs_session_create(tr_http_t *h, bool legacy, hs_principal_t *principal);
/* The stand-in session of one stateless POST (see hs_session_t.stateless). */
hs_session_t *tr_hs_session_create_stateless(tr_http_t *h, hs_principal_t *principal);
/* DELETE, idle expiry, a lost legacy stream or shutdown. */
void tr_hs_session_close(hs_session_t *s);
/* At the global cap: closes an idle session fairly (see tr.h); false if there is none. */
bool tr_hs_session_evict_fair(tr_http_t *h, const hs_principal_t *p);
/* p's least recently used idle session, or NULL. */
hs_session_t *tr_hs_session_lru_idle(tr_http_t *h, const hs_principal_t *p);
/* Idle expiry of sessions and of their retained streams. */
void tr_hs_sessions_expire(tr_http_t *h, uint64_t now);
/* After a token reload: ends every request and closes every session it marked revoked. */
void tr_hs_revoke_pass(tr_http_t *h);

/* ================================================================ respond.c */

void tr_hs_conn_unref(hs_conn_t *c);
/* c names s: holds it and counts it active. */
void tr_hs_conn_set_session(hs_conn_t *c, hs_session_t *s);
/* Queues r (with the common headers) and destroys it. */
enum MHD_Result tr_hs_queue(hs_conn_t *c, unsigned status, struct MHD_Response *r);
/* body is malloc'ed and handed over. */
enum MHD_Result tr_hs_respond_body(hs_conn_t *c, unsigned status, const char *type, char *body,
                                   size_t len);
enum MHD_Result tr_hs_respond_empty(hs_conn_t *c, unsigned status);
/* A transport error: the status, and a JSON-RPC error in the body with the request's id
 * once the body told it; header/value: one more header (or NULL). */
enum MHD_Result tr_hs_respond_error(hs_conn_t *c, unsigned status, int code, const char *message,
                                    const char *header, const char *value);
enum MHD_Result tr_hs_respond_405(hs_conn_t *c, const char *allow);
/* 401: the request's token was removed or changed by a reload while it waited. */
enum MHD_Result tr_hs_respond_revoked(hs_conn_t *c);
/* An SSE answer reading from c's stream (or c's output buffer). */
enum MHD_Result tr_hs_respond_sse(hs_conn_t *c);
/* Answers a POST whose stream has decided, or suspends until it does. */
enum MHD_Result tr_hs_post_try_respond(hs_conn_t *c);
/* Each returns false (or NULL) after answering the request itself (*ret). */
bool tr_hs_session_make_room(hs_conn_t *c, enum MHD_Result *ret);
bool tr_hs_unread_over(hs_conn_t *c, enum MHD_Result *ret); /* true: answered 429 */
bool tr_hs_stream_admit(hs_conn_t *c, enum MHD_Result *ret);
hs_session_t *tr_hs_lookup_session(hs_conn_t *c, const char *value, bool legacy,
                                   enum MHD_Result *ret);
enum MHD_Result tr_hs_check_protocol_version(hs_conn_t *c, bool *ok);
/* A request header, or NULL. */
const char *tr_hs_header(hs_conn_t *c, const char *name);
bool tr_hs_check_origin_host(hs_conn_t *c, const char **why);
bool tr_hs_check_auth(hs_conn_t *c);
/* Who sent c: its peer, and its client behind the trusted proxies (worked out once). */
const tr_remote_t *tr_hs_conn_remote(hs_conn_t *c);
bool tr_hs_version_supported(tr_http_t *h, const char *v);
void tr_hs_parse_accept(hs_conn_t *c);

/* ================================================================ mirror.c */

/* H2, H3, H6 for a stateless POST's single request `message`: false after answering 400
 * -32020 itself (*ret). */
bool tr_hs_check_mirrored(hs_conn_t *c, json_t *message, enum MHD_Result *ret);

/* ================================================================ ui.c */

/* GET <path>/ui<rest>: the playground page ("" or "/") and its assets; 404 for the rest. */
enum MHD_Result tr_hs_serve_ui(hs_conn_t *c, const char *rest);
/* Whether a GET of the endpoint itself is a browser's navigation (text/html first). */
bool tr_hs_wants_page(hs_conn_t *c);

/* ================================================================ routes.c */

/* libmicrohttpd's access handler and completion callback (cls is the transport). */
enum MHD_Result tr_hs_on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls);
void tr_hs_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                        enum MHD_RequestTerminationCode toe);

#endif
