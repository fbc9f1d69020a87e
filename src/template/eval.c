/* Tree-walking evaluator with Python's value semantics and Jinja2's scoping: a for loop body gets a fresh scope
 * each iteration (sets inside it never leak out), macros see the top level, namespaces are the one way to carry
 * state out of a loop. */
#include <math.h>
#include <string.h>

#include "template/eval.h"

enum { MAX_CALL_DEPTH = 100, MAX_EVAL_DEPTH = 1000 };
static const uint64_t MAX_STEPS = 10000000;
static const size_t MAX_REPEAT = (size_t)64 << 20; /* bytes or items a '*' may produce */

typedef enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

struct tpl_scope {
    tpl_scope *parent;
    size_t n, cap;
    tpl_str *names;
    tpl_value *vals;
};

bool tpl_str_eq(tpl_str s, const char *lit) { return s.len == strlen(lit) && !memcmp(s.p, lit, s.len); }

tpl_scope *tpl_scope_new(tpl_state *S, tpl_scope *parent) {
    tpl_scope *s = tpl_alloc(S->c, sizeof *s);
    s->parent = parent;
    return s;
}

static tpl_value *scope_find(tpl_scope *s, tpl_str name) {
    for (size_t i = 0; i < s->n; i++)
        if (s->names[i].len == name.len && !memcmp(s->names[i].p, name.p, name.len)) return &s->vals[i];
    return NULL;
}

