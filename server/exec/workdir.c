/* Per-run work directories as size-capped tmpfs mounts (when the server may mount): the
 * whole directory is bounded, not only each file, and creating and removing one never
 * touches the disk (on an ext4 disk with discard that is milliseconds per run). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

/* Mounts a size-capped tmpfs on dir when the server may (root): true if it did.  0 = no. */
static bool workdir_mount(exec_state_t *x, const char *dir, uint64_t bytes) {
  if (bytes == 0 || x->mount_state == 0) return false;
  if (geteuid() != 0) {
    x->mount_state = 0;
    return false;
  }
  char opts[64];
  snprintf(opts, sizeof opts, "size=%llu,mode=0700", (unsigned long long)bytes);
  if (mount("mps-work", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
    if (x->mount_state == -1)
      cm_warn("work directories are not size-capped: mounting a tmpfs failed: %s", strerror(errno));
    x->mount_state = 0;
    return false;
  }
  x->mount_state = 1;
  return true;
}

static void workdir_unmount(const char *dir) {
  if (umount2(dir, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    cm_warn("unmounting %s: %s", dir, strerror(errno));
}

char *exec_workdir_make(exec_state_t *x, bool *mounted, cm_error_t *err) {
  srv_server_t *s = x->server;
  char *tmpl = xasprintf("%s/run-XXXXXX", srv_server_runs_dir(s));
  if (!mkdtemp(tmpl)) {
    cm_error_set(err, errno, CM_ERR_IO, "creating a work directory");
    free(tmpl);
    return NULL;
  }
  /* A size-capped tmpfs of its own (when we may mount): the whole work directory, not just
   * each file, is bounded, and nothing touches the disk. */
  *mounted = workdir_mount(x, tmpl, srv_server_config(s)->work_bytes);
  return tmpl;
}

typedef struct workdir_rm_job {
  char *dir;
  bool mounted;
} workdir_rm_job_t;

static void workdir_rm(const char *dir, bool mounted) {
  cm_error_t err = CM_ERROR_INIT;
  if (mounted) workdir_unmount(dir);
  if (cm_rm_rf(dir, &err) < 0) cm_warn("cleaning up: %s", cm_error_message(&err));
  cm_error_release(&err);
}

static void workdir_rm_job(void *data) {
  workdir_rm_job_t *j = data;
  workdir_rm(j->dir, j->mounted);
  free(j->dir);
  free(j);
}

void exec_workdir_remove(const char *workdir, bool mounted) {
  /* In the background: unmounting a tmpfs and removing what was in it wait for RCU grace
   * periods (milliseconds), and nothing waits for the directory to be gone (its name is
   * never reused; the server's own directory goes after cm_bg_flush). */
  workdir_rm_job_t *j = xmalloc(sizeof *j);
  *j = (workdir_rm_job_t){xstrdup(workdir), mounted};
  if (cm_bg_run(workdir_rm_job, j)) return;
  free(j->dir);
  free(j);
  workdir_rm(workdir, mounted);
}

bool exec_workdir_capped(exec_state_t *x, uint64_t bytes) {
  return bytes && geteuid() == 0 && x->mount_state != 0;
}

/* Unmounts the run and build directories in dir (a server's, or a crashed run's own), then
 * removes it. */
static void remove_tree(const char *dir) {
  if (geteuid() == 0) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      cleanup_free char *p = xasprintf("%s/%s", dir, e->d_name);
      umount2(p, MNT_DETACH);
    }
    if (d) closedir(d);
    umount2(dir, MNT_DETACH);
  }
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(dir, &err);
  cm_error_release(&err);
}

void srv_workdir_sweep(const char *work_root, uint64_t older_than_s) {
  DIR *d = opendir(work_root);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    cleanup_free char *p = xasprintf("%s/%s", work_root, e->d_name);
    if (strncmp(e->d_name, "srv-", 4) == 0) {
      /* A server's own directory: its owner holds a lock on it for as long as it lives, so
       * one we can lock is a dead server's, whatever its age. */
      int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) remove_tree(p);
      close(fd);
      continue;
    }
    if (strncmp(e->d_name, "run-", 4) != 0 && strncmp(e->d_name, "build-", 6) != 0 &&
        strncmp(e->d_name, "warm-", 5) != 0 && strncmp(e->d_name, "resolve-", 8) != 0 &&
        strncmp(e->d_name, "new-", 4) != 0)
      continue;
    /* Another server may share the state directory: only a directory older than any run or
     * build can be (the longest timeout and then some) is a left-over of a crash. */
    struct stat st;
    if (lstat(p, &st) < 0 || !S_ISDIR(st.st_mode) || (uint64_t)(now - st.st_ctime) < older_than_s)
      continue;
    remove_tree(p);
  }
  closedir(d);
}

/* One try of srv_workdir_claim: 1 on success, 0 to try another name, -1 on an error. */
static int claim_once(const char *work_root, char **out, int *lock_fd, cm_error_t *err) {
  /* Made and locked under another name, then renamed: a sweep by a server starting at the
   * same time never sees it unlocked (the lock stays with the directory). */
  cleanup_free char *tmp = xasprintf("%s/new-XXXXXX", work_root);
  if (!mkdtemp(tmp)) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", tmp);
  chmod(tmp, 0711); /* as work/: a run's uid must reach its own directory inside */
  char *dir = xasprintf("%s/srv-%s", work_root, strrchr(tmp, '-') + 1);
  int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int rc = fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0                       ? -1
           : renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE) == 0 ? 1
           : errno == EEXIST                                                ? 0
                                                                            : -1;
  if (rc < 0) cm_error_set(err, errno, CM_ERR_IO, "locking %s", tmp);
  if (rc <= 0) {
    if (fd >= 0) close(fd);
    rmdir(tmp);
    free(dir);
    return rc;
  }
  *out = dir;
  *lock_fd = fd;
  return 1;
}

char *srv_workdir_claim(const char *work_root, int *lock_fd, cm_error_t *err) {
  char *dir = NULL;
  for (int i = 0; i < 8; i++) {
    int rc = claim_once(work_root, &dir, lock_fd, err);
    if (rc != 0) return rc > 0 ? dir : NULL;
  }
  cm_error_set(err, EEXIST, CM_ERR_IO, "no free name for a server directory in %s", work_root);
  return NULL;
}

void srv_workdir_release(const char *dir, int lock_fd) {
  cm_bg_flush(); /* the runs' directories in it, removed in the background, first */
  if (dir) remove_tree(dir);
  if (lock_fd >= 0) close(lock_fd);
}
