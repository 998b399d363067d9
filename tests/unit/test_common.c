/* Unit tests for common/: errors, buffers, head+tail capture, UTF-8, the event loop, file
 * operations in directories a sandbox could write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-internal.h"
#include "common/cm.h"

static void test_error_set_and_wrap(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(cm_error_set(&err, 2, CM_ERR_IO, "open %s", "x"), -1);
  assert_string_equal(cm_error_message(&err), "open x: No such file or directory");
  assert_int_equal(err.kind, CM_ERR_IO);
  cm_error_wrap(&err, "loading %d", 3);
  assert_string_equal(cm_error_message(&err), "loading 3: open x: No such file or directory");
  cm_error_release(&err);
  assert_null(err.msg);
  assert_string_equal(cm_error_message(&err), "unknown error");
}

static void test_buf_limits(void **state) {
  cm_buf_t b;
  cm_buf_init(&b, 10);
  assert_int_equal(cm_buf_appends(&b, "hello"), 0);
  assert_int_equal(cm_buf_appends(&b, "world"), 0);
  assert_int_equal(cm_buf_appends(&b, "!"), -1);
  assert_int_equal(b.len, 10);
  assert_string_equal(b.data, "helloworld");
  cm_buf_consume(&b, 5);
  assert_string_equal(b.data, "world");
  cm_buf_printf(&b, "%d", 42);
  assert_string_equal(b.data, "world42");
  char *s = cm_buf_steal(&b);
  assert_string_equal(s, "world42");
  free(s);
  cm_buf_release(&b);
}

static void check_headtail(size_t head_max, size_t tail_max, size_t total, size_t step) {
  cm_headtail_t h;
  cm_headtail_init(&h, head_max, tail_max);
  char *all = malloc(total + 1);
  for (size_t i = 0; i < total; i++) all[i] = (char)('a' + (i * 7) % 26);
  for (size_t i = 0; i < total; i += step) cm_headtail_append(&h, all + i, CM_MIN(step, total - i));
  char *head, *tail;
  size_t hl, tl;
  cm_headtail_get(&h, &head, &hl, &tail, &tl);
  assert_int_equal(h.total, total);
  size_t expect_head = CM_MIN(total, head_max);
  assert_int_equal(hl, expect_head);
  assert_memory_equal(head, all, hl);
  size_t rest = total - expect_head;
  size_t expect_tail = CM_MIN(rest, tail_max);
  assert_int_equal(tl, expect_tail);
  if (tl) assert_memory_equal(tail, all + total - tl, tl);
  assert_int_equal(cm_headtail_truncated(&h), total > head_max + tail_max);
  free(head);
  free(tail);
  free(all);
  cm_headtail_release(&h);
}

static void test_headtail(void **state) {
  size_t steps[] = {1, 3, 7, 64, 1000, 100000};
  size_t totals[] = {0, 5, 10, 15, 20, 21, 100, 5000, 100000};
  for (size_t i = 0; i < CM_ARRAY_SIZE(steps); i++)
    for (size_t j = 0; j < CM_ARRAY_SIZE(totals); j++) check_headtail(10, 10, totals[j], steps[i]);
  check_headtail(100, 0, 1000, 7);
  check_headtail(0, 100, 1000, 13);
  check_headtail(100000, 100000, 250000, 4096);
}

/* Memory follows what was written: a call waiting in the queue, or one that prints a line,
 * must not hold head_max + tail_max bytes (200 queued calls held 80 MB of heap). */
static void test_headtail_allocates_what_is_written(void **state) {
  cm_headtail_t h;
  cm_headtail_init(&h, 1u << 20, 1u << 20);
  assert_null(h.head);
  assert_null(h.tail);
  cm_headtail_append(&h, "hello\n", 6);
  assert_non_null(h.head);
  assert_true(h.head_cap < 4096);
  assert_null(h.tail);
  char *big = calloc(1, (1u << 20) + 10);
  cm_headtail_append(&h, big, (1u << 20) + 10);
  assert_int_equal(h.head_cap, 1u << 20);
  assert_non_null(h.tail);
  assert_int_equal(h.tail_len, 16);
  free(big);
  cm_headtail_release(&h);
}

