/* kiln bench: prompt-processing and decode speed, and decode as a fraction of the measured memory bandwidth. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/gen_opts.h"
#include "cli/membw.h"
#include "cuda/cuda_backend.h"
#include "engine/engine.h"
#include "kiln.h"

int cmd_bench(int argc, char **argv);

typedef struct bench_opts {
    gen_opts g;
    long n_prompt, n_gen, reps;
    int json, profile;
} bench_opts;

static void usage(FILE *out) {
    fprintf(out, "usage: kiln bench -m MODEL [-p 512] [-n 128] [--threads N] [--json] [--profile]\n\n"
                 "Measures prompt processing (one batch of -p tokens) and decoding (-n tokens one at a time from an\n"
                 "empty context), then the machine's memory read bandwidth with the same thread count; reports\n"
                 "decode bandwidth fraction = weight bytes read per token x decode tok/s / bandwidth.\n"
                 "  -p N                     prompt tokens (default 512; 0 skips)\n"
                 "  -n N                     generated tokens (default 128; 0 skips)\n"
                 "  -r, --reps N             repetitions, the best is reported (default 3)\n"
                 "  --json                   print one JSON object on stdout\n"
                 "  --profile                with --device cuda: time every op of 16 decode steps and of one prompt\n"
                 "                           batch (eager launches), with bytes moved and %% of copy bandwidth\n");
    gen_opts_usage(out, 0);
}

static int parse_args(bench_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = gen_opts_parse(&o->g, argc, argv, &i);
        if (r < 0) return -1;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--profile")) o->profile = 1;
        else if (i + 1 < argc && !strcmp(a, "-p")) {
            if (gen_parse_int(a, argv[++i], 0, 1 << 20, &o->n_prompt)) return -1;
        } else if (i + 1 < argc && !strcmp(a, "-n")) {
            if (gen_parse_int(a, argv[++i], 0, 1 << 20, &o->n_gen)) return -1;
        } else if (i + 1 < argc && (!strcmp(a, "-r") || !strcmp(a, "--reps"))) {
            if (gen_parse_int(a, argv[++i], 1, 1000, &o->reps)) return -1;
        } else {
            fprintf(stderr, "error: unknown option or missing value: %s (see 'kiln bench --help')\n", a);
            return -1;
        }
    }
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Milliseconds for one batch of n tokens at position 0. */
static double time_prompt(kiln_context *c, const int32_t *ids, int n) {
    char err[512];
    double t0 = now_ms();
    if (kiln_eval(c, ids, n, 0, NULL, false, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    return now_ms() - t0;
}

/* Milliseconds for n tokens decoded one at a time from position 0. On the GPU: greedy, each token fed back from the
 * device's argmax as `kiln run --temp 0` does; on the CPU: the given ids. */
static double time_decode(kiln_context *c, const int32_t *ids, int n) {
    char err[512];
    double t0 = now_ms();
    if (kiln_context_device(c) == KILN_DEVICE_CUDA) {
        kiln_error e = {{0}};
        int32_t tok = ids[0];
        c->n_past = 0;
        for (int i = 0; i < n; i++)
            if (kiln_ctx_decode_greedy(c, tok, &tok, &e)) {
                fprintf(stderr, "error: %s\n", e.msg);
                return -1;
            }
        return now_ms() - t0;
    }
    for (int i = 0; i < n; i++)
        if (kiln_eval(c, &ids[i], 1, i, NULL, false, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return -1;
        }
    return now_ms() - t0;
}

typedef struct bench_result {
    double pp_ms, tg_ms, bw;
    uint64_t peak_rss; /* before the bandwidth measurement, whose buffers would count */
} bench_result;

/* The process's peak resident set (the CPU path's mapped weights count once touched). */
static uint64_t peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (uint64_t)ru.ru_maxrss * 1024;
}

static int measure(const bench_opts *o, kiln_context *c, bench_result *r) {
    int n_vocab = kiln_model_n_vocab(kiln_context_model(c)), n_max = (int)(o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen);
    int32_t *ids = malloc(sizeof *ids * (size_t)(n_max + 1));
    if (!ids) return -1;
    for (int i = 0; i <= n_max; i++) ids[i] = (int32_t)((1000 + 7919 * i) % n_vocab); /* arbitrary ordinary tokens */
    r->pp_ms = r->tg_ms = 1e30;
    if (time_decode(c, ids, 2) < 0) goto fail; /* warm-up: page in the weights, start the workers */
    for (long rep = 0; rep < o->reps; rep++) {
        if (o->n_prompt) {
            double t = time_prompt(c, ids, (int)o->n_prompt);
            if (t < 0) goto fail;
            if (t < r->pp_ms) r->pp_ms = t;
        }
        if (o->n_gen) {
            double t = time_decode(c, ids, (int)o->n_gen);
            if (t < 0) goto fail;
            if (t < r->tg_ms) r->tg_ms = t;
        }
    }
    free(ids);
    r->peak_rss = peak_rss_bytes();
    kiln_error e = {{0}};
    if (kiln_context_device(c) == KILN_DEVICE_CUDA) { /* the GPU's roofline: its device-to-device copy */
        if (kiln_cuda_measure_copy_bandwidth(&r->bw, &e)) fprintf(stderr, "warning: %s\n", e.msg);
    } else {
        r->bw = membw_read(kiln_context_n_threads(c), 1024);
    }
    return 0;
fail:
    free(ids);
    return -1;
}

/* Per-op times of 16 greedy decode steps and of one prompt batch on the GPU, against the copy bandwidth. */
static int profile_cuda(const bench_opts *o, kiln_context *c, double bw) {
    enum { STEPS = 16 };
    int n_vocab = kiln_model_n_vocab(kiln_context_model(c)), n_prompt = (int)o->n_prompt;
    kiln_error e = {{0}};
    int32_t *ids = malloc(sizeof *ids * (size_t)(n_prompt > STEPS ? n_prompt : STEPS));
    if (!ids) return -1;
    for (int i = 0; i < (n_prompt > STEPS ? n_prompt : STEPS); i++) ids[i] = (int32_t)((1000 + 7919 * i) % n_vocab);
    int rc = kiln_cuda_context_set_profile(c->cuda, true, &e) ||
             kiln_cuda_generate_greedy(c->cuda, ids[0], 0, STEPS, ids, &e);
    if (!rc) {
        printf("profile of a decode step (eager launches timed with events, mean of %d):\n", STEPS);
        kiln_cuda_profile_print(c->cuda, STEPS, bw, stdout);
    }
    if (!rc && n_prompt > 1) {
        rc = kiln_cuda_context_set_profile(c->cuda, true, &e) || kiln_cuda_eval(c->cuda, ids, n_prompt, 0, NULL, &e);
        if (!rc) {
            printf("profile of a %d-token prompt:\n", n_prompt);
            kiln_cuda_profile_print(c->cuda, 1, bw, stdout);
        }
    }
    if (!rc) rc = kiln_cuda_context_set_profile(c->cuda, false, &e);
    c->n_past = 0;
    free(ids);
    if (rc) fprintf(stderr, "error: %s\n", e.msg);
    return rc ? -1 : 0;
}

static void report_memory(kiln_context *c, const bench_result *r) {
    char memory[160];
    printf("memory (%s): %s; host peak RSS %.1f MiB\n", kiln_context_device(c) == KILN_DEVICE_CUDA ? "GPU" : "host",
           gen_opts_memory(c, memory, sizeof memory), gen_mib(r->peak_rss));
}

static void report(const bench_opts *o, kiln_context *c, const bench_result *r) {
    const kiln_model *m = kiln_context_model(c);
    double pp = o->n_prompt ? o->n_prompt * 1e3 / r->pp_ms : 0, tg = o->n_gen ? o->n_gen * 1e3 / r->tg_ms : 0;
    double bytes = (double)kiln_model_bytes_per_token(m), frac = r->bw > 0 ? bytes * tg / r->bw : 0;
    double ttft = o->n_prompt ? r->pp_ms : 0;
    if (o->json) {
        kiln_memory mem = kiln_context_memory(c);
        printf("{\"model\": \"%s\", \"arch\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"n_prompt\": %ld, "
               "\"n_gen\": %ld, \"pp_tok_s\": %.2f, \"tg_tok_s\": %.2f, \"ttft_ms\": %.2f, \"bytes_per_token\": %.0f, "
               "\"bandwidth_gbs\": %.2f, \"bandwidth_fraction\": %.4f, \"weights_bytes\": %" PRIu64 ", "
               "\"kv_cache_bytes\": %" PRIu64 ", \"workspace_bytes\": %" PRIu64 ", \"peak_rss_bytes\": %" PRIu64 "}\n",
               o->g.model, kiln_model_arch(m), kiln_context_device(c) == KILN_DEVICE_CUDA ? "cuda" : "cpu",
               kiln_context_n_threads(c), o->n_prompt, o->n_gen, pp, tg, ttft, bytes, r->bw / 1e9, frac, mem.weights,
               mem.kv_cache, mem.workspace, r->peak_rss);
        return;
    }
    if (kiln_context_device(c) == KILN_DEVICE_CUDA) {
        char desc[256];
        kiln_error e = {{0}};
        kiln_cuda_probe(desc, sizeof desc, &e);
        printf("model: %s (%s), GPU: %s\n", o->g.model, kiln_model_arch(m), desc);
    } else {
        printf("model: %s (%s), %d threads\n", o->g.model, kiln_model_arch(m), kiln_context_n_threads(c));
    }
    if (o->n_prompt) printf("pp%ld: %.1f tok/s (time to first token %.2f ms)\n", o->n_prompt, pp, r->pp_ms);
    if (o->n_gen) printf("tg%ld: %.1f tok/s (%.2f ms/token)\n", o->n_gen, tg, r->tg_ms / o->n_gen);
    printf("weights read per token: %.1f MiB; memory bandwidth: %.2f GB/s; decode bandwidth fraction: %.1f%%\n",
           gen_mib((uint64_t)bytes), r->bw / 1e9, frac * 100);
    report_memory(c, r);
}

int cmd_bench(int argc, char **argv) {
    bench_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 3};
    gen_opts_init(&o.g);
    if (parse_args(&o, argc, argv)) return 1;
    long need = (o.n_prompt > o.n_gen ? o.n_prompt : o.n_gen) + 2;
    if (!o.g.ctx.n_ctx) o.g.ctx.n_ctx = (int)need;
    if (o.g.ctx.n_ctx < need) {
        fprintf(stderr, "error: --ctx %d is smaller than the benchmark needs (%ld)\n", o.g.ctx.n_ctx, need);
        return 1;
    }
    if (!o.g.ctx.n_batch && o.n_prompt) o.g.ctx.n_batch = (int)o.n_prompt;
    kiln_model *m;
    kiln_context *c;
    if (gen_opts_open(&o.g, false, &m, &c)) return 1;
    bench_result r;
    if (o.profile && kiln_context_device(c) != KILN_DEVICE_CUDA) fprintf(stderr, "warning: --profile needs --device cuda\n");
    int rc = measure(&o, c, &r);
    if (!rc) report(&o, c, &r);
    if (!rc && o.profile && kiln_context_device(c) == KILN_DEVICE_CUDA) rc = profile_cuda(&o, c, r.bw);
    kiln_context_free(c);
    kiln_model_close(m);
    return rc ? 1 : 0;
}
