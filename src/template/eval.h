/* The evaluator's state and the pieces the built-ins (filters, tests, methods, global functions) share with it. */
#ifndef KILN_TEMPLATE_EVAL_H
#define KILN_TEMPLATE_EVAL_H

#include "template/ast.h"

typedef struct tpl_scope tpl_scope;

typedef struct tpl_state {
    tpl_ctx *c;
    tpl_scope *globals; /* the template's top level: context variables and top-level sets */
    tpl_scope *scope;   /* innermost: a loop iteration or a macro call */
    tpl_sb *out;
    int depth;          /* macro call nesting */
    int eval_depth;     /* expression nesting */
    uint64_t steps;     /* loop iterations so far, bounded so a bad template cannot spin forever */
    int64_t now;        /* strftime_now's clock */
} tpl_state;

/* Call arguments, evaluated. */
typedef struct tpl_args {
    size_t n;
    tpl_value *v;
    size_t n_kw;
    const tpl_str *kw_names;
    tpl_value *kw;
    long pos; /* where the call is, for errors */
} tpl_args;

typedef tpl_value (*tpl_native)(tpl_state *S, tpl_value self, const tpl_args *a);

struct tpl_func {
    const char *name;
    tpl_native native;     /* built-in function or bound method (self is the receiver) ... */
    tpl_value self;
    const tpl_node *macro; /* ... or a template macro */
};

tpl_scope *tpl_scope_new(tpl_state *S, tpl_scope *parent);
void tpl_scope_set(tpl_state *S, tpl_scope *s, tpl_str name, tpl_value v);

/* Renders a statement list into S->out. */
void tpl_exec(tpl_state *S, const tpl_nodes *body);

tpl_value tpl_call(tpl_state *S, tpl_value fn, const tpl_args *a);
tpl_value tpl_native_func(tpl_state *S, const char *name, tpl_native fn, tpl_value self);
/* obj.name as Jinja resolves it: a method or attribute first, then the item; Undefined when neither exists. */
tpl_value tpl_getattr(tpl_state *S, long pos, tpl_value obj, tpl_str name);
/* obj[key] as Jinja resolves it: the item first, then an attribute of that name; Undefined when neither exists. */
tpl_value tpl_getitem(tpl_state *S, long pos, tpl_value obj, tpl_value key);
/* The items a for loop visits: list/tuple items, dict keys, string characters; Undefined gives none. */
tpl_list *tpl_iter(tpl_state *S, long pos, tpl_value v);

/* Built-ins (builtins.c). */
tpl_value tpl_filter(tpl_state *S, tpl_str name, tpl_value v, const tpl_args *a);
bool tpl_test(tpl_state *S, tpl_str name, tpl_value v, const tpl_args *a);
tpl_value tpl_method(tpl_state *S, tpl_value obj, tpl_str name); /* bound method, or Undefined */
tpl_value tpl_builtin_global(tpl_state *S, tpl_str name);        /* range, namespace, ..., or Undefined */

/* Argument helpers: the i-th positional or the keyword `name`, else def. */
tpl_value tpl_arg(const tpl_args *a, size_t i, const char *name, tpl_value def);
tpl_str tpl_to_str(tpl_state *S, tpl_value v); /* Python str() */

/* String operations shared by methods and filters (methods.c). */
tpl_str tpl_str_strip(tpl_str s, const tpl_str *chars, bool left, bool right); /* chars NULL: whitespace */
tpl_str tpl_str_case(tpl_state *S, tpl_str s, int mode); /* 'u'pper 'l'ower 'c'apitalize 't'itle 's'wapcase */
tpl_str tpl_str_replace(tpl_state *S, tpl_str s, tpl_str old, tpl_str rep, int64_t count); /* count < 0: all */
tpl_list *tpl_str_splitlines(tpl_state *S, tpl_str s);
/* Appends the code point cp, found at bytes [at, end) of s, mapped as Python does: 'u'pper, 'l'ower, 't'itle
 * (casing.c). */
void tpl_case_put(tpl_sb *b, tpl_str s, size_t at, size_t end, uint32_t cp, int how);
tpl_value tpl_dict_items(tpl_state *S, tpl_dict *d); /* list of (key, value) tuples */
/* Python's fmt % args for %s %r %d %i %f %%; mapping: the right operand was a mapping-like object, which Python
 * forgives for having unused arguments (filters.c). */
tpl_str tpl_percent_format(tpl_state *S, long pos, tpl_str fmt, const tpl_value *args, size_t n, bool mapping);
bool tpl_str_eq(tpl_str s, const char *lit);

#endif
