/* The session table (http-internal.h): a session (Mcp-Session-Id, or the HTTP+SSE
 * sessionId) owns the router's session object and a list of streams.  A hash by id in
 * struct tr_http's buckets; a session is found only by the principal that opened it; the
 * caps per principal and in all, with fair eviction of idle sessions; idle expiry.
 *
 * A session lives while the table, a request or a stream holds it (tr_hs_session_unref). */
#include <uuid/uuid.h>

#include "transport/http/http-internal.h"

static size_t hash_id(const char *id, size_t n_buckets) {
  uint64_t x = 1469598103934665603ull;
  for (const char *p = id; *p; p++) x = (x ^ (unsigned char)*p) * 1099511628211ull;
  return (size_t)(x & (n_buckets - 1));
}

/* The open session `id` of principal p: another principal's is not found, so that the
 * answer for it is the one for an id that never existed (no oracle). */
hs_session_t *tr_hs_session_find(tr_http_t *h, const char *id, size_t len,
                                 const hs_principal_t *p) {
  if (len != 36) return NULL;
  char key[37];
  memcpy(key, id, 36);
  key[36] = '\0';
  for (hs_session_t *s = h->buckets[hash_id(key, h->n_buckets)]; s; s = s->hnext)
    if (s->open && strcmp(s->id, key) == 0) return s->principal == p ? s : NULL;
  return NULL;
}

static bool session_busy(hs_session_t *s) {
  for (hs_stream_t *st = s->streams; st; st = st->next)
    if (st->kind == STREAM_POST && !st->finished) return true;
  return false;
}

hs_session_t *tr_hs_session_create(tr_http_t *h, bool legacy, hs_principal_t *principal) {
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
  s->standalone = tr_hs_stream_new(s, legacy ? STREAM_LEGACY : STREAM_STANDALONE);
  s->app = h->cbs.session_open(h->data, &s->standalone->sink, principal->name);
  /* The callee keeps its own reference if it wants one. */
  tr_sink_unref(&s->standalone->sink);
  if (!s->app) {
    tr_hs_session_close(s);
    return NULL;
  }
  cm_debug("http: session %s opened%s", s->id, legacy ? " (HTTP+SSE)" : "");
  tr_hs_tick_arm(h);
  return s;
}

void tr_hs_session_close(hs_session_t *s) {
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
      tr_hs_conn_wake(st->conn);
    }
    tr_hs_stream_unlist(st);
  }
  s->standalone = NULL;
  if (s->app) {
    void *app = s->app;
    s->app = NULL;
    cm_debug("http: session %s closed", s->id);
    h->cbs.session_close(h->data, app);
  }
  tr_hs_session_unref(s);
  tr_hs_session_unref(s); /* the table's */
}

hs_session_t *tr_hs_session_create_stateless(tr_http_t *h, hs_principal_t *principal) {
  hs_session_t *s = xcalloc(1, sizeof *s);
  s->h = h;
  s->principal = principal;
  s->refs = 1; /* dropped by tr_hs_session_close */
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
bool tr_hs_session_evict_fair(tr_http_t *h, const hs_principal_t *p) {
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
  tr_hs_session_close(victim);
  return true;
}

hs_session_t *tr_hs_session_lru_idle(tr_http_t *h, const hs_principal_t *p) {
  hs_session_t *victim = NULL;
  for (hs_session_t *s = h->sessions; s; s = s->next)
    if (s->principal == p && session_idle(s) && (!victim || s->last_active < victim->last_active))
      victim = s;
  return victim;
}

void tr_hs_sessions_expire(tr_http_t *h, uint64_t now) {
  hs_session_t *snext;
  for (hs_session_t *s = h->sessions; s; s = snext) {
    snext = s->next;
    tr_hs_streams_expire(s, now);
    if (!s->conns && !session_busy(s) && now - s->last_active >= h->idle_ms) {
      cm_info("http: session %s expired after %llu s idle", s->id,
              (unsigned long long)(h->idle_ms / 1000));
      tr_hs_session_close(s);
    }
  }
}

/* After a token reload (tr_http_reload_tokens marked what it must end): from the loop, with
 * nothing of the transport on the stack.  Requests first, so that one waiting in a session
 * that closes is answered 401 (why) rather than 404. */
void tr_hs_revoke_pass(tr_http_t *h) {
  h->revoke_pending = false;
  size_t n_conns = 0, n_sessions = 0;
  hs_conn_t *cnext;
  for (hs_conn_t *c = h->conns; c; c = cnext) {
    /* (a cancellation's callbacks complete no request, and free none: only MHD does) */
    cnext = c->next;
    if (c->revoke != REVOKE_MARKED) continue;
    tr_hs_conn_revoke(c);
    n_conns++;
  }
  hs_session_t *snext;
  for (hs_session_t *s = h->sessions; s; s = snext) {
    snext = s->next;
    if (s->revoke != REVOKE_MARKED) continue;
    s->revoke = REVOKE_DONE;
    n_sessions++;
    tr_hs_session_close(s);
  }
  if (n_conns || n_sessions)
    cm_info("http: tokens removed or changed: %zu of their requests and %zu of their sessions end",
            n_conns, n_sessions);
}
