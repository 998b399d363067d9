/* PEP 508 dependency specifiers and environment markers: a recursive-descent parser
 * over (buf, len) with bounded nesting, a renderer to canonical text, a marker
 * evaluator, and the dependency merge rule used when a caller adds packages to a
 * script's inline metadata. */
#include "pystd/pystd.h"

#include <stdio.h>

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
/* A byte of a marker variable name (including the legacy dotted spellings). */
static bool ch_ident(char c) {
  return ch_alnum(c) || c == '_' || c == '.';
}
/* A byte that may start a version operator. */
static bool ch_op(char c) {
  return c != '\0' && strchr("<>=!~", c) != NULL;
}

static void describe_char(char c, char out[16]) {
  unsigned char u = (unsigned char)c;
  if (u >= 0x21 && u < 0x7f)
    snprintf(out, 16, "'%c'", c);
  else if (c == ' ')
    snprintf(out, 16, "a space");
  else if (c == '\t')
    snprintf(out, 16, "a tab");
  else
    snprintf(out, 16, "byte 0x%02x", u);
}

static size_t skip_blanks(const char *buf, size_t len, size_t pos) {
  while (pos < len && ch_blank(buf[pos])) pos++;
  return pos;
}

/* ---------------------------------------------------------------- names */

/* Length of the name at buf[pos] ([A-Za-z0-9._-]+), 0 if none starts there. */
static size_t scan_name(const char *buf, size_t len, size_t pos) {
  size_t q = pos;
  if (q >= len || !ch_alnum(buf[q])) return 0;
  while (q < len && (ch_alnum(buf[q]) || ch_sep(buf[q]))) q++;
  return q - pos;
}

bool pep508_name_is_valid(const char *buf, size_t len) {
  return len > 0 && scan_name(buf, len, 0) == len && ch_alnum(buf[len - 1]);
}

char *pep508_normalize_name(const char *buf, size_t len) {
  char *out = xmalloc(len + 1);
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (ch_sep(buf[i])) {
      if (o == 0 || out[o - 1] != '-') out[o++] = '-';
      while (i + 1 < len && ch_sep(buf[i + 1])) i++;
      continue;
    }
    out[o++] = ch_lower(buf[i]);
  }
  out[o] = '\0';
  return out;
}

/* ---------------------------------------------------------------- parser state */

typedef struct parser {
  const char *buf;
  size_t len;
  size_t pos;
  const char *what; /* "requirement" or "marker", for messages */
  cm_error_t *err;
} parser_t;

__attribute__((format(printf, 4, 5))) static int fail_kind(parser_t *p, cm_error_kind_t kind,
                                                           size_t offset, const char *fmt, ...) {
  if (p->err == NULL) return -1;
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *reason = xvasprintf(fmt, ap);
  va_end(ap);
  return pep440_error_at(p->err, kind, p->what, p->buf, p->len, offset, "%s", reason);
}

#define fail_at(p, offset, ...) fail_kind((p), CM_ERR_INVALID, (offset), __VA_ARGS__)

/* "found 'x'" or "reached the end" for the byte at pos. */
static void describe_at(const parser_t *p, size_t pos, char out[32]) {
  char c[16];
  if (pos >= p->len) {
    snprintf(out, 32, "reached the end");
    return;
  }
  describe_char(p->buf[pos], c);
  snprintf(out, 32, "found %s", c);
}

/* ---------------------------------------------------------------- markers */

static const char *const var_names[] = {
    [PEP508_VAR_IMPLEMENTATION_NAME] = "implementation_name",
    [PEP508_VAR_IMPLEMENTATION_VERSION] = "implementation_version",
    [PEP508_VAR_OS_NAME] = "os_name",
    [PEP508_VAR_PLATFORM_MACHINE] = "platform_machine",
    [PEP508_VAR_PLATFORM_PYTHON_IMPLEMENTATION] = "platform_python_implementation",
    [PEP508_VAR_PLATFORM_RELEASE] = "platform_release",
    [PEP508_VAR_PLATFORM_SYSTEM] = "platform_system",
    [PEP508_VAR_PLATFORM_VERSION] = "platform_version",
    [PEP508_VAR_PYTHON_FULL_VERSION] = "python_full_version",
    [PEP508_VAR_PYTHON_VERSION] = "python_version",
    [PEP508_VAR_SYS_PLATFORM] = "sys_platform",
    [PEP508_VAR_EXTRA] = "extra",
};

