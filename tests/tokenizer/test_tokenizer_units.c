/* Tokenizer algorithms on small hand-built vocabularies: SPM score order, byte fallback, space prefix, unknown token;
 * BPE merge ranks, byte-level table, ignore_merges; special tokens; end-of-generation; streaming decode; the
 * pre-tokenizer table and split rules; UTF-8 helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

#define MAXTOK 600

/* A vocabulary under construction: pieces with scores and types, and merges. */
typedef struct vocab {
    kiln_str tokens[MAXTOK];
    float scores[MAXTOK];
    int32_t types[MAXTOK];
    char storage[MAXTOK][16];
    kiln_str merges[64];
    int n, n_merges;
} vocab;

static int add(vocab *v, const char *piece, float score, int32_t type) {
    strcpy(v->storage[v->n], piece);
    v->tokens[v->n] = (kiln_str){v->storage[v->n], strlen(piece)};
    v->scores[v->n] = score;
    v->types[v->n] = type;
    return v->n++;
}

static void merge(vocab *v, const char *m) { v->merges[v->n_merges++] = (kiln_str){m, strlen(m)}; }

static kiln_tokenizer *build(vocab *v, kiln_vocab_spec *s, const char *model) {
    kiln_tokenizer *t = NULL;
    kiln_error err = {{0}};
    s->model = model;
    s->n_tokens = v->n;
    s->tokens = v->tokens;
    s->scores = v->scores;
    s->token_types = v->types;
    s->n_merges = v->n_merges;
    s->merges = v->merges;
    if (kiln_tokenizer_build(s, &t, &err)) fail_msg("build: %s", err.msg);
    return t;
}

/* Tokenizes and compares with the expected ids (terminated by -1). */
static void expect(const kiln_tokenizer *t, const char *text, bool add_special, bool parse_special, const int *want) {
    int32_t ids[64];
    kiln_error err = {{0}};
    int n = kiln_tokenize(t, text, strlen(text), add_special, parse_special, ids, 64, &err);
    int wn = 0;
    while (want[wn] >= 0) wn++;
    if (n != wn) fail_msg("'%s': %d ids, want %d (%s)", text, n, wn, err.msg);
    for (int i = 0; i < n; i++)
        if (ids[i] != want[i]) fail_msg("'%s': id %d is %d, want %d", text, i, ids[i], want[i]);
}

#define IDS(...) ((const int[]){__VA_ARGS__, -1})
#define NONE ((const int[]){-1})

/* SPM: <unk> <s> </s>, the 256 byte tokens, then a few pieces */
enum { SPM_A = 259, SPM_B, SPM_C, SPM_AB, SPM_BC, SPM_SP, SPM_SP_A, SPM_ABC };

static kiln_tokenizer *spm_vocab(float ab, float bc, int space_prefix, bool byte_tokens) {
    static vocab v;
    memset(&v, 0, sizeof v);
    add(&v, "<unk>", 0, 2);
    add(&v, "<s>", 0, 3);
    add(&v, "</s>", 0, 3);
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, byte_tokens ? "<0x%02X>" : "<x%02X>", b);
        add(&v, piece, 0, byte_tokens ? 6 : 1);
    }
    add(&v, "a", -5, 1);
    add(&v, "b", -5, 1);
    add(&v, "c", -5, 1);
    add(&v, "ab", ab, 1);
    add(&v, "bc", bc, 1);
    add(&v, "\xE2\x96\x81", -3, 1);
    add(&v, "\xE2\x96\x81" "a", -2, 1);
    add(&v, "\xE2\x96\x81" "abc", -9, 1);
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    s.add_space_prefix = space_prefix;
    return build(&v, &s, "llama");
}

static void test_spm_merges_by_score(void **state) {
    kiln_tokenizer *t = spm_vocab(-1.0f, -0.5f, 0, true);
    expect(t, "abc", false, false, IDS(SPM_A, SPM_BC)); /* bc scores higher than ab */
    kiln_tokenizer_free(t);
    t = spm_vocab(-0.1f, -0.5f, 0, true);
    expect(t, "abc", false, false, IDS(SPM_AB, SPM_C));
    expect(t, "a b", false, false, IDS(SPM_A, SPM_SP, SPM_B)); /* the space is U+2581 */
    kiln_tokenizer_free(t);
}

