/* Device-side decoding of the GGUF block formats, one "part" of 32 weights at a time: the unit that pairs with one
 * Q8_1 activation block.
 *
 * Layout. On the device a quantized tensor keeps its file's blocks, but stored field by field (structure of arrays):
 * all blocks' first field, then all blocks' second field, and so on, fields ordered by size so each array is
 * aligned to its width. A warp then reads each field with 16-byte (or 4-, 2-byte) loads over consecutive bytes,
 * instead of unaligned 2-byte loads strided by an 18- or 210-byte block, which cost 5-10 times the L1 wavefronts
 * and capped the GEMVs near 40% of bandwidth. Field f of block g lives at base + soa_off_f * n_blocks + g * size_f;
 * kiln_cuda_repack() converts from the file layout (fields and offsets listed per format below, as in blocks.h). A
 * format may also rewrite its block first (to_device: the K-quants), into an order of the same size that takes fewer
 * instructions to decode.
 *
 * Values. Every format is reduced to one shape,
 *
 *     weight e (0..31) = d[e / 16] * q[e] + m[e / 16],    q[e] a signed 8-bit integer,
 *
 * so the dot product (int8 dp4a) and dequantization are written once over any format: a new format needs its field
 * list, its load() and its decode(). Two (d, m) pairs because Q2_K, Q3_K and Q6_K scale sub-blocks of 16. */
#ifndef KILN_CUDA_QUANT_UNPACK_CUH
#define KILN_CUDA_QUANT_UNPACK_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "quant/types.h"

struct kpart {
    int q[8];   /* 32 signed bytes, element e in byte e % 4 of q[e / 4] */
    float d[2]; /* scale of elements 0..15 and 16..31 */
    float m[2]; /* offset of elements 0..15 and 16..31 (zero for symmetric formats) */
};

/* A field of the file's block: byte offset there, and size. */
struct kfield {
    int aos_off, size;
};

/* A quantized tensor on the device: the field arrays start at base; n_blocks blocks in all. */
struct qtensor {
    const uint8_t *base;
    int64_t n_blocks;
};

/* A quantized matrix of format F as its kernels see it. */
template <class F>
static inline qtensor tensor_of(const kiln_cuda_matrix *m) {
    return qtensor{(const uint8_t *)m->data, (int64_t)m->n * (m->k / 32 / F::parts)};
}

template <int SOA_OFF, int SIZE>
__device__ __forceinline__ const uint8_t *field(const qtensor &t, int64_t g) {
    return t.base + SOA_OFF * t.n_blocks + g * SIZE;
}

__device__ __forceinline__ void ld16(const uint8_t *p, int w[4]) {
    uint4 v = *(const uint4 *)p;
    w[0] = (int)v.x, w[1] = (int)v.y, w[2] = (int)v.z, w[3] = (int)v.w;
}

__device__ __forceinline__ void ld8(const uint8_t *p, int w[2]) {
    uint2 v = *(const uint2 *)p;
    w[0] = (int)v.x, w[1] = (int)v.y;
}

__device__ __forceinline__ void ld32b(const uint8_t *p, int w[8]) {
    ld16(p, w);
    ld16(p + 16, w + 4);
}

__device__ __forceinline__ void set_scale(kpart &p, float d, float m) {
    p.d[0] = p.d[1] = d;
    p.m[0] = p.m[1] = m;
}

/* Low nibbles of 16 bytes are elements 0..15, high nibbles 16..31: the Q4_0/Q4_1/Q5 packing. */
__device__ __forceinline__ void nibbles32(const int w[4], kpart &p) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p.q[i] = w[i] & 0x0F0F0F0F;
        p.q[4 + i] = (w[i] >> 4) & 0x0F0F0F0F;
    }
}

/* w as 4 little-endian bytes (to_device's rewritten fields) */
__device__ inline void put_word(uint8_t *out, uint32_t w) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(w >> (8 * i));
}

/* One bit of each of a part's 32 weights (Q5_0/Q5_1/Q5_K's fifth, Q3_K's third) as the device keeps it: element
 * 4k + b's at bit 8b + k of one word, so that word k of the decoded part takes its four with one shift and mask
 * (bit_for_word, to bit AT of each byte). bit_word makes it from bit `shift` of 32 bytes in element order. */
