#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kiln_fail(kiln_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int kiln_fail_prefix(kiln_error *err, const char *fmt, ...) {
    if (err) {
        char old[KILN_ERROR_MAX];
        memcpy(old, err->msg, sizeof old);
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        size_t used = n < 0 ? 0 : (size_t)n < sizeof err->msg ? (size_t)n : sizeof err->msg - 1;
        /* the message is cut at the buffer's end on purpose: the context comes first */
        if (used + 2 < sizeof err->msg) {
            memcpy(err->msg + used, ": ", 2);
            used += 2;
            size_t room = sizeof err->msg - 1 - used, len = strnlen(old, sizeof old - 1);
            if (len > room) len = room;
            memcpy(err->msg + used, old, len);
            err->msg[used + len] = '\0';
        }
    }
    return -1;
}
