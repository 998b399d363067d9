/* sandbox/: backends (none, bwrap, docker), the spawn helper, and the life of one run
 * (pipes, deadlines, tree kill, reaping).  Knows nothing of JSON-RPC or MCP. */
#ifndef MPS_SANDBOX_SBX_H
#define MPS_SANDBOX_SBX_H

#include <signal.h>
#include <sys/resource.h>

#include "common/cm.h"

/* ---------------------------------------------------------------- limits and specs */

typedef struct sbx_limits {
  uint64_t timeout_ms;      /* wall clock, from spawn; 0 = none */
  uint64_t grace_ms;        /* SIGTERM to SIGKILL */
  uint64_t memory_bytes;    /* address space (RLIMIT_AS) / cgroup memory.max; 0 = none */
  uint64_t cpu_seconds;     /* RLIMIT_CPU; 0 = none */
  uint64_t max_processes;   /* RLIMIT_NPROC / pids.max; 0 = none */
  uint64_t file_size_bytes; /* RLIMIT_FSIZE; 0 = none */
  uint64_t open_files;      /* RLIMIT_NOFILE; 0 = none */
  uint64_t tmp_bytes;       /* size of the sandbox's /tmp (backends with a private /tmp) */
  uint64_t cpu_millis;      /* CPU bandwidth in thousandths of a CPU (cgroup cpu.max, docker
                             * --cpus); 0 = none */
  bool freezable;           /* the run is frozen between uses (sbx_run_freeze): a session's
                             * kernel; cgroup v1 then puts it in the freezer hierarchy too */
} sbx_limits_t;

/* A host directory made visible at another path inside the sandbox (backends that map
 * paths; the none backend sees everything at its host path). */
/* The way out of a sandbox's own network namespace (backends with
 * sbx_backend_can_egress()): the sandbox's supervisor listens on 127.0.0.1:port (and [::1])
 * inside it and passes each connection, as a file descriptor, over fd, a unix SOCK_SEQPACKET
 * socket whose other end the server's egress proxy holds (egress/egress.h). */
typedef struct sbx_egress {
  int fd;        /* borrowed: the backend passes its own duplicate into the sandbox */
  uint16_t port; /* above 1023 */
} sbx_egress_t;

typedef struct sbx_mount {
  const char *host;   /* clean absolute host path */
  const char *target; /* clean absolute path inside the sandbox, e.g. "/env" */
  bool writable;      /* writable by the sandboxed process (the directory is handed to it) */
} sbx_mount_t;

/* What to run.  Strings and vectors are borrowed for the duration of sbx_run_start(). */
typedef struct sbx_spec {
  char *const *argv;         /* the command as seen inside the sandbox; argv[0] an absolute path */
  char *const *envp;         /* the complete environment inside the sandbox */
  const char *workdir;       /* host path of the per-run work directory; the command's cwd */
  char *const *ro_binds;     /* host paths made visible read-only at the same path (may be NULL) */
  const sbx_mount_t *mounts; /* extra mounts at their own targets */
  size_t n_mounts;
  /* false: no network at all (backends that can isolate it).  true with egress: the
   * sandbox's own namespace, with only the egress path out of it; true without: the host's
   * namespace (--network host, and backends that cannot isolate). */
  bool network;
  const sbx_egress_t *egress;
  /* With network: a host file (the system bundle plus the egress proxy's CA) the sandbox sees
   * as /etc/ssl/certs/ca-certificates.crt, read-only; NULL: the host's own. */
  const char *ca_bundle;
  /* The identity to run as, kept by the caller across several runs (the steps of one
   * environment build: each step sees what the one before wrote as its own); NULL: a
   * fresh one for this run alone. */
  const struct sbx_identity *identity;
  /* Prestart: set the sandbox up now but hold the command until sbx_run_release()
   * (backends with sbx_backend_can_hold() only).  limits.timeout_ms counts from the
   * release. */
  bool hold;
  /* With hold: the command itself starts now and waits on a channel of the caller's own
   * (a prestarted interpreter blocked on its FIFO): the supervisor does not wait for the
   * go, sbx_run_release() sends nothing, and until then the run is held as above (output
   * logged, no deadline, release() gives its callbacks and timeout). */
  bool hold_in_command;
  sbx_limits_t limits;
} sbx_spec_t;

/* ---------------------------------------------------------------- backends */

typedef struct sbx_backend sbx_backend_t;

/* The host command a backend turns a spec into.  Initialise with SBX_LAUNCH_INIT: every fd
 * field is -1 when unused, never 0. */
