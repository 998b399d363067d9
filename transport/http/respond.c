/* Answers and checks (http-internal.h): every response the transport queues (one JSON body,
 * 202, its own JSON-RPC errors, SSE bodies read from a stream), and what a request must
 * pass before it is routed: Origin, Host, bearer token, MCP-Protocol-Version, Accept, and
 * the caps that answer 429/503 (sessions, GET streams, unread bytes). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>

#include "transport/http/http-internal.h"

/* What MHD asks an SSE answer for at a time. */
#define HTTP_SSE_BLOCK (16u << 10)

void tr_hs_conn_unref(hs_conn_t *c) {
  if (--c->refs > 0) return;
  cm_buf_release(&c->body);
  cm_buf_release(&c->out);
  json_decref(c->req_id);
  free(c->origin);
  free(c);
}

void tr_hs_conn_set_session(hs_conn_t *c, hs_session_t *s) {
  c->session = s;
  s->refs++;
  s->conns++;
  s->last_active = cm_now_ms();
  /* The session goes with the token that used it last: a client that moved to its
   * principal's new token keeps its session when the old token is removed. */
  if (c->has_token && !s->stateless && s->revoke == REVOKE_NONE) {
    memcpy(s->token_sha256, c->token_sha256, sizeof s->token_sha256);
    s->has_token = true;
  }
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

enum MHD_Result tr_hs_queue(hs_conn_t *c, unsigned status, struct MHD_Response *r) {
  add_common_headers(c, r);
  if (status >= 100 && status < 600) c->h->status_counts[status / 100 - 1]++;
  enum MHD_Result ret = tr_mhd.queue_response(c->mc, status, r);
  tr_mhd.destroy_response(r);
  c->responded = true;
  return ret;
}

enum MHD_Result tr_hs_respond_body(hs_conn_t *c, unsigned status, const char *type, char *body,
                                   size_t len) {
  /* body is ours (malloc) and MHD frees it. */
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  c->body_out = len;
  tr_hs_conn_count(c);
  if (type) tr_mhd.add_response_header(r, "Content-Type", type);
  return tr_hs_queue(c, status, r);
}

enum MHD_Result tr_hs_respond_empty(hs_conn_t *c, unsigned status) {
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  return tr_hs_queue(c, status, r);
}

/* A transport error: the status, and a JSON-RPC error in the body (clients show the body
 * text in their error message), with the request's id once the body told it. */
enum MHD_Result tr_hs_respond_error(hs_conn_t *c, unsigned status, int code, const char *message,
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
  return tr_hs_queue(c, status, r);
}

enum MHD_Result tr_hs_respond_405(hs_conn_t *c, const char *allow) {
  return tr_hs_respond_error(c, 405, -32000, "Method not allowed.", "Allow", allow);
}

enum MHD_Result tr_hs_respond_revoked(hs_conn_t *c) {
  return tr_hs_respond_error(
      c, 401, -32000,
      "Unauthorized: the bearer token this request came with was removed from the token file (or "
      "changed) while the request was open; send it again with a valid token",
      "WWW-Authenticate", "Bearer realm=\"mcp\", error=\"invalid_token\"");
}

bool tr_hs_session_make_room(hs_conn_t *c, enum MHD_Result *ret) {
  tr_http_t *h = c->h;
  hs_principal_t *p = c->principal;
  if (h->max_sessions_per_principal && p->sessions >= h->max_sessions_per_principal) {
    hs_session_t *own = tr_hs_session_lru_idle(h, p);
    if (!own) {
      cleanup_free char *msg = xasprintf(
          "Too Many Requests: this token already has %zu sessions open (its limit, "
          "--max-sessions-per-token), all in use; close one (DELETE) or wait",
          h->max_sessions_per_principal);
      *ret = tr_hs_respond_error(c, 429, -32000, msg, "Retry-After", "5");
      return false;
    }
    cm_debug("http: %s is at its session limit: closing its least recently used idle one", p->name);
    tr_hs_session_close(own);
  }
  if (h->n_sessions >= h->max_sessions && !tr_hs_session_evict_fair(h, p)) {
    *ret = tr_hs_respond_error(c, 503, -32000, "Service Unavailable: too many sessions",
                               "Retry-After", "5");
    return false;
  }
  return true;
}

/* Whether c's principal has more than its share waiting for its clients to read; answers
 * 429 if so.  (Replay memory has bounds of its own.) */
bool tr_hs_unread_over(hs_conn_t *c, enum MHD_Result *ret) {
  const hs_principal_t *p = c->principal;
  if (p->unread_bytes <= c->h->max_unread) return false;
  cleanup_free char *msg = xasprintf(
      "Too Many Requests: this token's clients have %zu bytes of answers they have not read yet "
      "(its limit, --max-unread-bytes-per-token); read them (or close those connections) first",
      p->unread_bytes);
  *ret = tr_hs_respond_error(c, 429, -32000, msg, "Retry-After", "5");
  return true;
}

/* A GET stream for c's principal, within its cap (else 429, answered here). */
bool tr_hs_stream_admit(hs_conn_t *c, enum MHD_Result *ret) {
  tr_http_t *h = c->h;
  if (h->max_streams_per_principal && c->principal->streams >= h->max_streams_per_principal) {
    cleanup_free char *msg = xasprintf(
        "Too Many Requests: this token already has %zu GET streams open (its limit, "
        "--max-streams-per-token)",
        h->max_streams_per_principal);
    *ret = tr_hs_respond_error(c, 429, -32000, msg, "Retry-After", "5");
    return false;
  }
  c->get_stream = true;
  c->principal->streams++;
  return true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max);
static void sse_read_done(void *cls);

enum MHD_Result tr_hs_respond_sse(hs_conn_t *c) {
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
  tr_hs_tick_arm(c->h);
  return tr_hs_queue(c, 200, r);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  hs_conn_t *c = cls;
  if (c->lost || c->kicked || c->completed) return MHD_CONTENT_READER_END_WITH_ERROR;
  if (c->out_off == c->out.len) {
    cm_buf_reset(&c->out);
    c->out_off = 0;
    tr_hs_conn_fill(c, max);
  }
  size_t avail = c->out.len - c->out_off;
  if (avail) {
    size_t n = CM_MIN(avail, max);
    memcpy(buf, c->out.data + c->out_off, n);
    c->out_off += n;
    c->last_write = cm_now_ms();
    tr_hs_conn_count(c);
    return (ssize_t)n;
  }
  hs_stream_t *st = c->stream;
  if (c->ending || !st || st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
  tr_hs_conn_suspend(c);
  return 0;
}

static void sse_read_done(void *cls) {
  tr_hs_conn_unref(cls);
}

/* Answers a POST whose stream has decided, or suspends until it does. */
enum MHD_Result tr_hs_post_try_respond(hs_conn_t *c) {
  hs_stream_t *st = c->stream;
  /* Its token went while it waited for its answer (which, cancelled, it will not get). */
  if (c->revoke != REVOKE_NONE && (!st || st->mode == MODE_PENDING || st->mode == MODE_EMPTY))
    return tr_hs_respond_revoked(c);
  if (!st) {
    return tr_hs_respond_error(c, c->h->shutting_down ? 503 : 404, -32001, "Session not found",
                               NULL, NULL);
  }
  switch (st->mode) {
    case MODE_ACCEPTED:
      return tr_hs_respond_empty(c, 202);
    case MODE_JSON: {
      char *body = st->held;
      size_t len = st->held_len;
      st->held = NULL;
      unsigned status =
          st->session && st->session->stateless ? tr_http_modern_status(body, len) : 200;
      return tr_hs_respond_body(c, status, "application/json", body, len);
    }
    case MODE_SSE:
      return tr_hs_respond_sse(c);
    case MODE_EMPTY:
      /* A request that ends without an answer (cancelled): an empty stream. */
      if (c->accept_sse) {
        st->mode = MODE_SSE;
        return tr_hs_respond_sse(c);
      }
      return tr_hs_respond_empty(c, 202);
    case MODE_PENDING:
      if (c->ending) {
        return tr_hs_respond_error(c, c->h->shutting_down ? 503 : 404, -32001, "Session not found",
                                   NULL, NULL);
      }
      tr_hs_conn_suspend(c);
      return MHD_YES;
  }
  return MHD_NO;
}

/* ================================================================ validation */

const char *tr_hs_header(hs_conn_t *c, const char *name) {
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
bool tr_hs_check_origin_host(hs_conn_t *c, const char **why) {
  tr_http_t *h = c->h;
  const char *origin = tr_hs_header(c, "Origin");
  if (origin) {
    if (!origin_allowed(h, origin)) {
      *why = "Forbidden: Origin not allowed";
      return false;
    }
    c->origin = xstrdup(origin);
  }
  /* DNS rebinding: a page on a foreign name that resolves to 127.0.0.1 sends its own name. */
  const char *host = tr_hs_header(c, "Host");
  if (host && (h->loopback || h->allowed_hosts)) {
    char name[TR_HTTP_HOST_MAX];
    if (tr_http_host_name(host, strlen(host), name, sizeof name) < 0 || !host_allowed(h, name)) {
      *why = "Forbidden: Host not allowed";
      return false;
    }
  }
  return true;
}

/* Every line of the trusted proxies' header, in order, one per '\n'-ended line. */
typedef struct forwarded_lines {
  const char *name;
  cm_buf_t text;
  bool found, over;
} forwarded_lines_t;

static enum MHD_Result collect_forwarded(void *cls, enum MHD_ValueKind kind, const char *key,
                                         const char *value) {
  forwarded_lines_t *f = cls;
  if (!key || strcasecmp(key, f->name) != 0) return MHD_YES;
  f->found = true;
  const char *v = value ? value : "";
  if (cm_buf_append(&f->text, v, strlen(v)) < 0 || cm_buf_append(&f->text, "\n", 1) < 0) {
    f->over = true;
    return MHD_NO;
  }
  return MHD_YES;
}

const tr_remote_t *tr_hs_conn_remote(hs_conn_t *c) {
  if (c->remote_known) return &c->remote;
  tr_http_t *h = c->h;
  c->remote_known = true;
  snprintf(c->remote.peer, sizeof c->remote.peer, "%s", "unknown");
  snprintf(c->remote.client, sizeof c->remote.client, "%s", "unknown");
  const union MHD_ConnectionInfo *ci =
      tr_mhd.get_connection_info(c->mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  tr_http_addr_t peer;
  if (!ci || tr_http_addr_from_sockaddr(ci->client_addr, &peer) < 0) return &c->remote;
  tr_http_addr_format(&peer, c->remote.peer);
  tr_http_addr_t client = peer;
  tr_http_forwarded_status_t st = TR_HTTP_FWD_NONE;
  if (h->n_trusted && tr_http_trusted(h->trusted, h->n_trusted, &peer)) {
    /* Only a trusted peer's header is read at all. */
    forwarded_lines_t f = {
        .name = h->forwarded_header == TR_HTTP_FORWARDED_RFC7239 ? "Forwarded" : "X-Forwarded-For"};
    cm_buf_init(&f.text, TR_HTTP_FORWARDED_MAX_BYTES + 1);
    tr_mhd.get_connection_values(c->mc, MHD_HEADER_KIND, collect_forwarded, &f);
    if (f.over)
      st = TR_HTTP_FWD_TOO_LONG;
    else
      st = tr_http_forwarded_client(h->trusted, h->n_trusted, &peer, h->forwarded_header,
                                    f.found ? f.text.data : NULL, f.text.len, &client);
    cm_buf_release(&f.text);
  }
  tr_http_addr_format(&client, c->remote.client);
  c->remote.forwarded = tr_http_forwarded_status_name(st);
  return &c->remote;
}

/* For the audit log: who was refused (the addresses, never what it sent). */
static void auth_failed(hs_conn_t *c, const char *reason) {
  tr_http_t *h = c->h;
  h->auth_failures++;
  if (!h->cbs.auth_failed) return;
  h->cbs.auth_failed(h->data, tr_hs_conn_remote(c), reason);
}

bool tr_hs_check_auth(hs_conn_t *c) {
  tr_http_t *h = c->h;
  if (!h->n_tokens) {
    c->principal = &h->principals[0];
    return true;
  }
  const char *v = tr_hs_header(c, "Authorization");
  const char *tok;
  size_t n;
  const tr_http_token_t *t = NULL;
  if (v && tr_http_bearer_token(v, strlen(v), &tok, &n) == 0)
    t = tr_http_token_match(h->tokens, h->n_tokens, tok, n);
  if (!t) {
    auth_failed(c, v ? "invalid" : "missing");
    return false;
  }
  c->principal = &h->principals[h->token_principal[t - h->tokens]];
  memcpy(c->token_sha256, t->sha256, sizeof c->token_sha256);
  c->has_token = true;
  cm_debug("http: authenticated as %s", c->principal->name);
  return true;
}

bool tr_hs_version_supported(tr_http_t *h, const char *v) {
  for (char **p = h->versions; p && *p; p++)
    if (strcmp(*p, v) == 0) return true;
  return false;
}

enum MHD_Result tr_hs_check_protocol_version(hs_conn_t *c, bool *ok) {
  const char *v = tr_hs_header(c, "MCP-Protocol-Version");
  *ok = true;
  if (!v || tr_hs_version_supported(c->h, v)) return MHD_YES;
  *ok = false;
  cleanup_free char *excerpt = cm_log_excerpt(v, strlen(v), 40);
  cleanup_free char *msg = xasprintf("Bad Request: Unsupported protocol version: %s", excerpt);
  return tr_hs_respond_error(c, 400, -32000, msg, NULL, NULL);
}

void tr_hs_parse_accept(hs_conn_t *c) {
  const char *a = tr_hs_header(c, "Accept");
  if (!a) {
    c->accept_json = c->accept_sse = true;
    return;
  }
  tr_http_parse_accept(a, strlen(a), &c->accept_json, &c->accept_sse);
}

/* The session a request names; answers 400/404 itself when there is none. */
hs_session_t *tr_hs_lookup_session(hs_conn_t *c, const char *value, bool legacy,
                                   enum MHD_Result *ret) {
  if (!value) {
    *ret = tr_hs_respond_error(c, 400, -32000,
                               legacy ? "Bad Request: sessionId is required"
                                      : "Bad Request: Mcp-Session-Id header is required",
                               NULL, NULL);
    return NULL;
  }
  hs_session_t *s = tr_http_session_id_valid(value, strlen(value))
                        ? tr_hs_session_find(c->h, value, strlen(value), c->principal)
                        : NULL;
  if (!s || s->legacy != legacy) {
    *ret = tr_hs_respond_error(c, 404, -32001, "Session not found", NULL, NULL);
    return NULL;
  }
  return s;
}
