/* The sandbox backend's probe: started from the loop shortly after start-up (or by the first
 * call that needs the backend), its outcome arriving by callback; calls that need it before
 * then wait without blocking the loop. */
#include "server/core/core-internal.h"

#define SRV_PROBE_DELAY_MS 20

/* The sandbox backend is probed like every other child process is run: started from the
 * loop, its outcome arriving by callback.  Calls that need the backend before then wait
 * (srv_server_when_probed) without blocking the loop. */
typedef struct probe_wait {
  struct probe_wait *next;
  void (*cb)(void *data);
  void *data;
} probe_wait_t;

static void flush_probe_waits(cm_loop_t *loop, cm_timer_t *t, void *data) {
  srv_server_t *s = data;
  s->probe_flush = NULL;
  /* One at a time from the head: a callback may cancel or add others. */
  while (s->probed && s->probe_waits) {
    probe_wait_t *w = s->probe_waits;
    s->probe_waits = w->next;
    w->cb(w->data);
    free(w);
  }
}

static void queue_probe_flush(srv_server_t *s) {
  if (s->probe_flush || !s->probe_waits) return;
  s->probe_flush = cm_loop_timer(s->loop, 0, flush_probe_waits, s);
}

static void on_probed(void *data, sbx_backend_t *b) {
  srv_server_t *s = data;
  s->probe = NULL;
  s->probed = true;
  if (!b->available)
    cm_warn("sandbox backend %s is not available: %s; executions will be refused (no fall back)",
            sbx_backend_name(b), b->unavailable);
  queue_probe_flush(s);
}

static void ensure_probed(srv_server_t *s) {
  if (s->probed || s->probe) return;
  cm_timer_cancel(s->probe_timer);
  s->probe_timer = NULL;
  s->probe = sbx_backend_probe_start(s->backend, s->loop, on_probed, s);
}

bool srv_server_probed(srv_server_t *s) {
  return s->probed;
}

void *srv_server_after_probe(srv_server_t *s, void (*cb)(void *data), void *data) {
  probe_wait_t *w = xcalloc(1, sizeof *w);
  w->cb = cb;
  w->data = data;
  probe_wait_t **tail = &s->probe_waits;
  while (*tail) tail = &(*tail)->next;
  *tail = w;
  if (s->probed) queue_probe_flush(s);
  return w;
}

void *srv_server_when_probed(srv_server_t *s, void (*cb)(void *data), void *data) {
  void *w = srv_server_after_probe(s, cb, data);
  ensure_probed(s);
  return w;
}

void srv_server_cancel_probe_wait(srv_server_t *s, void *wait) {
  for (probe_wait_t **p = &s->probe_waits; *p; p = &(*p)->next) {
    if (*p == wait) {
      *p = ((probe_wait_t *)wait)->next;
      free(wait);
      return;
    }
  }
}

static void probe_soon(cm_loop_t *loop, cm_timer_t *t, void *data) {
  srv_server_t *s = data;
  s->probe_timer = NULL;
  ensure_probed(s);
}
sbx_backend_t *srv_server_backend(srv_server_t *s) {
  ensure_probed(s);
  return s->backend;
}

void srv_probe_schedule(srv_server_t *s) {
  s->probe_timer = cm_loop_timer(s->loop, SRV_PROBE_DELAY_MS, probe_soon, s);
}

void srv_probe_release(srv_server_t *s) {
  cm_timer_cancel(s->probe_timer);
  s->probe_timer = NULL;
  sbx_probe_cancel(s->probe);
  s->probe = NULL;
  cm_timer_cancel(s->probe_flush);
  s->probe_flush = NULL;
  while (s->probe_waits) {
    probe_wait_t *w = s->probe_waits;
    s->probe_waits = w->next;
    free(w);
  }
}
