/* server/config/: what the server is (its name and version) and how it is configured: the
 * flags, each also settable as MCP_PY_SANDBOX_<FLAG> in the environment or in a profile
 * (profiles/NAME.toml), with the seed's names, defaults and validation messages.
 *
 * May use: pystd/ (the TOML of profiles), egress/ (the syntax of network rules), common/. */
#ifndef MPS_SERVER_CONFIG_CONFIG_H
#define MPS_SERVER_CONFIG_CONFIG_H

#include "common/cm.h"

#define SRV_NAME "mcp-python-exec-sandbox"

const char *srv_version(void);

/* --prestart on: held sandboxes (and interpreters) kept per shape.  A burst on a 2-core
 * machine starts two calls at once (--max-starting) and a prestarted interpreter's call ends
 * in a few milliseconds, so four cover a burst while their replacements start. */
#define SRV_PRESTART_DEFAULT 4
#define SRV_PRESTART_MAX 64
/* --prestart-max: how far a shape's pool grows under bursts (a held interpreter is about 4 MiB
 * of memory: 128 of them half a GiB, and only after a burst of 128 calls), and its cap. */
#define SRV_PRESTART_BURST_DEFAULT 128
#define SRV_PRESTART_BURST_MAX 1024
/* A secret (--secret NAME=PATH@HOST[,HOST...], or a profile's [secrets.NAME] table): where its
 * value is read from and where it may go.  Its value is never in the configuration. */
typedef struct srv_secret_spec {
  char *name;        /* [A-Z][A-Z0-9_]{0,63} */
  char *file;        /* the file holding the value (a profile's relative path made absolute) */
  char **hosts;      /* egress rules: a name, *.suffix, name:port (443 when none) */
  char **principals; /* token names that may use it; NULL: every principal */
} srv_secret_spec_t;

#define SRV_SECRETS_MAX 32

