/* libFuzzer target for the pure functions of server/files.c: the input path check, MIME
 * sniffing, base64 (decode, then encode and decode again), URI escaping.  Each takes
 * (buf, len) and must never read past len or trust a terminator. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "server/files/files.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  cm_error_t err = CM_ERROR_INIT;

  char *path = files_check_path(buf, size, &err);
  if (path) {
    /* An accepted path is clean: relative, no "." or ".." or empty component, no NUL. */
    size_t n = strlen(path);
    if (n == 0 || n > size || path[0] == '/' || path[n - 1] == '/' || strstr(path, "//") ||
        !cm_utf8_valid(path, n) || err.msg)
      abort();
    for (char *c = path; c && *c;) {
      char *slash = strchr(c, '/');
      size_t len = slash ? (size_t)(slash - c) : strlen(c);
      if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.')) abort();
      c = slash ? slash + 1 : NULL;
    }
    free(path);
  } else if (!err.msg || (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT)) {
    abort();
  }
  cm_error_release(&err);

  const char *mime = files_sniff_mime(buf, size, "name.csv", files_is_text(buf, size));
  if (!mime || !*mime) abort();
  (void)files_sniff_image(buf, size);

  char *dec = NULL;
  size_t dec_len = 0;
  if (files_base64_decode(buf, size, size, &dec, &dec_len, &err) == 0) {
    if (dec_len > size || dec[dec_len] != '\0') abort();
    size_t enc_len;
    char *enc = files_base64_encode(dec, dec_len, &enc_len);
    char *again = NULL;
    size_t again_len = 0;
    if (files_base64_decode(enc, enc_len, dec_len, &again, &again_len, &err) < 0) abort();
    if (again_len != dec_len || memcmp(again, dec, dec_len) != 0) abort();
    free(again);
    free(enc);
    free(dec);
  } else if (dec != NULL || !err.msg) {
    abort();
  }
  cm_error_release(&err);

  char *uri = files_uri_escape(buf, size);
  if (strlen(uri) < size || strlen(uri) > 3 * size) abort();
  free(uri);
  return 0;
}
