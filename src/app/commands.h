/* app/commands.h — the CLI subcommands; main.c dispatches `orchid <command>`.
 * Each returns the process exit code: 0 ok, 1 runtime failure, 2 bad usage
 * (bad flag, missing/invalid path), after printing one clear line on stderr. */
#ifndef ORCHID_COMMANDS_H
#define ORCHID_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
