/* The /proc parsers behind the runs' cgroups (sandbox/cgroup.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sandbox/sandbox-internal.h"

static const char v2_self[] = "0::/system.slice/mps.service\n";
static const char hybrid_self[] =
    "12:pids:/user.slice/user-1000.slice\n"
    "4:cpu,cpuacct:/user.slice\n"
    "3:memory:/user.slice/user-1000.slice/session-2.scope\n"
    "1:name=systemd:/user.slice/user-1000.slice/session-2.scope\n"
    "0::/user.slice/user-1000.slice/session-2.scope\n";

static const char v2_mounts[] =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate\n";
static const char hybrid_mounts[] =
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    "35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct\n"
    "36 31 0:33 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory\n"
    "40 31 0:37 / /sys/fs/cgroup/pids rw,nosuid shared:19 - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/my\\040group rw - cgroup cgroup rw,blkio\n";

static void test_own_path(void **state) {
  char *p = sbx_cgroup_own_path(v2_self, strlen(v2_self), NULL);
  assert_string_equal(p, "/system.slice/mps.service");
  free(p);
  assert_null(sbx_cgroup_own_path(v2_self, strlen(v2_self), "memory"));
  p = sbx_cgroup_own_path(hybrid_self, strlen(hybrid_self), "cpuacct");
  assert_string_equal(p, "/user.slice");
  free(p);
  p = sbx_cgroup_own_path(hybrid_self, strlen(hybrid_self), "memory");
  assert_string_equal(p, "/user.slice/user-1000.slice/session-2.scope");
  free(p);
  /* "name=systemd" is not the "systemd" controller; "cpu" does not match "cpuacct" alone. */
  assert_null(sbx_cgroup_own_path(hybrid_self, strlen(hybrid_self), "systemd"));
  assert_null(sbx_cgroup_own_path("4:cpuacct:/a\n", 13, "cpu"));
  /* Not terminated, no path, relative path, embedded NUL: nothing. */
  assert_null(sbx_cgroup_own_path("0::", 3, NULL));
  assert_null(sbx_cgroup_own_path("0::relative\n", 12, NULL));
  assert_null(sbx_cgroup_own_path("0::/a\0b\n", 8, NULL));
  p = sbx_cgroup_own_path("0::/x", 5, NULL); /* no final newline */
  assert_string_equal(p, "/x");
  free(p);
}

static void test_find_mount(void **state) {
  char *mp, *root;
  assert_int_equal(sbx_cgroup_find_mount(v2_mounts, strlen(v2_mounts), NULL, &mp, &root), 0);
  assert_string_equal(mp, "/sys/fs/cgroup");
  assert_string_equal(root, "/");
  free(mp), free(root);
  assert_int_equal(sbx_cgroup_find_mount(v2_mounts, strlen(v2_mounts), "memory", &mp, &root), -1);
  assert_null(mp);
  assert_int_equal(sbx_cgroup_find_mount(hybrid_mounts, strlen(hybrid_mounts), NULL, &mp, &root),
                   0);
  assert_string_equal(mp, "/sys/fs/cgroup/unified");
  free(mp), free(root);
  assert_int_equal(
      sbx_cgroup_find_mount(hybrid_mounts, strlen(hybrid_mounts), "cpuacct", &mp, &root), 0);
  assert_string_equal(mp, "/sys/fs/cgroup/cpu,cpuacct");
  free(mp), free(root);
  assert_int_equal(sbx_cgroup_find_mount(hybrid_mounts, strlen(hybrid_mounts), "blkio", &mp, &root),
                   0);
  assert_string_equal(mp, "/sys/fs/cgroup/my group"); /* \040 unescaped */
  free(mp), free(root);
  assert_int_equal(sbx_cgroup_find_mount(hybrid_mounts, strlen(hybrid_mounts), "rw", &mp, &root),
                   0);
  free(mp), free(root); /* superoptions hold "rw" too: harmless, the caller asks for controllers */
  const char *trunc = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2";
  assert_int_equal(sbx_cgroup_find_mount(trunc, strlen(trunc), NULL, &mp, &root), 0);
  free(mp), free(root);
  const char *nosep = "29 23 0:26 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n";
  assert_int_equal(sbx_cgroup_find_mount(nosep, strlen(nosep), NULL, &mp, &root), -1);
  const char *nul = "29 23 0:26 / /sys/\\000x rw - cgroup2 cgroup2 rw\n";
  assert_int_equal(sbx_cgroup_find_mount(nul, strlen(nul), NULL, &mp, &root), -1);
  /* A mount point or root with a "." or ".." component is not taken (found by fuzzing). */
  const char *dotdot = ":cpuacct:/ 3 0 / /.. i - cgroup c cpuacct";
  assert_int_equal(sbx_cgroup_find_mount(dotdot, strlen(dotdot), "cpuacct", &mp, &root), -1);
  assert_null(mp);
  const char *dotroot = "29 23 0:26 /a/../b /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  assert_int_equal(sbx_cgroup_find_mount(dotroot, strlen(dotroot), NULL, &mp, &root), -1);
  const char *dot = "29 23 0:26 / /sys/fs/./cgroup rw - cgroup2 cgroup2 rw\n";
  assert_int_equal(sbx_cgroup_find_mount(dot, strlen(dot), NULL, &mp, &root), -1);
}

static void test_dir(void **state) {
  char *d = sbx_cgroup_dir("/sys/fs/cgroup", "/", "/system.slice/mps.service");
  assert_string_equal(d, "/sys/fs/cgroup/system.slice/mps.service");
  free(d);
  d = sbx_cgroup_dir("/sys/fs/cgroup", "/", "/");
  assert_string_equal(d, "/sys/fs/cgroup");
  free(d);
  /* A container's mount shows only its own subtree. */
  d = sbx_cgroup_dir("/sys/fs/cgroup", "/docker/abc", "/docker/abc/inner");
  assert_string_equal(d, "/sys/fs/cgroup/inner");
  free(d);
  assert_null(sbx_cgroup_dir("/sys/fs/cgroup", "/docker/abc", "/docker/abcd"));
  assert_null(sbx_cgroup_dir("/sys/fs/cgroup", "/docker/abc", "/other"));
  assert_null(sbx_cgroup_dir("/sys/fs/cgroup", "/", "/a/../../etc"));
  assert_null(sbx_cgroup_dir("/sys/fs/cgroup", "/", "/a/.."));
  /* The final path is checked, not only the part after the root. */
  assert_null(sbx_cgroup_dir("/..", "/", "/ 3 0 / /.. i - cgroup c cpuacct"));
  assert_null(sbx_cgroup_dir("/sys/..", "/", "/"));
  assert_null(sbx_cgroup_dir("/sys/fs/cgroup", "/", "/.."));
}

static void test_off(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_cgroups_t *cg = sbx_cgroups_open("off", &err);
  assert_non_null(cg);
  assert_false(sbx_cgroups_active(cg));
  char *d = sbx_cgroups_describe(cg);
  assert_string_equal(d, "not used: turned off (--cgroup off)");
  free(d);
  sbx_cgroups_free(cg);
  assert_null(sbx_cgroups_open("/tmp", &err));
  assert_non_null(strstr(cm_error_message(&err), "not a directory of a cgroup v2 file system"));
  cm_error_release(&err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_own_path),
      cmocka_unit_test(test_find_mount),
      cmocka_unit_test(test_dir),
      cmocka_unit_test(test_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
