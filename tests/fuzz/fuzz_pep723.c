/* libFuzzer target for pystd/pep723.c: extract the script block, parse the metadata,
 * check the result contract, free. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "pystd/pystd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  cm_error_t err = CM_ERROR_INIT;
  pep723_block_t block;
  int found = pep723_extract(buf, size, &block, &err);
  if (found == 1) {
    if (block.content == NULL || block.content[block.content_len] != '\0') abort();
    if (block.content_len > size || block.first_line == 0 || block.last_line <= block.first_line)
      abort();
  } else if (found == 0) {
    if (block.content != NULL || err.msg != NULL) abort();
  } else if (found != -1 || err.kind != CM_ERR_INVALID || err.msg == NULL) {
    abort();
  }
  pep723_block_release(&block);
  cm_error_release(&err);

  pep723_metadata_t meta;
  int rc = pep723_parse_metadata(buf, size, &meta, &err);
  if (rc == 0) {
    if (meta.present != (found == 1) || (meta.present && meta.document == NULL)) abort();
    if (meta.dependencies) {
      if (cm_strv_len(meta.dependencies) != meta.n_dependencies) abort();
    } else if (meta.n_dependencies != 0) {
      abort();
    }
  } else {
    if (rc != -1 || err.msg == NULL || meta.document != NULL || meta.present) abort();
    if (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT) abort();
  }
  pep723_metadata_release(&meta);
  cm_error_release(&err);
  return 0;
}
