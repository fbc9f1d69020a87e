/* kiln template: render a model's chat template with a conversation and print the exact prompt, for debugging
 * prompts. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "template/template.h"

int cmd_template(int argc, char **argv);

static const char DEFAULT_MESSAGES[] =
    "[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
    " {\"role\": \"user\", \"content\": \"Hello! What can you do?\"}]";

static void usage(FILE *out) {
    fprintf(out,
            "usage: kiln template -m MODEL [--messages FILE.json] [--no-generation-prompt]\n"
            "       kiln template --template FILE.jinja [--bos TEXT] [--eos TEXT] [--messages FILE.json]\n\n"
            "Prints the prompt the model's chat template makes of a conversation, byte for byte.\n"
            "  -m, --model FILE        GGUF file or safetensors folder whose tokenizer.chat_template to use\n"
            "  --template FILE         render this Jinja template file instead of the model's\n"
            "  --name NAME             use the model's named template tokenizer.chat_template.NAME\n"
            "  --messages FILE         JSON array of {\"role\", \"content\"} messages (OpenAI shape), or an object\n"
            "                          with \"messages\" whose other keys become template variables (tools, ...);\n"
            "                          default: a short system + user conversation\n"
            "  --no-generation-prompt  leave add_generation_prompt false\n"
            "  --bos TEXT, --eos TEXT  bos_token/eos_token (default: the model's)\n");
}

static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

typedef struct template_args {
    const char *model, *template_file, *name, *messages_file, *bos, *eos;
    bool generation_prompt;
} template_args;

static int parse_args(int argc, char **argv, template_args *a) {
    *a = (template_args){.generation_prompt = true};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has_value = i + 1 < argc;
        if ((!strcmp(o, "-m") || !strcmp(o, "--model")) && has_value) a->model = argv[++i];
        else if (!strcmp(o, "--template") && has_value) a->template_file = argv[++i];
        else if (!strcmp(o, "--name") && has_value) a->name = argv[++i];
        else if (!strcmp(o, "--messages") && has_value) a->messages_file = argv[++i];
        else if (!strcmp(o, "--bos") && has_value) a->bos = argv[++i];
        else if (!strcmp(o, "--eos") && has_value) a->eos = argv[++i];
        else if (!strcmp(o, "--no-generation-prompt")) a->generation_prompt = false;
        else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "error: unknown or incomplete option '%s'\n\n", o);
            usage(stderr);
            return 1;
        }
    }
    if (!a->model == !a->template_file) {
        fprintf(stderr, "error: give a model (-m) or a template file (--template)\n\n");
        usage(stderr);
        return 1;
    }
    return -1;
}

/* Loads the conversation: a JSON array of messages, or an object holding "messages" plus extra variables. */
static int load_messages(const char *path, json_t **messages, json_t **extra) {
    json_error_t jerr;
    json_t *root = path ? json_load_file(path, 0, &jerr) : json_loads(DEFAULT_MESSAGES, 0, &jerr);
    if (!root) {
        fprintf(stderr, "error: %s: line %d, column %d: %s\n", path ? path : "default messages", jerr.line, jerr.column, jerr.text);
        return -1;
    }
    if (json_is_object(root)) {
        *messages = json_incref(json_object_get(root, "messages"));
        json_object_del(root, "messages");
        *extra = root;
    } else {
        *messages = root;
        *extra = NULL;
    }
    if (!json_is_array(*messages)) {
        fprintf(stderr, "error: %s: expected a JSON array of messages (or an object with \"messages\")\n", path);
        json_decref(*messages);
        json_decref(*extra);
        return -1;
    }
    return 0;
}

static int load_template(const template_args *a, kiln_gguf **g, kiln_template **t, kiln_error *err) {
    if (a->model) {
        if (kiln_model_file_open(a->model, g, err)) return -1;
        return kiln_template_from_gguf(*g, a->name, t, NULL, err);
    }
    char *src = read_text_file(a->template_file);
    if (!src) return kiln_fail(err, "cannot read %s: %s", a->template_file, strerror(errno));
    int rc = kiln_template_parse(src, t, err);
    free(src);
    return rc ? kiln_fail_prefix(err, "%s", a->template_file) : 0;
}

int cmd_template(int argc, char **argv) {
    template_args a;
    int status = parse_args(argc, argv, &a);
    if (status >= 0) return status;
    kiln_error err = {{0}};
    kiln_gguf *g = NULL;
    kiln_template *t = NULL;
    json_t *messages = NULL, *extra = NULL;
    char *out = NULL;
    int rc = 1;
    if (load_messages(a.messages_file, &messages, &extra)) goto done;
    if (load_template(&a, &g, &t, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    kiln_chat_opts opts = {.add_generation_prompt = a.generation_prompt, .bos_token = a.bos, .eos_token = a.eos, .extra = extra};
    if (g) kiln_template_special_tokens(g, a.bos ? NULL : &opts.bos_token, a.eos ? NULL : &opts.eos_token);
    if (kiln_template_render_json(t, messages, &opts, &out, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    rc = 0;
done:
    free(out);
    kiln_template_free(t);
    kiln_gguf_close(g);
    json_decref(messages);
    json_decref(extra);
    return rc;
}
