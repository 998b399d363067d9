/* server/exec/ internals shared by its files. */
#ifndef MPS_SERVER_EXEC_INTERNAL_H
#define MPS_SERVER_EXEC_INTERNAL_H

#include "envstore/envstore.h"
#include "server/exec/exec.h"

/* Progress notifications: at most one per interval per call, each carrying at most this
 * much text; what a flood produces beyond that is counted and skipped (the final result
 * still has the head and tail). */
#define EXEC_COALESCE_MS 2
/* A line begun but not ended (a print's text before its newline, which an unbuffered
 * stdout writes apart) waits this long for its end before it goes alone. */
#define EXEC_PARTIAL_LINE_MS 100
#define EXEC_PROGRESS_BURST 8.0
#define EXEC_PROGRESS_PER_SECOND 20.0
#define EXEC_PROGRESS_MAX_TEXT 4096
/* A message says which of its bytes came from which stream, in at most this many runs; output
 * that would start one more before a flush is skipped like a flood's. */
#define EXEC_PROGRESS_MAX_RUNS 64
/* The progress message's _meta key that lists its runs: [["stdout"|"stderr"|"note", length
 * in UTF-16 code units], ...] (UTF-16: what a JavaScript client slices by). */
#define EXEC_PROGRESS_STREAMS_META "mcp-python-exec-sandbox/streams"
/* A run counts as starting (sandbox set-up and interpreter start-up) for this long. */
#define EXEC_START_WINDOW_MS 100
/* The sandbox path of the runner's directory when the backend maps paths. */
#define EXEC_RUNNER_TARGET "/opt/mps"

typedef struct exec_job exec_job_t;
typedef struct exec_tenant exec_tenant_t;
typedef struct exec_prestart exec_prestart_t;
typedef struct runner_pyc runner_pyc_t;
typedef struct exec_session exec_session_t;

struct exec_state {
  srv_server_t *server;
  /* admission.c: how long calls waited for a slot (/metrics) */
  uint64_t wait_buckets[SRV_M_BUCKETS + 1];
  uint64_t wait_ms_sum, wait_count;
  /* admission.c: see struct exec_tenant */
  size_t slots_used;
  size_t n_starting;
  size_t cpus; /* 0 until counted */
  cm_timer_t *start_gate_timer;
  exec_job_t *all_jobs;  /* every job until it is DONE */
  exec_job_t *done_jobs; /* DONE, for the deferred pass to free */
  exec_tenant_t *tenants;
  exec_tenant_t *last_served; /* the round goes on after it; NULL: from the first */
  /* runner.c */
  bool runner_searched;
  char *runner; /* the start-up runner's path, or NULL */
  runner_pyc_t *runner_pycs;
  /* prestart.c */
  exec_prestart_t *prestart;
  bool prestart_stopped; /* the server stops: no prestarted sandbox is set up any more */
  /* workdir.c: -1 unknown, 0 cannot mount, 1 can */
  int mount_state;
  /* session.c: the live sessions (newest first), and closed ones whose kernel is still
   * being killed */
  exec_session_t *sessions, *dying;
  size_t n_sessions;
  /* job.c: the loop's deferred pass that frees DONE jobs and DEAD sessions, when queued */
  struct exec_reap *reap;
};

/* A job's stage (job.c's job_advance moves it on; docs/architecture.md has the table).  In
 * the stages that wait, the job's `wait` is the handle of what it waits for. */
enum job_stage {
  JOB_PYTHON,   /* the interpreters' discovery (wait: py_registry_when_ready), then the choice */
  JOB_DOWNLOAD, /* --allow-python-downloads: uv installs the Python asked for (one at a time) */
  JOB_PROBE,    /* the sandbox's probe (wait: srv_server_when_probed) */
  JOB_QUEUED,   /* a slot (admission.c's queue) */
  JOB_ENV,      /* with a slot: the dependency environment (wait: env_store_ensure) */
  JOB_WORKDIR,  /* the work directory, its files and the sandbox's start (no wait) */
  JOB_RUNNING,  /* the script runs: in its sandbox (run), or in its session's kernel */
  JOB_DONE,     /* answered: on done_jobs until the loop's deferred pass frees it */
};

