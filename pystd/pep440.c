/* PEP 440 versions and specifiers.  A hand-written scanner instead of the regular
 * expression the specification gives: it needs no regex engine, reads nothing past
 * len, and can say exactly where a version goes wrong. */
#include "pystd/pystd.h"

#include <inttypes.h>
#include <stdio.h>

/* Bytes of input quoted in an error message. */
#define EXCERPT_MAX 120

/* ---------------------------------------------------------------- characters */

static bool ch_digit(char c) {
  return c >= '0' && c <= '9';
}
static bool ch_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool ch_alnum(char c) {
  return ch_digit(c) || ch_alpha(c);
}
static bool ch_sep(char c) {
  return c == '-' || c == '_' || c == '.';
}
static bool ch_blank(char c) {
  return c == ' ' || c == '\t';
}
static bool ch_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static char ch_lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}
/* A byte of a specifier's version token (PEP 508: letters, digits, "-_.*+!"). */
static bool ch_version_token(char c) {
  return ch_alnum(c) || c == '-' || c == '_' || c == '.' || c == '*' || c == '+' || c == '!';
}

/* A byte of a version operator. */
static bool ch_op(char c) {
  return c != '\0' && strchr("<>=!~", c) != NULL;
}

/* "'x'" for a printable byte, "byte 0x01" otherwise. */
static void describe_char(char c, char out[16]) {
  unsigned char u = (unsigned char)c;
  if (u >= 0x21 && u < 0x7f)
    snprintf(out, 16, "'%c'", c);
  else if (c == ' ')
    snprintf(out, 16, "space");
  else
    snprintf(out, 16, "byte 0x%02x", u);
}

/* ---------------------------------------------------------------- errors */

static char *excerpt(const char *buf, size_t len) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  size_t shown = len > EXCERPT_MAX ? EXCERPT_MAX : len;
  for (size_t i = 0; i < shown; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c == '"' || c == '\\')
      cm_buf_printf(&b, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f)
      cm_buf_printf(&b, "\\x%02x", c);
    else
      cm_buf_append(&b, &buf[i], 1);
  }
  if (shown < len) cm_buf_appends(&b, "...");
  return cm_buf_steal(&b);
}

int pep440_error_at(cm_error_t *err, cm_error_kind_t kind, const char *what, const char *buf,
                    size_t len, size_t offset, const char *fmt, ...) {
  if (err == NULL) return -1;
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *reason = xvasprintf(fmt, ap);
  va_end(ap);
  cleanup_free char *quoted = excerpt(buf, len);
  if (kind == CM_ERR_INVALID)
    return cm_error_set(err, 0, kind, "invalid %s \"%s\": %s at column %zu", what, quoted, reason,
                        offset + 1);
  return cm_error_set(err, 0, kind, "%s \"%s\": %s", what, quoted, reason);
}

/* Where and why a version failed to parse, relative to the version text, so callers
 * embedding a version in a larger string can point into that string. */
typedef struct vfail {
  size_t offset;
  cm_error_kind_t kind;
  char reason[128];
} vfail_t;

__attribute__((format(printf, 4, 5))) static int vfail(vfail_t *f, cm_error_kind_t kind,
                                                       size_t offset, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->reason, sizeof f->reason, fmt, ap);
  va_end(ap);
  f->offset = offset;
  f->kind = kind;
  return -1;
}

/* ---------------------------------------------------------------- version parsing */

