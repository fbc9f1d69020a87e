/* kiln run: one prompt in, the generated text streamed to stdout; logs and timings on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/gen_opts.h"
#include "cli/prompt.h"
#include "kiln.h"

int cmd_run(int argc, char **argv);

typedef struct run_opts {
    gen_opts g;
    const char *prompt, *prompt_file, *system, *token_ids, *dump_logits;
    long n_predict;
    int chat, print_ids;
} run_opts;

static void usage(FILE *out) {
    fprintf(out, "usage: kiln run -m MODEL -p PROMPT [options]\n\n"
                 "Continues PROMPT and streams only the generated text to stdout (the prompt is not echoed);\n"
                 "logs and timings go to stderr.\n"
                 "  -p, --prompt TEXT        the prompt (raw text completion unless --chat)\n"
                 "  -f, --file FILE          read the prompt from FILE\n"
                 "  -n, --n-predict N        tokens to generate, -1 = until the model stops (default 128)\n"
                 "  --chat                   wrap the prompt as a user message in the model's chat template\n"
                 "  --system TEXT            system message for --chat\n");
    gen_opts_usage(out, 1);
    fprintf(out, "testing:\n"
                 "  --token-ids 1,2,3        the prompt as token ids instead of text\n"
                 "  --print-ids              print generated token ids instead of text\n"
                 "  --dump-logits FILE       evaluate the prompt only; write every position's logits to FILE\n"
                 "                           (raw little-endian float32, n_tokens x n_vocab)\n"
                 "  --reference              use the plain F32 reference forward pass (slow)\n"
                 "  --top-logprobs N         print each token's log-probability and N alternatives to stderr\n");
}

static int parse_args(run_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = gen_opts_parse(&o->g, argc, argv, &i);
        if (r < 0) return -1;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (i + 1 < argc && (!strcmp(a, "-p") || !strcmp(a, "--prompt"))) o->prompt = argv[++i];
        else if (i + 1 < argc && (!strcmp(a, "-f") || !strcmp(a, "--file"))) o->prompt_file = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--system")) o->system = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--token-ids")) o->token_ids = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--dump-logits")) o->dump_logits = argv[++i];
        else if (i + 1 < argc && (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))) {
            if (gen_parse_int(a, argv[++i], -1, 1 << 24, &o->n_predict)) return -1;
        } else {
            fprintf(stderr, "error: unknown option or missing value: %s (see 'kiln run --help')\n", a);
            return -1;
        }
    }
    if (!o->prompt && !o->prompt_file && !o->token_ids) {
        fprintf(stderr, "error: no prompt given (-p TEXT, -f FILE or --token-ids)\n");
        return -1;
    }
    return 0;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static int build_prompt(const run_opts *o, const kiln_model *m, int32_t **ids) {
    if (o->token_ids) return prompt_parse_ids(o->token_ids, ids);
    char *file_text = NULL;
    const char *text = o->prompt;
    if (o->prompt_file && !(text = file_text = read_file(o->prompt_file))) {
        fprintf(stderr, "error: cannot read prompt file %s\n", o->prompt_file);
        return -1;
    }
    int n;
    if (o->chat) {
        kiln_message msgs[2];
        int k = 0;
        if (o->system) msgs[k++] = (kiln_message){"system", o->system};
        msgs[k++] = (kiln_message){"user", text};
        n = prompt_tokenize_chat(m, msgs, k, ids);
    } else {
        n = prompt_tokenize(m, text, ids);
    }
    free(file_text);
    return n;
}

static int dump_logits(kiln_context *c, const int32_t *ids, int n, const char *path) {
    char err[512];
    size_t V = (size_t)kiln_model_n_vocab(kiln_context_model(c));
    float *logits = malloc(sizeof(float) * V * (size_t)n);
    int rc = -1;
    if (!logits) fprintf(stderr, "error: out of memory for %d x %zu logits\n", n, V);
    else if (kiln_eval(c, ids, n, 0, logits, true, err, sizeof err)) fprintf(stderr, "error: %s\n", err);
    else {
        FILE *f = fopen(path, "wb");
        if (f && fwrite(logits, sizeof(float) * V, (size_t)n, f) == (size_t)n && !fclose(f)) rc = 0;
        else fprintf(stderr, "error: cannot write %s\n", path);
    }
    free(logits);
    return rc;
}

typedef struct stream {
    const kiln_model *m;
    int print_ids, n_top;
} stream;

static int on_token(const kiln_token_event *ev, void *user) {
    const stream *s = user;
    if (s->print_ids) {
        if (ev->token >= 0) printf("%d ", ev->token);
    } else {
        fwrite(ev->text, 1, ev->len, stdout);
    }
    fflush(stdout);
    if (s->n_top && ev->token >= 0) {
        fprintf(stderr, "[%d %.4f |", ev->token, ev->logprob);
        for (int i = 0; i < ev->n_top; i++) fprintf(stderr, " %d:%.4f", ev->top_tokens[i], ev->top_logprobs[i]);
        fprintf(stderr, "]\n");
    }
    return 0;
}

static void print_timings(const kiln_generate_result *r, const kiln_context *c) {
    int evaluated = r->n_prompt - r->n_cached;
    char where[320];
    fprintf(stderr, "\nkiln: prompt %d tokens (%d cached) in %.1f ms (%.1f tok/s); generated %d tokens in %.1f ms"
                    " (%.1f tok/s); on %s\n",
            r->n_prompt, r->n_cached, r->prefill_ms, r->prefill_ms > 0 ? evaluated * 1e3 / r->prefill_ms : 0.0,
            r->n_generated, r->decode_ms, r->decode_ms > 0 ? r->n_generated * 1e3 / r->decode_ms : 0.0,
            gen_opts_where(c, where, sizeof where));
}

static int generate(const run_opts *o, kiln_context *c, const int32_t *ids, int n) {
    char err[512];
    kiln_generate_params gp = kiln_generate_default_params();
    gp.max_tokens = (int)o->n_predict;
    gp.sampling = o->g.sampling;
    gp.stop = o->g.stop;
    gp.n_stop = o->g.n_stop;
    stream s = {kiln_context_model(c), o->print_ids, o->g.sampling.n_top_logprobs};
    kiln_generate_result r;
    if (kiln_generate(c, ids, n, &gp, on_token, &s, &r, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (o->print_ids) printf("\n");
    fflush(stdout);
    print_timings(&r, c);
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o = {.n_predict = 128};
    gen_opts_init(&o.g);
    if (parse_args(&o, argc, argv)) return 1;
    kiln_model *m;
    kiln_context *c;
    if (gen_opts_open(&o.g, true, &m, &c)) return 1;
    gen_opts_describe(&o.g, c);
    int32_t *ids = NULL;
    int n = build_prompt(&o, m, &ids), rc = 1;
    if (n >= 0) rc = o.dump_logits ? dump_logits(c, ids, n, o.dump_logits) : generate(&o, c, ids, n);
    free(ids);
    kiln_context_free(c);
    kiln_model_close(m);
    return rc ? 1 : 0;
}
