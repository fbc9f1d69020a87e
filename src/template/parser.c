/* Recursive-descent parser with Jinja2's grammar and operator precedence (jinja2/parser.py): filters and tests bind
 * tighter than any binary operator, '**' is left-associative, and a for loop's iterable cannot be a bare ternary. */
#include <stdio.h>
#include <string.h>

#include "template/ast.h"

enum { MAX_NESTING = 200 };

typedef struct parser {
    tpl_ctx *c;
    tpl_tokens toks;
    size_t i;
    int depth;
    int loops; /* for loops around the statement being parsed, within the current macro or call body */
} parser;

static const tpl_token *peek(const parser *P) { return &P->toks.v[P->i]; }
static const tpl_token *peek2(const parser *P) { return &P->toks.v[P->i + (P->i + 1 < P->toks.n)]; }
static const tpl_token *next(parser *P) { return &P->toks.v[P->i < P->toks.n - 1 ? P->i++ : P->i]; }

static bool str_is(tpl_str s, const char *lit) { return s.len == strlen(lit) && !memcmp(s.p, lit, s.len); }
static bool is_op(const tpl_token *t, const char *op) { return t->kind == TOK_OP && str_is(t->text, op); }
static bool is_name(const tpl_token *t, const char *kw) { return t->kind == TOK_NAME && str_is(t->text, kw); }

static const char *describe(const tpl_token *t) {
    switch (t->kind) {
    case TOK_EOF: return "end of template";
    case TOK_TEXT: return "template data";
    case TOK_VAR_BEGIN: return "'{{'";
    case TOK_VAR_END: return "'}}'";
    case TOK_BLOCK_BEGIN: return "'{%'";
    case TOK_BLOCK_END: return "'%}'";
    case TOK_NAME: return "a name";
    case TOK_STRING: return "a string";
    case TOK_INT: return "an integer";
    case TOK_FLOAT: return "a float";
    case TOK_OP: return "an operator";
    }
    return "?";
}

_Noreturn static void unexpected(parser *P, const char *expected) {
    const tpl_token *t = peek(P);
    if (t->kind == TOK_NAME || t->kind == TOK_OP)
        tpl_fail(P->c, t->pos, "expected %s, got '%.*s'", expected, (int)t->text.len, t->text.p);
    tpl_fail(P->c, t->pos, "expected %s, got %s", expected, describe(t));
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(peek(P), op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        unexpected(P, what);
    }
    next(P);
}

static tpl_str expect_name(parser *P) {
    if (peek(P)->kind != TOK_NAME) unexpected(P, "a name");
    return next(P)->text;
}

static void expect_block_end(parser *P) {
    if (peek(P)->kind != TOK_BLOCK_END) unexpected(P, "end of statement '%}'");
    next(P);
}

static tpl_node *new_node(parser *P, tpl_node_kind kind, long pos) {
    tpl_node *n = tpl_alloc(P->c, sizeof *n);
    n->kind = kind;
    n->pos = pos;
    return n;
}

