/* Installer runs (a build's steps, the warm-up, a dry-run resolution): the index settings,
 * the builds' network and the sandbox they run in. */
#include <stdio.h>
#include <sys/statvfs.h>

#include "envstore/envstore-internal.h"

extern char **environ;

static char **split_spaces(const char *s) {
  size_t n = 0, cap = 4;
  char **v = xcalloc(cap + 1, sizeof *v);
  if (!s) return v;
  cleanup_free char *copy = xstrdup(s);
  char *save = NULL;
  for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    if (n == cap) {
      cap *= 2;
      v = xrealloc(v, (cap + 1) * sizeof *v);
    }
    v[n++] = xstrdup(t);
    v[n] = NULL;
  }
  return v;
}

/* ---------------------------------------------------------------- index settings and builds'
 * network */

/* The installers' own index variables of the server's environment: index settings, read
 * by the server (a flag wins), never handed to a sandbox that can keep them out. */
static const char *const index_env_vars[] = {
    "PIP_INDEX_URL=",      "UV_INDEX_URL=",   "PIP_EXTRA_INDEX_URL=",
    "UV_EXTRA_INDEX_URL=", "PIP_FIND_LINKS=", "UV_FIND_LINKS="};

static char **env_list(const char *a, const char *b) {
  const char *v = getenv(a);
  if (!v || !*v) v = getenv(b);
  return split_spaces(v && *v ? v : NULL);
}

void env_index_settings(env_store_t *s) {
  if (s->index_loaded) return;
  s->index_loaded = true;
  const env_options_t *cfg = &s->opts;
  const char *iu = cfg->index_url;
  if (!iu) iu = getenv("PIP_INDEX_URL");
  if (!iu || !*iu) iu = getenv("UV_INDEX_URL");
  s->index_url = iu && *iu ? xstrdup(iu) : NULL;
  /* A flag wins over the variables of the server's environment. */
  s->extra_index_urls = cfg->extra_index_urls && cfg->extra_index_urls[0]
                            ? cm_strv_dup(cfg->extra_index_urls)
                            : env_list("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL");
  s->find_links = cfg->find_links && cfg->find_links[0]
                      ? cm_strv_dup(cfg->find_links)
                      : env_list("PIP_FIND_LINKS", "UV_FIND_LINKS");
}

char *env_redacted_join(char *const *urls) {
  if (!urls || !urls[0]) return NULL;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (char *const *u = urls; *u; u++) {
    cleanup_free char *r = eg_url_redact(*u);
    if (b.len) cm_buf_appends(&b, " ");
    cm_buf_appends(&b, r);
  }
  return cm_buf_steal(&b);
}

void env_store_set_network(env_store_t *s, const env_network_t *net) {
  s->net = *net;
}

/* What a builder gets for url: the forwarder's mapping when it carries credentials (the
 * proxy adds them), else url itself. */
static char *builder_url(env_store_t *s, eg_proxy_t *p, const char *url) {
  eg_url_t u;
  if (eg_url_parse(url, strlen(url), &u) < 0) return xstrdup(url); /* a local directory */
  bool secret = u.user != NULL;
  eg_url_release(&u);
  if (!secret) return xstrdup(url);
  cm_error_t err = CM_ERROR_INIT;
  int n = eg_proxy_add_index(p, url, &err);
  if (n < 0) {
    cm_warn("index %s: %s", url, cm_error_message(&err));
    cm_error_release(&err);
    return NULL;
  }
  return eg_proxy_index_url(p, n);
}

static char **builder_urls(env_store_t *s, eg_proxy_t *p, char *const *urls) {
  cm_strv_builder_t b = {0};
  for (char *const *u = urls; u && *u; u++) {
    char *m = builder_url(s, p, *u);
    if (m) cm_strv_add(&b, m);
    free(m);
  }
  return cm_strv_steal(&b);
}

/* Whether builds go through the egress proxy (a backend with a namespace and a forwarder),
 * and their policy and URLs, once. */
