/* kiln synth: writes a GGUF at a real model's shape with seeded random weights (see format/synth.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/synth.h"

int cmd_synth(int argc, char **argv);

/* The default model's vocabulary: a byte-level BPE with a ChatML template, present once scripts/fetch-model.sh ran
 * (in $KILN_MODEL_DIR, else ~/.cache/kiln/models). Shapes with larger vocabularies get it padded. */
#define DEFAULT_VOCAB_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static void usage(FILE *out) {
    fprintf(out,
            "usage: kiln synth --shape SHAPE --type TYPE -o FILE [--vocab-from FILE.gguf] [--seed N] [--threads N]\n"
            "                  [--quiet]\n\n"
            "Writes a model at a real model's shape with random weights (normal(0, 0.02), norms 1) for speed tests.\n"
            "SHAPE: %s\nTYPE: %s\n"
            "--vocab-from: GGUF whose tokenizer is copied, padded to the shape's vocabulary with [PAD{id}] tokens\n"
            "              (default: the default model, ~/.cache/kiln/models/" DEFAULT_VOCAB_FILE ")\n",
            kiln_synth_shape_names(), kiln_quant_preset_names());
}

int cmd_synth(int argc, char **argv) {
    kiln_synth_params p = {NULL, NULL, NULL, NULL, 0, 0, true};
    const char *shape = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet")) {
            p.progress = false;
            continue;
        } else if (!v) {
            fprintf(stderr, "error: '%s' needs a value (see 'kiln synth --help')\n", a);
            return 1;
        } else if (!strcmp(a, "--shape")) {
            shape = v;
        } else if (!strcmp(a, "--type")) {
            type = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            p.out = v;
        } else if (!strcmp(a, "--vocab-from")) {
            p.vocab_from = v;
        } else if (!strcmp(a, "--seed")) {
            p.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--threads")) {
            p.n_threads = atoi(v);
        } else {
            fprintf(stderr, "error: unknown option '%s' (see 'kiln synth --help')\n", a);
            return 1;
        }
        i++;
    }
    if (!shape || !type || !p.out) {
        usage(stderr);
        return 1;
    }
    if (!(p.shape = kiln_synth_shape_find(shape))) {
        fprintf(stderr, "error: unknown shape '%s' (one of: %s)\n", shape, kiln_synth_shape_names());
        return 1;
    }
    if (!(p.preset = kiln_quant_preset_find(type))) {
        fprintf(stderr, "error: unknown type '%s' (one of: %s)\n", type, kiln_quant_preset_names());
        return 1;
    }
    char vocab[4096];
    if (!p.vocab_from) {
        const char *dir = getenv("KILN_MODEL_DIR"), *home = getenv("HOME");
        if (dir) snprintf(vocab, sizeof vocab, "%s/" DEFAULT_VOCAB_FILE, dir);
        else snprintf(vocab, sizeof vocab, "%s/.cache/kiln/models/" DEFAULT_VOCAB_FILE, home ? home : "");
        if (access(vocab, R_OK) != 0) {
            fprintf(stderr, "error: no vocabulary: %s is missing (run scripts/fetch-model.sh or pass --vocab-from)\n",
                    vocab);
            return 1;
        }
        p.vocab_from = vocab;
    }
    kiln_error err;
    if (kiln_synth(&p, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
