/* libFuzzer target for the /proc parsers of sandbox/cgroup.c.  The input is read both as
 * /proc/self/cgroup and as /proc/self/mountinfo text.  Checks, beyond memory safety: a
 * path found is absolute and has no NUL; a mount found has absolute, NUL-free mount point
 * and root; the directory built from them lies under the mount point and has no "." or
 * ".." component. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sandbox/sandbox-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_path(const char *p) {
  if (p && p[0] != '/') abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  static const char *const controllers[] = {NULL, "memory", "pids", "cpu", "cpuacct"};
  for (size_t i = 0; i < sizeof controllers / sizeof *controllers; i++) {
    char *own = sbx_cgroup_own_path(buf, size, controllers[i]);
    check_path(own);
    char *mp = NULL, *root = NULL;
    if (sbx_cgroup_find_mount(buf, size, controllers[i], &mp, &root) == 0) {
      check_path(mp);
      check_path(root);
      char *dir = own ? sbx_cgroup_dir(mp, root, own) : NULL;
      if (dir && strcmp(mp, "/") != 0 && strncmp(dir, mp, strlen(mp)) != 0) abort();
      if (dir && (strstr(dir, "/../") || strstr(dir, "/./") ||
                  (strlen(dir) >= 3 && strcmp(dir + strlen(dir) - 3, "/..") == 0) ||
                  (strlen(dir) >= 2 && strcmp(dir + strlen(dir) - 2, "/.") == 0)))
        abort();
      free(dir);
    } else if (mp || root) {
      abort();
    }
    free(mp);
    free(root);
    free(own);
  }
  return 0;
}
