/* The server: assembles every part (state directory, sandbox backends, cgroups, artifacts,
 * interpreters, environments, network, the execution state and the tool table) and takes
 * them apart again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "server/net/net.h"
#include "server/server-internal.h"

/* ---------------------------------------------------------------- server */

static eg_proxy_t *network_proxy(void *data, cm_error_t *err) {
  return srv_network_proxy(data, err);
}

static char *default_state_dir(void) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return xasprintf("%s/%s", xdg, SRV_NAME);
  const char *home = getenv("HOME");
  if (home && *home == '/') return xasprintf("%s/.cache/%s", home, SRV_NAME);
  return xasprintf("/tmp/%s-%u", SRV_NAME, (unsigned)getuid());
}

/* Once the interpreters are known and the sandbox probed: warm the download cache in the
 * background. */
static void warm_when_probed(void *data) {
  srv_assembly_t *a = data;
  a->warm_probe_wait = NULL;
  py_interp_t *def = a->warm_python;
  a->warm_python = NULL;
  if (!srv_server_backend_kind(a->server)->available) return;
  cleanup_free char *list = srv_find_profile_file("warmup.txt");
  if (def && list) env_store_warm(srv_server_envs(a->server), def, list);
}

/* The probe finished (the server's own waiter, the first): when the sandbox works, a
 * container image decides between uv and pip (envstore.h), and the prestart pool may fill. */
static void server_probed(void *data) {
  srv_server_t *s = data;
  if (!srv_server_backend_kind(s)->available) return;
  env_store_backend_probed(srv_server_envs(s));
  exec_prestart_start(s);
}

static void start_warming(void *data, py_interp_t *def, const cm_error_t *error) {
  srv_assembly_t *a = data;
  a->warm_wait = NULL;
  if (!def) return;
  a->warm_python = def;
  a->warm_probe_wait = srv_server_when_probed(a->server, warm_when_probed, a);
}

/* Absolute, no empty, "." or ".." component, no trailing slash: what the sandboxes accept
 * as the root of their mounts. */
static bool state_path_is_clean(const char *p) {
  if (p[0] != '/') return false;
  if (p[1] == '\0') return true;
  for (const char *c = p; *c;) {
    c++;
    const char *e = strchrnul(c, '/');
    size_t n = (size_t)(e - c);
    if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return false;
    c = e;
  }
  return true;
}

static void secrets_cleanup(srv_secrets_t **s) {
  srv_secrets_free(*s);
}

