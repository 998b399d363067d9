/* The docker and podman backends: turn a run spec into a `docker run` (or `podman run`)
 * command line, started under the host side of the drop helper, and kill the container by
 * name, because killing the client does not stop a container.
 *
 * What the script gets (see docker_build for the exact argv):
 *   - the image's root file system read-only (--read-only), a size-capped tmpfs /tmp and a
 *     capped /dev/shm, the work directory read-write at /work (the cwd), the spec's mounts at
 *     their targets (ro or rw) and its read-only binds at their host paths;
 *   - no capabilities (--cap-drop ALL), no_new_privs, a non-root uid, a private ipc
 *     namespace, and a network namespace with nothing but loopback (--network none).
 *     The seccomp profile is the native filter's table (seccomp.c) rendered for OCI, not the
 *     engine's default (which lets podman's scripts make user namespaces and docker's set up
 *     io_uring): --security-opt seccomp=FILE, the file written by the probe (see
 *     write_container_files); the engine installs it before it execs pid 1.  /etc/passwd and
 *     /etc/group are bubblewrap's (root and "sandbox"), bound read-only.  With
 *     the network on and an egress channel, the supervisor forwards 127.0.0.1:PORT (and
 *     every 127.x address, for builds' per-index origins) to the server's egress proxy,
 *     exactly as under bubblewrap; only a spec with network and no egress (--network host)
 *     gets the engine's bridge;
 *   - pid 1 is mps-container-init (drop.c, linked statically), bind-mounted read-only at /.mps-drop
 * (--entrypoint; in place of --init): it reaps, forwards egress, SIGTERMs the command on the
 * graceful half of a kill and reports the command's real wait status, rusage and the container's
 * OOM kills.  It talks to the host side of the same helper (the launcher: `mps-container-init
 *     --container-host DIR ... -- docker run ...`) over one unix socket in DIR, bind-mounted
 *     at /.mps-channel; drop.c, "Containers", says why that channel is the supervisor's own;
 *   - cgroup limits: memory with no swap (--memory = --memory-swap), CPU bandwidth, a pid
 *     limit; rlimits through --ulimit: CPU seconds, file size, open files, no core dumps
 *     (podman: an explicit nofile and nproc too, see docker_build);
 *   - exactly spec->envp as its environment (--env each); the client itself gets only what
 *     it needs to reach the engine (DOCKER_HOST and friends, HOME, PATH), never the rest of
 *     the server's environment;
 *   - stdin closed (the client's stdin is /dev/null and --interactive=false), no log driver
 *     (output streams to us through the attached client and is not stored by the engine),
 *     and the image is never pulled (--pull never; the probe says how to build it).
 *
 * The interpreter.  spec->argv[0] is a host path, which means nothing in the image.  The
 * rule: a command under the work directory or a mount's host path is translated to its
 * path inside the container (one already under a mount's target is kept); a basename
 * `python`, `python3` or `python3.N` becomes the image's python3.N when the probe found one
 * on the image's PATH, else the image's python3; a basename `uv` becomes the image's uv, and
 * is refused when the image has none (the image's pip builds environments then); anything
 * else is refused.  A read-only bind that holds the host command (the host interpreter's
 * prefix) is dropped, and so is one under /usr: the image brings its own.  The result and
 * check_environment name the image's interpreter (ops->interpreter).
 *
 * The identity.  As root, each container runs as a uid of its own (uids.c, the pool bwrap's
 * runs take theirs from: --user UID:UID, a real host uid since rootful engines map none), so
 * RLIMIT_NPROC, files and the kernel's per-uid state (the user keyring) are never shared
 * between runs; an environment build keeps one for all its steps (sbx_identity_new).  The
 * work directory (and each writable mount whose owner differs) is handed to that uid first,
 * never following a symlink.  Not as root, the container runs as the server's own uid:gid
 * (never 0): the work directory is already the server's, and the files the script leaves there
 * stay deletable by the server, which a chown to another uid would not give.  Rootless Docker
 * maps container uids onto subordinate ids, so there the work directory is not writable: not
 * supported yet.
 *
 * Killing.  The container is named mps-<16 random hex digits>, returned as kill_name.  The
 * graceful half of a kill is the control pipe closing (the supervisor SIGTERMs the
 * command; a `docker kill --signal TERM` would reach only pid 1, which ignores it).
 * ops->kill(sig) starts `docker kill --signal <SIG> <name>` (for SIGKILL: `docker rm -f
 * <name>`, which is SIGKILL plus removal, so the one call covers the end of the grace period
 * and the clean-up after the client exited in case --rm did not happen) through the spawn
 * helper and returns at once: the event loop never waits for the engine.  With SIGKILL it
 * also removes the run's channel directory, should the launcher have been killed before it
 * could.  Those helper processes are reaped later, without blocking, whenever the backend is
 * next used (build, kill, describe), and waited for (bounded) when it is freed; one that runs
 * past DOCKER_HELPER_TIMEOUT_MS is killed.  So a helper may stay a zombie until the next run,
 * never longer.  A second SIGKILL for a name whose `rm -f` is still running is not repeated.
 *
 * The probe (once, at start-up, on the event loop like every other child: each step within
 * DOCKER_PROBE_TIMEOUT_MS, twice that for the container, without blocking): `docker version`
 * must report a server version, `docker image inspect` must find the image
 * ($MPS_DOCKER_IMAGE or DOCKER_DEFAULT_IMAGE) locally, and one container of it, isolated
 * like a run, reports the image's python3 (version, real path, implementation), its
 * python3.N and its uv. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "sandbox/sandbox-internal.h"

#define DOCKER_DEFAULT_IMAGE "mcp-python-exec-sandbox:py3.12"
#define DOCKER_PYTHONS_LABEL "io.github.mcp-python-exec-sandbox.pythons"
#define DOCKER_IMAGE_BIN "/usr/local/bin"
#define DOCKER_WORKDIR "/work"
#define DOCKER_HOSTNAME SBX_SANDBOX_HOSTNAME
#define DOCKER_NAME_PREFIX "mps-"
#define DOCKER_PROBE_TIMEOUT_MS 5000
#define DOCKER_PROBE_OUTPUT_MAX 4096
/* A `docker kill`/`docker rm -f` that has not finished by then is killed. */
#define DOCKER_HELPER_TIMEOUT_MS 30000
/* Helpers running at once; beyond that one of them is killed to make room. */
#define DOCKER_MAX_HELPERS 64
/* How long freeing the backend waits for helpers still running (shutdown). */
#define DOCKER_SHUTDOWN_WAIT_MS 5000
/* Same defaults as the bwrap backend: /tmp is RAM, never unbounded. */
#define DOCKER_DEFAULT_TMP_BYTES (100ULL << 20)
#define DOCKER_MAX_SHM_BYTES (64ULL << 20)
#define DOCKER_CHOWN_MAX_DEPTH 64
/* Where the supervisor and its channel appear inside the container. */
#define DOCKER_DROP_IN_CONTAINER "/.mps-drop"
#define DOCKER_CHANNEL_DIR "/.mps-channel"
/* podman's rlimits (see docker_build). */
#define DOCKER_PODMAN_NPROC "4096:4096"
#define DOCKER_PODMAN_NOFILE "1024:1024"

typedef struct docker_helper {
  sbx_child_t child;
  char *name; /* the container it acts on */
  int sig;
  uint64_t deadline_ms;
} docker_helper_t;

