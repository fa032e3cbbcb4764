/* runtime/threadpool.c — see threadpool.h. A generation counter tells sleeping
 * workers a new run has started; `active` counts workers still inside the run
 * so threadpool_run can wait for the last one before returning (the caller's
 * ctx lives on its stack). */
#include "runtime/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/status.h"

struct threadpool {
    pthread_t *threads;
    int n_workers;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    unsigned long generation;
    int active;
    int stop;
    /* the current run */
    threadpool_fn fn;
    void *ctx;
    int n_items;
    atomic_int next;
};

static void drain(struct threadpool *p) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_items) break;
        p->fn(p->ctx, i);
    }
}

static void *worker_main(void *arg) {
    struct threadpool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int threadpool_create(threadpool **out, int n_threads, char *err, size_t errlen) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    struct threadpool *p = calloc(1, sizeof *p);
    if (!p) return errorf(err, errlen, ST_NOMEM, "out of memory creating thread pool");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { threadpool_destroy(p); return errorf(err, errlen, ST_NOMEM, "out of memory creating thread pool"); }
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            threadpool_destroy(p);
            return errorf(err, errlen, ST_INTERNAL, "pthread_create failed for worker %d", i);
        }
        p->n_workers++;
    }
    *out = p;
    return 0;
}

void threadpool_destroy(threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int threadpool_size(const threadpool *p) { return p->n_workers + 1; }

void threadpool_run(threadpool *p, int n_items, threadpool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (p->n_workers == 0 || n_items == 1) {
        for (int i = 0; i < n_items; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->active = p->n_workers;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
