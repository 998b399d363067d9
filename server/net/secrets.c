/* Secrets (see net.h): their values, a call's choice of them, and what a result and
 * check_environment say of them (names and hosts, never a value). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/net/net.h"

struct srv_secrets {
  const srv_config_t *cfg;
  eg_secret_value_t values[SRV_SECRETS_MAX];
  eg_rule_t *hosts[SRV_SECRETS_MAX];
  size_t n_hosts[SRV_SECRETS_MAX];
};

/* Reads one secret's file into v.  The value never appears in a message. */
static int read_value(const srv_secret_spec_t *spec, eg_secret_value_t *v, cm_error_t *err) {
  cleanup_close int fd = open(spec->file, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "secret %s: cannot open %s", spec->name, spec->file);
  struct stat st;
  if (fstat(fd, &st) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "secret %s: %s", spec->name, spec->file);
  if (!S_ISREG(st.st_mode))
    return cm_error_set(err, 0, CM_ERR_INVALID, "secret %s: %s is not a regular file", spec->name,
                        spec->file);
  if (st.st_mode & S_IROTH)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "secret %s: %s is world-readable (mode %03o): make it readable by the "
                        "server's user only (chmod 600)",
                        spec->name, spec->file, (unsigned)(st.st_mode & 0777));
  /* The value's home for a moment (on the stack, wiped at once). */
  char tmp[EG_SECRET_VALUE_MAX + 2];
  size_t len = 0;
  for (;;) {
    ssize_t r = read(fd, tmp + len, sizeof tmp - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      explicit_bzero(tmp, sizeof tmp);
      return cm_error_set(err, errno, CM_ERR_IO, "secret %s: reading %s", spec->name, spec->file);
    }
    if (r == 0) break;
    len += (size_t)r;
    if (len == sizeof tmp) break;
  }
  if (len && tmp[len - 1] == '\n') len--;
  if (len && tmp[len - 1] == '\r') len--;
  int rc = 0;
  if (len == 0)
    rc = cm_error_set(err, 0, CM_ERR_INVALID, "secret %s: %s is empty", spec->name, spec->file);
  else if (len > EG_SECRET_VALUE_MAX)
    rc = cm_error_set(err, 0, CM_ERR_INVALID, "secret %s: %s holds more than %d bytes", spec->name,
                      spec->file, EG_SECRET_VALUE_MAX);
  for (size_t i = 0; i < len && rc == 0; i++)
    if ((unsigned char)tmp[i] < 0x20 || tmp[i] == 0x7f)
      rc = cm_error_set(err, 0, CM_ERR_INVALID,
                        "secret %s: %s holds a control character (a line break, say): a value "
                        "goes into an HTTP header as it is",
                        spec->name, spec->file);
  if (rc == 0) eg_secret_value_set(v, tmp, len);
  explicit_bzero(tmp, sizeof tmp);
  return rc;
}

srv_secrets_t *srv_secrets_load(const srv_config_t *cfg, cm_error_t *err) {
  srv_secrets_t *s = xcalloc(1, sizeof *s);
  s->cfg = cfg;
  for (size_t i = 0; i < cfg->n_secrets; i++) {
    if (read_value(&cfg->secrets[i], &s->values[i], err) < 0) {
      srv_secrets_free(s);
      return NULL;
    }
    for (char *const *h = cfg->secrets[i].hosts; *h; h++) {
      eg_rule_t r;
      if (eg_rule_parse(*h, strlen(*h), &r, err) < 0) { /* validated already */
        srv_secrets_free(s);
        return NULL;
      }
      s->hosts[i] = xrealloc(s->hosts[i], (s->n_hosts[i] + 1) * sizeof r);
      s->hosts[i][s->n_hosts[i]++] = r;
    }
  }
  if (cfg->n_secrets) cm_info("secrets: %zu loaded", cfg->n_secrets);
  return s;
}

