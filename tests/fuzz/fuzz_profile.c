/* libFuzzer target for the TOML profile loader (server/config.c srv_config_apply_profile):
 * the input is a profile's text, applied to the default configuration, which is then
 * validated and released.  Checks, beyond memory safety and leaks: a failure carries an
 * error of the documented kinds; a profile that applies leaves a configuration that
 * validates or fails with an error, never anything else. */
#include <stdint.h>
#include <stdlib.h>

#include "common/cm.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The log level a profile may set is process-wide: start every input alike. */
  cm_log_set_level(CM_LOG_OFF);
  srv_config_t c;
  srv_config_defaults(&c);
  cm_error_t err = CM_ERROR_INIT;
  int rc = srv_config_apply_profile(&c, (const char *)data, size, "fuzz.toml", &err);
  if (rc == 0) {
    if (err.msg) abort();
    if (srv_config_validate(&c, &err) < 0 && !err.msg) abort();
  } else if (rc != -1 || !err.msg || (err.kind != CM_ERR_INVALID && err.kind != CM_ERR_LIMIT)) {
    abort();
  }
  cm_error_release(&err);
  srv_config_release(&c);
  return 0;
}
