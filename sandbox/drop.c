/* mps-sandbox-drop: the last step inside a bubblewrap sandbox, between bwrap and the
 * interpreter.
 *
 *   mps-sandbox-drop [--uid N --gid N] [--as BYTES] [--cpu SECONDS] [--nproc N]
 *                    [--fsize BYTES] [--nofile N] [--status-fd FD] [--control-fd FD]
 *                    [--egress-fd FD --egress-port PORT] [--wait-go] -- COMMAND [ARG...]
 *
 * When the server runs as root, bwrap runs without a user namespace (so the mounts are
 * made by real root and the script's host uid can be a real unprivileged one) and starts
 * this helper as root.  The command is started like this, in this order:
 *   1. the rlimits (CORE is always 0), here rather than on bwrap itself, whose own setup
 *      would otherwise run under them;
 *   2. with --uid/--gid: the capability bounding set is emptied, the securebits locked so
 *      root can never regain capabilities, the supplementary groups cleared and the real,
 *      effective and saved ids switched;
 *   3. the ambient and inheritable sets (and whatever else is left) cleared, no_new_privs
 *      set, no controlling terminal reachable (a new session if one is), every fd above 2
 *      closed, and all of it checked;
 *   4. COMMAND (an absolute path) exec'd with the environment bwrap set up.
 * Without --uid (the server is not root; bwrap made a user namespace) only the rlimits and
 * steps 3-4 apply.
 *
 * With --status-fd (and --control-fd) the helper stays as a small supervisor (pid 1 of the
 * sandbox: bwrap runs it --as-pid-1, without an init of its own): it forks, the child takes
 * steps 1-4, and the supervisor
 *   - is a child subreaper, so everything the command leaves behind is reaped (and
 *     counted) here;
 *   - sends SIGTERM to every other process in the sandbox when the control fd becomes
 *     readable (the server closed its end: the graceful half of a timeout or cancel; the
 *     SIGKILL half is the server killing bwrap, and with it the pid namespace);
 *   - when the command has exited, SIGKILLs and reaps whatever is left, writes one
 *     sbx_status_record_t (the command's real wait status and rusage, see sbx.h) to the
 *     status fd and exits 0.
 * With --wait-go the supervisor, once the sandbox is set up, first waits for one byte
 * 'G' on the control fd before it starts the command (a sandbox prestarted for the next
 * call: its set-up is off that call's path).  End of file instead means the sandbox is not
 * needed: it exits 0 without a record and without running anything.
 * As root the supervisor stays uid 0 but keeps only CAP_KILL (to signal the script's
 * uid), with an empty bounding set, no_new_privs and not dumpable: the script, under
 * another uid, without capabilities and with ptrace denied by seccomp, can neither signal
 * it nor trace it nor reach its fds, so a record is the supervisor's own.  Without --uid
 * the script shares the supervisor's uid, but as the namespace's pid 1 the supervisor
 * ignores its signals, and it cannot trace it (not dumpable, and seccomp denies ptrace).
 * Should the supervisor die anyway there is no record: bwrap exits non-zero and the server
 * reports the status as unknown rather than trust anything.
 *
 * With --egress-fd (a unix SOCK_SEQPACKET socket to the server's egress proxy, egress.h) the
 * supervisor is also the sandbox's forwarder: before the go (a prestarted sandbox has it
 * ready) it listens on PORT of every IPv4 address of the sandbox's own network namespace (which
 * has nothing but loopback: 127.0.0.0/8) and of [::1] when the namespace has IPv6, and passes every
 * connection it accepts to the server as a file descriptor (SCM_RIGHTS), copying no bytes itself.
 * It never blocks: the listeners are non-blocking, a connection the server cannot take yet waits in
 * a queue of at most EGRESS_QUEUE (while it is full nothing more is accepted, and the kernel's
 * backlog holds the rest), and when the server's end closes it stops listening, so clients see
 * refused connections.  The port needs no capability (it is above 1024), and the listeners are made
 * before the supervisor restricts itself; the command never inherits them.
 *
 * Any failure exits 126 with one line on stderr, which reaches the run's stderr; a failed
 * exec exits 127.  The program runs under the sandbox's seccomp filter, which allows
 * everything it does; the filter stays on the command.  It links nothing but libc and runs
 * before any untrusted code. */
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
#include <poll.h>
#include <arpa/inet.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/sbx.h" /* sbx_status_record_t only: nothing of the library is linked */

