/* xoshiro256**: a small, fast PRNG with a fixed algorithm, so a seed gives the same text on every machine. The
 * steps are inline for the GPU too: a decode step that samples on the device advances the host sampler's state. */
#ifndef KILN_SAMPLE_RNG_H
#define KILN_SAMPLE_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

typedef struct kiln_rng {
    uint64_t s[4];
} kiln_rng;

/* Seeds the state through splitmix64, so nearby seeds give unrelated streams. */
void kiln_rng_seed(kiln_rng *r, uint64_t seed);

static inline KILN_HD uint64_t kiln_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline KILN_HD uint64_t kiln_rng_next(kiln_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = kiln_rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kiln_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1), 24 random bits. */
static inline KILN_HD float kiln_rng_uniform(kiln_rng *r) {
    return (float)(kiln_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

#endif