typedef struct sbx_launch {
  char **argv;      /* host argv; argv[0] absolute */
  char **envp;      /* host environment for argv[0] */
  bool set_rlimits; /* apply spec limits as rlimits in the spawned child */
  int pass_fds[24]; /* extra fds to keep open in the child (-1 = unused; the used ones
                     * first); closed by the caller once the child runs */
  char *kill_name;  /* docker: container name to kill; NULL otherwise */
  int64_t uid_slot; /* bwrap, docker: the per-run uid reserved for it (uids.c), or -1 */
  /* The parent ends of the channel to a supervisor inside the sandbox (see "the status
   * record" below), or -1 when the backend has none.  Close-on-exec, owned by the launch
   * (sbx_launch_close_channel() closes them). */
  int status_fd;  /* read end: the supervisor writes one sbx_status_record_t and exits 0 */
  int control_fd; /* write end: closing it asks the supervisor to SIGTERM everything in the
                   * sandbox (the graceful half of a kill); without it the launcher's process
                   * group gets the SIGTERM */
} sbx_launch_t;

#define SBX_LAUNCH_INIT                                           \
  {                                                               \
    .pass_fds = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  \
                 -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}, \
    .status_fd = -1, .control_fd = -1, .uid_slot = -1             \
  }

void sbx_launch_release(sbx_launch_t *l);
/* Closes status_fd and control_fd (and sets them to -1).  sbx_launch_release() does not. */
void sbx_launch_close_channel(sbx_launch_t *l);

typedef struct sbx_probe sbx_probe_t;

/* The interpreter a backend with its own (docker's and podman's image) really runs. */
typedef struct sbx_interp {
  const char *version, *path, *implementation; /* owned by the backend */
} sbx_interp_t;

typedef struct sbx_backend_ops {
  const char *name;
  /* Whether spec mounts appear at their targets (and the work directory at /work);
   * false: the command sees host paths. */
  bool maps_paths;
  /* Whether spec.hold works: a supervisor inside the sandbox waits for the go. */
  bool can_hold;
  /* Whether spec.egress works: the sandbox has a network namespace of its own and a
   * supervisor inside it that forwards connections to the server's egress proxy. */
  bool can_egress;
  /* The command runs on this host as our descendant, with the host's interpreter (none,
   * bwrap); false when an engine runs it elsewhere (docker: its own limits, its image's
   * interpreter).  Runs of such backends get cgroups of ours. */
  bool host_processes;
  /* Checks that the backend can really run a sandbox here (by running one), without
   * blocking: its commands go through sbx_probe_command, and it ends, at once or from a
   * later step, with sbx_probe_finish (sandbox-internal.h). */
  void (*probe)(sbx_backend_t *b, sbx_probe_t *probe);
  int (*build)(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch, cm_error_t *err);
  /* Keeps what the backend reserved for the launch (bwrap, docker: its uid) until until_ms
   * (cm_now_ms() clock; UINT64_MAX: until told again), plus the backend's own margin.
   * Called when a held run is released (its timeout is known only then) and when a run is
   * freed.  May be NULL. */
  void (*reserve)(sbx_backend_t *b, const sbx_launch_t *launch, uint64_t until_ms);
  /* A sandbox identity (bwrap, docker as root: a per-run uid slot) reserved until released, for
   * sbx_identity_new().  May be NULL (the backend has no identities of its own). */
  void (*identity_new)(sbx_backend_t *b, struct sbx_identity *id);
  void (*identity_release)(sbx_backend_t *b, struct sbx_identity *id);
  /* Extra kill step for backends whose processes are not our descendants (docker). */
  void (*kill)(sbx_backend_t *b, const sbx_launch_t *launch, int sig);
  /* The interpreter the command host_python runs as in the sandbox, when it is not the
   * host's; false: the host's.  May be NULL. */
  bool (*interpreter)(sbx_backend_t *b, const char *host_python, sbx_interp_t *out);
  /* Whether the sandbox has a uv of its own (an image's), for a backend whose commands are
   * not the host's (host_processes false); known once probed.  May be NULL: none. */
  bool (*has_uv)(sbx_backend_t *b);
  /* One line for check_environment, e.g. "bubblewrap 0.8.0 (/usr/bin/bwrap)". */
  char *(*describe)(sbx_backend_t *b);
  void (*free)(sbx_backend_t *b);
} sbx_backend_ops_t;

typedef struct sbx_cgroups sbx_cgroups_t;

