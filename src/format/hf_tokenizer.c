/* tokenizer.json (+ tokenizer_config.json) → tokenizer.ggml.* keys, following llama.cpp's converter:
 *  - model: a BPE model with byte_fallback is SentencePiece-like ("llama"); any other BPE is byte-level ("gpt2").
 *  - tokens by id; ids nobody claims (and ids up to config.json's vocab_size) become "[PAD{id}]" of type unused.
 *  - token_type: added special tokens and "<|...|>" look-alikes are control, other added tokens user-defined,
 *    "<0xHH>" tokens of a byte_fallback model byte, the model's unk_token unknown, the rest normal.
 *  - scores ("llama" only, since HF files carry none): a token made by merge number r scores -r, so SentencePiece
 *    merging by highest score replays the BPE merge order; tokens no merge makes score below every merge result.
 *  - merges ("gpt2" only): "left right" strings in rank order, from either HF spelling ("a b" or ["a", "b"]).
 *  - pre: "default" for "llama"; for "gpt2" guessed from the pre_tokenizer: a Split regex with \p{N}{1,3} is
 *    "llama-bpe" (Llama 3), one with the contraction group and single \p{N} is "qwen2", Digits(individual) before
 *    ByteLevel is "smollm", plain ByteLevel is "gpt-2". llama.cpp hashes a test encoding instead; this rule covers
 *    the families kiln supports.
 *  - bos/eos/unk/padding ids from tokenizer_config.json's token strings, else config.json's ids; add_bos_token and
 *    add_eos_token from tokenizer_config.json, else from the post_processor template; chat_template from
 *    chat_template.jinja, else tokenizer_config.json (a named list picks "default"). */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/hf.h"

#define MAX_VOCAB (1 << 21)

enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

typedef struct vocab {
    int64_t n;
    kiln_str *tokens; /* ptr NULL: no token has this id (padding) */
    int32_t *types;
    float *scores;
    char *pad_text; /* storage of the [PAD{id}] strings */
} vocab;

typedef struct tok_ctx {
    json_t *root, *model, *vocab_obj, *added, *tcfg;
    bool byte_fallback;
    const kiln_hf_config *cfg;
    kiln_meta *m;
    vocab v;
    kiln_str *merges; /* "left right", rank order */
    size_t n_merges;
    char *merge_text;
} tok_ctx;

static void vocab_free(vocab *v) {
    free(v->tokens);
    free(v->types);
    free(v->scores);
    free(v->pad_text);
}

static int64_t id_of(json_t *v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_VOCAB) return -1;
    return json_integer_value(v);
}

/* Vocabulary size: one past the largest id, at least config.json's vocab_size. A hostile id far beyond the number
 * of entries would make a huge table, so ids must stay below twice the entry count (plus slack) or vocab_size. */
static int vocab_size(tok_ctx *c, kiln_error *err) {
    int64_t max_id = -1, entries = 0;
    const char *key;
    json_t *val;
    json_object_foreach(c->vocab_obj, key, val) {
        int64_t id = id_of(val);
        if (id < 0) return kiln_fail(err, "tokenizer.json: model.vocab[\"%.100s\"] is not a valid id", key);
        if (id > max_id) max_id = id;
        entries++;
    }
    size_t i;
    json_array_foreach(c->added, i, val) {
        int64_t id = id_of(json_object_get(val, "id"));
        if (id < 0 || !json_is_string(json_object_get(val, "content")))
            return kiln_fail(err, "tokenizer.json: added_tokens[%zu] lacks a valid id or content", i);
        if (id > max_id) max_id = id;
        entries++;
    }
    int64_t n = max_id + 1;
    if (n > 2 * entries + 1024 && n > c->cfg->vocab_size)
        return kiln_fail(err, "tokenizer.json: token id %lld is far beyond the %lld tokens listed", (long long)max_id,
                         (long long)entries);
    if (c->cfg->vocab_size > n) n = c->cfg->vocab_size;
    if (n == 0) return kiln_fail(err, "tokenizer.json: the vocabulary is empty");
    c->v.n = n;
    return 0;
}

