/* The reactor: one epoll instance, fd watches, timerfd-based one-shot timers and a
 * deferred-call queue that runs after each iteration's callbacks (where objects that
 * callbacks still use are freed).  Single-threaded by design. */
#include <errno.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>

#include "common/cm.h"

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
  int fd;
  cm_watch_t *watch;
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
};

uint64_t cm_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t cm_now_ms(void) { return cm_now_us() / 1000u; }

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

static void run_deferred(cm_loop_t *loop) {
  while (loop->defer_head) {
    defer_item_t *d = loop->defer_head;
    loop->defer_head = d->next;
    if (!loop->defer_head) loop->defer_tail = NULL;
    d->cb(d->data);
    free(d);
  }
}

void cm_loop_free(cm_loop_t *loop) {
  if (!loop) return;
  run_deferred(loop);
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

static void timer_release(cm_timer_t *t) {
  t->done = true;
  cm_watch_remove(t->watch);
  close(t->fd);
  cm_loop_defer(t->loop, free, t);
}

static void timer_ready(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  cm_timer_t *t = data;
  uint64_t expirations;
  if (read(fd, &expirations, sizeof expirations) < 0 && errno == EAGAIN) return;
  if (t->done) return;
  t->done = true;
  t->cb(loop, t, t->data);
  timer_release(t);
}

cm_timer_t *cm_loop_timer(cm_loop_t *loop, uint64_t ms, cm_timer_cb cb, void *data) {
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (fd < 0) {
    cm_err("timerfd_create: %s", strerror(errno));
    abort(); /* fd exhaustion here means the process cannot keep its promises */
  }
  struct itimerspec its = {0};
  if (ms == 0) ms = 1; /* 0 would disarm */
  its.it_value.tv_sec = (time_t)(ms / 1000);
  its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
  timerfd_settime(fd, 0, &its, NULL);
  cm_timer_t *t = xcalloc(1, sizeof *t);
  t->loop = loop;
  t->fd = fd;
  t->cb = cb;
  t->data = data;
  cm_error_t err = CM_ERROR_INIT;
  t->watch = cm_loop_watch(loop, fd, EPOLLIN, timer_ready, t, &err);
  if (!t->watch) {
    cm_err("timer: %s", cm_error_message(&err));
    abort();
  }
  return t;
}

void cm_timer_cancel(cm_timer_t *t) {
  if (!t || t->done) return;
  timer_release(t);
}

int cm_loop_run_once(cm_loop_t *loop, int timeout_ms, cm_error_t *err) {
  struct epoll_event events[64];
  run_deferred(loop);
  int n = epoll_wait(loop->epfd, events, (int)CM_ARRAY_SIZE(events), timeout_ms);
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

void cm_loop_stop(cm_loop_t *loop) { loop->stop = true; }
bool cm_loop_stopped(const cm_loop_t *loop) { return loop->stop; }
