/* runtime/env.h — the one rule for on/off switches read from the environment: a switch is
 * on when its variable is set to anything but "" or "0". The server's A/B switches and the
 * mock port's test knobs read through it (the CUDA backend's own copy, env_flag in
 * cuda/cuda_internal.h, is C++ and exported as cuda_env_flag for the GPU tests). */
#ifndef ORCHID_ENV_H
#define ORCHID_ENV_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

#endif
