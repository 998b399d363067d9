/* A build: its waiters, its steps (venv, install, inspect, copy) and its publication. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <time.h>

#include "envstore/envstore-internal.h"

static void build_next_step(env_build_t *b);
static void add_uv_config(env_build_t *b, cm_strv_builder_t *a);
static void publish(env_build_t *b, uint64_t size);
static void build_progress(env_build_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- waiters */

static void flush_answers(void *data) {
  env_store_t *s = data;
  s->answers_scheduled = false;
  while (s->answers) {
    env_waiter_t *w = s->answers;
    s->answers = w->next;
    if (!w->cancelled)
      w->cb(w->data, w->hit, w->hit ? NULL : &w->error);
    else
      env_release(w->hit);
    cm_error_release(&w->error);
    free(w->owner);
    free(w);
  }
}

/* Every answer goes through here and reaches its callback from the loop, never from inside
 * the call that produced it (env_store_ensure keeps its promise whatever path answers). */
static void answer(env_waiter_t *w, env_handle_t *env, cm_error_kind_t kind, const char *error) {
  env_store_t *s = w->store;
  w->build = NULL;
  w->hit = env;
  /* Valid UTF-8 whatever the build made: an error may name its files (a JSON string of
   * anything else would leave the call without an answer). */
  if (!error) error = "The environment could not be built.";
  if (!env) {
    size_t n;
    cleanup_free char *clean = cm_utf8_sanitize(error, strlen(error), &n);
    cm_error_set(&w->error, 0, kind, "%s", clean);
  }
  w->next = NULL;
  env_waiter_t **p = &s->answers;
  while (*p) p = &(*p)->next;
  *p = w;
  if (!s->answers_scheduled) {
    s->answers_scheduled = true;
    cm_loop_defer(s->loop, flush_answers, s);
  }
}
static void build_progress(env_build_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *msg = xvasprintf(fmt, ap);
  va_end(ap);
  for (env_waiter_t *w = b->waiters; w; w = w->next)
    if (!w->cancelled && w->progress) w->progress(w->data, msg, strlen(msg));
}

void env_build_free(env_build_t *b) {
  env_store_t *s = b->store;
  for (env_build_t **p = &s->builds; *p; p = &(*p)->next) {
    if (*p == b) {
      *p = b->next;
      break;
    }
  }
  cm_timer_cancel(b->lock_retry);
  if (b->run) sbx_run_free(b->run);
  sbx_call_free(b->copy);
  if (b->copy_name) env_discard(s, s->envs_fd, b->copy_name, "trash"); /* a copy never published */
  env_space_remove(s, &b->space);
  sbx_identity_free(b->identity); /* after the run: nothing of it is left */
  if (b->lock_fd >= 0) close(b->lock_fd);
  free(b->key);
  free(b->final_dir);
  free(b->copy_name);
  free(b->lock_path);
  free(b->py.executable);
  free(b->py.version);
  free(b->py.implementation);
  free(b->py.prefix);
  cm_strv_free(b->requirements);
  free(b->uv_config);
  free(b->owner);
  cm_headtail_release(&b->output);
  cm_buf_release(&b->line);
  cm_buf_release(&b->inspect);
  free(b);
}

/* Ends the build with an error for every waiter: kind says what failed (CM_ERR_LIMIT: a
 * bound of the build; CM_ERR_UNAVAILABLE: the installer; CM_ERR_IO: the store's disk). */
static void build_fail(env_build_t *b, cm_error_kind_t kind, const char *error) {
  b->store->counters.builds_failed++;
  b->store->counters.build_ms += cm_now_ms() - b->started_ms;
  env_waiter_t *w = b->waiters;
  b->waiters = NULL;
  env_build_free(b);
  while (w) {
    env_waiter_t *next = w->next;
    answer(w, NULL, kind, error);
    w = next;
  }
}

/* Ends the build with the finished environment (published here or by another server) for
 * every waiter.  We hold the key's lock exclusively; each waiter's handle needs it shared,
 * so ours becomes shared first (not atomically: should another server take it in between,
 * the handles find that and the waiters get an error rather than a vanishing environment). */
