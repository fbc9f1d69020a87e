/* KILN_GPU_DEBUG=1: every op of a one-token GPU pass is computed again on the CPU, in the plain loops of the
 * reference pass (cpu/forward_ref.c), from the GPU's own inputs to that op; the first op whose output differs by
 * more than its bound is reported with its layer. Starting each op from the GPU's inputs keeps errors from piling
 * up across layers, so the op named is the one that is wrong. The bounds, relative L2 error:
 *   embedding, rmsnorm, rope (q)            1e-5  same F32 arithmetic up to the order of sums
 *   GEMVs (q/k/v, output, gate/up, down, head) 1e-4  int8 products are exact; scales are F16 in both
 *   rope (k, v into the F16 cache)          1e-3  F16 rounding (2^-11)
 *   attention                               1e-4  F16 cache read the same way, F32 softmax
 *   Q8_1 inputs of the GEMVs                3e-2  int8 rounding of each block (half a step of amax/127)
 *   argmax                                  exact
 * The GEMVs of quantized weights are checked on the Q8_1 activations the GPU made (dequantized), so each kernel is
 * judged alone; the quantization itself is checked where it happens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/executor.h"
#include "quant/quant.h"
#include "util/half.h"

struct kiln_cuda_debug {
    const kiln_cuda_model *cm;
    kiln_cuda_debug_view v;
    cudaStream_t stream;
    kiln_cuda_op op; /* the op running since the last mark (KILN_OP_COUNT: none) */
    int layer;
    bool ffn_norm;   /* the running norm is the FFN's (it follows the output projection) */
    int32_t token, pos;
    float *x0, *q0, *k0, *v0;    /* inputs saved at the op's start */
    float *a, *b, *c, *row;      /* scratch: device copies and CPU results, max width each */
    float *kc, *vc;              /* one layer's cache rows 0..pos as F32 */
    uint8_t *qbuf;               /* the device's Q8_1 activations */
    kiln_half tmp[16 * 256];     /* cache rows on their way from the device: 16 positions of one head */
    bool greedy;                 /* the pass ends with the device argmax */
    /* the pass so far */
    bool failed;
    double worst;                /* largest error / bound */
    char worst_what[64];
    int n_checked;
    int n_diverged;              /* passes with a divergence since the context was made */
};

static size_t widest(const kiln_config *cfg) {
    size_t w = (size_t)cfg->n_embd;
    if ((size_t)kiln_config_q_dim(cfg) > w) w = (size_t)kiln_config_q_dim(cfg);
    if ((size_t)cfg->n_ff > w) w = (size_t)cfg->n_ff;
    if ((size_t)cfg->n_vocab > w) w = (size_t)cfg->n_vocab;
    return w;
}

kiln_cuda_debug *kiln_cuda_debug_new(const kiln_cuda_model *cm, const kiln_cuda_debug_view *view,
                                     cudaStream_t stream) {
    const kiln_config *cfg = &cm->cfg;
    kiln_cuda_debug *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->cm = cm, d->v = *view, d->stream = stream, d->op = KILN_OP_COUNT;
    size_t W = widest(cfg), kv = (size_t)kiln_config_kv_dim(cfg) * (size_t)view->n_ctx;
    float **bufs[] = {&d->x0, &d->q0, &d->k0, &d->v0, &d->a, &d->b, &d->c, &d->row};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = malloc(sizeof(float) * W);
    d->kc = malloc(sizeof(float) * kv), d->vc = malloc(sizeof(float) * kv);
    d->qbuf = malloc(W / 32 * 36);
    bool ok = d->kc && d->vc && d->qbuf;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ok = ok && *bufs[i];
    if (!ok) {
        kiln_cuda_debug_free(d);
        return NULL;
    }
    return d;
}

void kiln_cuda_debug_free(kiln_cuda_debug *d) {
    if (!d) return;
    void *bufs[] = {d->x0, d->q0, d->k0, d->v0, d->a, d->b, d->c, d->row, d->kc, d->vc, d->qbuf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(d);
}

static void fetch(void *dst, const void *src, size_t bytes) { cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost); }

static void fetch_f(float *dst, const float *src, size_t n) { fetch(dst, src, sizeof(float) * n); }

