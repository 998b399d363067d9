/* server/pep723.h: PEP 723 inline script metadata (`# /// script` blocks).
 *
 * Blocks are found as the specification describes them
 * (https://packaging.python.org/specifications/inline-script-metadata/): an opening line
 * that is exactly "# /// TYPE" (TYPE: ASCII letters, digits, '-'), content lines that are
 * "#" alone or "#" + " " + text, and a closing line that is exactly "# ///".  The block
 * closes at the last "# ///" line before the first line that is not a content line (so
 * "# ///" may appear inside the content), which is what the reference regular expression
 *   (?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$
 * matches.  Blocks may be anywhere in the file; a block of another TYPE is skipped whole
 * (a "# /// script" line inside it is its content, not an opening).
 *
 * Where this deliberately differs from the regex or the text:
 * - CRLF line endings are accepted: a '\r' before '\n' ends the line, it is not content.
 *   Lines end only at '\n' (the reference implementation's splitlines() also splits the
 *   content at other characters such as U+2028; we do not).
 * - An empty block ("# /// script" directly followed by "# ///") is accepted and has
 *   empty content (the text allows it; the regex needs one content line).
 * - A "# /// script" line with no closing line is an error naming its line, where the
 *   specification says to ignore an unclosed block: silently running a script without
 *   the dependencies its author declared only fails later and less clearly.  A line
 *   such as "#x" (no space after '#') is not a content line, so it ends the block: if
 *   no "# ///" came before it, the block is unclosed.
 * - Two "script" blocks are an error (the specification requires one).
 *
 * The script itself is never modified. */
#ifndef MPS_SERVER_PEP723_H
#define MPS_SERVER_PEP723_H

#include <stdbool.h>
#include <stddef.h>

#include "common/cm.h"
#include "server/toml.h"

/* More entries in `dependencies` fail with CM_ERR_LIMIT. */
#define PEP723_MAX_DEPENDENCIES 1000

typedef struct pep723_block {
  char *content;      /* un-commented TOML with "\n" line endings, NUL-terminated, owned */
  size_t content_len; /* bytes in content, without the NUL */
  size_t first_line;  /* the "# /// script" line, 1-based */
  size_t last_line;   /* the closing "# ///" line */
} pep723_block_t;

/* Finds the script block in buf[0..len) (no terminator needed).  Returns 1 and fills
 * *block (release it with pep723_block_release()) if there is one, 0 and zeroes *block
 * if there is none, or -1 with CM_ERR_INVALID for two script blocks or an unclosed one
 * (the message names the lines). */
int pep723_extract(const char *buf, size_t len, pep723_block_t *block, cm_error_t *err);
void pep723_block_release(pep723_block_t *block);

typedef struct pep723_metadata {
  bool present;      /* a script block was found (even an empty one) */
  size_t first_line; /* lines of the block, 0 when absent */
  size_t last_line;
  char **dependencies; /* NULL-terminated vector of heap strings; NULL when the
                        * block has no `dependencies` key, empty when it is [] */
  size_t n_dependencies;
  char *requires_python;    /* heap string, or NULL when absent */
  toml_value_t *document;   /* the whole decoded block (owned), NULL when absent; it
                             * keeps any other keys for later use */
  const toml_value_t *tool; /* the `tool` table inside document, or NULL */
} pep723_metadata_t;

/* Extracts the script block, decodes it as TOML and checks the fields PEP 723 defines:
 * `dependencies` must be an array of strings, `requires-python` a string, `tool` a
 * table; neither string may contain NUL.  Other keys are kept in document and not
 * checked.  No block is not an error: *meta is then empty (present == false).
 * Returns 0, or -1 with *meta empty and *err set:
 *   CM_ERR_INVALID  block structure ("script metadata (line 12): ..."), malformed TOML
 *                   ("malformed TOML in script metadata: line 4, column 7: ..."; lines
 *                   and columns are those of the script), or a bad field
 *                   ("script metadata (line 3): dependencies must be an array of strings");
 *   CM_ERR_LIMIT    the TOML limits (toml.h) or PEP723_MAX_DEPENDENCIES. */
int pep723_parse_metadata(const char *buf, size_t len, pep723_metadata_t *meta, cm_error_t *err);
void pep723_metadata_release(pep723_metadata_t *meta);

#endif
