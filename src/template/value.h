/* Template values (Python's None, bool, int, float, str, list, tuple, dict and callables, plus Jinja's Undefined),
 * the arena they live in, and the Python spellings of them (str, repr, json.dumps).
 *
 * Everything a parse or a render allocates comes from one arena that is freed whole at the end, so values need no
 * ownership rules. Errors unwind with longjmp to the entry point that owns the arena (tpl_fail), which keeps the
 * interpreter free of error plumbing on every call. */
#ifndef KILN_TEMPLATE_VALUE_H
#define KILN_TEMPLATE_VALUE_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tpl_chunk tpl_chunk;

/* Arena plus the error exit of the running parse or render. */
typedef struct tpl_ctx {
    tpl_chunk *chunks;
    size_t used, limit; /* bytes allocated so far, and the most a template may use */
    jmp_buf *on_error;
    kiln_error *err;
    const char *source; /* template source, to turn byte offsets into line and column */
} tpl_ctx;

void tpl_ctx_init(tpl_ctx *c, const char *source, kiln_error *err, jmp_buf *on_error);
void tpl_ctx_free(tpl_ctx *c);
void *tpl_alloc(tpl_ctx *c, size_t n); /* zeroed; unwinds on exhaustion */
/* Reports "template line L, column C: <message>" (pos < 0: no position) and unwinds. */
_Noreturn void tpl_fail(tpl_ctx *c, long pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

typedef struct tpl_str {
    const char *p;
    size_t len;
} tpl_str;

typedef enum tpl_type {
    TPL_UNDEF, /* Jinja's Undefined: prints empty, is falsy, iterates as empty, fails on most operations */
    TPL_NONE,
    TPL_BOOL,
    TPL_INT,
    TPL_FLOAT,
    TPL_STR,
    TPL_LIST, /* also tuples (is_tuple) */
    TPL_DICT, /* also namespaces (is_namespace), the only mutable values */
    TPL_FUNC,
} tpl_type;

typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
typedef struct tpl_func tpl_func;

typedef struct tpl_value {
    tpl_type type;
    union {
        bool b;
        int64_t i;
        double f;
        tpl_str s;     /* TPL_STR; TPL_UNDEF: why it is undefined, for error messages */
        tpl_list *l;
        tpl_dict *d;
        tpl_func *fn;
    };
} tpl_value;

/* What Python type a list stands for where it is not a plain list: Jinja's lazy filters (select, map, ...) return
 * generators, which are always true, have no len() and cannot be indexed; dict methods return views. */
typedef enum tpl_view { TPL_PLAIN, TPL_GENERATOR, TPL_DICT_ITEMS, TPL_DICT_KEYS, TPL_DICT_VALUES } tpl_view;

struct tpl_list {
    size_t n, cap;
    tpl_value *v;
    bool is_tuple;
    tpl_view view;
};

struct tpl_dict {
    size_t n, cap;
    tpl_value *keys, *vals; /* insertion order, as Python dicts keep it; lookups are linear (dicts here are small) */
    bool is_namespace;
};

/* Sized UTF-8 string builder in the arena. */
typedef struct tpl_sb {
    tpl_ctx *c;
    char *p;
    size_t len, cap;
} tpl_sb;

void tpl_sb_init(tpl_sb *b, tpl_ctx *c);
void tpl_sb_put(tpl_sb *b, const char *s, size_t n);
void tpl_sb_puts(tpl_sb *b, const char *s);
void tpl_sb_putc(tpl_sb *b, char ch);
void tpl_sb_printf(tpl_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tpl_str tpl_sb_str(const tpl_sb *b);

static inline tpl_value tpl_none(void) { return (tpl_value){.type = TPL_NONE}; }
static inline tpl_value tpl_bool(bool b) { return (tpl_value){.type = TPL_BOOL, .b = b}; }
static inline tpl_value tpl_int(int64_t i) { return (tpl_value){.type = TPL_INT, .i = i}; }
static inline tpl_value tpl_float(double f) { return (tpl_value){.type = TPL_FLOAT, .f = f}; }
static inline tpl_value tpl_strv(tpl_str s) { return (tpl_value){.type = TPL_STR, .s = s}; }
/* Fails with the reason an Undefined carries ("'x' is undefined"). */
_Noreturn void tpl_fail_undefined(tpl_ctx *c, long pos, tpl_value u);
tpl_value tpl_undef(tpl_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tpl_value tpl_cstr(tpl_ctx *c, const char *s, size_t n); /* copies */
tpl_value tpl_list_new(tpl_ctx *c, size_t cap);
void tpl_list_push(tpl_ctx *c, tpl_list *l, tpl_value v);
tpl_value tpl_dict_new(tpl_ctx *c);
tpl_value *tpl_dict_find(const tpl_dict *d, tpl_value key); /* NULL if absent */
tpl_value *tpl_dict_find_str(const tpl_dict *d, const char *key, size_t len);
void tpl_dict_set(tpl_ctx *c, tpl_dict *d, tpl_value key, tpl_value v);

const char *tpl_type_name(tpl_value v); /* Python's type name: 'str', 'dict', 'NoneType', ... */
bool tpl_truthy(tpl_value v);
bool tpl_is_number(tpl_value v); /* int, float or bool, as Python arithmetic treats them */
double tpl_as_double(tpl_value v);
bool tpl_equal(tpl_value a, tpl_value b);     /* Python ==, deep */
int tpl_compare(tpl_ctx *c, long pos, tpl_value a, tpl_value b); /* Python <, for numbers, strings, lists */

void tpl_write_str(tpl_sb *b, tpl_value v);  /* Python str(); Undefined prints nothing */
void tpl_write_repr(tpl_sb *b, tpl_value v); /* Python repr() */
void tpl_write_float(tpl_sb *b, double f);   /* Python repr() of a float: shortest round-trip digits */

typedef struct tpl_json_opts {
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
    bool ensure_ascii, sort_keys;
} tpl_json_opts;
/* json.dumps(v, **opts); returns false on a value JSON cannot hold (Undefined, a callable). */
bool tpl_write_json(tpl_sb *b, tpl_value v, const tpl_json_opts *o);

/* UTF-8 helpers; strings are indexed by code point as Python does. */
size_t tpl_utf8_decode(const char *s, size_t n, uint32_t *cp); /* bytes used (1 for an invalid byte) */
void tpl_utf8_put(tpl_sb *b, uint32_t cp);
size_t tpl_utf8_count(tpl_str s);
bool tpl_py_isspace(uint32_t cp); /* Python str.isspace() for one code point */

#endif