/* A piece with U+2581 after a letter: merges may cross word starts, so the text is merged as one sequence. */
static void test_spm_piece_across_words(void **state) {
    static vocab v;
    memset(&v, 0, sizeof v);
    add(&v, "<unk>", 0, 2);
    add(&v, "a", -5, 1);
    add(&v, "b", -5, 1);
    add(&v, "\xE2\x96\x81", -5, 1);
    add(&v, "a\xE2\x96\x81", -1, 1);
    add(&v, "\xE2\x96\x81" "b", -2, 1);
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    s.add_space_prefix = 0;
    kiln_tokenizer *t = build(&v, &s, "llama");
    expect(t, "a b", false, false, IDS(4, 2));
    kiln_tokenizer_free(t);
}

static void test_spm_space_prefix_and_bos(void **state) {
    kiln_tokenizer *t = spm_vocab(-1.0f, -0.5f, -1, true); /* absent: SPM's default is on */
    expect(t, "a", false, false, IDS(SPM_SP_A));
    expect(t, "a", true, false, IDS(1, SPM_SP_A)); /* BOS by default for SPM, no EOS */
    expect(t, "", true, false, IDS(1));
    expect(t, "", false, false, NONE);
    /* the prefix also goes in front of text that follows a special token */
    expect(t, "</s>a", false, true, IDS(2, SPM_SP_A));
    assert_true(kiln_token_is_eog(t, 2));
    kiln_tokenizer_free(t);
}