static void push(parser *P, tpl_nodes *l, tpl_node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tpl_node **v = tpl_alloc(P->c, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static void push_name(parser *P, tpl_node *n, tpl_str name) {
    tpl_str *v = tpl_alloc(P->c, (n->n_names + 1) * sizeof *v);
    if (n->n_names) memcpy(v, n->names, n->n_names * sizeof *v);
    v[n->n_names++] = name;
    n->names = v;
}

static void enter(parser *P) {
    if (++P->depth > MAX_NESTING) tpl_fail(P->c, peek(P)->pos, "expression or block nesting too deep");
}

/* ---- expressions ---- */

static tpl_node *parse_expression(parser *P);
static tpl_node *parse_or(parser *P);
static tpl_node *parse_unary(parser *P, bool with_filter);

static tpl_node *binary(parser *P, int op, long pos, tpl_node *a, tpl_node *b) {
    tpl_node *n = new_node(P, NODE_BINARY, pos);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* Call arguments after '(' up to ')': positional into items, keyword into names/items2. */
static void parse_args(parser *P, tpl_node *n) {
    expect_op(P, "(");
    while (!is_op(peek(P), ")")) {
        if (n->items.n || n->n_names) expect_op(P, ",");
        if (is_op(peek(P), ")")) break;
        if (peek(P)->kind == TOK_NAME && is_op(peek2(P), "=")) {
            push_name(P, n, next(P)->text);
            next(P);
            push(P, &n->items2, parse_expression(P));
        } else {
            if (n->n_names) tpl_fail(P->c, peek(P)->pos, "positional argument after keyword argument");
            push(P, &n->items, parse_expression(P));
        }
    }
    next(P);
}

static tpl_node *parse_const(parser *P, long pos, tpl_value v) {
    tpl_node *n = new_node(P, NODE_CONST, pos);
    n->value = v;
    return n;
}

static tpl_node *parse_sequence(parser *P, tpl_node_kind kind, const char *close, long pos) {
    tpl_node *n = new_node(P, kind, pos);
    while (!is_op(peek(P), close)) {
        if (n->items.n) expect_op(P, ",");
        if (is_op(peek(P), close)) break;
        push(P, &n->items, parse_expression(P));
        if (kind == NODE_DICT) {
            expect_op(P, ":");
            push(P, &n->items2, parse_expression(P));
        }
    }
    next(P);
    return n;
}

static tpl_node *parse_paren(parser *P, long pos) {
    if (is_op(peek(P), ")")) {
        next(P);
        return new_node(P, NODE_TUPLE, pos);
    }
    tpl_node *e = parse_expression(P);
    if (!is_op(peek(P), ",")) {
        expect_op(P, ")");
        return e;
    }
    tpl_node *t = new_node(P, NODE_TUPLE, pos);
    push(P, &t->items, e);
    while (is_op(peek(P), ",")) {
        next(P);
        if (is_op(peek(P), ")")) break;
        push(P, &t->items, parse_expression(P));
    }
    expect_op(P, ")");
    return t;
}

static tpl_node *parse_primary(parser *P) {
    const tpl_token *t = peek(P);
    long pos = t->pos;
    switch (t->kind) {
    case TOK_NAME:
        next(P);
        if (str_is(t->text, "true") || str_is(t->text, "True")) return parse_const(P, pos, tpl_bool(true));
        if (str_is(t->text, "false") || str_is(t->text, "False")) return parse_const(P, pos, tpl_bool(false));
        if (str_is(t->text, "none") || str_is(t->text, "None")) return parse_const(P, pos, tpl_none());
        tpl_node *n = new_node(P, NODE_NAME, pos);
        n->name = t->text;
        return n;
    case TOK_STRING: {
        tpl_sb b;
        tpl_sb_init(&b, P->c);
        while (peek(P)->kind == TOK_STRING) { /* adjacent literals concatenate, as in Python */
            tpl_str s = next(P)->text;
            tpl_sb_put(&b, s.p, s.len);
        }
        return parse_const(P, pos, tpl_strv(tpl_sb_str(&b)));
    }
    case TOK_INT: next(P); return parse_const(P, pos, tpl_int(t->i));
    case TOK_FLOAT: next(P); return parse_const(P, pos, tpl_float(t->f));
    case TOK_OP:
        next(P);
        if (str_is(t->text, "(")) return parse_paren(P, pos);
        if (str_is(t->text, "[")) return parse_sequence(P, NODE_LIST, "]", pos);
        if (str_is(t->text, "{")) return parse_sequence(P, NODE_DICT, "}", pos);
        P->i--;
        break;
    default: break;
    }
    unexpected(P, "an expression");
}

static tpl_node *parse_subscript(parser *P, tpl_node *obj, long pos) {
    tpl_node *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(peek(P), ":") && !is_op(peek(P), "]")) parts[k] = parse_expression(P);
        if (!is_op(peek(P), ":") || k == 2) break;
        next(P);
        slice = true;
        k++;
    }
    if (!slice && parts[0] && is_op(peek(P), ",")) { /* x[a, b] indexes with a tuple */
        tpl_node *t = new_node(P, NODE_TUPLE, parts[0]->pos);
        push(P, &t->items, parts[0]);
        while (is_op(peek(P), ",")) {
            next(P);
            if (is_op(peek(P), "]")) break;
            push(P, &t->items, parse_expression(P));
        }
        parts[0] = t;
    }
    expect_op(P, "]");
    tpl_node *n = new_node(P, slice ? NODE_SLICE : NODE_GETITEM, pos);
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    if (!slice && !n->b) tpl_fail(P->c, pos, "empty subscript");
    return n;
}

static tpl_node *parse_postfix(parser *P, tpl_node *n) {
    for (;;) {
        const tpl_token *t = peek(P);
        if (is_op(t, ".")) {
            next(P);
            const tpl_token *a = peek(P);
            if (a->kind == TOK_INT) {
                tpl_node *g = new_node(P, NODE_GETITEM, t->pos);
                g->a = n;
                g->b = parse_const(P, a->pos, tpl_int(a->i));
                next(P);
                n = g;
                continue;
            }
            tpl_node *g = new_node(P, NODE_GETATTR, t->pos);
            g->a = n;
            g->name = expect_name(P);
            n = g;
        } else if (is_op(t, "[")) {
            next(P);
            n = parse_subscript(P, n, t->pos);
        } else if (is_op(t, "(")) {
            tpl_node *call = new_node(P, NODE_CALL, n->pos);
            call->a = n;
            parse_args(P, call);
            n = call;
        } else {
            return n;
        }
    }
}

/* Jinja takes any following name but else/or/and as a test's single argument ("x is divisibleby 3", and also
 * "x is lower not in y", which then fails as it does there). */
static bool starts_test_arg(const tpl_token *t) {
    if (t->kind == TOK_NAME) return !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and");
    return t->kind == TOK_STRING || t->kind == TOK_INT || t->kind == TOK_FLOAT || is_op(t, "[") || is_op(t, "{");
}

static tpl_node *parse_test(parser *P, tpl_node *operand, long pos) {
    bool negated = is_name(peek(P), "not");
    if (negated) next(P);
    tpl_node *n = new_node(P, NODE_TEST, pos);
    n->a = operand;
    n->name = expect_name(P);
    if (is_op(peek(P), "(")) parse_args(P, n);
    else if (starts_test_arg(peek(P))) {
        if (is_name(peek(P), "is")) tpl_fail(P->c, peek(P)->pos, "You cannot chain multiple tests with is");
        push(P, &n->items, parse_postfix(P, parse_primary(P)));
    }
    if (!negated) return n;
    tpl_node *not = new_node(P, NODE_UNARY, pos);
    not->op = 'n';
    not->a = n;
    return not;
}

static tpl_node *parse_filter_expr(parser *P, tpl_node *n) {
    for (;;) {
        const tpl_token *t = peek(P);
        if (is_op(t, "|")) {
            next(P);
            tpl_node *f = new_node(P, NODE_FILTER, t->pos);
            f->a = n;
            f->name = expect_name(P);
            if (is_op(peek(P), "(")) parse_args(P, f);
            n = f;
        } else if (is_name(t, "is")) {
            next(P);
            n = parse_test(P, n, t->pos);
        } else if (is_op(t, "(")) {
            tpl_node *call = new_node(P, NODE_CALL, n->pos);
            call->a = n;
            parse_args(P, call);
            n = call;
        } else {
            return n;
        }
    }
}

static tpl_node *parse_unary(parser *P, bool with_filter) {
    enter(P);
    const tpl_token *t = peek(P);
    tpl_node *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(P);
        n = new_node(P, NODE_UNARY, t->pos);
        n->op = t->text.p[0];
        n->a = parse_unary(P, false);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static tpl_node *parse_pow(parser *P) {
    tpl_node *a = parse_unary(P, true);
    while (is_op(peek(P), "**")) {
        long pos = next(P)->pos;
        a = binary(P, 'p', pos, a, parse_unary(P, true));
    }
    return a;
}

static tpl_node *parse_math2(parser *P) {
    tpl_node *a = parse_pow(P);
    for (;;) {
        const tpl_token *t = peek(P);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'f' : is_op(t, "%") ? '%' : 0;
        if (!op) return a;
        next(P);
        a = binary(P, op, t->pos, a, parse_pow(P));
    }
}

static tpl_node *parse_concat(parser *P) {
    tpl_node *a = parse_math2(P);
    while (is_op(peek(P), "~")) {
        long pos = next(P)->pos;
        a = binary(P, '~', pos, a, parse_math2(P));
    }
    return a;
}

static tpl_node *parse_math1(parser *P) {
    tpl_node *a = parse_concat(P);
    for (;;) {
        const tpl_token *t = peek(P);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return a;
        next(P);
        a = binary(P, op, t->pos, a, parse_concat(P));
    }
}

/* Comparison operators as single characters: '=' ==, '!' !=, '<', 'l' <=, '>', 'g' >=, 'i' in, 'I' not in.
 * Chains mean what they mean in Python: a < b < c is (a < b) and (b < c). */
static tpl_node *parse_compare(parser *P) {
    tpl_node *a = parse_math1(P), *chain = NULL;
    for (;;) {
        const tpl_token *t = peek(P);
        int op = is_op(t, "==") ? '=' : is_op(t, "!=") ? '!' : is_op(t, "<") ? '<' : is_op(t, "<=") ? 'l'
               : is_op(t, ">") ? '>' : is_op(t, ">=") ? 'g' : is_name(t, "in") ? 'i' : 0;
        if (!op && is_name(t, "not") && is_name(peek2(P), "in")) {
            next(P);
            op = 'I';
        }
        if (!op) return chain ? chain : a;
        next(P);
        tpl_node *cmp = binary(P, op, t->pos, a, parse_math1(P));
        chain = chain ? binary(P, 'a', t->pos, chain, cmp) : cmp;
        a = cmp->b;
    }
}

static tpl_node *parse_not(parser *P) {
    if (!is_name(peek(P), "not")) return parse_compare(P);
    enter(P);
    tpl_node *n = new_node(P, NODE_UNARY, next(P)->pos);
    n->op = 'n';
    n->a = parse_not(P);
    P->depth--;
    return n;
}

static tpl_node *parse_and(parser *P) {
    tpl_node *a = parse_not(P);
    while (is_name(peek(P), "and")) {
        long pos = next(P)->pos;
        a = binary(P, 'a', pos, a, parse_not(P));
    }
    return a;
}

static tpl_node *parse_or(parser *P) {
    tpl_node *a = parse_and(P);
    while (is_name(peek(P), "or")) {
        long pos = next(P)->pos;
        a = binary(P, 'o', pos, a, parse_and(P));
    }
    return a;
}

static tpl_node *parse_expression(parser *P) {
    enter(P);
    tpl_node *a = parse_or(P);
    while (is_name(peek(P), "if")) {
        tpl_node *n = new_node(P, NODE_COND, next(P)->pos);
        n->a = parse_or(P);
        n->b = a;
        if (is_name(peek(P), "else")) {
            next(P);
            n->c = parse_expression(P);
        }
        a = n;
    }
    P->depth--;
    return a;
}

/* ---- statements ---- */

static tpl_nodes parse_until(parser *P, const char *const *ends, tpl_str *which);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_GENERATION[] = {"endgeneration", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};

/* {% with a = 1, b = x %}body{% endwith %} */
static tpl_node *parse_with(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_WITH, pos);
    while (peek(P)->kind != TOK_BLOCK_END) {
        if (n->n_names) expect_op(P, ",");
        push_name(P, n, expect_name(P));
        expect_op(P, "=");
        push(P, &n->items2, parse_expression(P));
    }
    next(P);
    tpl_str which;
    n->items = parse_until(P, END_WITH, &which);
    expect_block_end(P);
    return n;
}

/* {% filter name(args) | name2 %}body{% endfilter %} */
static tpl_node *parse_filter_block(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_FILTERBLOCK, pos);
    do {
        if (n->items2.n) next(P);
        tpl_node *f = new_node(P, NODE_FILTER, peek(P)->pos);
        f->name = expect_name(P);
        if (is_op(peek(P), "(")) parse_args(P, f);
        push(P, &n->items2, f);
    } while (is_op(peek(P), "|"));
    expect_block_end(P);
    tpl_str which;
    n->items = parse_until(P, END_FILTER, &which);
    expect_block_end(P);
    return n;
}

