/* Unit tests for pystd/pep723.c: block extraction per PEP 723 and metadata checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm.h"
#include "pystd/pystd.h"

/* Extracts from text, which must hold a script block; checks its content and lines. */
static void expect_block(const char *text, const char *content, size_t first, size_t last) {
  pep723_block_t block;
  cm_error_t err = CM_ERROR_INIT;
  int rc = pep723_extract(text, strlen(text), &block, &err);
  if (rc != 1) fail_msg("no block (rc %d, %s) in:\n%s", rc, cm_error_message(&err), text);
  if (strcmp(block.content, content) != 0)
    fail_msg("content\n  got:  [%s]\n  want: [%s]", block.content, content);
  assert_int_equal(block.content_len, strlen(content));
  assert_int_equal(block.first_line, first);
  assert_int_equal(block.last_line, last);
  pep723_block_release(&block);
  assert_null(block.content);
}

static void expect_no_block(const char *text) {
  pep723_block_t block;
  cm_error_t err = CM_ERROR_INIT;
  int rc = pep723_extract(text, strlen(text), &block, &err);
  if (rc != 0) fail_msg("expected no block (rc %d, %s) in:\n%s", rc, cm_error_message(&err), text);
  assert_null(block.content);
  assert_int_equal(block.first_line, 0);
}

/* Metadata parsing that must fail; checks kind and the exact message. */
static void expect_error(const char *text, cm_error_kind_t kind, const char *message) {
  pep723_metadata_t meta;
  cm_error_t err = CM_ERROR_INIT;
  int rc = pep723_parse_metadata(text, strlen(text), &meta, &err);
  if (rc == 0) fail_msg("expected an error for:\n%s", text);
  assert_int_equal(rc, -1);
  assert_false(meta.present);
  assert_null(meta.document);
  assert_null(meta.dependencies);
  assert_int_equal(err.kind, kind);
  if (strcmp(err.msg, message) != 0)
    fail_msg("for:\n%s\n  got:  %s\n  want: %s", text, err.msg, message);
  cm_error_release(&err);
}

static void parse_ok(const char *text, pep723_metadata_t *meta) {
  cm_error_t err = CM_ERROR_INIT;
  if (pep723_parse_metadata(text, strlen(text), meta, &err) != 0)
    fail_msg("unexpected error %s for:\n%s", err.msg, text);
}

/* ---------------------------------------------------------------- extraction */

static void test_no_block(void **state) {
  (void)state;
  expect_no_block("");
  expect_no_block("print('hello')\n");
  expect_no_block("# a comment\n# ///\n");
  /* Near misses of the opening line are not openings. */
  expect_no_block("# /// script \n# a = 1\n# ///\n");
  expect_no_block("#  /// script\n# a = 1\n# ///\n");
  expect_no_block("# ///script\n# a = 1\n# ///\n");
  expect_no_block("  # /// script\n# a = 1\n# ///\n");
  expect_no_block("# /// \n# a = 1\n# ///\n");
  /* A NULL buffer of length 0 is an empty script. */
  pep723_block_t block;
  assert_int_equal(pep723_extract(NULL, 0, &block, NULL), 0);

  pep723_metadata_t meta;
  parse_ok("import sys\n", &meta);
  assert_false(meta.present);
  assert_null(meta.dependencies);
  assert_null(meta.requires_python);
  assert_null(meta.document);
  assert_null(meta.tool);
  pep723_metadata_release(&meta);
}

static void test_basic_block(void **state) {
  (void)state;
  const char *script =
      "# /// script\n"
      "# requires-python = \">=3.11\"\n"
      "# dependencies = [\n"
      "#   \"requests<3\",\n"
      "#   \"rich\",\n"
      "# ]\n"
      "#\n"
      "# [tool.uv]\n"
      "# index-url = \"https://example.org/simple\"\n"
      "# ///\n"
      "\n"
      "import requests\n";
  expect_block(script,
               "requires-python = \">=3.11\"\ndependencies = [\n  \"requests<3\",\n  \"rich\",\n]\n"
               "\n[tool.uv]\nindex-url = \"https://example.org/simple\"\n",
               1, 10);
  pep723_metadata_t meta;
  parse_ok(script, &meta);
  assert_true(meta.present);
  assert_int_equal(meta.first_line, 1);
  assert_int_equal(meta.last_line, 10);
  assert_string_equal(meta.requires_python, ">=3.11");
  assert_int_equal(meta.n_dependencies, 2);
  assert_string_equal(meta.dependencies[0], "requests<3");
  assert_string_equal(meta.dependencies[1], "rich");
  assert_null(meta.dependencies[2]);
  assert_int_equal(toml_type(meta.tool), TOML_TABLE);
  const toml_value_t *url = toml_table_get(toml_table_get(meta.tool, "uv"), "index-url");
  assert_string_equal(toml_string(url, NULL), "https://example.org/simple");
  /* Lines in the tree are lines of the script. */
  assert_int_equal(toml_line(url), 9);
  pep723_metadata_release(&meta);
  assert_false(meta.present);
  assert_null(meta.document);
}