__device__ inline uint32_t bit_word(const uint8_t *bits, int shift) {
    uint32_t h = 0;
    for (int e = 0; e < 32; e++) h |= (uint32_t)((bits[e] >> shift) & 1) << (8 * (e % 4) + e / 4);
    return h;
}

/* The same from a little-endian word whose bit e is element e's (Q5_0's and Q5_1's qh), in place. */
__device__ inline void bit_word_in_place(uint8_t *qh) {
    uint8_t bits[32];
    for (int e = 0; e < 32; e++) bits[e] = (uint8_t)((qh[e / 8] >> (e % 8)) & 1);
    put_word(qh, bit_word(bits, 0));
}

template <int AT>
__device__ __forceinline__ int bit_for_word(uint32_t h, int k) {
    return (int)((k <= AT ? h << (AT - k) : h >> (k - AT)) & (0x01010101u << AT));
}

__device__ __forceinline__ void add_fifth_bit(uint32_t h, kpart &p) {
#pragma unroll
    for (int k = 0; k < 8; k++) p.q[k] |= bit_for_word<4>(h, k);
}

__device__ __forceinline__ void center(kpart &p, int bias4) {
#pragma unroll
    for (int i = 0; i < 8; i++) p.q[i] = __vsub4(p.q[i], bias4);
}

/* The bytes of one part as loaded, before any arithmetic: load() fills what its format has, decode() turns them
 * into a kpart. Kept apart so that a GEMV can issue the loads of several parts before it waits for the first: the
 * compiler leaves loads where the code puts them, next to their use. Unused fields cost nothing once inlined. */
struct kraw {
    int qs[8];     /* the part's low bits (4 or 8 words) */
    int hi[8];     /* its high bits, where the format keeps them apart */
    int sc[3];     /* packed scales (and mins), or the Q5 fifth bits */
    uint32_t dm;   /* the block's half scale (and half min) */
};

__device__ __forceinline__ uint32_t ldu16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ uint32_t ldu32(const uint8_t *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ float half_lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)v)); }
__device__ __forceinline__ float half_hi(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v >> 16)));
}

/* Each format: file block size, parts per block, whether it has offsets, the words of kraw its load() fills, its
 * fields in device order (file offset, size), load() of part `part` of block g and decode() of what it loaded. */
struct q4_0_t {
    static constexpr int block_bytes = 18, parts = 1, n_fields = 2;
    static constexpr bool has_min = false;
    static constexpr int raw_words = 5; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{2, 16}, {0, 2}};
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 16>(t, g), r.qs);
        r.dm = ldu16(field<16, 2>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        center(p, 0x08080808);
        set_scale(p, half_lo(r.dm), 0.0f);
    }
};

struct q4_1_t {
    static constexpr int block_bytes = 20, parts = 1, n_fields = 2;
    static constexpr bool has_min = true;
    static constexpr int raw_words = 5; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{4, 16}, {0, 4}};
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 16>(t, g), r.qs);
        r.dm = ldu32(field<16, 4>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        set_scale(p, half_lo(r.dm), half_hi(r.dm));
    }
};

/* Q5_0 and Q5_1: Q4_0's and Q4_1's blocks plus qh, a word whose bit e is element e's fifth bit; on the device qh
 * is in bit_word's order (a decoded word takes its four fifth bits with one shift and mask, where spreading them
 * from element order took seven operations a word). */
struct q5_0_t {
    static constexpr int block_bytes = 22, parts = 1, n_fields = 3;
    static constexpr bool has_min = false;
    static constexpr int raw_words = 6; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{6, 16}, {2, 4}, {0, 2}};
    __device__ static void to_device(const uint8_t *in, uint8_t *out) { /* qh as bit_word's */
        for (int i = 0; i < block_bytes; i++) out[i] = in[i];
        bit_word_in_place(out + 2);
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 16>(t, g), r.qs);
        r.sc[0] = (int)ldu32(field<16, 4>(t, g));
        r.dm = ldu16(field<20, 2>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        add_fifth_bit((uint32_t)r.sc[0], p);
        center(p, 0x10101010);
        set_scale(p, half_lo(r.dm), 0.0f);
    }
};

