#include "template/value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>


struct tpl_chunk {
    tpl_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { TPL_CHUNK_MIN = 64 * 1024 };

void tpl_ctx_init(tpl_ctx *c, const char *source, kiln_error *err, jmp_buf *on_error) {
    memset(c, 0, sizeof *c);
    c->source = source;
    c->err = err;
    c->on_error = on_error;
    c->limit = (size_t)256 << 20;
}

void tpl_ctx_free(tpl_ctx *c) {
    for (tpl_chunk *k = c->chunks, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    c->chunks = NULL;
    c->used = 0;
}

void *tpl_alloc(tpl_ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    tpl_chunk *k = c->chunks;
    if (!k || k->size - k->used < n) {
        if (n > c->limit || c->used > c->limit - n) tpl_fail(c, -1, "template needs more than %zu MiB of memory", c->limit >> 20);
        size_t size = n > TPL_CHUNK_MIN ? n : TPL_CHUNK_MIN;
        k = malloc(sizeof *k + size);
        if (!k) tpl_fail(c, -1, "out of memory");
        k->size = size;
        k->used = 0;
        k->next = c->chunks;
        c->chunks = k;
        c->used += size;
    }
    void *p = k->data + k->used;
    k->used += n;
    memset(p, 0, n);
    return p;
}

static void pos_to_line_col(const char *src, long pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (long i = 0; src && i < pos && src[i]; i++) {
        if (src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

_Noreturn void tpl_fail(tpl_ctx *c, long pos, const char *fmt, ...) {
    char msg[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos >= 0) {
        int line, col;
        pos_to_line_col(c->source, pos, &line, &col);
        kiln_fail(c->err, "template line %d, column %d: %s", line, col, msg);
    } else {
        kiln_fail(c->err, "template: %s", msg);
    }
    longjmp(*c->on_error, 1);
}

void tpl_sb_init(tpl_sb *b, tpl_ctx *c) { *b = (tpl_sb){.c = c}; }

void tpl_sb_put(tpl_sb *b, const char *s, size_t n) {
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n + 1) {
            if (cap > SIZE_MAX / 2) tpl_fail(b->c, -1, "string too long");
            cap *= 2;
        }
        char *p = tpl_alloc(b->c, cap);
        if (b->len) memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void tpl_sb_puts(tpl_sb *b, const char *s) { tpl_sb_put(b, s, strlen(s)); }
void tpl_sb_putc(tpl_sb *b, char ch) { tpl_sb_put(b, &ch, 1); }

void tpl_sb_printf(tpl_sb *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) tpl_sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

tpl_str tpl_sb_str(const tpl_sb *b) { return (tpl_str){b->p ? b->p : "", b->len}; }

tpl_value tpl_undef(tpl_ctx *c, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    tpl_value v = tpl_cstr(c, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
    v.type = TPL_UNDEF;
    return v;
}

tpl_value tpl_cstr(tpl_ctx *c, const char *s, size_t n) {
    char *p = tpl_alloc(c, n + 1);
    if (n) memcpy(p, s, n);
    return tpl_strv((tpl_str){p, n});
}

tpl_value tpl_list_new(tpl_ctx *c, size_t cap) {
    tpl_list *l = tpl_alloc(c, sizeof *l);
    if (cap) {
        l->v = tpl_alloc(c, cap * sizeof *l->v);
        l->cap = cap;
    }
    return (tpl_value){.type = TPL_LIST, .l = l};
}

void tpl_list_push(tpl_ctx *c, tpl_list *l, tpl_value v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tpl_value *nv = tpl_alloc(c, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

tpl_value tpl_dict_new(tpl_ctx *c) { return (tpl_value){.type = TPL_DICT, .d = tpl_alloc(c, sizeof(tpl_dict))}; }

tpl_value *tpl_dict_find(const tpl_dict *d, tpl_value key) {
    for (size_t i = 0; i < d->n; i++)
        if (tpl_equal(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

tpl_value *tpl_dict_find_str(const tpl_dict *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == TPL_STR && d->keys[i].s.len == len && !memcmp(d->keys[i].s.p, key, len))
            return &d->vals[i];
    return NULL;
}

void tpl_dict_set(tpl_ctx *c, tpl_dict *d, tpl_value key, tpl_value v) {
    tpl_value *slot = tpl_dict_find(d, key);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        tpl_value *nk = tpl_alloc(c, cap * sizeof *nk), *nv = tpl_alloc(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof *nk);
            memcpy(nv, d->vals, d->n * sizeof *nv);
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = v;
}

const char *tpl_type_name(tpl_value v) {
    switch (v.type) {
    case TPL_UNDEF: return "Undefined";
    case TPL_NONE: return "NoneType";
    case TPL_BOOL: return "bool";
    case TPL_INT: return "int";
    case TPL_FLOAT: return "float";
    case TPL_STR: return "str";
    case TPL_LIST: {
        static const char *const names[] = {"list", "generator", "dict_items", "dict_keys", "dict_values"};
        return v.l->is_tuple ? "tuple" : names[v.l->view];
    }
    case TPL_DICT: return v.d->is_namespace ? "Namespace" : "dict";
    case TPL_FUNC: return "function";
    }
    return "?";
}

bool tpl_truthy(tpl_value v) {
    switch (v.type) {
    case TPL_UNDEF:
    case TPL_NONE: return false;
    case TPL_BOOL: return v.b;
    case TPL_INT: return v.i != 0;
    case TPL_FLOAT: return v.f != 0.0;
    case TPL_STR: return v.s.len != 0;
    case TPL_LIST: return v.l->view == TPL_GENERATOR || v.l->n != 0;
    case TPL_DICT: return v.d->is_namespace || v.d->n != 0;
    case TPL_FUNC: return true;
    }
    return false;
}

bool tpl_is_number(tpl_value v) { return v.type == TPL_INT || v.type == TPL_FLOAT || v.type == TPL_BOOL; }

double tpl_as_double(tpl_value v) {
    return v.type == TPL_FLOAT ? v.f : v.type == TPL_INT ? (double)v.i : v.type == TPL_BOOL ? (double)v.b : 0.0;
}

static bool str_eq(tpl_str a, tpl_str b) { return a.len == b.len && !memcmp(a.p, b.p, a.len); }

bool tpl_equal(tpl_value a, tpl_value b) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT)
            return (a.type == TPL_BOOL ? a.b : a.i) == (b.type == TPL_BOOL ? b.b : b.i);
        return tpl_as_double(a) == tpl_as_double(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case TPL_UNDEF:
    case TPL_NONE: return true;
    case TPL_STR: return str_eq(a.s, b.s);
    case TPL_LIST:
        if (a.l->view || b.l->view) return a.l == b.l;
        if (a.l->is_tuple != b.l->is_tuple || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!tpl_equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case TPL_DICT:
        if (a.d->is_namespace || b.d->is_namespace) return a.d == b.d;
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            tpl_value *o = tpl_dict_find(b.d, a.d->keys[i]);
            if (!o || !tpl_equal(a.d->vals[i], *o)) return false;
        }
        return true;
    case TPL_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

int tpl_compare(tpl_ctx *c, long pos, tpl_value a, tpl_value b) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT) {
            int64_t x = a.type == TPL_BOOL ? a.b : a.i, y = b.type == TPL_BOOL ? b.b : b.i;
            return (x > y) - (x < y);
        }
        double x = tpl_as_double(a), y = tpl_as_double(b);
        return (x > y) - (x < y);
    }
    if (a.type == TPL_STR && b.type == TPL_STR) {
        size_t n = a.s.len < b.s.len ? a.s.len : b.s.len;
        int r = n ? memcmp(a.s.p, b.s.p, n) : 0;
        if (r) return r < 0 ? -1 : 1;
        return (a.s.len > b.s.len) - (a.s.len < b.s.len);
    }
    if (a.type == TPL_LIST && b.type == TPL_LIST && a.l->is_tuple == b.l->is_tuple && !a.l->view && !b.l->view) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (tpl_equal(a.l->v[i], b.l->v[i])) continue;
            return tpl_compare(c, pos, a.l->v[i], b.l->v[i]);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    if (a.type == TPL_UNDEF || b.type == TPL_UNDEF) tpl_fail_undefined(c, pos, a.type == TPL_UNDEF ? a : b);
    tpl_fail(c, pos, "'<' not supported between instances of '%s' and '%s'", tpl_type_name(a), tpl_type_name(b));
}

_Noreturn void tpl_fail_undefined(tpl_ctx *c, long pos, tpl_value u) {
    tpl_fail(c, pos, "%.*s", (int)u.s.len, u.s.p);
}

/* ---- Python spellings ---- */

void tpl_write_float(tpl_sb *b, double f) {
    if (isnan(f)) return tpl_sb_puts(b, "nan");
    if (isinf(f)) return tpl_sb_puts(b, f < 0 ? "-inf" : "inf");
    char buf[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf is [-]d.ddde[+-]XX: collect the digits and the decimal exponent */
    char digits[24];
    int nd = 0, exp10;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) tpl_sb_putc(b, '-');
    int decpt = exp10 + 1; /* digits before the decimal point */
    if (decpt > 16 || decpt < -3) {
        tpl_sb_putc(b, digits[0]);
        if (nd > 1) {
            tpl_sb_putc(b, '.');
            tpl_sb_put(b, digits + 1, (size_t)nd - 1);
        }
        tpl_sb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        tpl_sb_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) tpl_sb_putc(b, '0');
        tpl_sb_put(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i < decpt; i++) tpl_sb_putc(b, i < nd ? digits[i] : '0');
        tpl_sb_putc(b, '.');
        if (nd > decpt) tpl_sb_put(b, digits + decpt, (size_t)(nd - decpt));
        else tpl_sb_putc(b, '0');
    }
}

size_t tpl_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *cp = (unsigned char)s[0];
        return 1;
    }
    *cp = (uint32_t)c;
    return (size_t)k;
}

void tpl_utf8_put(tpl_sb *b, uint32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, tmp);
    tpl_sb_put(b, (const char *)tmp, (size_t)n);
}

size_t tpl_utf8_count(tpl_str s) {
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) n += ((unsigned char)s.p[i] & 0xC0) != 0x80;
    return n;
}

bool tpl_py_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static bool py_isprintable(uint32_t cp) {
    if (cp == ' ') return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void write_str_repr(tpl_sb *b, tpl_str s) {
    bool has_single = memchr(s.p, '\'', s.len) != NULL, has_double = memchr(s.p, '"', s.len) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    tpl_sb_putc(b, quote);
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p + i, s.len - i, &cp);
        if (cp == (uint32_t)quote || cp == '\\') {
            tpl_sb_putc(b, '\\');
            tpl_sb_putc(b, (char)cp);
        } else if (cp == '\n') tpl_sb_puts(b, "\\n");
        else if (cp == '\r') tpl_sb_puts(b, "\\r");
        else if (cp == '\t') tpl_sb_puts(b, "\\t");
        else if (cp < 0x7F ? cp >= 0x20 : py_isprintable(cp)) tpl_sb_put(b, s.p + i, k);
        else if (cp < 0x100) tpl_sb_printf(b, "\\x%02x", cp);
        else if (cp < 0x10000) tpl_sb_printf(b, "\\u%04x", cp);
        else tpl_sb_printf(b, "\\U%08x", cp);
        i += k;
    }
    tpl_sb_putc(b, quote);
}

void tpl_write_repr(tpl_sb *b, tpl_value v) {
    switch (v.type) {
    case TPL_STR: return write_str_repr(b, v.s);
    case TPL_LIST:
        if (v.l->view == TPL_GENERATOR) return tpl_sb_puts(b, "<generator object>");
        if (v.l->view) {
            tpl_sb_puts(b, tpl_type_name(v));
            tpl_sb_putc(b, '(');
        }
        tpl_sb_putc(b, v.l->is_tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) tpl_sb_puts(b, ", ");
            tpl_write_repr(b, v.l->v[i]);
        }
        if (v.l->is_tuple && v.l->n == 1) tpl_sb_putc(b, ',');
        tpl_sb_putc(b, v.l->is_tuple ? ')' : ']');
        if (v.l->view) tpl_sb_putc(b, ')');
        return;
    case TPL_DICT:
        tpl_sb_puts(b, v.d->is_namespace ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) tpl_sb_puts(b, ", ");
            tpl_write_repr(b, v.d->keys[i]);
            tpl_sb_puts(b, ": ");
            tpl_write_repr(b, v.d->vals[i]);
        }
        return tpl_sb_puts(b, v.d->is_namespace ? "}>" : "}");
    case TPL_UNDEF: return tpl_sb_puts(b, "Undefined");
    default: return tpl_write_str(b, v);
    }
}

