/* k-quants with AVX2: dequantize (bit-exact with kquant.c: the same multiply then subtract, never fused) and the
 * dot product with Q8_K activations (the quantizers are in kquant_quantize_avx2.c). The dot products unpack 32
 * weights to bytes, multiply them with the activations by vpmaddubsw (unsigned weights x signed activations, pairs
 * summed to 16 bits: no overflow, as every weight is at most 63 and every activation at most 127 in magnitude),
 * apply the sub-block scales by vpmaddwd, and keep the integer block sum exact; the min and bias terms go through
 * the activations' bsums. */
#include <immintrin.h>

#include "quant/kquant.h"
#include "quant/kquant_simd.h"
#include "quant/quant.h"

/* Bit-exactness with the references needs every multiply and add rounded on its own: GCC in ISO C mode never fuses
 * them, clang would (its default contracts even across intrinsics). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* F16C conversion: exact like kiln_half_to_float, without its branches */
static inline float half_to_float(kiln_half h) { return _cvtsh_ss(h); }

/* 8 unsigned / signed bytes (low half of v) -> floats, times dl, minus ml */
static inline void store8_affine(float *dst, __m128i v, __m256 dl, __m256 ml) {
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    _mm256_storeu_ps(dst, _mm256_sub_ps(_mm256_mul_ps(dl, f), ml));
}

static inline void store8_signed(float *dst, __m128i v, __m256 dl) {
    _mm256_storeu_ps(dst, _mm256_mul_ps(dl, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
}

/* 16 unsigned bytes -> 16 floats of one sub-block */
static inline void store16_affine(float *dst, __m128i v, float dl, float ml) {
    const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
    store8_affine(dst, v, d, m);
    store8_affine(dst + 8, _mm_srli_si128(v, 8), d, m);
}

static inline void store16_signed(float *dst, __m128i v, float dl) {
    const __m256 d = _mm256_set1_ps(dl);
    store8_signed(dst, v, d);
    store8_signed(dst + 8, _mm_srli_si128(v, 8), d);
}

/* 32 unsigned bytes -> 32 floats of one 32-weight sub-block */
static inline void store32_affine(float *dst, __m256i v, float dl, float ml) {
    store16_affine(dst, _mm256_castsi256_si128(v), dl, ml);
    store16_affine(dst + 16, _mm256_extracti128_si256(v, 1), dl, ml);
}

static inline __m256i srl16(__m256i v, int count) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(count)); }

static void dequantize_row_q2_K(const void *src, float *dst, int64_t n) {
    const block_q2_K *x = src;
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        const uint8_t *sc = x[i].scales;
        for (int half = 0; half < QK_K / 128; half++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * half));
            for (int k = 0; k < 4; k++, sc += 2, dst += 32) {
                const __m256i v = _mm256_and_si256(srl16(q, 2 * k), m3);
                store16_affine(dst, _mm256_castsi256_si128(v), d * (float)(sc[0] & 0xF), dmin * (float)(sc[0] >> 4));
                store16_affine(dst + 16, _mm256_extracti128_si256(v, 1), d * (float)(sc[1] & 0xF),
                               dmin * (float)(sc[1] >> 4));
            }
        }
    }
}

/* Q3_K weights of group k (0..7, 32 weights each) as bytes 0..7: low 2 bits plus 4 * the hmask bit. The decoded
 * weight is that minus 4. */
static inline __m256i q3_group(__m256i q, __m256i hm, int k) {
    const __m256i lo = _mm256_and_si256(srl16(q, 2 * (k % 4)), _mm256_set1_epi8(3));
    const __m256i hi = _mm256_and_si256(srl16(hm, k), _mm256_set1_epi8(1));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
}

static void dequantize_row_q3_K(const void *src, float *dst, int64_t n) {
    const block_q3_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d);
        int8_t sc[16];
        kquant_unpack_q3_scales(x[i].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int k = 0; k < 8; k++, dst += 32) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * (k / 4)));
            const __m256i v = _mm256_sub_epi8(q3_group(q, hm, k), _mm256_set1_epi8(4));
            store16_signed(dst, _mm256_castsi256_si128(v), d * (float)sc[2 * k]);
            store16_signed(dst + 16, _mm256_extracti128_si256(v, 1), d * (float)sc[2 * k + 1]);
        }
    }
}

