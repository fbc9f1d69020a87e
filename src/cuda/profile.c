/* Per-op timing of eager forward passes with CUDA events: where a decode step's time goes, and how close each
 * weight-reading op gets to the copy bandwidth. */
#include <stdlib.h>

#include "cuda/executor.h"

static const char *const OP_NAMES[KILN_OP_COUNT] = {"embedding", "rmsnorm", "q/k/v", "rope+kv store", "attention",
                                                     "output proj", "gate/up+swiglu", "down proj", "lm head",
                                                     "argmax"};

void kiln_cuda_profile_mark(kiln_cuda_profile *p, kiln_cuda_op op, uint64_t bytes, cudaStream_t stream) {
    if (!p || p->n == KILN_PROFILE_MARKS) return;
    cudaEventRecord(p->ev[p->n], stream);
    p->op[p->n] = op;
    p->bytes[p->n] = bytes;
    p->n++;
}

void kiln_cuda_profile_collect(kiln_cuda_profile *p) {
    if (!p) return;
    for (int i = 0; i + 1 < p->n; i++) {
        float ms = 0;
        if (p->op[i] == KILN_OP_COUNT || cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]) != cudaSuccess) continue;
        p->ms[p->op[i]] += ms;
        p->total_bytes[p->op[i]] += (double)p->bytes[i];
    }
    p->n = 0;
}

void kiln_cuda_profile_add(kiln_cuda_profile *p, kiln_cuda_op op, double ms, uint64_t bytes) {
    if (!p) return;
    p->ms[op] += ms;
    p->total_bytes[op] += (double)bytes;
}

kiln_cuda_profile *kiln_cuda_profile_new(kiln_error *err) {
    kiln_cuda_profile *p = calloc(1, sizeof *p);
    if (!p) {
        kiln_fail(err, "out of memory");
        return NULL;
    }
    for (int i = 0; i < KILN_PROFILE_MARKS; i++) {
        cudaError_t e = cudaEventCreate(&p->ev[i]);
        if (e != cudaSuccess) {
            kiln_fail(err, "CUDA creating profile events: %s", cudaGetErrorString(e));
            kiln_cuda_profile_free(p);
            return NULL;
        }
    }
    return p;
}

void kiln_cuda_profile_free(kiln_cuda_profile *p) {
    if (!p) return;
    for (int i = 0; i < KILN_PROFILE_MARKS; i++)
        if (p->ev[i]) cudaEventDestroy(p->ev[i]);
    free(p);
}

void kiln_cuda_profile_print(kiln_cuda_context *ctx, int n_steps, double copy_bw, FILE *out) {
    kiln_cuda_profile_write(kiln_cuda_context_profile(ctx), n_steps, copy_bw, out);
}

void kiln_cuda_profile_write(const kiln_cuda_profile *p, int n_steps, double copy_bw, FILE *out) {
    if (!p || n_steps < 1) return;
    double total_ms = 0, total_bytes = 0;
    for (int i = 0; i < KILN_OP_COUNT; i++) total_ms += p->ms[i], total_bytes += p->total_bytes[i];
    fprintf(out, "%-16s %10s %8s %10s %9s\n", "op (per step)", "us", "share", "MB", "% copy bw");
    for (int i = 0; i < KILN_OP_COUNT; i++) {
        double us = p->ms[i] * 1e3 / n_steps, mb = p->total_bytes[i] / n_steps / 1e6;
        if (us == 0) continue;
        fprintf(out, "%-16s %10.1f %7.1f%% %10.2f", OP_NAMES[i], us, 100 * p->ms[i] / total_ms, mb);
        if (mb > 0) fprintf(out, " %8.1f%%", 100 * mb * 1e6 / (us * 1e-6) / copy_bw);
        fprintf(out, "\n");
    }
    fprintf(out, "%-16s %10.1f %8s %10.2f %8.1f%%\n", "total", total_ms * 1e3 / n_steps, "",
            total_bytes / n_steps / 1e6, 100 * (total_bytes / n_steps) / (total_ms * 1e-3 / n_steps) / copy_bw);
}
