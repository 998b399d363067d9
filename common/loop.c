/* The reactor: one epoll instance, fd watches, one-shot timers and a deferred-call queue
 * that runs after each iteration's callbacks (where objects that callbacks still use are
 * freed).  Single-threaded by design.
 *
 * Timers hold no file descriptor: they live in one binary min-heap ordered by deadline
 * (then by creation, so timers due at the same time fire in the order they were made), and
 * epoll_wait sleeps until the earliest one, as libuv and redis do.  A timer therefore cannot
 * fail to be made, however many connections hold the process's descriptors. */
#include <errno.h>
#include <limits.h>
#include <sys/epoll.h>
#include <time.h>

#include "common/cm.h"
#include "common/cm-internal.h"

struct cm_watch {
  cm_loop_t *loop;
  int fd;
  uint32_t events;
  cm_fd_cb cb;
  void *data;
  bool dead;
};

struct cm_timer {
  cm_loop_t *loop;
  uint64_t deadline_us;
  uint64_t seq; /* creation order: the tie-break between equal deadlines */
  size_t index; /* in loop->timers while pending */
  cm_timer_cb cb;
  void *data;
  bool done; /* fired or cancelled */
};

typedef struct defer_item {
  cm_defer_cb cb;
  void *data;
  struct defer_item *next;
} defer_item_t;

struct cm_loop {
  int epfd;
  bool stop;
  defer_item_t *defer_head, *defer_tail;
  cm_timer_t **timers; /* min-heap: timers[0] is due first */
  size_t n_timers, cap_timers;
  uint64_t timer_seq;
};

uint64_t cm_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t cm_now_ms(void) {
  return cm_now_us() / 1000u;
}

cm_loop_t *cm_loop_new(cm_error_t *err) {
  int fd = epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "epoll_create1");
    return NULL;
  }
  cm_loop_t *loop = xcalloc(1, sizeof *loop);
  loop->epfd = fd;
  return loop;
}

/* Returns whether anything ran. */
static bool run_deferred(cm_loop_t *loop) {
  bool ran = loop->defer_head != NULL;
  while (loop->defer_head) {
    defer_item_t *d = loop->defer_head;
    loop->defer_head = d->next;
    if (!loop->defer_head) loop->defer_tail = NULL;
    d->cb(d->data);
    free(d);
  }
  return ran;
}

void cm_loop_free(cm_loop_t *loop) {
  if (!loop) return;
  /* Timers nobody cancelled go with the loop. */
  for (size_t i = 0; i < loop->n_timers; i++) free(loop->timers[i]);
  loop->n_timers = 0;
  run_deferred(loop);
  free(loop->timers);
  close(loop->epfd);
  free(loop);
}

void cm_loop_defer(cm_loop_t *loop, cm_defer_cb cb, void *data) {
  defer_item_t *d = xcalloc(1, sizeof *d);
  d->cb = cb;
  d->data = data;
  if (loop->defer_tail)
    loop->defer_tail->next = d;
  else
    loop->defer_head = d;
  loop->defer_tail = d;
}

cm_watch_t *cm_loop_watch(cm_loop_t *loop, int fd, uint32_t events, cm_fd_cb cb, void *data,
                          cm_error_t *err) {
  cm_watch_t *w = xcalloc(1, sizeof *w);
  w->loop = loop;
  w->fd = fd;
  w->events = events;
  w->cb = cb;
  w->data = data;
  struct epoll_event ev = {.events = events, .data.ptr = w};
  if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "epoll_ctl(ADD, fd %d)", fd);
    free(w);
    return NULL;
  }
  return w;
}

int cm_watch_set_events(cm_watch_t *w, uint32_t events, cm_error_t *err) {
  if (w->dead) return 0;
  if (events == w->events) return 0;
  struct epoll_event ev = {.events = events, .data.ptr = w};
  if (epoll_ctl(w->loop->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "epoll_ctl(MOD, fd %d)", w->fd);
  w->events = events;
  return 0;
}

void cm_watch_remove(cm_watch_t *w) {
  if (!w || w->dead) return;
  w->dead = true;
  epoll_ctl(w->loop->epfd, EPOLL_CTL_DEL, w->fd, NULL);
  cm_loop_defer(w->loop, free, w);
}

/* ---------------------------------------------------------------- the timer heap */

static bool timer_before(const cm_timer_t *a, const cm_timer_t *b) {
  return a->deadline_us < b->deadline_us || (a->deadline_us == b->deadline_us && a->seq < b->seq);
}

static void heap_place(cm_loop_t *loop, size_t i, cm_timer_t *t) {
  loop->timers[i] = t;
  t->index = i;
}

static void heap_up(cm_loop_t *loop, size_t i) {
  cm_timer_t *t = loop->timers[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!timer_before(t, loop->timers[parent])) break;
    heap_place(loop, i, loop->timers[parent]);
    i = parent;
  }
  heap_place(loop, i, t);
}

