/* Streamable HTTP transport (MCP 2025-11-25 and the stateless 2026-07-28 revision, with
 * the 2024-11-05 HTTP+SSE endpoints): its life.  Options, the listening socket, the
 * principals, libmicrohttpd's start and stop, shutdown and free; and the work the daemon
 * glue runs for it.  http-internal.h says which file holds what.
 *
 * libmicrohttpd runs inside our reactor (daemon.c): nothing blocks and nothing runs on
 * another thread.  Lifetimes are reference counts: a session lives while the table, a
 * request or a stream points at it; a stream while its session lists it, a request is
 * attached, or the router holds its sink; a request context while MHD knows the request or
 * an SSE response reads from it.  Everything a callback still uses is freed after the
 * callback returns. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>

#include "transport/http/http-internal.h"

/* The principal of every request when there are no tokens. */
#define HTTP_PRINCIPAL_LOCAL "local"
/* Idle keep-alive connections and slow uploads; streams and waiting requests are exempt. */
#define HTTP_CONNECTION_TIMEOUT_S 30
/* MHD's per-connection pool: bounds the request line and headers. */
#define HTTP_CONNECTION_MEMORY (32u << 10)

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

/* --metrics-token: each value a comma-separated list of principal names (NULL: none). */
static char **metrics_names(const char *const *v) {
  cm_strv_builder_t b = {0};
  for (; v && *v; v++) {
    for (const char *p = *v; *p;) {
      size_t n = strcspn(p, ",");
      if (n) {
        cleanup_free char *name = xstrndup(p, n);
        cm_strv_add(&b, name);
      }
      p += n;
      if (*p == ',') p++;
    }
  }
  return b.v;
}

/* Says who may read /metrics where it is not what an operator may expect: every token
 * refused (no --metrics-token; at start-up only), an operator's name with no token in the
 * file (at start-up and after each reload), --metrics-token without tokens. */
static void metrics_access_log(const tr_http_t *h, bool starting) {
  if (!h->n_tokens) {
    if (h->metrics_principals && starting)
      cm_warn(
          "http: --metrics-token is for a server with bearer tokens: without them /metrics "
          "is open to every client of the endpoint, as the endpoint is");
    return;
  }
  if (!h->metrics_principals) {
    if (starting)
      cm_info("http: /metrics answers 403 to every token: no --metrics-token names an operator");
    return;
  }
  for (char **m = h->metrics_principals; *m; m++) {
    bool found = false;
    for (size_t i = 0; i < h->n_tokens && !found; i++)
      found = !h->tokens[i].unnamed && strcmp(h->tokens[i].name, *m) == 0;
    if (!found)
      cm_warn("http: --metrics-token %s: no token of that name in %s (it cannot read /metrics)", *m,
              h->token_file);
  }
}

static char *sibling_path(const char *path, const char *name) {
  const char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path) : 0;
  return xasprintf("%.*s/%s", (int)dir, path, name);
}

#define PRINCIPAL_FULL SIZE_MAX
#define PRINCIPAL_TAKEN (SIZE_MAX - 1)

/* The principal of a token, by its name, made when it is new; PRINCIPAL_FULL when the table
 * is full (only reloads can fill it: a token file holds at most TR_HTTP_MAX_TOKENS names);
 * PRINCIPAL_TAKEN for an unnamed token whose "line N" was another token's (the file changed
 * under it): it would inherit that tenant's sessions, tasks and files. */
static size_t principal_for(tr_http_t *h, const tr_http_token_t *t) {
  size_t k = 0;
  while (k < h->n_principals && strcmp(h->principals[k].name, t->name) != 0) k++;
  if (k < h->n_principals) {
    const hs_principal_t *p = &h->principals[k];
    if (t->unnamed && (!p->unnamed || memcmp(p->unnamed_sha256, t->sha256, 32) != 0))
      return PRINCIPAL_TAKEN;
    return k;
  }
  if (k == h->principals_cap) return PRINCIPAL_FULL;
  hs_principal_t *p = &h->principals[h->n_principals++];
  p->name = xstrdup(t->name);
  p->unnamed = t->unnamed;
  if (t->unnamed) memcpy(p->unnamed_sha256, t->sha256, 32);
  return k;
}

