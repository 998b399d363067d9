/* The bubblewrap backend: turns a run spec into a `bwrap` command line.
 *
 * What the sandboxed script gets:
 *   - its own pid, ipc, uts, cgroup and network namespaces (the host's network namespace only
 *     for a spec with network and no egress: --network host); bwrap dies with the server
 *     (--die-with-parent) and the pid namespace dies with bwrap, so no process of a run
 *     outlives it.  With spec->egress the supervisor is also the namespace's forwarder to
 *     the server's egress proxy (drop.c --egress-fd): the only way out;
 *   - a root tmpfs (remounted read-only once set up) holding read-only /usr (and /bin,
 *     /sbin, /lib* as the host has them: usr-merge symlinks or binds), a minimal /etc (the
 *     loader cache, the time zone, read-only what libraries under /usr resolve through: the
 *     alternatives, fontconfig's configuration, matplotlibrc; a synthesized passwd/group
 *     with only root and the
 *     sandbox user, a synthesized hosts (localhost and the sandbox's name); with network TLS
 *     trust, the service databases and the resolver's configuration, and through the egress
 *     proxy a synthesized resolv.conf that names nothing of the host (the proxy resolves
 *     names: the host's resolvers, search domains and hosts entries are none of the
 *     sandbox's business), the host's resolv.conf and hosts only with --network host), fresh
 *     /proc and /dev, size-capped tmpfs
 *     /tmp and /dev/shm, the spec's read-only binds at their host paths (missing parents
 *     are created empty and 0755, so the rest of a home directory stays hidden), the work
 *     directory read-write at /work (the cwd), and the drop helper read-only;
 *   - a clean environment (exactly spec->envp, plus PWD=/work that bwrap sets), no
 *     controlling terminal, hostname "sandbox";
 *   - the seccomp filter of seccomp.c;
 *   - the drop helper (drop.c) as the last step: rlimits, then, when the server is root,
 *     a switch to a per-run unprivileged uid/gid without supplementary groups or
 *     capabilities, no_new_privs, exec.  The helper stays as the script's parent (pid 1:
 *     bwrap runs it --as-pid-1, which spares a process per run; the script is pid 2), a
 *     supervisor that reports the script's real wait status and usage on a status pipe and
 *     SIGTERMs the sandbox when the server closes a control pipe (see launch->status_fd and
 *     control_fd in sbx.h).
 *
 * As root, bwrap runs without a user namespace: mounts are made by real root (so
 * interpreters under 0700 /root can be bound), and the script's host uid is a real,
 * unprivileged one.  A user namespace mapped onto uid 0 would leave the script root on
 * the host for every root-owned file it can reach.  When the server is not root, bwrap
 * makes a user namespace and the script keeps the user's uid.
 *
 * Per-run uid (as root): one of uids.c's, reserved from build() until the run must be over, so
 * RLIMIT_NPROC, files, signals and the kernel's per-uid state belong to this run alone;
 * environment builds take one for all their steps (sbx_identity_new).
 *
 * The work directory stays on the host (the server collects output files from it after
 * the run) and, as root, is handed to the run's uid (chown of the tree, never following a
 * symlink) so the script can write there and nowhere else.  Its size is not capped here:
 * RLIMIT_FSIZE caps each file; a total cap needs a filesystem quota or a size-limited
 * mount the server makes before the run (see the notes in the issue). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"

#define BWRAP_DROP_IN_SANDBOX "/run/mps-sandbox-drop"
#define BWRAP_WORKDIR "/work"
#define BWRAP_HOSTNAME SBX_SANDBOX_HOSTNAME
/* /tmp when the spec gives no size: never unbounded (it is RAM). */
#define BWRAP_DEFAULT_TMP_BYTES (100ULL << 20)
/* /dev/shm (POSIX semaphores and shared memory for multiprocessing) gets the /tmp size up
 * to this cap. */
#define BWRAP_MAX_SHM_BYTES (64ULL << 20)
#define BWRAP_PROBE_TIMEOUT_MS 10000
#define BWRAP_PROBE_OUTPUT_MAX 4096
#define BWRAP_CHOWN_MAX_DEPTH 64

typedef struct bwrap_priv {
  char *bwrap_path;     /* set by sbx_bwrap_set_paths, or found by the probe */
  char *drop_path;      /* host path of the drop helper */
  char *version;        /* "0.8.0" */
  bool as_root;         /* geteuid() == 0: no user namespace, per-run uid drop */
  char **system_args;   /* host-layout-dependent mounts, computed by the probe */
  char **network_args;  /* the same, added when the spec asks for network */
  char **resolver_args; /* the host's resolv.conf and hosts: network without egress only */
  /* Regular files of /etc the sandbox gets as copies (bwrap --file from an fd opened per
   * run) rather than as bind mounts, which cost bwrap a mount and a remount each. */
  char **system_files, **network_files, **resolver_files;
} bwrap_priv_t;

#define BWRAP_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

/* ---------------------------------------------------------------- argv builder */

typedef struct argv_builder {
  cm_strv_builder_t args;
  char *dirs[64]; /* directories already emitted with --dir (a cache: overflow repeats them) */
  size_t n_dirs;
} argv_builder_t;

