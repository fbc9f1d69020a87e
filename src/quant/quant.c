/* The operations table: merges every family's kernels per ISA (with fall-back to lower levels) and detects what the
 * CPU can run. */
#include "quant/quant.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif

extern const kiln_quant_family kiln_float_scalar_family;
extern const kiln_quant_family kiln_legacy_scalar_family;
extern const kiln_quant_family kiln_float_avx2_family;
extern const kiln_quant_family kiln_legacy_avx2_family;
extern const kiln_quant_family kiln_float_avx512_family;
extern const kiln_quant_family kiln_legacy_avx512_family;
extern const kiln_quant_family kiln_legacy_avx512_vnni_family;
extern const kiln_quant_family kiln_kquant_scalar_family;
extern const kiln_quant_family kiln_kquant_avx2_family;
extern const kiln_quant_family kiln_kquant_avx512_family;
extern const kiln_quant_family kiln_kquant_avx512_vnni_family;
extern const kiln_quant_family kiln_kquant_quantize_avx2_family;
extern const kiln_quant_family kiln_kquant_quantize_avx512_family;

/* To register a family: add its `extern const kiln_quant_family ...;` declaration above and its address here.
 * The k-quant families (kquant*.c) go at the end of this list. Order does not matter: levels decide precedence. */
static const kiln_quant_family *const FAMILIES[] = {
    &kiln_float_scalar_family,
    &kiln_legacy_scalar_family,
    &kiln_float_avx2_family,
    &kiln_legacy_avx2_family,
    &kiln_float_avx512_family,
    &kiln_legacy_avx512_family,
    &kiln_legacy_avx512_vnni_family,
    &kiln_kquant_scalar_family,
    &kiln_kquant_avx2_family,
    &kiln_kquant_avx512_family,
    &kiln_kquant_avx512_vnni_family,
    &kiln_kquant_quantize_avx2_family,
    &kiln_kquant_quantize_avx512_family,
};
#define N_FAMILIES ((int)(sizeof FAMILIES / sizeof FAMILIES[0]))

#define N_ISA 3

static kiln_quant_ops TABLE[N_ISA][KILN_TYPE_COUNT];
static bool PRESENT[N_ISA][KILN_TYPE_COUNT];
static bool LEVEL_OK[KILN_LEVEL_COUNT];
static kiln_isa HW_ISA, CPU_ISA;
static pthread_once_t INIT_ONCE = PTHREAD_ONCE_INIT;

#ifdef KILN_X86
/* The OS must save the wide registers on context switch, or using them corrupts state: XCR0 tells. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_levels(void) {
    uint32_t a, b, c, d;
    LEVEL_OK[KILN_LEVEL_SCALAR] = true;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    if (!osxsave || !avx) return;
    uint64_t xcr0 = read_xcr0();
    bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    bool avx2 = b & (1u << 5);
    bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31)); /* F DQ BW VL */
    bool vnni = c & (1u << 11);
    LEVEL_OK[KILN_LEVEL_AVX2] = ymm_os && avx2 && fma && f16c;
    LEVEL_OK[KILN_LEVEL_AVX512] = LEVEL_OK[KILN_LEVEL_AVX2] && zmm_os && avx512;
    LEVEL_OK[KILN_LEVEL_AVX512_VNNI] = LEVEL_OK[KILN_LEVEL_AVX512] && vnni;
}
#else
static void detect_levels(void) { LEVEL_OK[KILN_LEVEL_SCALAR] = true; }
#endif

static kiln_isa hardware_isa(void) {
    if (LEVEL_OK[KILN_LEVEL_AVX512]) return KILN_ISA_AVX512;
    if (LEVEL_OK[KILN_LEVEL_AVX2]) return KILN_ISA_AVX2;
    return KILN_ISA_SCALAR;
}

/* KILN_ISA may only lower the ISA: asking for more than the CPU has would crash on the first kernel. */
static kiln_isa env_isa(kiln_isa hw) {
    const char *want = getenv("KILN_ISA");
    if (!want) return hw;
    for (int i = 0; i < N_ISA; i++)
        if (strcmp(want, kiln_isa_name((kiln_isa)i)) == 0) return (kiln_isa)i < hw ? (kiln_isa)i : hw;
    return hw;
}

/* The highest level an ISA's table draws from; VNNI kernels replace plain AVX-512 ones only where the CPU has it. */
static kiln_quant_level top_level(kiln_isa isa) {
    if (isa == KILN_ISA_SCALAR) return KILN_LEVEL_SCALAR;
    if (isa == KILN_ISA_AVX2) return KILN_LEVEL_AVX2;
    return LEVEL_OK[KILN_LEVEL_AVX512_VNNI] ? KILN_LEVEL_AVX512_VNNI : KILN_LEVEL_AVX512;
}

static void overlay(kiln_quant_ops *dst, const kiln_quant_ops *src, kiln_quant_level level) {
    if (src->dequantize) dst->dequantize = src->dequantize;
    if (src->quantize) dst->quantize = src->quantize;
    if (src->vec_dot) dst->vec_dot = src->vec_dot, dst->vec_dot_rows = src->vec_dot_rows;
    if (level == KILN_LEVEL_SCALAR) dst->vec_dot_type = src->vec_dot_type;
}

static void merge_isa(kiln_isa isa) {
    kiln_quant_level top = top_level(isa);
    for (int level = KILN_LEVEL_SCALAR; level <= (int)top; level++) {
        for (int f = 0; f < N_FAMILIES; f++) {
            const kiln_quant_family *fam = FAMILIES[f];
            if ((int)fam->level != level) continue;
            for (int e = 0; e < fam->n_entries; e++) {
                const kiln_quant_entry *entry = &fam->entries[e];
                /* a SIMD kernel without a scalar reference would have nothing to fall back to or test against */
                if (level != KILN_LEVEL_SCALAR && !PRESENT[isa][entry->type]) continue;
                overlay(&TABLE[isa][entry->type], &entry->ops, fam->level);
                PRESENT[isa][entry->type] = true;
            }
        }
    }
}

static void init_table(void) {
    detect_levels();
    HW_ISA = hardware_isa();
    CPU_ISA = env_isa(HW_ISA);
    for (int isa = 0; isa <= (int)HW_ISA; isa++) merge_isa((kiln_isa)isa);
}

static void ensure_init(void) { pthread_once(&INIT_ONCE, init_table); }

kiln_isa kiln_cpu_isa(void) {
    ensure_init();
    return CPU_ISA;
}

const char *kiln_isa_name(kiln_isa isa) {
    switch (isa) {
    case KILN_ISA_SCALAR: return "scalar";
    case KILN_ISA_AVX2: return "avx2";
    case KILN_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

bool kiln_quant_level_supported(kiln_quant_level level) {
    ensure_init();
    return (int)level >= 0 && level < KILN_LEVEL_COUNT && LEVEL_OK[level];
}

const kiln_quant_family *const *kiln_quant_families(int *count) {
    *count = N_FAMILIES;
    return FAMILIES;
}

const kiln_quant_ops *kiln_quant_ops_get(kiln_type type, kiln_isa isa) {
    ensure_init();
    if ((int)type < 0 || type >= KILN_TYPE_COUNT || (int)isa < 0 || (int)isa >= N_ISA) return NULL;
    if (isa > HW_ISA) isa = HW_ISA;
    return PRESENT[isa][type] ? &TABLE[isa][type] : NULL;
}

const kiln_quant_ops *kiln_quant_ops_best(kiln_type type) { return kiln_quant_ops_get(type, kiln_cpu_isa()); }
