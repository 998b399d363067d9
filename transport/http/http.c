/* Streamable HTTP transport (MCP 2025-11-25, with the 2024-11-05 HTTP+SSE endpoints).
 *
 * libmicrohttpd runs inside our reactor: MHD_USE_EPOLL without an internal thread, its
 * epoll fd watched by cm_loop, MHD_run on readiness, on MHD's own timeout and soon after
 * we resume a connection.  Nothing blocks and nothing runs on another thread.
 *
 * Objects:
 *  - a session (Mcp-Session-Id) owns the caller's session object and a list of streams;
 *  - a stream is where the router writes: one per POST (its reply sink), one standalone
 *    stream per session (the GET stream) or the legacy /sse stream.  A stream keeps a
 *    bounded buffer of SSE events for replay after a lost connection;
 *  - a request context (hs_conn_t) per HTTP request; a streaming one is attached to one
 *    stream at a time and suspended whenever it has nothing to write.
 *
 * Lifetimes are reference counts: a session lives while the table, a request or a stream
 * points at it; a stream while its session lists it, a request is attached, or the router
 * holds its sink; a request context while MHD knows the request or an SSE response reads
 * from it.  Everything a callback still uses is freed after the callback returns. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <jansson.h>
#include <uuid/uuid.h>

#include "transport/http/mhd.h"
#include "transport/transport-internal.h"

/* SSE keep-alive comments: well under any proxy or client idle timeout. */
#define HTTP_KEEPALIVE_MS 15000
/* The retry hint of priming events: how long a client waits before resuming. */
#define HTTP_RETRY_MS 1000
/* Replay buffer per stream: count and bytes (an unsent response is never dropped). */
#define HTTP_REPLAY_MAX_EVENTS 512
#define HTTP_REPLAY_MAX_BYTES (512u << 10)
/* A finished stream whose client went away is kept this long for resumption... */
#define HTTP_RETAIN_MS (5u * 60 * 1000)
/* ...and at most this many per session. */
#define HTTP_RETAIN_MAX 16
/* Replay memory over its bounds is logged at most this often. */
#define HTTP_REPLAY_LOG_MS 5000
/* The principal of every request when there are no tokens. */
#define HTTP_PRINCIPAL_LOCAL "local"
/* Idle keep-alive connections and slow uploads; streams and waiting requests are exempt. */
#define HTTP_CONNECTION_TIMEOUT_S 30
/* MHD's per-connection pool: bounds the request line and headers. */
#define HTTP_CONNECTION_MEMORY (32u << 10)
#define HTTP_SSE_BLOCK (16u << 10)
#define HTTP_TLS_MAX_PEM (1u << 20)

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
  size_t sessions;     /* open sessions */
  size_t streams;      /* open GET streams */
  size_t replay_bytes; /* events kept in its sessions' streams */
  size_t unread_bytes; /* queued for its connections and not yet written (conn_count) */
};

typedef enum endpoint { EP_NONE = 0, EP_MCP, EP_SSE, EP_MESSAGES, EP_DOWNLOAD } endpoint_t;

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
  hs_conn_t *conn;                  /* the attached request, if any */
  json_t *request_id;               /* a POST of one request: its id (for `lost`) */
  bool lost;                        /* its response was dropped to save memory */
  bool lost_noticed;                /* the error saying so is queued */
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
  hs_principal_t *principal; /* set by check_auth */
  size_t counted;            /* what it counts in principal->unread_bytes */
  size_t body_out;           /* a body handed to MHD, until the request completes */
  json_t *req_id;            /* the body's single request id, for error answers */
  bool get_stream;           /* a GET stream (standalone, resumed or /sse): counted per principal */
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
  char **allowed_hosts;   /* normalised host names */
  char **allowed_origins; /* as given, lower-cased, without a trailing '/' */
  char **versions;
  size_t max_body;
  size_t max_sessions;
  size_t max_sessions_per_principal, max_streams_per_principal;
  size_t max_replay_session, max_replay_total;
  size_t max_unread; /* per principal: see conn_count */
  bool loopback_origins;
  char *bound_host; /* the --host as a host name, unless it is a wildcard address */
  uint64_t idle_ms;
  tr_http_token_t *tokens;
  size_t n_tokens;
  hs_principal_t *principals; /* see hs_principal_t */
  size_t n_principals;
  size_t *token_principal; /* tokens[i] is principals[token_principal[i]] */
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

/* ================================================================ the daemon in our loop */

static void mhd_run(tr_http_t *h, bool from_soon);

static void replay_enforce(tr_http_t *h);

static void on_soon(void *data) {
  tr_http_t *h = data;
  h->soon_pending = false;
  if (h->dead) {
    free(h);
    return;
  }
  if (h->replay_over) replay_enforce(h);
  mhd_run(h, true);
}

/* Runs MHD after the current callbacks (a resumed connection, a queued response). */
static void schedule_soon(tr_http_t *h) {
  if (h->soon_pending || !h->daemon) return;
  h->soon_pending = true;
  cm_loop_defer(h->loop, on_soon, h);
}

static void on_mhd_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  tr_http_t *h = data;
  h->t_mhd = NULL;
  mhd_run(h, false);
}

static void rearm(tr_http_t *h, bool from_soon) {
  MHD_UNSIGNED_LONG_LONG ms;
  if (!h->daemon) return;
  if (tr_mhd.get_timeout(h->daemon, &ms) != MHD_YES) {
    cm_timer_cancel(h->t_mhd);
    h->t_mhd = NULL;
    return;
  }
  if (ms == 0 && !from_soon) {
    schedule_soon(h);
    return;
  }
  if (ms > 24ull * 3600 * 1000) ms = 24ull * 3600 * 1000;
  uint64_t deadline = cm_now_ms() + ms;
  /* A timer that fires early only costs one MHD_run that finds nothing to do, so keep it
   * rather than re-creating a timerfd after every request. */
  if (h->t_mhd && h->t_mhd_deadline <= deadline) return;
  cm_timer_cancel(h->t_mhd);
  h->t_mhd = cm_loop_timer(h->loop, ms, on_mhd_timer, h);
  h->t_mhd_deadline = deadline;
}

static unsigned mhd_connections(tr_http_t *h) {
  const union MHD_DaemonInfo *di =
      tr_mhd.get_daemon_info(h->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return di ? di->num_connections : 0;
}

static void mhd_run(tr_http_t *h, bool from_soon) {
  if (!h->daemon) return;
  unsigned before = mhd_connections(h);
  tr_mhd.run(h->daemon);
  /* Out of descriptors, MHD stops accepting and takes the listening socket out of its epoll
   * set; a connection that closes lifts that, but the socket goes back only at the next
   * MHD_run, which nothing else may trigger (the connections waiting in the backlog do not
   * wake its epoll fd while the socket is out of it).  So: once more, soon. */
  if (mhd_connections(h) < before) schedule_soon(h);
  rearm(h, from_soon);
}

static void on_mhd_ready(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  mhd_run(data, false);
}

/* ================================================================ forward declarations */

static void session_unref(hs_session_t *s);
static void session_close(hs_session_t *s);
static void stream_maybe_free(hs_stream_t *st);
static void stream_drop(hs_stream_t *st);
static void conn_wake(hs_conn_t *c);
static void conn_count(hs_conn_t *c);
static void tick_arm(tr_http_t *h);

/* ================================================================ events and streams */

/* A stream whose events go once written: nothing can resume it (HTTP+SSE, a stateless POST). */
static bool stream_unkept(const hs_stream_t *st) {
  return st->kind == STREAM_LEGACY || (st->session && st->session->stateless);
}

static void stream_send(tr_sink_t *sink, const char *json, size_t len, tr_send_flags_t flags);
static void stream_release(tr_sink_t *sink);
static void stream_close_stream(tr_sink_t *sink);
static const tr_sink_ops_t stream_sink_ops = {
    .send = stream_send, .release = stream_release, .close_stream = stream_close_stream};

/* What an event costs in replay memory. */
static size_t event_cost(const hs_event_t *ev) {
  return sizeof *ev + ev->len;
}

/* Counts an event in (or out of) its session's, principal's and the transport's replay
 * memory; an orphaned stream (tr_http_free) counts nowhere. */
static void replay_count(hs_stream_t *st, const hs_event_t *ev, bool add) {
  if (!st->h || !st->session || st->session->stateless) return;
  size_t n = event_cost(ev);
  hs_session_t *s = st->session;
  if (add) {
    s->replay_bytes += n;
    s->principal->replay_bytes += n;
    st->h->replay_bytes += n;
    if (s->replay_bytes > st->h->max_replay_session ||
        st->h->replay_bytes > st->h->max_replay_total)
      st->h->replay_over = true;
  } else {
    s->replay_bytes -= n;
    s->principal->replay_bytes -= n;
    st->h->replay_bytes -= n;
  }
}

static void event_remove(hs_stream_t *st, hs_event_t *prev, hs_event_t *ev) {
  if (prev)
    prev->next = ev->next;
  else
    st->head = ev->next;
  if (st->tail == ev) st->tail = prev;
  st->n_events--;
  st->bytes -= ev->len;
  replay_count(st, ev, false);
  free(ev);
}

/* Drops an event to save memory (not because it was delivered): a POST stream that loses
 * its response this way says so to a client that resumes it (stream_lost_notice). */
static void event_drop(hs_stream_t *st, hs_event_t *prev, hs_event_t *ev) {
  if (ev->response && st->kind == STREAM_POST) st->lost = true;
  event_remove(st, prev, ev);
}

/* Keeps the replay buffer within its bounds: droppable events go first (oldest first),
 * then events already written once; an unsent response is never dropped. */
static void stream_trim(hs_stream_t *st) {
  while (st->n_events > HTTP_REPLAY_MAX_EVENTS || st->bytes > HTTP_REPLAY_MAX_BYTES) {
    hs_event_t *prev = NULL, *victim = NULL, *victim_prev = NULL;
    for (hs_event_t *ev = st->head; ev; prev = ev, ev = ev->next) {
      if (ev->droppable) {
        victim = ev;
        victim_prev = prev;
        break;
      }
    }
    if (!victim) {
      prev = NULL;
      for (hs_event_t *ev = st->head; ev; prev = ev, ev = ev->next) {
        if (ev->sent) {
          victim = ev;
          victim_prev = prev;
          break;
        }
      }
    }
    if (!victim) break;
    event_drop(st, victim_prev, victim);
  }
}

static void stream_push_text(hs_stream_t *st, uint64_t seq, tr_send_flags_t flags, const char *text,
                             size_t len) {
  hs_event_t *ev = xmalloc(sizeof *ev + len);
  ev->next = NULL;
  ev->seq = seq;
  ev->droppable = (flags & TR_SEND_DROPPABLE) != 0;
  ev->response = (flags & TR_SEND_RESPONSE) != 0;
  ev->sent = false;
  ev->len = len;
  memcpy(ev->text, text, len);
  if (st->tail)
    st->tail->next = ev;
  else
    st->head = ev;
  st->tail = ev;
  st->n_events++;
  st->bytes += len;
  replay_count(st, ev, true);
  stream_trim(st);
  /* Past a replay bound: enforced from the loop, once nothing on the stack uses streams. */
  if (st->h && st->h->replay_over) schedule_soon(st->h);
}

static void stream_push(hs_stream_t *st, const char *json, size_t len, tr_send_flags_t flags) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  uint64_t seq = st->next_seq++;
  /* No event ids where there is no resumption: HTTP+SSE, and the stateless revision. */
  bool ids = st->kind != STREAM_LEGACY && !(st->session && st->session->stateless);
  tr_http_sse_event(&b, "message", ids, st->number, seq, json, len);
  stream_push_text(st, seq, flags, b.data, b.len);
  cm_buf_release(&b);
}

