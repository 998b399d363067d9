/* A TOML 1.0 decoder (see pystd.h).
 *
 * One pass of recursive descent over the bytes, no tokenizer: TOML's lexical rules
 * depend on the position (`1979-05-27 = 1` is a bare key, `true` may be a key), so each
 * context scans what it expects.  The whole input is checked for valid UTF-8 first, so
 * later code only has to decide which characters a context allows.
 *
 * Tables remember how they came to exist, which is what the spec's redefinition rules
 * hinge on: created on the way to a deeper [header] (may still get its own header
 * once), defined by a [header], created by a dotted key (may get sub-tables through
 * headers, never a header of its own), or an inline table (frozen). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pystd/pystd.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

/* Recursion (the parser's and toml_free's) is bounded by the depth limit; a caller's
 * larger limit is clamped to this. */
#define TOML_DEPTH_CEILING 1000
/* Tables with more entries than this get a hash index. */
#define TABLE_INDEX_MIN 8

enum table_kind {
  TABLE_ROOT,
  TABLE_IMPLICIT, /* created on the way to a deeper [header] */
  TABLE_HEADER,   /* defined by [header] or [[header]] */
  TABLE_DOTTED,   /* created by a dotted key */
  TABLE_INLINE,   /* { ... }: frozen once closed */
};

enum array_kind {
  ARRAY_STATIC, /* [ ... ] value: frozen */
  ARRAY_TABLES, /* built by [[header]]: only [[header]] may append */
};

typedef struct toml_entry {
  char *key; /* NUL-terminated, key_len bytes before the NUL */
  size_t key_len;
  uint64_t hash;
  toml_value_t *value;
} toml_entry_t;

struct toml_value {
  toml_type_t type;
  uint8_t kind; /* enum table_kind or enum array_kind */
  size_t depth;
  size_t line;
  union {
    struct {
      char *ptr;
      size_t len;
    } str;
    int64_t integer;
    double fp;
    bool boolean;
    struct {
      toml_datetime_t dt;
      char text[40];
    } dt;
    struct {
      toml_value_t **items;
      size_t len, cap;
    } arr;
    struct {
      toml_entry_t *entries;
      size_t len, cap;
      uint32_t *slots; /* open addressing: entry index + 1, 0 = empty */
      size_t nslots;   /* 0 (no index) or a power of two */
    } tab;
  } u;
};

/* ---------------------------------------------------------------- process-wide state */

static pthread_once_t toml_once = PTHREAD_ONCE_INIT;
static uint64_t hash_key[2];
static locale_t c_locale;

