/* Errors travel as a return code plus a message buffer the caller owns; the library never exits. */
#ifndef KILN_UTIL_ERROR_H
#define KILN_UTIL_ERROR_H

#include <stddef.h>

#define KILN_ERROR_MAX 512

typedef struct kiln_error {
    char msg[KILN_ERROR_MAX];
} kiln_error;

/* Sets err->msg (if err is non-NULL) and returns -1, so callers can write `return kiln_fail(err, ...)`. */
int kiln_fail(kiln_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to an existing message, e.g. the file name once the parser has said what broke. */
int kiln_fail_prefix(kiln_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
