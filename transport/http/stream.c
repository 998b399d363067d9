/* Streams (http-internal.h): where the router writes.  One per POST (its reply sink), one
 * standalone stream per session (the GET stream) or the legacy /sse stream.  A stream
 * keeps a bounded buffer of SSE events for replay after a lost connection, counted in its
 * session's, principal's and the transport's replay memory; the request context attached
 * to a stream is suspended whenever it has nothing to write and woken by a send.
 *
 * Lifetimes: a stream lives while its session lists it, a request is attached, or the
 * router holds its sink; it holds a reference to its session, dropped here. */
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "transport/http/http-internal.h"

/* The retry hint of priming events: how long a client waits before resuming. */
#define HTTP_RETRY_MS 1000
/* Replay buffer per stream: count and bytes (an unsent response is never dropped). */
#define HTTP_REPLAY_MAX_EVENTS 512
#define HTTP_REPLAY_MAX_BYTES (512u << 10)
/* A finished stream whose client went away is kept this long for resumption... */
#define HTTP_RETAIN_MS (5u * 60 * 1000)
/* A handshake-era POST stream its client closed before the answer: resumed within this, it
 * goes on; otherwise its request is cancelled. */
#define HTTP_ABANDON_GRACE_MS 3000u
/* ...and at most this many per session. */
#define HTTP_RETAIN_MAX 16
/* Replay memory over its bounds is logged at most this often. */
#define HTTP_REPLAY_LOG_MS 5000
/* SSE keep-alive comments: well under any proxy or client idle timeout. */
#define HTTP_KEEPALIVE_MS 15000
/* A request of a revoked token still there this long after it was ended (its client does
 * not read the end) loses its connection. */
#define HTTP_REVOKE_GRACE_MS 1000

static void stream_maybe_free(hs_stream_t *st);

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
 * its response this way says so to a client that resumes it (tr_hs_stream_lost_notice). */
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
  if (st->h && st->h->replay_over) tr_hs_soon(st->h);
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

const char *tr_hs_session_protocol(hs_session_t *s) {
  if (!s || !s->app || !s->h->cbs.session_protocol) return NULL;
  return s->h->cbs.session_protocol(s->h->data, s->app);
}

/* Switches a POST stream to text/event-stream: the priming event (2025-11-25 sessions),
 * then the response held so far. */
