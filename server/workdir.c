/* Per-run work directories as size-capped tmpfs mounts (when the server may mount): the
 * whole directory is bounded, not only each file, and creating and removing one never
 * touches the disk (on an ext4 disk with discard that is milliseconds per run). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>

#include "server/srv.h"

static int mount_state = -1; /* -1 unknown, 0 cannot mount, 1 can */

bool srv_workdir_mount(const char *dir, uint64_t bytes) {
  if (bytes == 0 || mount_state == 0) return false;
  if (geteuid() != 0) {
    mount_state = 0;
    return false;
  }
  char opts[64];
  snprintf(opts, sizeof opts, "size=%llu,mode=0700", (unsigned long long)bytes);
  if (mount("mps-work", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
    if (mount_state == -1) cm_warn("work directories are not size-capped: mounting a tmpfs failed: %s", strerror(errno));
    mount_state = 0;
    return false;
  }
  mount_state = 1;
  return true;
}

void srv_workdir_unmount(const char *dir) {
  if (umount2(dir, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    cm_warn("unmounting %s: %s", dir, strerror(errno));
}

bool srv_workdir_capped(uint64_t bytes) { return bytes && geteuid() == 0 && mount_state != 0; }

void srv_workdir_sweep(const char *work_root, uint64_t older_than_s) {
  DIR *d = opendir(work_root);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "run-", 4) != 0) continue;
    cleanup_free char *p = xasprintf("%s/%s", work_root, e->d_name);
    /* Another server may share the state directory: only a directory older than any run can
     * be (the longest timeout and then some) is a left-over of a crash. */
    struct stat st;
    if (lstat(p, &st) < 0 || (uint64_t)(now - st.st_ctime) < older_than_s) continue;
    if (geteuid() == 0) umount2(p, MNT_DETACH);
    cm_error_t err = CM_ERROR_INIT;
    cm_rm_rf(p, &err);
    cm_error_release(&err);
  }
  closedir(d);
}
