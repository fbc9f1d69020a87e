/* The public model functions: open, describe, tokenize, chat rendering. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

void kiln_error_export(const kiln_error *e, char *err, size_t err_size) {
    if (!err || !err_size) return;
    size_t n = strnlen(e->msg, sizeof e->msg);
    if (n >= err_size) n = err_size - 1;
    memcpy(err, e->msg, n);
    err[n] = 0;
}

kiln_model *kiln_model_open(const char *path, char *err, size_t err_size) {
    kiln_error e = {{0}};
    kiln_model *m;
    if (kiln_model_load(path, &m, &e)) {
        kiln_error_export(&e, err, err_size);
        return NULL;
    }
    m->users = 1;
    return m;
}

/* The opener's reference: contexts and schedulers still on the model keep it until they are freed. */
void kiln_model_close(kiln_model *m) { kiln_model_release(m); }
int kiln_model_n_vocab(const kiln_model *m) { return m->cfg.n_vocab; }
int kiln_model_n_ctx_train(const kiln_model *m) { return m->cfg.n_ctx_train; }
const char *kiln_model_arch(const kiln_model *m) { return m->cfg.arch->name; }
bool kiln_model_add_bos(const kiln_model *m) { return m->add_bos; }
uint64_t kiln_model_bytes_per_token(const kiln_model *m) { return kiln_weights_bytes_per_token(&m->w); }

bool kiln_model_has_tokenizer(const kiln_model *m) { return m->tok != NULL; }

int kiln_tokenize_text(const kiln_model *m, const char *text, bool add_special, bool parse_special, int32_t *ids,
                       int max_ids, char *err, size_t err_size) {
    kiln_error e = {{0}};
    int n = -1;
    if (!kiln_model_need_tokenizer(m, &e))
        n = kiln_tokenize(m->tok, text, strlen(text), add_special, parse_special, ids, max_ids, &e);
    if (n < 0) kiln_error_export(&e, err, err_size);
    return n;
}

const char *kiln_model_token_text(const kiln_model *m, int32_t id, size_t *len) {
    if (!m->tok || id < 0 || id >= kiln_tokenizer_n_vocab(m->tok)) return NULL;
    return kiln_token_bytes(m->tok, id, true, len);
}

bool kiln_model_is_eog(const kiln_model *m, int32_t id) { return m->tok && kiln_token_is_eog(m->tok, id); }

void kiln_free(void *p) { free(p); }

/* The text of the BOS or EOS token for the template's bos_token/eos_token variables, or NULL. */
static const char *special_text(const kiln_model *m, bool eos) {
    if (!m->tok) return NULL;
    int32_t id = eos ? kiln_token_eos(m->tok) : kiln_token_bos(m->tok);
    return id >= 0 && id < kiln_tokenizer_n_vocab(m->tok) ? kiln_token_piece(m->tok, id) : NULL;
}

char *kiln_chat_render(const kiln_model *m, const kiln_message *messages, size_t n_messages,
                       bool add_generation_prompt, char *err, size_t err_size) {
    kiln_error e = {{0}};
    kiln_template *t = NULL;
    char *out = NULL;
    kiln_chat_message *msgs = calloc(n_messages ? n_messages : 1, sizeof *msgs);
    if (!msgs) {
        kiln_fail(&e, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_messages; i++) msgs[i] = (kiln_chat_message){messages[i].role, messages[i].content};
    if (kiln_template_from_gguf(m->file, NULL, &t, NULL, &e)) goto done;
    kiln_chat_opts opts = {.add_generation_prompt = add_generation_prompt,
                           .bos_token = special_text(m, false),
                           .eos_token = special_text(m, true)};
    if (kiln_template_render(t, msgs, n_messages, &opts, &out, &e)) out = NULL;
done:
    if (!out) kiln_error_export(&e, err, err_size);
    if (t) kiln_template_free(t);
    free(msgs);
    return out;
}

int kiln_tokenize_chat(const kiln_model *m, const char *text, int32_t *ids, int max_ids, char *err, size_t err_size) {
    const char *bos = special_text(m, false);
    bool has_bos = bos && bos[0] && !strncmp(text, bos, strlen(bos));
    return kiln_tokenize_text(m, text, !has_bos, true, ids, max_ids, err, err_size);
}
