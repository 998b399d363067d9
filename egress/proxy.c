/* The egress proxy (see egress.h): sessions, connections, the resolver, the relay.
 *
 * One connection goes through these states:
 *   HEAD        reading the client's request head (HTTP, or a SOCKS5 greeting and request),
 *               at most EG_HEAD_MAX bytes within EG_HEAD_TIMEOUT_MS;
 *   RESOLVING   a c-ares lookup of the host (skipped for literals);
 *   CONNECTING  a non-blocking connect to the next allowed address;
 *   TLS         the TLS handshake of an index request to an https index;
 *   RELAY       bytes both ways through two bounded buffers: a side is read only while the
 *               buffer towards its peer has room and the run's rate allows it, so a slow
 *               reader slows its writer and nothing grows.  For a forwarded plain-HTTP
 *               request every response head is rewritten (hop-by-hop headers dropped, and an
 *               index's cookies), the interim (1xx) ones and the final one (Connection:
 *               close), before the body is relayed as it comes.
 * A refusal (policy, resolution, connection) answers the client with a short HTTP (or
 * SOCKS5) error and closes.  Connections are freed from the loop's deferred queue, never
 * inside one of their own callbacks. */
#include <ares.h>
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "egress/egress-internal.h"
#include "egress/tls.h"

#define EG_RELAY_BUF (64u << 10)
#define EG_HEAD_TIMEOUT_MS 30000
#define EG_CONNECT_TIMEOUT_MS 15000
#define EG_MAX_CANDIDATES 8
/* The addresses of the denied names a connection keeps (more: refused, as unjudgeable). */
#define EG_MAX_DENIED_ADDRS 256
#define EG_DEFAULT_MAX_CONNECTIONS 64
#define EG_DEFAULT_MAX_TOTAL 4096
/* All sessions together: beyond this, sessions wait (their sockets are not read).  Lowered
 * at start so that egress (two fds per connection) never takes more than half of the
 * server's open-file limit (see eg_proxy_new). */
#define EG_GLOBAL_MAX_CONNECTIONS 2048
#define EG_MAX_ARES_SOCKETS 32
#define EG_MAX_INDEXES 200
/* The links of an index's pages it remembers (the oldest go first), and how much of one page's
 * body is scanned for them. */
#define EG_INDEX_MAX_LINKS 16384
#define EG_INDEX_MAX_LINK_BYTES (8u << 20)
#define EG_PAGE_SCAN_MAX (64u << 20)

typedef struct conn conn_t;

/* C_CTLS: an intercepted connection's TLS handshake with the client (after the upstream's). */
typedef enum conn_state {
  C_HEAD = 1,
  C_RESOLVING,
  C_CONNECTING,
  C_TLS,
  C_CTLS,
  C_RELAY
} conn_state_t;
typedef enum conn_kind { K_CONNECT = 1, K_FORWARD, K_INDEX, K_SOCKS } conn_kind_t;

typedef struct rbuf {
  char *data;
  size_t start, len;
} rbuf_t;

/* One c-ares query of a connection: its target's name, or the name of a --network-deny rule
 * (whose addresses the destination must not be). */
typedef struct lookup {
  conn_t *conn; /* NULL once the connection is gone */
  struct lookup *next;
  long deny; /* -1: the target; else the index of the deny rule */
} lookup_t;

struct conn {
  eg_session_t *s;
  conn_t *prev, *next;
  int cfd, ufd;
  cm_watch_t *cw, *uw;
  uint32_t cev, uev; /* the events each watch has */
  conn_state_t state;
  conn_kind_t kind;
  bool closed;
  char *head; /* EG_HEAD_MAX: the request head, then (forward) the response head */
  size_t head_len;
  bool socks_greeted;
  size_t socks_consumed;
  eg_request_t *req;
  char host[EG_HOST_MAX + 1];
  uint16_t port;
  int index;            /* K_INDEX: the index it goes to; K_FORWARD: the credentialed index whose
                         * origin it is, or -1 */
  bool credentialed;    /* the index's credentials go with it (eg_index_credentials_apply) */
  char *page_target;    /* a page of the index (below its path): its target, whose links are
                         * learnt from the answer; else NULL */
  eg_page_scan_t *scan; /* the answer's body being scanned for links, or NULL */
  uint64_t scanned;     /* bytes of it scanned */
  lookup_t *lookups;    /* the queries under way */
  size_t pending;       /* lookups not answered yet (+1 while they are being started) */
  eg_addr_t *target;    /* the target's addresses (heap), n_target of them */
  size_t n_target;
  char *target_error;     /* why the target did not resolve (heap) */
  eg_name_addr_t *denied; /* what the denied names resolved to (heap) */
  size_t n_denied;
  char *denied_error; /* a denied name that could not be resolved: refused (heap) */
  eg_addr_t cand[EG_MAX_CANDIDATES];
  bool cand_own[EG_MAX_CANDIDATES]; /* judged as this host's own (and opened by a rule) */
  size_t n_cand, next_cand;
  cm_timer_t *timer;
  rbuf_t c2u, u2c;
  bool resp_head; /* K_FORWARD/K_INDEX: response heads to rewrite (up to the final one) */
  bool c_eof, u_eof, c_shut, u_shut;
  eg_tls_t *tls;
  bool secret_bytes; /* a secret's value went through its buffers: wiped when freed */
  /* A CONNECT to a host a secret of the session is bound to: the proxy speaks TLS to both
   * sides (ctls: the client's), reads the one request inside, substitutes and forwards it. */
  bool intercept;
  eg_tls_t *ctls;
  bool ctls_up; /* its handshake is done: answers go through it */
};

typedef struct ares_watch {
  int fd;
  cm_watch_t *w;
  uint32_t events;
} ares_watch_t;

typedef struct eg_index {
  eg_url_t url;
  char *host_header;    /* Host: value */
  char *authorization;  /* "Basic ...", or NULL */
  char *origin_path;    /* the URL's path, for eg_proxy_index_url */
  eg_link_set_t *links; /* what its pages linked to (the credentials go with those too) */
} eg_index_t;

/* A secret a session may use (eg_session_add_secret). */
typedef struct session_secret session_secret_t;
struct session_secret {
  char name[EG_SECRET_NAME_MAX + 1];
  char placeholder[EG_SECRET_PLACEHOLDER_MAX];
  const eg_secret_value_t *value;
  eg_rule_t *hosts;
  size_t n_hosts;
};

struct eg_session {
  eg_proxy_t *proxy;
  session_secret_t secrets[EG_SESSION_SECRETS_MAX];
  size_t n_secrets;
  eg_session_t *prev, *next;
  int fd;
  cm_watch_t *w;
  bool reading; /* the watch asks for EPOLLIN */
  unsigned flags;
  eg_policy_t policy;
  eg_rule_t *narrow;
  size_t n_narrow;
  conn_t *conns;
  size_t n_conns;
  eg_stats_t stats;
  double tokens;
  uint64_t refill_us;
  cm_timer_t *rate_timer;
  bool throttled;
};

struct eg_proxy {
  cm_loop_t *loop;
  ares_channel channel;
  bool channel_ok;
  ares_watch_t aw[EG_MAX_ARES_SOCKETS];
  size_t n_aw;
  cm_timer_t *ares_timer;
  char *dns_servers;
  eg_session_t *sessions;
  size_t n_conns, global_max;
  uint64_t max_conns, max_total, rate;
  eg_index_t indexes[EG_MAX_INDEXES];
  size_t n_indexes;
  eg_tls_ctx_t *tls;
  char *ca_file;
  eg_tls_ca_t *ca;
};

static void conn_close(conn_t *c);
static void conn_update(conn_t *c);
static void conn_connect_next(conn_t *c);
static void session_update_reading(eg_session_t *s);
static void ares_reschedule(eg_proxy_t *p);
static bool substitute_secrets(conn_t *c, bool tls);
static bool secret_bound(const session_secret_t *k, const char *host, uint16_t port);

/* ---------------------------------------------------------------- small helpers */

static void record_denied(eg_session_t *s, const char *host, uint16_t port, const char *why) {
  eg_stats_t *st = &s->stats;
  for (size_t i = 0; i < st->n_denied; i++)
    if (st->denied[i].port == port && strcmp(st->denied[i].host, host) == 0) return;
  if (st->n_denied >= EG_DENIED_MAX) {
    st->denied_more++;
    return;
  }
  eg_denied_t *d = &st->denied[st->n_denied++];
  snprintf(d->host, sizeof d->host, "%s", host);
  d->port = port;
  snprintf(d->reason, sizeof d->reason, "%s", why);
}

/* One non-blocking write of a short answer; the connection closes right after, so what the
 * socket buffer does not take is dropped (it always takes this little). */
static void reply_and_close(conn_t *c, int status, const char *reason, const char *text) {
  if (c->kind == K_SOCKS) {
    uint8_t rep[10] = {5, 1, 0, 1};
    rep[1] = status == 403 ? 2 : status == 502 ? 4 : status == 504 ? 4 : 1;
    (void)!write(c->cfd, rep, sizeof rep);
  } else if (c->cfd >= 0) {
    char buf[1024];
    int body = (int)strlen(text) + 1;
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %d\r\nConnection: close\r\nX-MPS-Egress: %s\r\n\r\n%s\n",
                     status, reason, body, status == 403 ? "denied" : "error", text);
    size_t len = n > 0 ? CM_MIN((size_t)n, sizeof buf - 1) : 0;
    if (c->ctls && c->ctls_up) {
      (void)eg_tls_write(c->ctls, buf, len);
      eg_tls_shutdown(c->ctls);
    } else if (!c->ctls && len) {
      (void)!write(c->cfd, buf, len);
    }
  }
  conn_close(c);
}

/* why goes to the run's result; the client gets shown, which may say less (never what a
 * name resolved to: the host's resolver sees names the sandbox must not map). */