struct q5_1_t {
    static constexpr int block_bytes = 24, parts = 1, n_fields = 3;
    static constexpr bool has_min = true;
    static constexpr int raw_words = 6; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{8, 16}, {4, 4}, {0, 4}};
    __device__ static void to_device(const uint8_t *in, uint8_t *out) { /* qh as bit_word's */
        for (int i = 0; i < block_bytes; i++) out[i] = in[i];
        bit_word_in_place(out + 4);
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 16>(t, g), r.qs);
        r.sc[0] = (int)ldu32(field<16, 4>(t, g));
        r.dm = ldu32(field<20, 4>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        add_fifth_bit((uint32_t)r.sc[0], p);
        set_scale(p, half_lo(r.dm), half_hi(r.dm));
    }
};

struct q8_0_t {
    static constexpr int block_bytes = 34, parts = 1, n_fields = 2;
    static constexpr bool has_min = false;
    static constexpr int raw_words = 9; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{2, 32}, {0, 2}};
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld32b(field<0, 32>(t, g), r.qs);
        r.dm = ldu16(field<32, 2>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
#pragma unroll
        for (int i = 0; i < 8; i++) p.q[i] = r.qs[i];
        set_scale(p, half_lo(r.dm), 0.0f);
    }
};

/* Q2_K and Q3_K keep their weights' low two bits in qs[64] (part p = 4n + j: the 2-bit fields at shift 2j of
 * qs[32n ..]). On the device (to_device, at upload) each part's 32 fields are 8 bytes of their own, element 4k + b's
 * at bit 2 (k % 4) of byte 4 (k / 4) + b, so that word k of the decoded part takes its four with one constant shift
 * and mask (low2_word). */
__device__ inline void k2_low_bits(const uint8_t *qs, uint8_t *out) {
    for (int p = 0; p < 8; p++) {
        int n = p >> 2, j = p & 3;
        uint8_t b[8] = {0};
        for (int e = 0; e < 32; e++)
            b[4 * (e / 16) + e % 4] |= (uint8_t)(((qs[32 * n + e] >> (2 * j)) & 3) << (2 * ((e / 4) % 4)));
        for (int i = 0; i < 8; i++) out[8 * p + i] = b[i];
    }
}

__device__ __forceinline__ int low2_word(const int w[2], int k) {
    return (w[k >> 2] >> (2 * (k & 3))) & 0x03030303;
}

/* Q2_K: in the file scales[16] (sub-blocks 2p and 2p+1: low nibble scale, high nibble min), qs[64], d and dmin;
 * on the device the low bits as k2_low_bits makes them. A part is three loads (8, 2 and 4 bytes), where the file's
 * order took four (32 bytes of qs for 8 of use). */
struct q2_K_t {
    static constexpr int block_bytes = 84, parts = 8, n_fields = 3;
    static constexpr bool has_min = true;
    static constexpr int raw_words = 4; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{0, 64}, {64, 16}, {80, 4}}; /* of to_device's block */
    __device__ static void to_device(const uint8_t *in, uint8_t *out) {
        k2_low_bits(in + 16, out);
        for (int i = 0; i < 16; i++) out[64 + i] = in[i];
        for (int i = 0; i < 4; i++) out[80 + i] = in[80 + i];
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld8(field<0, 64>(t, g) + 8 * part, r.qs);
        r.sc[0] = (int)ldu16(field<64, 16>(t, g) + 2 * part);
        r.dm = ldu32(field<80, 4>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        int sc = r.sc[0];
#pragma unroll
        for (int k = 0; k < 8; k++) p.q[k] = low2_word(r.qs, k);
        float d = half_lo(r.dm), dmin = half_hi(r.dm);
        p.d[0] = d * (float)(sc & 0xF), p.m[0] = -dmin * (float)((sc >> 4) & 0xF);
        p.d[1] = d * (float)((sc >> 8) & 0xF), p.m[1] = -dmin * (float)(sc >> 12);
    }
};