#define EXIT_SETUP 126
#define EXIT_EXEC 127

extern char **environ;

typedef struct drop_opts {
  bool change_ids;
  uid_t uid;
  gid_t gid;
  uint64_t as_bytes, cpu_seconds, nproc, fsize_bytes, nofile; /* 0 = leave as is */
  int status_fd, control_fd;                                  /* -1 = none */
  int egress_fd;                                              /* -1 = none */
  uint16_t egress_port;
  bool wait_go;
  const char *connect_path;   /* --connect: inside a container (see "Containers") */
  const char *container_host; /* --container-host: the host side of one */
  int oom_fd;                 /* the container's memory cgroup counters, or -1 */
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

/* An fd given on the command line must be open, above stdio, and open for mode. */
static void check_fd(int fd, int mode, const char *name) {
  if (fd < 0) return;
  int fl = fd > 2 ? fcntl(fd, F_GETFL) : -1;
  if (fl < 0 || (fl & O_ACCMODE) != mode) {
    fprintf(stderr, "mps-sandbox-drop: %s %d is not usable\n", name, fd);
    _exit(EXIT_SETUP);
  }
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
    if (strcmp(a, "--wait-go") == 0) {
      o->wait_go = true;
      continue;
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
    } else if (strcmp(a, "--status-fd") == 0) {
      o->status_fd = (int)parse_number(v, INT_MAX);
    } else if (strcmp(a, "--control-fd") == 0) {
      o->control_fd = (int)parse_number(v, INT_MAX);
    } else if (strcmp(a, "--egress-fd") == 0) {
      o->egress_fd = (int)parse_number(v, INT_MAX);
    } else if (strcmp(a, "--egress-port") == 0) {
      o->egress_port = (uint16_t)parse_number(v, 65535);
    } else if (strcmp(a, "--connect") == 0) {
      o->connect_path = v;
    } else if (strcmp(a, "--container-host") == 0) {
      o->container_host = v;
    } else {
      die_msg("unknown option");
    }
  }
  if (have_uid != have_gid) die_msg("--uid and --gid go together");
  if (have_uid && (o->uid == 0 || o->gid == 0)) die_msg("refusing to run as uid or gid 0");
  o->change_ids = have_uid;
  if (o->connect_path) {
    /* The channel (status, control and the egress fd) comes over the socket. */
    if (o->status_fd >= 0 || o->control_fd >= 0 || o->egress_fd >= 0 || o->wait_go || have_uid)
      die_msg("--connect takes no fds, --wait-go or --uid");
    if (o->connect_path[0] != '/') die_msg("--connect needs an absolute path");
    if (o->egress_port && o->egress_port < 1024) die_msg("--egress-port must be above 1023");
    if (i >= argc || argv[i][0] != '/') die_msg("expected -- and an absolute command path");
    o->argv = &argv[i];
    return;
  }
  if (o->container_host) {
    if (o->status_fd < 0 || o->control_fd < 0)
      die_msg("--container-host needs --status-fd and --control-fd");
    if (o->container_host[0] != '/') die_msg("--container-host needs an absolute path");
    if (o->wait_go || have_uid || o->egress_port)
      die_msg("--container-host takes no --wait-go, --uid or --egress-port");
  }
  if (o->control_fd >= 0 && o->status_fd < 0) die_msg("--control-fd needs --status-fd");
  if (o->wait_go && o->control_fd < 0) die_msg("--wait-go needs --control-fd");
  check_fd(o->status_fd, O_WRONLY, "--status-fd");
  check_fd(o->control_fd, O_RDONLY, "--control-fd");
  check_fd(o->egress_fd, O_RDWR, "--egress-fd");
  if (o->status_fd >= 0 && o->status_fd == o->control_fd) die_msg("one fd for status and control");
  if (o->egress_fd >= 0) {
    if (o->status_fd < 0) die_msg("--egress-fd needs --status-fd");
    if (o->egress_port < 1024 && !o->container_host)
      die_msg("--egress-fd needs an --egress-port above 1023");
    if (o->egress_fd == o->status_fd || o->egress_fd == o->control_fd)
      die_msg("--egress-fd is another channel's fd");
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(o->egress_fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_SEQPACKET)
      die_msg("--egress-fd is not a SOCK_SEQPACKET socket");
  } else if (o->egress_port) {
    die_msg("--egress-port needs --egress-fd");
  }
  if (o->container_host) {
    if (i >= argc || argv[i][0] != '/') die_msg("expected -- and an absolute command path");
    o->argv = &argv[i];
    return;
  }
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

/* Steps 1-4 of the header; never returns. */
static void drop_and_exec(const drop_opts_t *o) __attribute__((noreturn));
static void drop_and_exec(const drop_opts_t *o) {
  apply_limits(o);
  if (o->change_ids) {
    change_ids(o);
  } else {
    drop_bounding_set(false); /* in a user namespace without capabilities this is a no-op */
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    die("clearing the ambient set");
  if (capset_none() < 0) die("capset");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
  verify(o);

  /* The server starts bwrap without a terminal; should a terminal be reachable anyway,
   * leave it, so the script can never push input into it. */
  int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (tty >= 0) {
    close(tty);
    if (setsid() < 0) die("setsid");
  }

  /* Only stdio goes to the script; anything else bwrap or its caller left open (the
   * supervisor's status and control fds included) does not. */
  if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0) {
    for (int fd = 3; fd < 1024; fd++) close(fd);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  umask(022);

  execve(o->argv[0], o->argv, environ);
  int saved = errno;
  fprintf(stderr, "mps-sandbox-drop: cannot execute %s: %s\n", o->argv[0], strerror(saved));
  _exit(EXIT_EXEC);
}

/* ---------------------------------------------------------------- the supervisor */

static void close_range_or_loop(unsigned first, unsigned last) {
  if (first > last) return;
  if (syscall(SYS_close_range, first, last, 0U) == 0) return;
  for (unsigned fd = first; fd <= last && fd < 1024; fd++) close((int)fd);
}

/* Closes every fd above 2 except those of keep[] (-1 = none). */
static void close_all_but(const int *keep, size_t n) {
  int sorted[4];
  size_t m = 0;
  for (size_t i = 0; i < n && m < 4; i++)
    if (keep[i] >= 3) sorted[m++] = keep[i];
  for (size_t i = 1; i < m; i++)
    for (size_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
      int t = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = t;
    }
  unsigned next = 3;
  for (size_t i = 0; i < m; i++) {
    if ((unsigned)sorted[i] < next) continue;
    close_range_or_loop(next, (unsigned)sorted[i] - 1);
    next = (unsigned)sorted[i] + 1;
  }
  close_range_or_loop(next, ~0U);
}

/* ---------------------------------------------------------------- the forwarder */

#define EGRESS_QUEUE 64
#define EGRESS_BACKLOG 128

typedef struct egress {
  int fd;        /* to the server; -1 = none, or gone */
  int listen[2]; /* 127.0.0.1, ::1; -1 = none */
  int queue[EGRESS_QUEUE];
  size_t n_queued;
} egress_t;

static int egress_listen(int family, uint16_t port) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (family == AF_INET) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    /* Every loopback address: the namespace has nothing else, and a build reaches its
     * index n at 127.0.1.<n+1> (egress.h). */
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  } else {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    struct sockaddr_in6 a = {
        .sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  }
  if (rc < 0 || listen(fd, EGRESS_BACKLOG) < 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

static void egress_setup(egress_t *e, const drop_opts_t *o) {
  e->fd = o->egress_fd;
  e->listen[0] = e->listen[1] = -1;
  e->n_queued = 0;
  if (e->fd < 0) return;
  if (fcntl(e->fd, F_SETFD, FD_CLOEXEC) < 0) die("fcntl");
  e->listen[0] = egress_listen(AF_INET, o->egress_port);
  if (e->listen[0] < 0) die("listening on the sandbox's loopback for the egress proxy");
  e->listen[1] = egress_listen(AF_INET6, o->egress_port); /* a namespace without IPv6: none */
}

/* The server's end is gone: no more connections are taken or passed. */
static void egress_gone(egress_t *e) {
  for (size_t i = 0; i < e->n_queued; i++) close(e->queue[i]);
  e->n_queued = 0;
  for (int i = 0; i < 2; i++) {
    if (e->listen[i] >= 0) close(e->listen[i]);
    e->listen[i] = -1;
  }
  if (e->fd >= 0) close(e->fd);
  e->fd = -1;
}

/* 1 = passed (our copy closed), 0 = the server cannot take it yet, -1 = the server is gone. */
static int egress_pass(egress_t *e, int conn) {
  char byte = 'C';
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &conn, sizeof conn);
  for (;;) {
    ssize_t n = sendmsg(e->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == 1) {
      close(conn);
      return 1;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == ENOBUFS)) return 0;
    return -1;
  }
}

static void egress_flush(egress_t *e) {
  size_t done = 0;
  while (done < e->n_queued && e->fd >= 0) {
    int rc = egress_pass(e, e->queue[done]);
    if (rc == 0) break;
    if (rc < 0) {
      egress_gone(e);
      return;
    }
    done++;
  }
  memmove(e->queue, e->queue + done, (e->n_queued - done) * sizeof e->queue[0]);
  e->n_queued -= done;
}

static void egress_accept(egress_t *e, int lfd) {
  while (e->fd >= 0 && e->n_queued < EGRESS_QUEUE) {
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return; /* EAGAIN, or a connection that went away meanwhile */
    if (e->n_queued == 0) {
      int rc = egress_pass(e, c);
      if (rc == 1) continue;
      if (rc < 0) {
        close(c);
        egress_gone(e);
        return;
      }
    }
    e->queue[e->n_queued++] = c;
  }
}

static uint64_t tv_us(struct timeval tv) {
  return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

/* Reaps every child that has exited (blocking until none is left if wait_all). */
static void reap(pid_t main_pid, bool wait_all, bool *main_done, int *main_status,
                 struct rusage *main_ru) {
  for (;;) {
    int st = 0;
    struct rusage ru;
    pid_t p = wait4(-1, &st, wait_all ? 0 : WNOHANG, &ru);
    if (p < 0 && errno == EINTR) continue;
    if (p <= 0) return; /* none exited yet, or ECHILD: none left */
    if (p == main_pid) {
      *main_done = true;
      *main_status = st;
      *main_ru = ru;
    }
  }
}

/* As root: uid 0 with CAP_KILL alone (to signal the script's uid), nothing to regain.  In
 * a user namespace there is nothing to keep.  Either way: not dumpable (no ptrace, no
 * /proc/PID/fd or mem for a same-uid script) and no_new_privs. */
static int harden_supervisor(const drop_opts_t *o) {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) return -1;
  if (o->change_ids) {
    for (unsigned long cap = 0; cap < 64; cap++) {
      if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) break;
      if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) return -1;
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) return -1;
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (o->change_ids) data[0].effective = data[0].permitted = 1u << CAP_KILL;
  if (syscall(SYS_capset, &hdr, data) < 0) return -1;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
  struct __user_cap_data_struct now[2];
  if (capget_all(now) < 0) return -1;
  if (now[0].effective != data[0].effective || now[0].permitted != data[0].permitted ||
      now[0].inheritable || now[1].effective || now[1].permitted || now[1].inheritable)
    return -1;
  return 0;
}

