/* libFuzzer target for the GGUF reader: any bytes either open (then every accessor and every tensor byte must be
 * readable) or fail with a message; never a crash, a leak or undefined behaviour. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads what a loader would: typed getters on every key and each tensor's first and last byte. */
static unsigned exercise(const kiln_gguf *g) {
    unsigned sum = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const char *key = g->kv[i].key.ptr;
        int64_t iv;
        double fv;
        bool bv;
        sum += kiln_gguf_get_int(g, key, &iv) + kiln_gguf_get_float(g, key, &fv) + kiln_gguf_get_bool(g, key, &bv);
        const char *s = kiln_gguf_get_str(g, key);
        if (s) sum += (unsigned)strlen(s);
        const kiln_gguf_value *v = kiln_gguf_get(g, key);
        if (v->type == KILN_GGUF_ARRAY && v->arr.elem_type == KILN_GGUF_STRING && v->arr.n)
            sum += (unsigned)((const kiln_str *)v->arr.data)[v->arr.n - 1].len;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        const uint8_t *p = t->data;
        sum += p[0] + p[t->size - 1] + (kiln_gguf_find_tensor(g, t->name.ptr) == t);
        sum += (unsigned)kiln_tensor_nelements(t);
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g;
    kiln_error err;
    if (kiln_gguf_open_memory(data, size, "fuzz.gguf", &g, &err) == 0) {
        volatile unsigned sink = exercise(g);
        (void)sink;
        kiln_gguf_close(g);
    }
    return 0;
}
