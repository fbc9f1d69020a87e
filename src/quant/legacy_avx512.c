/* AVX-512 kernels for the 32-element block formats. Dequantize is bit-identical to the scalar reference (no fused
 * multiply-add). Dot products take two blocks per 512-bit step: an exact integer dot per block (vpdpbusd on CPUs
 * with AVX512-VNNI, maddubs + madd otherwise), then one float FMA with d_x * d_y per block, as the reference engine
 * does. This file exports two families, plain AVX-512 and VNNI; quant.c uses the VNNI one only where cpuid has it. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "quant/quant.h"

/* F16C converts exactly, like kiln_half_to_float, but in one instruction. */
static inline float half_to_float(kiln_half h) { return _cvtsh_ss(h); }

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- dequantize: 16 elements per vector; low nibbles are elements 0..15, high nibbles 16..31 ---- */

static inline __m128i low_nibbles(__m128i packed) { return _mm_and_si128(packed, _mm_set1_epi8(0x0F)); }

static inline __m128i high_nibbles(__m128i packed) {
    return _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
}

static inline void store16(__m128i q, __m512 d, float *dst) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
}

static inline void store16_min(__m128i q, __m512 d, __m512 m, float *dst) {
    _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d), m));
}

static void dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
        store16(_mm_sub_epi8(low_nibbles(packed), eight), d, dst);
        store16(_mm_sub_epi8(high_nibbles(packed), eight), d, dst + 16);
    }
}

static void dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d)), m = _mm512_set1_ps(half_to_float(b[i].m));
        store16_min(low_nibbles(packed), d, m, dst);
        store16_min(high_nibbles(packed), d, m, dst + 16);
    }
}

/* Bit i of the mask set means element i has its fifth bit: add 0x10 to exactly those bytes. */
static inline __m128i with_fifth_bits(__m128i q, uint32_t bits16) {
    return _mm_or_si128(q, _mm_maskz_set1_epi8((__mmask16)bits16, 0x10));
}

static void dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        uint32_t qh = load_u32(b[i].qh);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
        store16(_mm_sub_epi8(with_fifth_bits(low_nibbles(packed), qh & 0xFFFF), sixteen), d, dst);
        store16(_mm_sub_epi8(with_fifth_bits(high_nibbles(packed), qh >> 16), sixteen), d, dst + 16);
    }
}

static void dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        uint32_t qh = load_u32(b[i].qh);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d)), m = _mm512_set1_ps(half_to_float(b[i].m));
        store16_min(with_fifth_bits(low_nibbles(packed), qh & 0xFFFF), d, m, dst);
        store16_min(with_fifth_bits(high_nibbles(packed), qh >> 16), d, m, dst + 16);
    }
}

static inline void dequantize_8bit(const int8_t *qs, kiln_half d_half, float *dst) {
    __m512 d = _mm512_set1_ps(half_to_float(d_half));
    store16(_mm_loadu_si128((const __m128i *)qs), d, dst);
    store16(_mm_loadu_si128((const __m128i *)(qs + 16)), d, dst + 16);
}

static void dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) dequantize_8bit(b[i].qs, b[i].d, dst);
}

static void dequantize_row_q8_1(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) dequantize_8bit(b[i].qs, b[i].d, dst);
}

/* ---- quantize Q8_0/Q8_1 (the activation formats), bit-identical to the scalar reference ---- */

/* roundf semantics (ties away from zero; the vector unit's own mode is ties-to-even): truncate, then step one away
 * from zero where the dropped fraction is at least a half. v - trunc(v) is exact, so this matches roundf always. */
static inline __m512 round_half_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 step = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, step);
}

/* Returns d (unrounded) and the sum of the quants. */
static inline float quantize_block_8bit(const float *x, int8_t *qs, int *quant_sum) {
    __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi))) / 127;
    __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m512i qlo = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(lo, id)));
    __m512i qhi = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(hi, id)));
    *quant_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(qhi));
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

/* ---- dot products: two blocks per step, the second left zero when the row has an odd block count ---- */

/* The 32 quants of a block in element order, as bytes. */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(high_nibbles(packed), low_nibbles(packed));
}

static inline __m256i fifth_bits32(const uint8_t *qh) { return _mm256_maskz_set1_epi8(load_u32(qh), 0x10); }

static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

static inline __m512 join_scales(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

/* Sixteen int32 partial sums of unsigned x times signed y. Without VNNI the int16 step cannot saturate while
 * x <= 128 and |y| <= 127, which every quantizer's output satisfies. */
ALWAYS_INLINE __m512i dot_u8_i8(__m512i ux, __m512i sy, const bool vnni) {
    if (vnni) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, sy);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(ux, sy), _mm512_set1_epi16(1));
}