struct exec_job {
  srv_request_t *req;
  srv_server_t *server;
  exec_state_t *exec;
  const srv_config_t *cfg;
  exec_spec_t spec;
  enum job_stage stage;
  void *wait; /* what the stage waits for (see enum job_stage), or NULL */
  env_handle_t *env;
  bool download_tried; /* once per call: a Python asked for and not found may be downloaded */
  bool workdir_mounted;
  double setup_progress; /* progress counter while the environment is prepared */
  py_interp_t *py;
  exec_job_t *queue_next;
  exec_job_t *all_prev, *all_next; /* every job until DONE, for per-session counts */
  exec_job_t *done_next;           /* DONE: the next on done_jobs */
  exec_tenant_t *tenant;           /* whose call it is (the spec's principal) */
  bool holds_slot;
  uint64_t starting_since; /* ms; 0 = not (or no longer) starting */
  uint64_t queued_at;      /* ms: when it joined the queue */
  char *workdir;
  eg_session_t *egress; /* the run's egress proxy session, or NULL */
  sbx_run_t *run;
  /* run is a prestarted sandbox (EXEC_PRESTARTED_SANDBOX), or one whose interpreter waits
   * on go_fd's FIFO (EXEC_PRESTARTED_INTERPRETER; then workdir.ctl/ is the job's too) */
  int prestarted;
  int go_fd; /* -1 unless EXEC_PRESTARTED_INTERPRETER */
  /* session.c: the session the call runs in (spec.session), or NULL; then workdir is the
   * session's (never removed by the job) and env, when env_borrowed, the session's too */
  exec_session_t *ksession;
  bool env_borrowed;
  char *session_note; /* what the session did for this call (a cap, a restart), or NULL */
  cm_headtail_t out, err;
  /* progress.c */
  cm_buf_t pending; /* stdout and stderr as printed, for progress */
  struct {
    uint16_t len;   /* bytes of pending */
    uint8_t stream; /* sbx_stream_t */
  } runs[EXEC_PROGRESS_MAX_RUNS];
  size_t n_runs;
  uint64_t pending_tail_ms; /* when pending's unended last line began to wait */
  bool line_wait;           /* flush_timer waits for that line's end */
  uint64_t skipped;
  uint64_t streamed;
  cm_buf_t pending_err; /* stderr for notifications/message */
  double tokens;
  uint64_t last_refill_ms;
  cm_timer_t *flush_timer;
};

/* Slots: at most cfg->max_concurrent scripts run at once; the rest wait.  Of those, at
 * most max_starting (cfg->max_starting, or one per CPU) may be in their first
 * EXEC_START_WINDOW_MS at once: starting a run is the CPU-heavy part (bubblewrap's set-up,
 * the interpreter's start-up, ~40 ms of CPU for print('hi')), and a burst of calls that all
 * start together only makes each start slower (more processes fighting for the caches and
 * the CPUs) without finishing any sooner.  A run leaves its start-up when it ends or when
 * the window is over, whichever comes first, so scripts that sleep or wait still overlap
 * as before, a window later.
 *
 * Waiting calls are queued per principal (a tenant: a bearer token's name, "local",
 * "stdio"), oldest first, and admitted round-robin across principals: a free slot goes to
 * the next principal after the one served last that has a call waiting and is under its
 * --max-token-running, so one principal's backlog never delays another's call by more than
 * one turn.  A job holds its slot from admission to its end, building its dependency
 * environment included.  With one principal (stdio) this is the plain FIFO it always was. */
struct exec_tenant {
  char *principal;
  size_t jobs;    /* its calls from validation to the answer (--max-token-concurrent) */
  size_t running; /* of those, holding a slot (--max-token-running) */
  size_t queued;  /* of those, waiting for a slot */
  exec_job_t *queue_head, *queue_tail;
  exec_tenant_t *next; /* tenants, in the order they came: the round's order */
};

/* admission.c */
/* A tool error when r's session or the principal is at its cap (the call is refused before
 * it becomes a job), else NULL. */
json_t *exec_admission_refusal(exec_state_t *x, srv_session_t *session, const char *principal);
/* The job joins the execution state (its tenant holds one more call) and leaves it. */
void exec_admission_join(exec_job_t *job);
void exec_admission_leave(exec_job_t *job);
/* Queues the job for a slot (telling the client why it waits, if it must) and admits what
 * may start; may start and even finish the job. */
