/* A build's (warm-up's, resolution's) own bounded space, and big removals in a child. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "envstore/envstore-internal.h"

/* A tmpfs of its own on dir: at most bytes of data and inodes files, mode 0700, nosuid,
 * nodev.  Only as root; -1 with err when it cannot. */
static int space_mount(const char *dir, uint64_t bytes, uint64_t inodes, cm_error_t *err) {
  if (geteuid() != 0)
    return cm_error_set(err, EPERM, CM_ERR_UNAVAILABLE, "mounting a tmpfs on %s", dir);
  char opts[96];
  snprintf(opts, sizeof opts, "size=%llu,nr_inodes=%llu,mode=0700", (unsigned long long)bytes,
           (unsigned long long)inodes);
  if (mount("mps-build", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
    return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "mounting a tmpfs on %s", dir);
  return 0;
}

static char *human_bytes(uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0)
    return xasprintf("%lluG", (unsigned long long)(n >> 30));
  if (n >= (1ull << 20) && n % (1ull << 20) == 0)
    return xasprintf("%lluM", (unsigned long long)(n >> 20));
  return xasprintf("%llu bytes", (unsigned long long)n);
}

/* Lists a directory through a new fd of its own: a duplicate would share the offset of
 * fd, left at the end by the last listing. */
DIR *env_list_dir(int fd) {
  int dup = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
  DIR *d = dup >= 0 ? fdopendir(dup) : NULL;
  if (!d) {
    if (dup >= 0) close(dup);
    return NULL;
  }
  rewinddir(d);
  return d;
}

/* ---------------------------------------------------------------- removal in a child */

static int remove_in_child(void *arg, cm_buf_t *out, cm_error_t *err) {
  env_removal_t *r = arg;
  return cm_rm_rf_at(r->dir_fd, r->name, err);
}

void env_removal_free(env_removal_t *r) {
  for (env_removal_t **p = &r->store->removals; *p; p = &(*p)->next) {
    if (*p == r) {
      *p = r->next;
      break;
    }
  }
  if (r->dir_fd >= 0) close(r->dir_fd);
  free(r->name);
  free(r);
}

static void removal_done(void *data, int rc, const char *text) {
  env_removal_t *r = data;
  r->call = NULL;
  if (rc < 0) cm_warn("removing %s: %s", r->name, text);
  env_removal_free(r);
}

/* Removes name in dir_fd (renamed there by the caller, never used again) in a child, so a
 * big tree never blocks the loop.  If no child can be had it stays for the next start-up's
 * sweep (names starting with '.') or the next sweep of the work directory. */
void env_remove_later(env_store_t *s, int dir_fd, const char *name) {
  if (s->closing) return;
  env_removal_t *r = xcalloc(1, sizeof *r);
  r->store = s;
  r->dir_fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 3);
  r->name = xstrdup(name);
  r->next = s->removals;
  s->removals = r;
  cm_error_t err = CM_ERROR_INIT;
  if (r->dir_fd < 0 || sbx_call_start(s->loop, remove_in_child, r, &r->dir_fd, 1, 0, removal_done,
                                      r, &r->call, &err) < 0) {
    cm_warn("removing %s later: %s", name,
            r->dir_fd < 0 ? strerror(errno) : cm_error_message(&err));
    cm_error_release(&err);
    env_removal_free(r);
  }
}

/* Moves name in dir_fd aside to a trash name of the envs directory's kind and removes it. */
void env_discard(env_store_t *s, int dir_fd, const char *name, const char *kind) {
  cleanup_free char *trash =
      xasprintf(".%s-%s-%d-%u", kind, name[0] == '.' ? name + 1 : name, (int)getpid(), s->serial++);
  if (renameat(dir_fd, name, dir_fd, trash) < 0) {
    if (errno != ENOENT) cm_warn("moving %s aside: %s", name, strerror(errno));
    return;
  }
  env_listing_changed(s); /* (it may have been an environment) */
  env_remove_later(s, dir_fd, trash);
}