static tpl_node *parse_if(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_IF, pos);
    n->a = parse_expression(P);
    expect_block_end(P);
    tpl_str which;
    n->items = parse_until(P, END_IF, &which);
    if (str_is(which, "elif")) {
        push(P, &n->items2, parse_if(P, pos));
        return n;
    }
    expect_block_end(P);
    if (str_is(which, "else")) {
        n->items2 = parse_until(P, END_ENDIF, &which);
        expect_block_end(P);
    }
    return n;
}

static tpl_node *parse_for(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_FOR, pos);
    bool paren = is_op(peek(P), "(");
    if (paren) next(P);
    do {
        if (n->n_names) next(P);
        push_name(P, n, expect_name(P));
    } while (is_op(peek(P), ","));
    if (paren) expect_op(P, ")");
    if (!is_name(peek(P), "in")) unexpected(P, "'in'");
    next(P);
    n->a = parse_or(P);
    if (is_name(peek(P), "if")) {
        next(P);
        n->b = parse_expression(P);
    }
    if (is_name(peek(P), "recursive")) tpl_fail(P->c, peek(P)->pos, "recursive for loops are not supported");
    expect_block_end(P);
    tpl_str which;
    P->loops++;
    n->items = parse_until(P, END_FOR, &which);
    P->loops--;
    expect_block_end(P);
    if (str_is(which, "else")) {
        n->items2 = parse_until(P, END_ENDFOR, &which);
        expect_block_end(P);
    }
    return n;
}