static void toml_init_once(void) {
  /* A secret hash key, so a document cannot be built to collide in the index. */
  if (getrandom(hash_key, sizeof hash_key, GRND_NONBLOCK) != (ssize_t)sizeof hash_key) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    hash_key[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid();
    hash_key[1] = (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&hash_key;
  }
  c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

/* SipHash-1-3. */
static inline uint64_t rotl64(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

#define SIPROUND         \
  do {                   \
    v0 += v1;            \
    v1 = rotl64(v1, 13); \
    v1 ^= v0;            \
    v0 = rotl64(v0, 32); \
    v2 += v3;            \
    v3 = rotl64(v3, 16); \
    v3 ^= v2;            \
    v0 += v3;            \
    v3 = rotl64(v3, 21); \
    v3 ^= v0;            \
    v2 += v1;            \
    v1 = rotl64(v1, 17); \
    v1 ^= v2;            \
    v2 = rotl64(v2, 32); \
  } while (0)

static uint64_t key_hash(const char *data, size_t len) {
  const unsigned char *in = (const unsigned char *)data;
  uint64_t v0 = hash_key[0] ^ 0x736f6d6570736575ULL;
  uint64_t v1 = hash_key[1] ^ 0x646f72616e646f6dULL;
  uint64_t v2 = hash_key[0] ^ 0x6c7967656e657261ULL;
  uint64_t v3 = hash_key[1] ^ 0x7465646279746573ULL;
  size_t whole = len - len % 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m = 0;
    for (int b = 7; b >= 0; b--) m = (m << 8) | in[i + (size_t)b];
    v3 ^= m;
    SIPROUND;
    v0 ^= m;
  }
  uint64_t last = (uint64_t)len << 56;
  for (size_t b = 0; b < len % 8; b++) last |= (uint64_t)in[whole + b] << (8 * b);
  v3 ^= last;
  SIPROUND;
  v0 ^= last;
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}

/* ---------------------------------------------------------------- tree */

static void value_free(toml_value_t *v) {
  if (v == NULL) return;
  switch (v->type) {
    case TOML_STRING:
      free(v->u.str.ptr);
      break;
    case TOML_ARRAY:
      for (size_t i = 0; i < v->u.arr.len; i++) value_free(v->u.arr.items[i]);
      free(v->u.arr.items);
      break;
    case TOML_TABLE:
      for (size_t i = 0; i < v->u.tab.len; i++) {
        free(v->u.tab.entries[i].key);
        value_free(v->u.tab.entries[i].value);
      }
      free(v->u.tab.entries);
      free(v->u.tab.slots);
      break;
    default:
      break;
  }
  free(v);
}

void toml_free(toml_value_t *root) {
  value_free(root);
}

void toml_freep(toml_value_t **root) {
  if (root == NULL) return;
  value_free(*root);
  *root = NULL;
}

static toml_entry_t *table_find(const toml_value_t *t, const char *key, size_t len, uint64_t hash) {
  if (t->u.tab.nslots == 0) {
    for (size_t i = 0; i < t->u.tab.len; i++) {
      toml_entry_t *e = &t->u.tab.entries[i];
      if (e->hash == hash && e->key_len == len && memcmp(e->key, key, len) == 0) return e;
    }
    return NULL;
  }
  size_t mask = t->u.tab.nslots - 1;
  for (size_t s = (size_t)hash & mask;; s = (s + 1) & mask) {
    uint32_t slot = t->u.tab.slots[s];
    if (slot == 0) return NULL;
    toml_entry_t *e = &t->u.tab.entries[slot - 1];
    if (e->hash == hash && e->key_len == len && memcmp(e->key, key, len) == 0) return e;
  }
}

static void table_index_put(toml_value_t *t, size_t index) {
  size_t mask = t->u.tab.nslots - 1;
  size_t s = (size_t)t->u.tab.entries[index].hash & mask;
  while (t->u.tab.slots[s] != 0) s = (s + 1) & mask;
  t->u.tab.slots[s] = (uint32_t)(index + 1);
}

/* Adds a key known to be absent; takes ownership of value. */
static void table_insert(toml_value_t *t, const char *key, size_t len, uint64_t hash,
                         toml_value_t *value) {
  if (t->u.tab.len == t->u.tab.cap) {
    t->u.tab.cap = t->u.tab.cap ? t->u.tab.cap * 2 : 4;
    t->u.tab.entries = xrealloc(t->u.tab.entries, t->u.tab.cap * sizeof *t->u.tab.entries);
  }
  toml_entry_t *e = &t->u.tab.entries[t->u.tab.len++];
  e->key = xmalloc(len + 1);
  if (len) memcpy(e->key, key, len);
  e->key[len] = '\0';
  e->key_len = len;
  e->hash = hash;
  e->value = value;

  size_t n = t->u.tab.len;
  if (n <= TABLE_INDEX_MIN) return;
  if (n * 2 > t->u.tab.nslots) {
    size_t nslots = t->u.tab.nslots ? t->u.tab.nslots * 2 : 32;
    while (n * 2 > nslots) nslots *= 2;
    free(t->u.tab.slots);
    t->u.tab.slots = xcalloc(nslots, sizeof *t->u.tab.slots);
    t->u.tab.nslots = nslots;
    for (size_t i = 0; i < n; i++) table_index_put(t, i);
  } else {
    table_index_put(t, n - 1);
  }
}

static void array_append(toml_value_t *a, toml_value_t *item) {
  if (a->u.arr.len == a->u.arr.cap) {
    a->u.arr.cap = a->u.arr.cap ? a->u.arr.cap * 2 : 4;
    a->u.arr.items = xrealloc(a->u.arr.items, a->u.arr.cap * sizeof *a->u.arr.items);
  }
  a->u.arr.items[a->u.arr.len++] = item;
}

/* ---------------------------------------------------------------- parser state */

typedef struct parser {
  const char *buf;
  size_t len;
  size_t pos;
  size_t max_depth;
  size_t max_values;
  size_t nvalues;
  size_t first_line;
  size_t column_offset;
  /* Cache for line_at(): the line number (1-based, relative to buf) at line_pos. */
  size_t line_pos;
  size_t line_no;
  toml_value_t *root;
  toml_value_t *section; /* the table that key/value lines go into */
  cm_error_t *err;
} parser_t;

/* One part of a possibly dotted key.  Bare keys point into the input; quoted keys are
 * decoded into owned memory. */
typedef struct key_part {
  const char *s;
  size_t len;
  char *owned;
  size_t pos;
} key_part_t;

typedef struct dotted_key {
  key_part_t *parts;
  size_t n, cap;
} dotted_key_t;

static void dotted_key_release(dotted_key_t *k) {
  for (size_t i = 0; i < k->n; i++) free(k->parts[i].owned);
  free(k->parts);
  k->parts = NULL;
  k->n = k->cap = 0;
}

static size_t line_at(parser_t *p, size_t pos) {
  if (pos > p->len) pos = p->len;
  if (pos < p->line_pos) {
    /* Callers step back only a little (to the start of a key or header). */
    for (size_t i = pos; i < p->line_pos; i++)
      if (p->buf[i] == '\n') p->line_no--;
    p->line_pos = pos;
    return p->line_no + p->first_line - 1;
  }
  const char *s = p->buf + p->line_pos;
  const char *end = p->buf + pos;
  while (s < end) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    if (nl == NULL) break;
    p->line_no++;
    s = nl + 1;
  }
  p->line_pos = pos;
  return p->line_no + p->first_line - 1;
}

static int fail_at(parser_t *p, size_t pos, cm_error_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_at(parser_t *p, size_t pos, cm_error_kind_t kind, const char *fmt, ...) {
  if (pos > p->len) pos = p->len;
  size_t line = 1, line_start = 0;
  for (const char *s = p->buf, *end = p->buf + pos; s < end;) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    if (nl == NULL) break;
    line++;
    line_start = (size_t)(nl + 1 - p->buf);
    s = nl + 1;
  }
  size_t column = 1;
  if (line_start == 0 && pos >= 3 && memcmp(p->buf, "\xEF\xBB\xBF", 3) == 0) line_start = 3;
  for (size_t i = line_start; i < pos; i++) {
    if (((unsigned char)p->buf[i] & 0xC0) != 0x80) column++;
  }
  va_list ap;
  va_start(ap, fmt);
  char *what = xvasprintf(fmt, ap);
  va_end(ap);
  cm_error_set(p->err, 0, kind, "line %zu, column %zu: %s", line + p->first_line - 1,
               column + p->column_offset, what);
  free(what);
  return -1;
}

#define fail(p, pos, ...) fail_at((p), (pos), CM_ERR_INVALID, __VA_ARGS__)

/* Describes the character at pos for a message: "end of file", "'x'", "U+0007". */
static const char *describe(const parser_t *p, size_t pos, char out[24]) {
  if (pos >= p->len) return "end of file";
  unsigned char c = (unsigned char)p->buf[pos];
  if (c == '\n') return "end of line";
  if (c == '\r') return "carriage return (U+000D)";
  if (c == '\t') return "tab";
  if (c >= 0x20 && c < 0x7f) {
    snprintf(out, 24, "'%c'", c);
    return out;
  }
  uint32_t cp = c;
  if (c >= 0x80) {
    /* The input is valid UTF-8 here. */
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    cp = c & (0x3F >> extra);
    for (int i = 1; i <= extra && pos + (size_t)i < p->len; i++)
      cp = (cp << 6) | ((unsigned char)p->buf[pos + (size_t)i] & 0x3F);
  }
  snprintf(out, 24, "U+%04X", (unsigned)cp);
  return out;
}

/* A key path for messages: parts joined by '.', control characters, quotes and
 * backslashes escaped, cut at about 80 bytes (on a character boundary). */
static char *key_text(const key_part_t *parts, size_t n) {
  size_t cap = 96;
  char *out = xmalloc(cap);
  size_t o = 0;
  bool cut = false;
  for (size_t i = 0; i < n && !cut; i++) {
    if (i > 0) out[o++] = '.';
    for (size_t j = 0; j < parts[i].len; j++) {
      unsigned char c = (unsigned char)parts[i].s[j];
      if (o >= 80 && (c & 0xC0) != 0x80) {
        cut = true;
        break;
      }
      if (c < 0x20 || c == 0x7f) {
        o += (size_t)snprintf(out + o, cap - o, "\\u%04X", c);
      } else if (c == '"' || c == '\\') {
        out[o++] = '\\';
        out[o++] = (char)c;
      } else {
        out[o++] = (char)c;
      }
    }
  }
  if (cut) {
    memcpy(out + o, "...", 3);
    o += 3;
  }
  out[o] = '\0';
  return out;
}

/* fail() with the key path parts[0..n) formatted as the first %s argument. */
#define fail_key(p, pos, parts, n, fmt, ...)                   \
  ({                                                           \
    char *key_name_ = key_text((parts), (n));                  \
    int rc_ = fail((p), (pos), fmt, key_name_, ##__VA_ARGS__); \
    free(key_name_);                                           \
    rc_;                                                       \
  })

static toml_value_t *new_value(parser_t *p, toml_type_t type, size_t depth, size_t pos) {
  if (depth > p->max_depth) {
    fail_at(p, pos, CM_ERR_LIMIT, "nesting deeper than %zu levels", p->max_depth);
    return NULL;
  }
  if (p->nvalues >= p->max_values) {
    fail_at(p, pos, CM_ERR_LIMIT, "more than %zu keys and array items", p->max_values);
    return NULL;
  }
  p->nvalues++;
  toml_value_t *v = xcalloc(1, sizeof *v);
  v->type = type;
  v->depth = depth;
  v->line = line_at(p, pos);
  return v;
}

/* ---------------------------------------------------------------- lexical helpers */

static inline bool is_ws(char c) {
  return c == ' ' || c == '\t';
}

static inline bool is_bare_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

static inline bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static inline int peek(const parser_t *p) {
  return p->pos < p->len ? (unsigned char)p->buf[p->pos] : -1;
}

static inline int peek_at(const parser_t *p, size_t offset) {
  return p->pos + offset < p->len ? (unsigned char)p->buf[p->pos + offset] : -1;
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->len && is_ws(p->buf[p->pos])) p->pos++;
}

/* Returns the offset of the first byte that is not valid UTF-8, or len. */
static size_t utf8_check(const char *buf, size_t len) {
  const unsigned char *s = (const unsigned char *)buf;
  size_t i = 0;
  while (i < len) {
    unsigned char c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t need;
    uint32_t min, cp;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1, min = 0x80, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2, min = 0x800, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3, min = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (len - i <= need) return i;
    for (size_t k = 1; k <= need; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += need + 1;
  }
  return len;
}

/* A comment from '#' up to (not including) the end of the line. */
static int skip_comment(parser_t *p) {
  p->pos++; /* '#' */
  while (p->pos < p->len) {
    unsigned char c = (unsigned char)p->buf[p->pos];
    if (c == '\n') break;
    if (c == '\r' && peek_at(p, 1) == '\n') break;
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      char d[24];
      return fail(p, p->pos, "%s is not allowed in a comment", describe(p, p->pos, d));
    }
    p->pos++;
  }
  return 0;
}

/* Consumes a newline (LF or CRLF) if there is one.  Returns 1 if consumed, 0 if not,
 * -1 on a carriage return that is not followed by a line feed. */
static int eat_newline(parser_t *p) {
  int c = peek(p);
  if (c == '\n') {
    p->pos++;
    return 1;
  }
  if (c == '\r') {
    if (peek_at(p, 1) == '\n') {
      p->pos += 2;
      return 1;
    }
    return fail(p, p->pos, "carriage return (U+000D) not followed by a line feed");
  }
  return 0;
}

/* The rest of a line after a key/value pair or header: spaces, a comment, a newline. */
static int end_of_line(parser_t *p, const char *after) {
  skip_ws(p);
  if (peek(p) == '#' && skip_comment(p) < 0) return -1;
  if (p->pos >= p->len) return 0;
  int rc = eat_newline(p);
  if (rc != 0) return rc < 0 ? -1 : 0;
  char d[24];
  return fail(p, p->pos, "unexpected %s after %s (expected a newline or a comment)",
              describe(p, p->pos, d), after);
}

/* Whitespace, comments and newlines between array elements. */
static int skip_ws_comments_newlines(parser_t *p) {
  for (;;) {
    skip_ws(p);
    int c = peek(p);
    if (c == '#') {
      if (skip_comment(p) < 0) return -1;
    } else if (c == '\n' || c == '\r') {
      if (eat_newline(p) < 0) return -1;
    } else {
      return 0;
    }
  }
}

/* ---------------------------------------------------------------- strings */

typedef struct sbuf {
  char *data;
  size_t len, cap;
} sbuf_t;

static void sb_reserve(sbuf_t *b, size_t extra) {
  if (b->cap - b->len > extra) return;
  size_t cap = b->cap ? b->cap : 32;
  while (cap - b->len <= extra) cap *= 2;
  b->data = xrealloc(b->data, cap);
  b->cap = cap;
}

static void sb_put(sbuf_t *b, const char *s, size_t n) {
  sb_reserve(b, n);
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void sb_putc(sbuf_t *b, char c) {
  sb_put(b, &c, 1);
}

static void sb_put_utf8(sbuf_t *b, uint32_t cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) {
    u[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  sb_put(b, u, n);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The characters allowed in any string without escaping, other than newlines. */
static int check_string_char(parser_t *p, unsigned char c, bool multiline) {
  if ((c < 0x20 && c != '\t') || c == 0x7f) {
    char d[24];
    if (c == '\n') return fail(p, p->pos, "string is not closed before the end of the line");
    if (c == '\r' && multiline)
      return fail(p, p->pos, "carriage return (U+000D) not followed by a line feed");
    return fail(p, p->pos, "%s is not allowed in a string (use an escape sequence)",
                describe(p, p->pos, d));
  }
  return 0;
}

/* A quote run inside a multi-line string: fewer than three quotes are content, three to
 * five close the string (the extra ones are content).  Returns 1 if the string ended. */
static int multiline_quotes(parser_t *p, sbuf_t *b, char quote) {
  size_t n = 0;
  while (p->pos + n < p->len && p->buf[p->pos + n] == quote) n++;
  if (n < 3) {
    sb_put(b, p->buf + p->pos, n);
    p->pos += n;
    return 0;
  }
  if (n > 5) return fail(p, p->pos + 5, "too many quotes at the end of a multi-line string");
  sb_put(b, p->buf + p->pos, n - 3);
  p->pos += n;
  return 1;
}

/* A basic string ("..." or """...""") at p->pos.  On success *out is an owned,
 * NUL-terminated buffer (possibly with embedded NULs) of *out_len bytes. */
static int parse_basic_string(parser_t *p, bool multiline, char **out, size_t *out_len) {
  size_t open = p->pos;
  sbuf_t b = {0};
  sb_reserve(&b, 0);
  b.data[0] = '\0';
  p->pos += multiline ? 3 : 1;
  if (multiline && eat_newline(p) < 0) goto fail;
  for (;;) {
    if (p->pos >= p->len) {
      fail(p, open, "string is not closed before the end of the file");
      goto fail;
    }
    unsigned char c = (unsigned char)p->buf[p->pos];
    if (c == '"') {
      if (!multiline) {
        p->pos++;
        break;
      }
      int rc = multiline_quotes(p, &b, '"');
      if (rc < 0) goto fail;
      if (rc == 1) break;
      continue;
    }
    if (c == '\\') {
      int e = peek_at(p, 1);
      char plain = 0;
      switch (e) {
        case 'b':
          plain = '\b';
          break;
        case 't':
          plain = '\t';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'r':
          plain = '\r';
          break;
        case '"':
          plain = '"';
          break;
        case '\\':
          plain = '\\';
          break;
        default:
          break;
      }
      if (plain) {
        sb_putc(&b, plain);
        p->pos += 2;
        continue;
      }
      if (e == 'u' || e == 'U') {
        size_t digits = e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t i = 0; i < digits; i++) {
          int h = p->pos + 2 + i < p->len ? hex_value(p->buf[p->pos + 2 + i]) : -1;
          if (h < 0) {
            fail(p, p->pos, "\\%c escape needs %zu hexadecimal digits", e, digits);
            goto fail;
          }
          cp = (cp << 4) | (uint32_t)h;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          fail(p, p->pos, "\\%c escape is not a Unicode scalar value", e);
          goto fail;
        }
        sb_put_utf8(&b, cp);
        p->pos += 2 + digits;
        continue;
      }
      if (multiline && (e == ' ' || e == '\t' || e == '\n' || e == '\r')) {
        /* Line-ending backslash: only whitespace may follow it on its line; then all
         * whitespace and newlines up to the next other character are dropped. */
        size_t q = p->pos + 1;
        while (q < p->len && is_ws(p->buf[q])) q++;
        if (!(q < p->len && (p->buf[q] == '\n' ||
                             (p->buf[q] == '\r' && q + 1 < p->len && p->buf[q + 1] == '\n')))) {
          fail(p, p->pos, "a backslash followed by whitespace must end the line");
          goto fail;
        }
        p->pos = q;
        for (;;) {
          skip_ws(p);
          int rc = eat_newline(p);
          if (rc < 0) goto fail;
          if (rc == 0) break;
        }
        continue;
      }
      if (e < 0) {
        fail(p, open, "string is not closed before the end of the file");
      } else {
        char d[24];
        p->pos++;
        fail(p, p->pos - 1, "invalid escape sequence: backslash followed by %s",
             describe(p, p->pos, d));
      }
      goto fail;
    }
    if (multiline && c == '\n') {
      sb_putc(&b, '\n');
      p->pos++;
      continue;
    }
    if (multiline && c == '\r' && peek_at(p, 1) == '\n') {
      sb_putc(&b, '\n');
      p->pos += 2;
      continue;
    }
    if (check_string_char(p, c, multiline) < 0) goto fail;
    sb_putc(&b, (char)c);
    p->pos++;
  }
  *out = b.data;
  *out_len = b.len;
  return 0;
fail:
  free(b.data);
  return -1;
}

/* A literal string ('...' or '''...'''): no escapes. */
static int parse_literal_string(parser_t *p, bool multiline, char **out, size_t *out_len) {
  size_t open = p->pos;
  sbuf_t b = {0};
  sb_reserve(&b, 0);
  b.data[0] = '\0';
  p->pos += multiline ? 3 : 1;
  if (multiline && eat_newline(p) < 0) goto fail;
  for (;;) {
    if (p->pos >= p->len) {
      fail(p, open, "string is not closed before the end of the file");
      goto fail;
    }
    unsigned char c = (unsigned char)p->buf[p->pos];
    if (c == '\'') {
      if (!multiline) {
        p->pos++;
        break;
      }
      int rc = multiline_quotes(p, &b, '\'');
      if (rc < 0) goto fail;
      if (rc == 1) break;
      continue;
    }
    if (multiline && c == '\n') {
      sb_putc(&b, '\n');
      p->pos++;
      continue;
    }
    if (multiline && c == '\r' && peek_at(p, 1) == '\n') {
      sb_putc(&b, '\n');
      p->pos += 2;
      continue;
    }
    if (check_string_char(p, c, multiline) < 0) goto fail;
    /* Copy a run of plain bytes at once. */
    size_t run = 1;
    while (p->pos + run < p->len) {
      unsigned char d = (unsigned char)p->buf[p->pos + run];
      if (d == '\'' || (d < 0x20 && d != '\t') || d == 0x7f) break;
      run++;
    }
    sb_put(&b, p->buf + p->pos, run);
    p->pos += run;
  }
  *out = b.data;
  *out_len = b.len;
  return 0;
fail:
  free(b.data);
  return -1;
}

static bool at_triple(const parser_t *p, char quote) {
  return peek(p) == quote && peek_at(p, 1) == quote && peek_at(p, 2) == quote;
}

/* ---------------------------------------------------------------- keys */

/* A key: one or more simple keys separated by '.', with optional spaces around the
 * dots.  Consumes trailing spaces. */
static int parse_key(parser_t *p, dotted_key_t *k) {
  for (;;) {
    if (k->n >= p->max_depth)
      return fail_at(p, p->pos, CM_ERR_LIMIT, "dotted key with more than %zu parts", p->max_depth);
    if (k->n == k->cap) {
      k->cap = k->cap ? k->cap * 2 : 4;
      k->parts = xrealloc(k->parts, k->cap * sizeof *k->parts);
    }
    key_part_t *part = &k->parts[k->n];
    memset(part, 0, sizeof *part);
    part->pos = p->pos;
    int c = peek(p);
    if (c >= 0 && is_bare_key_char((char)c)) {
      size_t start = p->pos;
      while (p->pos < p->len && is_bare_key_char(p->buf[p->pos])) p->pos++;
      part->s = p->buf + start;
      part->len = p->pos - start;
    } else if (c == '"' || c == '\'') {
      if (at_triple(p, (char)c)) return fail(p, p->pos, "a multi-line string cannot be a key");
      int rc = c == '"' ? parse_basic_string(p, false, &part->owned, &part->len)
                        : parse_literal_string(p, false, &part->owned, &part->len);
      if (rc < 0) return -1;
      part->s = part->owned;
    } else {
      char d[24];
      return fail(p, p->pos, "expected a key, found %s", describe(p, p->pos, d));
    }
    k->n++;
    skip_ws(p);
    if (peek(p) != '.') return 0;
    p->pos++;
    skip_ws(p);
  }
}

/* ---------------------------------------------------------------- values */

static toml_value_t *parse_value(parser_t *p, size_t depth);
static int parse_keyval(parser_t *p, toml_value_t *table);

static bool digits_at(const parser_t *p, size_t pos, size_t n, int *out) {
  if (pos + n > p->len) return false;
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    char c = p->buf[pos + i];
    if (!is_digit(c)) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

static int days_in_month(int year, int month) {
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (month == 2 && ((year % 4 == 0 && year % 100 != 0) || year % 400 == 0)) return 29;
  return days[month - 1];
}

/* HH:MM:SS[.fraction] at pos; fills the time fields and appends the text. */
static int parse_time_part(parser_t *p, size_t pos, toml_datetime_t *dt, char *text,
                           size_t *text_len, size_t *end) {
  if (!digits_at(p, pos, 2, &dt->hour) || pos + 2 >= p->len || p->buf[pos + 2] != ':' ||
      !digits_at(p, pos + 3, 2, &dt->minute))
    return fail(p, pos, "invalid time (expected HH:MM:SS)");
  if (pos + 5 >= p->len || p->buf[pos + 5] != ':' || !digits_at(p, pos + 6, 2, &dt->second))
    return fail(p, pos, "invalid time: seconds are required (HH:MM:SS)");
  if (dt->hour > 23) return fail(p, pos, "invalid time: hour %02d is out of range", dt->hour);
  if (dt->minute > 59)
    return fail(p, pos + 3, "invalid time: minute %02d is out of range", dt->minute);
  if (dt->second > 59)
    return fail(p, pos + 6, "invalid time: second %02d is out of range", dt->second);
  memcpy(text + *text_len, p->buf + pos, 8);
  *text_len += 8;
  pos += 8;
  if (pos < p->len && p->buf[pos] == '.') {
    size_t digits = 0;
    while (pos + 1 + digits < p->len && is_digit(p->buf[pos + 1 + digits])) digits++;
    if (digits == 0) return fail(p, pos, "invalid time: '.' must be followed by digits");
    int ns = 0;
    for (size_t i = 0; i < 9; i++) ns = ns * 10 + (i < digits ? p->buf[pos + 1 + i] - '0' : 0);
    dt->nanosecond = ns;
    size_t keep = digits < 9 ? digits : 9;
    text[(*text_len)++] = '.';
    memcpy(text + *text_len, p->buf + pos + 1, keep);
    *text_len += keep;
    pos += 1 + digits;
  }
  *end = pos;
  return 0;
}

/* A date, date-time or local time at p->pos (the caller saw its first digits). */
static toml_value_t *parse_datetime(parser_t *p, size_t depth) {
  size_t start = p->pos, pos = start;
  toml_datetime_t dt = {0};
  char text[40];
  size_t text_len = 0;
  bool has_date = false, has_time = false;

  if (pos + 4 < p->len && p->buf[pos + 4] == '-') {
    if (!digits_at(p, pos, 4, &dt.year) || !digits_at(p, pos + 5, 2, &dt.month) ||
        pos + 7 >= p->len || p->buf[pos + 7] != '-' || !digits_at(p, pos + 8, 2, &dt.day)) {
      fail(p, pos, "invalid date (expected YYYY-MM-DD)");
      return NULL;
    }
    if (dt.month < 1 || dt.month > 12) {
      fail(p, pos + 5, "invalid date: month %02d is out of range", dt.month);
      return NULL;
    }
    if (dt.day < 1 || dt.day > days_in_month(dt.year, dt.month)) {
      fail(p, pos + 8, "invalid date: day %02d is out of range for %04d-%02d", dt.day, dt.year,
           dt.month);
      return NULL;
    }
    memcpy(text, p->buf + pos, 10);
    text_len = 10;
    pos += 10;
    has_date = true;
    if (pos < p->len && (p->buf[pos] == 'T' || p->buf[pos] == 't' ||
                         (p->buf[pos] == ' ' && pos + 1 < p->len && is_digit(p->buf[pos + 1])))) {
      text[text_len++] = 'T';
      pos++;
      if (parse_time_part(p, pos, &dt, text, &text_len, &pos) < 0) return NULL;
      has_time = true;
    }
  } else {
    if (parse_time_part(p, pos, &dt, text, &text_len, &pos) < 0) return NULL;
    has_time = true;
  }

  if (has_date && has_time) {
    dt.type = TOML_LOCAL_DATETIME;
    if (pos < p->len && (p->buf[pos] == 'Z' || p->buf[pos] == 'z')) {
      dt.type = TOML_OFFSET_DATETIME;
      dt.offset_z = true;
      text[text_len++] = 'Z';
      pos++;
    } else if (pos < p->len && (p->buf[pos] == '+' || p->buf[pos] == '-')) {
      int oh, om;
      if (!digits_at(p, pos + 1, 2, &oh) || pos + 3 >= p->len || p->buf[pos + 3] != ':' ||
          !digits_at(p, pos + 4, 2, &om)) {
        fail(p, pos, "invalid time offset (expected Z or +HH:MM)");
        return NULL;
      }
      if (oh > 23 || om > 59) {
        fail(p, pos, "invalid time offset: %.6s is out of range", p->buf + pos);
        return NULL;
      }
      dt.type = TOML_OFFSET_DATETIME;
      dt.offset_minutes = (oh * 60 + om) * (p->buf[pos] == '-' ? -1 : 1);
      memcpy(text + text_len, p->buf + pos, 6);
      text_len += 6;
      pos += 6;
    }
  } else {
    dt.type = has_date ? TOML_LOCAL_DATE : TOML_LOCAL_TIME;
  }
  text[text_len] = '\0';

  toml_value_t *v = new_value(p, dt.type, depth, start);
  if (v == NULL) return NULL;
  v->u.dt.dt = dt;
  memcpy(v->u.dt.text, text, text_len + 1);
  p->pos = pos;
  return v;
}

static bool is_number_char(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '+' ||
         c == '-' || c == '.';
}

static bool is_base_digit(char c, int base) {
  if (base == 16) return hex_value(c) >= 0;
  return c >= '0' && c < '0' + base;
}

/* DIGIT *( DIGIT / "_" DIGIT ) at t[*i]. */
static bool scan_digits(const char *t, size_t n, size_t *i, int base) {
  if (*i >= n || !is_base_digit(t[*i], base)) return false;
  (*i)++;
  while (*i < n) {
    if (is_base_digit(t[*i], base)) {
      (*i)++;
    } else if (t[*i] == '_' && *i + 1 < n && is_base_digit(t[*i + 1], base)) {
      *i += 2;
    } else {
      break;
    }
  }
  return true;
}

static toml_value_t *new_float(parser_t *p, double f, size_t depth, size_t pos) {
  toml_value_t *v = new_value(p, TOML_FLOAT, depth, pos);
  if (v) v->u.fp = f;
  return v;
}

/* An integer or float (including inf and nan) at p->pos. */
static toml_value_t *parse_number(parser_t *p, size_t depth) {
  size_t start = p->pos, end = start;
  while (end < p->len && is_number_char(p->buf[end])) end++;
  const char *t = p->buf + start;
  size_t n = end - start, i = 0;
  bool signed_ = false, negative = false;
  int shown = n > 40 ? 40 : (int)n;
  const char *more = n > 40 ? "..." : "";

  if (n > 0 && (t[0] == '+' || t[0] == '-')) {
    signed_ = true;
    negative = t[0] == '-';
    i = 1;
  }
  if (n - i == 3 && (memcmp(t + i, "inf", 3) == 0 || memcmp(t + i, "nan", 3) == 0)) {
    double f = t[i] == 'i' ? INFINITY : NAN;
    p->pos = end;
    return new_float(p, negative ? -f : f, depth, start);
  }

  if (n - i >= 2 && t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'o' || t[i + 1] == 'b')) {
    int base = t[i + 1] == 'x' ? 16 : t[i + 1] == 'o' ? 8 : 2;
    if (signed_) {
      fail(p, start, "a sign is not allowed on a hexadecimal, octal or binary integer");
      return NULL;
    }
    size_t digits_start = i + 2;
    i = digits_start;
    if (!scan_digits(t, n, &i, base) || i != n) {
      fail(p, start, "invalid %s integer %.*s%s",
           base == 16  ? "hexadecimal"
           : base == 8 ? "octal"
                       : "binary",
           shown, t, more);
      return NULL;
    }
    uint64_t value = 0;
    for (size_t k = digits_start; k < n; k++) {
      if (t[k] == '_') continue;
      uint64_t d = (uint64_t)hex_value(t[k]);
      if (value > ((uint64_t)INT64_MAX - d) / (uint64_t)base) {
        fail(p, start, "integer %.*s%s does not fit in 64 bits", shown, t, more);
        return NULL;
      }
      value = value * (uint64_t)base + d;
    }
    toml_value_t *v = new_value(p, TOML_INTEGER, depth, start);
    if (v) v->u.integer = (int64_t)value;
    p->pos = end;
    return v;
  }

  size_t int_start = i;
  if (!scan_digits(t, n, &i, 10)) {
    char d[24];
    if (n == 0 || (n == 1 && signed_))
      fail(p, start, "expected a value, found %s", describe(p, start + n, d));
    else
      fail(p, start, "invalid value %.*s%s (strings must be quoted)", shown, t, more);
    return NULL;
  }
  if (t[int_start] == '0' && i - int_start > 1) {
    fail(p, start, "leading zeros are not allowed in %.*s%s", shown, t, more);
    return NULL;
  }
  bool is_float = false;
  if (i < n && t[i] == '.') {
    i++;
    if (!scan_digits(t, n, &i, 10)) {
      fail(p, start, "invalid float %.*s%s: the decimal point must be followed by digits", shown, t,
           more);
      return NULL;
    }
    is_float = true;
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    i++;
    if (i < n && (t[i] == '+' || t[i] == '-')) i++;
    if (!scan_digits(t, n, &i, 10)) {
      fail(p, start, "invalid float %.*s%s: the exponent needs digits", shown, t, more);
      return NULL;
    }
    is_float = true;
  }
  if (i != n) {
    if (t[i] == '_' || (i > 0 && t[i - 1] == '_'))
      fail(p, start, "invalid number %.*s%s: an underscore must be between two digits", shown, t,
           more);
    else
      fail(p, start, "invalid number %.*s%s", shown, t, more);
    return NULL;
  }

  if (is_float) {
    char *clean = xmalloc(n + 1);
    size_t o = 0;
    for (size_t k = 0; k < n; k++)
      if (t[k] != '_') clean[o++] = t[k];
    clean[o] = '\0';
    double f = c_locale ? strtod_l(clean, NULL, c_locale) : strtod(clean, NULL);
    free(clean);
    p->pos = end;
    return new_float(p, f, depth, start);
  }

  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  uint64_t value = 0;
  for (size_t k = int_start; k < n; k++) {
    if (t[k] == '_') continue;
    uint64_t d = (uint64_t)(t[k] - '0');
    if (value > (limit - d) / 10) {
      fail(p, start, "integer %.*s%s does not fit in 64 bits", shown, t, more);
      return NULL;
    }
    value = value * 10 + d;
  }
  toml_value_t *v = new_value(p, TOML_INTEGER, depth, start);
  if (v == NULL) return NULL;
  /* -(2^63) has no positive counterpart: negate in unsigned arithmetic. */
  v->u.integer = negative ? (int64_t)(0 - value) : (int64_t)value;
  p->pos = end;
  return v;
}

static toml_value_t *parse_array(parser_t *p, size_t depth) {
  size_t open = p->pos;
  toml_value_t *a = new_value(p, TOML_ARRAY, depth, open);
  if (a == NULL) return NULL;
  a->kind = ARRAY_STATIC;
  p->pos++; /* '[' */
  for (;;) {
    if (skip_ws_comments_newlines(p) < 0) goto fail;
    if (p->pos >= p->len) {
      fail(p, open, "array is not closed before the end of the file");
      goto fail;
    }
    if (peek(p) == ']') {
      p->pos++;
      return a;
    }
    toml_value_t *item = parse_value(p, depth + 1);
    if (item == NULL) goto fail;
    array_append(a, item);
    if (skip_ws_comments_newlines(p) < 0) goto fail;
    int c = peek(p);
    if (c == ',') {
      p->pos++;
      continue;
    }
    if (c == ']') {
      p->pos++;
      return a;
    }
    char d[24];
    if (c < 0)
      fail(p, open, "array is not closed before the end of the file");
    else
      fail(p, p->pos, "expected ',' or ']' after an array element, found %s",
           describe(p, p->pos, d));
    goto fail;
  }
fail:
  value_free(a);
  return NULL;
}

static toml_value_t *parse_inline_table(parser_t *p, size_t depth) {
  size_t open = p->pos;
  toml_value_t *t = new_value(p, TOML_TABLE, depth, open);
  if (t == NULL) return NULL;
  t->kind = TABLE_INLINE;
  p->pos++; /* '{' */
  skip_ws(p);
  if (peek(p) == '}') {
    p->pos++;
    return t;
  }
  for (;;) {
    if (parse_keyval(p, t) < 0) goto fail;
    skip_ws(p);
    int c = peek(p);
    if (c == ',') {
      p->pos++;
      skip_ws(p);
      if (peek(p) == '}') {
        fail(p, p->pos, "a trailing comma is not allowed in an inline table");
        goto fail;
      }
      continue;
    }
    if (c == '}') {
      p->pos++;
      return t;
    }
    char d[24];
    if (c < 0)
      fail(p, open, "inline table is not closed before the end of the file");
    else if (c == '\n' || c == '\r')
      fail(p, p->pos, "an inline table must be on one line");
    else
      fail(p, p->pos, "expected ',' or '}' in an inline table, found %s", describe(p, p->pos, d));
    goto fail;
  }
fail:
  value_free(t);
  return NULL;
}

static toml_value_t *parse_value(parser_t *p, size_t depth) {
  size_t start = p->pos;
  int c = peek(p);
  char d[24];
  if (c == '"' || c == '\'') {
    bool multiline = at_triple(p, (char)c);
    char *s = NULL;
    size_t n = 0;
    int rc = c == '"' ? parse_basic_string(p, multiline, &s, &n)
                      : parse_literal_string(p, multiline, &s, &n);
    if (rc < 0) return NULL;
    toml_value_t *v = new_value(p, TOML_STRING, depth, start);
    if (v == NULL) {
      free(s);
      return NULL;
    }
    v->u.str.ptr = s;
    v->u.str.len = n;
    return v;
  }
  if (c == '[') {
    if (depth > p->max_depth) {
      fail_at(p, start, CM_ERR_LIMIT, "nesting deeper than %zu levels", p->max_depth);
      return NULL;
    }
    return parse_array(p, depth);
  }
  if (c == '{') {
    if (depth > p->max_depth) {
      fail_at(p, start, CM_ERR_LIMIT, "nesting deeper than %zu levels", p->max_depth);
      return NULL;
    }
    return parse_inline_table(p, depth);
  }
  if (c >= '0' && c <= '9') {
    if ((digits_at(p, start, 4, &(int){0}) && peek_at(p, 4) == '-') ||
        (digits_at(p, start, 2, &(int){0}) && peek_at(p, 2) == ':'))
      return parse_datetime(p, depth);
    return parse_number(p, depth);
  }
  if (c == '+' || c == '-' || c == 'i' || c == 'n') return parse_number(p, depth);
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
    size_t end = start;
    while (end < p->len && is_bare_key_char(p->buf[end])) end++;
    size_t n = end - start;
    if ((n == 4 && memcmp(p->buf + start, "true", 4) == 0) ||
        (n == 5 && memcmp(p->buf + start, "false", 5) == 0)) {
      toml_value_t *v = new_value(p, TOML_BOOLEAN, depth, start);
      if (v == NULL) return NULL;
      v->u.boolean = n == 4;
      p->pos = end;
      return v;
    }
    fail(p, start, "invalid value %.*s%s (strings must be quoted)", n > 40 ? 40 : (int)n,
         p->buf + start, n > 40 ? "..." : "");
    return NULL;
  }
  if (c < 0 || c == '\n' || c == '\r' || c == '#' || c == ',' || c == ']' || c == '}') {
    fail(p, start, "expected a value, found %s", describe(p, start, d));
    return NULL;
  }
  fail(p, start, "expected a value, found %s (strings must be quoted)", describe(p, start, d));
  return NULL;
}

/* ---------------------------------------------------------------- key/value and headers */

static const char *type_with_article(toml_type_t type) {
  switch (type) {
    case TOML_STRING:
      return "a string";
    case TOML_INTEGER:
      return "an integer";
    case TOML_FLOAT:
      return "a float";
    case TOML_BOOLEAN:
      return "a boolean";
    case TOML_OFFSET_DATETIME:
      return "an offset datetime";
    case TOML_LOCAL_DATETIME:
      return "a local datetime";
    case TOML_LOCAL_DATE:
      return "a local date";
    case TOML_LOCAL_TIME:
      return "a local time";
    case TOML_ARRAY:
      return "an array";
    case TOML_TABLE:
      return "a table";
    case TOML_NONE:
      break;
  }
  return "nothing";
}

/* key = value, inserted into table (a section table or an inline table being built). */
static int parse_keyval(parser_t *p, toml_value_t *table) {
  dotted_key_t k __attribute__((cleanup(dotted_key_release))) = {0};
  if (parse_key(p, &k) < 0) return -1;
  if (peek(p) != '=') {
    char d[24];
    return fail_key(p, p->pos, k.parts, k.n, "expected '=' after key \"%s\", found %s",
                    describe(p, p->pos, d));
  }
  p->pos++;
  skip_ws(p);

  toml_value_t *t = table;
  for (size_t i = 0; i + 1 < k.n; i++) {
    const key_part_t *part = &k.parts[i];
    uint64_t h = key_hash(part->s, part->len);
    toml_entry_t *e = table_find(t, part->s, part->len, h);
    if (e == NULL) {
      toml_value_t *child = new_value(p, TOML_TABLE, t->depth + 1, part->pos);
      if (child == NULL) return -1;
      child->kind = TABLE_DOTTED;
      table_insert(t, part->s, part->len, h, child);
      t = child;
      continue;
    }
    toml_value_t *v = e->value;
    if (v->type != TOML_TABLE)
      return fail_key(p, part->pos, k.parts, i + 1, "key \"%s\" is already %s, not a table",
                      type_with_article(v->type));
    if (v->kind == TABLE_INLINE)
      return fail_key(p, part->pos, k.parts, i + 1, "cannot add keys to inline table \"%s\"");
    if (v->kind == TABLE_HEADER)
      return fail_key(p, part->pos, k.parts, i + 1,
                      "cannot add keys to table \"%s\" with a dotted key: it is defined by a "
                      "[header]");
    v->kind = TABLE_DOTTED; /* an implicit table is now defined by dotted keys */
    t = v;
  }

  const key_part_t *last = &k.parts[k.n - 1];
  uint64_t h = key_hash(last->s, last->len);
  if (table_find(t, last->s, last->len, h) != NULL)
    return fail_key(p, last->pos, k.parts, k.n, "duplicate key \"%s\"");
  toml_value_t *v = parse_value(p, t->depth + 1);
  if (v == NULL) return -1;
  table_insert(t, last->s, last->len, h, v);
  return 0;
}

/* [a.b] or [[a.b]]: makes the named table the current section. */
static int parse_header(parser_t *p) {
  size_t open = p->pos;
  p->pos++;
  bool array = peek(p) == '[';
  if (array) p->pos++;
  skip_ws(p);
  dotted_key_t k __attribute__((cleanup(dotted_key_release))) = {0};
  if (parse_key(p, &k) < 0) return -1;
  char d[24];
  if (peek(p) != ']') {
    return fail(p, p->pos, "expected ']' to close the table header, found %s",
                describe(p, p->pos, d));
  }
  p->pos++;
  if (array) {
    if (peek(p) != ']')
      return fail(p, p->pos, "expected ']]' to close the array-of-tables header, found %s",
                  describe(p, p->pos, d));
    p->pos++;
  }

  toml_value_t *t = p->root;
  for (size_t i = 0; i < k.n; i++) {
    const key_part_t *part = &k.parts[i];
    bool last = i + 1 == k.n;
    uint64_t h = key_hash(part->s, part->len);
    toml_entry_t *e = table_find(t, part->s, part->len, h);
    if (e == NULL) {
      size_t at = last ? open : part->pos;
      if (last && array) {
        toml_value_t *a = new_value(p, TOML_ARRAY, t->depth + 1, at);
        if (a == NULL) return -1;
        a->kind = ARRAY_TABLES;
        table_insert(t, part->s, part->len, h, a);
        toml_value_t *elem = new_value(p, TOML_TABLE, a->depth + 1, at);
        if (elem == NULL) return -1;
        elem->kind = TABLE_HEADER;
        array_append(a, elem);
        t = elem;
      } else {
        toml_value_t *child = new_value(p, TOML_TABLE, t->depth + 1, at);
        if (child == NULL) return -1;
        child->kind = last ? TABLE_HEADER : TABLE_IMPLICIT;
        table_insert(t, part->s, part->len, h, child);
        t = child;
      }
      continue;
    }

    toml_value_t *v = e->value;
    if (v->type == TOML_ARRAY) {
      if (v->kind != ARRAY_TABLES)
        return fail_key(p, part->pos, k.parts, i + 1,
                        "cannot extend \"%s\": it is an array value, not an array of tables");
      if (last && !array)
        return fail_key(p, part->pos, k.parts, i + 1,
                        "cannot define table [%s]: it is an array of tables");
      if (last) {
        toml_value_t *elem = new_value(p, TOML_TABLE, v->depth + 1, open);
        if (elem == NULL) return -1;
        elem->kind = TABLE_HEADER;
        array_append(v, elem);
        t = elem;
      } else {
        t = v->u.arr.items[v->u.arr.len - 1];
      }
      continue;
    }
    if (v->type != TOML_TABLE)
      return fail_key(p, part->pos, k.parts, i + 1, "key \"%s\" is already %s, not a table",
                      type_with_article(v->type));
    if (v->kind == TABLE_INLINE)
      return fail_key(p, part->pos, k.parts, i + 1,
                      "cannot extend \"%s\": inline tables cannot be extended");
    if (last) {
      if (array)
        return fail_key(p, part->pos, k.parts, i + 1,
                        "cannot define array of tables [[%s]]: it is already a table");
      if (v->kind == TABLE_DOTTED)
        return fail_key(p, part->pos, k.parts, i + 1,
                        "cannot define table [%s]: it was already created by dotted keys");
      if (v->kind != TABLE_IMPLICIT)
        return fail_key(p, part->pos, k.parts, i + 1, "table [%s] is defined twice");
      v->kind = TABLE_HEADER;
      v->line = line_at(p, open);
    }
    t = v;
  }
  p->section = t;
  return 0;
}

static int parse_document(parser_t *p) {
  if (p->len >= 3 && memcmp(p->buf, "\xEF\xBB\xBF", 3) == 0) p->pos = 3;
  while (p->pos < p->len) {
    skip_ws(p);
    int c = peek(p);
    if (c < 0) break;
    if (c == '[') {
      if (parse_header(p) < 0) return -1;
      if (end_of_line(p, "a table header") < 0) return -1;
    } else if (c == '#' || c == '\n' || c == '\r') {
      if (end_of_line(p, "a comment") < 0) return -1;
    } else {
      if (parse_keyval(p, p->section) < 0) return -1;
      if (end_of_line(p, "a value") < 0) return -1;
    }
  }
  return 0;
}

int toml_parse(const char *buf, size_t len, const toml_options_t *options, toml_value_t **out,
               cm_error_t *err) {
  if (out) *out = NULL;
  if (out == NULL || (buf == NULL && len > 0))
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "toml_parse: invalid arguments");
  pthread_once(&toml_once, toml_init_once);

  toml_options_t o = options ? *options : (toml_options_t){0};
  if (o.max_input_bytes == 0) o.max_input_bytes = TOML_MAX_INPUT_BYTES;
  if (o.max_depth == 0) o.max_depth = TOML_MAX_DEPTH;
  if (o.max_depth > TOML_DEPTH_CEILING) o.max_depth = TOML_DEPTH_CEILING;
  if (o.max_values == 0) o.max_values = TOML_MAX_VALUES;
  if (o.first_line == 0) o.first_line = 1;
  if (len > o.max_input_bytes)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "TOML document of %zu bytes exceeds the limit of %zu",
                        len, o.max_input_bytes);

  parser_t p = {
      .buf = buf ? buf : "",
      .len = len,
      .max_depth = o.max_depth,
      .max_values = o.max_values,
      .first_line = o.first_line,
      .column_offset = o.column_offset,
      .line_no = 1,
      .err = err,
  };
  size_t bad = utf8_check(p.buf, len);
  if (bad < len) return fail(&p, bad, "invalid UTF-8 (byte 0x%02X)", (unsigned char)buf[bad]);

  p.root = xcalloc(1, sizeof *p.root);
  p.root->type = TOML_TABLE;
  p.root->kind = TABLE_ROOT;
  p.root->line = o.first_line;
  p.section = p.root;
  if (parse_document(&p) < 0) {
    value_free(p.root);
    return -1;
  }
  *out = p.root;
  return 0;
}

