/* Quant kernel throughput: for every type with ops and every ISA this CPU runs, dequantize and vec_dot speed in GB/s
 * of quantized weights read, next to the machine's memory bandwidth measured in the same run. The weights are a
 * matrix far larger than the caches, walked row by row as a matrix-vector product would: dequantize writes each row
 * into one small float buffer, vec_dot takes each row with one activation vector. Quantize speed is of a row of
 * F32 in cache (GB/s of floats read), as when activations are quantized for vec_dot.
 * Usage: bench_quant [MiB of weights per type, default 64] [type names to limit the run to, e.g. q4_0 q8_0] */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"

#define ROW 4096
#define MIN_SECONDS 0.3
#define QUANTIZE_REPEATS 16

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float float_sink;
static volatile uint64_t int_sink;

static void fill_random(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)seed >> 8) / 8388608.0f;
    }
}

typedef void (*pass_fn)(void *ctx);

/* Runs passes for MIN_SECONDS (after one warm-up pass) and returns the bytes per second of the fastest: on a
 * machine shared with other work the fastest pass is the one least disturbed. */
static double measure(pass_fn pass, void *ctx, size_t bytes_per_pass) {
    pass(ctx);
    double start = now(), best = 1e30, t = start;
    do {
        double before = t;
        pass(ctx);
        t = now();
        if (t - before < best) best = t - before;
    } while (t - start < MIN_SECONDS);
    return (double)bytes_per_pass / best;
}

typedef struct memory_ctx {
    uint64_t *src, *dst;
    size_t bytes;
} memory_ctx;

static void memcpy_pass(void *p) {
    memory_ctx *m = p;
    memcpy(m->dst, m->src, m->bytes);
    int_sink = m->dst[m->bytes / 16];
}

/* Eight independent sums, so the adds keep up with memory even in plain SSE2 code. */
static void read_pass(void *p) {
    memory_ctx *m = p;
    uint64_t sum[8] = {0};
    for (size_t i = 0; i + 8 <= m->bytes / sizeof(uint64_t); i += 8)
        for (int k = 0; k < 8; k++) sum[k] += m->src[i + k];
    int_sink = sum[0] + sum[1] + sum[2] + sum[3] + sum[4] + sum[5] + sum[6] + sum[7];
}

typedef struct kernel_ctx {
    const kiln_quant_ops *ops;
    const uint8_t *weights;
    size_t row_bytes;
    int64_t rows;
    float *row_out;
    const void *activations;
    const float *source_row;
    uint8_t *row_scratch;
} kernel_ctx;

static void dequantize_pass(void *p) {
    kernel_ctx *k = p;
    for (int64_t r = 0; r < k->rows; r++) k->ops->dequantize(k->weights + r * k->row_bytes, k->row_out, ROW);
    float_sink = k->row_out[ROW / 2];
}

/* Quantizing works on activations, which sit in cache: one row, many times. */
static void quantize_pass(void *p) {
    kernel_ctx *k = p;
    for (int r = 0; r < QUANTIZE_REPEATS; r++) k->ops->quantize(k->source_row, k->row_scratch, ROW);
    int_sink = k->row_scratch[0];
}

static void vec_dot_pass(void *p) {
    kernel_ctx *k = p;
    float sum = 0.0f;
    for (int64_t r = 0; r < k->rows; r++) sum += k->ops->vec_dot(ROW, k->weights + r * k->row_bytes, k->activations);
    float_sink = sum;
}

static void bench_memory(size_t bytes) {
    memory_ctx m = {malloc(bytes), malloc(bytes), bytes};
    memset(m.src, 1, bytes);
    memset(m.dst, 0, bytes);
    double copy = measure(memcpy_pass, &m, bytes), read = measure(read_pass, &m, bytes);
    printf("memory: memcpy %.1f GB/s (bytes copied), read %.1f GB/s (summing 64-bit words)\n\n", copy / 1e9,
           read / 1e9);
    free(m.src);
    free(m.dst);
}