void tpl_write_str(tpl_sb *b, tpl_value v) {
    switch (v.type) {
    case TPL_UNDEF: return;
    case TPL_NONE: return tpl_sb_puts(b, "None");
    case TPL_BOOL: return tpl_sb_puts(b, v.b ? "True" : "False");
    case TPL_INT: return tpl_sb_printf(b, "%lld", (long long)v.i);
    case TPL_FLOAT: return tpl_write_float(b, v.f);
    case TPL_STR: return tpl_sb_put(b, v.s.p, v.s.len);
    case TPL_FUNC: return tpl_sb_puts(b, "<function>");
    default: return tpl_write_repr(b, v);
    }
}

/* ---- json.dumps ---- */

static void write_json_string(tpl_sb *b, tpl_str s, bool ensure_ascii) {
    tpl_sb_putc(b, '"');
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p + i, s.len - i, &cp);
        switch (cp) {
        case '"': tpl_sb_puts(b, "\\\""); break;
        case '\\': tpl_sb_puts(b, "\\\\"); break;
        case '\n': tpl_sb_puts(b, "\\n"); break;
        case '\r': tpl_sb_puts(b, "\\r"); break;
        case '\t': tpl_sb_puts(b, "\\t"); break;
        case '\b': tpl_sb_puts(b, "\\b"); break;
        case '\f': tpl_sb_puts(b, "\\f"); break;
        default:
            if (cp < 0x20) tpl_sb_printf(b, "\\u%04x", cp);
            else if (!ensure_ascii || cp < 0x7F) tpl_sb_put(b, s.p + i, k);
            else if (cp < 0x10000) tpl_sb_printf(b, "\\u%04x", cp);
            else tpl_sb_printf(b, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        }
        i += k;
    }
    tpl_sb_putc(b, '"');
}

