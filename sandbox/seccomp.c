/* The syscall policy of every backend that isolates: one table, rendered as the BPF program
 * bubblewrap loads (--seccomp FD) just before it execs the drop helper, and as the OCI seccomp
 * profile docker and podman load (--security-opt seccomp=FILE, docker.c) before they exec the
 * container's init.  One source, so a backend cannot drift from another on a syscall
 * (tests/unit/test_seccomp.c runs both renderings over the same inputs).
 *
 * A denylist on top of default-allow: it removes what a Python script never needs and what
 * widens the kernel's attack surface or lets a process reach beyond its sandbox (other
 * processes' memory, namespaces, mounts, keyrings, BPF, modules, io_uring, file watches
 * on what runs share, terminal injection).  The rest of the isolation comes from the namespaces,
 * the uid drop and no_new_privs; this filter is one more wall, not the only one.
 *
 * It stays in force for the drop helper (and the container's init), so it must let that
 * helper drop privileges: setresuid/setresgid/setgroups/capset/prctl/setrlimit are allowed.
 * It is installed after the sandbox's namespaces exist (bubblewrap and the engine make them
 * first), so denying namespace creation binds the script alone.
 *
 * Foreign ABIs (i386 int 0x80, x32) are not described by the native filter, so libseccomp's
 * bad-arch action applies to them: the process is killed.  The OCI profile names the native
 * architecture alone for the same reason. */
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
    /* file watches: a run watching what every run shares (the read-only interpreter and
     * environments) would see other runs' imports as they happen */
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
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

/* ---------------------------------------------------------------- the table */

typedef struct rule_table {
  bool built;
  sbx_seccomp_rule_t *rules;
  size_t n, cap;
} rule_table_t;

static rule_table_t table;

static void table_add(rule_table_t *t, const char *syscall, int errno_value, int arg, uint64_t mask,
                      uint64_t value) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 128;
    t->rules = xrealloc(t->rules, t->cap * sizeof *t->rules);
  }
  t->rules[t->n++] = (sbx_seccomp_rule_t){syscall, errno_value, arg, mask, value};
}

/* Denies personality(v) for every v in [lo, hi] (32-bit values; the kernel ignores the
 * upper half of the register), as the fewest aligned masked blocks, since a rule compares
 * one argument once. */
static void deny_personality_range(rule_table_t *t, uint64_t lo, uint64_t hi) {
  while (lo <= hi) {
    uint64_t size = lo == 0 ? (uint64_t)1 << 32 : lo & -lo; /* largest block aligned at lo */
    while (lo + size - 1 > hi) size >>= 1;
    table_add(t, "personality", EPERM, 0, 0xffffffffULL & ~(size - 1), lo);
    lo += size;
  }
}

static void table_build(rule_table_t *t) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(denied_syscalls); i++)
    table_add(t, denied_syscalls[i], EPERM, -1, 0, 0);

  /* clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes glibc fall
   * back to clone(), whose flags we can check. */
  table_add(t, "clone3", ENOSYS, -1, 0, 0);
  for (size_t i = 0; i < CM_ARRAY_SIZE(clone_namespace_flags); i++)
    table_add(t, "clone", EPERM, 0, clone_namespace_flags[i], clone_namespace_flags[i]);

  /* Terminal input injection and console control; the request is an unsigned int. */
  static const uint64_t denied_ioctls[] = {TIOCSTI, TIOCLINUX};
  for (size_t i = 0; i < CM_ARRAY_SIZE(denied_ioctls); i++)
    table_add(t, "ioctl", EPERM, 1, 0xffffffffULL, denied_ioctls[i]);

  /* personality: deny the gaps between the allowed values. */
  uint64_t next = 0;
  for (size_t i = 0; i < CM_ARRAY_SIZE(allowed_personalities); i++) {
    uint64_t v = allowed_personalities[i];
    if (v > next) deny_personality_range(t, next, v - 1);
    next = v + 1;
  }
  if (next <= 0xffffffffULL) deny_personality_range(t, next, 0xffffffffULL);
}

const sbx_seccomp_rule_t *sbx_seccomp_rules(size_t *n) {
  if (!table.built) {
    table_build(&table);
    table.built = true;
  }
  *n = table.n;
  return table.rules;
}

int sbx_seccomp_resolve(const char *syscall) {
  int nr = seccomp_syscall_resolve_name(syscall);
  return nr < 0 ? -1 : nr; /* unknown here, or a pseudo number for another architecture */
}