static void test_spm_byte_fallback_and_unknown(void **state) {
    kiln_tokenizer *t = spm_vocab(-1.0f, -0.5f, 0, true);
    expect(t, "\xC3\xA9", false, false, IDS(3 + 0xC3, 3 + 0xA9));
    size_t len;
    const char *p = kiln_token_bytes(t, 3 + 0xC3, false, &len);
    assert_int_equal(len, 1);
    assert_int_equal((uint8_t)p[0], 0xC3);
    p = kiln_token_bytes(t, SPM_SP_A, false, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, " a", 2);
    kiln_token_bytes(t, 1, false, &len);
    assert_int_equal(len, 0);
    p = kiln_token_bytes(t, 1, true, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(p, "<s>", 3);
    assert_string_equal(kiln_token_piece(t, SPM_SP_A), "\xE2\x96\x81" "a");
    kiln_tokenizer_free(t);
    t = spm_vocab(-1.0f, -0.5f, 0, false);
    expect(t, "a\xC3\xA9", false, false, IDS(SPM_A, 0, 0)); /* no byte tokens: each byte is <unk> */
    kiln_tokenizer_free(t);
}

static void test_detok_streams_whole_characters(void **state) {
    kiln_tokenizer *t = spm_vocab(-1.0f, -0.5f, -1, true);
    kiln_detok d;
    char out[64];
    kiln_detok_init(&d);
    assert_int_equal(kiln_detok_push(&d, t, 1, out, sizeof out), 0);        /* BOS prints nothing */
    assert_int_equal(kiln_detok_push(&d, t, SPM_SP_A, out, sizeof out), 1); /* leading space dropped */
    assert_memory_equal(out, "a", 1);
    assert_int_equal(kiln_detok_push(&d, t, SPM_SP_A, out, sizeof out), 2);
    assert_int_equal(kiln_detok_push(&d, t, 3 + 0xE2, out, sizeof out), 0); /* U+20AC split over three tokens */
    assert_int_equal(kiln_detok_push(&d, t, 3 + 0x82, out, sizeof out), 0);
    assert_int_equal(kiln_detok_push(&d, t, 3 + 0xAC, out, sizeof out), 3);
    assert_memory_equal(out, "\xE2\x82\xAC", 3);
    assert_int_equal(kiln_detok_push(&d, t, 3 + 0xF0, out, sizeof out), 0);
    assert_int_equal(kiln_detok_push(&d, t, SPM_A, out, sizeof out), 4); /* a broken start becomes U+FFFD */
    assert_memory_equal(out, "\xEF\xBF\xBD" "a", 4);
    assert_int_equal(kiln_detok_push(&d, t, 3 + 0xC3, out, sizeof out), 0);
    assert_int_equal(kiln_detok_flush(&d, out, sizeof out), 3);
    assert_memory_equal(out, "\xEF\xBF\xBD", 3);
    kiln_tokenizer_free(t);
}

/* BPE: the 256 byte-level characters as ids 0..255, then merged pieces */
static vocab bpe;

static void bpe_add_bytes(void) {
    memset(&bpe, 0, sizeof bpe);
    for (int b = 0; b < 256; b++) {
        char piece[8] = {0};
        kiln_utf8_encode(kiln_byte_to_cp((uint8_t)b), piece);
        add(&bpe, piece, 0, 1);
    }
}

static kiln_tokenizer *bpe_vocab(const char *pre, int add_bos) {
    bpe_add_bytes();
    add(&bpe, "he", 0, 1);                /* 256 */
    add(&bpe, "ll", 0, 1);                /* 257 */
    add(&bpe, "hell", 0, 1);              /* 258 */
    add(&bpe, "hello", 0, 1);             /* 259 */
    add(&bpe, "\xC4\xA0" "w", 0, 1);      /* 260: " w" in byte-level form */
    add(&bpe, "el", 0, 1);                /* 261 */
    add(&bpe, "xyz", 0, 1);               /* 262: no merge makes it */
    add(&bpe, "<|end|>", 0, 3);           /* 263 */
    add(&bpe, "<u>", 0, 4);               /* 264: user-defined */
    add(&bpe, "<|im_end|>", 0, 3);        /* 265 */
    add(&bpe, "ab", 0, 3);                /* 266 */
    add(&bpe, "bcd", 0, 3);               /* 267 */
    merge(&bpe, "h e");
    merge(&bpe, "l l");
    merge(&bpe, "he ll");
    merge(&bpe, "hell o");
    merge(&bpe, "\xC4\xA0 w");
    merge(&bpe, "e l");
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    s.pre = pre;
    s.add_bos = add_bos;
    s.bos = 263;
    return build(&bpe, &s, "gpt2");
}

static void test_bpe_merges_by_rank(void **state) {
    kiln_tokenizer *t = bpe_vocab("gpt-2", -1);
    expect(t, "hello", false, false, IDS(259));
    /* "h e" (rank 0) beats "e l" (rank 5) */
    expect(t, "hel", false, false, IDS(256, 'l'));
    expect(t, "hello world", false, false, IDS(259, 260, 'o', 'r', 'l', 'd'));
    expect(t, "hello", true, false, IDS(259)); /* gpt-2 adds no BOS by default */
    expect(t, "xyz", false, false, IDS('x', 'y', 'z'));
    assert_string_equal(kiln_tokenizer_kind(t), "bpe");
    size_t len;
    const char *p = kiln_token_bytes(t, 260, false, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, " w", 2);
    p = kiln_token_bytes(t, 0x0A, false, &len); /* byte-level "Ċ" is a newline */
    assert_int_equal(len, 1);
    assert_int_equal(p[0], '\n');
    kiln_tokenizer_free(t);
}

static void test_bpe_ignore_merges_and_bos(void **state) {
    kiln_tokenizer *t = bpe_vocab("llama-bpe", -1);
    expect(t, "xyz", false, false, IDS(262)); /* the whole word is a token */
    expect(t, "xyz", true, false, IDS(263, 262)); /* llama3 adds BOS by default */
    kiln_tokenizer_free(t);
    t = bpe_vocab("llama-bpe", 0);
    expect(t, "xyz", true, false, IDS(262)); /* the file's flag wins */
    kiln_tokenizer_free(t);
}

static void test_bpe_unknown_pre_uses_default(void **state) {
    kiln_tokenizer *t = bpe_vocab("no-such-pre", -1); /* prints one warning */
    assert_string_equal(kiln_tokenizer_pre(t), "default");
    expect(t, "hello", false, false, IDS(259));
    kiln_tokenizer_free(t);
}

static void test_special_tokens(void **state) {
    kiln_tokenizer *t = bpe_vocab("gpt-2", -1);
    expect(t, "he<|end|>", false, true, IDS(256, 263));
    expect(t, "he<|end|>", false, false, IDS(256, '<', '|', 'e', 'n', 'd', '|', '>'));
    expect(t, "he<u>he", false, false, IDS(256, 264, 256)); /* user-defined: always */
    /* the longer special token claims its text first, as in llama.cpp */
    expect(t, "abcd", false, true, IDS('a', 267));
    expect(t, "abab", false, true, IDS(266, 266));
    assert_true(kiln_token_is_eog(t, 265)); /* <|im_end|> by its text */
    assert_int_equal(kiln_token_eot(t), 265);
    assert_false(kiln_token_is_eog(t, 256));
    assert_int_equal(kiln_token_by_text(t, "hell"), 258);
    assert_int_equal(kiln_token_by_text(t, "nope"), -1);
    kiln_tokenizer_free(t);
}

/* Phi-3 (by general.name): whitespace after a special token goes with it, except after <s> */
static void test_phi3_special_tokens_eat_whitespace(void **state) {
    static vocab v;
    memset(&v, 0, sizeof v);
    add(&v, "<unk>", 0, 2);
    add(&v, "<s>", 0, 3);
    add(&v, "</s>", 0, 3);
    add(&v, "<|end|>", 0, 3);
    add(&v, "\xE2\x96\x81", -1, 1);
    add(&v, "a", -1, 1);
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    s.name = "Phi-3-mini-4k-instruct";
    s.add_space_prefix = 0;
    kiln_tokenizer *t = build(&v, &s, "llama");
    expect(t, "<|end|> \n a", false, true, IDS(3, 5));
    expect(t, "<s> a", false, true, IDS(1, 4, 5));
    kiln_tokenizer_free(t);
}

static void test_tokenize_reports_needed_size(void **state) {
    kiln_tokenizer *t = bpe_vocab("gpt-2", -1);
    int32_t ids[2] = {-7, -7};
    kiln_error err = {{0}};
    assert_int_equal(kiln_tokenize(t, "xyz", 3, false, false, ids, 1, &err), 3);
    assert_int_equal(ids[0], 'x');
    assert_int_equal(ids[1], -7);
    kiln_tokenizer_free(t);
}

static void test_bad_specs_fail_cleanly(void **state) {
    kiln_vocab_spec s;
    kiln_tokenizer *t = (kiln_tokenizer *)1;
    kiln_error err = {{0}};
    kiln_vocab_spec_init(&s);
    assert_int_equal(kiln_tokenizer_build(&s, &t, &err), -1);
    assert_null(t);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.model"));
    bpe_add_bytes();
    add(&bpe, "a", 0, 1); /* a duplicate of the byte-level "a" */
    s.model = "gpt2";
    s.n_tokens = bpe.n;
    s.tokens = bpe.tokens;
    assert_int_equal(kiln_tokenizer_build(&s, &t, &err), -1);
    assert_non_null(strstr(err.msg, "duplicate"));
    s.model = "t5";
    assert_int_equal(kiln_tokenizer_build(&s, &t, &err), -1);
    assert_non_null(strstr(err.msg, "not supported"));
}

/* Through a real file: the tokenizer.ggml keys are read, integer scores included. */
static void test_load_from_gguf(void **state) {
    char path[] = "/tmp/kiln_tok_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const char *tokens[] = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc"};
    const int32_t scores[] = {0, 0, 0, -9, -9, -9, -5, -1}; /* bc beats ab only if the scores are read */
    const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1};
    kiln_error err = {{0}};
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", tokens, 8);
    kiln_gguf_writer_add_arr(w, "tokenizer.ggml.scores", KILN_GGUF_INT32, scores, 8);
    kiln_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, 8);
    kiln_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kiln_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    kiln_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", true);
    kiln_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
    if (kiln_gguf_writer_open(w, path, &err) || kiln_gguf_writer_close(w, &err)) fail_msg("%s", err.msg);
    kiln_gguf_writer_free(w);
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = NULL;
    if (kiln_gguf_open(path, &g, &err) || kiln_tokenizer_load(g, &t, &err)) fail_msg("%s", err.msg);
    kiln_gguf_close(g); /* the tokenizer keeps its own copy */
    unlink(path);
    expect(t, "abc", true, false, IDS(3, 7, 2)); /* no BOS, no space prefix, EOS added */
    assert_true(kiln_tokenizer_add_eos(t));
    assert_false(kiln_tokenizer_add_bos(t));
    assert_int_equal(kiln_tokenizer_max_token_bytes(t), 5);
    kiln_tokenizer_free(t);
}

