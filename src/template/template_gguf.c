/* Finding a model's chat template in its GGUF metadata, with ChatML when it carries none. */
#include <stdio.h>

#include "template/template.h"

int kiln_template_from_gguf(const kiln_gguf *g, const char *name, kiln_template **out, bool *is_fallback,
                            kiln_error *err) {
    char key[256];
    if (name) snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
    else snprintf(key, sizeof key, "tokenizer.chat_template");
    const char *src = kiln_gguf_get_str(g, key);
    if (is_fallback) *is_fallback = src == NULL;
    if (!src) {
        fprintf(stderr, "warning: %s has no %s; using ChatML\n", g->path ? g->path : "the model", key);
        src = KILN_TEMPLATE_CHATML;
    }
    if (kiln_template_parse(src, out, err)) return kiln_fail_prefix(err, "%s: %s", g->path ? g->path : "model", key);
    return 0;
}

static const char *token_text(const kiln_gguf *g, const char *id_key) {
    int64_t id;
    const kiln_gguf_value *tokens = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    if (!tokens || !kiln_gguf_get_int(g, id_key, &id) || id < 0 || (uint64_t)id >= tokens->arr.n) return NULL;
    return ((const kiln_str *)tokens->arr.data)[id].ptr;
}

void kiln_template_special_tokens(const kiln_gguf *g, const char **bos_token, const char **eos_token) {
    if (bos_token) *bos_token = token_text(g, "tokenizer.ggml.bos_token_id");
    if (eos_token) *eos_token = token_text(g, "tokenizer.ggml.eos_token_id");
}