static void dequantize_row_q4_K(const void *src, float *dst, int64_t n) {
    const block_q4_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        uint8_t sm[16]; /* 8 scales, then 8 mins */
        _mm_storeu_si128((__m128i *)sm, kquant_k4_scales_mins(x[i].scales));
        for (int j = 0; j < QK_K / 64; j++, dst += 64) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            store32_affine(dst, _mm256_and_si256(q, m4), d * (float)sm[2 * j], dmin * (float)sm[8 + 2 * j]);
            store32_affine(dst + 32, _mm256_and_si256(srl16(q, 4), m4), d * (float)sm[2 * j + 1],
                           dmin * (float)sm[8 + 2 * j + 1]);
        }
    }
}

/* Q5_K weights of sub-block pair j as bytes 0..31: (low nibbles, high nibbles) plus the qh bits 2j and 2j+1 */
static inline void q5_pair(const uint8_t *qs, __m256i qh, int j, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m1 = _mm256_set1_epi8(1);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(srl16(qh, 2 * j), m1), 4));
    *hi = _mm256_or_si256(_mm256_and_si256(srl16(q, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(srl16(qh, 2 * j + 1), m1), 4));
}

static void dequantize_row_q5_K(const void *src, float *dst, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        uint8_t sm[16]; /* 8 scales, then 8 mins */
        _mm_storeu_si128((__m128i *)sm, kquant_k4_scales_mins(x[i].scales));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        for (int j = 0; j < QK_K / 64; j++, dst += 64) {
            __m256i lo, hi;
            q5_pair(x[i].qs, qh, j, &lo, &hi);
            store32_affine(dst, lo, d * (float)sm[2 * j], dmin * (float)sm[8 + 2 * j]);
            store32_affine(dst + 32, hi, d * (float)sm[2 * j + 1], dmin * (float)sm[8 + 2 * j + 1]);
        }
    }
}

/* Q6_K weights of one 128-weight chunk as 4 vectors of bytes 0..63 (unbiased: the decoded weight is that - 32) */
static inline void q6_chunk(const uint8_t *ql, const uint8_t *qh, __m256i g[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    g[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
    g[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(srl16(h, 2), m3), 4));
    g[2] = _mm256_or_si256(_mm256_and_si256(srl16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(srl16(h, 4), m3), 4));
    g[3] = _mm256_or_si256(_mm256_and_si256(srl16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(srl16(h, 6), m3), 4));
}

static void dequantize_row_q6_K(const void *src, float *dst, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d);
        for (int c = 0; c < QK_K / 128; c++) {
            __m256i g[4];
            q6_chunk(x[i].ql + 64 * c, x[i].qh + 32 * c, g);
            const int8_t *sc = x[i].scales + 8 * c;
            for (int k = 0; k < 4; k++, dst += 32) {
                const __m256i v = _mm256_sub_epi8(g[k], _mm256_set1_epi8(32));
                store16_signed(dst, _mm256_castsi256_si128(v), d * (float)sc[2 * k]);
                store16_signed(dst + 16, _mm256_extracti128_si256(v, 1), d * (float)sc[2 * k + 1]);
            }
        }
    }
}

static void dequantize_row_q8_K(const void *src, float *dst, int64_t n) {
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256 d = _mm256_set1_ps(x[i].d);
        for (int l = 0; l < QK_K; l += 8, dst += 8) {
            int64_t v;
            memcpy(&v, x[i].qs + l, sizeof v);
            store8_signed(dst, _mm_cvtsi64_si128(v), d);
        }
    }
}

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 scale bytes as 16-bit words, in two vectors (scales 0-7, 8-15), each holding its 8 words in both lanes so that
 * one in-lane byte shuffle picks a scale for each lane. */
typedef struct scale_words {
    __m256i half[2];
} scale_words;

static inline scale_words widen_scales(__m128i bytes, int is_signed) {
    const __m128i hi_bytes = _mm_srli_si128(bytes, 8);
    const __m128i lo = is_signed ? _mm_cvtepi8_epi16(bytes) : _mm_cvtepu8_epi16(bytes);
    const __m128i hi = is_signed ? _mm_cvtepi8_epi16(hi_bytes) : _mm_cvtepu8_epi16(hi_bytes);
    return (scale_words){{_mm256_broadcastsi128_si256(lo), _mm256_broadcastsi128_si256(hi)}};
}

