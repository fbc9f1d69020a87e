/* safetensors header validation (a corpus of broken headers), HF folder translation: names, shapes, the llama q/k
 * permutation, shards, config and tokenizer keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/hf.h"
#include "format/safetensors.h"

/* A whole .safetensors file: u64 header length, the header text, data_len bytes of data (value i at byte i). */
static uint8_t *make_file(const char *header, size_t data_len, size_t *size) {
    size_t hlen = strlen(header);
    *size = 8 + hlen + data_len;
    uint8_t *f = malloc(*size);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(f + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++) f[8 + hlen + i] = (uint8_t)i;
    return f;
}

static void expect_error(const char *header, size_t data_len, const char *needle) {
    size_t size;
    uint8_t *f = make_file(header, data_len, &size);
    kiln_st_entry *e = (kiln_st_entry *)1;
    size_t n = 99;
    kiln_error err = {{0}};
    int rc = kiln_safetensors_parse(f, size, "t.safetensors", &e, &n, &err);
    if (rc != -1 || !strstr(err.msg, needle))
        fail_msg("header %s: rc %d, message '%s', wanted '%s'", header, rc, err.msg, needle);
    assert_null(e);
    assert_int_equal(n, 0);
    free(f);
}

static void test_valid_header(void **state) {
    (void)state;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    size_t size;
    uint8_t *f = make_file(h, 32, &size);
    kiln_st_entry *e;
    size_t n;
    kiln_error err;
    assert_int_equal(kiln_safetensors_parse(f, size, "t", &e, &n, &err), 0);
    assert_int_equal(n, 2);
    int a = strcmp(e[0].name, "a") == 0 ? 0 : 1;
    assert_int_equal(e[a].type, KILN_TYPE_F32);
    assert_int_equal(e[a].n_dims, 2);
    assert_int_equal(e[a].shape[0], 2);
    assert_int_equal(e[a].shape[1], 3);
    assert_int_equal(e[a].begin, 8 + strlen(h));
    assert_int_equal(e[1 - a].type, KILN_TYPE_BF16);
    assert_int_equal(e[1 - a].end, size);
    kiln_st_entries_free(e, n);
    free(f);
}

static void test_broken_headers(void **state) {
    (void)state;
    size_t size;
    kiln_st_entry *e;
    size_t n;
    kiln_error err;
    uint8_t tiny[4] = {0};
    assert_int_equal(kiln_safetensors_parse(tiny, 4, "t", &e, &n, &err), -1);
    assert_non_null(strstr(err.msg, "only 4 bytes"));

    uint8_t *f = make_file("{}", 0, &size);
    f[0] = 0xff; /* header length past the end */
    assert_int_equal(kiln_safetensors_parse(f, size, "t", &e, &n, &err), -1);
    assert_non_null(strstr(err.msg, "header length"));
    memset(f, 0xff, 8); /* and past any sane cap */
    assert_int_equal(kiln_safetensors_parse(f, size, "t", &e, &n, &err), -1);
    assert_non_null(strstr(err.msg, "limit"));
    free(f);

    expect_error("{\"a\":", 0, "header JSON");
    expect_error("[1,2]", 0, "not an object");
    expect_error("{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor a: dtype I64");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, "shape is not an array");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "5 dimensions");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4,
                 "overflows");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the data area");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "not a range");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "pair of integers");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, "overlap");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, "duplicate");
    expect_error("{\"a\":7}", 0, "not an object");
    expect_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype missing");
}

