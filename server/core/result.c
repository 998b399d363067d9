/* Tool results (core.h). */
#include <stdarg.h>

#include "server/core/core-internal.h"

json_t *srv_tool_text_result(const char *text, bool is_error) {
  return srv_tool_text_resultn(text, strlen(text), is_error);
}

json_t *srv_tool_text_resultn(const char *text, size_t len, bool is_error) {
  return json_pack("{s:[{s:s, s:s%}], s:b}", "content", "type", "text", "text", text, len,
                   "isError", is_error);
}

json_t *srv_tool_error_result(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *msg = xvasprintf(fmt, ap);
  va_end(ap);
  return srv_tool_text_result(msg, true);
}
