/* mps-sandbox-drop: the last step inside a bubblewrap sandbox, between bwrap and the
 * interpreter.
 *
 *   mps-sandbox-drop [--uid N --gid N] [--as BYTES] [--cpu SECONDS] [--nproc N]
 *                    [--fsize BYTES] [--nofile N] -- COMMAND [ARG...]
 *
 * When the server runs as root, bwrap runs without a user namespace (so the mounts are
 * made by real root and the script's host uid can be a real unprivileged one) and starts
 * this helper as root.  The helper then, in this order:
 *   1. applies the rlimits (CORE is always 0), here rather than on bwrap itself, whose own
 *      setup would otherwise run under them;
 *   2. with --uid/--gid: empties the capability bounding set, locks the securebits so root
 *      can never regain capabilities, clears the supplementary groups and switches the
 *      real, effective and saved ids;
 *   3. clears the ambient and inheritable sets (and whatever else is left), sets
 *      no_new_privs, makes sure no controlling terminal is reachable (a new session if
 *      one is), closes every fd above 2, and checks that all of it took effect;
 *   4. execs COMMAND (an absolute path) with the environment bwrap set up.
 * Without --uid (the server is not root; bwrap made a user namespace) only the rlimits and
 * steps 3-4 apply.
 *
 * Any failure exits 126 with one line on stderr, which reaches the run's stderr; a failed
 * exec exits 127.  The program runs under the sandbox's seccomp filter, which allows
 * everything it does.  It links nothing but libc and runs before any untrusted code. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setresuid, getresuid */
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXIT_SETUP 126
#define EXIT_EXEC 127

extern char **environ;

typedef struct drop_opts {
  bool change_ids;
  uid_t uid;
  gid_t gid;
  uint64_t as_bytes, cpu_seconds, nproc, fsize_bytes, nofile; /* 0 = leave as is */
  char **argv;
} drop_opts_t;

static void die(const char *what) {
  fprintf(stderr, "mps-sandbox-drop: %s: %s\n", what, strerror(errno));
  _exit(EXIT_SETUP);
}

static void die_msg(const char *msg) {
  fprintf(stderr, "mps-sandbox-drop: %s\n", msg);
  _exit(EXIT_SETUP);
}

static uint64_t parse_number(const char *s, uint64_t max) {
  if (!s || *s < '0' || *s > '9') die_msg("expected a number");
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max) die_msg("number out of range");
  return (uint64_t)v;
}

static void parse_args(int argc, char **argv, drop_opts_t *o) {
  bool have_uid = false, have_gid = false;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (i + 1 >= argc) die_msg("option without a value");
    const char *v = argv[++i];
    if (strcmp(a, "--uid") == 0) {
      o->uid = (uid_t)parse_number(v, UINT32_MAX - 1);
      have_uid = true;
    } else if (strcmp(a, "--gid") == 0) {
      o->gid = (gid_t)parse_number(v, UINT32_MAX - 1);
      have_gid = true;
    } else if (strcmp(a, "--as") == 0) {
      o->as_bytes = parse_number(v, UINT64_MAX);
    } else if (strcmp(a, "--cpu") == 0) {
      o->cpu_seconds = parse_number(v, UINT32_MAX);
    } else if (strcmp(a, "--nproc") == 0) {
      o->nproc = parse_number(v, UINT32_MAX);
    } else if (strcmp(a, "--fsize") == 0) {
      o->fsize_bytes = parse_number(v, UINT64_MAX);
    } else if (strcmp(a, "--nofile") == 0) {
      o->nofile = parse_number(v, UINT32_MAX);
    } else {
      die_msg("unknown option");
    }
  }
  if (have_uid != have_gid) die_msg("--uid and --gid go together");
  if (have_uid && (o->uid == 0 || o->gid == 0)) die_msg("refusing to run as uid or gid 0");
  o->change_ids = have_uid;
  if (i >= argc || argv[i][0] != '/') die_msg("expected -- and an absolute command path");
  o->argv = &argv[i];
}

/* Sets soft and hard limit.  Unprivileged, a hard limit can only go down: a request above
 * the current hard limit keeps that hard limit (it is already stricter). */
