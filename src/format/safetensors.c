/* An HF model folder as a kiln_gguf (what the translation gives is described in safetensors.h). */
#include "format/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/hf.h"
#include "format/meta_builder.h"
#include "util/half.h"

#define MAX_JSON_FILE (256u * 1024 * 1024)

typedef struct st_ctx {
    const char *dir;
    kiln_meta m;
    kiln_hf_config cfg;
    json_t *weight_map; /* HF name -> shard file, from the index; NULL for a single model.safetensors */
    json_t *seen;       /* GGUF name -> file it came from, for duplicate detection */
} st_ctx;

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Reads a whole small file; *text is NUL-terminated. Returns 1 (and *text NULL) when it does not exist. */
static int read_text(const char *dir, const char *name, char **text, size_t *len, kiln_error *err) {
    *text = NULL;
    char *path = join(dir, name);
    if (!path) return kiln_fail(err, "%s: out of memory", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        int rc = e == ENOENT ? 1 : kiln_fail(err, "%s: cannot open: %s", name, strerror(e));
        free(path);
        return rc;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_JSON_FILE) {
        rc = kiln_fail(err, "%s: not a regular file of at most %u bytes", name, MAX_JSON_FILE);
    } else if (!(*text = malloc((size_t)st.st_size + 1))) {
        rc = kiln_fail(err, "%s: out of memory", name);
    } else if (fread(*text, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        rc = kiln_fail(err, "%s: read error", name);
        free(*text);
        *text = NULL;
    } else {
        (*text)[st.st_size] = '\0';
        *len = (size_t)st.st_size;
    }
    fclose(f);
    free(path);
    return rc;
}

static int load_config(st_ctx *c, kiln_error *err) {
    char *text;
    size_t len;
    int rc = read_text(c->dir, "config.json", &text, &len, err);
    if (rc == 1) return kiln_fail(err, "no config.json in the folder");
    if (rc) return -1;
    rc = kiln_hf_config_parse(text, len, "config.json", &c->cfg, &c->m, err);
    free(text);
    return rc;
}

static int load_tokenizer(st_ctx *c, kiln_error *err) {
    char *tok = NULL, *tcfg = NULL, *tmpl = NULL;
    size_t tok_len = 0, tcfg_len = 0, tmpl_len = 0;
    int rc = read_text(c->dir, "tokenizer.json", &tok, &tok_len, err);
    if (rc == 1) return 0; /* weights only: the model loads without a tokenizer */
    if (rc == 0 && read_text(c->dir, "tokenizer_config.json", &tcfg, &tcfg_len, err) < 0) rc = -1;
    if (rc == 0 && read_text(c->dir, "chat_template.jinja", &tmpl, &tmpl_len, err) < 0) rc = -1;
    if (rc == 0) rc = kiln_hf_tokenizer_parse(tok, tok_len, tcfg, tcfg_len, tmpl, &c->cfg, &c->m, err);
    free(tok);
    free(tcfg);
    free(tmpl);
    return rc;
}

/* Shard names come from a file we do not trust: plain names only, nothing that walks out of the folder. */
static bool safe_file_name(const char *s) {
    return *s && *s != '.' && !strchr(s, '/') && strlen(s) < 1024;
}

static int load_index(st_ctx *c, json_t **files, kiln_error *err) {
    char *text;
    size_t len;
    int rc = read_text(c->dir, "model.safetensors.index.json", &text, &len, err);
    if (rc) return rc; /* 1: no index, a single model.safetensors */
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root)
        return kiln_fail(err, "model.safetensors.index.json: JSON at byte %d: %s", jerr.position, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return kiln_fail(err, "model.safetensors.index.json: weight_map missing or not an object");
    }
    *files = json_object();
    const char *name;
    json_t *file;
    json_object_foreach(wm, name, file) {
        if (!json_is_string(file) || !safe_file_name(json_string_value(file))) {
            rc = kiln_fail(err, "model.safetensors.index.json: weight_map[\"%.200s\"] is not a plain file name", name);
            break;
        }
        json_object_set_new(*files, json_string_value(file), json_true());
    }
    c->weight_map = json_incref(wm);
    json_decref(root);
    return rc;
}

static void gguf_shape(kiln_gguf_tensor *t, const kiln_st_entry *e) {
    t->n_dims = e->n_dims ? e->n_dims : 1;
    for (uint32_t d = 0; d < e->n_dims; d++) t->ne[d] = e->shape[e->n_dims - 1 - d];
}

