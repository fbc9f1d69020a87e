/* AVX2 kernels for the 32-element block formats. Dequantize multiplies (and adds the offset) in the same order as
 * the scalar reference, without fused multiply-add, so results are bit-identical. Dot products keep the reference
 * engine's scheme: an exact integer dot per block (maddubs + madd), then one float FMA per block with d_x * d_y. */
#include <immintrin.h>
#include <string.h>

#include "quant/legacy_avx2_blocks.h"
#include "quant/quant.h"

/* Byte i becomes 0x10 where bit i of qh is set: the fifth bit of element i of a 5-bit block. */
static inline __m256i fifth_bits(const uint8_t *qh_bytes) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, sizeof qh);
    const __m256i byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), byte_of_bit);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Writes 32 floats (float)q[i] * d (+ m when add_min), q given as 32 signed bytes. */
static inline void store_scaled(__m256i q, __m256 d, __m256 m, int add_min, float *dst) {
    __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int h = 0; h < 2; h++) {
        __m256 lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h])), d);
        __m256 hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8))), d);
        if (add_min) {
            lo = _mm256_add_ps(lo, m);
            hi = _mm256_add_ps(hi, m);
        }
        _mm256_storeu_ps(dst + 16 * h, lo);
        _mm256_storeu_ps(dst + 16 * h + 8, hi);
    }
}

static void dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        __m256i q = _mm256_sub_epi8(unpack_nibbles(b[i].qs), eight);
        store_scaled(q, _mm256_set1_ps(half_to_float(b[i].d)), _mm256_setzero_ps(), 0, dst);
    }
}

static void dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        store_scaled(unpack_nibbles(b[i].qs), _mm256_set1_ps(half_to_float(b[i].d)),
                     _mm256_set1_ps(half_to_float(b[i].m)), 1, dst);
    }
}

static void dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        __m256i q = _mm256_or_si256(unpack_nibbles(b[i].qs), fifth_bits(b[i].qh));
        store_scaled(_mm256_sub_epi8(q, sixteen), _mm256_set1_ps(half_to_float(b[i].d)), _mm256_setzero_ps(), 0,
                     dst);
    }
}

static void dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        __m256i q = _mm256_or_si256(unpack_nibbles(b[i].qs), fifth_bits(b[i].qh));
        store_scaled(q, _mm256_set1_ps(half_to_float(b[i].d)), _mm256_set1_ps(half_to_float(b[i].m)), 1,
                     dst);
    }
}

static void dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        __m256i q = _mm256_loadu_si256((const __m256i *)b[i].qs);
        store_scaled(q, _mm256_set1_ps(half_to_float(b[i].d)), _mm256_setzero_ps(), 0, dst);
    }
}

static void dequantize_row_q8_1(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) {
        __m256i q = _mm256_loadu_si256((const __m256i *)b[i].qs);
        store_scaled(q, _mm256_set1_ps(half_to_float(b[i].d)), _mm256_setzero_ps(), 0, dst);
    }
}

/* roundf semantics (ties away from zero; the vector unit's own mode is ties-to-even): truncate, then step one away
 * from zero where the dropped fraction is at least a half. v - trunc(v) is exact, so this matches roundf always. */
static inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

/* Q8_0/Q8_1 quants of 32 floats exactly as the scalar reference computes them; returns d (unrounded) and the sum of
 * the quants. */
static inline float quantize_block_8bit(const float *x, int8_t *qs, int *quant_sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float d = _mm_cvtss_f32(m) / 127;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    *quant_sum = _mm_cvtsi128_si32(s);
    /* the packs interleave 128-bit lanes; the permute puts the 32 bytes back in element order */
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, packed);
    return d;
}

static void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    int unused;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0)
        b[i].d = kiln_float_to_half(quantize_block_8bit(src, b[i].qs, &unused));
}

static void quantize_row_q8_1(const float *src, void *dst, int64_t n) {
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        int sum;
        float d = quantize_block_8bit(src, b[i].qs, &sum);
        b[i].d = kiln_float_to_half(d);
        b[i].s = kiln_float_to_half((float)sum * d);
    }
}

