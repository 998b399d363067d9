/* common/: base utilities every layer may use.
 *
 * Errors: a fallible function returns int (negative on failure) and takes
 * `cm_error_t *err` last.  The callee fills *err; the caller owns it and releases it
 * with cm_error_release().  Allocation failure aborts (xmalloc and friends), so every
 * size that input controls must be capped before allocating. */
#ifndef MPS_COMMON_CM_H
#define MPS_COMMON_CM_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* ---------------------------------------------------------------- errors */

typedef enum cm_error_kind {
  CM_ERR_NONE = 0,
  CM_ERR_INTERNAL,    /* a bug or an unexpected system failure */
  CM_ERR_INVALID,     /* the input is malformed or out of range */
  CM_ERR_LIMIT,       /* the input is well formed but exceeds a configured limit */
  CM_ERR_NOT_FOUND,   /* a named thing does not exist */
  CM_ERR_UNAVAILABLE, /* a needed facility (sandbox, interpreter, installer) cannot be used */
  CM_ERR_IO,          /* a system call on a file, pipe or socket failed */
  CM_ERR_UNSUPPORTED, /* a feature that is not (yet) implemented on this path */
} cm_error_kind_t;

typedef struct cm_error {
  int errnum;           /* errno at the failure, or 0 */
  cm_error_kind_t kind; /* CM_ERR_NONE while no error is set */
  char *msg;            /* heap string, owned; NULL while no error is set */
} cm_error_t;

#define CM_ERROR_INIT \
  { 0, CM_ERR_NONE, NULL }

/* Sets *err (replacing what it held) and returns -1.  errnum 0 means "no errno";
 * a non-zero errnum appends ": strerror(errnum)" to the message. */
