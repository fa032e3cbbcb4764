/* runtime/threadpool.h — a persistent pool of worker threads for the CPU backend.
 *
 * threadpool_run(pool, n, fn, ctx) calls fn(ctx, i) for every i in [0, n),
 * spread over the workers and the calling thread (which works too), and
 * returns when all calls are done. Items are claimed with an atomic counter,
 * so uneven items balance themselves. Workers sleep on a condition variable
 * between runs; nothing is allocated per run. Only one thread may call
 * threadpool_run at a time (the engine's owner).
 */
#ifndef ORCHID_THREADPOOL_H
#define ORCHID_THREADPOOL_H

#include <stddef.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int item);

/* n_threads counts the caller: n_threads = 1 spawns no worker. 0 = online cores. */
int threadpool_create(threadpool **out, int n_threads, char *err, size_t errlen);
void threadpool_destroy(threadpool *p);
int threadpool_size(const threadpool *p);
void threadpool_run(threadpool *p, int n_items, threadpool_fn fn, void *ctx);

#endif