static bool looks_special(const char *s, size_t len) {
    return len >= 4 && !memcmp(s, "<|", 2) && !memcmp(s + len - 2, "|>", 2);
}

static bool is_byte_token(const char *s, size_t len) {
    return len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && isxdigit((unsigned char)s[3]) &&
           isxdigit((unsigned char)s[4]);
}

static int fill_tokens(tok_ctx *c, kiln_error *err) {
    vocab *v = &c->v;
    v->tokens = calloc((size_t)v->n, sizeof *v->tokens);
    v->types = calloc((size_t)v->n, sizeof *v->types);
    v->scores = calloc((size_t)v->n, sizeof *v->scores);
    if (!v->tokens || !v->types || !v->scores) return kiln_fail(err, "tokenizer.json: out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(c->vocab_obj, key, val) {
        int64_t id = id_of(val);
        if (v->tokens[id].ptr) return kiln_fail(err, "tokenizer.json: id %lld is given to two tokens", (long long)id);
        v->tokens[id] = (kiln_str){key, strlen(key)};
        v->types[id] = c->byte_fallback && is_byte_token(key, strlen(key)) ? TOK_BYTE : TOK_NORMAL;
    }
    size_t i;
    json_array_foreach(c->added, i, val) {
        int64_t id = id_of(json_object_get(val, "id"));
        json_t *content = json_object_get(val, "content");
        kiln_str s = {json_string_value(content), json_string_length(content)};
        v->tokens[id] = s;
        v->types[id] = json_is_true(json_object_get(val, "special")) || looks_special(s.ptr, s.len) ? TOK_CONTROL
                                                                                                    : TOK_USER;
    }
    const char *unk = json_string_value(json_object_get(c->model, "unk_token"));
    json_t *unk_id = unk ? json_object_get(c->vocab_obj, unk) : NULL;
    if (unk_id && v->types[id_of(unk_id)] == TOK_NORMAL) v->types[id_of(unk_id)] = TOK_UNKNOWN;
    return 0;
}

static int fill_padding(vocab *v, kiln_error *err) {
    int64_t n_pad = 0;
    for (int64_t i = 0; i < v->n; i++) n_pad += v->tokens[i].ptr == NULL;
    if (!n_pad) return 0;
    v->pad_text = malloc((size_t)n_pad * 16);
    if (!v->pad_text) return kiln_fail(err, "tokenizer.json: out of memory");
    char *p = v->pad_text;
    for (int64_t i = 0; i < v->n; i++) {
        if (v->tokens[i].ptr) continue;
        int len = snprintf(p, 16, "[PAD%lld]", (long long)i);
        v->tokens[i] = (kiln_str){p, (uint64_t)len};
        v->types[i] = TOK_UNUSED;
        p += 16;
    }
    return 0;
}

/* The two halves of merge i, whichever way the file spells it. */
static int merge_parts(json_t *mg, size_t i, kiln_str *a, kiln_str *b, kiln_error *err) {
    if (json_is_string(mg)) {
        const char *s = json_string_value(mg);
        const char *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return kiln_fail(err, "tokenizer.json: model.merges[%zu] is not \"left right\"", i);
        *a = (kiln_str){s, (uint64_t)(sp - s)};
        *b = (kiln_str){sp + 1, strlen(sp + 1)};
        return 0;
    }
    json_t *l = json_array_get(mg, 0), *r = json_array_get(mg, 1);
    if (!json_is_array(mg) || json_array_size(mg) != 2 || !json_is_string(l) || !json_is_string(r))
        return kiln_fail(err, "tokenizer.json: model.merges[%zu] is neither a string nor a pair of strings", i);
    *a = (kiln_str){json_string_value(l), json_string_length(l)};
    *b = (kiln_str){json_string_value(r), json_string_length(r)};
    return 0;
}