struct sbx_backend {
  const sbx_backend_ops_t *ops;
  bool available;    /* probe succeeded */
  char *unavailable; /* why not, when !available */
  bool probing;      /* a probe is in flight: available says nothing yet */
  void *priv;
  /* Borrowed: runs of this backend get a cgroup each (backends whose processes are our
   * descendants; docker's containers have the engine's).  NULL = none. */
  sbx_cgroups_t *cgroups;
  /* See sbx_backend_set_state_dir (owned). */
  char *state_dir;
  /* Set by run.c once a run of this backend is detached (sbx_run_free): kills and reaps
   * those before the backend goes (sbx_backend_free), since their teardown uses it. */
  void (*end_detached)(sbx_backend_t *b);
};

/* Creates a backend by name: "none", "bwrap" (alias "native" on Linux), "docker", "podman".
 * Unknown names fail with CM_ERR_INVALID. */
sbx_backend_t *sbx_backend_new(const char *name, cm_error_t *err);
/* Starts probing the backend on loop: its checks run as child processes the loop
 * watches, so the caller never blocks (bubblewrap's probe takes up to 2 x 5 s on a slow
 * host, docker's up to 2 x 5 s).  done(data, b) follows exactly once, never from inside
 * this call, with the outcome in b->available / b->unavailable; until then
 * sbx_backend_probing(b).  The probe is freed after done returns. */
typedef void (*sbx_probe_done_cb)(void *data, sbx_backend_t *b);
sbx_probe_t *sbx_backend_probe_start(sbx_backend_t *b, cm_loop_t *loop, sbx_probe_done_cb done,
                                     void *data);
/* Stops a probe whose done has not run yet: its processes are killed and reaped, done is
 * never called, b->available stays as it was. */
void sbx_probe_cancel(sbx_probe_t *probe);
bool sbx_backend_probing(const sbx_backend_t *b);
/* The same, blocking the caller on a loop of its own until the outcome is in: for the
 * `none` backend (nothing to run) and for tests. */
void sbx_backend_probe(sbx_backend_t *b);
const char *sbx_backend_name(const sbx_backend_t *b);
/* See sbx_backend_ops_t.maps_paths. */
bool sbx_backend_maps_paths(const sbx_backend_t *b);
bool sbx_backend_can_hold(const sbx_backend_t *b);
bool sbx_backend_can_egress(const sbx_backend_t *b);
bool sbx_backend_host_processes(const sbx_backend_t *b);
/* See sbx_backend_ops_t.interpreter: false (out untouched) when the host's runs. */
bool sbx_backend_interpreter(sbx_backend_t *b, const char *host_python, sbx_interp_t *out);
/* Whether a uv command can run in the sandbox: the host's where the backend runs the host's
 * programs, else the sandbox's own (a container image's; known once probed). */
bool sbx_backend_has_uv(sbx_backend_t *b);
char *sbx_backend_describe(sbx_backend_t *b);

/* The server's helper programs, where a run would take them from: $MPS_SANDBOX_DROP /
 * $MPS_CONTAINER_INIT, the install tree relative to the binary
 * (<bindir>/MPS_REL_LIBEXECDIR), or next to the binary (a build directory).  NULL and err when
 * it is not found. */
typedef enum { SBX_HELPER_DROP, SBX_HELPER_CONTAINER_INIT } sbx_helper_t;
char *sbx_helper_path(sbx_helper_t which, cm_error_t *err);
void sbx_backend_free(sbx_backend_t *b);

/* ---------------------------------------------------------------- identities */

/* An identity for several runs in a row (the steps of one environment build): with the
 * bwrap, docker or podman backend as root, one per-run uid taken from the same pool as runs' uids
 * and kept reserved (no other run or build gets it) until sbx_identity_free() and the backend's
 * reuse margin after it, so every build is its own user for RLIMIT_NPROC, files and
 * signals.  Backends without identities give one that changes nothing.  Never NULL. */
typedef struct sbx_identity sbx_identity_t;
sbx_identity_t *sbx_identity_new(sbx_backend_t *b);
void sbx_identity_free(sbx_identity_t *id);

/* ---------------------------------------------------------------- the instance */

/* This server instance: a random id (the name of its cgroup directories) and a uid block of
 * its own (the per-run uids), recorded under state_dir/instances/ and locked for as long as
 * the process lives, so that no two instances share a run uid or a cgroup whatever their
 * pids, and a sweep removes only what an instance provably gone left behind.  Called once
 * before the cgroups and backends are set up; without it (unit tests) the id and block are
 * random and unrecorded.  sbx_instance_close() drops the record and the claim. */
