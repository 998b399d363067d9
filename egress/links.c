/* What an index's credentials may go with (see egress.h): the index's own path, the links its
 * pages named (resolved, canonical, remembered in a bounded set), and the scanner that finds
 * those links in a page's body as it streams past.  Pure but for the set's memory: every
 * input by (buf, len). */
#include <stdio.h>

#include "egress/egress-internal.h"

static bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
static int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}
static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f';
}

/* The length of the path part of a target (before its query). */
static size_t path_part(const char *p, size_t len) {
  const char *q = memchr(p, '?', len);
  return q ? (size_t)(q - p) : len;
}

/* No "." or ".." segment (a segment's ";params" cut off first: some servers drop them) and
 * no backslash; with strict, also no percent-escape of a dot, slash, backslash, percent sign
 * or NUL, and no '%' that starts no escape. */
static bool path_plain(const char *p, size_t n, bool strict) {
  size_t seg = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || p[i] == '/') {
      size_t end = i;
      const char *semi = memchr(p + seg, ';', end - seg);
      if (semi) end = (size_t)(semi - p);
      size_t l = end - seg;
      if ((l == 1 && p[seg] == '.') || (l == 2 && p[seg] == '.' && p[seg + 1] == '.')) return false;
      seg = i + 1;
      continue;
    }
    if (p[i] == '\\') return false;
    if (strict && p[i] == '%') {
      if (i + 2 >= n) return false;
      int h = hex_value(p[i + 1]), l = hex_value(p[i + 2]);
      if (h < 0 || l < 0) return false;
      char v = (char)(h * 16 + l);
      if (v == '.' || v == '/' || v == '\\' || v == '%' || v == '\0') return false;
    }
  }
  return true;
}

bool eg_index_path_below(const char *base, const char *target, size_t len) {
  size_t bl = path_part(base, strlen(base));
  while (bl > 0 && base[bl - 1] == '/') bl--;
  size_t n = path_part(target, len);
  if (n == 0 || target[0] != '/') return false;
  if (n < bl || memcmp(target, base, bl) != 0) return false;
  if (n > bl && target[bl] != '/') return false;
  return path_plain(target + bl, n - bl, true);
}

/* Bytes a canonical target keeps as they are: RFC 3986 unreserved and sub-delims, ':', '@',
 * '/' and '?'. */
static bool canon_keeps(unsigned char c) {
  return is_alpha((char)c) || is_digit((char)c) || (c && strchr("-._~!$&'()*+,;=:@/?", c));
}

char *eg_path_canon(const char *target, size_t len) {
  char *out = xmalloc(len * 3 + 1);
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)target[i];
    bool escaped = false;
    if (c == '%' && i + 2 < len) {
      int h = hex_value(target[i + 1]), l = hex_value(target[i + 2]);
      if (h >= 0 && l >= 0) {
        c = (unsigned char)(h * 16 + l);
        i += 2;
        escaped = true;
      }
    }
    bool keep = canon_keeps(c) && !(escaped && (c == '/' || c == '?' || c == '.'));
    if (keep) {
      out[o++] = (char)c;
    } else {
      static const char hex[] = "0123456789ABCDEF";
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    }
  }
  out[o] = '\0';
  return out;
}

/* RFC 3986 5.2.4 on a path that starts with '/' (n bytes), then the rest (the query). */
static char *remove_dot_segments(const char *p, size_t n, const char *rest, size_t rest_len) {
  eg_span_t *segs = xmalloc((n + 1) * sizeof *segs);
  size_t nseg = 0;
  size_t i = 1;
  for (;;) {
    size_t s = i;
    while (i < n && p[i] != '/') i++;
    size_t l = i - s;
    bool last = i >= n;
    if (l == 1 && p[s] == '.') {
      if (last) segs[nseg++] = (eg_span_t){s, 0};
    } else if (l == 2 && p[s] == '.' && p[s + 1] == '.') {
      if (nseg > 0) nseg--;
      if (last) segs[nseg++] = (eg_span_t){s, 0};
    } else {
      segs[nseg++] = (eg_span_t){s, l};
    }
    if (last) break;
    i++;
  }
  cm_buf_t out;
  cm_buf_init(&out, 0);
  for (size_t k = 0; k < nseg; k++) {
    cm_buf_appends(&out, "/");
    cm_buf_append(&out, p + segs[k].off, segs[k].len);
  }
  if (nseg == 0) cm_buf_appends(&out, "/");
  cm_buf_append(&out, rest, rest_len);
  free(segs);
  return cm_buf_steal(&out);
}