typedef struct srv_config {
  /* Seed flags (same names, defaults and validation messages). */
  char *python_version;      /* --python-version; NULL = the default interpreter */
  char *sandbox_backend;     /* --sandbox-backend native|bwrap|docker|none */
  uint64_t max_timeout;      /* --max-timeout, seconds */
  uint64_t default_timeout;  /* --default-timeout, seconds */
  uint64_t max_output_bytes; /* --max-output-bytes, per stream */
  bool warm_cache;           /* --warm-cache / --no-warm-cache */
  char *uv_path;             /* --uv-path */
  /* Ours. */
  char *python;       /* --python PATH: explicit default interpreter */
  char **python_dirs; /* --python-dir DIR (repeatable; a value may hold several, ':'-separated) */
  bool allow_python_downloads; /* --allow-python-downloads: uv installs a missing version */
  /* Dependencies. */
  char *installer;                    /* --installer auto|uv|pip */
  char *index_url;                    /* --index-url */
  char **extra_index_urls;            /* --extra-index-url (repeatable) */
  char **find_links;                  /* --find-links (repeatable; a path may hold spaces) */
  bool offline;                       /* --offline */
  bool show_version;                  /* --version was given: main prints it */
  uint64_t max_cache_bytes;           /* --max-cache-bytes */
  uint64_t max_cache_bytes_per_token; /* --max-cache-bytes-per-token: per principal; 0 = none */
  uint64_t env_max_age_ms;   /* --env-max-age-days: unpinned sets are re-resolved after this */
  uint64_t build_timeout_ms; /* --build-timeout */
  uint64_t
      max_build_bytes;  /* --max-build-bytes: all one build (or warm-up, resolution) may write */
  char *state_dir;      /* --state-dir */
  char *transport;      /* --transport stdio|http */
  bool network;         /* --network on|host: scripts may use the network (off: false) */
  bool network_host;    /* --network host: the host's namespace, no proxy (unsafe) */
  char **network_allow; /* --network-allow RULE (repeatable) */
  char **network_deny;  /* --network-deny RULE (repeatable) */
  char **build_network_allow; /* --build-network-allow RULE (repeatable) */
  srv_secret_spec_t *secrets; /* --secret (repeatable) and [secrets.NAME] */
  size_t n_secrets;
  char *egress_ca_file; /* --egress-ca-file PEM: more trust for the proxy's upstream TLS */
  char **dns_servers;   /* --dns-server ADDR[:PORT] (repeatable) */
  uint64_t network_max_connections;       /* --network-max-connections: per run at once */
  uint64_t network_max_total_connections; /* --network-max-total-connections: per run */
  uint64_t network_rate;                  /* --network-rate: bytes per second per run; 0 = no cap */
  uint64_t kill_grace_ms;                 /* --kill-grace-seconds */
  uint64_t memory_bytes;                  /* --memory-limit */
  uint64_t cpu_seconds;                   /* --cpu-limit */
  uint64_t max_processes;                 /* --max-processes */
  uint64_t cpu_millis;                    /* --cpus, in thousandths of a CPU; 0 = no cap */
  char *cgroup;                           /* --cgroup auto|off|DIR */
  bool prestart;            /* --prestart on|off|N: keep sandboxes ready for the next calls */
  uint64_t prestart_count;  /* ... this many per shape (on: SRV_PRESTART_DEFAULT; off: 0) */
  uint64_t prestart_max;    /* --prestart-max: up to this many per shape under bursts */
  uint64_t file_size_bytes; /* --max-file-size */
  uint64_t open_files;      /* --max-open-files */
  uint64_t tmp_bytes;       /* --tmp-size */
  uint64_t work_bytes;      /* --work-size: a run's work directory (a tmpfs when root); 0 = a plain
                               directory */
  uint64_t max_message_bytes; /* --max-message-bytes */
  uint64_t max_script_bytes;  /* --max-script-bytes */
  uint64_t max_concurrent;    /* --max-concurrent: executions at once; more wait */
  uint64_t max_starting; /* --max-starting: executions in their start-up at once; 0 = one per CPU */
  uint64_t max_session_concurrent; /* --max-session-concurrent: per session, more are refused; 0 =
                                      none */
  uint64_t max_token_concurrent;   /* --max-token-concurrent: per principal (running or waiting),
                                      likewise */
  uint64_t
      max_token_running; /* --max-token-running: per principal, holding a slot; the rest wait */
  /* Files in and out of a run (server/files/). */
  uint64_t max_input_files;          /* --max-input-files: entries of the files argument */
  uint64_t max_input_file_bytes;     /* --max-input-file-bytes: one input file, decoded */
  uint64_t max_input_bytes;          /* --max-input-bytes: all input files of a call */
  uint64_t max_output_files;         /* --max-output-files: entries collected from outputs/ */
  uint64_t max_artifact_bytes;       /* --max-artifact-bytes: output bytes kept per run */
  uint64_t max_artifact_store_bytes; /* --max-artifact-store-bytes: kept for all runs */
  uint64_t
      max_artifact_bytes_per_token;   /* --max-artifact-bytes-per-token: per principal; 0 = none */
  uint64_t max_inline_bytes;          /* --max-inline-bytes: largest image returned inline */
  uint64_t max_inline_text_bytes;     /* --max-inline-text-bytes: largest text embedded */
  uint64_t artifact_ttl_ms;           /* --artifact-ttl: how long outputs stay readable */
  uint64_t max_task_ttl_ms;           /* --max-task-ttl: a task's longest life (and the default) */
  uint64_t max_tasks_per_principal;   /* --max-tasks-per-principal: tasks kept; 0 = no limit */
  uint64_t max_listens_per_principal; /* --max-listens-per-principal: listen streams */
  uint64_t max_listens_local; /* --max-listens-local: the same, for the local/stdio principal */
  uint64_t max_task_result_bytes_per_principal; /* finished tasks' results kept, one principal */
  uint64_t max_task_result_bytes;               /* ... and in all */
  cm_log_level_t log_level;                     /* --log-level */
  char *audit_log;                              /* --audit-log FILE or "-" (stderr), or NULL */
  uint64_t drain_seconds;       /* --drain-seconds: SIGTERM lets running calls finish */
  bool health_auth;             /* --health-auth: the probes need a token */
  uint64_t audit_log_max_bytes; /* --audit-log-max-bytes: rotate past it; 0 = never */
  uint64_t audit_log_keep;      /* --audit-log-keep: rotated files kept */
  char *profile;                /* --profile: the sandbox profile it started from */
  /* Streamable HTTP (--transport http). */
  char *host;                           /* --host (127.0.0.1) */
  uint64_t port;                        /* --port (8765) */
  char *path;                           /* --path (/mcp) */
  char *allowed_hosts;                  /* --allowed-hosts: comma-separated extra Host names */
  char *allowed_origins;                /* --allowed-origins: comma-separated extra Origins */
  char **trusted_proxies;               /* --trusted-proxy: reverse proxies believed */
  char **metrics_tokens;                /* --metrics-token: principals that may read /metrics */
  char *trusted_proxy_header;           /* --trusted-proxy-header */
  char *auth_token_file;                /* --auth-token-file */
  bool allow_insecure_remote;           /* --allow-insecure-remote: non-loopback without tokens */
  char *tls_cert;                       /* --tls-cert */
  char *tls_key;                        /* --tls-key */
  bool tls_self_signed;                 /* --tls-self-signed */
  char **tls_san;                       /* --tls-san: extra names/addresses of that certificate */
  uint64_t exec_session_idle_ms;        /* --exec-session-idle-seconds: execute_python sessions */
  uint64_t exec_session_max_ms;         /* --exec-session-max-seconds: a session's longest life */
  uint64_t max_exec_sessions;           /* --max-exec-sessions: in all; 0 = sessions are off */
  uint64_t max_exec_sessions_per_token; /* --max-exec-sessions-per-token: per principal */
  uint64_t max_sessions;                /* --max-sessions */
  uint64_t session_idle_ms;             /* --session-idle-seconds */
  uint64_t stall_ms;                    /* --stall-seconds */
  uint64_t max_connections;             /* --max-connections */
  uint64_t max_sessions_per_token;      /* --max-sessions-per-token: per principal; 0 = none */
  uint64_t
      max_streams_per_token; /* --max-streams-per-token: open GET streams per principal; 0 = none */
  uint64_t max_replay_bytes_per_session; /* --max-replay-bytes-per-session */
  uint64_t max_replay_bytes;           /* --max-replay-bytes: events kept for resumption, in all */
  uint64_t max_unread_bytes_per_token; /* --max-unread-bytes-per-token (HTTP) */
  char *loopback_origins;              /* --loopback-origins auto|on|off */
  char *route; /* --route: this replica's name in a fleet, the prefix of every id it hands out */
  bool allow_none_with_tokens; /* --allow-none-with-tokens: backend none for several principals */
} srv_config_t;

