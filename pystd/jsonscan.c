/* A nesting-depth pre-scan, so hostile input is refused before jansson recurses into it
 * and before any allocation proportional to its depth. */
#include "pystd/pystd.h"

int srv_json_depth(const char *buf, size_t len, int max_depth) {
  int depth = 0, deepest = 0;
  int in_string = 0;
  for (size_t i = 0; i < len; i++) {
    char c = buf[i];
    if (in_string) {
      if (c == '\\') {
        i++; /* skip the escaped character */
      } else if (c == '"') {
        in_string = 0;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = 1;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > max_depth) return max_depth + 1;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) depth--;
        break;
      default:
        break;
    }
  }
  return deepest;
}
