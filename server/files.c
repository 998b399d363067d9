/* Files in and out of a run: input paths and their writing, MIME sniffing, base64, the
 * collection of outputs/, the content blocks of a result, and finding the start-up runner.
 * See files.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <strings.h>
#include <sys/stat.h>

#include "server/files.h"
#include "server/server-internal.h"

/* How much of a file the sniffers look at. */
#define FILES_SNIFF_BYTES 4096
#define FILES_COPY_CHUNK 65536
/* Entries examined (directories included) per listed entry before collection stops. */
#define FILES_SCAN_FACTOR 4
#define FILES_SCAN_MIN 64
/* Lines about single files in the text block; the rest are summarised. */
#define FILES_TEXT_LINES 20
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

/* ---------------------------------------------------------------- sniffing */

static bool starts_with(const unsigned char *b, size_t len, const char *magic, size_t n) {
  return len >= n && memcmp(b, magic, n) == 0;
}

/* Skips from p to just after the first occurrence of needle, or returns NULL. */
static const unsigned char *skip_past(const unsigned char *p, const unsigned char *end,
                                      const char *needle) {
  size_t n = strlen(needle);
  while ((size_t)(end - p) >= n) {
    if (memcmp(p, needle, n) == 0) return p + n;
    p++;
  }
  return NULL;
}

static const unsigned char *skip_space(const unsigned char *p, const unsigned char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  return p;
}

static bool looks_like_svg(const unsigned char *b, size_t len) {
  size_t n = cm_utf8_clip((const char *)b, len);
  if (n == 0 || memchr(b, '\0', n) || !cm_utf8_valid((const char *)b, n)) return false;
  const unsigned char *p = b, *end = b + n;
  if (starts_with(p, n, "\xef\xbb\xbf", 3)) p += 3;
  for (;;) {
    p = skip_space(p, end);
    if (!p || p >= end) return false;
    size_t left = (size_t)(end - p);
    if (starts_with(p, left, "<?xml", 5)) {
      p = skip_past(p, end, "?>");
    } else if (starts_with(p, left, "<!--", 4)) {
      p = skip_past(p + 4, end, "-->");
    } else if (left >= 9 && strncasecmp((const char *)p, "<!DOCTYPE", 9) == 0) {
      p = skip_past(p, end, ">");
    } else {
      break;
    }
    if (!p) return false;
  }
  size_t left = (size_t)(end - p);
  if (!starts_with(p, left, "<svg", 4)) return false;
  if (left == 4) return true;
  unsigned char c = p[4];
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '>' || c == '/';
}

