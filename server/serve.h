/* Serving the router over a transport other than stdio. */
#ifndef MPS_SERVER_SERVE_H
#define MPS_SERVER_SERVE_H

#include "server/srv.h"

/* Starts the Streamable HTTP transport on cfg's --host/--port/--path: reads the TLS key
 * and certificate (--tls-cert/--tls-key), or creates and reuses a self-signed pair under
 * <state dir>/tls/ (--tls-self-signed, whose SHA-256 fingerprint it prints to stderr),
 * and wires the transport's session callbacks to srv_session_*.  On success *out is the
 * transport (tr_http_shutdown() then tr_http_free() it before srv_server_free()). */
int srv_serve_http(cm_loop_t *loop, srv_server_t *server, const srv_config_t *cfg, tr_http_t **out,
                   cm_error_t *err);

/* "http[s]://host:port/path" for the log line that tells users where we listen (heap). */
char *srv_http_url(const srv_config_t *cfg, uint16_t port);

/* Loads (or creates, then reuses) the self-signed certificate under dir: an EC P-256 key
 * (key.pem, 0600) and a certificate (cert.pem) for localhost, 127.0.0.1, ::1 and host.
 * Returns both PEM texts (heap) and the certificate's SHA-256 fingerprint as upper-case
 * hex pairs joined by ':' (96 bytes with the NUL). */
int srv_tls_self_signed(const char *dir, const char *host, char **cert_pem, char **key_pem,
                        char fingerprint[96], cm_error_t *err);

#endif
