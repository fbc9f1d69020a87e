/* A client-facing error: the HTTP status and the fields of OpenAI's error object
 * {"error": {"message", "type", "param", "code"}}. */
#ifndef KILN_SERVER_API_ERROR_H
#define KILN_SERVER_API_ERROR_H

typedef struct srv_error {
    int status;        /* HTTP status */
    const char *code;  /* machine-readable code, or NULL */
    char param[64];    /* the request field at fault, or "" */
    char message[512];
} srv_error;

/* Fills e and returns -1. param and code may be NULL. */
int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* OpenAI's error type for a status: invalid_request_error for 4xx, server_error for 5xx. */
const char *srv_error_type(int status);

#endif
