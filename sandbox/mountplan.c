/* A run's mount plan (see sandbox-internal.h): built here once per run, rendered by each
 * backend (bwrap.c: sbx_bwrap_render_mounts, docker.c: sbx_docker_render_mounts). */
#include "sandbox/sandbox-internal.h"

static bool path_is_under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static sbx_mount_op_t *plan_add(sbx_mount_plan_t *plan, sbx_mount_op_kind_t kind,
                                const char *target) {
  if (plan->n == plan->cap) {
    plan->cap = plan->cap ? 2 * plan->cap : 16;
    plan->ops = xrealloc(plan->ops, plan->cap * sizeof *plan->ops);
  }
  sbx_mount_op_t *op = &plan->ops[plan->n++];
  *op = (sbx_mount_op_t){.kind = kind, .target = target};
  return op;
}

static void plan_file(sbx_mount_plan_t *plan, const char *name, const char *target,
                      const sbx_mount_file_t *f) {
  if (!f->data && !f->path) return;
  sbx_mount_op_t *op = plan_add(plan, SBX_MOUNT_FILE, target);
  op->name = name;
  op->source = f->path;
  op->data = f->path ? NULL : f->data;
  op->mode = 0644;
}

bool sbx_spec_host_network(const sbx_spec_t *spec) {
  return spec->network && !spec->egress;
}

void sbx_mount_plan_build(const sbx_spec_t *spec, const sbx_mount_plan_in_t *in,
                          sbx_mount_plan_t *plan) {
  *plan = (sbx_mount_plan_t){0};
  plan_file(plan, "passwd", "/etc/passwd", &in->passwd);
  plan_file(plan, "group", "/etc/group", &in->group);
  /* Only a sandbox on the host's network sees the host's resolver files (the backend's
   * business); every other gets localhost alone and a resolv.conf naming nothing of the
   * host's. */
  if (!sbx_spec_host_network(spec)) {
    plan_file(plan, "hosts", "/etc/hosts", &in->hosts);
    plan_file(plan, "resolv", "/etc/resolv.conf", &in->resolv);
  }
  uint64_t tmp_bytes = spec->limits.tmp_bytes ? spec->limits.tmp_bytes : in->default_tmp_bytes;
  sbx_mount_op_t *shm = plan_add(plan, SBX_MOUNT_TMPFS, "/dev/shm");
  shm->size = CM_MIN(tmp_bytes, in->max_shm_bytes);
  shm->mode = 01777;
  /* A spec mount at /tmp (a build's, on its own bounded space) replaces the tmpfs, in the
   * same place: before the binds, which may be below /tmp. */
  const sbx_mount_t *tmp_mount = NULL;
  for (size_t i = 0; i < spec->n_mounts; i++)
    if (strcmp(spec->mounts[i].target, "/tmp") == 0) tmp_mount = &spec->mounts[i];
  if (tmp_mount) {
    plan_add(plan, tmp_mount->writable ? SBX_MOUNT_BIND : SBX_MOUNT_RO_BIND, "/tmp")->source =
        tmp_mount->host;
  } else {
    sbx_mount_op_t *tmp = plan_add(plan, SBX_MOUNT_TMPFS, "/tmp");
    tmp->size = tmp_bytes;
    tmp->mode = 01777;
  }
  for (char *const *r = spec->ro_binds; r && *r; r++) {
    if (path_is_under(*r, "/usr")) continue; /* visible already, read-only */
    plan_add(plan, SBX_MOUNT_RO_BIND, *r)->source = *r;
  }
  for (size_t i = 0; i < spec->n_mounts; i++) {
    const sbx_mount_t *m = &spec->mounts[i];
    if (m == tmp_mount) continue;
    plan_add(plan, m->writable ? SBX_MOUNT_BIND : SBX_MOUNT_RO_BIND, m->target)->source = m->host;
  }
  sbx_mount_op_t *work = plan_add(plan, SBX_MOUNT_BIND, in->workdir_target);
  work->source = spec->workdir;
  work->workdir = true;
}

void sbx_mount_plan_free(sbx_mount_plan_t *plan) {
  free(plan->ops);
  *plan = (sbx_mount_plan_t){0};
}