/* Signed times signed: move x's sign onto y so x can be treated as unsigned. */
ALWAYS_INLINE __m512i dot_i8_i8(__m512i x, __m512i y, const bool vnni) {
    __m512i y_signed = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return dot_u8_i8(_mm512_abs_epi8(x), y_signed, vnni);
}

/* (x - bias) . y for unsigned x, as dot(x, y) - dot(bias, y): cheaper than moving signs, and the int16 step stays
 * within range for any y. */
ALWAYS_INLINE __m512i dot_biased(__m512i ux, __m512i sy, const int bias, const bool vnni) {
    const __m512i b = _mm512_set1_epi8((char)bias);
    if (vnni) {
        __m512i zero = _mm512_setzero_si512();
        return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, ux, sy), _mm512_dpbusd_epi32(zero, b, sy));
    }
    __m512i pairs = _mm512_sub_epi16(_mm512_maddubs_epi16(ux, sy), _mm512_maddubs_epi16(b, sy));
    return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}

/* The integer block dot of each symmetric type: Q4_0 and Q5_0 quants are unsigned with a bias of 8 and 16. */
ALWAYS_INLINE __m512i dot_q4_0(__m512i qx, __m512i qy, const bool vnni) { return dot_biased(qx, qy, 8, vnni); }
ALWAYS_INLINE __m512i dot_q5_0(__m512i qx, __m512i qy, const bool vnni) { return dot_biased(qx, qy, 16, vnni); }
ALWAYS_INLINE __m512i dot_q8_0(__m512i qx, __m512i qy, const bool vnni) { return dot_i8_i8(qx, qy, vnni); }

static inline float scale_of(kiln_half dx, kiln_half dy) { return half_to_float(dx) * half_to_float(dy); }

static inline __m256i q8_quants(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

/* Weight quants of one block as stored: unsigned for Q4_0/Q5_0 (their bias is applied in the dot), signed for Q8_0. */
static inline __m256i quants_q4_0(const block_q4_0 *b) { return nibbles32(b->qs); }

static inline __m256i quants_q5_0(const block_q5_0 *b) {
    return _mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh));
}

static inline __m256i quants_q8_0(const block_q8_0 *b) { return q8_quants(b->qs); }

/* Unsigned weight quants of one block of an offset type. */
static inline __m256i quants_q4_1(const block_q4_1 *b) { return nibbles32(b->qs); }

static inline __m256i quants_q5_1(const block_q5_1 *b) {
    return _mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh));
}

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

/* The first 4 bytes of 4 blocks, inserted one by one: built any other way, compilers assemble the vector in memory
 * and stall on the reload. */
static inline __m128i heads4(const uint8_t *b, size_t stride) {
    __m128i v = _mm_cvtsi32_si128((int)load_u32(b));
    v = _mm_insert_epi32(v, (int)load_u32(b + stride), 1);
    v = _mm_insert_epi32(v, (int)load_u32(b + 2 * stride), 2);
    return _mm_insert_epi32(v, (int)load_u32(b + 3 * stride), 3);
}

/* The first two halves of 8 consecutive blocks: d and m of offset weights, d and s of Q8_1, d and two quant bytes
 * of the others. */
static inline __m512 block_heads(const void *blocks, size_t stride) {
    const uint8_t *b = blocks;
    return _mm512_cvtph_ps(_mm256_set_m128i(heads4(b + 4 * stride, stride), heads4(b, stride)));
}

/* Permute indices that spread the scale of block 2p over the low half of a vector and of block 2p + 1 over the
 * high half, taken from the even lanes of the head products. */
static inline __m512i pair_pick(int p) {
    return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(4 * p), _mm512_set1_epi32(4 * p + 2));
}

/* A dot product of weights with Q8_0 or Q8_1 activations. Blocks go in groups of 8, whose scales come from one
 * multiply of their heads: d_x d_y lands in the even lanes and, for offset types, m_x s_y in the odd ones. Each pair
 * of blocks then takes one integer dot and one FMA. Leftover blocks take their scales one by one. */
