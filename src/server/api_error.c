#include "server/api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *srv_error_type(int status) {
    return status >= 500 ? "server_error" : "invalid_request_error";
}