/* ---------------------------------------------------------------- accessors */

toml_type_t toml_type(const toml_value_t *v) {
  return v ? v->type : TOML_NONE;
}

const char *toml_type_name(toml_type_t type) {
  switch (type) {
    case TOML_STRING:
      return "string";
    case TOML_INTEGER:
      return "integer";
    case TOML_FLOAT:
      return "float";
    case TOML_BOOLEAN:
      return "boolean";
    case TOML_OFFSET_DATETIME:
      return "offset datetime";
    case TOML_LOCAL_DATETIME:
      return "local datetime";
    case TOML_LOCAL_DATE:
      return "local date";
    case TOML_LOCAL_TIME:
      return "local time";
    case TOML_ARRAY:
      return "array";
    case TOML_TABLE:
      return "table";
    case TOML_NONE:
      break;
  }
  return "none";
}

size_t toml_line(const toml_value_t *v) {
  return v ? v->line : 0;
}

size_t toml_table_len(const toml_value_t *table) {
  return table && table->type == TOML_TABLE ? table->u.tab.len : 0;
}

const toml_value_t *toml_table_getn(const toml_value_t *table, const char *key, size_t key_len) {
  if (table == NULL || table->type != TOML_TABLE || (key == NULL && key_len > 0)) return NULL;
  if (table->u.tab.len == 0) return NULL;
  if (key == NULL) key = "";
  toml_entry_t *e = table_find(table, key, key_len, key_hash(key, key_len));
  return e ? e->value : NULL;
}

