/* Unit tests for transport/stdio.c's framing: a long line that arrives in many reads is
 * searched for its end once (linear in its bytes), not from its start at every read. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/transport-internal.h"

typedef struct seen {
  size_t messages, bytes, last_len;
  bool all_x;
} seen_t;

static void on_message(void *data, const char *buf, size_t len, tr_sink_t *reply) {
  seen_t *s = data;
  s->messages++;
  s->bytes += len;
  s->last_len = len;
  for (size_t i = 0; i < len; i++)
    if (buf[i] != 'x') s->all_x = false;
}

static void on_oversize(void *data, size_t len, tr_sink_t *reply) {
  fail_msg("a line within the limit was called oversize (%zu bytes)", len);
}

static void on_eof(void *data) {}

/* Writes total bytes of 'x' (then one newline) into the pipe in pieces of `piece`, running the
 * loop between them so that the transport reads each as it comes. */
static void feed(cm_loop_t *loop, int wfd, size_t total, size_t piece) {
  char *buf = malloc(piece);
  memset(buf, 'x', piece);
  size_t sent = 0;
  cm_error_t err = CM_ERROR_INIT;
  while (sent < total) {
    size_t n = total - sent < piece ? total - sent : piece;
    ssize_t w = write(wfd, buf, n);
    if (w > 0) sent += (size_t)w;
    assert_int_equal(cm_loop_run_once(loop, w > 0 ? 0 : 50, &err), 0);
  }
  while (write(wfd, "\n", 1) != 1) assert_int_equal(cm_loop_run_once(loop, 50, &err), 0);
  for (int i = 0; i < 20; i++) assert_int_equal(cm_loop_run_once(loop, 10, &err), 0);
  free(buf);
}

static void long_line_is_searched_once(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  assert_non_null(loop);
  int in[2];
  assert_int_equal(pipe2(in, O_CLOEXEC), 0);
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  int out = open("/dev/null", O_WRONLY | O_CLOEXEC);
  seen_t seen = {.all_x = true};
  tr_stdio_callbacks_t cbs = {
      .on_message = on_message, .on_oversize = on_oversize, .on_eof = on_eof};
  tr_stdio_t *t = tr_stdio_new(loop, in[0], out, 64u << 20, &cbs, &seen, &err);
  assert_non_null(t);
  const size_t total = 8u << 20;
  feed(loop, in[1], total, 4096); /* 2,048 pieces at least: one read each, or a few */
  assert_int_equal(seen.messages, 1);
  assert_int_equal(seen.last_len, total);
  assert_true(seen.all_x);
  /* Every byte once, and the newline: searching from the line's start at every read would
   * be about total * pieces / 2 (gigabytes). */
  assert_true(tr_stdio_bytes_searched(t) <= total + 1);
  /* A second line after it starts from zero again. */
  feed(loop, in[1], 100000, 4096);
  assert_int_equal(seen.messages, 2);
  assert_int_equal(seen.last_len, 100000);
  assert_true(tr_stdio_bytes_searched(t) <= total + 1 + 100000 + 1);
  tr_stdio_free(t);
  close(in[1]);
  close(out);
  cm_loop_free(loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(long_line_is_searched_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
