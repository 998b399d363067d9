/* transport/: framing of JSON-RPC texts over stdio and HTTP.  A transport delivers one
 * complete JSON text with a reply sink, and writes what the router gives it.  It knows no
 * MCP method and never includes a sandbox/ header. */
#ifndef MPS_TRANSPORT_TR_H
#define MPS_TRANSPORT_TR_H

#include "common/cm.h"

/* ---------------------------------------------------------------- sinks */

/* Where the router writes messages related to one incoming text (its responses and the
 * notifications tied to its requests).  Reference-counted: the transport holds one
 * reference, the router one per pending request. */
typedef struct tr_sink tr_sink_t;

typedef enum tr_send_flags {
  TR_SEND_DEFAULT = 0,
  /* May be dropped under back-pressure (progress, log notifications); responses never are. */
  TR_SEND_DROPPABLE = 1,
} tr_send_flags_t;

typedef struct tr_sink_ops {
  void (*send)(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags);
  /* Called when the last reference goes. */
  void (*release)(tr_sink_t *s);
} tr_sink_ops_t;

struct tr_sink {
  const tr_sink_ops_t *ops;
  int refs;
  bool closed; /* the peer is gone: sends are dropped */
};

void tr_sink_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags);
tr_sink_t *tr_sink_ref(tr_sink_t *s);
void tr_sink_unref(tr_sink_t *s);

/* ---------------------------------------------------------------- stdio */

typedef struct tr_stdio tr_stdio_t;

typedef struct tr_stdio_callbacks {
  /* One complete line (without its line ending), at most max_message_bytes. */
  void (*on_message)(void *data, const char *buf, size_t len, tr_sink_t *reply);
  /* A line longer than max_message_bytes was discarded. */
  void (*on_oversize)(void *data, size_t len, tr_sink_t *reply);
  /* stdin reached EOF (or failed). */
  void (*on_eof)(void *data);
} tr_stdio_callbacks_t;

/* Newline-delimited JSON on in_fd/out_fd (both made non-blocking).  Output is queued and
 * written as the peer reads; droppable messages are dropped while more than
 * max_pending_bytes are queued. */
tr_stdio_t *tr_stdio_new(cm_loop_t *loop, int in_fd, int out_fd, size_t max_message_bytes,
                         const tr_stdio_callbacks_t *cbs, void *data, cm_error_t *err);
tr_sink_t *tr_stdio_sink(tr_stdio_t *t);
/* Stops reading stdin (shutdown). */
void tr_stdio_stop_reading(tr_stdio_t *t);
/* Bytes still queued for stdout. */
size_t tr_stdio_pending(const tr_stdio_t *t);
/* Writes what is queued, waiting at most timeout_ms. */
void tr_stdio_flush(tr_stdio_t *t, int timeout_ms);
void tr_stdio_free(tr_stdio_t *t);

#endif
