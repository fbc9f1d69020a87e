/* kiln synth: a model at a real shape, random weights, llama.cpp-compatible metadata (see synth.h). */
#include "format/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf_writer.h"
#include "format/hf.h"

static const kiln_synth_shape SHAPES[] = {
    {"qwen2-1.5b", "qwen2", "Qwen2.5 1.5B (kiln synth)", "1.5B", 1536, 28, 12, 2, 8960, 151936, 32768, 1000000.0f,
     1e-6f, true, true, false},
    {"llama3-8b", "llama", "Llama 3.1 8B (kiln synth)", "8B", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0f,
     1e-5f, false, false, true},
    {"smollm2-135m", "llama", "SmolLM2 135M (kiln synth)", "135M", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0f,
     1e-5f, false, true, false},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

const kiln_synth_shape *kiln_synth_shape_find(const char *name) {
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, name)) return &SHAPES[i];
    return NULL;
}

const char *kiln_synth_shape_names(void) { return "qwen2-1.5b, llama3-8b, smollm2-135m"; }

#define WEIGHT_STD 0.02f
#define CHUNK_BYTES (16u << 20)
#define MAX_TENSORS 1024

/* --- the tensor list -------------------------------------------------------------------------------------------- */

typedef enum fill { FILL_NORMAL, FILL_ONES, FILL_ROPE_FREQS } fill;

typedef struct synth_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[2];
    fill fill;
    kiln_type type;
} synth_tensor;

typedef struct tensor_list {
    synth_tensor t[MAX_TENSORS];
    int n;
} tensor_list;

static void add(tensor_list *l, const char *name, int64_t ne0, int64_t ne1, fill f) {
    synth_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->fill = f;
}

static void add_layer(tensor_list *l, const kiln_synth_shape *s, int64_t i) {
    int64_t hd = s->n_embd / s->n_head, kv = hd * s->n_head_kv;
    char name[64];
#define LAYER(suffix, ne0, ne1, f) \
    (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)i), add(l, name, ne0, ne1, f))
    LAYER("attn_norm.weight", s->n_embd, 0, FILL_ONES);
    LAYER("attn_q.weight", s->n_embd, s->n_embd, FILL_NORMAL);
    LAYER("attn_k.weight", s->n_embd, kv, FILL_NORMAL);
    LAYER("attn_v.weight", s->n_embd, kv, FILL_NORMAL);
    if (s->qkv_bias) {
        LAYER("attn_q.bias", s->n_embd, 0, FILL_NORMAL);
        LAYER("attn_k.bias", kv, 0, FILL_NORMAL);
        LAYER("attn_v.bias", kv, 0, FILL_NORMAL);
    }
    LAYER("attn_output.weight", s->n_embd, s->n_embd, FILL_NORMAL);
    LAYER("ffn_norm.weight", s->n_embd, 0, FILL_ONES);
    LAYER("ffn_gate.weight", s->n_embd, s->n_ff, FILL_NORMAL);
    LAYER("ffn_up.weight", s->n_embd, s->n_ff, FILL_NORMAL);
    LAYER("ffn_down.weight", s->n_ff, s->n_embd, FILL_NORMAL);
#undef LAYER
}

static void list_tensors(tensor_list *l, const kiln_synth_shape *s) {
    l->n = 0;
    add(l, "token_embd.weight", s->n_embd, s->n_vocab, FILL_NORMAL);
    if (s->llama3_rope) add(l, "rope_freqs.weight", s->n_embd / s->n_head / 2, 0, FILL_ROPE_FREQS);
    for (int64_t i = 0; i < s->n_layer; i++) add_layer(l, s, i);
    add(l, "output_norm.weight", s->n_embd, 0, FILL_ONES);
    if (!s->tied_embeddings) add(l, "output.weight", s->n_embd, s->n_vocab, FILL_NORMAL);
}

