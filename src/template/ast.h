/* Tokens and syntax tree of the Jinja2 subset, and the lexer and parser that build them. */
#ifndef KILN_TEMPLATE_AST_H
#define KILN_TEMPLATE_AST_H

#include "template/value.h"

/* ---- lexer ---- */

typedef enum tpl_tok_kind {
    TOK_EOF,
    TOK_TEXT,        /* template data between tags, whitespace control already applied */
    TOK_VAR_BEGIN,   /* {{ */
    TOK_VAR_END,     /* }} */
    TOK_BLOCK_BEGIN, /* {% */
    TOK_BLOCK_END,   /* %} */
    TOK_NAME,
    TOK_STRING, /* escapes already decoded */
    TOK_INT,
    TOK_FLOAT,
    TOK_OP, /* text holds the operator: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : | */
} tpl_tok_kind;

typedef struct tpl_token {
    tpl_tok_kind kind;
    long pos; /* byte offset in the source */
    tpl_str text;
    int64_t i;
    double f;
} tpl_token;

typedef struct tpl_tokens {
    tpl_token *v;
    size_t n, cap;
} tpl_tokens;

/* Tokenizes the source the way Jinja2 does with trim_blocks=True, lstrip_blocks=True and
 * keep_trailing_newline=False. Newlines are expected normalized to "\n" already. */
void tpl_lex(tpl_ctx *c, const char *src, size_t len, tpl_tokens *out);

/* ---- syntax tree ---- */

typedef enum tpl_node_kind {
    /* expressions */
    NODE_CONST,   /* value */
    NODE_NAME,    /* name */
    NODE_LIST,    /* items */
    NODE_TUPLE,   /* items */
    NODE_DICT,    /* items (keys), items2 (values) */
    NODE_GETATTR, /* a.name */
    NODE_GETITEM, /* a[b] */
    NODE_SLICE,   /* a[b:c:d], any of b, c, d may be NULL */
    NODE_CALL,    /* a(items..., names[i]=items2[i]...) */
    NODE_FILTER,  /* a | name(items..., names=items2...) */
    NODE_TEST,    /* a is name(items...) */
    NODE_UNARY,   /* op a: '-', '+', 'n' (not) */
    NODE_BINARY,  /* a op b: arithmetic, comparison, '~', 'a'nd, 'o'r, 'i'n, 'I' (not in) */
    NODE_COND,    /* b if a else c (c may be NULL: Undefined) */
    /* statements */
    NODE_TEXT,     /* value: literal output */
    NODE_OUTPUT,   /* {{ a }} */
    NODE_IF,       /* if a: items else items2 (elif is an if inside items2) */
    NODE_FOR,      /* for names in a [if b]: items else items2 */
    NODE_SET,      /* names = b, or names[0].name = b when op == '.' */
    NODE_SETBLOCK, /* names[0] = rendered items */
    NODE_MACRO,    /* macro name(names = items2 defaults, NULL for none): items; op: MACRO_USES_* */
    NODE_CALLBLOCK, /* call a (items2: the caller body as a macro node in b) */
    NODE_BREAK,
    NODE_CONTINUE,
    NODE_BODY,        /* items, rendered in place (generation blocks) */
    NODE_WITH,        /* with names = items2 values: items, in a scope of its own */
    NODE_FILTERBLOCK, /* filter items2 (a chain of NODE_FILTER with no operand): items */
} tpl_node_kind;

/* What a macro body refers to decides what a call may pass, as in Jinja: extra positional arguments need varargs,
 * unknown keywords need kwargs, a {% call %} needs caller. */
enum { MACRO_USES_CALLER = 1, MACRO_USES_VARARGS = 2, MACRO_USES_KWARGS = 4 };

typedef struct tpl_node tpl_node;
typedef struct tpl_nodes {
    tpl_node **v;
    size_t n, cap;
} tpl_nodes;

struct tpl_node {
    tpl_node_kind kind;
    int op;
    long pos;
    tpl_str name;
    tpl_value value;
    tpl_node *a, *b, *c, *d;
    tpl_nodes items, items2;
    tpl_str *names;
    size_t n_names;
};

/* Parses a whole template into its top-level statement list. */
tpl_nodes tpl_parse(tpl_ctx *c, const char *src, size_t len);

#endif