/* Spellings from before PEP 508 that pip and packaging still accept. */
static const struct {
  const char *name;
  pep508_var_t var;
} legacy_vars[] = {
    {"os.name", PEP508_VAR_OS_NAME},
    {"sys.platform", PEP508_VAR_SYS_PLATFORM},
    {"platform.machine", PEP508_VAR_PLATFORM_MACHINE},
    {"platform.version", PEP508_VAR_PLATFORM_VERSION},
    {"platform.python_implementation", PEP508_VAR_PLATFORM_PYTHON_IMPLEMENTATION},
    {"python_implementation", PEP508_VAR_PLATFORM_PYTHON_IMPLEMENTATION},
};

const char *pep508_var_name(pep508_var_t var) {
  if ((size_t)var >= CM_ARRAY_SIZE(var_names)) return "?";
  return var_names[var];
}

static const char *const marker_ops[] = {
    [PEP508_OP_LT] = "<",          [PEP508_OP_LE] = "<=",         [PEP508_OP_NE] = "!=",
    [PEP508_OP_EQ] = "==",         [PEP508_OP_GE] = ">=",         [PEP508_OP_GT] = ">",
    [PEP508_OP_COMPATIBLE] = "~=", [PEP508_OP_ARBITRARY] = "===", [PEP508_OP_IN] = "in",
    [PEP508_OP_NOT_IN] = "not in",
};

const char *pep508_marker_op_string(pep508_marker_op_t op) {
  if ((size_t)op >= CM_ARRAY_SIZE(marker_ops)) return "?";
  return marker_ops[op];
}

static pep440_op_t version_op(pep508_marker_op_t op) {
  switch (op) {
    case PEP508_OP_LT:
      return PEP440_OP_LT;
    case PEP508_OP_LE:
      return PEP440_OP_LE;
    case PEP508_OP_NE:
      return PEP440_OP_NE;
    case PEP508_OP_EQ:
      return PEP440_OP_EQ;
    case PEP508_OP_GE:
      return PEP440_OP_GE;
    case PEP508_OP_GT:
      return PEP440_OP_GT;
    case PEP508_OP_COMPATIBLE:
      return PEP440_OP_COMPATIBLE;
    default:
      return PEP440_OP_ARBITRARY;
  }
}

void pep508_marker_free(pep508_marker_t *marker) {
  if (marker == NULL) return;
  for (size_t i = 0; i < marker->nchildren; i++) pep508_marker_free(marker->children[i]);
  free(marker->children);
  free(marker->lhs.str);
  free(marker->rhs.str);
  free(marker);
}

static void marker_add_child(pep508_marker_t *node, pep508_marker_t *child) {
  /* The capacity is the smallest power of two >= max(2, count), so it doubles when the
   * count reaches a power of two.  The count is bounded by the input length limit. */
  size_t n = node->nchildren;
  if (n == 0)
    node->children = xmalloc(2 * sizeof *node->children);
  else if (n >= 2 && (n & (n - 1)) == 0)
    node->children = xrealloc(node->children, 2 * n * sizeof *node->children);
  node->children[node->nchildren++] = child;
}

/* Is `word` at pos, as a whole word? */
static bool at_word(const parser_t *p, size_t pos, const char *word) {
  size_t wl = strlen(word);
  if (p->len - pos < wl || memcmp(p->buf + pos, word, wl) != 0) return false;
  return pos + wl == p->len || !ch_ident(p->buf[pos + wl]);
}

