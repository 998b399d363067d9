/* Glue between the Streamable HTTP transport and the router: options from the flags,
 * TLS material (given, or self-signed under the state directory), and the session
 * callbacks. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/files/files.h"
#include "server/server.h"

#define TLS_MAX_PEM (1u << 20)

/* ---------------------------------------------------------------- session callbacks */

static void *http_session_open(void *data, tr_sink_t *standalone, const char *principal) {
  srv_session_t *ss = srv_session_new(data, standalone);
  srv_session_set_principal(ss, principal);
  return ss;
}

static void http_on_message(void *data, void *session, const char *buf, size_t len,
                            tr_sink_t *reply) {
  srv_session_handle(session, buf, len, reply);
}

static void http_on_stateless(void *data, const char *principal, const char *buf, size_t len,
                              tr_sink_t *reply) {
  srv_server_handle_stateless(data, principal, buf, len, reply);
}

static const char *http_session_protocol(void *data, void *session) {
  return srv_session_protocol(session);
}

static void http_session_close(void *data, void *session) {
  srv_session_free(session);
}

static bool http_ready(void *data) {
  return srv_server_ready(data);
}

static char *http_metrics(void *data) {
  return srv_metrics_render(data, NULL);
}

static void http_auth_failed(void *data, const tr_remote_t *remote, const char *reason) {
  srv_audit_t *audit = srv_server_audit(data);
  if (!audit) return;
  json_t *line =
      json_pack("{s:s, s:s, s:s, s:s*, s:s}", "event", "auth_failure", "remote", remote->peer,
                "client", remote->client, "forwarded", remote->forwarded, "reason", reason);
  srv_audit_write(audit, line);
  json_decref(line);
}

/* ---------------------------------------------------------------- options */

/* "a, b,c" -> {"a", "b", "c", NULL}; NULL for NULL or nothing. */
static char **split_list(const char *s) {
  if (!s) return NULL;
  size_t n = 0, cap = 4;
  char **v = xcalloc(cap + 1, sizeof *v);
  const char *p = s;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *a = p;
    while (len && (*a == ' ' || *a == '\t')) a++, len--;
    while (len && (a[len - 1] == ' ' || a[len - 1] == '\t')) len--;
    if (len) {
      if (n == cap) {
        cap *= 2;
        v = xrealloc(v, (cap + 1) * sizeof *v);
      }
      v[n++] = xstrndup(a, len);
      v[n] = NULL;
    }
    if (!comma) break;
    p = comma + 1;
  }
  if (n == 0) {
    free(v);
    return NULL;
  }
  return v;
}

char *srv_http_url(const srv_config_t *cfg, uint16_t port) {
  bool tls = cfg->tls_cert || cfg->tls_self_signed;
  bool v6 = strchr(cfg->host, ':') != NULL;
  return xasprintf("%s://%s%s%s:%u%s", tls ? "https" : "http", v6 ? "[" : "", cfg->host,
                   v6 ? "]" : "", (unsigned)port, cfg->path);
}

static void cleanse_freep(char **p) {
  if (*p) explicit_bzero(*p, strlen(*p));
  free(*p);
}

/* GET <path>/runs/<run-id>/<file>: a run's output file, as resources/read would give it
 * to the same principal.  rest comes percent-decoded (libmicrohttpd decodes the path), the
 * URIs we issued are escaped: escape it again ("a b.html" is "a%20b.html"). */
static int http_open_download(void *data, const char *principal, const char *rest, int *fd,
                              const char **mime, uint64_t *size) {
  srv_server_t *server = data;
  cleanup_free char *escaped = files_uri_escape(rest, strlen(rest));
  cleanup_free char *uri = xasprintf("sandbox://runs/%s", escaped);
  cm_error_t err = CM_ERROR_INIT;
  int rc = art_store_open(srv_server_artifacts(server), principal, uri, fd, mime, size, &err);
  cm_error_release(&err);
  return rc;
}