void exec_admission_enqueue(exec_job_t *job);
/* Takes the job out of its queue, if it is in it. */
void exec_admission_dequeue(exec_job_t *job);
/* The job's start-up is over before its window is (a prestarted interpreter's costs next to
 * nothing): the next may start. */
void exec_admission_started(exec_job_t *job);
/* Gives back the job's slot (if it holds one) and admits the next. */
void exec_admission_release_slot(exec_job_t *job);
/* Calls wait for a slot (not for their own token's running cap), or the start gate is
 * full: a prestarted sandbox's set-up (CPU that only a later call gains from) waits too. */
bool exec_admission_busy(exec_state_t *x);
/* exec_metrics without the prestarted pool's part (prestart.c adds it). */
void exec_admission_metrics(exec_state_t *x, exec_metrics_t *out);
/* The start gate's width (--max-starting, or one per CPU). */
size_t exec_admission_max_starting(exec_state_t *x);

/* job.c */
/* Admitted (admission.c): with a slot, the dependency environment first (cached or built),
 * then the script.  May finish the job. */
void exec_job_start(exec_job_t *job);
/* Ends the job: the request is answered with result (stolen), the slot released, the work
 * directory removed, and the job DONE, out of every list that finds a job; its memory is
 * freed by the loop's deferred pass (exec_reap_soon), so a caller still on the stack may
 * read it, never act on it. */
void exec_job_finish(exec_job_t *job, json_t *result);
/* Queues the loop's deferred pass (once per iteration), which frees the DONE jobs and the
 * DEAD sessions (exec_sessions_reap); exec_free detaches it when the state goes first. */
void exec_reap_soon(exec_state_t *x);

/* progress.c */
void exec_progress_output(exec_job_t *job, sbx_stream_t stream, const char *buf, size_t len);
/* Sends what is pending now (the run is over). */
void exec_progress_flush(exec_job_t *job);
void exec_progress_stop(exec_job_t *job);

/* output.c: the tool result of a finished run (network and net_text: what the run's
 * connections did). */
json_t *exec_output_result(exec_job_t *job, const sbx_result_t *res, json_t *network,
                           cm_buf_t *net_text);

/* sandbox.c: starts a script run in workdir (script.py is there, or will be before a held
 * run is released): the interpreter (or the environment's), the start-up runner, the
 * limits (timeout_ms, and the server's).  *egress_out: the run's egress session, or NULL. */
int exec_sandbox_start(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                       const char *workdir, uint64_t timeout_ms, bool hold,
                       const srv_secret_call_t *secrets, const sbx_run_callbacks_t *cbs, void *data,
                       sbx_run_t **out, eg_session_t **egress_out, cm_error_t *err);
/* Starts a session's kernel (profiles/kernel.py, next to the start-up runner) in workdir as
 * identity, with ctl_dir (its FIFOs) mounted read-only at EXEC_KERNEL_CTL_TARGET, no
 * wall-clock or CPU-time limit (the session sets its calls' own) and the server's others. */
#define EXEC_KERNEL_CTL_TARGET "/opt/mps-ctl"
int exec_sandbox_start_kernel(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                              const char *workdir, const char *ctl_dir, sbx_identity_t *identity,
                              const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out,
                              eg_session_t **egress_out, cm_error_t *err);

/* Starts a prestarted interpreter: the start-up runner (profiles/runner.py) in workdir with
 * the script run's limits, waiting on the FIFO ctl_dir/go (mounted read-only at
 * EXEC_KERNEL_CTL_TARGET) for the go; held (spec.hold_in_command) until sbx_run_release(),
 * which gives it its timeout. */
int exec_sandbox_start_warm(exec_state_t *x, py_interp_t *py, env_handle_t *env, bool network,
                            const char *workdir, const char *ctl_dir,
                            const sbx_run_callbacks_t *cbs, void *data, sbx_run_t **out,
                            eg_session_t **egress_out, cm_error_t *err);

/* runner.c */
/* The start-up runner (exec_find_runner), found once; NULL (and a warning, once) when there is
 * none.  Then scripts run without it. */
const char *exec_runner_path(exec_state_t *x);
/* The compiled runner for py, when it is ready (its file name in exec_runner_pyc_dir); else
 * NULL, and its compilation starts if it has not. */
const char *exec_runner_pyc_for(exec_state_t *x, const py_interp_t *py, const char *runner);
char *exec_runner_pyc_dir(exec_state_t *x);
void exec_runner_release(exec_state_t *x);