/* A variable or a quoted string at p->pos (after blanks). */
static int parse_value(parser_t *p, pep508_marker_value_t *out, size_t *start) {
  size_t q = skip_blanks(p->buf, p->len, p->pos);
  char found[32];
  *start = q;
  memset(out, 0, sizeof *out);
  if (q < p->len && (p->buf[q] == '"' || p->buf[q] == '\'')) {
    char quote = p->buf[q];
    size_t s = q + 1, e = s;
    while (e < p->len && p->buf[e] != quote) {
      unsigned char c = (unsigned char)p->buf[e];
      /* The specification's string characters: printable ASCII and blanks except the
       * backslash (and the opening quote). */
      if ((c < 0x20 && c != '\t') || c >= 0x7f || c == '\\') {
        char what[16];
        describe_char(p->buf[e], what);
        return fail_at(p, e, "invalid character %s in a marker string", what);
      }
      e++;
    }
    if (e >= p->len) return fail_at(p, q, "unterminated string (no closing %c)", quote);
    out->str = xstrndup(p->buf + s, e - s);
    p->pos = e + 1;
    return 0;
  }
  size_t e = q;
  while (e < p->len && ch_ident(p->buf[e])) e++;
  if (e == q) {
    describe_at(p, q, found);
    return fail_at(p, q, "expected a marker variable (like python_version) or a quoted string, %s",
                   found);
  }
  size_t n = e - q;
  for (size_t i = 0; i < CM_ARRAY_SIZE(var_names); i++) {
    if (strlen(var_names[i]) == n && memcmp(var_names[i], p->buf + q, n) == 0) {
      out->is_var = true;
      out->var = (pep508_var_t)i;
      p->pos = e;
      return 0;
    }
  }
  for (size_t i = 0; i < CM_ARRAY_SIZE(legacy_vars); i++) {
    if (strlen(legacy_vars[i].name) == n && memcmp(legacy_vars[i].name, p->buf + q, n) == 0) {
      out->is_var = true;
      out->var = legacy_vars[i].var;
      p->pos = e;
      return 0;
    }
  }
  return fail_at(p, q, "unknown marker variable \"%.*s\"", (int)CM_MIN(n, 64), p->buf + q);
}

static int parse_marker_op(parser_t *p, pep508_marker_op_t *op) {
  size_t q = skip_blanks(p->buf, p->len, p->pos);
  char found[32];
  if (q < p->len && ch_op(p->buf[q])) {
    size_t e = q;
    while (e < p->len && e - q < 4 && ch_op(p->buf[e])) e++;
    size_t n = e - q;
    for (size_t i = 0; i <= PEP508_OP_ARBITRARY; i++) {
      if (strlen(marker_ops[i]) == n && memcmp(marker_ops[i], p->buf + q, n) == 0) {
        *op = (pep508_marker_op_t)i;
        p->pos = e;
        return 0;
      }
    }
    return fail_at(p, q, "unknown comparison operator \"%.*s\"", (int)n, p->buf + q);
  }
  if (at_word(p, q, "in")) {
    *op = PEP508_OP_IN;
    p->pos = q + 2;
    return 0;
  }
  if (at_word(p, q, "not")) {
    size_t r = skip_blanks(p->buf, p->len, q + 3);
    if (r == q + 3 || !at_word(p, r, "in")) return fail_at(p, r, "expected \"in\" after \"not\"");
    *op = PEP508_OP_NOT_IN;
    p->pos = r + 2;
    return 0;
  }
  describe_at(p, q, found);
  return fail_at(p, q,
                 "expected a comparison operator (==, !=, <, <=, >, >=, ~=, ===, in, not in), %s",
                 found);
}

static int parse_or(parser_t *p, int depth, pep508_marker_t **out);

