/* GGUF v3 writer: metadata is serialized into a byte buffer as it is added; tensor infos are kept as a table until
 * the header is written; tensor data then streams straight to the file. */
#include "format/gguf_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_VERSION 3u
#define WRITE_BUFFER (1u << 20)

typedef struct byte_buf {
    uint8_t *data;
    size_t len, cap;
} byte_buf;

typedef struct tensor_info {
    char *name;
    kiln_type type;
    uint32_t n_dims;
    int64_t ne[KILN_MAX_DIMS];
    uint64_t size, offset;
} tensor_info;

struct kiln_gguf_writer {
    byte_buf kv;      /* the serialized metadata section */
    uint64_t n_kv;
    char **keys;      /* for duplicate checks */
    uint64_t cap_keys;
    tensor_info *tensors;
    uint64_t n_tensors, cap_tensors;
    uint64_t alignment;
    kiln_error first_error;
    bool failed;
    /* while writing */
    FILE *f;
    char *path, *tmp_path;
    uint64_t current;  /* tensor being written */
    uint64_t written;  /* bytes of it so far */
};

static int fail(kiln_gguf_writer *w, const char *fmt, const char *what) __attribute__((format(printf, 2, 0)));

/* Remembers the first failure so kiln_gguf_writer_open can report it. */
static int fail(kiln_gguf_writer *w, const char *fmt, const char *what) {
    if (!w->failed) kiln_fail(&w->first_error, fmt, what);
    w->failed = true;
    return -1;
}

kiln_gguf_writer *kiln_gguf_writer_new(void) {
    kiln_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = KILN_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

static void abandon_file(kiln_gguf_writer *w) {
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
        remove(w->tmp_path);
    }
}

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    abandon_file(w);
    free(w->kv.data);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

static bool buf_put(byte_buf *b, const void *p, size_t n) {
    if (n > SIZE_MAX - b->len) return false;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        uint8_t *d = realloc(b->data, cap);
        if (!d) return false;
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return true;
}

static bool buf_u32(byte_buf *b, uint32_t v) { return buf_put(b, &v, 4); }
static bool buf_u64(byte_buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static bool buf_str(byte_buf *b, const char *s, uint64_t len) { return buf_u64(b, len) && buf_put(b, s, len); }

/* Writes a value's bytes in the file's encoding (floats narrowed back to f32 where the type says so). */
static bool put_scalar(byte_buf *b, const kiln_gguf_value *v) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
            uint64_t u64; int64_t i64; double f64; } x;
    switch (v->type) {
    case KILN_GGUF_UINT8: x.u8 = (uint8_t)v->u64; break;
    case KILN_GGUF_INT8: x.i8 = (int8_t)v->i64; break;
    case KILN_GGUF_UINT16: x.u16 = (uint16_t)v->u64; break;
    case KILN_GGUF_INT16: x.i16 = (int16_t)v->i64; break;
    case KILN_GGUF_UINT32: x.u32 = (uint32_t)v->u64; break;
    case KILN_GGUF_INT32: x.i32 = (int32_t)v->i64; break;
    case KILN_GGUF_FLOAT32: x.f32 = (float)v->f64; break;
    case KILN_GGUF_BOOL: x.u8 = v->b ? 1 : 0; break;
    case KILN_GGUF_UINT64: x.u64 = v->u64; break;
    case KILN_GGUF_INT64: x.i64 = v->i64; break;
    case KILN_GGUF_FLOAT64: x.f64 = v->f64; break;
    default: return false;
    }
    return buf_put(b, &x, kiln_gguf_vtype_size(v->type));
}

static bool put_value(byte_buf *b, const kiln_gguf_value *v, int depth);

