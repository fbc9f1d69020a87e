/* Test driver.
 * usage: template_render TEMPLATE.jinja VARS.json
 *   renders the template with the variables and prints the result byte for byte; errors go to stderr, exit 1.
 *   VARS.json: {"messages": [...], "add_generation_prompt": bool, "bos_token": s, "eos_token": s, "now": epoch,
 *   ...}; every other key becomes a template variable.
 * usage: template_render --batch CASES.json
 *   CASES.json: [{"template": source, "vars": {...}}, ...]; prints [{"ok": bool, "out": text or error}, ...]
 *   so a test can compare hundreds of renders without a process each. */
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

/* Renders src with vars; *out is the result or the error message (malloc'd). */
static int render_case(const char *src, json_t *vars, char **out) {
    if (!src) {
        *out = strdup("no template given");
        return 1;
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
    json_t *messages = json_object_get(vars, "messages");
    json_t *empty = json_array();
    *out = NULL;
    int rc = kiln_template_parse(src, &t, &err);
    if (!rc) rc = kiln_template_render_json(t, messages ? messages : empty, &opts, out, &err);
    if (rc) *out = strdup(err.msg);
    kiln_template_free(t);
    json_decref(empty);
    json_decref(extra);
    return rc;
}

static int run_batch(const char *path) {
    json_error_t jerr;
    json_t *cases = json_load_file(path, 0, &jerr);
    if (!json_is_array(cases)) {
        fprintf(stderr, "cannot read %s: %s\n", path, jerr.text);
        json_decref(cases);
        return 2;
    }
    json_t *results = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        char *out = NULL;
        int rc = render_case(json_string_value(json_object_get(c, "template")), json_object_get(c, "vars"), &out);
        json_t *r = json_pack("{s:b, s:s}", "ok", rc == 0, "out", out ? out : "out of memory");
        json_array_append_new(results, r ? r : json_pack("{s:b, s:s}", "ok", 0, "out", "output is not valid UTF-8"));
        free(out);
    }
    json_dumpf(results, stdout, JSON_ENSURE_ASCII);
    json_decref(results);
    json_decref(cases);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--batch")) return run_batch(argv[2]);
    if (argc != 3) {
        fprintf(stderr, "usage: %s TEMPLATE VARS.json | --batch CASES.json\n", argv[0]);
        return 2;
    }
    char *src = read_file(argv[1]);
    json_error_t jerr;
    json_t *vars = json_load_file(argv[2], 0, &jerr);
    if (!src || !vars) {
        fprintf(stderr, "cannot read %s\n", src ? argv[2] : argv[1]);
        free(src);
        json_decref(vars);
        return 2;
    }
    char *out = NULL;
    int rc = render_case(src, vars, &out);
    if (rc) fprintf(stderr, "%s\n", out);
    else fwrite(out, 1, strlen(out), stdout);
    free(out);
    json_decref(vars);
    free(src);
    return rc ? 1 : 0;
}