/* A comparison, or a parenthesised marker. */
static int parse_expr(parser_t *p, int depth, pep508_marker_t **out) {
  size_t q = skip_blanks(p->buf, p->len, p->pos);
  char found[32];
  *out = NULL;
  if (q < p->len && p->buf[q] == '(') {
    if (depth >= PEP508_MAX_MARKER_DEPTH)
      return fail_kind(p, CM_ERR_LIMIT, q, "parentheses nest deeper than %d levels",
                       PEP508_MAX_MARKER_DEPTH);
    p->pos = q + 1;
    pep508_marker_t *inner;
    if (parse_or(p, depth + 1, &inner) < 0) return -1;
    size_t r = skip_blanks(p->buf, p->len, p->pos);
    if (r >= p->len || p->buf[r] != ')') {
      pep508_marker_free(inner);
      describe_at(p, r, found);
      return fail_at(p, r, "expected ')' to close a parenthesis in the marker, %s", found);
    }
    p->pos = r + 1;
    *out = inner;
    return 0;
  }

  pep508_marker_t *m = xcalloc(1, sizeof *m);
  size_t lhs_at, rhs_at;
  m->kind = PEP508_MARKER_COMPARE;
  if (parse_value(p, &m->lhs, &lhs_at) < 0 || parse_marker_op(p, &m->op) < 0 ||
      parse_value(p, &m->rhs, &rhs_at) < 0) {
    pep508_marker_free(m);
    return -1;
  }
  /* Extras are names: compare them normalised (as pip does). */
  pep508_marker_value_t *lit = NULL;
  if (m->lhs.is_var && m->lhs.var == PEP508_VAR_EXTRA && !m->rhs.is_var) lit = &m->rhs;
  if (m->rhs.is_var && m->rhs.var == PEP508_VAR_EXTRA && !m->lhs.is_var) lit = &m->lhs;
  if (lit != NULL) {
    char *norm = pep508_normalize_name(lit->str, strlen(lit->str));
    free(lit->str);
    lit->str = norm;
  }
  if (m->op == PEP508_OP_COMPATIBLE && !m->rhs.is_var) {
    pep440_clause_t c;
    if (pep440_clause_init(&c, PEP440_OP_COMPATIBLE, m->rhs.str, strlen(m->rhs.str), NULL) < 0) {
      pep508_marker_free(m);
      return fail_at(p, rhs_at, "~= needs a version with at least two numbers (like \"3.8\")");
    }
    pep440_clause_release(&c);
  }
  *out = m;
  return 0;
}

/* A chain "x and y and ..." (kind AND, operands are expressions) or "x or y or ..."
 * (kind OR, operands are AND chains).  A chain of one is its operand. */
static int parse_chain(parser_t *p, int depth, pep508_marker_kind_t kind, pep508_marker_t **out) {
  const char *word = kind == PEP508_MARKER_OR ? "or" : "and";
  pep508_marker_t *node = NULL, *child;
  *out = NULL;
  for (;;) {
    int rc = kind == PEP508_MARKER_OR ? parse_chain(p, depth, PEP508_MARKER_AND, &child)
                                      : parse_expr(p, depth, &child);
    if (rc < 0) {
      pep508_marker_free(node);
      return -1;
    }
    size_t q = skip_blanks(p->buf, p->len, p->pos);
    bool more = at_word(p, q, word);
    if (node == NULL && !more) {
      *out = child;
      return 0;
    }
    if (node == NULL) {
      node = xcalloc(1, sizeof *node);
      node->kind = kind;
    }
    marker_add_child(node, child);
    if (!more) break;
    p->pos = q + strlen(word);
  }
  *out = node;
  return 0;
}

static int parse_or(parser_t *p, int depth, pep508_marker_t **out) {
  return parse_chain(p, depth, PEP508_MARKER_OR, out);
}

int pep508_marker_parse(const char *buf, size_t len, pep508_marker_t **out, cm_error_t *err) {
  *out = NULL;
  if (len > PEP508_MAX_REQUIREMENT_LEN)
    return pep440_error_at(err, CM_ERR_LIMIT, "marker", buf, len, 0,
                           "marker is %zu bytes, the limit is %d", len, PEP508_MAX_REQUIREMENT_LEN);
  parser_t p = {buf, len, 0, "marker", err};
  pep508_marker_t *m;
  if (parse_or(&p, 0, &m) < 0) return -1;
  size_t q = skip_blanks(buf, len, p.pos);
  if (q < len) {
    char found[32];
    describe_at(&p, q, found);
    pep508_marker_free(m);
    return fail_at(&p, q, "expected \"and\", \"or\" or the end, %s", found);
  }
  *out = m;
  return 0;
}

