/* A run's sandbox: what a run spec and the server's flags become for sandbox/ (argv, the
 * environment, mounts, the network and the limits: sbx_limits_t, which sandbox/ turns into
 * rlimits and cgroup values). */
#include <sys/stat.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

#define EXEC_KERNEL_NAME "kernel.py"

/* A script run, with ctl_dir a session's kernel (see exec_sandbox_start_kernel), or with
 * warm_ctl a prestarted interpreter (exec_sandbox_start_warm). */
static int sandbox_start(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                         const char *workdir, uint64_t timeout_ms, bool hold, const char *ctl_dir,
                         const char *warm_ctl, sbx_identity_t *identity,
                         const srv_secret_call_t *secrets, const sbx_run_callbacks_t *cbs,
                         void *data, sbx_run_t **out, eg_session_t **egress_out, cm_error_t *err) {
  srv_server_t *s = x->server;
  const srv_config_t *cfg = srv_server_config(s);
  /* Through the start-up runner when there is one (it saves open matplotlib figures;
   * profiles/runner.py), mounted read-only where the backend maps paths. */
  sbx_backend_t *backend = srv_server_backend(s);
  const char *runner = exec_runner_path(x);
  *egress_out = NULL;
  if (warm_ctl && !runner)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "a prestarted interpreter needs the start-up runner");
  /* A kernel lives next to the runner, in source form (it is started once a session). */
  cleanup_free char *kernel = NULL;
  if (ctl_dir) {
    struct stat st;
    if (runner)
      kernel = xasprintf("%.*s/" EXEC_KERNEL_NAME, (int)(strrchr(runner, '/') - runner), runner);
    if (!kernel || stat(kernel, &st) < 0 || !S_ISREG(st.st_mode))
      return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                          "the session kernel (" EXEC_KERNEL_NAME
                          ", installed next to the start-up runner) was not found");
  }
  /* Only where the host's interpreter runs it (not docker's image). */
  const char *pyc = runner && !ctl_dir && sbx_backend_host_processes(backend)
                        ? exec_runner_pyc_for(x, py, runner)
                        : NULL;
  cleanup_free char *pyc_dir = pyc ? exec_runner_pyc_dir(x) : NULL;
  cleanup_free char *runner_dir = pyc ? xstrdup(pyc_dir)
                                  : runner
                                      ? xstrndup(runner, (size_t)(strrchr(runner, '/') - runner))
                                      : NULL;
  bool maps = sbx_backend_maps_paths(backend);
  cleanup_free char *runner_arg =
      !runner ? NULL
      : pyc   ? (maps ? xasprintf(EXEC_RUNNER_TARGET "/%s", pyc) : xasprintf("%s/%s", pyc_dir, pyc))
              : (maps ? xasprintf(EXEC_RUNNER_TARGET "%s", strrchr(runner, '/')) : xstrdup(runner));
  char *python = env ? env->python : py->executable;
  char *argv_plain[] = {python, "-s", "script.py", NULL};
  char *argv_runner[] = {python, "-s", runner_arg, "script.py", NULL};
  /* The FIFO's sandbox path, after the runner's "script.py" (a placeholder: the go names the
   * script), so the command line reads as a run's up to there; "--mps-warm" is also the
   * marker the tests' leak checks look for. */
  cleanup_free char *go_arg =
      warm_ctl ? xasprintf("%s/go", maps ? EXEC_KERNEL_CTL_TARGET : warm_ctl) : NULL;
  char *argv_warm[] = {python, "-s", runner_arg, "script.py", "--mps-warm", go_arg, NULL};
  cleanup_free char *kernel_arg = !kernel ? NULL
                                  : maps  ? xstrdup(EXEC_RUNNER_TARGET "/" EXEC_KERNEL_NAME)
                                          : xstrdup(kernel);
  cleanup_free char *ctl_arg = ctl_dir ? xstrdup(maps ? EXEC_KERNEL_CTL_TARGET : ctl_dir) : NULL;
  char *argv_kernel[] = {python, "-s", kernel_arg, ctl_arg, NULL};
  char **argv = kernel ? argv_kernel : warm_ctl ? argv_warm : runner ? argv_runner : argv_plain;
  /* With an environment, its bin/ comes first (console scripts) and VIRTUAL_ENV names it. */
  const char *env_root = env ? (env->mount_target ? env->mount_target : env->host_dir) : NULL;
  cleanup_free char *path_var =
      env_root ? xasprintf("PATH=%s/bin:/usr/local/bin:/usr/bin:/bin", env_root)
               : xstrdup("PATH=/usr/local/bin:/usr/bin:/bin");
  cleanup_free char *venv_var = env_root ? xasprintf("VIRTUAL_ENV=%s", env_root) : NULL;
  /* With the network on, a namespace of its own whose one way out is the egress proxy
   * (server/net/net.h), unless the operator chose the host's (--network host).  A held one
   * (prestarted) has no way out at all until its call's go (job.c): what its interpreter's
   * set-up (site, every .pth of its environment) opens then waits, and is closed at the go. */
  int egress_fd = -1;
  bool proxied = network && srv_network_proxied(cfg, backend);
  if (proxied) {
    eg_proxy_t *proxy = srv_network_proxy(srv_server_network(s), err);
    unsigned flags = hold || warm_ctl ? EG_SESSION_HELD : 0;
    eg_session_t *session =
        proxy ? eg_session_new(proxy, srv_network_script_policy(srv_server_network(s)), flags,
                               &egress_fd, err)
              : NULL;
    if (!session) return cm_error_wrap(err, "the network of the sandbox (the egress proxy)");
    /* Before the loop runs again, so before any connection of the script reaches the proxy. */
    if (secrets && secrets->n) srv_secrets_bind(srv_server_network(s), cfg, secrets, session);
    *egress_out = session;
  }
  sbx_egress_t egress = {.fd = egress_fd, .port = EG_SANDBOX_PORT};
  cm_strv_builder_t envb = {0};
  cm_strv_addv(&envb, path_var, "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1",
               "PYTHONDONTWRITEBYTECODE=1", "PYTHONIOENCODING=utf-8", "MPLBACKEND=Agg", NULL);
  if (venv_var) cm_strv_add(&envb, venv_var);
  if (proxied) srv_network_env(srv_server_network(s), &envb, false);
  /* Placeholders only: the values stay with the proxy; and trust in its CA, which signs what
   * it shows for the secrets' hosts. */
  const char *ca_bundle = NULL;
  if (proxied && secrets && secrets->n) {
    srv_secrets_env(cfg, secrets, &envb);
    srv_secrets_ca_env(&envb);
    ca_bundle = srv_network_ca_bundle(srv_server_network(s), srv_server_state_dir(s), err);
    if (!ca_bundle) {
      cm_strv_free(cm_strv_steal(&envb));
      if (egress_fd >= 0) close(egress_fd);
      eg_session_close(*egress_out);
      *egress_out = NULL;
      return cm_error_wrap(err, "the CA bundle of a call with secrets");
    }
  }
  cleanup_strv char **envp = cm_strv_steal(&envb);
  char *binds[] = {py->prefix, NULL};
  sbx_mount_t mounts[3];
  size_t n_mounts = 0;
  if (env && env->mount_target)
    mounts[n_mounts++] = (sbx_mount_t){.host = env->host_dir, .target = env->mount_target};
  if (runner && maps)
    mounts[n_mounts++] = (sbx_mount_t){.host = runner_dir, .target = EXEC_RUNNER_TARGET};
  if ((ctl_dir || warm_ctl) && maps)
    mounts[n_mounts++] =
        (sbx_mount_t){.host = ctl_dir ? ctl_dir : warm_ctl, .target = EXEC_KERNEL_CTL_TARGET};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = workdir,
      .ro_binds = binds,
      .mounts = mounts,
      .n_mounts = n_mounts,
      .network = network,
      .egress = proxied ? &egress : NULL,
      .ca_bundle = ca_bundle,
      .hold = hold || warm_ctl,
      .hold_in_command = warm_ctl != NULL,
      .identity = identity,
      .limits =
          {
              .timeout_ms = timeout_ms,
              .grace_ms = cfg->kill_grace_ms,
              .memory_bytes = cfg->memory_bytes,
              /* A kernel's CPU time adds up over its calls: its calls have timeouts of
               * their own, and the cgroup's CPU bandwidth still applies. */
              .cpu_seconds = ctl_dir ? 0 : cfg->cpu_seconds,
              .max_processes = cfg->max_processes,
              .file_size_bytes = cfg->file_size_bytes,
              .open_files = cfg->open_files,
              .tmp_bytes = cfg->tmp_bytes,
              .cpu_millis = cfg->cpu_millis,
              /* A kernel is frozen between its calls (session.c). */
              .freezable = ctl_dir != NULL,
          },
  };
  int rc = sbx_run_start(srv_server_loop(s), backend, &spec, cbs, data, out, err);
  if (egress_fd >= 0) close(egress_fd); /* the sandbox has its own copy */
  if (rc < 0) {
    eg_session_close(*egress_out);
    *egress_out = NULL;
  }
  return rc;
}

int exec_sandbox_start(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                       const char *workdir, uint64_t timeout_ms, bool hold,
                       const srv_secret_call_t *secrets, const sbx_run_callbacks_t *cbs, void *data,
                       sbx_run_t **out, eg_session_t **egress_out, cm_error_t *err) {
  return sandbox_start(x, py, env, network, workdir, timeout_ms, hold, NULL, NULL, NULL, secrets,
                       cbs, data, out, egress_out, err);
}

int exec_sandbox_start_warm(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                            const char *workdir, const char *ctl_dir,
                            const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out,
                            eg_session_t **egress_out, cm_error_t *err) {
  return sandbox_start(x, py, env, network, workdir, 0, true, NULL, ctl_dir, NULL, NULL, cbs, data,
                       out, egress_out, err);
}

int exec_sandbox_start_kernel(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                              const char *workdir, const char *ctl_dir, sbx_identity_t *identity,
                              const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out,
                              eg_session_t **egress_out, cm_error_t *err) {
  return sandbox_start(x, py, env, network, workdir, 0, false, ctl_dir, NULL, identity, NULL, cbs,
                       data, out, egress_out, err);
}