/* --- weights ---------------------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1]: never 0, so the logarithm below stays finite */
static double uniform(uint64_t *state) {
    return ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

typedef struct gen_ctx {
    uint64_t seed;
    int tensor;
    fill fill;
    const float *rope_freqs;
} gen_ctx;

static void gen_row(void *ctx, int64_t row, float *out, int64_t n) {
    const gen_ctx *g = ctx;
    if (g->fill == FILL_ONES) {
        for (int64_t i = 0; i < n; i++) out[i] = 1.0f;
        return;
    }
    if (g->fill == FILL_ROPE_FREQS) {
        memcpy(out, g->rope_freqs, (size_t)n * sizeof *out);
        return;
    }
    uint64_t state = g->seed ^ ((uint64_t)g->tensor << 40) ^ (uint64_t)row;
    splitmix64(&state);
    const double two_pi = 6.28318530717958647692;
    for (int64_t i = 0; i < n; i += 2) {
        /* Box-Muller: two independent normals from two uniforms */
        double r = sqrt(-2.0 * log(uniform(&state))), a = two_pi * uniform(&state);
        out[i] = (float)(WEIGHT_STD * r * cos(a));
        if (i + 1 < n) out[i + 1] = (float)(WEIGHT_STD * r * sin(a));
    }
}

/* --- metadata --------------------------------------------------------------------------------------------------- */

static void add_arch_keys(kiln_gguf_writer *w, const kiln_synth_shape *s, uint32_t file_type) {
    char key[96];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    kiln_gguf_writer_add_str(w, "general.architecture", s->arch);
    kiln_gguf_writer_add_str(w, "general.type", "model");
    kiln_gguf_writer_add_str(w, "general.name", s->general_name);
    kiln_gguf_writer_add_str(w, "general.size_label", s->size_label);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("block_count"), (uint32_t)s->n_layer);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("context_length"), (uint32_t)s->n_ctx);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), (uint32_t)s->n_embd);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), (uint32_t)s->n_ff);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), (uint32_t)s->n_head);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    kiln_gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), s->rope_base);
    kiln_gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), s->norm_eps);
    kiln_gguf_writer_add_u32(w, "general.file_type", file_type);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("vocab_size"), (uint32_t)s->n_vocab);
    kiln_gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), (uint32_t)(s->n_embd / s->n_head));
    kiln_gguf_writer_add_u32(w, "general.quantization_version", 2);
#undef ARCH_KEY
}

/* A per-token array padded to n: the source's entries, then `pad` (an element of elem_size bytes) repeated. */
static int add_padded_arr(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v, int64_t n, const void *pad,
                          kiln_error *err) {
    size_t es = kiln_gguf_vtype_size(v->arr.elem_type);
    uint8_t *buf = malloc((size_t)n * es);
    if (!buf) return kiln_fail(err, "out of memory padding %s", key);
    memcpy(buf, v->arr.data, (size_t)v->arr.n * es);
    for (int64_t i = (int64_t)v->arr.n; i < n; i++) memcpy(buf + (size_t)i * es, pad, es);
    kiln_gguf_writer_add_arr(w, key, v->arr.elem_type, buf, (uint64_t)n);
    free(buf);
    return 0;
}

static int add_padded_tokens(kiln_gguf_writer *w, const kiln_gguf_value *v, int64_t n, kiln_error *err) {
    const char **strs = malloc((size_t)n * sizeof *strs);
    char *pads = malloc((size_t)(n - (int64_t)v->arr.n) * 32 + 1);
    if (!strs || !pads) {
        free(strs);
        free(pads);
        return kiln_fail(err, "out of memory padding the vocabulary");
    }
    const kiln_str *src = v->arr.data;
    for (uint64_t i = 0; i < v->arr.n; i++) strs[i] = src[i].ptr;
    char *p = pads;
    for (int64_t i = (int64_t)v->arr.n; i < n; i++, p += 32) {
        snprintf(p, 32, "[PAD%lld]", (long long)i);
        strs[i] = p;
    }
    kiln_gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", strs, (uint64_t)n);
    free(strs);
    free(pads);
    return 0;
}

/* tokenizer.* keys of the vocabulary file; the per-token arrays padded to the shape's vocabulary with unused
 * "[PAD{id}]" tokens (score: lowest, so a SentencePiece-style merge never prefers them). */