/* ---------------------------------------------------------------- spaces */

void env_space_init(env_space_t *sp) {
  memset(sp, 0, sizeof *sp);
  sp->fd = -1;
}

void env_space_remove(env_store_t *s, env_space_t *sp) {
  if (!sp->dir) return;
  if (sp->fd >= 0) close(sp->fd);
  sp->fd = -1;
  if (sp->mounted) {
    /* The tmpfs goes with everything in it; the mount point is left empty. */
    if (umount2(sp->dir, MNT_DETACH) < 0) cm_warn("unmounting %s: %s", sp->dir, strerror(errno));
    if (rmdir(sp->dir) < 0 && errno != ENOENT) cm_warn("removing %s: %s", sp->dir, strerror(errno));
  } else if (!s->closing) {
    env_remove_later(s, s->runs_fd, sp->name); /* on disk: as big as the build made it */
  } /* closing: the server's directory goes as a whole (the server releases it) */
  free(sp->dir);
  free(sp->env);
  free(sp->work);
  free(sp->cache);
  free(sp->tmp);
  env_space_init(sp);
}

/* Makes a space for one build (with_env), warm-up or resolution. */
int env_space_make(env_store_t *s, const char *kind, bool with_env, env_space_t *sp,
                   cm_error_t *err) {
  env_space_init(sp);
  sp->dir = xasprintf("%s/%s-XXXXXX", s->runs_dir, kind);
  if (!mkdtemp(sp->dir)) {
    int e = errno;
    free(sp->dir);
    sp->dir = NULL;
    return cm_error_set(err, e, CM_ERR_IO, "creating a directory for the build");
  }
  sp->name = strrchr(sp->dir, '/') + 1;
  uint64_t bytes = s->opts.max_build_bytes;
  if (geteuid() == 0) {
    cm_error_t merr = CM_ERROR_INIT;
    if (space_mount(sp->dir, bytes, CM_MAX(bytes / 16384, 8192), &merr) == 0) {
      sp->mounted = true;
    } else {
      if (!s->warned_uncapped)
        cm_warn("build spaces are not size-capped: %s", cm_error_message(&merr));
      s->warned_uncapped = true;
      cm_error_release(&merr);
    }
  }
  sp->fd = open(sp->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sp->fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "open %s", sp->dir);
  sp->work = xasprintf("%s/work", sp->dir);
  sp->cache = xasprintf("%s/cache", sp->dir);
  sp->tmp = xasprintf("%s/tmp", sp->dir);
  if (with_env) sp->env = xasprintf("%s/env", sp->dir);
  const char *parts[] = {sp->work, sp->cache, sp->tmp, sp->env};
  for (size_t i = 0; i < CM_ARRAY_SIZE(parts); i++)
    if (parts[i] && mkdir(parts[i], 0700) < 0)
      return cm_error_set(err, errno, CM_ERR_IO, "creating %s", parts[i]);
  return 0;
}

/* Whether a failed step ran out of the space's bytes. */
bool env_space_full(const env_space_t *sp, const char *output) {
  if (output && strstr(output, "No space left on device")) return true;
  struct statvfs v;
  return sp->mounted && sp->fd >= 0 && fstatvfs(sp->fd, &v) == 0 &&
         ((uint64_t)v.f_bavail * v.f_frsize < ENV_SPACE_FULL_BYTES || v.f_favail == 0);
}

/* The message for a build that hit --max-build-bytes, or NULL. */
char *env_bound_message(env_store_t *s, const env_space_t *sp, const sbx_result_t *res,
                        const char *tail) {
  cleanup_free char *limit = human_bytes(s->opts.max_build_bytes);
  if (sp->mounted && env_space_full(sp, tail))
    return xasprintf(
        "the build wrote more than %s (--max-build-bytes: everything one build may write, its "
        "environment, downloads, caches and temporary files together)",
        limit);
  if (res && res->file_size_limit)
    return xasprintf("the build wrote a file larger than %s (--max-build-bytes)", limit);
  return NULL;
}
