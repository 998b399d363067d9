/* The JSON-RPC 2.0 message rules (tr.h), once for both transports and the router. */
#include "transport/tr.h"

static bool valid_id(json_t *id) {
  return json_is_string(id) || json_is_integer(id);
}

void tr_jsonrpc_classify(json_t *msg, tr_msg_t *out) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(msg)) {
    out->error = "Invalid Request: a message must be a JSON object";
    return;
  }
  json_t *id = json_object_get(msg, "id");
  if (id && valid_id(id)) out->id = id;
  json_t *version = json_object_get(msg, "jsonrpc");
  if (!json_is_string(version) || strcmp(json_string_value(version), "2.0") != 0) {
    out->error = "Invalid Request: \"jsonrpc\" must be \"2.0\"";
    return;
  }
  json_t *method = json_object_get(msg, "method");
  if (method) {
    if (!json_is_string(method)) {
      out->error = "Invalid Request: \"method\" must be a string";
      return;
    }
    out->method = json_string_value(method);
    json_t *params = json_object_get(msg, "params");
    if (params && !json_is_object(params) && !json_is_array(params)) {
      out->error = "Invalid Request: \"params\" must be an object";
      return;
    }
    out->params = params;
    if (!id) {
      out->kind = TR_MSG_NOTIFICATION;
      return;
    }
    if (!valid_id(id)) {
      out->error = "Invalid Request: \"id\" must be a string or an integer";
      return;
    }
    out->kind = TR_MSG_REQUEST;
    return;
  }
  json_t *result = json_object_get(msg, "result");
  json_t *error = json_object_get(msg, "error");
  if ((result != NULL) != (error != NULL) && id) {
    out->kind = TR_MSG_RESPONSE;
    return;
  }
  out->error =
      "Invalid Request: a message needs \"method\", or \"id\" with \"result\" or \"error\"";
}
