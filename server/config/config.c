/* Command-line flags, each also settable as MCP_PY_SANDBOX_<FLAG> in the environment
 * (the flag wins).  The seed's flags keep their names, defaults and messages. */
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>

#include "egress/egress.h"
#include "server/config/config.h"
#include "pystd/pystd.h"

/* OPT_LIST: a repeatable flag, one value (without spaces) per use, kept as a string vector;
 * OPT_PATHS: the same, any non-empty value (paths may hold spaces); OPT_PATH_LIST: the same,
 * each value split at ':'. */
typedef enum opt_kind {
  OPT_LIST,
  OPT_PATHS,
  OPT_DAYS_MS,
  OPT_PATH_LIST,
  OPT_STRING,
  OPT_INT,
  OPT_SIZE,
  OPT_BOOL_ON,
  OPT_BOOL_OFF,
  OPT_ONOFF,
  OPT_PRESTART,
  OPT_SECONDS_MS,
  OPT_LOGLEVEL,
  OPT_CPUS,
  OPT_NETWORK,
  OPT_SECRET,
  OPT_HELP,
  OPT_VERSION
} opt_kind_t;

/* One row per flag: the only place a default is written.  srv_config_defaults applies each
 * `def` as if it were given on the command line, and --help prints the same text, so the
 * two cannot disagree. */
typedef struct opt_def {
  const char *name; /* without the leading "--" */
  opt_kind_t kind;
  size_t offset;
  const char *metavar;
  const char *def; /* the default, in the flag's own syntax; NULL: unset (zero, false, none) */
  const char *help;
} opt_def_t;

#define OFF(field) offsetof(srv_config_t, field)

