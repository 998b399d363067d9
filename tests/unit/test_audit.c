/* Unit tests for server/audit/: lines, rotation, reopening after logrotate, oversize records,
 * files that are not regular. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/audit/audit.h"

static char dir[64];

static int setup(void **state) {
  strcpy(dir, "/tmp/mps-audit-test.XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static char *path_of(const char *name) {
  return xasprintf("%s/%s", dir, name);
}

static json_t *read_lines(const char *path) {
  char *text = NULL;
  size_t len = 0;
  cm_error_t err = CM_ERROR_INIT;
  json_t *out = json_array();
  if (cm_read_file(path, 1u << 24, &text, &len, &err) < 0) {
    cm_error_release(&err);
    return out;
  }
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    json_t *j = json_loads(line, 0, NULL);
    assert_non_null(j);
    json_array_append_new(out, j);
  }
  free(text);
  return out;
}

static void write_event(srv_audit_t *a, const char *event, int n) {
  json_t *r = json_pack("{s:s, s:i, s:s}", "event", event, "n", n, "principal", "alice");
  srv_audit_write(a, r);
  json_decref(r);
}

static void test_lines_in_order_with_time_first(void **state) {
  cleanup_free char *p = path_of("audit.log");
  cm_error_t err = CM_ERROR_INIT;
  srv_audit_t *a = srv_audit_open(p, 0, 1, &err);
  assert_non_null(a);
  for (int i = 0; i < 100; i++) write_event(a, "tool_call", i);
  srv_audit_close(a, 5000);
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  json_t *lines = read_lines(p);
  assert_int_equal(json_array_size(lines), 100);
  for (size_t i = 0; i < 100; i++) {
    json_t *l = json_array_get(lines, i);
    assert_int_equal(json_integer_value(json_object_get(l, "n")), (json_int_t)i);
    assert_string_equal(json_object_iter_key(json_object_iter(l)), "time");
    const char *t = json_string_value(json_object_get(l, "time"));
    assert_int_equal(strlen(t), strlen("2026-12-01T15:00:00.000Z"));
    assert_int_equal(t[strlen(t) - 1], 'Z');
  }
  json_decref(lines);
  assert_int_equal(srv_audit_dropped(NULL), 0);
  /* A NULL log takes writes and does nothing. */
  json_t *o = json_object();
  srv_audit_write(NULL, o);
  json_decref(o);
  srv_audit_close(NULL, 0);
}

static void test_rotation_by_size_keeps_n(void **state) {
  cleanup_free char *p = path_of("rot.log");
  cm_error_t err = CM_ERROR_INIT;
  srv_audit_t *a = srv_audit_open(p, 300, 2, &err);
  assert_non_null(a);
  cleanup_free char *p1 = xasprintf("%s.1", p);
  cleanup_free char *p2 = xasprintf("%s.2", p);
  cleanup_free char *p3 = xasprintf("%s.3", p);
  /* Several batches, so several rotations: until the second rotation is there (the writer
   * batches what it finds, so a loaded machine needs more lines), then as many again. */
  int n = 0, more = -1;
  for (; n < 20000 && more != 0; n++) {
    write_event(a, "tool_call", n);
    if (n % 5 == 0) usleep(2000);
    if (more < 0 && n >= 59 && access(p2, F_OK) == 0) more = 60;
    if (more > 0) more--;
  }
  srv_audit_close(a, 5000);
  assert_int_equal(access(p1, F_OK), 0);
  assert_int_equal(access(p2, F_OK), 0);
  assert_int_equal(access(p3, F_OK), -1);
  /* The newest line is in the live file (or, just rotated, at the end of .1). */
  json_t *live = read_lines(p), *one = read_lines(p1);
  json_t *last = json_array_size(live) ? json_array_get(live, json_array_size(live) - 1)
                                       : json_array_get(one, json_array_size(one) - 1);
  assert_int_equal(json_integer_value(json_object_get(last, "n")), n - 1);
  json_decref(live);
  json_decref(one);
}

static void test_reopen_after_logrotate(void **state) {
  cleanup_free char *p = path_of("re.log");
  cleanup_free char *moved = path_of("re.log.moved");
  cm_error_t err = CM_ERROR_INIT;
  srv_audit_t *a = srv_audit_open(p, 0, 1, &err);
  assert_non_null(a);
  write_event(a, "before", 0);
  /* Let the writer take it before the file moves. */
  for (int i = 0; i < 400; i++) {
    struct stat st;
    if (stat(p, &st) == 0 && st.st_size > 0) break;
    usleep(5000);
  }
  assert_int_equal(rename(p, moved), 0);
  srv_audit_reopen(a);
  write_event(a, "after", 1);
  srv_audit_close(a, 5000);
  json_t *old = read_lines(moved), *now = read_lines(p);
  assert_int_equal(json_array_size(old), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(old, 0), "event")),
                      "before");
  assert_int_equal(json_array_size(now), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(now, 0), "event")), "after");
  json_decref(old);
  json_decref(now);
}

static void test_oversize_record_is_a_note(void **state) {
  cleanup_free char *p = path_of("big.log");
  cm_error_t err = CM_ERROR_INIT;
  srv_audit_t *a = srv_audit_open(p, 0, 1, &err);
  assert_non_null(a);
  char *big = xmalloc(SRV_AUDIT_LINE_MAX + 10);
  memset(big, 'x', SRV_AUDIT_LINE_MAX + 9);
  big[SRV_AUDIT_LINE_MAX + 9] = '\0';
  json_t *r = json_pack("{s:s, s:s, s:s, s:i}", "event", "tool_call", "blob", big, "principal",
                        "alice", "exit_code", 3);
  srv_audit_write(a, r);
  json_decref(r);
  free(big);
  srv_audit_close(a, 5000);
  json_t *lines = read_lines(p);
  assert_int_equal(json_array_size(lines), 1);
  json_t *l = json_array_get(lines, 0);
  assert_string_equal(json_string_value(json_object_get(l, "event")), "tool_call");
  assert_string_equal(json_string_value(json_object_get(l, "error")), "record too large");
  assert_true(json_integer_value(json_object_get(l, "bytes")) > SRV_AUDIT_LINE_MAX);
  /* Who and how stay; the blob goes, named. */
  assert_string_equal(json_string_value(json_object_get(l, "principal")), "alice");
  assert_int_equal(json_integer_value(json_object_get(l, "exit_code")), 3);
  assert_null(json_object_get(l, "blob"));
  assert_string_equal(json_string_value(json_array_get(json_object_get(l, "omitted"), 0)), "blob");
  json_decref(lines);
}

static void test_refuses_what_is_not_a_regular_file(void **state) {
  cleanup_free char *fifo = path_of("fifo");
  cleanup_free char *link = path_of("link");
  cleanup_free char *target = path_of("target");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(symlink(target, link), 0);
  cm_error_t err = CM_ERROR_INIT;
  /* A FIFO without a reader: refused at once, never waited on. */
  assert_null(srv_audit_open(fifo, 0, 1, &err));
  assert_non_null(strstr(cm_error_message(&err), "not a regular file"));
  cm_error_release(&err);
  assert_null(srv_audit_open(link, 0, 1, &err));
  cm_error_release(&err);
  assert_int_equal(access(target, F_OK), -1);
  assert_null(srv_audit_open("/nonexistent-dir/audit.log", 0, 1, &err));
  cm_error_release(&err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lines_in_order_with_time_first, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rotation_by_size_keeps_n, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reopen_after_logrotate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversize_record_is_a_note, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refuses_what_is_not_a_regular_file, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
