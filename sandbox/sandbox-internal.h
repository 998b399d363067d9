#ifndef MPS_SANDBOX_INTERNAL_H
#define MPS_SANDBOX_INTERNAL_H

#include "sandbox/sbx.h"

/* Checks every backend makes on a spec: an absolute command, an existing work directory
 * (not a symlink), environment entries of the form NAME=value.  The caller has already
 * checked that spec->workdir is a clean absolute path by its own rules. */
int sbx_spec_check_common(const sbx_spec_t *spec, cm_error_t *err);
/* A helper program of ours (what, e.g. "the drop helper"): $env_var if set, else `name` next
 * to the server's binary or in ../libexec/mcp-python-exec-sandbox/.  Returns its real path
 * (allocated), or NULL with err set. */
char *sbx_find_helper(const char *what, const char *env_var, const char *name, cm_error_t *err);

/* See sbx_identity_new(): uid is valid when has_uid; slot is the backend's reservation
 * (-1: none to release). */
struct sbx_identity {
  sbx_backend_t *backend;
  bool has_uid;
  uid_t uid;
  int64_t slot;
};

/* uids.c: the per-run uids (as root) of the backends that run scripts as real host uids
 * (bwrap, docker, podman), one pool per process.  sbx_uid_take() reserves a fresh uid until
 * the run with limits l must be over (no timeout: until told otherwise) and sets *slot (-1
 * when every slot was taken and a free uid was found by a scan instead); sbx_uid_reserve()
 * moves a slot's reservation to until_ms plus a reuse margin (UINT64_MAX: for good), which
 * is what a backend's ops->reserve does; the identity pair takes a uid for an
 * sbx_identity_t until it is released. */
uid_t sbx_uid_take(const sbx_limits_t *l, int64_t *slot);
/* The first uid of this process's block and (*count) how many follow: every uid
 * sbx_uid_take() can return. */
uid_t sbx_uid_block(unsigned *count);
void sbx_uid_reserve(int64_t slot, uint64_t until_ms);
void sbx_uid_identity_new(sbx_identity_t *id);
void sbx_uid_identity_release(sbx_identity_t *id);

/* instance.c: this server instance (see sbx_instance_open).  Its id is
 * SBX_INSTANCE_ID_LEN lowercase hex digits; sbx_instance_uid_block() is the index of the uid
 * block it holds (0..2^15-1).  sbx_instance_gone(id) is true only when another instance's
 * record proves it gone (another boot, or its lock is free); sbx_instance_forget(id)
 * removes such a record once what was named after it is swept; keep_record: something
 * named after this instance could not be removed, so its record outlives it as the proof a
 * later sweep needs. */
#define SBX_INSTANCE_ID_LEN 16
bool sbx_instance_id_valid(const char *s);
unsigned sbx_instance_uid_block(void);
bool sbx_instance_gone(const char *id);
void sbx_instance_forget(const char *id);
void sbx_instance_keep_record(void);

/* What every backend gives a sandbox in place of the host's resolver files: the hostname, the
 * hosts file of every sandbox but one on the host's network (localhost and the sandbox's own
 * name, nothing of the host's), and the resolv.conf of one whose way out is the egress proxy:
 * it resolves nothing itself (its namespace has nothing but loopback, where no resolver
 * listens: a lookup fails at once), and learns nothing of the host's resolvers or search
 * domains. */
#define SBX_SANDBOX_HOSTNAME "sandbox"
#define SBX_HOSTS_TEXT                          \
  "127.0.0.1\tlocalhost\n"                      \
  "::1\tlocalhost ip6-localhost ip6-loopback\n" \
  "127.0.1.1\t" SBX_SANDBOX_HOSTNAME "\n"
#define SBX_RESOLV_CONF_TEXT                                                                  \
  "# mcp-python-exec-sandbox: this sandbox resolves no names itself; its clients reach the\n" \
  "# network through the egress proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY), which does.\n"    \
  "nameserver 127.0.0.1\n"                                                                    \
  "options timeout:1 attempts:1\n"

/* mountplan.c: what a run's sandbox sees besides the backend's own system layout, as one
 * typed list built once per run and rendered by each backend (bubblewrap arguments, container
 * --mount/-v flags), the way bubblewrap builds its SetupOp list and runs it in one place: the
 * backends cannot drift on a mount.  In order: the files of /etc (passwd, group, and hosts
 * and resolv.conf unless the sandbox is on the host's network), /dev/shm's and /tmp's capped
 * tmpfs (or a spec mount at /tmp), the read-only binds at their own paths (not those under
 * /usr, which every backend shows already), the spec's mounts, and the work directory. */
typedef enum sbx_mount_op_kind {
  SBX_MOUNT_RO_BIND, /* source (host path) at target, read-only */
  SBX_MOUNT_BIND,    /* source at target, writable */
  SBX_MOUNT_TMPFS,   /* a tmpfs of size bytes and mode at target */
  SBX_MOUNT_FILE,    /* a read-only file of mode at target: data, or the host file source */
} sbx_mount_op_kind_t;

