/* The reference vectors: every case of ../shared/vocab/ggml-vocab-NAME.gguf.inp must give exactly the ids on the
 * matching line of .gguf.out (raw: no BOS, special-token text as plain text), and decoding must give the text back,
 * for those cases and for random valid UTF-8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

static const char *const vocabs[] = {"llama-spm", "gpt-2", "falcon", "starcoder", "deepseek-llm"};
#define SEPARATOR "\n__ggml_vocab_test__\n"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

typedef struct vocab_file {
    kiln_gguf *g;
    kiln_tokenizer *t;
    char *inp, *out;
    size_t inp_len, out_len;
} vocab_file;

static void open_vocab(const char *name, vocab_file *v) {
    const char *shared = getenv("KILN_SHARED_DIR");
    char path[1024];
    kiln_error err = {{0}};
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", shared ? shared : "../shared", name);
    if (kiln_gguf_open(path, &v->g, &err) || kiln_tokenizer_load(v->g, &v->t, &err)) fail_msg("%s", err.msg);
    size_t pl = strlen(path);
    strcpy(path + pl, ".inp");
    v->inp = slurp(path, &v->inp_len);
    strcpy(path + pl, ".out");
    v->out = slurp(path, &v->out_len);
    assert_non_null(v->inp);
    assert_non_null(v->out);
}

static void close_vocab(vocab_file *v) {
    kiln_tokenizer_free(v->t);
    kiln_gguf_close(v->g);
    free(v->inp);
    free(v->out);
}

static int32_t *encode(const kiln_tokenizer *t, const char *text, size_t len, int *n) {
    kiln_error err = {{0}};
    *n = kiln_tokenize(t, text, len, false, false, NULL, 0, &err);
    if (*n < 0) fail_msg("tokenize: %s", err.msg);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    assert_int_equal(kiln_tokenize(t, text, len, false, false, ids, *n, &err), *n);
    return ids;
}

/* Decodes through the streaming detokenizer one token at a time, so characters split across tokens are exercised. */
static char *decode(const kiln_tokenizer *t, const int32_t *ids, int n, size_t *len) {
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    kiln_detok d;
    kiln_detok_init(&d);
    for (int i = 0; i <= n; i++) {
        size_t tl = 0;
        if (i < n) kiln_token_bytes(t, ids[i], true, &tl);
        while (o + tl + 16 > cap) s = realloc(s, cap *= 2);
        o += i < n ? kiln_detok_push(&d, t, ids[i], s + o, cap - o) : kiln_detok_flush(&d, s + o, cap - o);
    }
    *len = o;
    return s;
}

static void check_roundtrip(const kiln_tokenizer *t, const char *name, const char *text, size_t len, const int32_t *ids,
                            int n) {
    size_t dl;
    char *back = decode(t, ids, n, &dl);
    if (dl != len || memcmp(back, text, len))
        fail_msg("%s: decode(encode('%.*s')) = '%.*s'", name, (int)len, text, (int)dl, back);
    free(back);
}

static void check_vectors(const char *name, bool roundtrip) {
    vocab_file v = {0};
    open_vocab(name, &v);
    char *text = v.inp, *line = v.out;
    int cases = 0;
    for (char *sep; (sep = strstr(text, SEPARATOR)); text = sep + strlen(SEPARATOR), cases++) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = 0;
        int n;
        int32_t *ids = encode(v.t, text, (size_t)(sep - text), &n);
        char *p = line;
        for (int i = 0; i < n; i++) {
            char *end;
            long want = strtol(p, &end, 10);
            if (end == p) fail_msg("%s case %d ('%.*s'): %d ids, want fewer", name, cases, (int)(sep - text), text, n);
            if (want != ids[i])
                fail_msg("%s case %d ('%.*s'): id %d is %d, want %ld", name, cases, (int)(sep - text), text, i, ids[i],
                         want);
            p = end;
        }
        while (*p == ' ') p++;
        if (*p) fail_msg("%s case %d ('%.*s'): %d ids, want more", name, cases, (int)(sep - text), text, n);
        if (roundtrip) check_roundtrip(v.t, name, text, (size_t)(sep - text), ids, n);
        free(ids);
        line = eol + 1;
    }
    assert_int_equal(cases, 46);
    close_vocab(&v);
}