int cm_error_set(cm_error_t *err, int errnum, cm_error_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefixes context to an existing error: "context: old message".  Returns -1. */
int cm_error_wrap(cm_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cm_error_release(cm_error_t *err);
const char *cm_error_message(const cm_error_t *err);

/* ---------------------------------------------------------------- cleanup */

void cm_cleanup_freep(void *p);
void cm_cleanup_closep(int *fd);
void cm_cleanup_fclosep(void *p);
void cm_cleanup_error(cm_error_t *err);
void cm_cleanup_strvp(void *p);
/* A child process owned by a scope: killed (its process group too) and reaped when the
 * scope ends, unless taken with steal_pid().  <= 0 means none. */
void cm_cleanup_pidp(int *pid);
/* A directory owned by a scope (a heap path): removed with everything in it (cm_rm_rf) and
 * freed when the scope ends, unless taken with steal_pointer(). */
void cm_cleanup_rmtreep(void *p);

#define cleanup_free __attribute__((cleanup(cm_cleanup_freep)))
#define cleanup_close __attribute__((cleanup(cm_cleanup_closep)))
#define cleanup_fclose __attribute__((cleanup(cm_cleanup_fclosep)))
#define cleanup_error __attribute__((cleanup(cm_cleanup_error)))
#define cleanup_strv __attribute__((cleanup(cm_cleanup_strvp)))
#define cleanup_pid __attribute__((cleanup(cm_cleanup_pidp)))
#define cleanup_rmtree __attribute__((cleanup(cm_cleanup_rmtreep)))

static inline void *cm_steal_pointer(void *pp) {
  void **p = (void **)pp;
  void *v = *p;
  *p = NULL;
  return v;
}
#define steal_pointer(pp) cm_steal_pointer(pp)
static inline int steal_pid(int *pid) {
  int v = *pid;
  *pid = -1;
  return v;
}
static inline int steal_fd(int *fd) {
  int v = *fd;
  *fd = -1;
  return v;
}

/* ---------------------------------------------------------------- allocation */

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *xvasprintf(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
void *xmemdup(const void *p, size_t n);

/* NULL-terminated vector of heap strings. */
void cm_strv_free(char **v);
size_t cm_strv_len(char *const *v);
/* A copy of v (an empty vector for NULL). */
char **cm_strv_dup(char *const *v);

/* Builds a NULL-terminated vector of heap strings (argv, envp).  Zero-initialise it; v stays
 * NULL until the first string; release with cm_strv_free(b.v) or take it with cm_strv_steal. */
typedef struct cm_strv_builder {
  char **v;
  size_t n, cap;
} cm_strv_builder_t;
void cm_strv_add(cm_strv_builder_t *b, const char *s);
/* Appends each string up to a terminating NULL. */
void cm_strv_addv(cm_strv_builder_t *b, ...) __attribute__((sentinel));
void cm_strv_addf(cm_strv_builder_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The vector (never NULL: an empty one when nothing was added); the builder is reset. */
char **cm_strv_steal(cm_strv_builder_t *b);

/* ---------------------------------------------------------------- buffers */

/* A growable byte buffer with a hard cap.  data is always NUL-terminated (the NUL is
 * not counted in len), so text can be used as a C string. */
typedef struct cm_buf {
  char *data;
  size_t len;
  size_t cap;
  size_t max; /* 0 = unbounded (only for sizes the program itself controls) */
} cm_buf_t;

void cm_buf_init(cm_buf_t *b, size_t max);
void cm_buf_release(cm_buf_t *b);
/* Append; returns -1 (and appends nothing) if max would be exceeded. */
int cm_buf_append(cm_buf_t *b, const void *data, size_t len);
int cm_buf_appends(cm_buf_t *b, const char *s);
int cm_buf_printf(cm_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Remove the first n bytes. */
void cm_buf_consume(cm_buf_t *b, size_t n);
void cm_buf_reset(cm_buf_t *b);
char *cm_buf_steal(cm_buf_t *b); /* returns data (or "" allocated) and resets */

/* Keeps the first `head_max` and the last `tail_max` bytes of a stream of unknown
 * length, and counts the total.  Memory is bounded by head_max + tail_max, and follows
 * what was written: the head grows as bytes arrive, the tail exists once the head is full
 * (so a queued call, or one that prints little, holds next to nothing). */
typedef struct cm_headtail {
  char *head;
  size_t head_len, head_cap, head_max;
  char *tail; /* ring buffer of tail_max bytes, allocated at the first byte past the head */
  size_t tail_len, tail_start, tail_max;
  uint64_t total;
} cm_headtail_t;

void cm_headtail_init(cm_headtail_t *h, size_t head_max, size_t tail_max);
void cm_headtail_release(cm_headtail_t *h);
void cm_headtail_append(cm_headtail_t *h, const char *data, size_t len);
bool cm_headtail_truncated(const cm_headtail_t *h);
/* Copies out the kept bytes: the head, and (if truncated) the tail, in order. Both are
 * heap-allocated, with a NUL after them (they may hold NULs of their own: use the
 * lengths). tail is "" when not truncated. */
void cm_headtail_get(const cm_headtail_t *h, char **head, size_t *head_len, char **tail,
                     size_t *tail_len);

/* ---------------------------------------------------------------- logging */

typedef enum cm_log_level {
  CM_LOG_DEBUG = 0,
  CM_LOG_INFO,
  CM_LOG_WARNING,
  CM_LOG_ERROR,
  CM_LOG_OFF,
} cm_log_level_t;

/* Logs go to stderr, never stdout. */
/* Looks whether stderr is the systemd journal's stream (JOURNAL_STREAM): its lines then carry
 * sd-daemon priority prefixes ("<4>warning: ...").  Called once at start, before any thread. */
bool cm_log_detect_journal(void);
/* What the last cm_log_detect_journal found. */
bool cm_log_journal(void);
void cm_log_set_level(cm_log_level_t level);
cm_log_level_t cm_log_get_level(void);
int cm_log_parse_level(const char *name, cm_log_level_t *level);
void cm_log(cm_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define cm_debug(...) cm_log(CM_LOG_DEBUG, __VA_ARGS__)
#define cm_info(...) cm_log(CM_LOG_INFO, __VA_ARGS__)
#define cm_warn(...) cm_log(CM_LOG_WARNING, __VA_ARGS__)
#define cm_err(...) cm_log(CM_LOG_ERROR, __VA_ARGS__)
/* A printable, shortened excerpt of untrusted input for a log line (heap string). */
char *cm_log_excerpt(const char *buf, size_t len, size_t max);

/* ---------------------------------------------------------------- background work */

/* One worker thread for the slow system calls of cleaning up, whose result nobody waits
 * for: removing a cgroup v1 directory, or unmounting and removing a run's tmpfs work
 * directory, waits for RCU grace periods in the kernel (up to 10-20 ms each on our
 * machines), which the event loop must not.  A job owns its data and touches nothing of the
 * loop's; jobs run in order.  cm_bg_run returns false when CM_BG_MAX jobs wait already (or no
 * thread can start): the caller then does the work itself, so a backlog stays bounded.
 * Called from the loop's thread only. */
#define CM_BG_MAX 256
bool cm_bg_run(void (*fn)(void *), void *data);
/* Waits until every job queued so far has run: before exit (no directory left behind), and
 * before anything that needs them done (removing the directory they were in). */
void cm_bg_flush(void);
/* Jobs queued and not finished. */
size_t cm_bg_pending(void);

/* ---------------------------------------------------------------- event loop */

typedef struct cm_loop cm_loop_t;
typedef struct cm_watch cm_watch_t;
typedef struct cm_timer cm_timer_t;

/* events: EPOLLIN/EPOLLOUT/... bits; revents as returned by epoll. */
typedef void (*cm_fd_cb)(cm_loop_t *loop, int fd, uint32_t revents, void *data);
typedef void (*cm_timer_cb)(cm_loop_t *loop, cm_timer_t *timer, void *data);
typedef void (*cm_defer_cb)(void *data);

cm_loop_t *cm_loop_new(cm_error_t *err);
void cm_loop_free(cm_loop_t *loop);
/* Runs until cm_loop_stop().  Returns 0, or -1 if epoll_wait failed. */
int cm_loop_run(cm_loop_t *loop, cm_error_t *err);
/* Runs one iteration, waiting at most timeout_ms (-1 = until something happens). */
int cm_loop_run_once(cm_loop_t *loop, int timeout_ms, cm_error_t *err);
void cm_loop_stop(cm_loop_t *loop);
bool cm_loop_stopped(const cm_loop_t *loop);

/* Watches fd.  The loop does not own fd; remove the watch before closing it. */
cm_watch_t *cm_loop_watch(cm_loop_t *loop, int fd, uint32_t events, cm_fd_cb cb, void *data,
                          cm_error_t *err);
int cm_watch_set_events(cm_watch_t *w, uint32_t events, cm_error_t *err);
/* Removes and frees the watch (safe from inside any callback, including its own). */
void cm_watch_remove(cm_watch_t *w);

/* One-shot timer after ms milliseconds (0 counts as 1: never in the iteration that made
 * it).  Freed after it fires or when cancelled.  Takes no file descriptor, so it cannot
 * fail.  Timers due at the same time fire in the order they were made, after the
 * iteration's fd callbacks. */
cm_timer_t *cm_loop_timer(cm_loop_t *loop, uint64_t ms, cm_timer_cb cb, void *data);
/* Cancels a pending timer (safe on a timer that already fired only from its own callback:
 * do not keep a pointer to a fired timer). */
void cm_timer_cancel(cm_timer_t *t);

/* Runs cb(data) after the current iteration's callbacks: the place to free objects that
 * a callback still uses. */
void cm_loop_defer(cm_loop_t *loop, cm_defer_cb cb, void *data);

/* Monotonic time. */
uint64_t cm_now_ms(void);
uint64_t cm_now_us(void);

/* ---------------------------------------------------------------- utilities */

int cm_set_nonblock(int fd, bool on);
int cm_set_cloexec(int fd);
/* Writes all of buf to a blocking fd, retrying on EINTR. */
int cm_write_all(int fd, const void *buf, size_t len);
/* Reads a whole (small) file, at most max bytes. */
int cm_read_file(const char *path, size_t max, char **out, size_t *out_len, cm_error_t *err);
int cm_write_file(const char *path, const void *data, size_t len, mode_t mode, cm_error_t *err);
/* mkdir -p */
int cm_mkdir_p(const char *path, mode_t mode, cm_error_t *err);
/* rm -rf that never follows symlinks and stays on one filesystem path. */
int cm_rm_rf(const char *path, cm_error_t *err);
/* ---------------------------------------------------------------- files a sandbox could have
 * written
 *
 * For every file the server opens, reads, writes or removes in a directory that a
 * sandboxed process could write (or could have written: a build's staging directory and
 * cache, a run's work directory).  name is one path component (no '/', not "." or "..")
 * relative to dirfd, which the caller opened the same way (cm_open_dir_at), so no symlink
 * is ever followed; opens are O_NONBLOCK, so a FIFO never blocks the caller (it is
 * refused after fstat, before any read or write); every fd is close-on-exec. */
#define CM_ANY_OWNER ((uid_t)-1)
/* A directory below dirfd (never through a symlink, never a FIFO).  The fd, or -1. */
int cm_open_dir_at(int dirfd, const char *name, cm_error_t *err);
/* Opens a regular file with flags (O_RDONLY, O_RDWR, ...; never creates) after checking on
 * the open fd that it is a regular file, owned by owner (CM_ANY_OWNER: anyone) and at most
 * max_size bytes; st gets its status (may be NULL).  The fd (blocking again), or -1: a
 * symlink, FIFO, socket, device or directory is an error naming what it is. */
int cm_open_regular_at(int dirfd, const char *name, int flags, uid_t owner, uint64_t max_size,
                       struct stat *st, cm_error_t *err);
/* Reads a whole regular file of at most max bytes (checks of cm_open_regular_at). */
int cm_read_file_at(int dirfd, const char *name, uid_t owner, size_t max, char **out,
                    size_t *out_len, cm_error_t *err);
/* Creates a new file (O_EXCL: fails if anything has the name, a symlink included) with data. */
int cm_create_file_at(int dirfd, const char *name, const void *data, size_t len, mode_t mode,
                      cm_error_t *err);
/* rm -rf of name in dirfd, never following a symlink.  Takes as long as the tree is big:
 * on the event loop only for trees the server made small; else in a child (sbx_call). */
int cm_rm_rf_at(int dirfd, const char *name, cm_error_t *err);
/* chmod of the directory name in dirfd, never through a symlink, whatever its own mode
 * (0 or -1 with errno). */
int cm_chmod_dir_at(int dirfd, const char *name, mode_t mode);

/* Finds an executable in PATH (or uses name as is if it contains a '/'). Heap string. */
char *cm_find_executable(const char *name);

/* SHA-256 (FIPS 180-4, common/sha256.c), one-shot or incremental: init, update any number
 * of times with any split of the message, final.  final wipes ctx. */
#define CM_SHA256_SIZE 32
typedef struct cm_sha256 {
  uint32_t state[8];
  uint64_t length;         /* message bytes so far */
  unsigned char block[64]; /* a partial block */
  size_t used;             /* bytes of block in use */
} cm_sha256_t;
void cm_sha256_init(cm_sha256_t *ctx);
void cm_sha256_update(cm_sha256_t *ctx, const void *data, size_t len);
void cm_sha256_final(cm_sha256_t *ctx, unsigned char out[CM_SHA256_SIZE]);
void cm_sha256(const void *data, size_t len, unsigned char out[CM_SHA256_SIZE]);
/* Lower-case hex SHA-256 of data (65 bytes with NUL). */
void cm_sha256_hex(const void *data, size_t len, char out[65]);
/* Are the len bytes at a and b equal?  The time taken depends on len only, not on where
 * they differ: for comparing secrets (token digests). */
bool cm_memeq_ct(const void *a, const void *b, size_t len);

/* Opens the shared library soname (kept open for the life of the process) and resolves
 * each of names[] into syms[], all or nothing: a library loaded only when a feature is
 * used.  The error names the library and what the loader said. */
int cm_dl_symbols(const char *soname, const char *const *names, size_t n, void **syms,
                  cm_error_t *err);

/* Is buf valid UTF-8? */
bool cm_utf8_valid(const char *buf, size_t len);
/* Length of the longest prefix of buf (at most len) that does not end inside a
 * multi-byte UTF-8 sequence. */
size_t cm_utf8_clip(const char *buf, size_t len);
/* Copies buf, replacing each invalid UTF-8 sequence with U+FFFD.  Heap string. */
char *cm_utf8_sanitize(const char *buf, size_t len, size_t *out_len);
/* A name made safe to show (a file name a script chose, in a result or a log): invalid UTF-8
 * as U+FFFD, and every control character (C0, DEL, C1), bidirectional override or isolate
 * and the backslash itself written as an escape (\xNN, \u{NNNN}, \\), so that no terminal
 * sequence or reordering reaches the reader and distinct names stay distinct.  Heap string. */
char *cm_utf8_display(const char *buf, size_t len, size_t *out_len);
/* Parses a non-negative decimal integer that fits in max; -1 if malformed. */
int cm_parse_u64(const char *s, uint64_t max, uint64_t *out);

#define CM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