static bool build_net_prepare(env_store_t *s) {
  if (s->build_net_prepared) return s->build_net_ok;
  s->build_net_prepared = true;
  env_index_settings(s);
  if (!s->net.proxy || !sbx_backend_can_egress(s->backend)) return false;
  cm_error_t err = CM_ERROR_INIT;
  eg_proxy_t *p = s->net.proxy(s->net.data, &err);
  cm_error_release(&err);
  /* Without a proxy a build on such a backend has no network at all (never the host's). */
  s->build_net_ok = true;
  eg_policy_t *bp = &s->build_policy;
  bp->public_internet = false;
  bp->closed_reason = "not an index host (allow it with --build-network-allow)";
  const eg_policy_t *deny = s->net.deny;
  for (size_t i = 0; deny && i < deny->n_deny; i++) eg_policy_add_deny(bp, &deny->deny[i]);
  if (s->index_url) {
    eg_policy_allow_url(bp, s->index_url);
  } else {
    /* The installers' default index and its file host. */
    eg_policy_allow_url(bp, "https://pypi.org/simple");
    eg_policy_allow_url(bp, "https://files.pythonhosted.org/");
  }
  for (char **u = s->extra_index_urls; u && *u; u++) eg_policy_allow_url(bp, *u);
  for (char **u = s->find_links; u && *u; u++) eg_policy_allow_url(bp, *u);
  for (char *const *r = s->opts.build_network_allow; r && *r; r++) {
    eg_rule_t rule;
    if (eg_rule_parse(*r, strlen(*r), &rule, &err) == 0) eg_policy_add_allow(bp, &rule);
    cm_error_release(&err);
  }
  if (p) {
    s->b_index_url = s->index_url ? builder_url(s, p, s->index_url) : NULL;
    s->b_extra_index_urls = builder_urls(s, p, s->extra_index_urls);
    s->b_find_links = builder_urls(s, p, s->find_links);
  }
  return true;
}

void env_index_args(env_store_t *s, bool uv, bool wheelhouse, cm_strv_builder_t *a) {
  const env_options_t *cfg = &s->opts;
  if (cfg->offline) {
    /* No index, and none of the index variables of the server's environment (installer_env
     * keeps them out): the local directories of the effective --find-links (the flag's, else
     * PIP_FIND_LINKS / UV_FIND_LINKS), which installer_binds mounts, and the wheelhouse. */
    env_index_settings(s);
    cm_strv_add(a, uv ? "--offline" : "--no-index");
    for (char *const *l = s->find_links; l && *l; l++) {
      if ((*l)[0] != '/') continue;
      cm_strv_add(a, "--find-links");
      cm_strv_add(a, *l);
    }
    if (wheelhouse && s->wheels_fd >= 0) {
      cm_strv_add(a, "--find-links");
      cm_strv_add(a, env_backend_maps(s) ? ENV_WHEELS_TARGET : s->wheels_dir);
    }
    return;
  }
  /* Through the proxy: the effective settings, credentials mapped.  Otherwise (a backend
   * that cannot keep them out) the flags, and the environment's variables pass as they are. */
  bool proxied = build_net_prepare(s);
  const char *index_url = proxied ? s->b_index_url : cfg->index_url;
  char *const *extra = proxied ? s->b_extra_index_urls : cfg->extra_index_urls;
  char *const *links = proxied ? s->b_find_links : cfg->find_links;
  if (index_url) {
    cm_strv_add(a, "--index-url");
    cm_strv_add(a, index_url);
  }
  for (char *const *e = extra; e && *e; e++) {
    cm_strv_add(a, "--extra-index-url");
    cm_strv_add(a, *e);
  }
  for (char *const *l = links; l && *l; l++) {
    cm_strv_add(a, "--find-links");
    cm_strv_add(a, *l);
  }
  if (wheelhouse && s->wheels_fd >= 0) {
    /* The server's own wheelhouse (binary wheels the warm-up downloaded), read-only. */
    cm_strv_add(a, "--find-links");
    cm_strv_add(a, env_backend_maps(s) ? ENV_WHEELS_TARGET : s->wheels_dir);
  }
}

/* The environment of installer runs: PATH and locale, the space's private cache and /tmp,
 * harmless settings of the installers from the server's environment (an allowlist: nothing
 * else of PIP_* / UV_*, whose variables may hold index credentials, tokens or keyring
 * settings), and the proxy.  Package code runs in a build (setup.py, build backends), so
 * nothing secret may be here. */
