/* The storage behind a kiln_gguf (an arena, file mappings, name indices) and the lookups every reader of a model
 * container uses, whichever format it came from. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"

#define ARENA_BLOCK (64u * 1024u)
#define ARENA_ALIGN 16u

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

typedef struct mapping {
    struct mapping *next;
    void *addr;
    size_t len;
} mapping;

/* Open addressing over entry indices; slot value 0 means empty, otherwise index + 1. */
typedef struct name_index {
    uint32_t *slots;
    size_t mask;
} name_index;

typedef struct container {
    arena_block *blocks;
    mapping *maps;
    name_index kv_index, tensor_index;
} container;

kiln_gguf *kiln_gguf_new(const char *path) {
    kiln_gguf *g = calloc(1, sizeof *g);
    container *c = calloc(1, sizeof *c);
    if (!g || !c) {
        free(g);
        free(c);
        return NULL;
    }
    g->impl = c;
    g->alignment = KILN_GGUF_DEFAULT_ALIGNMENT;
    kiln_str p = kiln_gguf_strdup(g, path ? path : "", path ? strlen(path) : 0);
    if (!p.ptr) {
        kiln_gguf_close(g);
        return NULL;
    }
    g->path = (char *)p.ptr;
    return g;
}

void *kiln_gguf_alloc(kiln_gguf *g, size_t size) {
    container *c = g->impl;
    if (size > SIZE_MAX - ARENA_ALIGN - sizeof(arena_block)) return NULL;
    size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (size == 0) size = ARENA_ALIGN;
    arena_block *b = c->blocks;
    if (!b || b->cap - b->used < size) {
        /* large requests get a block of their own so the current small block keeps its free space */
        size_t cap = size > ARENA_BLOCK / 4 ? size : ARENA_BLOCK;
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->used = 0;
        nb->cap = cap;
        if (b && cap != ARENA_BLOCK) {
            nb->next = b->next;
            b->next = nb;
            b = nb;
        } else {
            nb->next = b;
            c->blocks = b = nb;
        }
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

kiln_str kiln_gguf_strdup(kiln_gguf *g, const char *s, size_t len) {
    kiln_str out = {NULL, 0};
    if (len == SIZE_MAX) return out;
    char *p = kiln_gguf_alloc(g, len + 1);
    if (!p) return out;
    if (len) memcpy(p, s, len);
    p[len] = '\0';
    out.ptr = p;
    out.len = len;
    return out;
}

int kiln_gguf_map_file(kiln_gguf *g, const char *path, const void **data, size_t *size, kiln_error *err) {
    container *c = g->impl;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kiln_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_fail(err, "%s: not a regular file", path);
    }
    *data = NULL;
    *size = (size_t)st.st_size;
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    mapping *m = kiln_gguf_alloc(g, sizeof *m);
    void *addr = m ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    int e = errno;
    close(fd);
    if (!m) return kiln_fail(err, "%s: out of memory", path);
    if (addr == MAP_FAILED) return kiln_fail(err, "%s: cannot mmap: %s", path, strerror(e));
    m->addr = addr;
    m->len = (size_t)st.st_size;
    m->next = c->maps;
    c->maps = m;
    *data = addr;
    return 0;
}

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    container *c = g->impl;
    free(g->kv);
    free(g->tensors);
    if (c) {
        for (mapping *m = c->maps; m; m = m->next) munmap(m->addr, m->len);
        free(c->kv_index.slots);
        free(c->tensor_index.slots);
        for (arena_block *b = c->blocks, *next; b; b = next) {
            next = b->next;
            free(b);
        }
        free(c);
    }
    free(g);
}