/* ||got - want|| / ||want|| (0 when both are zero); NaN anywhere gives infinity. */
static double rel_err(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        num += e * e, den += (double)want[i] * want[i];
    }
    if (isnan(num) || isnan(den)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const char *const OP_NAMES[KILN_OP_COUNT] = {"embedding", "rmsnorm", "q/k/v", "rope+kv store", "attention",
                                                     "output proj", "gate/up+swiglu", "down proj", "lm head",
                                                     "argmax"};

/* Records one comparison; the first over its bound is printed. */
static void judge(kiln_cuda_debug *d, const char *what, double err, double bound) {
    char name[64];
    snprintf(name, sizeof name, "layer %d %s%s%s", d->layer, OP_NAMES[d->op], what[0] ? " " : "", what);
    d->n_checked++;
    if (!(err <= bound)) {
        if (!d->failed)
            fprintf(stderr, "kiln: KILN_GPU_DEBUG pos %d: %s diverges from the CPU: relative error %.2e > bound %.0e\n",
                    d->pos, name, err, bound);
        d->failed = true;
        return;
    }
    if (err / bound > d->worst) d->worst = err / bound, snprintf(d->worst_what, sizeof d->worst_what, "%s", name);
}

/* The Q8_1 activations of n values the GPU left in act_q, dequantized into out. */
static void fetch_q8_1(kiln_cuda_debug *d, int n, float *out) {
    size_t qs = (size_t)n, ds = (size_t)n / 32 * 4;
    fetch(d->qbuf, d->v.act_q, qs + ds);
    const int8_t *q = (const int8_t *)d->qbuf;
    const kiln_half *dh = (const kiln_half *)(d->qbuf + qs);
    for (int i = 0; i < n; i++) out[i] = (float)q[i] * kiln_half_to_float(dh[2 * (i / 32)]);
}

/* Checks the Q8_1 activations against the F32 values they were made from. */
static void judge_q8_1(kiln_cuda_debug *d, const kiln_cuda_matrix *next, const float *from, int n) {
    if (!kiln_cuda_type_uses_q8_1(next->type)) return;
    fetch_q8_1(d, n, d->c);
    judge(d, "(Q8_1 of its output)", rel_err(d->c, from, (size_t)n), 3e-2);
}

/* The input a GEMV over m read: the dequantized Q8_1 activations for quantized weights, else the F32 vector. */
static const float *gemv_input(kiln_cuda_debug *d, const kiln_cuda_matrix *m, const float *dev_f32, int n) {
    if (kiln_cuda_type_uses_q8_1(m->type)) fetch_q8_1(d, n, d->c);
    else fetch_f(d->c, dev_f32, (size_t)n);
    return d->c;
}

static void matvec(kiln_cuda_debug *d, const kiln_weight *w, const float *in, float *out) {
    const kiln_quant_ops *ops = kiln_quant_ops_get(w->type, KILN_ISA_SCALAR);
    for (int64_t r = 0; r < w->ne[1]; r++) {
        ops->dequantize((const char *)w->data + (size_t)r * w->row_bytes, d->row, w->ne[0]);
        float s = 0.0f;
        for (int64_t i = 0; i < w->ne[0]; i++) s += d->row[i] * in[i];
        out[r] = s;
    }
}

static void rmsnorm(const float *x, const float *g, int n, float eps, float *out) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * g[i];
}

static const kiln_weight *layer_w(const kiln_cuda_debug *d, kiln_layer_role r) {
    return &d->cm->host->layers[d->layer].w[r];
}

static void check_norm(kiln_cuda_debug *d) {
    const kiln_config *cfg = &d->cm->cfg;
    bool final = d->layer == cfg->n_layer;
    const kiln_weight *g = final ? &d->cm->host->output_norm : layer_w(d, d->ffn_norm ? KILN_ROLE_FFN_NORM : KILN_ROLE_ATTN_NORM);
    rmsnorm(d->x0, g->data, cfg->n_embd, cfg->rms_eps, d->b);
    fetch_f(d->a, d->v.h, (size_t)cfg->n_embd);
    judge(d, "", rel_err(d->a, d->b, (size_t)cfg->n_embd), 1e-5);
    const kiln_cuda_layer *L = final ? NULL : &d->cm->layers[d->layer];
    judge_q8_1(d, final ? &d->cm->output : d->ffn_norm ? &L->gate : &L->wq, d->a, cfg->n_embd);
}

