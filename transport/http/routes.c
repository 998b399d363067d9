/* Request routing (http-internal.h): the first call judges a request on its headers
 * (endpoint, Origin/Host, token, method), a POST's body is routed when complete (the
 * handshake era's sessions, the stateless revision's POSTs, HTTP+SSE messages), GET
 * streams and resumptions, DELETE, downloads; and what the end of a request means.
 *
 * A request context (hs_conn_t) per HTTP request: one that streams is attached to one
 * stream at a time.  Everything a callback still uses is freed after the callback returns. */
#include <stdio.h>

#include "transport/http/http-internal.h"

/* ================================================================ endpoints */

static enum MHD_Result mcp_get(hs_conn_t *c) {
  tr_hs_parse_accept(c);
  if (!c->accept_sse)
    return tr_hs_respond_error(c, 406, -32000,
                               "Not Acceptable: Client must accept text/event-stream", NULL, NULL);
  enum MHD_Result ret = MHD_YES;
  hs_session_t *s = tr_hs_lookup_session(c, tr_hs_header(c, "Mcp-Session-Id"), false, &ret);
  if (!s) return ret;
  bool ok;
  ret = tr_hs_check_protocol_version(c, &ok);
  if (!ok) return ret;
  tr_hs_conn_set_session(c, s);
  const char *last = tr_hs_header(c, "Last-Event-ID");
  if (last) {
    uint64_t number, seq;
    if (tr_http_parse_event_id(last, strlen(last), &number, &seq) < 0)
      return tr_hs_respond_error(c, 400, -32000, "Bad Request: malformed Last-Event-ID", NULL,
                                 NULL);
    hs_stream_t *st = NULL;
    for (hs_stream_t *x = s->streams; x; x = x->next)
      if (x->number == number) st = x;
    if (!tr_hs_stream_admit(c, &ret)) return ret;
    if (!st || st->mode != MODE_SSE) {
      /* Nothing left to replay: an empty stream; the client then opens a plain GET. */
      cm_debug("http: resumption of unknown stream %llu", (unsigned long long)number);
      return tr_hs_respond_sse(c);
    }
    if (st->lost) tr_hs_stream_lost_notice(st);
    if (st->conn) {
      /* The old request is most likely dead; the new one takes over. */
      hs_conn_t *old = st->conn;
      old->kicked = true;
      old->stream = NULL;
      st->conn = NULL;
      tr_hs_conn_wake(old);
    }
    tr_hs_conn_attach(c, st);
    c->next_seq = seq + 1;
    cm_debug("http: session %s resumes stream %llu after event %llu", s->id,
             (unsigned long long)number, (unsigned long long)seq);
    return tr_hs_respond_sse(c);
  }
  hs_stream_t *st = s->standalone;
  if (!st) return tr_hs_respond_error(c, 404, -32001, "Session not found", NULL, NULL);
  if (st->conn)
    return tr_hs_respond_error(c, 409, -32000,
                               "Conflict: Only one SSE stream is allowed per session", NULL, NULL);
  if (!tr_hs_stream_admit(c, &ret)) return ret;
  tr_hs_conn_attach(c, st);
  c->next_seq = st->unsent_from;
  return tr_hs_respond_sse(c);
}

static enum MHD_Result mcp_delete(hs_conn_t *c) {
  enum MHD_Result ret = MHD_YES;
  hs_session_t *s = tr_hs_lookup_session(c, tr_hs_header(c, "Mcp-Session-Id"), false, &ret);
  if (!s) return ret;
  bool ok;
  ret = tr_hs_check_protocol_version(c, &ok);
  if (!ok) return ret;
  tr_hs_session_close(s);
  return tr_hs_respond_empty(c, 200);
}

static enum MHD_Result respond_draining(hs_conn_t *c);

