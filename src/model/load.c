/* A model: the mapped container, its description and its tokenizer, loaded together. A model without a tokenizer
 * (tokenizer.ggml.model absent or "none", as in files made only to time or test the weights, or a safetensors folder
 * without tokenizer.json) loads with none: it runs on token ids (kiln bench), and everything that needs text says
 * the tokenizer is missing. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

int kiln_model_load(const char *path, kiln_model **out, kiln_error *err) {
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(err, "out of memory");
    if (kiln_model_file_open(path, &m->file, err)) {
        free(m);
        return -1;
    }
    const char *tok_model = kiln_gguf_get_str(m->file, "tokenizer.ggml.model");
    if (tok_model && !strcmp(tok_model, "none")) tok_model = NULL;
    if (kiln_config_load(m->file, &m->cfg, err) || kiln_weights_load(m->file, &m->cfg, &m->w, err) ||
        (tok_model && kiln_tokenizer_load(m->file, &m->tok, err))) {
        kiln_fail_prefix(err, "%s", path);
        kiln_model_free(m);
        return -1;
    }
    if (m->tok) {
        m->add_bos = !strcmp(tok_model, "llama");
        kiln_gguf_get_bool(m->file, "tokenizer.ggml.add_bos_token", &m->add_bos);
        if (m->add_bos && kiln_token_bos(m->tok) < 0) m->add_bos = false;
    }
    *out = m;
    return 0;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    if (m->tok) kiln_tokenizer_free(m->tok);
    kiln_weights_free(&m->w);
    if (m->file) kiln_gguf_close(m->file);
    free(m);
}

int kiln_model_need_tokenizer(const kiln_model *m, kiln_error *err) {
    if (m->tok) return 0;
    return kiln_fail(err, "%s has no tokenizer (a GGUF without tokenizer.ggml.model, or a folder without "
                          "tokenizer.json): no text in or out; kiln bench runs it", m->file->path);
}