static void json_newline(tpl_sb *b, const tpl_json_opts *o, int depth) {
    tpl_sb_putc(b, '\n');
    for (int i = 0; i < depth; i++) tpl_sb_puts(b, o->indent);
}

static bool write_json_float(tpl_sb *b, double f) {
    if (isnan(f)) tpl_sb_puts(b, "NaN");
    else if (isinf(f)) tpl_sb_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else tpl_write_float(b, f);
    return true;
}

static bool write_json_key(tpl_sb *b, tpl_value k, const tpl_json_opts *o) {
    tpl_sb tmp;
    switch (k.type) {
    case TPL_STR: write_json_string(b, k.s, o->ensure_ascii); return true;
    case TPL_NONE: tpl_sb_puts(b, "\"null\""); return true;
    case TPL_BOOL: tpl_sb_puts(b, k.b ? "\"true\"" : "\"false\""); return true;
    case TPL_INT:
    case TPL_FLOAT:
        tpl_sb_init(&tmp, b->c);
        if (k.type == TPL_INT) tpl_write_str(&tmp, k);
        else write_json_float(&tmp, k.f);
        write_json_string(b, tpl_sb_str(&tmp), false);
        return true;
    default: return false;
    }
}

static bool write_json(tpl_sb *b, tpl_value v, const tpl_json_opts *o, int depth);

