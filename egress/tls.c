/* TLS client connections (see tls.h). */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/epoll.h>

#include "egress/egress.h"
#include "egress/tls.h"

#define LIBSSL_SONAME "libssl.so.3"

#define LIBSSL_FUNCTIONS(X)           \
  X(TLS_client_method)                \
  X(SSL_CTX_new)                      \
  X(SSL_CTX_free)                     \
  X(SSL_CTX_set_default_verify_paths) \
  X(SSL_CTX_set_verify)               \
  X(SSL_CTX_ctrl)                     \
  X(SSL_new)                          \
  X(SSL_free)                         \
  X(SSL_set_fd)                       \
  X(SSL_set1_host)                    \
  X(SSL_get0_param)                   \
  X(X509_VERIFY_PARAM_set1_ip_asc)    \
  X(SSL_ctrl)                         \
  X(SSL_connect)                      \
  X(SSL_read)                         \
  X(SSL_write)                        \
  X(SSL_pending)                      \
  X(SSL_get_error)                    \
  X(SSL_get_verify_result)            \
  X(X509_verify_cert_error_string)    \
  X(ERR_get_error)                    \
  X(ERR_clear_error)                  \
  X(ERR_error_string_n)

static struct {
#define SSL_MEMBER(name) __typeof__(name) *name;
  LIBSSL_FUNCTIONS(SSL_MEMBER)
#undef SSL_MEMBER
} ssl;
static bool ssl_loaded;

static int ssl_load(cm_error_t *err) {
  if (ssl_loaded) return 0;
#define SSL_NAME(name) #name,
  static const char *const names[] = {LIBSSL_FUNCTIONS(SSL_NAME)};
#undef SSL_NAME
  void *syms[CM_ARRAY_SIZE(names)];
  if (cm_dl_symbols(LIBSSL_SONAME, names, CM_ARRAY_SIZE(names), syms, err) < 0) return -1;
  size_t i = 0;
#define SSL_ASSIGN(name) ssl.name = (__typeof__(name) *)syms[i++];
  LIBSSL_FUNCTIONS(SSL_ASSIGN)
#undef SSL_ASSIGN
  ssl_loaded = true;
  return 0;
}

struct eg_tls_ctx {
  SSL_CTX *ctx;
};

struct eg_tls {
  SSL *ssl;
  uint32_t hs_wants;
  bool read_wants_write, write_wants_read;
};

static int ssl_error(cm_error_t *err, const char *what) {
  unsigned long e = ssl.ERR_get_error();
  char buf[256] = "unknown error";
  if (e) ssl.ERR_error_string_n(e, buf, sizeof buf);
  ssl.ERR_clear_error();
  return cm_error_set(err, 0, CM_ERR_IO, "%s: %s", what, buf);
}

eg_tls_ctx_t *eg_tls_ctx_new(cm_error_t *err) {
  if (ssl_load(err) < 0) return NULL;
  SSL_CTX *ctx = ssl.SSL_CTX_new(ssl.TLS_client_method());
  if (!ctx) {
    ssl_error(err, "SSL_CTX_new");
    return NULL;
  }
  ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
  ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_MODE,
                   SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
  ssl.SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  if (ssl.SSL_CTX_set_default_verify_paths(ctx) != 1) {
    ssl_error(err, "loading the system trust store");
    ssl.SSL_CTX_free(ctx);
    return NULL;
  }
  eg_tls_ctx_t *c = xcalloc(1, sizeof *c);
  c->ctx = ctx;
  return c;
}

void eg_tls_ctx_free(eg_tls_ctx_t *ctx) {
  if (!ctx) return;
  ssl.SSL_CTX_free(ctx->ctx);
  free(ctx);
}

eg_tls_t *eg_tls_new(eg_tls_ctx_t *ctx, int fd, const char *host, cm_error_t *err) {
  SSL *s = ssl.SSL_new(ctx->ctx);
  if (!s) {
    ssl_error(err, "SSL_new");
    return NULL;
  }
  eg_addr_t a;
  bool literal = eg_addr_parse(host, strlen(host), &a) == 0;
  int ok = ssl.SSL_set_fd(s, fd);
  if (ok == 1 && literal) ok = ssl.X509_VERIFY_PARAM_set1_ip_asc(ssl.SSL_get0_param(s), host);
  if (ok == 1 && !literal) ok = ssl.SSL_set1_host(s, host);
  if (ok == 1 && !literal)
    ok = (int)ssl.SSL_ctrl(s, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                           (void *)(uintptr_t)host);
  if (ok != 1) {
    ssl_error(err, "setting up TLS");
    ssl.SSL_free(s);
    return NULL;
  }
  eg_tls_t *t = xcalloc(1, sizeof *t);
  t->ssl = s;
  t->hs_wants = EPOLLOUT;
  return t;
}

int eg_tls_handshake(eg_tls_t *t, cm_error_t *err) {
  ssl.ERR_clear_error();
  int rc = ssl.SSL_connect(t->ssl);
  if (rc == 1) return 1;
  int e = ssl.SSL_get_error(t->ssl, rc);
  if (e == SSL_ERROR_WANT_READ) {
    t->hs_wants = EPOLLIN;
    return 0;
  }
  if (e == SSL_ERROR_WANT_WRITE) {
    t->hs_wants = EPOLLOUT;
    return 0;
  }
  long v = ssl.SSL_get_verify_result(t->ssl);
  if (v != X509_V_OK)
    return cm_error_set(err, 0, CM_ERR_IO, "certificate verification failed: %s",
                        ssl.X509_verify_cert_error_string(v));
  return ssl_error(err, "handshake");
}

uint32_t eg_tls_wants(const eg_tls_t *t) {
  return t->hs_wants;
}

ssize_t eg_tls_read(eg_tls_t *t, char *buf, size_t n) {
  if (n > INT32_MAX) n = INT32_MAX;
  ssl.ERR_clear_error();
  int rc = ssl.SSL_read(t->ssl, buf, (int)n);
  t->read_wants_write = false;
  if (rc > 0) return rc;
  int e = ssl.SSL_get_error(t->ssl, rc);
  if (e == SSL_ERROR_WANT_READ) return -1;
  if (e == SSL_ERROR_WANT_WRITE) {
    t->read_wants_write = true;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  ssl.ERR_clear_error();
  return -2;
}

ssize_t eg_tls_write(eg_tls_t *t, const char *buf, size_t n) {
  if (n > INT32_MAX) n = INT32_MAX;
  ssl.ERR_clear_error();
  int rc = ssl.SSL_write(t->ssl, buf, (int)n);
  t->write_wants_read = false;
  if (rc > 0) return rc;
  int e = ssl.SSL_get_error(t->ssl, rc);
  if (e == SSL_ERROR_WANT_WRITE) return -1;
  if (e == SSL_ERROR_WANT_READ) {
    t->write_wants_read = true;
    return -1;
  }
  ssl.ERR_clear_error();
  return -2;
}

uint32_t eg_tls_adjust(const eg_tls_t *t, uint32_t events) {
  if (t->read_wants_write) events |= EPOLLOUT;
  if (t->write_wants_read) events |= EPOLLIN;
  return events;
}

size_t eg_tls_pending(const eg_tls_t *t) {
  int n = ssl.SSL_pending(t->ssl);
  return n > 0 ? (size_t)n : 0;
}

void eg_tls_free(eg_tls_t *t) {
  if (!t) return;
  ssl.SSL_free(t->ssl);
  free(t);
}
