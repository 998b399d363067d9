/* Fuzz target: the JSON-RPC envelope (depth pre-scan, strict parse, classification, the
 * builders and the lossy string).
 *
 * jansson is not instrumented (Debian's build; its source is not at hand offline), so
 * mutating raw bytes mostly explores jansson's rejections and reaches few of our own
 * branches.  The input is therefore used twice: as raw text, and as a program that builds
 * a structured message (an object or a batch of them, with the envelope's members chosen
 * and typed by the input: "jsonrpc", "id", "method", "params", "result", "error" and others,
 * values of every JSON type), which is serialised and then fed through the same parse and
 * classification, so that the envelope checks see well-formed JSON with every combination
 * of members.  Checks, beyond memory safety: the classification's contract (a request has
 * a method and a string or integer id, a notification no id, a response an id member and
 * exactly one of result and error; params, when there, an object or an array); answers built for a
 * classified message serialise and parse back to the same id. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/jsonscan.h"
#include "server/server-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  const uint8_t *p;
  size_t left;
} reader_t;

static unsigned take(reader_t *r) {
  if (!r->left) return 0;
  r->left--;
  return *r->p++;
}

static const char *const keys[] = {"jsonrpc", "id",   "method",  "params",   "result",        "error",
                                   "code",    "data", "message", "_meta",    "progressToken", "cursor",
                                   "name",    "arguments"};
static const char *const methods[] = {"initialize",     "ping",      "tools/list",
                                      "tools/call",     "notifications/initialized",
                                      "notifications/cancelled", "logging/setLevel", "resources/list",
                                      "",               "x"};

static json_t *make_string(reader_t *r) {
  unsigned how = take(r) % 4;
  if (how == 0) return json_string(keys[take(r) % CM_ARRAY_SIZE(keys)]);
  if (how == 1) return json_string(methods[take(r) % CM_ARRAY_SIZE(methods)]);
  /* Raw bytes, which may be invalid UTF-8 or hold a NUL: through the lossy constructor. */
  size_t want = take(r) % 24; /* CM_MIN evaluates its arguments twice */
  size_t n = CM_MIN(want, r->left);
  json_t *s = srv_json_string_lossy((const char *)r->p, n);
  r->p += n;
  r->left -= n;
  return s;
}

static json_t *make_value(reader_t *r, int depth) {
  unsigned t = take(r) % (depth > 6 ? 6 : 8);
  switch (t) {
    case 0: return json_null();
    case 1: return json_boolean(take(r) & 1);
    case 2: {
      uint64_t v = 0;
      for (int i = 0, n = 1 + (int)(take(r) % 8); i < n; i++) v = (v << 8) | take(r);
      return json_integer((json_int_t)v); /* any 64-bit pattern, negative ones too */
    }
    case 3: return json_real((double)(int8_t)take(r) / 4.0);
    case 4:
    case 5: return make_string(r);
    case 6: {
      json_t *a = json_array();
      for (unsigned n = take(r) % 4; n > 0 && r->left; n--) json_array_append_new(a, make_value(r, depth + 1));
      return a;
    }
    default: {
      json_t *o = json_object();
      for (unsigned n = take(r) % 5; n > 0 && r->left; n--) {
        json_t *k = make_string(r);
        json_object_set_new(o, json_string_value(k), make_value(r, depth + 1));
        json_decref(k);
      }
      return o;
    }
  }
}

/* One message: each envelope member present or not, well-typed or not, as the input says. */
static json_t *make_message(reader_t *r) {
  json_t *m = json_object();
  unsigned present = take(r) | (take(r) << 8);
  unsigned typed = take(r);
  if (present & 1) json_object_set_new(m, "jsonrpc", typed & 1 ? json_string(take(r) & 7 ? "2.0" : "1.0") : make_value(r, 1));
  if (present & 2) {
    json_t *id;
    switch (typed >> 1 & 3) {
      case 0: id = json_integer((json_int_t)take(r) - 128); break;
      case 1: id = make_string(r); break;
      default: id = make_value(r, 1); break;
    }
    json_object_set_new(m, "id", id);
  }
  if (present & 4)
    json_object_set_new(m, "method", typed & 8 ? json_string(methods[take(r) % CM_ARRAY_SIZE(methods)]) : make_value(r, 1));
  if (present & 8) json_object_set_new(m, "params", typed & 16 ? json_object() : make_value(r, 1));
  if (present & 16) json_object_set_new(m, "result", make_value(r, 1));
  if (present & 32) json_object_set_new(m, "error", make_value(r, 1));
  for (unsigned n = present >> 6 & 3; n > 0 && r->left; n--) {
    json_t *k = make_string(r);
    json_object_set_new(m, json_string_value(k), make_value(r, 1));
    json_decref(k);
  }
  if ((present >> 8 & 7) == 0) { /* now and then not an object at all */
    json_decref(m);
    return make_value(r, 1);
  }
  return m;
}

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
  json_t *answer = m.kind == SRV_MSG_REQUEST ? srv_jsonrpc_result(m.id, empty)
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

  reader_t r = {data, size};
  json_t *msg;
  if (take(&r) % 4 == 0) {
    msg = json_array();
    for (unsigned n = take(&r) % 5; n > 0 && r.left; n--) json_array_append_new(msg, make_message(&r));
  } else {
    msg = make_message(&r);
  }
  char *text = json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY);
  if (text) {
    size_t len = strlen(text);
    run_text(text, len);
    /* And cut short where the rest of the input says: the truncated envelope. */
    if (len > 1 && r.left) run_text(text, take(&r) % len);
    free(text);
  }
  json_decref(msg);
  (void)srv_protocol_supported(size > 10 ? "2025-06-18" : "1999-01-01");
  return 0;
}
