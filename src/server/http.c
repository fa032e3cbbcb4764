/* server/http.c — libmicrohttpd glue (see http.h).
 *
 * Threading: MHD_USE_THREAD_PER_CONNECTION, so each connection's handler may
 * block. A non-streaming generation waits in its handler, polling the socket
 * for a hang-up between waits; a streaming one returns a callback response
 * whose reader blocks (with the same hang-up check) until the job has more
 * text. Either way a vanished client cancels its job within ~50 ms, and the
 * scheduler drops it before its next step.
 *
 * Per-request state (struct req) lives from the first access-handler call to
 * MHD's request-completed notification, which writes the log line, records
 * metrics and frees everything (cancelling an unfinished job).
 */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/status.h"
#include "runtime/timing.h"
#include "server/anthropic.h"
#include "server/gen.h"
#include "server/tokenize.h"
#include "server/metrics.h"

struct http_server {
    struct http_options opt;
    struct MHD_Daemon *d;
    struct sched *sched;
    int port;
    char api_key[256];
    bool has_key;
    atomic_int active; /* requests between first handler call and completion */
};

struct req {
    struct http_server *srv;
    struct MHD_Connection *conn;
    char method[16];
    char path[160];
    enum metrics_endpoint ep;
    char *body;
    size_t len, cap;
    bool too_large;
    bool answered;
    double t0;
    int status;
    struct gen *gen;
    char err[640];
};

/* ---- responses ---- */

static bool takes_post(enum metrics_endpoint ep) {
    return ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_MESSAGES || ep == EP_COUNT_TOKENS || ep == EP_RESPONSES ||
           ep == EP_TOKENIZE || ep == EP_DETOKENIZE;
}

/* The Anthropic endpoints answer errors in Anthropic's shape. */
static bool anthropic_ep(enum metrics_endpoint ep) { return ep == EP_MESSAGES || ep == EP_COUNT_TOKENS; }

static enum MHD_Result send_text(struct req *r, int status, const char *ctype, char *body, size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 429) MHD_add_response_header(resp, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 405) {
        const char *allow = takes_post(r->ep) ? "POST" : "GET";
        MHD_add_response_header(resp, "Allow", allow);
    }
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->answered = true;
    return ret;
}

static enum MHD_Result send_json(struct req *r, int status, char *body) {
    if (!body) return MHD_NO;
    return send_text(r, status, "application/json", body, strlen(body));
}

static enum MHD_Result send_error(struct req *r, const struct api_error *e) {
    if (e->status >= 400 && e->status < 500) snprintf(r->err, sizeof r->err, "%s", e->message);
    return send_json(r, e->status, anthropic_ep(r->ep) ? anthropic_error_json(e) : api_error_json(e));
}

static enum MHD_Result fail(struct req *r, int status, const char *type, const char *param, const char *code,
                            const char *msg) {
    struct api_error e;
    api_error_set(&e, status, type, param, code, "%s", msg);
    return send_error(r, &e);
}

/* ---- client hang-up detection ---- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* True when the peer has closed (or reset) the connection. Waits up to timeout_ms. */
static bool peer_gone(int fd, int timeout_ms) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    int n = poll(&p, 1, timeout_ms);
    if (n <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0) return true;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
    return false;
}

/* ---- streaming ---- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct req *r = cls;
    struct gen *g = r->gen;
    int fd = conn_fd(r->conn);
    for (;;) {
        long n = gen_stream_take(g, buf, max);
        if (n > 0) return (ssize_t)n;
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (gen_pump(g, 25)) continue;
        if (gen_stream_take(g, buf, 0) == 0 && peer_gone(fd, 0)) {
            gen_cancel(g);
            snprintf(r->err, sizeof r->err, "client disconnected");
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* ---- routes ---- */

/* A body that is not UTF-8 is refused before it is parsed. Returns true when
 * it answered (*ret is the handler's result). */
static bool refuse_bad_utf8(struct req *r, enum MHD_Result *ret) {
    size_t bad = utf8_invalid_at(r->body ? r->body : "", r->len);
    if (bad == (size_t)-1) return false;
    char msg[96];
    snprintf(msg, sizeof msg, "request body is not valid UTF-8 (byte %zu)", bad);
    *ret = fail(r, 400, "invalid_request_error", NULL, NULL, msg);
    return true;
}

