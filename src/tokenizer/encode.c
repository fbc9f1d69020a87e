/* kiln_tokenize: special tokens first, then each run of plain text through the model's encoder, with BOS/EOS as the
 * model's flags say. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

int kiln_idbuf_push(kiln_idbuf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *v = realloc(b->ids, cap * sizeof *v);
        if (!v) return -1;
        b->ids = v;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return 0;
}

/* SentencePiece input: an optional leading space, then every space as U+2581. */
static char *spm_escape(const char *text, size_t len, bool prefix, size_t *out_len) {
    size_t spaces = prefix;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    char *out = malloc(len + 2 * spaces + 1);
    if (!out) return NULL;
    size_t o = 0;
    if (prefix) {
        memcpy(out, "\xE2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(out + o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            out[o++] = text[i];
        }
    }
    *out_len = o;
    return out;
}

static int encode_run(const kiln_tokenizer *t, const char *text, size_t len, bool after_special, kiln_idbuf *out,
                      kiln_error *err) {
    if (t->kind == KILN_VOCAB_BPE) return kiln_bpe_encode(t, text, len, out, err);
    size_t n;
    char *esc = spm_escape(text, len, t->add_space_prefix && after_special, &n);
    if (!esc) return kiln_fail(err, "tokenize: out of memory");
    int rc = kiln_spm_encode(t, esc, n, out);
    free(esc);
    return rc ? kiln_fail(err, "tokenize: out of memory") : 0;
}

static int encode_all(const kiln_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                      kiln_idbuf *out, kiln_error *err) {
    if (add_special && t->add_bos && kiln_idbuf_push(out, t->bos)) return kiln_fail(err, "tokenize: out of memory");
    kiln_part *parts = NULL;
    size_t n_parts = 0;
    if (kiln_special_split(t, text, len, parse_special, &parts, &n_parts))
        return kiln_fail(err, "tokenize: out of memory");
    bool after_special = true; /* the start of the text counts as following a special token */
    int rc = 0;
    for (size_t i = 0; i < n_parts && !rc; i++) {
        if (parts[i].token >= 0) {
            rc = kiln_idbuf_push(out, parts[i].token) ? kiln_fail(err, "tokenize: out of memory") : 0;
            after_special = true;
        } else {
            rc = encode_run(t, text + parts[i].start, parts[i].len, after_special, out, err);
            after_special = false;
        }
    }
    free(parts);
    if (!rc && add_special && t->add_eos && kiln_idbuf_push(out, t->eos)) rc = kiln_fail(err, "tokenize: out of memory");
    return rc;
}

int kiln_tokenize(const kiln_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                  int32_t *ids, int max_ids, kiln_error *err) {
    kiln_idbuf buf = {0};
    if (!text && len) return kiln_fail(err, "tokenize: NULL text");
    if (encode_all(t, text, len, add_special, parse_special, &buf, err)) {
        free(buf.ids);
        return -1;
    }
    if (buf.n > (size_t)INT32_MAX) {
        free(buf.ids);
        return kiln_fail(err, "tokenize: text gives more than %d tokens", INT32_MAX);
    }
    size_t copy = max_ids > 0 ? (buf.n < (size_t)max_ids ? buf.n : (size_t)max_ids) : 0;
    if (copy) memcpy(ids, buf.ids, copy * sizeof *ids);
    int n = (int)buf.n;
    free(buf.ids);
    return n;
}