static const opt_def_t options[] = {
    {"python-version", OPT_STRING, OFF(python_version), "VERSION", NULL,
     "default Python version for calls that do not choose one (e.g. 3.12)"},
    {"python", OPT_STRING, OFF(python), "PATH", NULL, "default Python interpreter (an executable)"},
    {"allow-python-downloads", OPT_BOOL_ON, OFF(allow_python_downloads), NULL, NULL,
     "let uv install a Python version that a call asks for and the machine lacks"},
    {"python-dir", OPT_PATH_LIST, OFF(python_dirs), "DIR", NULL,
     "also look for interpreters in DIR (repeatable; DIR, DIR/bin and DIR/<name>/bin)"},
    {"sandbox-backend", OPT_STRING, OFF(sandbox_backend), "{native,docker,podman,none}", "native",
     "sandbox backend: native (bubblewrap), docker, podman, or none (no isolation)"},
    {"max-timeout", OPT_INT, OFF(max_timeout), "SECONDS", "300",
     "largest timeout a call may ask for"},
    {"default-timeout", OPT_INT, OFF(default_timeout), "SECONDS", "30",
     "timeout of calls that give none"},
    {"max-output-bytes", OPT_INT, OFF(max_output_bytes), "BYTES", "102400",
     "output kept per stream in a result"},
    {"warm-cache", OPT_BOOL_ON, OFF(warm_cache), NULL, "true",
     "warm the package cache after start-up"},
    {"no-warm-cache", OPT_BOOL_OFF, OFF(warm_cache), NULL, NULL, "do not warm the package cache"},
    {"uv-path", OPT_STRING, OFF(uv_path), "PATH", "uv", "the uv executable"},
    {"installer", OPT_STRING, OFF(installer), "{auto,uv,pip}", "auto",
     "what installs dependencies: uv when found, else pip"},
    {"index-url", OPT_STRING, OFF(index_url), "URL", NULL,
     "package index for dependencies (the installer's default)"},
    {"extra-index-url", OPT_LIST, OFF(extra_index_urls), "URL", NULL,
     "an extra package index (repeatable)"},
    {"find-links", OPT_PATHS, OFF(find_links), "DIR|URL", NULL,
     "a local wheel directory or page of links (repeatable)"},
    {"offline", OPT_BOOL_ON, OFF(offline), NULL, NULL,
     "never reach an index: install only from --find-links and the cache"},
    {"max-cache-bytes", OPT_SIZE, OFF(max_cache_bytes), "SIZE", "10G",
     "environments kept, least recently used evicted beyond"},
    {"max-cache-bytes-per-token", OPT_SIZE, OFF(max_cache_bytes_per_token), "SIZE", "0",
     "environments kept of one principal's builds; its own least recently used go first; 0 = no "
     "limit"},
    {"env-max-age-days", OPT_DAYS_MS, OFF(env_max_age_ms), "DAYS", "7",
     "re-resolve environments with unpinned requirements after"},
    {"build-timeout", OPT_SECONDS_MS, OFF(build_timeout_ms), "SECONDS", "900",
     "limit for building one environment"},
    {"max-build-bytes", OPT_SIZE, OFF(max_build_bytes), "SIZE", "4G",
     "all one environment build may write: environment, downloads, caches, temporary files"},
    {"state-dir", OPT_STRING, OFF(state_dir), "DIR", NULL,
     "state directory (default $XDG_CACHE_HOME/mcp-python-exec-sandbox)"},
    {"transport", OPT_STRING, OFF(transport), "{stdio,http}", "stdio",
     "transport: stdio, or Streamable HTTP"},
    {"host", OPT_STRING, OFF(host), "ADDRESS", "127.0.0.1", "HTTP: address to listen on"},
    {"port", OPT_INT, OFF(port), "PORT", "8765", "HTTP: port to listen on"},
    {"path", OPT_STRING, OFF(path), "PATH", "/mcp", "HTTP: the MCP endpoint's path"},
    {"allowed-hosts", OPT_STRING, OFF(allowed_hosts), "NAMES", NULL,
     "HTTP: extra Host header names to accept (comma-separated)"},
    {"allowed-origins", OPT_STRING, OFF(allowed_origins), "ORIGINS", NULL,
     "HTTP: extra Origins to accept (comma-separated)"},
    {"trusted-proxy", OPT_LIST, OFF(trusted_proxies), "CIDR", NULL,
     "HTTP: a reverse proxy (address or ADDRESS/PREFIX, comma-separated) whose header names the "
     "client: the first untrusted address from the right is the client (repeatable)"},
    {"trusted-proxy-header", OPT_STRING, OFF(trusted_proxy_header), "{x-forwarded-for,forwarded}",
     "x-forwarded-for",
     "HTTP: the header the trusted proxies write (X-Forwarded-For, or RFC 7239 Forwarded); the "
     "other is never read"},
    {"auth-token-file", OPT_STRING, OFF(auth_token_file), "FILE", NULL,
     "HTTP: bearer tokens, one per line ([name:]token)"},
    {"allow-insecure-remote", OPT_BOOL_ON, OFF(allow_insecure_remote), NULL, NULL,
     "HTTP: allow a non-loopback address without tokens"},
    {"tls-cert", OPT_STRING, OFF(tls_cert), "FILE", NULL, "HTTP: TLS certificate (PEM)"},
    {"tls-key", OPT_STRING, OFF(tls_key), "FILE", NULL, "HTTP: TLS private key (PEM)"},
    {"tls-self-signed", OPT_BOOL_ON, OFF(tls_self_signed), NULL, NULL,
     "HTTP: serve TLS with a self-signed certificate kept in the state directory, for localhost, "
     "the host's name (and FQDN) and its addresses (every interface's with a wildcard --host, "
     "else --host) and --tls-san; made again when it lacks one of them"},
    {"tls-san", OPT_LIST, OFF(tls_san), "NAME|IP", NULL,
     "HTTP: one more DNS name or IP address in --tls-self-signed's certificate (repeatable)"},
    {"exec-session-idle-seconds", OPT_SECONDS_MS, OFF(exec_session_idle_ms), "SECONDS", "1800",
     "execute_python sessions (session: \"new\"): closed after this long without a call"},
    {"exec-session-max-seconds", OPT_SECONDS_MS, OFF(exec_session_max_ms), "SECONDS", "28800",
     "execute_python sessions: closed this long after they started, however busy"},
    {"max-exec-sessions", OPT_INT, OFF(max_exec_sessions), "N", "16",
     "execute_python sessions at once, of all principals; 0 = sessions are off"},
    {"max-exec-sessions-per-token", OPT_INT, OFF(max_exec_sessions_per_token), "N", "4",
     "execute_python sessions one principal may keep (its oldest idle one is closed to make "
     "room)"},
    {"max-sessions", OPT_INT, OFF(max_sessions), "N", "256", "HTTP: sessions at once"},
    {"session-idle-seconds", OPT_SECONDS_MS, OFF(session_idle_ms), "SECONDS", "1800",
     "HTTP: idle session expiry"},
    {"max-connections", OPT_INT, OFF(max_connections), "N", "512", "HTTP: connections at once"},
    {"stall-seconds", OPT_SECONDS_MS, OFF(stall_ms), "SECONDS", "60",
     "HTTP: an SSE stream (a GET, a listen, an answer) whose client reads nothing of what waits "
     "for it for this long loses its connection"},
    {"network", OPT_NETWORK, OFF(network), "{on,off,host}", "on",
     "scripts' network: on (the public internet through the server's egress proxy, from a network "
     "namespace of their own), off, or host (the host's own network, no policy: unsafe)"},
    {"network-allow", OPT_LIST, OFF(network_allow), "RULE", NULL,
     "also allow a destination: host, *.suffix, address or prefix, with an optional :port; opens "
     "denied ranges, e.g. 127.0.0.1:8080 (repeatable)"},
    {"network-deny", OPT_LIST, OFF(network_deny), "RULE", NULL,
     "deny a destination (wins over every allow rule; repeatable): a host name also denies the "
     "addresses it resolves to (at connect time), so the same server is denied by its address "
     "or any other name; a *.suffix denies the names below it only"},
    {"secret", OPT_SECRET, 0, "NAME=PATH@HOST[,HOST...]", NULL,
     "a secret a call may ask for by NAME ([A-Z][A-Z0-9_]*): the value is read from the file PATH "
     "(not world-readable; trailing newline stripped) at start and on SIGHUP, and never enters a "
     "sandbox: the script gets a placeholder in $NAME that the egress proxy replaces in requests "
     "to the HOSTs only (a name, *.suffix or name:port; port 443 when none); repeatable"},
    {"egress-ca-file", OPT_STRING, OFF(egress_ca_file), "PEM", NULL,
     "certificates the egress proxy trusts, besides the system store, when it verifies a secret's "
     "host (a private CA)"},
    {"build-network-allow", OPT_LIST, OFF(build_network_allow), "RULE", NULL,
     "let dependency builds reach a destination besides the index hosts (repeatable)"},
    {"dns-server", OPT_LIST, OFF(dns_servers), "ADDR[:PORT]", NULL,
     "the egress proxy's resolver (repeatable; default: the host's resolv.conf)"},
    {"network-max-connections", OPT_INT, OFF(network_max_connections), "N", "64",
     "egress connections one run may have open at once; more wait"},
    {"network-max-total-connections", OPT_INT, OFF(network_max_total_connections), "N", "4096",
     "egress connections one run may open in all; more are refused"},
    {"network-rate", OPT_SIZE, OFF(network_rate), "SIZE", "0",
     "egress bandwidth per run in bytes per second, both ways together, e.g. 10M; 0 = no cap"},
    {"max-sessions-per-token", OPT_INT, OFF(max_sessions_per_token), "N", "0",
     "HTTP: sessions one bearer token may have open; 0 = no limit"},
    {"max-streams-per-token", OPT_INT, OFF(max_streams_per_token), "N", "0",
     "HTTP: GET streams one bearer token may have open; 0 = no limit"},
    {"max-replay-bytes-per-session", OPT_SIZE, OFF(max_replay_bytes_per_session), "SIZE", "16M",
     "HTTP: events one session keeps for resumption"},
    {"max-replay-bytes", OPT_SIZE, OFF(max_replay_bytes), "SIZE", "128M",
     "HTTP: events all sessions keep for resumption"},
    {"max-unread-bytes-per-token", OPT_SIZE, OFF(max_unread_bytes_per_token), "SIZE", "256M",
     "HTTP: answers one bearer token's clients have yet to read; past it its requests get 429"},
    {"loopback-origins", OPT_STRING, OFF(loopback_origins), "{auto,on,off}", "auto",
     "HTTP: accept Origins on loopback names (local web clients on any port); auto = when bound to "
     "loopback"},
    {"kill-grace-seconds", OPT_SECONDS_MS, OFF(kill_grace_ms), "SECONDS", "2",
     "time between SIGTERM and SIGKILL on timeout or cancellation"},
    {"memory-limit", OPT_SIZE, OFF(memory_bytes), "SIZE", "2G",
     "address-space limit per script, 0 = none"},
    {"cpu-limit", OPT_INT, OFF(cpu_seconds), "SECONDS", "0", "CPU time limit per script, 0 = none"},
    {"max-processes", OPT_INT, OFF(max_processes), "N", "256", "processes per script, 0 = none"},
    {"cpus", OPT_CPUS, OFF(cpu_millis), "N", "0",
     "CPU bandwidth per script, e.g. 0.5 or 2 (cgroup cpu.max, docker --cpus); 0 = no cap"},
    {"prestart", OPT_PRESTART, OFF(prestart), "{on,off,N}", "on",
     "keep N sandboxes per shape (on: 4) set up for the next calls, their interpreter already "
     "started where it can be held: the commonest shape and each principal's last other one"},
    {"prestart-max", OPT_INT, OFF(prestart_max), "N", "128",
     "under bursts a shape's pool grows up to N (calls that found none ready), and shrinks back "
     "after a minute without; N at or below --prestart: no growth"},
    {"cgroup", OPT_STRING, OFF(cgroup), "{auto,off,DIR}", "auto",
     "cgroups for runs: auto (a delegated cgroup v2, else cgroup v1), off, or a delegated cgroup "
     "v2 DIR"},
    {"max-file-size", OPT_SIZE, OFF(file_size_bytes), "SIZE", "1G",
     "largest file a script may write"},
    {"max-open-files", OPT_INT, OFF(open_files), "N", "1024", "open files per process"},
    {"tmp-size", OPT_SIZE, OFF(tmp_bytes), "SIZE", "512M", "size of the sandbox's /tmp"},
    {"work-size", OPT_SIZE, OFF(work_bytes), "SIZE", "1G",
     "size of a run's work directory, a tmpfs when the server runs as root; 0 = uncapped"},
    {"max-message-bytes", OPT_SIZE, OFF(max_message_bytes), "SIZE", "16M",
     "largest JSON-RPC message"},
    {"max-script-bytes", OPT_SIZE, OFF(max_script_bytes), "SIZE", "4M", "largest script"},
    {"max-concurrent", OPT_INT, OFF(max_concurrent), "N", "8",
     "scripts running at once; more wait"},
    {"max-starting", OPT_INT, OFF(max_starting), "N", "0",
     "of those, scripts in their first 100 ms (sandbox set-up and interpreter start-up) at once; "
     "more wait; 0 = one per CPU"},
    {"max-session-concurrent", OPT_INT, OFF(max_session_concurrent), "N", "0",
     "executions one session may have running or waiting; more are refused; 0 = no limit"},
    {"max-token-concurrent", OPT_INT, OFF(max_token_concurrent), "N", "0",
     "executions one principal (a bearer token; the stdio client) may have running or waiting; "
     "more are refused; 0 = no limit"},
    {"max-token-running", OPT_INT, OFF(max_token_running), "N", "0",
     "of those, executions one principal may have running at once; the rest wait, admitted in turn "
     "across principals; 0 = no limit"},
    {"max-input-files", OPT_INT, OFF(max_input_files), "N", "100",
     "input files a call may pass in 'files'"},
    {"max-input-file-bytes", OPT_SIZE, OFF(max_input_file_bytes), "SIZE", "8M",
     "largest input file, decoded"},
    {"max-input-bytes", OPT_SIZE, OFF(max_input_bytes), "SIZE", "12M",
     "all input files of a call together"},
    {"max-output-files", OPT_INT, OFF(max_output_files), "N", "100",
     "entries collected from outputs/ per run"},
    {"max-artifact-bytes", OPT_SIZE, OFF(max_artifact_bytes), "SIZE", "64M",
     "output file bytes kept per run"},
    {"max-artifact-store-bytes", OPT_SIZE, OFF(max_artifact_store_bytes), "SIZE", "1G",
     "output file bytes kept for all runs; the oldest go first"},
    {"max-artifact-bytes-per-token", OPT_SIZE, OFF(max_artifact_bytes_per_token), "SIZE", "0",
     "output file bytes kept for one principal; its oldest runs go first; 0 = no limit"},
    {"max-inline-bytes", OPT_SIZE, OFF(max_inline_bytes), "SIZE", "1M",
     "largest image returned inline"},
    {"max-inline-text-bytes", OPT_SIZE, OFF(max_inline_text_bytes), "SIZE", "32K",
     "largest text file embedded"},
    {"artifact-ttl", OPT_SECONDS_MS, OFF(artifact_ttl_ms), "SECONDS", "3600",
     "how long output files stay readable with resources/read"},
    {"max-task-ttl", OPT_SECONDS_MS, OFF(max_task_ttl_ms), "SECONDS", "3600",
     "longest life of a task (a task-augmented call), from its creation: a client's ttl is cut "
     "to it, and it is the default"},
    {"max-task-result-bytes-per-principal", OPT_SIZE, OFF(max_task_result_bytes_per_principal),
     "SIZE", "64M",
     "results of finished tasks one principal may have kept; past it its own oldest go; 0 = no "
     "limit"},
    {"max-task-result-bytes", OPT_SIZE, OFF(max_task_result_bytes), "SIZE", "256M",
     "results of finished tasks kept in all; past it the oldest of the principal keeping the "
     "most go; 0 = no limit"},
    {"max-tasks-per-principal", OPT_INT, OFF(max_tasks_per_principal), "N", "32",
     "tasks one principal may have kept at once (running or holding a result); more are "
     "refused; 0 = no limit"},
    {"max-listens-per-principal", OPT_INT, OFF(max_listens_per_principal), "N", "8",
     "subscriptions/listen streams one principal may hold open; past it the principal's "
     "oldest idle stream is ended for the new one; at least 1"},
    {"max-listens-local", OPT_INT, OFF(max_listens_local), "N", "64",
     "the same for the local principal (HTTP without tokens: every local client is one "
     "principal); at least 1"},
    {"log-level", OPT_LOGLEVEL, OFF(log_level), "{debug,info,warning,error}", "info",
     "stderr log level"},
    {"drain-seconds", OPT_INT, OFF(drain_seconds), "SECONDS", "30",
     "on SIGTERM, how long running calls may go on while new ones are refused (503 with "
     "Retry-After over HTTP); then the rest are cancelled; a second SIGTERM cancels at once"},
    {"health-auth", OPT_BOOL_ON, OFF(health_auth), NULL, NULL,
     "HTTP: /healthz and /readyz need a bearer token too (/metrics always does, when there "
     "are tokens)"},
    {"metrics-token", OPT_LIST, OFF(metrics_tokens), "NAME", NULL,
     "HTTP: a principal (a token's name in --auth-token-file) that may read /metrics, which "
     "shows every tenant's activity (repeatable, or comma-separated); with tokens, every other "
     "token gets 403 there, and every token when none is named; without tokens /metrics is open "
     "as the endpoint is"},
    {"route", OPT_STRING, OFF(route), "NAME", NULL,
     "HTTP: this replica's name in a fleet (a-z and digits, up to 16): every task, Python "
     "session and run id it hands out starts with NAME and a dot, so that a front (nginx) "
     "sends a request naming one to this replica, and a replica that does not own an id says "
     "whose it is (docs/operations.md, \"A fleet behind nginx\")"},
    {"allow-none-with-tokens", OPT_BOOL_ON, OFF(allow_none_with_tokens), NULL, NULL,
     "HTTP: run --sandbox-backend none although the token file names more than one principal: "
     "every tenant's script then runs as the server's user, reads the token file (every "
     "tenant's token), the state directory and the other tenants' runs"},
    {"audit-log", OPT_STRING, OFF(audit_log), "FILE|-", NULL,
     "append one JSON line per tool call and per authentication failure to FILE (- for "
     "stderr); SIGHUP reopens it"},
    {"audit-log-max-bytes", OPT_SIZE, OFF(audit_log_max_bytes), "SIZE", "0",
     "rotate the audit log when it reaches SIZE (FILE.1, FILE.2, ...); 0 = never (logrotate)"},
    {"audit-log-keep", OPT_INT, OFF(audit_log_keep), "N", "5", "rotated audit logs kept"},
    {"profile", OPT_STRING, OFF(profile), "NAME|FILE", NULL,
     "a sandbox profile: default, offline, lan (profiles/NAME.toml) or a TOML file; flags override "
     "it"},
    {"help", OPT_HELP, 0, NULL, NULL, "show this help and exit"},
    {"version", OPT_VERSION, 0, NULL, NULL, "show the version and exit"},
};

