/* HF tensor names of the llama family (llama, mistral, qwen2) to the names llama.cpp's converter gives them. */
#include <stdio.h>
#include <string.h>

#include "format/hf.h"

typedef struct name_pair {
    const char *hf;
    const char *gguf;
} name_pair;

static const name_pair GLOBAL_NAMES[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

/* Suffixes after "model.layers.N." */
static const name_pair LAYER_NAMES[] = {
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int kiln_hf_tensor_name(const char *hf, char *out, size_t cap) {
    for (size_t i = 0; i < COUNT(GLOBAL_NAMES); i++)
        if (!strcmp(hf, GLOBAL_NAMES[i].hf)) return snprintf(out, cap, "%s", GLOBAL_NAMES[i].gguf) < (int)cap ? 1 : -1;
    /* older checkpoints carry the rotary frequencies as a buffer; GGUF recomputes them */
    if (ends_with(hf, "rotary_emb.inv_freq")) return 0;
    unsigned layer;
    int used = 0;
    if (sscanf(hf, "model.layers.%u.%n", &layer, &used) != 1 || used == 0 || layer > 100000) return -1;
    if (hf[strlen("model.layers.")] < '0' || hf[strlen("model.layers.")] > '9') return -1;
    const char *rest = hf + used;
    for (size_t i = 0; i < COUNT(LAYER_NAMES); i++)
        if (!strcmp(rest, LAYER_NAMES[i].hf)) {
            int n = snprintf(out, cap, "blk.%u.%s", layer, LAYER_NAMES[i].gguf);
            return n > 0 && (size_t)n < cap ? 1 : -1;
        }
    return -1;
}