void tpl_scope_set(tpl_state *S, tpl_scope *s, tpl_str name, tpl_value v) {
    tpl_value *slot = scope_find(s, name);
    if (slot) {
        *slot = v;
        return;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        tpl_str *nn = tpl_alloc(S->c, cap * sizeof *nn);
        tpl_value *nv = tpl_alloc(S->c, cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static tpl_value lookup(tpl_state *S, tpl_str name) {
    for (tpl_scope *s = S->scope; s; s = s->parent) {
        tpl_value *v = scope_find(s, name);
        if (v) return *v;
    }
    tpl_value g = tpl_builtin_global(S, name);
    if (g.type != TPL_UNDEF) return g;
    return tpl_undef(S->c, "'%.*s' is undefined", (int)name.len, name.p);
}

tpl_value tpl_native_func(tpl_state *S, const char *name, tpl_native fn, tpl_value self) {
    tpl_func *f = tpl_alloc(S->c, sizeof *f);
    f->name = name;
    f->native = fn;
    f->self = self;
    return (tpl_value){.type = TPL_FUNC, .fn = f};
}

tpl_str tpl_to_str(tpl_state *S, tpl_value v) {
    if (v.type == TPL_STR) return v.s;
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    tpl_write_str(&b, v);
    return tpl_sb_str(&b);
}

/* ---- attribute, item, iteration ---- */

/* Python index into n items (negative counts from the end); -1 when out of range. */
static long norm_index(int64_t i, size_t n) {
    if (i < 0) i += (int64_t)n;
    return i < 0 || (uint64_t)i >= n ? -1 : (long)i;
}

/* Byte offset of code point k in s (k <= count). */
static size_t cp_offset(tpl_str s, size_t k) {
    size_t i = 0;
    for (; i < s.len && k; k--) {
        i++;
        while (i < s.len && ((unsigned char)s.p[i] & 0xC0) == 0x80) i++;
    }
    return i;
}

tpl_value tpl_getitem(tpl_state *S, long pos, tpl_value obj, tpl_value key) {
    if (obj.type == TPL_UNDEF) tpl_fail_undefined(S->c, pos, obj);
    bool int_key = key.type == TPL_INT || key.type == TPL_BOOL;
    int64_t k = key.type == TPL_BOOL ? key.b : key.i;
    if (obj.type == TPL_DICT) {
        tpl_value *v = tpl_dict_find(obj.d, key);
        if (v) return *v;
    } else if (obj.type == TPL_LIST && !obj.l->view && int_key) {
        long i = norm_index(k, obj.l->n);
        if (i >= 0) return obj.l->v[i];
    } else if (obj.type == TPL_STR && int_key) {
        long i = norm_index(k, tpl_utf8_count(obj.s));
        if (i >= 0) {
            size_t a = cp_offset(obj.s, (size_t)i), b = cp_offset(obj.s, (size_t)i + 1);
            return tpl_strv((tpl_str){obj.s.p + a, b - a});
        }
    }
    if (key.type == TPL_STR) {
        tpl_value m = tpl_method(S, obj, key.s);
        if (m.type != TPL_UNDEF) return m;
    }
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    tpl_write_repr(&b, key);
    return tpl_undef(S->c, "'%s object' has no attribute %s", tpl_type_name(obj), b.p);
}

tpl_value tpl_getattr(tpl_state *S, long pos, tpl_value obj, tpl_str name) {
    if (obj.type == TPL_UNDEF) tpl_fail_undefined(S->c, pos, obj);
    if (obj.type == TPL_DICT && obj.d->is_namespace) {
        tpl_value *v = tpl_dict_find_str(obj.d, name.p, name.len);
        if (v) return *v;
    } else {
        tpl_value m = tpl_method(S, obj, name);
        if (m.type != TPL_UNDEF) return m;
        if (obj.type == TPL_DICT) {
            tpl_value *v = tpl_dict_find_str(obj.d, name.p, name.len);
            if (v) return *v;
        }
    }
    return tpl_undef(S->c, "'%s object' has no attribute '%.*s'", tpl_type_name(obj), (int)name.len, name.p);
}

tpl_list *tpl_iter(tpl_state *S, long pos, tpl_value v) {
    tpl_value out;
    switch (v.type) {
    case TPL_UNDEF: return tpl_list_new(S->c, 0).l;
    case TPL_LIST: return v.l;
    case TPL_DICT:
        if (v.d->is_namespace) break;
        out = tpl_list_new(S->c, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) tpl_list_push(S->c, out.l, v.d->keys[i]);
        return out.l;
    case TPL_STR:
        out = tpl_list_new(S->c, v.s.len);
        for (size_t i = 0; i < v.s.len;) {
            uint32_t cp;
            size_t k = tpl_utf8_decode(v.s.p + i, v.s.len - i, &cp);
            tpl_list_push(S->c, out.l, tpl_strv((tpl_str){v.s.p + i, k}));
            i += k;
        }
        return out.l;
    default: break;
    }
    tpl_fail(S->c, pos, "'%s' object is not iterable", tpl_type_name(v));
}

/* ---- operators ---- */

_Noreturn static void bad_operands(tpl_state *S, long pos, const char *op, tpl_value a, tpl_value b) {
    if (a.type == TPL_UNDEF) tpl_fail_undefined(S->c, pos, a);
    if (b.type == TPL_UNDEF) tpl_fail_undefined(S->c, pos, b);
    tpl_fail(S->c, pos, "unsupported operand type(s) for %s: '%s' and '%s'", op, tpl_type_name(a), tpl_type_name(b));
}

static int64_t as_int(tpl_value v) { return v.type == TPL_BOOL ? v.b : v.i; }
static bool both_ints(tpl_value a, tpl_value b) {
    return (a.type == TPL_INT || a.type == TPL_BOOL) && (b.type == TPL_INT || b.type == TPL_BOOL);
}

static tpl_value repeat(tpl_state *S, long pos, tpl_value seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.type == TPL_STR) {
        if (seq.s.len && (uint64_t)times > MAX_REPEAT / seq.s.len) tpl_fail(S->c, pos, "string repetition too large");
        tpl_sb b;
        tpl_sb_init(&b, S->c);
        for (int64_t i = 0; i < times; i++) tpl_sb_put(&b, seq.s.p, seq.s.len);
        return tpl_strv(tpl_sb_str(&b));
    }
    if (seq.l->n && (uint64_t)times > MAX_REPEAT / seq.l->n / sizeof(tpl_value)) tpl_fail(S->c, pos, "list repetition too large");
    tpl_value out = tpl_list_new(S->c, seq.l->n * (size_t)times);
    out.l->is_tuple = seq.l->is_tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < seq.l->n; j++) tpl_list_push(S->c, out.l, seq.l->v[j]);
    return out;
}

static tpl_value concat(tpl_state *S, tpl_value a, tpl_value b) {
    if (a.type == TPL_STR) {
        tpl_sb sb;
        tpl_sb_init(&sb, S->c);
        tpl_sb_put(&sb, a.s.p, a.s.len);
        tpl_sb_put(&sb, b.s.p, b.s.len);
        return tpl_strv(tpl_sb_str(&sb));
    }
    tpl_value out = tpl_list_new(S->c, a.l->n + b.l->n);
    out.l->is_tuple = a.l->is_tuple;
    for (size_t i = 0; i < a.l->n; i++) tpl_list_push(S->c, out.l, a.l->v[i]);
    for (size_t i = 0; i < b.l->n; i++) tpl_list_push(S->c, out.l, b.l->v[i]);
    return out;
}

static tpl_value arith(tpl_state *S, long pos, int op, tpl_value a, tpl_value b) {
    static const char *const names[128] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/", ['f'] = "//",
                                           ['%'] = "%", ['p'] = "** or pow()"};
    if (tpl_is_number(a) && tpl_is_number(b)) {
        bool ints = both_ints(a, b);
        int64_t x = as_int(a), y = as_int(b), r;
        double fx = tpl_as_double(a), fy = tpl_as_double(b);
        switch (op) {
        case '+':
            if (!ints) return tpl_float(fx + fy);
            if (__builtin_add_overflow(x, y, &r)) tpl_fail(S->c, pos, "integer overflow");
            return tpl_int(r);
        case '-':
            if (!ints) return tpl_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) tpl_fail(S->c, pos, "integer overflow");
            return tpl_int(r);
        case '*':
            if (!ints) return tpl_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) tpl_fail(S->c, pos, "integer overflow");
            return tpl_int(r);
        case '/':
            if (fy == 0.0) tpl_fail(S->c, pos, "division by zero");
            return tpl_float(fx / fy);
        case 'f':
        case '%':
            if (ints ? y == 0 : fy == 0.0) tpl_fail(S->c, pos, "integer division or modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) tpl_fail(S->c, pos, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return tpl_int(op == 'f' ? q : m);
            }
            if (op == 'f') return tpl_float(floor(fx / fy));
            double m = fmod(fx, fy);
            if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
            return tpl_float(m);
        case 'p':
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < y; i++)
                    if (__builtin_mul_overflow(acc, x, &acc)) tpl_fail(S->c, pos, "integer overflow");
                return tpl_int(acc);
            }
            return tpl_float(pow(fx, fy));
        }
    }
    if (op == '%' && a.type == TPL_STR) { /* printf-style formatting */
        bool tuple = b.type == TPL_LIST && b.l->is_tuple;
        bool mapping = !tuple && (b.type == TPL_LIST || b.type == TPL_DICT || b.type == TPL_UNDEF);
        return tpl_strv(tpl_percent_format(S, pos, a.s, tuple ? b.l->v : &b, tuple ? b.l->n : 1, mapping));
    }
    bool a_seq = a.type == TPL_STR || (a.type == TPL_LIST && !a.l->view);
    bool b_seq = b.type == TPL_STR || (b.type == TPL_LIST && !b.l->view);
    if (op == '+' && a_seq && b_seq && a.type == b.type && (a.type == TPL_STR || a.l->is_tuple == b.l->is_tuple))
        return concat(S, a, b);
    if (op == '*' && a_seq && both_ints(b, b)) return repeat(S, pos, a, as_int(b));
    if (op == '*' && b_seq && both_ints(a, a)) return repeat(S, pos, b, as_int(a));
    bad_operands(S, pos, names[op], a, b);
}

