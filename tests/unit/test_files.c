/* Unit tests for server/files.c: input path checks, MIME sniffing, base64, URI escaping,
 * the files argument, writing inputs and collecting outputs/ (symlinks, FIFOs, caps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "common/cm.h"
#include "server/files/files.h"

/* ---------------------------------------------------------------- paths */

static void path_ok(const char *in, const char *want) {
  cm_error_t err = CM_ERROR_INIT;
  char *got = files_check_path(in, strlen(in), &err);
  if (!got) fail_msg("'%s' refused: %s", in, cm_error_message(&err));
  if (strcmp(got, want) != 0) fail_msg("'%s' became '%s', want '%s'", in, got, want);
  free(got);
}

static void path_bad_len(const char *in, size_t len, cm_error_kind_t kind, const char *needle) {
  cm_error_t err = CM_ERROR_INIT;
  char *got = files_check_path(in, len, &err);
  if (got) fail_msg("'%s' accepted as '%s'", in, got);
  assert_int_equal(err.kind, kind);
  if (!strstr(err.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", in, err.msg, needle);
  cm_error_release(&err);
}

static void path_bad(const char *in, cm_error_kind_t kind, const char *needle) {
  path_bad_len(in, strlen(in), kind, needle);
}

static void test_paths(void **state) {
  path_ok("a", "a");
  path_ok("data/input.csv", "data/input.csv");
  path_ok("./data.csv", "data.csv");
  path_ok("a/./b", "a/b");
  path_ok("r\xc3\xa9sum\xc3\xa9.txt", "r\xc3\xa9sum\xc3\xa9.txt");
  path_ok("outputs/x", "outputs/x");
  path_ok("sub/script.py", "sub/script.py");
  path_ok("...", "...");
  path_ok("..a", "..a");
  path_bad("", CM_ERR_INVALID, "empty");
  path_bad("/etc/passwd", CM_ERR_INVALID, "absolute");
  path_bad("..", CM_ERR_INVALID, "'..'");
  path_bad("../x", CM_ERR_INVALID, "'..'");
  path_bad("a/../../x", CM_ERR_INVALID, "'..'");
  path_bad("a/..", CM_ERR_INVALID, "'..'");
  path_bad("a//b", CM_ERR_INVALID, "empty component");
  path_bad("a/", CM_ERR_INVALID, "empty component");
  path_bad(".", CM_ERR_INVALID, "working directory itself");
  path_bad("./.", CM_ERR_INVALID, "working directory itself");
  path_bad("script.py", CM_ERR_INVALID, "script itself");
  path_bad("./script.py", CM_ERR_INVALID, "script itself");
  path_bad("a\\b", CM_ERR_INVALID, "backslash");
  path_bad("a\nb", CM_ERR_INVALID, "control character");
  path_bad("a\x7f", CM_ERR_INVALID, "control character");
  path_bad("\xff\xfe", CM_ERR_INVALID, "UTF-8");
  path_bad("\xc0\xaf", CM_ERR_INVALID, "UTF-8"); /* overlong '/' */
  path_bad_len("a\0b", 3, CM_ERR_INVALID, "NUL");
  path_bad_len("a\0", 2, CM_ERR_INVALID, "NUL");
  char name[300];
  memset(name, 'n', 256);
  name[256] = '\0';
  path_bad(name, CM_ERR_LIMIT, "255 bytes");
  name[255] = '\0';
  path_ok(name, name);
  char deep[128] = "";
  for (int i = 0; i < 16; i++) strcat(deep, "d/");
  strcat(deep, "f");
  path_bad(deep, CM_ERR_LIMIT, "16 directories");
  deep[strlen(deep) - 4] = '\0'; /* 15 directories and a file */
  strcat(deep, "f");
  path_ok(deep, deep);
  char *longest = xmalloc(FILES_MAX_PATH_BYTES + 2);
  memset(longest, 'a', FILES_MAX_PATH_BYTES + 1);
  for (int i = 200; i < FILES_MAX_PATH_BYTES; i += 200) longest[i] = '/';
  longest[FILES_MAX_PATH_BYTES + 1] = '\0';
  path_bad(longest, CM_ERR_LIMIT, "longer than");
  free(longest);
}

/* ---------------------------------------------------------------- sniffing */

static void sniff(const char *data, size_t len, const char *name, const char *want) {
  const char *got = files_sniff_mime(data, len, name, files_is_text(data, len));
  if (strcmp(got, want) != 0) fail_msg("%s: got %s, want %s", name ? name : "(null)", got, want);
}

static void test_sniffing(void **state) {
  static const char png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
  sniff(png, sizeof png - 1, "x.txt", "image/png");
  sniff("\xff\xd8\xff\xe0\0\x10JFIF", 10, NULL, "image/jpeg");
  sniff("GIF89a\x01\0\x01\0", 10, "a.png", "image/gif");
  sniff("GIF87a", 6, "a", "image/gif");
  sniff("RIFF\x10\0\0\0WEBPVP8 ", 16, "a", "image/webp");
  sniff("RIFF\x10\0\0\0WAVEfmt ", 16, "a.webp", "application/octet-stream");
  const char *svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"/>";
  sniff(svg, strlen(svg), "a.txt", "image/svg+xml");
  const char *svg2 =
      "\xef\xbb\xbf<?xml version=\"1.0\"?>\n<!-- made by hand -->\n<!DOCTYPE svg PUBLIC \"x\">\n"
      "<svg width=\"1\">";
  sniff(svg2, strlen(svg2), NULL, "image/svg+xml");
  sniff("<svg", 4, NULL, "image/svg+xml");
  sniff("<svgx>", 6, "a.svg", "text/plain");
  sniff("<html><svg>", 11, "a.html", "text/html");
  sniff("<?xml version=\"1.0\"", 19, "a.xml", "application/xml");
  sniff("<!-- never closed <svg>", 23, NULL, "text/plain");
  sniff("a,b\n1,2\n", 8, "data.CSV", "text/csv");
  sniff("{}", 2, "x.json", "application/json");
  sniff("hello", 5, "README", "text/plain");
  sniff("hello", 5, ".hidden", "text/plain");
  sniff("hello", 5, "dir.d/file", "text/plain");
  sniff("%PDF-1.7\n\xe2\xe3", 11, "a.bin", "application/pdf");
  sniff("PK\x03\x04\0\0", 6, "a", "application/zip");
  sniff("\x1f\x8b\x08\0", 4, "a", "application/gzip");
  sniff("a\0b", 3, "a.txt", "application/octet-stream");
  sniff("\xff\xfe", 2, "a.txt", "application/octet-stream");
  sniff("", 0, "empty.txt", "text/plain");
  assert_null(files_sniff_image("", 0));
  assert_null(files_sniff_image("\x89PNG", 4));
  assert_true(files_is_text("", 0));
  assert_false(files_is_text("a\0", 2));
}

/* ---------------------------------------------------------------- base64 */

static void b64_roundtrip(const char *data, size_t len, const char *want) {
  size_t n;
  char *enc = files_base64_encode(data, len, &n);
  assert_string_equal(enc, want);
  assert_int_equal(n, strlen(want));
  char *dec;
  size_t dec_len;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(files_base64_decode(enc, n, len, &dec, &dec_len, &err), 0);
  assert_int_equal(dec_len, len);
  assert_memory_equal(dec, data, len);
  free(enc);
  free(dec);
}

static void b64_bad(const char *in, size_t max, cm_error_kind_t kind) {
  char *out = (char *)1;
  size_t len = 7;
  cm_error_t err = CM_ERROR_INIT;
  if (files_base64_decode(in, strlen(in), max, &out, &len, &err) == 0)
    fail_msg("'%s' decoded (%zu bytes)", in, len);
  assert_null(out);
  assert_int_equal(err.kind, kind);
  cm_error_release(&err);
}

static void test_base64(void **state) {
  b64_roundtrip("", 0, "");
  b64_roundtrip("f", 1, "Zg==");
  b64_roundtrip("fo", 2, "Zm8=");
  b64_roundtrip("foo", 3, "Zm9v");
  b64_roundtrip("foob", 4, "Zm9vYg==");
  b64_roundtrip("\0\xff\x10", 3, "AP8Q");
  char *out;
  size_t len;
  cm_error_t err = CM_ERROR_INIT;
  /* Whitespace and missing padding are fine. */
  assert_int_equal(files_base64_decode(" Zm9v\nYg ", 9, 100, &out, &len, &err), 0);
  assert_int_equal(len, 4);
  assert_memory_equal(out, "foob", 4);
  free(out);
  assert_int_equal(files_base64_decode("Zm8", 3, 2, &out, &len, &err), 0);
  assert_memory_equal(out, "fo", 2);
  free(out);
  b64_bad("!!!!", 100, CM_ERR_INVALID);
  b64_bad("Zm9v-", 100, CM_ERR_INVALID);
  b64_bad("QUJD=A", 100, CM_ERR_INVALID);
  b64_bad("Z", 100, CM_ERR_INVALID);
  b64_bad("Zm9vY", 100, CM_ERR_INVALID);
  b64_bad("Zg===", 100, CM_ERR_INVALID);
  b64_bad("Zm8==", 100, CM_ERR_INVALID);
  b64_bad("Zm9vYg==", 3, CM_ERR_LIMIT);
}

static void test_uri_escape(void **state) {
  const char *in = "outputs/a b/%#?\xc3\xa9.txt";
  char *e = files_uri_escape(in, strlen(in));
  assert_string_equal(e, "outputs/a%20b/%25%23%3F%C3%A9.txt");
  free(e);
  e = files_uri_escape("A-z_0.9~", 8);
  assert_string_equal(e, "A-z_0.9~");
  free(e);
}

/* ---------------------------------------------------------------- the files argument */

static srv_config_t test_config(void) {
  srv_config_t c;
  srv_config_defaults(&c);
  c.max_input_files = 3;
  c.max_input_file_bytes = 8;
  c.max_input_bytes = 12;
  return c;
}

static void parse_bad(const char *json, const char *needle) {
  srv_config_t cfg = test_config();
  json_error_t jerr;
  json_t *files = json_loads(json, JSON_DECODE_ANY, &jerr);
  if (!files) fail_msg("bad test JSON %s: %s", json, jerr.text);
  files_inputs_t in;
  cm_error_t err = CM_ERROR_INIT;
  if (files_inputs_parse(files, &cfg, &in, &err) == 0) fail_msg("%s accepted", json);
  assert_null(in.v);
  assert_int_equal(in.n, 0);
  if (!strstr(err.msg, needle)) fail_msg("%s: '%s' lacks '%s'", json, err.msg, needle);
  cm_error_release(&err);
  json_decref(files);
  srv_config_release(&cfg);
}

static void test_inputs_parse(void **state) {
  srv_config_t cfg = test_config();
  json_t *files = json_loads(
      "[{\"path\": \"a/b.txt\", \"content\": \"h\\u00e9\"},"
      " {\"path\": \"./c\", \"content\": \"AAE=\", \"encoding\": \"base64\"},"
      " {\"path\": \"d\", \"content\": \"\", \"encoding\": null}]",
      0, NULL);
  files_inputs_t in;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(files_inputs_parse(files, &cfg, &in, &err), 0);
  assert_int_equal(in.n, 3);
  assert_string_equal(in.v[0].path, "a/b.txt");
  assert_int_equal(in.v[0].len, 3);
  assert_string_equal(in.v[1].path, "c");
  assert_int_equal(in.v[1].len, 2);
  assert_memory_equal(in.v[1].data, "\0\1", 2);
  assert_int_equal(in.v[2].len, 0);
  files_inputs_release(&in);
  json_decref(files);
  assert_int_equal(files_inputs_parse(NULL, &cfg, &in, &err), 0);
  assert_int_equal(in.n, 0);
  json_t *null = json_null();
  assert_int_equal(files_inputs_parse(null, &cfg, &in, &err), 0);
  srv_config_release(&cfg);

  parse_bad("{}", "must be a list");
  parse_bad("[1]", "must be an object");
  parse_bad("[{}]", "path must be a string");
  parse_bad("[{\"path\": \"x\"}]", "content must be a string");
  parse_bad("[{\"path\": \"x\", \"content\": \"\", \"mode\": 1}]", "unknown key 'mode'");
  parse_bad("[{\"path\": \"../x\", \"content\": \"\"}]", "files[0].path '../x' contains '..'");
  parse_bad("[{\"path\": \"x\", \"content\": \"\"}, {\"path\": \"./x\", \"content\": \"\"}]",
            "files[0] and files[1] both write 'x'");
  parse_bad("[{\"path\": \"x\", \"content\": \"\", \"encoding\": \"hex\"}]", "encoding must be");
  parse_bad("[{\"path\": \"x\", \"content\": \"@@\", \"encoding\": \"base64\"}]",
            "is not valid base64");
  parse_bad("[{\"path\": \"x\", \"content\": \"123456789\"}]", "too large: 9 bytes");
  parse_bad("[{\"path\": \"x\", \"content\": \"MTIzNDU2Nzg5\", \"encoding\": \"base64\"}]",
            "too large");
  parse_bad(
      "[{\"path\": \"x\", \"content\": \"12345678\"}, {\"path\": \"y\", \"content\": \"12345\"}]",
      "12 bytes for all files");
  parse_bad(
      "[{\"path\":\"a\",\"content\":\"\"},{\"path\":\"b\",\"content\":\"\"},"
      "{\"path\":\"c\",\"content\":\"\"},{\"path\":\"d\",\"content\":\"\"}]",
      "At most 3 input files");
}

/* ---------------------------------------------------------------- the file system */

static char *make_tmpdir(void) {
  char *d = xstrdup("/tmp/mps-test-files-XXXXXX");
  if (!mkdtemp(d)) fail_msg("mkdtemp: %s", strerror(errno));
  return d;
}

static void rm_tree(char *dir) {
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(dir, &err);
  cm_error_release(&err);
  free(dir);
}

static void write_at(const char *dir, const char *rel, const char *data, size_t len) {
  char *p = xasprintf("%s/%s", dir, rel);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_write_file(p, data, len, 0644, &err) < 0) fail_msg("%s", cm_error_message(&err));
  free(p);
}

static void mkdir_at(const char *dir, const char *rel) {
  char *p = xasprintf("%s/%s", dir, rel);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(p, 0755, &err) < 0) fail_msg("%s", cm_error_message(&err));
  free(p);
}

