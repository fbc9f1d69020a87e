/* GGUF v2/v3 reader. The whole file is mapped read-only and parsed from memory with a bounds-checked cursor: every
 * count, length, offset and type id is checked against the bytes that remain (and the limits in gguf.h) before it
 * sizes an allocation or a loop, so a hostile file costs at most a small multiple of its own size in memory.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv × (string key, u32 type, value),
 * n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment,
 * tensor data. A string is u64 length + bytes; an array is u32 element type + u64 count + elements. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/gguf.h"
#include "format/safetensors.h"

#define GGUF_MAGIC "GGUF"
#define MIN_KV_BYTES 13u     /* key length, one key byte, value type */
#define MIN_TENSOR_BYTES 32u /* name length, n_dims, one dim, type, offset */

typedef struct cursor {
    const uint8_t *base;
    uint64_t size, pos;
    const char *name; /* the file, for messages */
    char ctx[160];    /* the entry being read, e.g. " of key 'general.name'", for messages */
    kiln_gguf *g;
    kiln_error *err;
} cursor;

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

/* "<file>: <field> at byte <offset>: <problem>" */
static int fail_at(const cursor *c, uint64_t at, const char *field, const char *problem) {
    return kiln_fail(c->err, "%s: %s%s at byte %" PRIu64 ": %s", c->name, field, c->ctx, at, problem);
}

static int need(const cursor *c, uint64_t n, const char *field) {
    if (n <= remaining(c)) return 0;
    return kiln_fail(c->err, "%s: %s%s at byte %" PRIu64 ": truncated (needs %" PRIu64 " bytes, file ends at byte %"
                     PRIu64 ")", c->name, field, c->ctx, c->pos, n, c->size);
}

