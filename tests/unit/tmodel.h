/* tests/unit/tmodel.h — a test model held open for a test program: a checkpoint
 * directory, or "synth:SHAPE[:SEED]" (default seed 1) built in memory by model/synth.c.
 * Shared by the CPU stability test and the GPU tests (tests/gpu/gpu_common.h). */
#ifndef ORCHID_TEST_TMODEL_H
#define ORCHID_TEST_TMODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/synth.h"
#include "model/weights.h"
#include "runtime/safetensors.h"

struct tmodel {
    struct model_config cfg;
    safetensors *st;
    struct model_weights w;
    char *config_json; /* synth only: the config text (owned) */
};

static inline int tmodel_open(struct tmodel *m, const char *where, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    int rc;
    if (strncmp(where, "synth:", 6) == 0) {
        char shape[64];
        snprintf(shape, sizeof shape, "%s", where + 6);
        uint64_t seed = 1;
        char *colon = strchr(shape, ':');
        if (colon) {
            *colon = 0;
            seed = strtoull(colon + 1, NULL, 10);
        }
        struct synth_options so = {.shape = shape, .seed = seed, .threads = 0, .quiet = true};
        struct synth_result res;
        if ((rc = synth_build_memory(&so, &m->st, &m->config_json, &res, err, errlen))) return rc;
        if ((rc = config_parse(&m->cfg, m->config_json, strlen(m->config_json), where, err, errlen))) return rc;
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", where);
        if ((rc = config_load(&m->cfg, path, err, errlen))) return rc;
        if ((rc = safetensors_open(&m->st, where, err, errlen))) return rc;
    }
    return weights_bind(&m->w, &m->cfg, m->st, err, errlen);
}

static inline void tmodel_close(struct tmodel *m) {
    weights_free(&m->w);
    if (m->st) safetensors_close(m->st);
    free(m->config_json);
}

#endif
