/* libFuzzer target for the session kernel's frames (server/exec/kframe.c): the bytes a
 * kernel (running the user's code) writes on its result FIFO, fed as the server reads them:
 * frames are cut from the front of the buffer until one is incomplete or refused, and each
 * is checked as a result.  Checks, beyond memory safety and leaks: a frame never claims more
 * bytes than it was given nor more than its cap; a result that is accepted has a known
 * status, an exit code in 0..255 (0 for ok) and strings within their caps. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/exec/exec-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  size_t off = 0;
  while (off < size) {
    size_t used;
    json_t *o;
    cm_error_t err = CM_ERROR_INIT;
    int rc = exec_kframe_parse(buf + off, size - off, &used, &o, &err);
    if (rc <= 0) {
      if (rc < 0 && err.kind != CM_ERR_LIMIT && err.kind != CM_ERR_INVALID) abort();
      if (rc == 0 && o) abort();
      cm_error_release(&err);
      break;
    }
    if (used < 4 || used > size - off || used > 4 + EXEC_KFRAME_MAX || !json_is_object(o)) abort();
    off += used;
    exec_kresult_t r;
    if (exec_kresult_from_json(o, &r, &err) == 0) {
      if (r.status < EXEC_KSTATUS_OK || r.status > EXEC_KSTATUS_EXIT) abort();
      if (r.exit_code < 0 || r.exit_code > 255) abort();
      if (r.status == EXEC_KSTATUS_OK && r.exit_code != 0) abort();
      if (r.display && strlen(r.display) > EXEC_KRESULT_MAX_DISPLAY) abort();
      if (r.error && strlen(r.error) > EXEC_KRESULT_MAX_NAME) abort();
      exec_kresult_release(&r);
    } else {
      cm_error_release(&err);
    }
    json_decref(o);
  }
  return 0;
}