#define args_add1(a, s) cm_strv_add(&(a)->args, (s))
#define args_add(a, ...) cm_strv_addv(&(a)->args, __VA_ARGS__)
#define args_addf(a, ...) cm_strv_addf(&(a)->args, __VA_ARGS__)

/* Emits `--perms 0755 --dir D` for each ancestor D of path (not "/", not already made by
 * this builder): bwrap would otherwise create missing parents of a mount point 0700,
 * which the unprivileged sandbox uid cannot traverse. */
static void args_add_parents(argv_builder_t *a, const char *path) {
  cleanup_free char *dir = xstrdup(path);
  for (char *s = strchr(dir + 1, '/'); s; s = strchr(s + 1, '/')) {
    *s = '\0';
    bool seen = false;
    for (size_t i = 0; i < a->n_dirs && !seen; i++) seen = strcmp(a->dirs[i], dir) == 0;
    if (!seen) {
      if (a->n_dirs < CM_ARRAY_SIZE(a->dirs)) a->dirs[a->n_dirs++] = xstrdup(dir);
      args_add(a, "--perms", "0755", "--dir", dir, NULL);
    }
    *s = '/';
  }
}

static char **args_steal(argv_builder_t *a) {
  for (size_t i = 0; i < a->n_dirs; i++) free(a->dirs[i]);
  a->n_dirs = 0;
  return cm_strv_steal(&a->args);
}

/* ---------------------------------------------------------------- helpers */

static bwrap_priv_t *priv_of(sbx_backend_t *b) {
  if (!b->priv) b->priv = xcalloc(1, sizeof(bwrap_priv_t));
  return b->priv;
}

static bool path_is_under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Absolute, no empty, "." or ".." components, no trailing slash. */
static bool path_is_clean(const char *p) {
  if (p[0] != '/') return false;
  if (p[1] == '\0') return true;
  for (const char *s = p; *s;) {
    s++; /* past '/' */
    const char *e = strchrnul(s, '/');
    size_t n = (size_t)(e - s);
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
    s = e;
  }
  return true;
}

/* A memfd holding data, sealed, at offset 0: for bwrap's --file. */
static int data_fd(const char *name, const char *data, cm_error_t *err) {
  cleanup_close int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "memfd_create");
  if (cm_write_all(fd, data, strlen(data)) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "writing %s", name);
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "sealing %s", name);
  if (lseek(fd, 0, SEEK_SET) < 0) return cm_error_set(err, errno, CM_ERR_IO, "lseek");
  return steal_fd(&fd);
}

static int chown_tree_at(int dirfd_, uid_t uid, gid_t gid, int depth) {
  if (depth > BWRAP_CHOWN_MAX_DEPTH) return -1;
  int fd = fcntl(dirfd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fchownat(dirfd(d), e->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) rc = -1;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    cleanup_close int sub =
        openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0 && chown_tree_at(sub, uid, gid, depth + 1) < 0) rc = -1;
  }
  closedir(d);
  return rc;
}

/* Hands the work directory (and what the server put in it) to the run's uid, never
 * following a symlink. */
static int chown_workdir(const char *workdir, uid_t uid, gid_t gid, cm_error_t *err) {
  cleanup_close int fd = open(workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "open work directory %s", workdir);
  if (fchown(fd, uid, gid) < 0 || chown_tree_at(fd, uid, gid, 0) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "handing %s to the sandbox uid", workdir);
  return 0;
}

/* ---------------------------------------------------------------- host layout */

static void add_etc_file(argv_builder_t *a, cm_strv_builder_t *copies, const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0) return;
  if (S_ISLNK(st.st_mode)) {
    /* /etc/localtime and friends usually point into /usr, which is visible: keep them
     * symlinks (no mount) when the target is there, else bind what they resolve to. */
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
      target[n] = '\0';
      if (path_is_under(target, "/usr") && path_is_clean(target)) {
        args_add_parents(a, path);
        args_add(a, "--symlink", target, path, NULL);
        return;
      }
    }
    if (stat(path, &st) < 0) return;
  }
  if (S_ISREG(st.st_mode)) {
    cm_strv_add(copies, path);
    return;
  }
  if (!S_ISDIR(st.st_mode)) return;
  args_add_parents(a, path);
  /* -try: a directory that goes away after the probe must not fail every run. */
  args_add(a, "--ro-bind-try", path, path, NULL);
}

/* Adds `--file FD path` for each file of paths that is still a regular file, with the fd
 * into fds (at *n, at most max).  A file that went away is left out, as a -try bind would. */
static void add_file_copies(argv_builder_t *a, char *const *paths, int *fds, size_t *n,
                            size_t max) {
  for (char *const *path = paths; path && *path && *n < max; path++) {
    int fd = open(*path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0) continue;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      continue;
    }
    args_add_parents(a, *path);
    args_add(a, "--perms", "0644", "--file", NULL);
    args_addf(a, "%d", fd);
    args_add1(a, *path);
    fds[(*n)++] = fd;
  }
}

