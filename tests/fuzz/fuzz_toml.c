/* libFuzzer target for pystd/toml.c: decode (with the default limits and with tight
 * ones), walk the tree through the public accessors, check the result contract, free. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "pystd/pystd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Returns the number of nodes below and including v; *depth gets the deepest level. */
static size_t walk(const toml_value_t *v, size_t level, size_t *depth) {
  size_t n = 1, len = 0;
  if (level > *depth) *depth = level;
  switch (toml_type(v)) {
    case TOML_TABLE:
      for (size_t i = 0; i < toml_table_len(v); i++) {
        const char *key;
        size_t key_len;
        const toml_value_t *child = toml_table_at(v, i, &key, &key_len);
        /* Every key is NUL-terminated and found again by lookup. */
        if (child == NULL || key[key_len] != '\0' || toml_table_getn(v, key, key_len) != child)
          abort();
        n += walk(child, level + 1, depth);
      }
      break;
    case TOML_ARRAY:
      for (size_t i = 0; i < toml_array_len(v); i++)
        n += walk(toml_array_at(v, i), level + 1, depth);
      break;
    case TOML_STRING: {
      const char *s = toml_string(v, &len);
      if (s == NULL || s[len] != '\0') abort();
      break;
    }
    case TOML_INTEGER:
    case TOML_FLOAT:
    case TOML_BOOLEAN:
      break;
    default: {
      toml_datetime_t dt;
      const char *text = toml_datetime_text(v);
      if (text == NULL || !toml_datetime(v, &dt) || dt.type != toml_type(v)) abort();
      break;
    }
  }
  return n;
}

static void check(const uint8_t *data, size_t size, const toml_options_t *options, size_t max_depth,
                  size_t max_values) {
  cm_error_t err = CM_ERROR_INIT;
  toml_value_t *root = NULL;
  int rc = toml_parse((const char *)data, size, options, &root, &err);
  if (rc == 0) {
    if (root == NULL || toml_type(root) != TOML_TABLE || err.msg != NULL) abort();
    size_t depth = 0;
    if (walk(root, 0, &depth) > max_values + 1 || depth > max_depth) abort();
  } else {
    if (rc != -1 || root != NULL || err.msg == NULL) abort();
    if (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT) abort();
  }
  toml_free(root);
  cm_error_release(&err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check(data, size, NULL, TOML_MAX_DEPTH, TOML_MAX_VALUES);
  toml_options_t tight = {.max_depth = 4, .max_values = 20};
  check(data, size, &tight, 4, 20);
  return 0;
}
