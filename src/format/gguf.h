/* GGUF v2/v3 reader (mmap, every field validated before use) and the in-memory shape every model container takes:
 * a safetensors folder is presented through the same struct, its config.json and tokenizer.json translated into
 * GGUF metadata keys and its tensors renamed to GGUF names (format/safetensors.h). */
#ifndef KILN_FORMAT_GGUF_H
#define KILN_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant/types.h"
#include "util/error.h"

typedef enum kiln_gguf_vtype {
    KILN_GGUF_UINT8 = 0,
    KILN_GGUF_INT8 = 1,
    KILN_GGUF_UINT16 = 2,
    KILN_GGUF_INT16 = 3,
    KILN_GGUF_UINT32 = 4,
    KILN_GGUF_INT32 = 5,
    KILN_GGUF_FLOAT32 = 6,
    KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9,
    KILN_GGUF_UINT64 = 10,
    KILN_GGUF_INT64 = 11,
    KILN_GGUF_FLOAT64 = 12,
} kiln_gguf_vtype;

/* A string owned by the container, NUL-terminated for convenience; len is authoritative (may hold NUL bytes). */
typedef struct kiln_str {
    const char *ptr;
    uint64_t len;
} kiln_str;

typedef struct kiln_gguf_value {
    kiln_gguf_vtype type;
    union {
        uint64_t u64; /* unsigned integer types */
        int64_t i64;  /* signed integer types */
        double f64;   /* float types */
        bool b;
        kiln_str str;
        struct {
            kiln_gguf_vtype elem_type;
            uint64_t n;
            /* numbers: an aligned native array of elem_type; strings: kiln_str[n]; arrays: kiln_gguf_value[n] */
            const void *data;
        } arr;
    };
} kiln_gguf_value;

typedef struct kiln_gguf_kv {
    kiln_str key;
    kiln_gguf_value value;
} kiln_gguf_kv;

#define KILN_MAX_DIMS 4

typedef struct kiln_gguf_tensor {
    kiln_str name;
    uint32_t n_dims;
    int64_t ne[KILN_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    kiln_type type;
    uint64_t offset;  /* from the start of the data section (GGUF) or of its file (safetensors) */
    uint64_t size;    /* bytes */
    const void *data; /* inside the mapping */
} kiln_gguf_tensor;

typedef struct kiln_gguf {
    char *path;
    uint32_t version; /* 2 or 3; 0 for a container built from a safetensors folder */
    uint64_t n_kv;
    kiln_gguf_kv *kv;
    uint64_t n_tensors;
    kiln_gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    void *impl; /* mappings and owned storage */
} kiln_gguf;

/* Opens and validates a GGUF file. Errors name the file, the field and its byte offset. */
int kiln_gguf_open(const char *path, kiln_gguf **out, kiln_error *err);
/* Opens a GGUF file or a safetensors model folder, by what the path is. */
int kiln_model_file_open(const char *path, kiln_gguf **out, kiln_error *err);
void kiln_gguf_close(kiln_gguf *g);

const kiln_gguf_value *kiln_gguf_get(const kiln_gguf *g, const char *key);
/* Typed getters: return false when the key is absent or not of a compatible kind (any integer type for _int,
 * any float or integer type for _float). */
bool kiln_gguf_get_int(const kiln_gguf *g, const char *key, int64_t *out);
bool kiln_gguf_get_float(const kiln_gguf *g, const char *key, double *out);
bool kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out);
const char *kiln_gguf_get_str(const kiln_gguf *g, const char *key); /* NULL if absent or not a string */
/* Array value of the given element type, or NULL. */
const kiln_gguf_value *kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_vtype elem_type);

const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name);
int64_t kiln_tensor_nelements(const kiln_gguf_tensor *t);

#endif