/* The mounts that depend only on the host: computed once, by the probe.  Every bind costs
 * bwrap a mount, a remount and a read of mountinfo (~0.1-0.2 ms of CPU), so /etc holds
 * only what the loader and the interpreter read; the resolver, TLS and service databases
 * come only with the network (network_args). */
static char **system_args_new(char ***files) {
  argv_builder_t a = {0};
  cm_strv_builder_t copies = {0};
  args_add(&a, "--ro-bind", "/usr", "/usr", NULL);
  static const char *const top[] = {"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(top); i++) {
    struct stat st;
    if (lstat(top[i], &st) < 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = readlink(top[i], target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      args_add(&a, "--symlink", target, top[i], NULL);
    } else if (S_ISDIR(st.st_mode)) {
      args_add(&a, "--ro-bind", top[i], top[i], NULL);
    }
  }
  args_add_parents(&a, "/etc/");
  /* What libraries under /usr resolve through: Debian's alternatives (libblas.so.3 and
   * liblapack.so.3 of python3-numpy are links through /etc/alternatives), python3-matplotlib's
   * matplotlibrc (Debian keeps it in /etc) and fontconfig's configuration (matplotlib asks
   * fc-list for fonts): without them the system interpreter's own packages cannot be imported,
   * or fill stderr with complaints. */
  static const char *const etc[] = {"/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives",
                                    "/etc/matplotlibrc", "/etc/fonts"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(etc); i++) add_etc_file(&a, &copies, etc[i]);
  *files = cm_strv_steal(&copies);
  return args_steal(&a);
}

/* With network: the resolver's configuration, TLS trust (never /etc/ssl/private) and the
 * service and protocol databases getaddrinfo() reads. */
static char **network_args_new(char ***files) {
  argv_builder_t a = {0};
  cm_strv_builder_t copies = {0};
  a.dirs[a.n_dirs++] = xstrdup("/etc");
  static const char *const etc[] = {
      "/etc/nsswitch.conf", "/etc/gai.conf",  "/etc/host.conf",       "/etc/services",
      "/etc/protocols",     "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates",
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(etc); i++) add_etc_file(&a, &copies, etc[i]);
  *files = cm_strv_steal(&copies);
  return args_steal(&a);
}

/* With the host's network (--network host: no egress proxy): the host's own resolvers and
 * hosts entries, which the sandbox then uses itself. */
static char **resolver_args_new(char ***files) {
  argv_builder_t a = {0};
  cm_strv_builder_t copies = {0};
  a.dirs[a.n_dirs++] = xstrdup("/etc");
  static const char *const etc[] = {"/etc/resolv.conf", "/etc/hosts"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(etc); i++) add_etc_file(&a, &copies, etc[i]);
  *files = cm_strv_steal(&copies);
  return args_steal(&a);
}

/* The hosts file of every sandbox but one on the host's network, and the resolv.conf of one
 * whose way out is the egress proxy (sandbox-internal.h: the container backends use them
 * too). */
#define BWRAP_HOSTS SBX_HOSTS_TEXT
#define BWRAP_RESOLV_CONF SBX_RESOLV_CONF_TEXT

/* ---------------------------------------------------------------- build */

/* Paths a read-only bind must not cover: our own mounts, and /etc, which would bring
 * back everything the minimal /etc leaves out. */
static int check_ro_bind(const char *p, cm_error_t *err) {
  if (!path_is_clean(p))
    return cm_error_set(err, 0, CM_ERR_INVALID, "read-only bind '%s' is not a clean absolute path",
                        p);
  static const char *const reserved[] = {"/proc", "/dev", "/sys", "/etc", "/run", BWRAP_WORKDIR};
  if (strcmp(p, "/") == 0 || strcmp(p, "/tmp") == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID, "read-only bind '%s' would cover the sandbox", p);
  for (size_t i = 0; i < CM_ARRAY_SIZE(reserved); i++) {
    if (path_is_under(p, reserved[i]))
      return cm_error_set(err, 0, CM_ERR_INVALID, "read-only bind '%s' is under reserved %s", p,
                          reserved[i]);
  }
  struct stat st;
  if (stat(p, &st) < 0)
    return cm_error_set(err, errno, errno == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO,
                        "read-only bind %s", p);
  return 0;
}

/* A mount target: a clean absolute path of its own, outside what the sandbox already
 * provides and the paths of the host that are bound at their own names. */
static bool mount_target_ok(const char *t) {
  if (!path_is_clean(t) || strcmp(t, "/") == 0) return false;
  if (strcmp(t, "/tmp") == 0) return true; /* in place of the tmpfs (not below it) */
  static const char *const reserved[] = {"/proc",  "/dev",  "/sys",  "/etc",       "/run",
                                         "/usr",   "/tmp",  "/bin",  "/sbin",      "/lib",
                                         "/lib64", "/root", "/home", BWRAP_WORKDIR};
  for (size_t i = 0; i < CM_ARRAY_SIZE(reserved); i++)
    if (path_is_under(t, reserved[i]) || path_is_under(reserved[i], t)) return false;
  return true;
}

static int check_spec(const sbx_spec_t *spec, cm_error_t *err) {
  if (!spec->workdir || !path_is_clean(spec->workdir))
    return cm_error_set(err, 0, CM_ERR_INVALID, "the work directory must be a clean absolute path");
  if (sbx_spec_check_common(spec, err) < 0) return -1;
  struct stat st;
  for (char *const *p = spec->ro_binds; p && *p; p++) {
    if (check_ro_bind(*p, err) < 0) return -1;
  }
  for (size_t i = 0; i < spec->n_mounts; i++) {
    const sbx_mount_t *m = &spec->mounts[i];
    if (!m->host || !path_is_clean(m->host))
      return cm_error_set(err, 0, CM_ERR_INVALID, "mount source '%s' is not a clean absolute path",
                          m->host ? m->host : "(null)");
    if (stat(m->host, &st) < 0 || !S_ISDIR(st.st_mode))
      return cm_error_set(err, errno, CM_ERR_NOT_FOUND, "mount source %s is not a directory",
                          m->host);
    if (!m->target || !mount_target_ok(m->target))
      return cm_error_set(err, 0, CM_ERR_INVALID, "mount target '%s' is not allowed",
                          m->target ? m->target : "(null)");
  }
  return 0;
}

/* Hands a writable mount's directory to the sandbox's uid: the top directory always, the
 * tree below only when the top changes owner (a cache handed over before stays as is). */
static int hand_over(const char *dir, uid_t uid, gid_t gid, cm_error_t *err) {
  struct stat st;
  if (lstat(dir, &st) < 0) return cm_error_set(err, errno, CM_ERR_IO, "stat %s", dir);
  if (st.st_uid == uid && st.st_gid == gid) return 0;
  return chown_workdir(dir, uid, gid, err);
}

/* ---------------------------------------------------------------- the mount plan */

typedef struct plan_fds {
  int fds[8];
  size_t n;
} plan_fds_t;

static void plan_fds_close(plan_fds_t *f) {
  for (size_t i = 0; i < f->n; i++)
    if (f->fds[i] >= 0) close(f->fds[i]);
}
#define cleanup_fds __attribute__((cleanup(plan_fds_close)))
#define cleanup_mount_plan __attribute__((cleanup(sbx_mount_plan_free)))

/* The plan as bwrap's arguments: files with data as sealed memfds (--file), binds and capped
 * tmpfs mounts with their parents made 0755 first. */
static int render_mounts(argv_builder_t *a, const sbx_mount_plan_t *plan, int *fds, size_t *n_fds,
                         size_t max_fds, cm_error_t *err) {
  for (size_t i = 0; i < plan->n; i++) {
    const sbx_mount_op_t *op = &plan->ops[i];
    char mode[16];
    snprintf(mode, sizeof mode, "%04o", op->mode);
    args_add_parents(a, op->target);
    switch (op->kind) {
      case SBX_MOUNT_FILE:
        if (op->source) {
          args_add(a, "--ro-bind", op->source, op->target, NULL);
          break;
        }
        if (*n_fds >= max_fds)
          return cm_error_set(err, 0, CM_ERR_INTERNAL, "too many files in a mount plan");
        cleanup_free char *name = xasprintf("mps-%s", op->name ? op->name : "file");
        int fd = data_fd(name, op->data, err);
        if (fd < 0) return -1;
        fds[(*n_fds)++] = fd;
        args_add(a, "--perms", mode, "--file", NULL);
        args_addf(a, "%d", fd);
        args_add1(a, op->target);
        break;
      case SBX_MOUNT_TMPFS:
        args_add(a, "--size", NULL);
        args_addf(a, "%llu", (unsigned long long)op->size);
        args_add(a, "--perms", mode, "--tmpfs", op->target, NULL);
        break;
      case SBX_MOUNT_RO_BIND:
      case SBX_MOUNT_BIND:
        args_add(a, op->kind == SBX_MOUNT_BIND ? "--bind" : "--ro-bind", op->source, op->target,
                 NULL);
        if (op->workdir) args_add(a, "--chdir", op->target, NULL);
        break;
    }
  }
  return 0;
}

int sbx_bwrap_render_mounts(const sbx_mount_plan_t *plan, cm_strv_builder_t *out, int *fds,
                            size_t *n_fds, size_t max_fds, cm_error_t *err) {
  argv_builder_t a = {0};
  /* As in a run: made by the system mounts already. */
  a.dirs[a.n_dirs++] = xstrdup("/etc");
  a.dirs[a.n_dirs++] = xstrdup("/tmp");
  a.dirs[a.n_dirs++] = xstrdup("/dev");
  int rc = render_mounts(&a, plan, fds, n_fds, max_fds, err);
  char **v = args_steal(&a);
  for (char **s = v; rc == 0 && *s; s++) cm_strv_add(out, *s);
  cm_strv_free(v);
  return rc;
}

static int bwrap_build(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch,
                       cm_error_t *err) {
  bwrap_priv_t *p = priv_of(b);
  if (!p->bwrap_path || !p->drop_path || !p->system_args || !p->network_args || !p->resolver_args)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the bwrap backend was not probed");
  if (check_spec(spec, err) < 0) return -1;

  uid_t uid = !p->as_root ? getuid()
              : spec->identity && spec->identity->has_uid
                  ? spec->identity->uid
                  : sbx_uid_take(&spec->limits, &launch->uid_slot);
  gid_t gid = p->as_root ? (gid_t)uid : getgid();
  /* Handed over once: a later run of the same identity (the next step of a build) finds the
   * tree its own already, and the server never walks what a sandbox wrote. */
  if (p->as_root && hand_over(spec->workdir, uid, gid, err) < 0) return -1;
  for (size_t i = 0; i < spec->n_mounts && p->as_root; i++)
    if (spec->mounts[i].writable && hand_over(spec->mounts[i].host, uid, gid, err) < 0) return -1;

  cleanup_close int seccomp_fd = sbx_seccomp_fd(err);
  if (seccomp_fd < 0) return -1;
  cleanup_free char *passwd = xasprintf(
      "root:x:0:0:root:/root:/usr/sbin/nologin\n"
      "sandbox:x:%u:%u:sandbox:" BWRAP_WORKDIR ":/usr/sbin/nologin\n",
      (unsigned)uid, (unsigned)gid);
  cleanup_free char *group = xasprintf("root:x:0:\nsandbox:x:%u:\n", (unsigned)gid);
  /* The channel to the supervisor (drop.c): the sandbox gets the status pipe's write end
   * and the control pipe's read end, the server keeps the other two. */
  int status_pipe[2] = {-1, -1}, control_pipe[2] = {-1, -1};
  if (pipe2(status_pipe, O_CLOEXEC) < 0) return cm_error_set(err, errno, CM_ERR_IO, "pipe2");
  cleanup_close int status_read = status_pipe[0], status_write = status_pipe[1];
  if (pipe2(control_pipe, O_CLOEXEC) < 0) return cm_error_set(err, errno, CM_ERR_IO, "pipe2");
  cleanup_close int control_read = control_pipe[0], control_write = control_pipe[1];
  if (cm_set_nonblock(status_read, true) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "fcntl(O_NONBLOCK)");
  /* Only a sandbox on the host's network (network without egress) sees the host's resolver
   * files; every other gets its own (the plan's). */
  bool host_network = sbx_spec_host_network(spec);
  sbx_mount_plan_in_t plan_in = {
      .workdir_target = BWRAP_WORKDIR,
      .default_tmp_bytes = BWRAP_DEFAULT_TMP_BYTES,
      .max_shm_bytes = BWRAP_MAX_SHM_BYTES,
      .passwd = {.data = passwd},
      .group = {.data = group},
      .hosts = {.data = BWRAP_HOSTS},
      .resolv = {.data = BWRAP_RESOLV_CONF},
  };
  cleanup_mount_plan sbx_mount_plan_t plan;
  sbx_mount_plan_build(spec, &plan_in, &plan);
  cleanup_fds plan_fds_t plan_fds = {.n = 0};

  argv_builder_t a = {0};
  /* Made by the system mounts already (/dev: by --dev). */
  a.dirs[a.n_dirs++] = xstrdup("/etc");
  a.dirs[a.n_dirs++] = xstrdup("/tmp");
  a.dirs[a.n_dirs++] = xstrdup("/dev");
  args_add(&a, p->bwrap_path, NULL);
  if (!p->as_root) args_add(&a, "--unshare-user", NULL);
  args_add(&a, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup", NULL);
  /* A namespace of its own unless the spec asks for the host's (network without egress). */
  if (!spec->network || spec->egress) args_add(&a, "--unshare-net", NULL);
  /* No --new-session: sbx_spawn() already starts bwrap without a controlling terminal (a
   * process group of its own, and a new session when the server has a terminal; stdin is
   * /dev/null, output goes to pipes), the drop helper leaves any terminal that is still
   * reachable, and seccomp denies TIOCSTI/TIOCLINUX.  A session would only add its
   * leader's exit, which costs milliseconds of wall clock per run on our machines. */
  /* The drop helper's supervisor is the namespace's pid 1 (a reaper already): no init
   * process of bwrap's in between, one fork and one process less per run. */
  args_add(&a, "--as-pid-1", "--die-with-parent", "--hostname", BWRAP_HOSTNAME, "--clearenv", NULL);
  for (char *const *e = spec->envp; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    cleanup_free char *name = xstrndup(*e, (size_t)(eq - *e));
    args_add(&a, "--setenv", name, eq + 1, NULL);
  }
  for (char **s = p->system_args; *s; s++) args_add1(&a, *s);
  /* Copies, closed by the caller once bwrap runs (launch->pass_fds, filled last). */
  int copy_fds[16];
  size_t n_copies = 0;
  add_file_copies(&a, p->system_files, copy_fds, &n_copies, CM_ARRAY_SIZE(copy_fds));
  if (spec->network) {
    for (char **s = p->network_args; *s; s++) args_add1(&a, *s);
    add_file_copies(&a, p->network_files, copy_fds, &n_copies, CM_ARRAY_SIZE(copy_fds));
    /* Over the host's bundle (bound with /etc/ssl/certs just above). */
    if (spec->ca_bundle) {
      args_add_parents(&a, BWRAP_CA_BUNDLE);
      args_add(&a, "--ro-bind", spec->ca_bundle, BWRAP_CA_BUNDLE, NULL);
    }
  }
  if (host_network) {
    for (char **s = p->resolver_args; *s; s++) args_add1(&a, *s);
    add_file_copies(&a, p->resolver_files, copy_fds, &n_copies, CM_ARRAY_SIZE(copy_fds));
  }
  args_add(&a, "--proc", "/proc", "--dev", "/dev", NULL);
  /* The run's own mounts and files: /etc's files are plain files in the root tmpfs (no mount
   * each), owned by root, read-only once the root is remounted read-only below. */
  if (render_mounts(&a, &plan, plan_fds.fds, &plan_fds.n, CM_ARRAY_SIZE(plan_fds.fds), err) < 0) {
    for (size_t i = 0; i < n_copies; i++) close(copy_fds[i]);
    cm_strv_free(args_steal(&a));
    return -1;
  }
  args_add_parents(&a, BWRAP_DROP_IN_SANDBOX);
  args_add(&a, "--ro-bind", p->drop_path, BWRAP_DROP_IN_SANDBOX, NULL);
  /* Nothing may be written into the root tmpfs itself (it has no size limit); only /work,
   * /tmp and /dev/shm are writable. */
  args_add(&a, "--remount-ro", "/", NULL);
  args_add(&a, "--seccomp", NULL);
  args_addf(&a, "%d", seccomp_fd);

  /* The drop helper and its limits, then the command. */
  args_add(&a, "--", BWRAP_DROP_IN_SANDBOX, NULL);
  if (p->as_root) {
    args_add(&a, "--uid", NULL);
    args_addf(&a, "%u", (unsigned)uid);
    args_add(&a, "--gid", NULL);
    args_addf(&a, "%u", (unsigned)gid);
  }
  args_add(&a, "--status-fd", NULL);
  args_addf(&a, "%d", status_write);
  args_add(&a, "--control-fd", NULL);
  args_addf(&a, "%d", control_read);
  cleanup_close int egress_fd = -1;
  if (spec->network && spec->egress) {
    if (spec->egress->fd < 0 || spec->egress->port < 1024)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "an egress channel needs an fd and a port above 1023");
    egress_fd = fcntl(spec->egress->fd, F_DUPFD_CLOEXEC, 3);
    if (egress_fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "duplicating the egress channel");
    args_add(&a, "--egress-fd", NULL);
    args_addf(&a, "%d", egress_fd);
    args_add(&a, "--egress-port", NULL);
    args_addf(&a, "%u", (unsigned)spec->egress->port);
  }
  if (spec->hold && !spec->hold_in_command) args_add(&a, "--wait-go", NULL);
  const sbx_limits_t *l = &spec->limits;
  const struct {
    const char *flag;
    uint64_t value;
  } limits[] = {
      {"--as", l->memory_bytes},       {"--cpu", l->cpu_seconds},   {"--nproc", l->max_processes},
      {"--fsize", l->file_size_bytes}, {"--nofile", l->open_files},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(limits); i++) {
    if (!limits[i].value) continue;
    args_add(&a, limits[i].flag, NULL);
    args_addf(&a, "%llu", (unsigned long long)limits[i].value);
  }
  args_add(&a, "--", NULL);
  for (char *const *s = spec->argv; *s; s++) args_add1(&a, *s);

  launch->argv = args_steal(&a);
  launch->envp = xcalloc(1, sizeof(char *)); /* bwrap itself needs no environment */
  launch->set_rlimits = false;               /* the drop helper applies them */
  size_t n = 0;
  launch->pass_fds[n++] = steal_fd(&seccomp_fd);
  for (size_t i = 0; i < plan_fds.n; i++) launch->pass_fds[n++] = steal_fd(&plan_fds.fds[i]);
  launch->pass_fds[n++] = steal_fd(&status_write);
  launch->pass_fds[n++] = steal_fd(&control_read);
  if (egress_fd >= 0) launch->pass_fds[n++] = steal_fd(&egress_fd);
  for (size_t i = 0; i < n_copies; i++) launch->pass_fds[n++] = copy_fds[i];
  launch->status_fd = steal_fd(&status_read);
  launch->control_fd = steal_fd(&control_write);
  return 0;
}

static void bwrap_identity_new(sbx_backend_t *b, sbx_identity_t *id) {
  if (priv_of(b)->as_root) sbx_uid_identity_new(id);
}

static void bwrap_identity_release(sbx_backend_t *b, sbx_identity_t *id) {
  sbx_uid_identity_release(id);
}

static void bwrap_reserve(sbx_backend_t *b, const sbx_launch_t *launch, uint64_t until_ms) {
  sbx_uid_reserve(launch->uid_slot, until_ms);
}

/* ---------------------------------------------------------------- probe */

static char *output_excerpt(const cm_buf_t *b) {
  size_t len = b->len;
  while (len > 0 && (b->data[len - 1] == '\n' || b->data[len - 1] == ' ')) len--;
  return len ? cm_log_excerpt(b->data, len, 400) : xstrdup("no output");
}

static int find_bwrap(bwrap_priv_t *p, cm_error_t *err) {
  if (p->bwrap_path) {
    if (access(p->bwrap_path, X_OK) < 0)
      return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "bubblewrap not found at %s",
                          p->bwrap_path);
    return 0;
  }
  const char *env = getenv("MPS_BWRAP");
  p->bwrap_path = cm_find_executable(env && *env ? env : "bwrap");
  if (!p->bwrap_path)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "bubblewrap (%s) not found; install the bubblewrap package",
                        env && *env ? env : "bwrap in PATH");
  if (p->bwrap_path[0] != '/') {
    char *abs = realpath(p->bwrap_path, NULL);
    if (!abs) return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "%s", p->bwrap_path);
    free(p->bwrap_path);
    p->bwrap_path = abs;
  }
  return 0;
}

