/* kiln inspect FILE|DIR [--json]: what a model container holds — architecture, hyperparameters, tokenizer, tensors. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

int cmd_inspect(int argc, char **argv);

#define ARRAY_PREVIEW 4 /* elements of an array shown in text output */

typedef struct totals {
    uint64_t bytes;
    int64_t params;
} totals;

static totals tensor_totals(const kiln_gguf *g) {
    totals t = {0, 0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        t.bytes += g->tensors[i].size;
        t.params += kiln_tensor_nelements(&g->tensors[i]);
    }
    return t;
}

static double bits_per_weight(totals t) { return t.params ? 8.0 * (double)t.bytes / (double)t.params : 0.0; }

/* Keys of the architecture's hyperparameters: "<arch>." prefix. */
static bool is_hparam(const char *key, const char *arch) {
    size_t n = strlen(arch);
    return arch[0] && strncmp(key, arch, n) == 0 && key[n] == '.';
}

/* ---- text ---- */

static void print_scalar(FILE *out, kiln_gguf_vtype t, const void *p) {
    switch (t) {
    case KILN_GGUF_UINT8: fprintf(out, "%u", *(const uint8_t *)p); break;
    case KILN_GGUF_INT8: fprintf(out, "%d", *(const int8_t *)p); break;
    case KILN_GGUF_UINT16: fprintf(out, "%u", *(const uint16_t *)p); break;
    case KILN_GGUF_INT16: fprintf(out, "%d", *(const int16_t *)p); break;
    case KILN_GGUF_UINT32: fprintf(out, "%" PRIu32, *(const uint32_t *)p); break;
    case KILN_GGUF_INT32: fprintf(out, "%" PRId32, *(const int32_t *)p); break;
    case KILN_GGUF_FLOAT32: fprintf(out, "%g", *(const float *)p); break;
    case KILN_GGUF_BOOL: fprintf(out, "%s", *(const bool *)p ? "true" : "false"); break;
    case KILN_GGUF_UINT64: fprintf(out, "%" PRIu64, *(const uint64_t *)p); break;
    case KILN_GGUF_INT64: fprintf(out, "%" PRId64, *(const int64_t *)p); break;
    case KILN_GGUF_FLOAT64: fprintf(out, "%g", *(const double *)p); break;
    default: break;
    }
}

/* A string shown on one line: control characters escaped, long ones cut. */
static void print_short_str(FILE *out, kiln_str s, size_t max) {
    fputc('"', out);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '\n') fputs("\\n", out);
        else if (ch < 0x20 || ch == 0x7f) fprintf(out, "\\x%02x", ch);
        else fputc(ch, out);
    }
    fputs(s.len > max ? "\"..." : "\"", out);
}

static void print_value(FILE *out, const kiln_gguf_value *v) {
    switch (v->type) {
    case KILN_GGUF_STRING: print_short_str(out, v->str, 60); return;
    case KILN_GGUF_BOOL: fputs(v->b ? "true" : "false", out); return;
    case KILN_GGUF_FLOAT32: case KILN_GGUF_FLOAT64: fprintf(out, "%g", v->f64); return;
    case KILN_GGUF_INT8: case KILN_GGUF_INT16: case KILN_GGUF_INT32: case KILN_GGUF_INT64:
        fprintf(out, "%" PRId64, v->i64);
        return;
    case KILN_GGUF_ARRAY: break;
    default: fprintf(out, "%" PRIu64, v->u64); return;
    }
    kiln_gguf_vtype et = v->arr.elem_type;
    fprintf(out, "[%s × %" PRIu64 "]", kiln_gguf_vtype_name(et), v->arr.n);
    if (et == KILN_GGUF_ARRAY || v->arr.n == 0) return;
    fputs(" ", out);
    for (uint64_t i = 0; i < v->arr.n && i < ARRAY_PREVIEW; i++) {
        if (i) fputs(", ", out);
        if (et == KILN_GGUF_STRING) print_short_str(out, ((const kiln_str *)v->arr.data)[i], 20);
        else print_scalar(out, et, (const char *)v->arr.data + i * kiln_gguf_vtype_size(et));
    }
    if (v->arr.n > ARRAY_PREVIEW) fputs(", ...", out);
}

static void print_token(FILE *out, const kiln_gguf *g, const char *key) {
    int64_t id;
    if (!kiln_gguf_get_int(g, key, &id)) {
        fputs("none\n", out);
        return;
    }
    fprintf(out, "%" PRId64, id);
    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    if (tok && id >= 0 && (uint64_t)id < tok->arr.n) {
        fputs(" ", out);
        print_short_str(out, ((const kiln_str *)tok->arr.data)[id], 40);
    }
    fputs("\n", out);
}