typedef struct docker_priv {
  bool podman;                    /* the podman backend: its client and its rlimit quirk */
  char *docker_path;              /* absolute path of the docker client (or stand-in) */
  char *drop_path;                /* host path of mps-sandbox-drop, the container's pid 1 */
  char *run_dir;                  /* where each run's channel directory is made (0700, ours) */
  char *seccomp_path;             /* the OCI seccomp profile every container gets (0600, ours) */
  char *passwd_path, *group_path; /* its /etc/passwd and /etc/group (0644, ours) */
  char *hosts_path, *resolv_path; /* its /etc/hosts and /etc/resolv.conf (0644, ours) */
  char *image;                    /* image reference */
  char *image_id;                 /* "sha256:…" from the probe */
  /* What the probe found in the image: its python3 (full version, real path, the
   * implementation), every python3.N on its PATH ("3.N" and path, in pairs), and uv. */
  char *py_version, *py_path, *py_impl;
  char **pythons;
  char *uv_path;
  char *last_version;   /* docker_interpreter's answer for another python3.N */
  char *server_version; /* the engine's version */
  char **cli_envp;      /* the client's own environment */
  docker_helper_t helpers[DOCKER_MAX_HELPERS];
  size_t n_helpers;
} docker_priv_t;

/* ---------------------------------------------------------------- argv builder */

/* ---------------------------------------------------------------- paths */

static docker_priv_t *priv_of(sbx_backend_t *b) {
  if (!b->priv) b->priv = xcalloc(1, sizeof(docker_priv_t));
  return b->priv;
}

static bool path_is_under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (n == 1 && dir[0] == '/') return path[0] == '/';
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Absolute, no empty, "." or ".." components, no trailing slash, and no ':' or ',' (which
 * docker's -v and --tmpfs syntax would split on) or control characters. */
static bool path_is_clean(const char *p) {
  if (p[0] != '/') return false;
  for (const char *c = p; *c; c++)
    if (*c == ':' || *c == ',' || (unsigned char)*c < 0x20 || *c == 0x7f) return false;
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

/* Places inside the container that belong to the image or to the engine: no mount may
 * land under them. */
static bool target_is_reserved(const char *p) {
  static const char *const reserved[] = {"/proc",
                                         "/dev",
                                         "/sys",
                                         "/etc",
                                         "/run",
                                         "/tmp",
                                         "/usr",
                                         DOCKER_WORKDIR,
                                         DOCKER_DROP_IN_CONTAINER,
                                         DOCKER_CHANNEL_DIR};
  if (strcmp(p, "/") == 0) return true;
  for (size_t i = 0; i < CM_ARRAY_SIZE(reserved); i++)
    if (path_is_under(p, reserved[i])) return true;
  return false;
}

/* A read-only bind keeps its host path: a host directory under /tmp may be bound (docker
 * mounts it over the tmpfs), but not /tmp itself nor the engine's and image's own places.
 * Binds under /usr are skipped rather than refused (see docker_build). */
static bool ro_bind_is_reserved(const char *p) {
  static const char *const reserved[] = {"/proc", "/dev", "/sys", "/etc", "/run", DOCKER_WORKDIR};
  if (strcmp(p, "/") == 0 || strcmp(p, "/tmp") == 0) return true;
  for (size_t i = 0; i < CM_ARRAY_SIZE(reserved); i++)
    if (path_is_under(p, reserved[i])) return true;
  return false;
}

/* ---------------------------------------------------------------- handing directories over */

static int chown_tree_at(int dir_fd, uid_t uid, gid_t gid, int depth) {
  if (depth > DOCKER_CHOWN_MAX_DEPTH) return -1;
  int fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fchownat(dirfd(d), e->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) rc = -1;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    /* O_NOFOLLOW: a symlink planted in place of a directory is never entered. */
    cleanup_close int sub =
        openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0 && chown_tree_at(sub, uid, gid, depth + 1) < 0) rc = -1;
  }
  closedir(d);
  return rc;
}

/* Hands dir and everything in it to uid:gid, never following a symlink.  With only_if_changed,
 * a directory already owned by uid:gid is left as it is (a cache handed over before). */
static int hand_over(const char *dir, uid_t uid, gid_t gid, bool only_if_changed, cm_error_t *err) {
  cleanup_close int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "open %s", dir);
  struct stat st;
  if (fstat(fd, &st) < 0) return cm_error_set(err, errno, CM_ERR_IO, "stat %s", dir);
  if (only_if_changed && st.st_uid == uid && st.st_gid == gid) return 0;
  if (fchown(fd, uid, gid) < 0 || chown_tree_at(fd, uid, gid, 0) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "handing %s to the container's uid %u", dir,
                        (unsigned)uid);
  return 0;
}

/* ---------------------------------------------------------------- the command */

/* The image's interpreter for a host python3.N, or NULL. */
static const char *image_python(const docker_priv_t *p, const char *version) {
  for (char **v = p->pythons; v && v[0] && v[1]; v += 2)
    if (strcmp(v[0], version) == 0) return v[1];
  return NULL;
}

/* spec->argv[0] (a host path) as a path inside the image; see the rule at the top. */
static int map_command(const docker_priv_t *p, const sbx_spec_t *spec, char **out,
                       cm_error_t *err) {
  const char *cmd = spec->argv[0];
  if (path_is_under(cmd, spec->workdir)) {
    *out = xasprintf(DOCKER_WORKDIR "%s", cmd + strlen(spec->workdir));
    return 0;
  }
  for (size_t i = 0; i < spec->n_mounts; i++) {
    const sbx_mount_t *m = &spec->mounts[i];
    if (path_is_under(cmd, m->host)) {
      *out = xasprintf("%s%s", m->target, cmd + strlen(m->host));
      return 0;
    }
    /* Already the path inside (an environment's /env/bin/python). */
    if (path_is_under(cmd, m->target)) {
      *out = xstrdup(cmd);
      return 0;
    }
  }
  const char *base = strrchr(cmd, '/') + 1;
  const char *dflt = p->py_path ? p->py_path : DOCKER_IMAGE_BIN "/python3";
  if (strcmp(base, "python") == 0 || strcmp(base, "python3") == 0) {
    *out = xstrdup(dflt);
    return 0;
  }
  if (strncmp(base, "python3.", 8) == 0 && base[8] >= '0' && base[8] <= '9') {
    size_t n = 8 + strspn(base + 8, "0123456789");
    cleanup_free char *version = xstrndup(base + 6, n - 6); /* "3.12" */
    const char *found = image_python(p, version);
    *out = xstrdup(found ? found : dflt);
    return 0;
  }
  if (strcmp(base, "uv") == 0) {
    if (!p->uv_path)
      return cm_error_set(
          err, 0, CM_ERR_UNSUPPORTED,
          "the image %s has no uv (build it with UV_VERSION, or use --installer pip)", p->image);
    *out = xstrdup(p->uv_path);
    return 0;
  }
  return cm_error_set(
      err, 0, CM_ERR_UNSUPPORTED,
      "the %s backend cannot run the host program %s: the image provides python3 and uv only",
      p->podman ? "podman" : "docker", cmd);
}