static void build_ready(env_build_t *b, bool cached) {
  env_store_t *s = b->store;
  s->counters.build_ms += cm_now_ms() - b->started_ms;
  bool shared = flock(b->lock_fd, LOCK_SH | LOCK_NB) == 0;
  env_waiter_t *w = b->waiters;
  b->waiters = NULL;
  cleanup_free char *key = xstrdup(b->key);
  bool pinned = b->pinned;
  while (w) {
    env_waiter_t *next = w->next;
    env_handle_t *h = shared ? env_handle_open(s, key, pinned, cached) : NULL;
    answer(w, h, CM_ERR_UNAVAILABLE,
           "The environment was removed by another server as it became ready; please try again.");
    w = next;
  }
  /* Room was made before the build; now that its size is known, the builder's share and the
   * total are enforced again (the new environment is locked: ours, and its callers'). */
  if (!cached) env_evict(s);
  env_build_free(b);
}

static char *output_tail(env_build_t *b) {
  cleanup_free char *head = NULL, *tail = NULL;
  size_t hl, tl;
  cm_headtail_get(&b->output, &head, &hl, &tail, &tl);
  cm_buf_t out;
  cm_buf_init(&out, 0);
  cm_buf_append(&out, head, hl);
  if (tl) {
    cm_buf_appends(&out, "\n...\n");
    cm_buf_append(&out, tail, tl);
  }
  char *raw = cm_buf_steal(&out);
  size_t n;
  char *clean = cm_utf8_sanitize(raw, strlen(raw), &n);
  free(raw);
  /* Trim trailing blank lines. */
  while (n && (clean[n - 1] == '\n' || clean[n - 1] == ' ')) clean[--n] = '\0';
  return clean;
}

static void on_step_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  env_build_t *b = data;
  if (b->step == STEP_INSPECT && stream == SBX_STDOUT) {
    cm_buf_append(&b->inspect, buf, len);
    return;
  }
  cm_headtail_append(&b->output, buf, len);
  /* Whole lines become progress messages ("Collecting x", "Installing collected ..."). */
  for (size_t i = 0; i < len; i++) {
    if (buf[i] == '\n' || buf[i] == '\r') {
      if (b->line.len) build_progress(b, "%s", b->line.data);
      cm_buf_reset(&b->line);
    } else if (b->line.len < ENV_PROGRESS_LINE_MAX) {
      cm_buf_append(&b->line, &buf[i], 1);
    }
  }
}

/* When the installer ran out of space, which disk: the cache's, or (when that one has room)
 * the sandbox's own /tmp. */
static char *disk_note(const char *tail, const char *envs_dir) {
  if (!strstr(tail, "No space left on device")) return xstrdup("");
  struct statvfs v;
  if (statvfs(envs_dir, &v) < 0) return xstrdup("");
  double free_mib = (double)v.f_bavail * (double)v.f_frsize / (1024.0 * 1024.0);
  double size_mib = (double)v.f_blocks * (double)v.f_frsize / (1024.0 * 1024.0);
  return xasprintf(
      "\n(The disk of the environment cache, %s, has %.1f MiB free of %.1f MiB; with room there, "
      "it is the build's own space, see --max-build-bytes.)",
      envs_dir, free_mib, size_mib);
}

static void on_step_exit(void *data, const sbx_result_t *res) {
  env_build_t *b = data;
  sbx_run_free(b->run);
  b->run = NULL;
  if (res->exit_code != 0 || res->timed_out || res->cancelled) {
    cleanup_free char *tail = output_tail(b);
    cleanup_free char *disk = disk_note(tail, b->store->envs_dir);
    const char *what = b->step == STEP_VENV      ? "creating the virtual environment"
                       : b->step == STEP_INSTALL ? "installing the dependencies"
                                                 : "inspecting the environment";
    cleanup_free char *bound =
        res->timed_out ? NULL : env_bound_message(b->store, &b->space, res, tail);
    /* Two failures say more in a sentence than in the installer's wall (logged below): an
     * index this server cannot reach, and an interpreter without pip. */
    bool plain = !res->timed_out && !bound && !res->cancelled && b->step == STEP_INSTALL;
    cleanup_free char *why =
        plain ? env_no_pip_message(b->store, false, b->py.executable, tail) : NULL;
    if (plain && !why) why = env_unreachable_message(b->store, tail);
    if (why) {
      cm_warn("environment %s: installing the dependencies failed (exit code %d):\n%s", b->key,
              res->exit_code, tail);
      cleanup_free char *msg = xasprintf("Building the environment failed: %s", why);
      build_fail(b, CM_ERR_UNAVAILABLE, msg);
      return;
    }
    cleanup_free char *msg =
        res->timed_out
            ? xasprintf("Building the environment failed: %s took longer than %llus.\n%s", what,
                        (unsigned long long)(b->store->opts.build_timeout_ms / 1000), tail)
        : bound ? xasprintf("Building the environment failed while %s: %s.\n%s", what, bound, tail)
                : xasprintf("Building the environment failed while %s (exit code %d):\n%s%s", what,
                            res->exit_code, tail, disk);
    cm_warn("environment %s: %s", b->key, msg);
    build_fail(b, res->timed_out || bound ? CM_ERR_LIMIT : CM_ERR_UNAVAILABLE, msg);
    return;
  }
  b->step++;
  build_next_step(b);
}