/* Spells every merge as "a b" (the gpt2 key) and scores the merge results (the llama scores). */
static int walk_merges(tok_ctx *c, kiln_error *err) {
    json_t *merges = json_object_get(c->model, "merges");
    if (merges && !json_is_array(merges)) return kiln_fail(err, "tokenizer.json: model.merges is not an array");
    size_t n = json_array_size(merges), total = 0;
    kiln_str *out = calloc(n ? n : 1, sizeof *out);
    if (!out) return kiln_fail(err, "tokenizer.json: out of memory");
    for (size_t i = 0; i < n; i++) {
        kiln_str a, b;
        if (merge_parts(json_array_get(merges, i), i, &a, &b, err)) goto fail;
        out[i] = (kiln_str){NULL, a.len + 1 + b.len};
        total += a.len + b.len + 2;
    }
    char *text = malloc(total ? total : 1), *p = text;
    if (!text) {
        kiln_fail(err, "tokenizer.json: out of memory");
        goto fail;
    }
    float floor_score = -(float)n - 1;
    for (int64_t i = 0; i < c->v.n; i++) c->v.scores[i] = floor_score;
    for (size_t i = 0; i < n; i++) {
        kiln_str a, b;
        merge_parts(json_array_get(merges, i), i, &a, &b, err);
        memcpy(p, a.ptr, a.len);
        p[a.len] = ' ';
        memcpy(p + a.len + 1, b.ptr, b.len);
        p[out[i].len] = '\0';
        out[i].ptr = p;
        if (c->byte_fallback) {
            /* merge i makes a+b: close the space for the lookup, then put it back */
            memmove(p + a.len, p + a.len + 1, b.len);
            json_t *id = json_object_getn(c->vocab_obj, p, a.len + b.len);
            memmove(p + a.len + 1, p + a.len, b.len);
            p[a.len] = ' ';
            int64_t t = id_of(id);
            if (t >= 0 && c->v.scores[t] == floor_score) c->v.scores[t] = -(float)i;
        }
        p += out[i].len + 1;
    }
    c->merges = out;
    c->n_merges = n;
    c->merge_text = text;
    return 0;
fail:
    free(out);
    return -1;
}

static void scan_pre_tokenizer(json_t *pt, bool *bytelevel, bool *digits, const char **pre) {
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *sub;
        json_array_foreach(json_object_get(pt, "pretokenizers"), i, sub) {
            scan_pre_tokenizer(sub, bytelevel, digits, pre);
        }
    } else if (!strcmp(type, "ByteLevel")) {
        *bytelevel = true;
    } else if (!strcmp(type, "Digits")) {
        *digits = *digits || json_is_true(json_object_get(pt, "individual_digits"));
    } else if (!strcmp(type, "Split")) {
        const char *re = json_string_value(json_object_get(json_object_get(pt, "pattern"), "Regex"));
        if (!re || *pre) return;
        if (strstr(re, "\\p{N}{1,3}")) *pre = "llama-bpe";
        else if (strstr(re, "(?i:'s|'t|'re|'ve|'m|'ll|'d)") && strstr(re, "\\p{N}")) *pre = "qwen2";
    }
}

static const char *guess_pre(tok_ctx *c) {
    if (c->byte_fallback) return "default";
    bool bytelevel = false, digits = false;
    const char *pre = NULL;
    scan_pre_tokenizer(json_object_get(c->root, "pre_tokenizer"), &bytelevel, &digits, &pre);
    if (pre) return pre;
    if (bytelevel && digits) return "smollm";
    return "gpt-2";
}

/* Id of a token given as text; added tokens first (their text may also sit in the vocab), -1 if absent. */
static int64_t find_token(tok_ctx *c, const char *text) {
    size_t i;
    json_t *val;
    json_array_foreach(c->added, i, val) {
        const char *s = json_string_value(json_object_get(val, "content"));
        if (s && !strcmp(s, text)) return id_of(json_object_get(val, "id"));
    }
    return id_of(json_object_get(c->vocab_obj, text));
}

