/* A kiln_gguf's metadata and tensor table built in memory: the safetensors reader presents a folder through it, and
 * quantize and synth assemble the metadata of the files they write with it. Every string and array lives in the
 * container's arena, so kiln_gguf_close() on the finished container releases it all. */
#ifndef KILN_FORMAT_META_BUILDER_H
#define KILN_FORMAT_META_BUILDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

typedef struct kiln_meta {
    kiln_gguf *g; /* the container being built (g->kv and g->tensors grow by doubling) */
    uint64_t cap_kv, cap_tensors;
} kiln_meta;

/* Starts an empty container; path is what g->path will say. */
int kiln_meta_init(kiln_meta *m, const char *path, kiln_error *err);
/* Indexes the names (failing on duplicates) and hands the container over; m is empty afterwards. */
kiln_gguf *kiln_meta_finish(kiln_meta *m, kiln_error *err);
/* Drops an unfinished container. */
void kiln_meta_discard(kiln_meta *m);

/* Setters replace a key that is already present, so a copied header can be amended. Each returns 0 or -1 (out of
 * memory, with err set). */
int kiln_meta_set_u32(kiln_meta *m, const char *key, uint32_t v, kiln_error *err);
int kiln_meta_set_i32(kiln_meta *m, const char *key, int32_t v, kiln_error *err);
int kiln_meta_set_f32(kiln_meta *m, const char *key, float v, kiln_error *err);
int kiln_meta_set_bool(kiln_meta *m, const char *key, bool v, kiln_error *err);
int kiln_meta_set_str(kiln_meta *m, const char *key, const char *v, kiln_error *err);
/* An array of strings, copied. */
int kiln_meta_set_str_arr(kiln_meta *m, const char *key, const kiln_str *v, uint64_t n, kiln_error *err);
/* An array of numbers of elem_type (native layout), copied. */
int kiln_meta_set_arr(kiln_meta *m, const char *key, kiln_gguf_vtype elem_type, const void *data, uint64_t n,
                      kiln_error *err);
/* Copies a value from another container (strings and arrays deep-copied). */
int kiln_meta_set_value(kiln_meta *m, const char *key, const kiln_gguf_value *v, kiln_error *err);
void kiln_meta_remove(kiln_meta *m, const char *key);
const kiln_gguf_value *kiln_meta_get(const kiln_meta *m, const char *key);

/* Appends a tensor entry (name copied); returns it for the caller to fill, or NULL when out of memory. */
kiln_gguf_tensor *kiln_meta_add_tensor(kiln_meta *m, const char *name, kiln_error *err);

#endif
