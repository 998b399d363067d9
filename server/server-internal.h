#ifndef MPS_SERVER_INTERNAL_H
#define MPS_SERVER_INTERNAL_H

#include "server/srv.h"

/* JSON-RPC 2.0 error codes. */
#define JSONRPC_PARSE_ERROR -32700
#define JSONRPC_INVALID_REQUEST -32600
#define JSONRPC_METHOD_NOT_FOUND -32601
#define JSONRPC_INVALID_PARAMS -32602
#define JSONRPC_INTERNAL_ERROR -32603

#define SRV_MAX_JSON_DEPTH 64

typedef enum srv_msg_kind {
  SRV_MSG_INVALID = 0,
  SRV_MSG_REQUEST,
  SRV_MSG_NOTIFICATION,
  SRV_MSG_RESPONSE,
} srv_msg_kind_t;

typedef struct srv_msg {
  srv_msg_kind_t kind;
  const char *method; /* borrowed from the message */
  json_t *id;         /* borrowed; NULL for notifications and for invalid ids */
  json_t *params;     /* borrowed; NULL when absent */
  const char *error;  /* why it is invalid */
} srv_msg_t;

/* Parses one JSON text with the limits (depth, duplicate keys rejected, no trailing
 * data).  On failure returns NULL with a message for a -32700/-32600 error in *why and
 * the code in *code. */
json_t *srv_jsonrpc_parse(const char *buf, size_t len, int *code, char **why);
/* Classifies one element (an object) of a parsed text. */
void srv_jsonrpc_classify(json_t *msg, srv_msg_t *out);
/* Builders; each returns a new reference.  id and result are borrowed (id keeps its type). */
json_t *srv_jsonrpc_error(json_t *id, int code, const char *message, json_t *data);
json_t *srv_jsonrpc_result(json_t *id, json_t *result);
json_t *srv_jsonrpc_notification(const char *method, json_t *params);
/* Compact one-line serialisation (heap). */
char *srv_jsonrpc_dump(json_t *msg, size_t *len);

/* A json string from arbitrary bytes: invalid UTF-8 is replaced by U+FFFD. */
json_t *srv_json_string_lossy(const char *buf, size_t len);

/* MCP protocol versions we speak, newest first. */
extern const char *const srv_protocol_versions[];
extern const size_t srv_protocol_versions_count;
bool srv_protocol_supported(const char *v);

#endif
