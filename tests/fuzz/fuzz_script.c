/* libFuzzer target for a call's script and dependencies as a whole (server/script.c
 * srv_script_prepare): the PEP 723 block is parsed (TOML inside), its dependencies merged
 * with the call's list (PEP 508 names normalised, PEP 440 specifiers), every requirement
 * parsed.  Input: lines up to the first empty line are the call's `dependencies` (a line
 * "#int" puts a number there instead of a string), the rest is the script; without an
 * empty line it is all script and the call has no list.  Checks, beyond memory safety and
 * leaks: on success one parsed requirement per merged entry, one entry per normalised name,
 * no more entries than the block and the list gave; on failure an error of the documented
 * kinds and nothing left in the result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/cm.h"
#include "server/tools/tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_EXTRA 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  json_t *extra = NULL;
  const char *script = buf;
  size_t script_len = size;
  const char *blank = NULL;
  for (size_t i = 0; i + 1 < size; i++) {
    if (buf[i] == '\n' && buf[i + 1] == '\n') {
      blank = buf + i;
      break;
    }
  }
  if (blank) {
    extra = json_array();
    for (const char *p = buf; p < blank && json_array_size(extra) < MAX_EXTRA;) {
      const char *nl = memchr(p, '\n', (size_t)(blank - p));
      const char *end = nl ? nl : blank;
      if (end - p == 4 && memcmp(p, "#int", 4) == 0)
        json_array_append_new(extra, json_integer(4));
      else
        json_array_append_new(extra, json_stringn_nocheck(p, (size_t)(end - p)));
      p = end + 1;
    }
    script = blank + 2;
    script_len = size - (size_t)(script - buf);
  }

  cm_error_t err = CM_ERROR_INIT;
  srv_script_t s;
  int rc = srv_script_prepare(script, script_len, extra, &s, &err);
  if (rc == 0) {
    if (err.msg) abort();
    if (s.n_requirements != cm_strv_len(s.requirements)) abort();
    if (s.n_requirements > s.meta.n_dependencies + (extra ? json_array_size(extra) : 0)) abort();
    for (size_t i = 0; i < s.n_requirements; i++) {
      if (!s.parsed[i] || !s.parsed[i]->normalized_name) abort();
      for (size_t j = 0; j < i; j++)
        if (strcmp(s.parsed[i]->normalized_name, s.parsed[j]->normalized_name) == 0) abort();
    }
    srv_script_release(&s);
  } else {
    if (rc != -1 || !err.msg || (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT)) abort();
    /* Nothing is left to release (the leak checker sees it if something is). */
    if (s.requirements || s.parsed || s.n_requirements || s.meta.document) abort();
  }
  cm_error_release(&err);
  json_decref(extra);
  return 0;
}