static int add_tokenizer(kiln_gguf_writer *w, const kiln_gguf *vocab, int64_t n_vocab, kiln_error *err) {
    const kiln_gguf_value *tokens = kiln_gguf_get_arr(vocab, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    if (!tokens) return kiln_fail(err, "%s: no tokenizer.ggml.tokens", vocab->path);
    if ((int64_t)tokens->arr.n > n_vocab)
        return kiln_fail(err, "%s: %llu tokens do not fit the shape's vocabulary of %lld", vocab->path,
                         (unsigned long long)tokens->arr.n, (long long)n_vocab);
    const int32_t unused = 5;
    const float lowest = -1e9f;
    for (uint64_t i = 0; i < vocab->n_kv; i++) {
        const kiln_gguf_kv *kv = &vocab->kv[i];
        const char *key = kv->key.ptr;
        if (strncmp(key, "tokenizer.", 10)) continue;
        bool per_token = kv->value.type == KILN_GGUF_ARRAY && kv->value.arr.n == tokens->arr.n;
        int rc = 0;
        if (!strcmp(key, "tokenizer.ggml.tokens")) rc = add_padded_tokens(w, &kv->value, n_vocab, err);
        else if (per_token && !strcmp(key, "tokenizer.ggml.token_type") && kv->value.arr.elem_type == KILN_GGUF_INT32)
            rc = add_padded_arr(w, key, &kv->value, n_vocab, &unused, err);
        else if (per_token && !strcmp(key, "tokenizer.ggml.scores") && kv->value.arr.elem_type == KILN_GGUF_FLOAT32)
            rc = add_padded_arr(w, key, &kv->value, n_vocab, &lowest, err);
        else kiln_gguf_writer_add_value(w, key, &kv->value);
        if (rc) return -1;
    }
    return 0;
}

/* --- writing ---------------------------------------------------------------------------------------------------- */

static void rope_freqs(const kiln_synth_shape *s, float *out) {
    kiln_hf_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = s->n_embd / s->n_head;
    c.rope_base = s->rope_base;
    c.rope_factor = 8.0;
    c.low_freq_factor = 1.0;
    c.high_freq_factor = 4.0;
    c.orig_ctx = 8192;
    kiln_hf_llama3_rope_freqs(&c, out);
}

static int write_tensors(kiln_gguf_writer *w, const tensor_list *l, const kiln_synth_params *p, kiln_error *err) {
    size_t buf_size = CHUNK_BYTES;
    for (int i = 0; i < l->n; i++) {
        size_t row = kiln_row_size(l->t[i].type, l->t[i].ne[0]);
        if (row > buf_size) buf_size = row;
    }
    uint8_t *buf = malloc(buf_size);
    if (!buf) return kiln_fail(err, "%s: out of memory", p->out);
    float freqs[512];
    rope_freqs(p->shape, freqs);
    int n_threads = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    kiln_progress progress;
    kiln_progress_start(&progress, p->progress);
    int rc = 0;
    for (int i = 0; i < l->n && rc == 0; i++) {
        const synth_tensor *t = &l->t[i];
        gen_ctx g = {p->seed, i, t->fill, freqs};
        size_t row = kiln_row_size(t->type, t->ne[0]);
        int64_t chunk = row >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / row);
        for (int64_t r = 0; r < t->ne[1] && rc == 0; r += chunk) {
            int64_t count = t->ne[1] - r < chunk ? t->ne[1] - r : chunk;
            rc = kiln_quant_rows(t->type, r, count, t->ne[0], gen_row, &g, buf, n_threads, err);
            if (rc == 0) rc = kiln_gguf_writer_write(w, buf, (size_t)count * row, err);
        }
        kiln_progress_tensor(&progress, (uint64_t)i, (uint64_t)l->n, t->name, t->type,
                             kiln_gguf_writer_tensor_size(w, (uint64_t)i));
    }
    free(buf);
    if (rc == 0) rc = kiln_gguf_writer_close(w, err);
    if (rc == 0) kiln_progress_end(&progress);
    return rc;
}

static int build(kiln_gguf_writer *w, tensor_list *l, const kiln_synth_params *p, kiln_error *err) {
    const kiln_synth_shape *s = p->shape;
    kiln_gguf *vocab;
    if (kiln_gguf_open(p->vocab_from, &vocab, err)) return -1;
    add_arch_keys(w, s, p->preset->file_type);
    int rc = add_tokenizer(w, vocab, s->n_vocab, err);
    kiln_gguf_close(vocab);
    if (rc) return -1;
    list_tensors(l, s);
    kiln_quant_model_info info = {s->n_layer, !s->tied_embeddings};
    for (int i = 0; i < l->n; i++) {
        synth_tensor *t = &l->t[i];
        t->type = t->fill == FILL_ROPE_FREQS ? KILN_TYPE_F32
                                             : kiln_quant_tensor_type(p->preset, &info, t->name, t->n_dims, t->ne);
        kiln_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    if (kiln_gguf_writer_open(w, p->out, err)) return -1;
    return write_tensors(w, l, p, err);
}

int kiln_synth(const kiln_synth_params *p, kiln_error *err) {
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    tensor_list *l = malloc(sizeof *l);
    int rc = w && l ? build(w, l, p, err) : kiln_fail(err, "out of memory");
    free(l);
    kiln_gguf_writer_free(w);
    return rc;
}
