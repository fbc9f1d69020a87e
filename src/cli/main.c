/* kiln: one binary, many subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "kiln.h"

static void usage(FILE *out) {
    fprintf(out, "kiln %s: LLM inference engine\n\nusage: kiln <command> [options]\n\ncommands:\n", kiln_version());
    for (const kiln_command *c = KILN_COMMANDS; c->name; c++) fprintf(out, "  %-12s %s\n", c->name, c->summary);
    fprintf(out, "\n'kiln <command> --help' describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("kiln %s\n", kiln_version());
        return 0;
    }
    for (const kiln_command *c = KILN_COMMANDS; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s' (see 'kiln --help')\n", argv[1]);
    return 1;
}