/* 16-bit lanes 0-7 = scale a, 8-15 = scale b; a and b in the same half (a / 8 == b / 8) */
static inline __m256i scale_pair(const scale_words *w, int a, int b) {
    const short pick_a = (short)(0x0100 * (2 * (a % 8) + 1) + 2 * (a % 8));
    const short pick_b = (short)(0x0100 * (2 * (b % 8) + 1) + 2 * (b % 8));
    return _mm256_shuffle_epi8(w->half[a / 8], _mm256_set_m128i(_mm_set1_epi16(pick_b), _mm_set1_epi16(pick_a)));
}

/* 32 weight bytes (0..63) times 32 activations, each 16-bit pair of products times its lane's scale */
static inline __m256i dot32(__m256i q, const int8_t *q8, __m256i scales) {
    const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)q8));
    return _mm256_madd_epi16(p, scales);
}

/* sum_j scales16[j] * bsums[j] over the 16 sub-blocks, as 8 int32 partial sums */
static inline __m256i bsum_dot(__m128i scales16_bytes, const int16_t *bsums, int is_signed) {
    const __m256i s = is_signed ? _mm256_cvtepi8_epi16(scales16_bytes) : _mm256_cvtepu8_epi16(scales16_bytes);
    return _mm256_madd_epi16(s, _mm256_loadu_si256((const __m256i *)bsums));
}

static float vec_dot_q2_K(int64_t n, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    /* the min terms accumulate apart, which halves the loop-carried dependency chain */
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = bsum_dot(_mm_and_si128(_mm_srli_epi16(sc, 4), m4), y[i].bsums, 0);
        const scale_words w = widen_scales(_mm_and_si128(sc, m4), 0);
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < QK_K / 128; half++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * half));
            for (int k = 0; k < 4; k++, q8 += 32) {
                const int s = 8 * half + 2 * k;
                const __m256i v = _mm256_and_si256(srl16(q, 2 * k), m3);
                sumi = _mm256_add_epi32(sumi, dot32(v, q8, scale_pair(&w, s, s + 1)));
            }
        }
        const float dall = y[i].d * half_to_float(x[i].d);
        const float dmin = y[i].d * half_to_float(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins), acc_m);
    }
    return hsum_ps(_mm256_sub_ps(acc, acc_m));
}

static float vec_dot_q3_K(int64_t n, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_sub_epi8(kquant_q3_scales(x[i].scales), _mm_set1_epi8(32));
        const scale_words w = widen_scales(sc, 1);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        const int8_t *q8 = y[i].qs;
        /* weights are stored as (0..7) - 4: the -4 goes through the bsums */
        __m256i sumi = _mm256_slli_epi32(bsum_dot(sc, y[i].bsums, 1), 2);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        for (int k = 0; k < 8; k++, q8 += 32) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * (k / 4)));
            sumi = _mm256_add_epi32(sumi, dot32(q3_group(q, hm, k), q8, scale_pair(&w, 2 * k, 2 * k + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * half_to_float(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* The Q4_K/Q5_K block tail: scales, and mins through the bsums (each min covers two 16-sums). */
static inline void k4_accumulate(__m256 *acc, __m256 *acc_m, __m256i sumi, __m128i scales_mins,
                                 const int16_t *bsums, float d, float dmin) {
    const __m128i mins = _mm_unpackhi_epi64(scales_mins, scales_mins);
    const __m256i m = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
                                        _mm256_loadu_si256((const __m256i *)bsums));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
    *acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(m), *acc_m);
}

static float vec_dot_q4_K(int64_t n, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    /* the min terms accumulate apart, which halves the loop-carried dependency chain */
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i scales_mins = kquant_k4_scales_mins(x[i].scales);
        const scale_words w = widen_scales(scales_mins, 0);
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++, q8 += 64) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(srl16(q, 4), m4);
            sumi = _mm256_add_epi32(sumi, dot32(lo, q8, scale_pair(&w, 2 * j, 2 * j)));
            sumi = _mm256_add_epi32(sumi, dot32(hi, q8 + 32, scale_pair(&w, 2 * j + 1, 2 * j + 1)));
        }
        k4_accumulate(&acc, &acc_m, sumi, scales_mins, y[i].bsums, y[i].d * half_to_float(x[i].d),
                      y[i].d * half_to_float(x[i].dmin));
    }
    return hsum_ps(_mm256_sub_ps(acc, acc_m));
}