static void test_empty_blocks(void **state) {
  (void)state;
  expect_block("# /// script\n# ///\n", "", 1, 2);
  expect_block("# /// script\n# ///", "", 1, 2);
  expect_block("# /// script\n#\n# ///\n", "\n", 1, 3);
  expect_block("# /// script\n# \n# ///\n", "\n", 1, 3);
  pep723_metadata_t meta;
  parse_ok("# /// script\n# ///\nprint(1)\n", &meta);
  assert_true(meta.present);
  assert_null(meta.dependencies);
  assert_null(meta.requires_python);
  assert_null(meta.tool);
  assert_int_equal(toml_table_len(meta.document), 0);
  pep723_metadata_release(&meta);
  /* Only comments: also empty metadata.  An empty dependency list is not "absent". */
  parse_ok("# /// script\n# # just a comment\n# dependencies = []\n# ///\n", &meta);
  assert_non_null(meta.dependencies);
  assert_null(meta.dependencies[0]);
  assert_int_equal(meta.n_dependencies, 0);
  pep723_metadata_release(&meta);
}

static void test_crlf(void **state) {
  (void)state;
  const char *script =
      "# /// script\r\n# dependencies = [\"rich\"]\r\n#\r\n# requires-python = '>=3.12'\r\n"
      "# ///\r\nprint(1)\r\n";
  expect_block(script, "dependencies = [\"rich\"]\n\nrequires-python = '>=3.12'\n", 1, 5);
  pep723_metadata_t meta;
  parse_ok(script, &meta);
  assert_string_equal(meta.dependencies[0], "rich");
  assert_string_equal(meta.requires_python, ">=3.12");
  pep723_metadata_release(&meta);
  /* Mixed endings, and a closing line ending in CRLF at the end of the file. */
  expect_block("x = 1\n# /// script\r\n# a = 1\n# ///\r\n", "a = 1\n", 2, 4);
  /* A '\r' that does not end a line is content, and then TOML rejects it. */
  expect_block("# /// script\n# a = 1\r \n# ///\n", "a = 1\r \n", 1, 3);
  expect_error("# /// script\n# a = 1\r \n# ///\n", CM_ERR_INVALID,
               "malformed TOML in script metadata: line 2, column 8: carriage return (U+000D) "
               "not followed by a line feed");
}

static void test_block_not_at_top(void **state) {
  (void)state;
  const char *script =
      "#!/usr/bin/env python3\n"
      "\"\"\"Docstring.\"\"\"\n"
      "import os\n"
      "\n"
      "# /// script\n"
      "# dependencies = [\"httpx\"]\n"
      "# ///\n"
      "print(os.getcwd())\n";
  expect_block(script, "dependencies = [\"httpx\"]\n", 5, 7);
  pep723_metadata_t meta;
  parse_ok(script, &meta);
  assert_int_equal(meta.first_line, 5);
  assert_string_equal(meta.dependencies[0], "httpx");
  pep723_metadata_release(&meta);
}

static void test_two_blocks(void **state) {
  (void)state;
  expect_error("# /// script\n# a = 1\n# ///\n\nx = 1\n\n# /// script\n# b = 2\n# ///\n",
               CM_ERR_INVALID,
               "script metadata (line 7): a second \"# /// script\" block (the first is at line "
               "1); only one is allowed");
  /* Two adjacent blocks are one: the block runs to the last "# ///" of the comment run,
   * as the reference regex does, and the result is not valid TOML. */
  expect_block("# /// script\n# a = 1\n# ///\n# /// script\n# b = 2\n# ///\n",
               "a = 1\n///\n/// script\nb = 2\n", 1, 6);
}

