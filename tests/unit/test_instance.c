/* sandbox/instance.c: a server instance's random id, its uid block and its ownership records.
 * Other instances are child processes on the same state directory: one that lives holds its
 * record and its block (never provably gone, never sharing the block), one that ended is
 * provably gone, a record of another boot is gone, and what has no record is not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"

static char state[] = "/tmp/mps-test-instance-XXXXXX";

typedef struct other {
  pid_t pid;
  int release; /* write end: closing it ends the other instance */
  char id[SBX_INSTANCE_ID_LEN + 1];
  unsigned block;
} other_t;

static const char *self_exe;

/* Another instance on the same state directory: this program again (a fresh process, as a
 * server is), until released. */
static void other_start(other_t *o) {
  int up[2], down[2];
  assert_int_equal(pipe2(up, O_CLOEXEC), 0);
  assert_int_equal(pipe2(down, O_CLOEXEC), 0);
  o->pid = fork();
  assert_true(o->pid >= 0);
  if (o->pid == 0) {
    dup2(down[0], 0);
    dup2(up[1], 1);
    execl(self_exe, self_exe, "--other", state, (char *)NULL);
    _exit(127);
  }
  close(up[1]);
  close(down[0]);
  o->release = down[1];
  char line[64] = {0};
  ssize_t n = read(up[0], line, sizeof line - 1);
  close(up[0]);
  assert_true(n > 0);
  assert_int_equal(sscanf(line, "%16s %u", o->id, &o->block), 2);
}

/* The other instance's side: its id and block on stdout, then it waits for stdin to close
 * and ends without closing (as a crash: the record stays, its lock goes). */
static int other_main(const char *dir) {
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_instance_open(dir, &err) < 0) return 1;
  printf("%s %u\n", sbx_instance_id(), sbx_instance_uid_block());
  fflush(stdout);
  char c;
  if (read(0, &c, 1) < 0) return 1;
  _exit(0);
}

static void other_end(other_t *o) {
  close(o->release);
  int status;
  assert_int_equal(waitpid(o->pid, &status, 0), o->pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int setup(void **st) {
  (void)st;
  if (!mkdtemp(state)) return -1;
  cm_error_t err = CM_ERROR_INIT;
  return sbx_instance_open(state, &err);
}

static int teardown(void **st) {
  (void)st;
  sbx_instance_close();
  cleanup_free char *cmd = xasprintf("rm -rf %s", state);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_id_and_block(void **st) {
  (void)st;
  const char *id = sbx_instance_id();
  assert_true(sbx_instance_id_valid(id));
  unsigned count;
  uid_t first = sbx_uid_block(&count);
  assert_int_equal(count, 4096);
  assert_int_equal(first, 2000000000u + sbx_instance_uid_block() * 4096u);
  /* Our own record, and never gone to ourselves. */
  cleanup_free char *record = xasprintf("%s/instances/%s", state, id);
  assert_int_equal(access(record, R_OK), 0);
  assert_false(sbx_instance_gone(id));
}

static void test_a_live_instance_is_not_gone_and_shares_no_block(void **st) {
  (void)st;
  other_t o[4];
  for (size_t i = 0; i < 4; i++) {
    other_start(&o[i]);
    assert_string_not_equal(o[i].id, sbx_instance_id());
    assert_int_not_equal(o[i].block, sbx_instance_uid_block());
    for (size_t k = 0; k < i; k++) assert_int_not_equal(o[i].block, o[k].block);
    assert_false(sbx_instance_gone(o[i].id));
  }
  /* Once ended (its lock dropped, its record left as after a crash): provably gone. */
  for (size_t i = 0; i < 4; i++) {
    other_end(&o[i]);
    assert_true(sbx_instance_gone(o[i].id));
    sbx_instance_forget(o[i].id);
    cleanup_free char *record = xasprintf("%s/instances/%s", state, o[i].id);
    assert_int_equal(access(record, F_OK), -1);
    assert_false(sbx_instance_gone(o[i].id)); /* no record: no proof */
  }
}

static void test_records_prove_or_do_not(void **st) {
  (void)st;
  /* No record at all (an instance of another state directory): not provably gone. */
  assert_false(sbx_instance_gone("0123456789abcdef"));
  /* Not an instance's name. */
  assert_false(sbx_instance_gone("../../etc/passwd"));
  assert_false(sbx_instance_id_valid("0123456789ABCDEF"));
  assert_false(sbx_instance_id_valid("0123456789abcde"));
  /* A record of another boot: gone, whoever holds it (another host's on a shared disk). */
  cleanup_free char *path = xasprintf("%s/instances/fedcba9876543210", state);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("instance fedcba9876543210\nboot 00000000-0000-0000-0000-000000000000\nuid_block 7\n", f);
  fclose(f);
  assert_true(sbx_instance_gone("fedcba9876543210"));
  sbx_instance_forget("fedcba9876543210");
  assert_int_equal(access(path, F_OK), -1);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--other") == 0) return other_main(argv[2]);
  self_exe = "/proc/self/exe";
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_id_and_block),
      cmocka_unit_test(test_a_live_instance_is_not_gone_and_shares_no_block),
      cmocka_unit_test(test_records_prove_or_do_not),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