static void installer_env(env_store_t *s, const env_space_t *sp, bool proxied,
                          cm_strv_builder_t *env) {
  bool maps = env_backend_maps(s);
  const char *cache = maps ? ENV_CACHE_TARGET : sp->cache;
  const char *tmp = maps ? "/tmp" : sp->tmp;
  cm_strv_add(env, "PATH=/usr/local/bin:/usr/bin:/bin");
  cm_strv_add(env, "LANG=C.UTF-8");
  cm_strv_addf(env, "HOME=%s", tmp);
  cm_strv_addf(env, "TMPDIR=%s", tmp);
  cm_strv_add(env, "PYTHONDONTWRITEBYTECODE=1");
  cm_strv_add(env, "PIP_DISABLE_PIP_VERSION_CHECK=1");
  cm_strv_add(env, "PIP_NO_INPUT=1");
  cm_strv_add(env, "PIP_PROGRESS_BAR=off");
  cm_strv_addf(env, "PIP_CACHE_DIR=%s/pip", cache);
  cm_strv_addf(env, "UV_CACHE_DIR=%s/uv", cache);
  cm_strv_add(env, "UV_NO_PROGRESS=1");
  static const char *const harmless[] = {
      "PIP_DEFAULT_TIMEOUT=",
      "PIP_TIMEOUT=",
      "PIP_RETRIES=",
      "PIP_PREFER_BINARY=",
      "PIP_ONLY_BINARY=",
      "PIP_NO_BINARY=",
      "PIP_PRE=",
      "PIP_TRUSTED_HOST=",
      "UV_HTTP_TIMEOUT=",
      "UV_CONCURRENT_DOWNLOADS=",
      "UV_CONCURRENT_BUILDS=",
      "UV_CONCURRENT_INSTALLS=",
      "UV_PRERELEASE=",
      "UV_RESOLUTION=",
      "UV_INDEX_STRATEGY=",
      "UV_NATIVE_TLS=",
      "SSL_CERT_FILE=",
      "SSL_CERT_DIR=",
      "REQUESTS_CA_BUNDLE=",
  };
  static const char *const host_proxy[] = {
      "HTTP_PROXY=", "HTTPS_PROXY=", "NO_PROXY=", "http_proxy=", "https_proxy=", "no_proxy="};
  for (char **e = environ; *e; e++) {
    for (size_t i = 0; i < CM_ARRAY_SIZE(harmless); i++)
      if (!strncmp(*e, harmless[i], strlen(harmless[i]))) cm_strv_add(env, *e);
    /* Offline: no index and no network, so nothing of the host's index or proxy settings
     * (env_index_args passes the effective local --find-links as flags). */
    if (proxied || s->opts.offline) continue;
    /* A backend without the proxy: the host's proxy settings, and the index variables as
     * before (it cannot keep them from the installer's processes anyway). */
    for (size_t i = 0; i < CM_ARRAY_SIZE(host_proxy); i++)
      if (!strncmp(*e, host_proxy[i], strlen(host_proxy[i]))) cm_strv_add(env, *e);
    for (size_t i = 0; i < CM_ARRAY_SIZE(index_env_vars); i++)
      if (!strncmp(*e, index_env_vars[i], strlen(index_env_vars[i]))) cm_strv_add(env, *e);
  }
  if (proxied) eg_proxy_env(env);
}

/* An installer run with a proxy session: the session lives as long as the run. */
typedef struct installer_net {
  env_store_t *store;
  eg_session_t *session;
  sbx_run_callbacks_t cbs;
  void *data;
  struct installer_net *next;
} installer_net_t;

static void installer_net_unlink(installer_net_t *n) {
  for (installer_net_t **l = &n->store->nets; *l; l = &(*l)->next)
    if (*l == n) {
      *l = n->next;
      break;
    }
}

static void installer_net_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  installer_net_t *n = data;
  if (n->cbs.on_output) n->cbs.on_output(n->data, stream, buf, len);
}

static void installer_net_exit(void *data, const sbx_result_t *res) {
  installer_net_t *n = data;
  eg_session_close(n->session);
  installer_net_unlink(n);
  sbx_run_callbacks_t cbs = n->cbs;
  void *d = n->data;
  free(n);
  if (cbs.on_exit) cbs.on_exit(d, res);
}

void env_installer_release(env_store_t *s) {
  while (s->nets) {
    installer_net_t *n = s->nets;
    s->nets = n->next;
    eg_session_close(n->session);
    free(n);
  }
  free(s->index_url);
  cm_strv_free(s->extra_index_urls);
  cm_strv_free(s->find_links);
  free(s->b_index_url);
  cm_strv_free(s->b_extra_index_urls);
  cm_strv_free(s->b_find_links);
  eg_policy_release(&s->build_policy);
}

/* Read-only in installer runs: the interpreter's prefix, local wheel directories (of the
 * effective --find-links: the flag's, else PIP_FIND_LINKS / UV_FIND_LINKS of the server's
 * environment), uv. */
static void installer_binds(env_store_t *s, const char *prefix, cm_strv_builder_t *binds) {
  env_index_settings(s);
  cm_strv_add(binds, prefix);
  for (char *const *l = s->find_links; l && *l; l++)
    if ((*l)[0] == '/') cm_strv_add(binds, *l);
  if (s->uv) cm_strv_add(binds, s->uv);
}