static void render_value(cm_buf_t *b, const pep508_marker_value_t *v) {
  if (v->is_var) {
    cm_buf_appends(b, pep508_var_name(v->var));
    return;
  }
  /* A literal never holds both quote characters: the grammar cannot express that. */
  char quote = strchr(v->str, '"') ? '\'' : '"';
  cm_buf_printf(b, "%c%s%c", quote, v->str, quote);
}

static void render_marker(cm_buf_t *b, const pep508_marker_t *m) {
  if (m->kind == PEP508_MARKER_COMPARE) {
    render_value(b, &m->lhs);
    cm_buf_printf(b, " %s ", pep508_marker_op_string(m->op));
    render_value(b, &m->rhs);
    return;
  }
  for (size_t i = 0; i < m->nchildren; i++) {
    const pep508_marker_t *c = m->children[i];
    if (i) cm_buf_appends(b, m->kind == PEP508_MARKER_AND ? " and " : " or ");
    /* Parentheses where precedence needs them, and where the input grouped a chain of
     * the same kind, so that rendering parses back to the same tree. */
    bool paren = c->kind != PEP508_MARKER_COMPARE &&
                 (m->kind == PEP508_MARKER_AND || c->kind == PEP508_MARKER_OR);
    if (paren) cm_buf_appends(b, "(");
    render_marker(b, c);
    if (paren) cm_buf_appends(b, ")");
  }
}

char *pep508_marker_render(const pep508_marker_t *marker) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  if (marker) render_marker(&b, marker);
  return cm_buf_steal(&b);
}

static const char *env_value(const pep508_env_t *env, pep508_var_t var) {
  const char *v = NULL;
  if (env == NULL) return "";
  switch (var) {
    case PEP508_VAR_IMPLEMENTATION_NAME:
      v = env->implementation_name;
      break;
    case PEP508_VAR_IMPLEMENTATION_VERSION:
      v = env->implementation_version;
      break;
    case PEP508_VAR_OS_NAME:
      v = env->os_name;
      break;
    case PEP508_VAR_PLATFORM_MACHINE:
      v = env->platform_machine;
      break;
    case PEP508_VAR_PLATFORM_PYTHON_IMPLEMENTATION:
      v = env->platform_python_implementation;
      break;
    case PEP508_VAR_PLATFORM_RELEASE:
      v = env->platform_release;
      break;
    case PEP508_VAR_PLATFORM_SYSTEM:
      v = env->platform_system;
      break;
    case PEP508_VAR_PLATFORM_VERSION:
      v = env->platform_version;
      break;
    case PEP508_VAR_PYTHON_FULL_VERSION:
      v = env->python_full_version;
      break;
    case PEP508_VAR_PYTHON_VERSION:
      v = env->python_version;
      break;
    case PEP508_VAR_SYS_PLATFORM:
      v = env->sys_platform;
      break;
    case PEP508_VAR_EXTRA:
      v = env->extra;
      break;
  }
  return v ? v : "";
}

/* The text of one side; *owned receives an allocation if one was needed. */
static const char *value_text(const pep508_marker_value_t *v, const pep508_env_t *env,
                              char **owned) {
  if (!v->is_var) return v->str;
  const char *s = env_value(env, v->var);
  if (v->var == PEP508_VAR_EXTRA) return *owned = pep508_normalize_name(s, strlen(s));
  return s;
}