static int read_bytes(cursor *c, void *out, uint64_t n, const char *field) {
    if (need(c, n, field)) return -1;
    memcpy(out, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int read_u32(cursor *c, uint32_t *v, const char *field) { return read_bytes(c, v, 4, field); }
static int read_u64(cursor *c, uint64_t *v, const char *field) { return read_bytes(c, v, 8, field); }

/* A string's bytes stay in the file; *len and *at say where. max caps the length beyond the file's own size. */
static int read_string_span(cursor *c, uint64_t max, const char *field, uint64_t *at, uint64_t *len) {
    uint64_t start = c->pos;
    if (read_u64(c, len, field)) return -1;
    if (*len > max) {
        char msg[96];
        snprintf(msg, sizeof msg, "length %" PRIu64 " exceeds the limit of %" PRIu64, *len, max);
        return fail_at(c, start, field, msg);
    }
    if (*len > remaining(c)) {
        char msg[96];
        snprintf(msg, sizeof msg, "length %" PRIu64 " runs past the end of the file", *len);
        return fail_at(c, start, field, msg);
    }
    *at = c->pos;
    c->pos += *len;
    return 0;
}

static int read_string(cursor *c, uint64_t max, const char *field, kiln_str *out) {
    uint64_t at, len;
    if (read_string_span(c, max, field, &at, &len)) return -1;
    *out = kiln_gguf_strdup(c->g, (const char *)c->base + at, len);
    if (!out->ptr) return kiln_fail(c->err, "%s: out of memory", c->name);
    return 0;
}

static int read_vtype(cursor *c, kiln_gguf_vtype *t, const char *field) {
    uint64_t at = c->pos;
    uint32_t v;
    if (read_u32(c, &v, field)) return -1;
    if (v > KILN_GGUF_FLOAT64) {
        char msg[64];
        snprintf(msg, sizeof msg, "unknown value type %" PRIu32, v);
        return fail_at(c, at, field, msg);
    }
    *t = (kiln_gguf_vtype)v;
    return 0;
}

/* Smallest encoding of one element, so an array's count can be checked against the bytes left. */
static uint64_t min_elem_bytes(kiln_gguf_vtype t) {
    if (t == KILN_GGUF_STRING) return 8;
    if (t == KILN_GGUF_ARRAY) return 12;
    return kiln_gguf_vtype_size(t);
}

/* Reads an array header (element type, count) and checks the count against the bytes left. */
static int read_array_header(cursor *c, int depth, kiln_gguf_vtype *et, uint64_t *n) {
    uint64_t at = c->pos;
    if (depth >= KILN_GGUF_MAX_ARRAY_DEPTH) return fail_at(c, at, "array", "arrays nested too deeply");
    if (read_vtype(c, et, "array element type")) return -1;
    uint64_t count_at = c->pos;
    if (read_u64(c, n, "array count")) return -1;
    if (*n > remaining(c) / min_elem_bytes(*et)) {
        char msg[128];
        snprintf(msg, sizeof msg, "%" PRIu64 " elements of %s do not fit in the %" PRIu64 " bytes left", *n,
                 kiln_gguf_vtype_name(*et), remaining(c));
        return fail_at(c, count_at, "array count", msg);
    }
    return 0;
}

/* Walks a value without storing it: checks the structure of string and nested arrays before their element
 * tables are allocated. */
static int skip_value(cursor *c, kiln_gguf_vtype t, int depth) {
    if (t == KILN_GGUF_STRING) {
        uint64_t at, len;
        return read_string_span(c, KILN_GGUF_MAX_STRING, "string", &at, &len);
    }
    if (t != KILN_GGUF_ARRAY) {
        if (need(c, kiln_gguf_vtype_size(t), "value")) return -1;
        c->pos += kiln_gguf_vtype_size(t);
        return 0;
    }
    kiln_gguf_vtype et = KILN_GGUF_UINT8;
    uint64_t n;
    if (read_array_header(c, depth, &et, &n)) return -1;
    if (et != KILN_GGUF_STRING && et != KILN_GGUF_ARRAY) {
        c->pos += n * kiln_gguf_vtype_size(et);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if (skip_value(c, et, depth + 1)) return -1;
    return 0;
}

static void scalar_from_bytes(kiln_gguf_value *v, kiln_gguf_vtype t, const uint8_t *p) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
            uint64_t u64; int64_t i64; double f64; } x;
    memcpy(&x, p, kiln_gguf_vtype_size(t));
    v->type = t;
    switch (t) {
    case KILN_GGUF_UINT8: v->u64 = x.u8; break;
    case KILN_GGUF_INT8: v->i64 = x.i8; break;
    case KILN_GGUF_UINT16: v->u64 = x.u16; break;
    case KILN_GGUF_INT16: v->i64 = x.i16; break;
    case KILN_GGUF_UINT32: v->u64 = x.u32; break;
    case KILN_GGUF_INT32: v->i64 = x.i32; break;
    case KILN_GGUF_FLOAT32: v->f64 = x.f32; break;
    case KILN_GGUF_BOOL: v->b = x.u8 != 0; break;
    case KILN_GGUF_UINT64: v->u64 = x.u64; break;
    case KILN_GGUF_INT64: v->i64 = x.i64; break;
    case KILN_GGUF_FLOAT64: v->f64 = x.f64; break;
    default: break;
    }
}

static int read_value(cursor *c, kiln_gguf_vtype t, int depth, kiln_gguf_value *v);

static void *alloc_or_fail(cursor *c, uint64_t n, size_t elem) {
    void *p = n <= SIZE_MAX / elem ? kiln_gguf_alloc(c->g, (size_t)(n * elem)) : NULL;
    if (!p) kiln_fail(c->err, "%s: out of memory", c->name);
    return p;
}

static int read_array(cursor *c, int depth, kiln_gguf_value *v) {
    uint64_t start = c->pos;
    kiln_gguf_vtype et = KILN_GGUF_UINT8;
    uint64_t n;
    if (read_array_header(c, depth, &et, &n)) return -1;
    v->type = KILN_GGUF_ARRAY;
    v->arr.elem_type = et;
    v->arr.n = n;
    if (et != KILN_GGUF_STRING && et != KILN_GGUF_ARRAY) {
        /* numbers: copied into an aligned native array (the file's copy may be unaligned); bools become 0/1 */
        size_t es = kiln_gguf_vtype_size(et);
        uint8_t *data = alloc_or_fail(c, n ? n : 1, es);
        if (!data) return -1;
        memcpy(data, c->base + c->pos, n * es);
        if (et == KILN_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++) data[i] = data[i] != 0;
        c->pos += n * es;
        v->arr.data = data;
        return 0;
    }
    /* walk first, so the element table is only allocated for an array that is really there */
    uint64_t body = c->pos;
    c->pos = start;
    if (skip_value(c, KILN_GGUF_ARRAY, depth)) return -1;
    c->pos = body;
    if (et == KILN_GGUF_STRING) {
        kiln_str *strs = alloc_or_fail(c, n ? n : 1, sizeof *strs);
        if (!strs) return -1;
        for (uint64_t i = 0; i < n; i++)
            if (read_string(c, KILN_GGUF_MAX_STRING, "string", &strs[i])) return -1;
        v->arr.data = strs;
        return 0;
    }
    kiln_gguf_value *elems = alloc_or_fail(c, n ? n : 1, sizeof *elems);
    if (!elems) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (read_value(c, KILN_GGUF_ARRAY, depth + 1, &elems[i])) return -1;
    v->arr.data = elems;
    return 0;
}

static int read_value(cursor *c, kiln_gguf_vtype t, int depth, kiln_gguf_value *v) {
    if (t == KILN_GGUF_STRING) {
        v->type = t;
        return read_string(c, KILN_GGUF_MAX_STRING, "string value", &v->str);
    }
    if (t == KILN_GGUF_ARRAY) return read_array(c, depth, v);
    if (need(c, kiln_gguf_vtype_size(t), "value")) return -1;
    scalar_from_bytes(v, t, c->base + c->pos);
    c->pos += kiln_gguf_vtype_size(t);
    return 0;
}

/* g->kv and g->tensors grow by doubling as entries actually parse, so a hostile count cannot size them. */
static int grow(cursor *c, void **arr, uint64_t *cap, uint64_t need_n, size_t elem) {
    if (need_n <= *cap) return 0;
    uint64_t ncap = *cap ? *cap * 2 : 64;
    void *p = ncap <= SIZE_MAX / elem ? realloc(*arr, (size_t)(ncap * elem)) : NULL;
    if (!p) return kiln_fail(c->err, "%s: out of memory", c->name);
    *arr = p;
    *cap = ncap;
    return 0;
}

typedef struct positions {
    uint64_t *kv, *tensor; /* byte offset of each entry, for duplicate reports */
    uint64_t cap_kv, cap_tensor;
} positions;

static int read_kvs(cursor *c, uint64_t n_kv, positions *pos) {
    kiln_gguf *g = c->g;
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (grow(c, (void **)&g->kv, &cap, i + 1, sizeof *g->kv)) return -1;
        if (grow(c, (void **)&pos->kv, &pos->cap_kv, i + 1, sizeof *pos->kv)) return -1;
        kiln_gguf_kv *kv = &g->kv[i];
        memset(kv, 0, sizeof *kv);
        pos->kv[i] = c->pos;
        c->ctx[0] = '\0';
        uint64_t key_at = c->pos;
        if (read_string(c, KILN_GGUF_MAX_KEY, "key", &kv->key)) return -1;
        if (kv->key.len == 0) return fail_at(c, key_at, "key", "empty key");
        if (strlen(kv->key.ptr) != kv->key.len) return fail_at(c, key_at, "key", "contains a NUL byte");
        g->n_kv = i + 1;
        snprintf(c->ctx, sizeof c->ctx, " of key '%.120s'", kv->key.ptr);
        kiln_gguf_vtype t = KILN_GGUF_UINT8;
        if (read_vtype(c, &t, "value type") || read_value(c, t, 0, &kv->value)) return -1;
    }
    c->ctx[0] = '\0';
    return 0;
}

