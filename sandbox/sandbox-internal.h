#ifndef MPS_SANDBOX_INTERNAL_H
#define MPS_SANDBOX_INTERNAL_H

#include "sandbox/sbx.h"

/* Checks every backend makes on a spec: an absolute command, an existing work directory
 * (not a symlink), environment entries of the form NAME=value.  The caller has already
 * checked that spec->workdir is a clean absolute path by its own rules. */
int sbx_spec_check_common(const sbx_spec_t *spec, cm_error_t *err);

/* A deep copy of a NULL-terminated string vector. */
char **sbx_strv_copy(char *const *v);

#ifdef MPS_HAVE_BWRAP
extern const sbx_backend_ops_t sbx_bwrap_ops;

/* Overrides where the bwrap backend finds bubblewrap and the drop helper (NULL keeps the
 * default: $MPS_BWRAP or `bwrap` in PATH; $MPS_SANDBOX_DROP or `mps-sandbox-drop` next to
 * the running executable).  Call before sbx_backend_probe(); b must be a bwrap backend. */
void sbx_bwrap_set_paths(sbx_backend_t *b, const char *bwrap_path, const char *drop_path);
#endif

/* seccomp.c: the filter bubblewrap loads before it execs the drop helper.
 * sbx_seccomp_fd() returns a new sealed, close-on-exec memfd at offset 0 holding the BPF
 * program (built once per process, then cached); the caller owns it.
 * sbx_seccomp_build() builds the program afresh into a heap buffer the caller frees. */
int sbx_seccomp_fd(cm_error_t *err);
int sbx_seccomp_build(void **bpf, size_t *len, cm_error_t *err);

#ifdef MPS_HAVE_DOCKER
extern const sbx_backend_ops_t sbx_docker_ops;
#endif

#endif