int srv_serve_http(cm_loop_t *loop, srv_server_t *server, const srv_config_t *cfg, tr_http_t **out,
                   cm_error_t *err) {
  cleanup_free char *cert = NULL;
  __attribute__((cleanup(cleanse_freep))) char *key = NULL;
  if (cfg->tls_cert) {
    size_t n;
    if (cm_read_file(cfg->tls_cert, TLS_MAX_PEM, &cert, &n, err) < 0)
      return cm_error_wrap(err, "reading --tls-cert");
    if (cm_read_file(cfg->tls_key, TLS_MAX_PEM, &key, &n, err) < 0)
      return cm_error_wrap(err, "reading --tls-key");
    char fp[96];
    if (tr_tls_check_pair(cert, key, fp, err) < 0)
      return cm_error_wrap(err, "--tls-cert/--tls-key");
    fprintf(stderr, "%s%s: TLS certificate SHA-256 fingerprint: %s\n",
            cm_log_journal() ? "<5>" : "", SRV_NAME, fp);
  } else if (cfg->tls_self_signed) {
    /* (checked here, not with the other flags: the transport knows what a name may be) */
    if (cm_strv_len(cfg->tls_san) > TR_TLS_MAX_EXTRA_NAMES)
      return cm_error_set(err, 0, CM_ERR_INVALID, "--tls-san: at most %d names",
                          TR_TLS_MAX_EXTRA_NAMES);
    for (char **san = cfg->tls_san; san && *san; san++)
      if (!tr_tls_name_ok(*san))
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "--tls-san: '%s' is neither an IP address nor a DNS name", *san);
    cleanup_free char *dir = xasprintf("%s/tls", srv_server_state_dir(server));
    char fp[96];
    if (tr_tls_self_signed(dir, SRV_NAME, cfg->host, (const char *const *)cfg->tls_san, &cert, &key,
                           fp, err) < 0)
      return -1;
    fprintf(stderr, "%s%s: TLS certificate SHA-256 fingerprint: %s\n",
            cm_log_journal() ? "<5>" : "", SRV_NAME, fp);
  }
  cleanup_strv char **hosts = split_list(cfg->allowed_hosts);
  cleanup_strv char **origins = split_list(cfg->allowed_origins);
  const char *versions[8] = {0};
  for (size_t i = 0; i < srv_protocol_versions_count && i + 1 < CM_ARRAY_SIZE(versions); i++)
    versions[i] = srv_protocol_versions[i];
  tr_http_options_t o = {
      .host = cfg->host,
      .port = (uint16_t)cfg->port,
      .path = cfg->path,
      .allowed_hosts = (const char *const *)hosts,
      .allowed_origins = (const char *const *)origins,
      .auth_token_file = cfg->auth_token_file,
      .allow_insecure_remote = cfg->allow_insecure_remote,
      .tls_cert_pem = cert,
      .tls_key_pem = key,
      .max_body_bytes = (size_t)cfg->max_message_bytes,
      .max_sessions = (size_t)cfg->max_sessions,
      .session_idle_ms = cfg->session_idle_ms,
      .stall_ms = cfg->stall_ms,
      .max_connections = (size_t)cfg->max_connections,
      .protocol_versions = versions,
      .max_sessions_per_principal = (size_t)cfg->max_sessions_per_token,
      .max_streams_per_principal = (size_t)cfg->max_streams_per_token,
      .max_replay_bytes_per_session = (size_t)cfg->max_replay_bytes_per_session,
      .max_replay_bytes = (size_t)cfg->max_replay_bytes,
      .max_unread_bytes_per_principal = (size_t)cfg->max_unread_bytes_per_token,
      .loopback_origins = strcmp(cfg->loopback_origins, "on") == 0 ? TR_HTTP_LOOPBACK_ORIGINS_ON
                          : strcmp(cfg->loopback_origins, "off") == 0
                              ? TR_HTTP_LOOPBACK_ORIGINS_OFF
                              : TR_HTTP_LOOPBACK_ORIGINS_AUTO,
      .health_auth = cfg->health_auth,
      .trusted_proxies = (const char *const *)cfg->trusted_proxies,
      .trusted_proxy_header = cfg->trusted_proxy_header,
      .metrics_principals = (const char *const *)cfg->metrics_tokens,
      /* Backend none keeps no tenant from another: a script runs as the server's user and
       * reads the token file (every tenant's token), the state directory and every run. */
      .one_principal_only =
          strcmp(cfg->sandbox_backend, "none") == 0 && !cfg->allow_none_with_tokens
              ? "with --sandbox-backend none every tenant's script runs as the server's user "
                "and can read this file (every other tenant's token), the state directory and "
                "the other tenants' runs; use a sandbox (native, docker or podman), one "
                "principal, or --allow-none-with-tokens to accept that"
              : NULL,
  };
  /* H6: what the tools mirror into Mcp-Param-* headers (pointers into `marked`). */
  cleanup_json json_t *marked = srv_server_param_headers(server);
  size_t n_marked = json_array_size(marked);
  cleanup_free tr_http_param_header_t *param_headers =
      xcalloc(n_marked ? n_marked : 1, sizeof *param_headers);
  for (size_t i = 0; i < n_marked; i++) {
    json_t *m = json_array_get(marked, i);
    param_headers[i] = (tr_http_param_header_t){
        .tool = json_string_value(json_object_get(m, "tool")),
        .property = json_string_value(json_object_get(m, "property")),
        .header = json_string_value(json_object_get(m, "header")),
    };
  }
  o.param_headers = param_headers;
  o.n_param_headers = n_marked;
  static const tr_http_callbacks_t cbs = {
      .session_open = http_session_open,
      .on_message = http_on_message,
      .on_stateless = http_on_stateless,
      .session_protocol = http_session_protocol,
      .session_close = http_session_close,
      .open_download = http_open_download,
      .ready = http_ready,
      .metrics = http_metrics,
      .auth_failed = http_auth_failed,
  };
  tr_http_t *h = tr_http_new(loop, &o, &cbs, server, err);
  if (!h) return -1;
  srv_server_set_http(server, h);
  *out = h;
  return 0;
}
