/* Fuzz target: the JSON-RPC envelope (depth pre-scan, strict parse, classification). */
#include <stdint.h>

#include "server/server-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int code;
  char *why = NULL;
  json_t *root = srv_jsonrpc_parse((const char *)data, size, &code, &why);
  free(why);
  if (!root) return 0;
  srv_msg_t m;
  if (json_is_array(root)) {
    size_t i;
    json_t *el;
    json_array_foreach(root, i, el) srv_jsonrpc_classify(el, &m);
  } else {
    srv_jsonrpc_classify(root, &m);
  }
  json_decref(root);
  return 0;
}
