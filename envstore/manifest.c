/* Manifests (what a finished environment holds) and the handles runs hold on them. */
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <time.h>

#include "envstore/envstore-internal.h"

/* ---------------------------------------------------------------- manifests and handles */

/* A finished environment's manifest, if it is one of ours (a regular file of the server's
 * own, not too big, for this key) and, for unpinned requirements, not too old to reuse.
 * With touch, its time is set to now: the last use, for eviction.  st gets the manifest's
 * status (before the touch). */
json_t *env_load_manifest(env_store_t *s, const char *key, bool pinned, bool touch,
                          struct stat *st_out) {
  struct stat st;
  cleanup_close int fd = -1;
  json_t *m = env_manifest_read(s->envs_fd, key, &st, &fd);
  if (!m) return NULL;
  if (!pinned && s->opts.env_max_age_ms) {
    json_int_t created = json_integer_value(json_object_get(m, "created"));
    if ((uint64_t)time(NULL) * 1000 > (uint64_t)created * 1000 + s->opts.env_max_age_ms) {
      cm_info(
          "environment %s has unpinned requirements and is older than its maximum age: "
          "re-resolving",
          key);
      json_decref(m);
      return NULL;
    }
  }
  if (st_out) *st_out = st;
  if (touch) (void)futimens(fd, NULL);
  return m;
}

json_t *env_manifest_read(int envs_fd, const char *key, struct stat *st_out, int *fd_out) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(envs_fd, key, &err);
  struct stat st;
  cleanup_close int fd = dfd < 0 ? -1
                                 : cm_open_regular_at(dfd, ENV_MANIFEST, O_RDONLY, geteuid(),
                                                      ENV_MANIFEST_MAX, &st, &err);
  if (fd < 0) {
    if (err.kind != CM_ERR_NOT_FOUND) cm_warn("environment %s: %s", key, cm_error_message(&err));
    cm_error_release(&err);
    return NULL;
  }
  cleanup_free char *text = xmalloc((size_t)st.st_size + 1);
  size_t len = 0;
  while (len < (size_t)st.st_size) {
    ssize_t n = read(fd, text + len, (size_t)st.st_size - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  json_t *m = json_loadb(text, len, 0, NULL);
  if (!json_is_object(m) || strcmp(json_string_value(json_object_get(m, "key")) ?: "", key) != 0) {
    json_decref(m);
    return NULL;
  }
  if (st_out) *st_out = st;
  if (fd_out) *fd_out = steal_fd(&fd);
  return m;
}

/* A handle on a finished environment, or NULL when there is none to use: the shared lock
 * comes first (another server's eviction or rebuild holds it exclusively while it renames
 * the directory away), then the manifest is read again under it. */
env_handle_t *env_handle_open(env_store_t *s, const char *key, bool pinned, bool cached) {
  cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, key);
  cleanup_close int lock_fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    cm_warn("environment %s: open %s: %s", key, lock, strerror(errno));
    return NULL;
  }
  if (flock(lock_fd, LOCK_SH | LOCK_NB) < 0) {
    cm_debug("environment %s is locked by another server: not a hit", key);
    return NULL;
  }
  json_t *m = env_load_manifest(s, key, pinned, true, NULL);
  if (!m) return NULL;
  env_handle_t *h = xcalloc(1, sizeof *h);
  h->key = xstrdup(key);
  h->host_dir = xasprintf("%s/%s", s->envs_dir, key);
  h->mount_target = env_backend_maps(s) ? xstrdup(ENV_TARGET) : NULL;
  h->python = xasprintf("%s/bin/python", h->mount_target ? h->mount_target : h->host_dir);
  h->cached = cached;
  json_t *pk = json_object_get(m, "packages");
  h->packages = json_is_object(pk) ? json_incref(pk) : json_object();
  json_decref(m);
  h->lock_fd = steal_fd(&lock_fd);
  return h;
}

env_handle_t *env_handle_copy_unlocked(const env_handle_t *env) {
  env_handle_t *h = xcalloc(1, sizeof *h);
  h->key = xstrdup(env->key);
  h->host_dir = xstrdup(env->host_dir);
  h->python = xstrdup(env->python);
  h->mount_target = env->mount_target ? xstrdup(env->mount_target) : NULL;
  h->cached = env->cached;
  h->packages = json_incref(env->packages);
  h->lock_fd = -1;
  return h;
}

void env_release(env_handle_t *h) {
  if (!h) return;
  if (h->lock_fd >= 0) close(h->lock_fd);
  free(h->key);
  free(h->host_dir);
  free(h->python);
  free(h->mount_target);
  json_decref(h->packages);
  free(h);
}
