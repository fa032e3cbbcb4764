/* app/cmd_info.c — `orchid info --model DIR`: load and validate a checkpoint
 * (every tensor bound and checked) and print its shape, quantization and size. */
#include <stdio.h>
#include <string.h>

#include "app/cli.h"
#include "app/commands.h"
#include "model/engine.h"

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0) {
            if (!(model = cli_value(argc, argv, &i))) return cli_usage_error("info", "--model needs a directory");
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: orchid info --model DIR\n");
            return 0;
        } else {
            return cli_usage_error("info", "unknown flag \"%s\" (usage: orchid info --model DIR)", argv[i]);
        }
    }
    if (!model) return cli_usage_error("info", "--model DIR is required");
    if (!cli_is_dir(model)) return cli_usage_error("info", "%s: not a directory", model);

    char err[1024];
    engine *e;
    struct engine_options opt = {.model_dir = model, .backend = "cpu", .threads = 1};
    if (engine_open(&e, &opt, err, sizeof err) != 0) {
        fprintf(stderr, "orchid info: %s\n", err);
        return 1;
    }
    const struct model_config *c = engine_config(e);
    char desc[1024];
    config_describe(c, desc, sizeof desc);
    printf("model:        %s\n", model);
    printf("shape:        %s\n", desc);
    printf("quantization: %s, default %d-bit, group %d, %d per-module overrides\n", c->q_mode, c->q_bits, c->q_group_size,
           c->n_overrides);
    printf("tensors:      %zu in the checkpoint, %zu bound, %zu skipped (vision_tower.*, mtp.*)\n", engine_tensor_count(e),
           engine_bound_tensors(e), engine_tensor_count(e) - engine_bound_tensors(e));
    printf("bytes:        %.3f GB of tensors, %.3f GB quantized matrices\n", engine_tensor_bytes(e) / 1e9, engine_quant_bytes(e) / 1e9);
    printf("eos ids:     ");
    for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
    printf("\nmax position: %d\n", c->max_position);
    printf("load:         %.3f s\n", engine_load_seconds(e));
    engine_close(e);
    return 0;
}