static enum MHD_Result legacy_get(hs_conn_t *c) {
  tr_http_t *h = c->h;
  /* The stream is a new session: refused during the drain, as an initialize is. */
  if (h->draining) return respond_draining(c);
  tr_hs_parse_accept(c);
  if (!c->accept_sse)
    return tr_hs_respond_error(c, 406, -32000,
                               "Not Acceptable: Client must accept text/event-stream", NULL, NULL);
  enum MHD_Result ret = MHD_YES;
  /* The stream is the session: both caps first, before anything is closed for it. */
  if (h->max_streams_per_principal && c->principal->streams >= h->max_streams_per_principal) {
    tr_hs_stream_admit(c, &ret);
    return ret;
  }
  if (!tr_hs_session_make_room(c, &ret)) return ret;
  hs_session_t *s = tr_hs_session_create(h, true, c->principal);
  if (!s)
    return tr_hs_respond_error(c, 503, -32000, "Service Unavailable: session refused", NULL, NULL);
  tr_hs_conn_set_session(c, s);
  c->legacy_stream = true;
  tr_hs_stream_admit(c, &ret); /* within the cap: checked above */
  hs_stream_t *st = s->standalone;
  cleanup_free char *endpoint = xasprintf("%s?sessionId=%s", h->messages_path, s->id);
  cm_buf_t b;
  cm_buf_init(&b, 0);
  tr_http_sse_event(&b, "endpoint", false, 0, 0, endpoint, strlen(endpoint));
  cm_buf_append(&c->out, b.data, b.len);
  cm_buf_release(&b);
  tr_hs_conn_count(c);
  tr_hs_conn_attach(c, st);
  c->next_seq = st->unsent_from;
  return tr_hs_respond_sse(c);
}

/* During the drain: a body that would start new work (a session, a tool call, a batch) is
 * refused with 503 and Retry-After; the rest (tasks/get, ping, a cancellation) is served. */
static bool starts_work(const tr_http_envelope_t *env, json_t *message) {
  if (env->initialize || (env->batch && env->requests)) return true;
  json_t *m = message ? json_object_get(message, "method") : NULL;
  /* (a listen stream too: the drain ended those open, and would cut a new one off) */
  return json_is_string(m) && (strcmp(json_string_value(m), "tools/call") == 0 ||
                               strcmp(json_string_value(m), "subscriptions/listen") == 0);
}

static enum MHD_Result respond_draining(hs_conn_t *c) {
  char after[16];
  snprintf(after, sizeof after, "%u", c->h->retry_after_s);
  return tr_hs_respond_error(c, 503, -32000,
                             "Service Unavailable: the server is draining (shutting down); retry "
                             "later or on another instance",
                             "Retry-After", after);
}

static enum MHD_Result legacy_post(hs_conn_t *c) {
  tr_http_t *h = c->h;
  enum MHD_Result ret = MHD_YES;
  const char *sid = tr_mhd.lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, "sessionId");
  tr_http_envelope_t env;
  tr_http_classify(c->body.data ? c->body.data : "", c->body.len, &env);
  c->req_id = steal_pointer(&env.id);
  bool refuse = h->draining && env.requests && starts_work(&env, env.message);
  tr_http_envelope_release(&env);
  if (refuse) return respond_draining(c);
  hs_session_t *s = tr_hs_lookup_session(c, sid, true, &ret);
  if (!s) return ret;
  tr_hs_conn_set_session(c, s);
  if (env.status != TR_HTTP_BODY_OK)
    return tr_hs_respond_error(c, 400, env.status == TR_HTTP_BODY_PARSE_ERROR ? -32700 : -32600,
                               env.why, NULL, NULL);
  if (env.requests && tr_hs_unread_over(c, &ret)) return ret;
  hs_stream_t *st = s->standalone;
  if (st && s->app) {
    st->sink.remote = *tr_hs_conn_remote(c);
    h->cbs.on_message(h->data, s->app, c->body.data, c->body.len, &st->sink);
  }
  struct MHD_Response *r =
      tr_mhd.create_response_from_buffer(8, (void *)(uintptr_t) "Accepted", MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  tr_mhd.add_response_header(r, "Content-Type", "text/plain");
  return tr_hs_queue(c, 202, r);
}

