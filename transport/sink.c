#include "transport/tr.h"

void tr_sink_send(tr_sink_t *s, const char *json, size_t len, tr_send_flags_t flags) {
  if (!s || s->closed) return;
  s->ops->send(s, json, len, flags);
}

tr_sink_t *tr_sink_ref(tr_sink_t *s) {
  if (s) s->refs++;
  return s;
}

void tr_sink_unref(tr_sink_t *s) {
  if (!s) return;
  if (--s->refs == 0 && s->ops->release) s->ops->release(s);
}

void tr_sink_close_stream(tr_sink_t *s) {
  if (s && !s->closed && s->ops->close_stream) s->ops->close_stream(s);
}

void tr_sink_on_peer_gone(tr_sink_t *s, void (*cb)(void *data), void *data) {
  if (!s) return;
  s->peer_gone = cb;
  s->peer_gone_data = data;
}

void tr_sink_peer_gone(tr_sink_t *s) {
  if (!s || !s->peer_gone) return;
  void (*cb)(void *data) = s->peer_gone;
  s->peer_gone = NULL;
  cb(s->peer_gone_data);
}
