#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/cm.h"

int cm_set_nonblock(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return -1;
  flags = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
  return fcntl(fd, F_SETFL, flags);
}

int cm_set_cloexec(int fd) {
  int flags = fcntl(fd, F_GETFD);
  if (flags < 0) return -1;
  return fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

int cm_write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int cm_read_file(const char *path, size_t max, char **out, size_t *out_len, cm_error_t *err) {
  cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return cm_error_set(err, errno, errno == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO, "open %s",
                        path);
  cm_buf_t b;
  cm_buf_init(&b, max);
  char chunk[65536];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      cm_buf_release(&b);
      return cm_error_set(err, errno, CM_ERR_IO, "read %s", path);
    }
    if (n == 0) break;
    if (cm_buf_append(&b, chunk, (size_t)n) < 0) {
      cm_buf_release(&b);
      return cm_error_set(err, 0, CM_ERR_LIMIT, "%s is larger than %zu bytes", path, max);
    }
  }
  if (out_len) *out_len = b.len;
  *out = cm_buf_steal(&b);
  return 0;
}

int cm_write_file(const char *path, const void *data, size_t len, mode_t mode, cm_error_t *err) {
  cleanup_close int fd =
      open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, mode);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "create %s", path);
  if (cm_write_all(fd, data, len) < 0) return cm_error_set(err, errno, CM_ERR_IO, "write %s", path);
  return 0;
}

int cm_mkdir_p(const char *path, mode_t mode, cm_error_t *err) {
  cleanup_free char *p = xstrdup(path);
  size_t len = strlen(p);
  for (size_t i = 1; i <= len; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char saved = p[i];
    p[i] = '\0';
    if (mkdir(p, mode) < 0 && errno != EEXIST)
      return cm_error_set(err, errno, CM_ERR_IO, "mkdir %s", p);
    p[i] = saved;
  }
  return 0;
}

char *cm_find_executable(const char *name) {
  if (!name || !*name) return NULL;
  if (strchr(name, '/')) return access(name, X_OK) == 0 ? xstrdup(name) : NULL;
  const char *path = getenv("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  const char *p = path;
  while (*p) {
    const char *colon = strchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    if (n > 0) {
      char *cand = xasprintf("%.*s/%s", (int)n, p, name);
      struct stat st;
      if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) return cand;
      free(cand);
    }
    if (!colon) break;
    p = colon + 1;
  }
  return NULL;
}

int cm_dl_symbols(const char *soname, const char *const *names, size_t n, void **syms,
                  cm_error_t *err) {
  void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "cannot load %s: %s", soname, dlerror());
  for (size_t i = 0; i < n; i++) {
    syms[i] = dlsym(lib, names[i]);
    if (!syms[i]) {
      cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "cannot load %s: %s", soname, dlerror());
      dlclose(lib);
      return -1;
    }
  }
  return 0;
}

void cm_sha256_hex(const void *data, size_t len, char out[65]) {
  unsigned char md[CM_SHA256_SIZE];
  cm_sha256(data, len, md);
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < CM_SHA256_SIZE; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[64] = '\0';
}

bool cm_memeq_ct(const void *a, const void *b, size_t len) {
  /* volatile: the compiler may not turn the loop into one that stops at a difference. */
  const volatile unsigned char *x = a, *y = b;
  unsigned char diff = 0;
  for (size_t i = 0; i < len; i++) diff |= x[i] ^ y[i];
  return diff == 0;
}

/* Length of the valid UTF-8 sequence at s (at most len bytes), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t len) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (len < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return n;
}

bool cm_utf8_valid(const char *buf, size_t len) {
  const unsigned char *s = (const unsigned char *)buf;
  size_t i = 0;
  while (i < len) {
    size_t n = utf8_seq(s + i, len - i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t cm_utf8_clip(const char *buf, size_t len) {
  const unsigned char *s = (const unsigned char *)buf;
  /* Walk back at most 3 bytes to the start of the last sequence. */
  size_t start = len;
  for (size_t k = 0; k < 4 && start > 0; k++) {
    start--;
    if ((s[start] & 0xc0) != 0x80) break;
  }
  if (start == len) return len;
  unsigned char c = s[start];
  size_t need = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
  return (len - start < need) ? start : len;
}

char *cm_utf8_sanitize(const char *buf, size_t len, size_t *out_len) {
  const unsigned char *s = (const unsigned char *)buf;
  /* Worst case every byte becomes 3 bytes (U+FFFD). */
  char *out = xmalloc(len * 3 + 1);
  size_t o = 0, i = 0;
  while (i < len) {
    size_t n = utf8_seq(s + i, len - i);
    if (n == 0) {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i += 1;
    } else {
      memcpy(out + o, s + i, n);
      o += n;
      i += n;
    }
  }
  out[o] = '\0';
  if (out_len) *out_len = o;
  return out;
}

/* The code point of a valid sequence of n bytes. */
static uint32_t utf8_code_point(const unsigned char *s, size_t n) {
  if (n == 1) return s[0];
  uint32_t cp = s[0] & (0xff >> (n + 1));
  for (size_t i = 1; i < n; i++) cp = (cp << 6) | (s[i] & 0x3f);
  return cp;
}

static bool display_escapes(uint32_t cp) {
  return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0) || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) || cp == '\\';
}

char *cm_utf8_display(const char *buf, size_t len, size_t *out_len) {
  size_t clean_len;
  cleanup_free char *clean = cm_utf8_sanitize(buf, len, &clean_len);
  const unsigned char *s = (const unsigned char *)clean;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = 0; i < clean_len;) {
    size_t n = utf8_seq(s + i, clean_len - i);
    if (n == 0) n = 1; /* (never, after cm_utf8_sanitize) */
    uint32_t cp = utf8_code_point(s + i, n);
    if (cp == '\\')
      cm_buf_appends(&b, "\\\\");
    else if (display_escapes(cp) && cp < 0x80)
      cm_buf_printf(&b, "\\x%02x", (unsigned)cp);
    else if (display_escapes(cp))
      cm_buf_printf(&b, "\\u{%04x}", (unsigned)cp);
    else
      cm_buf_append(&b, clean + i, n);
    i += n;
  }
  if (out_len) *out_len = b.len;
  return cm_buf_steal(&b);
}

int cm_parse_u64(const char *s, uint64_t max, uint64_t *out) {
  if (!s || !*s) return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    uint64_t d = (uint64_t)(*p - '0');
    if (d > max || v > (max - d) / 10) return -1; /* max - d must not wrap */
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}