/* Each step after the first gets a /tmp of its own, made here and empty: bwrap (as root)
 * creates the mount points of read-only binds below /tmp (a --find-links directory there)
 * inside it, following symlinks, so a /tmp an earlier step wrote could steer those mkdirs
 * anywhere on the host.  The old one stays in the space, counted, until the space goes. */
static int step_tmp(env_space_t *sp, build_step_t step, cm_error_t *err) {
  if (step == STEP_VENV) return 0;
  char *tmp = xasprintf("%s/tmp-%d", sp->dir, (int)step);
  if (mkdir(tmp, 0700) < 0) {
    int e = errno;
    free(tmp);
    return cm_error_set(err, e, CM_ERR_IO, "creating the build's /tmp");
  }
  free(sp->tmp);
  sp->tmp = tmp;
  return 0;
}

static void build_run(env_build_t *b, char **argv) {
  cm_headtail_release(&b->output);
  cm_headtail_init(&b->output, ENV_STEP_OUTPUT_TAIL / 4, ENV_STEP_OUTPUT_TAIL);
  sbx_run_callbacks_t cbs = {.on_output = on_step_output, .on_exit = on_step_exit};
  cm_error_t err = CM_ERROR_INIT;
  if (step_tmp(&b->space, b->step, &err) < 0 ||
      env_start_installer_run(b->store, b->py.prefix, argv, &b->space, b->identity, &cbs, b,
                              &b->run, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_kind_t kind = err.kind;
    cm_error_release(&err);
    build_fail(b, kind, msg);
  }
}

static void on_copied(void *data, int rc, const char *text) {
  env_build_t *b = data;
  b->copy = NULL;
  if (rc < 0) {
    /* The child removed its partial copy (or it is removed as trash by build_free). */
    cleanup_free char *disk = disk_note(text, b->store->envs_dir);
    cleanup_free char *msg = xasprintf("Building the environment failed: %s.%s", text, disk);
    cm_warn("environment %s: %s", b->key, msg);
    build_fail(b, CM_ERR_IO, msg);
    return;
  }
  uint64_t size = 0;
  (void)cm_parse_u64(text, UINT64_MAX, &size);
  publish(b, size);
}

static void start_copy(env_build_t *b) {
  env_store_t *s = b->store;
  build_progress(b, "storing the environment");
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int src =
      open(b->space.env, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (src < 0) {
    cleanup_free char *msg = xasprintf(
        "Building the environment failed: the environment's directory: %s", strerror(errno));
    build_fail(b, CM_ERR_IO, msg);
    return;
  }
  b->copy_name = xasprintf(".staging-%s-%d-%u", b->key, (int)getpid(), s->serial++);
  /* The child has its own copy of this (and of every string it points to). */
  env_copy_t c = {
      .src_fd = src,
      .dst_parent_fd = s->envs_fd,
      .dst_name = b->copy_name,
      .max_bytes = s->opts.max_build_bytes,
      .reloc_from = env_backend_maps(s) ? NULL : b->space.env,
      .reloc_to = env_backend_maps(s) ? NULL : b->final_dir,
  };
  int keep[] = {src, s->envs_fd};
  if (sbx_call_start(s->loop, env_copy_run, &c, keep, CM_ARRAY_SIZE(keep), s->opts.build_timeout_ms,
                     on_copied, b, &b->copy, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_kind_t kind = err.kind;
    cm_error_release(&err);
    free(b->copy_name);
    b->copy_name = NULL;
    build_fail(b, kind, msg);
  }
}

/* The copy is the server's: the manifest goes into it, then it is renamed into place. */
static void publish(env_build_t *b, uint64_t size) {
  env_store_t *s = b->store;
  json_t *packages = b->inspect.len ? json_loadb(b->inspect.data, b->inspect.len, 0, NULL) : NULL;
  if (!json_is_object(packages)) {
    json_decref(packages);
    packages = json_object();
  }
  json_t *requested = json_array();
  size_t requested_bytes = 0;
  for (size_t i = 0; i < b->n_requirements; i++) requested_bytes += strlen(b->requirements[i]);
  for (size_t i = 0; i < b->n_requirements && requested_bytes <= ENV_MANIFEST_PART_MAX; i++)
    json_array_append_new(requested, json_string(b->requirements[i]));
  json_t *m =
      json_pack("{s:i, s:s, s:{s:s, s:s, s:s}, s:o, s:o, s:s, s:I, s:I, s:b, s:I, s:s?}", "format",
                ENV_FORMAT, "key", b->key, "python", "executable", b->py.executable, "version",
                b->py.version, "implementation", b->py.implementation, "requested", requested,
                "packages", packages, "installer", s->uv ? "uv" : "pip", "created",
                (json_int_t)time(NULL), "size", (json_int_t)size, "pinned", b->pinned, "build_ms",
                (json_int_t)(cm_now_ms() - b->started_ms), "built_by", b->owner);
  if (json_array_size(requested) < b->n_requirements)
    json_object_set_new(m, "requested_count", json_integer((json_int_t)b->n_requirements));
  cleanup_free char *text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
  json_decref(m);
  if (strlen(text) > ENV_MANIFEST_MAX) {
    /* It could never be read back (load_manifest): every call would build it again. */
    cleanup_free char *msg =
        xasprintf("Building the environment failed: its manifest would be %zu bytes, more than %u",
                  strlen(text), ENV_MANIFEST_MAX);
    build_fail(b, CM_ERR_LIMIT, msg);
    return;
  }
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(s->envs_fd, b->copy_name, &err);
  if (dfd < 0 || cm_create_file_at(dfd, ENV_MANIFEST, text, strlen(text), 0644, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_kind_t kind = err.kind;
    cm_error_release(&err);
    build_fail(b, kind, msg);
    return;
  }
  /* Publish atomically.  An older environment with the same key (re-resolved because it
   * was too old) moves aside first: we hold the key's lock exclusively, so no run uses it. */
  struct stat st;
  if (fstatat(s->envs_fd, b->key, &st, AT_SYMLINK_NOFOLLOW) == 0)
    env_discard(s, s->envs_fd, b->key, "old");
  if (renameat(s->envs_fd, b->copy_name, s->envs_fd, b->key) < 0) {
    cleanup_free char *msg = xasprintf("Publishing the environment failed: %s", strerror(errno));
    build_fail(b, CM_ERR_IO, msg);
    return;
  }
  free(b->copy_name);
  b->copy_name = NULL;
  b->step = STEP_DONE;
  cm_info("environment %s built in %llums (%zu requirements, %llu bytes)", b->key,
          (unsigned long long)(cm_now_ms() - b->started_ms), b->n_requirements,
          (unsigned long long)size);
  build_progress(b, "environment ready");
  build_ready(b, false);
}

static char inspect_code[] =
    "import json\n"
    "try:\n"
    "    import importlib.metadata as md\n"
    "except ImportError:\n"
    "    print('{}'); raise SystemExit(0)\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in md.distributions() if "
    "d.metadata['Name']}))\n";

static void build_next_step(env_build_t *b) {
  env_store_t *s = b->store;
  bool maps = env_backend_maps(s);
  const char *env_path = maps ? ENV_TARGET : b->space.env;
  cleanup_free char *env_python = xasprintf("%s/bin/python", env_path);
  cm_strv_builder_t a = {0};
  switch (b->step) {
    case STEP_VENV:
      build_progress(b, "creating an environment for Python %s", b->py.version);
      if (s->uv) {
        cm_strv_add(&a, s->uv);
        cm_strv_add(&a, "venv");
        add_uv_config(b, &a);
        cm_strv_addv(&a, "--quiet", "--python", b->py.executable, env_path, NULL);
      } else {
        cm_strv_addv(&a, b->py.executable, "-m", "venv", "--without-pip", env_path, NULL);
      }
      break;
    case STEP_INSTALL:
      build_progress(b, "installing %zu requirement%s", b->n_requirements,
                     b->n_requirements == 1 ? "" : "s");
      if (b->uv_config && !s->uv)
        build_progress(
            b,
            "note: the script's [tool.uv] settings apply only when uv installs; pip ignores them");
      if (s->uv) {
        cm_strv_addv(&a, s->uv, "pip", "install", NULL);
        add_uv_config(b, &a);
        cm_strv_add(&a, "--python");
        cm_strv_add(&a, env_python);
      } else {
        /* The interpreter's own pip, installing into the environment (pip >= 22.3). */
        cm_strv_addv(&a, b->py.executable, "-m", "pip", "--python", env_python, "install",
                     "--no-input", NULL);
      }
      env_index_args(s, s->uv != NULL, true, &a);
      cm_strv_add(&a, "--");
      for (size_t i = 0; i < b->n_requirements; i++) cm_strv_add(&a, b->requirements[i]);
      break;
    case STEP_INSPECT:
      cm_strv_addv(&a, env_python, "-I", "-c", inspect_code, NULL);
      break;
    case STEP_COPY:
      start_copy(b);
      return;
    case STEP_DONE:
      return;
  }
  build_run(b, a.v);
  cm_strv_free(a.v);
}

static int prepare_build(env_build_t *b, cm_error_t *err) {
  env_store_t *s = b->store;
  if (env_space_make(s, "build", true, &b->space, err) < 0) return -1;
  if (b->uv_config && s->uv) {
    cleanup_free char *path = xasprintf("%s/uv.toml", b->space.work);
    if (cm_write_file(path, b->uv_config, strlen(b->uv_config), 0644, err) < 0) return -1;
  }
  b->identity = sbx_identity_new(s->backend);
  return 0;
}

/* uv reads the script's [tool.uv] settings from a file in the build's work directory. */
static void add_uv_config(env_build_t *b, cm_strv_builder_t *a) {
  if (!b->uv_config || !b->store->uv) return;
  cm_strv_add(a, "--config-file");
  if (env_backend_maps(b->store))
    cm_strv_add(a, "/work/uv.toml");
  else
    cm_strv_addf(a, "%s/uv.toml", b->space.work);
}

/* Removes copies that a crashed build of this key left behind (we hold the key's
 * exclusive lock, so no live build owns them). */
static void remove_stale_staging(env_store_t *s, const char *key) {
  DIR *d = env_list_dir(s->envs_fd);
  if (!d) return;
  cleanup_free char *prefix = xasprintf(".staging-%s-", key);
  cm_strv_builder_t stale = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) cm_strv_add(&stale, e->d_name);
  closedir(d);
  for (size_t i = 0; i < stale.n; i++) {
    cm_warn("removing an unfinished environment build left behind: %s/%s", s->envs_dir, stale.v[i]);
    env_discard(s, s->envs_fd, stale.v[i], "trash");
  }
  cm_strv_free(stale.v);
}

static void try_lock(cm_loop_t *loop, cm_timer_t *t, void *data) {
  env_build_t *b = data;
  b->lock_retry = NULL;
  if (flock(b->lock_fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      cleanup_free char *msg = xasprintf("Locking the environment failed: %s", strerror(errno));
      build_fail(b, CM_ERR_IO, msg);
      return;
    }
    /* Another server is building or evicting it, or a run uses the one that is too old to
     * keep: wait, without blocking the loop. */
    if (!b->said_waiting) cm_info("environment %s is locked elsewhere: waiting for it", b->key);
    b->said_waiting = true;
    b->lock_retry = cm_loop_timer(b->store->loop, ENV_LOCK_RETRY_MS, try_lock, b);
    return;
  }
  /* Another server may have finished it while we waited. */
  json_t *m = env_load_manifest(b->store, b->key, b->pinned, false, NULL);
  if (m) {
    json_decref(m);
    build_ready(b, true);
    return;
  }
  remove_stale_staging(b->store, b->key);
  env_evict(b->store);
  cm_error_t err = CM_ERROR_INIT;
  if (prepare_build(b, &err) < 0) {
    cleanup_free char *msg =
        xasprintf("Building the environment failed: %s", cm_error_message(&err));
    cm_error_kind_t kind = err.kind;
    cm_error_release(&err);
    build_fail(b, kind, msg);
    return;
  }
  b->started_ms = cm_now_ms();
  b->step = STEP_VENV;
  build_next_step(b);
}

void *env_store_ensure(env_store_t *s, const py_interp_t *py, char *const *requirements, size_t n,
                       const char *uv_config, const char *owner, env_ready_cb cb,
                       env_progress_cb progress, void *data) {
  env_waiter_t *w = xcalloc(1, sizeof *w);
  w->store = s;
  w->cb = cb;
  w->progress = progress;
  w->data = data;
  w->owner = owner ? xstrdup(owner) : NULL;
  if (!s->uv && strcmp(s->opts.installer, "uv") == 0) {
    cleanup_free char *msg =
        xasprintf("The server is configured with --installer uv, but uv was not found at '%s'.",
                  s->opts.uv_path);
    answer(w, NULL, CM_ERR_UNAVAILABLE, msg); /* from the loop, like every answer */
    return w;
  }
  bool pinned = true;
  for (size_t i = 0; i < n; i++) pinned = pinned && env_requirement_pinned(requirements[i]);
  cleanup_free char *key = env_key(s, py, requirements, n, uv_config);
  /* A build of this key in progress here: join it. */
  for (env_build_t *b = s->builds; b; b = b->next) {
    if (strcmp(b->key, key) == 0) {
      s->counters.joined++;
      w->build = b;
      w->next = b->waiters;
      b->waiters = w;
      return w;
    }
  }
  env_handle_t *hit = s->envs_fd >= 0 ? env_handle_open(s, key, pinned, true) : NULL;
  if (hit) {
    s->counters.hits++;
    answer(w, hit, CM_ERR_NONE, NULL);
    return w;
  }
  s->counters.builds++;
  env_build_t *b = xcalloc(1, sizeof *b);
  b->started_ms = cm_now_ms();
  b->store = s;
  b->key = xstrdup(key);
  b->final_dir = xasprintf("%s/%s", s->envs_dir, key);
  b->lock_path = xasprintf("%s/%s.lock", s->envs_dir, key);
  b->lock_fd = open(b->lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  b->py.executable = xstrdup(py->executable);
  b->py.version = xstrdup(py->version);
  b->py.implementation = xstrdup(py->implementation);
  b->py.prefix = xstrdup(py->prefix);
  b->requirements = xcalloc(n + 1, sizeof *b->requirements);
  for (size_t i = 0; i < n; i++) b->requirements[i] = xstrdup(requirements[i]);
  b->n_requirements = n;
  b->pinned = pinned;
  b->uv_config = uv_config ? xstrdup(uv_config) : NULL;
  b->owner = owner ? xstrdup(owner) : NULL;
  env_space_init(&b->space);
  cm_headtail_init(&b->output, 1024, 1024);
  cm_buf_init(&b->line, ENV_PROGRESS_LINE_MAX + 1);
  /* What the inspect step prints goes into the manifest (ENV_MANIFEST_PART_MAX). */
  cm_buf_init(&b->inspect, ENV_MANIFEST_PART_MAX);
  b->next = s->builds;
  s->builds = b;
  w->build = b;
  b->waiters = w;
  b->lock_retry = cm_loop_timer(s->loop, 0, try_lock, b);
  return w;
}

void env_store_cancel(env_store_t *s, void *handle) {
  if (!handle) return;
  env_waiter_t *w = handle;
  w->cancelled = true;
  /* A build goes on for its other waiters (and for the cache); with none left, stop it. */
  env_build_t *b = w->build;
  if (!b) return;
  env_waiter_t *other = NULL, *same = NULL;
  for (env_waiter_t *x = b->waiters; x; x = x->next) {
    if (x->cancelled) continue;
    if (!other) other = x;
    if (!same && x->owner && b->owner && strcmp(x->owner, b->owner) == 0) same = x;
  }
  if (other) {
    /* The build is charged (built_by) to a principal still asking for it: the one that
     * started it and gave up must not pay for another's environment. */
    if (!same) {
      free(b->owner);
      b->owner = other->owner ? xstrdup(other->owner) : NULL;
    }
    return;
  }
  if (b->run) {
    sbx_run_cancel(b->run); /* its exit fails the build */
    return;
  }
  /* Waiting for the lock, or copying: it would go on with no call (and no slot) of anyone's
   * behind it, its space and copy kept meanwhile. */
  build_fail(b, CM_ERR_UNAVAILABLE, "The environment's build was cancelled.");
}
