/* A structured JSON-RPC message generator for fuzz targets: reads the fuzzer's input as a
 * program that builds a message (an object with the envelope's members present or absent,
 * typed right or wrong, values of every JSON type, strings from the envelope's vocabulary
 * or raw bytes), so that targets whose parser is jansson (not instrumented) still reach
 * every branch of our envelope checks with well-formed JSON. */
#ifndef MPS_TESTS_FUZZ_JSONGEN_H
#define MPS_TESTS_FUZZ_JSONGEN_H

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/cm.h"

typedef struct {
  const uint8_t *p;
  size_t left;
} jg_reader_t;

static inline unsigned jg_take(jg_reader_t *r) {
  if (!r->left) return 0;
  r->left--;
  return *r->p++;
}

static const char *const jg_keys[] = {"jsonrpc",       "id",     "method", "params",   "result",
                                      "error",         "code",   "data",   "message",  "_meta",
                                      "progressToken", "cursor", "name",   "arguments"};
static const char *const jg_methods[] = {"initialize",
                                         "ping",
                                         "tools/list",
                                         "tools/call",
                                         "notifications/initialized",
                                         "notifications/cancelled",
                                         "logging/setLevel",
                                         "resources/list",
                                         "",
                                         "x"};

static inline json_t *jg_string(jg_reader_t *r) {
  unsigned how = jg_take(r) % 4;
  if (how == 0) return json_string(jg_keys[jg_take(r) % CM_ARRAY_SIZE(jg_keys)]);
  if (how == 1) return json_string(jg_methods[jg_take(r) % CM_ARRAY_SIZE(jg_methods)]);
  /* Raw bytes, which may be invalid UTF-8 or hold a NUL: through the lossy constructor. */
  size_t want = jg_take(r) % 24; /* CM_MIN evaluates its arguments twice */
  size_t n = CM_MIN(want, r->left);
  size_t clean_len;
  char *clean = cm_utf8_sanitize((const char *)r->p, n, &clean_len);
  json_t *s = json_stringn(clean, clean_len);
  free(clean);
  r->p += n;
  r->left -= n;
  return s;
}

static inline json_t *jg_value(jg_reader_t *r, int depth) {
  unsigned t = jg_take(r) % (depth > 6 ? 6 : 8);
  switch (t) {
    case 0:
      return json_null();
    case 1:
      return json_boolean(jg_take(r) & 1);
    case 2: {
      uint64_t v = 0;
      for (int i = 0, n = 1 + (int)(jg_take(r) % 8); i < n; i++) v = (v << 8) | jg_take(r);
      return json_integer((json_int_t)v); /* any 64-bit pattern, negative ones too */
    }
    case 3:
      return json_real((double)(int8_t)jg_take(r) / 4.0);
    case 4:
    case 5:
      return jg_string(r);
    case 6: {
      json_t *a = json_array();
      for (unsigned n = jg_take(r) % 4; n > 0 && r->left; n--)
        json_array_append_new(a, jg_value(r, depth + 1));
      return a;
    }
    default: {
      json_t *o = json_object();
      for (unsigned n = jg_take(r) % 5; n > 0 && r->left; n--) {
        json_t *k = jg_string(r);
        json_object_set_new(o, json_string_value(k), jg_value(r, depth + 1));
        json_decref(k);
      }
      return o;
    }
  }
}

/* One message: each envelope member present or not, well-typed or not, as the input says. */
static inline json_t *jg_message(jg_reader_t *r) {
  json_t *m = json_object();
  unsigned present = jg_take(r) | (jg_take(r) << 8);
  unsigned typed = jg_take(r);
  if (present & 1)
    json_object_set_new(m, "jsonrpc",
                        typed & 1 ? json_string(jg_take(r) & 7 ? "2.0" : "1.0") : jg_value(r, 1));
  if (present & 2) {
    json_t *id;
    switch (typed >> 1 & 3) {
      case 0:
        id = json_integer((json_int_t)jg_take(r) - 128);
        break;
      case 1:
        id = jg_string(r);
        break;
      default:
        id = jg_value(r, 1);
        break;
    }
    json_object_set_new(m, "id", id);
  }
  if (present & 4)
    json_object_set_new(m, "method",
                        typed & 8 ? json_string(jg_methods[jg_take(r) % CM_ARRAY_SIZE(jg_methods)])
                                  : jg_value(r, 1));
  if (present & 8) json_object_set_new(m, "params", typed & 16 ? json_object() : jg_value(r, 1));
  if (present & 16) json_object_set_new(m, "result", jg_value(r, 1));
  if (present & 32) json_object_set_new(m, "error", jg_value(r, 1));
  for (unsigned n = present >> 6 & 3; n > 0 && r->left; n--) {
    json_t *k = jg_string(r);
    json_object_set_new(m, json_string_value(k), jg_value(r, 1));
    json_decref(k);
  }
  if ((present >> 8 & 7) == 0) { /* now and then not an object at all */
    json_decref(m);
    return jg_value(r, 1);
  }
  return m;
}

#endif