static void test_names(void **state) {
    (void)state;
    char out[128];
    static const char *const pairs[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"},
        {"model.layers.12.self_attn.k_proj.bias", "blk.12.attn_k.bias"},
        {"model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight"},
        {"model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"},
        {"model.layers.7.mlp.gate_proj.weight", "blk.7.ffn_gate.weight"},
        {"model.layers.7.mlp.up_proj.weight", "blk.7.ffn_up.weight"},
        {"model.layers.7.mlp.down_proj.weight", "blk.7.ffn_down.weight"},
        {"model.layers.1.input_layernorm.weight", "blk.1.attn_norm.weight"},
        {"model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        assert_int_equal(kiln_hf_tensor_name(pairs[i][0], out, sizeof out), 1);
        assert_string_equal(out, pairs[i][1]);
    }
    assert_int_equal(kiln_hf_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq", out, sizeof out), 0);
    assert_int_equal(kiln_hf_tensor_name("model.layers.x.mlp.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(kiln_hf_tensor_name("model.layers.-1.mlp.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(kiln_hf_tensor_name("vision_tower.weight", out, sizeof out), -1);
}

static void test_llama3_rope_freqs(void **state) {
    (void)state;
    kiln_meta m;
    kiln_hf_config cfg;
    kiln_error err;
    const char *json = "{\"model_type\":\"llama\",\"hidden_size\":4096,\"num_hidden_layers\":32,"
                       "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"intermediate_size\":14336,"
                       "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,"
                       "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}";
    assert_int_equal(kiln_meta_init(&m, "cfg", &err), 0);
    assert_int_equal(kiln_hf_config_parse(json, strlen(json), "config.json", &cfg, &m, &err), 0);
    assert_true(cfg.llama3_rope);
    assert_string_equal(cfg.arch, "llama");
    float f[64];
    kiln_hf_llama3_rope_freqs(&cfg, f);
    assert_true(f[0] == 1.0f);  /* short wavelengths are untouched */
    assert_true(f[63] == 8.0f); /* long ones divided by the factor */
    for (int i = 1; i < 64; i++) assert_true(f[i] >= f[i - 1]);
    kiln_meta_discard(&m);

    /* transformers 5 spells it as one rope_parameters object holding rope_theta too */
    const char *v5 = "{\"model_type\":\"llama\",\"hidden_size\":4096,\"num_hidden_layers\":32,"
                     "\"num_attention_heads\":32,\"intermediate_size\":14336,\"rope_parameters\":{\"rope_theta\":"
                     "500000.0,\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                     "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}";
    assert_int_equal(kiln_meta_init(&m, "cfg", &err), 0);
    assert_int_equal(kiln_hf_config_parse(v5, strlen(v5), "config.json", &cfg, &m, &err), 0);
    assert_true(cfg.llama3_rope && cfg.rope_base == 500000.0);
    float g[64];
    kiln_hf_llama3_rope_freqs(&cfg, g);
    assert_memory_equal(f, g, sizeof f);
    kiln_meta_discard(&m);
    const char *plain = "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":64,\"rope_parameters\":{\"rope_theta\":1e6}}";
    assert_int_equal(kiln_meta_init(&m, "cfg", &err), 0);
    assert_int_equal(kiln_hf_config_parse(plain, strlen(plain), "config.json", &cfg, &m, &err), 0);
    assert_true(!cfg.llama3_rope && cfg.rope_base == 1e6);
    kiln_meta_discard(&m);
}

/* --- folders ---------------------------------------------------------------------------------------------------- */

static char g_dir[64];

static void put(const char *name, const void *data, size_t len) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void put_text(const char *name, const char *text) { put(name, text, strlen(text)); }

#define N_EMBD 8
#define N_HEAD 2
#define N_KV 1
#define HEAD_DIM 4

static const char *CONFIG =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":16,\"max_position_embeddings\":64,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"vocab_size\":12,\"tie_word_embeddings\":true,"
    "\"bos_token_id\":1,\"eos_token_id\":2}";

/* byte_fallback BPE: SentencePiece-like, scored from the merges */
static const char *TOKENIZER =
    "{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
    "{\"Sequence\":{\"id\":\"A\"}}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\","
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x41>\":3,\"a\":4,\"b\":5,\"ab\":6,\"abb\":7,\"\\u2581\":8},"
    "\"merges\":[\"a b\",[\"ab\",\"b\"]]}}";

static const char *TOKENIZER_CONFIG = "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"</s>\"},"
                                      "\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},"
                                      "{\"name\":\"default\",\"template\":\"{{ messages }}\"}]}";

/* float value of (tensor t, element i): distinct everywhere so permutations show */
static float val(int t, int i) { return (float)(t * 1000 + i); }

typedef struct spec {
    const char *name;
    int rows, cols; /* cols 0: 1-D */
} spec;

static const spec TENSORS[] = {
    {"model.embed_tokens.weight", 12, N_EMBD},
    {"model.norm.weight", N_EMBD, 0},
    {"model.layers.0.input_layernorm.weight", N_EMBD, 0},
    {"model.layers.0.post_attention_layernorm.weight", N_EMBD, 0},
    {"model.layers.0.self_attn.q_proj.weight", N_HEAD * HEAD_DIM, N_EMBD},
    {"model.layers.0.self_attn.k_proj.weight", N_KV * HEAD_DIM, N_EMBD},
    {"model.layers.0.self_attn.v_proj.weight", N_KV * HEAD_DIM, N_EMBD},
    {"model.layers.0.self_attn.o_proj.weight", N_EMBD, N_EMBD},
    {"model.layers.0.mlp.gate_proj.weight", 16, N_EMBD},
    {"model.layers.0.mlp.up_proj.weight", 16, N_EMBD},
    {"model.layers.0.mlp.down_proj.weight", N_EMBD, 16},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])

/* Writes TENSORS[first, last) as F32 into one file. */
static void write_st(const char *file, size_t first, size_t last) {
    char header[4096];
    size_t off = 0, pos = (size_t)snprintf(header, sizeof header, "{");
    for (size_t t = first; t < last; t++) {
        int n = TENSORS[t].rows * (TENSORS[t].cols ? TENSORS[t].cols : 1);
        char shape[32];
        if (TENSORS[t].cols) snprintf(shape, sizeof shape, "[%d,%d]", TENSORS[t].rows, TENSORS[t].cols);
        else snprintf(shape, sizeof shape, "[%d]", TENSORS[t].rows);
        pos += (size_t)snprintf(header + pos, sizeof header - pos, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,"
                                "\"data_offsets\":[%zu,%zu]}", t > first ? "," : "", TENSORS[t].name, shape, off,
                                off + 4 * (size_t)n);
        off += 4 * (size_t)n;
    }
    pos += (size_t)snprintf(header + pos, sizeof header - pos, "}");
    size_t size = 8 + pos + off;
    uint8_t *f = calloc(1, size);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)pos >> (8 * i));
    memcpy(f + 8, header, pos);
    float *d = (float *)(f + 8 + pos); /* header text is not 4-aligned in general: copy value by value */
    size_t k = 0;
    for (size_t t = first; t < last; t++) {
        int n = TENSORS[t].rows * (TENSORS[t].cols ? TENSORS[t].cols : 1);
        for (int i = 0; i < n; i++, k++) {
            float v = val((int)t, i);
            memcpy((uint8_t *)d + 4 * k, &v, 4);
        }
    }
    put(file, f, size);
    free(f);
}