static void need_hashable(tpl_state *S, long pos, tpl_value key) {
    if ((key.type == TPL_LIST && !key.l->is_tuple) || key.type == TPL_DICT)
        tpl_fail(S->c, pos, "unhashable type: '%s'", tpl_type_name(key));
}

static bool contains(tpl_state *S, long pos, tpl_value item, tpl_value seq) {
    switch (seq.type) {
    case TPL_UNDEF: return false;
    case TPL_STR:
        if (item.type != TPL_STR) tpl_fail(S->c, pos, "'in <string>' requires string as left operand, not %s", tpl_type_name(item));
        if (!item.s.len) return true;
        for (size_t i = 0; i + item.s.len <= seq.s.len; i++)
            if (!memcmp(seq.s.p + i, item.s.p, item.s.len)) return true;
        return false;
    case TPL_LIST:
        for (size_t i = 0; i < seq.l->n; i++)
            if (tpl_equal(seq.l->v[i], item)) return true;
        return false;
    case TPL_DICT:
        if (seq.d->is_namespace) break;
        need_hashable(S, pos, item);
        return tpl_dict_find(seq.d, item) != NULL;
    default: break;
    }
    tpl_fail(S->c, pos, "argument of type '%s' is not iterable", tpl_type_name(seq));
}

static tpl_value eval(tpl_state *S, const tpl_node *n);