static enum MHD_Result do_generate(struct req *r, enum api_kind kind) {
    struct api_error e;
    struct gen_config cfg = {r->srv->sched, r->srv->opt.default_thinking};
    enum MHD_Result ret;
    if (refuse_bad_utf8(r, &ret)) return ret;
    int rc = gen_begin(&r->gen, &cfg, kind, r->body ? r->body : "", r->len, &e);
    if (rc) return send_error(r, &e);
    if (gen_streaming(r->gen)) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        r->status = 200;
        r->answered = true;
        return ret;
    }
    int fd = conn_fd(r->conn);
    while (!gen_pump(r->gen, 50)) {
        if (peer_gone(fd, 0)) {
            gen_cancel(r->gen);
            snprintf(r->err, sizeof r->err, "client disconnected");
            r->status = 499; /* logged as client closed request */
            r->answered = true;
            return MHD_NO;
        }
    }
    int status;
    char *body = gen_final_json(r->gen, &status);
    if (status >= 500) gen_stats(r->gen, &(int){0}, &(int){0}, &(int){0}, r->err, sizeof r->err);
    return send_json(r, status, body);
}

/* A POST answered on the connection thread with one JSON body (count_tokens, tokenize,
 * detokenize): fn's answer, or its error. */
static enum MHD_Result do_json_call(struct req *r, int (*fn)(const struct gen_config *, const char *, size_t, char **,
                                                              struct api_error *)) {
    struct api_error e;
    struct gen_config cfg = {r->srv->sched, r->srv->opt.default_thinking};
    enum MHD_Result ret;
    if (refuse_bad_utf8(r, &ret)) return ret;
    char *json = NULL;
    if (fn(&cfg, r->body ? r->body : "", r->len, &json, &e)) return send_error(r, &e);
    return send_json(r, 200, json);
}

static char *models_json(struct http_server *s, const char *only) {
    const struct model_port *p = sched_port(s->sched);
    const char *id = p ? p->model_id : "Qwen3.6-35B-A3B";
    if (only && strcmp(only, id) != 0) return NULL;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "orchid");
    cJSON_AddNumberToObject(m, "max_model_len", sched_max_seq(s->sched));
    if (only) {
        char *out = cJSON_PrintUnformatted(m);
        cJSON_Delete(m);
        return out;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, m);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static enum metrics_endpoint route_of(const char *path) {
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/chat/completions")) return EP_CHAT;
    if (!strcmp(path, "/v1/completions") || !strcmp(path, "/completions")) return EP_COMPLETIONS;
    if (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11)) return EP_MODELS;
    if (!strcmp(path, "/v1/messages")) return EP_MESSAGES;
    if (!strcmp(path, "/v1/responses") || !strcmp(path, "/responses")) return EP_RESPONSES;
    if (!strcmp(path, "/v1/messages/count_tokens")) return EP_COUNT_TOKENS;
    if (!strcmp(path, "/tokenize") || !strcmp(path, "/v1/tokenize")) return EP_TOKENIZE;
    if (!strcmp(path, "/detokenize") || !strcmp(path, "/v1/detokenize")) return EP_DETOKENIZE;
    if (!strcmp(path, "/health")) return EP_HEALTH;
    if (!strcmp(path, "/metrics")) return EP_METRICS;
    return EP_OTHER;
}

/* The key comes as "Authorization: Bearer KEY" (OpenAI clients) or
 * "x-api-key: KEY" (Anthropic clients); either is accepted on every route. */
static bool authorized(struct req *r) {
    if (!r->srv->has_key || r->ep == EP_HEALTH) return true;
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && strncasecmp(h, "Bearer ", 7) == 0) {
        h += 7;
        while (*h == ' ') h++;
    } else {
        h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "x-api-key");
        if (!h) return false;
    }
    /* constant-time compare */
    size_t a = strlen(h), b = strlen(r->srv->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned)(unsigned char)(i < a ? h[i] : 0) ^ (unsigned char)r->srv->api_key[i];
    return diff == 0;
}

