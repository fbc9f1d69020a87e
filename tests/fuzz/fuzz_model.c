/* libFuzzer target for the model description: GGUF bytes that open are read as a model would be (hyperparameters,
 * then every tensor role bound and checked against them), which must either succeed or fail with a message; never a
 * crash, a leak or undefined behaviour. Seeds: tiny llama, qwen2 and gemma3 files in seeds/model. */
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g;
    kiln_error err;
    if (kiln_gguf_open_memory(data, size, "fuzz.gguf", &g, &err)) return 0;
    kiln_config cfg;
    kiln_weights w;
    if (kiln_config_load(g, &cfg, &err) == 0 && kiln_weights_load(g, &cfg, &w, &err) == 0) {
        volatile uint64_t sink = kiln_weights_bytes_per_token(&w) + (uint64_t)kiln_config_layer_first_pos(&cfg, 0, 7);
        (void)sink;
        kiln_weights_free(&w);
    }
    kiln_gguf_close(g);
    return 0;
}
