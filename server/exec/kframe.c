/* The session kernel's frames (profiles/kernel.py): a 4-byte big-endian length, then that
 * many bytes of one JSON object.  The kernel runs the user's code, so what it writes is
 * hostile input: every frame is capped (EXEC_KFRAME_MAX), parsed with duplicate keys
 * refused, and its result checked field by field before anything of it is used. */
#include <arpa/inet.h>
#include <stdlib.h>

#include "server/exec/exec-internal.h"

int exec_kframe_parse(const char *buf, size_t len, size_t *used, json_t **out, cm_error_t *err) {
  *used = 0;
  *out = NULL;
  if (len < 4) return 0;
  uint32_t n;
  memcpy(&n, buf, 4);
  n = ntohl(n);
  if (n > EXEC_KFRAME_MAX)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "a kernel frame of %u bytes (at most %u)", n,
                        (unsigned)EXEC_KFRAME_MAX);
  if (len - 4 < n) return 0;
  json_error_t jerr;
  json_t *o = json_loadb(buf + 4, n, JSON_REJECT_DUPLICATES, &jerr);
  if (!o) return cm_error_set(err, 0, CM_ERR_INVALID, "a kernel frame is not JSON: %s", jerr.text);
  if (!json_is_object(o)) {
    json_decref(o);
    return cm_error_set(err, 0, CM_ERR_INVALID, "a kernel frame is not a JSON object");
  }
  *used = 4 + (size_t)n;
  *out = o;
  return 1;
}

char *exec_kframe_encode(json_t *o, size_t *len) {
  cleanup_free char *body = json_dumps(o, JSON_COMPACT);
  if (!body) abort(); /* only an allocation failure can make it fail */
  size_t n = strlen(body);
  char *frame = xmalloc(n + 4);
  uint32_t be = htonl((uint32_t)n);
  memcpy(frame, &be, 4);
  memcpy(frame + 4, body, n);
  *len = n + 4;
  return frame;
}

static const char *const status_names[] = {
    [EXEC_KSTATUS_OK] = "ok",
    [EXEC_KSTATUS_ERROR] = "error",
    [EXEC_KSTATUS_INTERRUPTED] = "interrupted",
    [EXEC_KSTATUS_EXIT] = "exit",
};

static int opt_string(json_t *o, const char *key, size_t max, char **out, cm_error_t *err) {
  json_t *v = json_object_get(o, key);
  *out = NULL;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v))
    return cm_error_set(err, 0, CM_ERR_INVALID, "the kernel's '%s' is not a string", key);
  size_t n = json_string_length(v);
  if (n > max) n = max;
  /* Cut on a character boundary: the text goes back to the client as JSON. */
  const char *s = json_string_value(v);
  while (n > 0 && n < json_string_length(v) && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  *out = xstrndup(s, n);
  return 0;
}

int exec_kresult_from_json(json_t *o, exec_kresult_t *out, cm_error_t *err) {
  memset(out, 0, sizeof *out);
  json_t *id = json_object_get(o, "id");
  if (!json_is_integer(id) || json_integer_value(id) < 0)
    return cm_error_set(err, 0, CM_ERR_INVALID, "the kernel's result has no call id");
  out->id = (uint64_t)json_integer_value(id);
  json_t *status = json_object_get(o, "status");
  out->status = -1;
  for (int i = 0; json_is_string(status) && i < (int)CM_ARRAY_SIZE(status_names); i++)
    if (strcmp(json_string_value(status), status_names[i]) == 0) out->status = i;
  if (out->status < 0)
    return cm_error_set(err, 0, CM_ERR_INVALID, "the kernel's result has no valid status");
  json_t *code = json_object_get(o, "exit_code");
  if (code && !json_is_null(code)) {
    if (!json_is_integer(code) || json_integer_value(code) < 0 || json_integer_value(code) > 255)
      return cm_error_set(err, 0, CM_ERR_INVALID, "the kernel's exit code is not 0..255");
    out->exit_code = (int)json_integer_value(code);
  } else {
    out->exit_code = out->status == EXEC_KSTATUS_OK ? 0 : 1;
  }
  if (out->status == EXEC_KSTATUS_OK) out->exit_code = 0;
  json_t *rss = json_object_get(o, "rss_bytes");
  if (json_is_integer(rss) && json_integer_value(rss) > 0)
    out->rss_bytes = (uint64_t)json_integer_value(rss);
  if (opt_string(o, "error", EXEC_KRESULT_MAX_NAME, &out->error, err) < 0 ||
      opt_string(o, "display", EXEC_KRESULT_MAX_DISPLAY, &out->display, err) < 0 ||
      opt_string(o, "export_error", EXEC_KRESULT_MAX_NAME, &out->export_error, err) < 0) {
    exec_kresult_release(out);
    return -1;
  }
  return 0;
}

const char *exec_kstatus_name(int status) {
  return status >= 0 && status < (int)CM_ARRAY_SIZE(status_names) ? status_names[status] : "?";
}

void exec_kresult_release(exec_kresult_t *r) {
  free(r->error);
  free(r->display);
  free(r->export_error);
  memset(r, 0, sizeof *r);
}