const toml_value_t *toml_table_get(const toml_value_t *table, const char *key) {
  if (key == NULL) return NULL;
  return toml_table_getn(table, key, strlen(key));
}

const toml_value_t *toml_table_at(const toml_value_t *table, size_t index, const char **key,
                                  size_t *key_len) {
  if (table == NULL || table->type != TOML_TABLE || index >= table->u.tab.len) return NULL;
  const toml_entry_t *e = &table->u.tab.entries[index];
  if (key) *key = e->key;
  if (key_len) *key_len = e->key_len;
  return e->value;
}

size_t toml_array_len(const toml_value_t *array) {
  return array && array->type == TOML_ARRAY ? array->u.arr.len : 0;
}

const toml_value_t *toml_array_at(const toml_value_t *array, size_t index) {
  if (array == NULL || array->type != TOML_ARRAY || index >= array->u.arr.len) return NULL;
  return array->u.arr.items[index];
}

const char *toml_string(const toml_value_t *v, size_t *len) {
  if (v == NULL || v->type != TOML_STRING) return NULL;
  if (len) *len = v->u.str.len;
  return v->u.str.ptr;
}

bool toml_integer(const toml_value_t *v, int64_t *out) {
  if (v == NULL || v->type != TOML_INTEGER) return false;
  if (out) *out = v->u.integer;
  return true;
}