char *eg_link_resolve(const eg_url_t *origin, const char *page_target, const char *link,
                      size_t len) {
  while (len > 0 && is_space(link[0])) link++, len--;
  while (len > 0 && is_space(link[len - 1])) len--;
  const char *hash = memchr(link, '#', len);
  if (hash) len = (size_t)(hash - link);
  if (len == 0 || len > EG_LINK_MAX) return NULL;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)link[i];
    if (c < 0x20 || c == 0x7f) return NULL;
  }
  cleanup_free char *target = NULL;
  size_t scheme = 0;
  if (is_alpha(link[0])) {
    scheme = 1;
    while (scheme < len && (is_alpha(link[scheme]) || is_digit(link[scheme]) ||
                            link[scheme] == '+' || link[scheme] == '-' || link[scheme] == '.'))
      scheme++;
    if (scheme >= len || link[scheme] != ':') scheme = 0;
  }
  if (scheme || (len >= 2 && link[0] == '/' && link[1] == '/')) {
    cleanup_free char *abs =
        scheme ? xstrndup(link, len)
               : xasprintf("%s:%.*s", origin->https ? "https" : "http", (int)len, link);
    eg_url_t u;
    if (eg_url_parse(abs, strlen(abs), &u) < 0) return NULL;
    bool same = !u.user && !u.password && u.https == origin->https && u.port == origin->port &&
                strcmp(u.host, origin->host) == 0;
    if (same) target = xstrdup(u.path);
    eg_url_release(&u);
    if (!same) return NULL;
  } else if (link[0] == '/') {
    target = xstrndup(link, len);
  } else {
    size_t pl = path_part(page_target, strlen(page_target));
    if (pl == 0 || page_target[0] != '/') return NULL;
    if (link[0] == '?') {
      target = xasprintf("%.*s%.*s", (int)pl, page_target, (int)len, link);
    } else {
      size_t dir = pl;
      while (dir > 0 && page_target[dir - 1] != '/') dir--;
      target = xasprintf("%.*s%.*s", (int)dir, page_target, (int)len, link);
    }
  }
  size_t tl = strlen(target);
  size_t pl = path_part(target, tl);
  if (pl == 0 || target[0] != '/') return NULL;
  return remove_dot_segments(target, pl, target + pl, tl - pl);
}

/* ---------------------------------------------------------------- the remembered links */

#define LINK_BUCKETS 4096

typedef struct link_node {
  struct link_node *chain; /* the bucket's next */
  struct link_node *newer; /* the next in the order of arrival */
  uint64_t hash;
  size_t len;
  char text[];
} link_node_t;

struct eg_link_set {
  link_node_t **buckets; /* LINK_BUCKETS, made at the first link */
  link_node_t *oldest, *newest;
  size_t n, bytes, max_links, max_bytes;
};

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

eg_link_set_t *eg_link_set_new(size_t max_links, size_t max_bytes) {
  eg_link_set_t *s = xcalloc(1, sizeof *s);
  s->max_links = max_links ? max_links : 1;
  s->max_bytes = max_bytes ? max_bytes : 1;
  return s;
}

void eg_link_set_free(eg_link_set_t *s) {
  if (!s) return;
  for (link_node_t *n = s->oldest; n;) {
    link_node_t *next = n->newer;
    free(n);
    n = next;
  }
  free(s->buckets);
  free(s);
}

static link_node_t *find(const eg_link_set_t *s, const char *text, size_t len, uint64_t h) {
  if (!s->buckets) return NULL;
  for (link_node_t *n = s->buckets[h % LINK_BUCKETS]; n; n = n->chain)
    if (n->hash == h && n->len == len && memcmp(n->text, text, len) == 0) return n;
  return NULL;
}

static void drop_oldest(eg_link_set_t *s) {
  link_node_t *old = s->oldest;
  for (link_node_t **pp = &s->buckets[old->hash % LINK_BUCKETS]; *pp; pp = &(*pp)->chain)
    if (*pp == old) {
      *pp = old->chain;
      break;
    }
  s->oldest = old->newer;
  if (!s->oldest) s->newest = NULL;
  s->n--;
  s->bytes -= old->len;
  free(old);
}

void eg_link_set_add(eg_link_set_t *s, const char *target, size_t len) {
  cleanup_free char *canon = eg_path_canon(target, len);
  size_t cl = strlen(canon);
  if (cl > s->max_bytes) return;
  uint64_t h = fnv1a(canon, cl);
  if (find(s, canon, cl, h)) return;
  if (!s->buckets) s->buckets = xcalloc(LINK_BUCKETS, sizeof *s->buckets);
  while (s->oldest && (s->n >= s->max_links || s->bytes + cl > s->max_bytes)) drop_oldest(s);
  link_node_t *n = xmalloc(sizeof *n + cl + 1);
  n->hash = h;
  n->len = cl;
  memcpy(n->text, canon, cl + 1);
  n->newer = NULL;
  n->chain = s->buckets[h % LINK_BUCKETS];
  s->buckets[h % LINK_BUCKETS] = n;
  if (s->newest)
    s->newest->newer = n;
  else
    s->oldest = n;
  s->newest = n;
  s->n++;
  s->bytes += cl;
}