static void test_pretok_table_compiles(void **state) {
    size_t n;
    const kiln_pretok *p = kiln_pretok_table(&n);
    assert_true(n >= 30);
    for (size_t i = 0; i < n; i++) {
        kiln_pretok_compiled *c = NULL;
        kiln_error err = {{0}};
        if (kiln_pretok_compile(&p[i], &c, &err)) fail_msg("%s", err.msg);
        kiln_pretok_free(c);
        for (const char *const *name = p[i].names; *name; name++) assert_ptr_equal(kiln_pretok_find(*name), &p[i]);
    }
    const char *known[] = {"gpt-2", "llama3", "llama-bpe", "qwen2", "smollm", "deepseek-llm", "deepseek-coder",
                           "falcon", "starcoder", "refact", "mpt", "command-r", "olmo", "dbrx", "smaug-bpe",
                           "poro-chat", "chatglm-bpe", "viking", "jais", "tekken", "chameleon", "gpt-4o", "default"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) assert_non_null(kiln_pretok_find(known[i]));
    assert_null(kiln_pretok_find("no-such-pre"));
}

/* Splits text with one pre-tokenizer and compares with the words (joined by '|'). */
static void expect_split(const char *pre, const char *text, const char *want) {
    kiln_pretok_compiled *c = NULL;
    kiln_error err = {{0}};
    kiln_span *w = NULL;
    size_t n = 0;
    char got[256] = {0};
    assert_int_equal(kiln_pretok_compile(kiln_pretok_find(pre), &c, &err), 0);
    assert_int_equal(kiln_pretok_split(c, text, strlen(text), &w, &n, &err), 0);
    for (size_t i = 0; i < n; i++) {
        if (i) strcat(got, "|");
        strncat(got, text + w[i].start, w[i].len);
    }
    if (strcmp(got, want)) fail_msg("%s: '%s' splits as '%s', want '%s'", pre, text, got, want);
    free(w);
    kiln_pretok_free(c);
}