static int check_spec(const sbx_spec_t *spec, cm_error_t *err) {
  if (!spec->argv || !spec->argv[0] || spec->argv[0][0] != '/' || !strrchr(spec->argv[0], '/')[1])
    return cm_error_set(err, 0, CM_ERR_INVALID, "the command must be an absolute path");
  if (!spec->workdir || !path_is_clean(spec->workdir) || strcmp(spec->workdir, "/") == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "the work directory must be a clean absolute path without ':' or ','");
  if (sbx_spec_check_common(spec, err) < 0) return -1;
  struct stat st;
  for (char *const *r = spec->ro_binds; r && *r; r++) {
    if (!path_is_clean(*r))
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "read-only bind '%s' is not a clean absolute path without ':' or ','",
                          *r);
    if (ro_bind_is_reserved(*r))
      return cm_error_set(err, 0, CM_ERR_INVALID, "read-only bind '%s' would cover the sandbox",
                          *r);
  }
  for (size_t i = 0; i < spec->n_mounts; i++) {
    const sbx_mount_t *m = &spec->mounts[i];
    if (!m->host || !path_is_clean(m->host))
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "mount source '%s' is not a clean absolute path without ':' or ','",
                          m->host ? m->host : "(null)");
    if (stat(m->host, &st) < 0 || !S_ISDIR(st.st_mode))
      return cm_error_set(err, errno, CM_ERR_NOT_FOUND, "mount source %s is not a directory",
                          m->host);
    /* /tmp itself may be a mount (an environment build's, on its own bounded space): it
     * takes the tmpfs's place. */
    if (!m->target || !path_is_clean(m->target) ||
        (target_is_reserved(m->target) && strcmp(m->target, "/tmp") != 0))
      return cm_error_set(err, 0, CM_ERR_INVALID, "mount target '%s' is not allowed",
                          m->target ? m->target : "(null)");
  }
  return 0;
}

/* mps-<16 hex digits>: unique per run, and a valid container name. */
static int new_container_name(char **out, cm_error_t *err) {
  unsigned char raw[8];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return cm_error_set(err, errno, CM_ERR_INTERNAL, "getrandom");
    got += (size_t)n;
  }
  char hex[2 * sizeof raw + 1];
  for (size_t i = 0; i < sizeof raw; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
  *out = xasprintf(DOCKER_NAME_PREFIX "%s", hex);
  return 0;
}

/* ---------------------------------------------------------------- helpers (kill, rm) */

static void helper_forget(docker_priv_t *p, size_t i) {
  sbx_child_close(&p->helpers[i].child);
  free(p->helpers[i].name);
  p->helpers[i] = p->helpers[--p->n_helpers];
}

/* Kills a helper and waits for it: after SIGKILL that is immediate. */
static void helper_kill(docker_priv_t *p, size_t i) {
  docker_helper_t *h = &p->helpers[i];
  cm_warn("docker: `%s` for container %s did not finish; killing it",
          h->sig == SIGKILL ? "docker rm -f" : "docker kill", h->name);
  sbx_child_kill_tree(&h->child, SIGKILL);
  siginfo_t si;
  while (waitid(P_PID, (id_t)h->child.pid, &si, WEXITED) < 0 && errno == EINTR) {
  }
  helper_forget(p, i);
}

/* Reaps finished helpers without blocking; kills the overdue ones. */
static void helpers_reap(docker_priv_t *p) {
  uint64_t now = cm_now_ms();
  for (size_t i = 0; i < p->n_helpers;) {
    docker_helper_t *h = &p->helpers[i];
    if (sbx_child_reap(&h->child, NULL, NULL) == 1) {
      helper_forget(p, i);
    } else if (now >= h->deadline_ms) {
      helper_kill(p, i);
    } else {
      i++;
    }
  }
}

/* Waits (bounded) for every helper, then kills what is left: for shutdown. */
static void helpers_drain(docker_priv_t *p, uint64_t wait_ms) {
  uint64_t deadline = cm_now_ms() + wait_ms;
  for (;;) {
    helpers_reap(p);
    uint64_t now = cm_now_ms();
    if (p->n_helpers == 0 || now >= deadline) break;
    struct pollfd pfd[DOCKER_MAX_HELPERS];
    for (size_t i = 0; i < p->n_helpers; i++)
      pfd[i] = (struct pollfd){p->helpers[i].child.pidfd, POLLIN, 0};
    (void)poll(pfd, p->n_helpers, (int)CM_MIN(deadline - now, 100));
  }
  while (p->n_helpers > 0) helper_kill(p, p->n_helpers - 1);
}

/* The name `docker kill --signal` takes, into buf (16 bytes). */
static char *signal_name(int sig, char buf[16]) {
  static const struct {
    int sig;
    const char *name;
  } names[] = {{SIGTERM, "TERM"}, {SIGKILL, "KILL"}, {SIGINT, "INT"},   {SIGHUP, "HUP"},
               {SIGQUIT, "QUIT"}, {SIGUSR1, "USR1"}, {SIGUSR2, "USR2"}, {SIGALRM, "ALRM"}};
  for (size_t i = 0; i < CM_ARRAY_SIZE(names); i++)
    if (names[i].sig == sig) {
      snprintf(buf, 16, "%s", names[i].name);
      return buf;
    }
  snprintf(buf, 16, "%d", sig);
  return buf;
}

static void docker_kill(sbx_backend_t *b, const sbx_launch_t *launch, int sig) {
  docker_priv_t *p = priv_of(b);
  if (!launch->kill_name || !p->docker_path) return;
  helpers_reap(p);
  for (size_t i = 0; i < p->n_helpers; i++)
    if (p->helpers[i].sig == sig && strcmp(p->helpers[i].name, launch->kill_name) == 0)
      return;                                                /* still at it */
  if (p->n_helpers == DOCKER_MAX_HELPERS) helper_kill(p, 0); /* a stuck engine: make room */
  if (sig == SIGKILL && p->run_dir) {
    /* The launcher removes the channel directory when it ends; one that was SIGKILLed
     * could not (unlink and rmdir of one entry: nothing that blocks). */
    cleanup_free char *dir = xasprintf("%s/%s", p->run_dir, launch->kill_name);
    cleanup_free char *sock = xasprintf("%s/channel", dir);
    (void)unlink(sock);
    (void)rmdir(dir);
  }

  char sigbuf[16];
  char *rm_argv[] = {p->docker_path, "rm", "-f", launch->kill_name, NULL};
  char *kill_argv[] = {p->docker_path,    "kill", "--signal", signal_name(sig, sigbuf),
                       launch->kill_name, NULL};
  sbx_spawn_opts_t opts = {
      .argv = sig == SIGKILL ? rm_argv : kill_argv,
      .envp = p->cli_envp,
      .capture_output = false,
  };
  docker_helper_t *h = &p->helpers[p->n_helpers];
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_spawn(&opts, &h->child, &err) < 0) {
    cm_err("docker: cannot stop container %s: %s", launch->kill_name, cm_error_message(&err));
    cm_error_release(&err);
    return;
  }
  h->name = xstrdup(launch->kill_name);
  h->sig = sig;
  h->deadline_ms = cm_now_ms() + DOCKER_HELPER_TIMEOUT_MS;
  p->n_helpers++;
  cm_debug("docker: %s %s (pid %d)", sig == SIGKILL ? "rm -f" : "kill", launch->kill_name,
           (int)h->child.pid);
}

/* ---------------------------------------------------------------- the seccomp profile */

/* Files every container gets from the server, in a directory of ours: <state dir>/sandbox (0700;
 * without a state directory, the run directory).  Each is named after its content's digest and
 * replaced atomically, so servers of other versions (or uid blocks) on the same state directory
 * never swap one another's. */