/* Parses the digits at s[*i] (at least one is there). */
static int parse_number(const char *s, size_t n, size_t *i, uint64_t *out, vfail_t *f) {
  size_t start = *i;
  uint64_t v = 0;
  while (*i < n && ch_digit(s[*i])) {
    unsigned d = (unsigned)(s[*i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return vfail(f, CM_ERR_LIMIT, start, "number is larger than %" PRIu64, UINT64_MAX);
    v = v * 10 + d;
    (*i)++;
  }
  *out = v;
  return 0;
}

/* Length of word if s[i..] starts with it (ASCII case-insensitively), else 0. */
static size_t match_word(const char *s, size_t n, size_t i, const char *word) {
  size_t wl = strlen(word);
  if (n - i < wl) return 0;
  for (size_t k = 0; k < wl; k++)
    if (ch_lower(s[i + k]) != word[k]) return 0;
  return wl;
}

/* An optional "[-_.]?<label>[-_.]?<number>?" segment, the label one of words.  Like
 * the specification's regular expression, the separator after the label is taken even
 * when no number follows ("1.0a." is 1.0a0).  Returns the index of the word matched
 * (-1 if none, leaving *i alone), or -2 on a failed number. */
static int parse_labelled(const char *s, size_t n, size_t *i, const char *const *words,
                          size_t nwords, uint64_t *number, vfail_t *f) {
  size_t j = *i;
  if (j < n && ch_sep(s[j])) j++;
  for (size_t w = 0; w < nwords; w++) {
    size_t wl = match_word(s, n, j, words[w]);
    if (wl == 0) continue;
    j += wl;
    if (j < n && ch_sep(s[j])) j++;
    *number = 0;
    if (j < n && ch_digit(s[j]) && parse_number(s, n, &j, number, f) < 0) return -2;
    *i = j;
    return (int)w;
  }
  return -1;
}

/* Copies the local label s[start, end) normalised: lower case, '.' separators,
 * numeric segments without leading zeros.  The label was validated already. */
static char *normalize_local(const char *s, size_t start, size_t end) {
  char *out = xmalloc(end - start + 1);
  size_t o = 0;
  size_t i = start;
  while (i < end) {
    size_t seg = i;
    bool numeric = true;
    while (i < end && ch_alnum(s[i])) {
      if (!ch_digit(s[i])) numeric = false;
      i++;
    }
    size_t from = seg;
    if (numeric)
      while (from + 1 < i && s[from] == '0') from++;
    for (size_t k = from; k < i; k++) out[o++] = ch_lower(s[k]);
    if (i < end) {
      out[o++] = '.';
      i++; /* the separator */
    }
  }
  out[o] = '\0';
  return out;
}

/* Parses s[0, n) (no surrounding whitespace) into *out.  On failure *out is zeroed
 * and *f says where and why. */
static int version_parse_core(const char *s, size_t n, pep440_version_t *out, vfail_t *f) {
  static const char *const pre_words[] = {"alpha", "a", "beta", "b", "preview", "pre", "rc", "c"};
  static const pep440_pre_kind_t pre_kinds[] = {PEP440_PRE_A,  PEP440_PRE_A,  PEP440_PRE_B,
                                                PEP440_PRE_B,  PEP440_PRE_RC, PEP440_PRE_RC,
                                                PEP440_PRE_RC, PEP440_PRE_RC};
  static const char *const post_words[] = {"post", "rev", "r"};
  static const char *const dev_words[] = {"dev"};
  pep440_version_t v = PEP440_VERSION_INIT;
  uint64_t parts[PEP440_MAX_RELEASE_PARTS];
  size_t nparts = 0;
  size_t i = 0;
  char what[16];

  memset(out, 0, sizeof *out);
  if (n > PEP440_MAX_VERSION_LEN)
    return vfail(f, CM_ERR_LIMIT, 0, "version is %zu bytes, the limit is %d", n,
                 PEP440_MAX_VERSION_LEN);
  if (n == 0) return vfail(f, CM_ERR_INVALID, 0, "empty version");
  if (s[i] == 'v' || s[i] == 'V') i++;
  if (i >= n || !ch_digit(s[i]))
    return vfail(f, CM_ERR_INVALID, i, "expected a release number (like 1.0)");
  if (parse_number(s, n, &i, &parts[0], f) < 0) return -1;
  nparts = 1;
  if (i < n && s[i] == '!') {
    v.epoch = parts[0];
    i++;
    if (i >= n || !ch_digit(s[i]))
      return vfail(f, CM_ERR_INVALID, i, "expected a release number after the epoch '!'");
    if (parse_number(s, n, &i, &parts[0], f) < 0) return -1;
  }
  while (i + 1 < n && s[i] == '.' && ch_digit(s[i + 1])) {
    if (nparts == PEP440_MAX_RELEASE_PARTS)
      return vfail(f, CM_ERR_LIMIT, i + 1, "more than %d release numbers",
                   PEP440_MAX_RELEASE_PARTS);
    i++;
    if (parse_number(s, n, &i, &parts[nparts], f) < 0) return -1;
    nparts++;
  }

  int w = parse_labelled(s, n, &i, pre_words, CM_ARRAY_SIZE(pre_words), &v.pre, f);
  if (w == -2) return -1;
  if (w >= 0) v.pre_kind = pre_kinds[w];

  if (i + 1 < n && s[i] == '-' && ch_digit(s[i + 1])) {
    i++; /* implicit post release: 1.0-1 */
    if (parse_number(s, n, &i, &v.post, f) < 0) return -1;
    v.has_post = true;
  } else {
    w = parse_labelled(s, n, &i, post_words, CM_ARRAY_SIZE(post_words), &v.post, f);
    if (w == -2) return -1;
    v.has_post = w >= 0;
  }

  w = parse_labelled(s, n, &i, dev_words, CM_ARRAY_SIZE(dev_words), &v.dev, f);
  if (w == -2) return -1;
  v.has_dev = w >= 0;

  size_t local_start = 0, local_end = 0;
  if (i < n && s[i] == '+') {
    i++;
    local_start = i;
    for (;;) {
      if (i >= n || !ch_alnum(s[i]))
        return vfail(f, CM_ERR_INVALID, i,
                     "a local version label is letters and digits separated by '.', '-' or "
                     "'_'");
      while (i < n && ch_alnum(s[i])) i++;
      if (i < n && ch_sep(s[i])) {
        i++;
        continue;
      }
      break;
    }
    local_end = i;
  }

  if (i < n) {
    describe_char(s[i], what);
    if (s[i] == '*')
      return vfail(f, CM_ERR_INVALID, i, "unexpected '*' (a wildcard needs == or != and .*)");
    return vfail(f, CM_ERR_INVALID, i, "unexpected %s", what);
  }

  v.release = xmemdup(parts, nparts * sizeof parts[0]);
  v.release_len = nparts;
  if (local_end > local_start) v.local = normalize_local(s, local_start, local_end);
  *out = v;
  return 0;
}

static void trim(const char *buf, size_t len, size_t *start, size_t *end) {
  size_t a = 0, b = len;
  while (a < b && ch_space(buf[a])) a++;
  while (b > a && ch_space(buf[b - 1])) b--;
  *start = a;
  *end = b;
}

int pep440_version_parse(const char *buf, size_t len, pep440_version_t *out, cm_error_t *err) {
  memset(out, 0, sizeof *out);
  if (len > PEP440_MAX_VERSION_LEN)
    return pep440_error_at(err, CM_ERR_LIMIT, "version", buf, len, 0,
                           "version is %zu bytes, the limit is %d", len, PEP440_MAX_VERSION_LEN);
  size_t start, end;
  trim(buf, len, &start, &end);
  vfail_t f;
  if (version_parse_core(buf + start, end - start, out, &f) < 0)
    return pep440_error_at(err, f.kind, "version", buf, len, start + f.offset, "%s", f.reason);
  return 0;
}

void pep440_version_release(pep440_version_t *v) {
  if (v == NULL) return;
  free(v->release);
  free(v->local);
  memset(v, 0, sizeof *v);
}

void pep440_version_copy(pep440_version_t *out, const pep440_version_t *v) {
  *out = *v;
  out->release = xmemdup(v->release, v->release_len * sizeof v->release[0]);
  out->local = v->local ? xstrdup(v->local) : NULL;
}

static void render_version(cm_buf_t *b, const pep440_version_t *v, bool with_local) {
  if (v->epoch != 0) cm_buf_printf(b, "%" PRIu64 "!", v->epoch);
  for (size_t i = 0; i < v->release_len; i++)
    cm_buf_printf(b, i ? ".%" PRIu64 : "%" PRIu64, v->release[i]);
  static const char *const pre_names[] = {"", "a", "b", "rc"};
  if (v->pre_kind != PEP440_PRE_NONE)
    cm_buf_printf(b, "%s%" PRIu64, pre_names[v->pre_kind], v->pre);
  if (v->has_post) cm_buf_printf(b, ".post%" PRIu64, v->post);
  if (v->has_dev) cm_buf_printf(b, ".dev%" PRIu64, v->dev);
  if (with_local && v->local) cm_buf_printf(b, "+%s", v->local);
}

char *pep440_version_render(const pep440_version_t *v) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  render_version(&b, v, true);
  return cm_buf_steal(&b);
}

int pep440_normalize(const char *buf, size_t len, char **out, cm_error_t *err) {
  pep440_version_t v;
  *out = NULL;
  if (pep440_version_parse(buf, len, &v, err) < 0) return -1;
  *out = pep440_version_render(&v);
  pep440_version_release(&v);
  return 0;
}

/* ---------------------------------------------------------------- ordering */

static int cmp_u64(uint64_t a, uint64_t b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/* Release segments compare as if the shorter were padded with zeros. */
static int cmp_release(const pep440_version_t *a, const pep440_version_t *b) {
  size_t n = CM_MAX(a->release_len, b->release_len);
  for (size_t i = 0; i < n; i++) {
    uint64_t x = i < a->release_len ? a->release[i] : 0;
    uint64_t y = i < b->release_len ? b->release[i] : 0;
    int c = cmp_u64(x, y);
    if (c) return c;
  }
  return 0;
}

/* A dev release of a final ("1.0.dev1", no pre, no post) sorts before every
 * pre-release of it; a version without a pre segment sorts after all of them. */
static int pre_rank(const pep440_version_t *v) {
  if (v->pre_kind == PEP440_PRE_NONE) return v->has_dev && !v->has_post ? 0 : 2;
  return 1;
}

/* Local labels compare segment by segment: numbers numerically and above any
 * string, strings lexicographically, a proper prefix first.  Normalised numbers have
 * no leading zeros, so length first and then bytes orders them numerically without
 * any risk of overflow. */
static int cmp_local(const char *a, const char *b) {
  if (a == NULL || b == NULL) return (a != NULL) - (b != NULL);
  for (;;) {
    if (*a == '\0' || *b == '\0') return (*a != '\0') - (*b != '\0');
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    bool na = strspn(a, "0123456789") == la, nb = strspn(b, "0123456789") == lb;
    int c;
    if (na && nb) {
      c = la != lb ? (la < lb ? -1 : 1) : memcmp(a, b, la);
    } else if (na != nb) {
      c = na ? 1 : -1;
    } else {
      c = memcmp(a, b, CM_MIN(la, lb));
      if (c == 0) c = la < lb ? -1 : la > lb ? 1 : 0;
    }
    if (c) return c < 0 ? -1 : 1;
    a += la;
    b += lb;
    if (*a == '.') a++;
    if (*b == '.') b++;
  }
}

static int version_cmp(const pep440_version_t *a, const pep440_version_t *b, bool use_local) {
  int c = cmp_u64(a->epoch, b->epoch);
  if (c) return c;
  if ((c = cmp_release(a, b))) return c;
  int ra = pre_rank(a), rb = pre_rank(b);
  if (ra != rb) return ra < rb ? -1 : 1;
  if (ra == 1) {
    if (a->pre_kind != b->pre_kind) return a->pre_kind < b->pre_kind ? -1 : 1;
    if ((c = cmp_u64(a->pre, b->pre))) return c;
  }
  if (a->has_post != b->has_post) return a->has_post ? 1 : -1;
  if (a->has_post && (c = cmp_u64(a->post, b->post))) return c;
  if (a->has_dev != b->has_dev) return a->has_dev ? -1 : 1;
  if (a->has_dev && (c = cmp_u64(a->dev, b->dev))) return c;
  return use_local ? cmp_local(a->local, b->local) : 0;
}

int pep440_version_compare(const pep440_version_t *a, const pep440_version_t *b) {
  return version_cmp(a, b, true);
}

bool pep440_version_is_prerelease(const pep440_version_t *v) {
  return v->pre_kind != PEP440_PRE_NONE || v->has_dev;
}

bool pep440_version_is_postrelease(const pep440_version_t *v) {
  return v->has_post;
}

/* Same epoch and release, ignoring trailing zeros ("base version"). */
static bool same_base(const pep440_version_t *a, const pep440_version_t *b) {
  return a->epoch == b->epoch && cmp_release(a, b) == 0;
}

/* ---------------------------------------------------------------- clauses */

static const char *const op_strings[] = {"~=", "==", "!=", "<=", ">=", "<", ">", "==="};

const char *pep440_op_string(pep440_op_t op) {
  if ((size_t)op >= CM_ARRAY_SIZE(op_strings)) return "?";
  return op_strings[op];
}

/* Where clause errors are reported: the whole input, its label, and the error. */
typedef struct ctx {
  const char *buf;
  size_t len;
  const char *what;
  cm_error_t *err;
} ctx_t;

/* Validates buf[start, start + n) as the version of "<op>" and fills *out. */
static int clause_build(const ctx_t *cx, pep440_op_t op, size_t start, size_t n,
                        pep440_clause_t *out) {
  const char *s = cx->buf + start;
  const char *opname = pep440_op_string(op);
  vfail_t f;

  memset(out, 0, sizeof *out);
  if (n == 0)
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                           "expected a version after \"%s\"", opname);
  if (n > PEP440_MAX_VERSION_LEN)
    return pep440_error_at(cx->err, CM_ERR_LIMIT, cx->what, cx->buf, cx->len, start,
                           "the version after \"%s\" is %zu bytes, the limit is %d", opname, n,
                           PEP440_MAX_VERSION_LEN);
  if (op == PEP440_OP_ARBITRARY) {
    /* Any text; remember whether it also reads as a version (for pre-release rules). */
    out->has_version = version_parse_core(s, n, &out->version, &f) == 0;
    out->op = op;
    out->text = xstrndup(s, n);
    return 0;
  }

  const char *star = memchr(s, '*', n);
  bool wildcard = false;
  size_t vlen = n;
  if (star != NULL) {
    size_t at = (size_t)(star - s);
    if (op != PEP440_OP_EQ && op != PEP440_OP_NE)
      return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start + at,
                             "a '.*' wildcard is only allowed with == and !=, not \"%s\"", opname);
    if (at != n - 1 || n < 2 || s[n - 2] != '.')
      return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start + at,
                             "'*' is only allowed as a trailing '.*' (like ==1.2.*)");
    wildcard = true;
    vlen = n - 2;
  }

  pep440_version_t v;
  if (version_parse_core(s, vlen, &v, &f) < 0)
    return pep440_error_at(cx->err, f.kind, cx->what, cx->buf, cx->len, start + f.offset,
                           "bad version after \"%s\": %s", opname, f.reason);
  if (wildcard && (v.pre_kind != PEP440_PRE_NONE || v.has_post || v.has_dev || v.local)) {
    pep440_version_release(&v);
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                           "'.*' can only follow a release number (like %s1.2.*)", opname);
  }
  if (v.local && op != PEP440_OP_EQ && op != PEP440_OP_NE) {
    pep440_version_release(&v);
    const char *plus = memchr(s, '+', n);
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len,
                           start + (plus ? (size_t)(plus - s) : 0),
                           "a local version label is only allowed with == and !=, not \"%s\"",
                           opname);
  }
  if (op == PEP440_OP_COMPATIBLE && v.release_len < 2) {
    pep440_version_release(&v);
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                           "~= needs at least two release numbers (like ~=2.2)");
  }
  out->op = op;
  out->wildcard = wildcard;
  out->has_version = true;
  out->version = v;
  out->text = xstrndup(s, n);
  return 0;
}

