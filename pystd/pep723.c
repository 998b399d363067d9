/* PEP 723 block extraction and metadata checks (see pystd.h). */
#include "pystd/pystd.h"

#include <stdio.h>

/* One line of the script: text without its line ending ('\n' or "\r\n"). */
typedef struct script_line {
  const char *text;
  size_t len;
  size_t next; /* offset of the following line */
} script_line_t;

static bool read_line(const char *buf, size_t len, size_t pos, script_line_t *line) {
  if (pos >= len) return false;
  const char *start = buf + pos;
  const char *nl = memchr(start, '\n', len - pos);
  size_t n = nl ? (size_t)(nl - start) : len - pos;
  line->text = start;
  line->next = nl ? pos + n + 1 : len;
  if (nl && n > 0 && start[n - 1] == '\r') n--;
  line->len = n;
  return true;
}

#define OPEN_PREFIX "# /// "

/* "# /// TYPE": returns true and sets *type / *type_len. */
static bool is_opening(const script_line_t *l, const char **type, size_t *type_len) {
  size_t prefix = sizeof OPEN_PREFIX - 1;
  if (l->len <= prefix || memcmp(l->text, OPEN_PREFIX, prefix) != 0) return false;
  for (size_t i = prefix; i < l->len; i++) {
    char c = l->text[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
      return false;
  }
  *type = l->text + prefix;
  *type_len = l->len - prefix;
  return true;
}

static bool is_script_opening(const script_line_t *l) {
  const char *type;
  size_t type_len;
  return is_opening(l, &type, &type_len) && type_len == 6 && memcmp(type, "script", 6) == 0;
}

static bool is_closing(const script_line_t *l) {
  return l->len == 5 && memcmp(l->text, "# ///", 5) == 0;
}

static bool is_content(const script_line_t *l) {
  return (l->len == 1 && l->text[0] == '#') ||
         (l->len >= 2 && l->text[0] == '#' && l->text[1] == ' ');
}

static int unclosed(cm_error_t *err, size_t open_line, size_t stop_line) {
  if (stop_line == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "script metadata (line %zu): \"# /// script\" is not closed: no \"# ///\" "
                        "line before the end of the file",
                        open_line);
  return cm_error_set(err, 0, CM_ERR_INVALID,
                      "script metadata (line %zu): \"# /// script\" is not closed: line %zu ends "
                      "the comment block before any \"# ///\" line (every line of a block must "
                      "be \"#\" alone or start with \"# \")",
                      open_line, stop_line);
}

int pep723_extract(const char *buf, size_t len, pep723_block_t *block, cm_error_t *err) {
  memset(block, 0, sizeof *block);
  if (buf == NULL) {
    if (len == 0) return 0;
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "pep723_extract: invalid arguments");
  }
  size_t pos = 0, line_no = 1;
  size_t content_start = 0, content_end = 0;
  bool found = false;
  script_line_t l;
  while (read_line(buf, len, pos, &l)) {
    const char *type;
    size_t type_len;
    if (!is_opening(&l, &type, &type_len)) {
      pos = l.next;
      line_no++;
      continue;
    }
    bool script = type_len == 6 && memcmp(type, "script", 6) == 0;

    /* Follow the run of content lines; the block ends at the last "# ///" in it. */
    size_t q = l.next, q_line = line_no + 1;
    size_t close_line = 0, close_start = 0, close_next = 0;
    size_t stop_line = 0, stop_pos = len;
    size_t script_inside = 0; /* first "# /// script" line in the run */
    script_line_t m;
    while (read_line(buf, len, q, &m)) {
      if (!is_content(&m)) {
        stop_line = q_line;
        stop_pos = q;
        break;
      }
      if (is_closing(&m)) {
        close_line = q_line;
        close_start = q;
        close_next = m.next;
      } else if (script_inside == 0 && is_script_opening(&m)) {
        script_inside = q_line;
      }
      q = m.next;
      q_line++;
    }

    if (close_line == 0) {
      if (script) return unclosed(err, line_no, stop_line);
      /* Every opening inside the run is just as unclosed. */
      if (script_inside) return unclosed(err, script_inside, stop_line);
      if (stop_line == 0) break;
      pos = stop_pos;
      line_no = stop_line;
      continue;
    }
    if (script) {
      if (found)
        return cm_error_set(err, 0, CM_ERR_INVALID,
                            "script metadata (line %zu): a second \"# /// script\" block (the "
                            "first is at line %zu); only one is allowed",
                            line_no, block->first_line);
      found = true;
      block->first_line = line_no;
      block->last_line = close_line;
      content_start = l.next;
      content_end = close_start;
    }
    pos = close_next;
    line_no = close_line + 1;
  }
  if (!found) return 0;

  /* Un-comment: drop "# " (or the lone "#") and end every line with "\n". */
  char *out = xmalloc(content_end - content_start + 1);
  size_t o = 0;
  for (size_t p = content_start; read_line(buf, content_end, p, &l); p = l.next) {
    if (l.len > 2) {
      memcpy(out + o, l.text + 2, l.len - 2);
      o += l.len - 2;
    }
    out[o++] = '\n';
  }
  out[o] = '\0';
  block->content = out;
  block->content_len = o;
  return 1;
}

