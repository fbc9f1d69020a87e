#include "cli/commands.h"

#include <stddef.h>

/* One line per subcommand; the prototypes sit beside the table so each cmd_*.c needs no header of its own. */
#define KILN_CMD(name) int cmd_##name(int argc, char **argv);
KILN_CMD(inspect)
KILN_CMD(quantize)
KILN_CMD(synth)
KILN_CMD(tokenize)

const kiln_command KILN_COMMANDS[] = {
    {"inspect", cmd_inspect, "show a model's architecture, hyperparameters, tokenizer and tensors (--json)"},
    {"tokenize", cmd_tokenize, "print the token ids of stdin (--raw, --pieces)"},
    {"quantize", cmd_quantize, "convert a GGUF or safetensors folder to a GGUF of another type (q4_k_m, q8_0, ...)"},
    {"synth", cmd_synth, "write a random-weight model at a real shape (qwen2-1.5b, llama3-8b, smollm2-135m)"},
    {NULL, NULL, NULL},
};
