/* The architecture table and the hyperparameters read from "<arch>.*" GGUF keys. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

static const kiln_arch ARCHITECTURES[] = {
    {.name = "llama", .rope_style = KILN_ROPE_NORMAL, .output_may_be_tied = true, .gpu = true},
    {.name = "qwen2", .rope_style = KILN_ROPE_NEOX, .qkv_bias = true, .output_may_be_tied = true, .gpu = true},
    /* llama.cpp's gemma3: five sliding-window layers to one global, the local ones at rope base 10000 */
    {.name = "gemma3", .rope_style = KILN_ROPE_NEOX, .output_may_be_tied = true, .qk_norm = true, .post_norms = true,
     .embd_scale = true, .act = KILN_ACT_GELU, .swa_pattern = 6, .rope_base_swa = 10000.0f},
};

const kiln_arch *kiln_arch_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof ARCHITECTURES / sizeof ARCHITECTURES[0]; i++)
        if (!strcmp(ARCHITECTURES[i].name, name)) return &ARCHITECTURES[i];
    return NULL;
}

static const char *arch_key(const kiln_config *cfg, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", cfg->arch->name, suffix);
    return buf;
}

/* Reads a positive integer hyperparameter no larger than max; absent keys take dflt (or fail when dflt < 0). */
static int get_dim(const kiln_gguf *g, const kiln_config *cfg, const char *suffix, int64_t dflt, int64_t max,
                   int *out, kiln_error *err) {
    char key[128];
    int64_t v;
    arch_key(cfg, suffix, key, sizeof key);
    if (!kiln_gguf_get_int(g, key, &v)) {
        if (dflt < 0) return kiln_fail(err, "missing hyperparameter %s", key);
        v = dflt;
    }
    if (v <= 0 || v > max) return kiln_fail(err, "hyperparameter %s = %lld is out of range (1..%lld)", key, (long long)v,
                                            (long long)max);
    *out = (int)v;
    return 0;
}

static float get_float(const kiln_gguf *g, const kiln_config *cfg, const char *suffix, float dflt) {
    char key[128];
    double v;
    return kiln_gguf_get_float(g, arch_key(cfg, suffix, key, sizeof key), &v) ? (float)v : dflt;
}

