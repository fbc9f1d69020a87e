/* Building a tokenizer from vocabulary metadata: token table, special ids and flags, end-of-generation set, and the
 * decoded bytes of every token. Defaults and auto-detection follow llama.cpp's vocab loader. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"
#include "tokenizer/utf8.h"

#define MAX_VOCAB (1 << 24)

void kiln_vocab_spec_init(kiln_vocab_spec *s) {
    memset(s, 0, sizeof *s);
    s->bos = s->eos = s->eot = s->eom = s->unk = s->pad = s->fim_pad = s->fim_rep = s->fim_sep = -1;
    s->add_bos = s->add_eos = s->add_space_prefix = -1;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->tokens);
    free(t->arena);
    kiln_strmap_free(&t->by_text);
    free(t->is_eog);
    free(t->specials);
    free(t->special_rank);
    free(t->trie);
    kiln_strmap_free(&t->sym_by_text);
    free(t->sym_arena);
    free(t->sym_token);
    kiln_pairmap_free(&t->merges);
    kiln_pretok_free(t->pre_re);
    free(t);
}

static uint8_t attr_of_type(int32_t type) {
    switch (type) {
    case 1: return KILN_ATTR_NORMAL;
    case 2: return KILN_ATTR_UNKNOWN;
    case 3: return KILN_ATTR_CONTROL;
    case 4: return KILN_ATTR_USER_DEFINED;
    case 5: return KILN_ATTR_UNUSED;
    case 6: return KILN_ATTR_BYTE;
    default: return 0; /* undefined: decodes to nothing */
    }
}

/* <0xXX> -> XX, or -1 */
static int byte_piece_value(const char *p, size_t len) {
    if (len != 6 || memcmp(p, "<0x", 3) || p[5] != '>' || !isxdigit((unsigned char)p[3]) ||
        !isxdigit((unsigned char)p[4]))
        return -1;
    char hex[3] = {p[3], p[4], 0};
    return (int)strtol(hex, NULL, 16);
}

/* What a token prints as. Returns the decoded length written to out (never longer than the piece). */
static size_t decode_piece(const kiln_tokenizer *t, const char *p, size_t len, uint8_t attr, char *out) {
    if (attr & (KILN_ATTR_CONTROL | KILN_ATTR_UNKNOWN | KILN_ATTR_USER_DEFINED)) {
        memcpy(out, p, len);
        return len;
    }
    if (attr & KILN_ATTR_BYTE) {
        int b = byte_piece_value(p, len);
        if (b < 0) return 0;
        out[0] = (char)b;
        return 1;
    }
    if (!(attr & KILN_ATTR_NORMAL)) return 0;
    size_t o = 0;
    if (t->kind == KILN_VOCAB_SPM) {
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(p + i, "\xE2\x96\x81", 3)) {
                out[o++] = ' ';
                i += 3;
            } else {
                out[o++] = p[i++];
            }
        }
        return o;
    }
    /* byte-level BPE: every character stands for one byte; one outside the table is kept as it is */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = kiln_utf8_strict_len(p + i, len - i, &cp);
        int b = (n == 0 || n == KILN_UTF8_INCOMPLETE) ? -1 : kiln_cp_to_byte(cp);
        if (n == 0 || n == KILN_UTF8_INCOMPLETE) n = 1;
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, p + i, n);
            o += n;
        }
        i += n;
    }
    return o;
}

static int32_t id_or_default(int64_t from_file, int32_t dflt, int32_t n_vocab) {
    if (from_file >= 0 && from_file < n_vocab) return (int32_t)from_file;
    return dflt >= 0 && dflt < n_vocab ? dflt : -1;
}

static int32_t find_text(const kiln_tokenizer *t, const char *const *texts) {
    for (; *texts; texts++) {
        int32_t id = kiln_strmap_get(&t->by_text, *texts, strlen(*texts));
        if (id >= 0) return id;
    }
    return -1;
}

static void mark_eog(kiln_tokenizer *t, int32_t id) {
    if (id < 0) return;
    t->is_eog[id] = 1;
    /* a token that ends generation is never ordinary text */
    if (!(t->tokens[id].attr & (KILN_ATTR_CONTROL | KILN_ATTR_UNKNOWN))) t->tokens[id].attr |= KILN_ATTR_CONTROL;
}