static void json_unrefp(json_t **j) {
  json_decref(*j);
}

/* A stateless POST (2026-07-28): H5, H2, H3, H6, then the router on a stand-in session of
 * its own, for c's principal; no Mcp-Session-Id is read, minted or echoed. */
static enum MHD_Result stateless_post(hs_conn_t *c, json_t *meta_version, json_t *message) {
  tr_http_t *h = c->h;
  /* H5: the header must say what _meta says.  When _meta says nothing readable the router
   * answers its -32602, which is the more telling error. */
  const char *hv = tr_hs_header(c, "MCP-Protocol-Version");
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
    return tr_hs_respond_error(c, 400, -32020, msg, NULL, NULL);
  }
  /* The body's own claim, as for H5: without one the router's -32602 says more. */
  enum MHD_Result ret;
  if (meta_version && message && !tr_hs_check_mirrored(c, message, &ret)) return ret;
  hs_session_t *s = tr_hs_session_create_stateless(h, c->principal);
  tr_hs_conn_set_session(c, s);
  hs_stream_t *st = tr_hs_stream_new(s, STREAM_POST);
  st->accept_json = c->accept_json;
  st->accept_sse = c->accept_sse;
  if (c->req_id) st->request_id = json_incref(c->req_id);
  tr_hs_conn_attach(c, st);
  c->dispatched = true;
  st->sink.remote = *tr_hs_conn_remote(c);
  h->cbs.on_stateless(h->data, c->principal->name, c->body.data, c->body.len, &st->sink);
  cm_buf_release(&c->body);
  cm_buf_init(&c->body, 0);
  tr_sink_unref(&st->sink);
  return tr_hs_post_try_respond(c);
}

