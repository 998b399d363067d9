/* The background worker: one thread, started on first use, that runs self-contained jobs
 * in the order they were queued (see cm.h).  Jobs travel through a pipe (a job is one
 * write of 16 bytes: atomic), so the loop's thread never takes a lock the worker could hold
 * while it is preempted, and a full pipe is an answer (EAGAIN), not a wait. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "common/cm.h"

typedef struct bg_job {
  void (*fn)(void *);
  void *data;
} bg_job_t;

static struct {
  pthread_once_t once;
  int rfd, wfd;          /* -1 until started; the write end is non-blocking */
  uint64_t queued, done; /* queued: the loop's thread; done: the worker (atomic) */
  bool dead;             /* the worker stopped (atomic) */
} bg = {.once = PTHREAD_ONCE_INIT, .rfd = -1, .wfd = -1};

static void *bg_main(void *unused) {
  (void)unused;
  for (;;) {
    bg_job_t job;
    ssize_t n = read(bg.rfd, &job, sizeof job);
    if (n < 0 && errno == EINTR) continue;
    if (n != (ssize_t)sizeof job) {
      cm_err("background worker: reading its queue: %s", n < 0 ? strerror(errno) : "short read");
      __atomic_store_n(&bg.dead, true, __ATOMIC_RELEASE);
      return NULL;
    }
    job.fn(job.data);
    __atomic_add_fetch(&bg.done, 1, __ATOMIC_RELEASE);
  }
}

/* Every signal stays with the loop's thread, which blocks them and reads them from a
 * signalfd: the worker blocks them all too, or one could be delivered here. */
static void bg_start(void) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) {
    cm_warn("no background worker (pipe: %s): slow cleanups run on the event loop",
            strerror(errno));
    return;
  }
  bg.rfd = p[0];
  fcntl(p[1], F_SETFL, fcntl(p[1], F_GETFL) | O_NONBLOCK);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, NULL, bg_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    cm_warn("no background worker (%s): slow cleanups run on the event loop", strerror(rc));
    close(p[0]);
    close(p[1]);
    bg.rfd = -1;
    return;
  }
  pthread_detach(t);
  bg.wfd = p[1];
}

static bool bg_send(const bg_job_t *job) {
  ssize_t n;
  do n = write(bg.wfd, job, sizeof *job);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)sizeof *job;
}

bool cm_bg_run(void (*fn)(void *), void *data) {
  pthread_once(&bg.once, bg_start);
  if (bg.wfd < 0 || __atomic_load_n(&bg.dead, __ATOMIC_ACQUIRE) || cm_bg_pending() >= CM_BG_MAX)
    return false;
  if (!bg_send(&(bg_job_t){fn, data})) return false;
  bg.queued++;
  return true;
}

static void bg_post(void *sem) {
  sem_post(sem);
}

void cm_bg_flush(void) {
  if (bg.wfd < 0 || cm_bg_pending() == 0) return;
  /* A job of its own, after every one queued: they run in order. */
  sem_t sem;
  sem_init(&sem, 0, 0);
  bg_job_t job = {bg_post, &sem};
  while (!bg_send(&job)) {
    if (errno != EAGAIN) {
      cm_err("background worker: queueing: %s", strerror(errno));
      sem_destroy(&sem);
      return;
    }
    poll(&(struct pollfd){bg.wfd, POLLOUT, 0}, 1, 100);
  }
  bg.queued++;
  for (;;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    if (sem_timedwait(&sem, &ts) == 0) break;
    if (__atomic_load_n(&bg.dead, __ATOMIC_ACQUIRE)) return; /* (sem lost with it) */
  }
  sem_destroy(&sem);
}

size_t cm_bg_pending(void) {
  return (size_t)(bg.queued - __atomic_load_n(&bg.done, __ATOMIC_ACQUIRE));
}