static int write_container_file(const char *dir, const char *what, const char *data, mode_t mode,
                                char **out, cm_error_t *err) {
  char digest[65];
  cm_sha256_hex(data, strlen(data), digest);
  cleanup_free char *path =
      xasprintf("%s/%s-%.16s%s", dir, what, digest, strcmp(what, "seccomp") == 0 ? ".json" : "");
  if (!path_is_clean(path))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "the container's %s file %s is not a clean path without ':' or ','", what,
                        path);
  cleanup_free char *tmp = xasprintf("%s.XXXXXX", path);
  cleanup_close int fd = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", tmp);
  if (fchmod(fd, mode) < 0 || cm_write_all(fd, data, strlen(data)) < 0 ||
      close(steal_fd(&fd)) < 0 || rename(tmp, path) < 0) {
    int e = errno;
    (void)unlink(tmp);
    return cm_error_set(err, e, CM_ERR_IO, "writing %s", path);
  }
  free(*out);
  *out = steal_pointer(&path);
  return 0;
}

/* The container's files:
 *   - the syscall policy (seccomp.c) as an OCI profile, which the client reads at each `run`
 *     (--security-opt seccomp=FILE): 0600;
 *   - /etc/passwd and /etc/group as bubblewrap's runs have them: root and the user "sandbox"
 *     for every uid a run may get (as root, the server's block of per-run uids, uids.c; else
 *     the server's own uid), so getpwuid() knows the script's uid (getpass.getuser(), `id`,
 *     `~`) as it did for the image's nobody.  Bind-mounted read-only over the image's, so they
 *     are 0644. */
static int write_container_files(sbx_backend_t *b, docker_priv_t *p, cm_error_t *err) {
  cleanup_free char *json = sbx_seccomp_oci_json(err);
  if (!json) return cm_error_wrap(err, "the seccomp profile for containers");
  cleanup_free char *dir =
      b->state_dir ? xasprintf("%s/sandbox", b->state_dir) : xstrdup(p->run_dir);
  if (b->state_dir) {
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
      return cm_error_set(err, errno, CM_ERR_IO, "mkdir %s", dir);
    struct stat st;
    if (lstat(dir, &st) < 0) return cm_error_set(err, errno, CM_ERR_IO, "stat %s", dir);
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
      return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                          "%s must be a directory of ours with mode 0700", dir);
  }
  unsigned first = (unsigned)getuid(), count = 1;
  if (geteuid() == 0) first = (unsigned)sbx_uid_block(&count);
  cm_buf_t passwd, group;
  cm_buf_init(&passwd, 0);
  cm_buf_init(&group, 0);
  cm_buf_appends(&passwd, "root:x:0:0:root:/root:/usr/sbin/nologin\n");
  cm_buf_appends(&group, "root:x:0:\n");
  for (unsigned i = 0; i < count; i++) {
    cm_buf_printf(&passwd, "sandbox:x:%u:%u:sandbox:" DOCKER_WORKDIR ":/usr/sbin/nologin\n",
                  first + i, geteuid() == 0 ? first + i : (unsigned)getgid());
    if (geteuid() == 0 || i == 0)
      cm_buf_printf(&group, "sandbox:x:%u:\n", geteuid() == 0 ? first + i : (unsigned)getgid());
  }
  cleanup_free char *passwd_text = cm_buf_steal(&passwd);
  cleanup_free char *group_text = cm_buf_steal(&group);
  if (write_container_file(dir, "seccomp", json, 0600, &p->seccomp_path, err) < 0 ||
      write_container_file(dir, "passwd", passwd_text, 0644, &p->passwd_path, err) < 0 ||
      write_container_file(dir, "group", group_text, 0644, &p->group_path, err) < 0 ||
      write_container_file(dir, "hosts", SBX_HOSTS_TEXT, 0644, &p->hosts_path, err) < 0 ||
      write_container_file(dir, "resolv.conf", SBX_RESOLV_CONF_TEXT, 0644, &p->resolv_path, err) <
          0)
    return -1;
  return 0;
}

/* ---------------------------------------------------------------- the mount plan */

