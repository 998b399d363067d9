/* Warming the wheelhouse from profiles/warmup.txt in the background. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>

#include "envstore/envstore-internal.h"

/* ---------------------------------------------------------------- warming */

typedef struct warm_job {
  env_store_t *store;
  sbx_run_t *run;
  sbx_call_t *import;
  env_space_t space;
  cm_headtail_t output;
  uint64_t started_ms;
} warm_job_t;

typedef struct wheel_import {
  int src_fd, dst_fd;
  uint64_t max_bytes;
} wheel_import_t;

/* Runs in a child: the downloaded wheels into the wheelhouse, each under a temporary name
 * first, so a build never sees half a wheel.  A wheel already there stays (it came from
 * the same kind of download) and counts as used now. */
static int import_wheels(void *arg, cm_buf_t *out, cm_error_t *err) {
  wheel_import_t *w = arg;
  DIR *d = env_list_dir(w->src_fd);
  if (!d) return cm_error_set(err, errno, CM_ERR_IO, "listing the downloads");
  uint64_t total = 0;
  unsigned added = 0, kept = 0, skipped = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!env_wheel_name_ok(e->d_name)) {
      skipped += e->d_name[0] != '.';
      continue;
    }
    struct stat st;
    cleanup_close int in = cm_open_regular_at(w->src_fd, e->d_name, O_RDONLY, CM_ANY_OWNER,
                                              w->max_bytes - CM_MIN(total, w->max_bytes), &st, err);
    if (in < 0) {
      cm_warn("wheelhouse: not taking %s: %s", e->d_name, cm_error_message(err));
      cm_error_release(err);
      skipped++;
      continue;
    }
    total += (uint64_t)st.st_size;
    if (utimensat(w->dst_fd, e->d_name, NULL, AT_SYMLINK_NOFOLLOW) == 0) {
      kept++;
      continue;
    }
    cleanup_free char *tmp = xasprintf(".tmp-%d-%s", (int)getpid(), e->d_name);
    cleanup_close int outfd =
        openat(w->dst_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (outfd < 0) {
      closedir(d);
      return cm_error_set(err, errno, CM_ERR_IO, "creating %s in the wheelhouse", tmp);
    }
    char buf[65536];
    uint64_t copied = 0;
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) != 0) {
      if (n < 0 && errno == EINTR) continue;
      copied += n > 0 ? (uint64_t)n : 0;
      if (n < 0 || copied > (uint64_t)st.st_size || cm_write_all(outfd, buf, (size_t)n) < 0) {
        rc = -1;
        break;
      }
    }
    if (rc < 0 || fchmod(outfd, 0644) < 0 ||
        renameat2(w->dst_fd, tmp, w->dst_fd, e->d_name, RENAME_NOREPLACE) < 0) {
      unlinkat(w->dst_fd, tmp, 0);
      skipped++;
      continue;
    }
    added++;
  }
  closedir(d);
  cm_buf_printf(out, "%u new, %u already there, %u not taken", added, kept, skipped);
  return 0;
}

void env_warm_free(warm_job_t *w) {
  env_store_t *s = w->store;
  if (s->warm == w) s->warm = NULL;
  if (w->run) sbx_run_free(w->run);
  sbx_call_free(w->import);
  env_space_remove(s, &w->space);
  cm_headtail_release(&w->output);
  free(w);
}

static void warm_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  warm_job_t *w = data;
  cm_headtail_append(&w->output, buf, len);
}

static void warm_imported(void *data, int rc, const char *text) {
  warm_job_t *w = data;
  w->import = NULL;
  if (rc == 0)
    cm_info("package cache warmed in %llums (wheelhouse: %s)",
            (unsigned long long)(cm_now_ms() - w->started_ms), text);
  env_store_t *s = w->store;
  if (rc != 0) {
    cm_warn("package cache warming did not complete: %s", text);
    s->counters.warm_failed++;
  }
  env_warm_free(w);
  env_evict(s);
}

