/* The quantize side of model conversion: the per-tensor type policy (docs/quantize.md), the threaded row converter
 * (same bytes for any thread count), and kiln_quantize_model end to end on a tiny safetensors folder. */
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
#include "format/quantize.h"
#include "quant/quant.h"

static kiln_type type_of(const char *preset, const char *name, int64_t ne0, int64_t ne1, int64_t n_layer,
                         bool has_output) {
    kiln_quant_model_info info = {n_layer, has_output};
    int64_t ne[4] = {ne0, ne1, 1, 1};
    return kiln_quant_tensor_type(kiln_quant_preset_find(preset), &info, name, ne1 > 1 ? 2 : 1, ne);
}

static void test_policy(void **state) {
    (void)state;
    assert_null(kiln_quant_preset_find("q9_9"));
    assert_int_equal(kiln_quant_preset_find("Q4_K_M")->file_type, 15);
    /* 1-D and non-weight tensors stay F32 whatever the preset */
    assert_int_equal(type_of("q4_k_m", "blk.0.attn_norm.weight", 4096, 1, 32, true), KILN_TYPE_F32);
    assert_int_equal(type_of("f16", "blk.0.attn_q.bias", 4096, 1, 32, true), KILN_TYPE_F32);
    assert_int_equal(type_of("f16", "blk.0.attn_q.weight", 4096, 4096, 32, true), KILN_TYPE_F16);
    /* output: Q6_K, except q8_0; token_embd takes its place when tied */
    assert_int_equal(type_of("q4_0", "output.weight", 4096, 128256, 32, true), KILN_TYPE_Q6_K);
    assert_int_equal(type_of("q8_0", "output.weight", 4096, 128256, 32, true), KILN_TYPE_Q8_0);
    assert_int_equal(type_of("q4_k_m", "token_embd.weight", 4096, 128256, 32, true), KILN_TYPE_Q4_K);
    assert_int_equal(type_of("q4_k_m", "token_embd.weight", 1536, 151936, 28, false), KILN_TYPE_Q6_K);
    /* the _M mix: layers 0-3, 6, 9, ..., 27, 28-31 of 32 */
    int six[32] = {0};
    for (int i = 0; i < 32; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", i);
        six[i] = type_of("q4_k_m", name, 14336, 4096, 32, true) == KILN_TYPE_Q6_K;
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", i);
        assert_int_equal(six[i], type_of("q5_k_m", name, 4096, 1024, 32, true) == KILN_TYPE_Q6_K);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        assert_int_equal(type_of("q4_k_m", name, 4096, 4096, 32, true), KILN_TYPE_Q4_K);
    }
    const int want[32] = {1, 1, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1,
                          0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1};
    assert_memory_equal(six, want, sizeof want);
    assert_int_equal(type_of("q6_k", "blk.5.attn_v.weight", 4096, 1024, 32, true), KILN_TYPE_Q6_K);
    /* fallbacks for rows that are not a multiple of 256 (576: SmolLM2) or of 32 */
    assert_int_equal(type_of("q4_k_m", "blk.4.attn_q.weight", 576, 576, 30, false), KILN_TYPE_Q5_0);
    assert_int_equal(type_of("q5_k", "blk.4.attn_q.weight", 576, 576, 30, false), KILN_TYPE_Q5_1);
    assert_int_equal(type_of("q2_k", "blk.4.attn_q.weight", 576, 576, 30, false), KILN_TYPE_Q4_0);
    assert_int_equal(type_of("q4_k_m", "blk.0.attn_v.weight", 576, 192, 30, false), KILN_TYPE_Q8_0);
    assert_int_equal(type_of("q4_1", "token_embd.weight", 576, 49152, 30, false), KILN_TYPE_Q8_0);
    assert_int_equal(type_of("q4_0", "blk.0.attn_q.weight", 100, 100, 30, false), KILN_TYPE_F16);
}

static void ramp_row(void *ctx, int64_t row, float *out, int64_t n) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = sinf((float)(row * n + i) * 0.37f);
}