static void test_unclosed(void **state) {
  (void)state;
  expect_error("import os\n# /// script\n# dependencies = []\n", CM_ERR_INVALID,
               "script metadata (line 2): \"# /// script\" is not closed: no \"# ///\" line "
               "before the end of the file");
  expect_error("# /// script\n# dependencies = []\nimport os\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 1): \"# /// script\" is not closed: line 3 ends the "
               "comment block before any \"# ///\" line (every line of a block must be \"#\" "
               "alone or start with \"# \")");
  /* A blank line is not a comment line either. */
  expect_error("# /// script\n# a = 1\n\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 1): \"# /// script\" is not closed: line 3 ends the "
               "comment block before any \"# ///\" line (every line of a block must be \"#\" "
               "alone or start with \"# \")");
  /* The opening line is the last line (no newline after it). */
  expect_error("x = 1\n# /// script", CM_ERR_INVALID,
               "script metadata (line 2): \"# /// script\" is not closed: no \"# ///\" line "
               "before the end of the file");
  /* The length counts, not a terminator: the closing line lies beyond len. */
  const char *text = "# /// script\n# a = 1\n# ///\n";
  pep723_block_t block;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(pep723_extract(text, 20, &block, &err), -1);
  assert_non_null(strstr(err.msg, "(line 1)"));
  cm_error_release(&err);
  /* An unclosed block of another type is ignored, but a script opening inside its run
   * is reported. */
  expect_block("# /// pyproject\n# x = 1\nimport os\n# /// script\n# a = 1\n# ///\n", "a = 1\n", 4,
               6);
  expect_error("# /// pyproject\n# /// script\n# a = 1\n", CM_ERR_INVALID,
               "script metadata (line 2): \"# /// script\" is not closed: no \"# ///\" line "
               "before the end of the file");
}

static void test_hash_without_space(void **state) {
  (void)state;
  /* "#x" is not a content line (the regex needs "#" alone or "# "): it ends the block.
   * Before any "# ///" it leaves the opening unclosed... */
  expect_error("# /// script\n#x = 1\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 1): \"# /// script\" is not closed: line 2 ends the "
               "comment block before any \"# ///\" line (every line of a block must be \"#\" "
               "alone or start with \"# \")");
  expect_error("# /// script\n#\tx = 1\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 1): \"# /// script\" is not closed: line 2 ends the "
               "comment block before any \"# ///\" line (every line of a block must be \"#\" "
               "alone or start with \"# \")");
  /* ...after a "# ///" it is an ordinary comment after the block. */
  expect_block("# /// script\n# a = 1\n# ///\n#x\n", "a = 1\n", 1, 3);
  /* The block closes at the last "# ///" before the "#x" line; a later "# ///" after
   * it is a stray comment. */
  expect_block("# /// script\n# a = 1\n# ///\n# b = 2\n#x\n# ///\n", "a = 1\n", 1, 3);
  expect_block("# /// script\n# a = 1\n# ///\n# b = 2\n# ///\n#x\n", "a = 1\n///\nb = 2\n", 1, 5);
}

static void test_other_types(void **state) {
  (void)state;
  /* Other block types are skipped... */
  const char *script =
      "# /// pyproject\n# [project]\n# name = 'x'\n# ///\n\n"
      "# /// script\n# dependencies = ['a']\n# ///\n";
  expect_block(script, "dependencies = ['a']\n", 6, 8);
  /* ...whole: a "# /// script" line inside one is its content. */
  expect_no_block("# /// pyproject\n# /// script\n# a = 1\n# ///\n");
  expect_no_block("# /// script-v2\n# a = 1\n# ///\n");
  expect_no_block("# /// SCRIPT\n# a = 1\n# ///\n");
  /* A "# ///" line inside TOML content, as in the specification's example: the block
   * ends at the last one. */
  expect_block("# /// script\n# text = \"\"\"\n# ///\n# \"\"\"\n# ///\n",
               "text = \"\"\"\n///\n\"\"\"\n", 1, 5);
  pep723_metadata_t meta;
  parse_ok("# /// script\n# text = \"\"\"\n# ///\n# \"\"\"\n# ///\n", &meta);
  assert_string_equal(toml_string(toml_table_get(meta.document, "text"), NULL), "///\n");
  pep723_metadata_release(&meta);
}

static void test_script_untouched(void **state) {
  (void)state;
  char script[] = "# /// script\r\n# dependencies = ['a']\r\n# ///\r\nprint(1)\r\n";
  char copy[sizeof script];
  memcpy(copy, script, sizeof script);
  pep723_metadata_t meta;
  parse_ok(script, &meta);
  assert_memory_equal(script, copy, sizeof script);
  pep723_metadata_release(&meta);
  /* Also from read-only memory: a write would crash. */
  parse_ok("# /// script\n# a = 1\n# ///\n", &meta);
  pep723_metadata_release(&meta);
}