static int apply(srv_config_t *c, const opt_def_t *o, const char *value, const char *origin,
                 cm_error_t *err);

void srv_config_defaults(srv_config_t *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < CM_ARRAY_SIZE(options); i++) {
    if (!options[i].def) continue;
    cm_error_t err = CM_ERROR_INIT;
    if (apply(c, &options[i], options[i].def, " (a built-in default)", &err) < 0) {
      /* The table is ours: a default its own flag refuses is a bug, caught by every test. */
      cm_err("%s", cm_error_message(&err));
      abort();
    }
  }
}

void srv_config_release(srv_config_t *c) {
  free(c->python_version);
  free(c->python);
  cm_strv_free(c->python_dirs);
  free(c->profile);
  free(c->cgroup);
  free(c->installer);
  free(c->index_url);
  cm_strv_free(c->extra_index_urls);
  cm_strv_free(c->find_links);
  cm_strv_free(c->network_allow);
  cm_strv_free(c->network_deny);
  cm_strv_free(c->build_network_allow);
  for (size_t i = 0; i < c->n_secrets; i++) srv_secret_spec_release(&c->secrets[i]);
  free(c->secrets);
  free(c->egress_ca_file);
  cm_strv_free(c->dns_servers);
  free(c->sandbox_backend);
  free(c->uv_path);
  free(c->state_dir);
  free(c->transport);
  free(c->host);
  free(c->path);
  free(c->allowed_hosts);
  free(c->allowed_origins);
  cm_strv_free(c->trusted_proxies);
  cm_strv_free(c->tls_san);
  cm_strv_free(c->metrics_tokens);
  free(c->trusted_proxy_header);
  free(c->auth_token_file);
  free(c->audit_log);
  free(c->tls_cert);
  free(c->tls_key);
  free(c->loopback_origins);
  free(c->route);
  memset(c, 0, sizeof *c);
}