static tpl_node *parse_set(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_SET, pos);
    push_name(P, n, expect_name(P));
    if (is_op(peek(P), ".")) {
        next(P);
        n->op = '.';
        n->name = expect_name(P);
    } else {
        while (is_op(peek(P), ",")) {
            next(P);
            push_name(P, n, expect_name(P));
        }
    }
    if (peek(P)->kind == TOK_BLOCK_END && !n->op && n->n_names == 1) {
        next(P);
        n->kind = NODE_SETBLOCK;
        tpl_str which;
        n->items = parse_until(P, END_SET, &which);
        expect_block_end(P);
        return n;
    }
    expect_op(P, "=");
    tpl_node *value = parse_expression(P);
    if (is_op(peek(P), ",")) { /* set a, b = x, y */
        tpl_node *t = new_node(P, NODE_TUPLE, value->pos);
        push(P, &t->items, value);
        while (is_op(peek(P), ",")) {
            next(P);
            push(P, &t->items, parse_expression(P));
        }
        value = t;
    }
    n->b = value;
    expect_block_end(P);
    return n;
}

static bool refers_to(const tpl_node *n, const char *name);

static bool any_refers_to(const tpl_nodes *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (refers_to(l->v[i], name)) return true;
    return false;
}

static bool refers_to(const tpl_node *n, const char *name) {
    if (!n) return false;
    if (n->kind == NODE_NAME && str_is(n->name, name)) return true;
    return refers_to(n->a, name) || refers_to(n->b, name) || refers_to(n->c, name) || refers_to(n->d, name) ||
           any_refers_to(&n->items, name) || any_refers_to(&n->items2, name);
}