static int check_drop_helper(bwrap_priv_t *p, const char *path, cm_error_t *err) {
  struct stat st;
  if (stat(path, &st) < 0) return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "%s", path);
  if (!S_ISREG(st.st_mode) || access(path, X_OK) < 0)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s is not an executable file", path);
  if (p->as_root) {
    /* It runs as root with every capability inside the sandbox: whoever can replace it
     * owns the host. */
    if (st.st_uid != 0 || (st.st_mode & 022))
      return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                          "%s must be owned by root and writable only by root", path);
    cleanup_free char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    struct stat dst;
    if (stat(*dir ? dir : "/", &dst) < 0 || dst.st_uid != 0 ||
        ((dst.st_mode & 022) && !(dst.st_mode & S_ISVTX)))
      return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                          "the directory of %s must be owned by root and writable only by root",
                          path);
  }
  return 0;
}

static int find_drop_helper(bwrap_priv_t *p, cm_error_t *err) {
  if (!p->drop_path) p->drop_path = sbx_helper_path(SBX_HELPER_DROP, err);
  if (!p->drop_path) return -1;
  return check_drop_helper(p, p->drop_path, err);
}

/* The probe runs in steps, each from a callback of the loop: the file checks and
 * `bwrap --version`, then one trivial sandbox with the same argv shape as a run and
 * /bin/true as the command, then the verdict on it. */