bool eg_link_set_has(const eg_link_set_t *s, const char *target, size_t len) {
  if (!s || !s->n) return false;
  cleanup_free char *canon = eg_path_canon(target, len);
  size_t cl = strlen(canon);
  return find(s, canon, cl, fnv1a(canon, cl)) != NULL;
}

size_t eg_link_set_count(const eg_link_set_t *s) {
  return s ? s->n : 0;
}

bool eg_index_credentials_apply(const char *base, const eg_link_set_t *links, const char *target,
                                size_t len) {
  if (eg_index_path_below(base, target, len)) return true;
  size_t n = path_part(target, len);
  if (n == 0 || target[0] != '/' || !path_plain(target, n, false)) return false;
  if (eg_link_set_has(links, target, len)) return true;
  static const char meta[] = ".metadata";
  size_t ml = sizeof meta - 1;
  return n == len && n > ml && memcmp(target + n - ml, meta, ml) == 0 &&
         eg_link_set_has(links, target, n - ml);
}

/* ---------------------------------------------------------------- which pages are learnt */

static bool span_is(const char *buf, eg_span_t s, const char *lit) {
  size_t n = strlen(lit);
  if (s.len != n) return false;
  for (size_t i = 0; i < n; i++)
    if (lower(buf[s.off + i]) != lit[i]) return false;
  return true;
}

/* The value's first token (up to ';' or ','), trimmed and compared case-insensitively with
 * lit; prefix: lit is a prefix of it. */
static bool token_is(const char *buf, eg_span_t v, const char *lit, bool prefix) {
  size_t e = v.off;
  while (e < v.off + v.len && buf[e] != ';' && buf[e] != ',') e++;
  size_t s = v.off;
  while (s < e && (buf[s] == ' ' || buf[s] == '\t')) s++;
  while (e > s && (buf[e - 1] == ' ' || buf[e - 1] == '\t')) e--;
  size_t n = strlen(lit);
  if (prefix ? e - s < n : e - s != n) return false;
  for (size_t i = 0; i < n; i++)
    if (lower(buf[s + i]) != lit[i]) return false;
  return true;
}

bool eg_page_response_learnable(const char *buf, const eg_response_t *resp, bool *chunked) {
  *chunked = false;
  if (resp->status < 200 || resp->status > 299 || resp->status == 204 || resp->status == 206)
    return false;
  bool typed = false;
  for (size_t i = 0; i < resp->n_headers; i++) {
    const eg_header_t *h = &resp->headers[i];
    if (span_is(buf, h->name, "content-type")) {
      if (typed) return false; /* two: which one would the client believe? */
      typed = token_is(buf, h->value, "text/html", false) ||
              token_is(buf, h->value, "application/xhtml+xml", false) ||
              token_is(buf, h->value, "application/json", false) ||
              token_is(buf, h->value, "application/vnd.pypi.simple.", true);
      if (!typed) return false;
    } else if (span_is(buf, h->name, "content-encoding")) {
      if (h->value.len && !token_is(buf, h->value, "identity", false)) return false;
      if (memchr(buf + h->value.off, ',', h->value.len)) return false;
    } else if (span_is(buf, h->name, "transfer-encoding")) {
      if (*chunked || !token_is(buf, h->value, "chunked", false) ||
          memchr(buf + h->value.off, ',', h->value.len) ||
          memchr(buf + h->value.off, ';', h->value.len))
        return false;
      *chunked = true;
    }
  }
  return typed;
}

/* ---------------------------------------------------------------- the page scanner */

enum { CH_SIZE = 0, CH_EXT, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF, CH_DONE, CH_BROKEN };
enum { L_SCAN = 0, L_SEP, L_START, L_VALUE, L_ESCAPE };
enum { K_HREF = 1, K_URL };

void eg_page_scan_init(eg_page_scan_t *s, bool chunked) {
  memset(s, 0, sizeof *s);
  s->chunked = chunked;
  s->chunk_state = CH_SIZE;
}

static void value_add(eg_page_scan_t *s, char c) {
  if (s->len < EG_LINK_MAX)
    s->value[s->len++] = c;
  else
    s->skip = true;
}