/* general.alignment, if present, must be a non-zero power of two (u32 per the spec; any unsigned type accepted). */
static int read_alignment(cursor *c, const positions *pos) {
    kiln_gguf *g = c->g;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (strcmp(g->kv[i].key.ptr, "general.alignment") != 0) continue;
        const kiln_gguf_value *v = &g->kv[i].value;
        bool ok = v->type == KILN_GGUF_UINT8 || v->type == KILN_GGUF_UINT16 || v->type == KILN_GGUF_UINT32 ||
                  v->type == KILN_GGUF_UINT64;
        if (!ok) return fail_at(c, pos->kv[i], "general.alignment", "must be an unsigned integer");
        uint64_t a = v->u64;
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30)) {
            char msg[96];
            snprintf(msg, sizeof msg, "%" PRIu64 " is not a power of two between 1 and 2^30", a);
            return fail_at(c, pos->kv[i], "general.alignment", msg);
        }
        g->alignment = a;
    }
    return 0;
}

static int read_dims(cursor *c, kiln_gguf_tensor *t) {
    uint64_t at = c->pos;
    if (read_u32(c, &t->n_dims, "n_dims")) return -1;
    if (t->n_dims < 1 || t->n_dims > KILN_MAX_DIMS) {
        char msg[64];
        snprintf(msg, sizeof msg, "%" PRIu32 " dimensions (1 to %d allowed)", t->n_dims, KILN_MAX_DIMS);
        return fail_at(c, at, "n_dims", msg);
    }
    uint64_t n = 1;
    for (int d = 0; d < KILN_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne, ne_at = c->pos;
        if (read_u64(c, &ne, "ne")) return -1;
        if (ne == 0 || ne > (uint64_t)INT64_MAX) return fail_at(c, ne_at, "ne", "dimension must be positive");
        if (n > (uint64_t)INT64_MAX / ne) return fail_at(c, ne_at, "ne", "element count overflows");
        n *= ne;
        t->ne[d] = (int64_t)ne;
    }
    return 0;
}