/* A refused reload leaves no principal behind (nothing points at those it made). */
static void principals_truncate(tr_http_t *h, size_t n) {
  while (h->n_principals > n) {
    hs_principal_t *p = &h->principals[--h->n_principals];
    free(p->name);
    memset(p, 0, sizeof *p);
  }
}

/* Whether the token with this digest is still in the file under p's name. */
static bool token_kept(const tr_http_t *h, const unsigned char *sha256, const hs_principal_t *p) {
  bool kept = false;
  for (size_t i = 0; i < h->n_tokens; i++)
    kept |=
        memcmp(h->tokens[i].sha256, sha256, 32) == 0 && &h->principals[h->token_principal[i]] == p;
  return kept;
}

/* After a reload: marks the requests and sessions of every token removed or changed, and
 * has them ended from the loop (tr_hs_revoke_pass), not under the caller. */
static void revoke_mark(tr_http_t *h) {
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    if (c->completed || !c->has_token || c->revoke != REVOKE_NONE ||
        token_kept(h, c->token_sha256, c->principal))
      continue;
    c->revoke = REVOKE_MARKED;
    h->revoke_pending = true;
  }
  for (hs_session_t *s = h->sessions; s; s = s->next) {
    if (!s->has_token || s->revoke != REVOKE_NONE || token_kept(h, s->token_sha256, s->principal))
      continue;
    s->revoke = REVOKE_MARKED;
    h->revoke_pending = true;
  }
  if (h->revoke_pending) tr_hs_soon(h);
}

int tr_http_reload_tokens(tr_http_t *h, cm_error_t *err) {
  if (!h || !h->token_file) return 0;
  cleanup_free char *text = NULL;
  size_t len = 0;
  tr_http_token_t *tokens = NULL;
  size_t n = 0;
  if (cm_read_file(h->token_file, 1u << 20, &text, &len, err) < 0 ||
      tr_http_parse_tokens(text, len, &tokens, &n, err) < 0) {
    if (text) explicit_bzero(text, len);
    return cm_error_wrap(err, "reading --auth-token-file %s again (the tokens stay as they were)",
                         h->token_file);
  }
  explicit_bzero(text, len);
  if (n == 0 && !h->n_tokens) {
    tr_http_tokens_free(tokens, n);
    return 0;
  }
  if (n == 0) {
    /* Without tokens the server would be open to anyone who can reach it: refuse that. */
    tr_http_tokens_free(tokens, n);
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "--auth-token-file %s now holds no token: the tokens stay as they were",
                        h->token_file);
  }
  size_t *map = xcalloc(n, sizeof *map);
  size_t had = h->n_principals;
  for (size_t i = 0; i < n; i++) {
    map[i] = principal_for(h, &tokens[i]);
    if (map[i] == PRINCIPAL_TAKEN) {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "--auth-token-file %s: the unnamed token now on %s is not the one that was "
                   "there, and would become its tenant (its sessions, tasks and files): give "
                   "the tokens names (NAME:TOKEN); the tokens stay as they were",
                   h->token_file, tokens[i].name);
    } else if (h->one_principal_only && h->n_principals > 1) {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "--auth-token-file %s now names more than one principal: %s (the tokens "
                   "stay as they were)",
                   h->token_file, h->one_principal_only);
    } else if (map[i] == PRINCIPAL_FULL) {
      /* Never two names as one tenant: the reload is refused as a whole. */
      cm_error_set(err, 0, CM_ERR_LIMIT,
                   "more than %d token names since the server started: restart it to use the "
                   "new file (the tokens stay as they were)",
                   TR_HTTP_MAX_TOKENS);
    } else {
      continue;
    }
    principals_truncate(h, had);
    free(map);
    tr_http_tokens_free(tokens, n);
    return -1;
  }
  tr_http_tokens_free(h->tokens, h->n_tokens);
  free(h->token_principal);
  h->tokens = tokens;
  h->n_tokens = n;
  h->token_principal = map;
  cm_info("http: %zu bearer tokens after reading %s again", n, h->token_file);
  metrics_access_log(h, false);
  revoke_mark(h);
  return 0;
}