int sbx_instance_open(const char *state_dir, cm_error_t *err);
const char *sbx_instance_id(void);
void sbx_instance_close(void);

/* ---------------------------------------------------------------- cgroups */

/* The cgroups runs are put in.  setting: "auto" (cgroup v2 when the server's own cgroup
 * has the memory/pids/cpu controllers delegated, else the cgroup v1 hierarchies of a
 * hybrid host, else none, with the reason kept), "off", or the absolute path of a
 * delegated cgroup v2 directory (then failing is an error).  Makes a directory
 * "mps-<instance id>" in each hierarchy (removing those of instances provably gone: see
 * sbx_instance_open); freeing removes it.  Each run then gets "run-N" below it with the spec's
 * memory, processes and CPU bandwidth limits, and the run reports the tree's peak memory, OOM kills
 * and refused forks. */
sbx_cgroups_t *sbx_cgroups_open(const char *setting, cm_error_t *err);
bool sbx_cgroups_active(const sbx_cgroups_t *cg);
/* Whether a controller ("memory", "pids", "cpu", "cpuacct") is in use. */
bool sbx_cgroups_has(const sbx_cgroups_t *cg, const char *controller);
/* "cgroup v2 (memory, pids, cpu) under DIR" or "not used: why". */
char *sbx_cgroups_describe(const sbx_cgroups_t *cg);
void sbx_cgroups_free(sbx_cgroups_t *cg);
/* The loop on which run directories that are still busy at the end of a run are removed
 * a little later (without one, at the next run or at sbx_cgroups_free). */
void sbx_cgroups_set_loop(sbx_cgroups_t *cg, cm_loop_t *loop);
/* Run directories whose removal is still to be retried (busy at the end of their run; the
 * loop retries them): a drain waits for none to be left. */
size_t sbx_cgroups_pending(const sbx_cgroups_t *cg);
void sbx_backend_set_cgroups(sbx_backend_t *b, sbx_cgroups_t *cg);
/* Where the backend keeps files of its own across runs: a directory of the server's (its state
 * directory; the backend makes a 0700 "sandbox" directory in it).  Docker and podman keep the
 * seccomp profile they pass the engine there (without one: in their own run directory).  Call
 * before probing; dir is copied. */
void sbx_backend_set_state_dir(sbx_backend_t *b, const char *dir);

/* ---------------------------------------------------------------- the status record */

/* What a supervisor inside a sandbox (the bwrap drop helper) reports about the command it
 * ran, so the result describes the script and not the sandbox launcher: bwrap turns a
 * signal death into exit code 128+N and its rusage covers only itself.  Written once, in
 * one write() (smaller than PIPE_BUF, so atomic), in host byte order, after the command and
 * everything it left behind are gone; the supervisor then exits 0.  Only the supervisor
 * holds the write end: the command and its descendants run with every fd above 2 closed,
 * under another uid (as root) and cannot trace it. */
#define SBX_STATUS_MAGIC 0x5353504du /* "MPSS" */
/* The kernel's OOM killer struck in the sandbox's memory cgroup while the command ran (a
 * supervisor that can see the cgroup's counters: the one inside a container). */
#define SBX_STATUS_OOM_KILL 1u
typedef struct sbx_status_record {
  uint32_t magic;      /* SBX_STATUS_MAGIC */
  uint32_t size;       /* sizeof(sbx_status_record_t): guards against a mismatched helper */
  int32_t wait_status; /* the command's status as wait4() returned it */
  uint32_t flags;      /* SBX_STATUS_OOM_KILL, or 0 */
  /* wait4() on the command: it plus the descendants it reaped itself. */
  uint64_t main_user_us, main_system_us, main_max_rss_kib;
  /* getrusage(RUSAGE_CHILDREN) at the end: the whole tree, including orphans the
   * supervisor reaped as subreaper. */
  uint64_t tree_user_us, tree_system_us, tree_max_rss_kib;
} sbx_status_record_t;

/* Reads the record from a non-blocking status fd whose writers are all gone (or at least
 * the supervisor is).  1 = exactly one well-formed record was there; 0 = nothing, a short
 * or malformed record, or more bytes than one record (someone else wrote too): do not
 * trust any of it.  Reads at most two records' worth of bytes. */
int sbx_status_read(int fd, sbx_status_record_t *rec);

/* ---------------------------------------------------------------- spawning */