void pep723_block_release(pep723_block_t *block) {
  if (block == NULL) return;
  free(block->content);
  memset(block, 0, sizeof *block);
}

void pep723_metadata_release(pep723_metadata_t *meta) {
  if (meta == NULL) return;
  cm_strv_free(meta->dependencies);
  free(meta->requires_python);
  toml_free(meta->document);
  memset(meta, 0, sizeof *meta);
}

static int field_error(cm_error_t *err, const toml_value_t *v, const char *what) {
  return cm_error_set(err, 0, CM_ERR_INVALID, "script metadata (line %zu): %s", toml_line(v), what);
}

/* A string field as a C string: NUL inside would silently cut it. */
static int copy_string(const toml_value_t *v, const char *name, char **out, cm_error_t *err) {
  size_t n = 0;
  const char *s = toml_string(v, &n);
  if (memchr(s, '\0', n) != NULL)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "script metadata (line %zu): %s contains a NUL "
                        "character",
                        toml_line(v), name);
  *out = xstrndup(s, n);
  return 0;
}

int pep723_parse_metadata(const char *buf, size_t len, pep723_metadata_t *meta, cm_error_t *err) {
  memset(meta, 0, sizeof *meta);
  pep723_block_t block;
  int found = pep723_extract(buf, len, &block, err);
  if (found <= 0) return found;

  pep723_metadata_t m = {
      .present = true, .first_line = block.first_line, .last_line = block.last_line};
  toml_options_t options = {.first_line = block.first_line + 1, .column_offset = 2};
  int rc = toml_parse(block.content, block.content_len, &options, &m.document, err);
  pep723_block_release(&block);
  if (rc < 0) {
    if (err && err->kind == CM_ERR_LIMIT)
      return cm_error_wrap(err, "script metadata (line %zu)", m.first_line);
    return cm_error_wrap(err, "malformed TOML in script metadata");
  }

  const toml_value_t *deps = toml_table_get(m.document, "dependencies");
  if (deps) {
    if (toml_type(deps) != TOML_ARRAY) {
      field_error(err, deps, "dependencies must be an array of strings");
      goto fail;
    }
    size_t n = toml_array_len(deps);
    if (n > PEP723_MAX_DEPENDENCIES) {
      cm_error_set(err, 0, CM_ERR_LIMIT,
                   "script metadata (line %zu): %zu dependencies, more "
                   "than the limit of %d",
                   toml_line(deps), n, PEP723_MAX_DEPENDENCIES);
      goto fail;
    }
    m.dependencies = xcalloc(n + 1, sizeof *m.dependencies);
    for (size_t i = 0; i < n; i++) {
      const toml_value_t *d = toml_array_at(deps, i);
      if (toml_type(d) != TOML_STRING) {
        field_error(err, d, "dependencies must be an array of strings");
        goto fail;
      }
      if (copy_string(d, "a dependency", &m.dependencies[i], err) < 0) goto fail;
      m.n_dependencies++;
    }
  }

  const toml_value_t *requires = toml_table_get(m.document, "requires-python");
  if (requires) {
    if (toml_type(requires) != TOML_STRING) {
      field_error(err, requires, "requires-python must be a string");
      goto fail;
    }
    if (copy_string(requires, "requires-python", &m.requires_python, err) < 0) goto fail;
  }

  m.tool = toml_table_get(m.document, "tool");
  if (m.tool && toml_type(m.tool) != TOML_TABLE) {
    field_error(err, m.tool, "tool must be a table");
    goto fail;
  }

  *meta = m;
  return 0;
fail:
  pep723_metadata_release(&m);
  return -1;
}
