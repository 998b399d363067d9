/* Downloads (--allow-python-downloads): `uv python install`, then the new interpreters are
 * identified and join the list. */
#include <stdio.h>

#include "interp/interp-internal.h"

extern char **environ;

bool py_registry_can_download(py_registry_t *r) {
  if (!r->opts.allow_downloads) return false;
  cleanup_free char *uv = cm_find_executable(r->opts.uv_path);
  return uv != NULL;
}

static void download_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  py_registry_t *r = data;
  cm_headtail_append(&r->download_out, buf, len);
}

static void download_exit(void *data, const sbx_result_t *res) {
  py_registry_t *r = data;
  sbx_run_free(r->download);
  r->download = NULL;
  if (res->exit_code != 0) {
    r->downloads_failed++;
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&r->download_out, &head, &hl, &tail, &tl);
    size_t n;
    cleanup_free char *clean = cm_utf8_sanitize(tl ? tail : head, tl ? tl : hl, &n);
    cleanup_error cm_error_t err = CM_ERROR_INIT;
    cm_error_set(&err, 0, CM_ERR_UNAVAILABLE, "uv could not install that Python (exit code %d): %s",
                 res->exit_code, clean);
    cm_headtail_release(&r->download_out);
    py_download_cb cb = r->download_cb;
    r->download_cb = NULL;
    if (cb) cb(r->download_data, &err);
    return;
  }
  cm_headtail_release(&r->download_out);
  r->downloads_ok++;
  /* Find and identify what uv installed. */
  r->rescanning = true;
  if (r->uv_dir) py_scan_installs(r, r->uv_dir, "uv");
  py_probe_next(r);
}

void py_registry_download_counts(py_registry_t *r, uint64_t *ok, uint64_t *failed) {
  *ok = r->downloads_ok;
  *failed = r->downloads_failed;
}

int py_registry_download(py_registry_t *r, const char *request, py_download_cb cb, void *data,
                         cm_error_t *err) {
  if (r->download)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "another interpreter download is in progress; try again shortly");
  cleanup_free char *uv = cm_find_executable(r->opts.uv_path);
  if (!uv)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "uv was not found at '%s'", r->opts.uv_path);
  char *argv[] = {uv, "python", "install", (char *)(uintptr_t)request, NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = environ, /* uv's own settings (install dir, mirrors, proxies) */
      .workdir = "/",
      .network = true,
      .limits = {.timeout_ms = r->opts.download_timeout_ms, .grace_ms = 1000},
  };
  cm_headtail_init(&r->download_out, 2048, 4096);
  sbx_run_callbacks_t cbs = {.on_output = download_output, .on_exit = download_exit};
  if (sbx_run_start(r->loop, r->host, &spec, &cbs, r, &r->download, err) < 0) {
    cm_headtail_release(&r->download_out);
    return -1;
  }
  r->download_cb = cb;
  r->download_data = data;
  cm_info("downloading Python %s with uv", request);
  return 0;
}

void py_registry_cancel_download(py_registry_t *r) {
  r->download_cb = NULL;
}
