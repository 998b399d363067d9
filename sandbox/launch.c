/* What every backend shares, below all of them: a launch's release and its channel to the
 * supervisor (the status record), the checks every backend makes on a spec, finding our
 * helper programs, a vector copy.  Uses common/ only, so that the backends (bwrap.c,
 * docker.c), their registry (backend.c) and the run (run.c) call down into it and never
 * into each other in circles. */
#include <errno.h>
#include <sys/stat.h>

#include "sandbox/sandbox-internal.h"

void sbx_launch_close_channel(sbx_launch_t *l) {
  if (l->status_fd >= 0) close(l->status_fd);
  if (l->control_fd >= 0) close(l->control_fd);
  l->status_fd = l->control_fd = -1;
}

int sbx_status_read(int fd, sbx_status_record_t *rec) {
  if (fd < 0) return 0;
  /* Room for more than one record, so that extra bytes show. */
  unsigned char buf[2 * sizeof *rec];
  size_t len = 0;
  while (len < sizeof buf) {
    ssize_t n = read(fd, buf + len, sizeof buf - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* EOF, EAGAIN (a writer is still around, but nothing more is there) */
    len += (size_t)n;
  }
  if (len != sizeof *rec) return 0;
  memcpy(rec, buf, sizeof *rec);
  return rec->magic == SBX_STATUS_MAGIC && rec->size == sizeof *rec &&
         (rec->flags & ~SBX_STATUS_OOM_KILL) == 0;
}

void sbx_launch_release(sbx_launch_t *l) {
  cm_strv_free(l->argv);
  cm_strv_free(l->envp);
  free(l->kill_name);
  l->argv = l->envp = NULL;
  l->kill_name = NULL;
  for (size_t i = 0; i < CM_ARRAY_SIZE(l->pass_fds); i++) {
    if (l->pass_fds[i] >= 0) close(l->pass_fds[i]);
    l->pass_fds[i] = -1;
  }
  sbx_launch_close_channel(l);
}

char *sbx_find_helper(const char *what, const char *env_var, const char *name, cm_error_t *err) {
  const char *env = getenv(env_var);
  if (env && *env) {
    char *path = realpath(env, NULL);
    if (!path) cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "%s %s (%s)", what, env, env_var);
    return path;
  }
  cleanup_free char *self = realpath("/proc/self/exe", NULL);
  if (!self) {
    cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "realpath /proc/self/exe");
    return NULL;
  }
  *strrchr(self, '/') = '\0';
  /* Installed first: a binary in a build directory has no libexec beside it. */
  const char *dirs[] = {"/" MPS_REL_LIBEXECDIR, ""};
  for (size_t i = 0; i < CM_ARRAY_SIZE(dirs); i++) {
    cleanup_free char *c = xasprintf("%s%s/%s", self, dirs[i], name);
    char *path = realpath(c, NULL);
    if (path) return path;
  }
  cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s %s was not found next to %s (set %s)", what, name,
               self, env_var);
  return NULL;
}

char *sbx_helper_path(sbx_helper_t which, cm_error_t *err) {
  if (which == SBX_HELPER_DROP)
    return sbx_find_helper("the drop helper", "MPS_SANDBOX_DROP", "mps-sandbox-drop", err);
  return sbx_find_helper("the container init", "MPS_CONTAINER_INIT", "mps-container-init", err);
}

int sbx_spec_check_common(const sbx_spec_t *spec, cm_error_t *err) {
  if (!spec->argv || !spec->argv[0] || spec->argv[0][0] != '/')
    return cm_error_set(err, 0, CM_ERR_INVALID, "the command must be an absolute path");
  struct stat st;
  if (lstat(spec->workdir, &st) < 0)
    return cm_error_set(err, errno, CM_ERR_NOT_FOUND, "work directory %s", spec->workdir);
  if (!S_ISDIR(st.st_mode))
    return cm_error_set(err, 0, CM_ERR_INVALID, "work directory %s is not a directory",
                        spec->workdir);
  for (char *const *e = spec->envp; e && *e; e++) {
    /* Without '=', docker would even copy the variable from the client's environment. */
    if (!strchr(*e, '=') || **e == '=')
      return cm_error_set(err, 0, CM_ERR_INVALID, "environment entry without a name or value");
  }
  return 0;
}

char **sbx_strv_copy(char *const *v) {
  size_t n = cm_strv_len(v);
  char **out = xcalloc(n + 1, sizeof *out);
  for (size_t i = 0; i < n; i++) out[i] = xstrdup(v[i]);
  return out;
}