static const char *session_protocol(hs_session_t *s) {
  if (!s || !s->app || !s->h->cbs.session_protocol) return NULL;
  return s->h->cbs.session_protocol(s->h->data, s->app);
}

/* Switches a POST stream to text/event-stream: the priming event (2025-11-25 sessions),
 * then the response held so far. */
static void stream_go_sse(hs_stream_t *st) {
  st->mode = MODE_SSE;
  const char *v = session_protocol(st->session);
  if (v && strcmp(v, "2025-11-25") >= 0) {
    char text[96];
    int n = snprintf(text, sizeof text, "id: %llu-0\nretry: %d\ndata: \n\n",
                     (unsigned long long)st->number, HTTP_RETRY_MS);
    stream_push_text(st, 0, TR_SEND_DEFAULT, text, (size_t)n);
  }
  if (st->held) {
    stream_push(st, st->held, st->held_len, TR_SEND_RESPONSE);
    free(st->held);
    st->held = NULL;
  }
}

static hs_stream_t *stream_new(hs_session_t *s, stream_kind_t kind) {
  tr_http_t *h = s->h;
  hs_stream_t *st = xcalloc(1, sizeof *st);
  st->sink.ops = &stream_sink_ops;
  st->sink.refs = 1;
  st->h = h;
  st->session = s;
  s->refs++;
  st->kind = kind;
  st->mode = kind == STREAM_POST ? MODE_PENDING : MODE_SSE;
  st->number = ++s->next_stream;
  st->next_seq = 1;
  st->accept_json = st->accept_sse = true;
  st->listed = true;
  st->next = s->streams;
  if (s->streams) s->streams->prev = st;
  s->streams = st;
  st->all_next = h->streams;
  if (h->streams) h->streams->all_prev = st;
  h->streams = st;
  return st;
}

static void stream_unlist(hs_stream_t *st) {
  if (!st->listed) return;
  st->listed = false;
  hs_session_t *s = st->session;
  if (st->prev)
    st->prev->next = st->next;
  else if (s)
    s->streams = st->next;
  if (st->next) st->next->prev = st->prev;
  st->prev = st->next = NULL;
  stream_maybe_free(st);
}

/* Forgets the stream as far as the session goes; frees it if nothing else holds it. */
static void stream_drop(hs_stream_t *st) {
  if (st->listed)
    stream_unlist(st);
  else
    stream_maybe_free(st);
}

static void stream_free(hs_stream_t *st) {
  tr_http_t *h = st->h;
  if (h) {
    if (st->all_prev)
      st->all_prev->all_next = st->all_next;
    else
      h->streams = st->all_next;
    if (st->all_next) st->all_next->all_prev = st->all_prev;
  }
  while (st->head) event_remove(st, NULL, st->head);
  free(st->held);
  json_decref(st->request_id);
  hs_session_t *s = st->session;
  free(st);
  if (s) session_unref(s);
}

static void stream_maybe_free(hs_stream_t *st) {
  if (!st->listed && st->sink.refs == 0 && !st->conn) stream_free(st);
}

/* Keeps at most HTTP_RETAIN_MAX finished, detached streams per session. */
static void session_trim_retained(hs_session_t *s) {
  size_t n = 0;
  hs_stream_t *oldest = NULL;
  for (hs_stream_t *st = s->streams; st; st = st->next) {
    if (st->kind != STREAM_POST || !st->finished || st->conn) continue;
    n++;
    if (!oldest || st->finished_at < oldest->finished_at) oldest = st;
  }
  if (n > HTTP_RETAIN_MAX && oldest) stream_unlist(oldest);
}

static void stream_send(tr_sink_t *sink, const char *json, size_t len, tr_send_flags_t flags) {
  hs_stream_t *st = (hs_stream_t *)sink;
  if (!st->h || !st->session || !st->session->open) return;
  bool response = (flags & TR_SEND_RESPONSE) != 0;
  if (st->kind == STREAM_POST) {
    if (st->mode != MODE_PENDING && st->mode != MODE_SSE) return;
    if (st->mode == MODE_PENDING) {
      if (response && !st->held && st->accept_json) {
        /* Maybe the whole answer: keep it until we know whether more follows. */
        st->held = xmemdup(json, len);
        st->held_len = len;
        return;
      }
      if (!st->accept_sse) {
        if (response && !st->held) {
          st->held = xmemdup(json, len);
          st->held_len = len;
        } else {
          cm_debug("http: dropping a message the client cannot receive (it accepts no SSE)");
        }
        return;
      }
      stream_go_sse(st);
    }
  }
  stream_push(st, json, len, flags);
  if (st->conn) {
    conn_count(st->conn);
    conn_wake(st->conn);
  }
}

static void stream_release(tr_sink_t *sink) {
  hs_stream_t *st = (hs_stream_t *)sink;
  if (!st->h) {
    /* Orphaned by tr_http_free: nobody else knows it. */
    stream_free(st);
    return;
  }
  st->finished = true;
  st->finished_at = cm_now_ms();
  if (st->kind == STREAM_POST && st->mode == MODE_PENDING) {
    if (st->held && !st->accept_json)
      stream_go_sse(st);
    else
      st->mode = st->held ? MODE_JSON : MODE_EMPTY;
  }
  if (st->conn) {
    conn_wake(st->conn);
    return;
  }
  if (st->kind == STREAM_POST && st->mode == MODE_SSE && st->listed && st->session->open) {
    /* The client went away mid-stream: keep it for a resumption (bounded).  This may free
     * st. */
    session_trim_retained(st->session);
    return;
  }
  stream_drop(st);
}

/* Ends the client's request for a POST stream after what is queued, switching it to SSE
 * first; the stream stays listed, so what follows waits for GET + Last-Event-ID.  Only
 * where the client can resume: a 2025-11-25 session, whose priming event gives it an id. */
static void stream_close_stream(tr_sink_t *sink) {
  hs_stream_t *st = (hs_stream_t *)sink;
  if (!st->h || st->kind != STREAM_POST || !st->session || !st->session->open) return;
  const char *v = session_protocol(st->session);
  if (!v || strcmp(v, "2025-11-25") < 0) return;
  if (st->mode == MODE_PENDING) {
    if (!st->accept_sse || st->held) return;
    stream_go_sse(st);
  }
  if (st->mode != MODE_SSE || !st->conn) return;
  st->conn->ending = true;
  conn_wake(st->conn);
}

/* ================================================================ replay memory */

/* A finished POST stream nobody reads: kept only for a resumption. */
static bool stream_parked(const hs_stream_t *st) {
  return st->kind == STREAM_POST && st->finished && !st->conn && st->mode == MODE_SSE;
}

/* Drops st's events that no client can be waiting for (droppable ones, ones already
 * written once), or with `all` every event (st must be parked; its response, if it had
 * one, is then lost).  Returns whether anything went. */
static bool stream_shed(hs_stream_t *st, bool all) {
  bool any = false;
  hs_event_t *prev = NULL, *ev = st->head;
  while (ev) {
    hs_event_t *next = ev->next;
    if (all || ev->droppable || ev->sent) {
      event_drop(st, prev, ev);
      any = true;
    } else {
      prev = ev;
    }
    ev = next;
  }
  return any;
}

/* A resumption of a stream that lost its response: the client gets a JSON-RPC error for
 * its request instead (once queued, it is replayed like any event), then the end. */
static void stream_lost_notice(hs_stream_t *st) {
  if (st->lost_noticed) return;
  st->lost_noticed = true;
  json_t *j = json_pack(
      "{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
      st->request_id ? st->request_id : json_null(), "error", "code", -32000, "message",
      "Response lost: it waited for a resumption while the server's replay memory was over its "
      "limit (--max-replay-bytes-per-session, --max-replay-bytes), and was dropped. The request "
      "itself ran to its end; send it again if you need its result.");
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!text) abort();
  stream_push(st, text, strlen(text), TR_SEND_RESPONSE);
  free(text);
}