typedef struct bwrap_probe_state {
  sbx_backend_t *b;
  char *dir; /* the trivial sandbox's work directory */
  sbx_launch_t launch;
} bwrap_probe_state_t;

static void probe_state_free(void *data) {
  bwrap_probe_state_t *st = data;
  sbx_launch_close_channel(&st->launch);
  sbx_launch_release(&st->launch);
  if (st->dir) {
    cm_error_t rm_err = CM_ERROR_INIT;
    cm_rm_rf(st->dir, &rm_err);
    cm_error_release(&rm_err);
    free(st->dir);
  }
  free(st);
}

static void probe_sandbox_done(sbx_probe_t *probe, const sbx_probe_result_t *r) {
  bwrap_probe_state_t *st = sbx_probe_state(probe);
  cm_error_t err = CM_ERROR_INIT;
  if (r->rc < 0) {
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "%s", cm_error_message(r->err));
  } else if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0) {
    cleanup_free char *why = output_excerpt(r->errout);
    if (WIFEXITED(r->status))
      cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "bwrap cannot create the sandbox (exit %d): %s",
                   WEXITSTATUS(r->status), why);
    else
      cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "bwrap cannot create the sandbox (signal %d): %s",
                   WTERMSIG(r->status), why);
  } else {
    /* Without the record every run's exit status and usage would be unknown: a helper from
     * another version, say. */
    sbx_status_record_t rec;
    if (sbx_status_read(st->launch.status_fd, &rec) != 1 || !WIFEXITED(rec.wait_status) ||
        WEXITSTATUS(rec.wait_status) != 0)
      cm_error_set(&err, 0, CM_ERR_UNAVAILABLE,
                   "the drop helper %s did not report the exit status of a test command",
                   priv_of(st->b)->drop_path);
  }
  sbx_probe_finish(probe, &err);
}