static tpl_value eval_binary(tpl_state *S, const tpl_node *n) {
    tpl_value a = eval(S, n->a);
    if (n->op == 'a') return tpl_truthy(a) ? eval(S, n->b) : a;
    if (n->op == 'o') return tpl_truthy(a) ? a : eval(S, n->b);
    tpl_value b = eval(S, n->b);
    switch (n->op) {
    case '=': return tpl_bool(tpl_equal(a, b));
    case '!': return tpl_bool(!tpl_equal(a, b));
    case '<': return tpl_bool(tpl_compare(S->c, n->pos, a, b) < 0);
    case 'l': return tpl_bool(tpl_compare(S->c, n->pos, a, b) <= 0);
    case '>': return tpl_bool(tpl_compare(S->c, n->pos, a, b) > 0);
    case 'g': return tpl_bool(tpl_compare(S->c, n->pos, a, b) >= 0);
    case 'i': return tpl_bool(contains(S, n->pos, a, b));
    case 'I': return tpl_bool(!contains(S, n->pos, a, b));
    case '~': {
        tpl_sb sb;
        tpl_sb_init(&sb, S->c);
        tpl_write_str(&sb, a);
        tpl_write_str(&sb, b);
        return tpl_strv(tpl_sb_str(&sb));
    }
    default: return arith(S, n->pos, n->op, a, b);
    }
}

static tpl_value eval_unary(tpl_state *S, const tpl_node *n) {
    tpl_value a = eval(S, n->a);
    if (n->op == 'n') return tpl_bool(!tpl_truthy(a));
    if (a.type == TPL_UNDEF) tpl_fail_undefined(S->c, n->pos, a);
    if (!tpl_is_number(a)) tpl_fail(S->c, n->pos, "bad operand type for unary %c: '%s'", n->op, tpl_type_name(a));
    if (n->op == '+') return a.type == TPL_BOOL ? tpl_int(a.b) : a;
    if (a.type == TPL_FLOAT) return tpl_float(-a.f);
    if (as_int(a) == INT64_MIN) tpl_fail(S->c, n->pos, "integer overflow");
    return tpl_int(-as_int(a));
}

/* Python slice bounds for n items. */
static void slice_bounds(tpl_state *S, const tpl_node *n, size_t len, int64_t *start, int64_t *stop, int64_t *step) {
    int64_t parts[3];
    bool given[3];
    const tpl_node *nodes[3] = {n->b, n->c, n->d};
    for (int i = 0; i < 3; i++) {
        tpl_value v = nodes[i] ? eval(S, nodes[i]) : tpl_none();
        given[i] = v.type != TPL_NONE;
        if (given[i] && v.type != TPL_INT && v.type != TPL_BOOL)
            tpl_fail(S->c, n->pos, "slice indices must be integers or None, not %s", tpl_type_name(v));
        parts[i] = given[i] ? as_int(v) : 0;
    }
    *step = given[2] ? parts[2] : 1;
    if (*step == 0) tpl_fail(S->c, n->pos, "slice step cannot be zero");
    int64_t L = (int64_t)len;
    for (int i = 0; i < 2; i++) {
        int64_t *out = i ? stop : start;
        if (!given[i]) {
            *out = *step > 0 ? (i ? L : 0) : (i ? -1 : L - 1);
            continue;
        }
        int64_t v = parts[i];
        if (v < 0) v += L;
        if (*step > 0) v = v < 0 ? 0 : v > L ? L : v;
        else v = v < -1 ? -1 : v > L - 1 ? L - 1 : v;
        *out = v;
    }
}