static int parse_size(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n == 0) return -1;
  uint64_t mult = 1;
  char last = s[n - 1];
  if (last == 'b' || last == 'B') {
    n--;
    last = n ? s[n - 1] : 0;
  }
  switch (last) {
    case 'k':
    case 'K':
      mult = 1ull << 10;
      n--;
      break;
    case 'm':
    case 'M':
      mult = 1ull << 20;
      n--;
      break;
    case 'g':
    case 'G':
      mult = 1ull << 30;
      n--;
      break;
    case 't':
    case 'T':
      mult = 1ull << 40;
      n--;
      break;
    default:
      break;
  }
  cleanup_free char *digits = xstrndup(s, n);
  uint64_t v;
  if (cm_parse_u64(digits, UINT64_MAX / mult, &v) < 0) return -1;
  *out = v * mult;
  return 0;
}

/* "2", "0.5", "1.25": thousandths of a CPU, at most 4096 CPUs. */
static int parse_cpus(const char *s, uint64_t *out) {
  uint64_t whole = 0, frac = 0, scale = 1000;
  const char *p = s;
  if (!*p || *p == '.') return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    whole = whole * 10 + (uint64_t)(*p - '0');
    if (whole > 4096) return -1;
  }
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9')) return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
      if (scale > 1) frac += (uint64_t)(*p - '0') * (scale /= 10);
    }
  }
  if (*p) return -1;
  *out = whole * 1000 + frac;
  return *out <= 4096 * 1000 ? 0 : -1;
}

static bool takes_value(const opt_def_t *o) {
  return o->kind != OPT_BOOL_ON && o->kind != OPT_BOOL_OFF && o->kind != OPT_HELP &&
         o->kind != OPT_VERSION;
}

static void print_help(void) {
  printf(
      "usage: %s [options]\n\nAn MCP server that runs Python scripts in a sandbox.\n\noptions:\n",
      SRV_NAME);
  for (size_t i = 0; i < CM_ARRAY_SIZE(options); i++) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", options[i].name, options[i].metavar ? " " : "",
             options[i].metavar ? options[i].metavar : "");
    if (!options[i].def)
      printf("  %-36s %s\n", left, options[i].help);
    else if (takes_value(&options[i]))
      printf("  %-36s %s (%s)\n", left, options[i].help, options[i].def);
    else
      printf("  %-36s %s (the default)\n", left, options[i].help);
  }
  printf(
      "\nEvery flag can also be set as MCP_PY_SANDBOX_<FLAG> (e.g. "
      "MCP_PY_SANDBOX_MAX_TIMEOUT=60).\n");
}

/* Appends a copy of value to the vector *v (made on the first). */
static void strv_append(char ***v, const char *value) {
  size_t n = cm_strv_len(*v);
  *v = xrealloc(*v, (n + 2) * sizeof **v);
  (*v)[n] = xstrdup(value);
  (*v)[n + 1] = NULL;
}

void srv_secret_spec_release(srv_secret_spec_t *s) {
  free(s->name);
  free(s->file);
  cm_strv_free(s->hosts);
  cm_strv_free(s->principals);
  memset(s, 0, sizeof *s);
}

/* Checks a secret's host: a name rule (a name or *.suffix, with an optional port). */
static int secret_host_ok(const char *name, const char *host, const char *origin, cm_error_t *err) {
  eg_rule_t r;
  cm_error_t e2 = CM_ERROR_INIT;
  bool ok = eg_rule_parse(host, strlen(host), &r, &e2) == 0 && r.kind != EG_RULE_NET;
  cm_error_release(&e2);
  if (!ok)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "secret %s: invalid host '%s' (a DNS name, *.suffix or name:port)%s", name,
                        host, origin);
  return 0;
}

/* Adds s (taken) to the secrets; one of the same name is replaced (flags override a profile). */
static int add_secret(srv_config_t *c, srv_secret_spec_t *s, const char *origin, cm_error_t *err) {
  if (!eg_secret_name_ok(s->name, strlen(s->name))) {
    int rc = cm_error_set(err, 0, CM_ERR_INVALID,
                          "secret '%s': invalid name (an upper-case letter, then upper-case "
                          "letters, digits or '_', at most %d)%s",
                          s->name, EG_SECRET_NAME_MAX, origin);
    srv_secret_spec_release(s);
    return rc;
  }
  if (!s->file || !*s->file || !s->hosts || !*s->hosts) {
    int rc = cm_error_set(err, 0, CM_ERR_INVALID,
                          "secret %s: a file and at least one host are needed%s", s->name, origin);
    srv_secret_spec_release(s);
    return rc;
  }
  for (char **h = s->hosts; *h; h++)
    if (secret_host_ok(s->name, *h, origin, err) < 0) {
      srv_secret_spec_release(s);
      return -1;
    }
  for (size_t i = 0; i < c->n_secrets; i++)
    if (strcmp(c->secrets[i].name, s->name) == 0) {
      srv_secret_spec_release(&c->secrets[i]);
      c->secrets[i] = *s;
      return 0;
    }
  if (c->n_secrets >= SRV_SECRETS_MAX) {
    int rc = cm_error_set(err, 0, CM_ERR_INVALID, "at most %d secrets%s", SRV_SECRETS_MAX, origin);
    srv_secret_spec_release(s);
    return rc;
  }
  c->secrets = xrealloc(c->secrets, (c->n_secrets + 1) * sizeof *c->secrets);
  c->secrets[c->n_secrets++] = *s;
  return 0;
}