static void test_pretok_split(void **state) {
    expect_split("gpt-2", "Hello world's  end 123!", "Hello| world|'s| | end| 123|!");
    expect_split("gpt-2", "a\tb", "a|\t|b"); /* a gap no alternative matches is kept as a word */
    expect_split("llama3", "Hello WORLD'S 12345\n\n x", "Hello| WORLD|'S| |123|45|\n\n| x");
    expect_split("starcoder", "ab 123", "ab| |1|2|3");                  /* digits first, one by one */
    expect_split("superbpe", "x1234567y", "x|1|234|567|y");             /* empty matches split */
    expect_split("afmoe", "x12345 1 123", "x|12|345| |1| |123");         /* leading 1-2 digits, then threes */
    expect_split("deepseek-llm", "ab  \n", "ab|  |\n");                  /* '$' ends a piece */
    expect_split("default", "a,b 1234", "a|,|b| |123|4"); /* each regex splits the pieces of the one before */
}

static void test_utf8_helpers(void **state) {
    uint32_t cp;
    assert_int_equal(kiln_utf8_strict_len("\xE2\x82\xAC", 3, &cp), 3);
    assert_int_equal(cp, 0x20AC);
    assert_int_equal(kiln_utf8_strict_len("\xE2\x82", 2, &cp), KILN_UTF8_INCOMPLETE);
    assert_int_equal(kiln_utf8_strict_len("\xC0\x80", 2, &cp), 0);     /* overlong */
    assert_int_equal(kiln_utf8_strict_len("\xED\xA0\x80", 3, &cp), 0); /* surrogate */
    assert_int_equal(kiln_utf8_strict_len("\xF4\x90\x80\x80", 4, &cp), 0);
    char out[32];
    assert_int_equal(kiln_utf8_sanitize("a\x80" "b\xE2\x82", 5, out), 11);
    assert_memory_equal(out, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD", 11);
    for (int b = 0; b < 256; b++) assert_int_equal(kiln_cp_to_byte(kiln_byte_to_cp((uint8_t)b)), b);
    assert_int_equal(kiln_byte_to_cp(' '), 0x120);
    assert_int_equal(kiln_byte_to_cp('a'), 'a');
    assert_int_equal(kiln_cp_to_byte(0x2581), -1);
    int mapped = 0;
    for (uint32_t c = 0; c < 1000; c++) mapped += kiln_cp_to_byte(c) >= 0;
    assert_int_equal(mapped, 256); /* the table is a bijection onto 256 code points */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_merges_by_score),
        cmocka_unit_test(test_spm_piece_across_words),
        cmocka_unit_test(test_spm_space_prefix_and_bos),
        cmocka_unit_test(test_spm_byte_fallback_and_unknown),
        cmocka_unit_test(test_detok_streams_whole_characters),
        cmocka_unit_test(test_bpe_merges_by_rank),
        cmocka_unit_test(test_bpe_ignore_merges_and_bos),
        cmocka_unit_test(test_bpe_unknown_pre_uses_default),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_phi3_special_tokens_eat_whitespace),
        cmocka_unit_test(test_tokenize_reports_needed_size),
        cmocka_unit_test(test_bad_specs_fail_cleanly),
        cmocka_unit_test(test_load_from_gguf),
        cmocka_unit_test(test_pretok_table_compiles),
        cmocka_unit_test(test_pretok_split),
        cmocka_unit_test(test_utf8_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