/* One step of shedding a session's replay memory, in the documented order (tr.h): the
 * expendable events of parked streams (oldest finished first), then those of the other
 * streams, then whole parked streams.  Returns false when nothing more can go. */
static bool session_shed_one(hs_session_t *s) {
  for (int level = 0; level < 3; level++) {
    hs_stream_t *best = NULL;
    for (hs_stream_t *st = s->streams; st; st = st->next) {
      if (!st->head || st->kind == STREAM_LEGACY) continue;
      bool parked = stream_parked(st);
      if (level != 1 ? !parked : parked) continue;
      if (level != 2) {
        bool expendable = false;
        for (hs_event_t *ev = st->head; ev && !expendable; ev = ev->next)
          expendable = ev->droppable || ev->sent;
        if (!expendable) continue;
      }
      if (!best || (level == 1 ? st->number < best->number : st->finished_at < best->finished_at))
        best = st;
    }
    if (best && stream_shed(best, level == 2)) return true;
  }
  return false;
}

/* Brings every session within max_replay_session and all of them within
 * max_replay_total, taking first from the principal keeping the most, its session idle the
 * longest (not its largest: answers of one size differ by a few bytes of timings, and the
 * newest answer must not go first because its duration took a digit more). */
static void replay_enforce(tr_http_t *h) {
  h->replay_over = false;
  size_t before = h->replay_bytes;
  for (hs_session_t *s = h->sessions; s; s = s->next)
    while (s->replay_bytes > h->max_replay_session && session_shed_one(s)) {
    }
  /* A session that could shed nothing is skipped for the rest of this pass. */
  hs_session_t *stuck[64];
  size_t n_stuck = 0;
  while (h->replay_bytes > h->max_replay_total) {
    hs_session_t *victim = NULL;
    for (hs_session_t *s = h->sessions; s; s = s->next) {
      bool skip = false;
      for (size_t i = 0; i < n_stuck && !skip; i++) skip = stuck[i] == s;
      if (skip || !s->replay_bytes) continue;
      /* The principal keeping the most first (the one most over its share), its session
       * left alone the longest. */
      size_t mine = s->principal->replay_bytes,
             theirs = victim ? victim->principal->replay_bytes : 0;
      if (!victim || mine > theirs || (mine == theirs && s->last_active < victim->last_active))
        victim = s;
    }
    if (!victim) break;
    if (!session_shed_one(victim)) {
      if (n_stuck == CM_ARRAY_SIZE(stuck)) break;
      stuck[n_stuck++] = victim;
    }
  }
  h->replay_dropped += before > h->replay_bytes ? before - h->replay_bytes : 0;
  uint64_t now = cm_now_ms();
  if (h->replay_dropped && now - h->replay_logged_at >= HTTP_REPLAY_LOG_MS) {
    cm_info("http: replay memory over its limit: %zu bytes of kept events dropped (%zu kept)",
            h->replay_dropped, h->replay_bytes);
    h->replay_dropped = 0;
    h->replay_logged_at = now;
  }
}

/* ================================================================ sessions */

static size_t hash_id(const char *id, size_t n_buckets) {
  uint64_t x = 1469598103934665603ull;
  for (const char *p = id; *p; p++) x = (x ^ (unsigned char)*p) * 1099511628211ull;
  return (size_t)(x & (n_buckets - 1));
}

/* The open session `id` of principal p: another principal's is not found, so that the
 * answer for it is the one for an id that never existed (no oracle). */
static hs_session_t *session_find(tr_http_t *h, const char *id, size_t len,
                                  const hs_principal_t *p) {
  if (len != 36) return NULL;
  char key[37];
  memcpy(key, id, 36);
  key[36] = '\0';
  for (hs_session_t *s = h->buckets[hash_id(key, h->n_buckets)]; s; s = s->hnext)
    if (s->open && strcmp(s->id, key) == 0) return s->principal == p ? s : NULL;
  return NULL;
}

static void session_unref(hs_session_t *s) {
  if (--s->refs > 0) return;
  tr_http_t *h = s->h;
  if (h) {
    if (s->all_prev)
      s->all_prev->all_next = s->all_next;
    else
      h->all_sessions = s->all_next;
    if (s->all_next) s->all_next->all_prev = s->all_prev;
  }
  free(s);
}

static bool session_busy(hs_session_t *s) {
  for (hs_stream_t *st = s->streams; st; st = st->next)
    if (st->kind == STREAM_POST && !st->finished) return true;
  return false;
}

static hs_session_t *session_create(tr_http_t *h, bool legacy, hs_principal_t *principal) {
  hs_session_t *s = xcalloc(1, sizeof *s);
  s->h = h;
  s->principal = principal;
  principal->sessions++;
  s->refs = 1; /* the table's */
  s->open = true;
  s->legacy = legacy;
  uuid_t u;
  uuid_generate_random(u);
  uuid_unparse_lower(u, s->id);
  s->last_active = cm_now_ms();
  size_t b = hash_id(s->id, h->n_buckets);
  s->hnext = h->buckets[b];
  h->buckets[b] = s;
  s->next = h->sessions;
  if (h->sessions) h->sessions->prev = s;
  h->sessions = s;
  h->n_sessions++;
  s->all_next = h->all_sessions;
  if (h->all_sessions) h->all_sessions->all_prev = s;
  h->all_sessions = s;
  s->standalone = stream_new(s, legacy ? STREAM_LEGACY : STREAM_STANDALONE);
  s->app = h->cbs.session_open(h->data, &s->standalone->sink, principal->name);
  /* The callee keeps its own reference if it wants one. */
  tr_sink_unref(&s->standalone->sink);
  if (!s->app) {
    session_close(s);
    return NULL;
  }
  cm_debug("http: session %s opened%s", s->id, legacy ? " (HTTP+SSE)" : "");
  tick_arm(h);
  return s;
}

/* DELETE, idle expiry, a lost legacy stream or shutdown. */
static void session_close(hs_session_t *s) {
  if (!s->open) return;
  tr_http_t *h = s->h;
  s->open = false;
  if (!s->stateless) {
    hs_session_t **pp = &h->buckets[hash_id(s->id, h->n_buckets)];
    while (*pp && *pp != s) pp = &(*pp)->hnext;
    if (*pp) *pp = s->hnext;
    if (s->prev)
      s->prev->next = s->next;
    else
      h->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    h->n_sessions--;
    s->principal->sessions--;
  }
  s->refs++; /* hold it while its streams go */
  hs_stream_t *next;
  for (hs_stream_t *st = s->streams; st; st = next) {
    next = st->next;
    st->sink.closed = true;
    if (st->conn) {
      st->conn->ending = true;
      conn_wake(st->conn);
    }
    stream_unlist(st);
  }
  s->standalone = NULL;
  if (s->app) {
    void *app = s->app;
    s->app = NULL;
    cm_debug("http: session %s closed", s->id);
    h->cbs.session_close(h->data, app);
  }
  session_unref(s);
  session_unref(s); /* the table's */
}

/* The stand-in session of one stateless POST (see hs_session_t.stateless). */
static hs_session_t *session_create_stateless(tr_http_t *h, hs_principal_t *principal) {
  hs_session_t *s = xcalloc(1, sizeof *s);
  s->h = h;
  s->principal = principal;
  s->refs = 1; /* dropped by session_close */
  s->open = true;
  s->stateless = true;
  s->last_active = cm_now_ms();
  s->all_next = h->all_sessions;
  if (h->all_sessions) h->all_sessions->all_prev = s;
  h->all_sessions = s;
  return s;
}

static bool session_idle(hs_session_t *s) {
  return !s->conns && !session_busy(s);
}

/* Makes room for a session of principal p at the global cap: closes an idle session (no
 * request open, nothing running) of the principal holding the most sessions, least
 * recently used first, taking only from p itself or from a principal that holds more
 * sessions than p: a newcomer never pushes out someone with fewer.  Returns false if
 * there is no such session. */
static bool session_evict_fair(tr_http_t *h, const hs_principal_t *p) {
  hs_session_t *victim = NULL;
  for (hs_session_t *s = h->sessions; s; s = s->next) {
    const hs_principal_t *q = s->principal;
    if (!session_idle(s) || (q != p && q->sessions <= p->sessions)) continue;
    if (!victim || q->sessions > victim->principal->sessions ||
        (q == victim->principal && s->last_active < victim->last_active))
      victim = s;
  }
  if (!victim) return false;
  cm_info(
      "http: %zu sessions open (the limit): closing an idle one of the token with the most (%zu)",
      h->n_sessions, victim->principal->sessions);
  session_close(victim);
  return true;
}

/* Before a new session for c's principal: its own cap (its least recently used idle
 * session makes room, else 429), then the global one (session_evict_fair, else 503).
 * Returns false after answering the request itself. */
static bool session_make_room(hs_conn_t *c, enum MHD_Result *ret);

/* ================================================================ request contexts */

static void conn_unref(hs_conn_t *c) {
  if (--c->refs > 0) return;
  cm_buf_release(&c->body);
  cm_buf_release(&c->out);
  json_decref(c->req_id);
  free(c->origin);
  free(c);
}

static void on_peer_hangup(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  hs_conn_t *c = data;
  c->lost = true;
  conn_wake(c);
}

static void conn_suspend(hs_conn_t *c) {
  if (c->suspended) return;
  tr_mhd.suspend_connection(c->mc);
  c->suspended = true;
  /* MHD does not notice a peer that goes away while suspended: watch for it ourselves, so
   * a dead stream is detached at once and a reconnecting client is not refused. */
  const union MHD_ConnectionInfo *ci =
      tr_mhd.get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) {
    cm_error_t err = CM_ERROR_INIT;
    c->w_hup = cm_loop_watch(c->h->loop, ci->connect_fd, EPOLLRDHUP, on_peer_hangup, c, &err);
    cm_error_release(&err);
  }
}

