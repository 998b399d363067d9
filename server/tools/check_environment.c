/* check_environment: what a call would get, without running anything. */
#include <stdio.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include "envstore/envstore.h"
#include "server/net/net.h"
#include "server/files/files.h"
#include "server/exec/exec.h"
#include "server/tools/tools-internal.h"

static char *human_size(uint64_t v) {
  if (v == 0) return xstrdup("none");
  if (v % (1ull << 30) == 0) return xasprintf("%lluG", (unsigned long long)(v >> 30));
  if (v % (1ull << 20) == 0) return xasprintf("%lluM", (unsigned long long)(v >> 20));
  if (v % (1ull << 10) == 0) return xasprintf("%lluK", (unsigned long long)(v >> 10));
  return xasprintf("%llu bytes", (unsigned long long)v);
}

/* ---------------------------------------------------------------- the server's own files */

void srv_describe_installation(cm_buf_t *t, json_t **obj) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_free char *drop = sbx_helper_path(SBX_HELPER_DROP, &err);
  cleanup_free char *drop_why = drop ? NULL : xstrdup(cm_error_message(&err));
  cm_error_release(&err);
  cleanup_free char *init = sbx_helper_path(SBX_HELPER_CONTAINER_INIT, &err);
  cleanup_free char *init_why = init ? NULL : xstrdup(cm_error_message(&err));
  cm_error_release(&err);
  cleanup_free char *runner_why = NULL;
  cleanup_free char *runner = exec_find_runner(&runner_why);
  cleanup_free char *profile_file = srv_find_profile_file("default.toml");
  cleanup_free char *profile = profile_file ? realpath(profile_file, NULL) : NULL;
  char *slash = profile ? strrchr(profile, '/') : NULL;
  if (slash) *slash = '\0';
  const struct {
    const char *label, *key, *path, *why;
  } rows[] = {
      {"drop helper", "drop_helper", drop, drop_why},
      {"container init", "container_init", init, init_why},
      {"start-up runner", "runner", runner, runner_why},
      {"profiles", "profiles", profile, "not found (set MPS_PROFILES_DIR)"},
  };
  json_t *o = obj ? json_object() : NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(rows); i++) {
    if (t) cm_buf_printf(t, "%s: %s\n", rows[i].label, rows[i].path ? rows[i].path : rows[i].why);
    if (o)
      json_object_set_new(o, rows[i].key, rows[i].path ? json_string(rows[i].path) : json_null());
  }
  if (obj) *obj = o;
}

/* ---------------------------------------------------------------- check_environment */

static char *of_cap(uint64_t used, uint64_t cap) {
  return cap ? xasprintf("%llu of %llu", (unsigned long long)used, (unsigned long long)cap)
             : xasprintf("%llu (no cap)", (unsigned long long)used);
}

