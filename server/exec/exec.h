/* server/exec/: one run of a script, from its typed run spec to the tool result.  The
 * execution state hangs off the server (srv_server_exec): the admission (slots, the start
 * gate, the per-principal round-robin queue), the jobs, the prestarted sandboxes, the start-up
 * runner and its bytecode cache.  Nothing here reads a tool's JSON arguments: the execute
 * tool (server/tools/) turns them into an exec_spec_t.
 *
 * Files: spec.c (the run spec; where a call's timeout is decided), job.c (a call from the
 * spec to the answer: interpreter, probe, queue, environment, run), admission.c (slots, start
 * gate, queue, the principal's and session's caps), progress.c (output as progress, throttled),
 * sandbox.c (a run's sandbox spec: argv, env, mounts, limits), prestart.c, runner.c (the
 * start-up runner and its .pyc), workdir.c (work directories), output.c (truncation, the
 * seed's text block, the result of a finished run).
 *
 * May use: server/core/, server/net/, server/files/, server/config/, envstore/, interp/,
 * sandbox/, egress/, pystd/, common/. */
#ifndef MPS_SERVER_EXEC_EXEC_H
#define MPS_SERVER_EXEC_EXEC_H

#include <jansson.h>

#include "common/cm.h"
#include "server/config/config.h"
#include "server/core/core.h"
#include "server/files/files.h"
#include "server/net/net.h"

/* ---------------------------------------------------------------- the execution state */

typedef struct exec_state exec_state_t;

/* The server's execution state (made by srv_server_new, freed by srv_server_free after
 * every request ended). */
exec_state_t *exec_new(srv_server_t *s);
void exec_free(exec_state_t *x);
/* The server stops (its drain began, or its shutdown): no prestarted sandbox is set up from
 * now on, and once no call is left (no job), the held sandboxes are dropped and the sessions
 * closed, their kernels killed.  Never waits: what they leave (sandboxes being torn down,
 * work directories being removed) is the sandbox room's and the background worker's to
 * finish, beside the loop.  Idempotent: called again until it is done. */
void exec_wind_down(exec_state_t *x);
/* What exec_wind_down still has to end: jobs, held sandboxes, live or closing sessions. */
size_t exec_teardowns(exec_state_t *x);

/* ---------------------------------------------------------------- the run spec */

/* The explicit, typed inputs of one run: built by the execute tool, consumed by the job. */
typedef struct exec_spec {
  char *script;
  size_t script_len;
  char **requirements; /* merged PEP 723 + argument requirements (NULL-terminated), or NULL */
  size_t n_requirements;
  char *uv_config;           /* the script's [tool.uv] table as TOML, or NULL */
  char *python_request;      /* the call's python_version, or NULL */
  char *requires_python;     /* the script's PEP 723 requires-python, or NULL */
  uint64_t timeout_ms;       /* the run's wall-clock limit (exec_spec_set_timeout) */
  char *timeout_note;        /* why it is not what the call asked for, or NULL */
  srv_net_call_t net;        /* the call's network (never more than the server allows) */
  srv_secret_call_t secrets; /* the call's secrets (names and placeholders, never values) */
  files_inputs_t inputs;     /* the files argument, written before the script starts */
  char *principal;           /* whose call it is (the session's principal) */
  /* The call's session: NULL (a fresh sandbox, as always), "new" or a session's id. */
  char *session;
  bool export_workspace; /* the work directory comes back as outputs/workspace.tar */
  bool close_session;    /* the session is closed after the call (close_session's export) */
  bool details;          /* structuredContent carries the run's metadata too (details: true) */
} exec_spec_t;

/* The one place a call's timeout is decided: requested_s seconds (0: not given, so
 * --timeout's default), cut to --max-timeout with a note saying so. */
void exec_spec_set_timeout(exec_spec_t *spec, const srv_config_t *cfg, uint64_t requested_s);
void exec_spec_release(exec_spec_t *spec);
/* Releases the spec when it goes out of scope (a spec given to exec_submit is left empty). */
#define cleanup_exec_spec __attribute__((cleanup(exec_spec_release)))

/* ---------------------------------------------------------------- running */

/* Runs spec (its contents are stolen; *spec is left empty) as r's execution: refused at
 * once with a tool error when the session or the principal is at its cap, otherwise queued
 * for a slot and finished with the run's result (or a tool error) later. */
void exec_submit(srv_request_t *r, exec_spec_t *spec);

/* A principal's execute_python calls right now (check_environment). */
typedef struct exec_usage {
  size_t calls;   /* from validation to the answer (--max-token-concurrent counts these) */
  size_t running; /* holding a slot, building its environment included (--max-token-running) */
  size_t queued;  /* waiting for a slot */
} exec_usage_t;
void exec_usage(exec_state_t *x, const char *principal, exec_usage_t *out);
/* What /metrics shows of the executions: every principal's calls, running and queued summed,
 * the runs starting, the prestarted sandboxes, and how long calls waited for a slot. */
typedef struct exec_metrics {
  exec_usage_t total;
  size_t starting;
  size_t prestart_ready;               /* held, waiting for a call */
  size_t prestart_ready_interpreters;  /* of those, with the interpreter up and waiting */
  uint64_t prestart_taken;             /* calls that ran in one */
  uint64_t prestart_taken_interpreter; /* of those, in a prestarted interpreter */
  uint64_t prestart_failed;     /* held sandboxes that ended before use, or failed to start */
  const uint64_t *wait_buckets; /* SRV_M_BUCKETS + 1, not cumulative (srv_metric_buckets) */
  uint64_t wait_ms_sum, wait_count;
} exec_metrics_t;
void exec_metrics(exec_state_t *x, exec_metrics_t *out);
/* Another call that runs a process for principal (validate_script's compile or resolution)
 * counts against --max-token-concurrent like an execution, without a slot: false, holding
 * nothing, when the principal is at that cap; else held until exec_release. */