/* FNV-1a: names are short and few, so a simple byte hash is plenty. */
static uint64_t hash_bytes(const char *s, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static bool str_equal(kiln_str a, const char *b, size_t blen) {
    return a.len == blen && memcmp(a.ptr, b, blen) == 0;
}

static const kiln_str *kv_name(const kiln_gguf *g, uint64_t i) { return &g->kv[i].key; }
static const kiln_str *tensor_name(const kiln_gguf *g, uint64_t i) { return &g->tensors[i].name; }

typedef const kiln_str *(*name_of_fn)(const kiln_gguf *g, uint64_t i);

/* Builds idx over n names; on a repeat returns -1 with the two indices. */
static int index_build(name_index *idx, const kiln_gguf *g, uint64_t n, name_of_fn name_of, uint64_t dup[2]) {
    free(idx->slots);
    idx->slots = NULL;
    if (n == 0) return 0;
    if (n >= UINT32_MAX / 2) return -2;
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    idx->slots = calloc(cap, sizeof *idx->slots);
    if (!idx->slots) return -2;
    idx->mask = cap - 1;
    for (uint64_t i = 0; i < n; i++) {
        const kiln_str *s = name_of(g, i);
        size_t at = (size_t)hash_bytes(s->ptr, s->len) & idx->mask;
        for (; idx->slots[at]; at = (at + 1) & idx->mask) {
            uint64_t j = idx->slots[at] - 1;
            if (str_equal(*name_of(g, j), s->ptr, s->len)) {
                dup[0] = j;
                dup[1] = i;
                return -1;
            }
        }
        idx->slots[at] = (uint32_t)(i + 1);
    }
    return 0;
}

static int64_t index_find(const name_index *idx, const kiln_gguf *g, uint64_t n, name_of_fn name_of,
                          const char *name) {
    size_t len = strlen(name);
    if (!idx->slots) {
        for (uint64_t i = 0; i < n; i++)
            if (str_equal(*name_of(g, i), name, len)) return (int64_t)i;
        return -1;
    }
    for (size_t at = (size_t)hash_bytes(name, len) & idx->mask; idx->slots[at]; at = (at + 1) & idx->mask) {
        uint64_t i = idx->slots[at] - 1;
        if (str_equal(*name_of(g, i), name, len)) return (int64_t)i;
    }
    return -1;
}

int kiln_gguf_build_index(kiln_gguf *g, kiln_gguf_dup *dup, kiln_error *err) {
    container *c = g->impl;
    uint64_t at[2] = {0, 0};
    int rc = index_build(&c->kv_index, g, g->n_kv, kv_name, at);
    bool is_tensor = false;
    if (rc == 0) {
        is_tensor = true;
        rc = index_build(&c->tensor_index, g, g->n_tensors, tensor_name, at);
    }
    if (rc == -2) return kiln_fail(err, "out of memory indexing %s", is_tensor ? "tensor names" : "metadata keys");
    if (rc == 0) return 0;
    if (dup) *dup = (kiln_gguf_dup){is_tensor, at[0], at[1]};
    const kiln_str *name = is_tensor ? tensor_name(g, at[1]) : kv_name(g, at[1]);
    return kiln_fail(err, "duplicate %s '%.200s' (entries %llu and %llu)", is_tensor ? "tensor name" : "key",
                     name->ptr, (unsigned long long)at[0], (unsigned long long)at[1]);
}

const kiln_gguf_value *kiln_gguf_get(const kiln_gguf *g, const char *key) {
    const container *c = g->impl;
    int64_t i = index_find(&c->kv_index, g, g->n_kv, kv_name, key);
    return i < 0 ? NULL : &g->kv[i].value;
}

const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name) {
    const container *c = g->impl;
    int64_t i = index_find(&c->tensor_index, g, g->n_tensors, tensor_name, name);
    return i < 0 ? NULL : &g->tensors[i];
}

static bool is_unsigned(kiln_gguf_vtype t) {
    return t == KILN_GGUF_UINT8 || t == KILN_GGUF_UINT16 || t == KILN_GGUF_UINT32 || t == KILN_GGUF_UINT64;
}

static bool is_signed(kiln_gguf_vtype t) {
    return t == KILN_GGUF_INT8 || t == KILN_GGUF_INT16 || t == KILN_GGUF_INT32 || t == KILN_GGUF_INT64;
}

bool kiln_gguf_get_int(const kiln_gguf *g, const char *key, int64_t *out) {
    const kiln_gguf_value *v = kiln_gguf_get(g, key);
    if (!v) return false;
    if (is_signed(v->type)) {
        *out = v->i64;
        return true;
    }
    if (is_unsigned(v->type) && v->u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->u64;
        return true;
    }
    return false;
}

bool kiln_gguf_get_float(const kiln_gguf *g, const char *key, double *out) {
    const kiln_gguf_value *v = kiln_gguf_get(g, key);
    if (!v) return false;
    if (v->type == KILN_GGUF_FLOAT32 || v->type == KILN_GGUF_FLOAT64) *out = v->f64;
    else if (is_signed(v->type)) *out = (double)v->i64;
    else if (is_unsigned(v->type)) *out = (double)v->u64;
    else return false;
    return true;
}

bool kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out) {
    const kiln_gguf_value *v = kiln_gguf_get(g, key);
    if (!v || v->type != KILN_GGUF_BOOL) return false;
    *out = v->b;
    return true;
}

const char *kiln_gguf_get_str(const kiln_gguf *g, const char *key) {
    const kiln_gguf_value *v = kiln_gguf_get(g, key);
    return v && v->type == KILN_GGUF_STRING ? v->str.ptr : NULL;
}

const kiln_gguf_value *kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_vtype elem_type) {
    const kiln_gguf_value *v = kiln_gguf_get(g, key);
    return v && v->type == KILN_GGUF_ARRAY && v->arr.elem_type == elem_type ? v : NULL;
}

int64_t kiln_tensor_nelements(const kiln_gguf_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < KILN_MAX_DIMS; i++) n *= t->ne[i];
    return n;
}

size_t kiln_gguf_vtype_size(kiln_gguf_vtype t) {
    switch (t) {
    case KILN_GGUF_UINT8: case KILN_GGUF_INT8: case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_UINT16: case KILN_GGUF_INT16: return 2;
    case KILN_GGUF_UINT32: case KILN_GGUF_INT32: case KILN_GGUF_FLOAT32: return 4;
    case KILN_GGUF_UINT64: case KILN_GGUF_INT64: case KILN_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *kiln_gguf_vtype_name(uint32_t t) {
    static const char *const NAMES[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof NAMES / sizeof NAMES[0] ? NAMES[t] : "invalid";
}
