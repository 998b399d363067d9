/* Sessions: the stdio connection, or one Mcp-Session-Id. */
#include "server/core/core-internal.h"

/* ---------------------------------------------------------------- sessions */

srv_session_t *srv_session_new(srv_server_t *s, tr_sink_t *sink) {
  srv_session_t *ss = xcalloc(1, sizeof *ss);
  ss->server = s;
  ss->sink = tr_sink_ref(sink);
  ss->log_level = -1;
  ss->principal = xstrdup(SRV_PRINCIPAL_STDIO);
  ss->refs = 1;
  ss->serial = ++s->session_serial;
  return ss;
}

const char *srv_session_protocol(const srv_session_t *ss) {
  return ss->protocol;
}

void srv_session_set_principal(srv_session_t *ss, const char *principal) {
  free(ss->principal);
  ss->principal = xstrdup(principal ? principal : SRV_PRINCIPAL_STDIO);
}

const char *srv_session_principal(const srv_session_t *ss) {
  return ss ? ss->principal : NULL;
}

void srv_session_free(srv_session_t *ss) {
  if (!ss) return;
  /* Its tasks go on without it (they belong to the principal): their runs are detached
   * first, so the loop below does not see them. */
  srv_tasks_session_gone(ss);
  /* Requests of this session lose their session pointer and are cancelled (which may
   * finish and free them). */
  srv_request_t *next;
  for (srv_request_t *r = ss->server->inflight; r; r = next) {
    next = r->next;
    if (r->session != ss) continue;
    r->session = NULL;
    srv_request_cancel_one(r);
  }
  srv_session_destroy(ss);
}