/* ---------------------------------------------------------------- containers
 *
 * A container engine (docker, podman) starts a container, not a process of ours: its pid 1
 * is this helper, bind-mounted into it, with --connect PATH (a unix socket bind-mounted from
 * the host).  On the host, the server runs the engine's client under this helper too, with
 * --container-host DIR and the usual --status-fd, --control-fd (and --egress-fd): that side
 * makes DIR and the socket in it before it starts the client, accepts exactly one
 * connection (the container's pid 1 connects before it starts the command, so the command
 * can never be first), then removes the socket, so nothing else can connect.  Over that
 * connection it sends one message: the egress fd (SCM_RIGHTS) or none.  Inside, the
 * connection is the supervisor's status and control channel: the host shuts its writing
 * half down for the graceful kill (the control fd closing), and the supervisor sends its
 * one status record back, which the host side writes to its status fd.  So the record is
 * the supervisor's own (the command runs with every fd above 2 closed; the supervisor is
 * not dumpable and, as the pid namespace's init, ignores the command's signals), and the
 * egress path is the same forwarder as with bubblewrap.
 *
 * Inside, the supervisor also reads the container's memory cgroup (cgroup v1
 * memory.oom_control or v2 memory.events, both mounted read-only at /sys/fs/cgroup by the
 * engines): when its oom_kill count grew while the command ran, the record says
 * SBX_STATUS_OOM_KILL.  (docker's OOMKilled would need a `docker inspect` after the
 * exit, and podman's is not set on these machines.) */