/* A Q or K vector of n values, the CPU's, put in the device's order (kiln_cuda_qk_source). */
static void qk_to_device_order(kiln_cuda_debug *d, float *v, int n) {
    if (!d->cm->qk_interleaved) return;
    for (int i = 0; i < n; i++) d->row[i] = v[kiln_cuda_qk_source(d->cm, i)];
    memcpy(v, d->row, sizeof(float) * (size_t)n);
}

/* y (device, n) against W in, where in is what the GEMV over m read; qk: W holds Q or K rows. */
static void check_gemv(kiln_cuda_debug *d, const char *what, const kiln_cuda_matrix *m, const kiln_weight *w,
                       const float *dev_in, const float *dev_y, bool qk) {
    const float *in = gemv_input(d, m, dev_in, m->k);
    matvec(d, w, in, d->b);
    if (qk) qk_to_device_order(d, d->b, m->n);
    fetch_f(d->a, dev_y, (size_t)m->n);
    judge(d, what, rel_err(d->a, d->b, (size_t)m->n), 1e-4);
}

/* x += W in: the GPU's increment (x now minus x at the op's start) against W in. */
static void check_residual_gemv(kiln_cuda_debug *d, const kiln_cuda_matrix *m, const kiln_weight *w,
                                const float *dev_in) {
    const float *in = gemv_input(d, m, dev_in, m->k);
    matvec(d, w, in, d->b);
    fetch_f(d->a, d->v.x, (size_t)m->n);
    for (int i = 0; i < m->n; i++) d->a[i] -= d->x0[i];
    judge(d, "", rel_err(d->a, d->b, (size_t)m->n), 1e-4);
}

static void rope(const kiln_config *cfg, float *vec, int n_heads, int pos) {
    int half = cfg->rope_dim / 2;
    bool neox = cfg->rope_style == KILN_ROPE_NEOX;
    for (int h = 0; h < n_heads; h++) {
        float *hv = vec + h * cfg->head_dim;
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * cfg->rope_freq[i], cs = cosf(angle), sn = sinf(angle);
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = hv[a], x1 = hv[b];
            hv[a] = x0 * cs - x1 * sn, hv[b] = x0 * sn + x1 * cs;
        }
    }
}

/* x[i] += bias[i], the bias read in the device's order of x (kiln_cuda_qk_source, for Q and K). */
static void add_bias(const kiln_cuda_debug *d, float *x, const kiln_weight *b, int n, bool qk) {
    if (!b->data) return;
    for (int i = 0; i < n; i++) x[i] += ((const float *)b->data)[qk ? kiln_cuda_qk_source(d->cm, i) : i];
}

/* Cache rows first..first+n of the layer (all KV heads) as F32, [pos][kv_dim]. */
static void fetch_cache(kiln_cuda_debug *d, const void *cache, int first, int n, float *out) {
    const kiln_config *cfg = &d->cm->cfg;
    int hd = cfg->head_dim, kvd = kiln_config_kv_dim(cfg);
    kiln_half *tmp = d->tmp;
    for (int h = 0; h < cfg->n_head_kv; h++) {
        for (int p0 = 0; p0 < n; p0 += 16) {
            int m = n - p0 < 16 ? n - p0 : 16;
            size_t at = (((size_t)d->layer * cfg->n_head_kv + h) * d->v.n_ctx + first + p0) * hd;
            fetch(tmp, (const kiln_half *)cache + at, sizeof(kiln_half) * (size_t)m * hd);
            for (int p = 0; p < m; p++)
                for (int i = 0; i < hd; i++) out[(size_t)(p0 + p) * kvd + h * hd + i] = kiln_half_to_float(tmp[p * hd + i]);
        }
    }
}