typedef struct sbx_child {
  pid_t pid;
  int pidfd;     /* readable when the child exits; reap with sbx_child_reap */
  int stdout_fd; /* non-blocking read ends, or -1 */
  int stderr_fd;
} sbx_child_t;

typedef struct sbx_spawn_opts {
  char *const *argv;
  char *const *envp;
  const char *cwd;            /* NULL = inherit */
  bool capture_output;        /* pipes for stdout/stderr; else /dev/null */
  const sbx_limits_t *limits; /* rlimits to set in the child, or NULL */
  const int *pass_fds;        /* fds to keep (not close-on-exec) in the child; -1 ends */
  size_t n_pass_fds;
  const int *cgroup_fds; /* open cgroup.procs files the child joins before exec */
  size_t n_cgroup_fds;
  /* The drop helper, to join cgroup_fds after the exec (`--join-cgroup`) rather than in the
   * child, which would keep the server suspended for an RCU grace period per cgroup v1;
   * NULL = in the child */
  const char *cgroup_joiner;
  int cgroup_dir_fd; /* a cgroup v2 directory to start the child in (clone3 with
                      * CLONE_INTO_CGROUP: no migration); 0 or -1 = none (never
                      * stdio).  When the kernel cannot, the child joins through
                      * cgroup_fds instead */
} sbx_spawn_opts_t;

/* Forks and execs with: signals reset, a process group of its own (setpgid; a new session
 * with setsid only when the server has a controlling terminal, so the child never has
 * one), a parent-death SIGKILL, stdin from /dev/null, the limits, every other fd closed.
 * An exec failure comes back as an error here, not as a child exit. */
int sbx_spawn(const sbx_spawn_opts_t *opts, sbx_child_t *child, cm_error_t *err);
/* Reaps an exited child through its pidfd (non-blocking); 1 = reaped, 0 = still running. */
int sbx_child_reap(sbx_child_t *child, siginfo_t *info, struct rusage *ru);
/* Kills the child's process group (and the child) with sig. */
void sbx_child_kill_tree(const sbx_child_t *child, int sig);
void sbx_child_close(sbx_child_t *child);

/* ---------------------------------------------------------------- functions in a child */

/* Runs fn(arg) in a forked child of the server, for work that must not block the event
 * loop but needs no sandbox: copying or removing a tree that may be big (an environment
 * out of a build's space, a wheelhouse import, an evicted environment).  The child is a
 * copy of the server: fn sees the server's memory as it was at the fork and the fds in
 * keep_fds (every other fd above 2 is closed; stdin and stdout become /dev/null, stderr
 * stays for logs); it dies with the server (parent-death SIGKILL).  fn returns 0 with an
 * optional short text in out (at most ~4000 bytes), or -1 with err set; nothing else comes
 * back.  done(data, rc, text) runs on the loop once the child is reaped: rc 0 with fn's
 * text, or -1 with fn's error message or why the child failed (killed, timed out after
 * timeout_ms, 0 = no limit).  The call is freed right before done runs: forget the
 * pointer there.  Reaped through a pidfd, never waitpid(-1). */
typedef struct sbx_call sbx_call_t;
typedef int (*sbx_call_fn)(void *arg, cm_buf_t *out, cm_error_t *err);
typedef void (*sbx_call_done_cb)(void *data, int rc, const char *text);
int sbx_call_start(cm_loop_t *loop, sbx_call_fn fn, void *arg, const int *keep_fds, size_t n_keep,
                   uint64_t timeout_ms, sbx_call_done_cb done, void *data, sbx_call_t **out,
                   cm_error_t *err);
/* Before done has run: kills the child (SIGKILL), reaps it (blocking, but a SIGKILLed child
 * of ours exits at once) and frees the call; done is never called. */
void sbx_call_free(sbx_call_t *c);

/* ---------------------------------------------------------------- runs */

typedef enum sbx_stream { SBX_STDOUT = 1, SBX_STDERR = 2 } sbx_stream_t;