typedef struct sbx_mount_op {
  sbx_mount_op_kind_t kind;
  const char *source; /* binds: host path; FILE: a host file holding it (NULL: data) */
  const char *target;
  const char *data; /* FILE without source: the contents */
  const char *name; /* FILE: what it is ("passwd"), e.g. for a memfd's name */
  uint64_t size;    /* TMPFS */
  unsigned mode;    /* TMPFS, FILE */
  bool workdir;     /* the work directory (the command's cwd) */
} sbx_mount_op_t;

typedef struct sbx_mount_plan {
  sbx_mount_op_t *ops;
  size_t n, cap;
} sbx_mount_plan_t;

/* What a backend brings: the work directory's path inside, the /tmp size when the spec gives
 * none and the cap of /dev/shm, and the files of /etc, each as contents (data) or as a host
 * file (path).  Strings are borrowed: they (and the spec's) must outlive the plan. */
typedef struct sbx_mount_files {
  const char *data, *path;
} sbx_mount_file_t;
typedef struct sbx_mount_plan_in {
  const char *workdir_target;
  uint64_t default_tmp_bytes, max_shm_bytes;
  sbx_mount_file_t passwd, group, hosts, resolv;
} sbx_mount_plan_in_t;

void sbx_mount_plan_build(const sbx_spec_t *spec, const sbx_mount_plan_in_t *in,
                          sbx_mount_plan_t *plan);
void sbx_mount_plan_free(sbx_mount_plan_t *plan);
/* Whether the sandbox is on the host's (or engine's) network: network without egress. */
bool sbx_spec_host_network(const sbx_spec_t *spec);
/* The renderings, for the backends and their unit test.  bwrap: arguments (files with data
 * become memfds, their fds appended to fds, at most max_fds; -1 with err when one cannot be
 * made or there is no room), with `--perms 0755 --dir` for parents.  Containers: -v/--tmpfs/
 * --shm-size/-w flags; a FILE must have a host path, and read-only binds that hold
 * image_command are left out (the image's interpreter replaces the host's). */
int sbx_bwrap_render_mounts(const sbx_mount_plan_t *plan, cm_strv_builder_t *out, int *fds,
                            size_t *n_fds, size_t max_fds, cm_error_t *err);
int sbx_docker_render_mounts(const sbx_mount_plan_t *plan, const char *image_command,
                             cm_strv_builder_t *out, cm_error_t *err);

/* A deep copy of a NULL-terminated string vector. */
char **sbx_strv_copy(char *const *v);

/* probe.c: the steps of a backend's probe.  sbx_probe_command runs argv (environment envp,
 * NULL = empty; pass_fds kept open in it and closed here) on the probe's loop, capturing
 * stdout and stderr up to output_max bytes each; when it has exited and both pipes are
 * closed, or timeout_ms passed (then its tree is SIGKILLed and r->rc is -1 with r->err
 * saying so), next(probe, r) runs from the loop.  Returns -1 (nothing started) when it
 * cannot start.  r's buffers are valid during the call only.  A step ends the probe with
 * sbx_probe_finish (err NULL or empty = available; its message is kept as the reason
 * otherwise), or starts the next command.  State a backend keeps between steps is freed
 * with the probe (also when it is cancelled). */
typedef struct sbx_probe_result {
  int rc;     /* 0: status holds the wait status; -1: timed out (err) */
  int status; /* as waitpid() gives it */
  const cm_buf_t *out, *errout;
  cm_error_t *err;
} sbx_probe_result_t;
typedef void (*sbx_probe_step_cb)(sbx_probe_t *probe, const sbx_probe_result_t *r);
int sbx_probe_command(sbx_probe_t *probe, char *const *argv, char *const *envp, int *pass_fds,
                      size_t n_pass, int timeout_ms, size_t output_max, sbx_probe_step_cb next,
                      cm_error_t *err);
void sbx_probe_finish(sbx_probe_t *probe, cm_error_t *err);
void *sbx_probe_state(sbx_probe_t *probe);
void sbx_probe_set_state(sbx_probe_t *probe, void *state, void (*state_free)(void *state));
cm_loop_t *sbx_probe_loop(sbx_probe_t *probe);

#ifdef MPS_HAVE_BWRAP
extern const sbx_backend_ops_t sbx_bwrap_ops;

/* Overrides where the bwrap backend finds bubblewrap and the drop helper (NULL keeps the
 * default: $MPS_BWRAP or `bwrap` in PATH; $MPS_SANDBOX_DROP or `mps-sandbox-drop` next to
 * the running executable).  Call before sbx_backend_probe(); b must be a bwrap backend. */
void sbx_bwrap_set_paths(sbx_backend_t *b, const char *bwrap_path, const char *drop_path);
#endif

