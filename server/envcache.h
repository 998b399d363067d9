/* The environment store: requirement sets resolved into cached, immutable virtual
 * environments, built once (in the sandbox) and mounted read-only into runs.
 *
 * Layout under <state>/envs/:
 *   <key>/                 a finished environment (a venv) with mps-manifest.json, written
 *                          by the server alone (a copy of what the build made, see below)
 *   <key>.lock             flock: exclusive while building or evicting, shared while a run uses it
 *   .staging-<key>-<pid>-<n>/   a copy in progress (never used; removed if left over)
 *   .old-*, .evicted-*, .trash-*   trees on their way out (removed in the background)
 * <state>/downloads/wheels/ is the wheelhouse: binary wheels the warm-up downloaded, copied
 * there by the server, mounted read-only into builds (--find-links); nothing else lives in
 * downloads/.
 *
 * A build runs in the sandbox as a uid of its own (one for all its steps) in a cgroup of
 * its own, and writes only its own space in this server's work directory: the environment
 * (/env), a private download cache (/cache), /tmp and its cwd, on one tmpfs capped at
 * --max-build-bytes when the server is root (each file capped at that size otherwise).
 * The server never works in that space on its event loop: a forked child copies the
 * finished environment out of it (see envcache.c), and the space is dropped.
 *
 * The key is a SHA-256 over the interpreter identity, the normalised sorted requirements,
 * the installer and the index settings.  A build is renamed into place only when it
 * succeeded, so a crash, a kill or a full disk never leaves an environment that is used.
 * Environments and wheels together are kept within --max-cache-bytes, least recently used
 * first out; an environment in use (its lock held shared, by any server) never goes. */
#ifndef MPS_SERVER_ENVCACHE_H
#define MPS_SERVER_ENVCACHE_H

#include "server/script.h"

typedef struct env_store env_store_t; /* struct env_store, also named in srv.h */

/* A ready environment, held for the duration of a run (env_release). */
typedef struct env_handle {
  char *key;
  char *host_dir;     /* <state>/envs/<key> */
  char *python;       /* the interpreter as the sandbox sees it (/env/bin/python or host path) */
  char *mount_target; /* where the sandbox sees host_dir ("/env"), or NULL when paths are not mapped */
  bool cached;        /* a hit: nothing was built for this call */
  json_t *packages;   /* {"name": "version"} as installed */
  int lock_fd;        /* shared flock on <key>.lock while in use */
} env_handle_t;

typedef void (*env_ready_cb)(void *data, env_handle_t *env, const char *error);
typedef void (*env_progress_cb)(void *data, const char *message, size_t len);

/* runs_dir: this server's own work directory (srv_workdir_claim), where build spaces go. */
env_store_t *env_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir, const char *runs_dir,
                           sbx_backend_t *backend);
/* Where builds, warm-ups and resolutions make their work directories (default
 * <state>/work): the server's own directory there, which the next server removes even after
 * a crash. */
void env_store_set_work_dir(env_store_t *s, const char *dir);
/* Finds or builds the environment for (py, requirements).  uv_config is the script's
 * [tool.uv] table as TOML text (part of the key; handed to uv with --config-file), or NULL.
 * owner is the principal asking (a bearer token's name, or NULL): recorded as the
 * manifest's built_by when this call starts the build.  cb runs exactly once, always from
 * the loop and never from inside this call, whatever the outcome (every answer is queued
 * and delivered by a deferred call), with the environment or an error message a model can
 * act on (the installer's own words).  A hit holds the environment's lock shared before
 * its manifest is trusted: one that cannot be locked (another server is evicting or
 * rebuilding it) is a miss.  progress may be NULL.  Returns a handle (never NULL) for
 * env_store_cancel (which stops the callbacks; a shared build goes on for the others),
 * valid until cb has run. */
void *env_store_ensure(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                       const char *uv_config, const char *owner, env_ready_cb cb, env_progress_cb progress,
                       void *data);
void env_store_cancel(env_store_t *s, void *handle);
void env_release(env_handle_t *env);
/* A copy of the handle's description that holds no lock: the environment may be evicted
 * or rebuilt meanwhile (compare the directory's identity before relying on it). */
env_handle_t *env_handle_copy_unlocked(const env_handle_t *env);
/* The installer in use ("pip" or "uv <path>") for check_environment. */
const char *env_store_installer(env_store_t *s);
/* Number of finished environments, and the bytes of the store (environments and the
 * wheelhouse: what --max-cache-bytes bounds). */
void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes);
/* Starts warming the wheelhouse from profiles/warmup.txt in the background (never delays
 * anything; failures are logged): `pip download --only-binary=:all:` in a sandbox of its
 * own, then the server copies the wheels into the wheelhouse. */
void env_store_warm(env_store_t *s, const py_interp_t *py, const char *warmup_file);
/* A dry-run resolution (pip install --dry-run --report) with the server's index settings,
 * for validate_script: cb gets {"name": "version"} of everything that would be installed,
 * or an error.  It runs package code, like a build, in a space of its own; at most
 * --max-concurrent run at once, and per principal (owner) --max-token-running.  Returns NULL (and never calls cb) if it could not start, with err
 * saying why (CM_ERR_LIMIT: at a cap). */
typedef void (*env_resolved_cb)(void *data, json_t *resolved, const char *error);
void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        const char *owner, env_resolved_cb cb, void *data, cm_error_t *err);
void env_store_cancel_resolve(env_store_t *s, void *handle);
void env_store_free(env_store_t *s);

/* Builds' network (server/network.h): on a backend that can, every installer run gets a
 * network namespace of its own whose only way out is the egress proxy, allowed exactly the
 * hosts of the index settings (--index-url, --extra-index-url, --find-links URLs, or
 * PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / UV_INDEX_URL / UV_EXTRA_INDEX_URL / PIP_FIND_LINKS
 * from the server's environment; pypi.org and files.pythonhosted.org without an index) plus
 * --build-network-allow, minus --network-deny.  An index URL with credentials reaches the
 * installer as http://127.0.1.<n+1>:<port>/<its path> (an origin of its own on the sandbox's
 * forwarder), which the proxy maps to the real index adding the credentials itself: they
 * never enter the sandbox.  Call once, before the
 * first build. */
struct srv_network;
void env_store_set_network(env_store_t *s, struct srv_network *network);

#endif