/* EOT, EOM and the FIM ids by their usual texts when the file does not name them; then the end-of-generation set. */
static void detect_eog(kiln_tokenizer *t, const kiln_vocab_spec *s) {
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                            "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
                                            "<end_of_utterance>", NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                                                NULL};
    static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[", NULL};
    int32_t n = t->n_vocab;
    t->eot = id_or_default(s->eot, find_text(t, eot_texts), n);
    t->eom = id_or_default(s->eom, find_text(t, eom_texts), n);
    mark_eog(t, id_or_default(s->fim_pad, find_text(t, fim_pad_texts), n));
    mark_eog(t, id_or_default(s->fim_rep, find_text(t, fim_rep_texts), n));
    mark_eog(t, id_or_default(s->fim_sep, find_text(t, fim_sep_texts), n));
    for (const char *const *e = eog_texts; *e; e++) mark_eog(t, kiln_strmap_get(&t->by_text, *e, strlen(*e)));
    mark_eog(t, t->eos);
    mark_eog(t, t->eot);
    mark_eog(t, t->eom);
    /* gpt-oss and solar-open: <|end|> closes a message there, not the generation */
    bool has = kiln_strmap_get(&t->by_text, "<|return|>", 10) >= 0 && kiln_strmap_get(&t->by_text, "<|call|>", 8) >= 0;
    has = has || (kiln_strmap_get(&t->by_text, "<|calls|>", 9) >= 0 && kiln_strmap_get(&t->by_text, "<|flush|>", 9) >= 0);
    int32_t end = kiln_strmap_get(&t->by_text, "<|end|>", 7);
    if (has && end >= 0) {
        t->is_eog[end] = 0;
        t->tokens[end].attr = KILN_ATTR_USER_DEFINED;
    }
}

/* Phi-3's special tokens swallow the whitespace after them (llama.cpp sets this by model name). */
static void apply_name_quirks(kiln_tokenizer *t, const char *name) {
    char lower[128] = {0};
    if (!name) return;
    for (size_t i = 0; name[i] && i + 1 < sizeof lower; i++) lower[i] = (char)tolower((unsigned char)name[i]);
    if (!strstr(lower, "phi-3") && !strstr(lower, "phi3")) return;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tokens[i].attr & (KILN_ATTR_CONTROL | KILN_ATTR_USER_DEFINED | KILN_ATTR_UNKNOWN))
            t->tokens[i].attr |= KILN_ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++) {
        int32_t id = kiln_strmap_get(&t->by_text, keep[i], strlen(keep[i]));
        if (id >= 0) t->tokens[id].attr &= (uint8_t)~KILN_ATTR_RSTRIP;
    }
    int32_t eos = kiln_strmap_get(&t->by_text, "</s>", 4);
    if (eos >= 0) t->tokens[eos].attr |= KILN_ATTR_RSTRIP;
}

static int build_token_table(kiln_tokenizer *t, const kiln_vocab_spec *s, kiln_error *err) {
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!s->tokens[i].ptr && s->tokens[i].len) return kiln_fail(err, "tokenizer.ggml.tokens[%d]: missing text", i);
        if (s->tokens[i].len > (1u << 20)) return kiln_fail(err, "tokenizer.ggml.tokens[%d]: piece too long", i);
        total += 2 * (s->tokens[i].len + 1);
    }
    if (total > UINT32_MAX) return kiln_fail(err, "tokenizer.ggml.tokens: %zu bytes of text, more than kiln reads", total);
    t->tokens = calloc((size_t)t->n_vocab, sizeof *t->tokens);
    t->arena = malloc(total ? total : 1);
    t->is_eog = calloc((size_t)t->n_vocab, 1);
    if (!t->tokens || !t->arena || !t->is_eog || kiln_strmap_init(&t->by_text, (size_t)t->n_vocab))
        return kiln_fail(err, "tokenizer: out of memory for %d tokens", t->n_vocab);
    size_t o = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        kiln_token_info *ti = &t->tokens[i];
        ti->text_off = (uint32_t)o;
        ti->text_len = (uint32_t)s->tokens[i].len;
        if (ti->text_len) memcpy(t->arena + o, s->tokens[i].ptr, ti->text_len);
        t->arena[o + ti->text_len] = 0;
        o += ti->text_len + 1;
        ti->score = s->scores ? s->scores[i] : 0.0f;
        ti->attr = s->token_types ? attr_of_type(s->token_types[i]) : KILN_ATTR_NORMAL;
        if (!ti->text_len) continue; /* an empty piece can never be matched */
        int32_t got = kiln_strmap_put(&t->by_text, t->arena + ti->text_off, ti->text_len, i);
        if (got != i)
            return kiln_fail(err, "tokenizer.ggml.tokens: duplicate token '%.64s' at ids %d and %d",
                             t->arena + ti->text_off, got, i);
    }
    return 0;
}

static void fill_decoded(kiln_tokenizer *t) {
    const kiln_token_info *last = &t->tokens[t->n_vocab - 1];
    size_t o = last->text_off + last->text_len + 1; /* decoded pieces follow the stored ones */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        kiln_token_info *ti = &t->tokens[i];
        ti->bytes_off = (uint32_t)o;
        ti->bytes_len = (uint32_t)decode_piece(t, t->arena + ti->text_off, ti->text_len, ti->attr, t->arena + o);
        t->arena[o + ti->bytes_len] = 0;
        o += ti->bytes_len + 1;
    }
}

