/* app/cmd_generate.c — `orchid generate`: greedy generation from token ids.
 *
 * Prints the generated ids one per line and a summary line starting with '#'.
 * --dump-logits FILE writes one record per token fed to the model, in order
 * (the prompt tokens, then every generated token that is fed back):
 *     int32 position, int32 token id fed, int32 vocab, float32 logits[vocab]
 * all little-endian. The logits of record i predict the token after position i.
 * With N generated tokens, N-1 of them are fed (the last needs no forward pass).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/commands.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "runtime/timing.h"

static const char *USAGE =
    "usage: orchid generate --model DIR --prompt-ids 1,2,3 [--max-tokens N] [--dump-logits FILE]\n"
    "                       [--backend auto|cpu|cuda] [--threads N] [--ignore-eos]";

static int write_records(FILE *f, int pos0, const int32_t *ids, int n, const float *logits, int vocab) {
    for (int i = 0; i < n; i++) {
        int32_t hdr[3] = {pos0 + i, ids[i], vocab};
        if (fwrite(hdr, sizeof hdr, 1, f) != 1) return -1;
        if (fwrite(logits + (size_t)i * vocab, sizeof(float), (size_t)vocab, f) != (size_t)vocab) return -1;
    }
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *dump = NULL, *backend = "auto";
    long max_tokens = 16, threads = 0;
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0) { puts(USAGE); return 0; }
        if (strcmp(a, "--ignore-eos") == 0) { ignore_eos = true; continue; }
        if (strcmp(a, "--model") && strcmp(a, "--prompt-ids") && strcmp(a, "--max-tokens") && strcmp(a, "--dump-logits") &&
            strcmp(a, "--backend") && strcmp(a, "--threads"))
            return cli_usage_error("generate", "unknown flag \"%s\"\n%s", a, USAGE);
        if (!(v = cli_value(argc, argv, &i))) return cli_usage_error("generate", "%s needs a value", a);
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompt-ids")) ids_arg = v;
        else if (!strcmp(a, "--dump-logits")) dump = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--max-tokens") && !cli_parse_int(v, 1, 1 << 20, &max_tokens))
            return cli_usage_error("generate", "--max-tokens must be an integer in 1..1048576, got \"%s\"", v);
        else if (!strcmp(a, "--threads") && !cli_parse_int(v, 0, 1024, &threads))
            return cli_usage_error("generate", "--threads must be an integer in 0..1024, got \"%s\"", v);
    }
    if (!model) return cli_usage_error("generate", "--model DIR is required");
    if (!ids_arg) return cli_usage_error("generate", "--prompt-ids is required (comma-separated token ids)");
    if (!cli_is_dir(model)) return cli_usage_error("generate", "%s: not a directory", model);
    int32_t *prompt;
    size_t n_prompt;
    if (!cli_parse_ids(ids_arg, &prompt, &n_prompt)) return cli_usage_error("generate", "--prompt-ids must be comma-separated non-negative integers");

    char err[1024];
    int rc = 1;
    engine *e = NULL;
    session *s = NULL;
    float *logits = NULL;
    FILE *df = NULL;
    struct engine_options opt = {.model_dir = model, .backend = backend, .threads = (int)threads};
    if (engine_open(&e, &opt, err, sizeof err)) { fprintf(stderr, "orchid generate: %s\n", err); goto out; }
    const struct model_config *c = engine_config(e);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= c->vocab) {
            rc = cli_usage_error("generate", "prompt id %d is outside the vocabulary (0..%d)", prompt[i], c->vocab - 1);
            goto out;
        }
    const int cap = (int)n_prompt + (int)max_tokens;
    if (session_open(e, &s, cap, err, sizeof err)) { fprintf(stderr, "orchid generate: %s\n", err); goto out; }
    logits = malloc((size_t)c->vocab * sizeof(float) * (dump ? n_prompt : 1));
    if (!logits) { fprintf(stderr, "orchid generate: out of memory for logits\n"); goto out; }
    if (dump && !(df = fopen(dump, "wb"))) { rc = cli_usage_error("generate", "%s: cannot open for writing", dump); goto out; }

    double t0 = now_seconds();
    struct batch_seq bs = {.s = s, .tokens = prompt, .n_tokens = (int)n_prompt, .logits = logits, .all_logits = dump != NULL};
    if (engine_forward(e, &bs, 1, err, sizeof err)) { fprintf(stderr, "orchid generate: %s\n", err); goto out; }
    const float *last = logits + (dump ? (n_prompt - 1) * (size_t)c->vocab : 0);
    if (df && write_records(df, 0, prompt, (int)n_prompt, logits, c->vocab)) { fprintf(stderr, "orchid generate: write to %s failed\n", dump); goto out; }
    int32_t tok = sampler_argmax(last, c->vocab);
    const double t_prefill = now_seconds() - t0;
    int n_gen = 0;
    double t1 = now_seconds();
    for (;;) {
        printf("%d\n", tok);
        n_gen++;
        bool stop = false;
        for (int i = 0; i < c->n_eos && !ignore_eos; i++) stop |= tok == c->eos_ids[i];
        if (stop || n_gen >= max_tokens) break;
        bs = (struct batch_seq){.s = s, .tokens = &tok, .n_tokens = 1, .logits = logits};
        if (engine_forward(e, &bs, 1, err, sizeof err)) { fprintf(stderr, "orchid generate: %s\n", err); goto out; }
        if (df && write_records(df, session_length(s) - 1, &tok, 1, logits, c->vocab)) { fprintf(stderr, "orchid generate: write to %s failed\n", dump); goto out; }
        tok = sampler_argmax(logits, c->vocab);
    }
    const double t_decode = now_seconds() - t1;
    printf("# prompt=%zu generated=%d load_s=%.3f prefill_tok_s=%.2f decode_tok_s=%.2f backend=%s\n", n_prompt, n_gen,
           engine_load_seconds(e), (double)n_prompt / t_prefill, n_gen > 1 ? (double)(n_gen - 1) / t_decode : 0.0,
           engine_backend_name(e));
    rc = 0;
out:
    if (df && fclose(df) != 0 && rc == 0) { fprintf(stderr, "orchid generate: closing %s failed\n", dump); rc = 1; }
    free(logits);
    session_close(s);
    engine_close(e);
    free(prompt);
    return rc;
}
