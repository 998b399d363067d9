/* TLS material for the HTTP transport (tr.h): the self-signed certificate, and the check
 * that a certificate and a key belong together.  libcrypto is opened on first use. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "transport/tr.h"

#define TLS_MAX_PEM (1u << 20)
#define TLS_DAYS 3650

/* ---------------------------------------------------------------- libcrypto, on demand */

/* libcrypto is some 1.4 MiB of resident pages that only TLS needs, so it is opened the
 * first time a certificate is made or checked, and called through this table.  The
 * headers still give the types and constants; the soname pins the ABI they describe.
 * Two of the names used below are macros in the headers: BIO_get_mem_data (over BIO_ctrl)
 * and EVP_EC_gen (over EVP_PKEY_Q_keygen), so the table holds what they expand to. */
#define LIBCRYPTO_SONAME "libcrypto.so.3"
#define LIBCRYPTO_FUNCTIONS(X)  \
  X(BIO_ctrl)                   \
  X(BIO_free)                   \
  X(BIO_new)                    \
  X(BIO_new_mem_buf)            \
  X(BIO_s_mem)                  \
  X(BN_bin2bn)                  \
  X(BN_free)                    \
  X(BN_to_ASN1_INTEGER)         \
  X(ASN1_STRING_get0_data)      \
  X(ASN1_STRING_length)         \
  X(EVP_PKEY_Q_keygen)          \
  X(EVP_PKEY_free)              \
  X(EVP_sha256)                 \
  X(PEM_read_bio_PrivateKey)    \
  X(PEM_read_bio_X509)          \
  X(PEM_write_bio_PrivateKey)   \
  X(PEM_write_bio_X509)         \
  X(RAND_bytes)                 \
  X(X509V3_EXT_conf_nid)        \
  X(X509V3_set_ctx)             \
  X(X509_EXTENSION_free)        \
  X(X509_EXTENSION_get_data)    \
  X(X509_get_ext)               \
  X(X509_get_ext_by_NID)        \
  X(X509_NAME_add_entry_by_txt) \
  X(X509_add_ext)               \
  X(X509_check_private_key)     \
  X(X509_digest)                \
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

/* Opens libcrypto and fills the table, once; kept open for the life of the process. */
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

/* ---------------------------------------------------------------- TLS */

/* The guards matter: these run at scope exit, also on paths where nothing was made. */
static void pkey_freep(EVP_PKEY **p) {
  if (*p) crypto.EVP_PKEY_free(*p);
}
static void x509_freep(X509 **p) {
  if (*p) crypto.X509_free(*p);
}
static void bio_freep(BIO **p) {
  if (*p) crypto.BIO_free(*p);
}
#define cleanup_pkey __attribute__((cleanup(pkey_freep)))
#define cleanup_x509 __attribute__((cleanup(x509_freep)))
#define cleanup_bio __attribute__((cleanup(bio_freep)))

static char *bio_text(BIO *b) {
  char *p;
  long n = crypto.BIO_ctrl(b, BIO_CTRL_INFO, 0, &p);
  return xstrndup(p, n > 0 ? (size_t)n : 0);
}

static int add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value, cm_error_t *err) {
  X509_EXTENSION *ext = crypto.X509V3_EXT_conf_nid(NULL, ctx, nid, value);
  if (!ext) return cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate extension %s", value);
  int ok = crypto.X509_add_ext(x, ext, -1);
  crypto.X509_EXTENSION_free(ext);
  return ok ? 0 : cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate extension %s", value);
}

bool tr_tls_name_ok(const char *s) {
  unsigned char addr[16];
  if (inet_pton(AF_INET, s, addr) == 1 || inet_pton(AF_INET6, s, addr) == 1) return true;
  size_t n = strlen(s);
  if (n == 0 || n >= 254) return false;
  const char *p = strncmp(s, "*.", 2) == 0 ? s + 2 : s;
  if (!*p || *p == '.' || *p == '-') return false;
  for (; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '-' || *p == '.'))
      return false;
  return true;
}

/* The subjectAltName list, built without repeats, in at most TR_TLS_MAX_NAMES entries. */
typedef struct alt_list {
  cm_buf_t text; /* "DNS:a,IP:b,..." */
  size_t count;
  bool full;
} alt_list_t;