static void test_utf8(void **state) {
  assert_true(cm_utf8_valid("h\xc3\xa9llo", 6));
  assert_false(cm_utf8_valid("\xff", 1));
  assert_false(cm_utf8_valid("\xed\xa0\x80", 3)); /* surrogate */
  assert_false(cm_utf8_valid("\xc0\xaf", 2));     /* overlong */
  assert_false(cm_utf8_valid("\xe4\xb8", 2));     /* cut */
  /* "世" is e4 b8 96 */
  assert_int_equal(cm_utf8_clip("a\xe4\xb8\x96", 4), 4);
  assert_int_equal(cm_utf8_clip("a\xe4\xb8\x96", 3), 1);
  assert_int_equal(cm_utf8_clip("a\xe4\xb8\x96", 2), 1);
  assert_int_equal(cm_utf8_clip("ab", 2), 2);
  size_t n;
  char *s = cm_utf8_sanitize(
      "a\xff"
      "b",
      3, &n);
  assert_string_equal(s,
                      "a\xef\xbf\xbd"
                      "b");
  assert_int_equal(n, 5);
  free(s);
}

static void test_utf8_display(void **state) {
  size_t n;
  /* ESC, a bidi override (U+202E), C1 (U+009B), DEL, NUL and a backslash are escaped;
   * accented letters and CJK stay; invalid bytes become U+FFFD. */
  const char in[] = "a\x1b[31m\xe2\x80\xae\xc2\x9b\x7f\\b\xc3\xa9\xe4\xb8\x96\xff\0z";
  char *s = cm_utf8_display(in, sizeof in - 1, &n);
  assert_string_equal(
      s, "a\\x1b[31m\\u{202e}\\u{009b}\\x7f\\\\b\xc3\xa9\xe4\xb8\x96\xef\xbf\xbd\\x00z");
  assert_int_equal(n, strlen(s));
  free(s);
  /* Distinct names stay distinct: a literal "\x1b" is not ESC. */
  char *lit = cm_utf8_display("\\x1b", 4, NULL), *esc = cm_utf8_display("\x1b", 1, NULL);
  assert_string_not_equal(lit, esc);
  free(lit);
  free(esc);
}

static void test_parse_u64(void **state) {
  uint64_t v;
  assert_int_equal(cm_parse_u64("123", 1000, &v), 0);
  assert_int_equal(v, 123);
  assert_int_equal(cm_parse_u64("1001", 1000, &v), -1);
  assert_int_equal(cm_parse_u64("", 1000, &v), -1);
  assert_int_equal(cm_parse_u64("-1", 1000, &v), -1);
  assert_int_equal(cm_parse_u64("99999999999999999999999", UINT64_MAX, &v), -1);
  /* a max below one digit's value: max - digit must not wrap */
  assert_int_equal(cm_parse_u64("1", 0, &v), -1);
  assert_int_equal(cm_parse_u64("0", 0, &v), 0);
  assert_int_equal(cm_parse_u64("7", 5, &v), -1);
  assert_int_equal(cm_parse_u64("5", 5, &v), 0);
}

