#ifndef MPS_EGRESS_INTERNAL_H
#define MPS_EGRESS_INTERNAL_H

#include "egress/egress.h"

/* A destination host as a client names it: a host name (lower-cased into out, without a
 * trailing dot) or an address literal (IPv6 without brackets, copied as given).  0, or -1
 * when it is neither. */
int eg_host_parse(const char *buf, size_t len, char *out, size_t out_size);

#endif
