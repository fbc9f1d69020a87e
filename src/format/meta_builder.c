#include "format/meta_builder.h"

#include <stdlib.h>
#include <string.h>

int kiln_meta_init(kiln_meta *m, const char *path, kiln_error *err) {
    memset(m, 0, sizeof *m);
    m->g = kiln_gguf_new(path);
    return m->g ? 0 : kiln_fail(err, "%s: out of memory", path);
}

kiln_gguf *kiln_meta_finish(kiln_meta *m, kiln_error *err) {
    kiln_gguf *g = m->g;
    if (kiln_gguf_build_index(g, NULL, err)) {
        kiln_meta_discard(m);
        return NULL;
    }
    memset(m, 0, sizeof *m);
    return g;
}

void kiln_meta_discard(kiln_meta *m) {
    kiln_gguf_close(m->g);
    memset(m, 0, sizeof *m);
}

/* g->kv and g->tensors must stay plain malloc blocks (kiln_gguf_close frees them), so they grow by realloc. */
static int reserve_kv(kiln_meta *m) {
    if (m->g->n_kv < m->cap_kv) return 0;
    uint64_t n = m->cap_kv ? 2 * m->cap_kv : 32;
    void *p = realloc(m->g->kv, n * sizeof *m->g->kv);
    if (!p) return -1;
    m->g->kv = p;
    m->cap_kv = n;
    return 0;
}

static int reserve_tensor(kiln_meta *m) {
    if (m->g->n_tensors < m->cap_tensors) return 0;
    uint64_t n = m->cap_tensors ? 2 * m->cap_tensors : 64;
    void *p = realloc(m->g->tensors, n * sizeof *m->g->tensors);
    if (!p) return -1;
    m->g->tensors = p;
    m->cap_tensors = n;
    return 0;
}

static void *alloc(kiln_meta *m, size_t size) { return kiln_gguf_alloc(m->g, size); }

static kiln_str str_copy(kiln_meta *m, const char *s, size_t len) { return kiln_gguf_strdup(m->g, s, len); }

static kiln_gguf_kv *find(const kiln_meta *m, const char *key) {
    for (uint64_t i = 0; i < m->g->n_kv; i++)
        if (strcmp(m->g->kv[i].key.ptr, key) == 0) return &m->g->kv[i];
    return NULL;
}

const kiln_gguf_value *kiln_meta_get(const kiln_meta *m, const char *key) {
    kiln_gguf_kv *kv = find(m, key);
    return kv ? &kv->value : NULL;
}

void kiln_meta_remove(kiln_meta *m, const char *key) {
    kiln_gguf_kv *kv = find(m, key);
    if (!kv) return;
    uint64_t i = (uint64_t)(kv - m->g->kv);
    memmove(&m->g->kv[i], &m->g->kv[i + 1], (m->g->n_kv - i - 1) * sizeof *kv);
    m->g->n_kv--;
}

/* The slot for key: the existing entry, or a new one at the end (insertion order is file order). */
static kiln_gguf_value *slot(kiln_meta *m, const char *key, kiln_error *err) {
    kiln_gguf_kv *kv = find(m, key);
    if (kv) return &kv->value;
    if (reserve_kv(m)) goto oom;
    kv = &m->g->kv[m->g->n_kv];
    kv->key = str_copy(m, key, strlen(key));
    if (!kv->key.ptr) goto oom;
    m->g->n_kv++;
    memset(&kv->value, 0, sizeof kv->value);
    return &kv->value;
oom:
    kiln_fail(err, "out of memory setting metadata key %s", key);
    return NULL;
}

int kiln_meta_set_u32(kiln_meta *m, const char *key, uint32_t v, kiln_error *err) {
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_UINT32;
    s->u64 = v;
    return 0;
}

int kiln_meta_set_i32(kiln_meta *m, const char *key, int32_t v, kiln_error *err) {
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_INT32;
    s->i64 = v;
    return 0;
}

int kiln_meta_set_f32(kiln_meta *m, const char *key, float v, kiln_error *err) {
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_FLOAT32;
    s->f64 = v;
    return 0;
}

int kiln_meta_set_bool(kiln_meta *m, const char *key, bool v, kiln_error *err) {
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_BOOL;
    s->b = v;
    return 0;
}

int kiln_meta_set_str(kiln_meta *m, const char *key, const char *v, kiln_error *err) {
    kiln_str str = str_copy(m, v, strlen(v));
    if (!str.ptr) return kiln_fail(err, "out of memory setting metadata key %s", key);
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_STRING;
    s->str = str;
    return 0;
}