static enum MHD_Result dispatch(struct req *r) {
    bool get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD");
    bool post = !strcmp(r->method, "POST");
    if (r->ep == EP_OTHER)
        return fail(r, 404, "invalid_request_error", NULL, "unknown_url", "not found");
    if (!authorized(r))
        return fail(r, 401, "invalid_request_error", NULL, "invalid_api_key", "invalid or missing API key");
    switch (r->ep) {
    case EP_HEALTH: {
        if (!get) return fail(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method not allowed");
        char err[512];
        enum sched_state st = sched_state(r->srv->sched, err, sizeof err);
        if (st == SCHED_READY) return send_json(r, 200, strdup("{\"status\":\"ok\"}"));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", st == SCHED_LOADING ? "loading" : st == SCHED_FAILED ? "error" : "stopping");
        if (st == SCHED_FAILED) cJSON_AddStringToObject(o, "message", err);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return send_json(r, 503, s);
    }
    case EP_MODELS: {
        if (!get) return fail(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method not allowed");
        const char *only = !strncmp(r->path, "/v1/models/", 11) ? r->path + 11 : NULL;
        char *s = models_json(r->srv, only);
        if (!s) return fail(r, 404, "invalid_request_error", "model", "model_not_found", "model not found");
        return send_json(r, 200, s);
    }
    case EP_METRICS: {
        if (!get) return fail(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method not allowed");
        char *s;
        size_t n;
        if (metrics_render(&s, &n)) return MHD_NO;
        return send_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", s, n);
    }
    case EP_CHAT:
    case EP_COMPLETIONS:
    case EP_MESSAGES:
    case EP_COUNT_TOKENS:
    case EP_RESPONSES:
    case EP_TOKENIZE:
    case EP_DETOKENIZE:
        if (!post) return fail(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method not allowed");
        if (r->too_large) {
            char msg[96];
            snprintf(msg, sizeof msg, "request body exceeds %zu bytes", r->srv->opt.max_body);
            return fail(r, 413, "invalid_request_error", NULL, "request_too_large", msg);
        }
        if (r->ep == EP_COUNT_TOKENS) return do_json_call(r, gen_count_tokens);
        if (r->ep == EP_TOKENIZE) return do_json_call(r, tokenize_json);
        if (r->ep == EP_DETOKENIZE) return do_json_call(r, detokenize_json);
        return do_generate(r, r->ep == EP_CHAT       ? API_CHAT
                              : r->ep == EP_MESSAGES ? API_MESSAGES
                              : r->ep == EP_RESPONSES ? API_RESPONSES
                                                      : API_COMPLETION);
    default:
        return fail(r, 404, "invalid_request_error", NULL, "unknown_url", "not found");
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
    (void)version;
    struct http_server *s = cls;
    struct req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->conn = conn;
        r->t0 = now_seconds();
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        r->ep = route_of(url);
        *con_cls = r;
        atomic_fetch_add(&s->active, 1);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body && !strcmp(method, "POST") &&
            takes_post(r->ep)) {
            r->too_large = true;
            char msg[96];
            snprintf(msg, sizeof msg, "request body exceeds %zu bytes", s->opt.max_body);
            return fail(r, 413, "invalid_request_error", NULL, "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->answered || r->too_large) return MHD_YES;
        if (r->len + n > s->opt.max_body) {
            r->too_large = true;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t c = r->cap ? r->cap * 2 : 4096;
            while (c < r->len + n + 1) c *= 2;
            char *b = realloc(r->body, c);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = c;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->answered) return MHD_YES;
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    struct http_server *s = cls;
    struct req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->gen && !gen_finished(r->gen)) {
        gen_cancel(r->gen);
        if (!r->err[0]) snprintf(r->err, sizeof r->err, "client disconnected");
    }
    double ms = (now_seconds() - r->t0) * 1000.0;
    int status = r->status ? r->status : 500;
    metrics_request(r->ep, status);
    if (s->opt.log_requests) {
        char line[768];
        int n = snprintf(line, sizeof line, "%s %s %d %.0fms", r->method, r->path, status, ms);
        if (r->gen) {
            int p, c, k;
            char gerr[256];
            gen_stats(r->gen, &p, &c, &k, gerr, sizeof gerr);
            if (!r->err[0] && gerr[0]) snprintf(r->err, sizeof r->err, "%s", gerr);
            double secs = ms / 1000.0 < 0.001 ? 0.001 : ms / 1000.0;
            n += snprintf(line + n, sizeof line - (size_t)n, " prompt=%d cached=%d completion=%d tok/s=%.1f", p, c, k,
                          k / secs);
        }
        if (r->err[0] && n < (int)sizeof line)
            snprintf(line + n, sizeof line - (size_t)n, " error=\"%s\"", r->err);
        fprintf(stderr, "%s\n", line);
    }
    gen_free(r->gen);
    free(r->body);
    free(r);
    atomic_fetch_sub(&s->active, 1);
}

int http_start(struct http_server **out, const struct http_options *opt, struct sched *sched, char *err,
               size_t errlen) {
    *out = NULL;
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "out of memory");
    s->opt = *opt;
    s->sched = sched;
    if (opt->api_key && opt->api_key[0]) {
        snprintf(s->api_key, sizeof s->api_key, "%s", opt->api_key);
        s->has_key = true;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)opt->port);
    const char *host = opt->host && opt->host[0] ? opt->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        free(s);
        return errorf(err, errlen, ST_INVALID, "--host: '%s' is not an IPv4 address", host);
    }
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC,
                            (uint16_t)opt->port, NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)600, MHD_OPTION_END);
    if (!s->d) {
        free(s);
        return errorf(err, errlen, ST_IO, "cannot listen on %s:%d (address in use or not permitted)", host, opt->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : opt->port;
    *out = s;
    return ST_OK;
}

int http_port(const struct http_server *h) { return h->port; }

void http_quiesce(struct http_server *h) {
    if (!h || !h->d) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_stop(struct http_server *h) {
    if (!h) return;
    /* let in-flight requests deliver their final bytes (their jobs are done or
     * cancelled by now), up to 5 s, before the daemon closes every socket */
    for (int i = 0; i < 500 && atomic_load(&h->active) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (h->d) MHD_stop_daemon(h->d);
    free(h);
}