bool tr_http_principal_revoked(const tr_http_t *h, const char *name) {
  if (!h || !name || !h->n_tokens) return false;
  size_t k = 0;
  while (k < h->n_principals && strcmp(h->principals[k].name, name) != 0) k++;
  if (k == h->n_principals) return false; /* never a token's (stdio, no tokens) */
  for (size_t i = 0; i < h->n_tokens; i++)
    if (h->token_principal[i] == k) return false;
  return true;
}

void tr_http_drain(tr_http_t *h, unsigned retry_after_s) {
  if (!h) return;
  h->draining = true;
  h->retry_after_s = retry_after_s ? retry_after_s : 1;
}

static void http_release(tr_http_t *h) {
  tr_http_tokens_free(h->tokens, h->n_tokens);
  for (size_t i = 0; i < h->n_principals; i++) free(h->principals[i].name);
  free(h->principals);
  free(h->token_principal);
  free(h->bound_host);
  free(h->trusted);
  cm_strv_free(h->allowed_hosts);
  cm_strv_free(h->allowed_origins);
  cm_strv_free(h->versions);
  for (size_t i = 0; i < h->n_param_headers; i++) {
    free(h->param_headers[i].tool);
    free(h->param_headers[i].property);
    free(h->param_headers[i].header);
  }
  free(h->param_headers);
  free(h->path);
  free(h->sse_path);
  free(h->messages_path);
  free(h->healthz_path);
  free(h->readyz_path);
  free(h->metrics_path);
  cm_strv_free(h->metrics_principals);
  free(h->token_file);
  free(h->one_principal_only);
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
  h->healthz_path = sibling_path(path, "healthz");
  h->readyz_path = sibling_path(path, "readyz");
  h->metrics_path = sibling_path(path, "metrics");
  h->health_auth = opts->health_auth;
  h->metrics_principals = metrics_names(opts->metrics_principals);
  h->allowed_hosts = copy_strv(opts->allowed_hosts, true);
  h->allowed_origins = copy_strv(opts->allowed_origins, false);
  h->versions = copy_strv(opts->protocol_versions, false);
  if (opts->n_param_headers) {
    h->param_headers = xcalloc(opts->n_param_headers, sizeof *h->param_headers);
    for (size_t i = 0; i < opts->n_param_headers; i++) {
      h->param_headers[i].tool = xstrdup(opts->param_headers[i].tool);
      h->param_headers[i].property = xstrdup(opts->param_headers[i].property);
      h->param_headers[i].header = xstrdup(opts->param_headers[i].header);
    }
    h->n_param_headers = opts->n_param_headers;
  }
  h->max_body = opts->max_body_bytes ? opts->max_body_bytes : (16u << 20);
  h->max_sessions = opts->max_sessions ? opts->max_sessions : 256;
  h->idle_ms = opts->session_idle_ms ? opts->session_idle_ms : 1800ull * 1000;
  h->stall_ms = opts->stall_ms ? opts->stall_ms : HTTP_STALL_DEFAULT_MS;
  h->n_buckets = 64;
  while (h->n_buckets < h->max_sessions * 2 && h->n_buckets < (1u << 16)) h->n_buckets *= 2;
  h->buckets = xcalloc(h->n_buckets, sizeof *h->buckets);
  h->tls = opts->tls_cert_pem && opts->tls_key_pem;
  if (opts->trusted_proxy_header && strcmp(opts->trusted_proxy_header, "forwarded") == 0) {
    h->forwarded_header = TR_HTTP_FORWARDED_RFC7239;
  } else if (opts->trusted_proxy_header &&
             strcmp(opts->trusted_proxy_header, "x-forwarded-for") != 0) {
    cm_error_set(err, 0, CM_ERR_INVALID,
                 "argument --trusted-proxy-header: invalid value: '%s' (x-forwarded-for or "
                 "forwarded)",
                 opts->trusted_proxy_header);
    http_release(h);
    free(h);
    return NULL;
  }
  for (const char *const *t = opts->trusted_proxies; t && *t; t++) {
    if (!h->trusted) h->trusted = xcalloc(TR_HTTP_MAX_TRUSTED_PROXIES, sizeof *h->trusted);
    if (tr_http_parse_trusted(*t, strlen(*t), h->trusted, TR_HTTP_MAX_TRUSTED_PROXIES,
                              &h->n_trusted, err) < 0) {
      cm_error_wrap(err, "argument --trusted-proxy");
      http_release(h);
      free(h);
      return NULL;
    }
  }

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
  /* One principal per distinct token name (two lines with one name are one tenant).  With
   * a token file the table has room for every name a reload may bring (sessions point into
   * it, so it never moves); principals are never removed. */
  h->principals_cap = opts->auth_token_file ? TR_HTTP_MAX_TOKENS : 1;
  h->principals = xcalloc(h->principals_cap, sizeof *h->principals);
  h->token_principal = xcalloc(h->n_tokens ? h->n_tokens : 1, sizeof *h->token_principal);
  if (!h->n_tokens) h->principals[h->n_principals++].name = xstrdup(HTTP_PRINCIPAL_LOCAL);
  for (size_t i = 0; i < h->n_tokens; i++) h->token_principal[i] = principal_for(h, &h->tokens[i]);
  if (opts->one_principal_only) h->one_principal_only = xstrdup(opts->one_principal_only);
  if (h->one_principal_only && h->n_principals > 1) {
    cm_error_set(err, 0, CM_ERR_INVALID, "--auth-token-file %s names %zu principals: %s",
                 opts->auth_token_file, h->n_principals, h->one_principal_only);
    http_release(h);
    free(h);
    return NULL;
  }
  if (opts->auth_token_file) h->token_file = xstrdup(opts->auth_token_file);
  metrics_access_log(h, true);
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
  if (h->n_trusted)
    cm_info("http: behind %zu trusted proxy range(s): the client's address is read from %s",
            h->n_trusted,
            h->forwarded_header == TR_HTTP_FORWARDED_RFC7239 ? "Forwarded" : "X-Forwarded-For");
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
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)tr_hs_on_completed, h};
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
  h->daemon = tr_mhd.start_daemon(flags, 0, NULL, NULL, tr_hs_on_request, h, MHD_OPTION_ARRAY, o,
                                  MHD_OPTION_END);
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
  if (tr_hs_daemon_watch(h, di->epoll_fd, err) < 0) {
    tr_mhd.stop_daemon(h->daemon);
    http_release(h);
    free(h);
    return NULL;
  }
  tr_hs_rearm(h, false);
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
  while (h->sessions) tr_hs_session_close(h->sessions);
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    if (!c->streaming) continue;
    c->ending = true;
    tr_hs_conn_wake(c);
  }
  tr_hs_soon(h);
}

void tr_http_free(tr_http_t *h) {
  if (!h) return;
  tr_http_shutdown(h);
  /* MHD must not be stopped with suspended connections. */
  for (hs_conn_t *c = h->conns; c; c = c->next) {
    c->lost = true;
    tr_hs_conn_wake(c);
  }
  cm_watch_remove(h->w_epoll);
  cm_timer_cancel(h->t_mhd);
  cm_timer_cancel(h->t_tick);
  h->t_mhd = h->t_tick = NULL;
  struct MHD_Daemon *d = h->daemon;
  h->daemon = NULL;
  if (d) tr_mhd.stop_daemon(d); /* completes every request (tr_hs_on_completed) */
  /* Streams the router still holds: orphan them; their release frees them. */
  tr_hs_streams_orphan(h);
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
