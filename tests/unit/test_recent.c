/* Unit tests for the recent calls of each principal (server/core/recent.c): newest first,
 * a ring per principal, a bounded number of principals (the least recent caller's goes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/core/core-internal.h"

static const char *outcome_of(json_t *list, size_t i) {
  return json_string_value(json_object_get(json_array_get(list, i), "outcome"));
}

static void test_ring_and_order(void **state) {
  srv_server_t s = {0};
  json_t *l = srv_recent_json(&s, "alice");
  assert_int_equal(json_array_size(l), 0);
  json_decref(l);
  srv_recent_note(&s, "alice", "execute_python", "ok", NULL, 12);
  srv_recent_note(&s, "alice", "execute_python", "limit", "timeout", 3000);
  srv_recent_note(&s, NULL, "validate_script", "ok", NULL, 1);
  l = srv_recent_json(&s, "alice");
  assert_int_equal(json_array_size(l), 2);
  assert_string_equal(outcome_of(l, 0), "limit");
  assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "limit")), "timeout");
  assert_int_equal(json_integer_value(json_object_get(json_array_get(l, 0), "duration_ms")), 3000);
  assert_string_equal(outcome_of(l, 1), "ok");
  assert_null(json_object_get(json_array_get(l, 1), "limit"));
  json_decref(l);
  /* A call without a principal (stdio's session) is stdio's. */
  l = srv_recent_json(&s, SRV_PRINCIPAL_STDIO);
  assert_int_equal(json_array_size(l), 1);
  json_decref(l);
  for (int i = 0; i < 3 * SRV_RECENT_PER_PRINCIPAL; i++)
    srv_recent_note(&s, "alice", "execute_python", i % 2 ? "error" : "cancelled", NULL, i);
  l = srv_recent_json(&s, "alice");
  assert_int_equal(json_array_size(l), SRV_RECENT_PER_PRINCIPAL);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(l, 0), "duration_ms")),
                   3 * SRV_RECENT_PER_PRINCIPAL - 1);
  json_decref(l);
  srv_recent_free(&s);
  assert_null(s.recent);
}

static void test_bounded_principals(void **state) {
  srv_server_t s = {0};
  char name[32];
  for (int i = 0; i < SRV_RECENT_PRINCIPALS + 5; i++) {
    snprintf(name, sizeof name, "p%d", i);
    srv_recent_note(&s, name, "execute_python", "ok", NULL, 1);
  }
  /* The five first callers made room for the last ones, whose lists start empty; the rest
   * keep theirs. */
  for (int i = 0; i < SRV_RECENT_PRINCIPALS + 5; i++) {
    snprintf(name, sizeof name, "p%d", i);
    json_t *l = srv_recent_json(&s, name);
    assert_int_equal(json_array_size(l), i < 5 ? 0 : 1);
    json_decref(l);
  }
  srv_recent_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_and_order),
      cmocka_unit_test(test_bounded_principals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