/* The three words of a K-quant block's 12 packed scale bytes. */
__device__ __forceinline__ void ld_scales12(const uint8_t *p, int sc[3]) {
    const int *w = (const int *)p;
    sc[0] = w[0], sc[1] = w[1], sc[2] = w[2];
}

/* Q3_K: in the file hmask[32] (bit p of hmask[e] is part p's third bit of element e), qs[64], 16 six-bit scales
 * biased by 32 packed in 12 bytes, d; q = bits - 4. On the device the low bits as k2_low_bits makes them, each
 * part's third bits one word of their own (element 4k + b's at bit 8b + k, as Q5_K's fifth bits), and the scales
 * re-packed in their 12 bytes: the low nibbles of scales 0..7 and of 8..15 in one word each (nibble i % 8), their top
 * two bits in the third (bits 2i). A part is six loads (8, 4, three of 4, 2 bytes) where the file's order took eight
 * (64 bytes for 12 of use), with constant shifts and no run-time byte select. */
struct q3_K_t {
    static constexpr int block_bytes = 110, parts = 8, n_fields = 4;
    static constexpr bool has_min = false;
    static constexpr int raw_words = 7; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{0, 64}, {64, 32}, {96, 12}, {108, 2}}; /* of to_device's block */
    __device__ static void to_device(const uint8_t *in, uint8_t *out) {
        const uint8_t *hmask = in, *sc = in + 96;
        k2_low_bits(in + 32, out);
        for (int p = 0; p < 8; p++) put_word(out + 64 + 4 * p, bit_word(hmask, p));
        uint32_t w[3] = {0, 0, 0};
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
            int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            w[i / 8] |= (uint32_t)lo << (4 * (i % 8));
            w[2] |= (uint32_t)hi << (2 * i);
        }
        for (int i = 0; i < 3; i++) put_word(out + 96 + 4 * i, w[i]);
        out[108] = in[108], out[109] = in[109];
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld8(field<0, 64>(t, g) + 8 * part, r.qs);
        r.hi[0] = (int)ldu32(field<64, 32>(t, g) + 4 * part);
        ld_scales12(field<96, 12>(t, g), r.sc);
        r.dm = ldu16(field<108, 2>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        uint32_t h = (uint32_t)r.hi[0];
#pragma unroll
        for (int k = 0; k < 8; k++) p.q[k] = __vsub4(low2_word(r.qs, k) | bit_for_word<2>(h, k), 0x04040404);
        int lo = part < 4 ? r.sc[0] : r.sc[1], s8 = 8 * (part & 3), h4 = (r.sc[2] >> (4 * part)) & 15;
        float d = half_lo(r.dm);
        p.d[0] = d * (float)((((lo >> s8) & 15) | ((h4 & 3) << 4)) - 32);
        p.d[1] = d * (float)((((lo >> (s8 + 4)) & 15) | ((h4 >> 2) << 4)) - 32);
        p.m[0] = p.m[1] = 0.0f;
    }
};

/* Q4_K and Q5_K share their file block's first 16 bytes (d, dmin, the 8 sub-blocks' 6-bit scales and mins packed in
 * 12 bytes) and the low 4 bits of their weights (qs[128], part p: nibble p & 1 of qs[32 (p / 2) ..]). On the device
 * (to_device, at upload) each part's 32 low nibbles are 16 bytes of their own, packed as Q4_0's (elements 0..15 in
 * the low nibbles, 16..31 in the high), and d, dmin and the scales are one 16-byte field: d, dmin, then three words
 * whose nibble p holds part p's scale (low 4 bits), its min (low 4 bits) and the top two bits of both (the scale's
 * at bit 0, the min's at bit 2). */
__device__ inline void k4_low_nibbles(const uint8_t *qs, uint8_t *out) {
    for (int p = 0; p < 8; p++) {
        const uint8_t *src = qs + 32 * (p >> 1);
        int sh = 4 * (p & 1);
        for (int i = 0; i < 16; i++)
            out[16 * p + i] = (uint8_t)(((src[i] >> sh) & 15) | (((src[16 + i] >> sh) & 15) << 4));
    }
}