static bool eval_compare(const pep508_marker_t *m, const pep508_env_t *env) {
  cleanup_free char *lown = NULL;
  cleanup_free char *rown = NULL;
  const char *l = value_text(&m->lhs, env, &lown);
  const char *r = value_text(&m->rhs, env, &rown);

  if (m->op == PEP508_OP_IN) return strstr(r, l) != NULL;
  if (m->op == PEP508_OP_NOT_IN) return strstr(r, l) == NULL;

  /* PEP 440 semantics when "<op><rhs>" is a valid specifier and lhs a version (both
   * may carry surrounding whitespace, as with the reference implementation). */
  size_t rs = 0, re = strlen(r);
  while (rs < re && ch_space(r[rs])) rs++;
  while (re > rs && ch_space(r[re - 1])) re--;
  pep440_clause_t clause;
  if (pep440_clause_init(&clause, version_op(m->op), r + rs, re - rs, NULL) == 0) {
    pep440_version_t v;
    bool have = pep440_version_parse(l, strlen(l), &v, NULL) == 0;
    bool result = have && pep440_clause_contains(&clause, &v, true);
    pep440_clause_release(&clause);
    if (have) {
      pep440_version_release(&v);
      return result;
    }
  }
  int c = strcmp(l, r);
  switch (m->op) {
    case PEP508_OP_LT:
      return c < 0;
    case PEP508_OP_LE:
      return c <= 0;
    case PEP508_OP_NE:
      return c != 0;
    case PEP508_OP_EQ:
      return c == 0;
    case PEP508_OP_GE:
      return c >= 0;
    case PEP508_OP_GT:
      return c > 0;
    case PEP508_OP_ARBITRARY:
      return strcasecmp(l, r) == 0;
    default:
      return false; /* ~= between non-versions is undefined */
  }
}

bool pep508_marker_evaluate(const pep508_marker_t *marker, const pep508_env_t *env) {
  if (marker == NULL) return true;
  switch (marker->kind) {
    case PEP508_MARKER_COMPARE:
      return eval_compare(marker, env);
    case PEP508_MARKER_AND:
      for (size_t i = 0; i < marker->nchildren; i++)
        if (!pep508_marker_evaluate(marker->children[i], env)) return false;
      return true;
    case PEP508_MARKER_OR:
      for (size_t i = 0; i < marker->nchildren; i++)
        if (pep508_marker_evaluate(marker->children[i], env)) return true;
      return false;
  }
  return false;
}

/* ---------------------------------------------------------------- requirements */

void pep508_requirement_free(pep508_requirement_t *req) {
  if (req == NULL) return;
  free(req->name);
  free(req->normalized_name);
  cm_strv_free(req->extras);
  pep440_specifier_set_free(req->specifiers);
  free(req->url);
  pep508_marker_free(req->marker);
  free(req);
}

static int cmp_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "[" wsp* (name (wsp* "," wsp* name)*)? wsp* "]" at *pos; fills req->extras. */
static int parse_extras(parser_t *p, size_t *pos, pep508_requirement_t *req) {
  char *names[PEP508_MAX_EXTRAS];
  size_t n = 0;
  size_t q = skip_blanks(p->buf, p->len, *pos + 1);
  char found[32];
  int rc = -1;

  if (q < p->len && p->buf[q] == ']') {
    q++;
  } else {
    for (;;) {
      size_t nl = scan_name(p->buf, p->len, q);
      if (nl == 0) {
        describe_at(p, q, found);
        fail_at(p, q, "expected an extra name, %s", found);
        goto out;
      }
      if (!ch_alnum(p->buf[q + nl - 1])) {
        fail_at(p, q + nl - 1, "an extra name must end with a letter or digit");
        goto out;
      }
      if (n == PEP508_MAX_EXTRAS) {
        fail_kind(p, CM_ERR_LIMIT, q, "more than %d extras", PEP508_MAX_EXTRAS);
        goto out;
      }
      names[n++] = pep508_normalize_name(p->buf + q, nl);
      q = skip_blanks(p->buf, p->len, q + nl);
      if (q < p->len && p->buf[q] == ',') {
        q = skip_blanks(p->buf, p->len, q + 1);
        continue;
      }
      if (q < p->len && p->buf[q] == ']') {
        q++;
        break;
      }
      describe_at(p, q, found);
      fail_at(p, q, "expected ',' or ']' after an extra name, %s", found);
      goto out;
    }
  }

  qsort(names, n, sizeof names[0], cmp_strings);
  req->extras = xcalloc(n + 1, sizeof *req->extras);
  for (size_t i = 0; i < n; i++) {
    if (req->extras_len > 0 && strcmp(req->extras[req->extras_len - 1], names[i]) == 0) {
      free(names[i]);
      continue;
    }
    req->extras[req->extras_len++] = names[i];
  }
  n = 0;
  *pos = q;
  rc = 0;
out:
  for (size_t i = 0; i < n; i++) free(names[i]);
  return rc;
}

