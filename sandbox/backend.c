/* Backend registry and the `none` backend (no isolation, but still: timeout, tree kill,
 * output bounds, a clean environment, /dev/null stdin, rlimits). */
#include "sandbox/sandbox-internal.h"

static void none_probe(sbx_backend_t *b, sbx_probe_t *probe) {
  sbx_probe_finish(probe, NULL);
}

static int none_build(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch,
                      cm_error_t *err) {
  launch->argv = sbx_strv_copy(spec->argv);
  launch->envp = sbx_strv_copy(spec->envp);
  launch->set_rlimits = true;
  return 0;
}

static char *none_describe(sbx_backend_t *b) {
  return xstrdup("none (no sandboxing)");
}

static const sbx_backend_ops_t none_ops = {
    .name = "none",
    .host_processes = true,
    .probe = none_probe,
    .build = none_build,
    .describe = none_describe,
};

#if !defined(MPS_HAVE_BWRAP) || !defined(MPS_HAVE_DOCKER)
/* A backend this binary was built without: it exists, so the server starts and says why
 * it cannot run anything, but it never runs a script. */
static int missing_error(sbx_backend_t *b, cm_error_t *err) {
  return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "this binary was built without the %s backend",
                      b->ops->name);
}
static void missing_probe(sbx_backend_t *b, sbx_probe_t *probe) {
  cm_error_t err = CM_ERROR_INIT;
  missing_error(b, &err);
  sbx_probe_finish(probe, &err);
}
static int missing_build(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch,
                         cm_error_t *err) {
  return missing_error(b, err);
}
#endif
#ifndef MPS_HAVE_BWRAP
static const sbx_backend_ops_t missing_bwrap_ops = {
    .name = "bwrap", .probe = missing_probe, .build = missing_build};
#endif
#ifndef MPS_HAVE_DOCKER
static const sbx_backend_ops_t missing_docker_ops = {
    .name = "docker", .probe = missing_probe, .build = missing_build};
static const sbx_backend_ops_t missing_podman_ops = {
    .name = "podman", .probe = missing_probe, .build = missing_build};
#endif

static const sbx_backend_ops_t *find_ops(const char *name) {
  if (strcmp(name, "none") == 0) return &none_ops;
#ifdef MPS_HAVE_BWRAP
  if (strcmp(name, "bwrap") == 0 || strcmp(name, "native") == 0) return &sbx_bwrap_ops;
#else
  if (strcmp(name, "bwrap") == 0 || strcmp(name, "native") == 0) return &missing_bwrap_ops;
#endif
#ifdef MPS_HAVE_DOCKER
  if (strcmp(name, "docker") == 0) return &sbx_docker_ops;
  if (strcmp(name, "podman") == 0) return &sbx_podman_ops;
#else
  if (strcmp(name, "docker") == 0) return &missing_docker_ops;
  if (strcmp(name, "podman") == 0) return &missing_podman_ops;
#endif
  return NULL;
}

sbx_backend_t *sbx_backend_new(const char *name, cm_error_t *err) {
  const sbx_backend_ops_t *ops = find_ops(name);
  if (!ops) {
    cm_error_set(err, 0, CM_ERR_INVALID, "Unknown sandbox backend: '%s'", name);
    return NULL;
  }
  sbx_backend_t *b = xcalloc(1, sizeof *b);
  b->ops = ops;
  return b;
}

const char *sbx_backend_name(const sbx_backend_t *b) {
  return b->ops->name;
}
void sbx_backend_set_cgroups(sbx_backend_t *b, sbx_cgroups_t *cg) {
  b->cgroups = cg;
}
void sbx_backend_set_state_dir(sbx_backend_t *b, const char *dir) {
  free(b->state_dir);
  b->state_dir = dir ? xstrdup(dir) : NULL;
}
bool sbx_backend_maps_paths(const sbx_backend_t *b) {
  return b->ops->maps_paths;
}
bool sbx_backend_can_hold(const sbx_backend_t *b) {
  return b->ops->can_hold && b->available;
}
bool sbx_backend_can_egress(const sbx_backend_t *b) {
  return b->ops->can_egress;
}
bool sbx_backend_host_processes(const sbx_backend_t *b) {
  return b->ops->host_processes;
}
bool sbx_backend_has_uv(sbx_backend_t *b) {
  if (b->ops->host_processes) return true;
  return b->ops->has_uv && b->ops->has_uv(b);
}

bool sbx_backend_interpreter(sbx_backend_t *b, const char *host_python, sbx_interp_t *out) {
  return b->available && b->ops->interpreter && b->ops->interpreter(b, host_python, out);
}

char *sbx_backend_describe(sbx_backend_t *b) {
  cleanup_free char *d = b->ops->describe ? b->ops->describe(b) : xstrdup(b->ops->name);
  if (!b->available && b->unavailable) return xasprintf("%s: unavailable: %s", d, b->unavailable);
  return steal_pointer(&d);
}

void sbx_backend_free(sbx_backend_t *b) {
  if (!b) return;
  if (b->end_detached) b->end_detached(b);
  if (b->ops->free) b->ops->free(b);
  free(b->unavailable);
  free(b->state_dir);
  free(b);
}

sbx_identity_t *sbx_identity_new(sbx_backend_t *b) {
  sbx_identity_t *id = xcalloc(1, sizeof *id);
  id->backend = b;
  id->slot = -1;
  if (b && b->ops->identity_new) b->ops->identity_new(b, id);
  return id;
}

void sbx_identity_free(sbx_identity_t *id) {
  if (!id) return;
  if (id->backend && id->backend->ops->identity_release)
    id->backend->ops->identity_release(id->backend, id);
  free(id);
}