/* What the caller's principal holds against its caps: a line of text and an object. */
static json_t *tenant_share(srv_request_t *r, cm_buf_t *t) {
  srv_server_t *s = srv_request_server(r);
  const srv_config_t *cfg = srv_server_config(s);
  srv_session_t *ss = srv_request_session(r);
  const char *principal = ss ? srv_session_principal(ss) : SRV_PRINCIPAL_STDIO;
  exec_usage_t ex;
  exec_usage(srv_server_exec(s), principal, &ex);
  size_t files = 0;
  uint64_t bytes = 0;
  art_store_usage(srv_server_artifacts(s), principal, &files, &bytes);
  tr_http_t *http = srv_server_http(s);
  tr_http_usage_t hu;
  tr_http_usage(http, principal, &hu);
  cleanup_free char *calls = of_cap(ex.calls, cfg->max_token_concurrent);
  cleanup_free char *running =
      of_cap(ex.running, cfg->max_token_running ? cfg->max_token_running : cfg->max_concurrent);
  cleanup_free char *art = of_cap(bytes, cfg->max_artifact_bytes_per_token);
  size_t n_envs = 0;
  uint64_t env_bytes = 0;
  env_store_usage(srv_server_envs(s), principal, &n_envs, &env_bytes);
  cleanup_free char *envs = of_cap(env_bytes, cfg->max_cache_bytes_per_token);
  cm_buf_printf(t,
                "Your share (principal '%s'): executions %s (running or waiting), %s running, %zu "
                "waiting for a slot; "
                "output files %zu, bytes %s; environments your calls built %zu, bytes %s",
                principal, calls, running, ex.queued, files, art, n_envs, envs);
  json_t *o =
      json_pack("{s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "principal",
                principal, "executions", "calls", (json_int_t)ex.calls, "calls_max",
                (json_int_t)cfg->max_token_concurrent, "running", (json_int_t)ex.running,
                "running_max", (json_int_t)cfg->max_token_running, "queued", (json_int_t)ex.queued,
                "artifacts", "files", (json_int_t)files, "bytes", (json_int_t)bytes, "bytes_max",
                (json_int_t)cfg->max_artifact_bytes_per_token, "store_bytes_max",
                (json_int_t)cfg->max_artifact_store_bytes);
  json_object_set_new(
      o, "environments",
      json_pack("{s:I, s:I, s:I, s:I}", "count", (json_int_t)n_envs, "bytes", (json_int_t)env_bytes,
                "bytes_max", (json_int_t)cfg->max_cache_bytes_per_token, "store_bytes_max",
                (json_int_t)cfg->max_cache_bytes));
  /* Each of them (evict_environment removes one). */
  json_object_set_new(json_object_get(o, "environments"), "items",
                      env_store_list(srv_server_envs(s), principal));
  if (http) {
    cleanup_free char *sessions = of_cap(hu.sessions, cfg->max_sessions_per_token);
    cleanup_free char *streams = of_cap(hu.streams, cfg->max_streams_per_token);
    cm_buf_printf(
        t, "; HTTP sessions %s, GET streams %s, replay memory %zu bytes, unread answers %zu bytes",
        sessions, streams, hu.replay_bytes, hu.unread_bytes);
    json_object_set_new(
        o, "http",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "sessions",
                  (json_int_t)hu.sessions, "sessions_max", (json_int_t)cfg->max_sessions_per_token,
                  "streams", (json_int_t)hu.streams, "streams_max",
                  (json_int_t)cfg->max_streams_per_token, "replay_bytes",
                  (json_int_t)hu.replay_bytes, "replay_bytes_max_per_session",
                  (json_int_t)cfg->max_replay_bytes_per_session, "replay_bytes_max",
                  (json_int_t)cfg->max_replay_bytes, "unread_bytes", (json_int_t)hu.unread_bytes,
                  "unread_bytes_max", (json_int_t)cfg->max_unread_bytes_per_token));
  }
  cm_buf_appends(t, "\n");
  return o;
}

/* Which interpreter sees the system's own packages (apt's python3-numpy and friends, in
 * /usr/lib/python3/dist-packages): the system's, whose prefix is /usr; a pyenv or uv Python of
 * the same minor version does not, and the newest match wins a python_version. */
static void system_packages_line(cm_buf_t *t, py_interp_t *const *pys, size_t n_py) {
  struct stat st;
  if (stat("/usr/lib/python3/dist-packages", &st) < 0 || !S_ISDIR(st.st_mode)) return;
  const py_interp_t *sys_py = NULL;
  for (size_t i = 0; i < n_py && !sys_py; i++)
    if (pys[i]->ok && pys[i]->prefix && strcmp(pys[i]->prefix, "/usr") == 0) sys_py = pys[i];
  if (!sys_py) {
    cm_buf_appends(t,
                   "System packages (/usr/lib/python3/dist-packages): no system interpreter found, "
                   "so no call sees them\n");
    return;
  }
  cm_buf_printf(t,
                "System packages (/usr/lib/python3/dist-packages, e.g. apt's python3-numpy): only "
                "%s %s (%s) sees them%s; choose it per call with python_version \"%s\", or for "
                "every call with --python %s\n",
                sys_py->implementation, sys_py->version, sys_py->executable,
                sys_py->is_default ? " (the default)" : ", not the default", sys_py->version,
                sys_py->executable);
}

json_t *srv_tool_check_environment_describe(srv_server_t *s) {
  (void)s;
  /* (its structuredContent declared, briefly: the list is in every agent's context) */
  return json_pack("{s:s, s:s, s:s, s:{s:s}, s:{s:s}, s:{s:b}}", "name", "check_environment",
                   "title", "Check the sandbox", "description",
                   "The Python versions, sandbox, network policy, limits and your cached "
                   "environments.",
                   "inputSchema", "type", "object", "outputSchema", "type", "object", "annotations",
                   "readOnlyHint", 1);
}

typedef struct env_call {
  srv_request_t *req;
  void *wait;
} env_call_t;