static void check_rope(kiln_cuda_debug *d) {
    const kiln_config *cfg = &d->cm->cfg;
    int qd = kiln_config_q_dim(cfg), kvd = kiln_config_kv_dim(cfg);
    add_bias(d, d->q0, layer_w(d, KILN_ROLE_BQ), qd, true);
    add_bias(d, d->k0, layer_w(d, KILN_ROLE_BK), kvd, true);
    add_bias(d, d->v0, layer_w(d, KILN_ROLE_BV), kvd, false);
    rope(cfg, d->q0, cfg->n_head, d->pos);
    rope(cfg, d->k0, cfg->n_head_kv, d->pos);
    float scale = 1.0f / sqrtf((float)cfg->head_dim);
    for (int i = 0; i < qd; i++) d->q0[i] *= scale;
    fetch_f(d->a, d->v.q, (size_t)qd);
    judge(d, "(q)", rel_err(d->a, d->q0, (size_t)qd), 1e-5);
    fetch_cache(d, d->v.k_cache, d->pos, 1, d->a);
    judge(d, "(k in the cache)", rel_err(d->a, d->k0, (size_t)kvd), 1e-3);
    fetch_cache(d, d->v.v_cache, d->pos, 1, d->a);
    judge(d, "(v in the cache)", rel_err(d->a, d->v0, (size_t)kvd), 1e-3);
}

static void check_attention(kiln_cuda_debug *d) {
    const kiln_config *cfg = &d->cm->cfg;
    int qd = kiln_config_q_dim(cfg), kvd = kiln_config_kv_dim(cfg), hd = cfg->head_dim, n = d->pos + 1;
    int group = cfg->n_head / cfg->n_head_kv;
    fetch_cache(d, d->v.k_cache, 0, n, d->kc);
    fetch_cache(d, d->v.v_cache, 0, n, d->vc);
    fetch_f(d->q0, d->v.q, (size_t)qd);
    float *att = malloc(sizeof(float) * (size_t)n);
    if (!att) return;
    for (int h = 0; h < cfg->n_head; h++) {
        const float *q = d->q0 + h * hd;
        int off = (h / group) * hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int t = 0; t < n; t++) {
            float s = 0.0f;
            for (int i = 0; i < hd; i++) s += q[i] * d->kc[(size_t)t * kvd + off + i];
            att[t] = s, mx = s > mx ? s : mx;
        }
        for (int t = 0; t < n; t++) att[t] = expf(att[t] - mx), sum += att[t];
        float *o = d->b + h * hd;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < hd; i++) o[i] += att[t] / sum * d->vc[(size_t)t * kvd + off + i];
    }
    free(att);
    fetch_f(d->a, d->v.attn, (size_t)qd);
    judge(d, "", rel_err(d->a, d->b, (size_t)qd), 1e-4);
    judge_q8_1(d, &d->cm->layers[d->layer].wo, d->a, qd);
}

static void check_gate_up(kiln_cuda_debug *d) {
    const kiln_cuda_layer *L = &d->cm->layers[d->layer];
    const float *in = gemv_input(d, &L->gate, d->v.h, L->gate.k);
    int n = L->gate.n;
    matvec(d, layer_w(d, KILN_ROLE_FFN_GATE), in, d->b);
    float *up = malloc(sizeof(float) * (size_t)n);
    if (!up) return;
    matvec(d, layer_w(d, KILN_ROLE_FFN_UP), in, up);
    for (int i = 0; i < n; i++) d->b[i] = d->b[i] / (1.0f + expf(-d->b[i])) * up[i];
    free(up);
    fetch_f(d->a, d->v.ff, (size_t)n);
    judge(d, "", rel_err(d->a, d->b, (size_t)n), 1e-4);
}

static void check_down(kiln_cuda_debug *d) {
    const kiln_cuda_layer *L = &d->cm->layers[d->layer];
    if (kiln_cuda_type_uses_q8_1(L->down.type)) {
        fetch_f(d->a, d->v.ff, (size_t)L->down.k);
        judge_q8_1(d, &L->down, d->a, L->down.k);
    }
    check_residual_gemv(d, &L->down, layer_w(d, KILN_ROLE_FFN_DOWN), d->v.ff);
}

static void check_argmax(kiln_cuda_debug *d) {
    int n = d->cm->cfg.n_vocab, best = 0;
    int32_t got;
    fetch_f(d->a, d->v.logits, (size_t)n);
    fetch(&got, d->v.d_tokens, sizeof got);
    for (int i = 1; i < n; i++)
        if (d->a[i] > d->a[best]) best = i;
    judge(d, "", got == best ? 0.0 : INFINITY, 0.0);
}

