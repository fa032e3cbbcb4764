/* model/device_sampling.c — the host reference of the device sampler's draw (the contract
 * is in device_sampling.h): every token's probability and weight by the header's inline
 * functions, the kept tokens sorted by (p descending, id ascending), top_k and top_p as
 * prefixes of that order, then the walk in id order. O(V log V) and plain on purpose: it
 * is the oracle tests/gpu/test_cuda_sample.c holds the CUDA kernel to, bit for bit, and
 * what tests/unit/test_device_sampling.c checks against the sampler's semantics. */
#include "model/device_sampling.h"

#include <stdlib.h>
#include <string.h>

struct dsmp_item {
    uint32_t key; /* bits of p (> 0): their order is p's order */
    int32_t id;
};

static int by_rank(const void *a, const void *b) {
    const struct dsmp_item *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

size_t dsmp_reference_scratch(int V) { return (size_t)V * (sizeof(struct dsmp_item) + 1); }

int32_t dsmp_reference(const float *logits, int V, const struct row_sampling *rs, void *scratch) {
    struct dsmp_item *it = scratch;
    unsigned char *fin = (unsigned char *)(it + V); /* [V] 1 = a finalist */
    float m = -INFINITY;
    int32_t amax = -1;
    for (int i = 0; i < V; i++) {
        const float v = logits[i];
        if (v != v) continue;
        if (amax < 0 || v > m) {
            m = v;
            amax = i;
        }
    }
    if (amax < 0) return 0;                        /* all NaN: sampler_argmax's 0 */
    if (m == INFINITY || m == -INFINITY) return amax; /* the host sampler's argmax fallback */
    const float k = dsmp_scale(rs->temperature);
    int n = 0;
    for (int i = 0; i < V; i++) {
        const float p = dsmp_prob(logits[i], m, k);
        if (dsmp_kept(p, rs->min_p)) it[n++] = (struct dsmp_item){f32_bits(p), i};
    }
    if (n == 0) return amax; /* no p > 0 (a temperature so small that 1/T overflows): the argmax */
    qsort(it, (size_t)n, sizeof *it, by_rank);
    if (rs->top_k > 0 && n > rs->top_k) n = rs->top_k;
    uint64_t mass = 0;
    for (int i = 0; i < n; i++) mass += dsmp_weight(bits_f32(it[i].key));
    if (rs->top_p < 1.0f && n > 1) {
        const uint64_t target = dsmp_mass_target(rs->top_p, mass);
        uint64_t acc = 0;
        int j = 0;
        while (j < n && acc < target) acc += dsmp_weight(bits_f32(it[j++].key));
        n = j;
        mass = acc;
    }
    memset(fin, 0, (size_t)V);
    for (int i = 0; i < n; i++) fin[it[i].id] = 1;
    const uint64_t r = dsmp_draw(rs->u, mass);
    uint64_t acc = 0;
    for (int i = 0; i < V; i++) {
        if (!fin[i]) continue;
        acc += dsmp_weight(dsmp_prob(logits[i], m, k));
        if (acc > r) return i;
    }
    return amax; /* not reached: the finalists' weights sum to mass > r */
}