int pep440_clause_init(pep440_clause_t *out, pep440_op_t op, const char *buf, size_t len,
                       cm_error_t *err) {
  memset(out, 0, sizeof *out);
  if ((size_t)op >= CM_ARRAY_SIZE(op_strings))
    return err ? cm_error_set(err, 0, CM_ERR_INTERNAL, "unknown version operator %d", (int)op) : -1;
  ctx_t cx = {buf, len, "version", err};
  return clause_build(&cx, op, 0, len, out);
}

void pep440_clause_release(pep440_clause_t *c) {
  if (c == NULL) return;
  pep440_version_release(&c->version);
  free(c->text);
  memset(c, 0, sizeof *c);
}

/* The version's first `count` release numbers (zero-padded) equal prefix's. */
static bool release_prefix_match(const pep440_version_t *v, const pep440_version_t *prefix,
                                 size_t count) {
  if (v->epoch != prefix->epoch) return false;
  for (size_t i = 0; i < count; i++) {
    uint64_t x = i < v->release_len ? v->release[i] : 0;
    if (x != prefix->release[i]) return false;
  }
  return true;
}

static bool clause_equal(const pep440_clause_t *c, const pep440_version_t *v) {
  if (c->wildcard) return release_prefix_match(v, &c->version, c->version.release_len);
  /* A clause without a local label ignores the candidate's. */
  return version_cmp(v, &c->version, c->version.local != NULL) == 0;
}

