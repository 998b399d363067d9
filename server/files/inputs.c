/* Files in: the `files` argument checked and decoded, then written into the work directory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/files/files-internal.h"

#define FILES_SCRIPT_NAME "script.py"

/* ---------------------------------------------------------------- paths */

static char *quote(const char *s, size_t len) {
  return cm_log_excerpt(s, len, 120);
}

char *files_check_path(const char *path, size_t len, cm_error_t *err) {
  if (len == 0) {
    cm_error_set(err, 0, CM_ERR_INVALID, "the path is empty");
    return NULL;
  }
  cleanup_free char *q = quote(path, len);
  if (len > FILES_MAX_PATH_BYTES) {
    cm_error_set(err, 0, CM_ERR_LIMIT, "'%s' is longer than %d bytes", q, FILES_MAX_PATH_BYTES);
    return NULL;
  }
  if (memchr(path, '\0', len)) {
    cm_error_set(err, 0, CM_ERR_INVALID, "'%s' contains a NUL byte", q);
    return NULL;
  }
  if (!cm_utf8_valid(path, len)) {
    cm_error_set(err, 0, CM_ERR_INVALID, "'%s' is not valid UTF-8", q);
    return NULL;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)path[i];
    if (c < 0x20 || c == 0x7f) {
      cm_error_set(err, 0, CM_ERR_INVALID, "'%s' contains a control character", q);
      return NULL;
    }
    if (c == '\\') {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "'%s' contains a backslash; separate directories with '/'", q);
      return NULL;
    }
  }
  if (path[0] == '/') {
    cm_error_set(err, 0, CM_ERR_INVALID,
                 "'%s' is absolute; give a path relative to the working directory, such as "
                 "'data/input.csv'",
                 q);
    return NULL;
  }
  /* Components: "." ones are dropped ("./data.csv" is data.csv); "..", empty ones and
   * overlong ones are refused. */
  cm_buf_t out;
  cm_buf_init(&out, 0);
  size_t depth = 0;
  const char *p = path, *end = path + len;
  while (p <= end) {
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *stop = slash ? slash : end;
    size_t n = (size_t)(stop - p);
    const char *why = NULL;
    cm_error_kind_t kind = CM_ERR_INVALID;
    if (n == 0) {
      why = "has an empty component ('//' or a trailing '/')";
    } else if (n == 2 && p[0] == '.' && p[1] == '.') {
      why = "contains '..'; input files stay inside the working directory";
    } else if (n > FILES_MAX_NAME_BYTES) {
      why = "has a component longer than 255 bytes";
      kind = CM_ERR_LIMIT;
    } else if (!(n == 1 && p[0] == '.')) {
      if (++depth > FILES_MAX_PATH_DEPTH) {
        why = "is nested more than 16 directories deep";
        kind = CM_ERR_LIMIT;
      } else {
        if (out.len) cm_buf_append(&out, "/", 1);
        cm_buf_append(&out, p, n);
      }
    }
    if (why) {
      cm_buf_release(&out);
      cm_error_set(err, 0, kind, "'%s' %s", q, why);
      return NULL;
    }
    if (!slash) break;
    p = slash + 1;
  }
  if (out.len == 0) {
    cm_buf_release(&out);
    cm_error_set(err, 0, CM_ERR_INVALID, "'%s' names the working directory itself, not a file", q);
    return NULL;
  }
  if (strcmp(out.data, FILES_SCRIPT_NAME) == 0) {
    cm_buf_release(&out);
    cm_error_set(err, 0, CM_ERR_INVALID,
                 "'%s' is where the script itself is written; give the file another name", q);
    return NULL;
  }
  return cm_buf_steal(&out);
}

/* ---------------------------------------------------------------- inputs */

void files_inputs_release(files_inputs_t *in) {
  for (size_t i = 0; i < in->n; i++) {
    free(in->v[i].path);
    free(in->v[i].data);
  }
  free(in->v);
  in->v = NULL;
  in->n = 0;
}