static void write_folder(void) {
    put_text("config.json", CONFIG);
    put_text("tokenizer.json", TOKENIZER);
    put_text("tokenizer_config.json", TOKENIZER_CONFIG);
}

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln_st_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static float f32_at(const kiln_gguf_tensor *t, int64_t i) {
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
    return v;
}

static void check_tensors(const kiln_gguf *g) {
    assert_int_equal(g->version, 0);
    assert_int_equal(g->n_tensors, N_TENSORS);
    const kiln_gguf_tensor *emb = kiln_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->ne[0], N_EMBD);
    assert_int_equal(emb->ne[1], 12);
    assert_int_equal(emb->type, KILN_TYPE_F32);
    assert_true(f32_at(emb, 13) == val(0, 13));
    const kiln_gguf_tensor *norm = kiln_gguf_find_tensor(g, "output_norm.weight");
    assert_int_equal(norm->n_dims, 1);
    assert_int_equal(norm->ne[0], N_EMBD);
    assert_null(kiln_gguf_find_tensor(g, "output.weight")); /* tied */
    const kiln_gguf_tensor *down = kiln_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    assert_int_equal(down->ne[0], 16);
    assert_int_equal(down->ne[1], N_EMBD);
    /* q: GGUF row h*d + 2j + s holds HF row h*d + s*d/2 + j */
    const kiln_gguf_tensor *q = kiln_gguf_find_tensor(g, "blk.0.attn_q.weight");
    for (int h = 0; h < N_HEAD; h++)
        for (int j = 0; j < HEAD_DIM / 2; j++)
            for (int s = 0; s < 2; s++)
                for (int c = 0; c < N_EMBD; c++) {
                    int dst = h * HEAD_DIM + 2 * j + s, src = h * HEAD_DIM + s * HEAD_DIM / 2 + j;
                    assert_true(f32_at(q, dst * N_EMBD + c) == val(4, src * N_EMBD + c));
                }
    const kiln_gguf_tensor *k = kiln_gguf_find_tensor(g, "blk.0.attn_k.weight");
    assert_true(f32_at(k, 1 * N_EMBD) == val(5, 2 * N_EMBD)); /* row 1 = HF row d/2 */
    const kiln_gguf_tensor *v = kiln_gguf_find_tensor(g, "blk.0.attn_v.weight");
    assert_true(f32_at(v, 1 * N_EMBD) == val(6, 1 * N_EMBD)); /* v is not permuted */
}