static void deny_shown(conn_t *c, const char *why, const char *shown) {
  record_denied(c->s, c->host, c->port, why);
  cm_debug("egress: denied %s:%u: %s", c->host, (unsigned)c->port, why);
  cleanup_free char *text =
      xasprintf("mcp-python-exec-sandbox egress proxy: %s:%u is not allowed: %s", c->host,
                (unsigned)c->port, shown);
  reply_and_close(c, 403, "Forbidden", text);
}

static void deny(conn_t *c, const char *why) {
  deny_shown(c, why, why);
}

static bool rbuf_alloc(rbuf_t *b) {
  if (!b->data) b->data = xmalloc(EG_RELAY_BUF);
  return true;
}

static size_t rbuf_room(const rbuf_t *b) {
  return EG_RELAY_BUF - b->len;
}

/* Where to read into (contiguous room at the end), compacting first when needed. */
static char *rbuf_tail(rbuf_t *b, size_t *room) {
  if (b->start + b->len == EG_RELAY_BUF && b->start > 0) {
    memmove(b->data, b->data + b->start, b->len);
    b->start = 0;
  }
  *room = EG_RELAY_BUF - b->start - b->len;
  return b->data + b->start + b->len;
}

static void rbuf_push(rbuf_t *b, const void *data, size_t n) {
  if (b->start > 0 && b->start + b->len + n > EG_RELAY_BUF) {
    memmove(b->data, b->data + b->start, b->len);
    b->start = 0;
  }
  size_t room = EG_RELAY_BUF - b->start - b->len;
  if (n > room) n = room; /* callers check rbuf_room first */
  memcpy(b->data + b->start + b->len, data, n);
  b->len += n;
}

static void rbuf_consume(rbuf_t *b, size_t n) {
  b->start += n;
  b->len -= n;
  if (b->len == 0) b->start = 0;
}

/* ---------------------------------------------------------------- the rate */

static void rate_refill(eg_session_t *s) {
  eg_proxy_t *p = s->proxy;
  if (!p->rate) return;
  uint64_t now = cm_now_us();
  if (s->refill_us == 0) {
    s->tokens = (double)p->rate;
  } else if (now > s->refill_us) {
    s->tokens += (double)(now - s->refill_us) * (double)p->rate / 1e6;
    if (s->tokens > (double)p->rate) s->tokens = (double)p->rate; /* a burst of one second */
  }
  s->refill_us = now;
}

static void on_rate_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  eg_session_t *s = data;
  s->rate_timer = NULL;
  s->throttled = false;
  rate_refill(s);
  for (conn_t *c = s->conns; c; c = c->next) conn_update(c);
}

/* How many bytes a read may take now (at most want); 0 = throttled until the timer. */
static size_t rate_allow(eg_session_t *s, size_t want) {
  eg_proxy_t *p = s->proxy;
  if (!p->rate) return want;
  if (s->throttled) return 0;
  rate_refill(s);
  if (s->tokens >= 1.0) return CM_MIN(want, (size_t)s->tokens);
  s->throttled = true;
  /* Wake when a useful amount (a few KiB, or a tenth of a second's worth) is back. */
  double need = CM_MIN((double)p->rate / 10.0, 16384.0) - s->tokens;
  uint64_t ms = (uint64_t)(need * 1000.0 / (double)p->rate) + 1;
  s->rate_timer = cm_loop_timer(p->loop, ms, on_rate_timer, s);
  return 0;
}

static void rate_take(eg_session_t *s, size_t n) {
  if (s->proxy->rate) s->tokens -= (double)n;
}

/* ---------------------------------------------------------------- own addresses */

int eg_addr_is_local(const eg_addr_t *addr) {
  eg_addr_t a;
  eg_addr_normalise(addr, &a);
  size_t len = a.family == AF_INET ? 4 : 16;
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return -1;
  struct {
    struct nlmsghdr h;
    struct rtmsg r;
    char attrs[RTA_SPACE(16)];
  } req;
  memset(&req, 0, sizeof req);
  req.h.nlmsg_len = NLMSG_LENGTH(sizeof req.r);
  req.h.nlmsg_type = RTM_GETROUTE;
  req.h.nlmsg_flags = NLM_F_REQUEST;
  req.h.nlmsg_seq = 1;
  req.r.rtm_family = (unsigned char)a.family;
  req.r.rtm_dst_len = (unsigned char)(len * 8);
  struct rtattr *rta = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.h.nlmsg_len));
  rta->rta_type = RTA_DST;
  rta->rta_len = (unsigned short)RTA_LENGTH(len);
  memcpy(RTA_DATA(rta), a.bytes, len);
  req.h.nlmsg_len = NLMSG_ALIGN(req.h.nlmsg_len) + RTA_ALIGN(rta->rta_len);
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  int rc = -1;
  if (sendto(fd, &req, req.h.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) goto out;
  /* The kernel answers while handling the request: the answer is there at once (never a wait
   * on the loop; none there is "cannot tell"). */
  union {
    struct nlmsghdr h;
    char buf[8192];
  } answer;
  ssize_t n = recv(fd, answer.buf, sizeof answer.buf, MSG_DONTWAIT);
  if (n < (ssize_t)sizeof(struct nlmsghdr)) goto out;
  for (struct nlmsghdr *h = &answer.h; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      /* No route to it (unreachable, prohibited, a family the host lacks): not ours. */
      rc = 0;
      break;
    }
    if (h->nlmsg_type == RTM_NEWROUTE && h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct rtmsg))) {
      const struct rtmsg *r = NLMSG_DATA(h);
      rc = r->rtm_type == RTN_LOCAL;
      break;
    }
  }
out:;
  int saved = errno;
  close(fd);
  errno = saved;
  return rc;
}

/* Has a connection ended up at this host (its local and peer addresses are the same)?  What
 * the kernel delivers to itself through a local route: the last word on own addresses. */
static bool connected_to_self(int fd) {
  struct sockaddr_storage l, r;
  socklen_t ll = sizeof l, rl = sizeof r;
  if (getsockname(fd, (struct sockaddr *)&l, &ll) < 0 ||
      getpeername(fd, (struct sockaddr *)&r, &rl) < 0)
    return false;
  eg_addr_t a[2] = {{0}, {0}};
  const struct sockaddr_storage *ss[2] = {&l, &r};
  for (int i = 0; i < 2; i++) {
    eg_addr_t raw = {.family = ss[i]->ss_family};
    if (ss[i]->ss_family == AF_INET)
      memcpy(raw.bytes, &((const struct sockaddr_in *)ss[i])->sin_addr, 4);
    else if (ss[i]->ss_family == AF_INET6)
      memcpy(raw.bytes, &((const struct sockaddr_in6 *)ss[i])->sin6_addr, 16);
    else
      return false;
    eg_addr_normalise(&raw, &a[i]);
  }
  return eg_addr_equal(&a[0], &a[1]);
}

/* ---------------------------------------------------------------- c-ares on the loop */

static void on_ares_fd(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  eg_proxy_t *p = data;
  ares_socket_t r = (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) ? fd : ARES_SOCKET_BAD;
  ares_socket_t w = (revents & EPOLLOUT) ? fd : ARES_SOCKET_BAD;
  ares_process_fd(p->channel, r, w);
  ares_reschedule(p);
}

static void on_ares_sock_state(void *data, ares_socket_t fd, int readable, int writable) {
  eg_proxy_t *p = data;
  size_t i = 0;
  while (i < p->n_aw && p->aw[i].fd != fd) i++;
  uint32_t ev = (readable ? EPOLLIN : 0) | (writable ? EPOLLOUT : 0);
  cm_error_t err = CM_ERROR_INIT;
  if (i < p->n_aw) {
    if (!ev) {
      cm_watch_remove(p->aw[i].w);
      p->aw[i] = p->aw[--p->n_aw];
    } else if (cm_watch_set_events(p->aw[i].w, ev, &err) == 0) {
      p->aw[i].events = ev;
    }
  } else if (ev && p->n_aw < EG_MAX_ARES_SOCKETS) {
    cm_watch_t *w = cm_loop_watch(p->loop, fd, ev, on_ares_fd, p, &err);
    if (w) p->aw[p->n_aw++] = (ares_watch_t){fd, w, ev};
  }
  if (err.msg) cm_warn("egress resolver: %s", cm_error_message(&err));
  cm_error_release(&err);
}

static int on_ares_sock_config(ares_socket_t fd, int type, void *data) {
  return cm_set_cloexec(fd) < 0 ? -1 : 0;
}

static void on_ares_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  eg_proxy_t *p = data;
  p->ares_timer = NULL;
  ares_process_fd(p->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
  ares_reschedule(p);
}

static void ares_reschedule(eg_proxy_t *p) {
  cm_timer_cancel(p->ares_timer);
  p->ares_timer = NULL;
  struct timeval tv, *next = ares_timeout(p->channel, NULL, &tv);
  if (!next) return;
  uint64_t ms = (uint64_t)next->tv_sec * 1000 + (uint64_t)next->tv_usec / 1000 + 1;
  p->ares_timer = cm_loop_timer(p->loop, ms, on_ares_timer, p);
}

/* ---------------------------------------------------------------- resolving */

