/* app/main.c — `orchid <command> [flags]`: dispatch to the subcommands in commands.h. */
#include <stdio.h>
#include <string.h>

#include "app/commands.h"

#define ORCHID_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "orchid " ORCHID_VERSION " — inference engine and OpenAI-compatible server for Qwen3.6-35B-A3B (MLX 4-bit)\n"
            "\n"
            "usage: orchid <command> [flags]   (orchid <command> --help for its flags)\n"
            "\n"
            "  serve       OpenAI-compatible HTTP server\n"
            "  chat        interactive conversation in the terminal\n"
            "  generate    greedy generation from token ids (prints ids, optional logit dump)\n"
            "  info        check a checkpoint and print its shape, quantization and size\n"
            "  tokenize    text or chat messages to token ids\n"
            "  detokenize  token ids to text\n"
            "  synth       write a random-weight checkpoint in the exact MLX layout\n"
            "  bench       the benchmark contract (prefill + 64 decode steps)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    static const struct { const char *name; int (*fn)(int, char **); } table[] = {
        {"info", cmd_info},         {"generate", cmd_generate}, {"tokenize", cmd_tokenize},
        {"detokenize", cmd_detokenize}, {"serve", cmd_serve}, {"chat", cmd_chat}, {"synth", cmd_synth}, {"bench", cmd_bench},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(cmd, table[i].name) == 0) return table[i].fn(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("orchid %s\n", ORCHID_VERSION);
        return 0;
    }
    fprintf(stderr, "orchid: unknown command \"%s\" (try: orchid help)\n", cmd);
    return 2;
}