static void symlink_at(const char *target, const char *dir, const char *rel) {
  char *p = xasprintf("%s/%s", dir, rel);
  if (symlink(target, p) < 0) fail_msg("symlink %s: %s", p, strerror(errno));
  free(p);
}

static void test_write_inputs(void **state) {
  char *dir = make_tmpdir();
  char *outside = make_tmpdir();
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  files_input_t v[] = {
      {.path = "a/b/c.txt", .data = "abc", .len = 3},
      {.path = "a/d.bin", .data = "\0\1", .len = 2},
  };
  files_inputs_t in = {.v = v, .n = 2};
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(files_write_inputs(fd, &in, &err), 0);
  char *p = xasprintf("%s/a/b/c.txt", dir);
  char *data;
  size_t len;
  assert_int_equal(cm_read_file(p, 100, &data, &len, &err), 0);
  assert_int_equal(len, 3);
  free(data);
  free(p);
  /* Already there: never replaced. */
  assert_int_equal(files_write_inputs(fd, &in, &err), -1);
  cm_error_release(&err);
  /* A file where a directory is needed. */
  files_input_t clash[] = {{.path = "a/d.bin/x", .data = "", .len = 0}};
  files_inputs_t in2 = {.v = clash, .n = 1};
  assert_int_equal(files_write_inputs(fd, &in2, &err), -1);
  assert_non_null(strstr(err.msg, "not a directory"));
  cm_error_release(&err);
  /* A symlinked directory or file is never followed. */
  symlink_at(outside, dir, "link");
  files_input_t through[] = {{.path = "link/x", .data = "x", .len = 1}};
  files_inputs_t in3 = {.v = through, .n = 1};
  assert_int_equal(files_write_inputs(fd, &in3, &err), -1);
  cm_error_release(&err);
  char *leaked = xasprintf("%s/target", outside);
  symlink_at(leaked, dir, "flink");
  files_input_t onto[] = {{.path = "flink", .data = "x", .len = 1}};
  files_inputs_t in4 = {.v = onto, .n = 1};
  assert_int_equal(files_write_inputs(fd, &in4, &err), -1);
  cm_error_release(&err);
  struct stat st;
  assert_int_equal(lstat(leaked, &st), -1);
  char *leaked2 = xasprintf("%s/x", outside);
  assert_int_equal(lstat(leaked2, &st), -1);
  free(leaked);
  free(leaked2);
  close(fd);
  rm_tree(dir);
  rm_tree(outside);
}

