/* The kiln subcommands. Each lives in its own cmd_<name>.c and is listed in commands.c. */
#ifndef KILN_CLI_COMMANDS_H
#define KILN_CLI_COMMANDS_H

typedef struct kiln_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand's name; returns the process exit code */
    const char *summary;
} kiln_command;

extern const kiln_command KILN_COMMANDS[];

#endif