static void init_spm(kiln_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        t->byte_token[b] = kiln_strmap_get(&t->by_text, piece, 6);
        if (t->byte_token[b] < 0) {
            char c = (char)b;
            t->byte_token[b] = kiln_strmap_get(&t->by_text, &c, 1);
        }
    }
    kiln_spm_init(t);
}

static void set_flags(kiln_tokenizer *t, const kiln_vocab_spec *s) {
    bool spm = t->kind == KILN_VOCAB_SPM;
    t->bos = id_or_default(s->bos, spm ? 1 : (t->pretok && t->pretok->no_bos) ? -1 : 11, t->n_vocab);
    t->eos = id_or_default(s->eos, spm ? 2 : 11, t->n_vocab);
    t->unk = id_or_default(s->unk, spm ? 0 : -1, t->n_vocab);
    t->pad = id_or_default(s->pad, -1, t->n_vocab);
    t->add_bos = s->add_bos >= 0 ? s->add_bos : spm || (t->pretok && t->pretok->add_bos);
    t->add_eos = s->add_eos > 0;
    t->add_space_prefix = s->add_space_prefix >= 0 ? s->add_space_prefix : spm;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if (t->add_eos && t->eos < 0) t->add_eos = false;
}

/* The pre-tokenizer named by tokenizer.ggml.pre; an unknown or missing name says so once and takes the default. */
static void choose_pretok(kiln_tokenizer *t, const char *pre) {
    t->pretok = pre ? kiln_pretok_find(pre) : NULL;
    t->pre_name = "default";
    if (!pre) {
        fprintf(stderr, "warning: no pre-tokenizer (tokenizer.ggml.pre) in the file; using the default regexes\n");
    } else if (!t->pretok) {
        fprintf(stderr, "warning: unknown pre-tokenizer '%s' (tokenizer.ggml.pre); using the default regexes\n", pre);
    } else {
        for (const char *const *n = t->pretok->names; *n; n++)
            if (!strcmp(*n, pre)) t->pre_name = *n;
    }
    if (!t->pretok) t->pretok = kiln_pretok_default();
    t->ignore_merges = t->pretok->ignore_merges;
}

int kiln_tokenizer_build(const kiln_vocab_spec *s, kiln_tokenizer **out, kiln_error *err) {
    *out = NULL;
    if (!s->model) return kiln_fail(err, "tokenizer.ggml.model: missing");
    if (s->n_tokens <= 0 || s->n_tokens > MAX_VOCAB || !s->tokens)
        return kiln_fail(err, "tokenizer.ggml.tokens: missing or bad size (%lld)", (long long)s->n_tokens);
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kiln_fail(err, "tokenizer: out of memory");
    t->n_vocab = (int32_t)s->n_tokens;
    if (!strcmp(s->model, "llama")) {
        t->kind = KILN_VOCAB_SPM;
    } else if (!strcmp(s->model, "gpt2")) {
        t->kind = KILN_VOCAB_BPE;
        choose_pretok(t, s->pre);
    } else {
        free(t);
        return kiln_fail(err, "tokenizer.ggml.model: '%s' is not supported (kiln reads 'llama' and 'gpt2')", s->model);
    }
    if (build_token_table(t, s, err)) goto fail;
    set_flags(t, s);
    detect_eog(t, s);
    apply_name_quirks(t, s->name);
    fill_decoded(t);
    if (kiln_special_init(t)) {
        kiln_fail(err, "tokenizer: out of memory for special tokens");
        goto fail;
    }
    if (t->kind == KILN_VOCAB_SPM) {
        init_spm(t);
    } else {
        if (kiln_bpe_init(t, s, err)) goto fail;
        if (kiln_pretok_compile(t->pretok, &t->pre_re, err)) goto fail;
    }
    *out = t;
    return 0;
fail:
    kiln_tokenizer_free(t);
    return -1;
}

static int get_flag(const kiln_gguf *g, const char *key) {
    bool b;
    return kiln_gguf_get_bool(g, key, &b) ? b : -1;
}

static int64_t get_id(const kiln_gguf *g, const char *key) {
    int64_t v;
    return kiln_gguf_get_int(g, key, &v) && v >= 0 ? v : -1;
}