static void resolved(conn_t *c, const eg_addr_t *addrs, size_t n, const char *error) {
  if (error) {
    cleanup_free char *text =
        xasprintf("mcp-python-exec-sandbox egress proxy: cannot resolve %s: %s", c->host, error);
    reply_and_close(c, 502, "Bad Gateway", text);
    return;
  }
  eg_session_t *s = c->s;
  char first_why[EG_REASON_MAX] = "", first_shown[EG_REASON_MAX] = "";
  c->n_cand = 0;
  for (size_t i = 0; i < n && c->n_cand < EG_MAX_CANDIDATES; i++) {
    char why[EG_REASON_MAX];
    bool narrowed = s->narrow != NULL;
    const eg_rule_t *d =
        eg_policy_deny_resolved(&s->policy, c->denied, c->n_denied, &addrs[i], c->port);
    if (d) {
      /* The client hears which rule, never the address (the sandbox cannot resolve). */
      if (!first_why[0]) {
        char at[64];
        snprintf(first_shown, sizeof first_shown,
                 "denied by --network-deny %.100s (the same destination)", d->text);
        snprintf(first_why, sizeof first_why,
                 "denied by --network-deny %.100s (that name resolves to %s)", d->text,
                 eg_addr_format(&addrs[i], at, sizeof at));
      }
      continue;
    }
    /* The server's own addresses, asked of the kernel for this very address (an address it
     * cannot judge is refused as one). */
    int local = eg_addr_is_local(&addrs[i]);
    if (local < 0) cm_warn("egress: cannot tell whether an address is this host's: %m");
    if (eg_policy_allows(&s->policy, narrowed ? s->narrow : NULL, s->n_narrow, c->host, &addrs[i],
                         c->port, &addrs[i], local != 0 ? 1 : 0, why, sizeof why)) {
      c->cand_own[c->n_cand] = local != 0;
      c->cand[c->n_cand++] = addrs[i];
    } else if (!first_why[0]) {
      snprintf(first_shown, sizeof first_shown, "%s", why);
      char at[64];
      if (eg_addr_parse(c->host, strlen(c->host), &(eg_addr_t){0}) == 0)
        snprintf(first_why, sizeof first_why, "%s", why);
      else
        snprintf(first_why, sizeof first_why, "%.120s (%s resolves to %s)", why,
                 c->host[0] ? "the name" : "it", eg_addr_format(&addrs[i], at, sizeof at));
    }
  }
  if (c->n_cand == 0) {
    if (first_why[0])
      deny_shown(c, first_why, first_shown);
    else
      deny(c, "no address");
    return;
  }
  c->next_cand = 0;
  conn_connect_next(c);
}

/* Every query of c is answered: judge. */
static void lookups_done(conn_t *c) {
  if (c->denied_error) {
    deny(c, c->denied_error);
    return;
  }
  if (c->target_error) {
    resolved(c, NULL, 0, c->target_error);
    return;
  }
  resolved(c, c->target, c->n_target, c->n_target ? NULL : "no address");
}

static void lookup_unlink(conn_t *c, lookup_t *lk) {
  for (lookup_t **pp = &c->lookups; *pp; pp = &(*pp)->next)
    if (*pp == lk) {
      *pp = lk->next;
      return;
    }
}

static void on_addrinfo(void *arg, int status, int timeouts, struct ares_addrinfo *res) {
  lookup_t *lk = arg;
  conn_t *c = lk->conn;
  long deny_index = lk->deny;
  if (c) lookup_unlink(c, lk);
  free(lk);
  if (!c) {
    if (res) ares_freeaddrinfo(res);
    return;
  }
  eg_addr_t addrs[32];
  size_t n = 0;
  for (struct ares_addrinfo_node *nd = res && status == ARES_SUCCESS ? res->nodes : NULL;
       nd && n < CM_ARRAY_SIZE(addrs); nd = nd->ai_next) {
    if (nd->ai_family == AF_INET && nd->ai_addr) {
      addrs[n] = (eg_addr_t){.family = AF_INET};
      memcpy(addrs[n].bytes, &((struct sockaddr_in *)nd->ai_addr)->sin_addr, 4);
      n++;
    } else if (nd->ai_family == AF_INET6 && nd->ai_addr) {
      addrs[n] = (eg_addr_t){.family = AF_INET6};
      memcpy(addrs[n].bytes, &((struct sockaddr_in6 *)nd->ai_addr)->sin6_addr, 16);
      n++;
    }
  }
  if (res) ares_freeaddrinfo(res);
  if (deny_index < 0) {
    if (status != ARES_SUCCESS) {
      c->target_error = xstrdup(ares_strerror(status));
    } else {
      c->target = n ? xmemdup(addrs, n * sizeof *addrs) : NULL;
      c->n_target = n;
    }
  } else if (status == ARES_SUCCESS) {
    if (c->n_denied + n > EG_MAX_DENIED_ADDRS) {
      if (!c->denied_error)
        c->denied_error = xasprintf(
            "the names of --network-deny rules resolve to more than %d "
            "addresses, too many to judge this destination",
            EG_MAX_DENIED_ADDRS);
    } else {
      c->denied = xrealloc(c->denied, (c->n_denied + n) * sizeof *c->denied);
      for (size_t i = 0; i < n; i++)
        c->denied[c->n_denied++] = (eg_name_addr_t){(size_t)deny_index, addrs[i]};
    }
  } else if (status != ARES_ENOTFOUND && status != ARES_ENODATA && !c->denied_error) {
    /* A denied name that does not exist names no destination; one the resolver cannot
     * answer for might be this one: refuse rather than guess. */
    const eg_rule_t *r = &c->s->policy.deny[deny_index];
    c->denied_error = xasprintf(
        "cannot resolve %.100s (a --network-deny name) to judge this "
        "destination: %s",
        r->host, ares_strerror(status));
  }
  if (--c->pending == 0) lookups_done(c);
}

static void lookup_start(conn_t *c, const char *name, long deny_index) {
  eg_proxy_t *p = c->s->proxy;
  lookup_t *lk = xcalloc(1, sizeof *lk);
  lk->conn = c;
  lk->deny = deny_index;
  lk->next = c->lookups;
  c->lookups = lk;
  c->pending++;
  struct ares_addrinfo_hints hints = {
      .ai_flags = ARES_AI_NOSORT, .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  /* May answer at once (the hosts file, say); c->pending holds the judgement back until every
   * query is started. */
  ares_getaddrinfo(p->channel, name, NULL, &hints, on_addrinfo, lk);
}

/* The target is known (c->host, c->port): judge it, resolve it, connect. */
static void conn_route(conn_t *c) {
  eg_session_t *s = c->s;
  char why[EG_REASON_MAX];
  if (eg_policy_precheck(&s->policy, s->narrow, s->n_narrow, c->host, c->port, why, sizeof why) <
      0) {
    deny(c, why);
    return;
  }
  cm_timer_cancel(c->timer);
  c->timer = NULL;
  /* A --network-deny NAME denies the destination that name is: its addresses are resolved
   * now, beside the target's, and no address of the target may be one of them. */
  bool deny_names = false;
  for (size_t i = 0; i < s->policy.n_deny; i++)
    deny_names |= eg_rule_deny_resolves(&s->policy.deny[i], c->port);
  eg_addr_t lit;
  bool literal = eg_addr_parse(c->host, strlen(c->host), &lit) == 0;
  if (literal && !deny_names) {
    resolved(c, &lit, 1, NULL);
    return;
  }
  eg_proxy_t *p = s->proxy;
  if (!p->channel_ok) {
    resolved(c, NULL, 0, "the resolver is not available");
    return;
  }
  if (literal) {
    c->target = xmemdup(&lit, sizeof lit);
    c->n_target = 1;
  }
  c->state = C_RESOLVING;
  conn_update(c);
  c->pending = 1;
  if (!literal) lookup_start(c, c->host, -1);
  for (size_t i = 0; i < s->policy.n_deny && !c->closed; i++)
    if (eg_rule_deny_resolves(&s->policy.deny[i], c->port))
      lookup_start(c, s->policy.deny[i].host, (long)i);
  ares_reschedule(p);
  if (!c->closed && --c->pending == 0) lookups_done(c);
}

/* ---------------------------------------------------------------- connecting */

static void on_connect_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  conn_t *c = data;
  c->timer = NULL;
  /* A TLS handshake that timed out: the next address gets a session of its own. */
  if (c->tls) eg_tls_free(c->tls);
  c->tls = NULL;
  if (c->uw) cm_watch_remove(c->uw);
  c->uw = NULL;
  if (c->ufd >= 0) close(c->ufd);
  c->ufd = -1;
  conn_connect_next(c);
}

static void on_upstream(cm_loop_t *loop, int fd, uint32_t revents, void *data);
static void start_relay(conn_t *c);
static void start_intercept(conn_t *c);

static void conn_connect_next(conn_t *c) {
  int saved = 0;
  while (c->next_cand < c->n_cand) {
    eg_addr_t *a = &c->cand[c->next_cand++];
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    if (a->family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)&ss;
      in->sin_family = AF_INET;
      in->sin_port = htons(c->port);
      memcpy(&in->sin_addr, a->bytes, 4);
      sl = sizeof *in;
    } else {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(c->port);
      memcpy(&in6->sin6_addr, a->bytes, 16);
      sl = sizeof *in6;
    }
    int fd = socket(a->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      saved = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS) {
      saved = errno;
      close(fd);
      continue;
    }
    c->ufd = fd;
    c->state = C_CONNECTING;
    cm_error_t err = CM_ERROR_INIT;
    c->uev = EPOLLOUT;
    c->uw = cm_loop_watch(c->s->proxy->loop, fd, EPOLLOUT, on_upstream, c, &err);
    if (!c->uw) {
      cm_error_release(&err);
      close(fd);
      c->ufd = -1;
      continue;
    }
    cm_timer_cancel(c->timer);
    c->timer = cm_loop_timer(c->s->proxy->loop, EG_CONNECT_TIMEOUT_MS, on_connect_timeout, c);
    conn_update(c);
    return;
  }
  cleanup_free char *text =
      xasprintf("mcp-python-exec-sandbox egress proxy: cannot connect to %s:%u: %s", c->host,
                (unsigned)c->port, saved ? strerror(saved) : "no answer");
  reply_and_close(c, 502, "Bad Gateway", text);
}

/* ---------------------------------------------------------------- relay */

static bool up_tls(const conn_t *c) {
  return c->tls != NULL;
}