srv_server_t *srv_server_new(cm_loop_t *loop, srv_config_t *cfg, cm_error_t *err) {
  /* First: a secret that cannot be read (missing, world-readable) stops the start. */
  __attribute__((cleanup(secrets_cleanup))) srv_secrets_t *secrets = srv_secrets_load(cfg, err);
  if (!secrets) return NULL;
  cleanup_free char *state = cfg->state_dir ? xstrdup(cfg->state_dir) : default_state_dir();
  if (cm_mkdir_p(state, 0700, err) < 0) {
    cm_error_wrap(err, "creating the state directory");
    return NULL;
  }
  /* Every path under the state directory ends up in a mount of the sandbox, which takes
   * clean absolute paths only: a relative --state-dir (or one with "..") is resolved here,
   * once, against the directory the server started in. */
  if (!state_path_is_clean(state)) {
    cleanup_free char *resolved = realpath(state, NULL);
    if (!resolved) {
      cm_error_set(err, errno, CM_ERR_IO, "resolving the state directory %s", state);
      return NULL;
    }
    cm_info("state directory: %s (given as %s)", resolved, state);
    free(state);
    state = steal_pointer(&resolved);
  }
  cleanup_free char *work = xasprintf("%s/work", state);
  if (cm_mkdir_p(work, 0711, err) < 0) {
    cm_error_wrap(err, "creating the work directory");
    return NULL;
  }
  chmod(work, 0711);
  srv_workdir_sweep(work, cfg->max_timeout + cfg->kill_grace_ms / 1000 + 600);
  /* Until the server holds them, a failure below removes the directory and drops its lock
   * (nothing is mounted in it yet). */
  cleanup_close int runs_lock = -1;
  cleanup_rmtree char *runs_dir = srv_workdir_claim(work, &runs_lock, err);
  if (!runs_dir) {
    cm_error_wrap(err, "creating the work directory");
    return NULL;
  }
  if (sbx_instance_open(state, err) < 0) {
    cm_error_wrap(err, "recording the server instance");
    return NULL;
  }
  cm_info("instance %s (its cgroups: mps-%s; its records: %s/instances)", sbx_instance_id(),
          sbx_instance_id(), state);
  const char *backend_name = cfg->sandbox_backend;
  sbx_backend_t *backend = sbx_backend_new(backend_name, err);
  if (!backend) return NULL;
  sbx_backend_set_state_dir(backend, state);
  sbx_cgroups_t *cgroups = sbx_cgroups_open(cfg->cgroup, err);
  if (!cgroups) {
    sbx_backend_free(backend);
    return NULL;
  }
  cleanup_free char *cg_text = sbx_cgroups_describe(cgroups);
  cm_info("cgroups: %s", cg_text);
  sbx_backend_set_cgroups(backend, cgroups);
  sbx_cgroups_set_loop(cgroups, loop);
  art_store_t *artifacts = art_store_new(loop, cfg, state, err);
  if (!artifacts) {
    sbx_backend_free(backend);
    sbx_cgroups_free(cgroups);
    return NULL;
  }
  srv_audit_t *audit = NULL;
  if (cfg->audit_log && *cfg->audit_log) {
    audit = srv_audit_open(cfg->audit_log, cfg->audit_log_max_bytes, (unsigned)cfg->audit_log_keep,
                           err);
    if (!audit) {
      cm_error_wrap(err, "--audit-log");
      art_store_free(artifacts);
      sbx_backend_free(backend);
      sbx_cgroups_free(cgroups);
      return NULL;
    }
  }
  sbx_backend_t *host = sbx_backend_new("none", err);
  sbx_backend_probe(host);
  srv_assembly_t *a = xcalloc(1, sizeof *a);
  a->state_dir = steal_pointer(&state);
  a->runs_dir = steal_pointer(&runs_dir);
  a->runs_lock = steal_fd(&runs_lock);
  py_options_t py_opts = {
      .python = cfg->python,
      .python_dirs = cfg->python_dirs,
      .python_version = cfg->python_version,
      .allow_downloads = cfg->allow_python_downloads,
      .uv_path = cfg->uv_path,
      .download_timeout_ms = cfg->build_timeout_ms,
  };
  py_registry_t *pythons = py_registry_new(loop, &py_opts, a->state_dir);
  env_options_t env_opts = {
      .installer = cfg->installer,
      .uv_path = cfg->uv_path,
      .index_url = cfg->index_url,
      .extra_index_urls = cfg->extra_index_urls,
      .find_links = cfg->find_links,
      .build_network_allow = cfg->build_network_allow,
      .offline = cfg->offline,
      .max_cache_bytes = cfg->max_cache_bytes,
      .max_cache_bytes_per_owner = cfg->max_cache_bytes_per_token,
      .env_max_age_ms = cfg->env_max_age_ms,
      .build_timeout_ms = cfg->build_timeout_ms,
      .max_build_bytes = cfg->max_build_bytes,
      .kill_grace_ms = cfg->kill_grace_ms,
      .memory_bytes = cfg->memory_bytes,
      .max_processes = cfg->max_processes,
      .open_files = cfg->open_files,
      .tmp_bytes = cfg->tmp_bytes,
      .max_resolutions = cfg->max_concurrent,
      .max_resolutions_per_owner = cfg->max_token_running,
  };
  env_store_t *envs = env_store_new(loop, &env_opts, a->state_dir, a->runs_dir, backend);
  struct srv_network *network = srv_network_new(loop, cfg, steal_pointer(&secrets));
  env_network_t env_net = {
      .proxy = network_proxy, .deny = srv_network_deny_policy(network), .data = network};
  env_store_set_network(envs, &env_net);
  srv_parts_t parts = {
      .loop = loop,
      .cfg = cfg,
      .backend = backend,
      .host = host,
      .cgroups = cgroups,
      .pythons = pythons,
      .envs = envs,
      .network = network,
      .artifacts = artifacts,
      .audit = audit,
      .state_dir = a->state_dir,
      .runs_dir = a->runs_dir,
      .app = srv_tool_app(),
      .owner = a,
  };
  parts.tools = srv_tools(&parts.n_tools);
  srv_server_t *s = srv_core_new(&parts);
  a->server = s;
  srv_server_set_exec(s, exec_new(s));
  /* Before any call's waiter: what a probe that passed starts comes first. */
  srv_server_after_probe(s, server_probed, s);
  /* The sandbox is probed right after start-up, once the handshake had its chance (or at
   * the first call that needs it, whichever comes first): it runs a whole trivial sandbox. */
  srv_probe_schedule(s);
  if (cfg->warm_cache && !cfg->offline)
    a->warm_wait = py_registry_when_ready(pythons, start_warming, a);
  py_registry_start(pythons);
  return s;
}