static void alt_add(alt_list_t *l, const char *name) {
  if (!name || !*name || !tr_tls_name_ok(name)) return;
  unsigned char addr[16];
  bool ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
  cleanup_free char *entry = xasprintf("%s:%s", ip ? "IP" : "DNS", name);
  /* Already there?  (entries are comma-separated and hold no comma) */
  size_t el = strlen(entry);
  for (const char *p = l->text.data; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == el && strncasecmp(p, entry, el) == 0) return;
    p = comma ? comma + 1 : p + len;
  }
  if (l->count >= TR_TLS_MAX_NAMES) {
    l->full = true;
    return;
  }
  if (l->count) cm_buf_appends(&l->text, ",");
  cm_buf_appends(&l->text, entry);
  l->count++;
}

/* Every interface's address: IPv4 (v6 too when want_v6), but IPv6 link-local ones (only
 * meaningful with a zone, which a certificate cannot name). */
static void alt_add_interfaces(alt_list_t *l, bool want_v6) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) < 0) {
    cm_warn("TLS: listing the interfaces' addresses: %s", strerror(errno));
    return;
  }
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    char text[INET6_ADDRSTRLEN];
    if (i->ifa_addr->sa_family == AF_INET) {
      const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)i->ifa_addr;
      if (inet_ntop(AF_INET, &a->sin_addr, text, sizeof text)) alt_add(l, text);
    } else if (want_v6 && i->ifa_addr->sa_family == AF_INET6) {
      const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)i->ifa_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) continue;
      if (inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text)) alt_add(l, text);
    }
  }
  freeifaddrs(ifs);
}

/* The certificate's subjectAltName (tr_tls_self_signed says what it holds). */
static char *alt_names(const char *host, const char *const *extra_names) {
  alt_list_t l = {.count = 0};
  cm_buf_init(&l.text, 0);
  alt_add(&l, "localhost");
  alt_add(&l, "127.0.0.1");
  alt_add(&l, "::1");
  char hostname[256] = "";
  if (gethostname(hostname, sizeof hostname - 1) == 0 && hostname[0]) {
    alt_add(&l, hostname);
    /* Its FQDN, as the resolver's configuration gives it (/etc/hosts first, usually). */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_flags = AI_CANONNAME};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(hostname, NULL, &hints, &ai) == 0) {
      if (ai && ai->ai_canonname && strchr(ai->ai_canonname, '.')) alt_add(&l, ai->ai_canonname);
      freeaddrinfo(ai);
    }
  }
  bool any4 = host && strcmp(host, "0.0.0.0") == 0;
  bool any6 = !host || !*host || strcmp(host, "::") == 0;
  if (any4 || any6)
    alt_add_interfaces(&l, any6);
  else
    alt_add(&l, host);
  for (const char *const *e = extra_names; e && *e; e++) alt_add(&l, *e);
  if (l.full)
    cm_warn("TLS: the certificate names its first %d names and addresses only", TR_TLS_MAX_NAMES);
  return cm_buf_steal(&l.text);
}

/* One DER element at p (n bytes): its whole size, with *header the size of its tag and
 * length; 0 when it is malformed or runs past n.  (Short and long lengths up to 4 bytes.) */
static size_t der_element(const unsigned char *p, size_t n, size_t *header) {
  if (n < 2) return 0;
  size_t len = p[1], h = 2;
  if (len & 0x80) {
    size_t k = len & 0x7f;
    if (k == 0 || k > 4 || n < 2 + k) return 0;
    len = 0;
    for (size_t i = 0; i < k; i++) len = (len << 8) | p[2 + i];
    h += k;
  }
  if (len > n - h) return 0;
  *header = h;
  return h + len;
}

/* The DER of an extension's value (a SEQUENCE of GeneralNames for subjectAltName): its
 * elements' span, or false. */
static bool san_items(X509_EXTENSION *ext, const unsigned char **items, size_t *n) {
  const ASN1_OCTET_STRING *v = crypto.X509_EXTENSION_get_data(ext);
  const unsigned char *p = crypto.ASN1_STRING_get0_data(v);
  int len = crypto.ASN1_STRING_length(v);
  size_t h;
  if (!p || len <= 0 || p[0] != 0x30 || der_element(p, (size_t)len, &h) != (size_t)len)
    return false;
  *items = p + h;
  *n = (size_t)len - h;
  return true;
}

