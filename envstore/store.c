/* The environment store (see envstore.h): creating and freeing it, and the start-up sweeps.
 *
 * What a build may touch, and what the server touches of it.  A build (and a warm-up, a
 * dry-run resolution) gets a space of its own: <runs>/build-XXXXXX with env/ (the venv
 * being built, /env in the sandbox), work/ (its cwd), cache/ (a private, empty download
 * cache) and tmp/ (its /tmp), all on one size-capped tmpfs of its own when the server is
 * root (--max-build-bytes: a build that writes more gets ENOSPC), on disk otherwise (each
 * file bounded by RLIMIT_FSIZE).  Every step of a build runs as one fresh uid of its own
 * (sbx_identity_t) in a cgroup of its own per step.  Nothing another build reads is
 * writable by it: the only thing builds share is the wheelhouse (<state>/downloads/wheels),
 * which only the server writes (binary wheels the warm-up downloaded: no package code ran
 * to make them) and builds see read-only.
 *
 * The server never works inside a space on the event loop: once the last step is over
 * (every process of the sandbox is gone), a forked child (sbx_call) copies the environment
 * out of the space into <state>/envs/.staging-<key>-<pid>-<n>, a tree the server made and
 * owns (regular files, directories and symlinks only, never following one; a FIFO, socket
 * or device fails the build; set-id bits gone; the total bounded).  The manifest is then
 * written into that copy and the copy renamed into place; the space is dropped with its
 * tmpfs.  Big removals (an evicted environment, a space on disk) run in such a child too. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>

#include "envstore/envstore-internal.h"

/* ---------------------------------------------------------------- start-up */

/* What servers that are gone may have left in envs/ (or the state directory): trees moved
 * aside for removal. */
static void sweep_dir(env_store_t *s, int dir_fd) {
  DIR *d = env_list_dir(dir_fd);
  if (!d) return;
  cm_strv_builder_t gone = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, ".old-", 5) || !strncmp(e->d_name, ".evicted-", 9) ||
        !strncmp(e->d_name, ".trash-", 7))
      cm_strv_add(&gone, e->d_name);
  closedir(d);
  for (size_t i = 0; i < gone.n; i++) env_remove_later(s, dir_fd, gone.v[i]);
  cm_strv_free(gone.v);
}

/* Copies of builds that a server killed while copying left in envs/ (never published, never
 * counted): gone unless a live server builds that key (it holds the key's lock). */
static void sweep_staging(env_store_t *s) {
  DIR *d = env_list_dir(s->envs_fd);
  if (!d) return;
  cm_strv_builder_t stale = {0};
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, ".staging-", 9)) cm_strv_add(&stale, e->d_name);
  closedir(d);
  for (size_t i = 0; i < stale.n; i++) {
    cleanup_free char *key = xstrndup(stale.v[i] + 9, strcspn(stale.v[i] + 9, "-"));
    cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, key);
    cleanup_close int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) continue;
    cm_warn("removing an unfinished environment build left behind: %s/%s", s->envs_dir, stale.v[i]);
    env_discard(s, s->envs_fd, stale.v[i], "trash");
  }
  cm_strv_free(stale.v);
}

/* ---------------------------------------------------------------- public */

