/* kiln tokenize: stdin -> token ids (or id/piece lines), for checking kiln against reference tokenizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

int cmd_tokenize(int argc, char **argv);

static void usage(FILE *out) {
    fprintf(out,
            "usage: kiln tokenize -m MODEL [--raw] [--pieces] < text\n\n"
            "Reads all of stdin as one text and prints its token ids on one line, separated by spaces.\n"
            "  -m, --model FILE  GGUF file (a vocab-only file is enough) or safetensors folder\n"
            "  --raw             add no BOS/EOS and read special-token text as plain text\n"
            "  --pieces          print one 'id<TAB>piece' line per token instead\n");
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            return NULL;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static void print_ids(const kiln_tokenizer *t, const int32_t *ids, int n, int pieces) {
    for (int i = 0; i < n; i++) {
        if (pieces)
            printf("%d\t%s\n", ids[i], kiln_token_piece(t, ids[i]));
        else
            printf(i ? " %d" : "%d", ids[i]);
    }
    if (!pieces) printf("\n");
}

static int tokenize_stdin(const char *model, int raw, int pieces) {
    kiln_error err = {{0}};
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = NULL;
    size_t len = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    if (kiln_model_file_open(model, &g, &err) || kiln_tokenizer_load(g, &t, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (!(text = read_all(stdin, &len))) {
        fprintf(stderr, "error: cannot read stdin\n");
        goto done;
    }
    int n = kiln_tokenize(t, text, len, !raw, !raw, NULL, 0, &err);
    if (n >= 0 && (ids = malloc(((size_t)n + 1) * sizeof *ids)))
        n = kiln_tokenize(t, text, len, !raw, !raw, ids, n, &err);
    if (n < 0 || !ids) {
        fprintf(stderr, "error: %s\n", n < 0 ? err.msg : "out of memory");
        goto done;
    }
    print_ids(t, ids, n, pieces);
    rc = 0;
done:
    free(ids);
    free(text);
    kiln_tokenizer_free(t);
    kiln_gguf_close(g);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int raw = 0, pieces = 0;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--raw")) {
            raw = 1;
        } else if (!strcmp(argv[i], "--pieces")) {
            pieces = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "error: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 1;
        }
    }
    if (!model) {
        usage(stderr);
        return 1;
    }
    return tokenize_stdin(model, raw, pieces);
}
