/* app/cmd_stubs.c — placeholders for subcommands whose real implementation lives in
 * another file of src/app/; weak, so the real definitions win at link time. Each
 * says plainly that this build lacks the command. */
#include <stdio.h>

#include "app/commands.h"

#define STUB(fn, name)                                                                  \
    __attribute__((weak)) int fn(int argc, char **argv) {                               \
        (void)argc; (void)argv;                                                         \
        fprintf(stderr, "orchid " name ": not available in this build\n");              \
        return 1;                                                                       \
    }

STUB(cmd_tokenize, "tokenize")
STUB(cmd_detokenize, "detokenize")
STUB(cmd_serve, "serve")
STUB(cmd_chat, "chat")
STUB(cmd_synth, "synth")
STUB(cmd_bench, "bench")