static void conn_wake(hs_conn_t *c) {
  if (!c->suspended) return;
  cm_watch_remove(c->w_hup);
  c->w_hup = NULL;
  c->suspended = false;
  tr_mhd.resume_connection(c->mc);
  schedule_soon(c->h);
}

static void conn_attach(hs_conn_t *c, hs_stream_t *st) {
  c->stream = st;
  st->conn = c;
}

/* The request is over (or another took its stream). */
static void conn_detach(hs_conn_t *c, bool completed_ok) {
  hs_stream_t *st = c->stream;
  if (!st) return;
  c->stream = NULL;
  if (st->conn == c) st->conn = NULL;
  if (st->kind == STREAM_POST) {
    bool delivered = completed_ok && st->finished;
    if (st->mode != MODE_SSE || delivered || !st->listed || !st->session->open) {
      stream_drop(st);
      return;
    }
    /* Lost mid-stream: the request goes on and its events wait for a resumption. */
    if (st->finished) session_trim_retained(st->session); /* may free st */
    return;
  }
  stream_maybe_free(st);
}

/* A client that never reads keeps what we queued for it: an SSE connection has no idle
 * timeout, and an answer can be large (a resources/read of a big file).  So what a
 * request holds for its client (its output buffer, a body handed to MHD) counts against
 * its principal until written or the request is over; past max_unread a principal's new
 * requests are refused (unread_over). */
static void conn_count(hs_conn_t *c) {
  if (!c->principal) return;
  size_t now = c->completed ? 0 : c->out.len - c->out_off + c->body_out;
  /* An HTTP+SSE stream keeps nothing for replay: what waits in it waits for this client. */
  /* (nor does a stateless POST's stream) */
  if (!c->completed && c->stream && stream_unkept(c->stream)) now += c->stream->bytes;
  c->principal->unread_bytes = c->principal->unread_bytes - c->counted + now;
  c->counted = now;
}

/* Whether c's principal has more than its share waiting for its clients to read; answers
 * 429 if so.  (Replay memory has bounds of its own.) */
static bool unread_over(hs_conn_t *c, enum MHD_Result *ret);

static void conn_set_session(hs_conn_t *c, hs_session_t *s) {
  c->session = s;
  s->refs++;
  s->conns++;
  s->last_active = cm_now_ms();
}

/* ================================================================ responses */

static void add_common_headers(hs_conn_t *c, struct MHD_Response *r) {
  if (c->origin) {
    tr_mhd.add_response_header(r, "Access-Control-Allow-Origin", c->origin);
    tr_mhd.add_response_header(r, "Access-Control-Expose-Headers", "Mcp-Session-Id");
    tr_mhd.add_response_header(r, "Vary", "Origin");
  }
  if (c->session && c->session->open && !c->session->legacy && !c->session->stateless)
    tr_mhd.add_response_header(r, "Mcp-Session-Id", c->session->id);
  if (c->h->shutting_down) tr_mhd.add_response_header(r, "Connection", "close");
}

static enum MHD_Result queue(hs_conn_t *c, unsigned status, struct MHD_Response *r) {
  add_common_headers(c, r);
  enum MHD_Result ret = tr_mhd.queue_response(c->mc, status, r);
  tr_mhd.destroy_response(r);
  c->responded = true;
  return ret;
}

static enum MHD_Result respond_body(hs_conn_t *c, unsigned status, const char *type, char *body,
                                    size_t len) {
  /* body is ours (malloc) and MHD frees it. */
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  c->body_out = len;
  conn_count(c);
  if (type) tr_mhd.add_response_header(r, "Content-Type", type);
  return queue(c, status, r);
}

static enum MHD_Result respond_empty(hs_conn_t *c, unsigned status) {
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  return queue(c, status, r);
}

/* A transport error: the status, and a JSON-RPC error in the body (clients show the body
 * text in their error message), with the request's id once the body told it. */
static enum MHD_Result respond_error(hs_conn_t *c, unsigned status, int code, const char *message,
                                     const char *header, const char *value) {
  json_t *j =
      json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                c->req_id ? c->req_id : json_null(), "error", "code", code, "message", message);
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!text) abort();
  struct MHD_Response *r =
      tr_mhd.create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  tr_mhd.add_response_header(r, "Content-Type", "application/json");
  if (header) tr_mhd.add_response_header(r, header, value);
  if (status >= 400) cm_debug("http: %u: %s", status, message);
  return queue(c, status, r);
}

static enum MHD_Result respond_405(hs_conn_t *c, const char *allow) {
  return respond_error(c, 405, -32000, "Method not allowed.", "Allow", allow);
}

static hs_session_t *session_lru_idle(tr_http_t *h, const hs_principal_t *p) {
  hs_session_t *victim = NULL;
  for (hs_session_t *s = h->sessions; s; s = s->next)
    if (s->principal == p && session_idle(s) && (!victim || s->last_active < victim->last_active))
      victim = s;
  return victim;
}

static bool session_make_room(hs_conn_t *c, enum MHD_Result *ret) {
  tr_http_t *h = c->h;
  hs_principal_t *p = c->principal;
  if (h->max_sessions_per_principal && p->sessions >= h->max_sessions_per_principal) {
    hs_session_t *own = session_lru_idle(h, p);
    if (!own) {
      cleanup_free char *msg = xasprintf(
          "Too Many Requests: this token already has %zu sessions open (its limit, "
          "--max-sessions-per-token), all in use; close one (DELETE) or wait",
          h->max_sessions_per_principal);
      *ret = respond_error(c, 429, -32000, msg, "Retry-After", "5");
      return false;
    }
    cm_debug("http: %s is at its session limit: closing its least recently used idle one", p->name);
    session_close(own);
  }
  if (h->n_sessions >= h->max_sessions && !session_evict_fair(h, p)) {
    *ret =
        respond_error(c, 503, -32000, "Service Unavailable: too many sessions", "Retry-After", "5");
    return false;
  }
  return true;
}

/* A GET stream for c's principal, within its cap (else 429, answered here). */
static bool unread_over(hs_conn_t *c, enum MHD_Result *ret) {
  const hs_principal_t *p = c->principal;
  if (p->unread_bytes <= c->h->max_unread) return false;
  cleanup_free char *msg = xasprintf(
      "Too Many Requests: this token's clients have %zu bytes of answers they have not read yet "
      "(its limit, --max-unread-bytes-per-token); read them (or close those connections) first",
      p->unread_bytes);
  *ret = respond_error(c, 429, -32000, msg, "Retry-After", "5");
  return true;
}

static bool stream_admit(hs_conn_t *c, enum MHD_Result *ret) {
  tr_http_t *h = c->h;
  if (h->max_streams_per_principal && c->principal->streams >= h->max_streams_per_principal) {
    cleanup_free char *msg = xasprintf(
        "Too Many Requests: this token already has %zu GET streams open (its limit, "
        "--max-streams-per-token)",
        h->max_streams_per_principal);
    *ret = respond_error(c, 429, -32000, msg, "Retry-After", "5");
    return false;
  }
  c->get_stream = true;
  c->principal->streams++;
  return true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max);
static void sse_read_done(void *cls);

static enum MHD_Result respond_sse(hs_conn_t *c) {
  struct MHD_Response *r = tr_mhd.create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_SSE_BLOCK,
                                                                sse_read, c, sse_read_done);
  if (!r) return MHD_NO;
  c->refs++; /* the response's, dropped by sse_read_done */
  c->streaming = true;
  c->last_write = cm_now_ms();
  tr_mhd.add_response_header(r, "Content-Type", "text/event-stream");
  tr_mhd.add_response_header(r, "Cache-Control", "no-cache, no-transform");
  tr_mhd.add_response_header(r, "X-Accel-Buffering", "no");
  /* A live stream must never be cut by the idle timeout; keep-alive comments keep proxies
   * happy and reveal dead peers. */
  tr_mhd.set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  tick_arm(c->h);
  return queue(c, 200, r);
}

/* Copies queued events into the request's output buffer (at least `want` bytes if there
 * are that many). */