const char *files_sniff_image(const void *head, size_t len) {
  const unsigned char *b = head;
  if (starts_with(b, len, "\x89PNG\r\n\x1a\n", 8)) return "image/png";
  if (starts_with(b, len, "\xff\xd8\xff", 3)) return "image/jpeg";
  if (starts_with(b, len, "GIF87a", 6) || starts_with(b, len, "GIF89a", 6)) return "image/gif";
  if (len >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return "image/webp";
  if (looks_like_svg(b, CM_MIN(len, FILES_SNIFF_BYTES))) return "image/svg+xml";
  return NULL;
}

static const char *text_mime_by_name(const char *name) {
  static const struct {
    const char *ext, *mime;
  } types[] = {
      {"csv", "text/csv"},          {"tsv", "text/tab-separated-values"},
      {"json", "application/json"}, {"jsonl", "application/jsonl"},
      {"md", "text/markdown"},      {"html", "text/html"},
      {"htm", "text/html"},         {"xml", "application/xml"},
      {"yaml", "application/yaml"}, {"yml", "application/yaml"},
      {"py", "text/x-python"},      {"svg", "image/svg+xml"},
      {"css", "text/css"},          {"js", "text/javascript"},
      {"tex", "text/x-tex"},
  };
  const char *base = name ? strrchr(name, '/') : NULL;
  base = base ? base + 1 : name;
  const char *dot = base ? strrchr(base, '.') : NULL;
  if (!dot || dot == base) return "text/plain";
  for (size_t i = 0; i < CM_ARRAY_SIZE(types); i++)
    if (strcasecmp(dot + 1, types[i].ext) == 0) return types[i].mime;
  return "text/plain";
}

const char *files_sniff_mime(const void *head, size_t len, const char *name, bool is_text) {
  const char *image = files_sniff_image(head, len);
  if (image) return image;
  if (is_text) {
    const char *m = text_mime_by_name(name);
    /* An .svg name without an <svg> root is not an image. */
    return strcmp(m, "image/svg+xml") == 0 ? "text/plain" : m;
  }
  const unsigned char *b = head;
  if (starts_with(b, len, "%PDF-", 5)) return "application/pdf";
  if (starts_with(b, len, "PK\x03\x04", 4)) return "application/zip";
  if (starts_with(b, len, "\x1f\x8b", 2)) return "application/gzip";
  return "application/octet-stream";
}

bool files_is_text(const void *buf, size_t len) {
  return len == 0 || (!memchr(buf, '\0', len) && cm_utf8_valid(buf, len));
}

static bool mime_is_image(const char *mime) {
  return mime && strncmp(mime, "image/", 6) == 0;
}

/* ---------------------------------------------------------------- base64 */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *files_base64_encode(const void *buf, size_t len, size_t *out_len) {
  const unsigned char *in = buf;
  size_t n = (len + 2) / 3 * 4;
  char *out = xmalloc(n + 1);
  size_t o = 0, i = 0;
  for (; i + 2 < len; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = b64_alphabet[(v >> 6) & 63];
    out[o++] = b64_alphabet[v & 63];
  }
  if (i < len) {
    uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  out[o] = '\0';
  if (out_len) *out_len = o;
  return out;
}

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static bool b64_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int files_base64_decode(const char *in, size_t len, size_t max, char **out, size_t *out_len,
                        cm_error_t *err) {
  *out = NULL;
  *out_len = 0;
  /* First pass: check every character and size the result before allocating. */
  size_t data = 0, pad = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)in[i];
    if (b64_space(c)) continue;
    if (c == '=') {
      pad++;
      continue;
    }
    if (pad) return cm_error_set(err, 0, CM_ERR_INVALID, "data after the '=' padding");
    if (b64_value(c) < 0)
      return cm_error_set(err, 0, CM_ERR_INVALID, "a character that is not base64 at offset %zu",
                          i);
    data++;
  }
  if (data % 4 == 1 || pad > 2 || (pad && (data + pad) % 4 != 0))
    return cm_error_set(err, 0, CM_ERR_INVALID, "the base64 text has a bad length or padding");
  size_t n = data / 4 * 3 + (data % 4 ? data % 4 - 1 : 0);
  if (n > max)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "it decodes to %zu bytes, more than %zu", n, max);
  char *buf = xmalloc(n + 1);
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < len; i++) {
    int v = b64_value((unsigned char)in[i]);
    if (v < 0) continue;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      buf[o++] = (char)((acc >> bits) & 0xff);
    }
  }
  buf[o] = '\0';
  *out = buf;
  *out_len = o;
  return 0;
}

/* ---------------------------------------------------------------- URIs */

char *files_uri_escape(const char *path, size_t len) {
  static const char hex[] = "0123456789ABCDEF";
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)path[i];
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '~' || c == '-' || c == '/';
    if (keep) {
      cm_buf_append(&b, &path[i], 1);
    } else {
      char e[3] = {'%', hex[c >> 4], hex[c & 15]};
      cm_buf_append(&b, e, 3);
    }
  }
  return cm_buf_steal(&b);
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

/* Opens (creating it when missing) the directory `name` under dirfd, never through a
 * symlink. */
