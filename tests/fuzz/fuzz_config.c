/* libFuzzer target for the HF translation of config.json, and of tokenizer.json when the input holds two JSON
 * texts separated by a NUL byte: either translates into metadata or fails with a message; never a crash, a leak,
 * undefined behaviour or a huge allocation. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t cfg_len = nul ? (size_t)(nul - text) : size;
    kiln_meta m;
    kiln_error err;
    if (kiln_meta_init(&m, "fuzz", &err)) return 0;
    kiln_hf_config cfg;
    int rc = kiln_hf_config_parse(text, cfg_len, "config.json", &cfg, &m, &err);
    if (rc == 0 && cfg.llama3_rope) {
        float freqs[1 << 15];
        if (cfg.head_dim / 2 <= (int64_t)(sizeof freqs / sizeof freqs[0])) kiln_hf_llama3_rope_freqs(&cfg, freqs);
    }
    if (rc == 0 && nul)
        kiln_hf_tokenizer_parse(nul + 1, size - cfg_len - 1, NULL, 0, NULL, &cfg, &m, &err);
    kiln_gguf *g = kiln_meta_finish(&m, &err);
    kiln_gguf_close(g);
    return 0;
}