static bool clause_arbitrary(const pep440_clause_t *c, const pep440_version_t *v) {
  cleanup_free char *s = pep440_version_render(v);
  return strcasecmp(s, c->text) == 0;
}

/* The operator alone, without the pre-release filter. */
static bool clause_matches(const pep440_clause_t *c, const pep440_version_t *v) {
  const pep440_version_t *spec = &c->version;
  switch (c->op) {
    case PEP440_OP_EQ:
      return clause_equal(c, v);
    case PEP440_OP_NE:
      return !clause_equal(c, v);
    case PEP440_OP_LE:
      return version_cmp(v, spec, false) <= 0;
    case PEP440_OP_GE:
      return version_cmp(v, spec, false) >= 0;
    case PEP440_OP_LT:
      if (version_cmp(v, spec, true) >= 0) return false;
      /* <3.0 must not admit 3.0rc1 just because it sorts lower. */
      if (!pep440_version_is_prerelease(spec) && pep440_version_is_prerelease(v) &&
          same_base(v, spec))
        return false;
      return true;
    case PEP440_OP_GT:
      if (version_cmp(v, spec, true) <= 0) return false;
      /* >1.7 must not admit 1.7.post1 nor 1.7+local. */
      if (!pep440_version_is_postrelease(spec) && pep440_version_is_postrelease(v) &&
          same_base(v, spec))
        return false;
      if (v->local != NULL && same_base(v, spec)) return false;
      return true;
    case PEP440_OP_COMPATIBLE:
      /* ~=X.Y.Z means >=X.Y.Z, ==X.Y.* */
      return version_cmp(v, spec, false) >= 0 &&
             release_prefix_match(v, spec, spec->release_len - 1);
    case PEP440_OP_ARBITRARY:
      return clause_arbitrary(c, v);
  }
  return false;
}