static enum MHD_Result mcp_post(hs_conn_t *c) {
  tr_http_t *h = c->h;
  tr_http_envelope_t env;
  tr_http_classify(c->body.data ? c->body.data : "", c->body.len, &env);
  c->req_id = steal_pointer(&env.id);
  json_t *meta_version __attribute__((cleanup(json_unrefp))) = steal_pointer(&env.meta_version);
  json_t *message __attribute__((cleanup(json_unrefp))) = steal_pointer(&env.message);
  if (env.status == TR_HTTP_BODY_PARSE_ERROR)
    return tr_hs_respond_error(c, 400, -32700, env.why, NULL, NULL);
  if (env.status == TR_HTTP_BODY_INVALID)
    return tr_hs_respond_error(c, 400, -32600, env.why, NULL, NULL);
  c->has_request = env.requests > 0;
  tr_hs_parse_accept(c);
  if (c->has_request && !c->accept_json && !c->accept_sse)
    return tr_hs_respond_error(
        c, 406, -32000, "Not Acceptable: Client must accept application/json or text/event-stream",
        NULL, NULL);
  if (h->draining && c->has_request && starts_work(&env, message)) return respond_draining(c);
  /* A listen stream is a stream: a client that takes JSON only would hold it open and get
   * nothing on it, not even the acknowledgement. */
  json_t *method = message ? json_object_get(message, "method") : NULL;
  if (!c->accept_sse && json_is_string(method) &&
      strcmp(json_string_value(method), "subscriptions/listen") == 0)
    return tr_hs_respond_error(
        c, 406, -32000, "Not Acceptable: subscriptions/listen answers with text/event-stream", NULL,
        NULL);
  const char *sid = tr_hs_header(c, "Mcp-Session-Id");
  enum MHD_Result ret = MHD_YES;
  bool ok;
  hs_session_t *s;
  if (c->has_request && !(env.initialize && sid) && tr_hs_unread_over(c, &ret)) {
    /* (an initialize naming a session is answered below as ever: no new work) */
    return ret;
  }
  /* The era (docs/protocol-2026.md, section 2): a single request that claims the stateless
   * revision in its _meta is served statelessly, session or not (an Mcp-Session-Id on it is
   * ignored); so is one without a session that is not initialize, when it is
   * server/discover or its MCP-Protocol-Version is none of the handshake era's (its _meta
   * is then malformed: the router says how). */
  if (h->cbs.on_stateless && !env.batch && env.requests == 1) {
    const char *hv = tr_hs_header(c, "MCP-Protocol-Version");
    bool modern = env.modern || (!sid && !env.initialize &&
                                 (env.discover || (hv && !tr_hs_version_supported(h, hv))));
    if (modern) return stateless_post(c, meta_version, message);
  }
  if (env.initialize) {
    if (env.batch)
      return tr_hs_respond_error(
          c, 400, -32600, "Invalid Request: initialize must not be part of a batch", NULL, NULL);
    if (sid) {
      if (tr_http_session_id_valid(sid, strlen(sid)) &&
          tr_hs_session_find(h, sid, strlen(sid), c->principal))
        return tr_hs_respond_error(c, 400, -32600, "Invalid Request: Server already initialized",
                                   NULL, NULL);
      return tr_hs_respond_error(c, 404, -32001, "Session not found", NULL, NULL);
    }
    ret = tr_hs_check_protocol_version(c, &ok);
    if (!ok) return ret;
    if (!tr_hs_session_make_room(c, &ret)) return ret;
    s = tr_hs_session_create(h, false, c->principal);
    if (!s)
      return tr_hs_respond_error(c, 503, -32000, "Service Unavailable: session refused", NULL,
                                 NULL);
  } else {
    s = tr_hs_lookup_session(c, sid, false, &ret);
    if (!s) return ret;
    ret = tr_hs_check_protocol_version(c, &ok);
    if (!ok) return ret;
    if (env.batch) {
      const char *v = tr_hs_session_protocol(s);
      if (!v || strcmp(v, "2025-03-26") != 0)
        return tr_hs_respond_error(
            c, 400, -32600,
            "Invalid Request: batches are only accepted in protocol version 2025-03-26", NULL,
            NULL);
    }
  }
  tr_hs_conn_set_session(c, s);
  hs_stream_t *st = tr_hs_stream_new(s, STREAM_POST);
  st->accept_json = c->accept_json;
  st->accept_sse = c->accept_sse;
  if (c->req_id && env.requests == 1 && !env.batch) st->request_id = json_incref(c->req_id);
  if (!c->has_request) {
    st->mode = MODE_ACCEPTED;
    st->sink.closed = true;
  }
  tr_hs_conn_attach(c, st);
  c->dispatched = true;
  st->sink.remote = *tr_hs_conn_remote(c);
  h->cbs.on_message(h->data, s->app, c->body.data, c->body.len, &st->sink);
  cm_buf_release(&c->body);
  cm_buf_init(&c->body, 0);
  if (env.initialize && s->open && !tr_hs_session_protocol(s)) {
    /* initialize failed (bad params): no session comes of it. */
    tr_hs_session_close(s);
  }
  tr_sink_unref(&st->sink);
  return tr_hs_post_try_respond(c);
}

static enum MHD_Result preflight(hs_conn_t *c) {
  if (!c->origin) return tr_hs_respond_405(c, "GET, POST, DELETE");
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  tr_mhd.add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
  tr_mhd.add_response_header(r, "Access-Control-Allow-Headers",
                             "Content-Type, Authorization, Mcp-Session-Id, Mcp-Protocol-Version, "
                             "Last-Event-ID, Accept");
  tr_mhd.add_response_header(r, "Access-Control-Max-Age", "600");
  return tr_hs_queue(c, 204, r);
}

