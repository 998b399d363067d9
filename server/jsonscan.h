#ifndef MPS_SERVER_JSONSCAN_H
#define MPS_SERVER_JSONSCAN_H

#include <stddef.h>

/* Returns the deepest nesting of arrays/objects in buf (strings are skipped, escapes
 * honoured), stopping early once it exceeds max_depth (then returns max_depth + 1).
 * Does not validate the JSON; jansson does that afterwards.  Never reads past len. */
int srv_json_depth(const char *buf, size_t len, int max_depth);

#endif
