/* The JSON-RPC envelope of a POST body, as the transport needs it (transport-internal.h):
 * request, notification or response, batch or not, an initialize among them. */
#include <stdio.h>

#include "transport/transport-internal.h"

/* One element, by the JSON-RPC rules (tr_jsonrpc_classify).  Returns 'r'equest,
 * 'n'otification, 's' (response) or 0 with why set. */
static char classify_one(json_t *m, const char **why, bool *initialize) {
  tr_msg_t msg;
  tr_jsonrpc_classify(m, &msg);
  switch (msg.kind) {
    case TR_MSG_REQUEST:
      if (strcmp(msg.method, "initialize") == 0) *initialize = true;
      return 'r';
    case TR_MSG_NOTIFICATION:
      return 'n';
    case TR_MSG_RESPONSE:
      return 's';
    case TR_MSG_INVALID:
      break;
  }
  *why = msg.error;
  return 0;
}

void tr_http_classify(const char *buf, size_t len, tr_http_envelope_t *out) {
  memset(out, 0, sizeof *out);
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!root) {
    out->status = TR_HTTP_BODY_PARSE_ERROR;
    snprintf(out->why, sizeof out->why, "Parse error: %.160s (line %d, column %d)", jerr.text,
             jerr.line, jerr.column);
    return;
  }
  const char *why = NULL;
  if (json_is_array(root)) {
    out->batch = true;
    if (json_array_size(root) == 0) why = "Invalid Request: empty batch";
    size_t i;
    json_t *el;
    json_array_foreach(root, i, el) {
      const char *ignored = NULL;
      switch (classify_one(el, &ignored, &out->initialize)) {
        case 'r':
          out->requests++;
          break;
        case 'n':
          out->notifications++;
          break;
        case 's':
          out->responses++;
          break;
        default:
          out->requests++; /* the router answers it with an error */
          break;
      }
    }
  } else {
    json_t *id = json_is_object(root) ? json_object_get(root, "id") : NULL;
    bool response = json_is_object(root) && !json_object_get(root, "method") &&
                    (json_object_get(root, "result") || json_object_get(root, "error"));
    if ((json_is_string(id) || json_is_integer(id)) && !response) out->id = json_incref(id);
    switch (classify_one(root, &why, &out->initialize)) {
      case 'r': {
        out->requests = 1;
        out->message = json_incref(root);
        json_t *params = json_object_get(root, "params");
        json_t *meta = json_is_object(params) ? json_object_get(params, "_meta") : NULL;
        json_t *v = json_is_object(meta)
                        ? json_object_get(meta, "io.modelcontextprotocol/protocolVersion")
                        : NULL;
        out->modern = v != NULL;
        if (json_is_string(v)) out->meta_version = json_incref(v);
        out->discover =
            strcmp(json_string_value(json_object_get(root, "method")), "server/discover") == 0;
        break;
      }
      case 'n':
        out->notifications = 1;
        break;
      case 's':
        out->responses = 1;
        break;
      default:
        break;
    }
  }
  if (why) {
    out->status = TR_HTTP_BODY_INVALID;
    snprintf(out->why, sizeof out->why, "%s", why);
  }
  json_decref(root);
}

void tr_http_envelope_release(tr_http_envelope_t *env) {
  json_decref(env->id);
  env->id = NULL;
  json_decref(env->meta_version);
  env->meta_version = NULL;
  json_decref(env->message);
  env->message = NULL;
}

unsigned tr_http_modern_status(const char *buf, size_t len) {
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_DECODE_ANY, &jerr);
  json_t *error = json_is_object(root) ? json_object_get(root, "error") : NULL;
  json_t *code = json_is_object(error) ? json_object_get(error, "code") : NULL;
  json_int_t c = json_is_integer(code) ? json_integer_value(code) : 0;
  json_decref(root);
  switch (c) {
    case -32602:
    case -32020:
    case -32021:
    case -32022:
      return 400;
    case -32601:
      return 404;
    default:
      return 200;
  }
}