/* What the upstream socket delivers: >0 bytes, 0 EOF, -1 again later, -2 error. */
static ssize_t up_read(conn_t *c, char *buf, size_t n) {
  if (up_tls(c)) return eg_tls_read(c->tls, buf, n);
  ssize_t r = read(c->ufd, buf, n);
  if (r >= 0) return r;
  return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

static ssize_t up_write(conn_t *c, const char *buf, size_t n) {
  if (up_tls(c)) return eg_tls_write(c->tls, buf, n);
  ssize_t r = send(c->ufd, buf, n, MSG_NOSIGNAL);
  if (r >= 0) return r;
  return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

/* The client's side, through TLS when intercepted: >0, 0 EOF, -1 again later, -2 error. */
static ssize_t cl_read(conn_t *c, char *buf, size_t n) {
  if (c->ctls) return eg_tls_read(c->ctls, buf, n);
  ssize_t r = read(c->cfd, buf, n);
  if (r >= 0) return r;
  return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

static ssize_t cl_write(conn_t *c, const char *buf, size_t n) {
  if (c->ctls) return eg_tls_write(c->ctls, buf, n);
  ssize_t r = send(c->cfd, buf, n, MSG_NOSIGNAL);
  if (r >= 0) return r;
  return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

/* The upstream socket has nothing more to give or take: what is still to go to the client
 * goes on, what the client still sends is dropped. */
static void upstream_gone(conn_t *c) {
  cm_watch_remove(c->uw);
  c->uw = NULL;
  c->uev = 0;
  if (c->tls) eg_tls_free(c->tls);
  c->tls = NULL;
  if (c->ufd >= 0) close(c->ufd);
  c->ufd = -1;
  c->u_eof = true;
  c->c2u.start = c->c2u.len = 0;
}

static void on_linger(cm_loop_t *loop, cm_timer_t *t, void *data) {
  conn_t *c = data;
  c->timer = NULL;
  conn_close(c);
}

#define EG_LINGER_MS 5000

static void maybe_finish(conn_t *c) {
  if (c->ufd >= 0 && c->c_eof && c->c2u.len == 0 && !c->u_shut) {
    c->u_shut = true;
    if (!up_tls(c)) shutdown(c->ufd, SHUT_WR);
  }
  if (c->u_eof && c->ufd >= 0 && c->c2u.len == 0) upstream_gone(c);
  if (c->u_eof && c->u2c.len == 0 && !c->resp_head) {
    if (c->c_eof) {
      conn_close(c);
      return;
    }
    if (!c->c_shut) {
      /* Our end is done: the client sees the end of the stream.  Closing at once could
       * turn unread bytes of the client's into a reset that loses the answer, so wait a
       * little for the client to close. */
      c->c_shut = true;
      if (c->ctls) eg_tls_shutdown(c->ctls);
      shutdown(c->cfd, SHUT_WR);
      cm_timer_cancel(c->timer);
      c->timer = cm_loop_timer(c->s->proxy->loop, EG_LINGER_MS, on_linger, c);
    }
  }
}

static void on_page_link(void *data, const char *link, size_t len) {
  conn_t *c = data;
  eg_index_t *ix = &c->s->proxy->indexes[c->index];
  cleanup_free char *target = eg_link_resolve(&ix->url, c->page_target, link, len);
  if (target) eg_link_set_add(ix->links, target, strlen(target));
}

/* Body bytes of a page's answer on their way to the client: its links are remembered. */
static void scan_page(conn_t *c, const char *data, size_t n) {
  if (!c->scan) return;
  c->scanned += n;
  if (eg_page_scan_feed(c->scan, data, n, on_page_link, c) < 0 || c->scanned > EG_PAGE_SCAN_MAX) {
    free(c->scan);
    c->scan = NULL;
  }
}

/* The final response head of a page request: is its body one to learn links from? */
static void page_answered(conn_t *c, const char *head, const eg_response_t *resp) {
  bool chunked;
  if (!c->page_target || !eg_page_response_learnable(head, resp, &chunked)) return;
  c->scan = xmalloc(sizeof *c->scan);
  eg_page_scan_init(c->scan, chunked);
}

/* The first bytes from upstream of a forwarded request: its response heads, every one rewritten
 * (interim 1xx heads, as many as come, then the final one), and then the body. */
static void take_response_head(conn_t *c, const char *data, size_t n) {
  size_t room = EG_HEAD_MAX - c->head_len;
  size_t take = CM_MIN(room, n);
  memcpy(c->head + c->head_len, data, take);
  c->head_len += take;
  eg_response_t resp;
  size_t used = 0, final_off = 0;
  cm_buf_t out;
  cm_buf_init(&out, 0);
  int rc =
      eg_http_rewrite_heads(c->head, c->head_len, c->index >= 0, &out, &used, &resp, &final_off);
  /* (Room for it was there before the read: upstream_wanted.) */
  if (rc < 0 || out.len + (rc > 0 ? c->head_len - used : 0) > rbuf_room(&c->u2c)) {
    cm_buf_release(&out);
    conn_close(c); /* a broken upstream: the client sees the connection end */
    return;
  }
  rbuf_push(&c->u2c, out.data, out.len);
  cm_buf_release(&out);
  if (rc == 0) {
    /* Interim heads went on; the rest waits for the final head. */
    memmove(c->head, c->head + used, c->head_len - used);
    c->head_len -= used;
    return;
  }
  rbuf_push(&c->u2c, c->head + used, c->head_len - used);
  page_answered(c, c->head + final_off, &resp);
  scan_page(c, c->head + used, c->head_len - used);
  c->resp_head = false;
  c->head_len = 0;
}

/* Room for what upstream sends next: while its heads are read, a whole head's worth in the head
 * buffer and, towards the client, for the rewritten heads (a header line may come out a byte
 * longer than it went in, the final head gets "Connection: close") and the bytes after them;
 * then room in the relay buffer.  (A head that still does not fit closes the connection.) */
#define EG_HEAD_ROOM (2 * EG_HEAD_MAX)
static bool upstream_wanted(const conn_t *c) {
  return c->resp_head ? c->head_len < EG_HEAD_MAX && rbuf_room(&c->u2c) >= EG_HEAD_ROOM
                      : rbuf_room(&c->u2c) > 0;
}

static void relay_read_upstream(conn_t *c) {
  eg_session_t *s = c->s;
  size_t room;
  char *t;
  char tmp[EG_HEAD_MAX];
  if (c->resp_head) {
    t = tmp;
    room = EG_HEAD_MAX - c->head_len;
  } else {
    t = rbuf_tail(&c->u2c, &room);
  }
  size_t n = rate_allow(s, room);
  if (n == 0) return;
  ssize_t r = up_read(c, t, n);
  if (r == -1) return;
  if (r <= 0) {
    c->u_eof = true;
    if (r == -2 || c->resp_head) conn_close(c);
    return;
  }
  rate_take(s, (size_t)r);
  s->stats.bytes_in += (uint64_t)r;
  if (c->resp_head) {
    take_response_head(c, tmp, (size_t)r);
  } else {
    c->u2c.len += (size_t)r;
    scan_page(c, t, (size_t)r);
  }
}

/* TLS may hold decrypted bytes that no readiness event announces. */
static void drain_tls(conn_t *c) {
  while (!c->closed && c->tls && !c->u_eof && eg_tls_pending(c->tls) > 0 && !c->s->throttled &&
         upstream_wanted(c)) {
    size_t before = c->s->stats.bytes_in;
    relay_read_upstream(c);
    if (c->s->stats.bytes_in == before) break;
  }
}

static void relay_read_client(conn_t *c);

/* The client's TLS may hold decrypted bytes too. */
static void drain_ctls(conn_t *c) {
  while (!c->closed && c->ctls && !c->c_eof && eg_tls_pending(c->ctls) > 0 && !c->s->throttled &&
         rbuf_room(&c->c2u) > 0) {
    size_t before = c->c2u.len;
    relay_read_client(c);
    if (c->c2u.len == before) break;
  }
}

static void relay_read_client(conn_t *c) {
  eg_session_t *s = c->s;
  size_t room;
  char *t = rbuf_tail(&c->c2u, &room);
  size_t n = rate_allow(s, room);
  if (n == 0) return;
  ssize_t r = cl_read(c, t, n);
  if (r == -1) return;
  if (r < 0) {
    conn_close(c);
    return;
  }
  if (r == 0) {
    c->c_eof = true;
    return;
  }
  rate_take(s, (size_t)r);
  if (c->ufd < 0) return; /* nobody to send it to */
  c->c2u.len += (size_t)r;
}

static void relay_write_upstream(conn_t *c) {
  ssize_t r = up_write(c, c->c2u.data + c->c2u.start, c->c2u.len);
  if (r == -1) return;
  if (r < 0) {
    conn_close(c);
    return;
  }
  c->s->stats.bytes_out += (uint64_t)r;
  rbuf_consume(&c->c2u, (size_t)r);
}

static void relay_write_client(conn_t *c) {
  ssize_t r = cl_write(c, c->u2c.data + c->u2c.start, c->u2c.len);
  if (r == -1) return;
  if (r < 0) {
    conn_close(c);
    return;
  }
  rbuf_consume(&c->u2c, (size_t)r);
}

/* ---------------------------------------------------------------- events */

static void conn_update(conn_t *c) {
  if (c->closed) return;
  uint32_t cev = 0, uev = 0;
  bool can_read = !c->s->throttled;
  switch (c->state) {
    case C_HEAD:
      cev = c->ctls ? eg_tls_adjust(c->ctls, EPOLLIN) : EPOLLIN;
      break;
    case C_RESOLVING:
      break;
    case C_CONNECTING:
      uev = EPOLLOUT;
      break;
    case C_TLS:
      uev = eg_tls_wants(c->tls);
      break;
    case C_CTLS:
      cev = eg_tls_wants(c->ctls);
      break;
    case C_RELAY:
      if (!c->c_eof && rbuf_room(&c->c2u) > 0 && can_read) cev |= EPOLLIN;
      if (c->u2c.len) cev |= EPOLLOUT;
      if (c->ufd >= 0) {
        if (!c->u_eof && can_read && upstream_wanted(c)) uev |= EPOLLIN;
        if (c->c2u.len) uev |= EPOLLOUT;
        if (up_tls(c)) uev = eg_tls_adjust(c->tls, uev);
      }
      if (c->ctls) cev = eg_tls_adjust(c->ctls, cev);
      break;
  }
  cm_error_t err = CM_ERROR_INIT;
  if (c->cw && cev != c->cev && cm_watch_set_events(c->cw, cev, &err) == 0) c->cev = cev;
  if (c->uw && uev != c->uev && cm_watch_set_events(c->uw, uev, &err) == 0) c->uev = uev;
  cm_error_release(&err);
}

static void relay_step(conn_t *c, bool client_side, uint32_t revents) {
  if (client_side) {
    if (revents & EPOLLERR) {
      conn_close(c);
      return;
    }
    if ((revents & EPOLLOUT) && c->u2c.len) relay_write_client(c);
    if (!c->closed && (revents & (EPOLLIN | EPOLLHUP)) && (c->cev & EPOLLIN)) relay_read_client(c);
    /* Both directions of the client are gone: nobody takes an answer any more. */
    if (!c->closed && (revents & EPOLLHUP)) {
      conn_close(c);
      return;
    }
  } else if (c->ufd >= 0) {
    if (c->c2u.len && (revents & (EPOLLOUT | EPOLLIN))) relay_write_upstream(c);
    if (!c->closed && c->ufd >= 0 && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLOUT)) &&
        (c->uev & EPOLLIN))
      relay_read_upstream(c);
    if (!c->closed && c->ufd >= 0 && (revents & (EPOLLHUP | EPOLLERR))) {
      if (c->resp_head) {
        conn_close(c);
        return;
      }
      upstream_gone(c);
    }
  }
  if (c->closed) return;
  /* Data just read may be writable at once. */
  if (c->u2c.len) relay_write_client(c);
  if (!c->closed && c->c2u.len && c->ufd >= 0) relay_write_upstream(c);
  if (!c->closed) drain_tls(c);
  if (!c->closed) drain_ctls(c);
  if (!c->closed && c->c2u.len && c->ufd >= 0) relay_write_upstream(c);
  if (!c->closed && c->u2c.len) relay_write_client(c);
  if (c->closed) return;
  maybe_finish(c);
  if (!c->closed) conn_update(c);
}

static void start_relay(conn_t *c) {
  c->state = C_RELAY;
  rbuf_alloc(&c->c2u);
  rbuf_alloc(&c->u2c);
  if (c->kind == K_CONNECT) {
    static const char ok[] = "HTTP/1.1 200 Connection Established\r\n\r\n";
    rbuf_push(&c->u2c, ok, sizeof ok - 1);
  } else if (c->kind == K_SOCKS) {
    static const uint8_t ok[10] = {5, 0, 0, 1};
    rbuf_push(&c->u2c, ok, sizeof ok);
  } else {
    /* The rewritten head, then whatever body bytes came with it. */
    eg_proxy_t *p = c->s->proxy;
    cm_buf_t out;
    cm_buf_init(&out, 0);
    const char *path = NULL;
    size_t path_len = 0;
    const char *auth = NULL;
    cleanup_free char *host_header = NULL;
    unsigned flags = 0;
    if (c->index >= 0) {
      eg_index_t *ix = &p->indexes[c->index];
      auth = c->credentialed ? ix->authorization : NULL;
      host_header = xstrdup(ix->host_header);
      /* A page is asked for whole and as it is (no 304, no range, no content coding): its
       * links are read from it. */
      if (c->page_target) flags |= EG_FORWARD_PAGE;
    } else {
      bool v6 = strchr(c->host, ':') != NULL;
      host_header = c->port == (c->intercept ? 443 : 80)
                        ? xasprintf(v6 ? "[%s]" : "%s", c->host)
                        : xasprintf(v6 ? "[%s]:%u" : "%s:%u", c->host, (unsigned)c->port);
    }
    eg_http_forward_head(c->head, c->req, path, path_len, host_header, auth, flags, &out);
    size_t body = c->head_len - c->req->head_len;
    if (out.len + body > EG_RELAY_BUF) {
      cm_buf_release(&out);
      reply_and_close(c, 431, "Request Header Fields Too Large", "request head too large");
      return;
    }
    rbuf_push(&c->c2u, out.data, out.len);
    rbuf_push(&c->c2u, c->head + c->req->head_len, body);
    cm_buf_release(&out);
    c->resp_head = true;
    c->head_len = 0;
  }
  if (c->kind == K_CONNECT || c->kind == K_SOCKS) {
    /* Bytes the client sent after its request (optimistic TLS hellos) go upstream. */
    size_t used = c->kind == K_CONNECT ? c->req->head_len : c->socks_consumed;
    if (c->head_len > used) rbuf_push(&c->c2u, c->head + used, c->head_len - used);
    free(c->head);
    c->head = NULL;
    c->head_len = 0;
  }
  free(c->req);
  c->req = NULL;
  relay_step(c, true, EPOLLOUT);
}

static void on_head_timeout(cm_loop_t *loop, cm_timer_t *t, void *data);

/* The upstream's TLS is up (verified): the client gets its 200, then the proxy's own TLS for
 * the host, inside which its request comes. */
static void start_intercept(conn_t *c) {
  eg_proxy_t *p = c->s->proxy;
  static const char ok[] = "HTTP/1.1 200 Connection Established\r\n\r\n";
  if (send(c->cfd, ok, sizeof ok - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof ok - 1)) {
    conn_close(c);
    return;
  }
  cm_error_t err = CM_ERROR_INIT;
  if (!p->ca) p->ca = eg_tls_ca_new(&err);
  c->ctls = p->ca ? eg_tls_server_new(p->ca, c->cfd, c->host, &err) : NULL;
  if (!c->ctls) {
    cm_warn("egress: intercepting %s: %s", c->host, cm_error_message(&err));
    cm_error_release(&err);
    conn_close(c);
    return;
  }
  free(c->req);
  c->req = NULL;
  c->head_len = 0;
  c->state = C_CTLS;
  c->timer = cm_loop_timer(p->loop, EG_HEAD_TIMEOUT_MS, on_head_timeout, c);
  conn_update(c);
}

static void on_upstream(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  conn_t *c = data;
  if (c->closed) return;
  if (c->state == C_CONNECTING) {
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) soerr = errno;
    if (soerr) {
      cm_timer_cancel(c->timer);
      c->timer = NULL;
      cm_watch_remove(c->uw);
      c->uw = NULL;
      close(c->ufd);
      c->ufd = -1;
      errno = soerr;
      if (c->next_cand < c->n_cand) {
        conn_connect_next(c);
      } else {
        cleanup_free char *text =
            xasprintf("mcp-python-exec-sandbox egress proxy: cannot connect to %s:%u: %s", c->host,
                      (unsigned)c->port, strerror(soerr));
        reply_and_close(c, 502, "Bad Gateway", text);
      }
      return;
    }
    cm_timer_cancel(c->timer);
    c->timer = NULL;
    /* An address judged not to be this host's that still led to it (it became local since,
     * or a route made it so): refused all the same. */
    if (!c->cand_own[c->next_cand - 1] && connected_to_self(fd)) {
      deny(c, "this server's own address");
      return;
    }
    if ((c->index >= 0 && c->s->proxy->indexes[c->index].url.https) || c->intercept) {
      cm_error_t err = CM_ERROR_INIT;
      eg_proxy_t *p = c->s->proxy;
      if (!p->tls) p->tls = eg_tls_ctx_new(p->ca_file, &err);
      const char *name = c->intercept ? c->host : p->indexes[c->index].url.host;
      c->tls = p->tls ? eg_tls_new(p->tls, c->ufd, name, &err) : NULL;
      if (!c->tls) {
        cleanup_free char *text = xasprintf("mcp-python-exec-sandbox egress proxy: TLS to %s: %s",
                                            c->host, cm_error_message(&err));
        cm_error_release(&err);
        reply_and_close(c, 502, "Bad Gateway", text);
        return;
      }
      c->state = C_TLS;
      c->timer = cm_loop_timer(loop, EG_CONNECT_TIMEOUT_MS, on_connect_timeout, c);
    } else {
      start_relay(c);
      return;
    }
  }
  if (c->state == C_TLS) {
    cm_error_t err = CM_ERROR_INIT;
    int rc = eg_tls_handshake(c->tls, &err);
    if (rc < 0) {
      cleanup_free char *text = xasprintf("mcp-python-exec-sandbox egress proxy: TLS to %s: %s",
                                          c->host, cm_error_message(&err));
      cm_error_release(&err);
      reply_and_close(c, 502, "Bad Gateway", text);
      return;
    }
    if (rc == 0) {
      conn_update(c);
      return;
    }
    cm_timer_cancel(c->timer);
    c->timer = NULL;
    if (c->intercept)
      start_intercept(c);
    else
      start_relay(c);
    return;
  }
  if (c->state == C_RELAY) relay_step(c, false, revents);
}

/* ---------------------------------------------------------------- request heads */

/* The index an address of the forwarder stands for (127.0.1.<n+1>), or -1. */
static int index_of_addr(const eg_addr_t *a, size_t n_indexes) {
  eg_addr_t v;
  eg_addr_normalise(a, &v);
  if (v.family != AF_INET || v.bytes[0] != EG_INDEX_NET_A || v.bytes[1] != EG_INDEX_NET_B ||
      v.bytes[2] != EG_INDEX_NET_C || v.bytes[3] == 0)
    return -1;
  return (size_t)v.bytes[3] - 1 < n_indexes ? v.bytes[3] - 1 : -1;
}

/* The local address the client connected to (inside the sandbox). */
static int client_local_index(conn_t *c, size_t n_indexes) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(c->cfd, (struct sockaddr *)&ss, &sl) < 0) return -1;
  eg_addr_t a = {0};
  if (ss.ss_family == AF_INET) {
    a.family = AF_INET;
    memcpy(a.bytes, &((struct sockaddr_in *)&ss)->sin_addr, 4);
  } else if (ss.ss_family == AF_INET6) {
    a.family = AF_INET6;
    memcpy(a.bytes, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
  } else {
    return -1;
  }
  return index_of_addr(&a, n_indexes);
}

