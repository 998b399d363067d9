/* server/: the binary (main.c), the assembly of the server (server.c) and its HTTP glue
 * (serve_http.c).  This header is also what an embedding program (the conformance fixture,
 * the unit tests) includes: it brings every room's public header.
 *
 * May use: every room (server/core, server/exec, server/tools, server/files, server/config,
 * envstore, interp, sandbox, egress, transport, pystd, common). */
#ifndef MPS_SERVER_SERVER_H
#define MPS_SERVER_SERVER_H

#include "common/cm.h"
#include "server/config/config.h"
#include "server/core/core.h"
#include "server/exec/exec.h"
#include "server/files/files.h"
#include "server/net/net.h"
#include "server/tools/tools.h"
#include "transport/tr.h"

/* Assembles the server: the state directory (created 0700; a relative --state-dir is
 * resolved once), this server's own work directory (locked while it lives; what crashed
 * servers left is swept), the sandbox backend (probed shortly after, in the background),
 * cgroups, the artifact store, the interpreters (discovered in the background), the
 * environment store, the network, and the tool table.  cfg must outlive the server. */
srv_server_t *srv_server_new(cm_loop_t *loop, srv_config_t *cfg, cm_error_t *err);
/* Cancels and frees everything, in the order the parts need (runs before the stores, the
 * network after the runs and builds, cgroups after the runs, the work directory last). */
void srv_server_free(srv_server_t *s);

/* Ready to run calls (/readyz): the sandbox's probe passed and the default interpreter is
 * known. */
bool srv_server_ready(srv_server_t *s);
/* GET /metrics (server/metrics.c): the Prometheus text format, heap; http_extra (the
 * transport's own families, or NULL) is appended. */
char *srv_metrics_render(srv_server_t *s, const char *http_extra);

/* SIGTERM's first phase: new tool calls are refused (a tool error saying so); the calls in
 * progress go on.  srv_server_calls() (core.h) counts them (task runs included). */
void srv_server_drain(srv_server_t *s);
/* The shutdown's second phase (after SIGTERM's drain, or at once on the end of input or
 * SIGINT): no prestarted sandbox is set up any more, and once no call is left, the held
 * sandboxes are dropped and the sessions closed (their kernels killed).  Never waits:
 * srv_server_teardowns() counts what is still being torn down beside the loop (sandboxes
 * whose teardown follows their answer or their kill, work directories and cgroups being
 * removed), and the loop should run until it is zero, so that srv_server_free() finds nothing
 * left to kill or remove (past a deadline it does that itself, synchronously, and logs it).
 * Idempotent: call it again on each look. */
void srv_server_wind_down(srv_server_t *s);
size_t srv_server_teardowns(srv_server_t *s);

/* SIGHUP: the audit log is opened again (logrotate moved it). */
void srv_server_reopen_logs(srv_server_t *s);

/* Starts the Streamable HTTP transport on cfg's --host/--port/--path: reads the TLS key
 * and certificate (--tls-cert/--tls-key), or creates and reuses a self-signed pair under
 * <state dir>/tls/ (--tls-self-signed, whose SHA-256 fingerprint it prints to stderr),
 * and wires the transport's session callbacks to srv_session_*.  On success *out is the
 * transport (tr_http_shutdown() then tr_http_free() it before srv_server_free()). */
int srv_serve_http(cm_loop_t *loop, srv_server_t *server, const srv_config_t *cfg, tr_http_t **out,
                   cm_error_t *err);

/* "http[s]://host:port/path" for the log line that tells users where we listen (heap). */
char *srv_http_url(const srv_config_t *cfg, uint16_t port);

#endif
