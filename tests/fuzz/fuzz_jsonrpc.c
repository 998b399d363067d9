/* Fuzz target: the JSON-RPC envelope (depth pre-scan, strict parse, classification, the
 * builders and the lossy string).
 *
 * jansson is not instrumented (Debian's build; its source is not at hand offline), so
 * mutating raw bytes mostly explores jansson's rejections and reaches few of our own
 * branches.  The input is therefore used twice: as raw text, and as a program that builds
 * a structured message (jsongen.h: an object or a batch of them, with the envelope's
 * members chosen and typed by the input), which is serialised and then fed through the
 * same parse and classification, so that the envelope checks see well-formed JSON with
 * every combination of members.  Checks, beyond memory safety: the classification's contract (a
 * request has a method and a string or integer id, a notification no id, a response an id member
 * and exactly one of result and error; params, when there, an object or an array); answers built
 * for a classified message serialise and parse back to the same id. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pystd/pystd.h"
#include "server/core/core-internal.h"
#include "tests/fuzz/jsongen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_one(json_t *el) {
  srv_msg_t m;
  srv_jsonrpc_classify(el, &m);
  switch (m.kind) {
    case SRV_MSG_REQUEST:
      if (!m.method || !m.id || !(json_is_string(m.id) || json_is_integer(m.id))) abort();
      /* fall through */
    case SRV_MSG_NOTIFICATION:
      if (!m.method) abort();
      if (m.kind == SRV_MSG_NOTIFICATION && m.id) abort();
      if (m.params && !json_is_object(m.params) && !json_is_array(m.params)) abort();
      break;
    case SRV_MSG_RESPONSE:
      /* An id member (m.id only when it is a string or an integer: null is a response too). */
      if (!json_object_get(el, "id")) abort();
      if (m.id && !json_is_string(m.id) && !json_is_integer(m.id)) abort();
      if (!json_object_get(el, "result") == !json_object_get(el, "error")) abort();
      break;
    case SRV_MSG_INVALID:
      if (!m.error) abort();
      break;
  }
  /* The answers we would send for it serialise and parse back with the same id. */
  json_t *empty = json_object(); /* borrowed by srv_jsonrpc_result */
  json_t *answer = m.kind == SRV_MSG_REQUEST
                       ? srv_jsonrpc_result(m.id, empty)
                       : srv_jsonrpc_error(m.id, -32600, m.error ? m.error : "x", NULL);
  json_decref(empty);
  size_t len;
  char *text = srv_jsonrpc_dump(answer, &len);
  int code;
  char *why = NULL;
  json_t *back = srv_jsonrpc_parse(text, len, &code, &why);
  if (!back) abort();
  json_t *id = json_object_get(back, "id");
  if (m.id ? !json_equal(id, m.id) : !json_is_null(id)) abort();
  srv_msg_t again;
  srv_jsonrpc_classify(back, &again);
  if (again.kind != SRV_MSG_RESPONSE && m.id) abort();
  json_decref(back);
  free(text);
  json_decref(answer);
}

static void run_text(const char *buf, size_t len) {
  (void)srv_json_depth(buf, len, 4);
  int code;
  char *why = NULL;
  json_t *root = srv_jsonrpc_parse(buf, len, &code, &why);
  if (!root) {
    if (!why || (code != JSONRPC_PARSE_ERROR && code != JSONRPC_INVALID_REQUEST)) abort();
    free(why);
    return;
  }
  if (json_is_array(root)) {
    size_t i;
    json_t *el;
    json_array_foreach(root, i, el) check_one(el);
  } else {
    check_one(root);
  }
  json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_text((const char *)data, size);

  jg_reader_t r = {data, size};
  json_t *msg;
  if (jg_take(&r) % 4 == 0) {
    msg = json_array();
    for (unsigned n = jg_take(&r) % 5; n > 0 && r.left; n--)
      json_array_append_new(msg, jg_message(&r));
  } else {
    msg = jg_message(&r);
  }
  char *text = json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY);
  if (text) {
    size_t len = strlen(text);
    run_text(text, len);
    /* And cut short where the rest of the input says: the truncated envelope. */
    if (len > 1 && r.left) run_text(text, jg_take(&r) % len);
    free(text);
  }
  json_decref(msg);
  (void)srv_protocol_supported(size > 10 ? "2025-06-18" : "1999-01-01");
  /* Arbitrary bytes as a JSON string: always a valid one. */
  json_t *lossy = srv_json_string_lossy((const char *)data, size);
  if (!lossy || !cm_utf8_valid(json_string_value(lossy), json_string_length(lossy))) abort();
  json_decref(lossy);
  return 0;
}