/* The server's index credentials go with reads only: with another method a build could
 * upload to or delete from the index as the operator, or have them echoed back (TRACE); a
 * body could carry a second request to a server that reads none on a GET. */
static bool read_only(const char *buf, const eg_request_t *req) {
  const char *m = buf + req->method.off;
  if (!(req->method.len == 3 && !memcmp(m, "GET", 3)) &&
      !(req->method.len == 4 && !memcmp(m, "HEAD", 4)))
    return false;
  for (size_t i = 0; i < req->n_headers; i++) {
    const eg_header_t *h = &req->headers[i];
    const char *name = buf + h->name.off, *value = buf + h->value.off;
    if (h->name.len == 17 && !strncasecmp(name, "transfer-encoding", 17)) return false;
    if (h->name.len == 14 && !strncasecmp(name, "content-length", 14) &&
        !(h->value.len == 1 && value[0] == '0'))
      return false;
  }
  return true;
}

/* Whether the credentials of the index c goes to (c->index) go with this request: only below
 * the index URL's path and to the files its pages linked to; anything else on its host (an
 * API, a private project) goes as anyone's request would.  A page's answer is scanned for the
 * links that follow (a GET: a HEAD has no body). */
static void index_decide(conn_t *c) {
  eg_index_t *ix = &c->s->proxy->indexes[c->index];
  const eg_request_t *req = c->req;
  const char *target = req->path.len ? c->head + req->path.off : "/";
  size_t len = req->path.len ? req->path.len : 1;
  c->credentialed =
      ix->authorization && eg_index_credentials_apply(ix->url.path, ix->links, target, len);
  if (!ix->authorization) return;
  if (!c->credentialed) {
    cm_debug(
        "egress: a request to the index %s goes without its credentials (neither below %s "
        "nor a link of its pages)",
        ix->url.host, ix->url.path);
    return;
  }
  if (req->method.len == 3 && !memcmp(c->head + req->method.off, "GET", 3) &&
      eg_index_path_below(ix->url.path, target, len))
    c->page_target = xstrndup(target, len);
}