static int read_tensor_type(cursor *c, kiln_gguf_tensor *t) {
    uint64_t at = c->pos;
    uint32_t type;
    if (read_u32(c, &type, "type")) return -1;
    const kiln_type_traits *tr = kiln_type_get(type);
    char msg[96];
    if (!tr || !tr->supported) {
        snprintf(msg, sizeof msg, "type %" PRIu32 " (%s) is not supported", type, kiln_type_name(type));
        return fail_at(c, at, "type", msg);
    }
    if (t->ne[0] % tr->block_size != 0) {
        snprintf(msg, sizeof msg, "row length %" PRId64 " is not a multiple of the %s block size %d", t->ne[0],
                 tr->name, tr->block_size);
        return fail_at(c, at, "type", msg);
    }
    t->type = (kiln_type)type;
    uint64_t blocks = (uint64_t)kiln_tensor_nelements(t) / (uint64_t)tr->block_size;
    if (blocks > UINT64_MAX / tr->type_size) return fail_at(c, at, "type", "tensor size overflows");
    t->size = blocks * tr->type_size;
    return 0;
}

static int read_tensor_infos(cursor *c, uint64_t n_tensors, positions *pos) {
    kiln_gguf *g = c->g;
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow(c, (void **)&g->tensors, &cap, i + 1, sizeof *g->tensors)) return -1;
        if (grow(c, (void **)&pos->tensor, &pos->cap_tensor, i + 1, sizeof *pos->tensor)) return -1;
        kiln_gguf_tensor *t = &g->tensors[i];
        memset(t, 0, sizeof *t);
        pos->tensor[i] = c->pos;
        c->ctx[0] = '\0';
        uint64_t name_at = c->pos;
        if (read_string(c, KILN_GGUF_MAX_TENSOR_NAME, "tensor name", &t->name)) return -1;
        if (t->name.len == 0) return fail_at(c, name_at, "tensor name", "empty name");
        if (strlen(t->name.ptr) != t->name.len) return fail_at(c, name_at, "tensor name", "contains a NUL byte");
        g->n_tensors = i + 1;
        snprintf(c->ctx, sizeof c->ctx, " of tensor '%.120s'", t->name.ptr);
        if (read_dims(c, t) || read_tensor_type(c, t) || read_u64(c, &t->offset, "offset")) return -1;
        c->ctx[0] = '\0';
    }
    return 0;
}

/* Every tensor's data must start aligned and end inside the file. */
static int place_tensors(cursor *c, const positions *pos) {
    kiln_gguf *g = c->g;
    uint64_t a = g->alignment;
    uint64_t pad = (a - c->pos % a) % a;
    if (pad > remaining(c)) pad = remaining(c); /* no data section at all: fine when there are no tensors */
    g->data_offset = c->pos + pad;
    uint64_t data_size = c->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kiln_gguf_tensor *t = &g->tensors[i];
        char msg[160];
        snprintf(c->ctx, sizeof c->ctx, " of tensor '%.120s'", t->name.ptr);
        /* where the offset field sits: after the name, n_dims, the dims and the type */
        uint64_t at = pos->tensor[i] + 8 + t->name.len + 4 + 8ull * t->n_dims + 4;
        if (t->offset % a != 0) {
            snprintf(msg, sizeof msg, "%" PRIu64 " is not a multiple of the alignment %" PRIu64, t->offset, a);
            return fail_at(c, at, "offset", msg);
        }
        if (t->offset > data_size || t->size > data_size - t->offset) {
            snprintf(msg, sizeof msg, "%" PRIu64 " bytes at data offset %" PRIu64 " run past the end of the file "
                     "(data section is %" PRIu64 " bytes)", t->size, t->offset, data_size);
            return fail_at(c, at, "offset", msg);
        }
        t->data = c->base + g->data_offset + t->offset;
    }
    c->ctx[0] = '\0';
    return 0;
}

