/* Public entry points: parse a template once, render it with a conversation. Each entry point owns an arena and the
 * setjmp that errors unwind to (value.h). */
#include "template/template.h"

#include <stdlib.h>
#include <string.h>

#include "template/eval.h"

struct kiln_template {
    char *source; /* newlines normalized, one trailing newline dropped (Jinja's keep_trailing_newline=False) */
    tpl_ctx ctx;  /* owns the syntax tree */
    tpl_nodes body;
};

const char KILN_TEMPLATE_CHATML[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Jinja reads "\r\n" and "\r" as "\n" and drops a single trailing newline. */
static char *normalize_source(const char *src) {
    size_t n = strlen(src);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            out[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            out[k++] = src[i];
        }
    }
    if (k && out[k - 1] == '\n') k--;
    out[k] = '\0';
    return out;
}

int kiln_template_parse(const char *source, kiln_template **out, kiln_error *err) {
    *out = NULL;
    kiln_template *t = calloc(1, sizeof *t);
    if (!t) return kiln_fail(err, "out of memory");
    t->source = normalize_source(source);
    if (!t->source) {
        free(t);
        return kiln_fail(err, "out of memory");
    }
    jmp_buf on_error;
    tpl_ctx_init(&t->ctx, t->source, err, &on_error);
    if (setjmp(on_error)) {
        kiln_template_free(t);
        return -1;
    }
    t->body = tpl_parse(&t->ctx, t->source, strlen(t->source));
    t->ctx.on_error = NULL;
    *out = t;
    return 0;
}

void kiln_template_free(kiln_template *t) {
    if (!t) return;
    tpl_ctx_free(&t->ctx);
    free(t->source);
    free(t);
}

const char *kiln_template_source(const kiln_template *t) { return t->source; }

/* ---- rendering ---- */

static tpl_value from_json(tpl_state *S, const json_t *j, int depth) {
    if (depth > 100) tpl_fail(S->c, -1, "JSON input nested too deep");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tpl_value d = tpl_dict_new(S->c);
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            tpl_dict_set(S->c, d.d, tpl_cstr(S->c, key, strlen(key)), from_json(S, v, depth + 1));
        }
        return d;
    }
    case JSON_ARRAY: {
        tpl_value l = tpl_list_new(S->c, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) tpl_list_push(S->c, l.l, from_json(S, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING: return tpl_cstr(S->c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return tpl_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tpl_float(json_real_value(j));
    case JSON_TRUE: return tpl_bool(true);
    case JSON_FALSE: return tpl_bool(false);
    default: return tpl_none();
    }
}

static void set_global(tpl_state *S, const char *name, tpl_value v) {
    tpl_scope_set(S, S->globals, (tpl_str){name, strlen(name)}, v);
}

static void set_str_global(tpl_state *S, const char *name, const char *s) {
    if (s) set_global(S, name, tpl_cstr(S->c, s, strlen(s)));
}

/* What a render needs beyond the template, kept off the stack so setjmp leaves it intact. */
typedef struct render_job {
    tpl_ctx ctx;
    tpl_state S;
    tpl_sb out;
} render_job;

typedef void (*add_messages_fn)(tpl_state *S, const void *messages, size_t n);

static int render(const kiln_template *t, add_messages_fn add, const void *messages, size_t n, const kiln_chat_opts *opts,
                  char **out, kiln_error *err) {
    *out = NULL;
    render_job *job = calloc(1, sizeof *job);
    if (!job) return kiln_fail(err, "out of memory");
    jmp_buf on_error;
    tpl_ctx_init(&job->ctx, t->source, err, &on_error);
    if (setjmp(on_error)) {
        tpl_ctx_free(&job->ctx);
        free(job);
        return -1;
    }
    tpl_state *S = &job->S;
    S->c = &job->ctx;
    S->now = opts ? opts->now : 0;
    S->globals = S->scope = tpl_scope_new(S, NULL);
    tpl_sb_init(&job->out, S->c);
    S->out = &job->out;
    /* transformers passes these even when the caller has none */
    set_global(S, "tools", tpl_none());
    set_global(S, "documents", tpl_none());
    if (opts && opts->extra) {
        if (!json_is_object(opts->extra)) tpl_fail(S->c, -1, "extra variables must be a JSON object");
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)opts->extra, key, v) {
            set_global(S, tpl_cstr(S->c, key, strlen(key)).s.p, from_json(S, v, 0));
        }
    }
    /* the named arguments win over extra variables of the same name */
    add(S, messages, n);
    set_global(S, "add_generation_prompt", tpl_bool(opts && opts->add_generation_prompt));
    if (opts) {
        set_str_global(S, "bos_token", opts->bos_token);
        set_str_global(S, "eos_token", opts->eos_token);
    }
    tpl_exec(S, &t->body);
    tpl_str s = tpl_sb_str(&job->out);
    char *res = malloc(s.len + 1);
    if (res) {
        memcpy(res, s.p, s.len);
        res[s.len] = '\0';
    }
    tpl_ctx_free(&job->ctx);
    free(job);
    if (!res) return kiln_fail(err, "out of memory");
    *out = res;
    return 0;
}

static void add_struct_messages(tpl_state *S, const void *messages, size_t n) {
    const kiln_chat_message *m = messages;
    tpl_value list = tpl_list_new(S->c, n);
    for (size_t i = 0; i < n; i++) {
        tpl_value d = tpl_dict_new(S->c);
        tpl_dict_set(S->c, d.d, tpl_cstr(S->c, "role", 4), m[i].role ? tpl_cstr(S->c, m[i].role, strlen(m[i].role)) : tpl_none());
        tpl_dict_set(S->c, d.d, tpl_cstr(S->c, "content", 7),
                     m[i].content ? tpl_cstr(S->c, m[i].content, strlen(m[i].content)) : tpl_none());
        tpl_list_push(S->c, list.l, d);
    }
    set_global(S, "messages", list);
}

static void add_json_messages(tpl_state *S, const void *messages, size_t n) {
    const json_t *j = messages;
    if (!json_is_array(j)) tpl_fail(S->c, -1, "messages must be a JSON array");
    set_global(S, "messages", from_json(S, j, 0));
}

int kiln_template_render(const kiln_template *t, const kiln_chat_message *messages, size_t n_messages,
                         const kiln_chat_opts *opts, char **out, kiln_error *err) {
    return render(t, add_struct_messages, messages, n_messages, opts, out, err);
}

int kiln_template_render_json(const kiln_template *t, const json_t *messages, const kiln_chat_opts *opts, char **out,
                              kiln_error *err) {
    return render(t, add_json_messages, messages, 0, opts, out, err);
}