/* seccomp.c: the syscall policy of every backend that isolates, one table rendered twice: the
 * BPF program bubblewrap loads before it execs the drop helper, and the OCI seccomp profile
 * (JSON) docker and podman take with --security-opt seccomp=FILE.
 *
 * The policy is default allow; a rule refuses `syscall` with errno_value, always (arg < 0) or
 * when (argument arg & mask) == value (libseccomp's SCMP_CMP_MASKED_EQ).  Several rules of one
 * syscall are alternatives: any that matches refuses.  sbx_seccomp_rules() gives the table
 * (built once per process, owned by seccomp.c, in a fixed order).  Both renderings skip the
 * names sbx_seccomp_resolve() does not know (-1: unknown to this libseccomp, or a syscall
 * another architecture has). */
typedef struct sbx_seccomp_rule {
  const char *syscall;
  int errno_value;
  int arg; /* -1: unconditional */
  uint64_t mask, value;
} sbx_seccomp_rule_t;
const sbx_seccomp_rule_t *sbx_seccomp_rules(size_t *n);
int sbx_seccomp_resolve(const char *syscall);
/* sbx_seccomp_fd() returns a new sealed, close-on-exec memfd at offset 0 holding the BPF
 * program (built once per process, then cached); the caller owns it.
 * sbx_seccomp_build() builds the program afresh into a heap buffer the caller frees. */
int sbx_seccomp_fd(cm_error_t *err);
int sbx_seccomp_build(void **bpf, size_t *len, cm_error_t *err);
/* The OCI profile (allocated text): "defaultAction" SCMP_ACT_ALLOW, "architectures" the
 * native one alone (sbx_seccomp_oci_arch(), NULL where OCI has no name for it: then NULL and
 * CM_ERR_UNSUPPORTED), and one "syscalls" entry per rule, in the table's order. */
char *sbx_seccomp_oci_json(cm_error_t *err);
const char *sbx_seccomp_oci_arch(void);

/* cgroup.c: one run's cgroup (see sbx_cgroups_open). */
typedef struct sbx_cgroup_run sbx_cgroup_run_t;
int sbx_cgroup_run_new(sbx_cgroups_t *cg, const sbx_limits_t *limits, sbx_cgroup_run_t **out,
                       cm_error_t *err);
/* The open cgroup.procs files the spawned child writes "0" to, and (v2) the directory to
 * start it in with clone3 instead (-1 on v1). */
size_t sbx_cgroup_run_join_fds(const sbx_cgroup_run_t *r, const int **fds, int *dir_fd);
/* The child is started (and in its cgroup, or on its way there with its own copies): those
 * fds are closed, not kept for the run's whole life. */
void sbx_cgroup_run_spawned(sbx_cgroup_run_t *r);
/* SIGKILLs everything in the run's cgroup (cgroup.kill where the kernel has it). */
void sbx_cgroup_run_kill(sbx_cgroup_run_t *r);
/* Freezes (or thaws) every process of the run: cgroup v2's cgroup.freeze, or the v1 freezer
 * hierarchy (the run made with limits.freezable).  CM_ERR_UNAVAILABLE where there is none.
 * A kill thaws a frozen run, so that its processes take the SIGKILL. */
int sbx_cgroup_run_freeze(sbx_cgroup_run_t *r, bool frozen, cm_error_t *err);
/* Peak memory, OOM kills, refused forks and CPU time into res. */
void sbx_cgroup_run_collect(const sbx_cgroup_run_t *r, sbx_result_t *res);
/* The run's counters now (sbx_run_events). */
void sbx_cgroup_run_events(const sbx_cgroup_run_t *r, sbx_run_events_t *ev);
/* Kills what is left and removes the directories (later, if they are still busy). */
void sbx_cgroup_run_free(sbx_cgroup_run_t *r);

/* Parsers of /proc text, exposed for tests.  sbx_cgroup_own_path: the path of the
 * process's cgroup in /proc/self/cgroup text, for a v1 controller or, with NULL, the v2
 * line "0::PATH".  sbx_cgroup_find_mount: in /proc/self/mountinfo text, the mount point
 * and root of the cgroup2 mount (controller NULL) or of the v1 hierarchy with the
 * controller; -1 when there is none.  sbx_cgroup_dir: the directory of cgroup `own` under
 * a mount, or NULL when the mount does not show it. */
char *sbx_cgroup_own_path(const char *buf, size_t len, const char *controller);
int sbx_cgroup_find_mount(const char *buf, size_t len, const char *controller, char **mountpoint,
                          char **root);
char *sbx_cgroup_dir(const char *mountpoint, const char *root, const char *own);

#ifdef MPS_HAVE_DOCKER
extern const sbx_backend_ops_t sbx_docker_ops;
extern const sbx_backend_ops_t sbx_podman_ops;
#endif

#endif
