/* kiln perplexity: the reference engines' method, so numbers compare: the text is cut into non-overlapping chunks of
 * --ctx tokens (BOS replacing the first token of each when the model adds BOS), and each chunk is scored on its
 * second half only, where every prediction has at least ctx/2 tokens of context. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/gen_opts.h"
#include "cli/prompt.h"
#include "kiln.h"

int cmd_perplexity(int argc, char **argv);

static void usage(FILE *out) {
    fprintf(out, "usage: kiln perplexity -m MODEL -f TEXT [--ctx 512] [--chunks N]\n\n"
                 "Perplexity of a text file: non-overlapping chunks of --ctx tokens, each scored on its second half.\n"
                 "Prints a running estimate per chunk on stderr; the last line on stdout is 'perplexity: X.XXXX'.\n"
                 "  -f, --file FILE          the text (needs at least 2 x ctx tokens)\n"
                 "  --chunks N               score only the first N chunks\n");
    gen_opts_usage(out, 0);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 4096 + 1 > cap) {
            char *b = realloc(buf, cap = (n + 4096 + 1) * 2);
            if (!b) break;
            buf = b;
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

/* -log p(next) from one position's logits. */
static double nll(const float *logits, int n_vocab, int32_t next) {
    float max = logits[0];
    for (int i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)(logits[i] - max));
    return -((double)(logits[next] - max) - log(sum));
}

typedef struct ppl_run {
    kiln_context *c;
    const int32_t *tokens;
    int n_ctx, n_vocab;
    float *logits;
    double nll_sum;
    long count;
} ppl_run;

/* Scores chunk k: evaluates its first half without logits, then the second half with every position's. */
static int score_chunk(ppl_run *r, int k, int bos) {
    char err[512];
    int n = r->n_ctx, first = n / 2;
    int32_t *chunk = malloc(sizeof *chunk * (size_t)n);
    if (!chunk) return -1;
    memcpy(chunk, r->tokens + (size_t)k * n, sizeof *chunk * (size_t)n);
    if (bos >= 0) chunk[0] = bos;
    int rc = kiln_eval(r->c, chunk, first, 0, NULL, false, err, sizeof err) ||
             kiln_eval(r->c, chunk + first, n - 1 - first, first, r->logits, true, err, sizeof err);
    if (rc) fprintf(stderr, "error: %s\n", err);
    for (int j = first; !rc && j < n - 1; j++) {
        r->nll_sum += nll(r->logits + (size_t)(j - first) * r->n_vocab, r->n_vocab, chunk[j + 1]);
        r->count++;
    }
    free(chunk);
    return rc ? -1 : 0;
}

static int run(kiln_context *c, const int32_t *tokens, int n_tokens, long max_chunks) {
    const kiln_model *m = kiln_context_model(c);
    int n_ctx = kiln_context_n_ctx(c);
    if (n_ctx < 4) {
        fprintf(stderr, "error: --ctx %d is too small to score half a chunk\n", n_ctx);
        return -1;
    }
    if (n_tokens < 2 * n_ctx) {
        fprintf(stderr, "error: the text has %d tokens; perplexity with --ctx %d needs at least %d\n", n_tokens, n_ctx,
                2 * n_ctx);
        return -1;
    }
    int n_chunks = n_tokens / n_ctx;
    if (max_chunks > 0 && max_chunks < n_chunks) n_chunks = (int)max_chunks;
    int32_t bos = -1;
    if (kiln_model_add_bos(m)) bos = tokens[0]; /* the tokenizer put BOS there */
    ppl_run r = {.c = c, .tokens = tokens, .n_ctx = n_ctx, .n_vocab = kiln_model_n_vocab(m)};
    r.logits = malloc(sizeof(float) * (size_t)r.n_vocab * (size_t)(n_ctx - n_ctx / 2));
    if (!r.logits) {
        fprintf(stderr, "error: out of memory for logits\n");
        return -1;
    }
    fprintf(stderr, "kiln: %d tokens, %d chunks of %d\n", n_tokens, n_chunks, n_ctx);
    int rc = 0;
    for (int k = 0; k < n_chunks && !rc; k++) {
        rc = score_chunk(&r, k, bos);
        if (!rc) fprintf(stderr, "[%d]%.4f%s", k + 1, exp(r.nll_sum / r.count), k + 1 == n_chunks ? "\n" : ",");
    }
    if (!rc) printf("perplexity: %.4f\n", exp(r.nll_sum / r.count));
    free(r.logits);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    gen_opts g;
    gen_opts_init(&g);
    g.ctx.n_ctx = 512;
    const char *file = NULL;
    long max_chunks = 0;
    for (int i = 1; i < argc; i++) {
        int r = gen_opts_parse(&g, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file"))) file = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--chunks")) {
            if (gen_parse_int(argv[i], argv[i + 1], 1, 1 << 24, &max_chunks)) return 1;
            i++;
        } else {
            fprintf(stderr, "error: unknown option or missing value: %s (see 'kiln perplexity --help')\n", argv[i]);
            return 1;
        }
    }
    if (!file) {
        fprintf(stderr, "error: no text given (-f FILE)\n");
        return 1;
    }
    char *text = read_text(file);
    if (!text) {
        fprintf(stderr, "error: cannot read %s\n", file);
        return 1;
    }
    kiln_model *m;
    kiln_context *c;
    if (gen_opts_open(&g, true, &m, &c)) {
        free(text);
        return 1;
    }
    int32_t *tokens = NULL;
    int n = prompt_tokenize_plain(m, text, &tokens), rc = n < 0 ? -1 : run(c, tokens, n, max_chunks);
    free(tokens);
    free(text);
    kiln_context_free(c);
    kiln_model_close(m);
    return rc ? 1 : 0;
}