static void check_metadata(const kiln_gguf *g) {
    int64_t x;
    double f;
    bool b;
    assert_string_equal(kiln_gguf_get_str(g, "general.architecture"), "llama");
    assert_true(kiln_gguf_get_int(g, "llama.embedding_length", &x) && x == N_EMBD);
    assert_true(kiln_gguf_get_int(g, "llama.block_count", &x) && x == 1);
    assert_true(kiln_gguf_get_int(g, "llama.feed_forward_length", &x) && x == 16);
    assert_true(kiln_gguf_get_int(g, "llama.attention.head_count", &x) && x == N_HEAD);
    assert_true(kiln_gguf_get_int(g, "llama.attention.head_count_kv", &x) && x == N_KV);
    assert_true(kiln_gguf_get_int(g, "llama.context_length", &x) && x == 64);
    assert_true(kiln_gguf_get_int(g, "llama.rope.dimension_count", &x) && x == HEAD_DIM);
    assert_true(kiln_gguf_get_int(g, "llama.vocab_size", &x) && x == 12);
    assert_true(kiln_gguf_get_float(g, "llama.rope.freq_base", &f) && f == 10000.0);
    assert_true(kiln_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &f) && fabs(f - 1e-5) < 1e-9);
    assert_true(kiln_gguf_get_int(g, "general.file_type", &x) && x == 0);

    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.ggml.model"), "llama");
    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.ggml.pre"), "default");
    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.chat_template"), "{{ messages }}");
    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    assert_non_null(tok);
    assert_int_equal(tok->arr.n, 12); /* config vocab_size pads the 9 tokens */
    const kiln_str *s = tok->arr.data;
    assert_string_equal(s[6].ptr, "ab");
    assert_string_equal(s[10].ptr, "[PAD10]");
    const int32_t *type = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32)->arr.data;
    assert_int_equal(type[0], 2); /* unk */
    assert_int_equal(type[1], 3); /* control */
    assert_int_equal(type[3], 6); /* byte */
    assert_int_equal(type[4], 1);
    assert_int_equal(type[11], 5); /* padding: unused */
    const float *score = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32)->arr.data;
    assert_true(score[6] == 0.0f && score[7] == -1.0f && score[4] < score[7]);
    assert_null(kiln_gguf_get(g, "tokenizer.ggml.merges"));
    assert_true(kiln_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &x) && x == 1);
    assert_true(kiln_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &x) && x == 2);
    assert_true(kiln_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b);
    assert_true(kiln_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) && b);
}

static void test_folder_single(void **state) {
    (void)state;
    write_folder();
    write_st("model.safetensors", 0, N_TENSORS);
    kiln_gguf *g;
    kiln_error err;
    if (kiln_safetensors_open_dir(g_dir, &g, &err)) fail_msg("%s", err.msg);
    check_tensors(g);
    check_metadata(g);
    kiln_gguf_close(g);
}

static void write_index(const char *missing_name) {
    char text[4096];
    size_t pos = (size_t)snprintf(text, sizeof text, "{\"metadata\":{},\"weight_map\":{");
    for (size_t t = 0; t < N_TENSORS; t++)
        pos += (size_t)snprintf(text + pos, sizeof text - pos, "%s\"%s\":\"%s\"", t ? "," : "", TENSORS[t].name,
                                t < 5 ? "model-00001-of-00002.safetensors"
                                      : missing_name ? missing_name : "model-00002-of-00002.safetensors");
    snprintf(text + pos, sizeof text - pos, "}}");
    put_text("model.safetensors.index.json", text);
}

