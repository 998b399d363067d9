#ifndef MPS_SANDBOX_INTERNAL_H
#define MPS_SANDBOX_INTERNAL_H

#include "sandbox/sbx.h"

/* A deep copy of a NULL-terminated string vector. */
char **sbx_strv_copy(char *const *v);

#ifdef MPS_HAVE_BWRAP
extern const sbx_backend_ops_t sbx_bwrap_ops;
#endif
#ifdef MPS_HAVE_DOCKER
extern const sbx_backend_ops_t sbx_docker_ops;
#endif

#endif
