/* libmicrohttpd, opened when the first HTTP transport starts (mhd.h). */
#include "transport/http/mhd.h"

/* Process-wide, like the library it points into: loaded once, never unloaded. */
tr_mhd_t tr_mhd;
static bool mhd_loaded;

int tr_mhd_load(cm_error_t *err) {
  if (mhd_loaded) return 0;
#define MHD_NAME(name) "MHD_" #name,
  static const char *const names[] = {MHD_FUNCTIONS(MHD_NAME)};
#undef MHD_NAME
  void *syms[CM_ARRAY_SIZE(names)];
  if (cm_dl_symbols(MHD_SONAME, names, CM_ARRAY_SIZE(names), syms, err) < 0) return -1;
  size_t i = 0;
#define MHD_ASSIGN(name) tr_mhd.name = (__typeof__(MHD_##name) *)syms[i++];
  MHD_FUNCTIONS(MHD_ASSIGN)
#undef MHD_ASSIGN
  mhd_loaded = true;
  return 0;
}