void srv_server_drain(srv_server_t *s) {
  /* The calls in progress may still take a held sandbox, but none is set up any more: a
   * refill now would only be torn down again, racing the exit. */
  exec_prestart_stop(srv_server_exec(s), false);
  /* New calls are refused; listen streams would hold the drain open: they end now,
   * gracefully. */
  srv_core_drain(s);
}

void srv_server_wind_down(srv_server_t *s) {
  exec_wind_down(srv_server_exec(s));
}

size_t srv_server_teardowns(srv_server_t *s) {
  return exec_teardowns(srv_server_exec(s)) + sbx_run_detached_count() + cm_bg_pending() +
         sbx_cgroups_pending(srv_server_cgroups(s));
}

bool srv_server_ready(srv_server_t *s) {
  return srv_server_probed(s) && srv_server_backend_kind(s)->available &&
         py_registry_default(srv_server_pythons(s)) != NULL;
}

static bool principal_revoked(void *ctx, const char *principal) {
  return tr_http_principal_revoked(ctx, principal);
}

void srv_server_reopen_logs(srv_server_t *s) {
  srv_audit_t *audit = srv_server_audit(s);
  if (audit) {
    cm_info("SIGHUP: reopening the audit log");
    srv_audit_reopen(audit);
  }
  srv_network_reload_secrets(srv_server_network(s));
  cm_error_t err = CM_ERROR_INIT;
  tr_http_t *http = srv_server_http(s);
  if (http && tr_http_reload_tokens(http, &err) < 0) cm_err("SIGHUP: %s", cm_error_message(&err));
  cm_error_release(&err);
  /* A removed token's principal keeps nothing running: its tasks and background runs, which
   * outlive their requests and sessions, end with it. */
  if (http) srv_tasks_stop_revoked(s, principal_revoked, http);
}

void srv_server_free(srv_server_t *s) {
  if (!s) return;
  srv_assembly_t *a = srv_assembly(s);
  if (a->warm_wait) py_registry_cancel_wait(srv_server_pythons(s), a->warm_wait);
  if (a->warm_probe_wait) srv_server_cancel_probe_wait(s, a->warm_probe_wait);
  srv_probe_release(s);
  srv_tasks_free(s);
  srv_recent_free(s);
  exec_state_t *x = srv_server_exec(s);
  /* After a drain that ran its course, nothing: its wind-down waited for every teardown. */
  size_t left = exec_teardowns(x) + sbx_run_detached_count();
  if (left)
    cm_warn(
        "shutdown: %zu sandboxes, sessions or calls are still being torn down; killing and "
        "reaping them now",
        left);
  exec_free(x);
  srv_server_set_exec(s, NULL);
  sbx_run_reap_detached(); /* runs answered while their sandbox was torn down */
  art_store_free(srv_server_artifacts(s));
  env_store_free(srv_server_envs(s));
  srv_network_free(srv_server_network(s)); /* after the runs and builds: it closes what they left */
  py_registry_free(srv_server_pythons(s));
  sbx_backend_free(srv_server_backend_kind(s));
  sbx_backend_free(srv_server_host_backend(s));
  sbx_cgroups_free(srv_server_cgroups(s)); /* after the runs: it removes their directories */
  sbx_instance_close();                    /* after the cgroups named after it */
  srv_workdir_release(a->runs_dir, a->runs_lock);
  /* Last: the requests above wrote their lines as they were cancelled. */
  srv_audit_close(srv_server_audit(s), 2000);
  srv_core_free(s);
  free(a->runs_dir);
  free(a->state_dir);
  free(a);
}