static void set_limit(int resource, uint64_t soft, uint64_t hard, const char *name) {
  struct rlimit cur;
  if (getrlimit(resource, &cur) < 0) die(name);
  struct rlimit rl = {.rlim_cur = (rlim_t)soft, .rlim_max = (rlim_t)hard};
  if (setrlimit(resource, &rl) == 0) return;
  if (errno != EPERM) die(name);
  if (cur.rlim_max != RLIM_INFINITY && rl.rlim_max > cur.rlim_max) rl.rlim_max = cur.rlim_max;
  if (rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
  if (setrlimit(resource, &rl) < 0) die(name);
}

static void apply_limits(const drop_opts_t *o) {
  if (o->as_bytes) set_limit(RLIMIT_AS, o->as_bytes, o->as_bytes, "setrlimit(AS)");
  /* The soft limit sends SIGXCPU, the hard limit a second later SIGKILL. */
  if (o->cpu_seconds) set_limit(RLIMIT_CPU, o->cpu_seconds, o->cpu_seconds + 1, "setrlimit(CPU)");
  if (o->nproc) set_limit(RLIMIT_NPROC, o->nproc, o->nproc, "setrlimit(NPROC)");
  if (o->fsize_bytes) set_limit(RLIMIT_FSIZE, o->fsize_bytes, o->fsize_bytes, "setrlimit(FSIZE)");
  if (o->nofile) set_limit(RLIMIT_NOFILE, o->nofile, o->nofile, "setrlimit(NOFILE)");
  set_limit(RLIMIT_CORE, 0, 0, "setrlimit(CORE)");
}

static int capget_all(struct __user_cap_data_struct data[2]) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  return (int)syscall(SYS_capget, &hdr, data);
}

static int capset_none(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  return (int)syscall(SYS_capset, &hdr, data);
}

static void drop_bounding_set(bool must) {
  for (unsigned long cap = 0; cap < 64; cap++) {
    if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) break; /* EINVAL: past the last cap */
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && must) die("dropping the bounding set");
  }
}

static void change_ids(const drop_opts_t *o) {
  drop_bounding_set(true);
  /* setuid() below must clear every capability, and no later exec of a root-owned or
   * uid-0 program may hand any back. */
  if (prctl(PR_SET_SECUREBITS,
            SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_NOROOT |
                SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
            0, 0, 0) < 0)
    die("locking the securebits");
  if (setgroups(0, NULL) < 0) die("setgroups");
  if (setresgid(o->gid, o->gid, o->gid) < 0) die("setresgid");
  if (setresuid(o->uid, o->uid, o->uid) < 0) die("setresuid");
}

static void verify(const drop_opts_t *o) {
  if (o->change_ids) {
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (getresuid(&r, &e, &s) < 0 || getresgid(&rg, &eg, &sg) < 0) die("getresuid");
    if (r != o->uid || e != o->uid || s != o->uid || rg != o->gid || eg != o->gid || sg != o->gid)
      die_msg("the uid/gid change did not take effect");
    if (getgroups(0, NULL) != 0) die_msg("supplementary groups remain");
    if (setresuid(0, 0, 0) == 0) die_msg("could switch back to root");
  }
  struct __user_cap_data_struct data[2];
  if (capget_all(data) < 0) die("capget");
  for (int i = 0; i < 2; i++) {
    if (data[i].effective || data[i].permitted || data[i].inheritable)
      die_msg("capabilities remain");
  }
  if (o->change_ids && prctl(PR_CAPBSET_READ, 0UL, 0, 0, 0) != 0)
    die_msg("the bounding set is not empty");
  if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) die_msg("no_new_privs is not set");
}

int main(int argc, char **argv) {
  drop_opts_t o;
  memset(&o, 0, sizeof o);
  parse_args(argc, argv, &o);

  apply_limits(&o);
  if (o.change_ids) {
    change_ids(&o);
  } else {
    drop_bounding_set(false); /* in a user namespace without capabilities this is a no-op */
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    die("clearing the ambient set");
  if (capset_none() < 0) die("capset");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
  verify(&o);

  /* The server starts bwrap in a session of its own without a terminal; should a terminal
   * be reachable anyway, leave it, so the script can never push input into it. */
  int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (tty >= 0) {
    close(tty);
    if (setsid() < 0) die("setsid");
  }

  /* Only stdio goes to the script; anything else bwrap or its caller left open does not. */
  if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0) {
    for (int fd = 3; fd < 1024; fd++) close(fd);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  umask(022);

  execve(o.argv[0], o.argv, environ);
  int saved = errno;
  fprintf(stderr, "mps-sandbox-drop: cannot execute %s: %s\n", o.argv[0], strerror(saved));
  _exit(EXIT_EXEC);
}
