/* IEEE half and bfloat16 <-> float, exact (round to nearest even), usable from any ISA's code. */
#ifndef KILN_UTIL_HALF_H
#define KILN_UTIL_HALF_H

#include <stdint.h>
#include <string.h>

typedef uint16_t kiln_half;
typedef uint16_t kiln_bf16;

static inline float kiln_bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t kiln_float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kiln_half_to_float(kiln_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return kiln_bits_to_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return kiln_bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline kiln_half kiln_float_to_half(float f) {
    uint32_t x = kiln_float_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (kiln_half)(sign | 0x7e00); /* NaN */
    if (absx >= 0x477ff000u) return (kiln_half)(sign | 0x7c00); /* overflow after rounding -> inf */
    if (absx < 0x38800000u) {
        /* result is subnormal or zero: scale into the integer range and round to nearest even */
        float v = kiln_bits_to_float(absx) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1))) m++;
        return (kiln_half)(sign | m);
    }
    uint32_t rounded = absx + 0xfffu + ((absx >> 13) & 1);
    return (kiln_half)(sign | ((rounded - 0x38000000u) >> 13));
}

static inline float kiln_bf16_to_float(kiln_bf16 h) { return kiln_bits_to_float((uint32_t)h << 16); }

static inline kiln_bf16 kiln_float_to_bf16(float f) {
    uint32_t x = kiln_float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((x >> 16) | 0x40); /* quiet NaN */
    return (kiln_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

#endif