/* --secret NAME=PATH@HOST[,HOST...] (the last '@' ends the path). */
static int parse_secret_flag(srv_config_t *c, const char *value, const char *origin,
                             cm_error_t *err) {
  const char *eq = strchr(value, '=');
  const char *at = strrchr(value, '@');
  if (!eq || !at || at < eq)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "argument --secret: invalid value: '%s' (NAME=PATH@HOST[,HOST...])%s",
                        value, origin);
  srv_secret_spec_t s = {.name = xstrndup(value, (size_t)(eq - value)),
                         .file = xstrndup(eq + 1, (size_t)(at - eq - 1))};
  const char *h = at + 1;
  while (*h) {
    const char *comma = strchr(h, ',');
    size_t n = comma ? (size_t)(comma - h) : strlen(h);
    if (n) {
      cleanup_free char *one = xstrndup(h, n);
      strv_append(&s.hosts, one);
    }
    h += n + (comma ? 1 : 0);
  }
  return add_secret(c, &s, origin, err);
}

static int apply(srv_config_t *c, const opt_def_t *o, const char *value, const char *origin,
                 cm_error_t *err) {
  char *base = (char *)c;
  if (o->kind == OPT_SECRET) return parse_secret_flag(c, value, origin, err);
  uint64_t v;
  switch (o->kind) {
    case OPT_LIST:
    case OPT_PATHS: {
      char ***field = (char ***)(base + o->offset);
      if ((o->kind == OPT_LIST && strchr(value, ' ')) || !*value)
        return cm_error_set(err, 0, CM_ERR_INVALID, "argument --%s: invalid value: '%s' (%s)%s",
                            o->name, value, o->kind == OPT_LIST ? "no spaces" : "empty", origin);
      strv_append(field, value);
      return 0;
    }
    case OPT_DAYS_MS:
      if (cm_parse_u64(value, 36500, &v) < 0)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid value: '%s' (0 to 36500 days)%s", o->name,
                            value, origin);
      *(uint64_t *)(base + o->offset) = v * 86400ull * 1000;
      return 0;
    case OPT_PATH_LIST: {
      char ***field = (char ***)(base + o->offset);
      for (const char *p = value; *p;) {
        size_t n = strcspn(p, ":");
        if (n) {
          cleanup_free char *part = xstrndup(p, n);
          strv_append(field, part);
        }
        p += n;
        if (*p == ':') p++;
      }
      return 0;
    }
    case OPT_STRING: {
      char **field = (char **)(base + o->offset);
      free(*field);
      *field = xstrdup(value);
      return 0;
    }
    case OPT_INT:
      if (cm_parse_u64(value, UINT32_MAX, &v) < 0)
        return cm_error_set(err, 0, CM_ERR_INVALID, "argument --%s: invalid int value: '%s'%s",
                            o->name, value, origin);
      *(uint64_t *)(base + o->offset) = v;
      return 0;
    case OPT_SECONDS_MS:
      if (cm_parse_u64(value, 86400, &v) < 0)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid value: '%s' (0 to 86400 seconds)%s", o->name,
                            value, origin);
      *(uint64_t *)(base + o->offset) = v * 1000;
      return 0;
    case OPT_SIZE:
      if (parse_size(value, &v) < 0)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid size: '%s' (e.g. 512M, 2G)%s", o->name, value,
                            origin);
      *(uint64_t *)(base + o->offset) = v;
      return 0;
    case OPT_CPUS:
      if (parse_cpus(value, &v) < 0)
        return cm_error_set(
            err, 0, CM_ERR_INVALID,
            "argument --%s: invalid value: '%s' (a number of CPUs, e.g. 0.5 or 2)%s", o->name,
            value, origin);
      *(uint64_t *)(base + o->offset) = v;
      return 0;
    case OPT_BOOL_ON:
    case OPT_BOOL_OFF: {
      bool on = o->kind == OPT_BOOL_ON;
      if (value) {
        if (!strcmp(value, "0") || !strcasecmp(value, "false") || !strcasecmp(value, "no") ||
            !strcasecmp(value, "off"))
          on = !on;
        else if (strcmp(value, "1") && strcasecmp(value, "true") && strcasecmp(value, "yes") &&
                 strcasecmp(value, "on"))
          return cm_error_set(err, 0, CM_ERR_INVALID, "argument --%s: invalid boolean: '%s'%s",
                              o->name, value, origin);
      }
      *(bool *)(base + o->offset) = on;
      return 0;
    }
    case OPT_ONOFF:
      if (!strcmp(value, "on") || !strcmp(value, "true") || !strcmp(value, "1"))
        *(bool *)(base + o->offset) = true;
      else if (!strcmp(value, "off") || !strcmp(value, "false") || !strcmp(value, "0"))
        *(bool *)(base + o->offset) = false;
      else
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid choice: '%s' (choose from 'on', 'off')%s",
                            o->name, value, origin);
      return 0;
    case OPT_PRESTART:
      if (!strcmp(value, "on") || !strcmp(value, "true")) {
        c->prestart = true;
        c->prestart_count = SRV_PRESTART_DEFAULT;
      } else if (!strcmp(value, "off") || !strcmp(value, "false") || !strcmp(value, "0")) {
        c->prestart = false;
        c->prestart_count = 0;
      } else if (cm_parse_u64(value, SRV_PRESTART_MAX, &v) == 0) {
        c->prestart = true;
        c->prestart_count = v;
      } else {
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid choice: '%s' (choose from 'on', 'off', or a "
                            "number 0 to %d)%s",
                            o->name, value, SRV_PRESTART_MAX, origin);
      }
      return 0;
    case OPT_NETWORK:
      if (!strcmp(value, "on") || !strcmp(value, "true") || !strcmp(value, "1")) {
        c->network = true;
        c->network_host = false;
      } else if (!strcmp(value, "off") || !strcmp(value, "false") || !strcmp(value, "0")) {
        c->network = c->network_host = false;
      } else if (!strcmp(value, "host")) {
        c->network = c->network_host = true;
      } else {
        return cm_error_set(
            err, 0, CM_ERR_INVALID,
            "argument --%s: invalid choice: '%s' (choose from 'on', 'off', 'host')%s", o->name,
            value, origin);
      }
      return 0;
    case OPT_LOGLEVEL: {
      cm_log_level_t l;
      if (cm_log_parse_level(value, &l) < 0)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "argument --%s: invalid choice: '%s' (choose from 'debug', 'info', "
                            "'warning', 'error')%s",
                            o->name, value, origin);
      *(cm_log_level_t *)(base + o->offset) = l;
      return 0;
    }
    default:
      return 0;
  }
}