/* Signed times signed: move x's sign onto y so maddubs can treat x as unsigned. */
static inline __m256i dot_i8_i8(__m256i x, __m256i y) {
    return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline __m256 block_scale(kiln_half dx, kiln_half dy) {
    return _mm256_set1_ps(half_to_float(dx) * half_to_float(dy));
}

static inline __m256i q8_quants(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

/* Weight quants of one block as stored: unsigned for Q4_0/Q5_0 (their bias is applied in the dot) and the offset
 * types, signed for Q8_0. */
static inline __m256i quants_q4_0(const block_q4_0 *b) { return unpack_nibbles(b->qs); }
static inline __m256i quants_q5_0(const block_q5_0 *b) {
    return _mm256_or_si256(unpack_nibbles(b->qs), fifth_bits(b->qh));
}
static inline __m256i quants_q8_0(const block_q8_0 *b) { return q8_quants(b->qs); }
static inline __m256i quants_q4_1(const block_q4_1 *b) { return unpack_nibbles(b->qs); }
static inline __m256i quants_q5_1(const block_q5_1 *b) {
    return _mm256_or_si256(unpack_nibbles(b->qs), fifth_bits(b->qh));
}

/* The integer block dot of each type with its activation quants, as eight int32 partial sums. */
static inline __m256i dot_q4_0(__m256i qx, __m256i qy) { return dot_biased(qx, qy, 8); }
static inline __m256i dot_q5_0(__m256i qx, __m256i qy) { return dot_biased(qx, qy, 16); }

/* Offset types add m_x * s_y per block; symmetric types have no such term. */
static inline float offset_q4_1(const block_q4_1 *x, const block_q8_1 *y) {
    return half_to_float(x->m) * half_to_float(y->s);
}
static inline float offset_q5_1(const block_q5_1 *x, const block_q8_1 *y) {
    return half_to_float(x->m) * half_to_float(y->s);
}
static inline float no_offset(const void *x, const void *y) {
    (void)x;
    (void)y;
    return 0.0f;
}

/* A dot product of weights with Q8_0 or Q8_1 activations. Blocks go in groups of 4, whose scales come from one
 * multiply of their heads: d_x d_y lands in the even lanes and, for offset types, m_x s_y in the odd ones. Each block
 * then takes one integer dot and one FMA. Leftover blocks take their scales one by one. */
#define VEC_DOT(name, block_type, act_type, quants, dot, offset, has_offset)                                        \
    static float name(int64_t n, const void *vx, const void *vy) {                                                  \
        const block_type *x = vx;                                                                                    \
        const act_type *y = vy;                                                                                      \
        const int64_t nb = n / QK8_0;                                                                                \
        __m256 acc = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();                                             \
        int64_t i = 0;                                                                                               \
        for (; i + 4 <= nb; i += 4) {                                                                                \
            __m256 products = _mm256_mul_ps(block_heads(x + i, sizeof *x), block_heads(y + i, sizeof *y));           \
            for (int k = 0; k < 4; k++) {                                                                            \
                __m256 d = _mm256_permutevar8x32_ps(products, _mm256_set1_epi32(2 * k));                             \
                __m256i sums = dot(quants(&x[i + k]), q8_quants(y[i + k].qs));                                       \
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc);                                             \
            }                                                                                                        \
            if (has_offset) offsets = _mm256_add_ps(offsets, _mm256_blend_ps(_mm256_setzero_ps(), products, 0xAA));   \
        }                                                                                                            \
        float tail_offsets = 0.0f;                                                                                   \
        for (; i < nb; i++) {                                                                                        \
            __m256i sums = dot(quants(&x[i]), q8_quants(y[i].qs));                                                   \
            acc = _mm256_fmadd_ps(block_scale(x[i].d, y[i].d), _mm256_cvtepi32_ps(sums), acc);                       \
            tail_offsets += offset(&x[i], &y[i]);                                                                    \
        }                                                                                                            \
        return hsum(acc) + hsum(offsets) + tail_offsets;                                                             \
    }

/* VEC_DOT for KILN_DOT_ROWS activation rows at once, each weight block's quants and heads unpacked once: per row the
 * same products, FMAs and sums in the same order, so the same bits. */
#define VEC_DOT_ROWS(name, block_type, act_type, quants, dot, offset, has_offset)                                   \
    static void name##_rows(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {               \
        const block_type *x = vx;                                                                                    \
        const int64_t nb = n / QK8_0;                                                                                \
        __m256 acc[KILN_DOT_ROWS], offsets[KILN_DOT_ROWS];                                                           \
        float tail_offsets[KILN_DOT_ROWS] = {0};                                                                     \
        for (int r = 0; r < KILN_DOT_ROWS; r++) acc[r] = offsets[r] = _mm256_setzero_ps();                           \
        int64_t i = 0;                                                                                               \
        for (; i + 4 <= nb; i += 4) {                                                                                \
            const __m256 heads = block_heads(x + i, sizeof *x);                                                      \
            __m256i qx[4];                                                                                           \
            for (int k = 0; k < 4; k++) qx[k] = quants(&x[i + k]);                                                   \
            for (int r = 0; r < KILN_DOT_ROWS; r++) {                                                                \
                const act_type *y = (const act_type *)((const char *)vy + (size_t)r * y_stride) + i;                 \
                __m256 products = _mm256_mul_ps(heads, block_heads(y, sizeof *y));                                   \
                for (int k = 0; k < 4; k++) {                                                                        \
                    __m256 d = _mm256_permutevar8x32_ps(products, _mm256_set1_epi32(2 * k));                         \
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot(qx[k], q8_quants(y[k].qs))), acc[r]);         \
                }                                                                                                    \
                if (has_offset)                                                                                      \
                    offsets[r] = _mm256_add_ps(offsets[r], _mm256_blend_ps(_mm256_setzero_ps(), products, 0xAA));    \
            }                                                                                                        \
        }                                                                                                            \
        for (; i < nb; i++) {                                                                                        \
            const __m256i qx = quants(&x[i]);                                                                        \
            for (int r = 0; r < KILN_DOT_ROWS; r++) {                                                                \
                const act_type *y = (const act_type *)((const char *)vy + (size_t)r * y_stride) + i;                 \
                acc[r] = _mm256_fmadd_ps(block_scale(x[i].d, y->d), _mm256_cvtepi32_ps(dot(qx, q8_quants(y->qs))),  \
                                         acc[r]);                                                                    \
                tail_offsets[r] += offset(&x[i], y);                                                                 \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < KILN_DOT_ROWS; r++) out[r] = hsum(acc[r]) + hsum(offsets[r]) + tail_offsets[r];          \
    }