int kiln_meta_set_str_arr(kiln_meta *m, const char *key, const kiln_str *v, uint64_t n, kiln_error *err) {
    kiln_str *copy = alloc(m, n * sizeof *copy);
    if (!copy) return kiln_fail(err, "out of memory setting metadata key %s", key);
    for (uint64_t i = 0; i < n; i++) {
        copy[i] = str_copy(m, v[i].ptr, v[i].len);
        if (!copy[i].ptr) return kiln_fail(err, "out of memory setting metadata key %s", key);
    }
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_ARRAY;
    s->arr.elem_type = KILN_GGUF_STRING;
    s->arr.n = n;
    s->arr.data = copy;
    return 0;
}

int kiln_meta_set_arr(kiln_meta *m, const char *key, kiln_gguf_vtype elem_type, const void *data, uint64_t n,
                      kiln_error *err) {
    size_t es = kiln_gguf_vtype_size(elem_type);
    if (!es) return kiln_fail(err, "metadata key %s: array element type %d is not numeric", key, (int)elem_type);
    void *copy = alloc(m, n * es);
    if (!copy) return kiln_fail(err, "out of memory setting metadata key %s", key);
    if (n) memcpy(copy, data, n * es);
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    s->type = KILN_GGUF_ARRAY;
    s->arr.elem_type = elem_type;
    s->arr.n = n;
    s->arr.data = copy;
    return 0;
}

static int copy_value(kiln_meta *m, kiln_gguf_value *dst, const kiln_gguf_value *src, int depth, kiln_error *err);

static int copy_array(kiln_meta *m, kiln_gguf_value *dst, const kiln_gguf_value *src, int depth, kiln_error *err) {
    uint64_t n = src->arr.n;
    kiln_gguf_vtype et = src->arr.elem_type;
    if (et == KILN_GGUF_STRING) {
        const kiln_str *in = src->arr.data;
        kiln_str *out = alloc(m, n * sizeof *out);
        if (!out) return kiln_fail(err, "out of memory copying a string array");
        for (uint64_t i = 0; i < n; i++) {
            out[i] = str_copy(m, in[i].ptr, in[i].len);
            if (!out[i].ptr) return kiln_fail(err, "out of memory copying a string array");
        }
        dst->arr.data = out;
    } else if (et == KILN_GGUF_ARRAY) {
        const kiln_gguf_value *in = src->arr.data;
        kiln_gguf_value *out = alloc(m, n * sizeof *out);
        if (!out) return kiln_fail(err, "out of memory copying a nested array");
        for (uint64_t i = 0; i < n; i++)
            if (copy_value(m, &out[i], &in[i], depth + 1, err)) return -1;
        dst->arr.data = out;
    } else {
        size_t es = kiln_gguf_vtype_size(et);
        void *out = alloc(m, n * es);
        if (!out) return kiln_fail(err, "out of memory copying an array");
        if (n) memcpy(out, src->arr.data, n * es);
        dst->arr.data = out;
    }
    return 0;
}

static int copy_value(kiln_meta *m, kiln_gguf_value *dst, const kiln_gguf_value *src, int depth, kiln_error *err) {
    if (depth > 8) return kiln_fail(err, "metadata arrays nested deeper than 8 levels");
    *dst = *src;
    if (src->type == KILN_GGUF_STRING) {
        dst->str = str_copy(m, src->str.ptr, src->str.len);
        if (!dst->str.ptr) return kiln_fail(err, "out of memory copying a string");
    } else if (src->type == KILN_GGUF_ARRAY) {
        return copy_array(m, dst, src, depth, err);
    }
    return 0;
}

int kiln_meta_set_value(kiln_meta *m, const char *key, const kiln_gguf_value *v, kiln_error *err) {
    kiln_gguf_value tmp;
    if (copy_value(m, &tmp, v, 0, err)) return -1;
    kiln_gguf_value *s = slot(m, key, err);
    if (!s) return -1;
    *s = tmp;
    return 0;
}

kiln_gguf_tensor *kiln_meta_add_tensor(kiln_meta *m, const char *name, kiln_error *err) {
    if (reserve_tensor(m)) goto oom;
    kiln_gguf_tensor *t = &m->g->tensors[m->g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = str_copy(m, name, strlen(name));
    if (!t->name.ptr) goto oom;
    for (int d = 0; d < KILN_MAX_DIMS; d++) t->ne[d] = 1;
    m->g->n_tensors++;
    return t;
oom:
    kiln_fail(err, "out of memory adding tensor %s", name);
    return NULL;
}