static void test_sha256(void **state) {
  char hex[65];
  cm_sha256_hex("abc", 3, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void digest_hex(const unsigned char md[CM_SHA256_SIZE], char hex[65]) {
  for (int i = 0; i < CM_SHA256_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* The FIPS 180-4 examples (and the NIST long message). */
static void test_sha256_vectors(void **state) {
  static const struct {
    const char *msg;
    const char *hex;
  } vectors[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmn"
       "opqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  char hex[65];
  for (size_t i = 0; i < CM_ARRAY_SIZE(vectors); i++) {
    cm_sha256_hex(vectors[i].msg, strlen(vectors[i].msg), hex);
    assert_string_equal(hex, vectors[i].hex);
  }
  cm_sha256_hex(NULL, 0, hex);
  assert_string_equal(hex, vectors[0].hex);

  /* One million 'a': once whole, once in uneven pieces that straddle block boundaries. */
  size_t million = 1000000;
  char *a = xmalloc(million);
  memset(a, 'a', million);
  static const char *const million_hex =
      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  cm_sha256_hex(a, million, hex);
  assert_string_equal(hex, million_hex);
  cm_sha256_t ctx;
  cm_sha256_init(&ctx);
  for (size_t done = 0, step = 1; done < million; done += step, step = step % 199 + 1)
    cm_sha256_update(&ctx, a + done, CM_MIN(step, million - done));
  unsigned char md[CM_SHA256_SIZE];
  cm_sha256_final(&ctx, md);
  digest_hex(md, hex);
  assert_string_equal(hex, million_hex);
  free(a);
}

/* Every length from 0 to 130 (empty, within a block, the padding edges at 55, 56 and 64,
 * two and three blocks), each hashed in one piece, split at every position, and a byte at a
 * time.  The one-piece digests are checked together against a digest of their
 * concatenation that Python's hashlib computed. */
static void test_sha256_lengths(void **state) {
  enum { MAX_LEN = 130 };
  unsigned char msg[MAX_LEN];
  for (size_t i = 0; i < MAX_LEN; i++) msg[i] = (unsigned char)(i * 7 + 3);
  cm_sha256_t all;
  cm_sha256_init(&all);
  for (size_t len = 0; len <= MAX_LEN; len++) {
    unsigned char one[CM_SHA256_SIZE], md[CM_SHA256_SIZE];
    cm_sha256(msg, len, one);
    cm_sha256_update(&all, one, sizeof one);
    for (size_t cut = 0; cut <= len; cut++) {
      cm_sha256_t ctx;
      cm_sha256_init(&ctx);
      cm_sha256_update(&ctx, msg, cut);
      cm_sha256_update(&ctx, msg + cut, len - cut);
      cm_sha256_final(&ctx, md);
      assert_memory_equal(md, one, sizeof md);
    }
    cm_sha256_t ctx;
    cm_sha256_init(&ctx);
    for (size_t i = 0; i < len; i++) cm_sha256_update(&ctx, msg + i, 1);
    cm_sha256_final(&ctx, md);
    assert_memory_equal(md, one, sizeof md);
  }
  unsigned char md[CM_SHA256_SIZE];
  cm_sha256_final(&all, md);
  char hex[65];
  digest_hex(md, hex);
  /* hashlib.sha256(b"".join(hashlib.sha256(bytes((i * 7 + 3) & 0xff for i in range(n)))
   *                         .digest() for n in range(131))).hexdigest() */
  assert_string_equal(hex, "b3d31aa6b4f0810cff11dc15fd1017d7ba047ad10e757b0e36ed68897e6d1851");
}

static void test_memeq_ct(void **state) {
  unsigned char a[32], b[32];
  for (size_t i = 0; i < sizeof a; i++) a[i] = b[i] = (unsigned char)(i * 13);
  assert_true(cm_memeq_ct(a, b, sizeof a));
  assert_true(cm_memeq_ct(a, b, 0));
  for (size_t i = 0; i < sizeof a; i++) {
    for (unsigned bit = 0; bit < 8; bit++) {
      b[i] ^= (unsigned char)(1u << bit);
      assert_false(cm_memeq_ct(a, b, sizeof a));
      assert_true(cm_memeq_ct(a, b, i)); /* the differing byte is past len */
      b[i] ^= (unsigned char)(1u << bit);
    }
  }
}

static void test_rm_rf(void **state) {
  char tmpl[] = "/tmp/mps-unit-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  char path[256];
  snprintf(path, sizeof path, "%s/a/b/c", tmpl);
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(cm_mkdir_p(path, 0755, &err), 0);
  snprintf(path, sizeof path, "%s/a/b/f", tmpl);
  assert_int_equal(cm_write_file(path, "x", 1, 0644, &err), 0);
  snprintf(path, sizeof path, "%s/a/link", tmpl);
  assert_int_equal(symlink("/etc", path), 0);
  snprintf(path, sizeof path, "%s/a/b", tmpl);
  chmod(path, 0); /* unreadable directories go too */
  assert_int_equal(cm_rm_rf(tmpl, &err), 0);
  struct stat st;
  assert_int_equal(stat(tmpl, &st), -1);
  assert_int_equal(stat("/etc/passwd", &st), 0); /* the link was not followed */
}

/* The same as a plain user, who (unlike root) cannot open a directory without read
 * permission: a sandboxed script of a server that is not root makes one with chmod 0. */
static int rm_unreadable_trees(void) {
  char tmpl[] = "/tmp/mps-unit-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  char path[256];
  cm_error_t err = CM_ERROR_INIT;
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/t%d/a/b/c", tmpl, i);
    if (cm_mkdir_p(path, 0755, &err) < 0) return 2;
    snprintf(path, sizeof path, "%s/t%d/a/b/f", tmpl, i);
    if (cm_write_file(path, "x", 1, 0644, &err) < 0) return 3;
    snprintf(path, sizeof path, "%s/t%d/a/b", tmpl, i);
    if (chmod(path, 0) < 0) return 4;
  }
  int dir = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0 || cm_rm_rf_at(dir, "t0", &err) < 0) return 5;
  close(dir);
  snprintf(path, sizeof path, "%s/t1", tmpl);
  if (cm_rm_rf(path, &err) < 0) return 6;
  if (rmdir(tmpl) < 0) return 7; /* empty: both trees went */
  return 0;
}

static void test_rm_rf_unprivileged(void **state) {
  if (geteuid() != 0) {
    assert_int_equal(rm_unreadable_trees(), 0);
    return;
  }
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
        setresuid(65534, 65534, 65534) < 0)
      _exit(100);
    _exit(rm_unreadable_trees());
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* A FIFO, a symlink, a device, another owner's file, a big one: each refused on the open fd
 * without blocking (the test would hang on a FIFO opened without O_NONBLOCK), and an
 * exclusive create never goes through a symlink. */
static void test_files_at(void **state) {
  char tmpl[] = "/tmp/mps-unit-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  cm_error_t err = CM_ERROR_INIT;
  int dir = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  assert_true(dir >= 0);
  assert_int_equal(mkfifoat(dir, "fifo", 0666), 0);
  assert_int_equal(symlinkat("/etc/passwd", dir, "link"), 0);
  assert_int_equal(symlinkat("/etc", dir, "dirlink"), 0);
  assert_int_equal(mkdirat(dir, "sub", 0755), 0);
  int fd = openat(dir, "file", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  assert_true(fd >= 0 && write(fd, "hello", 5) == 5);
  close(fd);

  char *text = NULL;
  size_t len = 0;
  assert_int_equal(cm_read_file_at(dir, "file", geteuid(), 100, &text, &len, &err), 0);
  assert_int_equal(len, 5);
  assert_string_equal(text, "hello");
  free(text);
  const struct {
    const char *name;
    int flags;
    uid_t owner;
    uint64_t max;
    const char *why;
  } refused[] = {
      {"fifo", O_RDONLY, CM_ANY_OWNER, 100, "fifo is a FIFO"},
      {"fifo", O_WRONLY, CM_ANY_OWNER, 100, "fifo is a FIFO or a socket"}, /* no reader: ENXIO */
      {"link", O_RDONLY, CM_ANY_OWNER, 100, "link is a symlink"},
      {"sub", O_RDONLY, CM_ANY_OWNER, 100, "sub is a directory"},
      {"/dev/null", O_RDONLY, CM_ANY_OWNER, 100, "bad name"},
      {"..", O_RDONLY, CM_ANY_OWNER, 100, "bad name"},
      {"file", O_RDONLY, geteuid() + 1, 100, "file is owned by someone else"},
      {"file", O_RDONLY, CM_ANY_OWNER, 4, "file is too large"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    assert_int_equal(cm_open_regular_at(dir, refused[i].name, refused[i].flags, refused[i].owner,
                                        refused[i].max, NULL, &err),
                     -1);
    if (!strstr(cm_error_message(&err), refused[i].why))
      fail_msg("%s: %s", refused[i].name, cm_error_message(&err));
    cm_error_release(&err);
  }
  int devdir = open("/dev", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  assert_int_equal(cm_open_regular_at(devdir, "null", O_RDONLY, CM_ANY_OWNER, 100, NULL, &err), -1);
  assert_non_null(strstr(cm_error_message(&err), "a device"));
  cm_error_release(&err);
  close(devdir);
  assert_int_equal(cm_open_dir_at(dir, "dirlink", &err), -1);
  cm_error_release(&err);
  assert_int_equal(cm_open_dir_at(dir, "fifo", &err), -1);
  cm_error_release(&err);
  fd = cm_open_dir_at(dir, "sub", &err);
  assert_true(fd >= 0);
  close(fd);

  /* Exclusive: never over a symlink (the target stays untouched), a FIFO or a file. */
  struct stat before, after;
  assert_int_equal(stat("/etc/passwd", &before), 0);
  assert_int_equal(cm_create_file_at(dir, "link", "x", 1, 0644, &err), -1);
  cm_error_release(&err);
  assert_int_equal(cm_create_file_at(dir, "fifo", "x", 1, 0644, &err), -1);
  cm_error_release(&err);
  assert_int_equal(cm_create_file_at(dir, "file", "x", 1, 0644, &err), -1);
  cm_error_release(&err);
  assert_int_equal(stat("/etc/passwd", &after), 0);
  assert_int_equal(before.st_mtime, after.st_mtime);
  assert_int_equal(cm_create_file_at(dir, "new", "abc", 3, 0640, &err), 0);
  struct stat st;
  assert_int_equal(fstatat(dir, "new", &st, 0), 0);
  assert_int_equal(st.st_size, 3);
  assert_int_equal(st.st_mode & 0777, 0640);

  assert_int_equal(cm_rm_rf_at(dir, "dirlink", &err), 0); /* the link, not /etc */
  assert_int_equal(stat("/etc/passwd", &st), 0);
  assert_int_equal(cm_rm_rf_at(dir, "../x", &err), -1);
  cm_error_release(&err);
  close(dir);
  assert_int_equal(cm_rm_rf(tmpl, &err), 0);
}

static int fired;
static void on_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  fired += *(int *)data;
  if (fired >= 11) cm_loop_stop(loop);
}

static void test_loop_timers(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  assert_non_null(loop);
  static int one = 1, ten = 10, hundred = 100;
  fired = 0;
  cm_loop_timer(loop, 20, on_timer, &ten);
  cm_loop_timer(loop, 1, on_timer, &one);
  cm_timer_t *c = cm_loop_timer(loop, 5, on_timer, &hundred);
  cm_timer_cancel(c);
  assert_int_equal(cm_loop_run(loop, &err), 0);
  assert_int_equal(fired, 11);
  cm_loop_free(loop);
}

/* The timer heap, through the loop: thousands of timers with random delays, a third of
 * them cancelled (some before the loop runs, some from other timers' callbacks), some
 * made from callbacks.  Every timer fires once, never before its deadline, in the order of
 * (deadline, creation); a cancelled one never fires. */
#define HEAP_TIMERS 3000
typedef struct {
  cm_timer_t *t[HEAP_TIMERS + 64];
  size_t order[HEAP_TIMERS + 64]; /* creation index of each timer */
  bool cancelled[HEAP_TIMERS + 64], fired[HEAP_TIMERS + 64];
  size_t made, n_fired, n_cancelled;
  uint64_t last_deadline;
  size_t last_index;
  bool early, out_of_order, fired_cancelled;
  unsigned seed;
} heap_state_t;

static heap_state_t heap;

static unsigned heap_rand(void) {
  heap.seed = heap.seed * 1103515245u + 12345u;
  return (heap.seed >> 16) & 0x7fff;
}

static void on_heap_timer(cm_loop_t *loop, cm_timer_t *t, void *data);

static void heap_make(cm_loop_t *loop, uint64_t ms) {
  size_t i = heap.made++;
  heap.t[i] = cm_loop_timer(loop, ms, on_heap_timer, (void *)(uintptr_t)i);
  heap.order[i] = i;
}

static void on_heap_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  size_t i = (size_t)(uintptr_t)data;
  uint64_t deadline = cm_timer_deadline_us(t);
  if (deadline > cm_now_us()) heap.early = true;
  if (heap.cancelled[i] || heap.fired[i]) heap.fired_cancelled = true;
  if (heap.n_fired > 0 &&
      (deadline < heap.last_deadline || (deadline == heap.last_deadline && i < heap.last_index)))
    heap.out_of_order = true;
  heap.last_deadline = deadline;
  heap.last_index = i;
  heap.fired[i] = true;
  heap.n_fired++;
  cm_timer_cancel(t); /* from its own callback: a no-op */
  /* Cancel another pending timer now and then; make a new one now and then. */
  if (heap_rand() % 7 == 0) {
    size_t j = heap_rand() % heap.made;
    if (!heap.fired[j] && !heap.cancelled[j]) {
      cm_timer_cancel(heap.t[j]);
      heap.cancelled[j] = true;
      heap.n_cancelled++;
    }
  }
  if (heap.made < HEAP_TIMERS + 64 && heap_rand() % 50 == 0) heap_make(loop, heap_rand() % 5);
  if (cm_loop_pending_timers(loop) == 0) cm_loop_stop(loop);
}

static void test_loop_timer_heap(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  memset(&heap, 0, sizeof heap);
  heap.seed = 42;
  for (size_t i = 0; i < HEAP_TIMERS; i++) heap_make(loop, heap_rand() % 40);
  for (size_t i = 0; i < HEAP_TIMERS; i += 1 + heap_rand() % 5) {
    cm_timer_cancel(heap.t[i]);
    heap.cancelled[i] = true;
    heap.n_cancelled++;
  }
  assert_int_equal(cm_loop_pending_timers(loop), heap.made - heap.n_cancelled);
  assert_int_equal(cm_loop_run(loop, &err), 0);
  assert_false(heap.early);
  assert_false(heap.out_of_order);
  assert_false(heap.fired_cancelled);
  assert_int_equal(heap.n_fired + heap.n_cancelled, heap.made);
  assert_true(heap.made > HEAP_TIMERS); /* some were made from callbacks */
  for (size_t i = 0; i < heap.made; i++) assert_true(heap.fired[i] != heap.cancelled[i]);
  assert_int_equal(cm_loop_pending_timers(loop), 0);
  cm_loop_free(loop);
}

/* A timer of 0 ms made in a callback fires in a later iteration, not in the one that made
 * it (no busy loop); one left pending at cm_loop_free is freed with the loop. */
static int zero_iteration, zero_fired_in;
static int iteration;
static void on_zero(cm_loop_t *loop, cm_timer_t *t, void *data) {
  zero_fired_in = iteration;
}
static void on_make_zero(cm_loop_t *loop, cm_timer_t *t, void *data) {
  zero_iteration = iteration;
  cm_loop_timer(loop, 0, on_zero, NULL);
}

static void test_loop_timer_zero(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  zero_iteration = zero_fired_in = -1;
  cm_loop_timer(loop, 0, on_make_zero, NULL);
  for (iteration = 0; iteration < 1000 && zero_fired_in < 0; iteration++)
    assert_int_equal(cm_loop_run_once(loop, 100, &err), 0);
  assert_true(zero_iteration >= 0);
  assert_true(zero_fired_in > zero_iteration);
  cm_loop_timer(loop, 60000, on_zero, NULL); /* left pending: freed by cm_loop_free */
  cm_loop_free(loop);
}

/* Timers take no file descriptor: with the descriptor limit at what is open now, a
 * thousand timers are made and fire (a timerfd per timer aborted here). */
static int fd_timers_fired;
static void on_fd_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  if (++fd_timers_fired == 1000) cm_loop_stop(loop);
}

static void test_loop_timers_need_no_fds(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  struct rlimit old, low;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
  int highest = 0;
  for (int fd = 0; fd < 1024; fd++)
    if (fcntl(fd, F_GETFD) >= 0) highest = fd;
  low = old;
  low.rlim_cur = (rlim_t)highest + 1;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
  /* Fill the holes below the limit: then really no descriptor is left. */
  int fillers[1024], n_fillers = 0, fd;
  while (n_fillers < 1024 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
    fillers[n_fillers++] = fd;
  assert_int_equal(open("/dev/null", O_RDONLY | O_CLOEXEC) < 0 && errno == EMFILE, 1);
  fd_timers_fired = 0;
  for (int i = 0; i < 1000; i++) cm_loop_timer(loop, (uint64_t)(i % 10), on_fd_timer, NULL);
  int rc = cm_loop_run(loop, &err);
  for (int i = 0; i < n_fillers; i++) close(fillers[i]);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
  assert_int_equal(rc, 0);
  assert_int_equal(fd_timers_fired, 1000);
  cm_loop_free(loop);
}

static void on_pipe(cm_loop_t *loop, int fd, uint32_t ev, void *data) {
  char buf[16];
  ssize_t n = read(fd, buf, sizeof buf);
  *(ssize_t *)data = n;
  cm_watch_t **w = (cm_watch_t **)((ssize_t *)data + 1);
  cm_watch_remove(*w); /* removal from inside its own callback */
  cm_loop_stop(loop);
}

static void test_loop_fd(void **state) {
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  int p[2];
  assert_int_equal(pipe(p), 0);
  struct {
    ssize_t n;
    cm_watch_t *w;
  } st = {0, NULL};
  st.w = cm_loop_watch(loop, p[0], 1 /* EPOLLIN */, on_pipe, &st, &err);
  assert_non_null(st.w);
  assert_int_equal(write(p[1], "hey", 3), 3);
  assert_int_equal(cm_loop_run(loop, &err), 0);
  assert_int_equal(st.n, 3);
  cm_loop_free(loop);
  close(p[0]);
  close(p[1]);
}

/* The scope guards: a child is killed and reaped, a directory removed, unless stolen. */
static void test_cleanup_guards(void **state) {
  pid_t seen;
  {
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
      pause();
      _exit(0);
    }
    cleanup_pid pid_t guard = child;
    seen = child;
  }
  /* Reaped already: nothing is left to wait for. */
  assert_int_equal(waitpid(seen, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);
  {
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) _exit(7);
    cleanup_pid pid_t guard = child;
    seen = steal_pid(&guard);
    assert_int_equal(guard, -1);
  }
  int status = 0;
  assert_int_equal(waitpid(seen, &status, 0), seen); /* stolen: still ours to reap */
  assert_int_equal(WEXITSTATUS(status), 7);

  char tmpl[] = "/tmp/mps-guard-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  cleanup_free char *kept = NULL;
  {
    cleanup_rmtree char *dir = xstrdup(tmpl);
    cleanup_free char *f = xasprintf("%s/f", dir);
    cm_error_t err = CM_ERROR_INIT;
    assert_int_equal(cm_write_file(f, "x", 1, 0600, &err), 0);
  }
  struct stat st;
  assert_int_equal(stat(tmpl, &st), -1);
  assert_non_null(mkdtemp(strcpy(tmpl, "/tmp/mps-guard-XXXXXX")));
  {
    cleanup_rmtree char *dir = xstrdup(tmpl);
    kept = steal_pointer(&dir);
  }
  assert_int_equal(stat(kept, &st), 0);
  assert_int_equal(rmdir(kept), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error_set_and_wrap),
      cmocka_unit_test(test_buf_limits),
      cmocka_unit_test(test_headtail),
      cmocka_unit_test(test_headtail_allocates_what_is_written),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_utf8_display),
      cmocka_unit_test(test_parse_u64),
      cmocka_unit_test(test_sha256),
      cmocka_unit_test(test_sha256_vectors),
      cmocka_unit_test(test_sha256_lengths),
      cmocka_unit_test(test_memeq_ct),
      cmocka_unit_test(test_rm_rf),
      cmocka_unit_test(test_cleanup_guards),
      cmocka_unit_test(test_rm_rf_unprivileged),
      cmocka_unit_test(test_files_at),
      cmocka_unit_test(test_loop_timers),
      cmocka_unit_test(test_loop_fd),
      cmocka_unit_test(test_loop_timer_heap),
      cmocka_unit_test(test_loop_timer_zero),
      cmocka_unit_test(test_loop_timers_need_no_fds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