#define CHANNEL_NAME "channel"

static uint64_t oom_kills(int fd) {
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  for (char *line = buf; line && *line;) {
    if (strncmp(line, "oom_kill ", 9) == 0) return strtoull(line + 9, NULL, 10);
    line = strchr(line, '\n');
    if (line) line++;
  }
  return 0;
}

static int open_oom_counters(void) {
  static const char *const files[] = {"/sys/fs/cgroup/memory/memory.oom_control",
                                      "/sys/fs/cgroup/memory.events"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(files); i++) {
    int fd = open(files[i], O_RDONLY | O_CLOEXEC);
    if (fd >= 0) return fd;
  }
  return -1;
}

/* Inside the container: the channel, the egress fd from it, the cgroup counters. */
static void container_connect(drop_opts_t *o) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(o->connect_path) >= sizeof a.sun_path) die_msg("--connect path too long");
  strcpy(a.sun_path, o->connect_path);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) die("socket");
  int rc;
  do rc = connect(s, (struct sockaddr *)&a, sizeof a);
  while (rc < 0 && errno == EINTR);
  if (rc < 0) die("connecting to the server's channel");
  char byte = 0;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n != 1 || (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
    die_msg("no greeting on the server's channel");
  struct cmsghdr *h = CMSG_FIRSTHDR(&m);
  int fd = -1;
  if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
      h->cmsg_len == CMSG_LEN(sizeof(int)))
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
  if (byte == 'E') {
    if (fd < 0) die_msg("the server's channel sent no egress fd");
    if (!o->egress_port) die_msg("an egress fd needs --egress-port");
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_SEQPACKET)
      die_msg("the egress fd is not a SOCK_SEQPACKET socket");
    o->egress_fd = fd;
  } else if (byte != 'N' || fd >= 0) {
    die_msg("unexpected greeting on the server's channel");
  } else {
    o->egress_port = 0;
  }
  o->status_fd = s;
  o->control_fd = fcntl(s, F_DUPFD_CLOEXEC, 3);
  if (o->control_fd < 0) die("fcntl");
  o->oom_fd = open_oom_counters();
}