static void print_tokenizer(FILE *out, const kiln_gguf *g) {
    const char *model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    const char *pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    const char *tmpl = kiln_gguf_get_str(g, "tokenizer.chat_template");
    fprintf(out, "\ntokenizer:\n");
    fprintf(out, "  %-16s %s\n", "model", model ? model : "none");
    fprintf(out, "  %-16s %s\n", "pre", pre ? pre : "default");
    fprintf(out, "  %-16s %" PRIu64 "\n", "vocab size", tok ? tok->arr.n : 0);
    fprintf(out, "  %-16s ", "bos id");
    print_token(out, g, "tokenizer.ggml.bos_token_id");
    fprintf(out, "  %-16s ", "eos id");
    print_token(out, g, "tokenizer.ggml.eos_token_id");
    if (tmpl) fprintf(out, "  %-16s yes (%zu bytes)\n", "chat template", strlen(tmpl));
    else fprintf(out, "  %-16s no\n", "chat template");
}

static void format_shape(char *buf, size_t cap, const kiln_gguf_tensor *t) {
    size_t used = 0;
    for (uint32_t d = 0; d < t->n_dims && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, d ? " x " : "", t->ne[d]);
}

static void print_text(FILE *out, const kiln_gguf *g) {
    const char *arch = kiln_gguf_get_str(g, "general.architecture");
    const char *name = kiln_gguf_get_str(g, "general.name");
    fprintf(out, "%-16s %s\n", "file", g->path);
    if (g->version) fprintf(out, "%-16s GGUF v%" PRIu32 ", alignment %" PRIu64 ", data at byte %" PRIu64 "\n",
                            "format", g->version, g->alignment, g->data_offset);
    else fprintf(out, "%-16s safetensors folder\n", "format");
    fprintf(out, "%-16s %s\n", "architecture", arch ? arch : "unknown");
    if (name) fprintf(out, "%-16s %s\n", "name", name);

    fprintf(out, "\nhyperparameters:\n");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (!arch || !is_hparam(g->kv[i].key.ptr, arch)) continue;
        fprintf(out, "  %-40s ", g->kv[i].key.ptr + strlen(arch) + 1);
        print_value(out, &g->kv[i].value);
        fputc('\n', out);
    }
    print_tokenizer(out, g);

    fprintf(out, "\ntensors:\n  %-40s %-6s %-22s %12s\n", "name", "type", "shape", "bytes");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        char shape[96];
        format_shape(shape, sizeof shape, t);
        fprintf(out, "  %-40s %-6s %-22s %12" PRIu64 "\n", t->name.ptr, kiln_type_name(t->type), shape, t->size);
    }
    totals tot = tensor_totals(g);
    fprintf(out, "\ntotals: %" PRIu64 " tensors, %" PRIu64 " bytes (%.1f MiB), %" PRId64
            " parameters (%.1f M), %.2f bits per weight\n", g->n_tensors, tot.bytes, (double)tot.bytes / 1048576.0,
            tot.params, (double)tot.params / 1e6, bits_per_weight(tot));
}

/* ---- JSON ---- */

static json_t *json_number(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* An f32 as the double of its shortest decimal form, so 1e-05f reads back as 1e-05 and not 9.9999997e-06. */
static json_t *json_f32(float f) {
    if (!isfinite(f)) return json_null();
    char buf[32];
    for (int digits = 6; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) return json_real(strtod(buf, NULL));
    }
    return json_real(f);
}

/* A JSON string of arbitrary bytes: invalid UTF-8 (possible in any file) is shown as '?' rather than dropped. */
static json_t *json_str(const char *p, uint64_t len) {
    json_t *s = json_stringn(p, (size_t)len);
    if (s) return s;
    char *copy = malloc(len + 1);
    if (!copy) return json_null();
    for (uint64_t i = 0; i < len; i++) copy[i] = (unsigned char)p[i] < 0x80 && p[i] ? p[i] : '?';
    s = json_stringn(copy, (size_t)len);
    free(copy);
    return s ? s : json_null();
}

static json_t *json_value(const kiln_gguf_value *v);

static json_t *json_elem(kiln_gguf_vtype t, const void *p) {
    switch (t) {
    case KILN_GGUF_UINT8: return json_integer(*(const uint8_t *)p);
    case KILN_GGUF_INT8: return json_integer(*(const int8_t *)p);
    case KILN_GGUF_UINT16: return json_integer(*(const uint16_t *)p);
    case KILN_GGUF_INT16: return json_integer(*(const int16_t *)p);
    case KILN_GGUF_UINT32: return json_integer(*(const uint32_t *)p);
    case KILN_GGUF_INT32: return json_integer(*(const int32_t *)p);
    case KILN_GGUF_FLOAT32: return json_f32(*(const float *)p);
    case KILN_GGUF_BOOL: return json_boolean(*(const bool *)p);
    case KILN_GGUF_UINT64: {
        uint64_t u = *(const uint64_t *)p;
        return u <= INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    }
    case KILN_GGUF_INT64: return json_integer(*(const int64_t *)p);
    case KILN_GGUF_FLOAT64: return json_number(*(const double *)p);
    case KILN_GGUF_STRING: {
        const kiln_str *s = p;
        return json_str(s->ptr, s->len);
    }
    case KILN_GGUF_ARRAY: return json_value(p);
    default: return json_null();
    }
}

