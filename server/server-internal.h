/* server/ internals shared by its files: the assembly's own state, beside the core's server
 * (srv_server_owner() gives it). */
#ifndef MPS_SERVER_INTERNAL_H
#define MPS_SERVER_INTERNAL_H

#include "server/server.h"

typedef struct srv_assembly {
  srv_server_t *server;
  /* Owned here; the core borrows them (srv_parts_t). */
  char *state_dir;
  char *runs_dir; /* work/srv-XXXXXX, locked (runs_lock) while we live */
  int runs_lock;
  /* --warm-cache: waiting for the default interpreter, then for the probe. */
  void *warm_wait;
  void *warm_probe_wait;
  py_interp_t *warm_python;
  /* metrics.c: when /metrics last listed the environments, and what it found. */
  uint64_t metrics_env_at;
  size_t metrics_envs;
  uint64_t metrics_env_bytes;
} srv_assembly_t;

static inline srv_assembly_t *srv_assembly(srv_server_t *s) {
  return srv_server_owner(s);
}

#endif
