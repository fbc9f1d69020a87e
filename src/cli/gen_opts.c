#include "cli/gen_opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"

void gen_opts_init(gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->ctx = kiln_context_default_params();
    o->ctx.device = KILN_DEVICE_AUTO;
    o->sampling = kiln_sampling_default_params();
}

int gen_parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects a whole number in %ld..%ld, got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *opt, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "error: %s expects a number in %g..%g, got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seed(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "error: --seed expects a non-negative whole number, got '%s'\n", s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int gen_opts_parse(gen_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--kv-f32")) {
        o->ctx.kv_f32 = true;
        return 1;
    }
    if (!strcmp(a, "--reference")) {
        o->ctx.reference = true;
        return 1;
    }
    static const char *const with_value[] = {"-m", "--model", "-t", "--threads", "-c", "--ctx", "-b", "--batch",
                                             "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                                             "--repeat-last-n", "--presence-penalty", "--frequency-penalty",
                                             "--seed", "--stop", "--top-logprobs", "--device"};
    int known = 0;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= !strcmp(a, with_value[k]);
    if (!known) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "error: %s needs a value\n", a);
        return -1;
    }
    const char *v = argv[++*i];
    long n;
    kiln_sampling_params *s = &o->sampling;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (gen_parse_int(a, v, 1, 1024, &n)) return -1;
        o->ctx.n_threads = (int)n;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        if (gen_parse_int(a, v, 1, 1 << 24, &n)) return -1;
        o->ctx.n_ctx = (int)n;
    } else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) {
        if (gen_parse_int(a, v, 1, 65536, &n)) return -1;
        o->ctx.n_batch = (int)n;
    } else if (!strcmp(a, "--device")) {
        if (!strcmp(v, "cpu")) o->ctx.device = KILN_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->ctx.device = KILN_DEVICE_CUDA;
        else if (!strcmp(v, "auto")) o->ctx.device = KILN_DEVICE_AUTO;
        else {
            fprintf(stderr, "error: --device expects cpu, cuda or auto, got '%s'\n", v);
            return -1;
        }
    } else if (!strcmp(a, "--temp")) return parse_float(a, v, 0, 100, &s->temperature) ? -1 : 1;
    else if (!strcmp(a, "--top-k")) {
        if (gen_parse_int(a, v, 0, 1 << 24, &n)) return -1;
        s->top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) return parse_float(a, v, 1e-6f, 1, &s->top_p) ? -1 : 1;
    else if (!strcmp(a, "--min-p")) return parse_float(a, v, 0, 1, &s->min_p) ? -1 : 1;
    else if (!strcmp(a, "--repeat-penalty")) return parse_float(a, v, 1e-3f, 100, &s->repeat_penalty) ? -1 : 1;
    else if (!strcmp(a, "--repeat-last-n")) {
        if (gen_parse_int(a, v, -1, 1 << 20, &n)) return -1;
        s->repeat_last_n = (int)n;
    } else if (!strcmp(a, "--presence-penalty")) return parse_float(a, v, -100, 100, &s->presence_penalty) ? -1 : 1;
    else if (!strcmp(a, "--frequency-penalty")) return parse_float(a, v, -100, 100, &s->frequency_penalty) ? -1 : 1;
    else if (!strcmp(a, "--seed")) return parse_seed(v, &s->seed) ? -1 : 1;
    else if (!strcmp(a, "--top-logprobs")) {
        if (gen_parse_int(a, v, 0, KILN_MAX_TOP_LOGPROBS, &n)) return -1;
        s->n_top_logprobs = (int)n;
    } else if (!strcmp(a, "--stop")) {
        if (o->n_stop == GEN_MAX_STOP || !v[0]) {
            fprintf(stderr, "error: --stop takes a non-empty string, at most %d times\n", GEN_MAX_STOP);
            return -1;
        }
        o->stop[o->n_stop++] = v;
    }
    return 1;
}

