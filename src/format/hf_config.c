/* config.json → GGUF hyperparameter keys, as llama.cpp's converter writes them for llama (HF llama and mistral,
 * both GGUF arch "llama") and qwen2. Every number is range-checked: the file is untrusted input. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "format/hf.h"

#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096
#define MAX_VOCAB (1 << 21)
#define MAX_CTX (1 << 26)

static int get_int(json_t *root, const char *key, int64_t lo, int64_t hi, bool required, int64_t *out,
                   const char *what, kiln_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return kiln_fail(err, "%s: %s is missing", what, key);
        return 0;
    }
    if (!json_is_integer(v)) return kiln_fail(err, "%s: %s is not an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return kiln_fail(err, "%s: %s = %lld is outside [%lld, %lld]", what, key, (long long)x, (long long)lo,
                         (long long)hi);
    *out = x;
    return 0;
}

static int get_num(json_t *root, const char *key, double lo, double hi, double *out, const char *what,
                   kiln_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return kiln_fail(err, "%s: %s is not a number", what, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return kiln_fail(err, "%s: %s = %g is outside [%g, %g]", what, key, x, lo, hi);
    *out = x;
    return 0;
}

/* A special token id: an integer, or a list whose first entry counts (multi-eos configs); -1 when unusable. */
static int64_t token_id(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_VOCAB) return -1;
    return json_integer_value(v);
}

static int detect_arch(json_t *root, kiln_hf_config *cfg, const char *what, kiln_error *err) {
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    const char *ar = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    if ((mt && (!strcmp(mt, "llama") || !strcmp(mt, "mistral"))) ||
        (!mt && ar && (!strcmp(ar, "LlamaForCausalLM") || !strcmp(ar, "MistralForCausalLM")))) {
        strcpy(cfg->arch, "llama");
        cfg->permute_qk = true;
    } else if ((mt && !strcmp(mt, "qwen2")) || (!mt && ar && !strcmp(ar, "Qwen2ForCausalLM"))) {
        strcpy(cfg->arch, "qwen2");
    } else {
        return kiln_fail(err, "%s: model_type %s (architectures[0] %s) is not supported (llama, mistral, qwen2 are)",
                         what, mt ? mt : "(missing)", ar ? ar : "(missing)");
    }
    return 0;
}

static int read_shape(json_t *root, kiln_hf_config *c, const char *what, kiln_error *err) {
    if (get_int(root, "hidden_size", 1, MAX_DIM, true, &c->n_embd, what, err) ||
        get_int(root, "num_hidden_layers", 1, MAX_LAYERS, true, &c->n_layer, what, err) ||
        get_int(root, "num_attention_heads", 1, MAX_DIM, true, &c->n_head, what, err) ||
        get_int(root, "intermediate_size", 1, 64 * (int64_t)MAX_DIM, true, &c->n_ff, what, err))
        return -1;
    c->n_head_kv = c->n_head;
    c->head_dim = c->n_embd / c->n_head;
    c->n_ctx = 4096;
    c->vocab_size = 0;
    if (get_int(root, "num_key_value_heads", 1, c->n_head, false, &c->n_head_kv, what, err) ||
        get_int(root, "head_dim", 1, MAX_DIM, false, &c->head_dim, what, err) ||
        get_int(root, "max_position_embeddings", 1, MAX_CTX, false, &c->n_ctx, what, err) ||
        get_int(root, "vocab_size", 1, MAX_VOCAB, false, &c->vocab_size, what, err))
        return -1;
    if (c->n_head % c->n_head_kv)
        return kiln_fail(err, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                         (long long)c->n_head, (long long)c->n_head_kv);
    if (!json_object_get(root, "head_dim") && c->n_embd % c->n_head)
        return kiln_fail(err, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", what,
                         (long long)c->n_embd, (long long)c->n_head);
    if (c->head_dim % 2) return kiln_fail(err, "%s: head dimension %lld is odd", what, (long long)c->head_dim);
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    c->tied_embeddings = json_is_true(tie);
    c->bos_id = token_id(root, "bos_token_id");
    c->eos_id = token_id(root, "eos_token_id");
    return 0;
}

/* Rope settings: transformers 5 writes them as one "rope_parameters" object (rope_theta, rope_type and the
 * scaling fields); older configs have top-level rope_theta and a "rope_scaling" object. */
static json_t *rope_scaling(json_t *root) {
    json_t *rs = json_object_get(root, "rope_scaling");
    return rs && !json_is_null(rs) ? rs : json_object_get(root, "rope_parameters");
}