static void warm_exit(void *data, const sbx_result_t *res) {
  warm_job_t *w = data;
  env_store_t *s = w->store;
  sbx_run_free(w->run);
  w->run = NULL;
  if (res->exit_code != 0) {
    cleanup_free char *head = NULL, *tail = NULL;
    size_t hl, tl;
    cm_headtail_get(&w->output, &head, &hl, &tail, &tl);
    cleanup_free char *excerpt = cm_log_excerpt(tl ? tail : head, tl ? tl : hl, 300);
    cm_warn("package cache warming did not complete (exit code %d): %s", res->exit_code, excerpt);
    s->counters.warm_failed++;
    env_warm_free(w);
    return;
  }
  cleanup_free char *dl = xasprintf("%s/dl", w->space.work);
  cleanup_close int src = open(dl, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  cm_error_t err = CM_ERROR_INIT;
  wheel_import_t imp = {
      .src_fd = src, .dst_fd = s->wheels_fd, .max_bytes = s->opts.max_build_bytes};
  int keep[] = {src, s->wheels_fd};
  if (src < 0 || s->wheels_fd < 0 ||
      sbx_call_start(s->loop, import_wheels, &imp, keep, 2, s->opts.build_timeout_ms, warm_imported,
                     w, &w->import, &err) < 0) {
    s->counters.warm_failed++;
    cm_warn("package cache warming did not complete: %s", src < 0 ? "no downloads"
                                                          : s->wheels_fd < 0
                                                              ? "no wheelhouse"
                                                              : cm_error_message(&err));
    cm_error_release(&err);
    env_warm_free(w);
  }
}

void env_store_warm(env_store_t *s, const py_interp_t *py, const char *warmup_file) {
  if (s->warm || !py) return;
  cleanup_free char *text = NULL;
  size_t len;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_read_file(warmup_file, 1u << 20, &text, &len, &err) < 0) {
    cm_warn("cache warming: %s", cm_error_message(&err));
    s->counters.warm_failed++;
    cm_error_release(&err);
    return;
  }
  warm_job_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->started_ms = cm_now_ms();
  cm_headtail_init(&w->output, 2048, 2048);
  env_space_init(&w->space);
  if (env_space_make(s, "warm", false, &w->space, &err) < 0) {
    cm_warn("cache warming: %s", cm_error_message(&err));
    s->counters.warm_failed++;
    cm_error_release(&err);
    env_warm_free(w);
    return;
  }
  /* Binary wheels only: no package code runs to make what builds will share. */
  cleanup_free char *dest = xasprintf("%s/dl", env_backend_maps(s) ? "/work" : w->space.work);
  cm_strv_builder_t a = {0};
  cm_strv_addv(&a, py->executable, "-m", "pip", "download", "--quiet", "--no-input",
               "--only-binary=:all:", "--dest", dest, NULL);
  env_index_args(s, false, false, &a);
  size_t n_pkgs = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    while (*line == ' ' || *line == '\t') line++;
    char *end = line + strlen(line);
    while (end > line && (end[-1] == ' ' || end[-1] == '\r' || end[-1] == '\t')) *--end = '\0';
    if (!*line || *line == '#') continue;
    pep508_requirement_t *q = NULL;
    if (pep508_requirement_parse(line, strlen(line), &q, NULL) < 0) continue;
    pep508_requirement_free(q);
    if (n_pkgs++ == 0) cm_strv_add(&a, "--");
    cm_strv_add(&a, line);
  }
  if (n_pkgs == 0) {
    cm_strv_free(a.v);
    env_warm_free(w);
    return;
  }
  sbx_run_callbacks_t cbs = {.on_output = warm_output, .on_exit = warm_exit};
  if (env_start_installer_run(s, py->prefix, a.v, &w->space, NULL, &cbs, w, &w->run, &err) < 0) {
    cm_warn("cache warming could not start: %s", cm_error_message(&err));
    s->counters.warm_failed++;
    cm_error_release(&err);
    env_warm_free(w);
  } else {
    s->warm = w;
    cm_info("warming the package cache with %zu packages in the background", n_pkgs);
  }
  cm_strv_free(a.v);
}