static files_collect_limits_t limits(void) {
  return (files_collect_limits_t){
      .max_entries = 100,
      .max_bytes = 1 << 20,
      .inline_bytes = 1024,
      .inline_text_bytes = 64,
      .inline_total = 4096,
      .max_depth = 3,
  };
}

static const files_output_t *find_out(const files_collection_t *c, const char *path) {
  for (size_t i = 0; i < c->n; i++)
    if (strcmp(c->v[i].path, path) == 0) return &c->v[i];
  fail_msg("%s not collected", path);
  return NULL;
}

static void test_collect(void **state) {
  char *dir = make_tmpdir();
  char *dest = xasprintf("%s/store", dir);
  mkdir_at(dir, "outputs/sub/a/b/c");
  static const char png[] = "\x89PNG\r\n\x1a\n0123456789";
  write_at(dir, "outputs/p.bin", png, sizeof png - 1);
  write_at(dir, "outputs/t.txt", "text", 4);
  write_at(dir, "outputs/long.txt",
           "0123456789012345678901234567890123456789012345678901234567890123456789", 70);
  write_at(dir, "outputs/bin", "\0\1\2", 3);
  write_at(dir, "outputs/sub/a/b/c/deep.txt", "x", 1);
  write_at(dir, "outputs/sub/a/ok.txt", "y", 1);
  write_at(dir, "secret", "s", 1);
  symlink_at("../secret", dir, "outputs/link");
  symlink_at("/etc", dir, "outputs/dirlink");
  char *fifo = xasprintf("%s/outputs/fifo", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  free(fifo);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  files_collect_limits_t lim = limits();
  files_collection_t c;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(files_collect(fd, dest, &lim, &c, &err), 0);
  assert_null(c.note);
  assert_int_equal(find_out(&c, "outputs/p.bin")->how, FILES_IMAGE);
  assert_string_equal(find_out(&c, "outputs/p.bin")->mime, "image/png");
  assert_memory_equal(find_out(&c, "outputs/p.bin")->data, png, sizeof png - 1);
  assert_int_equal(find_out(&c, "outputs/t.txt")->how, FILES_RESOURCE);
  assert_int_equal(find_out(&c, "outputs/long.txt")->how, FILES_RESOURCE_LINK);
  assert_int_equal(find_out(&c, "outputs/bin")->how, FILES_RESOURCE_LINK);
  assert_int_equal(find_out(&c, "outputs/link")->how, FILES_SKIPPED);
  assert_int_equal(find_out(&c, "outputs/dirlink")->how, FILES_SKIPPED);
  assert_non_null(strstr(find_out(&c, "outputs/fifo")->reason, "FIFO"));
  assert_int_equal(find_out(&c, "outputs/sub/a/ok.txt")->how, FILES_RESOURCE);
  assert_non_null(strstr(find_out(&c, "outputs/sub/a/b/c")->reason, "levels"));
  assert_int_equal(c.stored_files, 5);
  char *copy = xasprintf("%s/%s", dest, find_out(&c, "outputs/p.bin")->stored);
  char *data;
  size_t len;
  assert_int_equal(cm_read_file(copy, 100, &data, &len, &err), 0);
  assert_memory_equal(data, png, sizeof png - 1);
  free(data);
  struct stat st;
  assert_int_equal(stat(dest, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  free(copy);
  /* The result: content blocks and structuredContent. */
  for (size_t i = 0; i < c.n; i++)
    if (c.v[i].stored) c.v[i].uri = xasprintf("sandbox://runs/x/%s", c.v[i].path);
  json_t *content = json_array();
  json_t *sc = json_object();
  cm_buf_t text;
  cm_buf_init(&text, 0);
  files_result_append(&c, &text, content, sc);
  assert_int_equal(json_array_size(json_object_get(sc, "files")), c.n);
  assert_int_equal(json_array_size(content), 5);
  assert_non_null(strstr(text.data, "--- skipped: outputs/link: a symbolic link"));
  cm_buf_release(&text);
  json_decref(content);
  json_decref(sc);
  files_collection_release(&c);
  close(fd);
  free(dest);
  rm_tree(dir);
}

static void test_collect_caps(void **state) {
  char *dir = make_tmpdir();
  char *dest = xasprintf("%s/store", dir);
  mkdir_at(dir, "outputs");
  for (int i = 0; i < 500; i++) {
    char name[32];
    snprintf(name, sizeof name, "outputs/%03d", i);
    write_at(dir, name, "x", 1);
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  files_collect_limits_t lim = limits();
  lim.max_entries = 10;
  files_collection_t c;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(files_collect(fd, dest, &lim, &c, &err), 0);
  assert_int_equal(c.n, 10);
  assert_non_null(c.note);
  assert_non_null(strstr(c.note, "more than 10 entries"));
  files_collection_release(&c);
  /* The byte budget: files that do not fit are skipped, smaller ones still come. */
  char *budget = make_tmpdir();
  mkdir_at(budget, "outputs");
  char *big = xmalloc(3000);
  memset(big, 'b', 3000);
  write_at(budget, "outputs/0", big, 3000);
  write_at(budget, "outputs/1", "x", 1);
  write_at(budget, "outputs/2", "y", 1);
  free(big);
  lim.max_bytes = 2;
  char *dest2 = xasprintf("%s/store", budget);
  int bfd = open(budget, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  assert_int_equal(files_collect(bfd, dest2, &lim, &c, &err), 0);
  close(bfd);
  rm_tree(budget);
  assert_int_equal(c.n, 3);
  assert_int_equal(c.v[0].how, FILES_SKIPPED);
  assert_non_null(strstr(c.v[0].reason, "budget"));
  assert_int_equal(c.v[1].how, FILES_RESOURCE);
  assert_int_equal(c.v[2].how, FILES_RESOURCE);
  assert_int_equal(c.stored_bytes, 2);
  files_collection_release(&c);
  free(dest2);
  /* No outputs/: nothing, no store directory. */
  char *empty = make_tmpdir();
  int efd = open(empty, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  char *dest3 = xasprintf("%s/store", empty);
  assert_int_equal(files_collect(efd, dest3, &lim, &c, &err), 0);
  assert_int_equal(c.n, 0);
  struct stat st;
  assert_int_equal(stat(dest3, &st), -1);
  files_collection_release(&c);
  /* An empty outputs/ (and an empty directory inside it): nothing, no store directory. */
  mkdir_at(empty, "outputs/sub");
  assert_int_equal(files_collect(efd, dest3, &lim, &c, &err), 0);
  assert_int_equal(c.n, 0);
  assert_null(c.note);
  assert_int_equal(stat(dest3, &st), -1);
  files_collection_release(&c);
  char *sub = xasprintf("%s/outputs/sub", empty), *outputs = xasprintf("%s/outputs", empty);
  assert_int_equal(rmdir(sub), 0);
  assert_int_equal(rmdir(outputs), 0);
  free(sub);
  free(outputs);
  /* outputs/ itself a symlink. */
  symlink_at(dir, empty, "outputs");
  assert_int_equal(files_collect(efd, dest3, &lim, &c, &err), 0);
  assert_int_equal(c.n, 1);
  assert_int_equal(c.v[0].how, FILES_SKIPPED);
  files_collection_release(&c);
  close(efd);
  free(dest3);
  rm_tree(empty);
  close(fd);
  free(dest);
  rm_tree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths),        cmocka_unit_test(test_sniffing),
      cmocka_unit_test(test_base64),       cmocka_unit_test(test_uri_escape),
      cmocka_unit_test(test_inputs_parse), cmocka_unit_test(test_write_inputs),
      cmocka_unit_test(test_collect),      cmocka_unit_test(test_collect_caps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