static void stream_go_sse(hs_stream_t *st) {
  st->mode = MODE_SSE;
  const char *v = tr_hs_session_protocol(st->session);
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

hs_stream_t *tr_hs_stream_new(hs_session_t *s, stream_kind_t kind) {
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

void tr_hs_stream_unlist(hs_stream_t *st) {
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
    tr_hs_stream_unlist(st);
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
  if (s) tr_hs_session_unref(s);
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
  if (n > HTTP_RETAIN_MAX && oldest) tr_hs_stream_unlist(oldest);
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
    tr_hs_conn_count(st->conn);
    tr_hs_conn_wake(st->conn);
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
    tr_hs_conn_wake(st->conn);
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
  const char *v = tr_hs_session_protocol(st->session);
  if (!v || strcmp(v, "2025-11-25") < 0) return;
  if (st->mode == MODE_PENDING) {
    if (!st->accept_sse || st->held) return;
    stream_go_sse(st);
  }
  if (st->mode != MODE_SSE || !st->conn) return;
  st->conn->ending = true;
  tr_hs_conn_wake(st->conn);
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
void tr_hs_stream_lost_notice(hs_stream_t *st) {
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
void tr_hs_replay_enforce(tr_http_t *h) {
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

/* ================================================================ what streams hold */

void tr_hs_session_unref(hs_session_t *s) {
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

/* ================================================================ the attached request */

static void on_peer_hangup(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  hs_conn_t *c = data;
  c->lost = true;
  tr_hs_conn_wake(c);
}

void tr_hs_conn_suspend(hs_conn_t *c) {
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

void tr_hs_conn_wake(hs_conn_t *c) {
  if (!c->suspended) return;
  cm_watch_remove(c->w_hup);
  c->w_hup = NULL;
  c->suspended = false;
  tr_mhd.resume_connection(c->mc);
  tr_hs_soon(c->h);
}

void tr_hs_conn_attach(hs_conn_t *c, hs_stream_t *st) {
  c->stream = st;
  st->conn = c;
  st->abandoned_at = 0; /* resumed */
}

/* The request is over (or another took its stream). */
void tr_hs_conn_detach(hs_conn_t *c, bool completed_ok) {
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
 * requests are refused (tr_hs_unread_over). */
void tr_hs_conn_count(hs_conn_t *c) {
  if (!c->principal) return;
  /* (a revoked token's request counts nothing: its principal's new token must not pay) */
  bool over = c->completed || c->revoke != REVOKE_NONE;
  size_t now = over ? 0 : c->out.len - c->out_off + c->body_out;
  /* An HTTP+SSE stream keeps nothing for replay: what waits in it waits for this client. */
  /* (nor does a stateless POST's stream) */
  if (!over && c->stream && stream_unkept(c->stream)) now += c->stream->bytes;
  c->principal->unread_bytes = c->principal->unread_bytes - c->counted + now;
  c->counted = now;
}

void tr_hs_conn_fill(hs_conn_t *c, size_t want) {
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

void tr_hs_conns_keepalive(tr_http_t *h, uint64_t now) {
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    /* (not behind data the client has yet to read: that would only pile up) */
    if (!c->streaming || c->ending || c->out.len > c->out_off ||
        now - c->last_write < HTTP_KEEPALIVE_MS)
      continue;
    cm_buf_appends(&c->out, ": keepalive\n\n");
    c->last_write = now;
    tr_hs_conn_count(c);
    tr_hs_conn_wake(c);
  }
}

/* The connection goes now: MHD sees it fail and completes the request. */
static void conn_cut(hs_conn_t *c) {
  c->lost = true;
  tr_hs_conn_wake(c);
  const union MHD_ConnectionInfo *ci =
      tr_mhd.get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
  tr_hs_soon(c->h);
}

void tr_hs_conns_cut_stalled(tr_http_t *h, uint64_t now) {
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    if (c->completed) continue;
    /* Something waits for the client (in our buffer, or events it has yet to get) and MHD
     * took nothing from it for that long: the socket accepts nothing. */
    hs_stream_t *st = c->stream;
    bool waiting = c->out.len > c->out_off || (st && st->tail && st->tail->seq >= c->next_seq);
    bool stalled = c->streaming && waiting && now - c->last_write >= c->h->stall_ms;
    bool lingers = c->revoke == REVOKE_DONE && now - c->revoked_at >= HTTP_REVOKE_GRACE_MS;
    if (!stalled && !lingers) continue;
    if (stalled && !c->lost)
      cm_info("http: an SSE stream's client read nothing for %llu s: closing its connection",
              (unsigned long long)(c->h->stall_ms / 1000));
    conn_cut(c);
  }
}

void tr_hs_conn_revoke(hs_conn_t *c) {
  if (c->revoke != REVOKE_MARKED) return;
  c->revoke = REVOKE_DONE;
  c->revoked_at = cm_now_ms();
  if (c->get_stream) {
    c->get_stream = false;
    c->principal->streams--;
  }
  tr_hs_conn_count(c);
  c->ending = true;
  hs_stream_t *st = c->stream;
  hs_session_t *s = st ? st->session : NULL;
  /* A stateless request is cancelled (its listen stream, a wait for a task), and so is
   * every request of a session that closes with the token: an error says why, in place of
   * the answer it will never get.  (A request of a session that stays goes on: its answer
   * waits for a resumption.) */
  if (st && st->kind == STREAM_POST && s && (s->stateless || s->revoke != REVOKE_NONE) &&
      !st->finished && !st->sink.closed) {
    if (st->mode == MODE_SSE && st->request_id) {
      json_t *j = json_pack(
          "{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", st->request_id, "error", "code",
          -32000, "message",
          "Unauthorized: the bearer token this request came with was removed from the token "
          "file (or changed) while it was open; what it opened has ended. Send it again with "
          "a valid token.");
      char *text = json_dumps(j, JSON_COMPACT);
      json_decref(j);
      if (!text) abort();
      stream_push(st, text, strlen(text), TR_SEND_RESPONSE);
      free(text);
    }
    /* Nothing after the error: what the request would still send is dropped. */
    st->sink.closed = true;
    if (s->stateless && st->sink.refs > 0) {
      tr_sink_ref(&st->sink);
      tr_sink_peer_gone(&st->sink);
      tr_sink_unref(&st->sink);
    }
  }
  tr_hs_conn_wake(c);
}

void tr_hs_streams_expire(hs_session_t *s, uint64_t now) {
  hs_stream_t *next;
  for (hs_stream_t *st = s->streams; st; st = next) {
    next = st->next;
    if (st->kind == STREAM_POST && st->abandoned_at && !st->conn && !st->finished &&
        now - st->abandoned_at >= HTTP_ABANDON_GRACE_MS && st->sink.refs > 0) {
      st->abandoned_at = 0;
      cm_debug("http: a request's stream was not resumed: cancelling the request");
      tr_sink_ref(&st->sink);
      tr_sink_peer_gone(&st->sink);
      tr_sink_unref(&st->sink); /* may free st: next was read first */
      continue;
    }
    if (st->kind == STREAM_POST && st->finished && !st->conn &&
        now - st->finished_at >= HTTP_RETAIN_MS)
      tr_hs_stream_unlist(st);
  }
}

void tr_hs_streams_orphan(tr_http_t *h) {
  hs_stream_t *snext;
  for (hs_stream_t *st = h->streams; st; st = snext) {
    snext = st->all_next;
    st->h = NULL;
    st->all_prev = st->all_next = NULL;
    st->sink.closed = true;
    st->listed = false;
    hs_session_t *s = st->session;
    st->session = NULL;
    if (s) tr_hs_session_unref(s);
    if (st->sink.refs == 0 && !st->conn) {
      while (st->head) event_remove(st, NULL, st->head);
      free(st->held);
      json_decref(st->request_id);
      free(st);
    }
  }
  h->streams = NULL;
}
