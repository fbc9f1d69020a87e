/* Chat templates: a Jinja2-subset interpreter that renders a model's own chat template exactly as HF transformers'
 * apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, loop controls, HF's
 * tojson, raise_exception and strftime_now). */
#ifndef KILN_TEMPLATE_TEMPLATE_H
#define KILN_TEMPLATE_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

/* A parsed template; immutable once parsed, so one may be rendered from several threads at once. */
typedef struct kiln_template kiln_template;

/* Parses template source. Syntax errors name the line and column: "template line 3, column 7: ...". */
int kiln_template_parse(const char *source, kiln_template **out, kiln_error *err);
void kiln_template_free(kiln_template *t);
/* The source the template was parsed from, as Jinja reads it: "\r\n" and "\r" made "\n", one trailing newline
 * dropped. */
const char *kiln_template_source(const kiln_template *t);

/* One message in the OpenAI shape with plain-text content. Messages with content parts, tool_calls or other fields
 * go through kiln_template_render_json instead. */
typedef struct kiln_chat_message {
    const char *role;
    const char *content; /* NULL renders as None */
} kiln_chat_message;

typedef struct kiln_chat_opts {
    bool add_generation_prompt;
    const char *bos_token; /* NULL: the variable is left undefined, as HF does when the tokenizer has none */
    const char *eos_token;
    const json_t *extra; /* optional JSON object: more variables (tools, documents, date_string, ...); tools and
                            documents are None unless given here, as in transformers; the fields above win over
                            keys of the same name */
    int64_t now;         /* seconds since the epoch that strftime_now formats (local time); 0: the current time */
} kiln_chat_opts;

/* Renders the template with messages and the variables in opts; *out is a malloc'd NUL-terminated string the
 * caller frees. Errors (a raise_exception message, a type error, an undefined attribute chain) name the template
 * line and column. A render is bounded (256 MiB of memory, 10 million loop iterations), so a hostile template
 * fails instead of exhausting the process. */
int kiln_template_render(const kiln_template *t, const kiln_chat_message *messages, size_t n_messages,
                         const kiln_chat_opts *opts, char **out, kiln_error *err);
/* The same with messages given as a JSON array of message objects (any fields, content may be a list of parts). */
int kiln_template_render_json(const kiln_template *t, const json_t *messages, const kiln_chat_opts *opts, char **out,
                              kiln_error *err);

/* The ChatML template, used when a model carries none. */
extern const char KILN_TEMPLATE_CHATML[];

/* Parses the model's tokenizer.chat_template (or tokenizer.chat_template.<name> when name is non-NULL). When the
 * model has none, prints a warning to stderr, parses ChatML instead and sets *is_fallback (if non-NULL). */
int kiln_template_from_gguf(const kiln_gguf *g, const char *name, kiln_template **out, bool *is_fallback,
                            kiln_error *err);

/* The text of the model's BOS and EOS tokens (tokenizer.ggml.bos_token_id/eos_token_id into tokenizer.ggml.tokens),
 * as HF hands them to templates; NULL where the model has none. The strings belong to g. */
void kiln_template_special_tokens(const kiln_gguf *g, const char **bos_token, const char **eos_token);

#endif
