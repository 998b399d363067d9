/* interp/ internals shared by its files: the registry and its candidates. */
#ifndef MPS_INTERP_INTERNAL_H
#define MPS_INTERP_INTERNAL_H

#include <jansson.h>

#include "interp/interp.h"

#define PY_PROBE_MAX_OUTPUT 16384
#define PY_PROBE_TIMEOUT_MS 20000
#define PY_MAX_CANDIDATES 256
#define PY_PROBES_AT_ONCE 2
#define PY_CACHE_FILE "interpreters.json"
#define PY_CACHE_MAX_BYTES (4u << 20)

typedef struct py_waiter {
  py_ready_cb cb;
  void *data;
  struct py_waiter *next;
} py_waiter_t;

typedef struct py_candidate {
  py_interp_t info;
  char *real;       /* realpath of the candidate file */
  int64_t mtime_ns; /* of the real file, for the cache */
  int64_t size;
  sbx_run_t *probe;
  cm_buf_t out;
  py_registry_t *reg;
} py_candidate_t;

struct py_registry {
  cm_loop_t *loop;
  py_options_t opts; /* the strings are the caller's */
  char *cache_path;
  sbx_backend_t *host; /* the none backend: probes run trusted host binaries */
  py_candidate_t *cands[PY_MAX_CANDIDATES];
  size_t n_cands;
  size_t next_probe, probes_running;
  py_interp_t **list; /* usable and broken, deduplicated, newest first */
  size_t n_list;
  py_interp_t *def;
  cm_error_t def_error; /* why there is no default (kind CM_ERR_NONE until known) */
  bool ready, flush_scheduled;
  uint64_t downloads_ok, downloads_failed;
  bool cache_dirty; /* something was probed, or the cache lists other files: rewrite it */
  char *uv_dir;     /* where uv installs interpreters */
  /* A download in progress (uv python install): at most one at a time. */
  sbx_run_t *download;
  cm_headtail_t download_out;
  py_download_cb download_cb;
  void *download_data;
  bool rescanning;
  py_waiter_t *waiters;
};

/* discover.c: every candidate on the machine (PATH, pyenv, uv, --python-dir, --python), and
 * DIR/<version>/bin as pyenv and uv lay out their installs. */
void py_discover(py_registry_t *r);
void py_scan_installs(py_registry_t *r, const char *dir, const char *source);
/* cache.c: identities from and into <state>/interpreters.json, keyed by path, size, mtime. */
void py_cache_load(py_registry_t *r);
void py_cache_save(py_registry_t *r);
/* An identity from the probe's (or the cache's) JSON; false when it lacks a field. */
bool py_interp_fill(py_interp_t *p, json_t *info);
/* registry.c: identifies the next candidates (PY_PROBES_AT_ONCE at a time), then finishes. */
void py_probe_next(py_registry_t *r);

#endif