static int read_rope_scaling(json_t *root, kiln_hf_config *c, kiln_meta *m, const char *what, kiln_error *err) {
    json_t *rs = rope_scaling(root);
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return kiln_fail(err, "%s: rope_scaling is not an object", what);
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!type && rs == json_object_get(root, "rope_parameters")) return 0; /* just rope_theta */
    if (!type) return kiln_fail(err, "%s: rope_scaling has no rope_type", what);
    double factor = 1.0;
    if (get_num(rs, "factor", 1e-6, 1e6, &factor, what, err)) return -1;
    char key[64];
    if (!strcmp(type, "llama3")) {
        c->llama3_rope = true;
        c->rope_factor = json_object_get(rs, "factor") ? factor : 8.0;
        c->low_freq_factor = 1.0;
        c->high_freq_factor = 4.0;
        c->orig_ctx = 8192;
        if (get_num(rs, "low_freq_factor", 1e-6, 1e6, &c->low_freq_factor, what, err) ||
            get_num(rs, "high_freq_factor", 1e-6, 1e6, &c->high_freq_factor, what, err) ||
            get_num(rs, "original_max_position_embeddings", 1, MAX_CTX, &c->orig_ctx, what, err) ||
            get_num(root, "original_max_position_embeddings", 1, MAX_CTX, &c->orig_ctx, what, err))
            return -1;
        if (c->low_freq_factor == c->high_freq_factor)
            return kiln_fail(err, "%s: rope_scaling low_freq_factor equals high_freq_factor", what);
        return 0;
    }
    if (!strcmp(type, "linear") || !strcmp(type, "yarn")) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
        if (kiln_meta_set_str(m, key, type, err)) return -1;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", c->arch);
        if (kiln_meta_set_f32(m, key, (float)factor, err)) return -1;
        double orig = 0;
        if (get_num(rs, "original_max_position_embeddings", 1, MAX_CTX, &orig, what, err)) return -1;
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", c->arch);
        if (orig > 0 && kiln_meta_set_u32(m, key, (uint32_t)orig, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "default")) return 0;
    return kiln_fail(err, "%s: rope_scaling type %s is not supported (llama3, linear, yarn are)", what, type);
}

static int set_u32(kiln_meta *m, const char *arch, const char *suffix, int64_t v, kiln_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return kiln_meta_set_u32(m, key, (uint32_t)v, err);
}

static int set_f32(kiln_meta *m, const char *arch, const char *suffix, double v, kiln_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return kiln_meta_set_f32(m, key, (float)v, err);
}

static int write_keys(json_t *root, kiln_hf_config *c, kiln_meta *m, const char *what, kiln_error *err) {
    double eps = 1e-6;
    c->rope_base = 10000.0;
    json_t *rp = json_object_get(root, "rope_parameters");
    if (get_num(root, "rms_norm_eps", 0, 1, &eps, what, err) ||
        get_num(root, "rope_theta", 1e-3, 1e12, &c->rope_base, what, err) ||
        (json_is_object(rp) && get_num(rp, "rope_theta", 1e-3, 1e12, &c->rope_base, what, err)))
        return -1;
    const char *a = c->arch;
    if (kiln_meta_set_str(m, "general.architecture", a, err) || set_u32(m, a, "context_length", c->n_ctx, err) ||
        set_u32(m, a, "embedding_length", c->n_embd, err) || set_u32(m, a, "block_count", c->n_layer, err) ||
        set_u32(m, a, "feed_forward_length", c->n_ff, err) || set_u32(m, a, "attention.head_count", c->n_head, err) ||
        set_u32(m, a, "attention.head_count_kv", c->n_head_kv, err) ||
        set_f32(m, a, "rope.freq_base", c->rope_base, err) ||
        set_f32(m, a, "attention.layer_norm_rms_epsilon", eps, err) ||
        set_u32(m, a, "rope.dimension_count", c->head_dim, err))
        return -1;
    if (json_object_get(root, "head_dim") &&
        (set_u32(m, a, "attention.key_length", c->head_dim, err) ||
         set_u32(m, a, "attention.value_length", c->head_dim, err)))
        return -1;
    return read_rope_scaling(root, c, m, what, err);
}

int kiln_hf_config_parse(const char *json, size_t len, const char *what, kiln_hf_config *cfg, kiln_meta *m,
                         kiln_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root) return kiln_fail(err, "%s: JSON at byte %d: %s", what, jerr.position, jerr.text);
    int rc;
    if (!json_is_object(root)) rc = kiln_fail(err, "%s: not a JSON object", what);
    else rc = (detect_arch(root, cfg, what, err) || read_shape(root, cfg, what, err) ||
               write_keys(root, cfg, m, what, err)) ? -1 : 0;
    json_decref(root);
    return rc;
}

/* Single precision throughout, in the converter's order of operations (it computes with float32 tensors), so the
 * factors come out bit for bit as in a converted GGUF. */
void kiln_hf_llama3_rope_freqs(const kiln_hf_config *c, float *out) {
    const float two_pi = 6.28318530717958647692f;
    const float low = (float)c->low_freq_factor, high = (float)c->high_freq_factor, factor = (float)c->rope_factor;
    const float orig = (float)c->orig_ctx;
    const double low_wavelen = c->orig_ctx / c->low_freq_factor, high_wavelen = c->orig_ctx / c->high_freq_factor;
    for (int64_t i = 0; i < c->head_dim / 2; i++) {
        float freq = 1.0f / powf((float)c->rope_base, (float)(2 * i) / (float)c->head_dim);
        float wavelen = two_pi / freq;
        if (wavelen < high_wavelen) {
            out[i] = 1.0f;
        } else if (wavelen > low_wavelen) {
            out[i] = factor;
        } else {
            float smooth = (orig / wavelen - low) / (high - low);
            out[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
}
