/* tests/fuzz/fuzz_config.c — libFuzzer target: arbitrary bytes as config.json through
 * config_parse. Accepted configs must satisfy the invariants the loader relies on. */
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct model_config c;
    char err[512] = "";
    int rc = config_parse(&c, (const char *)data, size, "config.json", err, sizeof err);
    if (rc != 0 && err[0] == 0) abort();
    if (rc == 0) {
        if (c.n_layers < 1 || c.n_layers > MAX_LAYERS || c.hidden % c.q_group_size || c.n_heads % c.n_kv_heads ||
            c.lin_v_heads % c.lin_k_heads || c.rotary_dim > c.head_dim || c.n_experts_per_tok > c.n_experts ||
            c.conv_kernel < 1 || c.conv_kernel > 16)
            abort();
        for (int i = 0; i < c.n_eos; i++)
            if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab) abort();
    }
    return 0;
}