/* The op that just ended, against the CPU. */
static void check_op(kiln_cuda_debug *d) {
    const kiln_cuda_model *cm = d->cm;
    const kiln_cuda_layer *L = d->layer < cm->cfg.n_layer ? &cm->layers[d->layer] : NULL;
    switch (d->op) {
    case KILN_OP_EMBED: {
        const kiln_weight *e = &cm->host->token_embd;
        kiln_quant_ops_get(e->type, KILN_ISA_SCALAR)->dequantize((const char *)e->data + (size_t)d->token * e->row_bytes, d->b, e->ne[0]);
        fetch_f(d->a, d->v.x, (size_t)e->ne[0]);
        judge(d, "", rel_err(d->a, d->b, (size_t)e->ne[0]), 1e-5);
        break;
    }
    case KILN_OP_NORM: check_norm(d); break;
    case KILN_OP_QKV:
        check_gemv(d, "(q)", &L->wq, layer_w(d, KILN_ROLE_WQ), d->v.h, d->v.q, true);
        check_gemv(d, "(k)", &L->wk, layer_w(d, KILN_ROLE_WK), d->v.h, d->v.k, true);
        check_gemv(d, "(v)", &L->wv, layer_w(d, KILN_ROLE_WV), d->v.h, d->v.v, false);
        break;
    case KILN_OP_ROPE: check_rope(d); break;
    case KILN_OP_ATTENTION: check_attention(d); break;
    case KILN_OP_WO: check_residual_gemv(d, &L->wo, layer_w(d, KILN_ROLE_WO), d->v.attn); break;
    case KILN_OP_GATE_UP: check_gate_up(d); break;
    case KILN_OP_DOWN: check_down(d); break;
    case KILN_OP_HEAD: check_gemv(d, "", &cm->output, &cm->host->output, d->v.h, d->v.logits, false); break;
    case KILN_OP_ARGMAX: if (d->greedy) check_argmax(d); break;
    default: break;
    }
}

/* Saves what the op about to run reads and overwrites. */
static void save_inputs(kiln_cuda_debug *d) {
    const kiln_config *cfg = &d->cm->cfg;
    switch (d->op) {
    case KILN_OP_EMBED:
        fetch(&d->token, d->v.d_tokens, sizeof d->token);
        fetch(&d->pos, d->v.d_pos, sizeof d->pos);
        d->failed = false, d->worst = 0, d->n_checked = 0, d->worst_what[0] = '\0';
        break;
    case KILN_OP_NORM: case KILN_OP_WO: case KILN_OP_DOWN: fetch_f(d->x0, d->v.x, (size_t)cfg->n_embd); break;
    case KILN_OP_ROPE:
        fetch_f(d->q0, d->v.q, (size_t)kiln_config_q_dim(cfg));
        fetch_f(d->k0, d->v.k, (size_t)kiln_config_kv_dim(cfg));
        fetch_f(d->v0, d->v.v, (size_t)kiln_config_kv_dim(cfg));
        break;
    default: break;
    }
}

void kiln_cuda_debug_mark(kiln_cuda_debug *d, kiln_cuda_op op, int layer, bool greedy) {
    if (!d) return;
    cudaError_t e = cudaStreamSynchronize(d->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "kiln: KILN_GPU_DEBUG: the GPU failed in layer %d %s: %s\n", d->layer,
                d->op < KILN_OP_COUNT ? OP_NAMES[d->op] : "start", cudaGetErrorString(e));
        return;
    }
    d->greedy = greedy;
    if (d->op != KILN_OP_COUNT) check_op(d);
    if (op == KILN_OP_NORM) d->ffn_norm = d->op == KILN_OP_WO;
    d->op = op, d->layer = layer;
    if (op == KILN_OP_COUNT) {
        d->n_diverged += d->failed;
        if (!d->failed)
            fprintf(stderr, "kiln: KILN_GPU_DEBUG pos %d: %d checks of every op agree with the CPU (closest to its bound: %s at %.2f of it)\n",
                    d->pos, d->n_checked, d->worst_what, d->worst);
        return;
    }
    save_inputs(d);
}

int kiln_cuda_debug_diverged(const kiln_cuda_debug *d) { return d->n_diverged; }
