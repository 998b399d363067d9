/* The server: assembles every part (state directory, sandbox backends, cgroups, artifacts,
 * interpreters, environments, network, the execution state and the tool table) and takes
 * them apart again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "server/net/net.h"
#include "server/server.h"

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
  srv_server_t *s = data;
  s->warm_probe_wait = NULL;
  py_interp_t *def = s->warm_python;
  s->warm_python = NULL;
  if (!s->backend->available) return;
  cleanup_free char *list = srv_find_profile_file("warmup.txt");
  if (def && list) env_store_warm(s->envs, def, list);
}

/* The sandbox works: a container image decides between uv and pip (envstore.h), and the
 * prestart pool may fill. */
static void server_probed(srv_server_t *s) {
  env_store_backend_probed(s->envs);
  exec_prestart_start(s);
}

static void start_warming(void *data, py_interp_t *def, const cm_error_t *error) {
  srv_server_t *s = data;
  s->warm_wait = NULL;
  if (!def) return;
  s->warm_python = def;
  s->warm_probe_wait = srv_server_when_probed(s, warm_when_probed, s);
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

srv_server_t *srv_server_new(cm_loop_t *loop, srv_config_t *cfg, cm_error_t *err) {
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
  srv_server_t *s = xcalloc(1, sizeof *s);
  s->counters.started_ms = (uint64_t)time(NULL) * 1000;
  s->audit = audit;
  s->artifacts = artifacts;
  s->loop = loop;
  s->cfg = cfg;
  s->backend = backend;
  s->cgroups = cgroups;
  s->host = sbx_backend_new("none", err);
  sbx_backend_probe(s->host);
  s->state_dir = steal_pointer(&state);
  s->runs_dir = steal_pointer(&runs_dir);
  s->runs_lock = steal_fd(&runs_lock);
  py_options_t py_opts = {
      .python = cfg->python,
      .python_dirs = cfg->python_dirs,
      .python_version = cfg->python_version,
      .allow_downloads = cfg->allow_python_downloads,
      .uv_path = cfg->uv_path,
      .download_timeout_ms = cfg->build_timeout_ms,
  };
  s->pythons = py_registry_new(loop, &py_opts, s->state_dir);
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
  s->envs = env_store_new(loop, &env_opts, s->state_dir, s->runs_dir, backend);
  s->network = srv_network_new(loop, cfg);
  env_network_t env_net = {
      .proxy = network_proxy, .deny = srv_network_deny_policy(s->network), .data = s->network};
  env_store_set_network(s->envs, &env_net);
  /* The sandbox is probed right after start-up, once the handshake had its chance (or at
   * the first call that needs it, whichever comes first): it runs a whole trivial sandbox. */
  s->tools = srv_tools(&s->n_tools);
  s->app = srv_tool_app();
  s->exec = exec_new(s);
  s->on_probed = server_probed;
  srv_probe_schedule(s);
  if (cfg->warm_cache && !cfg->offline)
    s->warm_wait = py_registry_when_ready(s->pythons, start_warming, s);
  py_registry_start(s->pythons);
  return s;
}

void srv_server_drain(srv_server_t *s) {
  s->draining = true;
  /* The calls in progress may still take a held sandbox, but none is set up any more: a
   * refill now would only be torn down again, racing the exit. */
  exec_prestart_stop(s->exec, false);
  /* Listen streams would hold the drain open: they end now, gracefully. */
  srv_listen_end_all(s);
}

size_t srv_server_calls(srv_server_t *s) {
  size_t n = 0;
  for (srv_request_t *r = s->inflight; r; r = srv_request_next_inflight(r))
    if (srv_request_is_call(r)) n++;
  return n;
}

void srv_server_wind_down(srv_server_t *s) {
  exec_wind_down(s->exec);
}

size_t srv_server_teardowns(srv_server_t *s) {
  return exec_teardowns(s->exec) + sbx_run_detached_count() + cm_bg_pending() +
         sbx_cgroups_pending(s->cgroups);
}

bool srv_server_ready(srv_server_t *s) {
  return srv_server_probed(s) && srv_server_backend_kind(s)->available &&
         py_registry_default(s->pythons) != NULL;
}

void srv_server_reopen_logs(srv_server_t *s) {
  if (s->audit) {
    cm_info("SIGHUP: reopening the audit log");
    srv_audit_reopen(s->audit);
  }
  cm_error_t err = CM_ERROR_INIT;
  if (s->http && tr_http_reload_tokens(s->http, &err) < 0)
    cm_err("SIGHUP: %s", cm_error_message(&err));
  cm_error_release(&err);
}

void srv_server_free(srv_server_t *s) {
  if (!s) return;
  if (s->warm_wait) py_registry_cancel_wait(s->pythons, s->warm_wait);
  if (s->warm_probe_wait) srv_server_cancel_probe_wait(s, s->warm_probe_wait);
  srv_probe_release(s);
  srv_tasks_free(s);
  srv_recent_free(s);
  /* After a drain that ran its course, nothing: its wind-down waited for every teardown. */
  size_t left = exec_teardowns(s->exec) + sbx_run_detached_count();
  if (left)
    cm_warn(
        "shutdown: %zu sandboxes, sessions or calls are still being torn down; killing and "
        "reaping them now",
        left);
  exec_free(s->exec);
  s->exec = NULL;
  sbx_run_reap_detached(); /* runs answered while their sandbox was torn down */
  art_store_free(s->artifacts);
  env_store_free(s->envs);
  srv_network_free(s->network); /* after the runs and builds: it closes what they left */
  py_registry_free(s->pythons);
  sbx_backend_free(s->backend);
  sbx_backend_free(s->host);
  sbx_cgroups_free(s->cgroups); /* after the runs: it removes their directories */
  srv_workdir_release(s->runs_dir, s->runs_lock);
  /* Last: the requests above wrote their lines as they were cancelled. */
  srv_audit_close(s->audit, 2000);
  free(s->runs_dir);
  free(s->state_dir);
  free(s);
}