/* A tokenizer_config.json special token: "text" or {"content": "text", ...}. */
static int64_t config_token(tok_ctx *c, const char *key) {
    json_t *v = json_object_get(c->tcfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? find_token(c, json_string_value(v)) : -1;
}

/* The post_processor's single-sequence template, for whether it adds a token before or after the text. */
static json_t *template_single(json_t *pp) {
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type) return NULL;
    if (!strcmp(type, "TemplateProcessing")) return json_object_get(pp, "single");
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *sub;
        json_array_foreach(json_object_get(pp, "processors"), i, sub) {
            json_t *s = template_single(sub);
            if (s) return s;
        }
    }
    return NULL;
}

static int set_id(tok_ctx *c, const char *key, int64_t id, kiln_error *err) {
    if (id < 0 || id >= c->v.n) return 0;
    return kiln_meta_set_u32(c->m, key, (uint32_t)id, err);
}

static int write_special(tok_ctx *c, kiln_error *err) {
    int64_t bos = config_token(c, "bos_token"), eos = config_token(c, "eos_token");
    if (bos < 0) bos = c->cfg->bos_id;
    if (eos < 0) eos = c->cfg->eos_id;
    if (set_id(c, "tokenizer.ggml.bos_token_id", bos, err) || set_id(c, "tokenizer.ggml.eos_token_id", eos, err) ||
        set_id(c, "tokenizer.ggml.unknown_token_id", config_token(c, "unk_token"), err) ||
        set_id(c, "tokenizer.ggml.padding_token_id", config_token(c, "pad_token"), err))
        return -1;
    json_t *single = template_single(json_object_get(c->root, "post_processor"));
    size_t n_single = json_array_size(single);
    json_t *add_bos = json_object_get(c->tcfg, "add_bos_token"), *add_eos = json_object_get(c->tcfg, "add_eos_token");
    if (json_is_boolean(add_bos) || single) {
        bool b = json_is_boolean(add_bos) ? json_is_true(add_bos)
                                          : n_single && json_object_get(json_array_get(single, 0), "SpecialToken");
        if (kiln_meta_set_bool(c->m, "tokenizer.ggml.add_bos_token", b, err)) return -1;
    }
    if (json_is_boolean(add_eos) || single) {
        bool e = json_is_boolean(add_eos)
                     ? json_is_true(add_eos)
                     : n_single > 1 && json_object_get(json_array_get(single, n_single - 1), "SpecialToken");
        if (kiln_meta_set_bool(c->m, "tokenizer.ggml.add_eos_token", e, err)) return -1;
    }
    return 0;
}

/* Whether a SentencePiece-like tokenizer puts "▁" before the text (normalizer Prepend or Metaspace prefix). */
static bool prepends_space(tok_ctx *c) {
    json_t *norm = json_object_get(c->root, "normalizer");
    const char *ntype = json_string_value(json_object_get(norm, "type"));
    bool found = ntype && !strcmp(ntype, "Prepend");
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(norm, "normalizers"), i, n) {
        const char *type = json_string_value(json_object_get(n, "type"));
        if (type && !strcmp(type, "Prepend")) found = true;
    }
    json_t *pt = json_object_get(c->root, "pre_tokenizer");
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type && !strcmp(type, "Metaspace")) {
        const char *scheme = json_string_value(json_object_get(pt, "prepend_scheme"));
        bool prefix = scheme ? strcmp(scheme, "never") != 0 : json_is_true(json_object_get(pt, "add_prefix_space"));
        found = found || prefix;
    }
    return found;
}

static int write_chat_template(tok_ctx *c, const char *from_file, kiln_error *err) {
    if (from_file) return kiln_meta_set_str(c->m, "tokenizer.chat_template", from_file, err);
    json_t *t = json_object_get(c->tcfg, "chat_template");
    if (json_is_array(t)) {
        json_t *pick = NULL, *e;
        size_t i;
        json_array_foreach(t, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!pick || (name && !strcmp(name, "default"))) pick = e;
        }
        t = json_object_get(pick, "template");
    }
    if (!json_is_string(t)) return 0;
    return kiln_meta_set_str(c->m, "tokenizer.chat_template", json_string_value(t), err);
}