/* The host side; never returns. */
static void container_host(drop_opts_t *o) __attribute__((noreturn));
static void container_host(drop_opts_t *o) {
  int chans[] = {o->status_fd, o->control_fd, o->egress_fd};
  for (size_t i = 0; i < CM_ARRAY_SIZE(chans); i++)
    if (chans[i] >= 0 && fcntl(chans[i], F_SETFD, FD_CLOEXEC) < 0) die("fcntl");
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(o->container_host) + sizeof "/" CHANNEL_NAME > sizeof a.sun_path)
    die_msg("--container-host path too long");
  snprintf(a.sun_path, sizeof a.sun_path, "%s/" CHANNEL_NAME, o->container_host);
  /* The directory is new (never one someone else made) and only searchable by others: the
   * container's uid must reach the socket in it through the bind mount. */
  /* Locked from its birth under its name, and held while this side lives: a directory
   * nobody holds is one a killed server's launcher left, and the next server removes it
   * (docker.c, sweep_run_dir).  So it is made under a dot name, locked, then renamed. */
  char fresh[PATH_MAX];
  const char *base = strrchr(o->container_host, '/') + 1;
  snprintf(fresh, sizeof fresh, "%.*s.new-%s", (int)(base - o->container_host), o->container_host,
           base);
  if (mkdir(fresh, 0700) < 0 || chmod(fresh, 0711) < 0) die("mkdir --container-host");
  int held = open(fresh, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (held < 0 || flock(held, LOCK_EX | LOCK_NB) < 0 || rename(fresh, o->container_host) < 0) {
    int saved = errno;
    rmdir(fresh);
    errno = saved;
    die("locking --container-host");
  }
  int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || chmod(a.sun_path, 0666) < 0 ||
      listen(lfd, 1) < 0) {
    int saved = errno;
    unlink(a.sun_path);
    rmdir(o->container_host);
    errno = saved;
    die("the container's channel");
  }
  bool linked = true;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) die("sigprocmask");
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) die("signalfd");
  signal(SIGPIPE, SIG_IGN);
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    /* The client goes with this side (itself SIGKILLed with the server). */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() == 1) _exit(EXIT_SETUP);
    execve(o->argv[0], o->argv, environ);
    fprintf(stderr, "mps-sandbox-drop: cannot execute %s: %s\n", o->argv[0], strerror(errno));
    _exit(EXIT_EXEC);
  }
  int conn = -1;
  bool control_closed = false, have_record = false, bad_record = false, exited = false;
  int status = 0;
  sbx_status_record_t rec;
  while (!exited) {
    struct pollfd p[4] = {{sfd, POLLIN, 0},
                          {lfd, POLLIN, 0},
                          {control_closed ? -1 : o->control_fd, POLLIN, 0},
                          {conn, POLLIN, 0}};
    if (poll(p, 4, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (p[1].fd >= 0 && (p[1].revents & POLLIN)) {
      conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn >= 0) {
        /* One connection, the first: nothing else may connect after it. */
        close(lfd);
        lfd = -1;
        unlink(a.sun_path);
        linked = false;
        char byte = o->egress_fd >= 0 ? 'E' : 'N';
        struct iovec iov = {&byte, 1};
        union {
          struct cmsghdr h;
          char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (o->egress_fd >= 0) {
          m.msg_control = ctl.buf;
          m.msg_controllen = sizeof ctl.buf;
          struct cmsghdr *h = CMSG_FIRSTHDR(&m);
          h->cmsg_level = SOL_SOCKET;
          h->cmsg_type = SCM_RIGHTS;
          h->cmsg_len = CMSG_LEN(sizeof(int));
          memcpy(CMSG_DATA(h), &o->egress_fd, sizeof(int));
        }
        if (sendmsg(conn, &m, MSG_NOSIGNAL) != 1) bad_record = true;
        if (o->egress_fd >= 0) close(o->egress_fd);
        o->egress_fd = -1;
        if (control_closed) shutdown(conn, SHUT_WR);
      }
    }
    if (p[2].fd >= 0 && p[2].revents) {
      /* The server closed its end: the graceful half of a kill, passed on. */
      control_closed = true;
      close(o->control_fd);
      if (conn >= 0) shutdown(conn, SHUT_WR);
    }
    if (p[3].fd >= 0 && p[3].revents) {
      unsigned char buf[2 * sizeof rec];
      ssize_t n = recv(conn, buf, sizeof buf, MSG_DONTWAIT);
      if (n == (ssize_t)sizeof rec && !have_record) {
        memcpy(&rec, buf, sizeof rec);
        have_record = true;
      } else if (n > 0) {
        bad_record = true; /* a second message, or a malformed one: trust none */
      } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(conn);
        conn = -1;
      }
    }
    if (p[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      pid_t w;
      do w = waitpid(child, &status, WNOHANG);
      while (w < 0 && errno == EINTR);
      if (w == child) exited = true;
    }
  }
  /* A record sent right before the container ended is already queued. */
  if (conn >= 0) {
    unsigned char buf[2 * sizeof rec];
    ssize_t n;
    while ((n = recv(conn, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      if (n == (ssize_t)sizeof rec && !have_record) {
        memcpy(&rec, buf, sizeof rec);
        have_record = true;
      } else {
        bad_record = true;
      }
    }
  }
  if (linked) unlink(a.sun_path);
  rmdir(o->container_host);
  if (have_record && !bad_record) {
    ssize_t n;
    do n = write(o->status_fd, &rec, sizeof rec);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof rec) die("writing the status record");
    _exit(0);
  }
  /* No trustworthy record: the client's own status (the server reports it as unknown). */
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status) ? WEXITSTATUS(status) : EXIT_SETUP);
  _exit(128 + WTERMSIG(status));
}