#define VEC_DOT(name, block_type, act_type, quants, dot, offset, has_offset)                                        \
    ALWAYS_INLINE __m512 name##_pair(const block_type *x, const act_type *y, __m512 d, __m512 acc, const bool pair,  \
                                     const bool vnni) {                                                              \
        __m512i qx = join(quants(&x[0]), pair ? quants(&x[1]) : _mm256_setzero_si256());                             \
        __m512i qy = join(q8_quants(y[0].qs), pair ? q8_quants(y[1].qs) : _mm256_setzero_si256());                   \
        return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot(qx, qy, vnni)), acc);                                       \
    }                                                                                                                \
    ALWAYS_INLINE float name##_impl(int64_t n, const void *vx, const void *vy, const bool vnni) {                  \
        const block_type *x = vx;                                                                                    \
        const act_type *y = vy;                                                                                      \
        const int64_t nb = n / QK8_0;                                                                                \
        const __m512i pick[4] = {pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)};                            \
        __m512 acc = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();                                             \
        int64_t i = 0;                                                                                               \
        for (; i + 8 <= nb; i += 8) {                                                                                \
            __m512 products = _mm512_mul_ps(block_heads(x + i, sizeof *x), block_heads(y + i, sizeof *y));           \
            for (int p = 0; p < 4; p++)                                                                              \
                acc = name##_pair(x + i + 2 * p, y + i + 2 * p, _mm512_permutexvar_ps(pick[p], products), acc, true,  \
                                  vnni);                                                                             \
            if (has_offset) offsets = _mm512_mask_add_ps(offsets, 0xAAAA, offsets, products);                        \
        }                                                                                                            \
        float tail_offsets = 0.0f;                                                                                   \
        for (; i < nb; i += 2) {                                                                                     \
            bool pair = i + 1 < nb;                                                                                  \
            __m512 d = join_scales(scale_of(x[i].d, y[i].d), pair ? scale_of(x[i + 1].d, y[i + 1].d) : 0.0f);       \
            acc = name##_pair(x + i, y + i, d, acc, pair, vnni);                                                     \
            tail_offsets += offset(&x[i], &y[i]) + (pair ? offset(&x[i + 1], &y[i + 1]) : 0.0f);                     \
        }                                                                                                            \
        return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(offsets) + tail_offsets;                             \
    }

VEC_DOT(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, quants_q4_0, dot_q4_0, no_offset, false)
VEC_DOT(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, quants_q5_0, dot_q5_0, no_offset, false)
VEC_DOT(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, quants_q8_0, dot_q8_0, no_offset, false)
VEC_DOT(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, quants_q4_1, dot_u8_i8, offset_q4_1, true)
VEC_DOT(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, quants_q5_1, dot_u8_i8, offset_q5_1, true)

#define VEC_DOT_VARIANTS(name)                                                                                      \
    static float name(int64_t n, const void *vx, const void *vy) { return name##_impl(n, vx, vy, false); }         \
    static float name##_vnni(int64_t n, const void *vx, const void *vy) { return name##_impl(n, vx, vy, true); }

VEC_DOT_VARIANTS(vec_dot_q4_0_q8_0)
VEC_DOT_VARIANTS(vec_dot_q5_0_q8_0)
VEC_DOT_VARIANTS(vec_dot_q8_0_q8_0)
VEC_DOT_VARIANTS(vec_dot_q4_1_q8_1)
VEC_DOT_VARIANTS(vec_dot_q5_1_q8_1)

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q4_0, {dequantize_row_q4_0, NULL, vec_dot_q4_0_q8_0, KILN_TYPE_Q8_0}},
    {KILN_TYPE_Q4_1, {dequantize_row_q4_1, NULL, vec_dot_q4_1_q8_1, KILN_TYPE_Q8_1}},
    {KILN_TYPE_Q5_0, {dequantize_row_q5_0, NULL, vec_dot_q5_0_q8_0, KILN_TYPE_Q8_0}},
    {KILN_TYPE_Q5_1, {dequantize_row_q5_1, NULL, vec_dot_q5_1_q8_1, KILN_TYPE_Q8_1}},
    {KILN_TYPE_Q8_0, {dequantize_row_q8_0, quantize_row_q8_0, vec_dot_q8_0_q8_0, KILN_TYPE_Q8_0}},
    {KILN_TYPE_Q8_1, {dequantize_row_q8_1, quantize_row_q8_1, NULL, KILN_TYPE_Q8_1}},
};

/* Only the dot products change with VNNI; dequantize falls back to the plain AVX-512 family. */
static const kiln_quant_entry VNNI_ENTRIES[] = {
    {KILN_TYPE_Q4_0, {NULL, NULL, vec_dot_q4_0_q8_0_vnni, KILN_TYPE_Q8_0}},
    {KILN_TYPE_Q4_1, {NULL, NULL, vec_dot_q4_1_q8_1_vnni, KILN_TYPE_Q8_1}},
    {KILN_TYPE_Q5_0, {NULL, NULL, vec_dot_q5_0_q8_0_vnni, KILN_TYPE_Q8_0}},
    {KILN_TYPE_Q5_1, {NULL, NULL, vec_dot_q5_1_q8_1_vnni, KILN_TYPE_Q8_1}},
    {KILN_TYPE_Q8_0, {NULL, NULL, vec_dot_q8_0_q8_0_vnni, KILN_TYPE_Q8_0}},
};

const kiln_quant_family kiln_legacy_avx512_family = {
    "legacy_avx512", KILN_LEVEL_AVX512, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

const kiln_quant_family kiln_legacy_avx512_vnni_family = {
    "legacy_avx512_vnni", KILN_LEVEL_AVX512_VNNI, VNNI_ENTRIES, (int)(sizeof VNNI_ENTRIES / sizeof VNNI_ENTRIES[0])};