static int write_vocab(tok_ctx *c, kiln_error *err) {
    kiln_meta *m = c->m;
    if (kiln_meta_set_str(m, "tokenizer.ggml.model", c->byte_fallback ? "llama" : "gpt2", err) ||
        kiln_meta_set_str(m, "tokenizer.ggml.pre", guess_pre(c), err) ||
        kiln_meta_set_str_arr(m, "tokenizer.ggml.tokens", c->v.tokens, (uint64_t)c->v.n, err))
        return -1;
    if (c->byte_fallback &&
        kiln_meta_set_arr(m, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, c->v.scores, (uint64_t)c->v.n, err))
        return -1;
    if (kiln_meta_set_arr(m, "tokenizer.ggml.token_type", KILN_GGUF_INT32, c->v.types, (uint64_t)c->v.n, err))
        return -1;
    if (!c->byte_fallback && kiln_meta_set_str_arr(m, "tokenizer.ggml.merges", c->merges, c->n_merges, err))
        return -1;
    return 0;
}

static int translate(tok_ctx *c, const char *chat_template, kiln_error *err) {
    if (!json_is_object(c->root)) return kiln_fail(err, "tokenizer.json: not a JSON object");
    c->model = json_object_get(c->root, "model");
    const char *type = json_string_value(json_object_get(c->model, "type"));
    if (!json_is_object(c->model) || (type && strcmp(type, "BPE")))
        return kiln_fail(err, "tokenizer.json: model type %s is not supported (BPE is)", type ? type : "(missing)");
    c->vocab_obj = json_object_get(c->model, "vocab");
    if (!json_is_object(c->vocab_obj)) return kiln_fail(err, "tokenizer.json: model.vocab is not an object");
    c->added = json_object_get(c->root, "added_tokens");
    if (c->added && !json_is_array(c->added)) return kiln_fail(err, "tokenizer.json: added_tokens is not an array");
    c->byte_fallback = json_is_true(json_object_get(c->model, "byte_fallback"));
    if (vocab_size(c, err) || fill_tokens(c, err) || fill_padding(&c->v, err) || walk_merges(c, err) ||
        write_vocab(c, err))
        return -1;
    if (write_special(c, err) || write_chat_template(c, chat_template, err)) return -1;
    json_t *aps = json_object_get(c->tcfg, "add_prefix_space");
    if (c->byte_fallback || json_is_boolean(aps)) {
        bool b = c->byte_fallback ? prepends_space(c) : json_is_true(aps);
        if (kiln_meta_set_bool(c->m, "tokenizer.ggml.add_space_prefix", b, err)) return -1;
    }
    return 0;
}

int kiln_hf_tokenizer_parse(const char *tok_json, size_t tok_len, const char *cfg_json, size_t cfg_len,
                            const char *chat_template, const kiln_hf_config *cfg, kiln_meta *m, kiln_error *err) {
    tok_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = cfg;
    c.m = m;
    json_error_t jerr;
    c.root = json_loadb(tok_json, tok_len, 0, &jerr);
    if (!c.root) return kiln_fail(err, "tokenizer.json: JSON at byte %d: %s", jerr.position, jerr.text);
    int rc = 0;
    if (cfg_json) {
        c.tcfg = json_loadb(cfg_json, cfg_len, 0, &jerr);
        if (!c.tcfg) rc = kiln_fail(err, "tokenizer_config.json: JSON at byte %d: %s", jerr.position, jerr.text);
        else if (!json_is_object(c.tcfg)) rc = kiln_fail(err, "tokenizer_config.json: not a JSON object");
    }
    if (rc == 0) rc = translate(&c, chat_template, err);
    vocab_free(&c.v);
    free(c.merges);
    free(c.merge_text);
    json_decref(c.tcfg);
    json_decref(c.root);
    return rc;
}
