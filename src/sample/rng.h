/* xoshiro256**: a small, fast PRNG with a fixed algorithm, so a seed gives the same text on every machine. */
#ifndef KILN_SAMPLE_RNG_H
#define KILN_SAMPLE_RNG_H

#include <stdint.h>

typedef struct kiln_rng {
    uint64_t s[4];
} kiln_rng;

/* Seeds the state through splitmix64, so nearby seeds give unrelated streams. */
void kiln_rng_seed(kiln_rng *r, uint64_t seed);
uint64_t kiln_rng_next(kiln_rng *r);
/* Uniform in [0, 1), 24 random bits. */
float kiln_rng_uniform(kiln_rng *r);

#endif
