/* libFuzzer target for the safetensors header parser: any bytes either parse into entries that lie inside the
 * file, sized by their shape and dtype and not overlapping, or fail with a message; never a crash, a leak or
 * undefined behaviour. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_st_entry *e;
    size_t n;
    kiln_error err;
    if (kiln_safetensors_parse(data, size, "fuzz.safetensors", &e, &n, &err) == 0) {
        for (size_t i = 0; i < n; i++) {
            /* the promise made to the folder loader: every byte of a tensor is inside the input */
            if (e[i].begin > e[i].end || e[i].end > size) abort();
            if (e[i].end > e[i].begin && data[e[i].begin] + data[e[i].end - 1] > 510) abort();
        }
        kiln_st_entries_free(e, n);
    }
    return 0;
}
