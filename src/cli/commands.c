#include "cli/commands.h"

#include <stddef.h>

/* One line per subcommand; the prototypes sit beside the table so each cmd_*.c needs no header of its own. */
#define KILN_CMD(name) int cmd_##name(int argc, char **argv);
KILN_CMD(quantize)
KILN_CMD(tokenize)

const kiln_command KILN_COMMANDS[] = {
    {"tokenize", cmd_tokenize, "print the token ids of stdin (--raw, --pieces)"},
    {"quantize", cmd_quantize, "convert a GGUF or safetensors folder to a GGUF of another type (q4_k_m, q8_0, ...)"},
    {NULL, NULL, NULL},
};