static float vec_dot_q5_K(int64_t n, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    /* the min terms accumulate apart, which halves the loop-carried dependency chain */
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i scales_mins = kquant_k4_scales_mins(x[i].scales);
        const scale_words w = widen_scales(scales_mins, 0);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++, q8 += 64) {
            __m256i lo, hi;
            q5_pair(x[i].qs, qh, j, &lo, &hi);
            sumi = _mm256_add_epi32(sumi, dot32(lo, q8, scale_pair(&w, 2 * j, 2 * j)));
            sumi = _mm256_add_epi32(sumi, dot32(hi, q8 + 32, scale_pair(&w, 2 * j + 1, 2 * j + 1)));
        }
        k4_accumulate(&acc, &acc_m, sumi, scales_mins, y[i].bsums, y[i].d * half_to_float(x[i].d),
                      y[i].d * half_to_float(x[i].dmin));
    }
    return hsum_ps(_mm256_sub_ps(acc, acc_m));
}

static float vec_dot_q6_K(int64_t n, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const scale_words w = widen_scales(sc, 1);
        const int8_t *q8 = y[i].qs;
        /* weights are stored as (0..63) - 32: the -32 goes through the bsums */
        __m256i sumi = _mm256_slli_epi32(bsum_dot(sc, y[i].bsums, 1), 5);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        for (int c = 0; c < QK_K / 128; c++) {
            __m256i g[4];
            q6_chunk(x[i].ql + 64 * c, x[i].qh + 32 * c, g);
            for (int k = 0; k < 4; k++, q8 += 32) {
                const int s = 8 * c + 2 * k;
                sumi = _mm256_add_epi32(sumi, dot32(g[k], q8, scale_pair(&w, s, s + 1)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * half_to_float(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ---- KILN_DOT_ROWS activation rows at once: per row the operations of the single-row kernels above, the weights'
 * unpacking and scales shared ---- */

static void vec_dot_rows_q2_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q2_K *x = vx;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc[KILN_DOT_ROWS], acc_m[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = acc_m[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const scale_words w = widen_scales(_mm_and_si128(sc, m4), 0);
        __m256i sumi[KILN_DOT_ROWS];
        for (int k = 0; k < KILN_DOT_ROWS; k++) sumi[k] = _mm256_setzero_si256();
        for (int half = 0; half < QK_K / 128; half++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * half));
            for (int j = 0; j < 4; j++) {
                const int s = 8 * half + 2 * j;
                const __m256i v = _mm256_and_si256(srl16(q, 2 * j), m3), scales = scale_pair(&w, s, s + 1);
                for (int k = 0; k < KILN_DOT_ROWS; k++) {
                    const int8_t *q8 = kquant_row_block(vy, y_stride, k, i)->qs + 32 * (4 * half + j);
                    sumi[k] = _mm256_add_epi32(sumi[k], dot32(v, q8, scales));
                }
            }
        }
        const float xd = half_to_float(x[i].d), xdmin = half_to_float(x[i].dmin);
        const __m128i min_bytes = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            const __m256i mins = bsum_dot(min_bytes, y->bsums, 0);
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * xd), _mm256_cvtepi32_ps(sumi[k]), acc[k]);
            acc_m[k] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * xdmin), _mm256_cvtepi32_ps(mins), acc_m[k]);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = hsum_ps(_mm256_sub_ps(acc[k], acc_m[k]));
}

static void vec_dot_rows_q3_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q3_K *x = vx;
    __m256 acc[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_sub_epi8(kquant_q3_scales(x[i].scales), _mm_set1_epi8(32));
        const scale_words w = widen_scales(sc, 1);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi[KILN_DOT_ROWS];
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            sumi[k] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsum_dot(sc, y->bsums, 1), 2));
        }
        for (int j = 0; j < 8; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * (j / 4)));
            const __m256i g = q3_group(q, hm, j), scales = scale_pair(&w, 2 * j, 2 * j + 1);
            for (int k = 0; k < KILN_DOT_ROWS; k++) {
                const int8_t *q8 = kquant_row_block(vy, y_stride, k, i)->qs + 32 * j;
                sumi[k] = _mm256_add_epi32(sumi[k], dot32(g, q8, scales));
            }
        }
        const float xd = half_to_float(x[i].d);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const float d = kquant_row_block(vy, y_stride, k, i)->d * xd;
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[k]), acc[k]);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = hsum_ps(acc[k]);
}