/* Does an inclusive clause name a pre-release (so pre-releases are wanted)? */
static bool clause_names_prerelease(const pep440_clause_t *c) {
  switch (c->op) {
    case PEP440_OP_EQ:
    case PEP440_OP_LE:
    case PEP440_OP_GE:
    case PEP440_OP_COMPATIBLE:
    case PEP440_OP_ARBITRARY:
      return c->has_version && pep440_version_is_prerelease(&c->version);
    default:
      return false;
  }
}

bool pep440_clause_contains(const pep440_clause_t *c, const pep440_version_t *v,
                            bool allow_prereleases) {
  if (!allow_prereleases && !clause_names_prerelease(c) && pep440_version_is_prerelease(v))
    return false;
  return clause_matches(c, v);
}

/* ---------------------------------------------------------------- specifier sets */

void pep440_specifier_set_free(pep440_specifier_set_t *set) {
  if (set == NULL) return;
  for (size_t i = 0; i < set->len; i++) pep440_clause_release(&set->clauses[i]);
  free(set->clauses);
  free(set);
}

/* Reads an operator at *pos: the longest run of "<>=!~" must be exactly one. */
static int parse_op(const ctx_t *cx, size_t *pos, bool after_comma, pep440_op_t *op) {
  size_t start = *pos, end = start;
  while (end < cx->len && end - start < 4 && ch_op(cx->buf[end])) end++;
  size_t n = end - start;
  for (size_t k = 0; k < CM_ARRAY_SIZE(op_strings); k++) {
    if (strlen(op_strings[k]) == n && memcmp(op_strings[k], cx->buf + start, n) == 0) {
      *op = (pep440_op_t)k;
      *pos = end;
      return 0;
    }
  }
  if (n > 0)
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                           "unknown version operator \"%.*s\" (use ==, !=, <, <=, >, >=, ~= or "
                           "===)",
                           (int)n, cx->buf + start);
  if (start >= cx->len)
    return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                           "expected a version operator%s (==, !=, <, <=, >, >=, ~= or ===)",
                           after_comma ? " after ','" : "");
  char what[16];
  describe_char(cx->buf[start], what);
  return pep440_error_at(cx->err, CM_ERR_INVALID, cx->what, cx->buf, cx->len, start,
                         "expected a version operator%s (==, !=, <, <=, >, >=, ~= or ===), "
                         "found %s",
                         after_comma ? " after ','" : "", what);
}