static void check_environment_ready(void *data, py_interp_t *py, const cm_error_t *error) {
  env_call_t *c = data;
  srv_request_t *r = c->req;
  free(c);
  srv_server_t *s = srv_request_server(r);
  const srv_config_t *cfg = srv_server_config(s);
  sbx_backend_t *b = srv_server_backend(s);
  struct utsname u;
  if (uname(&u) < 0) strcpy(u.sysname, "unknown"), strcpy(u.machine, "unknown");
  cleanup_free char *uv = cm_find_executable(cfg->uv_path);
  /* The probe runs in the background after start-up: until it is done, say so. */
  bool probing = !srv_server_probed(s);
  cleanup_free char *described = sbx_backend_describe(b);
  cleanup_free char *status = probing ? xasprintf("%s: probing", described) : xstrdup(described);
  cleanup_free char *mem = human_size(cfg->memory_bytes);
  cleanup_free char *fsize = human_size(cfg->file_size_bytes);
  cleanup_free char *tmp = human_size(cfg->tmp_bytes);
  cleanup_free char *cpu =
      cfg->cpu_seconds ? xasprintf("%llus", (unsigned long long)cfg->cpu_seconds) : xstrdup("none");
  /* Where an image runs the scripts (docker, podman), its interpreter is the one to report. */
  sbx_interp_t interp = {py ? py->version : "", py ? py->executable : "",
                         py ? py->implementation : ""};
  bool in_image = py && !probing && sbx_backend_interpreter(b, py->executable, &interp);
  cleanup_free char *pyver =
      py ? xstrdup(interp.version)
         : xasprintf("unavailable (%s)", error ? cm_error_message(error) : "unknown");
  cm_buf_t t;
  cm_buf_init(&t, 0);
  /* The seed's nine lines first, with the same labels. */
  cm_buf_printf(&t, "Python version: %s\n", pyver);
  cm_buf_printf(&t, "uv: %s\n", uv ? uv : "not found");
  cm_buf_printf(&t, "Platform: %s %s\n", u.sysname, u.machine);
  cm_buf_printf(&t, "Sandbox backend: %s\n", sbx_backend_name(b));
  cm_buf_printf(&t, "Sandbox status: %s\n", status);
  cm_buf_printf(&t, "Default timeout: %llus\n", (unsigned long long)cfg->default_timeout);
  cm_buf_printf(&t, "Max timeout: %llus\n", (unsigned long long)cfg->max_timeout);
  cm_buf_printf(&t, "Max output: %llu bytes\n", (unsigned long long)cfg->max_output_bytes);
  cm_buf_printf(&t, "Cache warming: %s\n", cfg->warm_cache ? "enabled" : "disabled");
  /* Then what the seed never said. */
  if (py)
    cm_buf_printf(&t, "Python interpreter: %s %s (%s%s)\n", interp.implementation, interp.version,
                  interp.path, in_image ? ", in the sandbox's image" : "");
  py_registry_t *reg = srv_server_pythons(s);
  size_t n_py;
  py_interp_t *const *pys = py_registry_list(reg, &n_py);
  cm_buf_printf(&t, "Interpreters (%zu; choose with python_version):\n", n_py);
  json_t *jpys = json_array();
  for (size_t i = 0; i < n_py; i++) {
    py_interp_t *p = pys[i];
    if (p->ok) {
      cm_buf_printf(&t, "  - %s %s%s%s (%s, from %s)%s\n", p->implementation, p->version,
                    p->free_threaded ? " free-threaded" : "", p->prerelease ? " pre-release" : "",
                    p->executable, p->source, p->is_default ? " [default]" : "");
      json_array_append_new(jpys, json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:b}", "version",
                                            p->version, "implementation", p->implementation, "path",
                                            p->executable, "source", p->source, "free_threaded",
                                            p->free_threaded, "default", p->is_default, "ok", 1));
    } else {
      cm_buf_printf(&t, "  - broken: %s (%s)\n", p->path, p->error ? p->error : "unknown");
      json_array_append_new(
          jpys, json_pack("{s:s, s:s, s:s, s:b}", "path", p->path, "source", p->source, "error",
                          p->error ? p->error : "unknown", "ok", 0));
    }
  }
  cm_buf_printf(&t, "Sandbox available: %s\n",
                probing        ? "probing (executions wait for the outcome)"
                : b->available ? "yes"
                               : "no (executions are refused; no fall back)");
  cm_buf_printf(&t, "Network: %s\n", !cfg->network ? "off" : cfg->network_host ? "host" : "on");
  json_t *net_obj = NULL;
  srv_network_describe(srv_server_network(s), cfg, b, &t, &net_obj);
  if (!cfg->offline)
    cm_buf_printf(&t, "Build network: %s\n",
                  sbx_backend_can_egress(b)
                      ? "each dependency build has a network namespace of its own and reaches only "
                        "the index hosts (plus --build-network-allow) through the egress proxy; "
                        "index credentials stay in the server, never in the build's environment "
                        "or files: the proxy adds them to reads (GET, HEAD without a body) below "
                        "the index URL's path and of the files the index's own pages linked to "
                        "(remembered, bounded), to nothing else on its host, and drops the index's "
                        "cookies from every response head"
                      : "not isolated by this backend (builds use its own network, and see the "
                        "index settings)");
  size_t n_envs;
  uint64_t env_bytes;
  env_store_stats(srv_server_envs(s), &n_envs, &env_bytes);
  cleanup_free char *env_size = human_size(env_bytes);
  cleanup_free char *env_max = human_size(cfg->max_cache_bytes);
  cm_buf_printf(&t, "Dependencies: %s; %zu cached environments (%s of %s)%s\n",
                env_store_installer(srv_server_envs(s)), n_envs, env_bytes ? env_size : "0",
                env_max,
                cfg->offline ? "; offline (no index: --find-links directories and the wheelhouse "
                               "only)"
                             : "");
  /* Said plainly: without pip (Debian's python3 without python3-pip) every dependency fails. */
  if (py && !in_image && env_store_pip_missing(srv_server_envs(s), py))
    cm_buf_printf(&t,
                  "Dependencies: not installable with the default interpreter (%s): it has no pip "
                  "and uv was not found. Install pip for it (Debian: apt-get install python3-pip) "
                  "or uv (--uv-path)\n",
                  py->executable);
  system_packages_line(&t, pys, n_py);
  bool isolating = sbx_backend_maps_paths(b);
  sbx_cgroups_t *cg = srv_server_cgroups(s);
  cleanup_free char *cg_text = sbx_cgroups_describe(cg);
  cleanup_free char *cpus =
      cfg->cpu_millis ? xasprintf("%llu.%03llu CPUs", (unsigned long long)(cfg->cpu_millis / 1000),
                                  (unsigned long long)(cfg->cpu_millis % 1000))
                      : xstrdup("no cap");
  /* docker's containers get the engine's cgroup limits, not ours. */
  bool cg_runs = sbx_cgroups_active(cg) && sbx_backend_host_processes(b);
  cm_buf_printf(&t,
                "Limits (enforced with rlimits in the sandboxed process; wall clock by the server, "
                "which kills the "
                "whole process tree): memory %s (RLIMIT_AS), CPU %s (RLIMIT_CPU), processes %llu "
                "(RLIMIT_NPROC%s), "
                "file size %s (RLIMIT_FSIZE), open files %llu (RLIMIT_NOFILE), /tmp %s (%s), kill "
                "grace %llums\n",
                mem, cpu, (unsigned long long)cfg->max_processes,
                isolating ? ", counted per run: each run has its own uid" : "", fsize,
                (unsigned long long)cfg->open_files, tmp,
                isolating ? "a size-capped tmpfs" : "not isolated: the host /tmp",
                (unsigned long long)cfg->kill_grace_ms);
  if (cg_runs)
    cm_buf_printf(&t,
                  "Cgroups: %s; each run has its own: memory %s for the whole process tree (%s), "
                  "processes %llu (%s), "
                  "CPU bandwidth %s (%s); peak memory is measured, and everything left in it is "
                  "killed at the end\n",
                  cg_text, mem,
                  sbx_cgroups_has(cg, "memory") ? "OOM kill" : "not enforced: no memory controller",
                  (unsigned long long)cfg->max_processes,
                  sbx_cgroups_has(cg, "pids") ? "pids.max" : "not enforced: no pids controller",
                  cpus, sbx_cgroups_has(cg, "cpu") ? "cpu.max" : "not enforced: no cpu controller");
  else
    cm_buf_printf(&t, "Cgroups: %s\n",
                  sbx_cgroups_active(cg) ? "not used for docker (the container's own limits apply)"
                                         : cg_text);
  /* What a dependency build (or a dry-run resolution) may write and hold. */
  cleanup_free char *build_bytes = human_size(cfg->max_build_bytes);
  bool own_uid = isolating && geteuid() == 0 && strcmp(sbx_backend_name(b), "bwrap") == 0;
  cm_buf_printf(
      &t,
      "Dependency builds: %s%s%s; each writes only a space of its own, %s %s (--max-build-bytes); "
      "each step may take %llus (--build-timeout); at most %llu dry-run resolutions at once\n",
      isolating ? "in the sandbox"
                : "not isolated by this backend (package code runs with the server's rights)",
      own_uid ? ", as a uid of its own" : "", cg_runs ? ", a cgroup per step" : "",
      geteuid() == 0 ? "a tmpfs capped at"
                     : "a plain directory (its total is not capped: needs root), each file up to",
      build_bytes, (unsigned long long)(cfg->build_timeout_ms / 1000),
      (unsigned long long)cfg->max_concurrent);
  cleanup_free char *work = human_size(cfg->work_bytes);
  cm_buf_printf(&t, "Work directory: %s\n",
                exec_workdir_capped(srv_server_exec(s), cfg->work_bytes)
                    ? "a size-capped tmpfs per run"
                    : "a plain directory per run (not size-capped: needs root)");
  if (exec_workdir_capped(srv_server_exec(s), cfg->work_bytes))
    cm_buf_printf(&t, "Work directory size: %s\n", work);
  if (cfg->profile) cm_buf_printf(&t, "Profile: %s\n", cfg->profile);
  cm_buf_printf(&t, "Concurrent executions: %llu\n", (unsigned long long)cfg->max_concurrent);
  json_t *share = tenant_share(r, &t);
  srv_session_t *rs = srv_request_session(r);
  const char *me = rs ? srv_session_principal(rs) : SRV_PRINCIPAL_STDIO;
  /* The secrets the caller may name (names and hosts, never a value). */
  cm_buf_t sec_text;
  cm_buf_init(&sec_text, 0);
  json_t *secrets_obj = srv_secrets_describe(cfg, me, &sec_text);
  if (json_array_size(secrets_obj))
    cm_buf_printf(&t,
                  "Secrets you may name in execute_python's 'secrets' (the script gets a "
                  "placeholder; the egress proxy puts the value into HTTPS requests to the "
                  "hosts only):\n%.*s\n",
                  (int)sec_text.len, sec_text.data ? sec_text.data : "");
  else
    cm_buf_appends(&t, cfg->n_secrets ? "Secrets: none for you\n"
                                      : "Secrets: none (an operator gives them with --secret)\n");
  cm_buf_release(&sec_text);
  uint64_t taken = 0;
  bool prestarting = exec_prestart_describe(srv_server_exec(s), &taken);
  /* The shapes kept for the caller (the commonest and its own last other one), never
   * another principal's: its interpreter, environment key and network are its own. */
  exec_prestart_counts_t pc;
  exec_prestart_counts(srv_server_exec(s), me, &pc);
  if (prestarting)
    cm_buf_printf(&t,
                  "Prestarted sandbox: on (%zu per shape, up to %zu under bursts, for the "
                  "commonest call and for your last other one; %zu ready for you, %zu of them "
                  "with the interpreter up; %llu calls took one, %llu of them an interpreter)\n",
                  pc.per_shape, pc.max_per_shape, pc.ready, pc.ready_interpreters,
                  (unsigned long long)pc.taken, (unsigned long long)pc.taken_interpreter);
  else
    cm_buf_printf(&t, "Prestarted sandbox: %s\n",
                  !cfg->prestart
                      ? "off (--prestart off)"
                      : "off (the backend cannot hold a sandbox, or prestarting failed)");
  json_t *prestart_obj = json_pack(
      "{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "on", prestarting, "per_shape",
      (json_int_t)pc.per_shape, "max_per_shape", (json_int_t)pc.max_per_shape, "other_shapes_max",
      (json_int_t)pc.other_shapes_max, "ready", (json_int_t)pc.ready, "ready_interpreters",
      (json_int_t)pc.ready_interpreters, "taken", (json_int_t)pc.taken, "taken_interpreter",
      (json_int_t)pc.taken_interpreter, "failed", (json_int_t)pc.failed, "shapes",
      exec_prestart_shapes(srv_server_exec(s), me));
  /* Sessions: the caller's own and the server's caps (never another principal's ids). */
  size_t my_sessions, all_sessions;
  exec_sessions_count(srv_server_exec(s), me, &my_sessions, &all_sessions);
  const char *no_sessions;
  bool sessions_on = exec_sessions_available(srv_server_exec(s), &no_sessions);
  json_t *my_list = exec_sessions_list(srv_server_exec(s), me);
  size_t frozen = 0, k;
  json_t *one;
  json_array_foreach(my_list, k, one) frozen += json_is_true(json_object_get(one, "kernel_frozen"));
  if (sessions_on)
    cm_buf_printf(&t,
                  "Sessions: %zu of yours, %zu frozen between calls (at most %llu per principal, "
                  "%llu in all; closed after %llu s idle, %llu s after start)\n",
                  my_sessions, frozen, (unsigned long long)cfg->max_exec_sessions_per_token,
                  (unsigned long long)cfg->max_exec_sessions,
                  (unsigned long long)(cfg->exec_session_idle_ms / 1000),
                  (unsigned long long)(cfg->exec_session_max_ms / 1000));
  else
    cm_buf_printf(&t, "Sessions: off (%s)\n", no_sessions);
  json_t *sessions_obj =
      json_pack("{s:b, s:o, s:I, s:I, s:I, s:I}", "available", sessions_on, "yours", my_list,
                "max_per_principal", (json_int_t)cfg->max_exec_sessions_per_token, "max",
                (json_int_t)cfg->max_exec_sessions, "idle_seconds",
                (json_int_t)(cfg->exec_session_idle_ms / 1000), "max_seconds",
                (json_int_t)(cfg->exec_session_max_ms / 1000));
  cm_buf_t files;
  cm_buf_init(&files, 0);
  json_t *files_obj = NULL;
  srv_describe_installation(&files, &files_obj);
  cleanup_free char *files_text = cm_buf_steal(&files);
  for (char *p = files_text; (p = strchr(p, '\n')) && p[1]; p++) *p = ';';
  if (*files_text) files_text[strlen(files_text) - 1] = '\0';
  cm_buf_printf(&t, "Server files: %s\n", files_text);
  cm_buf_printf(&t, "Server: %s %s", SRV_NAME, srv_version());
  cleanup_free char *platform = xasprintf("%s %s", u.sysname, u.machine);
  json_t *sc = json_pack(
      "{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:I, s:I, s:I, s:b, s:s}", "python_version",
      interp.version, "python_path", interp.path, "uv", uv ? uv : "", "platform", platform,
      "sandbox_backend", sbx_backend_name(b), "sandbox_status", status, "sandbox_available",
      !probing && b->available, "default_timeout", (json_int_t)cfg->default_timeout, "max_timeout",
      (json_int_t)cfg->max_timeout, "max_output_bytes", (json_int_t)cfg->max_output_bytes,
      "network", cfg->network, "server_version", srv_version());
  json_object_set_new(sc, "interpreters", jpys);
  json_object_set_new(sc, "network_policy", net_obj ? net_obj : json_null());
  json_object_set_new(sc, "tenant", share);
  /* The caller's own last runs (never another principal's). */
  json_object_set_new(sc, "recent_calls", srv_recent_json(s, me));
  json_object_set_new(sc, "sandbox_probing", json_boolean(probing));
  json_object_set_new(sc, "server_files", files_obj);
  json_object_set_new(sc, "sessions", sessions_obj);
  json_object_set_new(sc, "prestart", prestart_obj);
  json_object_set_new(sc, "secrets", secrets_obj);
  json_object_set_new(sc, "cgroups",
                      json_pack("{s:b, s:s}", "active", cg_runs, "description", cg_text));
  cleanup_free char *text = cm_buf_steal(&t);
  json_t *result = srv_tool_text_result(text, false);
  json_object_set_new(result, "structuredContent", sc);
  srv_request_finish(r, result);
}

static void check_environment_cancel(void *data) {
  env_call_t *c = data;
  py_registry_cancel_wait(srv_server_pythons(srv_request_server(c->req)), c->wait);
  srv_request_t *r = c->req;
  free(c);
  srv_request_finish(r, json_object());
}

void srv_tool_check_environment(srv_request_t *r, json_t *args) {
  if (json_object_size(args) > 0) {
    srv_request_finish(r, srv_tool_error_result("check_environment takes no arguments"));
    return;
  }
  env_call_t *c = xcalloc(1, sizeof *c);
  c->req = r;
  srv_request_on_cancel(r, check_environment_cancel, c);
  c->wait =
      py_registry_when_ready(srv_server_pythons(srv_request_server(r)), check_environment_ready, c);
}

/* ---------------------------------------------------------------- the table */