static bool write_json_dict(tpl_sb *b, tpl_dict *d, const tpl_json_opts *o, int depth) {
    if (!d->n) {
        tpl_sb_puts(b, "{}");
        return true;
    }
    size_t *order = tpl_alloc(b->c, d->n * sizeof *order);
    for (size_t i = 0; i < d->n; i++) order[i] = i;
    if (o->sort_keys) /* insertion sort keeps it stable and dependency-free; dicts here are small */
        for (size_t i = 1; i < d->n; i++)
            for (size_t j = i; j > 0 && tpl_compare(b->c, -1, d->keys[order[j]], d->keys[order[j - 1]]) < 0; j--) {
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
    tpl_sb_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) tpl_sb_puts(b, o->item_sep);
        if (o->indent) json_newline(b, o, depth + 1);
        if (!write_json_key(b, d->keys[order[i]], o)) return false;
        tpl_sb_puts(b, o->key_sep);
        if (!write_json(b, d->vals[order[i]], o, depth + 1)) return false;
    }
    if (o->indent) json_newline(b, o, depth);
    tpl_sb_putc(b, '}');
    return true;
}

static bool write_json(tpl_sb *b, tpl_value v, const tpl_json_opts *o, int depth) {
    if (depth > 256) return false;
    switch (v.type) {
    case TPL_NONE: tpl_sb_puts(b, "null"); return true;
    case TPL_BOOL: tpl_sb_puts(b, v.b ? "true" : "false"); return true;
    case TPL_INT: tpl_write_str(b, v); return true;
    case TPL_FLOAT: return write_json_float(b, v.f);
    case TPL_STR: write_json_string(b, v.s, o->ensure_ascii); return true;
    case TPL_LIST:
        if (v.l->view) return false;
        if (!v.l->n) {
            tpl_sb_puts(b, "[]");
            return true;
        }
        tpl_sb_putc(b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) tpl_sb_puts(b, o->item_sep);
            if (o->indent) json_newline(b, o, depth + 1);
            if (!write_json(b, v.l->v[i], o, depth + 1)) return false;
        }
        if (o->indent) json_newline(b, o, depth);
        tpl_sb_putc(b, ']');
        return true;
    case TPL_DICT: return !v.d->is_namespace && write_json_dict(b, v.d, o, depth);
    default: return false;
    }
}

bool tpl_write_json(tpl_sb *b, tpl_value v, const tpl_json_opts *o) { return write_json(b, v, o, 0); }
