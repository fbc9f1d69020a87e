#include "cli/commands.h"

#include <stddef.h>

/* One line per subcommand; the prototypes sit beside the table so each cmd_*.c needs no header of its own. */
#define KILN_CMD(name) int cmd_##name(int argc, char **argv);

const kiln_command KILN_COMMANDS[] = {
    {NULL, NULL, NULL},
};