static void note_macro_uses(tpl_node *m) {
    m->op = (any_refers_to(&m->items, "caller") ? MACRO_USES_CALLER : 0) |
            (any_refers_to(&m->items, "varargs") ? MACRO_USES_VARARGS : 0) |
            (any_refers_to(&m->items, "kwargs") ? MACRO_USES_KWARGS : 0);
}

/* Macro parameters "(a, b=default, ...)" into names and items2 (NULL where there is no default). */
static void parse_params(parser *P, tpl_node *n) {
    expect_op(P, "(");
    while (!is_op(peek(P), ")")) {
        if (n->n_names) expect_op(P, ",");
        push_name(P, n, expect_name(P));
        tpl_node *def = NULL;
        if (is_op(peek(P), "=")) {
            next(P);
            def = parse_expression(P);
        }
        push(P, &n->items2, def);
    }
    next(P);
}

static tpl_node *parse_macro(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_MACRO, pos);
    n->name = expect_name(P);
    parse_params(P, n);
    expect_block_end(P);
    tpl_str which;
    int loops = P->loops; /* a macro body is a function of its own: no loop to break out of */
    P->loops = 0;
    n->items = parse_until(P, END_MACRO, &which);
    P->loops = loops;
    expect_block_end(P);
    note_macro_uses(n);
    return n;
}

