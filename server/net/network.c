/* The network of runs and builds (see net.h). */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "server/net/net.h"

struct srv_network {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  eg_proxy_t *proxy;
  bool proxy_failed;
  eg_policy_t script; /* public internet + allow - deny */
  eg_policy_t deny;   /* the deny rules alone */
  srv_secrets_t *secrets;
  char *ca_bundle; /* written at the first call with secrets */
};

static void add_rules(eg_policy_t *p, char *const *list, bool deny) {
  for (char *const *s = list; s && *s; s++) {
    eg_rule_t r;
    cm_error_t err = CM_ERROR_INIT;
    /* srv_config_validate() parsed every rule already. */
    if (eg_rule_parse(*s, strlen(*s), &r, &err) == 0) {
      if (deny)
        eg_policy_add_deny(p, &r);
      else
        eg_policy_add_allow(p, &r);
    }
    cm_error_release(&err);
  }
}

srv_network_t *srv_network_new(cm_loop_t *loop, const srv_config_t *cfg, srv_secrets_t *secrets) {
  srv_network_t *n = xcalloc(1, sizeof *n);
  n->secrets = secrets;
  n->loop = loop;
  n->cfg = cfg;
  n->script.public_internet = true;
  add_rules(&n->script, cfg->network_allow, false);
  add_rules(&n->script, cfg->network_deny, true);
  add_rules(&n->deny, cfg->network_deny, true);
  return n;
}

void srv_network_free(srv_network_t *n) {
  if (!n) return;
  eg_proxy_free(n->proxy);
  eg_policy_release(&n->script);
  eg_policy_release(&n->deny);
  srv_secrets_free(n->secrets);
  if (n->ca_bundle) unlink(n->ca_bundle);
  free(n->ca_bundle);
  free(n);
}

eg_proxy_t *srv_network_proxy(srv_network_t *n, cm_error_t *err) {
  if (n->proxy) return n->proxy;
  /* c-ares takes the resolvers as one comma-separated list. */
  cleanup_free char *servers = NULL;
  for (char *const *d = n->cfg->dns_servers; d && *d; d++) {
    char *joined = servers ? xasprintf("%s,%s", servers, *d) : xstrdup(*d);
    free(servers);
    servers = joined;
  }
  eg_proxy_config_t pc = {
      .dns_servers = servers,
      .max_connections = n->cfg->network_max_connections,
      .max_total_connections = n->cfg->network_max_total_connections,
      .rate_bytes = n->cfg->network_rate,
      .ca_file = n->cfg->egress_ca_file,
  };
  n->proxy = eg_proxy_new(n->loop, &pc, err);
  if (!n->proxy && !n->proxy_failed) {
    n->proxy_failed = true;
    cm_warn("the egress proxy cannot start: %s", cm_error_message(err));
  }
  return n->proxy;
}

#define SYSTEM_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define CA_BUNDLE_MAX (8u << 20)

const char *srv_network_ca_bundle(srv_network_t *n, const char *state_dir, cm_error_t *err) {
  if (n->ca_bundle) return n->ca_bundle;
  eg_proxy_t *p = srv_network_proxy(n, err);
  const char *pem = p ? eg_proxy_ca_pem(p, err) : NULL;
  if (!pem) return NULL;
  cleanup_free char *dir = xasprintf("%s/egress-ca", state_dir);
  if (cm_mkdir_p(dir, 0755, err) < 0) return NULL;
  cleanup_free char *system = NULL;
  size_t len = 0;
  cm_error_t e2 = CM_ERROR_INIT;
  if (cm_read_file(SYSTEM_CA_BUNDLE, CA_BUNDLE_MAX, &system, &len, &e2) < 0)
    cm_warn("the sandbox's CA bundle: %s (only the proxy's CA is in it)", cm_error_message(&e2));
  cm_error_release(&e2);
  cleanup_free char *text = xasprintf("%.*s%s%s", (int)len, system ? system : "",
                                      len && system[len - 1] != '\n' ? "\n" : "", pem);
  /* One per server process: several instances may share a state directory, each with a CA
   * of its own.  Removed when the server stops (a certificate, nothing secret, if one stays). */
  cleanup_free char *path = xasprintf("%s/ca-certificates-%d.crt", dir, (int)getpid());
  cleanup_free char *tmp = xasprintf("%s.tmp.%d", path, (int)getpid());
  if (cm_write_file(tmp, text, strlen(text), 0644, err) < 0) return NULL;
  if (rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    cm_error_set(err, e, CM_ERR_IO, "rename %s", path);
    return NULL;
  }
  n->ca_bundle = steal_pointer(&path);
  return n->ca_bundle;
}

