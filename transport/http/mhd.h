/* transport/http/ internals: libmicrohttpd, opened on demand (mhd.c). */
#ifndef MPS_TRANSPORT_HTTP_MHD_H
#define MPS_TRANSPORT_HTTP_MHD_H

#include <microhttpd.h>

#include "common/cm.h"

/* libmicrohttpd brings GnuTLS, p11-kit, nettle and more: some 2.5 MiB of resident pages
 * and 2 ms of dynamic loading that the stdio transport, the default, never needs.  So it
 * is opened when the first HTTP transport starts and called through this table; the
 * header still gives the types and constants, and the soname pins the ABI they describe.
 * The pure parts above never touch it. */
#define MHD_SONAME "libmicrohttpd.so.12"
#define MHD_FUNCTIONS(X)           \
  X(add_response_header)           \
  X(create_response_from_buffer)   \
  X(create_response_from_callback) \
  X(create_response_from_fd64)     \
  X(destroy_response)              \
  X(get_connection_info)           \
  X(get_connection_values)         \
  X(get_daemon_info)               \
  X(get_timeout)                   \
  X(lookup_connection_value)       \
  X(queue_response)                \
  X(quiesce_daemon)                \
  X(resume_connection)             \
  X(run)                           \
  X(set_connection_option)         \
  X(start_daemon)                  \
  X(stop_daemon)                   \
  X(suspend_connection)

typedef struct tr_mhd {
#define MHD_MEMBER(name) __typeof__(MHD_##name) *name;
  MHD_FUNCTIONS(MHD_MEMBER)
#undef MHD_MEMBER
} tr_mhd_t;

/* The table, filled by tr_mhd_load. */
extern tr_mhd_t tr_mhd;
/* Opens libmicrohttpd and fills the table, once; kept open for the life of the process. */
int tr_mhd_load(cm_error_t *err);

#endif