static inline void vec_dot_rows_k4(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out,
                                   bool five_bits) {
    const uint8_t *xb = vx;
    const size_t size = five_bits ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[KILN_DOT_ROWS], acc_m[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = acc_m[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, xb += size) {
        /* Q4_K and Q5_K share d, dmin and scales at the same offsets; Q5_K adds qh before qs */
        const block_q4_K *x4 = (const block_q4_K *)xb;
        const block_q5_K *x5 = (const block_q5_K *)xb;
        const __m128i scales_mins = kquant_k4_scales_mins(x4->scales);
        const scale_words w = widen_scales(scales_mins, 0);
        const __m256i qh = five_bits ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
        __m256i sumi[KILN_DOT_ROWS];
        for (int k = 0; k < KILN_DOT_ROWS; k++) sumi[k] = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++) {
            __m256i lo, hi;
            if (five_bits) {
                q5_pair(x5->qs, qh, j, &lo, &hi);
            } else {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(x4->qs + 32 * j));
                lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(srl16(q, 4), m4);
            }
            const __m256i s_lo = scale_pair(&w, 2 * j, 2 * j), s_hi = scale_pair(&w, 2 * j + 1, 2 * j + 1);
            for (int k = 0; k < KILN_DOT_ROWS; k++) {
                const int8_t *q8 = kquant_row_block(vy, y_stride, k, i)->qs + 64 * j;
                sumi[k] = _mm256_add_epi32(sumi[k], dot32(lo, q8, s_lo));
                sumi[k] = _mm256_add_epi32(sumi[k], dot32(hi, q8 + 32, s_hi));
            }
        }
        const float xd = half_to_float(x4->d), xdmin = half_to_float(x4->dmin);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            k4_accumulate(&acc[k], &acc_m[k], sumi[k], scales_mins, y->bsums, y->d * xd, y->d * xdmin);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = hsum_ps(_mm256_sub_ps(acc[k], acc_m[k]));
}

static void vec_dot_rows_q4_K(int64_t n, const void *x, const void *y, size_t y_stride, float *out) {
    vec_dot_rows_k4(n, x, y, y_stride, out, false);
}

static void vec_dot_rows_q5_K(int64_t n, const void *x, const void *y, size_t y_stride, float *out) {
    vec_dot_rows_k4(n, x, y, y_stride, out, true);
}

static void vec_dot_rows_q6_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q6_K *x = vx;
    __m256 acc[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const scale_words w = widen_scales(sc, 1);
        __m256i sumi[KILN_DOT_ROWS];
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            sumi[k] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsum_dot(sc, y->bsums, 1), 5));
        }
        for (int c = 0; c < QK_K / 128; c++) {
            __m256i g[4];
            q6_chunk(x[i].ql + 64 * c, x[i].qh + 32 * c, g);
            for (int q = 0; q < 4; q++) {
                const int s = 8 * c + 2 * q;
                const __m256i scales = scale_pair(&w, s, s + 1);
                for (int k = 0; k < KILN_DOT_ROWS; k++) {
                    const int8_t *q8 = kquant_row_block(vy, y_stride, k, i)->qs + 32 * (4 * c + q);
                    sumi[k] = _mm256_add_epi32(sumi[k], dot32(g[q], q8, scales));
                }
            }
        }
        const float xd = half_to_float(x[i].d);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const float d = kquant_row_block(vy, y_stride, k, i)->d * xd;
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[k]), acc[k]);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = hsum_ps(acc[k]);
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q2_K, {dequantize_row_q2_K, NULL, vec_dot_q2_K, KILN_TYPE_Q8_K, vec_dot_rows_q2_K}},
    {KILN_TYPE_Q3_K, {dequantize_row_q3_K, NULL, vec_dot_q3_K, KILN_TYPE_Q8_K, vec_dot_rows_q3_K}},
    {KILN_TYPE_Q4_K, {dequantize_row_q4_K, NULL, vec_dot_q4_K, KILN_TYPE_Q8_K, vec_dot_rows_q4_K}},
    {KILN_TYPE_Q5_K, {dequantize_row_q5_K, NULL, vec_dot_q5_K, KILN_TYPE_Q8_K, vec_dot_rows_q5_K}},
    {KILN_TYPE_Q6_K, {dequantize_row_q6_K, NULL, vec_dot_q6_K, KILN_TYPE_Q8_K, vec_dot_rows_q6_K}},
    {KILN_TYPE_Q8_K, {dequantize_row_q8_K, NULL, NULL, KILN_TYPE_Q8_K, NULL}},
};

const kiln_quant_family kiln_kquant_avx2_family = {
    "kquant_avx2", KILN_LEVEL_AVX2, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};