static tpl_value eval_slice(tpl_state *S, const tpl_node *n) {
    tpl_value obj = eval(S, n->a);
    if (obj.type == TPL_UNDEF) tpl_fail_undefined(S->c, n->pos, obj);
    if ((obj.type != TPL_LIST || obj.l->view) && obj.type != TPL_STR) /* Jinja slices bypass its lenient getitem */
        tpl_fail(S->c, n->pos, "'%s' object is not subscriptable", tpl_type_name(obj));
    tpl_list *items = obj.type == TPL_LIST ? obj.l : tpl_iter(S, n->pos, obj);
    int64_t start, stop, step;
    slice_bounds(S, n, items->n, &start, &stop, &step);
    tpl_value out = tpl_list_new(S->c, 0);
    out.l->is_tuple = obj.type == TPL_LIST && obj.l->is_tuple;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) tpl_list_push(S->c, out.l, items->v[i]);
    if (obj.type == TPL_LIST) return out;
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < out.l->n; i++) tpl_sb_put(&b, out.l->v[i].s.p, out.l->v[i].s.len);
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_args eval_args(tpl_state *S, const tpl_node *n, size_t extra_kw) {
    tpl_args a = {.n = n->items.n, .n_kw = n->n_names, .kw_names = n->names, .pos = n->pos};
    a.v = tpl_alloc(S->c, (a.n + 1) * sizeof *a.v);
    for (size_t i = 0; i < a.n; i++) a.v[i] = eval(S, n->items.v[i]);
    a.kw = tpl_alloc(S->c, (a.n_kw + extra_kw + 1) * sizeof *a.kw);
    for (size_t i = 0; i < a.n_kw; i++) a.kw[i] = eval(S, n->items2.v[i]);
    return a;
}

static tpl_value eval_call(tpl_state *S, const tpl_node *n, tpl_value caller) {
    tpl_value fn = eval(S, n->a);
    if (fn.type == TPL_UNDEF) tpl_fail_undefined(S->c, n->pos, fn);
    tpl_args a = eval_args(S, n, caller.type == TPL_FUNC);
    if (caller.type == TPL_FUNC) { /* {% call %}: the body goes in as keyword argument `caller` */
        tpl_str *names = tpl_alloc(S->c, (a.n_kw + 1) * sizeof *names);
        if (a.n_kw) memcpy(names, a.kw_names, a.n_kw * sizeof *names);
        names[a.n_kw] = (tpl_str){"caller", 6};
        a.kw[a.n_kw++] = caller;
        a.kw_names = names;
    }
    return tpl_call(S, fn, &a);
}

static tpl_value eval_node(tpl_state *S, const tpl_node *n) {
    tpl_value v;
    switch (n->kind) {
    case NODE_CONST: return n->value;
    case NODE_NAME: return lookup(S, n->name);
    case NODE_LIST:
    case NODE_TUPLE:
        v = tpl_list_new(S->c, n->items.n);
        v.l->is_tuple = n->kind == NODE_TUPLE;
        for (size_t i = 0; i < n->items.n; i++) tpl_list_push(S->c, v.l, eval(S, n->items.v[i]));
        return v;
    case NODE_DICT:
        v = tpl_dict_new(S->c);
        for (size_t i = 0; i < n->items.n; i++) {
            tpl_value key = eval(S, n->items.v[i]);
            need_hashable(S, n->items.v[i]->pos, key);
            tpl_dict_set(S->c, v.d, key, eval(S, n->items2.v[i]));
        }
        return v;
    case NODE_GETATTR: return tpl_getattr(S, n->pos, eval(S, n->a), n->name);
    case NODE_GETITEM: {
        tpl_value obj = eval(S, n->a);
        return tpl_getitem(S, n->pos, obj, eval(S, n->b));
    }
    case NODE_SLICE: return eval_slice(S, n);
    case NODE_CALL: return eval_call(S, n, tpl_none());
    case NODE_FILTER: {
        tpl_value x = eval(S, n->a);
        tpl_args a = eval_args(S, n, 0);
        return tpl_filter(S, n->name, x, &a);
    }
    case NODE_TEST: {
        tpl_value x = eval(S, n->a);
        tpl_args a = eval_args(S, n, 0);
        return tpl_bool(tpl_test(S, n->name, x, &a));
    }
    case NODE_UNARY: return eval_unary(S, n);
    case NODE_BINARY: return eval_binary(S, n);
    case NODE_COND:
        if (tpl_truthy(eval(S, n->a))) return eval(S, n->b);
        return n->c ? eval(S, n->c) : tpl_undef(S->c, "the inline if-expression evaluated to false and no else section was defined");
    default: tpl_fail(S->c, n->pos, "statement used as an expression");
    }
}