static void refuse_unsafe(conn_t *c) {
  reply_and_close(c, 405, "Method Not Allowed",
                  "mcp-python-exec-sandbox egress proxy: only GET and HEAD without a body go to an "
                  "index with the server's credentials");
}

static void head_request(conn_t *c) {
  eg_request_t *req = c->req ? c->req : (c->req = xmalloc(sizeof *c->req));
  int rc = eg_http_parse_request(c->head, c->head_len, req);
  if (rc == 0) return;
  if (rc < 0) {
    reply_and_close(c, 400, "Bad Request",
                    "mcp-python-exec-sandbox egress proxy: not a request this proxy takes (use "
                    "CONNECT host:port, or an http:// absolute URI)");
    return;
  }
  eg_session_t *s = c->s;
  eg_proxy_t *p = s->proxy;
  c->index = -1;
  bool builds = (s->flags & EG_SESSION_INDEX) != 0;
  eg_addr_t target;
  int abs_index = builds && req->form == EG_FORM_ABSOLUTE && req->port == EG_SANDBOX_PORT &&
                          eg_addr_parse(req->host, strlen(req->host), &target) == 0
                      ? index_of_addr(&target, p->n_indexes)
                      : -1;
  if (req->form == EG_FORM_AUTHORITY) {
    c->kind = K_CONNECT;
  } else if (req->form == EG_FORM_ORIGIN || abs_index >= 0) {
    /* Addressed to one of a build's index origins on the forwarder (directly, or as a
     * proxied absolute URI): an index request. */
    int ix = abs_index >= 0 ? abs_index : builds ? client_local_index(c, p->n_indexes) : -1;
    if (ix < 0) {
      reply_and_close(
          c, 400, "Bad Request",
          "mcp-python-exec-sandbox egress proxy: this is a proxy; send CONNECT host:port "
          "or an absolute http:// URI");
      return;
    }
    if (!read_only(c->head, req)) {
      refuse_unsafe(c);
      return;
    }
    c->kind = K_INDEX;
    c->index = ix;
    index_decide(c);
    snprintf(c->host, sizeof c->host, "%s", p->indexes[ix].url.host);
    c->port = p->indexes[ix].url.port;
    conn_route(c);
    return;
  } else {
    c->kind = K_FORWARD;
    /* Plain HTTP to a credentialed index's own origin (absolute links on its pages) gets
     * its credentials too, for builds only. */
    for (size_t i = 0; (s->flags & EG_SESSION_INDEX) && i < p->n_indexes; i++) {
      eg_index_t *ix = &p->indexes[i];
      if (!ix->url.https && ix->authorization && ix->url.port == req->port &&
          !strcmp(ix->url.host, req->host))
        c->index = (int)i;
    }
    if (c->index >= 0 && !read_only(c->head, req)) {
      refuse_unsafe(c);
      return;
    }
    if (c->index >= 0) index_decide(c);
  }
  snprintf(c->host, sizeof c->host, "%s", req->host);
  c->port = req->port;
  /* Cleartext: a placeholder in it is never replaced, and the request never leaves. */
  if (c->kind == K_FORWARD && !substitute_secrets(c, false)) return;
  if (c->kind == K_CONNECT) {
    for (size_t i = 0; i < s->n_secrets && !c->intercept; i++)
      c->intercept = secret_bound(&s->secrets[i], c->host, c->port);
    if (c->intercept && c->head_len > req->head_len) {
      reply_and_close(
          c, 400, "Bad Request",
          "mcp-python-exec-sandbox egress proxy: bytes after CONNECT before its answer");
      return;
    }
  }
  conn_route(c);
}

static void head_socks(conn_t *c) {
  const uint8_t *b = (const uint8_t *)c->head;
  if (!c->socks_greeted) {
    size_t used = 0;
    int rc = eg_socks5_greeting(b, c->head_len, &used);
    if (rc == 0) return;
    if (rc < 0) {
      static const uint8_t no[2] = {5, 0xff};
      (void)!write(c->cfd, no, 2);
      conn_close(c);
      return;
    }
    static const uint8_t ok[2] = {5, 0};
    if (write(c->cfd, ok, 2) != 2) {
      conn_close(c);
      return;
    }
    c->socks_greeted = true;
    c->socks_consumed = used;
  }
  size_t used = 0;
  int rc = eg_socks5_request(b + c->socks_consumed, c->head_len - c->socks_consumed, &used, c->host,
                             sizeof c->host, &c->port);
  if (rc == 0) return;
  if (rc < 0) {
    snprintf(c->host, sizeof c->host, "?");
    reply_and_close(c, 400, "Bad Request", "");
    return;
  }
  c->socks_consumed += used;
  c->index = -1;
  conn_route(c);
}

/* The request inside an intercepted connection: its placeholders replaced (or it is refused),
 * then forwarded to the upstream whose TLS is up, as one request (Connection: close). */
static void intercepted_head(conn_t *c) {
  eg_request_t *req = c->req ? c->req : (c->req = xmalloc(sizeof *c->req));
  int rc = eg_http_parse_request(c->head, c->head_len, req);
  if (rc == 0) return;
  if (rc < 0 || req->form != EG_FORM_ORIGIN) {
    reply_and_close(c, 400, "Bad Request",
                    "mcp-python-exec-sandbox egress proxy: not an HTTP/1.x request (this "
                    "connection carries secrets: the proxy reads its request)");
    return;
  }
  if (!substitute_secrets(c, true)) return;
  cm_timer_cancel(c->timer);
  c->timer = NULL;
  start_relay(c);
}

static void on_head_timeout(cm_loop_t *loop, cm_timer_t *t, void *data) {
  conn_t *c = data;
  c->timer = NULL;
  reply_and_close(c, 408, "Request Timeout",
                  "mcp-python-exec-sandbox egress proxy: no request head in time");
}

static void on_client(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  conn_t *c = data;
  if (c->closed) return;
  if (c->state == C_RELAY) {
    relay_step(c, true, revents);
    return;
  }
  if (c->state == C_CTLS) {
    cm_error_t err = CM_ERROR_INIT;
    int rc = eg_tls_handshake(c->ctls, &err);
    if (rc < 0) {
      /* The client did not take the proxy's certificate (its own trust, or no TLS). */
      cm_debug("egress: TLS with the client for %s: %s", c->host, cm_error_message(&err));
      cm_error_release(&err);
      conn_close(c);
      return;
    }
    if (rc == 0) {
      conn_update(c);
      return;
    }
    c->ctls_up = true;
    c->state = C_HEAD;
    c->kind = K_FORWARD;
    conn_update(c);
    /* The request may already wait, decrypted. */
    revents = EPOLLIN;
  }
  if (c->state != C_HEAD) {
    if (revents & (EPOLLHUP | EPOLLERR)) conn_close(c);
    return;
  }
  ssize_t r = cl_read(c, c->head + c->head_len, EG_HEAD_MAX - c->head_len);
  if (r == -1) {
    if (c->ctls) conn_update(c);
    return;
  }
  if (r <= 0) {
    conn_close(c);
    return;
  }
  c->head_len += (size_t)r;
  if (c->ctls_up) {
    intercepted_head(c);
    /* More of the head may wait decrypted in the library, which no event announces. */
    while (!c->closed && c->state == C_HEAD && eg_tls_pending(c->ctls) > 0 &&
           c->head_len < EG_HEAD_MAX) {
      r = cl_read(c, c->head + c->head_len, EG_HEAD_MAX - c->head_len);
      if (r == -1) break;
      if (r <= 0) {
        conn_close(c);
        return;
      }
      c->head_len += (size_t)r;
      intercepted_head(c);
    }
    if (!c->closed && c->state == C_HEAD) conn_update(c);
    return;
  }
  if (c->kind == K_SOCKS || (c->head_len > 0 && (uint8_t)c->head[0] == 5)) {
    c->kind = K_SOCKS;
    head_socks(c);
  } else {
    head_request(c);
  }
}

