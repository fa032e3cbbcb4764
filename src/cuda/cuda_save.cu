// cuda/cuda_save.cu — checkpoint saves that do not hold up the decode stream (the default;
// ORCHID_NO_ASYNC_SAVE=1: synchronous copies). A prefix-cache checkpoint copies a session's
// whole recurrent state (the GDN state of every linear layer: 63 MB for the real model, plus
// the conv windows) and its KV rows to pinned host memory. Done as a device-to-host copy on
// the compute stream followed by a synchronize, each one stalls the scheduler — and so every
// running sequence — for the PCIe transfer (~1.5–3 ms at 25–50 GB/s); a 64-stream burst of
// fresh 512-token prompts saves 128 of them (each prompt's end, each finish).
//
// Here a save is a device-to-device snapshot into a staging ring on the compute stream (in
// stream order: after the forward that produced the state, before the next one changes it;
// ~50 µs of HBM time for 73 MB), then the device-to-host copy of the snapshot on a copy
// stream of its own, which waits for the snapshot (event) and runs beside the next
// forwards. The host returns at once. Nothing reads the host buffer but the backend's loads
// (backend.h: formats are the backend's own), so every load, and every free of pinned
// memory, first drains the copy stream (cuda_saver_drain). The ring: one device buffer,
// allocations in order with wrap-around, each remembered with the event that ends its
// device-to-host copy; an allocation that would overwrite a region still being copied waits
// for the copies up to that one, oldest first (host-side, the only time a save blocks). Any
// pending region may be the one in the way, not only the oldest: after a wrap the oldest can
// sit past head while newer ones fill [0, head). A save larger than the ring falls back to
// the caller's synchronous copy (the function returns 1).
#include "cuda/cuda_internal.h"

#define SV_MAX_PENDING 512 /* outstanding copies remembered (more: the oldest is waited for) */

struct cuda_saver {
    char *ring;
    size_t cap, head; /* the next allocation starts at head (or 0 after a wrap) */
    cudaStream_t copy;
    struct {
        size_t off, len;
        cudaEvent_t snap, done;
    } q[SV_MAX_PENDING];
    int q0, n; /* FIFO of the outstanding copies (oldest at q0) */
    cudaEvent_t spare[SV_MAX_PENDING * 2];
    int n_spare;
};

static cudaEvent_t sv_event(cuda_saver *s) {
    if (s->n_spare) return s->spare[--s->n_spare];
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return e;
}

/* Whether a pending copy's region meets [off, off + len). */
static bool sv_overlaps(const cuda_saver *s, size_t off, size_t len) {
    for (int k = 0; k < s->n; k++) {
        const int i = (s->q0 + k) % SV_MAX_PENDING;
        if (s->q[i].off < off + len && off < s->q[i].off + s->q[i].len) return true;
    }
    return false;
}

/* The oldest copy: waited for, its events kept for reuse. */
static cudaError_t sv_retire(cuda_saver *s) {
    const cudaError_t e = cudaEventSynchronize(s->q[s->q0].done);
    s->spare[s->n_spare++] = s->q[s->q0].snap;
    s->spare[s->n_spare++] = s->q[s->q0].done;
    s->q0 = (s->q0 + 1) % SV_MAX_PENDING;
    s->n--;
    return e;
}

extern "C" int cuda_saver_create(struct cuda_saver **out, size_t bytes, char *err, size_t errlen) {
    *out = NULL;
    cuda_saver *s = (cuda_saver *)calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "async save: out of memory");
    cudaError_t e = cudaMalloc((void **)&s->ring, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (s->ring) cudaFree(s->ring);
        free(s);
        return errorf(err, errlen, ST_DEVICE, "async save: %zu MB of staging: %s", bytes >> 20, cudaGetErrorString(e));
    }
    s->cap = bytes;
    *out = s;
    return 0;
}

extern "C" int cuda_saver_drain(struct cuda_saver *s, char *err, size_t errlen) {
    if (!s) return 0;
    cudaError_t e = cudaStreamSynchronize(s->copy);
    while (s->n) {
        const cudaError_t r = sv_retire(s);
        if (e == cudaSuccess) e = r;
    }
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "async save: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" void cuda_saver_destroy(struct cuda_saver *s) {
    if (!s) return;
    char err[8];
    cuda_saver_drain(s, err, sizeof err);
    for (int i = 0; i < s->n_spare; i++) cudaEventDestroy(s->spare[i]);
    cudaStreamDestroy(s->copy);
    cudaFree(s->ring);
    free(s);
}

/* height rows of width bytes, pitch apart at dev, to host (packed): snapshot on `stream`, then
 * the copy to host on the saver's stream. 1: larger than the ring (nothing done; copy it
 * synchronously); 0: queued; < 0: error. */
extern "C" int cuda_saver_copy(struct cuda_saver *s, cuda_stream_t stream, void *host, const void *dev, size_t width,
                               size_t height, size_t pitch, char *err, size_t errlen) {
    const size_t len = width * height, al = (len + 255) & ~(size_t)255;
    if (!s || al > s->cap) return 1;
    size_t off = s->head + al <= s->cap ? s->head : 0;
    /* wait, oldest first, until no pending copy's region meets [off, off + al) and a slot is free */
    while (s->n && (s->n == SV_MAX_PENDING || sv_overlaps(s, off, al))) {
        const cudaError_t r = sv_retire(s);
        if (r != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "async save: %s", cudaGetErrorString(r));
    }
    const cudaEvent_t snap = sv_event(s), done = sv_event(s);
    if (!snap || !done) {
        if (snap) s->spare[s->n_spare++] = snap;
        if (done) s->spare[s->n_spare++] = done;
        return 1;
    }
    const cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = cudaMemcpy2DAsync(s->ring + off, width, dev, pitch, width, height, cudaMemcpyDeviceToDevice, st);
    if (e == cudaSuccess) e = cudaEventRecord(snap, st);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s->copy, snap, 0);
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, s->ring + off, len, cudaMemcpyDeviceToHost, s->copy);
    if (e == cudaSuccess) e = cudaEventRecord(done, s->copy);
    if (e != cudaSuccess) {
        s->spare[s->n_spare++] = snap;
        s->spare[s->n_spare++] = done;
        return errorf(err, errlen, ST_DEVICE, "async save: %s", cudaGetErrorString(e));
    }
    const int i = (s->q0 + s->n) % SV_MAX_PENDING;
    s->q[i].off = off;
    s->q[i].len = al;
    s->q[i].snap = snap;
    s->q[i].done = done;
    s->n++;
    s->head = off + al;
    return 0;
}