static void test_folder_shards(void **state) {
    (void)state;
    char cmd[128];
    write_folder();
    write_st("model-00001-of-00002.safetensors", 0, 5);
    write_st("model-00002-of-00002.safetensors", 5, N_TENSORS);
    write_index(NULL);
    kiln_gguf *g;
    kiln_error err;
    if (kiln_safetensors_open_dir(g_dir, &g, &err)) fail_msg("%s", err.msg);
    check_tensors(g);
    kiln_gguf_close(g);

    write_index("model-00003-of-00002.safetensors"); /* a shard that is not there */
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "model-00003-of-00002.safetensors"));
    write_index("../escape.safetensors");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "plain file name"));

    /* q_proj in both shards: the index decides which one counts; without an index entry it is a duplicate */
    write_index(NULL);
    write_st("model-00002-of-00002.safetensors", 4, N_TENSORS);
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), 0);
    kiln_gguf_close(g);
    put_text("model.safetensors.index.json",
             "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
             "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "appears twice"));
    snprintf(cmd, sizeof cmd, "rm -f '%s'/model.safetensors.index.json", g_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "no model.safetensors"));
}

static void test_folder_errors(void **state) {
    (void)state;
    write_folder();
    write_st("model.safetensors", 0, N_TENSORS);
    kiln_gguf *g;
    kiln_error err;
    put_text("config.json", "{\"model_type\":\"gpt_neox\"}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "gpt_neox"));
    put_text("config.json", "{\"model_type\":\"llama\",\"hidden_size\":8}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "num_hidden_layers is missing"));
    put_text("config.json", CONFIG);
    put_text("tokenizer.json", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "Unigram"));
    put_text("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":16000000},\"merges\":[]}}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "model.vocab"));
    put_text("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1000000},\"merges\":[]}}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "far beyond"));
    put_text("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}");
    assert_int_equal(kiln_safetensors_open_dir(g_dir, &g, &err), -1);
    assert_non_null(strstr(err.msg, "merges[0]"));
}

/* A byte-level tokenizer: gpt2 model, merges kept, pre-tokenizer guessed from the regex. */
static void test_gpt2_tokenizer(void **state) {
    (void)state;
    const char *tok =
        "{\"added_tokens\":[{\"id\":3,\"content\":\"<|im_start|>\",\"special\":false}],"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}\"}},"
        "{\"type\":\"ByteLevel\"}]},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"b\"]]}}";
    kiln_hf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.bos_id = cfg.eos_id = -1;
    kiln_meta m;
    kiln_error err;
    assert_int_equal(kiln_meta_init(&m, "tok", &err), 0);
    if (kiln_hf_tokenizer_parse(tok, strlen(tok), NULL, 0, NULL, &cfg, &m, &err)) fail_msg("%s", err.msg);
    kiln_gguf *g = kiln_meta_finish(&m, &err);
    assert_non_null(g);
    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.ggml.model"), "gpt2");
    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.ggml.pre"), "llama-bpe");
    const kiln_gguf_value *mg = kiln_gguf_get_arr(g, "tokenizer.ggml.merges", KILN_GGUF_STRING);
    assert_int_equal(mg->arr.n, 1);
    assert_string_equal(((const kiln_str *)mg->arr.data)[0].ptr, "a b");
    const int32_t *type = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32)->arr.data;
    assert_int_equal(type[3], 3); /* "<|...|>" looks special even when not flagged */
    assert_null(kiln_gguf_get(g, "tokenizer.ggml.scores"));
    assert_null(kiln_gguf_get(g, "tokenizer.ggml.bos_token_id"));
    kiln_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_header),
        cmocka_unit_test(test_broken_headers),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_llama3_rope_freqs),
        cmocka_unit_test(test_gpt2_tokenizer),
        cmocka_unit_test_setup_teardown(test_folder_single, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_folder_shards, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_folder_errors, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
