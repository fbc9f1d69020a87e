/* Finding a model's chat template in its GGUF metadata, with ChatML when it carries none. */
#include <stdio.h>

#include "template/template.h"

int kiln_template_from_gguf(const kiln_gguf *g, const char *name, kiln_template **out, bool *is_fallback,
                            kiln_error *err) {
    char key[256];
    if (name) snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
    else snprintf(key, sizeof key, "tokenizer.chat_template");
    const char *src = kiln_gguf_get_str(g, key);
    if (is_fallback) *is_fallback = src == NULL;
    if (!src) {
        fprintf(stderr, "warning: %s has no %s; using ChatML\n", g->path ? g->path : "the model", key);
        src = KILN_TEMPLATE_CHATML;
    }
    if (kiln_template_parse(src, out, err)) return kiln_fail_prefix(err, "%s: %s", g->path ? g->path : "model", key);
    return 0;
}