static int add_entry(st_ctx *c, const char *file, const uint8_t *base, const kiln_st_entry *e, kiln_error *err) {
    char name[KILN_GGUF_MAX_TENSOR_NAME];
    int mapped = kiln_hf_tensor_name(e->name, name, sizeof name);
    if (mapped < 0)
        return kiln_fail(err, "%s: tensor %.200s has no GGUF name (architecture %s)", file, e->name, c->cfg.arch);
    if (mapped == 0 || (c->cfg.tied_embeddings && !strcmp(name, "output.weight"))) return 0;
    if (c->weight_map) {
        const char *listed = json_string_value(json_object_get(c->weight_map, e->name));
        if (listed && strcmp(listed, file)) return 0; /* the index says another shard holds the real one */
    }
    for (uint32_t d = 0; d < e->n_dims; d++)
        if (e->shape[d] == 0) return kiln_fail(err, "%s: tensor %.200s has a zero-size dimension", file, e->name);
    json_t *prev = json_object_get(c->seen, name);
    if (prev)
        return kiln_fail(err, "%s: tensor %.200s appears twice (also in %s)", file, e->name, json_string_value(prev));
    json_object_set_new(c->seen, name, json_string(file));
    kiln_gguf_tensor *t = kiln_meta_add_tensor(&c->m, name, err);
    if (!t) return -1;
    gguf_shape(t, e);
    t->type = e->type;
    t->offset = e->begin;
    t->size = e->end - e->begin;
    t->data = base + e->begin;
    return 0;
}

static int load_file(st_ctx *c, const char *file, kiln_error *err) {
    char *path = join(c->dir, file);
    if (!path) return kiln_fail(err, "%s: out of memory", file);
    const void *data;
    size_t size;
    kiln_st_entry *e = NULL;
    size_t n = 0;
    int rc = kiln_gguf_map_file(c->m.g, path, &data, &size, err);
    if (rc == 0) rc = kiln_safetensors_parse(data, size, file, &e, &n, err);
    for (size_t i = 0; rc == 0 && i < n; i++) rc = add_entry(c, file, data, &e[i], err);
    kiln_st_entries_free(e, n);
    free(path);
    return rc;
}

static int load_tensors(st_ctx *c, kiln_error *err) {
    json_t *files = NULL;
    int rc = load_index(c, &files, err);
    if (rc < 0) {
        json_decref(files);
        return -1;
    }
    if (rc == 1) {
        struct stat st;
        char *path = join(c->dir, "model.safetensors");
        bool found = path && stat(path, &st) == 0;
        free(path);
        if (!found) return kiln_fail(err, "no model.safetensors or model.safetensors.index.json in the folder");
        return load_file(c, "model.safetensors", err);
    }
    const char *file;
    json_t *unused;
    json_object_foreach(files, file, unused) {
        if ((rc = load_file(c, file, err))) break;
    }
    json_decref(files);
    if (rc) return -1;
    const char *name;
    json_t *shard;
    json_object_foreach(c->weight_map, name, shard) {
        char gname[KILN_GGUF_MAX_TENSOR_NAME];
        if (kiln_hf_tensor_name(name, gname, sizeof gname) == 1 && !json_object_get(c->seen, gname) &&
            !(c->cfg.tied_embeddings && !strcmp(gname, "output.weight")))
            return kiln_fail(err, "%s: tensor %.200s listed in model.safetensors.index.json is not in it",
                             json_string_value(shard), name);
    }
    return 0;
}

/* HF keeps each head's rotary halves apart (rows [0, d/2) pair with [d/2, d)); GGUF llama interleaves them
 * (rows 2j and 2j+1 pair). GGUF row h*d + 2j + s comes from HF row h*d + s*d/2 + j. */
static int permute_rows(kiln_meta *m, kiln_gguf_tensor *t, int64_t n_head, kiln_error *err) {
    int64_t rows = t->n_dims == 1 ? t->ne[0] : t->ne[1];
    if (rows % (2 * n_head))
        return kiln_fail(err, "tensor %s: %lld rows do not split into %lld heads of even size", t->name.ptr,
                         (long long)rows, (long long)n_head);
    size_t row_bytes = (size_t)(t->size / (uint64_t)rows);
    int64_t hd = rows / n_head, half = hd / 2;
    uint8_t *dst = kiln_gguf_alloc(m->g, (size_t)t->size);
    if (!dst) return kiln_fail(err, "tensor %s: out of memory for the rope permutation", t->name.ptr);
    const uint8_t *src = t->data;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t j = 0; j < half; j++)
            for (int64_t s = 0; s < 2; s++) {
                size_t to = (size_t)(h * hd + 2 * j + s), from = (size_t)(h * hd + s * half + j);
                memcpy(dst + to * row_bytes, src + from * row_bytes, row_bytes);
            }
    t->data = dst;
    return 0;
}

