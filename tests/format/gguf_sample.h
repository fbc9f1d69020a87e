/* A small valid GGUF built byte by byte, with the offset of every field recorded, so tests can cut it at each
 * section boundary or overwrite one field with a hostile value. */
#ifndef KILN_TESTS_FORMAT_GGUF_SAMPLE_H
#define KILN_TESTS_FORMAT_GGUF_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLE_MAX_BYTES 4096
#define SAMPLE_MAX_MARKS 256

typedef struct sample_mark {
    char name[48]; /* e.g. "kv3.type", "tensor1.offset", "data" */
    size_t at;
} sample_mark;

typedef struct gguf_sample {
    uint8_t bytes[SAMPLE_MAX_BYTES];
    size_t size;
    sample_mark marks[SAMPLE_MAX_MARKS];
    int n_marks;
} gguf_sample;

/* Builds the sample: 17 metadata keys covering every value type (string arrays, nested arrays, general.alignment
 * = 32) and three tensors (f32 [8,2], q8_0 [32,2], f32 [8]) whose data ends exactly at the end of the file.
 * array_depth > 0 adds one more key holding arrays nested that deep. */
void gguf_sample_build(gguf_sample *s, int array_depth);

/* Offset of a named field; fails the test when the name is unknown. */
size_t gguf_sample_at(const gguf_sample *s, const char *name);

void gguf_sample_put_u32(gguf_sample *s, const char *field, uint32_t v);
void gguf_sample_put_u64(gguf_sample *s, const char *field, uint64_t v);

#endif
