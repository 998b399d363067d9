/* TLS client connections for index requests to https indexes: OpenSSL's libssl, opened at
 * run time (dlopen) the first time one is needed, non-blocking on the proxy's loop, verifying
 * the server against the system trust store (SSL_CERT_FILE / SSL_CERT_DIR honoured) and its
 * name (or address). */
#ifndef MPS_EGRESS_TLS_H
#define MPS_EGRESS_TLS_H

#include "common/cm.h"

typedef struct eg_tls_ctx eg_tls_ctx_t;
typedef struct eg_tls eg_tls_t;

/* extra_ca_file: a PEM file trusted besides the system store (--egress-ca-file), or NULL. */
eg_tls_ctx_t *eg_tls_ctx_new(const char *extra_ca_file, cm_error_t *err);
void eg_tls_ctx_free(eg_tls_ctx_t *ctx);
/* A client on the connected, non-blocking fd (not owned) for host (a name: SNI and name
 * check; an address literal: address check). */
eg_tls_t *eg_tls_new(eg_tls_ctx_t *ctx, int fd, const char *host, cm_error_t *err);
/* 1 = done, 0 = call again when eg_tls_wants() is ready, -1 = failed (err says why). */
int eg_tls_handshake(eg_tls_t *t, cm_error_t *err);
/* The events the handshake waits for (EPOLLIN / EPOLLOUT). */
uint32_t eg_tls_wants(const eg_tls_t *t);
/* >0 bytes, 0 = the peer closed, -1 = again later, -2 = error. */
ssize_t eg_tls_read(eg_tls_t *t, char *buf, size_t n);
ssize_t eg_tls_write(eg_tls_t *t, const char *buf, size_t n);
/* The relay's wanted events, plus what a read or write that must be retried waits for. */
uint32_t eg_tls_adjust(const eg_tls_t *t, uint32_t events);
/* Decrypted bytes waiting in the library. */
size_t eg_tls_pending(const eg_tls_t *t);
/* Sends close_notify (one non-blocking try). */
void eg_tls_shutdown(eg_tls_t *t);
void eg_tls_free(eg_tls_t *t);

/* The CA of intercepted connections (a secret's hosts): a new EC P-256 key and a self-signed
 * certificate per proxy, both in memory only; leaf certificates for each host made from it on
 * first use and kept.  The certificates carry what Python 3.13's strict verification asks
 * for (basicConstraints critical, key usage, subject and authority key identifiers). */
typedef struct eg_tls_ca eg_tls_ca_t;
eg_tls_ca_t *eg_tls_ca_new(cm_error_t *err);
void eg_tls_ca_free(eg_tls_ca_t *ca);
/* The CA certificate (PEM), for the sandbox's trust store. */
const char *eg_tls_ca_pem(const eg_tls_ca_t *ca);
/* The proxy's end of an intercepted connection to host, on the client's fd (not owned):
 * eg_tls_handshake accepts. */
eg_tls_t *eg_tls_server_new(eg_tls_ca_t *ca, int fd, const char *host, cm_error_t *err);

#endif