int sbx_docker_render_mounts(const sbx_mount_plan_t *plan, const char *image_command,
                             cm_strv_builder_t *out, cm_error_t *err) {
  for (size_t i = 0; i < plan->n; i++) {
    const sbx_mount_op_t *op = &plan->ops[i];
    switch (op->kind) {
      case SBX_MOUNT_FILE:
        if (!op->source)
          return cm_error_set(err, 0, CM_ERR_INTERNAL, "a container's %s needs a host file",
                              op->target);
        cm_strv_add(out, "-v");
        cm_strv_addf(out, "%s:%s:ro", op->source, op->target);
        break;
      case SBX_MOUNT_TMPFS:
        /* The engines make /dev/shm themselves: its size is a flag of its own. */
        if (strcmp(op->target, "/dev/shm") == 0) {
          cm_strv_add(out, "--shm-size");
          cm_strv_addf(out, "%llu", (unsigned long long)op->size);
          break;
        }
        cm_strv_add(out, "--tmpfs");
        if (op->mode == 01777) /* the engines' default mode */
          cm_strv_addf(out, "%s:rw,nosuid,nodev,size=%llu", op->target,
                       (unsigned long long)op->size);
        else
          cm_strv_addf(out, "%s:rw,nosuid,nodev,size=%llu,mode=%o", op->target,
                       (unsigned long long)op->size, op->mode);
        break;
      case SBX_MOUNT_RO_BIND:
      case SBX_MOUNT_BIND:
        /* A read-only bind at its own path that holds the host's interpreter (its prefix):
         * the image's interpreter replaces it. */
        if (op->kind == SBX_MOUNT_RO_BIND && image_command && strcmp(op->source, op->target) == 0 &&
            path_is_under(image_command, op->source))
          break;
        cm_strv_add(out, "-v");
        cm_strv_addf(out, "%s:%s:%s", op->source, op->target,
                     op->kind == SBX_MOUNT_BIND ? "rw" : "ro");
        if (op->workdir) cm_strv_addv(out, "-w", op->target, NULL);
        break;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- build */

static int docker_build(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch,
                        cm_error_t *err) {
  docker_priv_t *p = priv_of(b);
  if (!p->docker_path || !p->image)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the docker backend was not probed");
  helpers_reap(p);
  if (check_spec(spec, err) < 0) return -1;
  cleanup_free char *command = NULL;
  if (map_command(p, spec, &command, err) < 0) return -1;

  bool as_root = geteuid() == 0;
  uid_t uid = !as_root ? getuid()
              : spec->identity && spec->identity->has_uid
                  ? spec->identity->uid
                  : sbx_uid_take(&spec->limits, &launch->uid_slot);
  gid_t gid = as_root ? (gid_t)uid : getgid();
  if (uid == 0)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "refusing to run a container as uid 0");
  if (as_root) {
    if (hand_over(spec->workdir, uid, gid, false, err) < 0) return -1;
    for (size_t i = 0; i < spec->n_mounts; i++)
      if (spec->mounts[i].writable && hand_over(spec->mounts[i].host, uid, gid, true, err) < 0)
        return -1;
  }
  cleanup_free char *name = NULL;
  if (new_container_name(&name, err) < 0) return -1;
  if (!p->drop_path || !p->run_dir)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the %s backend was not probed", b->ops->name);
  cleanup_free char *chan_dir = xasprintf("%s/%s", p->run_dir, name);
  /* The files the probe wrote, written again should someone have removed them since. */
  if (!p->seccomp_path || access(p->seccomp_path, R_OK) < 0 || access(p->passwd_path, R_OK) < 0 ||
      access(p->group_path, R_OK) < 0 || access(p->hosts_path, R_OK) < 0 ||
      access(p->resolv_path, R_OK) < 0) {
    if (write_container_files(b, p, err) < 0) return -1;
  }

  /* The channel to the supervisor, as with bubblewrap, but through the host side of the
   * drop helper (drop.c, "Containers"): the status pipe's write end and the control pipe's
   * read end go to it, the server keeps the other two. */
  int status_pipe[2] = {-1, -1}, control_pipe[2] = {-1, -1};
  if (pipe2(status_pipe, O_CLOEXEC) < 0) return cm_error_set(err, errno, CM_ERR_IO, "pipe2");
  cleanup_close int status_read = status_pipe[0], status_write = status_pipe[1];
  if (pipe2(control_pipe, O_CLOEXEC) < 0) return cm_error_set(err, errno, CM_ERR_IO, "pipe2");
  cleanup_close int control_read = control_pipe[0], control_write = control_pipe[1];
  if (cm_set_nonblock(status_read, true) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "fcntl(O_NONBLOCK)");
  cleanup_close int egress_fd = -1;
  bool egress = spec->network && spec->egress;
  if (egress) {
    if (spec->egress->fd < 0 || spec->egress->port < 1024)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "an egress channel needs an fd and a port above 1023");
    egress_fd = fcntl(spec->egress->fd, F_DUPFD_CLOEXEC, 3);
    if (egress_fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "duplicating the egress channel");
  }

  cm_strv_builder_t a = {0};
  cm_strv_addv(&a, p->drop_path, "--container-host", chan_dir, "--status-fd", NULL);
  cm_strv_addf(&a, "%d", status_write);
  cm_strv_add(&a, "--control-fd");
  cm_strv_addf(&a, "%d", control_read);
  if (egress_fd >= 0) {
    cm_strv_add(&a, "--egress-fd");
    cm_strv_addf(&a, "%d", egress_fd);
  }
  cm_strv_add(&a, "--");
  /* No network but the container's own loopback, unless the spec asks for the engine's
   * (network without egress: --network host); with egress the forwarder is the way out. */
  cm_strv_addv(&a, p->docker_path, "run", "--rm", "--interactive=false", "--name", name, "--pull",
               "never", "--log-driver", "none", "--network",
               spec->network && !egress ? "bridge" : "none", "--hostname", DOCKER_HOSTNAME, "--ipc",
               "private", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "--security-opt", NULL);
  cm_strv_addf(&a, "seccomp=%s", p->seccomp_path);
  cm_strv_add(&a, "--user");
  cm_strv_addf(&a, "%u:%u", (unsigned)uid, (unsigned)gid);

  const sbx_limits_t *l = &spec->limits;
  if (l->memory_bytes) {
    cm_strv_addv(&a, "--memory", NULL);
    cm_strv_addf(&a, "%llu", (unsigned long long)l->memory_bytes);
    cm_strv_addv(&a, "--memory-swap", NULL); /* equal to --memory: no swap at all */
    cm_strv_addf(&a, "%llu", (unsigned long long)l->memory_bytes);
  }
  if (l->cpu_millis) {
    cm_strv_addv(&a, "--cpus", NULL);
    cm_strv_addf(&a, "%llu.%03llu", (unsigned long long)(l->cpu_millis / 1000),
                 (unsigned long long)(l->cpu_millis % 1000));
  }
  if (l->max_processes) {
    cm_strv_addv(&a, "--pids-limit", NULL);
    cm_strv_addf(&a, "%llu", (unsigned long long)l->max_processes);
  }
  if (l->cpu_seconds) { /* soft: SIGXCPU, hard one second later: SIGKILL (as the spawn helper) */
    cm_strv_addv(&a, "--ulimit", NULL);
    cm_strv_addf(&a, "cpu=%llu:%llu", (unsigned long long)l->cpu_seconds,
                 (unsigned long long)l->cpu_seconds + 1);
  }
  if (l->file_size_bytes) { /* docker hands the number to setrlimit as is: bytes */
    cm_strv_addv(&a, "--ulimit", NULL);
    cm_strv_addf(&a, "fsize=%llu:%llu", (unsigned long long)l->file_size_bytes,
                 (unsigned long long)l->file_size_bytes);
  }
  if (l->open_files) {
    cm_strv_addv(&a, "--ulimit", NULL);
    cm_strv_addf(&a, "nofile=%llu:%llu", (unsigned long long)l->open_files,
                 (unsigned long long)l->open_files);
  } else if (p->podman) {
    cm_strv_addv(&a, "--ulimit", "nofile=" DOCKER_PODMAN_NOFILE, NULL);
  }
  /* podman: any --ulimit replaces its default rlimits, which runc cannot set here (root
   * without CAP_SYS_RESOURCE: "error setting rlimit"), and RLIMIT_NPROC above what runc
   * itself holds fails too; the pids cgroup is the real cap, so a modest fixed nproc. */
  if (p->podman) cm_strv_addv(&a, "--ulimit", "nproc=" DOCKER_PODMAN_NPROC, NULL);
  cm_strv_addv(&a, "--ulimit", "core=0:0", NULL);

  /* The run's own mounts and files (the plan every backend renders).  /etc's files are ours,
   * written once (write_container_files); only a container on the engine's network (network
   * without egress) keeps the engine's resolver files (both engines copy the host's resolvers
   * and search domains, also with --network none, and podman's hosts names the host as
   * host.containers.internal); every other gets localhost alone and a resolv.conf that names
   * nothing of the host, as under bubblewrap. */
  sbx_mount_plan_in_t plan_in = {
      .workdir_target = DOCKER_WORKDIR,
      .default_tmp_bytes = DOCKER_DEFAULT_TMP_BYTES,
      .max_shm_bytes = DOCKER_MAX_SHM_BYTES,
      .passwd = {.path = p->passwd_path},
      .group = {.path = p->group_path},
      .hosts = {.path = p->hosts_path},
      .resolv = {.path = p->resolv_path},
  };
  sbx_mount_plan_t plan;
  sbx_mount_plan_build(spec, &plan_in, &plan);
  int rendered = sbx_docker_render_mounts(&plan, spec->argv[0], &a, err);
  sbx_mount_plan_free(&plan);
  if (rendered < 0) {
    cm_strv_free(cm_strv_steal(&a));
    return -1;
  }
  /* The supervisor, bind-mounted, is the container's pid 1 (in place of --init): it
   * reaps, forwards egress, and reports the command's real status and OOM kills. */
  cm_strv_add(&a, "-v");
  cm_strv_addf(&a, "%s:" DOCKER_CHANNEL_DIR ":ro", chan_dir);
  cm_strv_add(&a, "-v");
  cm_strv_addf(&a, "%s:" DOCKER_DROP_IN_CONTAINER ":ro", p->drop_path);
  for (char *const *e = spec->envp; e && *e; e++) cm_strv_addv(&a, "--env", *e, NULL);
  cm_strv_addv(&a, "--label", "io.github.mcp-python-exec-sandbox.run=1", "--entrypoint",
               DOCKER_DROP_IN_CONTAINER, p->image, "--connect", DOCKER_CHANNEL_DIR "/channel",
               NULL);
  if (egress) {
    cm_strv_add(&a, "--egress-port");
    cm_strv_addf(&a, "%u", (unsigned)spec->egress->port);
  }
  cm_strv_addv(&a, "--", command, NULL);
  for (char *const *s = spec->argv + 1; *s; s++) cm_strv_add(&a, *s);

  launch->argv = cm_strv_steal(&a);
  launch->envp = sbx_strv_copy(p->cli_envp);
  launch->set_rlimits =
      false; /* rlimits on the Go client would break it; the container has its own */
  launch->kill_name = steal_pointer(&name);
  size_t n = 0;
  launch->pass_fds[n++] = steal_fd(&status_write);
  launch->pass_fds[n++] = steal_fd(&control_read);
  if (egress_fd >= 0) launch->pass_fds[n++] = steal_fd(&egress_fd);
  launch->status_fd = steal_fd(&status_read);
  launch->control_fd = steal_fd(&control_write);
  return 0;
}

/* ---------------------------------------------------------------- probe */

/* The client's environment: only what it needs to find and talk to the engine. */
static char **cli_env_new(void) {
  static const char *const keep[] = {
      "DOCKER_HOST",
      "DOCKER_CONTEXT",
      "DOCKER_CONFIG",
      "DOCKER_CERT_PATH",
      "DOCKER_TLS_VERIFY",
      "DOCKER_TLS",
      "DOCKER_API_VERSION",
      "HOME",
      "PATH",
      "XDG_RUNTIME_DIR",
  };
  char **env = xcalloc(CM_ARRAY_SIZE(keep) + 1, sizeof *env);
  size_t n = 0;
  for (size_t i = 0; i < CM_ARRAY_SIZE(keep); i++) {
    const char *v = getenv(keep[i]);
    if (v) env[n++] = xasprintf("%s=%s", keep[i], v);
  }
  return env;
}

/* Trimmed output, or NULL when there is none. */
static char *trimmed(const cm_buf_t *b) {
  if (!b->data) return NULL;
  const char *s = b->data;
  size_t len = b->len;
  while (len > 0 && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) s++, len--;
  while (len > 0 &&
         (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == '\t'))
    len--;
  return len ? cm_log_excerpt(s, len, 400) : NULL;
}

/* The outcome of `docker <args…>`: 0 with *out its trimmed stdout (maybe NULL), or -1 with
 * an error quoting its stderr. */
static int docker_query_result(char *const *argv, const sbx_probe_result_t *r, char **out,
                               cm_error_t *err) {
  if (r->rc < 0) return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s", cm_error_message(r->err));
  if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0) {
    cleanup_free char *why = trimmed(r->errout);
    if (!why) why = trimmed(r->out);
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "`docker %s %s` failed (%s %d): %s", argv[1],
                        argv[2], WIFEXITED(r->status) ? "exit" : "signal",
                        WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status),
                        why ? why : "no output");
  }
  *out = trimmed(r->out);
  return 0;
}