srv_secrets_t *srv_network_secrets(srv_network_t *n) {
  return n->secrets;
}

const eg_policy_t *srv_network_script_policy(srv_network_t *n) {
  return &n->script;
}
const eg_policy_t *srv_network_deny_policy(srv_network_t *n) {
  return &n->deny;
}

bool srv_network_proxied(const srv_config_t *cfg, sbx_backend_t *backend) {
  return !cfg->network_host && sbx_backend_can_egress(backend);
}

void srv_net_call_release(srv_net_call_t *c) {
  free(c->rules);
  memset(c, 0, sizeof *c);
}

int srv_network_parse_call(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *backend,
                           json_t *arg, srv_net_call_t *out, char **error) {
  memset(out, 0, sizeof *out);
  *error = NULL;
  if (!arg || json_is_null(arg)) {
    out->on = cfg->network;
    return 0;
  }
  if (json_is_false(arg)) return 0;
  if (!json_is_true(arg) && !json_is_array(arg)) {
    *error = xstrdup(
        "'network' must be true, false, or a list of destinations (host names, *.suffix, addresses "
        "or prefixes, each with an optional :port), e.g. [\"api.github.com\", "
        "\"*.pypi.org:443\"].");
    return -1;
  }
  if (!cfg->network) {
    *error = xstrdup(
        "The network is off on this server (--network off), so a call cannot ask for it: leave "
        "'network' out or set it to false, and use no network in the script (pass data in with "
        "'files').");
    return -1;
  }
  if (json_is_true(arg)) {
    out->on = true;
    return 0;
  }
  size_t count = json_array_size(arg);
  if (count == 0) return 0; /* no destination at all: the cheapest way, no network */
  if (count > SRV_NET_MAX_CALL_RULES) {
    *error = xasprintf("'network' lists %zu destinations; at most %d are accepted.", count,
                       SRV_NET_MAX_CALL_RULES);
    return -1;
  }
  if (cfg->network_host) {
    *error = xstrdup(
        "This server gives scripts the host's own network (--network host) and has no egress "
        "policy, so a list of destinations cannot be enforced: pass true or false.");
    return -1;
  }
  if (!srv_network_proxied(cfg, backend)) {
    /* A list asks for less than the network: running without enforcing it would give more. */
    *error = xasprintf(
        "The %s backend does not send runs through the server's egress proxy, so a list of "
        "destinations cannot be enforced: pass true or false.",
        sbx_backend_name(backend));
    return -1;
  }
  out->rules = xcalloc(count, sizeof *out->rules);
  for (size_t i = 0; i < count; i++) {
    json_t *e = json_array_get(arg, i);
    if (!json_is_string(e)) {
      *error = xasprintf("'network' entry %zu is not a string.", i + 1);
      srv_net_call_release(out);
      return -1;
    }
    cm_error_t err = CM_ERROR_INIT;
    if (eg_rule_parse(json_string_value(e), json_string_length(e), &out->rules[i], &err) < 0) {
      *error = xasprintf("'network' entry %zu: %s.", i + 1, cm_error_message(&err));
      cm_error_release(&err);
      srv_net_call_release(out);
      return -1;
    }
    char why[EG_REASON_MAX];
    if (!eg_policy_narrowing_ok(&n->script, &out->rules[i], why, sizeof why)) {
      *error = xasprintf(
          "'network' entry '%s' is refused: %s. A call can only narrow what the server allows; "
          "ask the operator for a --network-allow rule.",
          out->rules[i].text, why);
      srv_net_call_release(out);
      return -1;
    }
  }
  out->n_rules = count;
  out->on = true;
  return 0;
}

void srv_network_env(srv_network_t *n, cm_strv_builder_t *env, bool build) {
  eg_proxy_env(env);
  /* A script's own servers on its own loopback stay direct, unless the operator opened a
   * loopback address of the host: then such URLs mean the host's, through the proxy. */
  bool host_loopback = false;
  for (size_t i = 0; i < n->script.n_allow; i++) {
    const eg_rule_t *r = &n->script.allow[i];
    const char *cls = r->kind == EG_RULE_NET ? eg_addr_class(&r->addr) : NULL;
    host_loopback |= (cls && !strcmp(cls, "loopback")) ||
                     (r->kind == EG_RULE_HOST && !strcmp(r->host, "localhost"));
  }
  if (!build && !host_loopback) {
    cm_strv_add(env, "NO_PROXY=localhost,127.0.0.1,::1");
    cm_strv_add(env, "no_proxy=localhost,127.0.0.1,::1");
  }
}

