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
} sbx_limits_t;

/* A host directory made visible at another path inside the sandbox (backends that map
 * paths; the none backend sees everything at its host path). */
typedef struct sbx_mount {
  const char *host;   /* clean absolute host path */
  const char *target; /* clean absolute path inside the sandbox, e.g. "/env" */
  bool writable;      /* writable by the sandboxed process (the directory is handed to it) */
} sbx_mount_t;

/* What to run.  Strings and vectors are borrowed for the duration of sbx_run_start(). */
typedef struct sbx_spec {
  char *const *argv;     /* the command as seen inside the sandbox; argv[0] an absolute path */
  char *const *envp;     /* the complete environment inside the sandbox */
  const char *workdir;   /* host path of the per-run work directory; the command's cwd */
  char *const *ro_binds; /* host paths made visible read-only at the same path (may be NULL) */
  const sbx_mount_t *mounts; /* extra mounts at their own targets */
  size_t n_mounts;
  bool network;          /* false: no network at all (backends that can isolate it) */
  /* An environment build, not a script run: the sandbox runs as the one builder identity
   * (so the shared download cache stays writable by every build) instead of a fresh one. */
  bool builder;
  sbx_limits_t limits;
} sbx_spec_t;

/* ---------------------------------------------------------------- backends */

typedef struct sbx_backend sbx_backend_t;

/* The host command a backend turns a spec into. */
typedef struct sbx_launch {
  char **argv;           /* host argv; argv[0] absolute */
  char **envp;           /* host environment for argv[0] */
  bool set_rlimits;      /* apply spec limits as rlimits in the spawned child */
  int pass_fds[4];       /* extra fds to keep open in the child (-1 = unused) */
  char *kill_name;       /* docker: container name to kill; NULL otherwise */
} sbx_launch_t;

void sbx_launch_release(sbx_launch_t *l);

typedef struct sbx_backend_ops {
  const char *name;
  /* Whether spec mounts appear at their targets (and the work directory at /work);
   * false: the command sees host paths. */
  bool maps_paths;
  /* Checks that the backend can really run a sandbox here (by running one). */
  int (*probe)(sbx_backend_t *b, cm_error_t *err);
  int (*build)(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch, cm_error_t *err);
  /* Extra kill step for backends whose processes are not our descendants (docker). */
  void (*kill)(sbx_backend_t *b, const sbx_launch_t *launch, int sig);
  /* One line for check_environment, e.g. "bubblewrap 0.8.0 (/usr/bin/bwrap)". */
  char *(*describe)(sbx_backend_t *b);
  void (*free)(sbx_backend_t *b);
} sbx_backend_ops_t;

struct sbx_backend {
  const sbx_backend_ops_t *ops;
  bool available;     /* probe succeeded */
  char *unavailable;  /* why not, when !available */
  void *priv;
};

/* Creates a backend by name: "none", "bwrap" (alias "native" on Linux), "docker".
 * Unknown names fail with CM_ERR_INVALID. */
sbx_backend_t *sbx_backend_new(const char *name, cm_error_t *err);
/* Probes the backend and records the outcome in b->available / b->unavailable. */
void sbx_backend_probe(sbx_backend_t *b);
const char *sbx_backend_name(const sbx_backend_t *b);
/* See sbx_backend_ops_t.maps_paths. */
bool sbx_backend_maps_paths(const sbx_backend_t *b);
char *sbx_backend_describe(sbx_backend_t *b);
void sbx_backend_free(sbx_backend_t *b);

/* ---------------------------------------------------------------- spawning */

typedef struct sbx_child {
  pid_t pid;
  int pidfd;      /* readable when the child exits; reap with sbx_child_reap */
  int stdout_fd;  /* non-blocking read ends, or -1 */
  int stderr_fd;
} sbx_child_t;

typedef struct sbx_spawn_opts {
  char *const *argv;
  char *const *envp;
  const char *cwd;           /* NULL = inherit */
  bool capture_output;       /* pipes for stdout/stderr; else /dev/null */
  const sbx_limits_t *limits; /* rlimits to set in the child, or NULL */
  const int *pass_fds;       /* fds to keep (not close-on-exec) in the child; -1 ends */
  size_t n_pass_fds;
} sbx_spawn_opts_t;

/* Forks and execs with: signals reset, a new session (setsid, so the child leads its own
 * process group), a parent-death SIGKILL, stdin from /dev/null, the limits, every other
 * fd closed.  An exec failure comes back as an error here, not as a child exit. */
int sbx_spawn(const sbx_spawn_opts_t *opts, sbx_child_t *child, cm_error_t *err);
/* Reaps an exited child through its pidfd (non-blocking); 1 = reaped, 0 = still running. */
int sbx_child_reap(sbx_child_t *child, siginfo_t *info, struct rusage *ru);
/* Kills the child's process group (and the child) with sig. */
void sbx_child_kill_tree(const sbx_child_t *child, int sig);
void sbx_child_close(sbx_child_t *child);

/* ---------------------------------------------------------------- runs */

typedef enum sbx_stream { SBX_STDOUT = 1, SBX_STDERR = 2 } sbx_stream_t;

typedef struct sbx_result {
  int exit_code;          /* exit status; -N when killed by signal N */
  int term_signal;        /* 0 when it exited */
  bool timed_out;         /* the wall-clock limit was hit */
  bool cancelled;         /* sbx_run_cancel() was called */
  bool cpu_limit;         /* killed by SIGXCPU/SIGKILL after RLIMIT_CPU */
  bool file_size_limit;   /* SIGXFSZ */
  uint64_t duration_ms;   /* spawn to exit */
  uint64_t cpu_user_ms, cpu_system_ms;
  uint64_t max_rss_kib;
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
/* Kills the whole tree now (SIGTERM, grace, SIGKILL); on_exit follows with cancelled. */
void sbx_run_cancel(sbx_run_t *run);
/* Frees a finished run; a running one is killed with SIGKILL and reaped first (blocking,
 * bounded: for shutdown only). */
void sbx_run_free(sbx_run_t *run);
pid_t sbx_run_pid(const sbx_run_t *run);

#endif
