/* libFuzzer target: any bytes as a template, parsed and rendered with a small conversation and tools. Whatever the
 * input, the interpreter must return 0 or -1 with a message: no crash, no leak, no undefined behaviour, no hang.
 * Build it with tests/fuzz's kiln_fuzz(fuzz_template ${CMAKE_SOURCE_DIR}/tests/template/fuzz_template.c
 * MODULES util template). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONVERSATION[] =
    "[{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi {{ x }}\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true]}}}]}, {\"role\": \"user\", \"content\": \"é世\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* long inputs only slow the search down */
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    static json_t *messages, *extra;
    if (!messages) {
        messages = json_loads(CONVERSATION, 0, NULL);
        extra = json_pack("{s:[{s:s}]}", "tools", "name", "f");
    }
    kiln_error err;
    kiln_template *t = NULL;
    if (!kiln_template_parse(src, &t, &err)) {
        kiln_chat_opts opts = {.add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>", .extra = extra, .now = 1};
        char *out = NULL;
        if (!kiln_template_render_json(t, messages, &opts, &out, &err)) free(out);
        kiln_template_free(t);
    }
    free(src);
    return 0;
}
