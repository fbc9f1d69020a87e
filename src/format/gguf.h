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

/* Opens GGUF bytes already in memory (they must outlive the container); name stands for the file in errors. */
int kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out, kiln_error *err);

/* Limits the reader enforces beyond the file's own size. */
#define KILN_GGUF_MAX_STRING (1ull << 30)
#define KILN_GGUF_MAX_KEY 65535
#define KILN_GGUF_MAX_TENSOR_NAME 1024
#define KILN_GGUF_MAX_ARRAY_DEPTH 8
#define KILN_GGUF_DEFAULT_ALIGNMENT 32

/* Size in bytes of one element of a number type (UINT8..FLOAT64, BOOL); 0 for STRING and ARRAY. */
size_t kiln_gguf_vtype_size(kiln_gguf_vtype t);
/* "u32", "string", "array", ...; "invalid" for ids outside the enum. */
const char *kiln_gguf_vtype_name(uint32_t t);

/* Building a container (the GGUF reader and the safetensors translator both do it this way):
 * kiln_gguf_new makes an empty one; every other piece of storage comes from kiln_gguf_alloc or kiln_gguf_map_file
 * and is released by kiln_gguf_close, except g->kv and g->tensors, which must come from malloc (close frees them). */
kiln_gguf *kiln_gguf_new(const char *path); /* NULL when out of memory */
void *kiln_gguf_alloc(kiln_gguf *g, size_t size); /* zeroed, 16-byte aligned; NULL when out of memory */
/* Copies len bytes and a terminating NUL; .ptr is NULL when out of memory. */
kiln_str kiln_gguf_strdup(kiln_gguf *g, const char *s, size_t len);
/* Maps a file read-only for the container's lifetime (an empty file gives data NULL, size 0). */
int kiln_gguf_map_file(kiln_gguf *g, const char *path, const void **data, size_t *size, kiln_error *err);

/* Which entry repeats a name, as kiln_gguf_build_index found it. */
typedef struct kiln_gguf_dup {
    bool is_tensor;          /* a tensor name; otherwise a metadata key */
    uint64_t first, second;  /* indices into g->kv or g->tensors */
} kiln_gguf_dup;

/* Builds the hash lookup behind kiln_gguf_get and kiln_gguf_find_tensor (they fall back to a scan without it).
 * Fails on a repeated key or tensor name (message names it; dup, if non-NULL, says where). */
int kiln_gguf_build_index(kiln_gguf *g, kiln_gguf_dup *dup, kiln_error *err);

#endif
