/* MIME types from a file's bytes (and, for text, its name): never trusting a name alone. */
#include <strings.h>

#include "server/files/files-internal.h"

/* ---------------------------------------------------------------- sniffing */

static bool starts_with(const unsigned char *b, size_t len, const char *magic, size_t n) {
  return len >= n && memcmp(b, magic, n) == 0;
}

/* Skips from p to just after the first occurrence of needle, or returns NULL. */
static const unsigned char *skip_past(const unsigned char *p, const unsigned char *end,
                                      const char *needle) {
  size_t n = strlen(needle);
  while ((size_t)(end - p) >= n) {
    if (memcmp(p, needle, n) == 0) return p + n;
    p++;
  }
  return NULL;
}

static const unsigned char *skip_space(const unsigned char *p, const unsigned char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  return p;
}

static bool looks_like_svg(const unsigned char *b, size_t len) {
  size_t n = cm_utf8_clip((const char *)b, len);
  if (n == 0 || memchr(b, '\0', n) || !cm_utf8_valid((const char *)b, n)) return false;
  const unsigned char *p = b, *end = b + n;
  if (starts_with(p, n, "\xef\xbb\xbf", 3)) p += 3;
  for (;;) {
    p = skip_space(p, end);
    if (!p || p >= end) return false;
    size_t left = (size_t)(end - p);
    if (starts_with(p, left, "<?xml", 5)) {
      p = skip_past(p, end, "?>");
    } else if (starts_with(p, left, "<!--", 4)) {
      p = skip_past(p + 4, end, "-->");
    } else if (left >= 9 && strncasecmp((const char *)p, "<!DOCTYPE", 9) == 0) {
      p = skip_past(p, end, ">");
    } else {
      break;
    }
    if (!p) return false;
  }
  size_t left = (size_t)(end - p);
  if (!starts_with(p, left, "<svg", 4)) return false;
  if (left == 4) return true;
  unsigned char c = p[4];
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '>' || c == '/';
}

const char *files_sniff_image(const void *head, size_t len) {
  const unsigned char *b = head;
  if (starts_with(b, len, "\x89PNG\r\n\x1a\n", 8)) return "image/png";
  if (starts_with(b, len, "\xff\xd8\xff", 3)) return "image/jpeg";
  if (starts_with(b, len, "GIF87a", 6) || starts_with(b, len, "GIF89a", 6)) return "image/gif";
  if (len >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return "image/webp";
  if (looks_like_svg(b, CM_MIN(len, FILES_SNIFF_BYTES))) return "image/svg+xml";
  return NULL;
}

static const char *text_mime_by_name(const char *name) {
  static const struct {
    const char *ext, *mime;
  } types[] = {
      {"csv", "text/csv"},          {"tsv", "text/tab-separated-values"},
      {"json", "application/json"}, {"jsonl", "application/jsonl"},
      {"md", "text/markdown"},      {"html", "text/html"},
      {"htm", "text/html"},         {"xml", "application/xml"},
      {"yaml", "application/yaml"}, {"yml", "application/yaml"},
      {"py", "text/x-python"},      {"svg", "image/svg+xml"},
      {"css", "text/css"},          {"js", "text/javascript"},
      {"tex", "text/x-tex"},
  };
  const char *base = name ? strrchr(name, '/') : NULL;
  base = base ? base + 1 : name;
  const char *dot = base ? strrchr(base, '.') : NULL;
  if (!dot || dot == base) return "text/plain";
  for (size_t i = 0; i < CM_ARRAY_SIZE(types); i++)
    if (strcasecmp(dot + 1, types[i].ext) == 0) return types[i].mime;
  return "text/plain";
}

const char *files_sniff_mime(const void *head, size_t len, const char *name, bool is_text) {
  const char *image = files_sniff_image(head, len);
  if (image) return image;
  if (is_text) {
    const char *m = text_mime_by_name(name);
    /* An .svg name without an <svg> root is not an image. */
    return strcmp(m, "image/svg+xml") == 0 ? "text/plain" : m;
  }
  const unsigned char *b = head;
  if (starts_with(b, len, "%PDF-", 5)) return "application/pdf";
  if (starts_with(b, len, "PK\x03\x04", 4)) return "application/zip";
  if (starts_with(b, len, "\x1f\x8b", 2)) return "application/gzip";
  return "application/octet-stream";
}

bool files_is_text(const void *buf, size_t len) {
  return len == 0 || (!memchr(buf, '\0', len) && cm_utf8_valid(buf, len));
}

bool files_mime_is_image(const char *mime) {
  return mime && strncmp(mime, "image/", 6) == 0;
}
