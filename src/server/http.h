/* server/http.h — the HTTP front: libmicrohttpd with one thread per
 * connection, routing, body limits, API-key check, error bodies, SSE, client
 * disconnect detection and the one-line-per-request log. */
#ifndef ORCHID_SERVER_HTTP_H
#define ORCHID_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "server/sched.h"

struct http_options {
    const char *host;     /* bind address, default 127.0.0.1 */
    int port;             /* 0: any free port (see http_port) */
    const char *api_key;  /* NULL: no auth */
    size_t max_body;      /* bytes; larger bodies get 413 */
    int default_thinking; /* -1 template default, 0 off, 1 on */
    bool log_requests;    /* one stderr line per request */
};

struct http_server;

int http_start(struct http_server **out, const struct http_options *opt, struct sched *sched, char *err,
               size_t errlen);
int http_port(const struct http_server *h);
/* Stops accepting new connections (in-flight requests continue). */
void http_quiesce(struct http_server *h);
/* Stops the daemon; waits for every connection thread. */
void http_stop(struct http_server *h);

#endif
