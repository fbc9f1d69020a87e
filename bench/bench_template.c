/* Chat-template speed: parse time and render time of each template given on the command line, with a 32-message
 * conversation (what a server renders per request).
 * usage: bench_template TEMPLATE.jinja... */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/template.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf) buf[fread(buf, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return buf;
}

static json_t *conversation(int turns) {
    json_t *msgs = json_array();
    for (int i = 0; i < turns; i++) {
        char text[256];
        snprintf(text, sizeof text, "Message %d: a few sentences of ordinary chat text, with \"quotes\" and a newline\nhere.", i);
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", i % 2 ? "assistant" : "user", "content", text));
    }
    return msgs;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TEMPLATE.jinja...\n", argv[0]);
        return 2;
    }
    json_t *msgs = conversation(32);
    kiln_chat_opts opts = {.add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
    printf("%-50s %12s %12s %10s\n", "template", "parse us", "render us", "out bytes");
    for (int i = 1; i < argc; i++) {
        char *src = read_file(argv[i]);
        if (!src) {
            fprintf(stderr, "cannot read %s\n", argv[i]);
            continue;
        }
        kiln_error err = {{0}};
        kiln_template *t = NULL;
        int reps = 200;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) {
            kiln_template_free(t);
            if (kiln_template_parse(src, &t, &err)) break;
        }
        double parse_us = (now_s() - t0) / reps * 1e6;
        char *out = NULL;
        size_t bytes = 0;
        t0 = now_s();
        for (int r = 0; t && r < reps; r++) {
            free(out);
            out = NULL;
            if (kiln_template_render_json(t, msgs, &opts, &out, &err)) break;
            bytes = strlen(out);
        }
        double render_us = (now_s() - t0) / reps * 1e6;
        const char *name = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
        if (!out) printf("%-50s error: %s\n", name, err.msg);
        else printf("%-50s %12.1f %12.1f %10zu\n", name, parse_us, render_us, bytes);
        free(out);
        kiln_template_free(t);
        free(src);
    }
    json_decref(msgs);
    return 0;
}