/* What policy a run had. */
static const char *policy_name(const srv_config_t *cfg, sbx_backend_t *b,
                               const srv_net_call_t *call) {
  if (!call->on) return "off";
  if (cfg->network_host) return "host";
  if (!sbx_backend_can_egress(b)) return "unfiltered";
  return call->rules ? "rules" : "on";
}

json_t *srv_network_result(const srv_config_t *cfg, sbx_backend_t *backend,
                           const srv_net_call_t *call, const eg_session_t *session) {
  eg_stats_t st;
  memset(&st, 0, sizeof st);
  if (session) eg_session_stats(session, &st);
  json_t *denied = json_array();
  for (size_t i = 0; i < st.n_denied; i++)
    json_array_append_new(denied, json_pack("{s:s, s:i, s:s}", "host", st.denied[i].host, "port",
                                            (int)st.denied[i].port, "reason", st.denied[i].reason));
  json_t *o =
      json_pack("{s:s, s:b, s:I, s:I, s:I, s:o, s:I}", "policy", policy_name(cfg, backend, call),
                "proxied", session != NULL, "connections", (json_int_t)st.connections, "bytes_in",
                (json_int_t)st.bytes_in, "bytes_out", (json_int_t)st.bytes_out, "denied", denied,
                "denied_more", (json_int_t)st.denied_more);
  if (!o) return json_object(); /* only invalid UTF-8 could fail, and names are ASCII */
  if (call->rules) {
    json_t *rules = json_array();
    for (size_t i = 0; i < call->n_rules; i++)
      json_array_append_new(rules, json_string(call->rules[i].text));
    json_object_set_new(o, "allow", rules);
  }
  return o;
}

void srv_network_text(const srv_config_t *cfg, sbx_backend_t *backend, const srv_net_call_t *call,
                      const eg_session_t *session, cm_buf_t *t) {
  if (call->on && !cfg->network_host && !sbx_backend_can_egress(backend) &&
      sbx_backend_maps_paths(backend))
    cm_buf_printf(t,
                  "\n--- note: the %s backend does not send runs through the server's egress "
                  "policy yet: this "
                  "run had the engine's own network (not filtered by --network rules) ---",
                  sbx_backend_name(backend));
  if (!session) return;
  eg_stats_t st;
  eg_session_stats(session, &st);
  if (st.n_denied == 0) return;
  uint64_t total = st.n_denied + st.denied_more;
  cm_buf_printf(t, "\n--- network: denied %llu destination%s: ", (unsigned long long)total,
                total == 1 ? "" : "s");
  size_t shown = CM_MIN(st.n_denied, (size_t)5);
  for (size_t i = 0; i < shown; i++) {
    bool v6 = strchr(st.denied[i].host, ':') != NULL;
    cm_buf_printf(t, "%s%s%s%s:%u (%s)", i ? ", " : "", v6 ? "[" : "", st.denied[i].host,
                  v6 ? "]" : "", (unsigned)st.denied[i].port, st.denied[i].reason);
  }
  if (total > shown) cm_buf_printf(t, " and %llu more", (unsigned long long)(total - shown));
  cm_buf_appends(
      t, call->rules
             ? " (not in this call's list, or not allowed by the server; ask the operator for a "
               "--network-allow rule) ---"
             : " (ask the operator for a --network-allow rule) ---");
}

json_t *srv_network_output_schema(void) {
  json_t *denied_item =
      json_pack("{s:s, s:{s:{s:s}, s:{s:s}, s:{s:s}}}", "type", "object", "properties", "host",
                "type", "string", "port", "type", "integer", "reason", "type", "string");
  return json_pack(
      "{s:s, s:s, s:{s:{s:s, s:[s, s, s, s, s]}, s:{s:s}, s:{s:s, s:{s:s}}, s:{s:s}, s:{s:s}, "
      "s:{s:s}, "
      "s:{s:s, s:o}, s:{s:s}}}",
      "type", "object", "description",
      "The run's network: its policy (off; on: the public internet through the server's egress "
      "proxy; rules: only "
      "the call's list; host: the host's own network, not filtered; unfiltered: a backend that "
      "cannot apply the "
      "policy), the connections and bytes through the proxy, and the destinations it refused (at "
      "most 20; "
      "denied_more counts the rest).",
      "properties", "policy", "type", "string", "enum", "off", "on", "rules", "host", "unfiltered",
      "proxied", "type", "boolean", "allow", "type", "array", "items", "type", "string",
      "connections", "type", "integer", "bytes_in", "type", "integer", "bytes_out", "type",
      "integer", "denied", "type", "array", "items", denied_item, "denied_more", "type", "integer");
}