static json_t *json_value(const kiln_gguf_value *v) {
    switch (v->type) {
    case KILN_GGUF_STRING: return json_str(v->str.ptr, v->str.len);
    case KILN_GGUF_BOOL: return json_boolean(v->b);
    case KILN_GGUF_FLOAT32: return json_f32((float)v->f64);
    case KILN_GGUF_FLOAT64: return json_number(v->f64);
    case KILN_GGUF_INT8: case KILN_GGUF_INT16: case KILN_GGUF_INT32: case KILN_GGUF_INT64:
        return json_integer(v->i64);
    case KILN_GGUF_ARRAY: break;
    default: return v->u64 <= INT64_MAX ? json_integer((json_int_t)v->u64) : json_real((double)v->u64);
    }
    json_t *a = json_array();
    kiln_gguf_vtype et = v->arr.elem_type;
    size_t es = et == KILN_GGUF_STRING ? sizeof(kiln_str) : et == KILN_GGUF_ARRAY ? sizeof(kiln_gguf_value)
                                                                                   : kiln_gguf_vtype_size(et);
    for (uint64_t i = 0; i < v->arr.n; i++) json_array_append_new(a, json_elem(et, (const char *)v->arr.data + i * es));
    return a;
}

static json_t *json_token_id(const kiln_gguf *g, const char *key) {
    int64_t id;
    return kiln_gguf_get_int(g, key, &id) ? json_integer(id) : json_null();
}

static json_t *json_tokenizer(const kiln_gguf *g) {
    const char *model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    const char *pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    return json_pack("{s:o, s:o, s:I, s:o, s:o, s:b}", "model", model ? json_str(model, strlen(model)) : json_null(),
                     "pre", pre ? json_str(pre, strlen(pre)) : json_null(), "vocab_size", (json_int_t)(tok ? tok->arr.n : 0),
                     "bos_id", json_token_id(g, "tokenizer.ggml.bos_token_id"), "eos_id",
                     json_token_id(g, "tokenizer.ggml.eos_token_id"), "has_chat_template",
                     kiln_gguf_get_str(g, "tokenizer.chat_template") != NULL);
}

static json_t *json_tensors(const kiln_gguf *g) {
    json_t *a = json_array();
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->ne[d]));
        json_array_append_new(a, json_pack("{s:o, s:s, s:o, s:I, s:I}", "name", json_str(t->name.ptr, t->name.len),
                                           "type", kiln_type_name(t->type), "shape", shape, "bytes",
                                           (json_int_t)t->size, "offset", (json_int_t)t->offset));
    }
    return a;
}

static int print_json(FILE *out, const kiln_gguf *g) {
    const char *arch = kiln_gguf_get_str(g, "general.architecture");
    json_t *hparams = json_object(), *general = json_object();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const char *key = g->kv[i].key.ptr;
        if (arch && is_hparam(key, arch)) json_object_set_new(hparams, key + strlen(arch) + 1, json_value(&g->kv[i].value));
        else if (strncmp(key, "general.", 8) == 0) json_object_set_new(general, key + 8, json_value(&g->kv[i].value));
    }
    totals tot = tensor_totals(g);
    json_t *root = json_pack(
        "{s:o, s:s, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I, s:f}}", "path",
        json_str(g->path, strlen(g->path)), "format",
        g->version ? "gguf" : "safetensors", "version", (json_int_t)g->version, "alignment", (json_int_t)g->alignment,
        "data_offset", (json_int_t)g->data_offset, "architecture", arch ? json_str(arch, strlen(arch)) : json_null(), "general",
        general, "hyperparameters", hparams, "tokenizer", json_tokenizer(g), "tensors", json_tensors(g), "totals",
        "tensors", (json_int_t)g->n_tensors, "bytes", (json_int_t)tot.bytes, "parameters", (json_int_t)tot.params,
        "bits_per_weight", bits_per_weight(tot));
    if (!root) return -1;
    int rc = json_dumpf(root, out, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    fputc('\n', out);
    json_decref(root);
    return rc;
}

static void usage(FILE *out) {
    fprintf(out, "usage: kiln inspect FILE.gguf|MODEL_DIR [--json]\n\n"
                 "Prints a model's architecture, hyperparameters, tokenizer summary, tensor table and totals.\n"
                 "  --json   one JSON object instead of text\n");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            as_json = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "error: unexpected argument '%s' (see 'kiln inspect --help')\n", argv[i]);
            return 1;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "error: no model given (see 'kiln inspect --help')\n");
        return 1;
    }
    kiln_gguf *g;
    kiln_error err;
    if (kiln_model_file_open(path, &g, &err)) {
        /* one line, whatever bytes a hostile file put into a key or name the message quotes */
        for (char *c = err.msg; *c; c++)
            if ((unsigned char)*c < 0x20) *c = '?';
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int rc = as_json ? print_json(stdout, g) : (print_text(stdout, g), 0);
    kiln_gguf_close(g);
    if (rc || fflush(stdout) != 0) {
        fprintf(stderr, "error: cannot write the output\n");
        return 1;
    }
    return 0;
}
