/* Tokenizer throughput on one core: MB of text per second for each vocabulary given (default: the reference vocab
 * files, BPE and SPM). The text is English prose with numbers and code, plus the reference test cases (emoji, CJK,
 * whitespace runs), repeated to the requested size; or a file given with --text. Time is the thread's CPU time,
 * best of three.
 *
 * usage: bench_tokenizer [--text FILE] [--mb N] [VOCAB.gguf ...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

static const char prose[] =
    "The engine reads the model file once, maps its tensors, and builds the tokenizer from the metadata. Each "
    "request is split into tokens; a prompt of 1,024 tokens takes 3.5 ms to encode on a laptop from 2019, and the "
    "reply streams back as soon as each character is complete. Don't worry: it's fast enough, isn't it?\n\n"
    "    for (int i = 0; i < n; i++) {\n        sum += x[i] * w[i]; // dot product\n    }\n"
    "Prices rose 12.5% in Q3 (from $40.00 to $45.00), while 3 of 7 teams shipped on time -- see table 2.\n";

/* CPU time of this thread: on a shared machine, waiting for a core does not count against the tokenizer */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

/* prose and extra, alternating, until size bytes */
static char *make_text(const char *extra, size_t extra_len, size_t size) {
    char *text = malloc(size + 1);
    size_t o = 0, pl = strlen(prose);
    while (o < size) {
        size_t n = pl < size - o ? pl : size - o;
        memcpy(text + o, prose, n);
        o += n;
        n = extra_len < size - o ? extra_len : size - o;
        memcpy(text + o, extra, n);
        o += n;
    }
    text[size] = 0;
    return text;
}

static void bench(const char *path, const char *text, size_t len) {
    kiln_error err = {{0}};
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = NULL;
    if (kiln_gguf_open(path, &g, &err) || kiln_tokenizer_load(g, &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        kiln_gguf_close(g);
        return;
    }
    int n = kiln_tokenize(t, text, len, false, false, NULL, 0, &err);
    int32_t *ids = n >= 0 ? malloc((size_t)n * sizeof *ids + 1) : NULL;
    double best = 1e30;
    for (int rep = 0; rep < 3 && ids; rep++) {
        double t0 = now();
        kiln_tokenize(t, text, len, false, false, ids, n, &err);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (n < 0)
        fprintf(stderr, "%s: %s\n", name, err.msg);
    else
        printf("%-32s %s %-14s %8.2f MB/s  %6.2f M tokens/s  (%.1f MB -> %d tokens, %.2f bytes/token)\n", name,
               kiln_tokenizer_kind(t), kiln_tokenizer_pre(t), (double)len / best / 1e6, n / best / 1e6,
               (double)len / 1e6, n, (double)len / n);
    free(ids);
    kiln_tokenizer_free(t);
    kiln_gguf_close(g);
}

int main(int argc, char **argv) {
    const char *text_path = NULL;
    double mb = 4;
    int first_vocab = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) {
            text_path = argv[++i];
        } else if (!strcmp(argv[i], "--mb") && i + 1 < argc) {
            mb = atof(argv[++i]);
        } else {
            first_vocab = i;
            break;
        }
    }
    const char *shared = getenv("KILN_SHARED_DIR") ? getenv("KILN_SHARED_DIR") : "../shared";
    char path[1024];
    size_t extra_len = 0, len;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf.inp", shared);
    char *extra = read_file(text_path ? text_path : path, &extra_len);
    if (!extra) {
        fprintf(stderr, "cannot read %s (set KILN_SHARED_DIR or pass --text FILE)\n", text_path ? text_path : path);
        return 1;
    }
    char *text = text_path ? extra : make_text(extra, extra_len, (size_t)(mb * 1e6));
    len = text_path ? extra_len : (size_t)(mb * 1e6);
    if (first_vocab < argc) {
        for (int i = first_vocab; i < argc; i++) bench(argv[i], text, len);
    } else {
        static const char *const names[] = {"gpt-2", "starcoder", "falcon", "deepseek-llm", "llama-spm"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", shared, names[i]);
            bench(path, text, len);
        }
    }
    if (text != extra) free(text);
    free(extra);
    return 0;
}