/* scheme "://" rest, printable ASCII without the characters RFC 3986 excludes. */
static int check_url(parser_t *p, size_t s, size_t e) {
  size_t i = s;
  if (!ch_alpha(p->buf[i])) return fail_at(p, s, "expected a URL like https://host/path after '@'");
  while (i < e && (ch_alnum(p->buf[i]) || p->buf[i] == '+' || p->buf[i] == '-' || p->buf[i] == '.'))
    i++;
  if (e - i < 3 || memcmp(p->buf + i, "://", 3) != 0)
    return fail_at(p, s, "expected a URL like https://host/path after '@' (scheme://...)");
  if (i + 3 == e) return fail_at(p, e, "the URL has nothing after \"://\"");
  bool semicolon = false;
  for (size_t k = s; k < e; k++) {
    unsigned char c = (unsigned char)p->buf[k];
    if (c < 0x21 || c > 0x7e || strchr("\"<>\\^`{|}", c) != NULL) {
      char what[16];
      describe_char(p->buf[k], what);
      return fail_at(p, k, "invalid character %s in the URL%s", what,
                     semicolon ? " (a marker after a URL needs a space before its ';')" : "");
    }
    if (c == ';') semicolon = true;
  }
  return 0;
}

static int parse_requirement(parser_t *p, pep508_requirement_t *req) {
  const char *buf = p->buf;
  size_t len = p->len;
  char found[32];
  size_t q = skip_blanks(buf, len, 0);

  size_t nl = scan_name(buf, len, q);
  if (nl == 0) {
    describe_at(p, q, found);
    return fail_at(p, q, "expected a package name (letters, digits, '.', '-', '_'), %s", found);
  }
  if (!ch_alnum(buf[q + nl - 1]))
    return fail_at(p, q + nl - 1, "a package name must end with a letter or digit");
  req->name = xstrndup(buf + q, nl);
  req->normalized_name = pep508_normalize_name(buf + q, nl);
  q = skip_blanks(buf, len, q + nl);

  const char *expected = "expected '[', a version specifier, \"@ URL\" or ';' after the name";
  if (q < len && buf[q] == '[') {
    if (parse_extras(p, &q, req) < 0) return -1;
    q = skip_blanks(buf, len, q);
    expected = "expected a version specifier, \"@ URL\" or ';' after the extras";
  } else {
    req->extras = xcalloc(1, sizeof *req->extras);
  }

  if (q < len && buf[q] == '@') {
    size_t s = skip_blanks(buf, len, q + 1), e = s;
    while (e < len && !ch_blank(buf[e])) e++;
    if (e == s) return fail_at(p, s, "expected a URL after '@'");
    if (check_url(p, s, e) < 0) return -1;
    req->url = xstrndup(buf + s, e - s);
    req->specifiers = xcalloc(1, sizeof *req->specifiers);
    q = skip_blanks(buf, len, e);
    expected = "expected ';' or the end after the URL";
  } else if (q < len && buf[q] == '(') {
    q = skip_blanks(buf, len, q + 1);
    if (pep440_specifier_set_parse_at(buf, len, &q, p->what, &req->specifiers, p->err) < 0)
      return -1;
    q = skip_blanks(buf, len, q);
    if (q >= len || buf[q] != ')') {
      describe_at(p, q, found);
      return fail_at(p, q, "expected ',' or ')' after the version specifier in parentheses, %s",
                     found);
    }
    q = skip_blanks(buf, len, q + 1);
    expected = "expected ';' or the end after the version specifier";
  } else if (q < len && ch_op(buf[q])) {
    if (pep440_specifier_set_parse_at(buf, len, &q, p->what, &req->specifiers, p->err) < 0)
      return -1;
    q = skip_blanks(buf, len, q);
    expected = "expected ',', ';' or the end after the version specifier";
  } else {
    req->specifiers = xcalloc(1, sizeof *req->specifiers);
  }

  if (q < len && buf[q] == ';') {
    p->pos = q + 1;
    if (parse_or(p, 0, &req->marker) < 0) return -1;
    q = skip_blanks(buf, len, p->pos);
    expected = "expected \"and\", \"or\" or the end in the marker";
  }
  if (q < len) {
    describe_at(p, q, found);
    return fail_at(p, q, "%s, %s", expected, found);
  }
  return 0;
}