static void heap_down(cm_loop_t *loop, size_t i) {
  cm_timer_t *t = loop->timers[i];
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= loop->n_timers) break;
    if (child + 1 < loop->n_timers && timer_before(loop->timers[child + 1], loop->timers[child]))
      child++;
    if (!timer_before(loop->timers[child], t)) break;
    heap_place(loop, i, loop->timers[child]);
    i = child;
  }
  heap_place(loop, i, t);
}

static void heap_push(cm_loop_t *loop, cm_timer_t *t) {
  if (loop->n_timers == loop->cap_timers) {
    loop->cap_timers = loop->cap_timers ? loop->cap_timers * 2 : 16;
    loop->timers = xrealloc(loop->timers, loop->cap_timers * sizeof *loop->timers);
  }
  heap_place(loop, loop->n_timers++, t);
  heap_up(loop, t->index);
}

static void heap_remove(cm_loop_t *loop, cm_timer_t *t) {
  size_t i = t->index;
  cm_timer_t *last = loop->timers[--loop->n_timers];
  if (last == t) return;
  heap_place(loop, i, last);
  /* The moved timer may belong above or below the hole. */
  if (i > 0 && timer_before(last, loop->timers[(i - 1) / 2]))
    heap_up(loop, i);
  else
    heap_down(loop, i);
}

cm_timer_t *cm_loop_timer(cm_loop_t *loop, uint64_t ms, cm_timer_cb cb, void *data) {
  if (ms == 0) ms = 1; /* never within the iteration that made it: no busy loop */
  if (ms > UINT64_MAX / 2000) ms = UINT64_MAX / 2000;
  cm_timer_t *t = xcalloc(1, sizeof *t);
  t->loop = loop;
  t->deadline_us = cm_now_us() + ms * 1000u;
  t->seq = loop->timer_seq++;
  t->cb = cb;
  t->data = data;
  heap_push(loop, t);
  return t;
}

void cm_timer_cancel(cm_timer_t *t) {
  if (!t || t->done) return;
  t->done = true;
  heap_remove(t->loop, t);
  /* Freed after this iteration, like a fired timer: a callback later in it may still
   * hold the pointer. */
  cm_loop_defer(t->loop, free, t);
}

uint64_t cm_timer_deadline_us(const cm_timer_t *t) {
  return t->deadline_us;
}
size_t cm_loop_pending_timers(const cm_loop_t *loop) {
  return loop->n_timers;
}

/* Fires the timers due by now.  Timers that their callbacks make are due at least a
 * millisecond later, so the loop ends. */
static void run_timers(cm_loop_t *loop) {
  if (!loop->n_timers) return;
  uint64_t now = cm_now_us();
  while (loop->n_timers && loop->timers[0]->deadline_us <= now && !loop->stop) {
    cm_timer_t *t = loop->timers[0];
    heap_remove(loop, t);
    t->done = true;
    t->cb(loop, t, t->data);
    cm_loop_defer(loop, free, t);
  }
}

/* How long epoll_wait may sleep: the caller's limit, or until the first timer is due
 * (rounded up: waking a little late is harmless, early is a wasted iteration). */
static int wait_ms(const cm_loop_t *loop, int timeout_ms) {
  if (!loop->n_timers) return timeout_ms;
  uint64_t now = cm_now_us(), due = loop->timers[0]->deadline_us;
  uint64_t ms = due <= now ? 0 : (due - now + 999) / 1000;
  if (ms > INT_MAX) ms = INT_MAX;
  if (timeout_ms < 0 || (int)ms < timeout_ms) return (int)ms;
  return timeout_ms;
}

int cm_loop_run_once(cm_loop_t *loop, int timeout_ms, cm_error_t *err) {
  struct epoll_event events[64];
  /* What deferred calls did (a result delivered, say) may be what the caller waits for:
   * then this iteration only polls. */
  if (run_deferred(loop)) timeout_ms = 0;
  int n = epoll_wait(loop->epfd, events, (int)CM_ARRAY_SIZE(events), wait_ms(loop, timeout_ms));
  if (n < 0) {
    if (errno == EINTR) return 0;
    return cm_error_set(err, errno, CM_ERR_IO, "epoll_wait");
  }
  for (int i = 0; i < n; i++) {
    cm_watch_t *w = events[i].data.ptr;
    /* A watch removed by an earlier callback of this batch is still allocated (its free
     * is deferred) and marked dead. */
    if (w->dead) continue;
    w->cb(loop, w->fd, events[i].events, w->data);
  }
  run_timers(loop);
  run_deferred(loop);
  return 0;
}

int cm_loop_run(cm_loop_t *loop, cm_error_t *err) {
  while (!loop->stop) {
    if (cm_loop_run_once(loop, -1, err) < 0) return -1;
  }
  run_deferred(loop);
  return 0;
}

void cm_loop_stop(cm_loop_t *loop) {
  loop->stop = true;
}
bool cm_loop_stopped(const cm_loop_t *loop) {
  return loop->stop;
}