void gen_opts_usage(FILE *out, int with_sampling) {
    fprintf(out, "  -m, --model PATH         GGUF file or safetensors folder (required)\n"
                 "  -t, --threads N          worker threads (default: physical cores)\n"
                 "  -c, --ctx N              context size in tokens (default: the model's, at most 4096)\n"
                 "  -b, --batch N            prompt tokens per batched step (default 512; 2048 on a GPU)\n"
                 "  --kv-f32                 F32 KV cache (default F16)\n"
                 "  --device cpu|cuda|auto   where to run (default auto: the GPU when one answers)\n");
    if (!with_sampling) return;
    fprintf(out, "  --temp T                 temperature, 0 = greedy (default 0.8)\n"
                 "  --top-k K                keep the K most likely tokens, 0 = off (default 40)\n"
                 "  --top-p P                nucleus sampling, 1 = off (default 0.95)\n"
                 "  --min-p P                drop tokens below P x the top probability, 0 = off (default 0.05)\n"
                 "  --repeat-penalty X       penalize recent tokens, 1 = off (default 1)\n"
                 "  --repeat-last-n N        recent tokens the penalties see, -1 = all (default 64)\n"
                 "  --presence-penalty X     subtract X from tokens already present (default 0)\n"
                 "  --frequency-penalty X    subtract X per occurrence (default 0)\n"
                 "  --seed S                 random seed; the same seed gives the same text (default: random)\n"
                 "  --stop STR               stop before STR (repeatable)\n");
}

int gen_require_tokenizer(const kiln_model *m, const char *path) {
    if (kiln_model_has_tokenizer(m)) return 0;
    fprintf(stderr, "error: %s has no tokenizer (a GGUF without tokenizer.ggml.model, or a folder without "
                    "tokenizer.json): this command needs one; kiln bench runs such a model\n", path);
    return -1;
}

int gen_opts_open(const gen_opts *o, bool needs_text, kiln_model **m, kiln_context **c) {
    char err[512];
    *m = NULL;
    *c = NULL;
    if (!o->model) {
        fprintf(stderr, "error: no model given (-m PATH)\n");
        return -1;
    }
    if (!(*m = kiln_model_open(o->model, err, sizeof err))) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (needs_text && gen_require_tokenizer(*m, o->model)) {
        kiln_model_close(*m);
        *m = NULL;
        return -1;
    }
    if (!(*c = kiln_context_new(*m, &o->ctx, err, sizeof err))) {
        fprintf(stderr, "error: %s\n", err);
        kiln_model_close(*m);
        *m = NULL;
        return -1;
    }
    return 0;
}

const char *gen_opts_where(const kiln_context *c, char *buf, size_t size) {
    if (kiln_context_device(c) == KILN_DEVICE_CUDA) {
        char desc[256];
        kiln_error e = {{0}};
        if (kiln_cuda_probe(desc, sizeof desc, &e)) snprintf(desc, sizeof desc, "CUDA");
        snprintf(buf, size, "the GPU (%s)", desc);
    } else {
        int n = kiln_context_n_threads(c);
        snprintf(buf, size, "the CPU, %d thread%s", n, n == 1 ? "" : "s");
    }
    return buf;
}

double gen_mib(uint64_t bytes) { return (double)bytes / 1048576.0; }

const char *gen_memory_phrase(const kiln_memory *mem, const char *kv_extent, char *buf, size_t size) {
    snprintf(buf, size, "weights %.1f MiB, KV cache %.1f MiB (%s), workspace %.1f MiB", gen_mib(mem->weights),
             gen_mib(mem->kv_cache), kv_extent, gen_mib(mem->workspace));
    return buf;
}

const char *gen_opts_memory(const kiln_context *c, char *buf, size_t size) {
    kiln_memory mem = kiln_context_memory(c);
    char extent[32];
    snprintf(extent, sizeof extent, "%d positions", kiln_context_n_ctx(c));
    return gen_memory_phrase(&mem, extent, buf, size);
}

void gen_opts_describe(const gen_opts *o, const kiln_context *c) {
    char where[320], memory[160];
    fprintf(stderr, "kiln: %s (%s) on %s: %s\n", o->model, kiln_model_arch(kiln_context_model(c)),
            gen_opts_where(c, where, sizeof where), gen_opts_memory(c, memory, sizeof memory));
}
