/* server/audit/: the audit log (--audit-log FILE, or - for stderr): one JSON line per tool
 * call and per authentication failure, appended (O_APPEND) by a writer thread of its own, so
 * that a slow or full disk never blocks the event loop.  The queue between the two is bounded
 * (SRV_AUDIT_QUEUE_MAX): past it, lines are dropped and counted, and the next line written
 * says how many were lost.  Rotation by size (--audit-log-max-bytes: FILE -> FILE.1 ->
 * ... FILE.<keep>), or srv_audit_reopen() on SIGHUP after logrotate moved the file.
 *
 * May use: common/. */
#ifndef MPS_SERVER_AUDIT_AUDIT_H
#define MPS_SERVER_AUDIT_AUDIT_H

#include <jansson.h>

#include "common/cm.h"

#define SRV_AUDIT_QUEUE_MAX (4u << 20)
#define SRV_AUDIT_LINE_MAX (64u << 10)

typedef struct srv_audit srv_audit_t;

/* Opens (creates 0600) path for appending, or stderr for "-".  A path that exists must be a
 * regular file (never a FIFO, a device or a symbolic link).  max_bytes: rotate once the file
 * reaches it (0: never), keeping `keep` old files (at least 1).  Errors: CM_ERR_INVALID,
 * CM_ERR_IO. */
srv_audit_t *srv_audit_open(const char *path, uint64_t max_bytes, unsigned keep, cm_error_t *err);
/* Queues one record (a JSON object; "time" is added in front, RFC 3339 UTC with
 * milliseconds).  Never blocks on the file; a line over SRV_AUDIT_LINE_MAX keeps only its
 * numbers, booleans and short strings, with "error": "record too large", its "bytes" and
 * the fields "omitted".  Safe with a NULL log (no audit log configured). */
void srv_audit_write(srv_audit_t *a, json_t *record);
/* The file is opened again (after logrotate moved it) before the next line is written. */
void srv_audit_reopen(srv_audit_t *a);
/* Lines lost so far because the queue was full or the file could not be written. */
uint64_t srv_audit_dropped(srv_audit_t *a);
/* Writes what is queued (waiting at most timeout_ms for the disk), then closes. */
void srv_audit_close(srv_audit_t *a, uint64_t timeout_ms);

#endif