static size_t skip_blanks(const char *buf, size_t len, size_t pos) {
  while (pos < len && ch_blank(buf[pos])) pos++;
  return pos;
}

int pep440_specifier_set_parse_at(const char *buf, size_t len, size_t *pos, const char *what,
                                  pep440_specifier_set_t **out, cm_error_t *err) {
  ctx_t cx = {buf, len, what, err};
  pep440_clause_t clauses[PEP440_MAX_CLAUSES];
  size_t count = 0;
  size_t p = *pos;
  bool after_comma = false;

  *out = NULL;
  for (;;) {
    p = skip_blanks(buf, len, p);
    pep440_op_t op = PEP440_OP_EQ;
    if (parse_op(&cx, &p, after_comma, &op) < 0) goto fail;
    p = skip_blanks(buf, len, p);
    size_t start = p;
    while (p < len && ch_version_token(buf[p])) p++;
    if (clause_build(&cx, op, start, p - start, &clauses[count]) < 0) goto fail;
    count++;
    size_t q = skip_blanks(buf, len, p);
    if (q >= len || buf[q] != ',') break;
    if (count == PEP440_MAX_CLAUSES) {
      pep440_error_at(err, CM_ERR_LIMIT, what, buf, len, q, "more than %d version clauses",
                      PEP440_MAX_CLAUSES);
      goto fail;
    }
    p = q + 1;
    after_comma = true;
  }
  pep440_specifier_set_t *set = xcalloc(1, sizeof *set);
  set->clauses = xmemdup(clauses, count * sizeof clauses[0]);
  set->len = count;
  *out = set;
  *pos = p;
  return 0;

fail:
  for (size_t i = 0; i < count; i++) pep440_clause_release(&clauses[i]);
  return -1;
}

