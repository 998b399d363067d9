/* Discovery: every Python on the machine, as candidates to identify (registry.c). */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "interp/interp-internal.h"

/* Is this executable a candidate name: python3, python3.N, python3.Nt, pypy3, pypy3.N? */
static bool interesting_name(const char *n) {
  const char *rest;
  if (strncmp(n, "python3", 7) == 0)
    rest = n + 7;
  else if (strncmp(n, "pypy3", 5) == 0)
    rest = n + 5;
  else
    return false;
  if (*rest == '\0') return true;
  if (*rest != '.') return false;
  rest++;
  if (*rest < '0' || *rest > '9') return false;
  while (*rest >= '0' && *rest <= '9') rest++;
  return *rest == '\0' || (rest[0] == 't' && rest[1] == '\0');
}

static void add_candidate(py_registry_t *r, const char *path, const char *source) {
  if (r->n_cands >= PY_MAX_CANDIDATES) return;
  struct stat st;
  if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || access(path, X_OK) < 0) return;
  char real[PATH_MAX];
  if (!realpath(path, real)) return;
  for (size_t i = 0; i < r->n_cands; i++)
    if (strcmp(r->cands[i]->real, real) == 0) return;
  py_candidate_t *c = xcalloc(1, sizeof *c);
  c->reg = r;
  c->real = xstrdup(real);
  c->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  c->size = (int64_t)st.st_size;
  c->info.path = xstrdup(path);
  c->info.source = xstrdup(source);
  cm_buf_init(&c->out, PY_PROBE_MAX_OUTPUT);
  r->cands[r->n_cands++] = c;
}

static void scan_dir(py_registry_t *r, const char *dir, const char *source) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char *names[128];
  size_t n = 0;
  while ((e = readdir(d)) && n < CM_ARRAY_SIZE(names))
    if (interesting_name(e->d_name)) names[n++] = xstrdup(e->d_name);
  closedir(d);
  /* Stable order: shortest (python3) first, then by name. */
  for (size_t i = 0; i < n; i++) {
    for (size_t j = i + 1; j < n; j++) {
      if (strlen(names[j]) < strlen(names[i]) ||
          (strlen(names[j]) == strlen(names[i]) && strcmp(names[j], names[i]) < 0)) {
        char *t = names[i];
        names[i] = names[j];
        names[j] = t;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    cleanup_free char *p = xasprintf("%s/%s", dir, names[i]);
    add_candidate(r, p, source);
    free(names[i]);
  }
}

/* DIR/<version>/bin, as pyenv and uv lay out their installs. */
void py_scan_installs(py_registry_t *r, const char *dir, const char *source) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char *subs[256];
  size_t n = 0;
  while ((e = readdir(d)) && n < CM_ARRAY_SIZE(subs))
    if (e->d_name[0] != '.') subs[n++] = xstrdup(e->d_name);
  closedir(d);
  for (size_t i = 0; i < n; i++) {
    for (size_t j = i + 1; j < n; j++) {
      if (strcmp(subs[j], subs[i]) < 0) {
        char *t = subs[i];
        subs[i] = subs[j];
        subs[j] = t;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    cleanup_free char *bin = xasprintf("%s/%s/bin", dir, subs[i]);
    scan_dir(r, bin, source);
    free(subs[i]);
  }
}

void py_discover(py_registry_t *r) {
  if (r->opts.python) {
    cleanup_free char *p = cm_find_executable(r->opts.python);
    if (p) add_candidate(r, p, "--python");
  }
  const char *path = getenv("PATH");
  if (path) {
    cleanup_free char *copy = xstrdup(path);
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
      size_t len = strlen(dir);
      /* pyenv's shims are scripts that pick a version by context: its versions are scanned
       * directly below instead. */
      if (len >= 6 && strcmp(dir + len - 6, "/shims") == 0) continue;
      if (dir[0] == '/') scan_dir(r, dir, "PATH");
    }
  }
  const char *pyenv = getenv("PYENV_ROOT");
  const char *home = getenv("HOME");
  cleanup_free char *pyenv_default = home ? xasprintf("%s/.pyenv", home) : NULL;
  if (!pyenv) pyenv = pyenv_default;
  if (pyenv) {
    cleanup_free char *v = xasprintf("%s/versions", pyenv);
    py_scan_installs(r, v, "pyenv");
  }
  const char *uv_dir = getenv("UV_PYTHON_INSTALL_DIR");
  cleanup_free char *uv_default = NULL;
  if (!uv_dir && home) {
    const char *xdg = getenv("XDG_DATA_HOME");
    uv_default =
        xdg ? xasprintf("%s/uv/python", xdg) : xasprintf("%s/.local/share/uv/python", home);
    uv_dir = uv_default;
  }
  if (uv_dir) {
    py_scan_installs(r, uv_dir, "uv");
    free(r->uv_dir);
    r->uv_dir = xstrdup(uv_dir);
  }
  for (char *const *d = r->opts.python_dirs; d && *d; d++) {
    const char *dir = *d;
    if (!*dir) continue;
    scan_dir(r, dir, "--python-dir");
    cleanup_free char *bin = xasprintf("%s/bin", dir);
    scan_dir(r, bin, "--python-dir");
    py_scan_installs(r, dir, "--python-dir");
  }
}