static int find_docker(docker_priv_t *p, cm_error_t *err) {
  const char *env = getenv("MPS_DOCKER");
  const char *want = env && *env ? env : p->podman ? "podman" : "docker";
  free(p->docker_path);
  p->docker_path = cm_find_executable(want);
  if (!p->docker_path)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "the %s client (%s) was not found; install it or set MPS_DOCKER",
                        p->podman ? "podman" : "docker", env && *env ? env : "in PATH");
  if (p->docker_path[0] != '/') {
    char *abs = realpath(p->docker_path, NULL);
    if (!abs) return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "%s", p->docker_path);
    free(p->docker_path);
    p->docker_path = abs;
  }
  return 0;
}

/* An image reference goes on the command line: it must not look like a flag or hold
 * anything but the characters references are made of. */
static bool image_ref_ok(const char *s) {
  if (!*s || *s == '-' || strlen(s) > 512) return false;
  return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@") ==
         strlen(s);
}

static char **split_words(const char *s) {
  cm_strv_builder_t a = {0};
  while (s && *s) {
    s += strspn(s, " \t,");
    size_t n = strcspn(s, " \t,");
    if (n == 0) break;
    cleanup_free char *w = xstrndup(s, n);
    cm_strv_add(&a, w);
    s += n;
  }
  return cm_strv_steal(&a);
}

/* The probe's two steps, each from a callback of the loop: `docker version`, then
 * `docker image inspect`. */
typedef struct docker_probe_state {
  sbx_backend_t *b;
  char *image;
  char *version;
  uid_t uid; /* the trial container's */
  gid_t gid;
} docker_probe_state_t;

static void probe_state_free(void *data) {
  docker_probe_state_t *st = data;
  free(st->image);
  free(st->version);
  free(st);
}

static char **inspect_argv_new(docker_priv_t *p, const char *image) {
  cm_strv_builder_t a = {0};
  cm_strv_add(&a, p->docker_path);
  cm_strv_add(&a, "image");
  cm_strv_add(&a, "inspect");
  cm_strv_add(&a, "--format");
  cm_strv_add(&a, "{{.Id}}");
  cm_strv_add(&a, image);
  return cm_strv_steal(&a);
}

/* What the probe container prints: its python3 (version, real path, implementation),
 * each python3.N on its PATH, and uv. */
static const char DOCKER_PROBE_SCRIPT[] =
    "import os, platform, re, shutil, sys\n"
    "exe = shutil.which('python3') or sys.executable\n"
    "print('python', platform.python_version(), os.path.realpath(exe), sys.implementation.name)\n"
    "seen = set()\n"
    "for d in os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin').split(':'):\n"
    "    try:\n"
    "        names = sorted(os.listdir(d))\n"
    "    except OSError:\n"
    "        continue\n"
    "    for n in names:\n"
    "        if re.fullmatch(r'python3\\.[0-9]+', n) and n not in seen and ' ' not in d:\n"
    "            seen.add(n)\n"
    "            print('minor', n[6:], os.path.join(d, n))\n"
    "uv = shutil.which('uv')\n"
    "print('uv', uv if uv and ' ' not in uv else '-')\n";