/* ---------------------------------------------------------------- connections */

static void conn_free(void *data) {
  conn_t *c = data;
  if (c->secret_bytes) {
    if (c->head) explicit_bzero(c->head, EG_HEAD_MAX);
    if (c->c2u.data) explicit_bzero(c->c2u.data, EG_RELAY_BUF);
  }
  free(c->head);
  free(c->req);
  free(c->page_target);
  free(c->scan);
  free(c->target);
  free(c->target_error);
  free(c->denied);
  free(c->denied_error);
  free(c->c2u.data);
  free(c->u2c.data);
  free(c);
}

static void conn_close(conn_t *c) {
  if (c->closed) return;
  c->closed = true;
  eg_session_t *s = c->s;
  for (lookup_t *lk = c->lookups; lk; lk = lk->next) lk->conn = NULL;
  c->lookups = NULL;
  cm_timer_cancel(c->timer);
  c->timer = NULL;
  cm_watch_remove(c->cw);
  cm_watch_remove(c->uw);
  c->cw = c->uw = NULL;
  if (c->tls) eg_tls_free(c->tls);
  c->tls = NULL;
  if (c->ctls) eg_tls_free(c->ctls);
  c->ctls = NULL;
  if (c->cfd >= 0) close(c->cfd);
  if (c->ufd >= 0) close(c->ufd);
  c->cfd = c->ufd = -1;
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  s->proxy->n_conns--;
  cm_loop_defer(s->proxy->loop, conn_free, c);
  session_update_reading(s);
  /* A session of the global cap may have been waiting. */
  if (s->proxy->n_conns + 1 == s->proxy->global_max)
    for (eg_session_t *o = s->proxy->sessions; o; o = o->next) session_update_reading(o);
}

static void conn_new(eg_session_t *s, int fd) {
  eg_proxy_t *p = s->proxy;
  s->stats.connections++;
  if (s->stats.connections > p->max_total) {
    static const char busy[] =
        "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)!write(fd, busy, sizeof busy - 1);
    close(fd);
    return;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) || cm_set_nonblock(fd, true) < 0) {
    close(fd);
    return;
  }
  conn_t *c = xcalloc(1, sizeof *c);
  c->s = s;
  c->cfd = fd;
  c->ufd = -1;
  c->index = -1;
  c->state = C_HEAD;
  c->head = xmalloc(EG_HEAD_MAX);
  cm_error_t err = CM_ERROR_INIT;
  c->cev = EPOLLIN;
  c->cw = cm_loop_watch(p->loop, fd, EPOLLIN, on_client, c, &err);
  if (!c->cw) {
    cm_warn("egress: %s", cm_error_message(&err));
    cm_error_release(&err);
    close(fd);
    conn_free(c);
    return;
  }
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  p->n_conns++;
  c->timer = cm_loop_timer(p->loop, EG_HEAD_TIMEOUT_MS, on_head_timeout, c);
}

/* ---------------------------------------------------------------- sessions */

/* A held session takes nothing (eg_session_open); the others while the caps have room. */
static bool session_has_room(const eg_session_t *s) {
  return !(s->flags & EG_SESSION_HELD) && s->n_conns < s->proxy->max_conns &&
         s->proxy->n_conns < s->proxy->global_max;
}

static void session_update_reading(eg_session_t *s) {
  if (!s->w) return;
  bool want = session_has_room(s);
  if (want == s->reading) return;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_watch_set_events(s->w, want ? EPOLLIN : 0, &err) == 0) s->reading = want;
  cm_error_release(&err);
}

static void session_stop_reading(eg_session_t *s) {
  cm_watch_remove(s->w);
  s->w = NULL;
}

/* One message of a sandbox's supervisor (a byte and a connection's descriptor): recvmsg's
 * answer, and in *got the first descriptor it carried (-1 if none; any more are closed). */
static ssize_t recv_connection(int fd, int *got) {
  char byte;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  *got = -1;
  ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n <= 0) return n;
  for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    size_t nfds = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int *fds = (int *)CMSG_DATA(h);
    for (size_t i = 0; i < nfds; i++) {
      int f;
      memcpy(&f, &fds[i], sizeof f);
      if (*got < 0)
        *got = f;
      else
        close(f);
    }
  }
  return n;
}

static void on_session(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  eg_session_t *s = data;
  while (session_has_room(s)) {
    int got;
    ssize_t n = recv_connection(fd, &got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      /* The supervisor is gone (the sandbox ended): what is open stays until the owner
       * closes the session. */
      session_stop_reading(s);
      return;
    }
    if (got >= 0) conn_new(s, got);
  }
  /* Full: the sandbox's connections wait in its supervisor (bounded there) and its kernel
   * backlog until one of these ends. */
  if (revents & (EPOLLHUP | EPOLLERR) && !(revents & EPOLLIN))
    session_stop_reading(s);
  else
    session_update_reading(s);
}

eg_session_t *eg_session_new(eg_proxy_t *p, const eg_policy_t *policy, unsigned flags,
                             int *sandbox_fd, cm_error_t *err) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "socketpair for the egress proxy");
    return NULL;
  }
  eg_session_t *s = xcalloc(1, sizeof *s);
  s->proxy = p;
  s->fd = sv[0];
  s->flags = flags;
  eg_policy_copy(&s->policy, policy);
  /* Held: not even read (what the sandbox opens waits in it, and holds nothing of ours). */
  s->reading = !(flags & EG_SESSION_HELD);
  s->w = cm_loop_watch(p->loop, s->fd, s->reading ? EPOLLIN : 0, on_session, s, err);
  if (!s->w) {
    close(sv[0]);
    close(sv[1]);
    eg_policy_release(&s->policy);
    free(s);
    return NULL;
  }
  s->next = p->sessions;
  if (p->sessions) p->sessions->prev = s;
  p->sessions = s;
  *sandbox_fd = sv[1];
  return s;
}

/* At most this many connections are closed at the go (more may be coming in: the rest are
 * judged as the call's). */
#define EG_OPEN_DRAIN_MAX 1024

size_t eg_session_open(eg_session_t *s) {
  if (!(s->flags & EG_SESSION_HELD)) return 0;
  s->flags &= ~(unsigned)EG_SESSION_HELD;
  size_t closed = 0;
  while (s->w && closed < EG_OPEN_DRAIN_MAX) {
    int got;
    ssize_t n = recv_connection(s->fd, &got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      session_stop_reading(s); /* the supervisor is gone */
      break;
    }
    if (got >= 0) close(got);
    closed++;
  }
  if (closed) cm_debug("egress: %zu connections opened before the go closed", closed);
  session_update_reading(s);
  return closed;
}

void eg_session_narrow(eg_session_t *s, const eg_rule_t *rules, size_t n) {
  free(s->narrow);
  s->narrow = n ? xmemdup(rules, n * sizeof *rules) : NULL;
  s->n_narrow = n;
}

int eg_session_add_secret(eg_session_t *s, const char *name, const char *placeholder,
                          const eg_secret_value_t *value, const eg_rule_t *hosts, size_t n_hosts) {
  if (s->n_secrets >= EG_SESSION_SECRETS_MAX) return -1;
  session_secret_t *k = &s->secrets[s->n_secrets];
  snprintf(k->name, sizeof k->name, "%s", name);
  snprintf(k->placeholder, sizeof k->placeholder, "%s", placeholder);
  k->value = value;
  k->hosts = n_hosts ? xmemdup(hosts, n_hosts * sizeof *hosts) : NULL;
  k->n_hosts = n_hosts;
  return (int)s->n_secrets++;
}

/* Is host:port one that secret k is bound to?  A name rule without a port binds 443. */
static bool secret_bound(const session_secret_t *k, const char *host, uint16_t port) {
  for (size_t i = 0; i < k->n_hosts; i++) {
    eg_rule_t r = k->hosts[i];
    if (r.port == 0) r.port = 443;
    if (eg_rule_match_name(&r, host, port)) return true;
  }
  return false;
}

/* The session's placeholders as bindings for a request to host:port; tls: over TLS the proxy
 * terminated (cleartext is never substituted). */
static size_t secret_bindings(const eg_session_t *s, const char *host, uint16_t port, bool tls,
                              eg_secret_binding_t *b) {
  for (size_t i = 0; i < s->n_secrets; i++) {
    const session_secret_t *k = &s->secrets[i];
    b[i] = (eg_secret_binding_t){.placeholder = k->placeholder,
                                 .placeholder_len = strlen(k->placeholder),
                                 .value = k->value ? k->value->data : NULL,
                                 .value_len = k->value ? k->value->len : 0,
                                 .bound = tls && secret_bound(k, host, port)};
  }
  return s->n_secrets;
}

/* A request head (c->head, parsed as c->req) about to go upstream: its placeholders replaced
 * where the secret may go (c->head and c->req rewritten), or the request refused (403, false). */
