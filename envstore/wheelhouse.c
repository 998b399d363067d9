/* The wheelhouse (<state>/downloads/wheels): binary wheels the warm-up downloaded, which
 * only the server writes and builds see read-only. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>

#include "envstore/envstore-internal.h"

/* A wheel's file name as the warm-up may bring it into the wheelhouse:
 * name-version(-build)?-python-abi-platform.whl in the characters wheel names use. */
bool env_wheel_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n < 10 || n > 255 || name[0] == '.' || name[0] == '-' || strcmp(name + n - 4, ".whl") != 0)
    return false;
  size_t dashes = 0;
  for (size_t i = 0; i < n - 4; i++) {
    char c = name[i];
    if (c == '-')
      dashes++;
    else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '+' || c == '!'))
      return false;
  }
  return dashes == 4 || dashes == 5;
}

/* downloads/ holds the wheelhouse and nothing else.  Versions before it let every build
 * write there (it was their shared download cache), so what such a version left may be a
 * tenant's forgery: the first start of this version clears it all (marked in the state
 * directory, which no sandbox ever saw).  After that, every start keeps only wheels that
 * are regular files of the server's own, written by nobody else. */
void env_clean_downloads(env_store_t *s) {
  struct stat st;
  if (fstatat(s->state_fd, ENV_DOWNLOADS_MARK, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
      !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    if (fstatat(s->state_fd, "downloads", &st, AT_SYMLINK_NOFOLLOW) == 0) {
      cm_info("clearing %s: builds of earlier versions could write there", s->downloads_dir);
      env_discard(s, s->state_fd, "downloads", "trash");
    }
    unlinkat(s->state_fd, ENV_DOWNLOADS_MARK, 0);
    cm_error_t err = CM_ERROR_INIT;
    if (cm_create_file_at(s->state_fd, ENV_DOWNLOADS_MARK, "", 0, 0600, &err) < 0) {
      cm_warn("environment store: %s", cm_error_message(&err));
      cm_error_release(&err);
    }
  }
  if (mkdirat(s->state_fd, "downloads", 0755) < 0 && errno != EEXIST)
    cm_warn("environment store: creating %s: %s", s->downloads_dir, strerror(errno));
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dl = cm_open_dir_at(s->state_fd, "downloads", &err);
  if (dl < 0 || fstat(dl, &st) < 0 || st.st_uid != geteuid()) {
    cm_warn("environment store: %s is not the server's: no wheelhouse", s->downloads_dir);
    cm_error_release(&err);
    return;
  }
  (void)fchmod(dl, 0755);
  /* Anything but the wheelhouse goes. */
  DIR *d = env_list_dir(dl);
  cm_strv_builder_t gone = {0};
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ENV_WHEELHOUSE))
      cm_strv_add(&gone, e->d_name);
  if (d) closedir(d);
  for (size_t i = 0; i < gone.n; i++) env_discard(s, dl, gone.v[i], "trash");
  cm_strv_free(gone.v);
  if (mkdirat(dl, ENV_WHEELHOUSE, 0755) < 0 && errno != EEXIST)
    cm_warn("environment store: creating %s: %s", s->wheels_dir, strerror(errno));
  int wfd = cm_open_dir_at(dl, ENV_WHEELHOUSE, &err);
  if (wfd < 0 || fstat(wfd, &st) < 0 || st.st_uid != geteuid()) {
    cm_warn("environment store: %s is not the server's: no wheelhouse", s->wheels_dir);
    cm_error_release(&err);
    if (wfd >= 0) close(wfd);
    return;
  }
  (void)fchmod(wfd, 0755);
  d = env_list_dir(wfd);
  time_t now = time(NULL);
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat ws;
    if (fstatat(wfd, e->d_name, &ws, AT_SYMLINK_NOFOLLOW) < 0) continue;
    /* Another server's import in progress (a day is far beyond any). */
    if (!strncmp(e->d_name, ".tmp-", 5) && now - ws.st_mtime < 86400) continue;
    bool ok = env_wheel_name_ok(e->d_name) && S_ISREG(ws.st_mode) && ws.st_uid == geteuid() &&
              !(ws.st_mode & 022) && ws.st_nlink == 1;
    if (ok) continue;
    cm_warn("wheelhouse: removing %s (not a wheel the server stored)", e->d_name);
    if (S_ISDIR(ws.st_mode))
      env_discard(s, wfd, e->d_name, "trash");
    else
      unlinkat(wfd, e->d_name, 0);
  }
  if (d) closedir(d);
  s->wheels_fd = wfd;
  env_listing_changed(s); /* (listings from now on count its wheels) */
}