static void supervise(const drop_opts_t *o) __attribute__((noreturn));
static void supervise(const drop_opts_t *o) {
  /* kill(-1) below reaches every process this one may signal in its pid namespace: only
   * ever do that at the top of a namespace made for the run (pid 1 with bwrap --as-pid-1;
   * pid 2 under an init of bwrap's own).  In the host's namespace pids 1 and 2 are init and
   * kthreadd, so nothing there passes.  As pid 1 of its namespace the supervisor also
   * ignores every signal sent from inside it that it has no handler for, SIGKILL included,
   * whatever the sender's uid; and when it exits, the kernel kills what is left. */
  if (getpid() > 2) die_msg("--status-fd needs a pid namespace of its own");
  int keep[] = {o->status_fd, o->control_fd, o->egress_fd, o->oom_fd};
  close_all_but(keep, CM_ARRAY_SIZE(keep));
  if (fcntl(o->status_fd, F_SETFD, FD_CLOEXEC) < 0 ||
      (o->control_fd >= 0 && fcntl(o->control_fd, F_SETFD, FD_CLOEXEC) < 0))
    die("fcntl");
  /* Orphans of the script come here (as pid 1, and under an init of bwrap's too): reaped,
   * and counted. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) die("PR_SET_CHILD_SUBREAPER");
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) die("sigprocmask");
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) die("signalfd");
  /* The forwarder listens before the go: a prestarted sandbox is complete when released. */
  egress_t eg;
  egress_setup(&eg, o);

  if (o->wait_go) {
    char go = 0;
    ssize_t n;
    do n = read(o->control_fd, &go, 1);
    while (n < 0 && errno == EINTR);
    if (n == 0) _exit(0); /* not needed after all */
    if (n != 1 || go != 'G') die_msg("unexpected byte on the control fd");
  }

  /* vfork: no copy of this process's page tables and no copy-on-write faults (which cost
   * more than the rest of this helper on our machines).  The child only makes system
   * calls until it execs or _exits, and this process waits until then. */
  pid_t child = vfork();
  if (child < 0) die("vfork");
  if (child == 0) drop_and_exec(o); /* closes sfd and both channel fds before the exec */

  if (harden_supervisor(o) < 0) {
    int saved = errno;
    kill(child, SIGKILL);
    errno = saved;
    die("restricting the supervisor");
  }
  signal(SIGPIPE, SIG_IGN); /* a vanished reader is a write error, not a death */

  uint64_t oom_before = oom_kills(o->oom_fd);
  bool main_done = false;
  int main_status = 0;
  struct rusage main_ru;
  memset(&main_ru, 0, sizeof main_ru);
  struct pollfd pfd[5] = {{sfd, POLLIN, 0}, {o->control_fd, POLLIN, 0}};
  while (!main_done) {
    /* Listening only while a connection can be queued; the server's end only for its
     * closing (and for room, when something waits). */
    bool room = eg.fd >= 0 && eg.n_queued < EGRESS_QUEUE;
    for (int i = 0; i < 2; i++) pfd[2 + i] = (struct pollfd){room ? eg.listen[i] : -1, POLLIN, 0};
    pfd[4] = (struct pollfd){eg.fd, (short)(eg.n_queued ? POLLOUT : 0), 0};
    if (poll(pfd, 5, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pfd[1].fd >= 0 && pfd[1].revents) {
      /* The server closed its end (or wrote): a graceful end for everything but this
       * process (and pid 1, were that not this one), which kill(-1) leaves out. */
      kill(-1, SIGTERM);
      close(pfd[1].fd);
      pfd[1].fd = -1;
    }
    if (pfd[4].fd >= 0 && (pfd[4].revents & (POLLHUP | POLLERR | POLLNVAL)))
      egress_gone(&eg);
    else if (pfd[4].fd >= 0 && (pfd[4].revents & POLLOUT))
      egress_flush(&eg);
    for (int i = 0; i < 2; i++)
      if (pfd[2 + i].fd >= 0 && pfd[2 + i].fd == eg.listen[i] && (pfd[2 + i].revents & POLLIN))
        egress_accept(&eg, eg.listen[i]);
    if (pfd[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      reap(child, false, &main_done, &main_status, &main_ru);
    }
  }
  /* What the command left behind goes with it, as it would with the sandbox, and is
   * reaped here so that its usage counts. */
  kill(-1, SIGKILL);
  reap(child, true, &main_done, &main_status, &main_ru);
  struct rusage tree;
  if (getrusage(RUSAGE_CHILDREN, &tree) < 0) die("getrusage");

  sbx_status_record_t rec;
  memset(&rec, 0, sizeof rec);
  rec.magic = SBX_STATUS_MAGIC;
  rec.size = (uint32_t)sizeof rec;
  rec.wait_status = main_status;
  rec.main_user_us = tv_us(main_ru.ru_utime);
  rec.main_system_us = tv_us(main_ru.ru_stime);
  rec.main_max_rss_kib = (uint64_t)main_ru.ru_maxrss;
  rec.tree_user_us = tv_us(tree.ru_utime);
  rec.tree_system_us = tv_us(tree.ru_stime);
  rec.tree_max_rss_kib = (uint64_t)tree.ru_maxrss;
  if (o->oom_fd >= 0 && oom_kills(o->oom_fd) > oom_before) rec.flags |= SBX_STATUS_OOM_KILL;
  /* Non-blocking: should the pipe be full, that is an error, not a hang. */
  int fl = fcntl(o->status_fd, F_GETFL);
  if (fl < 0 || fcntl(o->status_fd, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl");
  ssize_t n;
  do n = write(o->status_fd, &rec, sizeof rec);
  while (n < 0 && errno == EINTR);
  if (n < 0) die("writing the status record");
  if (n != (ssize_t)sizeof rec) die_msg("short write of the status record");
  _exit(0);
}

/* mps-sandbox-drop --join-cgroup FD [--join-cgroup FD...] [--as BYTES] [--cpu SECONDS]
 *                  [--nproc N] [--fsize BYTES] [--nofile N] -- COMMAND [ARG...]
 *
 * Not a sandbox step: the server spawns this on the host, in front of bwrap, where runs get a
 * cgroup v1 hierarchy.  Moving a process into a cgroup v1 (a write to its cgroup.procs) waits
 * for an RCU grace period in the kernel, 10-20 ms on our machines, and the server's spawn is
 * suspended until its child execs (vfork-style): in the child, that wait would stall the
 * server's whole event loop.  Here it stalls only this process.  Each FD (an open cgroup.procs
 * file, inherited) is joined and closed; then the rlimits given (the spawn's, which it leaves
 * to this process: an interpreter under them would have to fit here too, and a sanitizer's
 * runtime does not fit under an address-space limit), then COMMAND is exec'd as it is, with
 * this process's environment and everything else: nothing of the sandbox runs before. */
static void join_and_exec(int argc, char **argv) __attribute__((noreturn));
static void join_and_exec(int argc, char **argv) {
  drop_opts_t lim;
  memset(&lim, 0, sizeof lim);
  bool limits = false;
  int i = 1;
  for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
    const char *a = argv[i];
    if (i + 1 >= argc) die_msg("option without a value");
    const char *v = argv[i + 1];
    if (strcmp(a, "--join-cgroup") == 0) {
      int fd = (int)parse_number(v, INT_MAX);
      check_fd(fd, O_WRONLY, "--join-cgroup");
      ssize_t n;
      do n = write(fd, "0", 1);
      while (n < 0 && errno == EINTR);
      if (n != 1) die("joining the run's cgroup");
      close(fd);
      continue;
    }
    limits = true;
    if (strcmp(a, "--as") == 0)
      lim.as_bytes = parse_number(v, UINT64_MAX);
    else if (strcmp(a, "--cpu") == 0)
      lim.cpu_seconds = parse_number(v, UINT32_MAX);
    else if (strcmp(a, "--nproc") == 0)
      lim.nproc = parse_number(v, UINT32_MAX);
    else if (strcmp(a, "--fsize") == 0)
      lim.fsize_bytes = parse_number(v, UINT64_MAX);
    else if (strcmp(a, "--nofile") == 0)
      lim.nofile = parse_number(v, UINT32_MAX);
    else
      die_msg("--join-cgroup takes --join-cgroup FD and rlimit options only");
  }
  if (i + 1 >= argc || argv[i + 1][0] != '/') die_msg("expected -- and an absolute command path");
  if (limits) apply_limits(&lim);
  execve(argv[i + 1], &argv[i + 1], environ);
  fprintf(stderr, "mps-sandbox-drop: exec %s: %s\n", argv[i + 1], strerror(errno));
  _exit(EXIT_EXEC);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--join-cgroup") == 0) join_and_exec(argc, argv);
  drop_opts_t o;
  memset(&o, 0, sizeof o);
  o.status_fd = o.control_fd = o.egress_fd = o.oom_fd = -1;
  parse_args(argc, argv, &o);
  if (o.container_host) container_host(&o);
  if (o.connect_path) container_connect(&o);
  if (o.status_fd >= 0) supervise(&o);
  drop_and_exec(&o);
}