static bool substitute_secrets(conn_t *c, bool tls) {
  eg_session_t *s = c->s;
  if (!s->n_secrets) return true;
  eg_secret_binding_t b[EG_SESSION_SECRETS_MAX];
  size_t n = secret_bindings(s, c->host, c->port, tls, b);
  cm_buf_t out;
  cm_buf_init(&out, 0);
  uint64_t used = 0;
  size_t refused = n;
  int rc = eg_secret_rewrite_head(c->head, c->req, b, n, &out, &used, &refused);
  if (rc < 0) {
    if (out.data) explicit_bzero(out.data, out.len);
    cm_buf_release(&out);
    if (refused < n) s->stats.secrets_refused |= 1ull << refused;
    cleanup_free char *why =
        refused < n ? xasprintf(
                          "the request carries the placeholder of secret %s, which is not "
                          "bound to this destination%s",
                          s->secrets[refused].name,
                          tls ? "" : " (or was sent without TLS: never substituted)")
                    : xstrdup("the request head with its secrets is too large");
    deny(c, why);
    return false;
  }
  if (rc == 0) return true;
  s->stats.secrets_used |= used;
  c->secret_bytes = true;
  /* The head with the values, then the body bytes that came with it. */
  size_t body = c->head_len - c->req->head_len;
  eg_request_t *req = c->req;
  if (out.len + body > EG_HEAD_MAX || eg_http_parse_request(out.data, out.len, req) != 1) {
    explicit_bzero(out.data, out.len);
    cm_buf_release(&out);
    deny(c, "the request head with its secrets is too large");
    return false;
  }
  char *head = xmalloc(EG_HEAD_MAX);
  memcpy(head, out.data, out.len);
  memcpy(head + out.len, c->head + (c->head_len - body), body);
  explicit_bzero(c->head, c->head_len);
  free(c->head);
  c->head = head;
  c->head_len = out.len + body;
  explicit_bzero(out.data, out.len);
  cm_buf_release(&out);
  return true;
}

void eg_session_stats(const eg_session_t *s, eg_stats_t *out) {
  *out = s->stats;
}

static void session_free(void *data) {
  free(data);
}

void eg_session_close(eg_session_t *s) {
  if (!s) return;
  eg_proxy_t *p = s->proxy;
  while (s->conns) conn_close(s->conns);
  session_stop_reading(s);
  close(s->fd);
  cm_timer_cancel(s->rate_timer);
  eg_policy_release(&s->policy);
  free(s->narrow);
  for (size_t i = 0; i < s->n_secrets; i++) free(s->secrets[i].hosts);
  if (s->prev)
    s->prev->next = s->next;
  else
    p->sessions = s->next;
  if (s->next) s->next->prev = s->prev;
  cm_loop_defer(p->loop, session_free, s);
}

/* ---------------------------------------------------------------- the proxy */

static bool ares_initialised;

eg_proxy_t *eg_proxy_new(cm_loop_t *loop, const eg_proxy_config_t *cfg, cm_error_t *err) {
  if (!ares_initialised) {
    int rc = ares_library_init(ARES_LIB_INIT_ALL);
    if (rc != ARES_SUCCESS) {
      cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "c-ares: %s", ares_strerror(rc));
      return NULL;
    }
    ares_initialised = true;
  }
  eg_proxy_t *p = xcalloc(1, sizeof *p);
  p->loop = loop;
  p->max_conns = cfg->max_connections ? cfg->max_connections : EG_DEFAULT_MAX_CONNECTIONS;
  p->max_total = cfg->max_total_connections ? cfg->max_total_connections : EG_DEFAULT_MAX_TOTAL;
  p->rate = cfg->rate_bytes;
  /* Every connection holds two fds of the server.  Raise the soft open-file limit towards
   * the hard one (children get their own limits: the sandbox sets them), and keep egress
   * within half of it, so that a flood of connections never starves the rest. */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    rlim_t want = nofile.rlim_max == RLIM_INFINITY ? 65536 : CM_MIN(nofile.rlim_max, (rlim_t)65536);
    if (want > nofile.rlim_cur) {
      struct rlimit raised = {want, nofile.rlim_max};
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile.rlim_cur = want;
    }
    rlim_t fds = nofile.rlim_cur > 512 ? nofile.rlim_cur - 512 : 64;
    p->global_max =
        CM_MAX((size_t)32, CM_MIN((size_t)EG_GLOBAL_MAX_CONNECTIONS, (size_t)(fds / 4)));
  } else {
    p->global_max = 256;
  }
  struct ares_options opts = {0};
  opts.sock_state_cb = on_ares_sock_state;
  opts.sock_state_cb_data = p;
  opts.timeout = 2000;
  opts.tries = 2;
  /* A name is resolved as the client wrote it: with the host's search domains, "db" could
   * become db.corp.example, a name no rule of the client's request was judged on (a
   * --network-deny db.corp.example would not apply).  An empty search list, since
   * ares_getaddrinfo() of some c-ares versions (Debian 12's 1.18) ignores the flag. */
  opts.flags = ARES_FLAG_NOSEARCH;
  opts.domains = NULL;
  opts.ndomains = 0;
  int rc = ares_init_options(&p->channel, &opts,
                             ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES |
                                 ARES_OPT_FLAGS | ARES_OPT_DOMAINS);
  if (rc != ARES_SUCCESS) {
    cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the egress resolver (c-ares): %s", ares_strerror(rc));
    free(p);
    return NULL;
  }
  p->channel_ok = true;
  p->ca_file = cfg->ca_file ? xstrdup(cfg->ca_file) : NULL;
  ares_set_socket_configure_callback(p->channel, on_ares_sock_config, p);
  if (cfg->dns_servers && *cfg->dns_servers) {
    rc = ares_set_servers_ports_csv(p->channel, cfg->dns_servers);
    if (rc != ARES_SUCCESS) {
      cm_error_set(err, 0, CM_ERR_INVALID, "--dns-server %s: %s", cfg->dns_servers,
                   ares_strerror(rc));
      ares_destroy(p->channel);
      free(p);
      return NULL;
    }
    p->dns_servers = xstrdup(cfg->dns_servers);
  }
  return p;
}

void eg_proxy_free(eg_proxy_t *p) {
  if (!p) return;
  while (p->sessions) eg_session_close(p->sessions);
  cm_timer_cancel(p->ares_timer);
  p->ares_timer = NULL;
  if (p->channel_ok)
    ares_destroy(p->channel); /* runs the pending callbacks: their conns are gone */
  for (size_t i = 0; i < p->n_aw; i++) cm_watch_remove(p->aw[i].w);
  for (size_t i = 0; i < p->n_indexes; i++) {
    eg_index_t *ix = &p->indexes[i];
    eg_url_release(&ix->url);
    free(ix->host_header);
    if (ix->authorization) explicit_bzero(ix->authorization, strlen(ix->authorization));
    free(ix->authorization);
    free(ix->origin_path);
    eg_link_set_free(ix->links);
  }
  eg_tls_ctx_free(p->tls);
  eg_tls_ca_free(p->ca);
  free(p->ca_file);
  free(p->dns_servers);
  free(p);
}

static char *base64(const char *s, size_t n) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = xmalloc((n + 2) / 3 * 4 + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned)(unsigned char)s[i] << 16;
    if (i + 1 < n) v |= (unsigned)(unsigned char)s[i + 1] << 8;
    if (i + 2 < n) v |= (unsigned char)s[i + 2];
    out[o++] = tbl[(v >> 18) & 63];
    out[o++] = tbl[(v >> 12) & 63];
    out[o++] = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < n ? tbl[v & 63] : '=';
  }
  out[o] = '\0';
  return out;
}

int eg_proxy_add_index(eg_proxy_t *p, const char *url, cm_error_t *err) {
  if (p->n_indexes >= EG_MAX_INDEXES)
    return cm_error_set(err, 0, CM_ERR_LIMIT, "more than %d index URLs", EG_MAX_INDEXES);
  eg_index_t *ix = &p->indexes[p->n_indexes];
  memset(ix, 0, sizeof *ix);
  if (eg_url_parse(url, strlen(url), &ix->url) < 0) {
    cleanup_free char *shown = eg_url_redact(url);
    return cm_error_set(err, 0, CM_ERR_INVALID, "index URL %s is not an http(s) URL", shown);
  }
  bool v6 = strchr(ix->url.host, ':') != NULL;
  ix->host_header = ix->url.explicit_port
                        ? xasprintf(v6 ? "[%s]:%u" : "%s:%u", ix->url.host, (unsigned)ix->url.port)
                        : xasprintf(v6 ? "[%s]" : "%s", ix->url.host);
  if (ix->url.user) {
    cleanup_free char *pair =
        xasprintf("%s:%s", ix->url.user, ix->url.password ? ix->url.password : "");
    cleanup_free char *enc = base64(pair, strlen(pair));
    ix->authorization = xasprintf("Basic %s", enc);
    explicit_bzero(pair, strlen(pair));
  }
  ix->origin_path = xstrdup(ix->url.path);
  ix->links = eg_link_set_new(EG_INDEX_MAX_LINKS, EG_INDEX_MAX_LINK_BYTES);
  return (int)p->n_indexes++;
}

char *eg_proxy_index_url(eg_proxy_t *p, int n) {
  if (n < 0 || (size_t)n >= p->n_indexes) return NULL;
  return xasprintf("http://%d.%d.%d.%d:%d%s", EG_INDEX_NET_A, EG_INDEX_NET_B, EG_INDEX_NET_C, n + 1,
                   EG_SANDBOX_PORT, p->indexes[n].origin_path);
}

const char *eg_proxy_ca_pem(eg_proxy_t *p, cm_error_t *err) {
  if (!p->ca) p->ca = eg_tls_ca_new(err);
  return p->ca ? eg_tls_ca_pem(p->ca) : NULL;
}

char *eg_proxy_describe(eg_proxy_t *p) {
  cleanup_free char *rate = p->rate ? xasprintf("%llu bytes/s", (unsigned long long)p->rate)
                                    : xstrdup("no bandwidth cap");
  return xasprintf("resolver %s; per run: %llu connections at once, %llu in all, %s",
                   p->dns_servers ? p->dns_servers : "from the host's resolv.conf",
                   (unsigned long long)p->max_conns, (unsigned long long)p->max_total, rate);
}