__device__ inline void k4_meta(const uint8_t *in, uint8_t *out) {
    const uint8_t *sc = in + 4;
    uint32_t lo_sc = 0, lo_mn = 0, hi = 0;
    for (int p = 0; p < 8; p++) {
        int s = p < 4 ? sc[p] & 63 : (sc[p + 4] & 0xF) | ((sc[p - 4] >> 6) << 4);
        int m = p < 4 ? sc[p + 4] & 63 : (sc[p + 4] >> 4) | ((sc[p] >> 6) << 4);
        lo_sc |= (uint32_t)(s & 15) << (4 * p);
        lo_mn |= (uint32_t)(m & 15) << (4 * p);
        hi |= (uint32_t)((s >> 4) | ((m >> 4) << 2)) << (4 * p);
    }
    for (int i = 0; i < 4; i++) out[i] = in[i]; /* d, dmin */
    put_word(out + 4, lo_sc), put_word(out + 8, lo_mn), put_word(out + 12, hi);
}

__device__ __forceinline__ void k4_load_meta(const uint8_t *p, kraw &r) {
    uint4 m = *(const uint4 *)p;
    r.dm = m.x, r.sc[0] = (int)m.y, r.sc[1] = (int)m.z, r.sc[2] = (int)m.w;
}

__device__ __forceinline__ void k4_set_scale(const kraw &r, int part, kpart &p) {
    int s4 = 4 * part;
    int sc = ((r.sc[0] >> s4) & 15) | (((r.sc[2] >> s4) & 3) << 4);
    int mn = ((r.sc[1] >> s4) & 15) | (((r.sc[2] >> s4) & 12) << 2);
    set_scale(p, half_lo(r.dm) * (float)sc, -half_hi(r.dm) * (float)mn);
}

/* Q4_K: the K-quant block above, device order as k4_low_nibbles and k4_meta make it. A part is two 16-byte loads
 * and a constant shift a value, where the file's order took six loads, a run-time shift of every word and a run-time
 * byte select of the scales. */
struct q4_K_t {
    static constexpr int block_bytes = 144, parts = 8, n_fields = 2;
    static constexpr bool has_min = true;
    static constexpr int raw_words = 8; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{0, 128}, {128, 16}}; /* of to_device's block */
    __device__ static void to_device(const uint8_t *in, uint8_t *out) {
        k4_low_nibbles(in + 16, out);
        k4_meta(in, out + 128);
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 128>(t, g) + 16 * part, r.qs);
        k4_load_meta(field<128, 16>(t, g), r);
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        k4_set_scale(r, part, p);
    }
};

/* Q5_K: as Q4_K plus qh[32] (file offset 16, before qs), whose bit p of qh[e] is the fifth bit of part p's element
 * e. On the device each part's fifth bits are one word of their own, element 4k + b's at bit 8b + k, so that word k
 * of the decoded part takes its four with one shift and mask: three loads a part (16, 4 and 16 bytes) where the
 * file's order took eight. */
struct q5_K_t {
    static constexpr int block_bytes = 176, parts = 8, n_fields = 3;
    static constexpr bool has_min = true;
    static constexpr int raw_words = 9; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{0, 128}, {128, 32}, {160, 16}}; /* of to_device's block */
    __device__ static void to_device(const uint8_t *in, uint8_t *out) {
        const uint8_t *qh = in + 16;
        k4_low_nibbles(in + 48, out);
        for (int p = 0; p < 8; p++) put_word(out + 128 + 4 * p, bit_word(qh, p));
        k4_meta(in, out + 160);
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 128>(t, g) + 16 * part, r.qs);
        r.hi[0] = (int)ldu32(field<128, 32>(t, g) + 4 * part);
        k4_load_meta(field<160, 16>(t, g), r);
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
        nibbles32(r.qs, p);
        add_fifth_bit((uint32_t)r.hi[0], p);
        k4_set_scale(r, part, p);
    }
};

/* Q6_K. In the file: ql[128] (part p = 4n + j: nibble j / 2 of ql[64n + 32 (j & 1) ..]), qh[64] (two bits at
 * shift 2j of qh[32n ..]), int8 scales[16] (part p's two at 2p), d; q = bits - 32. On the device (to_device, at
 * upload) each part's low nibbles are 16 bytes of their own, packed as Q4_0's, and its high bits 8 bytes of their
 * own, as k2_low_bits lays out 2-bit fields, so that each word of the decoded part takes its high bits with one
 * constant shift and mask. A part is four loads (16, 8, 2 and 2 bytes) where the file's order
 * took six (64 bytes for 24 of use), with run-time shifts of every word. */