/* Starts one installer run (a build step, a warm-up, a dry-run resolution) in the sandbox:
 * network per --offline (through the egress proxy, allowed the index hosts only, where the
 * backend can), as identity (NULL: a fresh one), writing only its space (the work
 * directory, the private cache at /cache, /tmp and, for a build, the environment at /env),
 * with the wheelhouse read-only at /wheels. */
int env_start_installer_run(env_store_t *s, const char *prefix, char **argv, const env_space_t *sp,
                            const sbx_identity_t *identity, const sbx_run_callbacks_t *cbs,
                            void *data, sbx_run_t **run, cm_error_t *err) {
  const env_options_t *cfg = &s->opts;
  bool proxied = !cfg->offline && build_net_prepare(s);
  eg_proxy_t *proxy = proxied ? s->net.proxy(s->net.data, err) : NULL;
  if (proxied && !proxy) return cm_error_wrap(err, "the build's network (the egress proxy)");
  int sandbox_fd = -1;
  installer_net_t *net = NULL;
  if (proxied) {
    net = xcalloc(1, sizeof *net);
    net->session = eg_session_new(proxy, &s->build_policy, EG_SESSION_INDEX, &sandbox_fd, err);
    if (!net->session) {
      free(net);
      return cm_error_wrap(err, "the build's network");
    }
    net->store = s;
    net->cbs = *cbs;
    net->data = data;
  }
  sbx_egress_t egress = {.fd = sandbox_fd, .port = EG_SANDBOX_PORT};
  sbx_run_callbacks_t net_cbs = {.on_output = installer_net_output, .on_exit = installer_net_exit};
  cm_strv_builder_t env = {0};
  installer_env(s, sp, proxied, &env);
  cm_strv_builder_t binds = {0};
  installer_binds(s, prefix, &binds);
  sbx_mount_t mounts[4];
  size_t n_mounts = 0;
  mounts[n_mounts++] =
      (sbx_mount_t){.host = sp->cache, .target = ENV_CACHE_TARGET, .writable = true};
  mounts[n_mounts++] = (sbx_mount_t){.host = sp->tmp, .target = "/tmp", .writable = true};
  if (sp->env)
    mounts[n_mounts++] = (sbx_mount_t){.host = sp->env, .target = ENV_TARGET, .writable = true};
  if (s->wheels_fd >= 0)
    mounts[n_mounts++] =
        (sbx_mount_t){.host = s->wheels_dir, .target = ENV_WHEELS_TARGET, .writable = false};
  /* On its tmpfs, what a build writes is memory its cgroup is charged for: the memory limit
   * leaves room for a full space on top of the installer's own.  What earlier steps wrote
   * there is memory already (charged to their cgroups, gone with them): only the rest of the
   * space is room, so that a build never holds more than the installer's own and one space. */
  uint64_t memory = CM_MAX(cfg->memory_bytes, 4ull << 30);
  struct statvfs v;
  if (sp->mounted) {
    uint64_t used = fstatvfs(sp->fd, &v) == 0 ? (uint64_t)(v.f_blocks - v.f_bfree) * v.f_frsize : 0;
    memory += cfg->max_build_bytes - CM_MIN(used, cfg->max_build_bytes);
  }
  sbx_spec_t spec = {
      .argv = argv,
      .envp = env.v,
      .workdir = sp->work,
      .ro_binds = binds.v,
      .mounts = mounts,
      .n_mounts = env_backend_maps(s) ? n_mounts : 0,
      .network = !cfg->offline,
      .egress = proxied ? &egress : NULL,
      .identity = identity,
      .limits =
          {
              .timeout_ms = cfg->build_timeout_ms,
              .grace_ms = cfg->kill_grace_ms,
              .memory_bytes = memory,
              .max_processes = CM_MAX(cfg->max_processes, 512),
              .file_size_bytes = cfg->max_build_bytes,
              .open_files = CM_MAX(cfg->open_files, 4096),
              .tmp_bytes = CM_MAX(cfg->tmp_bytes, 1ull << 30),
          },
  };
  int rc = net ? sbx_run_start(s->loop, s->backend, &spec, &net_cbs, net, run, err)
               : sbx_run_start(s->loop, s->backend, &spec, cbs, data, run, err);
  if (sandbox_fd >= 0) close(sandbox_fd); /* the sandbox has its own copy */
  if (net && rc < 0) {
    eg_session_close(net->session);
    free(net);
  } else if (net) {
    net->next = s->nets;
    s->nets = net;
  }
  cm_strv_free(env.v);
  cm_strv_free(binds.v);
  return rc;
}