static void conn_fill(hs_conn_t *c, size_t want) {
  hs_stream_t *st = c->stream;
  if (!st) return;
  hs_event_t *prev = NULL, *ev = st->head;
  while (ev && c->out.len - c->out_off < want) {
    hs_event_t *next = ev->next;
    if (ev->seq >= c->next_seq) {
      cm_buf_append(&c->out, ev->text, ev->len);
      c->next_seq = ev->seq + 1;
      ev->sent = true;
      if (st->unsent_from <= ev->seq) st->unsent_from = ev->seq + 1;
      if (stream_unkept(st)) {
        /* HTTP+SSE and the stateless revision have no resumption: nothing to keep. */
        event_remove(st, prev, ev);
        ev = next;
        continue;
      }
    }
    prev = ev;
    ev = next;
  }
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  hs_conn_t *c = cls;
  if (c->lost || c->kicked || c->completed) return MHD_CONTENT_READER_END_WITH_ERROR;
  if (c->out_off == c->out.len) {
    cm_buf_reset(&c->out);
    c->out_off = 0;
    conn_fill(c, max);
  }
  size_t avail = c->out.len - c->out_off;
  if (avail) {
    size_t n = CM_MIN(avail, max);
    memcpy(buf, c->out.data + c->out_off, n);
    c->out_off += n;
    c->last_write = cm_now_ms();
    conn_count(c);
    return (ssize_t)n;
  }
  hs_stream_t *st = c->stream;
  if (c->ending || !st || st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
  conn_suspend(c);
  return 0;
}

static void sse_read_done(void *cls) {
  conn_unref(cls);
}

/* Answers a POST whose stream has decided, or suspends until it does. */
static enum MHD_Result post_try_respond(hs_conn_t *c) {
  hs_stream_t *st = c->stream;
  if (!st) {
    return respond_error(c, c->h->shutting_down ? 503 : 404, -32001, "Session not found", NULL,
                         NULL);
  }
  switch (st->mode) {
    case MODE_ACCEPTED:
      return respond_empty(c, 202);
    case MODE_JSON: {
      char *body = st->held;
      size_t len = st->held_len;
      st->held = NULL;
      unsigned status =
          st->session && st->session->stateless ? tr_http_modern_status(body, len) : 200;
      return respond_body(c, status, "application/json", body, len);
    }
    case MODE_SSE:
      return respond_sse(c);
    case MODE_EMPTY:
      /* A request that ends without an answer (cancelled): an empty stream. */
      if (c->accept_sse) {
        st->mode = MODE_SSE;
        return respond_sse(c);
      }
      return respond_empty(c, 202);
    case MODE_PENDING:
      if (c->ending) {
        return respond_error(c, c->h->shutting_down ? 503 : 404, -32001, "Session not found", NULL,
                             NULL);
      }
      conn_suspend(c);
      return MHD_YES;
  }
  return MHD_NO;
}

/* ================================================================ validation */

static const char *header(hs_conn_t *c, const char *name) {
  return tr_mhd.lookup_connection_value(c->mc, MHD_HEADER_KIND, name);
}

static bool host_allowed(tr_http_t *h, const char *name) {
  if (tr_http_loopback_name(name)) return true;
  for (char **p = h->allowed_hosts; p && *p; p++)
    if (strcmp(*p, name) == 0) return true;
  return false;
}

/* The documented rule (tr.h): an allowed origin; the server's own (scheme, port, and a
 * host it answers to); a loopback origin when loopback_origins is on.  Opaque origins
 * ("null": sandboxed pages, among them every artifact we serve) never pass. */
static bool origin_allowed(tr_http_t *h, const char *origin) {
  size_t olen = strlen(origin);
  while (olen && origin[olen - 1] == '/') olen--;
  for (char **p = h->allowed_origins; p && *p; p++)
    if (strlen(*p) == olen && strncasecmp(*p, origin, olen) == 0) return true;
  char scheme[32], name[TR_HTTP_HOST_MAX];
  unsigned port;
  if (tr_http_origin_parse(origin, olen, scheme, name, sizeof name, &port) < 0) return false;
  if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) return false;
  if (h->loopback_origins && tr_http_loopback_name(name)) return true;
  if (strcmp(scheme, h->tls ? "https" : "http") != 0 || port != h->port) return false;
  if (h->loopback && tr_http_loopback_name(name)) return true;
  if (h->bound_host && strcmp(name, h->bound_host) == 0) return true;
  for (char **p = h->allowed_hosts; p && *p; p++)
    if (strcmp(*p, name) == 0) return true;
  return false;
}

/* 403 checks.  Returns true if the request may go on. */
static bool check_origin_host(hs_conn_t *c, const char **why) {
  tr_http_t *h = c->h;
  const char *origin = header(c, "Origin");
  if (origin) {
    if (!origin_allowed(h, origin)) {
      *why = "Forbidden: Origin not allowed";
      return false;
    }
    c->origin = xstrdup(origin);
  }
  /* DNS rebinding: a page on a foreign name that resolves to 127.0.0.1 sends its own name. */
  const char *host = header(c, "Host");
  if (host && (h->loopback || h->allowed_hosts)) {
    char name[TR_HTTP_HOST_MAX];
    if (tr_http_host_name(host, strlen(host), name, sizeof name) < 0 || !host_allowed(h, name)) {
      *why = "Forbidden: Host not allowed";
      return false;
    }
  }
  return true;
}

static bool check_auth(hs_conn_t *c) {
  tr_http_t *h = c->h;
  if (!h->n_tokens) {
    c->principal = &h->principals[0];
    return true;
  }
  const char *v = header(c, "Authorization");
  const char *tok;
  size_t n;
  if (!v || tr_http_bearer_token(v, strlen(v), &tok, &n) < 0) return false;
  const tr_http_token_t *t = tr_http_token_match(h->tokens, h->n_tokens, tok, n);
  if (!t) return false;
  c->principal = &h->principals[h->token_principal[t - h->tokens]];
  cm_debug("http: authenticated as %s", c->principal->name);
  return true;
}

static bool version_supported(tr_http_t *h, const char *v) {
  for (char **p = h->versions; p && *p; p++)
    if (strcmp(*p, v) == 0) return true;
  return false;
}

static enum MHD_Result check_protocol_version(hs_conn_t *c, bool *ok) {
  const char *v = header(c, "MCP-Protocol-Version");
  *ok = true;
  if (!v || version_supported(c->h, v)) return MHD_YES;
  *ok = false;
  cleanup_free char *excerpt = cm_log_excerpt(v, strlen(v), 40);
  cleanup_free char *msg = xasprintf("Bad Request: Unsupported protocol version: %s", excerpt);
  return respond_error(c, 400, -32000, msg, NULL, NULL);
}

static void parse_accept(hs_conn_t *c) {
  const char *a = header(c, "Accept");
  if (!a) {
    c->accept_json = c->accept_sse = true;
    return;
  }
  tr_http_parse_accept(a, strlen(a), &c->accept_json, &c->accept_sse);
}

/* The session a request names; answers 400/404 itself when there is none. */
static hs_session_t *lookup_session(hs_conn_t *c, const char *value, bool legacy,
                                    enum MHD_Result *ret) {
  if (!value) {
    *ret = respond_error(c, 400, -32000,
                         legacy ? "Bad Request: sessionId is required"
                                : "Bad Request: Mcp-Session-Id header is required",
                         NULL, NULL);
    return NULL;
  }
  hs_session_t *s = tr_http_session_id_valid(value, strlen(value))
                        ? session_find(c->h, value, strlen(value), c->principal)
                        : NULL;
  if (!s || s->legacy != legacy) {
    *ret = respond_error(c, 404, -32001, "Session not found", NULL, NULL);
    return NULL;
  }
  return s;
}

/* ================================================================ endpoints */

static enum MHD_Result mcp_get(hs_conn_t *c) {
  parse_accept(c);
  if (!c->accept_sse)
    return respond_error(c, 406, -32000, "Not Acceptable: Client must accept text/event-stream",
                         NULL, NULL);
  enum MHD_Result ret = MHD_YES;
  hs_session_t *s = lookup_session(c, header(c, "Mcp-Session-Id"), false, &ret);
  if (!s) return ret;
  bool ok;
  ret = check_protocol_version(c, &ok);
  if (!ok) return ret;
  conn_set_session(c, s);
  const char *last = header(c, "Last-Event-ID");
  if (last) {
    uint64_t number, seq;
    if (tr_http_parse_event_id(last, strlen(last), &number, &seq) < 0)
      return respond_error(c, 400, -32000, "Bad Request: malformed Last-Event-ID", NULL, NULL);
    hs_stream_t *st = NULL;
    for (hs_stream_t *x = s->streams; x; x = x->next)
      if (x->number == number) st = x;
    if (!stream_admit(c, &ret)) return ret;
    if (!st || st->mode != MODE_SSE) {
      /* Nothing left to replay: an empty stream; the client then opens a plain GET. */
      cm_debug("http: resumption of unknown stream %llu", (unsigned long long)number);
      return respond_sse(c);
    }
    if (st->lost) stream_lost_notice(st);
    if (st->conn) {
      /* The old request is most likely dead; the new one takes over. */
      hs_conn_t *old = st->conn;
      old->kicked = true;
      old->stream = NULL;
      st->conn = NULL;
      conn_wake(old);
    }
    conn_attach(c, st);
    c->next_seq = seq + 1;
    cm_debug("http: session %s resumes stream %llu after event %llu", s->id,
             (unsigned long long)number, (unsigned long long)seq);
    return respond_sse(c);
  }
  hs_stream_t *st = s->standalone;
  if (!st) return respond_error(c, 404, -32001, "Session not found", NULL, NULL);
  if (st->conn)
    return respond_error(c, 409, -32000, "Conflict: Only one SSE stream is allowed per session",
                         NULL, NULL);
  if (!stream_admit(c, &ret)) return ret;
  conn_attach(c, st);
  c->next_seq = st->unsent_from;
  return respond_sse(c);
}

static enum MHD_Result mcp_delete(hs_conn_t *c) {
  enum MHD_Result ret = MHD_YES;
  hs_session_t *s = lookup_session(c, header(c, "Mcp-Session-Id"), false, &ret);
  if (!s) return ret;
  bool ok;
  ret = check_protocol_version(c, &ok);
  if (!ok) return ret;
  session_close(s);
  return respond_empty(c, 200);
}

static enum MHD_Result legacy_get(hs_conn_t *c) {
  tr_http_t *h = c->h;
  parse_accept(c);
  if (!c->accept_sse)
    return respond_error(c, 406, -32000, "Not Acceptable: Client must accept text/event-stream",
                         NULL, NULL);
  enum MHD_Result ret = MHD_YES;
  /* The stream is the session: both caps first, before anything is closed for it. */
  if (h->max_streams_per_principal && c->principal->streams >= h->max_streams_per_principal) {
    stream_admit(c, &ret);
    return ret;
  }
  if (!session_make_room(c, &ret)) return ret;
  hs_session_t *s = session_create(h, true, c->principal);
  if (!s) return respond_error(c, 503, -32000, "Service Unavailable: session refused", NULL, NULL);
  conn_set_session(c, s);
  c->legacy_stream = true;
  stream_admit(c, &ret); /* within the cap: checked above */
  hs_stream_t *st = s->standalone;
  cleanup_free char *endpoint = xasprintf("%s?sessionId=%s", h->messages_path, s->id);
  cm_buf_t b;
  cm_buf_init(&b, 0);
  tr_http_sse_event(&b, "endpoint", false, 0, 0, endpoint, strlen(endpoint));
  cm_buf_append(&c->out, b.data, b.len);
  cm_buf_release(&b);
  conn_count(c);
  conn_attach(c, st);
  c->next_seq = st->unsent_from;
  return respond_sse(c);
}