static int probe_sandbox_start(sbx_backend_t *b, sbx_probe_t *probe, cm_error_t *err) {
  const char *tmpdir = getenv("TMPDIR");
  bwrap_probe_state_t *st = xcalloc(1, sizeof *st);
  st->b = b;
  st->launch = (sbx_launch_t)SBX_LAUNCH_INIT;
  sbx_probe_set_state(probe, st, probe_state_free);
  st->dir = xasprintf("%s/mps-bwrap-probe-XXXXXX", tmpdir && tmpdir[0] == '/' ? tmpdir : "/tmp");
  if (!mkdtemp(st->dir)) {
    cm_error_set(err, errno, CM_ERR_IO, "mkdtemp %s", st->dir);
    free(st->dir);
    st->dir = NULL;
    return -1;
  }
  char *const argv[] = {access("/usr/bin/true", X_OK) == 0 ? "/usr/bin/true" : "/bin/true", NULL};
  char *const envp[] = {"PATH=/usr/bin:/bin", NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = st->dir,
      .limits = {.timeout_ms = BWRAP_PROBE_TIMEOUT_MS,
                 .memory_bytes = 256ULL << 20,
                 .max_processes = 16,
                 .open_files = 64,
                 .file_size_bytes = 1 << 20,
                 .tmp_bytes = 1 << 20},
  };
  if (bwrap_build(b, &spec, &st->launch, err) < 0) return -1;
  size_t n = 0;
  while (n < CM_ARRAY_SIZE(st->launch.pass_fds) && st->launch.pass_fds[n] >= 0) n++;
  return sbx_probe_command(probe, st->launch.argv, NULL, st->launch.pass_fds, n,
                           BWRAP_PROBE_TIMEOUT_MS, BWRAP_PROBE_OUTPUT_MAX, probe_sandbox_done, err);
}