static const opt_def_t *find_option(const char *name, size_t len) {
  for (size_t k = 0; k < CM_ARRAY_SIZE(options); k++)
    if (strlen(options[k].name) == len && strncmp(options[k].name, name, len) == 0)
      return &options[k];
  return NULL;
}

char *srv_find_profile_file(const char *file) {
  const char *env = getenv("MPS_PROFILES_DIR");
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash) *slash = '\0';
  char *candidates[] = {
      env ? xasprintf("%s/%s", env, file) : NULL,
      xasprintf("%s/" MPS_REL_DATADIR "/profiles/%s", exe, file),
      xasprintf("%s/profiles/%s", exe, file),
      xasprintf("%s/../profiles/%s", exe, file),
  };
  char *found = NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(candidates); i++) {
    if (!found && candidates[i] && access(candidates[i], R_OK) == 0)
      found = candidates[i];
    else
      free(candidates[i]);
  }
  return found;
}

/* Where named profiles live: $MPS_PROFILES_DIR, the installed share directory (relative to the
 * binary), beside the binary (a build directory), or the source tree it was built in. */
static char *profile_path(const char *name) {
  if (strchr(name, '/')) return xstrdup(name);
  cleanup_free char *file = xasprintf("%s.toml", name);
  return srv_find_profile_file(file);
}

/* A list of strings of a [secrets.NAME] table, into *out. */
static int profile_strings(const toml_value_t *v, const char *name, const char *key,
                           const char *path, char ***out, cm_error_t *err) {
  if (toml_type(v) != TOML_ARRAY || toml_array_len(v) == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "profile %s (line %zu): secrets.%s.%s must be a non-empty list of strings",
                        path, toml_line(v), name, key);
  for (size_t k = 0; k < toml_array_len(v); k++) {
    const toml_value_t *e = toml_array_at(v, k);
    if (toml_type(e) != TOML_STRING)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "profile %s (line %zu): secrets.%s.%s must be a list of strings", path,
                          toml_line(e), name, key);
    strv_append(out, toml_string(e, NULL));
  }
  return 0;
}

/* [secrets.NAME] tables: file (relative to the profile's directory), hosts, principals. */
static int profile_secrets(srv_config_t *c, const toml_value_t *secrets, const char *path,
                           cm_error_t *err) {
  if (toml_type(secrets) != TOML_TABLE)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "profile %s (line %zu): 'secrets' must be tables [secrets.NAME]", path,
                        toml_line(secrets));
  cleanup_free char *origin = xasprintf(" (from profile %s)", path);
  for (size_t i = 0; i < toml_table_len(secrets); i++) {
    const char *name;
    size_t name_len;
    const toml_value_t *t = toml_table_at(secrets, i, &name, &name_len);
    if (toml_type(t) != TOML_TABLE)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "profile %s (line %zu): secrets.%s must be a table", path, toml_line(t),
                          name);
    srv_secret_spec_t s = {.name = xstrndup(name, name_len)};
    int rc = 0;
    for (size_t k = 0; k < toml_table_len(t) && rc == 0; k++) {
      const char *key;
      size_t key_len;
      const toml_value_t *v = toml_table_at(t, k, &key, &key_len);
      if (strcmp(key, "file") == 0 && toml_type(v) == TOML_STRING && !s.file) {
        const char *f = toml_string(v, NULL);
        const char *slash = strrchr(path, '/');
        s.file =
            f[0] == '/' || !slash ? xstrdup(f) : xasprintf("%.*s/%s", (int)(slash - path), path, f);
      } else if (strcmp(key, "hosts") == 0 && !s.hosts) {
        rc = profile_strings(v, s.name, "hosts", path, &s.hosts, err);
      } else if (strcmp(key, "principals") == 0 && !s.principals) {
        rc = profile_strings(v, s.name, "principals", path, &s.principals, err);
      } else {
        rc = cm_error_set(err, 0, CM_ERR_INVALID,
                          "profile %s (line %zu): secrets.%s: unknown or repeated key '%s' "
                          "(file = \"PATH\", hosts = [...], principals = [...])",
                          path, toml_line(v), s.name, key);
      }
    }
    if (rc < 0) {
      srv_secret_spec_release(&s);
      return -1;
    }
    if (add_secret(c, &s, origin, err) < 0) return -1;
  }
  return 0;
}

/* A profile is a TOML table of flag names (dashes or underscores) and values; it applies
 * before the environment and the flags, which override it. */
int srv_config_apply_profile(srv_config_t *c, const char *text, size_t len, const char *path,
                             cm_error_t *err) {
  toml_value_t *doc = NULL;
  if (toml_parse(text, len, NULL, &doc, err) < 0) return cm_error_wrap(err, "profile %s", path);
  int rc = 0;
  for (size_t i = 0; i < toml_table_len(doc) && rc == 0; i++) {
    const char *key;
    size_t key_len;
    const toml_value_t *v = toml_table_at(doc, i, &key, &key_len);
    if (strcmp(key, "description") == 0) continue;
    if (strcmp(key, "secrets") == 0) {
      rc = profile_secrets(c, v, path, err);
      continue;
    }
    char flag[64];
    if (key_len >= sizeof flag) key_len = sizeof flag - 1;
    for (size_t k = 0; k < key_len; k++) flag[k] = key[k] == '_' ? '-' : key[k];
    flag[key_len] = '\0';
    const opt_def_t *o = find_option(flag, strlen(flag));
    if (!o || o->kind == OPT_HELP || o->kind == OPT_VERSION || strcmp(o->name, "profile") == 0) {
      rc = cm_error_set(err, 0, CM_ERR_INVALID, "profile %s (line %zu): unknown setting '%s'", path,
                        toml_line(v), flag);
      break;
    }
    char buf[64];
    const char *value = NULL;
    int64_t iv;
    bool bv;
    if (toml_type(v) == TOML_ARRAY && (o->kind == OPT_LIST || o->kind == OPT_PATHS)) {
      /* A repeatable flag: each string of the array, as if given once each. */
      cleanup_free char *origin = xasprintf(" (from profile %s)", path);
      for (size_t k = 0; k < toml_array_len(v) && rc == 0; k++) {
        const toml_value_t *e = toml_array_at(v, k);
        if (toml_type(e) != TOML_STRING)
          rc = cm_error_set(err, 0, CM_ERR_INVALID,
                            "profile %s (line %zu): '%s' must be a list of strings", path,
                            toml_line(e), flag);
        else
          rc = apply(c, o, toml_string(e, NULL), origin, err);
      }
      continue;
    }
    if (toml_type(v) == TOML_STRING) {
      value = toml_string(v, NULL);
    } else if (toml_integer(v, &iv)) {
      snprintf(buf, sizeof buf, "%lld", (long long)iv);
      value = buf;
    } else if (toml_boolean(v, &bv)) {
      value = bv ? "true" : "false";
    } else {
      rc = cm_error_set(err, 0, CM_ERR_INVALID,
                        "profile %s (line %zu): '%s' must be a string, an integer, a boolean "
                        "or (for a repeatable flag) a list of strings",
                        path, toml_line(v), flag);
      break;
    }
    cleanup_free char *origin = xasprintf(" (from profile %s)", path);
    rc = apply(c, o, value, origin, err);
  }
  toml_free(doc);
  return rc;
}