/* Long operator or attribute chains nest as deep as they are long; bound them so the stack is safe. */
static tpl_value eval(tpl_state *S, const tpl_node *n) {
    if (++S->eval_depth > MAX_EVAL_DEPTH) tpl_fail(S->c, n->pos, "expression nested too deep");
    tpl_value v = eval_node(S, n);
    S->eval_depth--;
    return v;
}

/* ---- statements ---- */

static flow exec_body(tpl_state *S, const tpl_nodes *body);

static void assign(tpl_state *S, long pos, const tpl_str *names, size_t n_names, tpl_value v) {
    if (n_names == 1) return tpl_scope_set(S, S->scope, names[0], v);
    tpl_list *items = tpl_iter(S, pos, v);
    if (items->n != n_names)
        tpl_fail(S->c, pos, "cannot unpack %zu values into %zu names", items->n, n_names);
    for (size_t i = 0; i < n_names; i++) tpl_scope_set(S, S->scope, names[i], items->v[i]);
}

static tpl_value loop_cycle(tpl_state *S, tpl_value self, const tpl_args *a) {
    if (!a->n) tpl_fail(S->c, a->pos, "no items for cycling given");
    return a->v[self.i % (int64_t)a->n];
}

static tpl_value make_loop(tpl_state *S, tpl_list *items, size_t i) {
    tpl_value loop = tpl_dict_new(S->c);
    size_t n = items->n;
    struct { const char *k; tpl_value v; } fields[] = {
        {"index", tpl_int((int64_t)i + 1)},     {"index0", tpl_int((int64_t)i)},
        {"revindex", tpl_int((int64_t)(n - i))}, {"revindex0", tpl_int((int64_t)(n - i - 1))},
        {"first", tpl_bool(i == 0)},            {"last", tpl_bool(i + 1 == n)},
        {"length", tpl_int((int64_t)n)},        {"depth", tpl_int(1)},
        {"depth0", tpl_int(0)},
        {"previtem", i > 0 ? items->v[i - 1] : tpl_undef(S->c, "there is no previous item")},
        {"nextitem", i + 1 < n ? items->v[i + 1] : tpl_undef(S->c, "there is no next item")},
        {"cycle", tpl_native_func(S, "loop.cycle", loop_cycle, tpl_int((int64_t)i))},
    };
    for (size_t k = 0; k < sizeof fields / sizeof *fields; k++)
        tpl_dict_set(S->c, loop.d, tpl_strv((tpl_str){fields[k].k, strlen(fields[k].k)}), fields[k].v);
    return loop;
}

