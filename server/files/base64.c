/* Base64 (input files in, images out) and the escaping of artifact paths in URIs. */
#include "server/files/files-internal.h"

/* ---------------------------------------------------------------- base64 */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *files_base64_encode(const void *buf, size_t len, size_t *out_len) {
  const unsigned char *in = buf;
  size_t n = (len + 2) / 3 * 4;
  char *out = xmalloc(n + 1);
  size_t o = 0, i = 0;
  for (; i + 2 < len; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = b64_alphabet[(v >> 6) & 63];
    out[o++] = b64_alphabet[v & 63];
  }
  if (i < len) {
    uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  out[o] = '\0';
  if (out_len) *out_len = o;
  return out;
}

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static bool b64_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int files_base64_decode(const char *in, size_t len, size_t max, char **out, size_t *out_len,
                        cm_error_t *err) {
  *out = NULL;
  *out_len = 0;
  /* First pass: check every character and size the result before allocating. */
  size_t data = 0, pad = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)in[i];
    if (b64_space(c)) continue;
    if (c == '=') {
      pad++;
      continue;
    }
    if (pad) return cm_error_set(err, 0, CM_ERR_INVALID, "data after the '=' padding");
    if (b64_value(c) < 0)
      return cm_error_set(err, 0, CM_ERR_INVALID, "a character that is not base64 at offset %zu",
                          i);
    data++;
  }
  if (data % 4 == 1 || pad > 2 || (pad && (data + pad) % 4 != 0))
    return cm_error_set(err, 0, CM_ERR_INVALID, "the base64 text has a bad length or padding");
  size_t n = data / 4 * 3 + (data % 4 ? data % 4 - 1 : 0);
  if (n > max)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "it decodes to %zu bytes, more than %zu", n, max);
  char *buf = xmalloc(n + 1);
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < len; i++) {
    int v = b64_value((unsigned char)in[i]);
    if (v < 0) continue;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      buf[o++] = (char)((acc >> bits) & 0xff);
    }
  }
  buf[o] = '\0';
  *out = buf;
  *out_len = o;
  return 0;
}

/* ---------------------------------------------------------------- URIs */

char *files_uri_escape(const char *path, size_t len) {
  static const char hex[] = "0123456789ABCDEF";
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)path[i];
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '~' || c == '-' || c == '/';
    if (keep) {
      cm_buf_append(&b, &path[i], 1);
    } else {
      char e[3] = {'%', hex[c >> 4], hex[c & 15]};
      cm_buf_append(&b, e, 3);
    }
  }
  return cm_buf_steal(&b);
}