/* {% call [(params)] macro(args) %}body{% endcall %}: the body becomes the macro `caller`. */
static tpl_node *parse_call_block(parser *P, long pos) {
    tpl_node *n = new_node(P, NODE_CALLBLOCK, pos);
    tpl_node *caller = new_node(P, NODE_MACRO, pos);
    caller->name = (tpl_str){"caller", 6};
    if (is_op(peek(P), "(")) parse_params(P, caller);
    n->a = parse_expression(P);
    if (n->a->kind != NODE_CALL) tpl_fail(P->c, pos, "expected a call after 'call'");
    expect_block_end(P);
    tpl_str which;
    int loops = P->loops;
    P->loops = 0;
    caller->items = parse_until(P, END_CALL, &which);
    P->loops = loops;
    expect_block_end(P);
    note_macro_uses(caller);
    n->b = caller;
    return n;
}

static tpl_node *parse_statement(parser *P) {
    const tpl_token *t = peek(P);
    long pos = t->pos;
    if (t->kind != TOK_NAME) unexpected(P, "a statement name");
    tpl_str kw = next(P)->text;
    if (str_is(kw, "if")) return parse_if(P, pos);
    if (str_is(kw, "for")) return parse_for(P, pos);
    if (str_is(kw, "set")) return parse_set(P, pos);
    if (str_is(kw, "macro")) return parse_macro(P, pos);
    if (str_is(kw, "call")) return parse_call_block(P, pos);
    if (str_is(kw, "with")) return parse_with(P, pos);
    if (str_is(kw, "filter")) return parse_filter_block(P, pos);
    if (str_is(kw, "break") || str_is(kw, "continue")) {
        if (!P->loops) tpl_fail(P->c, pos, "'%.*s' outside loop", (int)kw.len, kw.p);
        expect_block_end(P);
        return new_node(P, str_is(kw, "break") ? NODE_BREAK : NODE_CONTINUE, pos);
    }
    if (str_is(kw, "generation")) { /* transformers' assistant-mask marker: renders its body */
        expect_block_end(P);
        tpl_node *n = new_node(P, NODE_BODY, pos);
        tpl_str which;
        n->items = parse_until(P, END_GENERATION, &which);
        expect_block_end(P);
        return n;
    }
    tpl_fail(P->c, pos, "unknown tag '%.*s'", (int)kw.len, kw.p);
}

static bool in_list(tpl_str s, const char *const *list) {
    for (; list && *list; list++)
        if (str_is(s, *list)) return true;
    return false;
}

/* Parses statements until a block tag named in ends (consumed up to its name, reported in which) or, when ends is
 * NULL, until the end of the template. */
static tpl_nodes parse_until(parser *P, const char *const *ends, tpl_str *which) {
    enter(P);
    tpl_nodes body = {0};
    for (;;) {
        const tpl_token *t = peek(P);
        if (t->kind == TOK_EOF) {
            if (ends) {
                char want[128] = "";
                for (const char *const *e = ends; *e; e++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", e == ends ? "" : " or ", *e);
                tpl_fail(P->c, t->pos, "unexpected end of template: expected %s", want);
            }
            break;
        }
        if (t->kind == TOK_TEXT) {
            tpl_node *n = new_node(P, NODE_TEXT, t->pos);
            n->value = tpl_strv(t->text);
            push(P, &body, n);
            next(P);
        } else if (t->kind == TOK_VAR_BEGIN) {
            next(P);
            tpl_node *n = new_node(P, NODE_OUTPUT, t->pos);
            n->a = parse_expression(P);
            if (peek(P)->kind != TOK_VAR_END) unexpected(P, "end of print statement '}}'");
            next(P);
            push(P, &body, n);
        } else if (t->kind == TOK_BLOCK_BEGIN) {
            next(P);
            if (peek(P)->kind == TOK_NAME && in_list(peek(P)->text, ends)) {
                *which = next(P)->text;
                break;
            }
            push(P, &body, parse_statement(P));
        } else {
            unexpected(P, "template data or a tag");
        }
    }
    P->depth--;
    return body;
}

tpl_nodes tpl_parse(tpl_ctx *c, const char *src, size_t len) {
    parser P = {.c = c};
    tpl_lex(c, src, len, &P.toks);
    return parse_until(&P, NULL, NULL);
}