static bool put_array(byte_buf *b, const kiln_gguf_value *v, int depth) {
    kiln_gguf_vtype et = v->arr.elem_type;
    if (depth >= KILN_GGUF_MAX_ARRAY_DEPTH || (unsigned)et > KILN_GGUF_FLOAT64) return false;
    if (!buf_u32(b, et) || !buf_u64(b, v->arr.n)) return false;
    if (et == KILN_GGUF_STRING) {
        const kiln_str *s = v->arr.data;
        for (uint64_t i = 0; i < v->arr.n; i++)
            if (!buf_str(b, s[i].ptr, s[i].len)) return false;
        return true;
    }
    if (et == KILN_GGUF_ARRAY) {
        const kiln_gguf_value *e = v->arr.data;
        for (uint64_t i = 0; i < v->arr.n; i++)
            if (e[i].type != KILN_GGUF_ARRAY || !put_array(b, &e[i], depth + 1)) return false;
        return true;
    }
    size_t es = kiln_gguf_vtype_size(et);
    if (v->arr.n > SIZE_MAX / es) return false;
    if (et != KILN_GGUF_BOOL) return buf_put(b, v->arr.data, (size_t)(v->arr.n * es));
    const bool *bs = v->arr.data;
    for (uint64_t i = 0; i < v->arr.n; i++) {
        uint8_t one = bs[i] ? 1 : 0;
        if (!buf_put(b, &one, 1)) return false;
    }
    return true;
}

static bool put_value(byte_buf *b, const kiln_gguf_value *v, int depth) {
    if (!buf_u32(b, v->type)) return false;
    if (v->type == KILN_GGUF_STRING) return buf_str(b, v->str.ptr, v->str.len);
    if (v->type == KILN_GGUF_ARRAY) return put_array(b, v, depth);
    return put_scalar(b, v);
}

static bool has_key(const kiln_gguf_writer *w, const char *key) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return true;
    return false;
}

static int set_alignment(kiln_gguf_writer *w, const kiln_gguf_value *v) {
    if (v->type != KILN_GGUF_UINT32) return fail(w, "%s: must be a u32", "general.alignment");
    uint64_t a = v->u64;
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
        return fail(w, "%s: must be a power of two between 1 and 2^30", "general.alignment");
    if (w->n_tensors) return fail(w, "%s: must be set before the first tensor", "general.alignment");
    w->alignment = a;
    return 0;
}

int kiln_gguf_writer_add_value(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v) {
    size_t klen = strlen(key);
    if (klen == 0 || klen > KILN_GGUF_MAX_KEY) return fail(w, "key '%.100s': empty or too long", key);
    if (has_key(w, key)) return fail(w, "duplicate key '%.200s'", key);
    if ((unsigned)v->type > KILN_GGUF_FLOAT64) return fail(w, "key '%.200s': invalid value type", key);
    if (!strcmp(key, "general.alignment") && set_alignment(w, v)) return -1;
    if (w->n_kv == w->cap_keys) {
        uint64_t cap = w->cap_keys ? w->cap_keys * 2 : 32;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return fail(w, "out of memory adding key '%.200s'", key);
        w->keys = k;
        w->cap_keys = cap;
    }
    size_t mark = w->kv.len;
    char *copy = strdup(key);
    if (!copy || !buf_str(&w->kv, key, klen) || !put_value(&w->kv, v, 0)) {
        free(copy);
        w->kv.len = mark;
        return fail(w, "key '%.200s': invalid value or out of memory", key);
    }
    w->keys[w->n_kv++] = copy;
    return 0;
}

static int add_scalar(kiln_gguf_writer *w, const char *key, kiln_gguf_value v) {
    return kiln_gguf_writer_add_value(w, key, &v);
}

int kiln_gguf_writer_add_u32(kiln_gguf_writer *w, const char *key, uint32_t v) {
    return add_scalar(w, key, (kiln_gguf_value){.type = KILN_GGUF_UINT32, .u64 = v});
}

int kiln_gguf_writer_add_i32(kiln_gguf_writer *w, const char *key, int32_t v) {
    return add_scalar(w, key, (kiln_gguf_value){.type = KILN_GGUF_INT32, .i64 = v});
}

int kiln_gguf_writer_add_u64(kiln_gguf_writer *w, const char *key, uint64_t v) {
    return add_scalar(w, key, (kiln_gguf_value){.type = KILN_GGUF_UINT64, .u64 = v});
}

int kiln_gguf_writer_add_f32(kiln_gguf_writer *w, const char *key, float v) {
    return add_scalar(w, key, (kiln_gguf_value){.type = KILN_GGUF_FLOAT32, .f64 = v});
}

int kiln_gguf_writer_add_bool(kiln_gguf_writer *w, const char *key, bool v) {
    return add_scalar(w, key, (kiln_gguf_value){.type = KILN_GGUF_BOOL, .b = v});
}

