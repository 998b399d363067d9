/* TLS client connections (see tls.h). */
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/epoll.h>

#include "egress/egress.h"
#include "egress/tls.h"

#define LIBSSL_SONAME "libssl.so.3"

#define LIBSSL_FUNCTIONS(X)           \
  X(TLS_client_method)                \
  X(TLS_server_method)                \
  X(SSL_CTX_use_certificate)          \
  X(SSL_CTX_use_PrivateKey)           \
  X(SSL_CTX_load_verify_locations)    \
  X(SSL_accept)                       \
  X(SSL_shutdown)                     \
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
  bool server; /* the proxy's end of an intercepted connection (SSL_accept) */
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

eg_tls_ctx_t *eg_tls_ctx_new(const char *extra_ca_file, cm_error_t *err) {
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
  if (extra_ca_file && ssl.SSL_CTX_load_verify_locations(ctx, extra_ca_file, NULL) != 1) {
    ssl_error(err, "loading --egress-ca-file");
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
  int rc = t->server ? ssl.SSL_accept(t->ssl) : ssl.SSL_connect(t->ssl);
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
  long v = t->server ? X509_V_OK : ssl.SSL_get_verify_result(t->ssl);
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

void eg_tls_shutdown(eg_tls_t *t) {
  ssl.ERR_clear_error();
  (void)ssl.SSL_shutdown(t->ssl); /* one try: close_notify, if the socket takes it */
  ssl.ERR_clear_error();
}

void eg_tls_free(eg_tls_t *t) {
  if (!t) return;
  ssl.SSL_free(t->ssl);
  free(t);
}

/* ---------------------------------------------------------------- the interception CA */

#define LIBCRYPTO_SONAME "libcrypto.so.3"
#define LIBCRYPTO_FUNCTIONS(X)  \
  X(BIO_ctrl)                   \
  X(BIO_free)                   \
  X(BIO_new)                    \
  X(BIO_s_mem)                  \
  X(BN_bin2bn)                  \
  X(BN_free)                    \
  X(BN_to_ASN1_INTEGER)         \
  X(EVP_PKEY_Q_keygen)          \
  X(EVP_PKEY_free)              \
  X(EVP_sha256)                 \
  X(PEM_write_bio_X509)         \
  X(RAND_bytes)                 \
  X(X509V3_EXT_conf_nid)        \
  X(X509V3_set_ctx)             \
  X(X509_EXTENSION_free)        \
  X(X509_NAME_add_entry_by_txt) \
  X(X509_add_ext)               \
  X(X509_free)                  \
  X(X509_get_serialNumber)      \
  X(X509_get_subject_name)      \
  X(X509_getm_notAfter)         \
  X(X509_getm_notBefore)        \
  X(X509_gmtime_adj)            \
  X(X509_new)                   \
  X(X509_set_issuer_name)       \
  X(X509_set_pubkey)            \
  X(X509_set_version)           \
  X(X509_sign)

static struct {
#define CRYPTO_MEMBER(name) __typeof__(name) *name;
  LIBCRYPTO_FUNCTIONS(CRYPTO_MEMBER)
#undef CRYPTO_MEMBER
} crypto;
static bool crypto_loaded;

static int crypto_load(cm_error_t *err) {
  if (crypto_loaded) return 0;
#define CRYPTO_NAME(name) #name,
  static const char *const names[] = {LIBCRYPTO_FUNCTIONS(CRYPTO_NAME)};
#undef CRYPTO_NAME
  void *syms[CM_ARRAY_SIZE(names)];
  if (cm_dl_symbols(LIBCRYPTO_SONAME, names, CM_ARRAY_SIZE(names), syms, err) < 0) return -1;
  size_t i = 0;
#define CRYPTO_ASSIGN(name) crypto.name = (__typeof__(name) *)syms[i++];
  LIBCRYPTO_FUNCTIONS(CRYPTO_ASSIGN)
#undef CRYPTO_ASSIGN
  crypto_loaded = true;
  return 0;
}

/* Leaf certificates kept (one SSL_CTX per host), for the process's life; past it the oldest
 * is made again when next asked for. */
#define EG_TLS_LEAVES_MAX 256

typedef struct leaf {
  char host[EG_HOST_MAX + 1];
  SSL_CTX *ctx;
  uint64_t made;
} leaf_t;

struct eg_tls_ca {
  EVP_PKEY *key; /* the CA's key: in this process only */
  X509 *cert;
  EVP_PKEY *leaf_key; /* one key for every leaf */
  char *pem;          /* the CA certificate */
  leaf_t leaves[EG_TLS_LEAVES_MAX];
  uint64_t made;
};

static int add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value, cm_error_t *err) {
  X509_EXTENSION *ext = crypto.X509V3_EXT_conf_nid(NULL, ctx, nid, value);
  if (!ext) return cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate extension %s", value);
  int ok = crypto.X509_add_ext(x, ext, -1);
  crypto.X509_EXTENSION_free(ext);
  return ok ? 0 : cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate extension %s", value);
}

/* A certificate for key, signed by issuer_key (issuer NULL: self-signed), with the
 * extensions Python 3.13's strict verification asks for. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
                       const char *san, cm_error_t *err) {
  X509 *x = crypto.X509_new();
  if (!x || !crypto.X509_set_version(x, 2)) {
    cm_error_set(err, 0, CM_ERR_INTERNAL, "creating a certificate");
    goto fail;
  }
  unsigned char serial[16];
  if (crypto.RAND_bytes(serial, sizeof serial) != 1) {
    cm_error_set(err, 0, CM_ERR_INTERNAL, "random serial number");
    goto fail;
  }
  serial[0] &= 0x7f;
  serial[0] |= 0x01;
  BIGNUM *bn = crypto.BN_bin2bn(serial, sizeof serial, NULL);
  bool serial_ok = bn && crypto.BN_to_ASN1_INTEGER(bn, crypto.X509_get_serialNumber(x));
  crypto.BN_free(bn);
  if (!serial_ok) {
    cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate serial number");
    goto fail;
  }
  crypto.X509_gmtime_adj(crypto.X509_getm_notBefore(x), -3600);
  crypto.X509_gmtime_adj(crypto.X509_getm_notAfter(x), issuer ? 397L * 86400 : 3650L * 86400);
  crypto.X509_set_pubkey(x, key);
  X509_NAME *name = crypto.X509_get_subject_name(x);
  crypto.X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  if (!issuer) {
    crypto.X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                      (const unsigned char *)"mcp-python-exec-sandbox", -1, -1, 0);
  }
  crypto.X509_set_issuer_name(x, crypto.X509_get_subject_name(issuer ? issuer : x));
  X509V3_CTX ctx;
  crypto.X509V3_set_ctx(&ctx, issuer ? issuer : x, x, NULL, NULL, 0);
  int rc = issuer
               ? (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:FALSE", err) < 0 ||
                  add_ext(x, &ctx, NID_key_usage, "critical,digitalSignature", err) < 0 ||
                  add_ext(x, &ctx, NID_ext_key_usage, "serverAuth", err) < 0 ||
                  add_ext(x, &ctx, NID_subject_key_identifier, "hash", err) < 0 ||
                  add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always", err) < 0 ||
                  add_ext(x, &ctx, NID_subject_alt_name, san, err) < 0)
               : (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0", err) < 0 ||
                  add_ext(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign", err) < 0 ||
                  add_ext(x, &ctx, NID_subject_key_identifier, "hash", err) < 0 ||
                  add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always", err) < 0);
  if (rc) goto fail;
  if (!crypto.X509_sign(x, issuer ? issuer_key : key, crypto.EVP_sha256())) {
    cm_error_set(err, 0, CM_ERR_INTERNAL, "signing the certificate");
    goto fail;
  }
  return x;
fail:
  if (x) crypto.X509_free(x);
  return NULL;
}

eg_tls_ca_t *eg_tls_ca_new(cm_error_t *err) {
  if (ssl_load(err) < 0 || crypto_load(err) < 0) return NULL;
  eg_tls_ca_t *ca = xcalloc(1, sizeof *ca);
  ca->key = crypto.EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  ca->leaf_key = crypto.EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  if (!ca->key || !ca->leaf_key) {
    cm_error_set(err, 0, CM_ERR_INTERNAL, "generating the egress proxy's CA key");
    eg_tls_ca_free(ca);
    return NULL;
  }
  ca->cert = make_cert(ca->key, "mcp-python-exec-sandbox egress proxy CA", NULL, NULL, NULL, err);
  BIO *b = ca->cert ? crypto.BIO_new(crypto.BIO_s_mem()) : NULL;
  if (b && crypto.PEM_write_bio_X509(b, ca->cert)) {
    char *p;
    long n = crypto.BIO_ctrl(b, BIO_CTRL_INFO, 0, &p);
    ca->pem = xstrndup(p, n > 0 ? (size_t)n : 0);
  }
  if (b) crypto.BIO_free(b);
  if (!ca->pem) {
    if (ca->cert) cm_error_set(err, 0, CM_ERR_INTERNAL, "writing the CA certificate");
    eg_tls_ca_free(ca);
    return NULL;
  }
  return ca;
}

void eg_tls_ca_free(eg_tls_ca_t *ca) {
  if (!ca) return;
  for (size_t i = 0; i < EG_TLS_LEAVES_MAX; i++)
    if (ca->leaves[i].ctx) ssl.SSL_CTX_free(ca->leaves[i].ctx);
  if (ca->cert) crypto.X509_free(ca->cert);
  if (ca->key) crypto.EVP_PKEY_free(ca->key);
  if (ca->leaf_key) crypto.EVP_PKEY_free(ca->leaf_key);
  free(ca->pem);
  free(ca);
}

const char *eg_tls_ca_pem(const eg_tls_ca_t *ca) {
  return ca->pem;
}

/* The server context for host: made (leaf certificate and all) the first time. */
static SSL_CTX *leaf_ctx(eg_tls_ca_t *ca, const char *host, cm_error_t *err) {
  leaf_t *slot = &ca->leaves[0];
  for (size_t i = 0; i < EG_TLS_LEAVES_MAX; i++) {
    leaf_t *l = &ca->leaves[i];
    if (l->ctx && strcmp(l->host, host) == 0) return l->ctx;
    if (!l->ctx || (slot->ctx && l->made < slot->made)) slot = l;
  }
  eg_addr_t a;
  bool literal = eg_addr_parse(host, strlen(host), &a) == 0;
  cleanup_free char *san = xasprintf("%s:%s", literal ? "IP" : "DNS", host);
  X509 *x = make_cert(ca->leaf_key, host, ca->cert, ca->key, san, err);
  if (!x) return NULL;
  SSL_CTX *ctx = ssl.SSL_CTX_new(ssl.TLS_server_method());
  if (!ctx || ssl.SSL_CTX_use_certificate(ctx, x) != 1 ||
      ssl.SSL_CTX_use_PrivateKey(ctx, ca->leaf_key) != 1) {
    ssl_error(err, "the leaf certificate's context");
    if (ctx) ssl.SSL_CTX_free(ctx);
    crypto.X509_free(x);
    return NULL;
  }
  crypto.X509_free(x); /* the context holds its own reference */
  ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
  ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_MODE,
                   SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
  if (slot->ctx) ssl.SSL_CTX_free(slot->ctx); /* connections using it hold their references */
  snprintf(slot->host, sizeof slot->host, "%s", host);
  slot->ctx = ctx;
  slot->made = ++ca->made;
  return ctx;
}

eg_tls_t *eg_tls_server_new(eg_tls_ca_t *ca, int fd, const char *host, cm_error_t *err) {
  SSL_CTX *ctx = leaf_ctx(ca, host, err);
  if (!ctx) return NULL;
  SSL *s = ssl.SSL_new(ctx);
  if (!s || ssl.SSL_set_fd(s, fd) != 1) {
    ssl_error(err, "setting up TLS");
    if (s) ssl.SSL_free(s);
    return NULL;
  }
  eg_tls_t *t = xcalloc(1, sizeof *t);
  t->ssl = s;
  t->server = true;
  t->hs_wants = EPOLLIN;
  return t;
}
