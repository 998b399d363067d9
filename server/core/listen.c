/* subscriptions/listen (protocol revision 2026-07-28, SEP-2575): a long-lived request whose
 * stream carries the notifications a client opted in to, in place of the handshake era's
 * GET stream and resources/subscribe.
 *
 * The request stays in flight until the client cancels it (notifications/cancelled on
 * stdio, closing its response stream over HTTP) or the server drains, when it ends with
 * its result.  Its first message is notifications/subscriptions/acknowledged with the part
 * of the filter the server honours (what its capabilities say it can send); every
 * notification on it names the subscription (the listen request's id) in
 * _meta["io.modelcontextprotocol/subscriptionId"].  A listener belongs to its principal:
 * what concerns one principal's resources (its artifacts) reaches that principal's
 * listeners only.  Listeners are bounded per principal and in all.
 *
 * The tasks extension's taskIds (a client that declares the extension on the listen
 * request): the stream watches those of the named tasks that are the principal's (another
 * principal's task is not agreed, exactly as an unknown id), hears their current state
 * first, then a notifications/tasks with the DetailedTask (what tasks/get would answer) on
 * every change of status or of the questions waiting for the client. */
#include "server/core/core-internal.h"

#define MCP_META_SUBSCRIPTION "io.modelcontextprotocol/subscriptionId"

/* Everyone's listen streams: each holds a request (and over HTTP a connection).  A
 * principal's are bounded by --max-listens-per-principal (--max-listens-local for the local
 * principal, which every client without a token is: one per Claude Code session). */
#define SRV_MAX_LISTENS 256
#define SRV_PRINCIPAL_LOCAL "local"
/* resourceSubscriptions: URIs per stream, and bytes per URI. */
#define SRV_MAX_LISTEN_URIS 64
#define SRV_MAX_LISTEN_URI_BYTES 2048
/* taskIds per stream, and bytes per id (ours are 32). */
#define SRV_MAX_LISTEN_TASKS 64
#define SRV_MAX_LISTEN_TASK_ID_BYTES 128

struct srv_listener {
  srv_request_t *r;
  char *principal;
  unsigned kinds;     /* SRV_LISTEN_* agreed */
  json_t *uris;       /* resourceSubscriptions agreed (array of strings), or NULL */
  json_t *tasks;      /* taskIds agreed (array of strings), or NULL */
  uint64_t active_ms; /* opened, or last sent to: the oldest idle goes first at the cap */
  srv_listener_t *next;
};

/* The filter's list-changed members, and the capability each needs. */
static const struct {
  const char *member, *capability;
  unsigned kind;
  const char *method;
} list_kinds[] = {
    {"toolsListChanged", "tools", SRV_LISTEN_TOOLS, "notifications/tools/list_changed"},
    {"promptsListChanged", "prompts", SRV_LISTEN_PROMPTS, "notifications/prompts/list_changed"},
    {"resourcesListChanged", "resources", SRV_LISTEN_RESOURCES,
     "notifications/resources/list_changed"},
};

static void listener_unlink(srv_listener_t *l) {
  srv_server_t *s = l->r->server;
  for (srv_listener_t **p = &s->listeners; *p; p = &(*p)->next) {
    if (*p != l) continue;
    *p = l->next;
    s->n_listeners--;
    break;
  }
}

static void listener_end(srv_listener_t *l);

static void listener_free(srv_listener_t *l) {
  free(l->principal);
  json_decref(l->uris);
  json_decref(l->tasks);
  free(l);
}

/* The client cancelled the stream (or its session, connection or the server went): the
 * request ends with nothing sent (srv_request_finish drops it). */
static void listener_cancelled(void *data) {
  srv_listener_t *l = data;
  srv_request_t *r = l->r;
  listener_unlink(l);
  listener_free(l);
  srv_request_finish(r, json_object());
}

/* The params' _meta with the subscription's id, for a notification on l's stream. */
static json_t *tagged_params(const srv_listener_t *l, json_t *params) {
  if (!params) params = json_object();
  json_object_set_new(params, "_meta", json_pack("{s:O}", MCP_META_SUBSCRIPTION, l->r->id));
  return params;
}

static void listener_send(srv_listener_t *l, const char *method, json_t *params) {
  l->active_ms = cm_now_ms();
  json_t *n = srv_jsonrpc_notification(method, tagged_params(l, params));
  srv_send_json(l->r->sink, n, TR_SEND_DEFAULT);
  json_decref(n);
}

