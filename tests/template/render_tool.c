/* Test driver: renders a template file with the variables in a JSON file and prints the result byte for byte.
 * usage: template_render TEMPLATE.jinja VARS.json
 * VARS.json: {"messages": [...], "add_generation_prompt": bool, "bos_token": s, "eos_token": s, "now": epoch, ...};
 * every other key becomes a template variable. Errors go to stderr with exit status 1. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TEMPLATE VARS.json\n", argv[0]);
        return 2;
    }
    char *src = read_file(argv[1]);
    json_error_t jerr;
    json_t *vars = json_load_file(argv[2], 0, &jerr);
    if (!src || !vars) {
        fprintf(stderr, "cannot read %s\n", src ? argv[2] : argv[1]);
        return 2;
    }
    kiln_chat_opts opts = {
        .add_generation_prompt = json_is_true(json_object_get(vars, "add_generation_prompt")),
        .bos_token = json_string_value(json_object_get(vars, "bos_token")),
        .eos_token = json_string_value(json_object_get(vars, "eos_token")),
        .now = json_integer_value(json_object_get(vars, "now")),
    };
    json_t *extra = json_deep_copy(vars);
    const char *fixed[] = {"messages", "add_generation_prompt", "bos_token", "eos_token", "now"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) json_object_del(extra, fixed[i]);
    opts.extra = extra;
    kiln_error err = {{0}};
    kiln_template *t = NULL;
    char *out = NULL;
    int rc = kiln_template_parse(src, &t, &err);
    if (!rc) rc = kiln_template_render_json(t, json_object_get(vars, "messages"), &opts, &out, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    else fwrite(out, 1, strlen(out), stdout);
    free(out);
    kiln_template_free(t);
    json_decref(extra);
    json_decref(vars);
    free(src);
    return rc ? 1 : 0;
}