/* Llama 3 frequency factors: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between. */
static int llama3_factors(const kiln_gguf *g, kiln_config *cfg, float *factors, kiln_error *err) {
    float factor = get_float(g, cfg, "rope.scaling.factor", 8.0f);
    float low = get_float(g, cfg, "rope.scaling.low_freq_factor", 1.0f);
    float high = get_float(g, cfg, "rope.scaling.high_freq_factor", 4.0f);
    float orig = get_float(g, cfg, "rope.scaling.original_context_length", 8192.0f);
    if (!(factor > 0) || !(high > low) || !(orig > 0))
        return kiln_fail(err, "%s.rope.scaling: bad llama3 parameters (factor %g, low %g, high %g, original %g)",
                         cfg->arch->name, factor, low, high, orig);
    float low_wavelen = orig / low, high_wavelen = orig / high;
    for (int i = 0; i < cfg->rope_dim / 2; i++) {
        float freq = powf(cfg->rope_base, -2.0f * (float)i / (float)cfg->rope_dim);
        float wavelen = 2.0f * (float)M_PI / freq;
        if (wavelen < high_wavelen) {
            factors[i] = 1.0f;
        } else if (wavelen > low_wavelen) {
            factors[i] = factor;
        } else {
            float smooth = (orig / wavelen - low) / (high - low);
            factors[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
    return 0;
}

/* Fills factors (rope_dim/2 entries, divisors of each pair's frequency) and the linear scale. */
static int rope_scaling(const kiln_gguf *g, kiln_config *cfg, float *factors, float *linear, kiln_error *err) {
    char key[128];
    for (int i = 0; i < cfg->rope_dim / 2; i++) factors[i] = 1.0f;
    *linear = 1.0f;

    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, "rope_freqs.weight");
    if (t) {
        if (t->type != KILN_TYPE_F32 || kiln_tensor_nelements(t) != cfg->rope_dim / 2)
            return kiln_fail(err, "tensor rope_freqs.weight: expected %d F32 values, found %lld of type %s",
                             cfg->rope_dim / 2, (long long)kiln_tensor_nelements(t), kiln_type_name(t->type));
        memcpy(factors, t->data, sizeof(float) * (size_t)(cfg->rope_dim / 2));
        return 0;
    }
    const char *type = kiln_gguf_get_str(g, arch_key(cfg, "rope.scaling.type", key, sizeof key));
    if (!type || !strcmp(type, "none")) {
        float f = get_float(g, cfg, "rope.scale_linear", 1.0f);
        if (f > 0) *linear = 1.0f / f;
        return 0;
    }
    if (!strcmp(type, "linear")) {
        float f = get_float(g, cfg, "rope.scaling.factor", 1.0f);
        if (!(f > 0)) return kiln_fail(err, "%s.rope.scaling.factor must be positive", cfg->arch->name);
        *linear = 1.0f / f;
        return 0;
    }
    if (!strcmp(type, "llama3")) return llama3_factors(g, cfg, factors, err);
    return kiln_fail(err, "%s: rope scaling type '%s' is not supported", key, type);
}

static int load_rope(const kiln_gguf *g, kiln_config *cfg, kiln_error *err) {
    if (get_dim(g, cfg, "rope.dimension_count", cfg->head_dim, cfg->head_dim, &cfg->rope_dim, err)) return -1;
    if (cfg->rope_dim % 2) return kiln_fail(err, "%s.rope.dimension_count = %d must be even", cfg->arch->name,
                                            cfg->rope_dim);
    cfg->rope_base = get_float(g, cfg, "rope.freq_base", 10000.0f);
    if (!(cfg->rope_base > 1.0f)) return kiln_fail(err, "%s.rope.freq_base = %g must be > 1", cfg->arch->name,
                                                   cfg->rope_base);
    float factors[KILN_MAX_HEAD_DIM / 2], linear;
    if (rope_scaling(g, cfg, factors, &linear, err)) return -1;
    for (int i = 0; i < cfg->rope_dim / 2; i++) {
        if (!(factors[i] > 0)) return kiln_fail(err, "rope frequency factor %d is %g, must be positive", i, factors[i]);
        cfg->rope_freq[i] = powf(cfg->rope_base, -2.0f * (float)i / (float)cfg->rope_dim) * linear / factors[i];
        cfg->rope_freq_swa[i] = cfg->arch->swa_pattern > 0
                                    ? powf(cfg->arch->rope_base_swa, -2.0f * (float)i / (float)cfg->rope_dim)
                                    : cfg->rope_freq[i];
    }
    return 0;
}

/* The sliding window (architectures with sliding-window layers) and the attention scale. */
static int load_attention(const kiln_gguf *g, kiln_config *cfg, kiln_error *err) {
    cfg->n_swa = 0;
    if (cfg->arch->swa_pattern > 0) {
        char key[128];
        int64_t v = 0;
        if (kiln_gguf_get_int(g, arch_key(cfg, "attention.sliding_window", key, sizeof key), &v) &&
            (v < 0 || v > (1 << 24)))
            return kiln_fail(err, "hyperparameter %s = %lld is out of range (0..%d)", key, (long long)v, 1 << 24);
        cfg->n_swa = (int)v;
    }
    /* Gemma 3 27B (its 62 layers are how llama.cpp knows it) scales queries by its query_pre_attn_scalar,
     * n_embd / n_head, instead of the head size */
    bool by_embd = !strcmp(cfg->arch->name, "gemma3") && cfg->n_layer == 62;
    cfg->attn_scale = 1.0f / sqrtf((float)(by_embd ? cfg->n_embd / cfg->n_head : cfg->head_dim));
    return 0;
}

int kiln_config_load(const kiln_gguf *g, kiln_config *cfg, kiln_error *err) {
    memset(cfg, 0, sizeof *cfg);
    const char *name = kiln_gguf_get_str(g, "general.architecture");
    if (!name) return kiln_fail(err, "missing general.architecture");
    cfg->arch = kiln_arch_find(name);
    if (!cfg->arch) return kiln_fail(err, "architecture '%s' is not supported (kiln runs llama, qwen2, gemma3)", name);
    cfg->rope_style = cfg->arch->rope_style;

    const int64_t big = 1 << 20;
    if (get_dim(g, cfg, "embedding_length", -1, big, &cfg->n_embd, err) ||
        get_dim(g, cfg, "block_count", -1, 4096, &cfg->n_layer, err) ||
        get_dim(g, cfg, "attention.head_count", -1, 4096, &cfg->n_head, err) ||
        get_dim(g, cfg, "attention.head_count_kv", cfg->n_head, cfg->n_head, &cfg->n_head_kv, err) ||
        get_dim(g, cfg, "feed_forward_length", -1, big, &cfg->n_ff, err) ||
        get_dim(g, cfg, "context_length", 2048, 1 << 24, &cfg->n_ctx_train, err))
        return -1;
    if (cfg->n_embd % cfg->n_head)
        return kiln_fail(err, "embedding_length %d is not a multiple of head_count %d", cfg->n_embd, cfg->n_head);
    if (get_dim(g, cfg, "attention.key_length", cfg->n_embd / cfg->n_head, KILN_MAX_HEAD_DIM, &cfg->head_dim, err))
        return -1;
    if (cfg->n_head % cfg->n_head_kv)
        return kiln_fail(err, "head_count %d is not a multiple of head_count_kv %d", cfg->n_head, cfg->n_head_kv);

    cfg->rms_eps = get_float(g, cfg, "attention.layer_norm_rms_epsilon", 1e-5f);
    if (!(cfg->rms_eps > 0) || cfg->rms_eps > 1)
        return kiln_fail(err, "%s.attention.layer_norm_rms_epsilon = %g is out of range", name, cfg->rms_eps);

    const kiln_gguf_tensor *embd = kiln_gguf_find_tensor(g, "token_embd.weight");
    if (!embd) return kiln_fail(err, "missing tensor token_embd.weight");
    if (embd->ne[1] <= 0 || embd->ne[1] > (1 << 24))
        return kiln_fail(err, "tensor token_embd.weight: vocabulary size %lld is out of range", (long long)embd->ne[1]);
    cfg->n_vocab = (int)embd->ne[1];
    return load_rope(g, cfg, err) || load_attention(g, cfg, err) ? -1 : 0;
}