static void probe_version_done(sbx_probe_t *probe, const sbx_probe_result_t *r) {
  sbx_backend_t *b = sbx_probe_state(probe);
  bwrap_priv_t *p = priv_of(b);
  sbx_probe_set_state(probe, NULL, NULL);
  cm_error_t err = CM_ERROR_INIT;
  if (r->rc < 0) {
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "%s", cm_error_message(r->err));
    sbx_probe_finish(probe, &err);
    return;
  }
  if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0) {
    cleanup_free char *why = output_excerpt(r->errout);
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "%s --version failed: %s", p->bwrap_path, why);
    sbx_probe_finish(probe, &err);
    return;
  }
  const char *v = r->out->data ? strstr(r->out->data, "bubblewrap ") : NULL;
  free(p->version);
  p->version = v ? xstrndup(v + 11, strcspn(v + 11, " \r\n")) : xstrdup("(unknown version)");
  if (!p->system_args) p->system_args = system_args_new(&p->system_files);
  if (!p->network_args) p->network_args = network_args_new(&p->network_files);
  if (!p->resolver_args) p->resolver_args = resolver_args_new(&p->resolver_files);
  if (probe_sandbox_start(b, probe, &err) < 0) sbx_probe_finish(probe, &err);
}

static void bwrap_probe(sbx_backend_t *b, sbx_probe_t *probe) {
  bwrap_priv_t *p = priv_of(b);
  cm_error_t err = CM_ERROR_INIT;
  p->as_root = geteuid() == 0;
  if (find_bwrap(p, &err) < 0 || find_drop_helper(p, &err) < 0) {
    sbx_probe_finish(probe, &err);
    return;
  }
  char *argv[] = {p->bwrap_path, "--version", NULL};
  /* The state of this step is the backend itself (nothing to free). */
  sbx_probe_set_state(probe, b, NULL);
  if (sbx_probe_command(probe, argv, NULL, NULL, 0, BWRAP_PROBE_TIMEOUT_MS, BWRAP_PROBE_OUTPUT_MAX,
                        probe_version_done, &err) < 0)
    sbx_probe_finish(probe, &err);
}

