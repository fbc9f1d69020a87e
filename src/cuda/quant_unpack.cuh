/* Device-side decoding of the GGUF block formats (byte layouts as in quant/blocks.h), one "part" of 32 weights at a
 * time: the unit that pairs with one Q8_1 activation block. Every format is reduced to one shape,
 *
 *     weight e (0..31) = d[e / 16] * q[e] + m[e / 16],    q[e] a signed 8-bit integer,
 *
 * so the dot product (int8 dp4a) and dequantization are written once, over any format: a new format only needs
 * its unpack(). Two (d, m) pairs because Q2_K, Q3_K and Q6_K scale sub-blocks of 16. */
#ifndef KILN_CUDA_QUANT_UNPACK_CUH
#define KILN_CUDA_QUANT_UNPACK_CUH

#include <cuda_fp16.h>
#include <stdint.h>

struct kpart {
    int q[8];    /* 32 signed bytes, element e in byte e % 4 of q[e / 4] */
    float d[2];  /* scale of elements 0..15 and 16..31 */
    float m[2];  /* offset of elements 0..15 and 16..31 (zero for symmetric formats) */
};

/* Blocks are only 2-byte aligned (an 18-byte Q4_0 block, a 210-byte Q6_K block), so 32-bit words are read as two
 * halves. */
__device__ __forceinline__ int ld32(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
}

__device__ __forceinline__ float ldh(const uint8_t *p) { return __half2float(*(const __half *)p); }

__device__ __forceinline__ void set_scale(kpart &p, float d, float m) {
    p.d[0] = p.d[1] = d;
    p.m[0] = p.m[1] = m;
}

/* Four bits of `bits` (bit i) moved to bit 4 of byte i: the fifth bit of Q5 weights. */
__device__ __forceinline__ int spread_bit4(uint32_t bits) {
    return (int)(((bits & 1) << 4) | ((bits & 2) << 11) | ((bits & 4) << 18) | ((bits & 8) << 25));
}

/* 32 low nibbles (elements 0..15) then high nibbles (16..31) of 16 bytes: the Q4_0/Q4_1/Q5 packing. */
__device__ __forceinline__ void nibbles32(const uint8_t *qs, kpart &p) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int v = ld32(qs + 4 * i);
        p.q[i] = v & 0x0F0F0F0F;
        p.q[4 + i] = (v >> 4) & 0x0F0F0F0F;
    }
}

/* Q4_K/Q5_K: 6-bit scale and min of sub-block j from the 12 packed bytes. */
__device__ __forceinline__ void scale_min_k4(const uint8_t *s, int j, int &sc, int &mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

struct q4_0_t {
    static constexpr int block_bytes = 18, parts = 1;
    static constexpr bool has_min = false;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        nibbles32(b + 2, p);
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = __vsub4(p.q[i], 0x08080808);
        set_scale(p, ldh(b), 0.0f);
    }
};

struct q4_1_t {
    static constexpr int block_bytes = 20, parts = 1;
    static constexpr bool has_min = true;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        nibbles32(b + 4, p);
        set_scale(p, ldh(b), ldh(b + 2));
    }
};

__device__ __forceinline__ void add_fifth_bit(uint32_t qh, kpart &p) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p.q[i] |= spread_bit4(qh >> (4 * i));
        p.q[4 + i] |= spread_bit4(qh >> (16 + 4 * i));
    }
}

struct q5_0_t {
    static constexpr int block_bytes = 22, parts = 1;
    static constexpr bool has_min = false;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        nibbles32(b + 6, p);
        add_fifth_bit((uint32_t)ld32(b + 2), p);
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = __vsub4(p.q[i], 0x10101010);
        set_scale(p, ldh(b), 0.0f);
    }
};

struct q5_1_t {
    static constexpr int block_bytes = 24, parts = 1;
    static constexpr bool has_min = true;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        nibbles32(b + 8, p);
        add_fifth_bit((uint32_t)ld32(b + 4), p);
        set_scale(p, ldh(b), ldh(b + 2));
    }
};

struct q8_0_t {
    static constexpr int block_bytes = 34, parts = 1;
    static constexpr bool has_min = false;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = ld32(b + 2 + 4 * i);
        set_scale(p, ldh(b), 0.0f);
    }
};

/* Q2_K: scales[16] at 0, qs[64] at 16, d at 80, dmin at 82. Part p = 4n + j holds the 2-bit fields at shift 2j of
 * qs[32n .. 32n+31]; its sub-blocks of 16 use scales[2p] and scales[2p+1] (low nibble scale, high nibble min). */
struct q2_K_t {
    static constexpr int block_bytes = 84, parts = 8;
    static constexpr bool has_min = true;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        const uint8_t *qs = b + 16 + 32 * (part >> 2);
        int shift = 2 * (part & 3);
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = (ld32(qs + 4 * i) >> shift) & 0x03030303;
        float d = ldh(b + 80), dmin = ldh(b + 82);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int sc = b[2 * part + h];
            p.d[h] = d * (float)(sc & 0xF);
            p.m[h] = -dmin * (float)(sc >> 4);
        }
    }
};

/* Q3_K: hmask[32] at 0, qs[64] at 32, scales[12] at 96, d at 108. Part p = 4n + j: low two bits at shift 2j of
 * qs[32n ..], the third bit is bit p of hmask[e]; q = that - 4. Sixteen 6-bit scales, biased by 32. */