/* ---------------------------------------------------------------- what a failed installer
 * run means for its caller */

/* What an installer prints when the index's host cannot be resolved or reached (pip's
 * retries, through the egress proxy or not; uv's causes)... */
static const char *const unreachable_marks[] = {
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "Failed to establish a new connection",
    "NewConnectionError",
    "ConnectTimeoutError",
    "Network is unreachable",
    "502 Bad Gateway",
    "504 Gateway",
    "dns error",
    "failed to lookup address",
    "tcp connect error",
};

/* ... and what says the failure was something else, whose wall stays: a refusal of the
 * build's policy (the proxy's 403; the wall names the host), or a package's own build (its
 * code could not resolve a name of its own). */
static const char *const build_failure_marks[] = {
    "403 Forbidden",
    "subprocess-exited-with-error",
    "did not run successfully",
    "Failed to build",
};

char *env_unreachable_message(env_store_t *s, const char *output) {
  if (!output || s->opts.offline) return NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(build_failure_marks); i++)
    if (strstr(output, build_failure_marks[i])) return NULL;
  const char *mark = NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(unreachable_marks) && !mark; i++)
    if (strstr(output, unreachable_marks[i])) mark = unreachable_marks[i];
  if (!mark) return NULL;
  env_index_settings(s);
  cleanup_free char *index = s->index_url ? eg_url_redact(s->index_url)
                                          : xstrdup("https://pypi.org/simple, the default index");
  cleanup_free char *extra = env_redacted_join(s->extra_index_urls);
  return xasprintf(
      "the package index (%s%s%s) cannot be resolved or reached from this server (the "
      "installer said: %s). Without an index, dependencies come from local wheels: put them in "
      "a directory (pip download -d DIR PACKAGE... on a machine that reaches an index) and start "
      "the server with --find-links DIR --offline, or point it at a private index with "
      "--index-url URL. A script without dependencies can import the system interpreter's "
      "packages (Debian: apt-get install python3-numpy python3-matplotlib; --python "
      "/usr/bin/python3).",
      index, extra ? "; also " : "", extra ? extra : "", mark);
}

/* Where an interpreter's own pip may live below its prefix: the usual site-packages, Debian's
 * dist-packages (python3-pip) and /usr/local's. */
static bool python_has_pip(const char *prefix, const char *version, bool free_threaded) {
  if (!prefix || !version) return true;
  const char *dot = strchr(version, '.');
  const char *end = dot ? dot + 1 + strspn(dot + 1, "0123456789") : NULL;
  if (!end) return true;
  cleanup_free char *xy =
      xasprintf("%.*s%s", (int)(end - version), version, free_threaded ? "t" : "");
  /* Below the prefix: {directory, versioned}: a versioned one takes "pythonX.Y" or "pypyX.Y". */
  const struct {
    const char *dir, *sub;
  } places[] = {{"lib", "site-packages"},
                {"lib64", "site-packages"},
                {"lib", "dist-packages"},
                {"local/lib", "dist-packages"}};
  for (size_t i = 0; i < CM_ARRAY_SIZE(places); i++) {
    const char *const names[] = {"python", "pypy"};
    for (size_t k = 0; k < CM_ARRAY_SIZE(names); k++) {
      cleanup_free char *p =
          xasprintf("%s/%s/%s%s/%s/pip", prefix, places[i].dir, names[k], xy, places[i].sub);
      struct stat st;
      if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) return true;
    }
  }
  /* Debian's python3-pip. */
  cleanup_free char *debian = xasprintf("%s/lib/python3/dist-packages/pip", prefix);
  struct stat st;
  if (stat(debian, &st) == 0 && S_ISDIR(st.st_mode)) return true;
  return false;
}

bool env_store_pip_missing(env_store_t *s, const py_interp_t *py) {
  if (s->uv || !py || !py->ok || !sbx_backend_host_processes(s->backend)) return false;
  return !python_has_pip(py->prefix, py->version, py->free_threaded);
}

char *env_no_pip_message(env_store_t *s, bool resolving, const char *executable,
                         const char *output) {
  if ((!resolving && s->uv) || !output || !strstr(output, "No module named pip")) return NULL;
  return xasprintf(
      "the interpreter %s has no pip, which %s. Install pip for it (Debian: apt-get "
      "install python3-pip)%s, or choose an interpreter that has pip "
      "(python_version; check_environment lists them)",
      executable,
      resolving ? "resolves dependencies" : "installs dependencies where the server has no uv",
      resolving ? "" : " or uv (--uv-path)");
}