bool toml_float(const toml_value_t *v, double *out) {
  if (v == NULL || v->type != TOML_FLOAT) return false;
  if (out) *out = v->u.fp;
  return true;
}

bool toml_boolean(const toml_value_t *v, bool *out) {
  if (v == NULL || v->type != TOML_BOOLEAN) return false;
  if (out) *out = v->u.boolean;
  return true;
}

static bool is_datetime_type(toml_type_t t) {
  return t == TOML_OFFSET_DATETIME || t == TOML_LOCAL_DATETIME || t == TOML_LOCAL_DATE ||
         t == TOML_LOCAL_TIME;
}

bool toml_datetime(const toml_value_t *v, toml_datetime_t *out) {
  if (v == NULL || !is_datetime_type(v->type)) return false;
  if (out) *out = v->u.dt.dt;
  return true;
}

const char *toml_datetime_text(const toml_value_t *v) {
  if (v == NULL || !is_datetime_type(v->type)) return NULL;
  return v->u.dt.text;
}

/* ---------------------------------------------------------------- writing */

static void write_string(cm_buf_t *out, const char *s, size_t len) {
  cm_buf_append(out, "\"", 1);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
      case '"':
        cm_buf_appends(out, "\\\"");
        break;
      case '\\':
        cm_buf_appends(out, "\\\\");
        break;
      case '\n':
        cm_buf_appends(out, "\\n");
        break;
      case '\t':
        cm_buf_appends(out, "\\t");
        break;
      case '\r':
        cm_buf_appends(out, "\\r");
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          cm_buf_printf(out, "\\u%04x", c);
        else
          cm_buf_append(out, (const char *)&s[i], 1);
    }
  }
  cm_buf_append(out, "\"", 1);
}

