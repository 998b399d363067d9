#ifndef MPS_SERVER_SCRIPT_H
#define MPS_SERVER_SCRIPT_H

#include "pystd/pystd.h"
#include "server/srv.h"

typedef struct srv_script {
  pep723_metadata_t meta;        /* requires_python, the tool table, the block's lines */
  char **requirements;           /* merged block + argument, as written (NULL-terminated) */
  size_t n_requirements;
  pep508_requirement_t **parsed; /* one per requirement */
} srv_script_t;

/* Parses the PEP 723 block, merges `extra` (a JSON array of strings, or NULL) into its
 * dependencies with the seed's rule, and parses every requirement.  Errors are
 * CM_ERR_INVALID/CM_ERR_LIMIT with a message that names the bad part; on failure *out
 * holds nothing (releasing it is harmless). */
int srv_script_prepare(const char *script, size_t len, json_t *extra, srv_script_t *out, cm_error_t *err);
void srv_script_release(srv_script_t *s);

#endif