static void exec_for(tpl_state *S, const tpl_node *n) {
    tpl_list *all = tpl_iter(S, n->pos, eval(S, n->a)), *items = all;
    tpl_scope *outer = S->scope;
    if (n->b) { /* the loop filter sees the loop variables but not `loop` */
        items = tpl_list_new(S->c, all->n).l;
        for (size_t i = 0; i < all->n; i++) {
            S->scope = tpl_scope_new(S, outer);
            assign(S, n->pos, n->names, n->n_names, all->v[i]);
            if (tpl_truthy(eval(S, n->b))) tpl_list_push(S->c, items, all->v[i]);
            S->scope = outer;
        }
    }
    /* Jinja runs the else block unless some iteration reached the end of the body: a loop left by break (or
     * whose every iteration ended in continue) runs it too. */
    bool completed = false;
    for (size_t i = 0; i < items->n; i++) {
        if (++S->steps > MAX_STEPS) tpl_fail(S->c, n->pos, "too many loop iterations");
        S->scope = tpl_scope_new(S, outer);
        assign(S, n->pos, n->names, n->n_names, items->v[i]);
        tpl_scope_set(S, S->scope, (tpl_str){"loop", 4}, make_loop(S, items, i));
        flow f = exec_body(S, &n->items);
        S->scope = outer;
        completed = completed || f == FLOW_NORMAL;
        if (f == FLOW_BREAK) break;
    }
    if (!completed) exec_body(S, &n->items2);
}

static void exec_set(tpl_state *S, const tpl_node *n) {
    tpl_value v = eval(S, n->b);
    if (n->op != '.') return assign(S, n->pos, n->names, n->n_names, v);
    tpl_value ns = lookup(S, n->names[0]);
    if (ns.type != TPL_DICT || !ns.d->is_namespace)
        tpl_fail(S->c, n->pos, "cannot assign attribute on non-namespace object");
    tpl_dict_set(S->c, ns.d, tpl_strv(n->name), v);
}

static tpl_str render_to_string(tpl_state *S, const tpl_nodes *body, flow *f) {
    tpl_sb b, *saved = S->out;
    tpl_sb_init(&b, S->c);
    S->out = &b;
    flow got = exec_body(S, body);
    if (f) *f = got;
    S->out = saved;
    return tpl_sb_str(&b);
}

/* A break or continue inside a block set leaves the loop before the variable is assigned, as in Jinja. */
static flow exec_setblock(tpl_state *S, const tpl_node *n) {
    flow f;
    tpl_str s = render_to_string(S, &n->items, &f);
    if (f == FLOW_NORMAL) tpl_scope_set(S, S->scope, n->names[0], tpl_strv(s));
    return f;
}

static tpl_value make_macro(tpl_state *S, const tpl_node *n) {
    tpl_func *f = tpl_alloc(S->c, sizeof *f);
    char *name = tpl_alloc(S->c, n->name.len + 1);
    memcpy(name, n->name.p, n->name.len);
    f->name = name;
    f->macro = n;
    return (tpl_value){.type = TPL_FUNC, .fn = f};
}

static flow exec_with(tpl_state *S, const tpl_node *n) {
    tpl_scope *outer = S->scope, *inner = tpl_scope_new(S, outer);
    for (size_t i = 0; i < n->n_names; i++) tpl_scope_set(S, inner, n->names[i], eval(S, n->items2.v[i]));
    S->scope = inner;
    flow f = exec_body(S, &n->items);
    S->scope = outer;
    return f;
}

static flow exec_filter_block(tpl_state *S, const tpl_node *n) {
    flow f;
    tpl_value v = tpl_strv(render_to_string(S, &n->items, &f));
    if (f != FLOW_NORMAL) return f; /* a break or continue leaves before the filtered text is written */
    for (size_t i = 0; i < n->items2.n; i++) {
        tpl_args a = eval_args(S, n->items2.v[i], 0);
        v = tpl_filter(S, n->items2.v[i]->name, v, &a);
    }
    tpl_write_str(S->out, v);
    return f;
}

static flow exec_node(tpl_state *S, const tpl_node *n) {
    switch (n->kind) {
    case NODE_TEXT: tpl_sb_put(S->out, n->value.s.p, n->value.s.len); break;
    case NODE_OUTPUT: tpl_write_str(S->out, eval(S, n->a)); break;
    case NODE_IF: return exec_body(S, tpl_truthy(eval(S, n->a)) ? &n->items : &n->items2);
    case NODE_FOR: exec_for(S, n); break;
    case NODE_SET: exec_set(S, n); break;
    case NODE_SETBLOCK: return exec_setblock(S, n);
    case NODE_MACRO: tpl_scope_set(S, S->scope, n->name, make_macro(S, n)); break;
    case NODE_CALLBLOCK: tpl_write_str(S->out, eval_call(S, n->a, make_macro(S, n->b))); break;
    case NODE_BREAK: return FLOW_BREAK;
    case NODE_CONTINUE: return FLOW_CONTINUE;
    case NODE_BODY: return exec_body(S, &n->items);
    case NODE_WITH: return exec_with(S, n);
    case NODE_FILTERBLOCK: return exec_filter_block(S, n);
    default: tpl_write_str(S->out, eval(S, n)); break;
    }
    return FLOW_NORMAL;
}

