/* The run spec: the typed inputs of one run, and where a call's timeout is decided. */
#include "server/exec/exec-internal.h"

void exec_spec_set_timeout(exec_spec_t *spec, const srv_config_t *cfg, uint64_t requested_s) {
  free(spec->timeout_note);
  spec->timeout_note = NULL;
  uint64_t s = requested_s ? requested_s : cfg->default_timeout;
  if (requested_s > cfg->max_timeout) {
    /* The call still runs, with the most the server allows, and its result says so. */
    spec->timeout_note =
        xasprintf("timeout_seconds %llu exceeds the server maximum; %llu was used",
                  (unsigned long long)requested_s, (unsigned long long)cfg->max_timeout);
    s = cfg->max_timeout;
  }
  spec->timeout_ms = s * 1000;
}

void exec_spec_release(exec_spec_t *spec) {
  free(spec->script);
  cm_strv_free(spec->requirements);
  free(spec->uv_config);
  free(spec->python_request);
  free(spec->requires_python);
  free(spec->timeout_note);
  srv_net_call_release(&spec->net);
  files_inputs_release(&spec->inputs);
  free(spec->principal);
  free(spec->session);
  memset(spec, 0, sizeof *spec);
}
