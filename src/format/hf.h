/* Translation of Hugging Face model folders into GGUF terms: tensor names, config.json hyperparameters and
 * tokenizer.json vocabularies. Used by safetensors.c; the functions taking JSON text are also fuzzing entry points. */
#ifndef KILN_FORMAT_HF_H
#define KILN_FORMAT_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/meta_builder.h"
#include "util/error.h"

typedef struct kiln_hf_config {
    char arch[16];   /* GGUF architecture: "llama" (HF llama, mistral) or "qwen2" */
    bool permute_qk; /* llama: q/k rows go from HF's rotate-halves layout to interleaved pairs */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, vocab_size, head_dim;
    bool tied_embeddings;
    int64_t bos_id, eos_id; /* bos_token_id / eos_token_id, -1 when absent (tokenizer_config.json wins) */
    double rope_base;
    /* rope_scaling.rope_type "llama3": per-frequency factors become the rope_freqs.weight tensor */
    bool llama3_rope;
    double rope_factor, low_freq_factor, high_freq_factor, orig_ctx;
} kiln_hf_config;

/* GGUF name of an HF tensor name. Returns 1 and fills out when mapped, 0 for tensors a GGUF does not keep (rotary
 * inv_freq buffers), -1 for names kiln does not know. */
int kiln_hf_tensor_name(const char *hf, char *out, size_t cap);

/* Parses config.json text, fills cfg and writes general.architecture and the <arch>.* keys into m. `what` names
 * the file in errors. */
int kiln_hf_config_parse(const char *json, size_t len, const char *what, kiln_hf_config *cfg, kiln_meta *m,
                         kiln_error *err);

/* The rope_freqs.weight values (head_dim/2 of them) for llama3 rope scaling, computed as llama.cpp's converter
 * does. */
void kiln_hf_llama3_rope_freqs(const kiln_hf_config *cfg, float *out);

/* Translates tokenizer.json text (and tokenizer_config.json text, which may be NULL) into tokenizer.ggml.* keys and
 * tokenizer.chat_template. The vocabulary is padded with [PAD{i}] tokens to cfg->vocab_size when that is larger. */
int kiln_hf_tokenizer_parse(const char *tok_json, size_t tok_len, const char *cfg_json, size_t cfg_len,
                            const char *chat_template, const kiln_hf_config *cfg, kiln_meta *m, kiln_error *err);

#endif