int pep440_specifier_set_parse(const char *buf, size_t len, pep440_specifier_set_t **out,
                               cm_error_t *err) {
  *out = NULL;
  if (len > PEP440_MAX_SPECIFIER_LEN)
    return pep440_error_at(err, CM_ERR_LIMIT, "version specifier", buf, len, 0,
                           "specifier is %zu bytes, the limit is %d", len,
                           PEP440_MAX_SPECIFIER_LEN);
  size_t start, end;
  trim(buf, len, &start, &end);
  if (start == end) {
    *out = xcalloc(1, sizeof **out);
    return 0;
  }
  size_t pos = start;
  pep440_specifier_set_t *set;
  if (pep440_specifier_set_parse_at(buf, len, &pos, "version specifier", &set, err) < 0) return -1;
  while (pos < len && ch_space(buf[pos])) pos++;
  if (pos < len) {
    char what[16];
    describe_char(buf[pos], what);
    pep440_specifier_set_free(set);
    return pep440_error_at(err, CM_ERR_INVALID, "version specifier", buf, len, pos,
                           "unexpected %s after a version (separate clauses with ',')", what);
  }
  *out = set;
  return 0;
}

char *pep440_specifier_set_render(const pep440_specifier_set_t *set) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = 0; i < set->len; i++) {
    const pep440_clause_t *c = &set->clauses[i];
    if (i) cm_buf_appends(&b, ",");
    cm_buf_appends(&b, pep440_op_string(c->op));
    if (c->op == PEP440_OP_ARBITRARY) {
      /* "=== !x" must not render as the unknown operator "===!". */
      if (ch_op(c->text[0])) cm_buf_appends(&b, " ");
      cm_buf_appends(&b, c->text);
      continue;
    }
    render_version(&b, &c->version, true);
    if (c->wildcard) cm_buf_appends(&b, ".*");
  }
  return cm_buf_steal(&b);
}

