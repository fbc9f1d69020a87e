#include "format/gguf_sample.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void mark(gguf_sample *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mark(gguf_sample *s, const char *fmt, ...) {
    if (s->n_marks == SAMPLE_MAX_MARKS) abort();
    sample_mark *m = &s->marks[s->n_marks++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->name, sizeof m->name, fmt, ap);
    va_end(ap);
    m->at = s->size;
}

static void put(gguf_sample *s, const void *p, size_t n) {
    if (s->size + n > SAMPLE_MAX_BYTES) abort();
    memcpy(s->bytes + s->size, p, n);
    s->size += n;
}

static void u32(gguf_sample *s, uint32_t v) { put(s, &v, 4); }
static void u64(gguf_sample *s, uint64_t v) { put(s, &v, 8); }
static void str(gguf_sample *s, const char *v) {
    u64(s, strlen(v));
    put(s, v, strlen(v));
}

/* Key and type of metadata entry i; the caller writes the value. */
static void kv_head(gguf_sample *s, int i, const char *key, uint32_t type) {
    mark(s, "kv%d", i);
    str(s, key);
    mark(s, "kv%d.type", i);
    u32(s, type);
    mark(s, "kv%d.value", i);
}

static void kv_scalar(gguf_sample *s, int i, const char *key, uint32_t type, uint64_t bits, size_t n) {
    kv_head(s, i, key, type);
    put(s, &bits, n); /* little-endian host: the low n bytes */
}

static void nested(gguf_sample *s, int depth) {
    u32(s, depth > 1 ? 9 : 5);
    u64(s, 1);
    if (depth > 1) nested(s, depth - 1);
    else u32(s, 7);
}

static void tensor_info(gguf_sample *s, int i, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                        uint64_t offset) {
    mark(s, "tensor%d", i);
    str(s, name);
    mark(s, "tensor%d.n_dims", i);
    u32(s, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) {
        mark(s, "tensor%d.ne%u", i, d);
        u64(s, ne[d]);
    }
    mark(s, "tensor%d.type", i);
    u32(s, type);
    mark(s, "tensor%d.offset", i);
    u64(s, offset);
}

void gguf_sample_build(gguf_sample *s, int array_depth) {
    memset(s, 0, sizeof *s);
    mark(s, "magic");
    put(s, "GGUF", 4);
    mark(s, "version");
    u32(s, 3);
    mark(s, "n_tensors");
    u64(s, 3);
    mark(s, "n_kv");
    u64(s, array_depth > 0 ? 18 : 17);

    kv_head(s, 0, "general.architecture", 8);
    str(s, "llama");
    kv_scalar(s, 1, "general.alignment", 4, 32, 4);
    kv_scalar(s, 2, "llama.block_count", 4, 1, 4);
    kv_scalar(s, 3, "u8", 0, 200, 1);
    kv_scalar(s, 4, "i8", 1, 0x80, 1);
    kv_scalar(s, 5, "u16", 2, 60000, 2);
    kv_scalar(s, 6, "i16", 3, 0x8000, 2);
    kv_scalar(s, 7, "i32", 5, 0xfffffffe, 4);
    kv_scalar(s, 8, "f32", 6, 0x3fc00000, 4); /* 1.5f */
    kv_scalar(s, 9, "bool", 7, 1, 1);
    kv_scalar(s, 10, "u64", 10, 1ull << 40, 8);
    kv_scalar(s, 11, "i64", 11, (uint64_t)-5, 8);
    kv_scalar(s, 12, "f64", 12, 0x4004000000000000ull, 8); /* 2.5 */
    kv_head(s, 13, "tokenizer.ggml.tokens", 9);
    mark(s, "kv13.elem_type");
    u32(s, 8);
    mark(s, "kv13.count");
    u64(s, 3);
    const char *toks[] = {"<s>", "", "he\xe2\x96\x81llo"};
    for (int i = 0; i < 3; i++) {
        mark(s, "kv13.str%d", i);
        str(s, toks[i]);
    }
    kv_head(s, 14, "tokenizer.ggml.token_type", 9);
    mark(s, "kv14.elem_type");
    u32(s, 5);
    mark(s, "kv14.count");
    u64(s, 3);
    for (int32_t i = 1; i <= 3; i++) u32(s, (uint32_t)i);
    kv_head(s, 15, "nested", 9); /* [[1, 2], []] of i32 */
    mark(s, "kv15.elem_type");
    u32(s, 9);
    mark(s, "kv15.count");
    u64(s, 2);
    mark(s, "kv15.inner0");
    u32(s, 5);
    mark(s, "kv15.inner0.count");
    u64(s, 2);
    u32(s, 1);
    u32(s, 2);
    u32(s, 5);
    u64(s, 0);
    kv_head(s, 16, "flags", 9); /* [true, false] */
    u32(s, 7);
    u64(s, 2);
    put(s, "\x01\x00", 2);
    if (array_depth > 0) {
        kv_head(s, 17, "deep", 9);
        nested(s, array_depth);
    }

    tensor_info(s, 0, "a", 2, (const uint64_t[]){8, 2}, 0, 0);
    tensor_info(s, 1, "b", 2, (const uint64_t[]){32, 2}, 8, 64);
    tensor_info(s, 2, "c", 1, (const uint64_t[]){8}, 0, 160);
    mark(s, "padding");
    while (s->size % 32) put(s, "", 1);
    mark(s, "data");
    for (int i = 0; i < 192; i++) {
        uint8_t b = (uint8_t)(i * 7 + 3);
        put(s, &b, 1);
    }
    mark(s, "end");
}

size_t gguf_sample_at(const gguf_sample *s, const char *name) {
    for (int i = 0; i < s->n_marks; i++)
        if (strcmp(s->marks[i].name, name) == 0) return s->marks[i].at;
    fprintf(stderr, "gguf_sample: no field '%s'\n", name);
    abort();
}

void gguf_sample_put_u32(gguf_sample *s, const char *field, uint32_t v) {
    memcpy(s->bytes + gguf_sample_at(s, field), &v, 4);
}

void gguf_sample_put_u64(gguf_sample *s, const char *field, uint64_t v) {
    memcpy(s->bytes + gguf_sample_at(s, field), &v, 8);
}