static void test_vectors_llama_spm(void **state) { check_vectors("llama-spm", true); }
static void test_vectors_gpt2(void **state) { check_vectors("gpt-2", true); }
static void test_vectors_falcon(void **state) { check_vectors("falcon", true); }
static void test_vectors_starcoder(void **state) { check_vectors("starcoder", true); }
static void test_vectors_deepseek_llm(void **state) { check_vectors("deepseek-llm", true); }

/* xorshift: the same strings every run, so a failure reproduces */
static uint32_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

/* A code point from a mix that exercises spaces, newlines, ASCII, accents, CJK, emoji and rare planes. */
static uint32_t random_cp(uint64_t *s) {
    static const uint32_t ranges[][2] = {{' ', ' '},       {'\n', '\n'},       {'\t', '\r'},     {'!', '~'},
                                         {'a', 'z'},       {'0', '9'},         {0xA0, 0x24F},    {0x370, 0x52F},
                                         {0x3000, 0x30FF}, {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3}, {0x1F300, 0x1F6FF},
                                         {0x10000, 0x1FFFF}, {0xE000, 0xF8FF}, {0x2000, 0x206F}, {0x80, 0x9F}};
    uint32_t r = next_rand(s) % (sizeof ranges / sizeof ranges[0]);
    return ranges[r][0] + next_rand(s) % (ranges[r][1] - ranges[r][0] + 1);
}

/* Whether every byte the random strings can hold has a token of its own (<0xXX>, or its byte-level character): only
 * then is any such text encoded without loss. The strings stay below U+20000, so C0, C1 and F1..FF never occur
 * (starcoder lacks those). Falcon's vocabulary lacks some control bytes and is left out. */
static bool covers_all_bytes(const kiln_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        if (b == 0xC0 || b == 0xC1 || b >= 0xF1) continue;
        char piece[8] = {0};
        if (!strcmp(kiln_tokenizer_kind(t), "spm"))
            snprintf(piece, sizeof piece, "<0x%02X>", b);
        else
            kiln_utf8_encode(kiln_byte_to_cp((uint8_t)b), piece);
        if (kiln_token_by_text(t, piece) < 0) return false;
    }
    return true;
}

static int check_random_roundtrip(const char *name) {
    vocab_file v = {0};
    open_vocab(name, &v);
    if (!covers_all_bytes(v.t)) {
        close_vocab(&v);
        return 0;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char text[64 * 4];
    for (int iter = 0; iter < 300; iter++) {
        size_t len = 0, n_cp = 1 + next_rand(&seed) % 60;
        for (size_t i = 0; i < n_cp; i++) {
            uint32_t cp = random_cp(&seed);
            if (cp == 0x2581) cp = ' '; /* SentencePiece's space stand-in decodes to a space by design */
            len += kiln_utf8_encode(cp, text + len);
        }
        int n;
        int32_t *ids = encode(v.t, text, len, &n);
        check_roundtrip(v.t, name, text, len, ids, n);
        free(ids);
    }
    close_vocab(&v);
    return 1;
}

static void test_random_roundtrip(void **state) {
    int checked = 0;
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) checked += check_random_roundtrip(vocabs[i]);
    assert_int_equal(checked, 4); /* all but falcon */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_llama_spm),   cmocka_unit_test(test_vectors_gpt2),
        cmocka_unit_test(test_vectors_falcon),      cmocka_unit_test(test_vectors_starcoder),
        cmocka_unit_test(test_vectors_deepseek_llm), cmocka_unit_test(test_random_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