void srv_secrets_free(srv_secrets_t *s) {
  if (!s) return;
  for (size_t i = 0; i < SRV_SECRETS_MAX; i++) {
    eg_secret_value_wipe(&s->values[i]);
    free(s->hosts[i]);
  }
  free(s);
}

void srv_network_reload_secrets(srv_network_t *n) {
  srv_secrets_t *s = srv_network_secrets(n);
  if (!s) return;
  for (size_t i = 0; i < s->cfg->n_secrets; i++) {
    cm_error_t err = CM_ERROR_INIT;
    /* Set in place: the sessions that hold the value's address see the new one. */
    if (read_value(&s->cfg->secrets[i], &s->values[i], &err) < 0)
      cm_err("SIGHUP: %s (the old value stays)", cm_error_message(&err));
    cm_error_release(&err);
  }
  if (s->cfg->n_secrets) cm_info("SIGHUP: secrets read again");
}

static bool principal_may(const srv_secret_spec_t *spec, const char *principal) {
  if (!spec->principals) return true;
  for (char *const *p = spec->principals; *p; p++)
    if (strcmp(*p, principal) == 0) return true;
  return false;
}

int srv_secrets_parse_call(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *backend,
                           const char *principal, const srv_net_call_t *net, json_t *arg,
                           srv_secret_call_t *out, char **error) {
  (void)n;
  memset(out, 0, sizeof *out);
  *error = NULL;
  if (!arg || json_is_null(arg)) return 0;
  if (!json_is_array(arg)) {
    *error = xstrdup(
        "'secrets' must be a list of secret names, e.g. [\"GITHUB_TOKEN\"] "
        "(check_environment lists the ones you may use).");
    return -1;
  }
  if (json_array_size(arg) == 0) return 0;
  if (json_array_size(arg) > SRV_SECRETS_MAX) {
    *error = xasprintf("'secrets' names %zu secrets; at most %d.", json_array_size(arg),
                       SRV_SECRETS_MAX);
    return -1;
  }
  size_t i;
  json_t *v;
  json_array_foreach(arg, i, v) {
    const char *name = json_string_value(v);
    size_t len = json_is_string(v) ? json_string_length(v) : 0;
    size_t k = cfg->n_secrets;
    if (name && eg_secret_name_ok(name, len))
      for (k = 0; k < cfg->n_secrets; k++)
        if (!strcmp(cfg->secrets[k].name, name) && principal_may(&cfg->secrets[k], principal))
          break;
    if (k == cfg->n_secrets) {
      cleanup_free char *shown = name ? cm_log_excerpt(name, len, 64) : xstrdup("(not a string)");
      *error = xasprintf(
          "Unknown secret '%s': no secret of that name is available to you "
          "(check_environment lists the ones you may use).",
          shown);
      return -1;
    }
    for (size_t j = 0; j < out->n; j++)
      if (out->index[j] == k) {
        *error = xasprintf("'secrets' names %s twice.", name);
        return -1;
      }
    out->index[out->n] = k;
    eg_secret_placeholder(name, out->placeholder[out->n], sizeof out->placeholder[out->n]);
    out->n++;
  }
  if (!net->on) {
    *error = xstrdup(
        "A secret is only used by the egress proxy, on the network: this call has no "
        "network (set 'network' to true or to a list naming the secret's hosts).");
    return -1;
  }
  if (!srv_network_proxied(cfg, backend) || strcmp(sbx_backend_name(backend), "bwrap") != 0) {
    *error = xasprintf(
        "Secrets need the bwrap backend and its egress proxy; this server runs the "
        "%s backend%s, where they are not available.",
        sbx_backend_name(backend), cfg->network_host ? " with --network host" : "");
    return -1;
  }
  return 0;
}

void srv_secrets_env(const srv_config_t *cfg, const srv_secret_call_t *call,
                     cm_strv_builder_t *env) {
  for (size_t i = 0; i < call->n; i++) {
    cleanup_free char *var =
        xasprintf("%s=%s", cfg->secrets[call->index[i]].name, call->placeholder[i]);
    cm_strv_add(env, var);
  }
}