static char **probe_run_argv_new(docker_priv_t *p, const docker_probe_state_t *st) {
  cm_strv_builder_t a = {0};
  cm_strv_addv(&a, p->docker_path, "run", "--rm", "--interactive=false", "--pull", "never",
               "--log-driver", "none", "--network", "none", "--read-only", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--security-opt", NULL);
  cm_strv_addf(&a, "seccomp=%s", p->seccomp_path);
  cm_strv_add(&a, "-v");
  cm_strv_addf(&a, "%s:/etc/passwd:ro", p->passwd_path);
  cm_strv_add(&a, "-v");
  cm_strv_addf(&a, "%s:/etc/group:ro", p->group_path);
  cm_strv_addv(&a, "--label", "io.github.mcp-python-exec-sandbox.run=1", "--user", NULL);
  cm_strv_addf(&a, "%u:%u", (unsigned)st->uid, (unsigned)st->gid);
  if (p->podman)
    cm_strv_addv(&a, "--ulimit", "nofile=" DOCKER_PODMAN_NOFILE, "--ulimit",
                 "nproc=" DOCKER_PODMAN_NPROC, NULL);
  cm_strv_addv(&a, "--entrypoint", "python3", st->image, "-I", "-c", DOCKER_PROBE_SCRIPT, NULL);
  return cm_strv_steal(&a);
}

static bool word_ok(const char *w) {
  return w && *w && strlen(w) < 256 &&
         strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+/") ==
             strlen(w);
}

static void probe_run_done(sbx_probe_t *probe, const sbx_probe_result_t *r) {
  docker_probe_state_t *st = sbx_probe_state(probe);
  docker_priv_t *p = priv_of(st->b);
  cm_error_t err = CM_ERROR_INIT;
  char **argv = probe_run_argv_new(p, st);
  cleanup_free char *excerpt = NULL;
  int rc = docker_query_result(argv, r, &excerpt, &err);
  cm_strv_free(argv);
  /* The lines themselves (the excerpt is for messages); at most DOCKER_PROBE_OUTPUT_MAX. */
  cleanup_free char *out = rc == 0 && r->out->data ? xstrndup(r->out->data, r->out->len) : NULL;
  if (rc < 0) {
    cm_error_wrap(&err, "a trial container of image %s did not run", st->image);
    sbx_probe_finish(probe, &err);
    return;
  }
  free(p->py_version);
  free(p->py_path);
  free(p->py_impl);
  free(p->uv_path);
  cm_strv_free(p->pythons);
  p->py_version = p->py_path = p->py_impl = p->uv_path = NULL;
  cm_strv_builder_t pys = {0};
  for (char *line = out, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    cleanup_strv char **w = split_words(line);
    size_t n = cm_strv_len(w);
    if (n == 4 && strcmp(w[0], "python") == 0 && word_ok(w[1]) && w[2][0] == '/' && word_ok(w[2]) &&
        word_ok(w[3]) && !p->py_path) {
      p->py_version = xstrdup(w[1]);
      p->py_path = xstrdup(w[2]);
      p->py_impl = xstrdup(w[3]);
    } else if (n == 3 && strcmp(w[0], "minor") == 0 && word_ok(w[1]) && w[2][0] == '/' &&
               word_ok(w[2])) {
      cm_strv_add(&pys, w[1]);
      cm_strv_add(&pys, w[2]);
    } else if (n == 2 && strcmp(w[0], "uv") == 0 && w[1][0] == '/' && word_ok(w[1])) {
      p->uv_path = xstrdup(w[1]);
    }
  }
  p->pythons = cm_strv_steal(&pys);
  if (!p->py_path) {
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "image %s has no python3 on its PATH", st->image);
    sbx_probe_finish(probe, &err);
    return;
  }
  p->image = steal_pointer(&st->image);
  sbx_probe_finish(probe, NULL);
}

static void probe_inspect_done(sbx_probe_t *probe, const sbx_probe_result_t *r) {
  docker_probe_state_t *st = sbx_probe_state(probe);
  docker_priv_t *p = priv_of(st->b);
  cm_error_t err = CM_ERROR_INIT;
  char **argv = inspect_argv_new(p, st->image);
  cleanup_free char *inspect = NULL;
  int rc = docker_query_result(argv, r, &inspect, &err);
  cm_strv_free(argv);
  if (rc < 0) {
    cm_error_wrap(&err,
                  "image %s is not in the local docker engine (the server never pulls): build it "
                  "with `docker build -t %s "
                  "profiles/` or fetch it with `docker pull %s`",
                  st->image, st->image, st->image);
    sbx_probe_finish(probe, &err);
    return;
  }
  free(p->server_version);
  p->server_version = steal_pointer(&st->version);
  free(p->image_id);
  size_t id_len = inspect ? strcspn(inspect, " ") : 0;
  p->image_id = id_len ? xstrndup(inspect, id_len) : xstrdup("(unknown id)");
  /* Then one container, isolated like a run (a uid of its own included), asks the image what
   * it has. */
  st->uid = getuid();
  st->gid = getgid();
  if (geteuid() == 0) {
    sbx_limits_t trial = {.timeout_ms = 2 * DOCKER_PROBE_TIMEOUT_MS};
    int64_t slot;
    st->uid = sbx_uid_take(&trial, &slot);
    st->gid = (gid_t)st->uid;
  }
  char **run_argv = probe_run_argv_new(p, st);
  rc = sbx_probe_command(probe, run_argv, p->cli_envp, NULL, 0, 2 * DOCKER_PROBE_TIMEOUT_MS,
                         DOCKER_PROBE_OUTPUT_MAX, probe_run_done, &err);
  cm_strv_free(run_argv);
  if (rc < 0) sbx_probe_finish(probe, &err);
}

static void probe_version_done(sbx_probe_t *probe, const sbx_probe_result_t *r) {
  docker_probe_state_t *st = sbx_probe_state(probe);
  docker_priv_t *p = priv_of(st->b);
  cm_error_t err = CM_ERROR_INIT;
  char *version_argv[] = {p->docker_path, "version", "--format", "{{.Server.Version}}", NULL};
  if (docker_query_result(version_argv, r, &st->version, &err) < 0) {
    cm_error_wrap(&err,
                  "the docker engine is not reachable (is it running, and may this user use it?)");
    sbx_probe_finish(probe, &err);
    return;
  }
  if (!st->version) {
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE,
                 "the docker engine is not reachable: `docker version` reports no server");
    sbx_probe_finish(probe, &err);
    return;
  }
  char **argv = inspect_argv_new(p, st->image);
  int rc = sbx_probe_command(probe, argv, p->cli_envp, NULL, 0, DOCKER_PROBE_TIMEOUT_MS,
                             DOCKER_PROBE_OUTPUT_MAX, probe_inspect_done, &err);
  cm_strv_free(argv);
  if (rc < 0) sbx_probe_finish(probe, &err);
}

/* mps-container-init (drop.c built static; the host side of a run and the container's pid
 * 1 alike): $MPS_CONTAINER_INIT, or next to the server (or in
 * ../libexec/mcp-python-exec-sandbox/). */
static int find_drop(docker_priv_t *p, cm_error_t *err) {
  free(p->drop_path);
  p->drop_path = sbx_helper_path(SBX_HELPER_CONTAINER_INIT, err);
  if (!p->drop_path) return -1;
  if (!path_is_clean(p->drop_path) || access(p->drop_path, X_OK) < 0)
    return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "the container init %s is not usable",
                        p->drop_path);
  return 0;
}

/* Channel directories that no launcher holds (its flock, taken before the directory has its
 * name: drop.c): a killed server's launchers left them.  Removed (the socket in one, then
 * it); another live server's are held, and stay.  A `.new-` one is swept only when old (its
 * launcher may be about to lock it). */
static void sweep_run_dir(const char *dir) {
  cleanup_close int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dup(dfd)) : NULL;
  if (!d) return;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d))) {
    bool fresh = strncmp(e->d_name, ".new-mps-", 9) == 0;
    if (strncmp(e->d_name, "mps-", 4) != 0 && !fresh) continue;
    struct stat st;
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode) ||
        (fresh && st.st_mtime > now - 60))
      continue;
    cleanup_close int fd =
        openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) continue; /* a live launcher's */
    (void)unlinkat(fd, "channel", 0);
    if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) == 0)
      cm_info("removed %s/%s, a container channel a killed server left", dir, e->d_name);
  }
  closedir(d);
}

/* The directory the runs' channel directories go in: $MPS_DOCKER_RUN_DIR, else
 * /run/mcp-python-exec-sandbox/containers as root, else $XDG_RUNTIME_DIR/... or
 * /tmp/mps-containers-<uid>.  Ours, 0700, never a symlink: only the engine (root) and we
 * reach into it, and a container sees its own channel directory alone. */