static flow exec_body(tpl_state *S, const tpl_nodes *body) {
    for (size_t i = 0; i < body->n; i++) {
        flow f = exec_node(S, body->v[i]);
        if (f != FLOW_NORMAL) return f;
    }
    return FLOW_NORMAL;
}

void tpl_exec(tpl_state *S, const tpl_nodes *body) { exec_body(S, body); }

/* ---- calls ---- */

static tpl_value call_macro(tpl_state *S, const tpl_func *f, const tpl_args *a) {
    const tpl_node *m = f->macro;
    if (++S->depth > MAX_CALL_DEPTH) tpl_fail(S->c, a->pos, "macro calls nested too deep");
    tpl_scope *saved = S->scope;
    S->scope = tpl_scope_new(S, S->globals);
    tpl_value varargs = tpl_list_new(S->c, 0), kwargs = tpl_dict_new(S->c);
    varargs.l->is_tuple = true;
    for (size_t i = m->n_names; i < a->n; i++) tpl_list_push(S->c, varargs.l, a->v[i]);
    for (size_t i = 0; i < m->n_names; i++) {
        tpl_value v = i < a->n ? a->v[i] : tpl_undef(S->c, "parameter '%.*s' was not provided", (int)m->names[i].len, m->names[i].p);
        for (size_t k = 0; k < a->n_kw; k++)
            if (a->kw_names[k].len == m->names[i].len && !memcmp(a->kw_names[k].p, m->names[i].p, m->names[i].len)) v = a->kw[k];
        if (v.type == TPL_UNDEF && m->items2.v[i]) v = eval(S, m->items2.v[i]);
        tpl_scope_set(S, S->scope, m->names[i], v);
    }
    if (a->n > m->n_names && !(m->op & MACRO_USES_VARARGS))
        tpl_fail(S->c, a->pos, "macro '%s' takes not more than %zu argument(s)", f->name, m->n_names);
    if (m->op & MACRO_USES_CALLER) tpl_scope_set(S, S->scope, (tpl_str){"caller", 6}, tpl_undef(S->c, "No caller defined"));
    for (size_t k = 0; k < a->n_kw; k++) {
        tpl_str kw = a->kw_names[k];
        bool is_param = false;
        for (size_t i = 0; i < m->n_names; i++) is_param = is_param || (kw.len == m->names[i].len && !memcmp(kw.p, m->names[i].p, kw.len));
        if (is_param) continue;
        if (tpl_str_eq(kw, "caller") && (m->op & MACRO_USES_CALLER)) tpl_scope_set(S, S->scope, kw, a->kw[k]);
        else if (m->op & MACRO_USES_KWARGS) tpl_dict_set(S->c, kwargs.d, tpl_strv(kw), a->kw[k]);
        else tpl_fail(S->c, a->pos, "macro '%s' takes no keyword argument '%.*s'", f->name, (int)kw.len, kw.p);
    }
    tpl_scope_set(S, S->scope, (tpl_str){"varargs", 7}, varargs);
    tpl_scope_set(S, S->scope, (tpl_str){"kwargs", 6}, kwargs);
    tpl_str s = render_to_string(S, &m->items, NULL);
    S->scope = saved;
    S->depth--;
    return tpl_strv(s);
}

tpl_value tpl_call(tpl_state *S, tpl_value fn, const tpl_args *a) {
    if (fn.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, fn);
    if (fn.type != TPL_FUNC) tpl_fail(S->c, a->pos, "'%s' object is not callable", tpl_type_name(fn));
    if (fn.fn->macro) return call_macro(S, fn.fn, a);
    return fn.fn->native(S, fn.fn->self, a);
}