struct q3_K_t {
    static constexpr int block_bytes = 110, parts = 8;
    static constexpr bool has_min = false;
    __device__ static int scale(const uint8_t *s, int i) {
        int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
        int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        const uint8_t *qs = b + 32 + 32 * (part >> 2);
        int shift = 2 * (part & 3);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = (ld32(qs + 4 * i) >> shift) & 0x03030303;
            int hm = (ld32(b + 4 * i) >> part) & 0x01010101;
            p.q[i] = __vsub4(lo | (hm << 2), 0x04040404);
        }
        float d = ldh(b + 108);
        p.d[0] = d * (float)scale(b + 96, 2 * part);
        p.d[1] = d * (float)scale(b + 96, 2 * part + 1);
        p.m[0] = p.m[1] = 0.0f;
    }
};

/* Q4_K: d, dmin at 0, 2; scales[12] at 4; qs[128] at 16. Part p: nibble (p & 1) of qs[32 * (p / 2) ..]. */
struct q4_K_t {
    static constexpr int block_bytes = 144, parts = 8;
    static constexpr bool has_min = true;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        const uint8_t *qs = b + 16 + 32 * (part >> 1);
        int shift = 4 * (part & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = (ld32(qs + 4 * i) >> shift) & 0x0F0F0F0F;
        int sc, mn;
        scale_min_k4(b + 4, part, sc, mn);
        set_scale(p, ldh(b) * (float)sc, -ldh(b + 2) * (float)mn);
    }
};

/* Q5_K: as Q4_K with qh[32] at 16 (bit p of qh[e] is the fifth bit) and qs[128] at 48. */
struct q5_K_t {
    static constexpr int block_bytes = 176, parts = 8;
    static constexpr bool has_min = true;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        const uint8_t *qs = b + 48 + 32 * (part >> 1);
        int shift = 4 * (part & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int hb = (ld32(b + 16 + 4 * i) >> part) & 0x01010101;
            p.q[i] = ((ld32(qs + 4 * i) >> shift) & 0x0F0F0F0F) | (hb << 4);
        }
        int sc, mn;
        scale_min_k4(b + 4, part, sc, mn);
        set_scale(p, ldh(b) * (float)sc, -ldh(b + 2) * (float)mn);
    }
};

/* Q6_K: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, d at 208. Part p = 4n + j: nibble (j >> 1) of
 * ql[64n + 32 (j & 1) ..], two high bits at shift 2j of qh[32n ..]; q = that - 32; scales[8n + 2j + half]. */
struct q6_K_t {
    static constexpr int block_bytes = 210, parts = 8;
    static constexpr bool has_min = false;
    __device__ static void unpack(const uint8_t *b, int part, kpart &p) {
        int n = part >> 2, j = part & 3;
        const uint8_t *ql = b + 64 * n + 32 * (j & 1);
        const uint8_t *qh = b + 128 + 32 * n;
        int lshift = 4 * (j >> 1), hshift = 2 * j;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = (ld32(ql + 4 * i) >> lshift) & 0x0F0F0F0F;
            int hi = (ld32(qh + 4 * i) >> hshift) & 0x03030303;
            p.q[i] = __vsub4(lo | (hi << 4), 0x20202020);
        }
        float d = ldh(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * n + 2 * j;
        p.d[0] = d * (float)sc[0];
        p.d[1] = d * (float)sc[1];
        p.m[0] = p.m[1] = 0.0f;
    }
};

/* Weight e of an unpacked part. */
__device__ __forceinline__ float kpart_value(const kpart &p, int e) {
    int8_t q = (int8_t)(p.q[e >> 2] >> (8 * (e & 3)));
    return p.d[e >> 4] * (float)q + p.m[e >> 4];
}

/* Every quantized format with its type id, for dispatch tables: X(type id, format). */
#define KILN_CUDA_QUANT_TYPES(X)                                                                                      \
    X(KILN_TYPE_Q4_0, q4_0_t)                                                                                          \
    X(KILN_TYPE_Q4_1, q4_1_t)                                                                                          \
    X(KILN_TYPE_Q5_0, q5_0_t)                                                                                          \
    X(KILN_TYPE_Q5_1, q5_1_t)                                                                                          \
    X(KILN_TYPE_Q8_0, q8_0_t)                                                                                          \
    X(KILN_TYPE_Q2_K, q2_K_t)                                                                                          \
    X(KILN_TYPE_Q3_K, q3_K_t)                                                                                          \
    X(KILN_TYPE_Q4_K, q4_K_t)                                                                                          \
    X(KILN_TYPE_Q5_K, q5_K_t)                                                                                          \
    X(KILN_TYPE_Q6_K, q6_K_t)

/* The Q8_1 activation block (block_q8_1): d, s = d * sum(qs) as halves, then 32 int8 values. */
struct q8_1_block {
    __half d, s;
    int8_t qs[32];
};

/* Dot product of an unpacked part with its Q8_1 block: int8 dp4a per half, scales applied once per half. */
template <class F>
__device__ __forceinline__ float dot_part(const uint8_t *block, int part, const q8_1_block *xb) {
    kpart p;
    F::unpack(block, part, p);
    const int *xq = (const int *)xb->qs;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s0 = __dp4a(p.q[i], xq[i], s0);
        s1 = __dp4a(p.q[4 + i], xq[4 + i], s1);
    }
    float r = p.d[0] * (float)s0 + p.d[1] * (float)s1;
    if (F::has_min) {
        /* the offsets multiply the plain sums of the activations, taken exactly from the int8 values */
        int t0 = 0, t1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            t0 = __dp4a(0x01010101, xq[i], t0);
            t1 = __dp4a(0x01010101, xq[4 + i], t1);
        }
        r += p.m[0] * (float)t0 + p.m[1] * (float)t1;
    }
    return r * __half2float(xb->d);
}

#endif
