/* kiln quantize IN OUT TYPE: converts a GGUF file or safetensors folder into a GGUF of the given type or preset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quantize.h"

int cmd_quantize(int argc, char **argv);

static void usage(FILE *out) {
    fprintf(out,
            "usage: kiln quantize IN OUT TYPE [--threads N] [--quiet]\n\n"
            "IN is a GGUF file or a Hugging Face safetensors folder; OUT is the GGUF to write.\n"
            "TYPE: %s\n"
            "(q4_k_m and q5_k_m mix in Q6_K for some attn_v/ffn_down layers, as llama.cpp does;\n"
            " docs/quantize.md lists which tensor gets which type)\n",
            kiln_quant_preset_names());
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3];
    int n_pos = 0;
    kiln_quantize_params params = {0, true};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--quiet")) {
            params.progress = false;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            params.n_threads = atoi(argv[++i]);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            return 1;
        } else if (n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else {
            usage(stderr);
            return 1;
        }
    }
    if (n_pos != 3) {
        usage(stderr);
        return 1;
    }
    const kiln_quant_preset *preset = kiln_quant_preset_find(pos[2]);
    if (!preset) {
        fprintf(stderr, "error: unknown type '%s' (one of: %s)\n", pos[2], kiln_quant_preset_names());
        return 1;
    }
    kiln_error err;
    if (kiln_quantize_model(pos[0], pos[1], preset, &params, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