static enum MHD_Result begin_post(hs_conn_t *c) {
  const char *ct = tr_hs_header(c, "Content-Type");
  if (!ct || !tr_http_media_type_is(ct, strlen(ct), "application/json"))
    return tr_hs_respond_error(c, 415, -32000,
                               "Unsupported Media Type: Content-Type must be application/json",
                               NULL, NULL);
  const char *cl = tr_hs_header(c, "Content-Length");
  uint64_t declared;
  if (cl && cm_parse_u64(cl, UINT64_MAX, &declared) == 0 && declared > c->h->max_body) {
    cleanup_free char *msg =
        xasprintf("Payload Too Large: the body exceeds %zu bytes", c->h->max_body);
    return tr_hs_respond_error(c, 413, -32000, msg, NULL, NULL);
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
    return tr_hs_respond_error(c, 404, -32002, "Not Found: no such file (or it expired)", NULL,
                               NULL);
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
  return tr_hs_queue(c, 200, r);
}

/* GET <base>/healthz (alive), <base>/readyz (ready to run calls: 503 before, and while
 * draining), <base>/metrics (Prometheus text: the server's and the transport's own). */
static enum MHD_Result plain(hs_conn_t *c, unsigned status, const char *type, const char *text,
                             const char *header, const char *value) {
  size_t len = strlen(text);
  struct MHD_Response *r =
      tr_mhd.create_response_from_buffer(len, xmemdup(text, len + 1), MHD_RESPMEM_MUST_FREE);
  if (!r) return MHD_NO;
  tr_mhd.add_response_header(r, "Content-Type", type);
  tr_mhd.add_response_header(r, "Cache-Control", "no-store");
  if (header) tr_mhd.add_response_header(r, header, value);
  return tr_hs_queue(c, status, r);
}

static enum MHD_Result health(hs_conn_t *c) {
  tr_http_t *h = c->h;
  if (c->ep == EP_HEALTHZ) return plain(c, 200, "text/plain", "ok\n", NULL, NULL);
  if (h->draining || h->shutting_down) {
    char after[16];
    snprintf(after, sizeof after, "%u", h->retry_after_s ? h->retry_after_s : 1);
    return plain(c, 503, "text/plain", "draining\n", "Retry-After", after);
  }
  if (h->cbs.ready && !h->cbs.ready(h->data))
    return plain(c, 503, "text/plain", "not ready\n", NULL, NULL);
  return plain(c, 200, "text/plain", "ready\n", NULL, NULL);
}

/* Whether c's principal may read /metrics: any, without tokens (the one local principal, as
 * for the MCP endpoint); else only those --metrics-token names.  It shows every tenant's
 * activity (calls, outcomes, durations, queues): an operator's view. */
static bool may_read_metrics(const hs_conn_t *c) {
  const tr_http_t *h = c->h;
  if (!h->n_tokens) return true;
  for (char **m = h->metrics_principals; m && *m && c->principal; m++)
    if (!c->principal->unnamed && strcmp(c->principal->name, *m) == 0) return true;
  return false;
}

static enum MHD_Result metrics(hs_conn_t *c) {
  tr_http_t *h = c->h;
  if (!may_read_metrics(c))
    return tr_hs_respond_error(c, 403, -32000,
                               "Forbidden: /metrics is for the server's operators (the principals "
                               "--metrics-token names)",
                               NULL, NULL);
  cleanup_free char *server = h->cbs.metrics ? h->cbs.metrics(h->data) : NULL;
  size_t conns = 0;
  for (hs_conn_t *k = h->conns; k; k = k->next) conns++;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  if (server) cm_buf_appends(&b, server);
  cm_buf_appends(&b,
                 "# HELP mcp_sandbox_http_responses_total HTTP answers, by status class.\n"
                 "# TYPE mcp_sandbox_http_responses_total counter\n");
  for (int k = 0; k < 5; k++)
    cm_buf_printf(&b, "mcp_sandbox_http_responses_total{code=\"%dxx\"} %llu\n", k + 1,
                  (unsigned long long)h->status_counts[k]);
  cm_buf_printf(&b,
                "# HELP mcp_sandbox_http_auth_failures_total Requests refused for want of a "
                "valid bearer token.\n# TYPE mcp_sandbox_http_auth_failures_total counter\n"
                "mcp_sandbox_http_auth_failures_total %llu\n"
                "# HELP mcp_sandbox_http_sessions Open sessions (the handshake era).\n"
                "# TYPE mcp_sandbox_http_sessions gauge\nmcp_sandbox_http_sessions %zu\n"
                "# HELP mcp_sandbox_http_connections Requests in progress (streams included).\n"
                "# TYPE mcp_sandbox_http_connections gauge\nmcp_sandbox_http_connections %zu\n"
                "# HELP mcp_sandbox_http_replay_bytes Events kept for resumption.\n"
                "# TYPE mcp_sandbox_http_replay_bytes gauge\nmcp_sandbox_http_replay_bytes %zu\n"
                "# HELP mcp_sandbox_draining 1 while the server drains.\n"
                "# TYPE mcp_sandbox_draining gauge\nmcp_sandbox_draining %d\n",
                (unsigned long long)h->auth_failures, h->n_sessions, conns, h->replay_bytes,
                h->draining ? 1 : 0);
  cleanup_free char *text = cm_buf_steal(&b);
  return plain(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, NULL, NULL);
}

/* The first call: everything that needs only the headers. */
static enum MHD_Result handle_headers(hs_conn_t *c, const char *url, const char *method) {
  tr_http_t *h = c->h;
  /* What goes under the endpoint is under its path without a trailing slash: under "/" it
   * is "/ui", never "//ui" (a browser reads that as a host named "ui"). */
  size_t path_len = strlen(h->path);
  while (path_len && h->path[path_len - 1] == '/') path_len--;
  if (strcmp(url, h->path) == 0)
    c->ep = EP_MCP;
  else if (strncmp(url, h->path, path_len) == 0 && strncmp(url + path_len, "/runs/", 6) == 0)
    c->ep = EP_DOWNLOAD;
  else if (strcmp(url, h->sse_path) == 0)
    c->ep = EP_SSE;
  else if (strcmp(url, h->messages_path) == 0)
    c->ep = EP_MESSAGES;
  else if (strcmp(url, h->healthz_path) == 0)
    c->ep = EP_HEALTHZ;
  else if (strcmp(url, h->readyz_path) == 0)
    c->ep = EP_READYZ;
  else if (strcmp(url, h->metrics_path) == 0)
    c->ep = EP_METRICS;
  else if (strncmp(url, h->path, path_len) == 0 && strncmp(url + path_len, "/ui", 3) == 0 &&
           (url[path_len + 3] == '\0' || url[path_len + 3] == '/'))
    c->ep = EP_UI;
  else
    return tr_hs_respond_error(c, 404, -32000, "Not Found", NULL, NULL);
  const char *why = NULL;
  if (!tr_hs_check_origin_host(c, &why))
    return tr_hs_respond_error(c, 403, -32000, why, NULL, NULL);
  if (strcmp(method, "OPTIONS") == 0) return preflight(c);
  bool probe = c->ep == EP_HEALTHZ || c->ep == EP_READYZ;
  if (probe && strcmp(method, "GET") != 0) return tr_hs_respond_405(c, "GET");
  /* A load balancer's probes need no token (unless --health-auth); /metrics does, when
   * there are tokens, and an operator's (metrics()). */
  if (probe && !h->health_auth) return health(c);
  /* The page and its assets need no token (ui.c): the page asks for one. */
  bool get_or_head = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  if (c->ep == EP_UI)
    return get_or_head ? tr_hs_serve_ui(c, url + path_len + 3) : tr_hs_respond_405(c, "GET");
  if (c->ep == EP_MCP && get_or_head && tr_hs_wants_page(c)) return tr_hs_serve_ui(c, "");
  if (!tr_hs_check_auth(c))
    return tr_hs_respond_error(c, 401, -32000, "Unauthorized: a valid bearer token is required",
                               "WWW-Authenticate", "Bearer realm=\"mcp\", error=\"invalid_token\"");
  if (h->shutting_down)
    return tr_hs_respond_error(c, 503, -32000, "Service Unavailable: shutting down", NULL, NULL);
  bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  switch (c->ep) {
    case EP_MCP:
      if (post) return begin_post(c);
      if (get) return mcp_get(c);
      if (strcmp(method, "DELETE") == 0) return mcp_delete(c);
      return tr_hs_respond_405(c, "GET, POST, DELETE");
    case EP_SSE:
      if (get) return legacy_get(c);
      return tr_hs_respond_405(c, "GET");
    case EP_MESSAGES:
      if (post) return begin_post(c);
      return tr_hs_respond_405(c, "POST");
    case EP_DOWNLOAD:
      if (get) return download(c, url + path_len + 6);
      return tr_hs_respond_405(c, "GET");
    case EP_HEALTHZ:
    case EP_READYZ:
      return health(c);
    case EP_METRICS:
      if (get) return metrics(c);
      return tr_hs_respond_405(c, "GET");
    case EP_UI:
    case EP_NONE:
      break;
  }
  return MHD_NO;
}

enum MHD_Result tr_hs_on_request(void *cls, struct MHD_Connection *mc, const char *url,
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
    return tr_hs_respond_error(c, 413, -32000, msg, NULL, NULL);
  }
  if (!c->is_post) return MHD_NO; /* cannot happen: every other request is answered at once */
  if (c->dispatched) return tr_hs_post_try_respond(c);
  /* Its token was removed (or changed) while its body arrived. */
  if (c->revoke != REVOKE_NONE) return tr_hs_respond_revoked(c);
  if (h->shutting_down)
    return tr_hs_respond_error(c, 503, -32000, "Service Unavailable: shutting down", NULL, NULL);
  if (c->ep == EP_MESSAGES) return legacy_post(c);
  return mcp_post(c);
}