static int read_header(cursor *c, uint64_t *n_tensors, uint64_t *n_kv) {
    char magic[4];
    uint32_t version;
    if (read_bytes(c, magic, 4, "magic")) return -1;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) return fail_at(c, 0, "magic", "not a GGUF file");
    if (read_u32(c, &version, "version")) return -1;
    if (version == 1) return fail_at(c, 4, "version", "GGUF v1 is not supported (re-convert the model)");
    if (version == 0x02000000u || version == 0x03000000u)
        return fail_at(c, 4, "version", "big-endian GGUF is not supported");
    if (version != 2 && version != 3) {
        char msg[64];
        snprintf(msg, sizeof msg, "unsupported version %" PRIu32, version);
        return fail_at(c, 4, "version", msg);
    }
    c->g->version = version;
    if (read_u64(c, n_tensors, "n_tensors") || read_u64(c, n_kv, "n_kv")) return -1;
    char msg[96];
    if (*n_kv > remaining(c) / MIN_KV_BYTES) {
        snprintf(msg, sizeof msg, "%" PRIu64 " entries cannot fit in the file", *n_kv);
        return fail_at(c, 16, "n_kv", msg);
    }
    if (*n_tensors > remaining(c) / MIN_TENSOR_BYTES) {
        snprintf(msg, sizeof msg, "%" PRIu64 " tensors cannot fit in the file", *n_tensors);
        return fail_at(c, 8, "n_tensors", msg);
    }
    return 0;
}

static int check_duplicates(cursor *c, const positions *pos) {
    kiln_gguf_dup dup = {false, 0, UINT64_MAX}; /* second stays out of range when indexing ran out of memory */
    kiln_error e;
    if (kiln_gguf_build_index(c->g, &dup, &e) == 0) return 0;
    if (dup.second >= (dup.is_tensor ? c->g->n_tensors : c->g->n_kv)) return kiln_fail(c->err, "%s: %s", c->name, e.msg);
    char msg[KILN_ERROR_MAX];
    if (dup.is_tensor) {
        snprintf(msg, sizeof msg, "duplicate tensor name '%.120s' (first at byte %" PRIu64 ")",
                 c->g->tensors[dup.second].name.ptr, pos->tensor[dup.first]);
        return fail_at(c, pos->tensor[dup.second], "tensor name", msg);
    }
    snprintf(msg, sizeof msg, "duplicate key '%.120s' (first at byte %" PRIu64 ")", c->g->kv[dup.second].key.ptr,
             pos->kv[dup.first]);
    return fail_at(c, pos->kv[dup.second], "key", msg);
}

static int parse(cursor *c) {
    uint64_t n_tensors = 0, n_kv = 0;
    positions pos = {0};
    int rc = -1;
    if (read_header(c, &n_tensors, &n_kv) == 0 && read_kvs(c, n_kv, &pos) == 0 && read_alignment(c, &pos) == 0 &&
        read_tensor_infos(c, n_tensors, &pos) == 0 && check_duplicates(c, &pos) == 0 && place_tensors(c, &pos) == 0)
        rc = 0;
    free(pos.kv);
    free(pos.tensor);
    return rc;
}

static int open_bytes(kiln_gguf *g, const void *data, size_t size, const char *name, kiln_gguf **out,
                      kiln_error *err) {
    cursor c = {data, size, 0, name, "", g, err};
    if (parse(&c)) {
        kiln_gguf_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

int kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out, kiln_error *err) {
    *out = NULL;
    kiln_gguf *g = kiln_gguf_new(name);
    if (!g) return kiln_fail(err, "%s: out of memory", name);
    return open_bytes(g, size ? data : "", size, g->path, out, err);
}

int kiln_gguf_open(const char *path, kiln_gguf **out, kiln_error *err) {
    *out = NULL;
    kiln_gguf *g = kiln_gguf_new(path);
    if (!g) return kiln_fail(err, "%s: out of memory", path);
    const void *data;
    size_t size;
    if (kiln_gguf_map_file(g, path, &data, &size, err)) {
        kiln_gguf_close(g);
        return -1;
    }
    return open_bytes(g, size ? data : "", size, g->path, out, err);
}

int kiln_model_file_open(const char *path, kiln_gguf **out, kiln_error *err) {
    struct stat st;
    *out = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return kiln_safetensors_open_dir(path, out, err);
    return kiln_gguf_open(path, out, err);
}