struct q6_K_t {
    static constexpr int block_bytes = 210, parts = 8, n_fields = 4;
    static constexpr bool has_min = false;
    static constexpr int raw_words = 8; /* registers a loaded part holds */
    static constexpr kfield fields[n_fields] = {{0, 128}, {128, 64}, {192, 16}, {208, 2}}; /* of to_device's block */
    __device__ static void to_device(const uint8_t *in, uint8_t *out) {
        const uint8_t *ql = in;
        for (int p = 0; p < 8; p++) {
            const uint8_t *src = ql + 64 * (p >> 2) + 32 * (p & 1);
            int sh = 4 * ((p & 3) >> 1);
            for (int i = 0; i < 16; i++)
                out[16 * p + i] = (uint8_t)(((src[i] >> sh) & 15) | (((src[16 + i] >> sh) & 15) << 4));
        }
        k2_low_bits(in + 128, out + 128); /* qh's 2-bit fields sit as Q2_K's qs */
        for (int i = 192; i < 210; i++) out[i] = in[i];
    }
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) {
        ld16(field<0, 128>(t, g) + 16 * part, r.qs);
        ld8(field<128, 64>(t, g) + 8 * part, r.hi);
        r.sc[0] = (int)ldu16(field<192, 16>(t, g) + 2 * part);
        r.dm = ldu16(field<208, 2>(t, g));
    }
    __device__ static void decode(const kraw &r, int part, kpart &p) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int lo = k < 4 ? r.qs[k] & 0x0F0F0F0F : (r.qs[k - 4] >> 4) & 0x0F0F0F0F;
            p.q[k] = __vsub4(lo | (low2_word(r.hi, k) << 4), 0x20202020);
        }
        float d = half_lo(r.dm);
        p.d[0] = d * (float)(int8_t)(r.sc[0] & 0xFF);
        p.d[1] = d * (float)(int8_t)(r.sc[0] >> 8);
        p.m[0] = p.m[1] = 0.0f;
    }
};

/* Part `part` of block g of t, decoded. */
template <class F>
__device__ __forceinline__ void unpack_part(const qtensor &t, int64_t g, int part, kpart &p) {
    kraw r;
    F::load(t, g, part, r);
    F::decode(r, part, p);
}

/* Eight consecutive weights of a float row as F32: one 16-byte load for F16/BF16, two for F32. */
template <kiln_type T>
__device__ __forceinline__ void load8(const uint8_t *row, int i8, float v[8]) {
    if (T == KILN_TYPE_F32) {
        const float4 *p = (const float4 *)row + 2 * i8;
        float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        uint4 r = ((const uint4 *)row)[i8];
        uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (T == KILN_TYPE_F16) {
                __half2 h = *(__half2 *)&words[i];
                float2 f = __half22float2(h);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            } else {
                v[2 * i] = __uint_as_float(words[i] << 16);
                v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
            }
        }
    }
}