static int open_subdir(int dirfd, const char *name, bool create) {
  if (create && mkdirat(dirfd, name, 0755) < 0 && errno != EEXIST) return -1;
  return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static int write_one(int dirfd, const files_input_t *f, cm_error_t *err) {
  cleanup_free char *path = xstrdup(f->path);
  cleanup_close int cur = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (cur < 0) return cm_error_set(err, errno, CM_ERR_IO, "dup");
  char *p = path;
  for (char *slash; (slash = strchr(p, '/')); p = slash + 1) {
    *slash = '\0';
    int next = open_subdir(cur, p, true);
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
  for (size_t i = 0; i < in->n; i++)
    if (write_one(dirfd, &in->v[i], err) < 0) return -1;
  return 0;
}

/* ---------------------------------------------------------------- collection */

typedef struct walk {
  const files_collect_limits_t *lim;
  files_collection_t *out;
  const char *dest_dir;
  int dest_fd;
  size_t scanned, scan_max;
  uint64_t inline_used;
  bool stop;
  char *chunk;
  cm_error_t *err;
  int rc;
} walk_t;

static files_output_t *add_entry(walk_t *w, const char *rel) {
  files_collection_t *c = w->out;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 16;
    c->v = xrealloc(c->v, c->cap * sizeof *c->v);
  }
  files_output_t *e = &c->v[c->n++];
  memset(e, 0, sizeof *e);
  size_t len;
  e->path = cm_utf8_sanitize(rel, strlen(rel), &len);
  return e;
}

static void skip_entry(walk_t *w, const char *rel, uint64_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void skip_entry(walk_t *w, const char *rel, uint64_t size, const char *fmt, ...) {
  files_output_t *e = add_entry(w, rel);
  e->how = FILES_SKIPPED;
  e->size = size;
  va_list ap;
  va_start(ap, fmt);
  e->reason = xvasprintf(fmt, ap);
  va_end(ap);
}

static void set_note(walk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_note(walk_t *w, const char *fmt, ...) {
  if (w->out->note) return;
  va_list ap;
  va_start(ap, fmt);
  w->out->note = xvasprintf(fmt, ap);
  va_end(ap);
}

static const char *kind_name(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

static bool name_ok(const char *name) {
  size_t n = strlen(name);
  if (!cm_utf8_valid(name, n)) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) return false;
  return true;
}

static int dest_open(walk_t *w) {
  if (w->dest_fd >= 0) return 0;
  if (mkdir(w->dest_dir, 0700) < 0 && errno != EEXIST)
    return cm_error_set(w->err, errno, CM_ERR_IO, "creating %s", w->dest_dir);
  w->dest_fd = open(w->dest_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (w->dest_fd < 0) return cm_error_set(w->err, errno, CM_ERR_IO, "opening %s", w->dest_dir);
  return 0;
}

/* Copies one regular file into the store and decides how it is returned. */
static void collect_file(walk_t *w, int dfd, const char *name, const char *rel,
                         const struct stat *seen) {
  const files_collect_limits_t *lim = w->lim;
  files_collection_t *c = w->out;
  uint64_t room = lim->max_bytes > c->stored_bytes ? lim->max_bytes - c->stored_bytes : 0;
  if ((uint64_t)seen->st_size > room) {
    skip_entry(w, rel, (uint64_t)seen->st_size,
               "%llu bytes is more than what is left of this run's output budget (%llu of %llu "
               "bytes)",
               (unsigned long long)seen->st_size, (unsigned long long)room,
               (unsigned long long)lim->max_bytes);
    return;
  }
  cleanup_close int fd =
      openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    skip_entry(w, rel, (uint64_t)seen->st_size, "could not be opened: %s", strerror(errno));
    return;
  }
  if (!S_ISREG(st.st_mode) || st.st_ino != seen->st_ino || st.st_dev != seen->st_dev) {
    skip_entry(w, rel, 0, "changed while it was being collected");
    return;
  }
  if (dest_open(w) < 0) {
    w->rc = -1;
    w->stop = true;
    return;
  }
  char stored[32];
  snprintf(stored, sizeof stored, "%zu", c->stored_files);
  cleanup_close int out =
      openat(w->dest_fd, stored, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) {
    cm_error_set(w->err, errno, CM_ERR_IO, "creating %s/%s", w->dest_dir, stored);
    w->rc = -1;
    w->stop = true;
    return;
  }
  /* Copy at most the size seen (a file that grows is cut there), keeping the head for
   * sniffing and the whole file when it is small enough to be inlined. */
  uint64_t limit = CM_MIN((uint64_t)st.st_size, room);
  uint64_t keep_max = CM_MAX(lim->inline_bytes, lim->inline_text_bytes);
  bool keep = limit <= keep_max;
  cm_buf_t data;
  cm_buf_init(&data, 0);
  char head[FILES_SNIFF_BYTES];
  size_t head_len = 0;
  uint64_t copied = 0;
  int read_errno = 0;
  while (copied < limit) {
    size_t want = (size_t)CM_MIN((uint64_t)FILES_COPY_CHUNK, limit - copied);
    ssize_t n = read(fd, w->chunk, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) read_errno = errno;
    if (n <= 0) break;
    if (head_len < sizeof head) {
      size_t h = CM_MIN(sizeof head - head_len, (size_t)n);
      memcpy(head + head_len, w->chunk, h);
      head_len += h;
    }
    if (keep) cm_buf_append(&data, w->chunk, (size_t)n);
    if (cm_write_all(out, w->chunk, (size_t)n) < 0) {
      int e = errno;
      cm_buf_release(&data);
      unlinkat(w->dest_fd, stored, 0);
      cm_error_set(w->err, e, CM_ERR_IO, "writing %s/%s", w->dest_dir, stored);
      w->rc = -1;
      w->stop = true;
      return;
    }
    copied += (uint64_t)n;
  }
  if (read_errno) {
    cm_buf_release(&data);
    unlinkat(w->dest_fd, stored, 0);
    skip_entry(w, rel, copied, "could not be read: %s", strerror(read_errno));
    return;
  }
  files_output_t *e = add_entry(w, rel);
  e->size = copied;
  e->stored = xstrdup(stored);
  c->stored_files++;
  c->stored_bytes += copied;
  e->is_text =
      keep ? files_is_text(data.data, data.len) : files_is_text(head, cm_utf8_clip(head, head_len));
  const char *base = strrchr(rel, '/');
  e->mime = files_sniff_mime(head, head_len, base ? base + 1 : rel, e->is_text);
  uint64_t inline_left =
      lim->inline_total > w->inline_used ? lim->inline_total - w->inline_used : 0;
  if (keep && copied <= inline_left && mime_is_image(e->mime) && copied <= lim->inline_bytes) {
    e->how = FILES_IMAGE;
  } else if (keep && copied <= inline_left && e->is_text && copied <= lim->inline_text_bytes) {
    e->how = FILES_RESOURCE;
  } else {
    e->how = FILES_RESOURCE_LINK;
  }
  if (e->how != FILES_RESOURCE_LINK) {
    w->inline_used += copied;
    e->len = data.len;
    e->data = cm_buf_steal(&data);
  }
  cm_buf_release(&data);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void walk_dir(walk_t *w, int dfd, const char *rel, unsigned depth) {
  const files_collect_limits_t *lim = w->lim;
  int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    skip_entry(w, rel, 0, "the directory could not be read: %s", strerror(errno));
    return;
  }
  /* Read no more names than could still be listed or examined (plus one, to know there
   * are more): a directory of 100 000 files costs a few hundred readdir entries. */
  size_t list_left = lim->max_entries > w->out->n ? lim->max_entries - w->out->n : 0;
  size_t scan_left = w->scan_max > w->scanned ? w->scan_max - w->scanned : 0;
  size_t want = CM_MIN(list_left, scan_left) + 1;
  char **names = NULL;
  size_t n = 0, cap = 0;
  bool more = false;
  struct dirent *ent;
  errno = 0;
  while ((ent = readdir(d))) {
    if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
    if (n == want) {
      more = true;
      break;
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      names = xrealloc(names, cap * sizeof *names);
    }
    names[n++] = xstrdup(ent->d_name);
  }
  /* An empty directory leaves names NULL, which qsort must not be given. */
  if (n > 1) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n && !w->stop; i++) {
    const char *name = names[i];
    if (w->out->n >= lim->max_entries || w->scanned >= w->scan_max) {
      more = true;
      break;
    }
    w->scanned++;
    cleanup_free char *child = xasprintf("%s/%s", rel, name);
    if (!name_ok(name)) {
      skip_entry(w, child, 0, "the name is not valid UTF-8 or contains a control character");
      continue;
    }
    struct stat st;
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      skip_entry(w, child, 0, "could not be examined: %s", strerror(errno));
      continue;
    }
    if (S_ISLNK(st.st_mode)) {
      skip_entry(w, child, 0, "a symbolic link (links are never followed)");
    } else if (S_ISDIR(st.st_mode)) {
      if (depth + 1 > lim->max_depth) {
        skip_entry(w, child, 0, "a directory more than %u levels below %s/ (not collected)",
                   lim->max_depth, FILES_OUTPUTS_DIR);
        continue;
      }
      cleanup_close int sub =
          openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (sub < 0) {
        skip_entry(w, child, 0, "the directory could not be opened: %s", strerror(errno));
        continue;
      }
      walk_dir(w, sub, child, depth + 1);
    } else if (S_ISREG(st.st_mode)) {
      collect_file(w, dirfd(d), name, child, &st);
    } else {
      skip_entry(w, child, 0, "%s, not a regular file", kind_name(st.st_mode));
    }
  }
  if (more && !w->stop) {
    w->stop = true;
    set_note(w,
             "%s/ holds more than %zu entries; collection stopped there and the rest was skipped",
             FILES_OUTPUTS_DIR, lim->max_entries);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
}

int files_collect(int workdir_fd, const char *dest_dir, const files_collect_limits_t *lim,
                  files_collection_t *out, cm_error_t *err) {
  memset(out, 0, sizeof *out);
  cleanup_close int fd = openat(workdir_fd, FILES_OUTPUTS_DIR,
                                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    walk_t w = {.out = out};
    if (errno == ELOOP || errno == ENOTDIR)
      skip_entry(&w, FILES_OUTPUTS_DIR, 0,
                 "not a directory (a symbolic link or a file); nothing was collected");
    else
      skip_entry(&w, FILES_OUTPUTS_DIR, 0, "could not be opened: %s", strerror(errno));
    return 0;
  }
  walk_t w = {
      .lim = lim,
      .out = out,
      .dest_dir = dest_dir,
      .dest_fd = -1,
      .scan_max = CM_MAX(lim->max_entries * FILES_SCAN_FACTOR, (size_t)FILES_SCAN_MIN),
      .chunk = xmalloc(FILES_COPY_CHUNK),
      .err = err,
  };
  walk_dir(&w, fd, FILES_OUTPUTS_DIR, 0);
  free(w.chunk);
  if (w.dest_fd >= 0) close(w.dest_fd);
  return w.rc;
}

void files_collection_release(files_collection_t *c) {
  for (size_t i = 0; i < c->n; i++) {
    files_output_t *e = &c->v[i];
    free(e->path);
    free(e->reason);
    free(e->data);
    free(e->stored);
    free(e->uri);
  }
  free(c->v);
  free(c->note);
  memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- results */

static const char *how_name(files_how_t how) {
  switch (how) {
    case FILES_IMAGE:
      return "image";
    case FILES_RESOURCE:
      return "resource";
    case FILES_RESOURCE_LINK:
      return "resource_link";
    default:
      return "skipped";
  }
}

static void text_line(cm_buf_t *t, const files_output_t *e) {
  if (e->how == FILES_SKIPPED) {
    cm_buf_printf(t, "\n--- skipped: %s: %s ---", e->path, e->reason ? e->reason : "skipped");
    return;
  }
  cm_buf_printf(t, "\n--- file: %s (%s, %llu bytes): %s", e->path, e->mime,
                (unsigned long long)e->size, how_name(e->how));
  if (e->how == FILES_RESOURCE_LINK && e->uri)
    cm_buf_printf(t, " %s (read it with resources/read)", e->uri);
  cm_buf_appends(t, " ---");
}

void files_result_append(const files_collection_t *c, cm_buf_t *text, json_t *content,
                         json_t *structured) {
  json_t *list = json_array();
  size_t returned = 0, skipped = 0;
  for (size_t i = 0; i < c->n; i++) {
    const files_output_t *e = &c->v[i];
    if (e->how == FILES_SKIPPED)
      skipped++;
    else
      returned++;
    json_t *item = json_pack("{s:s, s:I, s:s}", "path", e->path, "size", (json_int_t)e->size,
                             "returned", how_name(e->how));
    json_object_set_new(item, "mime_type", e->mime ? json_string(e->mime) : json_null());
    if (e->uri) json_object_set_new(item, "uri", json_string(e->uri));
    if (e->reason)
      json_object_set_new(item, "reason", srv_json_string_lossy(e->reason, strlen(e->reason)));
    json_array_append_new(list, item);
    if (!content) continue;
    if (e->how == FILES_IMAGE) {
      cleanup_free char *b64 = files_base64_encode(e->data, e->len, NULL);
      json_array_append_new(
          content, json_pack("{s:s, s:s, s:s}", "type", "image", "data", b64, "mimeType", e->mime));
    } else if (e->how == FILES_RESOURCE && e->uri) {
      json_array_append_new(
          content, json_pack("{s:s, s:{s:s, s:s, s:s%}}", "type", "resource", "resource", "uri",
                             e->uri, "mimeType", e->mime, "text", e->data, e->len));
    } else if (e->how == FILES_RESOURCE_LINK && e->uri) {
      json_array_append_new(
          content, json_pack("{s:s, s:s, s:s, s:s, s:I}", "type", "resource_link", "uri", e->uri,
                             "name", e->path, "mimeType", e->mime, "size", (json_int_t)e->size));
    }
  }
  if (structured)
    json_object_set_new(structured, "files", list);
  else
    json_decref(list);
  if (!text || (c->n == 0 && !c->note)) return;
  cm_buf_printf(text, "\n--- files: %zu returned from %s/, %zu skipped ---", returned,
                FILES_OUTPUTS_DIR, skipped);
  size_t shown = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (shown == FILES_TEXT_LINES) {
      cm_buf_printf(text, "\n--- ... and %zu more (see structuredContent.files) ---", c->n - shown);
      break;
    }
    text_line(text, &c->v[i]);
    shown++;
  }
  if (c->note) cm_buf_printf(text, "\n--- note: %s ---", c->note);
}

json_t *files_output_schema(void) {
  json_t *nullable_string = json_pack("{s:[s, s]}", "type", "string", "null");
  return json_pack(
      "{s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s}, s:o, s:{s:s, s:[s, s, s, s]}, s:{s:s}, s:{s:s}},"
      " s:[s, s]}}",
      "type", "array", "description",
      "Files collected from outputs/: how each was returned, or why it was skipped.", "items",
      "type", "object", "properties", "path", "type", "string", "size", "type", "integer",
      "mime_type", nullable_string, "returned", "type", "string", "enum", "image", "resource",
      "resource_link", "skipped", "uri", "type", "string", "reason", "type", "string", "required",
      "path", "returned");
}

/* ---------------------------------------------------------------- the runner */

#define FILES_RUNNER_NAME "runner.py"

static bool runner_safe(const char *path, char **why) {
  struct stat st;
  if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) {
    *why = xasprintf("%s is not a readable file", path);
    return false;
  }
  if (geteuid() != 0) return true;
  /* A root server hands this file to every script: whoever can change it can change
   * every run. */
  cleanup_free char *dir = xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  struct stat dst;
  if (st.st_uid != 0 || (st.st_mode & 022) || stat(*dir ? dir : "/", &dst) < 0 || dst.st_uid != 0 ||
      (dst.st_mode & 022)) {
    *why = xasprintf("%s and its directory must be owned by root and writable only by root", path);
    return false;
  }
  return true;
}

const char *files_runner_path(void) {
  static bool searched;
  static char *found;
  if (searched) return found;
  searched = true;
  cleanup_free char *why = NULL;
  const char *env = getenv("MPS_RUNNER");
  if (env && *env) {
    char *real = realpath(env, NULL);
    if (real && runner_safe(real, &why))
      found = real;
    else
      free(real);
    if (!found && !why) why = xasprintf("%s (MPS_RUNNER): %s", env, strerror(errno));
  } else {
    cleanup_free char *self = realpath("/proc/self/exe", NULL);
    char *slash = self ? strrchr(self, '/') : NULL;
    if (slash) *slash = '\0';
    const char *candidates[] = {
        "/mps-runner/" FILES_RUNNER_NAME,
        "/../share/mcp-python-exec-sandbox/runner/" FILES_RUNNER_NAME,
        "/../profiles/" FILES_RUNNER_NAME,
    };
    for (size_t i = 0; self && i < CM_ARRAY_SIZE(candidates) && !found && !why; i++) {
      cleanup_free char *c = xasprintf("%s%s", self, candidates[i]);
      char *real = realpath(c, NULL);
      if (real && runner_safe(real, &why))
        found = real;
      else
        free(real);
    }
    if (!found && !why)
      why = xasprintf("%s was not found next to %s (set MPS_RUNNER)",
                      "mps-runner/" FILES_RUNNER_NAME, self ? self : "the binary");
  }
  if (!found)
    cm_warn("the start-up runner is not used, so open matplotlib figures are not saved: %s", why);
  return found;
}
