/* The quantize driver: one pass over the input's tensors, each converted in chunks of rows and streamed into the
 * GGUF writer, so neither model has to fit in memory. */
#include "format/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf_writer.h"
#include "quant/quant.h"

#define CHUNK_BYTES (16u << 20)

typedef struct src_tensor {
    const kiln_gguf_tensor *t;
    kiln_dequantize_fn dequantize;
    size_t row_bytes;
} src_tensor;

static void dequantize_row(void *ctx, int64_t row, float *out, int64_t n) {
    const src_tensor *s = ctx;
    s->dequantize((const uint8_t *)s->t->data + (size_t)row * s->row_bytes, out, n);
}

/* Keys the output sets itself (or must not inherit: it is written with the default alignment). */
static bool replaced_key(const char *key) {
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version") ||
           !strcmp(key, "general.alignment") || !strncmp(key, "split.", 6);
}

static void add_metadata(kiln_gguf_writer *w, const kiln_gguf *g, const kiln_quant_preset *p) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!replaced_key(g->kv[i].key.ptr)) kiln_gguf_writer_add_value(w, g->kv[i].key.ptr, &g->kv[i].value);
    kiln_gguf_writer_add_u32(w, "general.quantization_version", 2);
    kiln_gguf_writer_add_u32(w, "general.file_type", p->file_type);
}

static kiln_quant_model_info model_info(const kiln_gguf *g) {
    kiln_quant_model_info info = {0, kiln_gguf_find_tensor(g, "output.weight") != NULL};
    const char *arch = kiln_gguf_get_str(g, "general.architecture");
    char key[128];
    snprintf(key, sizeof key, "%s.block_count", arch ? arch : "llama");
    if (!kiln_gguf_get_int(g, key, &info.n_layer)) info.n_layer = 0;
    return info;
}

static int declare_tensors(kiln_gguf_writer *w, const kiln_gguf *g, const kiln_quant_preset *p, kiln_type *types,
                           kiln_error *err) {
    kiln_quant_model_info info = model_info(g);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        const kiln_quant_ops *ops = kiln_quant_ops_best(t->type);
        if (!ops || !ops->dequantize)
            return kiln_fail(err, "%s: tensor %s has type %s, which kiln cannot decode", g->path, t->name.ptr,
                             kiln_type_name(t->type));
        types[i] = kiln_quant_tensor_type(p, &info, t->name.ptr, t->n_dims, t->ne);
        kiln_gguf_writer_add_tensor(w, t->name.ptr, types[i], t->n_dims, t->ne);
    }
    return 0;
}

static int convert_tensor(kiln_gguf_writer *w, const kiln_gguf_tensor *t, kiln_type type, uint8_t *buf,
                          int n_threads, kiln_error *err) {
    int64_t n = t->ne[0], rows = kiln_tensor_nelements(t) / n;
    if (type == t->type) return kiln_gguf_writer_write(w, t->data, (size_t)t->size, err);
    src_tensor src = {t, kiln_quant_ops_best(t->type)->dequantize, kiln_row_size(t->type, n)};
    size_t out_row = kiln_row_size(type, n);
    int64_t chunk = out_row >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / out_row);
    for (int64_t r = 0; r < rows; r += chunk) {
        int64_t count = rows - r < chunk ? rows - r : chunk;
        if (kiln_quant_rows(type, r, count, n, dequantize_row, &src, buf, n_threads, err) ||
            kiln_gguf_writer_write(w, buf, (size_t)count * out_row, err))
            return kiln_fail_prefix(err, "tensor %s", t->name.ptr);
    }
    return 0;
}

static int write_model(kiln_gguf_writer *w, const kiln_gguf *g, const kiln_type *types, const char *out,
                       const kiln_quantize_params *params, kiln_error *err) {
    if (kiln_gguf_writer_open(w, out, err)) return -1;
    size_t buf_size = CHUNK_BYTES;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        size_t row = kiln_row_size(types[i], g->tensors[i].ne[0]);
        if (row > buf_size) buf_size = row;
    }
    uint8_t *buf = malloc(buf_size);
    if (!buf) return kiln_fail(err, "%s: out of memory", out);
    int n_threads = params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    kiln_progress progress;
    kiln_progress_start(&progress, params->progress);
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors && rc == 0; i++) {
        rc = convert_tensor(w, &g->tensors[i], types[i], buf, n_threads, err);
        kiln_progress_tensor(&progress, i, g->n_tensors, g->tensors[i].name.ptr, types[i],
                             kiln_gguf_writer_tensor_size(w, i));
    }
    free(buf);
    if (rc == 0) rc = kiln_gguf_writer_close(w, err);
    if (rc == 0) kiln_progress_end(&progress);
    return rc;
}

int kiln_quantize_model(const char *in, const char *out, const kiln_quant_preset *preset,
                        const kiln_quantize_params *params, kiln_error *err) {
    kiln_gguf *g;
    if (kiln_model_file_open(in, &g, err)) return -1;
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_type *types = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *types);
    int rc;
    if (!w || !types) {
        rc = kiln_fail(err, "out of memory");
    } else {
        add_metadata(w, g, preset);
        rc = declare_tensors(w, g, preset, types, err);
        if (rc == 0) rc = write_model(w, g, types, out, params, err);
    }
    free(types);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return rc;
}