/* prestart.c */
/* A held sandbox of the job's shape, when there is one: its run and work directory become
 * the job's. */
bool exec_prestart_take(exec_job_t *job);
enum { EXEC_PRESTARTED_NO, EXEC_PRESTARTED_SANDBOX, EXEC_PRESTARTED_INTERPRETER };
/* The go for a job whose interpreter was prestarted (after sbx_run_release: its output and
 * timeout are the job's by then): the frame naming script.py into its FIFO. */
int exec_prestart_go(exec_job_t *job, cm_error_t *err);
/* Closes go_fd (when >= 0) and removes workdir.ctl/, a prestarted interpreter's FIFO. */
void exec_prestart_remove_ctl(const char *workdir, int go_fd);
/* "interpreter", "sandbox" or "no" (the results' prestarted). */
const char *exec_prestarted_name(int prestarted);
void exec_prestart_free(exec_state_t *x);
/* A call was answered: the refills deferred until then start (if nothing waits). */
void exec_prestart_call_done(exec_state_t *x);

/* kframe.c: the session kernel's frames (profiles/kernel.py).  A frame is a 4-byte big-endian
 * length and that many bytes of one JSON object, at most EXEC_KFRAME_MAX. */
#define EXEC_KFRAME_MAX 65536
#define EXEC_KRESULT_MAX_DISPLAY 4096
#define EXEC_KRESULT_MAX_NAME 200
/* 1: a whole frame at buf, its object in *out (to json_decref) and its size in *used; 0: more
 * bytes are needed; -1: the bytes can never become a frame (too long, not a JSON object). */
int exec_kframe_parse(const char *buf, size_t len, size_t *used, json_t **out, cm_error_t *err);
/* A request frame for o (allocated; *len its size). */
char *exec_kframe_encode(json_t *o, size_t *len);
enum { EXEC_KSTATUS_OK, EXEC_KSTATUS_ERROR, EXEC_KSTATUS_INTERRUPTED, EXEC_KSTATUS_EXIT };
/* A call's result as the kernel reported it, checked: status one of EXEC_KSTATUS_*, exit_code
 * 0..255 (0 for ok), strings cut to their caps. */
typedef struct exec_kresult {
  uint64_t id;
  int status;
  int exit_code;
  char *error;        /* the exception's type name, or NULL */
  char *display;      /* repr() of the final expression, or NULL */
  char *export_error; /* why the asked-for export was not written, or NULL */
  uint64_t rss_bytes;
} exec_kresult_t;
int exec_kresult_from_json(json_t *o, exec_kresult_t *out, cm_error_t *err);
const char *exec_kstatus_name(int status);
void exec_kresult_release(exec_kresult_t *r);

/* session.c */
/* Finds or makes the session spec->session names for the call ("new", or an id of the
 * principal's) and claims it for the job: a tool error when it cannot (unknown, busy, a cap),
 * else NULL with *out set and *note what was done to make room (or NULL). */
json_t *exec_session_claim(exec_state_t *x, exec_spec_t *spec, exec_session_t **out, char **note);
/* The session's interpreter, once it has one (a later call runs with it), or NULL. */
py_interp_t *exec_session_python(exec_session_t *ks);
/* With a slot: true when the session's environment (or none) serves the call (job->env is
 * then the session's, borrowed); false when the call needs more packages: its requirements
 * become the session's and its own together, for a new environment. */
bool exec_session_prepare(exec_job_t *job);
/* The kernel runs the job's script (its environment is ready in job->env, or none). */
void exec_session_run(exec_job_t *job);
/* The request was cancelled: true when the session ends the job (later). */
bool exec_session_cancel(exec_job_t *job);
/* The job ends: result (borrowed, may be changed) gets the session's part. */
void exec_session_job_done(exec_job_t *job, json_t *result);
void exec_sessions_free(exec_state_t *x);
/* Frees the DEAD sessions (the deferred pass's part). */
void exec_sessions_reap(exec_state_t *x);

/* workdir.c */
/* A fresh work directory under the server's runs directory: a size-capped tmpfs of its own
 * when the server may mount (*mounted). */
char *exec_workdir_make(exec_state_t *x, bool *mounted, cm_error_t *err);
void exec_workdir_remove(const char *workdir, bool mounted);

#endif
