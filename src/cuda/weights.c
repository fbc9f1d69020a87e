/* Uploads a model's weights once, in their file types, into one device allocation. Quantized tensors pass through
 * a staging buffer and are stored field by field (kiln_cuda_repack), the layout the GEMVs read fastest. */
#include <stdlib.h>
#include <string.h>

#include "cuda/executor.h"

#define ARENA_ALIGN 256 /* keeps every tensor aligned for 16-byte vector loads */

static size_t aligned(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static size_t weight_bytes(const kiln_weight *w) { return w->data ? w->row_bytes * (size_t)w->ne[1] : 0; }

/* Walks every tensor in a fixed order; with arena NULL it only sums sizes. */
typedef struct upload {
    uint8_t *arena;
    size_t used;
    void *staging;        /* file-layout bytes of one quantized tensor on their way to the arena */
    size_t staging_bytes; /* while sizing: the largest quantized tensor */
    cudaError_t error;
} upload;

static const void *put(upload *u, const kiln_weight *w) {
    size_t n = weight_bytes(w);
    if (!n) return NULL;
    const void *dst = u->arena ? u->arena + u->used : NULL;
    if (u->arena && u->error == cudaSuccess) u->error = cudaMemcpy(u->arena + u->used, w->data, n, cudaMemcpyHostToDevice);
    u->used += aligned(n);
    return dst;
}

static kiln_cuda_matrix put_matrix(upload *u, const kiln_weight *w) {
    if (!kiln_cuda_type_uses_q8_1(w->type)) {
        kiln_cuda_matrix m = {put(u, w), w->type, (int)w->ne[0], (int)w->ne[1], w->row_bytes};
        return m;
    }
    size_t n = weight_bytes(w);
    kiln_cuda_matrix m = {u->arena ? u->arena + u->used : NULL, w->type, (int)w->ne[0], (int)w->ne[1], w->row_bytes};
    if (n > u->staging_bytes && !u->arena) u->staging_bytes = n;
    if (u->arena && u->error == cudaSuccess) {
        int64_t n_blocks = w->ne[1] * (w->ne[0] / kiln_type_get(w->type)->block_size);
        u->error = cudaMemcpy(u->staging, w->data, n, cudaMemcpyHostToDevice);
        if (u->error == cudaSuccess) kiln_cuda_repack(w->type, u->staging, u->arena + u->used, n_blocks, 0);
        if (u->error == cudaSuccess) u->error = cudaDeviceSynchronize();
    }
    u->used += aligned(n);
    return m;
}

int kiln_cuda_qk_source(const kiln_cuda_model *cm, int e) {
    if (!cm->qk_interleaved) return e;
    int hd = cm->cfg.head_dim, j = e % hd, half = cm->cfg.rope_dim / 2;
    return e - j + (j >= cm->cfg.rope_dim ? j : (j & 1) ? j / 2 + half : j / 2);
}

/* A copy of w (a matrix of Q or K rows, or their bias) with its rows or values in the device's order
 * (kiln_cuda_qk_source), for the upload; NULL data when out of memory. */
static kiln_weight qk_interleaved_copy(const kiln_cuda_model *cm, const kiln_weight *w) {
    kiln_weight c = *w;
    bool vector = w->ne[1] == 1;
    size_t unit = vector ? w->row_bytes / (size_t)w->ne[0] : w->row_bytes;
    int64_t count = vector ? w->ne[0] : w->ne[1];
    uint8_t *out = malloc(unit * (size_t)count);
    c.data = out;
    if (!out) return c;
    for (int64_t e = 0; e < count; e++)
        memcpy(out + unit * (size_t)e, (const uint8_t *)w->data + unit * (size_t)kiln_cuda_qk_source(cm, (int)e), unit);
    return c;
}

/* Q/K rows and biases: in the device's order where cm uploads them interleaved. Sizing passes (no arena) and other
 * tensors go as they are. */
static const void *put_qk(kiln_cuda_model *cm, upload *u, const kiln_weight *w, kiln_cuda_matrix *m) {
    kiln_weight c = *w;
    bool copy = cm->qk_interleaved && u->arena && w->data;
    if (copy) c = qk_interleaved_copy(cm, w);
    if (copy && !c.data) {
        u->error = cudaErrorMemoryAllocation;
        c = *w;
        copy = false;
    }
    const void *at = NULL;
    if (m) *m = put_matrix(u, &c);
    else at = put(u, &c);
    if (copy) free((void *)c.data);
    return at;
}

static int check_matrix(const kiln_weight *w, kiln_error *err) {
    if (!kiln_cuda_type_supported(w->type, (int)w->ne[0]))
        return kiln_fail(err, "%s: type %s with rows of %lld is not supported by the CUDA backend", w->name,
                         kiln_type_name(w->type), (long long)w->ne[0]);
    return 0;
}

static int check_all(const kiln_weights *w, kiln_error *err) {
    static const kiln_layer_role matrices[] = {KILN_ROLE_WQ, KILN_ROLE_WK, KILN_ROLE_WV, KILN_ROLE_WO,
                                               KILN_ROLE_FFN_GATE, KILN_ROLE_FFN_UP, KILN_ROLE_FFN_DOWN};
    if (check_matrix(&w->token_embd, err) || check_matrix(&w->output, err)) return -1;
    if (w->token_embd.ne[0] > KILN_CUDA_NORM_MAX)
        return kiln_fail(err, "n_embd %lld is wider than the CUDA backend's RMSNorm takes (%d)",
                         (long long)w->token_embd.ne[0], KILN_CUDA_NORM_MAX);
    for (int l = 0; l < w->n_layer; l++)
        for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
            if (check_matrix(&w->layers[l].w[matrices[i]], err)) return -1;
    return 0;
}

static void place_all(kiln_cuda_model *cm, const kiln_weights *w, upload *u) {
    cm->token_embd = put_matrix(u, &w->token_embd);
    cm->output = w->tied ? cm->token_embd : put_matrix(u, &w->output);
    cm->output_norm = put(u, &w->output_norm);
    cm->max_matrix_elems = 0;
    for (int l = 0; l < w->n_layer; l++) {
        const kiln_weight *t = w->layers[l].w;
        kiln_cuda_layer *d = &cm->layers[l];
        d->attn_norm = put(u, &t[KILN_ROLE_ATTN_NORM]);
        d->ffn_norm = put(u, &t[KILN_ROLE_FFN_NORM]);
        d->bq = put_qk(cm, u, &t[KILN_ROLE_BQ], NULL);
        d->bk = put_qk(cm, u, &t[KILN_ROLE_BK], NULL);
        d->bv = put(u, &t[KILN_ROLE_BV]);
        put_qk(cm, u, &t[KILN_ROLE_WQ], &d->wq);
        put_qk(cm, u, &t[KILN_ROLE_WK], &d->wk);
        d->wv = put_matrix(u, &t[KILN_ROLE_WV]);
        d->wo = put_matrix(u, &t[KILN_ROLE_WO]);
        d->gate = put_matrix(u, &t[KILN_ROLE_FFN_GATE]);
        d->up = put_matrix(u, &t[KILN_ROLE_FFN_UP]);
        d->down = put_matrix(u, &t[KILN_ROLE_FFN_DOWN]);
        const kiln_cuda_matrix *ms[] = {&d->wq, &d->wk, &d->wv, &d->wo, &d->gate, &d->up, &d->down};
        for (int i = 0; i < 7; i++) {
            size_t e = (size_t)ms[i]->k * ms[i]->n;
            if (e > cm->max_matrix_elems) cm->max_matrix_elems = e;
        }
    }
    kiln_weight freq = {cm->cfg.rope_freq, KILN_TYPE_F32, {cm->cfg.rope_dim / 2, 1}, sizeof(float) * (cm->cfg.rope_dim / 2), "rope_freq"};
    cm->rope_freq = put(u, &freq);
}

int kiln_cuda_model_load(const kiln_config *cfg, const kiln_weights *w, kiln_cuda_model **out, kiln_error *err) {
    *out = NULL;
    char desc[256];
    if (!cfg->arch->gpu)
        return kiln_fail(err, "the CUDA executor does not run %s models yet (the CPU does)", cfg->arch->name);
    if (kiln_cuda_probe(desc, sizeof desc, err) || check_all(w, err)) return -1;
    kiln_cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm || !(cm->layers = calloc((size_t)w->n_layer, sizeof *cm->layers))) {
        free(cm);
        return kiln_fail(err, "out of memory");
    }
    cm->cfg = *cfg;
    /* NeoX pairs as neighbouring dims on the device (executor.h says why) */
    if (cfg->rope_style == KILN_ROPE_NEOX && cfg->head_dim % 2 == 0 && cfg->rope_dim % 2 == 0)
        cm->qk_interleaved = true, cm->cfg.rope_style = KILN_ROPE_NORMAL;
    const char *debug = getenv("KILN_GPU_DEBUG");
    if (debug && strcmp(debug, "0") && debug[0]) cm->host = w;
    upload sizing = {NULL, 0, NULL, 0, cudaSuccess};
    place_all(cm, w, &sizing);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    upload u = {NULL, 0, NULL, 0, cudaSuccess};
    if (cudaMalloc(&cm->arena, sizing.used) != cudaSuccess ||
        (sizing.staging_bytes && cudaMalloc(&u.staging, sizing.staging_bytes) != cudaSuccess)) {
        cudaGetLastError();
        kiln_cuda_model_free(cm);
        return kiln_fail(err, "the weights need %.1f MiB of GPU memory (plus %.1f MiB while loading); %.1f MiB of %.1f MiB are free",
                         sizing.used / 1048576.0, sizing.staging_bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
    }
    cm->arena_bytes = sizing.used;
    u.arena = cm->arena;
    place_all(cm, w, &u);
    cudaFree(u.staging);
    if (u.error != cudaSuccess) {
        kiln_cuda_model_free(cm);
        return kiln_fail(err, "uploading weights: %s", cudaGetErrorString(u.error));
    }
    *out = cm;
    return 0;
}

void kiln_cuda_model_free(kiln_cuda_model *cm) {
    if (!cm) return;
    cudaFree(cm->arena);
    free(cm->layers);
    free(cm);
}

uint64_t kiln_cuda_model_bytes(const kiln_cuda_model *cm) { return cm ? cm->arena_bytes : 0; }