static void test_rows_threads(void **state) {
    (void)state;
    const int64_t rows = 37, n = 512;
    size_t row_bytes = kiln_row_size(KILN_TYPE_Q4_K, n);
    uint8_t *a = malloc(rows * row_bytes), *b = malloc(rows * row_bytes);
    kiln_error err;
    assert_int_equal(kiln_quant_rows(KILN_TYPE_Q4_K, 5, rows, n, ramp_row, NULL, a, 1, &err), 0);
    assert_int_equal(kiln_quant_rows(KILN_TYPE_Q4_K, 5, rows, n, ramp_row, NULL, b, 7, &err), 0);
    assert_memory_equal(a, b, rows * row_bytes);
    /* the rows are the ones asked for: row 5 + r */
    float back[512], want[512];
    kiln_quant_ops_best(KILN_TYPE_Q4_K)->dequantize(a + 3 * row_bytes, back, n);
    ramp_row(NULL, 8, want, n);
    for (int i = 0; i < n; i++) assert_true(fabsf(back[i] - want[i]) < 0.1f);
    free(a);
    free(b);
}

/* a tiny llama folder: one layer, 64 wide, F32 */
static char g_dir[64];

static void put(const char *name, const void *data, size_t len) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static const char *const NAMES[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                    "model.layers.0.mlp.down_proj.weight"};
static const int ROWS[] = {16, 64, 16, 64};
static const int COLS[] = {64, 0, 64, 64};

static void write_tiny(void) {
    const char *cfg = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                      "\"intermediate_size\":64,\"vocab_size\":16}";
    const char *tok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}";
    put("config.json", cfg, strlen(cfg));
    put("tokenizer.json", tok, strlen(tok));
    char header[1024];
    size_t pos = 0, off = 0;
    pos += (size_t)snprintf(header, sizeof header, "{");
    for (int t = 0; t < 4; t++) {
        size_t bytes = 4u * (size_t)ROWS[t] * (size_t)(COLS[t] ? COLS[t] : 1);
        char shape[32];
        if (COLS[t]) snprintf(shape, sizeof shape, "[%d,%d]", ROWS[t], COLS[t]);
        else snprintf(shape, sizeof shape, "[%d]", ROWS[t]);
        pos += (size_t)snprintf(header + pos, sizeof header - pos,
                                "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}", t ? "," : "",
                                NAMES[t], shape, off, off + bytes);
        off += bytes;
    }
    pos += (size_t)snprintf(header + pos, sizeof header - pos, "}");
    size_t size = 8 + pos + off;
    uint8_t *f = calloc(1, size);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)pos >> (8 * i));
    memcpy(f + 8, header, pos);
    for (size_t i = 0; i < off / 4; i++) {
        float v = sinf((float)i);
        memcpy(f + 8 + pos + 4 * i, &v, 4);
    }
    put("model.safetensors", f, size);
    free(f);
}

static void test_quantize_folder(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln_stq_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    write_tiny();
    char out[128];
    snprintf(out, sizeof out, "%s/out.gguf", g_dir);
    kiln_quantize_params params = {2, false};
    kiln_error err;
    if (kiln_quantize_model(g_dir, out, kiln_quant_preset_find("q8_0"), &params, &err)) fail_msg("%s", err.msg);
    kiln_gguf *g;
    if (kiln_gguf_open(out, &g, &err)) fail_msg("%s", err.msg);
    int64_t ft;
    assert_true(kiln_gguf_get_int(g, "general.file_type", &ft) && ft == 7);
    assert_string_equal(kiln_gguf_get_str(g, "tokenizer.ggml.model"), "gpt2");
    const kiln_gguf_tensor *down = kiln_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    assert_int_equal(down->type, KILN_TYPE_Q8_0);
    assert_int_equal(kiln_gguf_find_tensor(g, "output_norm.weight")->type, KILN_TYPE_F32);
    assert_int_equal(kiln_gguf_find_tensor(g, "output.weight")->type, KILN_TYPE_Q8_0);
    float row[64];
    kiln_quant_ops_best(KILN_TYPE_Q8_0)->dequantize((const uint8_t *)down->data + kiln_row_size(KILN_TYPE_Q8_0, 64),
                                                    row, 64);
    size_t first = 16 * 64 + 64 + 16 * 64; /* elements before down_proj in the file */
    for (int i = 0; i < 64; i++) assert_true(fabsf(row[i] - sinf((float)(first + 64 + (size_t)i))) < 0.01f);
    kiln_gguf_close(g);

    assert_int_equal(kiln_quantize_model("/nonexistent/model.gguf", out, kiln_quant_preset_find("q8_0"), &params,
                                         &err), -1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_rows_threads),
        cmocka_unit_test(test_quantize_folder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