void tr_hs_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                        enum MHD_RequestTerminationCode toe) {
  hs_conn_t *c = *con_cls;
  if (!c) return;
  *con_cls = NULL;
  tr_http_t *h = c->h;
  c->completed = true;
  tr_hs_conn_count(c);
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
  /* A handshake-era POST the client gave up on (the connection ended, not the answer): a
   * stream that cannot be resumed (a JSON answer, an unlisted stream) is cancelled as the
   * 2026 era's is; a resumable SSE stream is cancelled by the tick unless a GET with
   * Last-Event-ID takes it up within HTTP_ABANDON_GRACE_MS. */
  hs_stream_t *st = c->stream;
  if (!abandoned && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->session &&
      !c->session->stateless && st && st->kind == STREAM_POST && !st->finished &&
      st->sink.refs > 0 && st->conn == c) {
    if (st->mode != MODE_SSE || !st->listed || !c->session->open)
      abandoned = st;
    else
      st->abandoned_at = cm_now_ms();
  }
  if (abandoned) tr_sink_ref(&abandoned->sink);
  tr_hs_conn_detach(c, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
  if (c->get_stream) {
    c->get_stream = false;
    c->principal->streams--;
  }
  hs_session_t *s = c->session;
  c->session = NULL;
  if (s) {
    s->conns--;
    s->last_active = cm_now_ms();
    if (c->legacy_stream) tr_hs_session_close(s); /* HTTP+SSE: the stream is the session */
    /* A stateless POST is over: nothing of it stays (what the router sends later is dropped). */
    if (s->stateless) tr_hs_session_close(s);
    tr_hs_session_unref(s);
  }
  if (abandoned) {
    cm_debug("http: the client closed a request's stream: cancelling the request");
    tr_sink_peer_gone(&abandoned->sink);
    tr_sink_unref(&abandoned->sink);
  }
  tr_hs_conn_unref(c);
}
