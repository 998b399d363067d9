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
 * finished environment out of it (copy.c), and the space is dropped.
 *
 * The key is a SHA-256 over the interpreter identity, the normalised sorted requirements,
 * the installer and the index settings.  A build is renamed into place only when it
 * succeeded, so a crash, a kill or a full disk never leaves an environment that is used.
 * Environments and wheels together are kept within --max-cache-bytes, least recently used
 * first out; an environment in use (its lock held shared, by any server) never goes.
 *
 * Files: store.c (the store, start-up sweeps), key.c (the key), manifest.c (manifests and
 * handles), build.c (a build's steps, waiters), copy.c (the copy out of a build's space, in a
 * child), installer.c (installer runs: index settings, network, sandbox), space.c (a build's
 * bounded space, removals in a child), evict.c (eviction, sizes), warm.c (the warm-up),
 * resolve.c (dry-run resolutions), wheelhouse.c (the wheelhouse).
 *
 * May use: interp/ (the interpreter a set is built for), sandbox/ (builds run there), egress/
 * (the builds' network), pystd/ (PEP 508/440 for keys and pins), common/. */
#ifndef MPS_ENVSTORE_ENVSTORE_H
#define MPS_ENVSTORE_ENVSTORE_H

#include <jansson.h>

#include "common/cm.h"
#include "egress/egress.h"
#include "interp/interp.h"
#include "sandbox/sbx.h"

typedef struct env_store env_store_t;

/* A ready environment, held for the duration of a run (env_release). */
typedef struct env_handle {
  char *key;
  char *host_dir;     /* <state>/envs/<key> */
  char *python;       /* the interpreter as the sandbox sees it (/env/bin/python or host path) */
  char *mount_target; /* where the sandbox sees host_dir ("/env"), or NULL when paths are not mapped
                       */
  bool cached;        /* a hit: nothing was built for this call */
  json_t *packages;   /* {"name": "version"} as installed */
  int lock_fd;        /* shared flock on <key>.lock while in use */
} env_handle_t;

/* env, or NULL and error (valid only during the call): its message is one a model can act on
 * (the installer's own words); its kind says what failed (CM_ERR_LIMIT: a bound of the build,
 * e.g. --build-timeout or --max-build-bytes; CM_ERR_UNAVAILABLE: the installer, or uv is
 * missing; CM_ERR_IO: the store's disk). */
typedef void (*env_ready_cb)(void *data, env_handle_t *env, const cm_error_t *error);
typedef void (*env_progress_cb)(void *data, const char *message, size_t len);

/* What the store is told (the server fills it from its flags).  Strings and vectors are
 * borrowed: they must outlive the store. */
typedef struct env_options {
  const char *installer;            /* --installer auto|uv|pip */
  const char *uv_path;              /* --uv-path */
  const char *index_url;            /* --index-url, or NULL */
  char *const *extra_index_urls;    /* --extra-index-url (NULL-terminated), or NULL */
  char *const *find_links;          /* --find-links: directories or URLs, or NULL */
  char *const *build_network_allow; /* --build-network-allow rules (valid), or NULL */
  bool offline;                     /* --offline */
  uint64_t max_cache_bytes;         /* --max-cache-bytes: environments and wheels kept */
  /* --max-cache-bytes-per-token: environments one principal's builds may keep (0 = no cap) */
  uint64_t max_cache_bytes_per_owner;
  uint64_t env_max_age_ms;   /* --env-max-age-days: unpinned sets re-resolved after */
  uint64_t build_timeout_ms; /* --build-timeout: one step of a build */
  uint64_t max_build_bytes;  /* --max-build-bytes: all one build may write */
  /* An installer run's limits start from a run's (--kill-grace-seconds, --memory-limit,
   * --max-processes, --max-open-files, --tmp-size) and are raised to what installers need. */
  uint64_t kill_grace_ms, memory_bytes, max_processes, open_files, tmp_bytes;
  /* Dry-run resolutions at once: in all (--max-concurrent) and per owner
   * (--max-token-running; 0 = no cap). */
  uint64_t max_resolutions, max_resolutions_per_owner;
} env_options_t;

/* runs_dir: this server's own work directory (where build spaces go); backend: the sandbox
 * builds run in. */
env_store_t *env_store_new(cm_loop_t *loop, const env_options_t *opts, const char *state_dir,
                           const char *runs_dir, sbx_backend_t *backend);
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
                       const char *uv_config, const char *owner, env_ready_cb cb,
                       env_progress_cb progress, void *data);
void env_store_cancel(env_store_t *s, void *handle);
void env_release(env_handle_t *env);
/* A copy of the handle's description that holds no lock: the environment may be evicted
 * or rebuilt meanwhile (compare the directory's identity before relying on it). */
