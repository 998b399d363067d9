/* A collection as a result: text lines, content blocks, structuredContent.files. */
#include <stdio.h>

#include "server/files/files-internal.h"

/* Lines about single files in the text block; the rest are summarised. */
#define FILES_TEXT_LINES 20

/* ---------------------------------------------------------------- results */

static const char *how_name(files_how_t how) {
  switch (how) {
    case FILES_IMAGE:
      return "image";
    case FILES_RESOURCE:
      return "resource";
    case FILES_RESOURCE_LINK:
      return "resource_link";
    default:
      return "skipped";
  }
}

static void text_line(cm_buf_t *t, const files_output_t *e) {
  if (e->how == FILES_SKIPPED) {
    cm_buf_printf(t, "\n--- skipped: %s: %s ---", e->path, e->reason ? e->reason : "skipped");
    return;
  }
  cm_buf_printf(t, "\n--- file: %s (%s, %llu bytes): %s", e->path, e->mime,
                (unsigned long long)e->size, how_name(e->how));
  if (e->how == FILES_RESOURCE_LINK && e->uri) cm_buf_printf(t, " %s", e->uri);
  cm_buf_appends(t, " ---");
}

void files_result_append(const files_collection_t *c, cm_buf_t *text, json_t *content,
                         json_t *structured) {
  json_t *list = json_array();
  size_t returned = 0, skipped = 0;
  for (size_t i = 0; i < c->n; i++) {
    const files_output_t *e = &c->v[i];
    if (e->how == FILES_SKIPPED)
      skipped++;
    else
      returned++;
    json_t *item = json_pack("{s:s, s:I, s:s}", "path", e->path, "size", (json_int_t)e->size,
                             "returned", how_name(e->how));
    json_object_set_new(item, "mime_type", e->mime ? json_string(e->mime) : json_null());
    if (e->uri) json_object_set_new(item, "uri", json_string(e->uri));
    if (e->reason) {
      /* A reason may quote a file name: bytes, not necessarily UTF-8. */
      size_t n;
      cleanup_free char *reason = cm_utf8_sanitize(e->reason, strlen(e->reason), &n);
      json_object_set_new(item, "reason", json_stringn(reason, n));
    }
    json_array_append_new(list, item);
    if (!content) continue;
    if (e->how == FILES_IMAGE) {
      cleanup_free char *b64 = files_base64_encode(e->data, e->len, NULL);
      json_array_append_new(
          content, json_pack("{s:s, s:s, s:s}", "type", "image", "data", b64, "mimeType", e->mime));
    } else if (e->how == FILES_RESOURCE && e->uri) {
      json_array_append_new(
          content, json_pack("{s:s, s:{s:s, s:s, s:s%}}", "type", "resource", "resource", "uri",
                             e->uri, "mimeType", e->mime, "text", e->data, e->len));
    } else if (e->how == FILES_RESOURCE_LINK && e->uri) {
      json_array_append_new(
          content, json_pack("{s:s, s:s, s:s, s:s, s:I}", "type", "resource_link", "uri", e->uri,
                             "name", e->path, "mimeType", e->mime, "size", (json_int_t)e->size));
    }
  }
  if (structured)
    json_object_set_new(structured, "files", list);
  else
    json_decref(list);
  if (!text || (c->n == 0 && !c->note)) return;
  cm_buf_printf(text, "\n--- files: %zu returned from %s/, %zu skipped ---", returned,
                FILES_OUTPUTS_DIR, skipped);
  size_t shown = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (shown == FILES_TEXT_LINES) {
      cm_buf_printf(text, "\n--- ... and %zu more ---", c->n - shown);
      break;
    }
    text_line(text, &c->v[i]);
    shown++;
  }
  if (c->note) cm_buf_printf(text, "\n--- note: %s ---", c->note);
}

json_t *files_output_schema(void) {
  json_t *nullable_string = json_pack("{s:[s, s]}", "type", "string", "null");
  return json_pack(
      "{s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s}, s:o, s:{s:s, s:[s, s, s, s]}, s:{s:s}, s:{s:s}},"
      " s:[s, s]}}",
      "type", "array", "description",
      "Files collected from outputs/: how each was returned, or why it was skipped.", "items",
      "type", "object", "properties", "path", "type", "string", "size", "type", "integer",
      "mime_type", nullable_string, "returned", "type", "string", "enum", "image", "resource",
      "resource_link", "skipped", "uri", "type", "string", "reason", "type", "string", "required",
      "path", "returned");
}
