/* The seccomp filter bubblewrap loads (--seccomp FD) just before it execs the drop helper.
 *
 * A denylist on top of default-allow: it removes what a Python script never needs and what
 * widens the kernel's attack surface or lets a process reach beyond its sandbox (other
 * processes' memory, namespaces, mounts, keyrings, BPF, modules, io_uring, terminal
 * injection).  The rest of the isolation comes from the namespaces, the uid drop and
 * no_new_privs; this filter is one more wall, not the only one.
 *
 * It stays in force for the drop helper, so it must let that helper drop privileges:
 * setresuid/setresgid/setgroups/capset/prctl/setrlimit are allowed.
 *
 * Foreign ABIs (i386 int 0x80, x32) are not described by the native filter, so libseccomp's
 * bad-arch action applies to them: the process is killed. */
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "sandbox/sandbox-internal.h"

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

/* Denied with EPERM, unconditionally.  Names unknown to this libseccomp or absent on this
 * architecture are skipped. */
/* clang-format off */
static const char *const denied_syscalls[] = {
    /* other processes' memory */
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
    "kcmp",
    /* mounts and namespaces */
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen",
    "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr",
    /* kernel keyrings */
    "keyctl", "add_key", "request_key",
    /* large kernel attack surface a script has no use for */
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "lookup_dcookie",
    /* file handles bypass path-based checks */
    "open_by_handle_at", "name_to_handle_at",
    /* the machine, not the process */
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "create_module", "query_module", "get_kernel_syms", "quotactl", "quotactl_fd", "swapon",
    "swapoff", "reboot", "acct", "syslog", "iopl", "ioperm", "vhangup", "nfsservctl",
    "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old", "settimeofday",
    "clock_settime", "stime",
    /* NUMA placement of other processes' pages */
    "mbind", "migrate_pages", "move_pages",
};
/* clang-format on */

/* clone() flags that create namespaces.  CLONE_NEWTIME shares its bit with the exit signal
 * in clone() and only exists for clone3(), which is refused wholesale. */
static const uint64_t clone_namespace_flags[] = {
    CLONE_NEWNS,   CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
    CLONE_NEWUSER, CLONE_NEWPID,    CLONE_NEWNET,
};

/* personality() values that change nothing dangerous (the same set Docker allows):
 * PER_LINUX, PER_LINUX32, UNAME26 with either, and the 0xffffffff query.  Sorted. */
static const uint32_t allowed_personalities[] = {0x0, 0x8, 0x20000, 0x20008, 0xffffffff};

typedef struct filter_cache {
  bool built;
  void *bpf;
  size_t len;
} filter_cache_t;

static filter_cache_t cache;

static void release_ctx(scmp_filter_ctx *ctx) {
  if (*ctx) seccomp_release(*ctx);
}
#define cleanup_seccomp __attribute__((cleanup(release_ctx)))

static int add_rule(scmp_filter_ctx ctx, uint32_t action, int nr, unsigned n,
                    const struct scmp_arg_cmp *cmp, const char *name, cm_error_t *err) {
  int rc = seccomp_rule_add_array(ctx, action, nr, n, cmp);
  if (rc < 0) return cm_error_set(err, -rc, CM_ERR_INTERNAL, "seccomp rule for %s", name);
  return 0;
}

/* Denies personality(v) for every v in [lo, hi] (32-bit values; the kernel ignores the
 * upper half of the register), as the fewest aligned masked blocks, since libseccomp allows
 * one comparison per argument and rule. */
static int deny_personality_range(scmp_filter_ctx ctx, int nr, uint64_t lo, uint64_t hi,
                                  cm_error_t *err) {
  while (lo <= hi) {
    uint64_t size = lo == 0 ? (uint64_t)1 << 32 : lo & -lo; /* largest block aligned at lo */
    while (lo + size - 1 > hi) size >>= 1;
    struct scmp_arg_cmp cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, (0xffffffffULL & ~(size - 1)), lo);
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, &cmp, "personality", err) < 0) return -1;
    lo += size;
  }
  return 0;
}

