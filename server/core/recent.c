/* The recent tool calls of each principal (core.h, srv_recent_*): what the audit log says of
 * them (tool, outcome, limit, duration, when), kept in memory so that a principal can see its
 * own (check_environment, the playground's status view) whether or not the audit log is on,
 * and never another's.  Bounded: SRV_RECENT_PER_PRINCIPAL calls of SRV_RECENT_PRINCIPALS
 * principals, the one that called least recently making room. */
#include <stdio.h>
#include <time.h>

#include "server/core/core-internal.h"

typedef struct recent_call {
  int64_t at_ms; /* wall clock (Unix ms): shown to people */
  uint32_t duration_ms;
  const char *tool, *outcome, *limit; /* static strings (srv_metric_*); limit NULL: none */
} recent_call_t;

struct srv_recent {
  char *principal;
  uint64_t used; /* the order of last calls: larger is more recent */
  size_t next, n;
  recent_call_t calls[SRV_RECENT_PER_PRINCIPAL];
  struct srv_recent *link;
};

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void srv_recent_note(srv_server_t *s, const char *principal, const char *tool, const char *outcome,
                     const char *limit, uint64_t duration_ms) {
  if (!principal) principal = SRV_PRINCIPAL_STDIO;
  srv_recent_t *r = NULL, *oldest = NULL;
  size_t n = 0;
  uint64_t latest = 0;
  for (srv_recent_t *x = s->recent; x; x = x->link, n++) {
    if (strcmp(x->principal, principal) == 0) r = x;
    if (!oldest || x->used < oldest->used) oldest = x;
    if (x->used > latest) latest = x->used;
  }
  if (!r && n >= SRV_RECENT_PRINCIPALS) {
    /* The least recent caller's list is reused (its calls go). */
    r = oldest;
    free(r->principal);
    r->principal = xstrdup(principal);
    r->next = r->n = 0;
  } else if (!r) {
    r = xcalloc(1, sizeof *r);
    r->principal = xstrdup(principal);
    r->link = s->recent;
    s->recent = r;
  }
  r->used = latest + 1;
  recent_call_t *c = &r->calls[r->next];
  c->at_ms = wall_ms() - (int64_t)duration_ms; /* when it started */
  c->duration_ms = duration_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)duration_ms;
  c->tool = tool;
  c->outcome = outcome;
  c->limit = limit;
  r->next = (r->next + 1) % SRV_RECENT_PER_PRINCIPAL;
  if (r->n < SRV_RECENT_PER_PRINCIPAL) r->n++;
}

json_t *srv_recent_json(srv_server_t *s, const char *principal) {
  json_t *list = json_array();
  if (!principal) principal = SRV_PRINCIPAL_STDIO;
  for (srv_recent_t *r = s->recent; r; r = r->link) {
    if (strcmp(r->principal, principal) != 0) continue;
    for (size_t k = 0; k < r->n; k++) {
      /* Newest first. */
      const recent_call_t *c =
          &r->calls[(r->next + SRV_RECENT_PER_PRINCIPAL - 1 - k) % SRV_RECENT_PER_PRINCIPAL];
      time_t secs = (time_t)(c->at_ms / 1000);
      struct tm tm;
      char when[40];
      gmtime_r(&secs, &tm);
      size_t w = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
      snprintf(when + w, sizeof when - w, ".%03dZ", (int)(c->at_ms % 1000));
      json_t *o = json_pack("{s:s, s:s, s:s, s:I}", "time", when, "tool", c->tool, "outcome",
                            c->outcome, "duration_ms", (json_int_t)c->duration_ms);
      if (c->limit) json_object_set_new(o, "limit", json_string(c->limit));
      json_array_append_new(list, o);
    }
  }
  return list;
}

void srv_recent_free(srv_server_t *s) {
  while (s->recent) {
    srv_recent_t *r = s->recent;
    s->recent = r->link;
    free(r->principal);
    free(r);
  }
}