/* Whether the certificate's subjectAltName holds every entry of san ("DNS:a,IP:b", as
 * X509V3_EXT_conf_nid reads it): one it lacks means a new certificate.  (One that is no
 * longer wanted stays: every new certificate is a new trust anchor for its clients.) */
static bool names_all(const char *cert_pem, const char *san, const char **missing_out) {
  cleanup_bio BIO *cb = crypto.BIO_new_mem_buf(cert_pem, -1);
  cleanup_x509 X509 *x = cb ? crypto.PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  if (!x) return false;
  int at = crypto.X509_get_ext_by_NID(x, NID_subject_alt_name, -1);
  X509_EXTENSION *have = at >= 0 ? crypto.X509_get_ext(x, at) : NULL;
  const unsigned char *have_items;
  size_t have_n;
  if (!have || !san_items(have, &have_items, &have_n)) return false;
  cleanup_free char *list = xstrdup(san);
  char *save = NULL;
  for (char *entry = strtok_r(list, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
    X509_EXTENSION *want = crypto.X509V3_EXT_conf_nid(NULL, NULL, NID_subject_alt_name, entry);
    const unsigned char *w;
    size_t wn, h;
    bool found = false;
    if (want && san_items(want, &w, &wn)) {
      for (size_t off = 0, size; off < have_n && !found; off += size) {
        size = der_element(have_items + off, have_n - off, &h);
        if (!size) break;
        found = size == wn && memcmp(have_items + off, w, wn) == 0;
      }
    }
    if (want) crypto.X509_EXTENSION_free(want);
    if (!found) {
      *missing_out = san + (entry - list);
      return false;
    }
  }
  return true;
}

static int make_certificate(const char *cn, const char *san, char **cert_pem, char **key_pem,
                            cm_error_t *err) {
  cleanup_pkey EVP_PKEY *pkey = crypto.EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  if (!pkey) return cm_error_set(err, 0, CM_ERR_INTERNAL, "generating an EC P-256 key");
  cleanup_x509 X509 *x = crypto.X509_new();
  if (!x || !crypto.X509_set_version(x, 2))
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "creating a certificate");
  unsigned char serial[16];
  if (crypto.RAND_bytes(serial, sizeof serial) != 1)
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "random serial number");
  serial[0] &= 0x7f;
  BIGNUM *bn = crypto.BN_bin2bn(serial, sizeof serial, NULL);
  bool serial_ok = bn && crypto.BN_to_ASN1_INTEGER(bn, crypto.X509_get_serialNumber(x));
  crypto.BN_free(bn);
  if (!serial_ok) return cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate serial number");
  crypto.X509_gmtime_adj(crypto.X509_getm_notBefore(x), -3600);
  crypto.X509_gmtime_adj(crypto.X509_getm_notAfter(x), (long)TLS_DAYS * 86400);
  crypto.X509_set_pubkey(x, pkey);
  X509_NAME *name = crypto.X509_get_subject_name(x);
  crypto.X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  crypto.X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  crypto.X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
  if (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:TRUE", err) < 0 ||
      add_ext(x, &ctx, NID_key_usage, "critical,digitalSignature,keyCertSign", err) < 0 ||
      add_ext(x, &ctx, NID_ext_key_usage, "serverAuth", err) < 0 ||
      add_ext(x, &ctx, NID_subject_key_identifier, "hash", err) < 0 ||
      add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always", err) < 0 ||
      add_ext(x, &ctx, NID_subject_alt_name, san, err) < 0)
    return -1;
  if (!crypto.X509_sign(x, pkey, crypto.EVP_sha256()))
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "signing the certificate");
  cleanup_bio BIO *cb = crypto.BIO_new(crypto.BIO_s_mem());
  cleanup_bio BIO *kb = crypto.BIO_new(crypto.BIO_s_mem());
  if (!cb || !kb || !crypto.PEM_write_bio_X509(cb, x) ||
      !crypto.PEM_write_bio_PrivateKey(kb, pkey, NULL, NULL, 0, NULL, NULL))
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "writing PEM");
  *cert_pem = bio_text(cb);
  *key_pem = bio_text(kb);
  return 0;
}