int kiln_gguf_writer_add_str(kiln_gguf_writer *w, const char *key, const char *v) {
    kiln_gguf_value val = {.type = KILN_GGUF_STRING, .str = {v, strlen(v)}};
    return kiln_gguf_writer_add_value(w, key, &val);
}

int kiln_gguf_writer_add_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_vtype elem_type, const void *data,
                             uint64_t n) {
    if (kiln_gguf_vtype_size(elem_type) == 0) return fail(w, "key '%.200s': not a number array", key);
    kiln_gguf_value val = {.type = KILN_GGUF_ARRAY};
    val.arr.elem_type = elem_type;
    val.arr.n = n;
    val.arr.data = data;
    return kiln_gguf_writer_add_value(w, key, &val);
}

int kiln_gguf_writer_add_str_arr(kiln_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    kiln_str *strs = malloc((n ? n : 1) * sizeof *strs);
    if (!strs) return fail(w, "out of memory adding key '%.200s'", key);
    for (uint64_t i = 0; i < n; i++) strs[i] = (kiln_str){v[i], strlen(v[i])};
    kiln_gguf_value val = {.type = KILN_GGUF_ARRAY};
    val.arr.elem_type = KILN_GGUF_STRING;
    val.arr.n = n;
    val.arr.data = strs;
    int rc = kiln_gguf_writer_add_value(w, key, &val);
    free(strs);
    return rc;
}

int kiln_gguf_writer_add_kvs(kiln_gguf_writer *w, const kiln_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (kiln_gguf_writer_add_value(w, g->kv[i].key.ptr, &g->kv[i].value)) return -1;
    return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int check_shape(kiln_gguf_writer *w, const char *name, kiln_type type, uint32_t n_dims, const int64_t *ne,
                       uint64_t *size) {
    const kiln_type_traits *tr = kiln_type_get(type);
    if (!tr) return fail(w, "tensor '%.200s': unknown type", name);
    if (n_dims < 1 || n_dims > KILN_MAX_DIMS) return fail(w, "tensor '%.200s': 1 to 4 dimensions allowed", name);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || n > (uint64_t)INT64_MAX / (uint64_t)ne[d])
            return fail(w, "tensor '%.200s': bad dimension", name);
        n *= (uint64_t)ne[d];
    }
    if (ne[0] % tr->block_size != 0)
        return fail(w, "tensor '%.200s': row length is not a multiple of the block size", name);
    *size = n / (uint64_t)tr->block_size * tr->type_size;
    return 0;
}

int64_t kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, uint32_t n_dims,
                                    const int64_t *ne) {
    size_t nlen = strlen(name);
    uint64_t size;
    if (w->f) return fail(w, "tensor '%.200s': added after the header was written", name);
    if (nlen == 0 || nlen > KILN_GGUF_MAX_TENSOR_NAME) return fail(w, "tensor '%.200s': empty or too long", name);
    if (check_shape(w, name, type, n_dims, ne, &size)) return -1;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return fail(w, "duplicate tensor name '%.200s'", name);
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        tensor_info *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return fail(w, "out of memory adding tensor '%.200s'", name);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    tensor_info *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return fail(w, "out of memory adding tensor '%.200s'", name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    t->size = size;
    if (w->n_tensors) {
        const tensor_info *prev = &w->tensors[w->n_tensors - 1];
        t->offset = align_up(prev->offset + prev->size, w->alignment);
    }
    return (int64_t)w->n_tensors++;
}

uint64_t kiln_gguf_writer_tensor_size(const kiln_gguf_writer *w, uint64_t i) {
    return i < w->n_tensors ? w->tensors[i].size : 0;
}

static bool put_tensor_infos(kiln_gguf_writer *w, byte_buf *b) {
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const tensor_info *t = &w->tensors[i];
        if (!buf_str(b, t->name, strlen(t->name)) || !buf_u32(b, t->n_dims)) return false;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (!buf_u64(b, (uint64_t)t->ne[d])) return false;
        if (!buf_u32(b, (uint32_t)t->type) || !buf_u64(b, t->offset)) return false;
    }
    return true;
}

