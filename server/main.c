/* mcp-python-exec-sandbox: parse flags, build the server, serve stdio until EOF (or
 * Streamable HTTP) until a termination signal, then cancel what runs, kill every child
 * and exit. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>

#include "server/server.h"

typedef struct app {
  cm_loop_t *loop;
  srv_server_t *server;
  srv_session_t *session;
  tr_stdio_t *stdio;
  tr_http_t *http;
  bool shutting_down;
  cm_timer_t *shutdown_timer;
  bool draining;
  uint64_t drain_started_ms;
  cm_timer_t *drain_poll, *drain_deadline;
} app_t;

static void on_message(void *data, const char *buf, size_t len, tr_sink_t *reply) {
  app_t *app = data;
  srv_session_handle(app->session, buf, len, reply);
}

static void on_oversize(void *data, size_t len, tr_sink_t *reply) {
  app_t *app = data;
  srv_session_oversize(app->session, len, reply);
}

static void check_drained(app_t *app);

static void on_shutdown_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  app_t *app = data;
  app->shutdown_timer = NULL;
  cm_warn(
      "shutdown: %zu requests still in flight and %zu teardowns (sandboxes, sessions, "
      "directories, cgroups) unfinished; stopping anyway (what is left is killed and removed "
      "now)",
      srv_server_inflight(app->server), srv_server_teardowns(app->server));
  cm_loop_stop(loop);
}

static void poll_drained(cm_loop_t *loop, cm_timer_t *t, void *data) {
  check_drained(data);
}

/* Done once no request is left and everything torn down has finished its teardown (held
 * sandboxes and session kernels, dropped once no call is left, and the sandboxes of calls
 * answered before their teardown was over): only then may the process exit, or a sandbox's
 * processes, mounts, cgroups or directories could outlive it.  Looked at on a timer: the loop
 * reaps the sandboxes and the background worker removes the directories meanwhile. */
static void check_drained(app_t *app) {
  if (srv_server_inflight(app->server) == 0) {
    srv_server_wind_down(app->server);
    if (srv_server_teardowns(app->server) == 0) {
      cm_loop_stop(app->loop);
      return;
    }
  }
  cm_loop_timer(app->loop, 10, poll_drained, app);
}

static void begin_shutdown(app_t *app, const char *why) {
  if (app->shutting_down) return;
  app->shutting_down = true;
  cm_timer_cancel(app->drain_poll);
  cm_timer_cancel(app->drain_deadline);
  app->drain_poll = app->drain_deadline = NULL;
  cm_debug("shutting down: %s", why);
  if (app->stdio) tr_stdio_stop_reading(app->stdio);
  /* Stops accepting, ends every stream and closes every session (which cancels its
   * requests). */
  if (app->http) tr_http_shutdown(app->http);
  /* No prestarted sandbox is set up from here on (a cancelled call's end would refill). */
  srv_server_wind_down(app->server);
  /* Every running script is killed (SIGTERM, grace, SIGKILL); their results are dropped. */
  srv_server_cancel_all(app->server);
  uint64_t grace = srv_server_config(app->server)->kill_grace_ms;
  app->shutdown_timer = cm_loop_timer(app->loop, grace + 3000, on_shutdown_timeout, app);
  check_drained(app);
}

/* The drain (SIGTERM, --drain-seconds): new calls are refused, those in progress go on; once
 * none is left, or at the deadline, the shutdown proper cancels what remains. */
static void drain_poll(cm_loop_t *loop, cm_timer_t *t, void *data) {
  app_t *app = data;
  app->drain_poll = NULL;
  if (srv_server_calls(app->server) == 0) {
    cm_info("drain: done in %llums (no call left); stopping",
            (unsigned long long)(cm_now_ms() - app->drain_started_ms));
    begin_shutdown(app, "drained");
    return;
  }
  app->drain_poll = cm_loop_timer(loop, 50, drain_poll, app);
}

static void drain_deadline(cm_loop_t *loop, cm_timer_t *t, void *data) {
  app_t *app = data;
  app->drain_deadline = NULL;
  cm_warn("drain: %zu calls still running after --drain-seconds; cancelling them",
          srv_server_calls(app->server));
  begin_shutdown(app, "the drain's deadline");
}

static void begin_drain(app_t *app, const char *why) {
  uint64_t seconds = srv_server_config(app->server)->drain_seconds;
  if (app->shutting_down) return;
  if (app->draining || seconds == 0) {
    /* A second SIGTERM (or no drain): now. */
    begin_shutdown(app, why);
    return;
  }
  app->draining = true;
  app->drain_started_ms = cm_now_ms();
  cm_info("%s: draining (new calls are refused; %zu running may finish within %llus)", why,
          srv_server_calls(app->server), (unsigned long long)seconds);
  srv_server_drain(app->server);
  tr_http_drain(app->http, (unsigned)(seconds < 60 ? seconds : 60));
  app->drain_deadline = cm_loop_timer(app->loop, seconds * 1000, drain_deadline, app);
  drain_poll(app->loop, NULL, app);
}