static int permute_qk(st_ctx *c, kiln_error *err) {
    for (uint64_t i = 0; i < c->m.g->n_tensors; i++) {
        kiln_gguf_tensor *t = &c->m.g->tensors[i];
        if (strncmp(t->name.ptr, "blk.", 4)) continue;
        const char *dot = strchr(t->name.ptr + 4, '.'); /* after "blk.N" */
        if (!dot) continue;
        int64_t heads = !strncmp(dot, ".attn_q.", 8)   ? c->cfg.n_head
                        : !strncmp(dot, ".attn_k.", 8) ? c->cfg.n_head_kv
                                                       : 0;
        if (heads && permute_rows(&c->m, t, heads, err)) return -1;
    }
    return 0;
}

/* Norm weights and biases come as F16/BF16 in half-precision checkpoints; a GGUF always holds them as F32, and so
 * does the container (a small owned copy), so no consumer meets a half-precision vector. */
static int widen_vectors(st_ctx *c, kiln_error *err) {
    for (uint64_t i = 0; i < c->m.g->n_tensors; i++) {
        kiln_gguf_tensor *t = &c->m.g->tensors[i];
        if (t->n_dims != 1 || t->type == KILN_TYPE_F32) continue;
        int64_t n = t->ne[0];
        float *f = kiln_gguf_alloc(c->m.g, (size_t)n * sizeof *f);
        if (!f) return kiln_fail(err, "tensor %s: out of memory", t->name.ptr);
        const uint16_t *h = t->data;
        for (int64_t j = 0; j < n; j++) {
            uint16_t v;
            memcpy(&v, h + j, sizeof v); /* mapped data need not be 2-byte aligned */
            f[j] = t->type == KILN_TYPE_F16 ? kiln_half_to_float(v) : kiln_bf16_to_float(v);
        }
        t->type = KILN_TYPE_F32;
        t->size = (uint64_t)n * sizeof *f;
        t->data = f;
    }
    return 0;
}

static int add_rope_freqs(st_ctx *c, kiln_error *err) {
    int64_t n = c->cfg.head_dim / 2;
    float *f = kiln_gguf_alloc(c->m.g, (size_t)n * sizeof *f);
    if (!f) return kiln_fail(err, "out of memory for rope_freqs");
    kiln_hf_llama3_rope_freqs(&c->cfg, f);
    kiln_gguf_tensor *t = kiln_meta_add_tensor(&c->m, "rope_freqs.weight", err);
    if (!t) return -1;
    t->type = KILN_TYPE_F32;
    t->n_dims = 1;
    t->ne[0] = n;
    t->size = (uint64_t)n * sizeof *f;
    t->data = f;
    return 0;
}

/* general.* keys: the folder's name and the file type llama.cpp would give an unquantized conversion. */
static int write_general(st_ctx *c, kiln_error *err) {
    const char *base = strrchr(c->dir, '/');
    base = base && base[1] ? base + 1 : c->dir;
    const kiln_gguf_tensor *emb = NULL;
    for (uint64_t i = 0; i < c->m.g->n_tensors; i++)
        if (!strcmp(c->m.g->tensors[i].name.ptr, "token_embd.weight")) emb = &c->m.g->tensors[i];
    if (!emb) return kiln_fail(err, "no model.embed_tokens.weight tensor");
    uint32_t ftype = emb->type == KILN_TYPE_F32 ? 0 : emb->type == KILN_TYPE_F16 ? 1 : 32; /* 32: mostly BF16 */
    char key[64];
    snprintf(key, sizeof key, "%s.vocab_size", c->cfg.arch);
    const kiln_gguf_value *tokens = kiln_meta_get(&c->m, "tokenizer.ggml.tokens");
    return kiln_meta_set_str(&c->m, "general.name", base, err) ||
                   kiln_meta_set_u32(&c->m, "general.file_type", ftype, err) ||
                   kiln_meta_set_u32(&c->m, key, (uint32_t)(tokens ? tokens->arr.n : 0), err)
               ? -1
               : 0;
}

static int build(st_ctx *c, kiln_error *err) {
    if (load_config(c, err) || load_tokenizer(c, err) || load_tensors(c, err)) return -1;
    if (c->cfg.permute_qk && permute_qk(c, err)) return -1;
    if (widen_vectors(c, err)) return -1;
    if (c->cfg.llama3_rope && add_rope_freqs(c, err)) return -1;
    return write_general(c, err);
}

int kiln_safetensors_open_dir(const char *dir, kiln_gguf **out, kiln_error *err) {
    *out = NULL;
    st_ctx c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    if (kiln_meta_init(&c.m, dir, err)) return -1;
    c.seen = json_object();
    int rc = c.seen ? build(&c, err) : kiln_fail(err, "out of memory");
    json_decref(c.seen);
    json_decref(c.weight_map);
    if (rc) {
        kiln_fail_prefix(err, "%s", dir);
        kiln_meta_discard(&c.m);
        return -1;
    }
    c.m.g->version = 0;
    *out = kiln_meta_finish(&c.m, err);
    return *out ? 0 : -1;
}
