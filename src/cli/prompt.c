#include "cli/prompt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum mode { MODE_PROMPT, MODE_PLAIN, MODE_CHAT } mode;

static int tokenize_into(const kiln_model *m, const char *text, mode md, int32_t *ids, int max, char *err, size_t cap) {
    if (md == MODE_CHAT) return kiln_tokenize_chat(m, text, ids, max, err, cap);
    return kiln_tokenize_text(m, text, true, md == MODE_PROMPT, ids, max, err, cap);
}

/* Calls the tokenizer twice: once for the length, once into a buffer of that size. */
static int tokenize_twice(const kiln_model *m, const char *text, mode md, int32_t **ids) {
    char err[512];
    int n = tokenize_into(m, text, md, NULL, 0, err, sizeof err);
    if (n >= 0) {
        *ids = malloc(sizeof **ids * (size_t)(n + 1));
        if (!*ids) {
            fprintf(stderr, "error: out of memory\n");
            return -1;
        }
        n = tokenize_into(m, text, md, *ids, n, err, sizeof err);
    }
    if (n < 0) {
        fprintf(stderr, "error: tokenizing the prompt: %s\n", err);
        free(*ids);
        *ids = NULL;
    }
    return n;
}

int prompt_tokenize(const kiln_model *m, const char *text, int32_t **ids) {
    return tokenize_twice(m, text, MODE_PROMPT, ids);
}

int prompt_tokenize_plain(const kiln_model *m, const char *text, int32_t **ids) {
    return tokenize_twice(m, text, MODE_PLAIN, ids);
}

int prompt_tokenize_chat(const kiln_model *m, const kiln_message *msgs, int n_msgs, int32_t **ids) {
    char err[512];
    char *text = kiln_chat_render(m, msgs, (size_t)n_msgs, true, err, sizeof err);
    if (!text) {
        fprintf(stderr, "error: chat template: %s\n", err);
        return -1;
    }
    int n = tokenize_twice(m, text, MODE_CHAT, ids);
    kiln_free(text);
    return n;
}

int prompt_parse_ids(const char *list, int32_t **ids) {
    int cap = 1;
    for (const char *p = list; *p; p++) cap += *p == ',';
    *ids = malloc(sizeof **ids * (size_t)cap);
    if (!*ids) return -1;
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "error: --token-ids expects comma-separated ids, got '%s'\n", list);
            free(*ids);
            *ids = NULL;
            return -1;
        }
        (*ids)[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}