VEC_DOT(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, quants_q4_0, dot_q4_0, no_offset, false)
VEC_DOT(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, quants_q5_0, dot_q5_0, no_offset, false)
VEC_DOT(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, quants_q8_0, dot_i8_i8, no_offset, false)
VEC_DOT(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, quants_q4_1, dot_u8_i8, offset_q4_1, true)
VEC_DOT(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, quants_q5_1, dot_u8_i8, offset_q5_1, true)
VEC_DOT_ROWS(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, quants_q4_0, dot_q4_0, no_offset, false)
VEC_DOT_ROWS(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, quants_q4_1, dot_u8_i8, offset_q4_1, true)
VEC_DOT_ROWS(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, quants_q5_0, dot_q5_0, no_offset, false)
VEC_DOT_ROWS(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, quants_q8_0, dot_i8_i8, no_offset, false)
VEC_DOT_ROWS(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, quants_q5_1, dot_u8_i8, offset_q5_1, true)

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q4_0, {dequantize_row_q4_0, NULL, vec_dot_q4_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q4_0_q8_0_rows}},
    {KILN_TYPE_Q4_1, {dequantize_row_q4_1, NULL, vec_dot_q4_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q4_1_q8_1_rows}},
    {KILN_TYPE_Q5_0, {dequantize_row_q5_0, NULL, vec_dot_q5_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q5_0_q8_0_rows}},
    {KILN_TYPE_Q5_1, {dequantize_row_q5_1, NULL, vec_dot_q5_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q5_1_q8_1_rows}},
    {KILN_TYPE_Q8_0,
     {dequantize_row_q8_0, quantize_row_q8_0, vec_dot_q8_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q8_0_q8_0_rows}},
    {KILN_TYPE_Q8_1, {dequantize_row_q8_1, quantize_row_q8_1, NULL, KILN_TYPE_Q8_1, NULL}},
};

const kiln_quant_family kiln_legacy_avx2_family = {
    "legacy_avx2", KILN_LEVEL_AVX2, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};