static enum MHD_Result legacy_post(hs_conn_t *c) {
  tr_http_t *h = c->h;
  enum MHD_Result ret = MHD_YES;
  const char *sid = tr_mhd.lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, "sessionId");
  tr_http_envelope_t env;
  tr_http_classify(c->body.data ? c->body.data : "", c->body.len, &env);
  c->req_id = steal_pointer(&env.id);
  tr_http_envelope_release(&env);
  hs_session_t *s = lookup_session(c, sid, true, &ret);
  if (!s) return ret;
  conn_set_session(c, s);
  if (env.status != TR_HTTP_BODY_OK)
    return respond_error(c, 400, env.status == TR_HTTP_BODY_PARSE_ERROR ? -32700 : -32600, env.why,
                         NULL, NULL);
  if (env.requests && unread_over(c, &ret)) return ret;
  hs_stream_t *st = s->standalone;
  if (st && s->app) h->cbs.on_message(h->data, s->app, c->body.data, c->body.len, &st->sink);
  struct MHD_Response *r =
      tr_mhd.create_response_from_buffer(8, (void *)(uintptr_t) "Accepted", MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  tr_mhd.add_response_header(r, "Content-Type", "text/plain");
  return queue(c, 202, r);
}

static void json_unrefp(json_t **j) {
  json_decref(*j);
}

/* A stateless POST (2026-07-28): H5, then the router on a stand-in session of its own,
 * for c's principal; no Mcp-Session-Id is read, minted or echoed. */
static enum MHD_Result stateless_post(hs_conn_t *c, json_t *meta_version) {
  tr_http_t *h = c->h;
  /* H5: the header must say what _meta says.  When _meta says nothing readable the router
   * answers its -32602, which is the more telling error. */
  const char *hv = header(c, "MCP-Protocol-Version");
  if (meta_version &&
      (!hv || strlen(json_string_value(meta_version)) != json_string_length(meta_version) ||
       strcmp(hv, json_string_value(meta_version)) != 0)) {
    cleanup_free char *msg =
        hv ? xasprintf(
                 "Header mismatch: MCP-Protocol-Version does not match "
                 "_meta[\"io.modelcontextprotocol/protocolVersion\"]")
           : xstrdup(
                 "Header mismatch: MCP-Protocol-Version is required and must match "
                 "_meta[\"io.modelcontextprotocol/protocolVersion\"]");
    return respond_error(c, 400, -32020, msg, NULL, NULL);
  }
  hs_session_t *s = session_create_stateless(h, c->principal);
  conn_set_session(c, s);
  hs_stream_t *st = stream_new(s, STREAM_POST);
  st->accept_json = c->accept_json;
  st->accept_sse = c->accept_sse;
  if (c->req_id) st->request_id = json_incref(c->req_id);
  conn_attach(c, st);
  c->dispatched = true;
  h->cbs.on_stateless(h->data, c->principal->name, c->body.data, c->body.len, &st->sink);
  cm_buf_release(&c->body);
  cm_buf_init(&c->body, 0);
  tr_sink_unref(&st->sink);
  return post_try_respond(c);
}

static enum MHD_Result mcp_post(hs_conn_t *c) {
  tr_http_t *h = c->h;
  tr_http_envelope_t env;
  tr_http_classify(c->body.data ? c->body.data : "", c->body.len, &env);
  c->req_id = steal_pointer(&env.id);
  json_t *meta_version __attribute__((cleanup(json_unrefp))) = steal_pointer(&env.meta_version);
  if (env.status == TR_HTTP_BODY_PARSE_ERROR)
    return respond_error(c, 400, -32700, env.why, NULL, NULL);
  if (env.status == TR_HTTP_BODY_INVALID) return respond_error(c, 400, -32600, env.why, NULL, NULL);
  c->has_request = env.requests > 0;
  parse_accept(c);
  if (c->has_request && !c->accept_json && !c->accept_sse)
    return respond_error(c, 406, -32000,
                         "Not Acceptable: Client must accept application/json or text/event-stream",
                         NULL, NULL);
  const char *sid = header(c, "Mcp-Session-Id");
  enum MHD_Result ret = MHD_YES;
  bool ok;
  hs_session_t *s;
  if (c->has_request && !(env.initialize && sid) && unread_over(c, &ret)) {
    /* (an initialize naming a session is answered below as ever: no new work) */
    return ret;
  }
  /* The era (docs/protocol-2026.md, section 2): a single request that claims the stateless
   * revision in its _meta is served statelessly, session or not (an Mcp-Session-Id on it is
   * ignored); so is one without a session that is not initialize, when it is
   * server/discover or its MCP-Protocol-Version is none of the handshake era's (its _meta
   * is then malformed: the router says how). */
  if (h->cbs.on_stateless && !env.batch && env.requests == 1) {
    const char *hv = header(c, "MCP-Protocol-Version");
    bool modern = env.modern ||
                  (!sid && !env.initialize && (env.discover || (hv && !version_supported(h, hv))));
    if (modern) return stateless_post(c, meta_version);
  }
  if (env.initialize) {
    if (env.batch)
      return respond_error(c, 400, -32600,
                           "Invalid Request: initialize must not be part of a batch", NULL, NULL);
    if (sid) {
      if (tr_http_session_id_valid(sid, strlen(sid)) &&
          session_find(h, sid, strlen(sid), c->principal))
        return respond_error(c, 400, -32600, "Invalid Request: Server already initialized", NULL,
                             NULL);
      return respond_error(c, 404, -32001, "Session not found", NULL, NULL);
    }
    ret = check_protocol_version(c, &ok);
    if (!ok) return ret;
    if (!session_make_room(c, &ret)) return ret;
    s = session_create(h, false, c->principal);
    if (!s)
      return respond_error(c, 503, -32000, "Service Unavailable: session refused", NULL, NULL);
  } else {
    s = lookup_session(c, sid, false, &ret);
    if (!s) return ret;
    ret = check_protocol_version(c, &ok);
    if (!ok) return ret;
    if (env.batch) {
      const char *v = session_protocol(s);
      if (!v || strcmp(v, "2025-03-26") != 0)
        return respond_error(
            c, 400, -32600,
            "Invalid Request: batches are only accepted in protocol version 2025-03-26", NULL,
            NULL);
    }
  }
  conn_set_session(c, s);
  hs_stream_t *st = stream_new(s, STREAM_POST);
  st->accept_json = c->accept_json;
  st->accept_sse = c->accept_sse;
  if (c->req_id && env.requests == 1 && !env.batch) st->request_id = json_incref(c->req_id);
  if (!c->has_request) {
    st->mode = MODE_ACCEPTED;
    st->sink.closed = true;
  }
  conn_attach(c, st);
  c->dispatched = true;
  h->cbs.on_message(h->data, s->app, c->body.data, c->body.len, &st->sink);
  cm_buf_release(&c->body);
  cm_buf_init(&c->body, 0);
  if (env.initialize && s->open && !session_protocol(s)) {
    /* initialize failed (bad params): no session comes of it. */
    session_close(s);
  }
  tr_sink_unref(&st->sink);
  return post_try_respond(c);
}

static enum MHD_Result preflight(hs_conn_t *c) {
  if (!c->origin) return respond_405(c, "GET, POST, DELETE");
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  tr_mhd.add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
  tr_mhd.add_response_header(r, "Access-Control-Allow-Headers",
                             "Content-Type, Authorization, Mcp-Session-Id, Mcp-Protocol-Version, "
                             "Last-Event-ID, Accept");
  tr_mhd.add_response_header(r, "Access-Control-Max-Age", "600");
  return queue(c, 204, r);
}

static enum MHD_Result begin_post(hs_conn_t *c) {
  const char *ct = header(c, "Content-Type");
  if (!ct || !tr_http_media_type_is(ct, strlen(ct), "application/json"))
    return respond_error(c, 415, -32000,
                         "Unsupported Media Type: Content-Type must be application/json", NULL,
                         NULL);
  const char *cl = header(c, "Content-Length");
  uint64_t declared;
  if (cl && cm_parse_u64(cl, UINT64_MAX, &declared) == 0 && declared > c->h->max_body) {
    cleanup_free char *msg =
        xasprintf("Payload Too Large: the body exceeds %zu bytes", c->h->max_body);
    return respond_error(c, 413, -32000, msg, NULL, NULL);
  }
  c->is_post = true;
  return MHD_YES;
}

/* A "." or ".." segment ("a..b.txt" is a file name like any other). */
static bool has_dot_segment(const char *p) {
  while (*p) {
    size_t n = strcspn(p, "/");
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return true;
    p += n;
    if (*p) p++;
  }
  return false;
}

/* GET <path>/runs/<rest>: a file the server keeps for the request's principal, under the
 * same Origin/Host/token checks as the endpoint.  Never a page of the server's origin: an
 * attachment, not sniffed, and sandboxed should a browser render it anyway (its origin is
 * then opaque, "null", which the Origin check refuses). */