static int load_profile(srv_config_t *c, const char *name, cm_error_t *err) {
  cleanup_free char *path = profile_path(name);
  if (!path)
    return cm_error_set(
        err, 0, CM_ERR_NOT_FOUND,
        "profile '%s' not found (known: default, offline, lan; or give a file path)", name);
  cleanup_free char *text = NULL;
  size_t len;
  if (cm_read_file(path, 1u << 20, &text, &len, err) < 0)
    return cm_error_wrap(err, "profile '%s'", name);
  return srv_config_apply_profile(c, text, len, path, err);
}

int srv_config_parse(srv_config_t *c, int argc, char **argv, cm_error_t *err) {
  /* The profile first (from the flags or the environment), then the environment, then the
   * flags: each overrides what came before. */
  const char *profile = getenv("MCP_PY_SANDBOX_PROFILE");
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--profile") == 0 && i + 1 < argc)
      profile = argv[i + 1];
    else if (strncmp(argv[i], "--profile=", 10) == 0)
      profile = argv[i] + 10;
  }
  if (profile && load_profile(c, profile, err) < 0) return -1;
  for (size_t i = 0; i < CM_ARRAY_SIZE(options); i++) {
    const opt_def_t *o = &options[i];
    if (o->kind == OPT_HELP || o->kind == OPT_VERSION) continue;
    char var[80] = "MCP_PY_SANDBOX_";
    size_t p = strlen(var);
    for (const char *q = o->name; *q && p < sizeof var - 1; q++)
      var[p++] = *q == '-' ? '_' : (char)(*q & ~0x20);
    var[p] = '\0';
    const char *value = getenv(var);
    if (!value) continue;
    cleanup_free char *origin = xasprintf(" (from %s)", var);
    if (apply(c, o, value, origin, err) < 0) return -1;
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
      return cm_error_set(err, 0, CM_ERR_INVALID, "unrecognized arguments: %s", arg);
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_def_t *o = NULL;
    for (size_t k = 0; k < CM_ARRAY_SIZE(options); k++) {
      if (strlen(options[k].name) == name_len && strncmp(options[k].name, name, name_len) == 0) {
        o = &options[k];
        break;
      }
    }
    if (!o) return cm_error_set(err, 0, CM_ERR_INVALID, "unrecognized arguments: %s", arg);
    if (o->kind == OPT_HELP) {
      print_help();
      return 1;
    }
    if (o->kind == OPT_VERSION) {
      c->show_version = true; /* main prints it, with where the helpers come from */
      return 1;
    }
    const char *value = NULL;
    if (takes_value(o)) {
      if (eq) {
        value = eq + 1;
      } else {
        if (i + 1 >= argc)
          return cm_error_set(err, 0, CM_ERR_INVALID, "argument --%s: expected one argument",
                              o->name);
        value = argv[++i];
      }
    } else if (eq) {
      value = eq + 1;
    }
    if (apply(c, o, value, "", err) < 0) return -1;
  }
  return 0;
}