env_store_t *env_store_new(cm_loop_t *loop, const env_options_t *opts, const char *state_dir,
                           const char *runs_dir, sbx_backend_t *backend) {
  env_store_t *s = xcalloc(1, sizeof *s);
  s->loop = loop;
  s->opts = *opts;
  const env_options_t *cfg = &s->opts;
  s->backend = backend;
  s->state_dir = xstrdup(state_dir);
  s->envs_dir = xasprintf("%s/envs", state_dir);
  s->downloads_dir = xasprintf("%s/downloads", state_dir);
  s->wheels_dir = xasprintf("%s/" ENV_WHEELHOUSE, s->downloads_dir);
  s->runs_dir = xstrdup(runs_dir);
  s->state_fd = s->envs_fd = s->wheels_fd = s->runs_fd = -1;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(s->envs_dir, 0755, &err) < 0)
    cm_warn("environment store: %s", cm_error_message(&err));
  cm_error_release(&err);
  /* envs/ is traversable so that an environment can be mounted; the state dir above it is not. */
  chmod(s->envs_dir, 0755);
  s->state_fd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  s->envs_fd = open(s->envs_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  s->runs_fd = open(runs_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (s->state_fd < 0 || s->envs_fd < 0 || s->runs_fd < 0)
    cm_warn("environment store: cannot open its directories: %s", strerror(errno));
  /* The sweeps first: what clean_downloads moves aside is already on its way out. */
  if (s->envs_fd >= 0) sweep_dir(s, s->envs_fd);
  if (s->envs_fd >= 0) sweep_staging(s);
  if (s->envs_fd >= 0) env_listing_prime(s); /* (check_environment and /metrics find one) */
  if (s->state_fd >= 0) sweep_dir(s, s->state_fd);
  if (s->state_fd >= 0) env_clean_downloads(s);
  bool want_uv = strcmp(cfg->installer, "pip") != 0;
  if (want_uv) {
    char *uv = cm_find_executable(cfg->uv_path);
    char real[4096];
    if (uv && realpath(uv, real)) {
      free(uv);
      uv = xstrdup(real);
    }
    s->uv = uv;
    if (!uv && strcmp(cfg->installer, "uv") == 0)
      cm_warn("--installer uv: uv not found at '%s'; dependency installs will fail", cfg->uv_path);
  }
  s->installer_desc =
      s->uv ? xasprintf("uv (%s)", s->uv) : xstrdup("pip (the interpreter's own, into a venv)");
  return s;
}

void env_store_backend_probed(env_store_t *s) {
  if (!s->uv || strcmp(s->opts.installer, "auto") != 0 || sbx_backend_has_uv(s->backend)) return;
  cm_info(
      "the %s sandbox's image has no uv: environments are built with the image's pip "
      "(--installer auto)",
      sbx_backend_name(s->backend));
  free(s->uv);
  s->uv = NULL;
  free(s->installer_desc);
  s->installer_desc = xstrdup("pip (the image's own, into a venv: the image has no uv)");
}

const char *env_store_installer(env_store_t *s) {
  return s->installer_desc;
}

void env_store_free(env_store_t *s) {
  if (!s) return;
  s->closing = true;
  if (s->warm) env_warm_free(s->warm);
  while (s->resolves) env_resolve_free(s->resolves); /* no callback: the callers are going too */
  while (s->builds) {
    env_build_t *b = s->builds;
    env_waiter_t *w = b->waiters;
    b->waiters = NULL;
    while (w) {
      env_waiter_t *next = w->next;
      free(w->owner);
      free(w);
      w = next;
    }
    env_build_free(b);
  }
  while (s->answers) {
    env_waiter_t *w = s->answers;
    s->answers = w->next;
    env_release(w->hit);
    cm_error_release(&w->error);
    free(w->owner);
    free(w);
  }
  while (s->removals) {
    env_removal_t *r = s->removals;
    sbx_call_free(r->call); /* what it did not remove is swept at the next start */
    env_removal_free(r);
  }
  int fds[] = {s->state_fd, s->envs_fd, s->wheels_fd, s->runs_fd};
  for (size_t i = 0; i < CM_ARRAY_SIZE(fds); i++)
    if (fds[i] >= 0) close(fds[i]);
  free(s->state_dir);
  free(s->envs_dir);
  free(s->downloads_dir);
  free(s->wheels_dir);
  free(s->runs_dir);
  free(s->uv);
  free(s->installer_desc);
  env_known_release(s->known, s->n_known);
  env_listing_free(s);
  env_installer_release(s);
  free(s);
}
