/* libmicrohttpd in our loop (http-internal.h): MHD_USE_EPOLL without an internal thread,
 * its epoll fd watched by cm_loop, MHD_run on readiness, on MHD's own timeout and soon
 * after we resume a connection; and the transport's periodic tick.  Before a deferred run
 * the replay bounds are enforced (stream.c), and each tick expires idle sessions
 * (session.c) and keep-alive connections (respond.c). */
#include <sys/epoll.h>

#include "transport/http/http-internal.h"

static void mhd_run(tr_http_t *h, bool from_soon);

static void on_soon(void *data) {
  tr_http_t *h = data;
  h->soon_pending = false;
  if (h->dead) {
    free(h);
    return;
  }
  /* What a revoked token opened ends, and replay memory over a bound is enforced, here: once
   * nothing on the stack uses streams. */
  if (h->revoke_pending) tr_hs_revoke_pass(h);
  if (h->replay_over) tr_hs_replay_enforce(h);
  mhd_run(h, true);
}

void tr_hs_soon(tr_http_t *h) {
  if (h->soon_pending || !h->daemon) return;
  h->soon_pending = true;
  cm_loop_defer(h->loop, on_soon, h);
}

static void on_mhd_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  tr_http_t *h = data;
  h->t_mhd = NULL;
  mhd_run(h, false);
}

void tr_hs_rearm(tr_http_t *h, bool from_soon) {
  MHD_UNSIGNED_LONG_LONG ms;
  if (!h->daemon) return;
  if (tr_mhd.get_timeout(h->daemon, &ms) != MHD_YES) {
    cm_timer_cancel(h->t_mhd);
    h->t_mhd = NULL;
    return;
  }
  if (ms == 0 && !from_soon) {
    tr_hs_soon(h);
    return;
  }
  if (ms > 24ull * 3600 * 1000) ms = 24ull * 3600 * 1000;
  uint64_t deadline = cm_now_ms() + ms;
  /* A timer that fires early only costs one MHD_run that finds nothing to do, so keep it
   * rather than re-creating a timerfd after every request. */
  if (h->t_mhd && h->t_mhd_deadline <= deadline) return;
  cm_timer_cancel(h->t_mhd);
  h->t_mhd = cm_loop_timer(h->loop, ms, on_mhd_timer, h);
  h->t_mhd_deadline = deadline;
}

static unsigned mhd_connections(tr_http_t *h) {
  const union MHD_DaemonInfo *di =
      tr_mhd.get_daemon_info(h->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return di ? di->num_connections : 0;
}

static void mhd_run(tr_http_t *h, bool from_soon) {
  if (!h->daemon) return;
  unsigned before = mhd_connections(h);
  tr_mhd.run(h->daemon);
  /* Out of descriptors, MHD stops accepting and takes the listening socket out of its epoll
   * set; a connection that closes lifts that, but the socket goes back only at the next
   * MHD_run, which nothing else may trigger (the connections waiting in the backlog do not
   * wake its epoll fd while the socket is out of it).  So: once more, soon. */
  if (mhd_connections(h) < before) tr_hs_soon(h);
  tr_hs_rearm(h, from_soon);
}

static void on_mhd_ready(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  mhd_run(data, false);
}

int tr_hs_daemon_watch(tr_http_t *h, int epoll_fd, cm_error_t *err) {
  h->w_epoll = cm_loop_watch(h->loop, epoll_fd, EPOLLIN, on_mhd_ready, h, err);
  return h->w_epoll ? 0 : -1;
}

static void on_tick(cm_loop_t *loop, cm_timer_t *t, void *data) {
  tr_http_t *h = data;
  h->t_tick = NULL;
  uint64_t now = cm_now_ms();
  tr_hs_sessions_expire(h, now);
  tr_hs_conns_keepalive(h, now);
  tr_hs_conns_cut_stalled(h, now);
  tr_hs_tick_arm(h);
}

void tr_hs_tick_arm(tr_http_t *h) {
  if (h->t_tick || !h->daemon || (!h->sessions && !h->conns)) return;
  uint64_t period = CM_MIN(h->idle_ms / 2, (uint64_t)5000);
  if (period < 50) period = 50;
  h->t_tick = cm_loop_timer(h->loop, period, on_tick, h);
}