static int build_filter(void **bpf, size_t *len, cm_error_t *err) {
  cleanup_seccomp scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return cm_error_set(err, 0, CM_ERR_INTERNAL, "seccomp_init failed");
  /* Killing the whole process beats killing one thread of it on a foreign-ABI syscall. */
  if (seccomp_api_get() >= 3) seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
#if SCMP_VER_MAJOR > 2 || (SCMP_VER_MAJOR == 2 && SCMP_VER_MINOR >= 5)
  /* A binary search over syscall numbers instead of a linear chain: every syscall of the
   * script pays for the filter. */
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
#endif

  for (size_t i = 0; i < CM_ARRAY_SIZE(denied_syscalls); i++) {
    int nr = seccomp_syscall_resolve_name(denied_syscalls[i]);
    if (nr < 0) continue; /* unknown here, or a pseudo number for another architecture */
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0, NULL, denied_syscalls[i], err) < 0) return -1;
  }

  /* clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes glibc fall
   * back to clone(), whose flags we can check. */
  int nr = seccomp_syscall_resolve_name("clone3");
  if (nr >= 0 && add_rule(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0, NULL, "clone3", err) < 0) return -1;

  nr = seccomp_syscall_resolve_name("clone");
  for (size_t i = 0; nr >= 0 && i < CM_ARRAY_SIZE(clone_namespace_flags); i++) {
    uint64_t f = clone_namespace_flags[i];
    struct scmp_arg_cmp cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, f, f);
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, &cmp, "clone", err) < 0) return -1;
  }

  /* Terminal input injection and console control; the request is an unsigned int. */
  static const uint64_t denied_ioctls[] = {TIOCSTI, TIOCLINUX};
  nr = seccomp_syscall_resolve_name("ioctl");
  for (size_t i = 0; nr >= 0 && i < CM_ARRAY_SIZE(denied_ioctls); i++) {
    struct scmp_arg_cmp cmp = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffULL, denied_ioctls[i]);
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, &cmp, "ioctl", err) < 0) return -1;
  }

  /* personality: deny the gaps between the allowed values. */
  nr = seccomp_syscall_resolve_name("personality");
  if (nr >= 0) {
    uint64_t next = 0;
    for (size_t i = 0; i < CM_ARRAY_SIZE(allowed_personalities); i++) {
      uint64_t v = allowed_personalities[i];
      if (v > next && deny_personality_range(ctx, nr, next, v - 1, err) < 0) return -1;
      next = v + 1;
    }
    if (next <= 0xffffffffULL && deny_personality_range(ctx, nr, next, 0xffffffffULL, err) < 0)
      return -1;
  }

  cleanup_close int fd = memfd_create("mps-seccomp-export", MFD_CLOEXEC);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "memfd_create");
  int rc = seccomp_export_bpf(ctx, fd);
  if (rc < 0) return cm_error_set(err, -rc, CM_ERR_INTERNAL, "seccomp_export_bpf");
  off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0 || size % 8 != 0 || size > 65536)
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "seccomp program has an odd size (%lld)",
                        (long long)size);
  cleanup_free char *buf = xmalloc((size_t)size);
  if (pread(fd, buf, (size_t)size, 0) != size)
    return cm_error_set(err, errno, CM_ERR_IO, "reading the seccomp program back");
  *bpf = steal_pointer(&buf);
  *len = (size_t)size;
  return 0;
}

int sbx_seccomp_build(void **bpf, size_t *len, cm_error_t *err) {
  return build_filter(bpf, len, err);
}

int sbx_seccomp_fd(cm_error_t *err) {
  if (!cache.built) {
    if (build_filter(&cache.bpf, &cache.len, err) < 0)
      return cm_error_wrap(err, "building the seccomp filter");
    cache.built = true;
  }
  /* A fresh, sealed memfd per run: bwrap reads the fd to EOF, so each run needs its own
   * file offset, and the seals make sure nobody edits the program in between. */
  cleanup_close int fd = memfd_create("mps-seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "memfd_create");
  if (cm_write_all(fd, cache.bpf, cache.len) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "writing the seccomp program");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "sealing the seccomp program");
  if (lseek(fd, 0, SEEK_SET) < 0) return cm_error_set(err, errno, CM_ERR_IO, "lseek");
  return steal_fd(&fd);
}