/* tokenizer.ggml.scores as floats (some converters store integers: those are copied into *converted), or NULL. */
static const float *read_scores(const kiln_gguf *g, uint64_t n_tokens, float **converted) {
    const kiln_gguf_value *f = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32);
    const kiln_gguf_value *i = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", KILN_GGUF_INT32);
    if (f && f->arr.n >= n_tokens) return f->arr.data;
    if (!i || i->arr.n < n_tokens || n_tokens > MAX_VOCAB || !(*converted = malloc(n_tokens * sizeof **converted)))
        return NULL;
    for (uint64_t k = 0; k < n_tokens; k++) (*converted)[k] = (float)((const int32_t *)i->arr.data)[k];
    return *converted;
}

int kiln_tokenizer_load(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err) {
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    *out = NULL;
    s.model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    s.pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    s.name = kiln_gguf_get_str(g, "general.name");
    const kiln_gguf_value *tokens = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    if (!s.model) return kiln_fail(err, "%s: tokenizer.ggml.model missing (no tokenizer in this file)", g->path);
    if (!tokens) return kiln_fail(err, "%s: tokenizer.ggml.tokens missing or not an array of strings", g->path);
    s.n_tokens = (int64_t)tokens->arr.n;
    s.tokens = tokens->arr.data;
    float *converted = NULL;
    s.scores = read_scores(g, tokens->arr.n, &converted);
    const kiln_gguf_value *types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32);
    if (types && types->arr.n >= tokens->arr.n) s.token_types = types->arr.data;
    const kiln_gguf_value *merges = kiln_gguf_get_arr(g, "tokenizer.ggml.merges", KILN_GGUF_STRING);
    if (merges) {
        s.n_merges = (int64_t)merges->arr.n;
        s.merges = merges->arr.data;
    }
    s.bos = get_id(g, "tokenizer.ggml.bos_token_id");
    s.eos = get_id(g, "tokenizer.ggml.eos_token_id");
    s.eot = get_id(g, "tokenizer.ggml.eot_token_id");
    s.eom = get_id(g, "tokenizer.ggml.eom_token_id");
    s.unk = get_id(g, "tokenizer.ggml.unknown_token_id");
    s.pad = get_id(g, "tokenizer.ggml.padding_token_id");
    s.fim_pad = get_id(g, "tokenizer.ggml.fim_pad_token_id");
    s.fim_rep = get_id(g, "tokenizer.ggml.fim_rep_token_id");
    s.fim_sep = get_id(g, "tokenizer.ggml.fim_sep_token_id");
    s.add_bos = get_flag(g, "tokenizer.ggml.add_bos_token");
    s.add_eos = get_flag(g, "tokenizer.ggml.add_eos_token");
    s.add_space_prefix = get_flag(g, "tokenizer.ggml.add_space_prefix");
    int rc = kiln_tokenizer_build(&s, out, err);
    free(converted);
    return rc ? kiln_fail_prefix(err, "%s", g->path) : 0;
}

int kiln_tokenizer_n_vocab(const kiln_tokenizer *t) { return t->n_vocab; }

size_t kiln_tokenizer_max_token_bytes(const kiln_tokenizer *t) {
    size_t m = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tokens[i].bytes_len > m) m = t->tokens[i].bytes_len;
    return m;
}
int32_t kiln_token_bos(const kiln_tokenizer *t) { return t->bos; }
int32_t kiln_token_eos(const kiln_tokenizer *t) { return t->eos; }
int32_t kiln_token_eot(const kiln_tokenizer *t) { return t->eot; }
bool kiln_tokenizer_add_bos(const kiln_tokenizer *t) { return t->add_bos; }
bool kiln_tokenizer_add_eos(const kiln_tokenizer *t) { return t->add_eos; }
const char *kiln_tokenizer_kind(const kiln_tokenizer *t) { return t->kind == KILN_VOCAB_SPM ? "spm" : "bpe"; }
const char *kiln_tokenizer_pre(const kiln_tokenizer *t) { return t->pre_name ? t->pre_name : "default"; }

bool kiln_token_is_eog(const kiln_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->is_eog[id]; }

bool kiln_token_is_control(const kiln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->tokens[id].attr & (KILN_ATTR_CONTROL | KILN_ATTR_UNKNOWN));
}

int32_t kiln_token_by_text(const kiln_tokenizer *t, const char *text) {
    return kiln_strmap_get(&t->by_text, text, strlen(text));
}

const char *kiln_token_piece(const kiln_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return t->arena + t->tokens[id].text_off;
}

const char *kiln_token_bytes(const kiln_tokenizer *t, int32_t id, bool render_special, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    const kiln_token_info *ti = &t->tokens[id];
    if (!render_special && (ti->attr & (KILN_ATTR_CONTROL | KILN_ATTR_UNKNOWN))) {
        *len = 0;
        return t->arena + ti->bytes_off + ti->bytes_len; /* the NUL: an empty string */
    }
    *len = ti->bytes_len;
    return t->arena + ti->bytes_off;
}