int srv_config_validate(const srv_config_t *c, cm_error_t *err) {
  static const char *const backends[] = {"native", "bwrap", "docker", "podman", "none"};
  bool known = false;
  for (size_t i = 0; i < CM_ARRAY_SIZE(backends); i++)
    known |= strcmp(c->sandbox_backend, backends[i]) == 0;
  if (!known)
    return cm_error_set(
        err, 0, CM_ERR_INVALID,
        "Invalid sandbox_backend '%s', must be one of ('native', 'docker', 'podman', 'none')",
        c->sandbox_backend);
  if (c->max_timeout < 1) return cm_error_set(err, 0, CM_ERR_INVALID, "max_timeout must be >= 1");
  if (c->default_timeout < 1 || c->default_timeout > c->max_timeout)
    return cm_error_set(err, 0, CM_ERR_INVALID, "default_timeout must be between 1 and %llu",
                        (unsigned long long)c->max_timeout);
  if (c->max_output_bytes < 1024)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_output_bytes must be >= 1024");
  if (c->max_output_bytes > (64ull << 20))
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_output_bytes must be <= 67108864");
  if (strcmp(c->transport, "stdio") != 0 && strcmp(c->transport, "http") != 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "Invalid transport '%s', must be one of ('stdio', 'http')", c->transport);
  if (c->port < 1 || c->port > 65535)
    return cm_error_set(err, 0, CM_ERR_INVALID, "port must be between 1 and 65535");
  if (c->path[0] != '/') return cm_error_set(err, 0, CM_ERR_INVALID, "path must start with '/'");
  if ((c->tls_cert != NULL) != (c->tls_key != NULL))
    return cm_error_set(err, 0, CM_ERR_INVALID, "--tls-cert and --tls-key go together");
  if (c->tls_self_signed && c->tls_cert)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "--tls-self-signed and --tls-cert exclude each other");
  if (c->tls_san && !c->tls_self_signed)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "--tls-san names what --tls-self-signed's certificate covers: it needs "
                        "--tls-self-signed (a --tls-cert carries its own names)");
  if (c->max_sessions < 1) return cm_error_set(err, 0, CM_ERR_INVALID, "max_sessions must be >= 1");
  if (c->max_message_bytes < 4096)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_message_bytes must be >= 4096");
  if (c->max_message_bytes > (1ull << 30))
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_message_bytes must be <= 1G");
  if (c->max_script_bytes < 1)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_script_bytes must be >= 1");
  if (strcmp(c->installer, "auto") && strcmp(c->installer, "uv") && strcmp(c->installer, "pip"))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "Invalid installer '%s', must be one of ('auto', 'uv', 'pip')",
                        c->installer);
  if (c->build_timeout_ms < 1000)
    return cm_error_set(err, 0, CM_ERR_INVALID, "build_timeout must be >= 1");
  if (c->max_build_bytes < (16ull << 20))
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_build_bytes must be >= 16M");
  if (c->max_concurrent < 1)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_concurrent must be >= 1");
  if (c->prestart_max > SRV_PRESTART_BURST_MAX)
    return cm_error_set(err, 0, CM_ERR_INVALID, "prestart_max must be <= %d",
                        SRV_PRESTART_BURST_MAX);
  if (c->artifact_ttl_ms < 1000)
    return cm_error_set(err, 0, CM_ERR_INVALID, "artifact_ttl must be >= 1");
  if (c->audit_log_keep < 1 || c->audit_log_keep > 100)
    return cm_error_set(err, 0, CM_ERR_INVALID, "audit_log_keep must be between 1 and 100");
  if (c->max_listens_per_principal < 1 || c->max_listens_local < 1)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "max_listens_per_principal and max_listens_local must be >= 1");
  if (c->max_task_ttl_ms < 1000)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_task_ttl must be >= 1");
  if (c->max_artifact_bytes > c->max_artifact_store_bytes)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "max_artifact_bytes must be <= max_artifact_store_bytes");
  if (c->route) {
    size_t n = strlen(c->route);
    bool ok = n >= 1 && n <= SRV_ROUTE_MAX;
    for (const char *p = c->route; ok && *p; p++)
      ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9');
    if (!ok)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "argument --route: '%s' is not a route name (a-z and digits, 1 to %d)",
                          c->route, SRV_ROUTE_MAX);
  }
  if (strcmp(c->cgroup, "auto") && strcmp(c->cgroup, "off") && c->cgroup[0] != '/')
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "Invalid cgroup '%s', must be 'auto', 'off' or an absolute path",
                        c->cgroup);
  const struct {
    const char *flag;
    char *const *list;
  } rule_lists[] = {{"network-allow", c->network_allow},
                    {"network-deny", c->network_deny},
                    {"build-network-allow", c->build_network_allow}};
  for (size_t i = 0; i < CM_ARRAY_SIZE(rule_lists); i++) {
    for (char *const *p = rule_lists[i].list; p && *p; p++) {
      eg_rule_t r;
      if (eg_rule_parse(*p, strlen(*p), &r, err) < 0)
        return cm_error_wrap(err, "argument --%s", rule_lists[i].flag);
    }
  }
  /* A secret bound to a host a deny rule names could never be used: said at start. */
  for (size_t i = 0; i < c->n_secrets; i++) {
    for (char *const *h = c->secrets[i].hosts; *h; h++) {
      eg_rule_t hr;
      if (eg_rule_parse(*h, strlen(*h), &hr, err) < 0)
        return cm_error_wrap(err, "secret %s", c->secrets[i].name);
      for (char *const *d = c->network_deny; d && *d; d++) {
        eg_rule_t dr;
        if (eg_rule_parse(*d, strlen(*d), &dr, err) < 0) return -1;
        const char *name = hr.kind == EG_RULE_SUFFIX ? hr.host + 1 : hr.host;
        bool hit = dr.kind != EG_RULE_NET && (dr.port == 0 || hr.port == 0 || dr.port == hr.port) &&
                   (eg_rule_match_name(&dr, name, dr.port ? dr.port : 443) ||
                    (dr.kind == hr.kind && !strcmp(dr.host, hr.host)));
        if (hit)
          return cm_error_set(err, 0, CM_ERR_INVALID,
                              "secret %s is bound to %s, which --network-deny %s denies",
                              c->secrets[i].name, *h, *d);
      }
    }
  }
  for (char *const *d = c->dns_servers; d && *d; d++) {
    const char *p = *d;
    size_t n = strlen(p);
    eg_rule_t r;
    cm_error_t e2 = CM_ERROR_INIT;
    bool ok = eg_rule_parse(p, n, &r, &e2) == 0 && r.kind == EG_RULE_NET &&
              r.prefix == (r.addr.family == AF_INET ? 32u : 128u);
    cm_error_release(&e2);
    if (!ok)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "argument --dns-server: invalid value: '%.*s' (an address with an "
                          "optional :port, e.g. 127.0.0.1:5353 or [::1]:53)",
                          (int)n, p);
  }
  if (c->network_max_connections < 1)
    return cm_error_set(err, 0, CM_ERR_INVALID, "network_max_connections must be >= 1");
  if (c->network_host && c->profile &&
      (!strcmp(c->profile, "lan") ||
       (strrchr(c->profile, '/') && !strcmp(strrchr(c->profile, '/'), "/lan.toml"))))
    return cm_error_set(
        err, 0, CM_ERR_INVALID,
        "--network host is refused with the lan profile: it would give every script the host's own "
        "network (its loopback services, its LAN, this server's port); use --network on with "
        "--network-allow rules");
  if (strcmp(c->loopback_origins, "auto") && strcmp(c->loopback_origins, "on") &&
      strcmp(c->loopback_origins, "off"))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "Invalid loopback_origins '%s', must be one of ('auto', 'on', 'off')",
                        c->loopback_origins);
  if (strcmp(c->trusted_proxy_header, "x-forwarded-for") &&
      strcmp(c->trusted_proxy_header, "forwarded"))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "Invalid trusted_proxy_header '%s', must be one of ('x-forwarded-for', "
                        "'forwarded')",
                        c->trusted_proxy_header);
  if (c->max_replay_bytes_per_session < (64u << 10) || c->max_replay_bytes < (64u << 10))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "max_replay_bytes_per_session and max_replay_bytes must be >= 64K");
  if (c->max_replay_bytes_per_session > SIZE_MAX / 2 || c->max_replay_bytes > SIZE_MAX / 2)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_replay_bytes is too large");
  if (c->max_unread_bytes_per_token < (64u << 10) || c->max_unread_bytes_per_token > SIZE_MAX / 2)
    return cm_error_set(err, 0, CM_ERR_INVALID, "max_unread_bytes_per_token must be >= 64K");
  if (c->max_inline_bytes > (16ull << 20) || c->max_inline_text_bytes > (16ull << 20))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "max_inline_bytes and max_inline_text_bytes must be <= 16M");
  return 0;
}

char *srv_route_id(const srv_config_t *c, const char *rest) {
  return c->route ? xasprintf("%s.%s", c->route, rest) : xstrdup(rest);
}

/* The length of id's route ("<route>." at its start), or 0. */
static size_t route_len(const char *id) {
  const char *dot = strchr(id, '.');
  size_t n = dot ? (size_t)(dot - id) : 0;
  if (n < 1 || n > SRV_ROUTE_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9'))) return 0;
  return n;
}

bool srv_route_foreign(const srv_config_t *c, const char *id) {
  size_t n = route_len(id);
  return n && !(c->route && strlen(c->route) == n && memcmp(c->route, id, n) == 0);
}

char *srv_route_unknown(const srv_config_t *c, const char *what, const char *id) {
  size_t n = route_len(id);
  if (srv_route_foreign(c, id))
    return xasprintf(
        "it belongs to replica %.*s, and this is %s%s: the request did not reach "
        "its owner (that replica is gone, or the front does not route on the id's "
        "prefix); whatever lived in %.*s is lost if it is gone",
        (int)n, id, c->route ? "replica " : "a server without --route", c->route ? c->route : "",
        (int)n, id);
  if (c->route)
    return xasprintf(
        "no %s of yours has that id in replica %s (it ended or expired, the replica "
        "restarted, or it was never yours)",
        what, c->route);
  return xasprintf(
      "no %s of yours has that id (it ended or expired, the server restarted, or "
      "it was never yours)",
      what);
}