static void value_emit(eg_page_scan_t *s, eg_link_fn *fn, void *data) {
  if (!s->skip && s->len > 0) {
    size_t n = s->len;
    if (s->kind == K_HREF) {
      /* "&amp;" is how HTML spells '&' in an attribute (a query's separator). */
      size_t o = 0;
      for (size_t i = 0; i < n; i++) {
        if (s->value[i] == '&' && n - i >= 5 && memcmp(s->value + i, "&amp;", 5) == 0) {
          s->value[o++] = '&';
          i += 4;
        } else {
          s->value[o++] = s->value[i];
        }
      }
      n = o;
    }
    fn(data, s->value, n);
  }
  s->state = L_SCAN;
  s->len = 0;
  s->skip = false;
}

static void scan_byte(eg_page_scan_t *s, char c, eg_link_fn *fn, void *data) {
  for (;;) {
    switch (s->state) {
      case L_SCAN: {
        static const char href[] = "href", url[] = "\"url\"";
        char lc = lower(c);
        s->match_href = lc == href[s->match_href] ? s->match_href + 1 : lc == 'h' ? 1 : 0;
        s->match_url = c == url[s->match_url] ? s->match_url + 1 : c == '"' ? 1 : 0;
        if (s->match_href == 4) {
          s->kind = K_HREF;
        } else if (s->match_url == 5) {
          s->kind = K_URL;
        } else {
          return;
        }
        s->match_href = s->match_url = 0;
        s->state = L_SEP;
        return;
      }
      case L_SEP:
        if (is_space(c)) return;
        if (c == (s->kind == K_HREF ? '=' : ':')) {
          s->state = L_START;
          return;
        }
        s->state = L_SCAN;
        continue; /* this byte may start the next keyword */
      case L_START:
        if (is_space(c)) return;
        s->len = 0;
        s->skip = false;
        if (c == '"' || (c == '\'' && s->kind == K_HREF)) {
          s->quote = c;
          s->state = L_VALUE;
          return;
        }
        if (s->kind == K_HREF && c != '>') {
          s->quote = 0;
          s->state = L_VALUE;
          value_add(s, c);
          return;
        }
        s->state = L_SCAN;
        continue;
      case L_VALUE:
        if (s->quote ? c == s->quote : (is_space(c) || c == '>')) {
          value_emit(s, fn, data);
          return;
        }
        if (s->kind == K_URL && c == '\\') {
          s->state = L_ESCAPE;
          return;
        }
        value_add(s, c);
        return;
      case L_ESCAPE:
        if (c == '/' || c == '\\' || c == '"')
          value_add(s, c);
        else
          s->skip = true; /* \uXXXX and friends: not a link we can spell as the client will */
        s->state = L_VALUE;
        return;
    }
    return;
  }
}

int eg_page_scan_feed(eg_page_scan_t *s, const char *buf, size_t len, eg_link_fn *fn, void *data) {
  if (!s->chunked) {
    for (size_t i = 0; i < len; i++) scan_byte(s, buf[i], fn, data);
    return 0;
  }
  size_t i = 0;
  while (i < len) {
    char c = buf[i];
    switch (s->chunk_state) {
      case CH_SIZE: {
        int v = hex_value(c);
        if (v >= 0) {
          if (++s->chunk_digits > 15) {
            s->chunk_state = CH_BROKEN;
            return -1;
          }
          s->chunk_left = s->chunk_left * 16 + (uint64_t)v;
        } else if (s->chunk_digits && (c == ';' || c == ' ' || c == '\t')) {
          s->chunk_state = CH_EXT;
        } else if (s->chunk_digits && c == '\r') {
          s->chunk_state = CH_SIZE_LF;
        } else {
          s->chunk_state = CH_BROKEN;
          return -1;
        }
        i++;
        break;
      }
      case CH_EXT:
        if (c == '\r') s->chunk_state = CH_SIZE_LF;
        i++;
        break;
      case CH_SIZE_LF:
        if (c != '\n') {
          s->chunk_state = CH_BROKEN;
          return -1;
        }
        s->chunk_digits = 0;
        s->chunk_state = s->chunk_left ? CH_DATA : CH_DONE;
        i++;
        break;
      case CH_DATA: {
        size_t n = len - i;
        if (n > s->chunk_left) n = (size_t)s->chunk_left;
        for (size_t k = 0; k < n; k++) scan_byte(s, buf[i + k], fn, data);
        s->chunk_left -= n;
        i += n;
        if (!s->chunk_left) s->chunk_state = CH_DATA_CR;
        break;
      }
      case CH_DATA_CR:
      case CH_DATA_LF:
        if (c != (s->chunk_state == CH_DATA_CR ? '\r' : '\n')) {
          s->chunk_state = CH_BROKEN;
          return -1;
        }
        s->chunk_state = s->chunk_state == CH_DATA_CR ? CH_DATA_LF : CH_SIZE;
        i++;
        break;
      case CH_DONE:
        return 0; /* trailers: no links there */
      default:
        return -1;
    }
  }
  return 0;
}