static void on_eof(void *data) {
  begin_shutdown(data, "end of input");
}

static void on_signal(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  app_t *app = data;
  struct signalfd_siginfo si;
  while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (si.ssi_signo == SIGHUP)
      srv_server_reopen_logs(app->server); /* the tokens and logrotate's postrotate: not a stop */
    else if (si.ssi_signo == SIGTERM)
      begin_drain(app, strsignal((int)si.ssi_signo));
    else
      begin_shutdown(app, strsignal((int)si.ssi_signo));
  }
}

int main(int argc, char **argv) {
  bool journal = cm_log_detect_journal();
  /* What is always shown (not log lines) gets its priority in the journal too. */
  const char *error_prefix = journal ? "<3>" : "";
  srv_config_t cfg;
  srv_config_defaults(&cfg);
  cm_error_t err = CM_ERROR_INIT;
  int rc = srv_config_parse(&cfg, argc, argv, &err);
  if (rc == 0) rc = srv_config_validate(&cfg, &err);
  if (rc > 0 && cfg.show_version) {
    /* The first line is the seed's; then where this binary takes its helpers from. */
    printf("%s %s\n", SRV_NAME, srv_version());
    cm_buf_t t;
    cm_buf_init(&t, 0);
    srv_describe_installation(&t, NULL);
    cleanup_free char *text = cm_buf_steal(&t);
    fputs(text, stdout);
  }
  if (rc != 0) {
    if (rc < 0)
      fprintf(stderr, "%s%s: error: %s\n", error_prefix, SRV_NAME, cm_error_message(&err));
    cm_error_release(&err);
    srv_config_release(&cfg);
    return rc < 0 ? 2 : 0;
  }
  cm_log_set_level(cfg.log_level);
  signal(SIGPIPE, SIG_IGN);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  app_t app = {0};
  app.loop = cm_loop_new(&err);
  if (!app.loop || sfd < 0) {
    fprintf(stderr, "%s%s: error: %s\n", error_prefix, SRV_NAME,
            app.loop ? "signalfd failed" : cm_error_message(&err));
    return 1;
  }
  app.server = srv_server_new(app.loop, &cfg, &err);
  if (!app.server) {
    fprintf(stderr, "%s%s: error: %s\n", error_prefix, SRV_NAME, cm_error_message(&err));
    cm_error_release(&err);
    cm_loop_free(app.loop);
    close(sfd);
    srv_config_release(&cfg);
    return 1;
  }
  if (strcmp(cfg.transport, "http") == 0) {
    if (srv_serve_http(app.loop, app.server, &cfg, &app.http, &err) < 0) {
      fprintf(stderr, "%s%s: error: %s\n", error_prefix, SRV_NAME, cm_error_message(&err));
      cm_error_release(&err);
      srv_server_free(app.server);
      cm_loop_free(app.loop);
      srv_config_release(&cfg);
      return 1;
    }
    cleanup_free char *url = srv_http_url(&cfg, tr_http_port(app.http));
    /* Always shown (not a log line): users need it to configure their client.  In the
     * journal, a notice. */
    fprintf(stderr, "%s%s %s listening on %s (sandbox %s)\n", journal ? "<5>" : "", SRV_NAME,
            srv_version(), url, cfg.sandbox_backend);
  } else {
    tr_stdio_callbacks_t cbs = {
        .on_message = on_message, .on_oversize = on_oversize, .on_eof = on_eof};
    app.stdio = tr_stdio_new(app.loop, STDIN_FILENO, STDOUT_FILENO, cfg.max_message_bytes, &cbs,
                             &app, &err);
    if (!app.stdio) {
      fprintf(stderr, "%s%s: error: %s\n", error_prefix, SRV_NAME, cm_error_message(&err));
      return 1;
    }
    app.session = srv_session_new(app.server, tr_stdio_sink(app.stdio));
    cm_info("%s %s serving on stdio (sandbox %s)", SRV_NAME, srv_version(), cfg.sandbox_backend);
  }
  cm_watch_t *sw = cm_loop_watch(app.loop, sfd, EPOLLIN, on_signal, &app, &err);

  if (cm_loop_run(app.loop, &err) < 0) cm_err("event loop: %s", cm_error_message(&err));
  cm_timer_cancel(app.shutdown_timer);
  cm_timer_cancel(app.drain_poll);
  cm_timer_cancel(app.drain_deadline);
  srv_session_free(app.session);
  if (app.stdio) {
    tr_stdio_flush(app.stdio, 2000);
    tr_stdio_free(app.stdio);
  }
  /* After the sessions (closed by tr_http_shutdown) and before the server. */
  tr_http_free(app.http);
  srv_server_free(app.server);
  cm_watch_remove(sw);
  cm_loop_free(app.loop);
  close(sfd);
  srv_config_release(&cfg);
  cm_error_release(&err);
  return 0;
}