/* Quantized activations for a type's vec_dot, or NULL when the type has no vec_dot or its partner cannot quantize. */
static void *make_activations(const kiln_quant_ops *ops, const float *x) {
    const kiln_quant_ops *act = kiln_quant_ops_best(ops->vec_dot_type);
    if (!ops->vec_dot || !act || !act->quantize) return NULL;
    void *y = aligned_alloc(64, kiln_row_size(ops->vec_dot_type, ROW));
    act->quantize(x, y, ROW);
    return y;
}

static void bench_type(kiln_type type, size_t weight_bytes, const float *source_row, float *row_out) {
    const kiln_quant_ops *scalar = kiln_quant_ops_get(type, KILN_ISA_SCALAR);
    size_t row_bytes = kiln_row_size(type, ROW);
    int64_t rows = (int64_t)(weight_bytes / row_bytes);
    /* GGUF aligns tensor data to 32 bytes, so the weights start half way into a cache line as they may in a model */
    uint8_t *allocation = aligned_alloc(64, (size_t)rows * row_bytes + 64), *weights = allocation + 32;
    /* every row is the same quantized row: reference quantizers are too slow to fill the matrix one by one */
    scalar->quantize(source_row, weights, ROW);
    for (int64_t r = 1; r < rows; r++) memcpy(weights + r * row_bytes, weights, row_bytes);
    uint8_t *scratch = malloc(row_bytes);
    for (int isa = KILN_ISA_SCALAR; isa <= (int)kiln_cpu_isa(); isa++) {
        const kiln_quant_ops *ops = kiln_quant_ops_get(type, (kiln_isa)isa);
        kernel_ctx k = {ops, weights, row_bytes, rows, row_out, make_activations(ops, source_row), source_row, scratch};
        size_t bytes = (size_t)rows * row_bytes;
        double dequantize = measure(dequantize_pass, &k, bytes);
        printf("%-6s %-7s %12.2f", kiln_type_name(type), kiln_isa_name((kiln_isa)isa), dequantize / 1e9);
        if (k.activations)
            printf(" %12.2f", measure(vec_dot_pass, &k, bytes) / 1e9);
        else
            printf(" %12s", "-");
        printf(" %12.2f\n", measure(quantize_pass, &k, QUANTIZE_REPEATS * ROW * sizeof(float)) / 1e9);
        free((void *)k.activations);
    }
    free(allocation);
    free(scratch);
}

static bool selected(kiln_type type, int n_names, char **names) {
    for (int i = 0; i < n_names; i++)
        if (kiln_type_from_name(names[i]) == (int)type) return true;
    return n_names <= 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 64;
    if (mib == 0) mib = 64;
    size_t weight_bytes = mib << 20;
    float *source_row = malloc(ROW * sizeof(float)), *row_out = malloc(ROW * sizeof(float));
    fill_random(source_row, ROW, 42);
    printf("bench_quant: %zu MiB of weights per type, rows of %d, one thread; best ISA %s%s\n", mib, ROW,
           kiln_isa_name(kiln_cpu_isa()),
           kiln_quant_level_supported(KILN_LEVEL_AVX512_VNNI) ? " (VNNI dot products)" : "");
    bench_memory(weight_bytes);
    printf("%-6s %-7s %12s %12s %12s\n", "type", "isa", "dequant GB/s", "vec_dot GB/s", "quant GB/s");
    for (int t = 0; t < KILN_TYPE_COUNT; t++) {
        const kiln_quant_ops *ops = kiln_quant_ops_get((kiln_type)t, KILN_ISA_SCALAR);
        if (ops && ops->dequantize && ops->quantize && ROW % kiln_type_get((uint32_t)t)->block_size == 0 &&
            selected((kiln_type)t, argc - 2, argv + 2))
            bench_type((kiln_type)t, weight_bytes, source_row, row_out);
    }
    free(source_row);
    free(row_out);
    return 0;
}