static int check_pair(const char *cert_pem, const char *key_pem, char fingerprint[96],
                      cm_error_t *err) {
  cleanup_bio BIO *cb = crypto.BIO_new_mem_buf(cert_pem, -1);
  cleanup_bio BIO *kb = crypto.BIO_new_mem_buf(key_pem, -1);
  cleanup_x509 X509 *x = cb ? crypto.PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  cleanup_pkey EVP_PKEY *pkey = kb ? crypto.PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  if (!x || !pkey) return cm_error_set(err, 0, CM_ERR_INVALID, "unreadable PEM");
  if (crypto.X509_check_private_key(x, pkey) != 1)
    return cm_error_set(err, 0, CM_ERR_INVALID, "the key does not match the certificate");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!crypto.X509_digest(x, crypto.EVP_sha256(), md, &n) || n != 32)
    return cm_error_set(err, 0, CM_ERR_INTERNAL, "certificate digest");
  for (unsigned int i = 0; i < n; i++)
    snprintf(fingerprint + 3 * i, 4, i + 1 < n ? "%02X:" : "%02X", md[i]);
  return 0;
}

static int write_private(const char *path, const char *text, mode_t mode, cm_error_t *err) {
  cleanup_free char *tmp = xasprintf("%s.tmp.%d", path, (int)getpid());
  unlink(tmp);
  if (cm_write_file(tmp, text, strlen(text), mode, err) < 0) return -1;
  if (rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    return cm_error_set(err, e, CM_ERR_IO, "rename %s", path);
  }
  return 0;
}

int tr_tls_self_signed(const char *dir, const char *name, const char *host,
                       const char *const *extra_names, char **cert_pem, char **key_pem,
                       char fingerprint[96], cm_error_t *err) {
  if (crypto_load(err) < 0) return cm_error_wrap(err, "self-signed certificate");
  if (cm_mkdir_p(dir, 0700, err) < 0) return cm_error_wrap(err, "creating %s", dir);
  cleanup_free char *cert_path = xasprintf("%s/cert.pem", dir);
  cleanup_free char *key_path = xasprintf("%s/key.pem", dir);
  cleanup_free char *cert = NULL;
  cleanup_free char *key = NULL;
  cleanup_free char *san = alt_names(host, extra_names);
  size_t cl = 0, kl = 0;
  cm_error_t lerr = CM_ERROR_INIT;
  if (cm_read_file(cert_path, TLS_MAX_PEM, &cert, &cl, &lerr) == 0 &&
      cm_read_file(key_path, TLS_MAX_PEM, &key, &kl, &lerr) == 0 &&
      check_pair(cert, key, fingerprint, &lerr) == 0) {
    const char *missing = NULL;
    if (names_all(cert, san, &missing)) {
      *cert_pem = steal_pointer(&cert);
      *key_pem = steal_pointer(&key);
      return 0;
    }
    if (missing)
      cm_error_set(&lerr, 0, CM_ERR_INVALID, "the certificate does not name %.*s",
                   (int)strcspn(missing, ","), missing);
    else
      cm_error_set(&lerr, 0, CM_ERR_INVALID, "the certificate has no readable subjectAltName");
  }
  if (lerr.errnum != ENOENT)
    cm_warn("TLS: %s: %s; making a new certificate", dir, cm_error_message(&lerr));
  cm_error_release(&lerr);
  if (key) explicit_bzero(key, kl);
  free(steal_pointer(&cert));
  free(steal_pointer(&key));
  if (make_certificate(name, san, &cert, &key, err) < 0)
    return cm_error_wrap(err, "self-signed certificate");
  int rc = write_private(key_path, key, 0600, err);
  if (rc == 0) rc = write_private(cert_path, cert, 0644, err);
  if (rc == 0) rc = check_pair(cert, key, fingerprint, err);
  if (rc < 0) {
    explicit_bzero(key, strlen(key));
    return cm_error_wrap(err, "self-signed certificate in %s", dir);
  }
  cm_info("TLS: created a self-signed certificate in %s for %s", dir, san);
  *cert_pem = steal_pointer(&cert);
  *key_pem = steal_pointer(&key);
  return 0;
}

int tr_tls_check_pair(const char *cert_pem, const char *key_pem, char fingerprint[96],
                      cm_error_t *err) {
  if (crypto_load(err) < 0) return -1;
  return check_pair(cert_pem, key_pem, fingerprint, err);
}