/* ---------------------------------------------------------------- the rest */

static char *bwrap_describe(sbx_backend_t *b) {
  bwrap_priv_t *p = priv_of(b);
  if (!p->version) return xasprintf("bubblewrap (%s)", p->bwrap_path ? p->bwrap_path : "bwrap");
  return xasprintf(
      "bubblewrap %s (%s): pid/ipc/uts/cgroup/network namespaces, %s, no capabilities, "
      "no_new_privs, "
      "seccomp filter, rlimits, capped /tmp; network per the policy (a forwarder to the egress "
      "proxy)",
      p->version, p->bwrap_path,
      p->as_root ? "per-run unprivileged uid" : "user namespace with the server's uid");
}

static void bwrap_free(sbx_backend_t *b) {
  bwrap_priv_t *p = b->priv;
  if (!p) return;
  free(p->bwrap_path);
  free(p->drop_path);
  free(p->version);
  cm_strv_free(p->system_args);
  cm_strv_free(p->network_args);
  cm_strv_free(p->resolver_args);
  cm_strv_free(p->system_files);
  cm_strv_free(p->network_files);
  cm_strv_free(p->resolver_files);
  free(p);
  b->priv = NULL;
}

void sbx_bwrap_set_paths(sbx_backend_t *b, const char *bwrap_path, const char *drop_path) {
  bwrap_priv_t *p = priv_of(b);
  if (bwrap_path) {
    free(p->bwrap_path);
    p->bwrap_path = xstrdup(bwrap_path);
  }
  if (drop_path) {
    free(p->drop_path);
    p->drop_path = xstrdup(drop_path);
  }
}

const sbx_backend_ops_t sbx_bwrap_ops = {
    .name = "bwrap",
    .maps_paths = true,
    .can_hold = true,
    .can_egress = true,
    .host_processes = true,
    .reserve = bwrap_reserve,
    .identity_new = bwrap_identity_new,
    .identity_release = bwrap_identity_release,
    .probe = bwrap_probe,
    .build = bwrap_build,
    .describe = bwrap_describe,
    .free = bwrap_free,
};