static int write_zeros(FILE *f, uint64_t n) {
    static const uint8_t ZEROS[256];
    while (n) {
        size_t k = n < sizeof ZEROS ? (size_t)n : sizeof ZEROS;
        if (fwrite(ZEROS, 1, k, f) != k) return -1;
        n -= k;
    }
    return 0;
}

static int io_fail(kiln_gguf_writer *w, kiln_error *err, const char *what) {
    int e = errno;
    kiln_fail(err, "%s: %s: %s", w->path, what, strerror(e));
    abandon_file(w);
    return -1;
}

static char *concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

int kiln_gguf_writer_open(kiln_gguf_writer *w, const char *path, kiln_error *err) {
    if (w->failed) return kiln_fail(err, "%s: %s", path, w->first_error.msg);
    if (w->f || w->path) return kiln_fail(err, "%s: writer already used", path);
    w->path = strdup(path);
    w->tmp_path = concat(path, ".tmp");
    if (!w->path || !w->tmp_path) return kiln_fail(err, "%s: out of memory", path);
    byte_buf head = {0};
    bool ok = buf_put(&head, "GGUF", 4) && buf_u32(&head, GGUF_VERSION) && buf_u64(&head, w->n_tensors) &&
              buf_u64(&head, w->n_kv) && buf_put(&head, w->kv.data, w->kv.len) && put_tensor_infos(w, &head);
    if (!ok) {
        free(head.data);
        return kiln_fail(err, "%s: out of memory", path);
    }
    w->f = fopen(w->tmp_path, "wb");
    if (!w->f) {
        free(head.data);
        return kiln_fail(err, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    }
    setvbuf(w->f, NULL, _IOFBF, WRITE_BUFFER);
    uint64_t pad = align_up(head.len, w->alignment) - head.len;
    ok = fwrite(head.data, 1, head.len, w->f) == head.len && write_zeros(w->f, pad) == 0;
    free(head.data);
    if (!ok) return io_fail(w, err, "write failed");
    w->current = 0;
    w->written = 0;
    return 0;
}

int kiln_gguf_writer_write(kiln_gguf_writer *w, const void *data, size_t n, kiln_error *err) {
    if (!w->f) return kiln_fail(err, "gguf writer: write before open (or after an error)");
    if (w->current >= w->n_tensors) return kiln_fail(err, "%s: more data than the tensors declared", w->path);
    const tensor_info *t = &w->tensors[w->current];
    if (n > t->size - w->written)
        return kiln_fail(err, "%s: tensor '%s': %zu bytes written past its size %llu", w->path, t->name, n,
                         (unsigned long long)t->size);
    if (n && fwrite(data, 1, n, w->f) != n) return io_fail(w, err, "write failed");
    w->written += n;
    if (w->written == t->size) {
        /* the last tensor is padded too: readers that load the data section whole expect its padded size */
        uint64_t end = t->offset + t->size;
        if (write_zeros(w->f, align_up(end, w->alignment) - end)) return io_fail(w, err, "write failed");
        w->current++;
        w->written = 0;
    }
    return 0;
}

int kiln_gguf_writer_write_tensor(kiln_gguf_writer *w, uint64_t i, const void *data, kiln_error *err) {
    if (i != w->current || w->written != 0)
        return kiln_fail(err, "%s: tensor %llu written out of order (expected %llu)", w->path ? w->path : "gguf",
                         (unsigned long long)i, (unsigned long long)w->current);
    return kiln_gguf_writer_write(w, data, (size_t)w->tensors[i].size, err);
}

int kiln_gguf_writer_close(kiln_gguf_writer *w, kiln_error *err) {
    if (!w->f) return kiln_fail(err, "gguf writer: close without an open file");
    if (w->current != w->n_tensors) {
        kiln_fail(err, "%s: tensor '%s' incomplete (%llu of %llu bytes)", w->path, w->tensors[w->current].name,
                  (unsigned long long)w->written, (unsigned long long)w->tensors[w->current].size);
        abandon_file(w);
        return -1;
    }
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) {
        int e = errno;
        remove(w->tmp_path);
        return kiln_fail(err, "%s: write failed: %s", w->path, strerror(e));
    }
    if (rename(w->tmp_path, w->path) != 0) {
        int e = errno;
        remove(w->tmp_path);
        return kiln_fail(err, "%s: cannot rename from %s: %s", w->path, w->tmp_path, strerror(e));
    }
    return 0;
}
