/* Validation of one .safetensors file's header: u64 little-endian length, then that many bytes of JSON mapping each
 * tensor name to {dtype, shape, data_offsets} (offsets relative to the end of the header), plus an optional
 * "__metadata__" string map. Everything is checked before any entry is handed out. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

static int dtype_from_name(const char *s, kiln_type *out) {
    if (!strcmp(s, "F32")) *out = KILN_TYPE_F32;
    else if (!strcmp(s, "F16")) *out = KILN_TYPE_F16;
    else if (!strcmp(s, "BF16")) *out = KILN_TYPE_BF16;
    else return -1;
    return 0;
}

void kiln_st_entries_free(kiln_st_entry *e, size_t n) {
    if (!e) return;
    for (size_t i = 0; i < n; i++) free(e[i].name);
    free(e);
}

static int parse_shape(json_t *shape, kiln_st_entry *e, const char *what, uint64_t *n_elem, kiln_error *err) {
    if (!json_is_array(shape)) return kiln_fail(err, "%s: tensor %s: shape is not an array", what, e->name);
    size_t nd = json_array_size(shape);
    if (nd > KILN_MAX_DIMS)
        return kiln_fail(err, "%s: tensor %s: %zu dimensions (at most %d supported)", what, e->name, nd,
                         KILN_MAX_DIMS);
    uint64_t total = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return kiln_fail(err, "%s: tensor %s: shape[%zu] is not a non-negative integer", what, e->name, d);
        uint64_t dim = (uint64_t)json_integer_value(v);
        if (dim > 0 && total > UINT64_MAX / 16 / dim) /* 16: headroom for the byte count below */
            return kiln_fail(err, "%s: tensor %s: shape product overflows", what, e->name);
        total *= dim;
        e->shape[d] = (int64_t)dim;
    }
    e->n_dims = (uint32_t)nd;
    *n_elem = total;
    return 0;
}

static int parse_offsets(json_t *offs, kiln_st_entry *e, const char *what, uint64_t data_start, uint64_t data_size,
                         kiln_error *err) {
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return kiln_fail(err, "%s: tensor %s: data_offsets is not a pair of integers", what, e->name);
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t en = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || en < b)
        return kiln_fail(err, "%s: tensor %s: data_offsets [%lld, %lld) is not a range", what, e->name,
                         (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return kiln_fail(err, "%s: tensor %s: data_offsets [%lld, %lld) run past the data area (%llu bytes)", what,
                         e->name, (long long)b, (long long)en, (unsigned long long)data_size);
    e->begin = data_start + (uint64_t)b;
    e->end = data_start + (uint64_t)en;
    return 0;
}

static int parse_entry(const char *name, json_t *info, kiln_st_entry *e, const char *what, uint64_t data_start,
                       uint64_t data_size, kiln_error *err) {
    e->name = strdup(name);
    if (!e->name) return kiln_fail(err, "%s: out of memory", what);
    for (int d = 0; d < KILN_MAX_DIMS; d++) e->shape[d] = 1;
    if (!json_is_object(info)) return kiln_fail(err, "%s: tensor %s: entry is not an object", what, name);
    json_t *dtype = json_object_get(info, "dtype");
    if (!json_is_string(dtype)) return kiln_fail(err, "%s: tensor %s: dtype missing or not a string", what, name);
    if (dtype_from_name(json_string_value(dtype), &e->type))
        return kiln_fail(err, "%s: tensor %s: dtype %s is not supported (F32, F16 and BF16 are)", what, name,
                         json_string_value(dtype));
    uint64_t n_elem = 0;
    if (parse_shape(json_object_get(info, "shape"), e, what, &n_elem, err)) return -1;
    if (parse_offsets(json_object_get(info, "data_offsets"), e, what, data_start, data_size, err)) return -1;
    uint64_t want = n_elem * kiln_type_get(e->type)->type_size;
    if (e->end - e->begin != want)
        return kiln_fail(err, "%s: tensor %s: data_offsets span %llu bytes but shape and dtype need %llu", what,
                         name, (unsigned long long)(e->end - e->begin), (unsigned long long)want);
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const kiln_st_entry *x = *(const kiln_st_entry *const *)a, *y = *(const kiln_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int check_overlaps(kiln_st_entry *e, size_t n, const char *what, kiln_error *err) {
    kiln_st_entry **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return kiln_fail(err, "%s: out of memory", what);
    for (size_t i = 0; i < n; i++) order[i] = &e[i];
    qsort(order, n, sizeof *order, by_begin);
    const kiln_st_entry *prev = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (order[i]->begin == order[i]->end) continue; /* empty tensors occupy no bytes */
        if (prev && order[i]->begin < prev->end)
            rc = kiln_fail(err, "%s: tensors %s and %s overlap in the data area", what, prev->name, order[i]->name);
        prev = order[i];
    }
    free(order);
    return rc;
}

static uint64_t read_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int parse_object(json_t *root, const char *what, uint64_t data_start, uint64_t data_size,
                        kiln_st_entry **out, size_t *n_out, kiln_error *err) {
    size_t cap = json_object_size(root);
    kiln_st_entry *e = calloc(cap ? cap : 1, sizeof *e);
    if (!e) return kiln_fail(err, "%s: out of memory", what);
    size_t n = 0;
    const char *name;
    json_t *info;
    json_object_foreach(root, name, info) {
        if (!strcmp(name, "__metadata__")) continue;
        if (parse_entry(name, info, &e[n++], what, data_start, data_size, err)) goto fail;
    }
    if (check_overlaps(e, n, what, err)) goto fail;
    *out = e;
    *n_out = n;
    return 0;
fail:
    kiln_st_entries_free(e, n);
    return -1;
}

int kiln_safetensors_parse(const void *file, uint64_t size, const char *what, kiln_st_entry **out, size_t *n,
                           kiln_error *err) {
    *out = NULL;
    *n = 0;
    if (size < 8) return kiln_fail(err, "%s: header length at byte 0: file is only %llu bytes", what,
                                   (unsigned long long)size);
    uint64_t hlen = read_u64le(file);
    if (hlen > KILN_SAFETENSORS_MAX_HEADER)
        return kiln_fail(err, "%s: header length at byte 0: %llu exceeds the %u-byte limit", what,
                         (unsigned long long)hlen, KILN_SAFETENSORS_MAX_HEADER);
    if (hlen > size - 8)
        return kiln_fail(err, "%s: header length at byte 0: %llu runs past the end of the %llu-byte file", what,
                         (unsigned long long)hlen, (unsigned long long)size);
    json_error_t jerr;
    /* JSON_REJECT_DUPLICATES: two entries with one name would make the file ambiguous */
    json_t *root = json_loadb((const char *)file + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return kiln_fail(err, "%s: header JSON at byte %d: %s", what, 8 + jerr.position, jerr.text);
    int rc;
    if (!json_is_object(root)) rc = kiln_fail(err, "%s: header JSON at byte 8: not an object", what);
    else rc = parse_object(root, what, 8 + hlen, size - 8 - hlen, out, n, err);
    json_decref(root);
    return rc;
}