int pep508_requirement_parse(const char *buf, size_t len, pep508_requirement_t **out,
                             cm_error_t *err) {
  *out = NULL;
  if (len > PEP508_MAX_REQUIREMENT_LEN)
    return pep440_error_at(err, CM_ERR_LIMIT, "requirement", buf, len, 0,
                           "requirement is %zu bytes, the limit is %d", len,
                           PEP508_MAX_REQUIREMENT_LEN);
  parser_t p = {buf, len, 0, "requirement", err};
  pep508_requirement_t *req = xcalloc(1, sizeof *req);
  if (parse_requirement(&p, req) < 0) {
    pep508_requirement_free(req);
    return -1;
  }
  *out = req;
  return 0;
}

char *pep508_requirement_render(const pep508_requirement_t *req) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_appends(&b, req->normalized_name);
  if (req->extras_len > 0) {
    cm_buf_appends(&b, "[");
    for (size_t i = 0; i < req->extras_len; i++) {
      if (i) cm_buf_appends(&b, ",");
      cm_buf_appends(&b, req->extras[i]);
    }
    cm_buf_appends(&b, "]");
  }
  if (req->url) {
    cm_buf_printf(&b, " @ %s", req->url);
  } else if (req->specifiers && req->specifiers->len > 0) {
    cleanup_free char *spec = pep440_specifier_set_render(req->specifiers);
    cm_buf_appends(&b, spec);
  }
  if (req->marker) {
    cm_buf_appends(&b, req->url ? " ; " : "; ");
    render_marker(&b, req->marker);
  }
  return cm_buf_steal(&b);
}

/* ---------------------------------------------------------------- merging */

int pep508_merge_dependencies(const char *const *existing, size_t existing_len,
                              const char *const *extra, size_t extra_len, char ***out,
                              cm_error_t *err) {
  *out = NULL;
  if (existing_len > PEP508_MAX_DEPENDENCIES || extra_len > PEP508_MAX_DEPENDENCIES ||
      existing_len + extra_len > PEP508_MAX_DEPENDENCIES)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "%zu dependencies, the limit is %d",
                        existing_len + extra_len, PEP508_MAX_DEPENDENCIES);
  size_t total = existing_len + extra_len;
  cleanup_strv char **names = xcalloc(total + 1, sizeof *names);
  cleanup_free size_t *winner = xcalloc(total + 1, sizeof *winner);
  cleanup_free bool *leads = xcalloc(total + 1, sizeof *leads);

  for (size_t i = 0; i < total; i++) {
    bool is_extra = i >= existing_len;
    size_t index = is_extra ? i - existing_len : i;
    const char *s = is_extra ? extra[index] : existing[index];
    const char *label = is_extra ? "extra dependency" : "script dependency";
    if (s == NULL)
      return cm_error_set(err, 0, CM_ERR_INVALID, "%s %zu is missing", label, index + 1);
    pep508_requirement_t *req;
    if (pep508_requirement_parse(s, strlen(s), &req, err) < 0)
      return cm_error_wrap(err, "%s %zu", label, index + 1);
    names[i] = steal_pointer(&req->normalized_name);
    pep508_requirement_free(req);
  }

  /* winner[first] = the last entry with the first entry's name. */
  for (size_t i = 0; i < total; i++) {
    size_t first = i;
    for (size_t j = 0; j < i; j++) {
      if (leads[j] && strcmp(names[j], names[i]) == 0) {
        first = j;
        break;
      }
    }
    if (first == i) leads[i] = true;
    winner[first] = i;
  }

  char **merged = xcalloc(total + 1, sizeof *merged);
  size_t n = 0;
  for (size_t i = 0; i < total; i++) {
    if (!leads[i]) continue;
    size_t w = winner[i];
    merged[n++] = xstrdup(w >= existing_len ? extra[w - existing_len] : existing[w]);
  }
  *out = merged;
  return 0;
}