static enum MHD_Result download(hs_conn_t *c, const char *rest) {
  tr_http_t *h = c->h;
  int fd = -1;
  const char *mime = NULL;
  uint64_t size = 0;
  if (!h->cbs.open_download || has_dot_segment(rest) ||
      h->cbs.open_download(h->data, c->principal->name, rest, &fd, &mime, &size) < 0)
    return respond_error(c, 404, -32002, "Not Found: no such file (or it expired)", NULL, NULL);
  struct MHD_Response *r = tr_mhd.create_response_from_fd64(size, fd);
  if (!r) {
    close(fd);
    return MHD_NO;
  }
  char name[160];
  tr_http_attachment_name(rest, strlen(rest), name, sizeof name);
  cleanup_free char *disposition = xasprintf("attachment; filename=\"%s\"", name);
  tr_mhd.add_response_header(r, "Content-Type", mime ? mime : "application/octet-stream");
  tr_mhd.add_response_header(r, "Content-Disposition", disposition);
  tr_mhd.add_response_header(r, "Cache-Control", "no-store");
  tr_mhd.add_response_header(r, "X-Content-Type-Options", "nosniff");
  tr_mhd.add_response_header(r, "Content-Security-Policy", "sandbox; default-src 'none'");
  return queue(c, 200, r);
}

/* The first call: everything that needs only the headers. */
static enum MHD_Result handle_headers(hs_conn_t *c, const char *url, const char *method) {
  tr_http_t *h = c->h;
  size_t path_len = strlen(h->path);
  if (strcmp(url, h->path) == 0)
    c->ep = EP_MCP;
  else if (strncmp(url, h->path, path_len) == 0 && strncmp(url + path_len, "/runs/", 6) == 0)
    c->ep = EP_DOWNLOAD;
  else if (strcmp(url, h->sse_path) == 0)
    c->ep = EP_SSE;
  else if (strcmp(url, h->messages_path) == 0)
    c->ep = EP_MESSAGES;
  else
    return respond_error(c, 404, -32000, "Not Found", NULL, NULL);
  const char *why = NULL;
  if (!check_origin_host(c, &why)) return respond_error(c, 403, -32000, why, NULL, NULL);
  if (strcmp(method, "OPTIONS") == 0) return preflight(c);
  if (!check_auth(c))
    return respond_error(c, 401, -32000, "Unauthorized: a valid bearer token is required",
                         "WWW-Authenticate", "Bearer realm=\"mcp\", error=\"invalid_token\"");
  if (h->shutting_down)
    return respond_error(c, 503, -32000, "Service Unavailable: shutting down", NULL, NULL);
  bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  switch (c->ep) {
    case EP_MCP:
      if (post) return begin_post(c);
      if (get) return mcp_get(c);
      if (strcmp(method, "DELETE") == 0) return mcp_delete(c);
      return respond_405(c, "GET, POST, DELETE");
    case EP_SSE:
      if (get) return legacy_get(c);
      return respond_405(c, "GET");
    case EP_MESSAGES:
      if (post) return begin_post(c);
      return respond_405(c, "POST");
    case EP_DOWNLOAD:
      if (get) return download(c, url + path_len + 6);
      return respond_405(c, "GET");
    case EP_NONE:
      break;
  }
  return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  tr_http_t *h = cls;
  hs_conn_t *c = *con_cls;
  if (!c) {
    c = xcalloc(1, sizeof *c);
    c->h = h;
    c->mc = mc;
    c->refs = 1; /* MHD's, dropped when the request completes */
    cm_buf_init(&c->body, 0);
    cm_buf_init(&c->out, 0);
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    *con_cls = c;
    /* Answering now would make MHD close the connection (it stops reading the request):
     * only a POST is judged on its headers alone, before its body is read. */
    if (strcmp(method, "POST") == 0) return handle_headers(c, url, method);
    c->deferred = true;
    return MHD_YES;
  }
  if (c->deferred) {
    if (*upload_data_size) {
      *upload_data_size = 0; /* a body we do not want */
      return MHD_YES;
    }
    c->deferred = false;
    return handle_headers(c, url, method);
  }
  if (c->responded) {
    *upload_data_size = 0; /* the answer is out; ignore the rest of the body */
    return MHD_YES;
  }
  if (c->lost) return MHD_NO;
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (!c->oversize && c->body.len + n > h->max_body) {
      /* MHD cannot answer in the middle of a body: drop it and answer 413 at its end. */
      c->oversize = true;
      c->discarded = c->body.len;
      cm_buf_release(&c->body);
    }
    if (c->oversize) {
      c->discarded += n;
      /* A body without end (chunked) is not read for ever: past twice the limit the
       * connection goes without an answer. */
      return c->discarded > 2 * h->max_body ? MHD_NO : MHD_YES;
    }
    cm_buf_append(&c->body, upload_data, n);
    return MHD_YES;
  }
  if (c->oversize) {
    cleanup_free char *msg =
        xasprintf("Payload Too Large: the body exceeds %zu bytes", h->max_body);
    return respond_error(c, 413, -32000, msg, NULL, NULL);
  }
  if (!c->is_post) return MHD_NO; /* cannot happen: every other request is answered at once */
  if (c->dispatched) return post_try_respond(c);
  if (h->shutting_down)
    return respond_error(c, 503, -32000, "Service Unavailable: shutting down", NULL, NULL);
  if (c->ep == EP_MESSAGES) return legacy_post(c);
  return mcp_post(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  hs_conn_t *c = *con_cls;
  if (!c) return;
  *con_cls = NULL;
  tr_http_t *h = c->h;
  c->completed = true;
  conn_count(c);
  cm_watch_remove(c->w_hup);
  c->w_hup = NULL;
  c->suspended = false;
  if (c->prev)
    c->prev->next = c->next;
  else
    h->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
  /* A stateless POST whose answer is not out yet: its client gave up, which 2026-07-28 makes
   * the request's cancellation (H7).  The router holds the stream (it is not finished). */
  hs_stream_t *abandoned = c->session && c->session->stateless && c->stream &&
                                   !c->stream->finished && c->stream->sink.refs > 0
                               ? c->stream
                               : NULL;
  if (abandoned) tr_sink_ref(&abandoned->sink);
  conn_detach(c, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
  if (c->get_stream) {
    c->get_stream = false;
    c->principal->streams--;
  }
  hs_session_t *s = c->session;
  c->session = NULL;
  if (s) {
    s->conns--;
    s->last_active = cm_now_ms();
    if (c->legacy_stream) session_close(s); /* HTTP+SSE: the stream is the session */
    /* A stateless POST is over: nothing of it stays (what the router sends later is dropped). */
    if (s->stateless) session_close(s);
    session_unref(s);
  }
  if (abandoned) {
    cm_debug("http: the client closed a stateless request's stream: cancelling the request");
    tr_sink_peer_gone(&abandoned->sink);
    tr_sink_unref(&abandoned->sink);
  }
  conn_unref(c);
}

/* ================================================================ periodic work */

static void on_tick(cm_loop_t *loop, cm_timer_t *t, void *data) {
  tr_http_t *h = data;
  h->t_tick = NULL;
  uint64_t now = cm_now_ms();
  hs_session_t *snext;
  for (hs_session_t *s = h->sessions; s; s = snext) {
    snext = s->next;
    hs_stream_t *next;
    for (hs_stream_t *st = s->streams; st; st = next) {
      next = st->next;
      if (st->kind == STREAM_POST && st->finished && !st->conn &&
          now - st->finished_at >= HTTP_RETAIN_MS)
        stream_unlist(st);
    }
    if (!s->conns && !session_busy(s) && now - s->last_active >= h->idle_ms) {
      cm_info("http: session %s expired after %llu s idle", s->id,
              (unsigned long long)(h->idle_ms / 1000));
      session_close(s);
    }
  }
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    /* (not behind data the client has yet to read: that would only pile up) */
    if (!c->streaming || c->ending || c->out.len > c->out_off ||
        now - c->last_write < HTTP_KEEPALIVE_MS)
      continue;
    cm_buf_appends(&c->out, ": keepalive\n\n");
    c->last_write = now;
    conn_count(c);
    conn_wake(c);
  }
  tick_arm(h);
}

static void tick_arm(tr_http_t *h) {
  if (h->t_tick || !h->daemon || (!h->sessions && !h->conns)) return;
  uint64_t period = CM_MIN(h->idle_ms / 2, (uint64_t)5000);
  if (period < 50) period = 50;
  h->t_tick = cm_loop_timer(h->loop, period, on_tick, h);
}

/* ================================================================ setup */

__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt,
                                                             va_list ap) {
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  cm_debug("libmicrohttpd: %s", line);
}

static bool sockaddr_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

/* Binds the listening socket ourselves: any address family, port 0, and the loopback
 * check on what was really bound. */
static int listen_on(tr_http_t *h, const char *host, uint16_t port, bool allow_remote,
                     cm_error_t *err) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char portstr[8];
  snprintf(portstr, sizeof portstr, "%u", (unsigned)port);
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc != 0)
    return cm_error_set(err, 0, CM_ERR_INVALID, "cannot resolve --host %s: %s", host,
                        gai_strerror(rc));
  /* Refuse before binding anything: a LAN address without tokens is never even opened. */
  for (struct addrinfo *ai = res; ai && !allow_remote; ai = ai->ai_next) {
    if (!sockaddr_loopback(ai->ai_addr)) {
      freeaddrinfo(res);
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "refusing to listen on %s (not a loopback address) without "
                          "--auth-token-file; pass --allow-insecure-remote to do it anyway",
                          host);
    }
  }
  int saved = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      saved = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
      saved = errno;
      close(fd);
      continue;
    }
    h->loopback = sockaddr_loopback(ai->ai_addr);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
      h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    h->listen_fd = fd;
    freeaddrinfo(res);
    return 0;
  }
  freeaddrinfo(res);
  return cm_error_set(err, saved, CM_ERR_IO, "cannot listen on %s port %u", host, (unsigned)port);
}

static char **copy_strv(const char *const *v, bool as_host) {
  size_t n = 0;
  while (v && v[n]) n++;
  if (!n) return NULL;
  char **out = xcalloc(n + 1, sizeof *out);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (as_host) {
      char name[TR_HTTP_HOST_MAX];
      if (tr_http_host_name(v[i], strlen(v[i]), name, sizeof name) < 0) {
        cm_warn("http: ignoring malformed allowed host '%s'", v[i]);
        continue;
      }
      out[k++] = xstrdup(name);
    } else {
      size_t len = strlen(v[i]);
      while (len && v[i][len - 1] == '/') len--;
      out[k++] = xstrndup(v[i], len);
    }
  }
  return out;
}