int files_inputs_parse(json_t *files, const srv_config_t *cfg, files_inputs_t *out,
                       cm_error_t *err) {
  out->v = NULL;
  out->n = 0;
  if (!files || json_is_null(files)) return 0;
  if (!json_is_array(files))
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "'files' must be a list of {\"path\", \"content\", \"encoding\"} objects.");
  size_t n = json_array_size(files);
  if (n > cfg->max_input_files)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "At most %llu input files are accepted (got %zu).",
                        (unsigned long long)cfg->max_input_files, n);
  out->v = xcalloc(n ? n : 1, sizeof *out->v);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *f = json_array_get(files, i);
    if (!json_is_object(f)) {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "files[%zu] must be an object with 'path' and 'content'.", i);
      goto fail;
    }
    const char *key;
    json_t *value;
    json_object_foreach(f, key, value) {
      if (strcmp(key, "path") && strcmp(key, "content") && strcmp(key, "encoding")) {
        cleanup_free char *k = quote(key, strlen(key));
        cm_error_set(err, 0, CM_ERR_INVALID,
                     "files[%zu] has an unknown key '%s'; the keys are path, content and encoding.",
                     i, k);
        goto fail;
      }
    }
    json_t *path = json_object_get(f, "path");
    json_t *content = json_object_get(f, "content");
    json_t *encoding = json_object_get(f, "encoding");
    if (!json_is_string(path)) {
      cm_error_set(err, 0, CM_ERR_INVALID, "files[%zu].path must be a string.", i);
      goto fail;
    }
    cm_error_t perr = CM_ERROR_INIT;
    char *checked = files_check_path(json_string_value(path), json_string_length(path), &perr);
    if (!checked) {
      cm_error_set(err, 0, perr.kind, "files[%zu].path %s.", i, cm_error_message(&perr));
      cm_error_release(&perr);
      goto fail;
    }
    out->v[i].path = checked;
    out->n = i + 1;
    for (size_t k = 0; k < i; k++) {
      if (strcmp(out->v[k].path, checked) == 0) {
        cm_error_set(err, 0, CM_ERR_INVALID, "files[%zu] and files[%zu] both write '%s'.", k, i,
                     checked);
        goto fail;
      }
    }
    if (!json_is_string(content)) {
      cm_error_set(err, 0, CM_ERR_INVALID, "files[%zu].content must be a string.", i);
      goto fail;
    }
    bool base64 = false;
    if (encoding && !json_is_null(encoding)) {
      const char *e = json_is_string(encoding) ? json_string_value(encoding) : "";
      if (strcasecmp(e, "base64") == 0) {
        base64 = true;
      } else if (strcasecmp(e, "utf-8") != 0 && strcasecmp(e, "utf8") != 0) {
        cm_error_set(err, 0, CM_ERR_INVALID,
                     "files[%zu].encoding must be \"utf-8\" (the default) or \"base64\".", i);
        goto fail;
      }
    }
    uint64_t room = cfg->max_input_bytes > total ? cfg->max_input_bytes - total : 0;
    uint64_t max = CM_MIN(cfg->max_input_file_bytes, room);
    const char *text = json_string_value(content);
    size_t text_len = json_string_length(content);
    if (base64) {
      cm_error_t derr = CM_ERROR_INIT;
      if (files_base64_decode(text, text_len, max, &out->v[i].data, &out->v[i].len, &derr) < 0) {
        if (derr.kind == CM_ERR_LIMIT)
          cm_error_set(err, 0, CM_ERR_LIMIT,
                       "files[%zu] ('%s') is too large: %s (at most %llu bytes per file and %llu "
                       "bytes for all files).",
                       i, checked, cm_error_message(&derr),
                       (unsigned long long)cfg->max_input_file_bytes,
                       (unsigned long long)cfg->max_input_bytes);
        else
          cm_error_set(err, 0, CM_ERR_INVALID, "files[%zu].content ('%s') is not valid base64: %s.",
                       i, checked, cm_error_message(&derr));
        cm_error_release(&derr);
        goto fail;
      }
    } else {
      if (text_len > max) {
        cm_error_set(err, 0, CM_ERR_LIMIT,
                     "files[%zu] ('%s') is too large: %zu bytes (at most %llu bytes per file and "
                     "%llu bytes for all files).",
                     i, checked, text_len, (unsigned long long)cfg->max_input_file_bytes,
                     (unsigned long long)cfg->max_input_bytes);
        goto fail;
      }
      out->v[i].data = xmemdup(text, text_len + 1);
      out->v[i].len = text_len;
    }
    total += out->v[i].len;
  }
  return 0;