void srv_secrets_bind(srv_network_t *n, const srv_config_t *cfg, const srv_secret_call_t *call,
                      eg_session_t *session) {
  srv_secrets_t *s = srv_network_secrets(n);
  if (!s || !session) return;
  for (size_t i = 0; i < call->n; i++) {
    size_t k = call->index[i];
    eg_session_add_secret(session, cfg->secrets[k].name, call->placeholder[i], &s->values[k],
                          s->hosts[k], s->n_hosts[k]);
  }
}

json_t *srv_secrets_used(const srv_config_t *cfg, const srv_secret_call_t *call,
                         const eg_session_t *session) {
  json_t *a = json_array();
  if (!session) return a;
  eg_stats_t st;
  eg_session_stats(session, &st);
  for (size_t i = 0; i < call->n && i < 64; i++)
    if (st.secrets_used & (1ull << i))
      json_array_append_new(a, json_string(cfg->secrets[call->index[i]].name));
  return a;
}

json_t *srv_secrets_describe(const srv_config_t *cfg, const char *principal, cm_buf_t *t) {
  json_t *a = json_array();
  for (size_t i = 0; i < cfg->n_secrets; i++) {
    const srv_secret_spec_t *spec = &cfg->secrets[i];
    if (!principal_may(spec, principal)) continue;
    json_t *hosts = json_array();
    cm_buf_printf(t, "%s  %s (hosts: ", json_array_size(a) ? "\n" : "", spec->name);
    for (char *const *h = spec->hosts; *h; h++) {
      json_array_append_new(hosts, json_string(*h));
      cm_buf_printf(t, "%s%s", h == spec->hosts ? "" : ", ", *h);
    }
    cm_buf_appends(t, ")");
    json_array_append_new(a, json_pack("{s:s, s:o}", "name", spec->name, "hosts", hosts));
  }
  return a;
}

void srv_secrets_ca_env(cm_strv_builder_t *env) {
  static const char *const vars[] = {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                     "PIP_CERT", "NODE_EXTRA_CA_CERTS"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(vars); i++) {
    cleanup_free char *v = xasprintf("%s=" SRV_SANDBOX_CA_BUNDLE, vars[i]);
    cm_strv_add(env, v);
  }
}

/* Does the call's list name a destination of one of the secret's hosts? */
static bool listed(const srv_config_t *cfg, size_t k, const srv_net_call_t *net) {
  for (char *const *h = cfg->secrets[k].hosts; *h; h++) {
    eg_rule_t r;
    cm_error_t err = CM_ERROR_INIT;
    if (eg_rule_parse(*h, strlen(*h), &r, &err) < 0) {
      cm_error_release(&err);
      continue;
    }
    uint16_t port = r.port ? r.port : 443;
    /* A suffix binding: a name below it stands for it. */
    cleanup_free char *name = r.kind == EG_RULE_SUFFIX ? xasprintf("x%s", r.host) : xstrdup(r.host);
    for (size_t i = 0; i < net->n_rules; i++)
      if (eg_rule_match_name(&net->rules[i], name, port)) return true;
  }
  return false;
}

void srv_secrets_text(const srv_config_t *cfg, const srv_secret_call_t *call,
                      const srv_net_call_t *net, const eg_session_t *session, cm_buf_t *t) {
  for (size_t i = 0; i < call->n && net->rules; i++)
    if (!listed(cfg, call->index[i], net))
      cm_buf_printf(t,
                    "\n--- note: secret %s: none of its hosts is in this call's network list, so "
                    "it was never substituted ---",
                    cfg->secrets[call->index[i]].name);
  if (!session) return;
  eg_stats_t st;
  eg_session_stats(session, &st);
  for (size_t i = 0; i < call->n && i < 64; i++)
    if (st.secrets_refused & (1ull << i))
      cm_buf_printf(t,
                    "\n--- network: a request carrying secret %s's placeholder was refused (403): "
                    "it went to a host the secret is not bound to, or without TLS ---",
                    cfg->secrets[call->index[i]].name);
}