bool exec_hold(exec_state_t *x, const char *principal);
void exec_release(exec_state_t *x, const char *principal);

/* ---------------------------------------------------------------- sessions */

/* A session (execute_python's session argument): a kernel, a long-lived interpreter in a
 * sandbox of its own (profiles/kernel.py), and its work directory, which outlive a call.
 * Sessions belong to their principal: to any other, a session is unknown. */

/* The principal's sessions as JSON objects (id, state, age, idle, python, environment,
 * memory, work directory bytes, calls), oldest first. */
json_t *exec_sessions_list(exec_state_t *x, const char *principal);
/* How many sessions principal has, and all principals together. */
void exec_sessions_count(exec_state_t *x, const char *principal, size_t *mine, size_t *all);
/* Closes the principal's session id (its kernel is killed, its directories removed): false
 * when it has none of that id. */
bool exec_session_close(exec_state_t *x, const char *principal, const char *id);
/* Whether sessions can run here, and if not *why (static text). */
bool exec_sessions_available(exec_state_t *x, const char **why);

/* ---------------------------------------------------------------- the prestarted sandbox */

/* Starts keeping sandboxes ready (with --prestart on and a backend that can hold one): the
 * assembly's waiter for a probe that passed (srv_server_after_probe). */
void exec_prestart_start(srv_server_t *s);
/* No prestarted sandbox is set up from now on (refills, retries, a new shape's); with drop,
 * those held are dropped too (killed: their teardown goes on beside the loop). */
void exec_prestart_stop(exec_state_t *x, bool drop);
/* Whether sandboxes are being prestarted; *taken: calls that ran in one. */
bool exec_prestart_describe(exec_state_t *x, uint64_t *taken);
/* The pool's counters (check_environment, /metrics): how many are kept per shape (and how
 * many a shape's pool may grow to under bursts), held and waiting for a call (of those, with
 * the interpreter up: of the shapes principal sees, the commonest and its own last other
 * one; NULL: of all), and the server's totals: the calls that took one (of those, an
 * interpreter), and the held ones that ended before use or failed to start. */
typedef struct exec_prestart_counts {
  size_t per_shape, max_per_shape, ready, ready_interpreters;
  size_t other_shapes_max; /* principals that may keep a last other shape at once */
  uint64_t taken, taken_interpreter, failed;
} exec_prestart_counts_t;
void exec_prestart_counts(exec_state_t *x, const char *principal, exec_prestart_counts_t *out);
/* The shapes principal sees (check_environment): the commonest, and its own last other one
 * (never another principal's); [{shape, python, environment, network, holds ("interpreter",
 * "sandbox" or "nothing (given up)"), ready, target}]. */
json_t *exec_prestart_shapes(exec_state_t *x, const char *principal);

/* ---------------------------------------------------------------- work directories */

/* Whether work directories are size-capped here (for check_environment). */
bool exec_workdir_capped(exec_state_t *x, uint64_t bytes);
/* Unmounts and removes what crashed servers left in work_root: the directories of servers
 * that are gone (work/srv-*, see below), and runs and builds older than any can be. */
void srv_workdir_sweep(const char *work_root, uint64_t older_than_s);
/* A directory of this server's own for its runs' work directories (work_root/srv-XXXXXX),
 * locked (flock) for as long as the server lives: however the server ends, the next one to
 * sweep the state directory can tell it is gone and remove it, mounts and all.  Returns it
 * (to free) and the lock's fd, or NULL. */
char *srv_workdir_claim(const char *work_root, int *lock_fd, cm_error_t *err);

/* The start-up runner (profiles/runner.py) a run would use: $MPS_RUNNER, the install tree
 * relative to the binary (<bindir>/MPS_REL_DATADIR/runner/runner.py), a build directory's
 * <bindir>/mps-runner/runner.py, or its source tree's profiles/runner.py.  NULL and *why
 * (allocated) when there is none or, for a root server, when it or its directory is writable
 * by anyone but root. */
char *exec_find_runner(char **why);
/* Unmounts what is left in dir, removes it and drops the lock. */
void srv_workdir_release(const char *dir, int lock_fd);

/* ---------------------------------------------------------------- output formatting */

/* The seed's truncation: at most max bytes of valid UTF-8, with its marker
 * "\n... [truncated at NKB]" when cut.  Ours keeps the tail too (see output.c).  Output
 * is bytes: a NUL is kept like any other byte (JSON carries it as \u0000), and invalid
 * UTF-8 becomes U+FFFD.  _n gives the length of the result (which may hold NULs) and
 * whether anything was cut; the plain form is for texts without NUL. */
char *srv_truncate_output_n(const char *head, size_t head_len, const char *tail, size_t tail_len,
                            uint64_t total, uint64_t max, size_t *out_len, bool *cut);
char *srv_truncate_output(const char *head, size_t head_len, const char *tail, size_t tail_len,
                          uint64_t total, uint64_t max);
char *srv_truncation_marker(uint64_t max);

typedef struct srv_exec_summary {
  const char *stdout_text; /* already truncated */
  const char *stderr_text;
  int exit_code;
  uint64_t duration_ms;
  bool timed_out;
  size_t stdout_len; /* bytes of stdout_text, which may hold NULs; 0 = strlen */
  size_t stderr_len;
} srv_exec_summary_t;

/* The seed's text block: "--- stdout ---\n...\n--- exit_code: N ---\n--- duration_ms: N ---".
 * _n also gives its length (the outputs' NULs are in it). */
char *srv_format_result_n(const srv_exec_summary_t *s, size_t *len);
char *srv_format_result(const srv_exec_summary_t *s);

#endif