/* ---------------------------------------------------------------- the native filter */

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

  size_t n;
  const sbx_seccomp_rule_t *rules = sbx_seccomp_rules(&n);
  for (size_t i = 0; i < n; i++) {
    const sbx_seccomp_rule_t *r = &rules[i];
    int nr = sbx_seccomp_resolve(r->syscall);
    if (nr < 0) continue;
    struct scmp_arg_cmp cmp = {
        .arg = (unsigned)(r->arg < 0 ? 0 : r->arg),
        .op = SCMP_CMP_MASKED_EQ,
        .datum_a = r->mask,
        .datum_b = r->value,
    };
    int rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO((uint32_t)r->errno_value), nr,
                                    r->arg < 0 ? 0 : 1, &cmp);
    if (rc < 0) return cm_error_set(err, -rc, CM_ERR_INTERNAL, "seccomp rule for %s", r->syscall);
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

/* ---------------------------------------------------------------- the OCI profile */

/* libseccomp's architecture tokens and the names OCI profiles give them. */
static const struct {
  uint32_t token;
  const char *name;
} oci_arches[] = {
    {SCMP_ARCH_X86_64, "SCMP_ARCH_X86_64"},   {SCMP_ARCH_X86, "SCMP_ARCH_X86"},
    {SCMP_ARCH_X32, "SCMP_ARCH_X32"},         {SCMP_ARCH_AARCH64, "SCMP_ARCH_AARCH64"},
    {SCMP_ARCH_ARM, "SCMP_ARCH_ARM"},         {SCMP_ARCH_PPC64LE, "SCMP_ARCH_PPC64LE"},
    {SCMP_ARCH_PPC64, "SCMP_ARCH_PPC64"},     {SCMP_ARCH_S390X, "SCMP_ARCH_S390X"},
    {SCMP_ARCH_MIPS64, "SCMP_ARCH_MIPS64"},   {SCMP_ARCH_MIPSEL64, "SCMP_ARCH_MIPSEL64"},
#ifdef SCMP_ARCH_RISCV64
    {SCMP_ARCH_RISCV64, "SCMP_ARCH_RISCV64"},
#endif
};

const char *sbx_seccomp_oci_arch(void) {
  uint32_t native = seccomp_arch_native();
  for (size_t i = 0; i < CM_ARRAY_SIZE(oci_arches); i++)
    if (oci_arches[i].token == native) return oci_arches[i].name;
  return NULL;
}

char *sbx_seccomp_oci_json(cm_error_t *err) {
  const char *arch = sbx_seccomp_oci_arch();
  if (!arch) {
    cm_error_set(err, 0, CM_ERR_UNSUPPORTED,
                 "no OCI seccomp profile for this architecture (libseccomp token %#x)",
                 (unsigned)seccomp_arch_native());
    return NULL;
  }
  cm_buf_t b;
  cm_buf_init(&b, 0);
  /* Only the native architecture, as the native filter: a foreign ABI's syscall (i386
   * int 0x80, x32) meets the runtime's bad-architecture action, never the default allow. */
  cm_buf_printf(&b,
                "{\n  \"defaultAction\": \"SCMP_ACT_ALLOW\",\n  \"architectures\": [\"%s\"],\n"
                "  \"syscalls\": [",
                arch);
  size_t n;
  const sbx_seccomp_rule_t *rules = sbx_seccomp_rules(&n);
  const char *sep = "";
  for (size_t i = 0; i < n; i++) {
    const sbx_seccomp_rule_t *r = &rules[i];
    /* The same names as the native filter: those this libseccomp knows here. */
    if (sbx_seccomp_resolve(r->syscall) < 0) continue;
    cm_buf_printf(&b,
                  "%s\n    {\"names\": [\"%s\"], \"action\": \"SCMP_ACT_ERRNO\", \"errnoRet\": %d",
                  sep, r->syscall, r->errno_value);
    /* value is the mask and valueTwo the datum, as libseccomp's SCMP_CMP_MASKED_EQ takes
     * them (runc and crun hand them over in that order). */
    if (r->arg >= 0)
      cm_buf_printf(&b,
                    ", \"args\": [{\"index\": %d, \"value\": %llu, \"valueTwo\": %llu, \"op\": "
                    "\"SCMP_CMP_MASKED_EQ\"}]",
                    r->arg, (unsigned long long)r->mask, (unsigned long long)r->value);
    cm_buf_appends(&b, "}");
    sep = ",";
  }
  cm_buf_appends(&b, "\n  ]\n}\n");
  return cm_buf_steal(&b);
}
