/* server/: configuration, the JSON-RPC/MCP router, the tools, interpreters and jobs.
 * The only layer that turns internal errors into JSON-RPC errors. */
#ifndef MPS_SERVER_SRV_H
#define MPS_SERVER_SRV_H

#include <jansson.h>

#include "common/cm.h"
#include "server/config/config.h"
#include "server/core/core.h"
#include "interp/interp.h"
#include "sandbox/sbx.h"
#include "transport/tr.h"

/* ---------------------------------------------------------------- the prestarted sandbox */

/* The sandbox prestarted for the next call (server/execute.c). */
typedef struct srv_prestart srv_prestart_t;
/* Starts keeping one sandbox ready (with --prestart on and a backend that can hold one). */
void srv_prestart_start(srv_server_t *s);
void srv_prestart_free(srv_server_t *s);
/* Whether sandboxes are being prestarted; *taken: calls that ran in one. */
bool srv_prestart_describe(srv_server_t *s, uint64_t *taken);

/* ---------------------------------------------------------------- tools */


const srv_tool_t *srv_tools(size_t *count);
const srv_tool_t *srv_tool_find(const char *name);

/* A tool result with one text block. isError as given.  _n: len bytes of valid UTF-8,
 * which may hold NULs. */
json_t *srv_tool_text_result(const char *text, bool is_error);
json_t *srv_tool_text_resultn(const char *text, size_t len, bool is_error);
json_t *srv_tool_error_result(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void srv_tool_execute_python(srv_request_t *r, json_t *arguments);
/* A principal's execute_python calls right now (check_environment). */
typedef struct srv_exec_usage {
  size_t calls;   /* from validation to the answer (--max-token-concurrent counts these) */
  size_t running; /* holding a slot, building its environment included (--max-token-running) */
  size_t queued;  /* waiting for a slot */
} srv_exec_usage_t;
void srv_exec_usage(const char *principal, srv_exec_usage_t *out);
/* Another call that runs a process for principal (validate_script's compile or resolution)
 * counts against --max-token-concurrent like an execution, without a slot: false, holding
 * nothing, when the principal is at that cap; else held until srv_exec_release. */
bool srv_exec_hold(const srv_config_t *cfg, const char *principal);
void srv_exec_release(const char *principal);
json_t *srv_tool_execute_python_describe(srv_server_t *s);
void srv_tool_validate_script(srv_request_t *r, json_t *arguments);
json_t *srv_tool_validate_script_describe(srv_server_t *s);

/* ---------------------------------------------------------------- the runner */

/* The start-up runner (profiles/runner.py, installed as mps-runner/runner.py next to the
 * binary): $MPS_RUNNER, <bindir>/mps-runner/runner.py,
 * <bindir>/../share/mcp-python-exec-sandbox/runner/runner.py or <bindir>/../profiles/runner.py.
 * Found once; NULL (and a warning, once) when there is none or, for a root server, when
 * it or its directory is writable by anyone but root.  Then scripts run without it. */
const char *files_runner_path(void);
/* The sandbox path of the runner's directory when the backend maps paths. */
#define FILES_RUNNER_TARGET "/opt/mps"

/* ---------------------------------------------------------------- work directories */

/* Mounts a size-capped tmpfs on dir when the server may (root): true if it did.  0 = no. */
bool srv_workdir_mount(const char *dir, uint64_t bytes);
void srv_workdir_unmount(const char *dir);
/* Unmounts and removes what crashed servers left in work_root: the directories of servers
 * that are gone (work/srv-*, see below), and runs and builds older than any can be. */
void srv_workdir_sweep(const char *work_root, uint64_t older_than_s);
/* A directory of this server's own for its runs' work directories (work_root/srv-XXXXXX),
 * locked (flock) for as long as the server lives: however the server ends, the next one to
 * sweep the state directory can tell it is gone and remove it, mounts and all.  Returns it
 * (to free) and the lock's fd, or NULL. */
char *srv_workdir_claim(const char *work_root, int *lock_fd, cm_error_t *err);
/* Unmounts what is left in dir, removes it and drops the lock. */
void srv_workdir_release(const char *dir, int lock_fd);
/* Whether work directories are size-capped here (for check_environment). */
bool srv_workdir_capped(uint64_t bytes);

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