/* The eight weights w dotted with x[8 * i8 ..] (F32 activations). */
__device__ __forceinline__ float dot8f(const float w[8], const float *x, int i8) {
    const float4 *xp = (const float4 *)x + 2 * i8;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

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

/* Q8_1 activations on the device, for n values: n int8 (16-byte aligned), then n / 32 (d, s) half pairs, where
 * s = d * sum of the block's values. Same numbers as block_q8_1, stored field by field like the weights. */
struct q8_1_view {
    const int8_t *qs;
    const __half2 *ds;
};

__device__ __forceinline__ q8_1_view q8_1_at(const void *buf, int64_t n) {
    q8_1_view v = {(const int8_t *)buf, (const __half2 *)((const int8_t *)buf + n)};
    return v;
}

/* Field f of blocks [g0, g1) of t into L2 (f past the format's fields: nothing). */
template <class F, int FIELD = 0>
__device__ __forceinline__ void prefetch_field(const qtensor &t, int f, int64_t g0, int64_t g1, int64_t soa_off = 0) {
    constexpr int size = F::fields[FIELD].size;
    const uint8_t *base = t.base + soa_off * t.n_blocks;
    if (f == FIELD) prefetch_l2(base + g0 * size, base + g1 * size);
    if constexpr (FIELD + 1 < F::n_fields) prefetch_field<F, FIELD + 1>(t, f, g0, g1, soa_off + size);
}

/* Blocks [g0, g1) of t into L2, field by field (each field's blocks are consecutive bytes), lane f asking for field
 * f. A GEMV's warps ask for the start of their rows this way before waiting for the previous kernel (programmatic
 * dependent launch): the weights do not depend on it, so their first bytes come from DRAM while it finishes. */
template <class F>
__device__ __forceinline__ void prefetch_blocks(const qtensor &t, int64_t g0, int64_t g1) {
    prefetch_field<F>(t, threadIdx.x & 31, g0, g1);
}

/* The plain sums of each half of a Q8_1 block's 32 values (the offsets multiply them), exactly from the int8s. */
__device__ __forceinline__ void q8_1_half_sums(const int xq[8], int &t0, int &t1) {
    t0 = t1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        t0 = __dp4a(0x01010101, xq[i], t0);
        t1 = __dp4a(0x01010101, xq[4 + i], t1);
    }
}

/* Dot product of a decoded part with a Q8_1 block's values xq, before the block's scale: int8 dp4a per half, the
 * part's scales applied once per half. The offsets multiply the half sums of xq: given (t0, t1, a held block's) or
 * taken here. */
template <bool HAS_MIN, bool SUMS_GIVEN>
__device__ __forceinline__ float dot_decoded(const kpart &p, const int xq[8], int t0, int t1) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s0 = __dp4a(p.q[i], xq[i], s0);
        s1 = __dp4a(p.q[4 + i], xq[4 + i], s1);
    }
    float v = p.d[0] * (float)s0 + p.d[1] * (float)s1;
    if (HAS_MIN) {
        if (!SUMS_GIVEN) q8_1_half_sums(xq, t0, t1);
        v += p.m[0] * (float)t0 + p.m[1] * (float)t1;
    }
    return v;
}

/* Dot product of a loaded part with Q8_1 block u of x, loaded after the part is decoded (its weights' DRAM loads
 * were issued first). */
template <class F>
__device__ __forceinline__ float dot_loaded(const kraw &r, int part, const q8_1_view &x, int u) {
    kpart p;
    F::decode(r, part, p);
    int xq[8];
    ld32b((const uint8_t *)(x.qs + 32 * (int64_t)u), xq);
    return dot_decoded<F::has_min, false>(p, xq, 0, 0) * __low2float(x.ds[u]);
}

/* One Q8_1 block of the activations as a lane holds it: its values, its scale and their half sums. A loop over
 * rows that share the activations holds them once (gemv_q_loop_kernel). */
struct q8_1_held {
    int q[8];
    float d;
    int t0, t1;
};

template <class F>
__device__ __forceinline__ void hold_q8_1(const q8_1_view &x, int u, q8_1_held &h) {
    ld32b((const uint8_t *)(x.qs + 32 * (int64_t)u), h.q);
    h.d = __low2float(x.ds[u]);
    h.t0 = h.t1 = 0;
    if (F::has_min) q8_1_half_sums(h.q, h.t0, h.t1);
}

template <class F>
__device__ __forceinline__ float dot_held(const kraw &r, int part, const q8_1_held &h) {
    kpart p;
    F::decode(r, part, p);
    return dot_decoded<F::has_min, true>(p, h.q, h.t0, h.t1) * h.d;
}

/* Dot product of part `part` of block g with Q8_1 block u of x. The activations are loaded after the weights, so
 * the weight loads (from DRAM) are issued first. */
template <class F>
__device__ __forceinline__ float dot_part(const qtensor &t, int64_t g, int part, const q8_1_view &x, int u) {
    kraw r;
    F::load(t, g, part, r);
    return dot_loaded<F>(r, part, x, u);
}

#endif