static void write_value(cm_buf_t *out, const toml_value_t *v) {
  int64_t i;
  double d;
  bool b;
  size_t len;
  switch (toml_type(v)) {
    case TOML_STRING: {
      const char *s = toml_string(v, &len);
      write_string(out, s, len);
      break;
    }
    case TOML_INTEGER:
      toml_integer(v, &i);
      cm_buf_printf(out, "%lld", (long long)i);
      break;
    case TOML_FLOAT:
      toml_float(v, &d);
      if (isnan(d))
        cm_buf_appends(out, "nan");
      else if (isinf(d))
        cm_buf_appends(out, d > 0 ? "inf" : "-inf");
      else {
        char num[64];
        snprintf(num, sizeof num, "%.17g", d);
        /* A float must look like one: 1 -> 1.0. */
        if (!strpbrk(num, ".eE")) strcat(num, ".0");
        cm_buf_appends(out, num);
      }
      break;
    case TOML_BOOLEAN:
      toml_boolean(v, &b);
      cm_buf_appends(out, b ? "true" : "false");
      break;
    case TOML_OFFSET_DATETIME:
    case TOML_LOCAL_DATETIME:
    case TOML_LOCAL_DATE:
    case TOML_LOCAL_TIME:
      cm_buf_appends(out, toml_datetime_text(v));
      break;
    case TOML_ARRAY:
      cm_buf_append(out, "[", 1);
      for (size_t k = 0; k < toml_array_len(v); k++) {
        if (k) cm_buf_appends(out, ", ");
        write_value(out, toml_array_at(v, k));
      }
      cm_buf_append(out, "]", 1);
      break;
    case TOML_TABLE:
      cm_buf_append(out, "{", 1);
      for (size_t k = 0; k < toml_table_len(v); k++) {
        const char *key;
        size_t key_len;
        const toml_value_t *item = toml_table_at(v, k, &key, &key_len);
        cm_buf_appends(out, k ? ", " : " ");
        write_string(out, key, key_len);
        cm_buf_appends(out, " = ");
        write_value(out, item);
        if (k + 1 == toml_table_len(v)) cm_buf_append(out, " ", 1);
      }
      cm_buf_append(out, "}", 1);
      break;
    default:
      break;
  }
}

char *toml_write(const toml_value_t *table) {
  cm_buf_t out;
  cm_buf_init(&out, 0);
  for (size_t k = 0; k < toml_table_len(table); k++) {
    const char *key;
    size_t key_len;
    const toml_value_t *item = toml_table_at(table, k, &key, &key_len);
    write_string(&out, key, key_len);
    cm_buf_appends(&out, " = ");
    write_value(&out, item);
    cm_buf_append(&out, "\n", 1);
  }
  return cm_buf_steal(&out);
}