void srv_config_defaults(srv_config_t *c);
/* Parses argv (and MCP_PY_SANDBOX_<FLAG> environment variables, which argv overrides).
 * Returns 0, 1 when --help/--version was handled (exit 0), or -1 with err set. */
int srv_config_parse(srv_config_t *c, int argc, char **argv, cm_error_t *err);
/* The seed's validation, with its messages. */
int srv_config_validate(const srv_config_t *c, cm_error_t *err);
/* Applies a profile's TOML text (a table of flag names and values; `path` names it in
 * errors) to c, as --profile does after reading the file.  Errors: CM_ERR_INVALID or
 * CM_ERR_LIMIT (the TOML limits), naming the line. */
int srv_config_apply_profile(srv_config_t *c, const char *text, size_t len, const char *path,
                             cm_error_t *err);
void srv_config_release(srv_config_t *c);
void srv_secret_spec_release(srv_secret_spec_t *s);

/* The longest --route: letters a-z and digits, 1 to SRV_ROUTE_MAX. */
#define SRV_ROUTE_MAX 16
/* An id this server hands out (a task, a Python session, a run): "<route>.<rest>" with
 * --route, rest alone without.  Returns a new string. */
char *srv_route_id(const srv_config_t *c, const char *rest);
/* Why an id this server does not know is unknown, for the error a client reads: "it belongs
 * to replica X, which this request did not reach ..." when id carries another route,
 * "it no longer exists ..." otherwise.  `what` names the kind ("task", "session", "run").
 * Returns a new string. */
char *srv_route_unknown(const srv_config_t *c, const char *what, const char *id);
/* Whether id carries a route other than this server's (another replica minted it). */
bool srv_route_foreign(const srv_config_t *c, const char *id);
/* A file of profiles/ ($MPS_PROFILES_DIR, the installed share directory relative to the binary,
 * beside the binary, or the source tree), or NULL. */
char *srv_find_profile_file(const char *file);

#endif