static size_t principal_listeners(const srv_server_t *s, const char *principal) {
  size_t n = 0;
  for (const srv_listener_t *l = s->listeners; l; l = l->next)
    if (strcmp(l->principal, principal) == 0) n++;
  return n;
}

/* Checks the filter's shape; NULL when it is well formed, else why not. */
static const char *filter_problem(json_t *filter) {
  if (!json_is_object(filter))
    return "subscriptions/listen needs \"notifications\", an object (the filter)";
  for (size_t i = 0; i < CM_ARRAY_SIZE(list_kinds); i++) {
    json_t *v = json_object_get(filter, list_kinds[i].member);
    if (v && !json_is_boolean(v)) return "the filter's list-changed members must be booleans";
  }
  json_t *tasks = json_object_get(filter, "taskIds");
  if (tasks) {
    if (!json_is_array(tasks)) return "\"taskIds\" must be an array of task ids";
    if (json_array_size(tasks) > SRV_MAX_LISTEN_TASKS)
      return "\"taskIds\" names more than 64 tasks";
    size_t i;
    json_t *t;
    json_array_foreach(tasks, i, t) {
      if (!json_is_string(t) || json_string_length(t) == 0 ||
          json_string_length(t) > SRV_MAX_LISTEN_TASK_ID_BYTES ||
          strlen(json_string_value(t)) != json_string_length(t))
        return "\"taskIds\" must hold task ids (strings of 1 to 128 bytes)";
    }
  }
  json_t *uris = json_object_get(filter, "resourceSubscriptions");
  if (!uris) return NULL;
  if (!json_is_array(uris)) return "\"resourceSubscriptions\" must be an array of URIs";
  if (json_array_size(uris) > SRV_MAX_LISTEN_URIS)
    return "\"resourceSubscriptions\" names more than 64 URIs";
  size_t i;
  json_t *u;
  json_array_foreach(uris, i, u) {
    if (!json_is_string(u) || json_string_length(u) == 0 ||
        json_string_length(u) > SRV_MAX_LISTEN_URI_BYTES ||
        strlen(json_string_value(u)) != json_string_length(u))
      return "\"resourceSubscriptions\" must hold URIs (strings of 1 to 2048 bytes)";
  }
  return NULL;
}

static bool has_string(json_t *array, const char *value) {
  size_t i;
  json_t *v;
  json_array_foreach(array, i, v) if (strcmp(json_string_value(v), value) == 0) return true;
  return false;
}

void srv_listen_task_changed(srv_server_t *s, const char *principal, const char *task_id,
                             json_t *detailed) {
  srv_listener_t *next;
  for (srv_listener_t *l = s->listeners; l; l = next) {
    next = l->next;
    if (!l->tasks || strcmp(principal, l->principal) != 0 || !has_string(l->tasks, task_id))
      continue;
    listener_send(l, "notifications/tasks", json_copy(detailed));
  }
}