env_handle_t *env_handle_copy_unlocked(const env_handle_t *env);
/* Once the sandbox is probed: where the backend runs an image's programs (docker, podman)
 * and the image has no uv, --installer auto builds with the image's pip instead of the
 * host's uv (which could not run there). */
void env_store_backend_probed(env_store_t *s);
/* The installer in use ("pip" or "uv <path>") for check_environment. */
const char *env_store_installer(env_store_t *s);
/* Whether py has no pip of its own where builds need it (pip is the installer: no uv, and the
 * host's interpreter runs, not an image's): a look below its prefix for the usual places
 * (site-packages, Debian's dist-packages), for check_environment to say so. */
bool env_store_pip_missing(env_store_t *s, const py_interp_t *py);
/* Number of finished environments, and the bytes of the store (environments and the
 * wheelhouse: what --max-cache-bytes bounds). */
void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes);
/* What the store did since it started (/metrics). */
typedef struct env_counters {
  uint64_t hits;          /* calls answered with an environment that was there */
  uint64_t joined;        /* calls that joined a build in progress */
  uint64_t builds;        /* builds started */
  uint64_t builds_failed; /* of them, ended without an environment */
  uint64_t build_ms;      /* their time, start to end */
  uint64_t evictions;     /* environments removed to make room (or too old) */
  uint64_t evicted_bytes;
  uint64_t warm_failed; /* package cache warm-ups that did not complete */
} env_counters_t;
void env_store_counters(env_store_t *s, env_counters_t *out);
/* The environments built for `owner` (a principal's name; NULL: the server's own) that
 * the store keeps, and their bytes: what eviction charges to it. */
void env_store_usage(env_store_t *s, const char *owner, size_t *count, uint64_t *bytes);
/* The same environments, most recently used first: [{key, bytes, last_used (Unix seconds),
 * packages? (the manifest's), python? (its version)}] (a new reference). */
json_t *env_store_list(env_store_t *s, const char *owner);
/* Removes one of owner's environments now (the next call that needs it builds it again).
 * CM_ERR_NOT_FOUND when owner has none by that key (another's included), CM_ERR_UNAVAILABLE
 * while it is in use or being built (nothing is removed then). */
int env_store_evict_owned(env_store_t *s, const char *owner, const char *key, cm_error_t *err);
/* Starts warming the wheelhouse from profiles/warmup.txt in the background (never delays
 * anything; failures are logged): `pip download --only-binary=:all:` in a sandbox of its
 * own, then the server copies the wheels into the wheelhouse. */
void env_store_warm(env_store_t *s, const py_interp_t *py, const char *warmup_file);
/* A dry-run resolution (pip install --dry-run --report) with the server's index settings,
 * for validate_script: cb gets {"name": "version"} of everything that would be installed,
 * or NULL and an error (valid only during the call; CM_ERR_LIMIT: it took too long or hit a
 * bound of its space; CM_ERR_UNAVAILABLE: the installer failed, in its own words).  It runs package
 * code, like a build, in a space of its own; at most max_resolutions run at once, and
 * max_resolutions_per_owner per principal (owner).  Returns NULL (and never calls cb) if it could
 * not start, with err saying why (CM_ERR_LIMIT: at a cap). */
typedef void (*env_resolved_cb)(void *data, json_t *resolved, const cm_error_t *error);
void *env_store_resolve(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                        const char *owner, env_resolved_cb cb, void *data, cm_error_t *err);
void env_store_cancel_resolve(env_store_t *s, void *handle);
void env_store_free(env_store_t *s);

/* Builds' network: on a backend that can (sbx_backend_can_egress), every installer run gets
 * a network namespace of its own whose only way out is the egress proxy, allowed exactly the
 * hosts of the index settings (--index-url, --extra-index-url, --find-links URLs, or
 * PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / UV_INDEX_URL / UV_EXTRA_INDEX_URL / PIP_FIND_LINKS
 * from the server's environment; pypi.org and files.pythonhosted.org without an index) plus
 * --build-network-allow, minus the server's deny rules.  An index URL with credentials
 * reaches the installer as http://127.0.1.<n+1>:<port>/<its path> (an origin of its own on
 * the sandbox's forwarder), which the proxy maps to the real index adding the credentials
 * itself: they never enter the sandbox.  The server gives the store its proxy (made at the
 * first use) and its deny rules; without them (or on a backend that cannot) builds use the
 * backend's own network.  Call once, before the first build; net is copied, its policy
 * borrowed. */
typedef struct env_network {
  eg_proxy_t *(*proxy)(void *data, cm_error_t *err); /* NULL (and err) when it cannot start */
  const eg_policy_t *deny;
  void *data;
} env_network_t;
void env_store_set_network(env_store_t *s, const env_network_t *net);

#endif
