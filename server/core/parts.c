/* The server's parts: made by the assembly (server/server.c), held here, read through the
 * accessors (the struct is the core's own: core-internal.h). */
#include <time.h>

#include "server/core/core-internal.h"

srv_server_t *srv_core_new(const srv_parts_t *parts) {
  srv_server_t *s = xcalloc(1, sizeof *s);
  s->loop = parts->loop;
  s->cfg = parts->cfg;
  s->backend = parts->backend;
  s->host = parts->host;
  s->cgroups = parts->cgroups;
  s->pythons = parts->pythons;
  s->envs = parts->envs;
  s->network = parts->network;
  s->artifacts = parts->artifacts;
  s->audit = parts->audit;
  s->state_dir = parts->state_dir;
  s->runs_dir = parts->runs_dir;
  s->tools = parts->tools;
  s->n_tools = parts->n_tools;
  s->app = parts->app;
  s->owner = parts->owner;
  s->counters.started_ms = (uint64_t)time(NULL) * 1000;
  return s;
}

void srv_core_free(srv_server_t *s) {
  for (size_t era = 0; era < 2; era++)
    for (size_t apps = 0; apps < 2; apps++) json_decref(s->tools_list[era][apps]);
  free(s);
}

cm_loop_t *srv_server_loop(srv_server_t *s) {
  return s->loop;
}

const srv_config_t *srv_server_config(srv_server_t *s) {
  return s->cfg;
}

sbx_backend_t *srv_server_backend_kind(srv_server_t *s) {
  return s->backend;
}

sbx_backend_t *srv_server_host_backend(srv_server_t *s) {
  return s->host;
}

sbx_cgroups_t *srv_server_cgroups(srv_server_t *s) {
  return s->cgroups;
}

py_registry_t *srv_server_pythons(srv_server_t *s) {
  return s->pythons;
}

env_store_t *srv_server_envs(srv_server_t *s) {
  return s->envs;
}

art_store_t *srv_server_artifacts(srv_server_t *s) {
  return s->artifacts;
}

struct srv_network *srv_server_network(srv_server_t *s) {
  return s->network;
}

const char *srv_server_state_dir(srv_server_t *s) {
  return s->state_dir;
}

const char *srv_server_runs_dir(srv_server_t *s) {
  return s->runs_dir;
}

srv_audit_t *srv_server_audit(srv_server_t *s) {
  return s->audit;
}

const srv_counters_t *srv_server_counters(srv_server_t *s) {
  return &s->counters;
}

void *srv_server_owner(srv_server_t *s) {
  return s->owner;
}

void srv_server_set_exec(srv_server_t *s, struct exec_state *x) {
  s->exec = x;
}

struct exec_state *srv_server_exec(srv_server_t *s) {
  return s->exec;
}

void srv_server_set_http(srv_server_t *s, tr_http_t *h) {
  s->http = h;
}

tr_http_t *srv_server_http(srv_server_t *s) {
  return s->http;
}

void srv_core_drain(srv_server_t *s) {
  s->draining = true;
  srv_listen_end_all(s);
}