static bool set_names_prerelease(const pep440_specifier_set_t *set) {
  for (size_t i = 0; i < set->len; i++)
    if (clause_names_prerelease(&set->clauses[i])) return true;
  return false;
}

bool pep440_specifier_contains(const pep440_specifier_set_t *set, const pep440_version_t *v,
                               bool allow_prereleases) {
  if (!allow_prereleases && !set_names_prerelease(set) && pep440_version_is_prerelease(v))
    return false;
  for (size_t i = 0; i < set->len; i++)
    if (!clause_matches(&set->clauses[i], v)) return false;
  return true;
}

/* ---------------------------------------------------------------- requires-python */

static bool try_micro(const pep440_specifier_set_t *set, uint64_t major, uint64_t minor,
                      uint64_t micro) {
  uint64_t release[3] = {major, minor, micro};
  pep440_version_t v = PEP440_VERSION_INIT;
  v.release = release;
  v.release_len = 3;
  return pep440_specifier_contains(set, &v, true);
}

int pep440_specifier_allows_python(const pep440_specifier_set_t *set, const char *python_version,
                                   size_t len, bool *out, cm_error_t *err) {
  pep440_version_t v;
  *out = false;
  if (pep440_version_parse(python_version, len, &v, err) < 0)
    return cm_error_wrap(err, "checking a Python version against \"requires-python\"");
  bool minor_only = v.release_len == 2 && v.epoch == 0 && v.pre_kind == PEP440_PRE_NONE &&
                    !v.has_post && !v.has_dev && v.local == NULL;
  bool ok = pep440_specifier_contains(set, &v, true);
  if (!ok && minor_only) {
    /* Over the versions X.Y.m each clause changes truth value only at the micro it
     * names (or just after it), so testing 0 and the neighbours of every named micro
     * visits every region. */
    uint64_t major = v.release[0], minor = v.release[1];
    ok = try_micro(set, major, minor, 0);
    for (size_t i = 0; !ok && i < set->len; i++) {
      const pep440_clause_t *c = &set->clauses[i];
      const pep440_version_t *cv = &c->version;
      if (!c->has_version || cv->epoch != 0 || cv->release_len < 3 || cv->release[0] != major ||
          cv->release[1] != minor)
        continue;
      uint64_t m = cv->release[2];
      if (m > 0) ok = try_micro(set, major, minor, m - 1);
      for (uint64_t d = 0; !ok && d <= 2 && m <= UINT64_MAX - d; d++)
        ok = try_micro(set, major, minor, m + d);
    }
  }
  pep440_version_release(&v);
  *out = ok;
  return 0;
}