void srv_listen_start(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                      const srv_modern_t *mm, json_t *capabilities) {
  srv_server_t *s = ss->server;
  json_t *filter = json_is_object(params) ? json_object_get(params, "notifications") : NULL;
  const char *why = filter_problem(filter);
  if (why) {
    cleanup_free char *msg = xasprintf("Invalid params: %s", why);
    srv_reply_error(sink, NULL, id, JSONRPC_INVALID_PARAMS, msg);
    return;
  }
  json_t *task_ids = json_object_get(filter, "taskIds");
  if (json_array_size(task_ids) > 0 && !srv_tasks_declared(mm)) {
    srv_tasks_reply_missing(sink, id, "subscriptions/listen's \"taskIds\"");
    return;
  }
  /* At the principal's cap the new stream wins: a client that opens one per connection and
   * never closes them (Claude Code) would otherwise lock its newest sessions out. */
  bool local = strcmp(ss->principal, SRV_PRINCIPAL_LOCAL) == 0 ||
               strcmp(ss->principal, SRV_PRINCIPAL_STDIO) == 0;
  uint64_t most = local ? s->cfg->max_listens_local : s->cfg->max_listens_per_principal;
  while (principal_listeners(s, ss->principal) >= most) {
    /* (newest first: on a tie the later one in the list, the older, wins) */
    srv_listener_t *oldest = NULL;
    for (srv_listener_t *o = s->listeners; o; o = o->next)
      if (strcmp(o->principal, ss->principal) == 0 &&
          (!oldest || o->active_ms <= oldest->active_ms))
        oldest = o;
    if (!oldest) break;
    cm_info(
        "subscriptions/listen: %s has %llu streams open; its oldest idle one ends for a new one",
        ss->principal, (unsigned long long)most);
    listener_end(oldest);
  }
  if (s->n_listeners >= SRV_MAX_LISTENS) {
    cleanup_free char *msg = xasprintf(
        "Invalid Request: too many subscriptions/listen streams open (%d in all): close one "
        "first",
        SRV_MAX_LISTENS);
    srv_reply_error(sink, NULL, id, JSONRPC_INVALID_REQUEST, msg);
    return;
  }
  srv_listener_t *l = xcalloc(1, sizeof *l);
  l->principal = xstrdup(ss->principal);
  l->active_ms = cm_now_ms();
  /* What is agreed: what was asked for and the capabilities say the server sends. */
  json_t *agreed = json_object();
  for (size_t i = 0; i < CM_ARRAY_SIZE(list_kinds); i++) {
    json_t *cap = json_object_get(capabilities, list_kinds[i].capability);
    if (!json_is_true(json_object_get(filter, list_kinds[i].member)) ||
        !json_is_true(json_object_get(cap, "listChanged")))
      continue;
    l->kinds |= list_kinds[i].kind;
    json_object_set_new(agreed, list_kinds[i].member, json_true());
  }
  json_t *uris = json_object_get(filter, "resourceSubscriptions");
  json_t *resources = json_object_get(capabilities, "resources");
  if (json_array_size(uris) > 0 && json_is_true(json_object_get(resources, "subscribe"))) {
    l->uris = json_deep_copy(uris);
    json_object_set(agreed, "resourceSubscriptions", l->uris);
  }
  /* The tasks that are the principal's, each once, with their state now (sent after the
   * acknowledgement). */
  json_t *snapshots = NULL;
  if (task_ids) {
    l->tasks = json_array();
    snapshots = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(task_ids, i, t) {
      const char *tid = json_string_value(t);
      if (has_string(l->tasks, tid)) continue;
      json_t *d = srv_tasks_detailed(s, ss->principal, tid);
      if (!d) continue;
      json_array_append(l->tasks, t);
      json_array_append_new(snapshots, d);
    }
    json_object_set(agreed, "taskIds", l->tasks);
  }
  srv_request_t *r = srv_request_new(ss, id, sink, NULL, mm);
  r->method = xstrdup("subscriptions/listen");
  l->r = r;
  l->next = s->listeners;
  s->listeners = l;
  s->n_listeners++;
  srv_request_on_cancel(r, listener_cancelled, l);
  listener_send(l, "notifications/subscriptions/acknowledged",
                json_pack("{s:o}", "notifications", agreed));
  size_t i;
  json_t *d;
  json_array_foreach(snapshots, i, d) listener_send(l, "notifications/tasks", json_incref(d));
  json_decref(snapshots);
  /* A stream opened while the server drains ends at once, as those open when it began did
   * (srv_listen_end_all): nothing would end it gracefully later. */
  if (s->draining) listener_end(l);
}

void srv_listen_list_changed(srv_server_t *s, unsigned kind, const char *principal) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(list_kinds); i++) {
    if (list_kinds[i].kind != kind) continue;
    srv_listener_t *next;
    for (srv_listener_t *l = s->listeners; l; l = next) {
      next = l->next; /* (a send that finds its stream gone must not cost the walk) */
      if ((l->kinds & kind) && (!principal || strcmp(principal, l->principal) == 0))
        listener_send(l, list_kinds[i].method, NULL);
    }
  }
}

void srv_listen_resource_updated(srv_server_t *s, const char *uri, const char *principal) {
  srv_listener_t *next;
  for (srv_listener_t *l = s->listeners; l; l = next) {
    next = l->next;
    if (!l->uris || (principal && strcmp(principal, l->principal) != 0)) continue;
    size_t i;
    json_t *u;
    json_array_foreach(l->uris, i, u) {
      if (strcmp(json_string_value(u), uri) != 0) continue;
      listener_send(l, "notifications/resources/updated", json_pack("{s:s}", "uri", uri));
      break;
    }
  }
}

/* Ends l's stream with its result (the revision's SubscriptionsListenResult: the stream's
 * last message); l is unlinked and freed. */
static void listener_end(srv_listener_t *l) {
  srv_request_t *r = l->r;
  listener_unlink(l);
  srv_request_on_cancel(r, NULL, NULL);
  json_t *result = json_pack("{s:{s:O}}", "_meta", MCP_META_SUBSCRIPTION, r->id);
  listener_free(l);
  srv_request_finish(r, result);
}

void srv_listen_end_all(srv_server_t *s) {
  while (s->listeners) listener_end(s->listeners);
}
