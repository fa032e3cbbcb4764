/* tests/fuzz/fuzz_http.c — libFuzzer target: arbitrary bytes as one client connection
 * to the HTTP server as `orchid serve --mock` runs it (server/http.c on libmicrohttpd,
 * the scheduler, the scripted mock model), over a loopback socket.
 *
 * The server is started once per process on 127.0.0.1 (a free port) with an API key
 * ("Bearer fuzz-key"), a 64 KiB body limit, 256-token sessions and a mock model that
 * does not sleep between steps. Each input is written to a new connection, the write
 * side is shut (the client is done), and the reply is read until the server closes.
 * MHD parses the request line, headers and chunked bodies; orchid's handlers see what
 * it accepts. libmicrohttpd cannot be driven in-process without a socket, so this is
 * the cheapest faithful way; the connection threads run in this process, so ASan,
 * UBSan and LeakSanitizer cover the server code too.
 *
 * Invariants: the server never crashes or hangs (the reply ends within the 1 s
 * timeout); a reply, if any, starts with an HTTP/1.x status line; a 5xx only for a
 * prompt that asks the mock to fail ("MOCK_FAIL") or MHD's 505 for an unknown version. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http.h"
#include "server/metrics.h"
#include "server/sched.h"

static int port;

/* libFuzzer's timer (SIGALRM) must not interrupt this thread's socket calls or the
 * server's; it is taken by a thread that does nothing else. */
static void *alarm_taker(void *arg) {
    (void)arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    for (;;) pause();
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* inherited by the server's threads */
    pthread_t th;
    if (pthread_create(&th, NULL, alarm_taker, NULL)) exit(1);
    setenv("ORCHID_MOCK_STEP_MS", "0", 1);
    metrics_init();
    char err[1024];
    struct sched_options so = {0};
    so.parallel = 2;
    so.max_queue = 4;
    so.max_seq = 256;
    so.prefill_chunk = 256;
    so.open = port_open_mock;
    static struct sched *sched;
    static struct http_server *http;
    if (sched_start(&sched, &so, err, sizeof err) || sched_wait_loaded(sched, err, sizeof err) != SCHED_READY) {
        fprintf(stderr, "fuzz_http: scheduler: %s\n", err);
        exit(1);
    }
    struct http_options ho = {.host = "127.0.0.1", .port = 0, .api_key = "fuzz-key", .max_body = 64 << 10,
                              .default_thinking = -1};
    if (http_start(&http, &ho, sched, err, sizeof err)) {
        fprintf(stderr, "fuzz_http: %s\n", err);
        exit(1);
    }
    port = http_port(http);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        perror("fuzz_http: socket");
        abort();
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        perror("fuzz_http: connect");
        abort();
    }
    for (size_t off = 0; off < size;) { /* the server may answer (and close) before reading it all */
        ssize_t k = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (k <= 0) break;
        off += (size_t)k;
    }
    shutdown(fd, SHUT_WR);
    static char reply[1 << 16];
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, 5000); /* libFuzzer's -timeout fires first on a hang */
        if (n <= 0) {
            fprintf(stderr, "fuzz_http: no reply and no close in 5 s\n");
            abort();
        }
        char tmp[16384];
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break; /* closed (or reset: MHD drops what it will not answer) */
        size_t c = (size_t)k < sizeof reply - got ? (size_t)k : sizeof reply - got;
        memcpy(reply + got, tmp, c);
        got += c;
    }
    /* close with a reset: this side shut first, so a FIN close would leave the port in
     * TIME_WAIT, and thousands a second would use up the ephemeral ports */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    if (got) {
        int status = got >= 12 && !memcmp(reply, "HTTP/1.", 7) ? atoi(reply + 9) : 0;
        if (status < 100 || status > 599) {
            fprintf(stderr, "fuzz_http: not a status line:\n%.*s\n", (int)(got < 200 ? got : 200), reply);
            abort();
        }
        /* 505: libmicrohttpd's own answer to an HTTP version it does not speak */
        if (status >= 500 && status != 505 && !memmem(data, size, "MOCK_FAIL", 9)) {
            fprintf(stderr, "fuzz_http: status %d:\n%.*s\n", status, (int)(got < 2000 ? got : 2000), reply);
            abort();
        }
    }
    return 0;
}