typedef struct sbx_result {
  int exit_code;        /* exit status; -N when killed by signal N */
  int term_signal;      /* 0 when it exited */
  bool timed_out;       /* the wall-clock limit was hit */
  bool cancelled;       /* sbx_run_cancel() was called */
  bool cpu_limit;       /* killed by SIGXCPU/SIGKILL after RLIMIT_CPU */
  bool file_size_limit; /* SIGXFSZ */
  /* The backend has a supervisor inside the sandbox but it reported nothing trustworthy
   * (the sandbox failed to start, was SIGKILLed after the grace period, or the supervisor
   * died): exit_code/term_signal are the launcher's own (bwrap: 128+N for a signal) and
   * the CPU and memory figures are 0. */
  bool status_unknown;
  uint64_t duration_ms; /* spawn to exit */
  /* The command and the descendants reaped in the sandbox (for bwrap from the status
   * record; for none the server's wait on the command, which covers what it reaped). */
  uint64_t cpu_user_ms, cpu_system_ms;
  uint64_t max_rss_kib; /* of the largest single process */
  /* Ran in a cgroup of its own: the figures below are the whole tree's. */
  bool cgroup;
  bool memory_limit;          /* the cgroup's memory limit made the kernel OOM-kill a process */
  bool process_limit;         /* the cgroup's process limit refused at least one fork */
  uint64_t memory_peak_bytes; /* 0 when the kernel does not tell */
  uint64_t cgroup_cpu_us;
} sbx_result_t;

typedef struct sbx_run sbx_run_t;

typedef struct sbx_run_callbacks {
  /* A chunk of output as soon as it is read.  buf is valid only during the call. */
  void (*on_output)(void *data, sbx_stream_t stream, const char *buf, size_t len);
  /* The run is over: the process tree is gone and both pipes are closed.  Called
   * exactly once (also after cancel).  The run may be freed from inside. */
  void (*on_exit)(void *data, const sbx_result_t *result);
} sbx_run_callbacks_t;

/* Starts spec on backend.  Fails (nothing started) if the backend is unavailable. */
int sbx_run_start(cm_loop_t *loop, sbx_backend_t *backend, const sbx_spec_t *spec,
                  const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out, cm_error_t *err);
/* Starts the command of a run started with spec.hold: from now on output goes to cbs
 * (replacing the ones given at the start, which until now got only on_exit, should the
 * sandbox die while held), the duration and timeout_ms (0 = none) count from now.  Fails
 * when the run is over already (then nothing changes: free it). */
int sbx_run_release(sbx_run_t *run, const sbx_run_callbacks_t *cbs, void *data, uint64_t timeout_ms,
                    cm_error_t *err);
/* Kills the whole tree now (SIGTERM, grace, SIGKILL); on_exit follows with cancelled. */
void sbx_run_cancel(sbx_run_t *run);
/* Frees a run.  One still running is killed with SIGKILL; it, and one that finished on its
 * supervisor's record while its sandbox is still being torn down, is detached: its
 * callbacks are never called again, and the loop reaps it and releases its cgroup and
 * reservation when its launcher exits (never a wait here). */
void sbx_run_free(sbx_run_t *run);
/* Kills and reaps every detached run now (blocking, bounded: at shutdown, before the
 * backends and the cgroups are freed, which their teardown uses). */
void sbx_run_reap_detached(void);
/* How many runs are detached now: freed while their sandbox is still being torn down (a
 * teardown in flight, which the loop finishes when the launcher exits).  A server's drain
 * waits for this to reach zero before it exits (then sbx_run_reap_detached has nothing to
 * do). */
size_t sbx_run_detached_count(void);
pid_t sbx_run_pid(const sbx_run_t *run);
/* Freezes (frozen) or thaws every process of a run that lives across uses (a session's
 * kernel between calls), so that nothing it left running uses CPU meanwhile: its cgroup's
 * freezer (cgroup v2 cgroup.freeze, the v1 freezer for a run with limits.freezable), else
 * SIGSTOP/SIGCONT to its process group (a process that left the group escapes that).  Sets
 * *how ("cgroup" or "signal") when given.  Cancelling or freeing a frozen run thaws it. */
int sbx_run_freeze(sbx_run_t *run, bool frozen, const char **how, cm_error_t *err);
/* Reads what the run's pipes hold now (one read budget each), through on_output: for a
 * run that told on another channel that it flushed its output (a session's kernel), before
 * that news is acted on.  Never finishes the run. */
void sbx_run_read_pending(sbx_run_t *run);
/* What the run's cgroup has counted so far, for a run that lives across calls (a session's
 * kernel): the difference between two readings is what happened in between. */
typedef struct sbx_run_events {
  bool known;             /* the run has a cgroup: the counts below mean something */
  uint64_t oom_kills;     /* processes the memory limit's OOM killer took */
  uint64_t forks_refused; /* forks the process limit refused */
} sbx_run_events_t;
void sbx_run_events(const sbx_run_t *run, sbx_run_events_t *ev);

#endif