/* ---------------------------------------------------------------- metadata */

static void test_malformed_toml(void **state) {
  (void)state;
  expect_error("# /// script\n# this is not valid toml [[[\n# ///\n", CM_ERR_INVALID,
               "malformed TOML in script metadata: line 2, column 8: expected '=' after key "
               "\"this\", found 'i'");
  expect_error("x = 1\n\n# /// script\n# a = 1\n# a = 2\n# ///\n", CM_ERR_INVALID,
               "malformed TOML in script metadata: line 5, column 3: duplicate key \"a\"");
  expect_error("# /// script\n# dependencies = [\n#   'a',\n#   b\n# ]\n# ///\n", CM_ERR_INVALID,
               "malformed TOML in script metadata: line 4, column 5: invalid value b (strings "
               "must be quoted)");
}

static void test_field_errors(void **state) {
  (void)state;
  expect_error("# /// script\n#\n# dependencies = \"requests\"\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 3): dependencies must be an array of strings");
  expect_error("# /// script\n# dependencies = [\n#   \"a\",\n#   2,\n# ]\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 4): dependencies must be an array of strings");
  expect_error("# /// script\n# dependencies = [['a']]\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): dependencies must be an array of strings");
  expect_error("# /// script\n# [dependencies]\n# a = 1\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): dependencies must be an array of strings");
  expect_error("# /// script\n# requires-python = 3.11\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): requires-python must be a string");
  expect_error("# /// script\n# tool = 'uv'\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): tool must be a table");
  expect_error("# /// script\n# dependencies = [\"a\\u0000b\"]\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): a dependency contains a NUL character");
  expect_error("# /// script\n# requires-python = \">=3\\u0000\"\n# ///\n", CM_ERR_INVALID,
               "script metadata (line 2): requires-python contains a NUL character");
  /* Unknown keys are kept, not rejected. */
  pep723_metadata_t meta;
  parse_ok("# /// script\n# future-field = 1\n# ///\n", &meta);
  assert_non_null(toml_table_get(meta.document, "future-field"));
  pep723_metadata_release(&meta);
}

static void test_limits(void **state) {
  (void)state;
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_appends(&b, "# /// script\n# dependencies = [\n");
  for (int i = 0; i <= PEP723_MAX_DEPENDENCIES; i++) cm_buf_printf(&b, "#  'pkg%d',\n", i);
  cm_buf_appends(&b, "# ]\n# ///\n");
  expect_error(b.data, CM_ERR_LIMIT,
               "script metadata (line 2): 1001 dependencies, more than the limit of 1000");
  /* The TOML limits apply to the content. */
  cm_buf_reset(&b);
  cm_buf_appends(&b, "# /// script\n# a = ");
  for (int i = 0; i < 100; i++) cm_buf_appends(&b, "[");
  cm_buf_appends(&b, "\n# ///\n");
  expect_error(b.data, CM_ERR_LIMIT,
               "script metadata (line 1): line 2, column 71: nesting deeper than 64 levels");
  cm_buf_reset(&b);
  cm_buf_appends(&b, "# /// script\n");
  for (int i = 0; i < 20000; i++)
    cm_buf_appends(&b, "# ##############################################################\n");
  cm_buf_appends(&b, "# ///\n");
  pep723_metadata_t meta;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(pep723_parse_metadata(b.data, b.len, &meta, &err), -1);
  assert_int_equal(err.kind, CM_ERR_LIMIT);
  assert_non_null(strstr(err.msg, "exceeds the limit"));
  cm_error_release(&err);
  cm_buf_release(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_block),         cmocka_unit_test(test_basic_block),
      cmocka_unit_test(test_empty_blocks),     cmocka_unit_test(test_crlf),
      cmocka_unit_test(test_block_not_at_top), cmocka_unit_test(test_two_blocks),
      cmocka_unit_test(test_unclosed),         cmocka_unit_test(test_hash_without_space),
      cmocka_unit_test(test_other_types),      cmocka_unit_test(test_script_untouched),
      cmocka_unit_test(test_malformed_toml),   cmocka_unit_test(test_field_errors),
      cmocka_unit_test(test_limits),
  };
  return cmocka_run_group_tests_name("pep723", tests, NULL, NULL);
}
