/* server/net/: the network of runs and builds: the server's policy (--network,
 * --network-allow/-deny), a call's own list of rules, the egress proxy they go through
 * (egress/egress.h), and how a result reports it.  The glue between the server and egress/.
 *
 * Files: network.c.
 *
 * May use: server/config/, egress/, sandbox/ (a backend's kind), common/. */
#ifndef MPS_SERVER_NET_NET_H
#define MPS_SERVER_NET_NET_H

#include <jansson.h>

#include "egress/egress.h"
#include "sandbox/sbx.h"
#include "server/config/config.h"

typedef struct srv_network srv_network_t;
typedef struct srv_net_call srv_net_call_t;

/* The secrets' values (--secret, [secrets.NAME]): read at start (a missing, unreadable or
 * world-readable file is an error), again on SIGHUP (srv_network_reload_secrets), held in
 * memory kept out of core dumps.  Only the egress proxy ever reads them. */
typedef struct srv_secrets srv_secrets_t;
srv_secrets_t *srv_secrets_load(const srv_config_t *cfg, cm_error_t *err);
void srv_secrets_free(srv_secrets_t *s);

/* Takes secrets (may be NULL when the server has none). */
srv_network_t *srv_network_new(cm_loop_t *loop, const srv_config_t *cfg, srv_secrets_t *secrets);
srv_secrets_t *srv_network_secrets(srv_network_t *n);
/* SIGHUP: every secret's file read again; a file that fails keeps its old value (logged). */
void srv_network_reload_secrets(srv_network_t *n);

/* A call's `secrets` argument: the names it asked for, each with its placeholder. */
typedef struct srv_secret_call {
  size_t n;
  size_t index[SRV_SECRETS_MAX]; /* into cfg->secrets */
  char placeholder[SRV_SECRETS_MAX][EG_SECRET_PLACEHOLDER_MAX];
} srv_secret_call_t;

/* 0, or -1 with a tool error's message in *error (heap): not a list of names, an unknown name or
 * one principal may not use (the same message: a foreign secret is not shown to exist), with
 * the network off for the call, or where runs do not go through the proxy. */
int srv_secrets_parse_call(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *backend,
                           const char *principal, const srv_net_call_t *net, json_t *arg,
                           srv_secret_call_t *out, char **error);
/* The variables the sandbox gets for the call's secrets: NAME=placeholder each. */
void srv_secrets_env(const srv_config_t *cfg, const srv_secret_call_t *call,
                     cm_strv_builder_t *env);
/* The CA bundle of calls with secrets: the host's system bundle plus the egress proxy's CA,
 * written (once per server process, removed when it stops) as
 * state_dir/egress-ca/ca-certificates-<pid>.crt; its path, or NULL and err. */
const char *srv_network_ca_bundle(srv_network_t *n, const char *state_dir, cm_error_t *err);
/* Where a sandbox finds it, and the variables that name it (SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
 * CURL_CA_BUNDLE, PIP_CERT, NODE_EXTRA_CA_CERTS). */
#define SRV_SANDBOX_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
void srv_secrets_ca_env(cm_strv_builder_t *env);
/* Gives a run's egress session the call's secrets. */
void srv_secrets_bind(srv_network_t *n, const srv_config_t *cfg, const srv_secret_call_t *call,
                      eg_session_t *session);
/* The names of the call's secrets that were substituted (a JSON array of strings). */
json_t *srv_secrets_used(const srv_config_t *cfg, const srv_secret_call_t *call,
                         const eg_session_t *session);
/* The result's lines about the call's secrets: one whose hosts the call's own network list
 * does not name (no substitution can happen), and requests refused for carrying a placeholder
 * where it may not go. */
void srv_secrets_text(const srv_config_t *cfg, const srv_secret_call_t *call,
                      const srv_net_call_t *net, const eg_session_t *session, cm_buf_t *t);
/* check_environment: the secrets principal may use, with their hosts ([{name, hosts}]), and
 * their lines of text. */
json_t *srv_secrets_describe(const srv_config_t *cfg, const char *principal, cm_buf_t *t);
void srv_network_free(srv_network_t *n);

/* The proxy, created at the first use; NULL (and err) when its resolver cannot be set up. */
eg_proxy_t *srv_network_proxy(srv_network_t *n, cm_error_t *err);
/* What scripts may reach with the network on: the public internet, the allow rules, minus
 * the deny rules. */
const eg_policy_t *srv_network_script_policy(srv_network_t *n);
/* The deny rules alone (builds have their own allow rules). */
const eg_policy_t *srv_network_deny_policy(srv_network_t *n);

/* Whether runs of this backend reach the network through the proxy (the server's policy
 * applies), rather than not at all or through the host's own namespace. */
bool srv_network_proxied(const srv_config_t *cfg, sbx_backend_t *backend);

/* A call's `network` argument: false, true, null (the server's default) or a list of rules. */
struct srv_net_call {
  bool on;          /* the call uses the network */
  eg_rule_t *rules; /* its own list (only these destinations), or NULL */
  size_t n_rules;
};

#define SRV_NET_MAX_CALL_RULES 64

/* 0, or -1 with a message for a tool error in *error (heap): a malformed entry, or one the
 * server's policy denies entirely (named), any network on a --network off server, or a list
 * where runs do not go through the proxy (--network host, a backend that cannot). */
int srv_network_parse_call(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *backend,
                           json_t *arg, srv_net_call_t *out, char **error);
void srv_net_call_release(srv_net_call_t *c);

/* The variables that point a sandbox's clients at its forwarder (HTTP(S)_PROXY, ALL_PROXY,
 * lower-case forms; for scripts also NO_PROXY for their own loopback, unless an allow rule
 * opens a loopback address of the host; builds send even loopback index URLs through it). */
void srv_network_env(srv_network_t *n, cm_strv_builder_t *env, bool build);

/* A run's `network` object for structuredContent and its text lines (a denial line, and a
 * note when the backend could not apply the policy).  session may be NULL (not proxied). */
json_t *srv_network_result(const srv_config_t *cfg, sbx_backend_t *backend,
                           const srv_net_call_t *call, const eg_session_t *session);
void srv_network_text(const srv_config_t *cfg, sbx_backend_t *backend, const srv_net_call_t *call,
                      const eg_session_t *session, cm_buf_t *t);
/* The JSON schema of that object. */
json_t *srv_network_output_schema(void);
/* check_environment's lines about the network (text) and its object. */
void srv_network_describe(srv_network_t *n, const srv_config_t *cfg, sbx_backend_t *backend,
                          cm_buf_t *t, json_t **obj);

#endif