static int make_run_dir(docker_priv_t *p, cm_error_t *err) {
  const char *env = getenv("MPS_DOCKER_RUN_DIR");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  cleanup_free char *dir = env && *env      ? xstrdup(env)
                           : geteuid() == 0 ? xstrdup("/run/mcp-python-exec-sandbox/containers")
                           : xdg && xdg[0] == '/'
                               ? xasprintf("%s/mcp-python-exec-sandbox-containers", xdg)
                               : xasprintf("/tmp/mps-containers-%u", (unsigned)geteuid());
  if (!path_is_clean(dir))
    return cm_error_set(err, 0, CM_ERR_INVALID, "container run directory %s is not a clean path",
                        dir);
  if (geteuid() == 0 && !env) (void)mkdir("/run/mcp-python-exec-sandbox", 0755);
  if (mkdir(dir, 0700) < 0 && errno != EEXIST)
    return cm_error_set(err, errno, CM_ERR_IO, "mkdir %s", dir);
  struct stat st;
  if (lstat(dir, &st) < 0) return cm_error_set(err, errno, CM_ERR_IO, "stat %s", dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s must be a directory of ours with mode 0700",
                        dir);
  sweep_run_dir(dir);
  free(p->run_dir);
  p->run_dir = steal_pointer(&dir);
  return 0;
}

static void docker_probe(sbx_backend_t *b, sbx_probe_t *probe) {
  docker_priv_t *p = priv_of(b);
  p->podman = b->ops == &sbx_podman_ops;
  cm_error_t err = CM_ERROR_INIT;
  const char *image_env = getenv("MPS_DOCKER_IMAGE");
  cleanup_free char *image = xstrdup(image_env && *image_env ? image_env : DOCKER_DEFAULT_IMAGE);
  free(p->image);
  p->image = NULL;
  if (!image_ref_ok(image)) {
    cm_error_set(&err, 0, CM_ERR_INVALID, "MPS_DOCKER_IMAGE '%s' is not an image reference", image);
    sbx_probe_finish(probe, &err);
    return;
  }
  if (find_docker(p, &err) < 0 || find_drop(p, &err) < 0 || make_run_dir(p, &err) < 0 ||
      write_container_files(b, p, &err) < 0) {
    sbx_probe_finish(probe, &err);
    return;
  }
  cm_strv_free(p->cli_envp);
  p->cli_envp = cli_env_new();
  docker_probe_state_t *st = xcalloc(1, sizeof *st);
  st->b = b;
  st->image = steal_pointer(&image);
  sbx_probe_set_state(probe, st, probe_state_free);
  char *version_argv[] = {p->docker_path, "version", "--format", "{{.Server.Version}}", NULL};
  if (sbx_probe_command(probe, version_argv, p->cli_envp, NULL, 0, DOCKER_PROBE_TIMEOUT_MS,
                        DOCKER_PROBE_OUTPUT_MAX, probe_version_done, &err) < 0)
    sbx_probe_finish(probe, &err);
}

/* ---------------------------------------------------------------- the rest */

static char *docker_describe(sbx_backend_t *b) {
  docker_priv_t *p = priv_of(b);
  helpers_reap(p);
  if (!p->server_version || !p->image)
    return xasprintf("docker (%s)", p->docker_path ? p->docker_path : "docker");
  /* sha256:0123456789ab… is enough to tell images apart. */
  const char *id = p->image_id;
  int id_len = strncmp(id, "sha256:", 7) == 0 ? 7 + 12 : (int)strlen(id);
  return xasprintf(
      "%s engine %s (%s), image %s (%.*s) with %s %s (%s)%s: read-only root, no capabilities, "
      "no-new-privileges, the native seccomp policy, %s, memory/CPU/pids limits, capped /tmp; "
      "its own network "
      "namespace (--network none), whose way out is the egress forwarder when the network is on",
      p->podman ? "podman" : "docker", p->server_version, p->docker_path, p->image, id_len, id,
      p->py_impl ? p->py_impl : "python", p->py_version ? p->py_version : "?",
      p->py_path ? p->py_path : "?", p->uv_path ? " and uv" : ", no uv",
      geteuid() == 0 ? "a uid of its own per run" : "the server's uid");
}

static bool docker_interpreter(sbx_backend_t *b, const char *host_python, sbx_interp_t *out) {
  docker_priv_t *p = priv_of(b);
  if (!p->py_path) return false;
  out->version = p->py_version;
  out->path = p->py_path;
  out->implementation = p->py_impl;
  const char *base = host_python ? strrchr(host_python, '/') : NULL;
  base = base ? base + 1 : "";
  if (strncmp(base, "python3.", 8) == 0 && base[8] >= '0' && base[8] <= '9') {
    size_t n = 8 + strspn(base + 8, "0123456789");
    cleanup_free char *version = xstrndup(base + 6, n - 6);
    const char *found = image_python(p, version);
    /* Another python3.N of the image than its python3: the minor version is what we know. */
    size_t vl = strlen(version);
    bool is_default = strncmp(p->py_version, version, vl) == 0 &&
                      (p->py_version[vl] == '.' || !p->py_version[vl]);
    if (found && !is_default) {
      free(p->last_version);
      p->last_version = xstrdup(version);
      out->version = p->last_version;
      out->path = found;
    }
  }
  return true;
}

static void docker_identity_new(sbx_backend_t *b, sbx_identity_t *id) {
  if (geteuid() == 0) sbx_uid_identity_new(id);
}

static void docker_identity_release(sbx_backend_t *b, sbx_identity_t *id) {
  sbx_uid_identity_release(id);
}

static void docker_reserve(sbx_backend_t *b, const sbx_launch_t *launch, uint64_t until_ms) {
  sbx_uid_reserve(launch->uid_slot, until_ms);
}

static bool docker_has_uv(sbx_backend_t *b) {
  return priv_of(b)->uv_path != NULL;
}

static void docker_free(sbx_backend_t *b) {
  docker_priv_t *p = b->priv;
  if (!p) return;
  helpers_drain(p, DOCKER_SHUTDOWN_WAIT_MS);
  free(p->docker_path);
  free(p->image);
  free(p->image_id);
  cm_strv_free(p->pythons);
  free(p->py_version);
  free(p->py_path);
  free(p->py_impl);
  free(p->uv_path);
  free(p->last_version);
  free(p->drop_path);
  free(p->run_dir);
  free(p->seccomp_path);
  free(p->passwd_path);
  free(p->group_path);
  free(p->hosts_path);
  free(p->resolv_path);
  free(p->server_version);
  cm_strv_free(p->cli_envp);
  free(p);
  b->priv = NULL;
}

const sbx_backend_ops_t sbx_docker_ops = {
    .name = "docker",
    .maps_paths = true,
    .can_egress = true,
    .probe = docker_probe,
    .build = docker_build,
    .kill = docker_kill,
    .reserve = docker_reserve,
    .identity_new = docker_identity_new,
    .identity_release = docker_identity_release,
    .interpreter = docker_interpreter,
    .has_uv = docker_has_uv,
    .describe = docker_describe,
    .free = docker_free,
};

/* The same backend on podman's client (rootful here), with its rlimit quirk. */
const sbx_backend_ops_t sbx_podman_ops = {
    .name = "podman",
    .maps_paths = true,
    .can_egress = true,
    .probe = docker_probe,
    .build = docker_build,
    .kill = docker_kill,
    .reserve = docker_reserve,
    .identity_new = docker_identity_new,
    .identity_release = docker_identity_release,
    .interpreter = docker_interpreter,
    .has_uv = docker_has_uv,
    .describe = docker_describe,
    .free = docker_free,
};