static char *sibling_path(const char *path, const char *name) {
  const char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path) : 0;
  return xasprintf("%.*s/%s", (int)dir, path, name);
}

static void http_release(tr_http_t *h) {
  tr_http_tokens_free(h->tokens, h->n_tokens);
  for (size_t i = 0; i < h->n_principals; i++) free(h->principals[i].name);
  free(h->principals);
  free(h->token_principal);
  free(h->bound_host);
  cm_strv_free(h->allowed_hosts);
  cm_strv_free(h->allowed_origins);
  cm_strv_free(h->versions);
  free(h->path);
  free(h->sse_path);
  free(h->messages_path);
  free(h->buckets);
  if (h->listen_fd >= 0) close(h->listen_fd);
}

tr_http_t *tr_http_new(cm_loop_t *loop, const tr_http_options_t *opts,
                       const tr_http_callbacks_t *cbs, void *data, cm_error_t *err) {
  if (tr_mhd_load(err) < 0) return NULL;
  tr_http_t *h = xcalloc(1, sizeof *h);
  h->loop = loop;
  h->cbs = *cbs;
  h->data = data;
  h->listen_fd = -1;
  const char *path = opts->path && opts->path[0] == '/' ? opts->path : "/mcp";
  h->path = xstrdup(path);
  h->sse_path = sibling_path(path, "sse");
  h->messages_path = sibling_path(path, "messages");
  h->allowed_hosts = copy_strv(opts->allowed_hosts, true);
  h->allowed_origins = copy_strv(opts->allowed_origins, false);
  h->versions = copy_strv(opts->protocol_versions, false);
  h->max_body = opts->max_body_bytes ? opts->max_body_bytes : (16u << 20);
  h->max_sessions = opts->max_sessions ? opts->max_sessions : 256;
  h->idle_ms = opts->session_idle_ms ? opts->session_idle_ms : 1800ull * 1000;
  h->n_buckets = 64;
  while (h->n_buckets < h->max_sessions * 2 && h->n_buckets < (1u << 16)) h->n_buckets *= 2;
  h->buckets = xcalloc(h->n_buckets, sizeof *h->buckets);
  h->tls = opts->tls_cert_pem && opts->tls_key_pem;

  if (opts->auth_token_file) {
    cleanup_free char *text = NULL;
    size_t len = 0;
    if (cm_read_file(opts->auth_token_file, 1u << 20, &text, &len, err) < 0 ||
        tr_http_parse_tokens(text, len, &h->tokens, &h->n_tokens, err) < 0) {
      cm_error_wrap(err, "reading --auth-token-file %s", opts->auth_token_file);
      if (text) explicit_bzero(text, len);
      http_release(h);
      free(h);
      return NULL;
    }
    explicit_bzero(text, len);
  }
  /* One principal per distinct token name (two lines with one name are one tenant). */
  h->principals = xcalloc(h->n_tokens ? h->n_tokens : 1, sizeof *h->principals);
  h->token_principal = xcalloc(h->n_tokens ? h->n_tokens : 1, sizeof *h->token_principal);
  if (!h->n_tokens) h->principals[h->n_principals++].name = xstrdup(HTTP_PRINCIPAL_LOCAL);
  for (size_t i = 0; i < h->n_tokens; i++) {
    size_t k = 0;
    while (k < h->n_principals && strcmp(h->principals[k].name, h->tokens[i].name) != 0) k++;
    if (k == h->n_principals) h->principals[h->n_principals++].name = xstrdup(h->tokens[i].name);
    h->token_principal[i] = k;
  }
  h->max_sessions_per_principal = opts->max_sessions_per_principal;
  h->max_streams_per_principal = opts->max_streams_per_principal;
  h->max_replay_session = opts->max_replay_bytes_per_session ? opts->max_replay_bytes_per_session
                                                             : TR_HTTP_REPLAY_SESSION_DEFAULT;
  h->max_replay_total =
      opts->max_replay_bytes ? opts->max_replay_bytes : TR_HTTP_REPLAY_TOTAL_DEFAULT;
  h->max_unread = opts->max_unread_bytes_per_principal ? opts->max_unread_bytes_per_principal
                                                       : TR_HTTP_UNREAD_DEFAULT;
  const char *host = opts->host && *opts->host ? opts->host : "127.0.0.1";
  if (listen_on(h, host, opts->port, h->n_tokens > 0 || opts->allow_insecure_remote, err) < 0) {
    http_release(h);
    free(h);
    return NULL;
  }
  h->loopback_origins = opts->loopback_origins == TR_HTTP_LOOPBACK_ORIGINS_ON ||
                        (opts->loopback_origins == TR_HTTP_LOOPBACK_ORIGINS_AUTO && h->loopback);
  if (strcmp(host, "0.0.0.0") != 0 && strcmp(host, "::") != 0) {
    char name[TR_HTTP_HOST_MAX];
    cleanup_free char *bracketed = strchr(host, ':') ? xasprintf("[%s]", host) : xstrdup(host);
    if (tr_http_host_name(bracketed, strlen(bracketed), name, sizeof name) == 0)
      h->bound_host = xstrdup(name);
  }
  if (!h->loopback && !h->tls)
    cm_warn(
        "http: listening on %s without TLS: bearer tokens and scripts cross the network in "
        "clear text (use --tls-cert/--tls-key or --tls-self-signed)",
        host);

  struct MHD_OptionItem o[16];
  size_t n = 0;
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, h->listen_fd, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                   (intptr_t)(opts->max_connections ? opts->max_connections : 512),
                                   NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, HTTP_CONNECTION_TIMEOUT_S, NULL};
  o[n++] =
      (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_CONNECTION_MEMORY, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, h};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, h};
  if (h->tls) {
    o[n++] =
        (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)opts->tls_key_pem};
    o[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                     (void *)(uintptr_t)opts->tls_cert_pem};
  }
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (h->tls) flags |= MHD_USE_TLS;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(h->listen_fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  h->daemon =
      tr_mhd.start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_ARRAY, o, MHD_OPTION_END);
  if (h->daemon) h->listen_fd = -1; /* MHD's now: closed by MHD_stop_daemon unless quiesced */
  if (!h->daemon) {
    cm_error_set(err, 0, CM_ERR_INTERNAL,
                 "libmicrohttpd failed to start%s (run with --log-level debug for its reason)",
                 h->tls ? " (is the TLS key and certificate valid?)" : "");
    http_release(h);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *di = tr_mhd.get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD);
  if (!di) {
    tr_mhd.stop_daemon(h->daemon);
    http_release(h);
    free(h);
    cm_error_set(err, 0, CM_ERR_INTERNAL, "libmicrohttpd has no epoll fd");
    return NULL;
  }
  h->w_epoll = cm_loop_watch(loop, di->epoll_fd, EPOLLIN, on_mhd_ready, h, err);
  if (!h->w_epoll) {
    tr_mhd.stop_daemon(h->daemon);
    http_release(h);
    free(h);
    return NULL;
  }
  rearm(h, false);
  return h;
}

uint16_t tr_http_port(const tr_http_t *h) {
  return h->port;
}

void tr_http_usage(const tr_http_t *h, const char *principal, tr_http_usage_t *out) {
  memset(out, 0, sizeof *out);
  for (size_t i = 0; h && principal && i < h->n_principals; i++) {
    const hs_principal_t *p = &h->principals[i];
    if (strcmp(p->name, principal) != 0) continue;
    out->sessions = p->sessions;
    out->streams = p->streams;
    out->replay_bytes = p->replay_bytes;
    out->unread_bytes = p->unread_bytes;
  }
}

void tr_http_shutdown(tr_http_t *h) {
  if (!h || h->shutting_down) return;
  h->shutting_down = true;
  if (h->daemon) {
    /* Quiesced, the listening socket is ours again; closed, the port is free at once. */
    MHD_socket fd = tr_mhd.quiesce_daemon(h->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
  }
  while (h->sessions) session_close(h->sessions);
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    if (!c->streaming) continue;
    c->ending = true;
    conn_wake(c);
  }
  schedule_soon(h);
}

void tr_http_free(tr_http_t *h) {
  if (!h) return;
  tr_http_shutdown(h);
  /* MHD must not be stopped with suspended connections. */
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    c->lost = true;
    conn_wake(c);
  }
  cm_watch_remove(h->w_epoll);
  cm_timer_cancel(h->t_mhd);
  cm_timer_cancel(h->t_tick);
  h->t_mhd = h->t_tick = NULL;
  struct MHD_Daemon *d = h->daemon;
  h->daemon = NULL;
  if (d) tr_mhd.stop_daemon(d); /* completes every request (on_completed) */
  /* Streams the router still holds: orphan them; their release frees them. */
  hs_stream_t *snext;
  for (hs_stream_t *st = h->streams; st; st = snext) {
    snext = st->all_next;
    st->h = NULL;
    st->all_prev = st->all_next = NULL;
    st->sink.closed = true;
    st->listed = false;
    hs_session_t *s = st->session;
    st->session = NULL;
    if (s) session_unref(s);
    if (st->sink.refs == 0 && !st->conn) {
      while (st->head) event_remove(st, NULL, st->head);
      free(st->held);
      json_decref(st->request_id);
      free(st);
    }
  }
  h->streams = NULL;
  while (h->all_sessions) {
    hs_session_t *s = h->all_sessions;
    h->all_sessions = s->all_next;
    free(s);
  }
  http_release(h);
  if (h->soon_pending)
    h->dead = true; /* the pending deferred run frees it */
  else
    free(h);
}
