#include "server/config/config.h"

#ifndef MPS_VERSION
#define MPS_VERSION "0.1.0"
#endif

const char *srv_version(void) {
  return MPS_VERSION;
}
