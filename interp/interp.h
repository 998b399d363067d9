/* interp/: the Python interpreters of the machine.  Discovery (PATH, pyenv, uv,
 * --python-dir, --python), identification (each asked once, in the background, on the
 * none backend: trusted host binaries), the identity cache in the state directory, the
 * choice of an interpreter for a call, downloads with uv, and the PEP 508 marker
 * environment of an interpreter.
 *
 * May use: sandbox/ (to run the probes and downloads), pystd/ (PEP 440 versions, PEP 508
 * markers), common/. */
#ifndef MPS_INTERP_INTERP_H
#define MPS_INTERP_INTERP_H

#include "common/cm.h"
#include "pystd/pystd.h"
#include "sandbox/sbx.h"

typedef struct py_interp {
  char *path;           /* the executable as found (the first name it was found under) */
  char *source;         /* "--python", "PATH", "pyenv", "uv", "--python-dir" */
  char *executable;     /* sys.executable, resolved */
  char *version;        /* "3.11.7" (platform.python_version()) */
  char *implementation; /* "cpython", "pypy" */
  char *prefix;         /* sys.base_prefix, resolved: what a sandbox must bind */
  bool free_threaded;
  bool prerelease; /* alpha, beta, rc or dev */
  bool ok;         /* identified and usable */
  char *error;     /* why not, when !ok */
  bool is_default;
} py_interp_t;

/* What the registry is told (the server fills it from its flags).  The strings and the
 * vector are borrowed: they must outlive the registry. */
typedef struct py_options {
  const char *python;       /* --python: the default interpreter (an executable), or NULL */
  char *const *python_dirs; /* --python-dir: more directories to scan (NULL-terminated), or NULL */
  const char *python_version;   /* --python-version: the default's version request, or NULL */
  bool allow_downloads;         /* --allow-python-downloads: uv installs a missing version */
  const char *uv_path;          /* --uv-path */
  uint64_t download_timeout_ms; /* --build-timeout: how long one `uv python install` may take */
} py_options_t;

typedef struct py_registry py_registry_t;
/* interp: the default interpreter; or NULL, and error says why there is none (the
 * registry's: valid only during the call; CM_ERR_NOT_FOUND: --python or --python-version
 * names nothing found; CM_ERR_UNAVAILABLE: it is broken, or no interpreter works). */
typedef void (*py_ready_cb)(void *data, py_interp_t *interp, const cm_error_t *error);

py_registry_t *py_registry_new(cm_loop_t *loop, const py_options_t *opts, const char *state_dir);
/* Discovers interpreters (PATH, pyenv, uv, --python-dir, --python) and identifies the new
 * or changed ones in the background; identities are cached in the state directory keyed
 * by path, size and mtime, so a warm start runs none of them. */
void py_registry_start(py_registry_t *r);
/* Calls cb once discovery is complete, never from inside this call (from the loop, right
 * after the current callback, if it already is).  Returns a handle that
 * py_registry_cancel_wait() can cancel before cb runs. */
void *py_registry_when_ready(py_registry_t *r, py_ready_cb cb, void *data);
void py_registry_cancel_wait(py_registry_t *r, void *handle);
py_interp_t *py_registry_default(py_registry_t *r); /* NULL until ready or if none */
/* Every interpreter found (broken ones too), newest first. */
py_interp_t *const *py_registry_list(py_registry_t *r, size_t *count);
/* Chooses the interpreter for a call: `request` (the call's python_version: "3.12",
 * "3.12.1", "3.13t", "pypy3.10", ">=3.11,<3.13" or a discovered path) first, else the
 * script's `requires_python`, else the default; the newest match wins; a request must
 * also satisfy requires_python.  On failure returns NULL with err set, its message listing
 * what is available, its kind: CM_ERR_NOT_FOUND when no interpreter installed here matches
 * (one might be downloaded), CM_ERR_INVALID for a malformed request or requires-python, or
 * a request whose match does not satisfy requires-python, and for no default the default's
 * own error (CM_ERR_NOT_FOUND, CM_ERR_UNAVAILABLE). */
py_interp_t *py_registry_select(py_registry_t *r, const char *request, const char *requires_python,
                                cm_error_t *err);
/* Downloads (--allow-python-downloads with uv): `uv python install <request>`, then the new
 * interpreters are identified and join the list.  cb gets NULL, or an error (valid only
 * during the call; CM_ERR_UNAVAILABLE: uv failed, with its words).  One at a time. */
typedef void (*py_download_cb)(void *data, const cm_error_t *error);
bool py_registry_can_download(py_registry_t *r);
int py_registry_download(py_registry_t *r, const char *request, py_download_cb cb, void *data,
                         cm_error_t *err);
/* Downloads since start-up that installed an interpreter, and that failed (/metrics). */
void py_registry_download_counts(py_registry_t *r, uint64_t *ok, uint64_t *failed);
/* Forgets the callback of the download in progress (it goes on for the cache). */
void py_registry_cancel_download(py_registry_t *r);
/* "3.8.18, 3.9.18, 3.11.7 (default)" (heap). */
char *py_registry_describe_available(py_registry_t *r);
void py_registry_free(py_registry_t *r);

/* The PEP 508 marker environment of an interpreter on this machine: env points into the
 * struct (its own strings) and into py, which must outlive it. */
typedef struct py_marker_env {
  pep508_env_t env;
  char machine[80], release[80], version[80], python_version[80];
} py_marker_env_t;
void py_marker_env(const py_interp_t *py, py_marker_env_t *out);

#endif