void srv_network_describe(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *b, cm_buf_t *t,
                          json_t **obj) {
  const char *mode = !cfg->network ? "off" : cfg->network_host ? "host" : "on";
  bool proxied = srv_network_proxied(cfg, b);
  if (!cfg->network) {
    cm_buf_appends(t,
                   "Network policy: off: scripts run in a network namespace of their own with "
                   "nothing in it but "
                   "loopback; a call cannot turn it on\n");
  } else if (cfg->network_host) {
    cm_buf_appends(
        t,
        "Network policy: host (unsafe): scripts share the host's network namespace with no policy: "
        "they reach the host's loopback services, its abstract unix sockets, its LAN, cloud "
        "metadata "
        "and this server's own port, and can listen on its interfaces\n");
  } else if (!proxied && sbx_backend_maps_paths(b)) {
    cm_buf_printf(
        t,
        "Network policy: on, but the %s backend does not route runs through the egress proxy yet: "
        "scripts get the engine's own network, not filtered by the rules below\n",
        sbx_backend_name(b));
  } else if (!proxied) {
    cm_buf_printf(t,
                  "Network policy: on, not enforced: the %s backend cannot isolate the network "
                  "(scripts use the "
                  "host's network directly)\n",
                  sbx_backend_name(b));
  } else {
    cm_buf_printf(
        t,
        "Network policy: on: each script has a network namespace of its own; its only way out is "
        "the "
        "server's egress proxy (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY=http://127.0.0.1:%d inside the "
        "sandbox: HTTP CONNECT, plain HTTP, SOCKS5), which reaches the public internet and refuses "
        "every range IANA's special-purpose registries mark not globally reachable (loopback, "
        "private (RFC 1918), CGNAT, link-local, ULA, documentation, benchmarking, multicast, "
        "reserved, ...), cloud metadata and this server's own addresses (what the kernel routes "
        "locally, asked of it for each address: every interface address, IPv6, AnyIP routes; and "
        "a connection that arrives back at this host), judged on every resolved address, "
        "unless a rule names them; a call may narrow it with network: [rules], which binds a "
        "prestarted sandbox too (a held sandbox has no egress at all until its call starts); "
        "the sandbox resolves no names itself (a hosts file and a resolv.conf of its own, "
        "nothing of the host's): the proxy resolves them, as written (no search domains)\n",
        EG_SANDBOX_PORT);
  }
  cleanup_free char *allow = NULL, *deny = NULL;
  for (size_t i = 0; i < n->script.n_allow; i++) {
    char *s = allow ? xasprintf("%s, %s", allow, n->script.allow[i].text)
                    : xstrdup(n->script.allow[i].text);
    free(allow);
    allow = s;
  }
  for (size_t i = 0; i < n->deny.n_deny; i++) {
    char *s =
        deny ? xasprintf("%s, %s", deny, n->deny.deny[i].text) : xstrdup(n->deny.deny[i].text);
    free(deny);
    deny = s;
  }
  cm_buf_printf(
      t,
      "Network rules: allow %s; deny %s (deny wins; a host rule opens what that name "
      "resolves to, a *.suffix rule only public addresses, an address rule a denied range "
      "only when it lies within it: 0.0.0.0/0 or 64:ff9b::/96 never open loopback or "
      "metadata, and only a rule of that one address opens one of this server's own; a denied "
      "name also denies the addresses it resolves to at connect time (by any other name or "
      "literal), a denied *.suffix names only, a denied address or prefix its destinations by "
      "any name)\n",
      allow ? allow : "none", deny ? deny : "none");
  cleanup_free char *proxy_desc = n->proxy ? eg_proxy_describe(n->proxy) : NULL;
  if (proxied || !cfg->offline)
    cm_buf_printf(t, "Egress proxy: %s\n",
                  proxy_desc         ? proxy_desc
                  : cfg->dns_servers ? "not started yet (resolver from --dns-server)"
                                     : "not started yet (resolver from the host's resolv.conf)");
  json_t *rules_allow = json_array(), *rules_deny = json_array();
  for (size_t i = 0; i < n->script.n_allow; i++)
    json_array_append_new(rules_allow, json_string(n->script.allow[i].text));
  for (size_t i = 0; i < n->deny.n_deny; i++)
    json_array_append_new(rules_deny, json_string(n->deny.deny[i].text));
  *obj = json_pack("{s:s, s:b, s:o, s:o, s:i}", "mode", mode, "proxied", cfg->network && proxied,
                   "allow", rules_allow, "deny", rules_deny, "forwarder_port", EG_SANDBOX_PORT);
}
