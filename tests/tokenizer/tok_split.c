/* Test helper for test_tokenizer_hf.py: exposes the pre-tokenizer table and split over a pipe.
 * Each input line is a request, each output line its answer:
 *   "?PRE"            -> the regexes of PRE, each as hex, followed by ','
 *   "PRE<TAB>HEXTEXT" -> the words of the text as "start:len," byte spans, or "ERR message" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/pretok.h"

static void print_regexes(const char *name) {
    const kiln_pretok *p = kiln_pretok_find(name);
    for (const char *const *r = p ? p->regexes : NULL; r && *r; r++) {
        for (const char *q = *r; *q; q++) printf("%02x", (unsigned char)*q);
        printf(",");
    }
    printf("\n");
}

static void print_split(const char *name, const char *hex) {
    size_t n = strlen(hex) / 2;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        text[i] = (char)v;
    }
    const kiln_pretok *p = kiln_pretok_find(name);
    kiln_pretok_compiled *c = NULL;
    kiln_span *w = NULL;
    size_t nw = 0;
    kiln_error err = {{0}};
    if (!p) {
        printf("ERR unknown pre '%s'\n", name);
    } else if (kiln_pretok_compile(p, &c, &err) || kiln_pretok_split(c, text, n, &w, &nw, &err)) {
        printf("ERR %s\n", err.msg);
    } else {
        for (size_t i = 0; i < nw; i++) printf("%zu:%zu,", w[i].start, w[i].len);
        printf("\n");
    }
    free(w);
    kiln_pretok_free(c);
    free(text);
}

int main(void) {
    static char line[1 << 18];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (line[0] == '?') {
            print_regexes(line + 1);
        } else if (tab) {
            *tab = 0;
            print_split(line, tab + 1);
        } else {
            printf("ERR bad request\n");
        }
        fflush(stdout);
    }
    return 0;
}