fail:
  files_inputs_release(out);
  return -1;
}

/* How write_one writes: into a fresh directory (never replacing anything), or over a
 * session's files with owner_set (what is made is chowned to uid:gid). */
typedef struct {
  bool replace, owner_set;
  uid_t uid;
  gid_t gid;
} write_mode_t;

/* Opens (creating it when missing) the directory `name` under dirfd, never through a
 * symlink. */
static int open_subdir(int dirfd, const char *name, bool create, const write_mode_t *m) {
  bool made = false;
  if (create) {
    if (mkdirat(dirfd, name, 0755) == 0)
      made = true;
    else if (errno != EEXIST)
      return -1;
  }
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && made && m->owner_set && fchown(fd, m->uid, m->gid) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* Over a session's files: a new file under a temporary name, renamed over `name` (rename
 * replaces a symlink or a file, never follows one; it fails on a directory). */
static int write_replacing(int dirfd, const char *name, const files_input_t *f,
                           const write_mode_t *m, cm_error_t *err) {
  cleanup_free char *tmp = NULL;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 16; tries++) {
    unsigned r;
    if (getentropy(&r, sizeof r) < 0) abort();
    free(tmp);
    tmp = xasprintf(".mps-input-%08x", r);
    fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "cannot write input file '%s'", f->path);
  int rc = 0;
  if ((m->owner_set && fchown(fd, m->uid, m->gid) < 0) || cm_write_all(fd, f->data, f->len) < 0)
    rc = cm_error_set(err, errno, CM_ERR_IO, "cannot write input file '%s'", f->path);
  close(fd);
  if (rc == 0 && renameat(dirfd, tmp, dirfd, name) < 0) {
    if (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST)
      rc = cm_error_set(err, 0, CM_ERR_INVALID,
                        "cannot write input file '%s': a directory of that name is in the work "
                        "directory",
                        f->path);
    else
      rc = cm_error_set(err, errno, CM_ERR_IO, "cannot write input file '%s'", f->path);
  }
  if (rc < 0) unlinkat(dirfd, tmp, 0);
  return rc;
}

static int write_one(int dirfd, const files_input_t *f, const write_mode_t *m, cm_error_t *err) {
  cleanup_free char *path = xstrdup(f->path);
  cleanup_close int cur = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (cur < 0) return cm_error_set(err, errno, CM_ERR_IO, "dup");
  char *p = path;
  for (char *slash; (slash = strchr(p, '/')); p = slash + 1) {
    *slash = '\0';
    int next = open_subdir(cur, p, true, m);
    if (next < 0) {
      int e = errno;
      *slash = '\0';
      if (e == ENOTDIR || e == ELOOP || e == EEXIST)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "cannot write input file '%s': '%s' is already a file, not a directory",
                            f->path, path);
      return cm_error_set(err, e, CM_ERR_IO, "cannot write input file '%s'", f->path);
    }
    close(cur);
    cur = next;
    *slash = '/';
  }
  if (m->replace) return write_replacing(cur, p, f, m, err);
  cleanup_close int fd =
      openat(cur, p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST)
      return cm_error_set(err, 0, CM_ERR_INVALID,
                          "cannot write input file '%s': another input file already made it a "
                          "directory",
                          f->path);
    return cm_error_set(err, errno, CM_ERR_IO, "cannot write input file '%s'", f->path);
  }
  if (cm_write_all(fd, f->data, f->len) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "cannot write input file '%s'", f->path);
  return 0;
}

int files_write_inputs(int dirfd, const files_inputs_t *in, cm_error_t *err) {
  write_mode_t m = {0};
  for (size_t i = 0; i < in->n; i++)
    if (write_one(dirfd, &in->v[i], &m, err) < 0) return -1;
  return 0;
}

int files_write_inputs_over(int dirfd, const files_inputs_t *in, cm_error_t *err) {
  struct stat st;
  if (fstat(dirfd, &st) < 0) return cm_error_set(err, errno, CM_ERR_IO, "the work directory");
  write_mode_t m = {.replace = true, .owner_set = true, .uid = st.st_uid, .gid = st.st_gid};
  for (size_t i = 0; i < in->n; i++)
    if (write_one(dirfd, &in->v[i], &m, err) < 0) return -1;
  return 0;
}
