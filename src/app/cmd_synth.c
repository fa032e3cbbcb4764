/* app/cmd_synth.c — `orchid synth`: write a random-weight checkpoint of the
 * Qwen3.6-MoE architecture in the exact MLX layout (model/synth.h does the work;
 * this file owns only the flags and the summary line). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "model/synth.h"

static const char *USAGE =
    "usage: orchid synth --out DIR --shape 35b-a3b|mini|small|tiny [--seed N] [--threads N] [--tokenizer DIR] [--sync] [--quiet]\n"
    "  writes sharded safetensors + index + config.json (+ tokenizer files from .cache/tokenizer when present)\n"
    "  --sync fsyncs every file before exit (the time then includes the disk)";

int cmd_synth(int argc, char **argv) {
    const char *out = NULL, *shape = NULL, *tok = NULL;
    long seed = 0, threads = 0;
    bool sync = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { puts(USAGE); return 0; }
        if (!strcmp(a, "--sync")) { sync = true; continue; }
        if (!strcmp(a, "--quiet")) { quiet = true; continue; }
        if (strcmp(a, "--out") && strcmp(a, "--shape") && strcmp(a, "--seed") && strcmp(a, "--threads") && strcmp(a, "--tokenizer"))
            return cli_usage_error("synth", "unknown flag \"%s\" (%s)", a, "see orchid synth --help");
        if (!(v = cli_value(argc, argv, &i))) return cli_usage_error("synth", "%s needs a value", a);
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "--tokenizer")) tok = v;
        else if (!strcmp(a, "--seed") && !cli_parse_int(v, 0, (1L << 53), &seed))
            return cli_usage_error("synth", "--seed must be an integer in 0..2^53, got \"%s\"", v);
        else if (!strcmp(a, "--threads") && !cli_parse_int(v, 0, 64, &threads))
            return cli_usage_error("synth", "--threads must be an integer in 0..64, got \"%s\"", v);
    }
    if (!out) return cli_usage_error("synth", "--out DIR is required");
    if (!shape) return cli_usage_error("synth", "--shape is required (%s)", SYNTH_SHAPES);
    if (!synth_shape_valid(shape)) return cli_usage_error("synth", "unknown --shape \"%s\" (%s)", shape, SYNTH_SHAPES);
    if (tok && !cli_is_dir(tok)) return cli_usage_error("synth", "--tokenizer %s: not a directory", tok);
    if (tok) {
        char path[4200];
        snprintf(path, sizeof path, "%.4000s/tokenizer.json", tok);
        if (access(path, R_OK) != 0) return cli_usage_error("synth", "--tokenizer %s: no tokenizer.json there", tok);
    }

    struct synth_options opt = {.shape = shape, .seed = (uint64_t)seed, .threads = (int)threads, .quiet = quiet,
                                .sync = sync, .tokenizer_dir = tok};
    struct synth_result res;
    char err[1024];
    if (synth_write(out, &opt, &res, err, sizeof err)) {
        fprintf(stderr, "orchid synth: %s\n", err);
        return 1;
    }
    if (!res.tokenizer_files)
        fprintf(stderr, "orchid synth: no tokenizer files found (run tools/fetch_tokenizer.py, or pass --tokenizer DIR); "
                        "the checkpoint has none\n");
    printf("orchid synth: %s seed %ld: %d tensors in %d shards, %.3f GB, %llu parameters, %d tokenizer files%s%s, "
           "%.1f s%s -> %s\n",
           shape, seed, res.n_tensors, res.n_shards, res.total_bytes / 1e9, (unsigned long long)res.total_parameters,
           res.tokenizer_files, res.tokenizer_files ? " from " : "", res.tokenizer_from, res.seconds,
           sync ? " (synced)" : "", out);
    return 0;
}
