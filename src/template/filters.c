/* Jinja2's built-in filters and tests (the ones chat templates use), with HF's tojson: json.dumps with
 * ensure_ascii=False and no HTML escaping. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template/eval.h"

typedef tpl_value (*filter_fn)(tpl_state *S, tpl_value v, const tpl_args *a);
typedef bool (*test_fn)(tpl_state *S, tpl_value v, const tpl_args *a);

static tpl_str str_of(tpl_state *S, tpl_value v) { return tpl_to_str(S, v); }
static tpl_value arg(const tpl_args *a, size_t i, const char *name, tpl_value def) { return tpl_arg(a, i, name, def); }
static tpl_value lit(const char *s) { return tpl_strv((tpl_str){s, strlen(s)}); }

static tpl_value list_of(tpl_state *S, size_t cap) { return tpl_list_new(S->c, cap); }

/* Jinja's lazy filters return generators: always true, no len(), no indexing (tpl_view). */
static tpl_value generator(tpl_value list) {
    list.l->view = TPL_GENERATOR;
    return list;
}

/* Jinja's attribute getter for selectattr/map/sort/...: "a.b.0" walks items (then attributes) part by part. */
static tpl_value get_path(tpl_state *S, long pos, tpl_value item, tpl_value attr) {
    if (attr.type != TPL_STR) return tpl_getitem(S, pos, item, attr);
    tpl_str s = attr.s;
    size_t start = 0;
    for (size_t i = 0; i <= s.len; i++) {
        if (i < s.len && s.p[i] != '.') continue;
        tpl_str part = {s.p + start, i - start};
        bool numeric = part.len > 0;
        for (size_t k = 0; k < part.len; k++) numeric = numeric && part.p[k] >= '0' && part.p[k] <= '9';
        item = tpl_getitem(S, pos, item, numeric ? tpl_int(strtoll(part.p, NULL, 10)) : tpl_strv(part));
        start = i + 1;
    }
    return item;
}

static tpl_args shift_args(const tpl_args *a, size_t k) {
    tpl_args r = *a;
    r.n = a->n > k ? a->n - k : 0;
    r.v = a->v + (a->n > k ? k : a->n);
    return r;
}

/* ---- sequence filters ---- */

static tpl_value f_length(tpl_state *S, tpl_value v, const tpl_args *a) {
    switch (v.type) {
    case TPL_UNDEF: return tpl_int(0);
    case TPL_STR: return tpl_int((int64_t)tpl_utf8_count(v.s));
    case TPL_LIST:
        if (v.l->view == TPL_GENERATOR) break;
        return tpl_int((int64_t)v.l->n);
    case TPL_DICT: if (!v.d->is_namespace) return tpl_int((int64_t)v.d->n); break;
    default: break;
    }
    tpl_fail(S->c, a->pos, "object of type '%s' has no len()", tpl_type_name(v));
}

static tpl_value f_first(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    return l->n ? l->v[0] : tpl_undef(S->c, "No first item, sequence was empty.");
}

static tpl_value f_last(tpl_state *S, tpl_value v, const tpl_args *a) {
    if (v.type == TPL_LIST && v.l->view == TPL_GENERATOR) tpl_fail(S->c, a->pos, "'generator' object is not reversible");
    tpl_list *l = tpl_iter(S, a->pos, v);
    return l->n ? l->v[l->n - 1] : tpl_undef(S->c, "No last item, sequence was empty.");
}

static tpl_value f_join(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_str sep = str_of(S, arg(a, 0, "d", lit("")));
    tpl_value attr = arg(a, 1, "attribute", tpl_none());
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < l->n; i++) {
        if (i) tpl_sb_put(&b, sep.p, sep.len);
        tpl_write_str(&b, attr.type == TPL_NONE ? l->v[i] : get_path(S, a->pos, l->v[i], attr));
    }
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value f_list(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_value out = list_of(S, l->n);
    for (size_t i = 0; i < l->n; i++) tpl_list_push(S->c, out.l, l->v[i]);
    return out;
}

static tpl_value f_items(tpl_state *S, tpl_value v, const tpl_args *a) {
    if (v.type == TPL_UNDEF) return list_of(S, 0);
    if (v.type != TPL_DICT || v.d->is_namespace) tpl_fail(S->c, a->pos, "Can only get item pairs from a mapping.");
    tpl_value items = tpl_dict_items(S, v.d);
    items.l->view = TPL_GENERATOR;
    return items;
}

static tpl_value f_reverse(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_value out = list_of(S, l->n);
    for (size_t i = l->n; i > 0; i--) tpl_list_push(S->c, out.l, l->v[i - 1]);
    if (v.type != TPL_STR) return generator(out);
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < out.l->n; i++) tpl_sb_put(&b, out.l->v[i].s.p, out.l->v[i].s.len);
    return tpl_strv(tpl_sb_str(&b));
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result equals want. */
static tpl_value filter_items(tpl_state *S, tpl_value v, const tpl_args *a, bool by_attr, bool want) {
    if (!tpl_truthy(v)) return generator(list_of(S, 0)); /* Jinja looks at a false value no further */
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_value attr = by_attr ? arg(a, 0, NULL, tpl_none()) : tpl_none();
    size_t test_at = by_attr ? 1 : 0;
    tpl_value test = arg(a, test_at, NULL, tpl_none());
    tpl_args rest = shift_args(a, test_at + 1);
    tpl_value out = list_of(S, l->n);
    for (size_t i = 0; i < l->n; i++) {
        tpl_value x = by_attr ? get_path(S, a->pos, l->v[i], attr) : l->v[i];
        bool ok = test.type == TPL_NONE ? tpl_truthy(x) : tpl_test(S, str_of(S, test), x, &rest);
        if (ok == want) tpl_list_push(S->c, out.l, l->v[i]);
    }
    return generator(out);
}
static tpl_value f_select(tpl_state *S, tpl_value v, const tpl_args *a) { return filter_items(S, v, a, false, true); }
static tpl_value f_reject(tpl_state *S, tpl_value v, const tpl_args *a) { return filter_items(S, v, a, false, false); }
static tpl_value f_selectattr(tpl_state *S, tpl_value v, const tpl_args *a) { return filter_items(S, v, a, true, true); }
static tpl_value f_rejectattr(tpl_state *S, tpl_value v, const tpl_args *a) { return filter_items(S, v, a, true, false); }

static tpl_value f_map(tpl_state *S, tpl_value v, const tpl_args *a) {
    if (!tpl_truthy(v)) return generator(list_of(S, 0));
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_value attr = arg(a, SIZE_MAX, "attribute", tpl_none()), def = arg(a, SIZE_MAX, "default", tpl_none());
    tpl_value out = list_of(S, l->n);
    for (size_t i = 0; i < l->n; i++) {
        tpl_value x;
        if (attr.type != TPL_NONE) {
            x = get_path(S, a->pos, l->v[i], attr);
            if (x.type == TPL_UNDEF && def.type != TPL_NONE) x = def;
        } else {
            if (!a->n) tpl_fail(S->c, a->pos, "map requires a filter argument");
            tpl_args rest = shift_args(a, 1); /* the filter gets the other arguments, keywords included */
            x = tpl_filter(S, str_of(S, a->v[0]), l->v[i], &rest);
        }
        tpl_list_push(S->c, out.l, x);
    }
    return generator(out);
}

/* Sort key as Jinja's sort/unique/min/max use it: the attribute, lower-cased unless case_sensitive. */
static tpl_value sort_key(tpl_state *S, long pos, tpl_value x, tpl_value attr, bool case_sensitive) {
    if (attr.type != TPL_NONE) x = get_path(S, pos, x, attr);
    if (x.type == TPL_STR && !case_sensitive) x = tpl_strv(tpl_str_case(S, x.s, 'l'));
    return x;
}

static tpl_value sorted(tpl_state *S, tpl_list *l, long pos, tpl_value attr, bool case_sensitive, bool reverse) {
    tpl_value out = list_of(S, l->n), *keys = tpl_alloc(S->c, (l->n + 1) * sizeof *keys);
    for (size_t i = 0; i < l->n; i++) {
        tpl_value x = l->v[i], k = sort_key(S, pos, x, attr, case_sensitive);
        size_t j = out.l->n; /* stable insertion sort: lists in templates are short */
        tpl_list_push(S->c, out.l, x);
        while (j > 0) {
            int c = tpl_compare(S->c, pos, keys[j - 1], k);
            if (reverse ? c >= 0 : c <= 0) break;
            out.l->v[j] = out.l->v[j - 1];
            keys[j] = keys[j - 1];
            j--;
        }
        out.l->v[j] = x;
        keys[j] = k;
    }
    return out;
}

static tpl_value f_sort(tpl_state *S, tpl_value v, const tpl_args *a) {
    return sorted(S, tpl_iter(S, a->pos, v), a->pos, arg(a, 2, "attribute", tpl_none()),
                  tpl_truthy(arg(a, 1, "case_sensitive", tpl_bool(false))), tpl_truthy(arg(a, 0, "reverse", tpl_bool(false))));
}

static tpl_value f_dictsort(tpl_state *S, tpl_value v, const tpl_args *a) {
    if (v.type != TPL_DICT) tpl_fail(S->c, a->pos, "dictsort expects a mapping");
    tpl_value items = tpl_dict_items(S, v.d);
    bool by_value = tpl_str_eq(str_of(S, arg(a, 1, "by", lit("key"))), "value");
    return sorted(S, items.l, a->pos, tpl_int(by_value), tpl_truthy(arg(a, 0, "case_sensitive", tpl_bool(false))),
                  tpl_truthy(arg(a, 2, "reverse", tpl_bool(false))));
}

static tpl_value f_unique(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    bool cs = tpl_truthy(arg(a, 0, "case_sensitive", tpl_bool(false)));
    tpl_value attr = arg(a, 1, "attribute", tpl_none());
    tpl_value out = list_of(S, l->n), seen = list_of(S, l->n);
    for (size_t i = 0; i < l->n; i++) {
        tpl_value k = sort_key(S, a->pos, l->v[i], attr, cs);
        bool dup = false;
        for (size_t j = 0; j < seen.l->n && !dup; j++) dup = tpl_equal(seen.l->v[j], k);
        if (dup) continue;
        tpl_list_push(S->c, seen.l, k);
        tpl_list_push(S->c, out.l, l->v[i]);
    }
    return generator(out);
}

static tpl_value min_max(tpl_state *S, tpl_value v, const tpl_args *a, int sign) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    bool cs = tpl_truthy(arg(a, 0, "case_sensitive", tpl_bool(false)));
    tpl_value attr = arg(a, 1, "attribute", tpl_none());
    if (!l->n) return tpl_undef(S->c, "No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < l->n; i++)
        if (tpl_compare(S->c, a->pos, sort_key(S, a->pos, l->v[i], attr, cs), sort_key(S, a->pos, l->v[best], attr, cs)) * sign > 0) best = i;
    return l->v[best];
}
static tpl_value f_min(tpl_state *S, tpl_value v, const tpl_args *a) { return min_max(S, v, a, -1); }
static tpl_value f_max(tpl_state *S, tpl_value v, const tpl_args *a) { return min_max(S, v, a, 1); }

static tpl_value f_sum(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_list *l = tpl_iter(S, a->pos, v);
    tpl_value attr = arg(a, 0, "attribute", tpl_none()), acc = arg(a, 1, "start", tpl_int(0));
    for (size_t i = 0; i < l->n; i++) {
        tpl_value x = attr.type == TPL_NONE ? l->v[i] : get_path(S, a->pos, l->v[i], attr);
        if (!tpl_is_number(acc) || !tpl_is_number(x)) tpl_fail(S->c, a->pos, "sum expects numbers");
        if (acc.type == TPL_FLOAT || x.type == TPL_FLOAT) acc = tpl_float(tpl_as_double(acc) + tpl_as_double(x));
        else if (__builtin_add_overflow(acc.type == TPL_BOOL ? acc.b : acc.i, x.type == TPL_BOOL ? x.b : x.i, &acc.i)) tpl_fail(S->c, a->pos, "integer overflow");
        else acc.type = TPL_INT;
    }
    return acc;
}

/* ---- string filters ---- */

static tpl_value f_string(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_strv(str_of(S, v)); }
static tpl_value f_upper(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_strv(tpl_str_case(S, str_of(S, v), 'u')); }
static tpl_value f_lower(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_strv(tpl_str_case(S, str_of(S, v), 'l')); }
static tpl_value f_capitalize(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_strv(tpl_str_case(S, str_of(S, v), 'c')); }

/* Jinja's title: words are split at whitespace, '-', and opening brackets; each word gets str.capitalize(). */
static tpl_value f_title(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t at = i;
        i += tpl_utf8_decode(s.p + i, s.len - i, &cp);
        if (tpl_py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') {
            tpl_sb_put(&b, s.p + at, i - at);
            continue;
        }
        /* a word: Jinja spells it word[0].upper() + word[1:].lower(), so the rest is lowered on its own */
        tpl_case_put(&b, s, at, i, cp, 'u');
        size_t end = i;
        while (end < s.len) {
            size_t k = tpl_utf8_decode(s.p + end, s.len - end, &cp);
            if (tpl_py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') break;
            end += k;
        }
        tpl_str rest = tpl_str_case(S, (tpl_str){s.p + i, end - i}, 'l');
        tpl_sb_put(&b, rest.p, rest.len);
        i = end;
    }
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value f_trim(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value chars = arg(a, 0, "chars", tpl_none());
    tpl_str cs = chars.type == TPL_NONE ? (tpl_str){0} : str_of(S, chars);
    return tpl_strv(tpl_str_strip(str_of(S, v), chars.type == TPL_NONE ? NULL : &cs, true, true));
}

static tpl_value f_replace(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value count = arg(a, 2, "count", tpl_none());
    return tpl_strv(tpl_str_replace(S, str_of(S, v), str_of(S, arg(a, 0, "old", lit(""))), str_of(S, arg(a, 1, "new", lit(""))),
                                    count.type == TPL_INT ? count.i : -1));
}

static tpl_value f_escape(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < s.len; i++) {
        switch (s.p[i]) {
        case '&': tpl_sb_puts(&b, "&amp;"); break;
        case '<': tpl_sb_puts(&b, "&lt;"); break;
        case '>': tpl_sb_puts(&b, "&gt;"); break;
        case '"': tpl_sb_puts(&b, "&#34;"); break;
        case '\'': tpl_sb_puts(&b, "&#39;"); break;
        default: tpl_sb_putc(&b, s.p[i]);
        }
    }
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value f_safe(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_strv(str_of(S, v)); }

static tpl_value f_indent(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value w = arg(a, 0, "width", tpl_int(4));
    tpl_str ind;
    if (w.type == TPL_STR) {
        ind = w.s;
    } else {
        int64_t n = w.type == TPL_INT ? w.i : 0;
        if (n > 4096) tpl_fail(S->c, a->pos, "indent width too large");
        char *sp = tpl_alloc(S->c, n > 0 ? (size_t)n + 1 : 1);
        if (n > 0) memset(sp, ' ', (size_t)n);
        ind = (tpl_str){sp, n > 0 ? (size_t)n : 0};
    }
    bool first = tpl_truthy(arg(a, 1, "first", tpl_bool(false))), blank = tpl_truthy(arg(a, 2, "blank", tpl_bool(false)));
    if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
    if (v.type != TPL_STR) tpl_fail(S->c, a->pos, "indent expects a string, got %s", tpl_type_name(v));
    tpl_str s = v.s;
    tpl_sb src;
    tpl_sb_init(&src, S->c);
    tpl_sb_put(&src, s.p, s.len);
    tpl_sb_putc(&src, '\n'); /* as Jinja does, so splitlines keeps a trailing empty line */
    tpl_list *lines = tpl_str_splitlines(S, tpl_sb_str(&src));
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    if (first) tpl_sb_put(&b, ind.p, ind.len);
    for (size_t i = 0; i < lines->n; i++) {
        tpl_str line = lines->v[i].s;
        if (i) {
            tpl_sb_putc(&b, '\n');
            if (blank || line.len) tpl_sb_put(&b, ind.p, ind.len);
        }
        tpl_sb_put(&b, line.p, line.len);
    }
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value f_center(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    tpl_value w = arg(a, 0, "width", tpl_int(80));
    size_t n = tpl_utf8_count(s), width = w.type == TPL_INT && w.i > 0 && w.i < 4096 ? (size_t)w.i : 0;
    if (width <= n) return tpl_strv(s);
    size_t pad = width - n, left = pad / 2 + (pad & width & 1);
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < left; i++) tpl_sb_putc(&b, ' ');
    tpl_sb_put(&b, s.p, s.len);
    for (size_t i = left; i < pad; i++) tpl_sb_putc(&b, ' ');
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value f_wordcount(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        i += tpl_utf8_decode(s.p + i, s.len - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_NO);
        n += w && !in_word;
        in_word = w;
    }
    return tpl_int(n);
}

tpl_str tpl_percent_format(tpl_state *S, long pos, tpl_str f, const tpl_value *args, size_t n, bool mapping) {
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    size_t k = 0;
    for (size_t i = 0; i < f.len; i++) {
        if (f.p[i] != '%') {
            tpl_sb_putc(&b, f.p[i]);
            continue;
        }
        char spec = i + 1 < f.len ? f.p[++i] : 0;
        if (spec == '%') {
            tpl_sb_putc(&b, '%');
            continue;
        }
        if (k >= n) tpl_fail(S->c, pos, "not enough arguments for format string");
        tpl_value x = args[k++];
        if (x.type == TPL_UNDEF && spec != 's') tpl_fail_undefined(S->c, pos, x);
        if (spec == 's') tpl_write_str(&b, x);
        else if (spec == 'r') tpl_write_repr(&b, x);
        else if ((spec == 'd' || spec == 'i') && tpl_is_number(x)) tpl_sb_printf(&b, "%lld", (long long)tpl_as_double(x));
        else if (spec == 'f' && tpl_is_number(x)) tpl_sb_printf(&b, "%f", tpl_as_double(x));
        else tpl_fail(S->c, pos, "unsupported format character '%c' for %s", spec, tpl_type_name(x));
    }
    if (k < n && !mapping) tpl_fail(S->c, pos, "not all arguments converted during string formatting");
    return tpl_sb_str(&b);
}

static tpl_value f_format(tpl_state *S, tpl_value v, const tpl_args *a) {
    return tpl_strv(tpl_percent_format(S, a->pos, str_of(S, v), a->v, a->n, false));
}

/* ---- conversions ---- */

static bool parse_py_int(tpl_str s, int64_t *out) {
    tpl_str t = tpl_str_strip(s, NULL, true, true);
    char buf[64];
    size_t k = 0;
    for (size_t i = 0; i < t.len; i++) {
        if (t.p[i] == '_' && i > 0 && i + 1 < t.len) continue;
        if (k + 1 >= sizeof buf) return false;
        buf[k++] = t.p[i];
    }
    buf[k] = '\0';
    if (!k) return false;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (*end || end == buf) return false;
    *out = v;
    return true;
}

static bool parse_py_float(tpl_str s, double *out) {
    tpl_str t = tpl_str_strip(s, NULL, true, true);
    char buf[128];
    if (!t.len || t.len >= sizeof buf) return false;
    memcpy(buf, t.p, t.len);
    buf[t.len] = '\0';
    char *end;
    *out = strtod(buf, &end);
    return !*end;
}

static tpl_value f_int(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value def = arg(a, 0, "default", tpl_int(0));
    if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
    int64_t i;
    double f;
    if (v.type == TPL_INT) return v;
    if (v.type == TPL_BOOL) return tpl_int(v.b);
    if (v.type == TPL_STR && parse_py_int(v.s, &i)) return tpl_int(i);
    if (v.type == TPL_FLOAT) f = v.f;
    else if (v.type != TPL_STR || !parse_py_float(v.s, &f)) return def;
    if (!isfinite(f) || fabs(f) >= 9.2e18) return def;
    return tpl_int((int64_t)f);
}

static tpl_value f_float(tpl_state *S, tpl_value v, const tpl_args *a) {
    double f;
    if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
    if (tpl_is_number(v)) return tpl_float(tpl_as_double(v));
    if (v.type == TPL_STR && parse_py_float(v.s, &f)) return tpl_float(f);
    return arg(a, 0, "default", tpl_float(0.0));
}

static tpl_value f_abs(tpl_state *S, tpl_value v, const tpl_args *a) {
    if (v.type == TPL_FLOAT) return tpl_float(fabs(v.f));
    if (v.type == TPL_INT && v.i != INT64_MIN) return tpl_int(v.i < 0 ? -v.i : v.i);
    if (v.type == TPL_BOOL) return tpl_int(v.b);
    tpl_fail(S->c, a->pos, "bad operand type for abs(): '%s'", tpl_type_name(v));
}

static tpl_value f_round(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value p = arg(a, 0, "precision", tpl_int(0));
    tpl_str method = str_of(S, arg(a, 1, "method", lit("common")));
    if (!tpl_is_number(v)) tpl_fail(S->c, a->pos, "round expects a number");
    int64_t prec = p.type == TPL_INT ? p.i : 0;
    double scale = pow(10.0, (double)prec), x = tpl_as_double(v) * scale;
    if (tpl_str_eq(method, "common")) {
        if (v.type != TPL_FLOAT) return v.type == TPL_BOOL ? tpl_int(v.b) : v; /* Python round() of an int */
        if (prec >= 0 && prec <= 400 && isfinite(v.f)) {
            /* Python rounds the exact binary value half-to-even, as printf does: 23.585 -> 23.59, where the
             * scaled 2358.4999... would give 23.58 */
            int n = snprintf(NULL, 0, "%.*f", (int)prec, v.f);
            char *buf = tpl_alloc(S->c, (size_t)n + 1);
            snprintf(buf, (size_t)n + 1, "%.*f", (int)prec, v.f);
            return tpl_float(strtod(buf, NULL));
        }
        x = nearbyint(x);
    } else if (tpl_str_eq(method, "ceil") || tpl_str_eq(method, "floor")) {
        /* Python's math.ceil/floor return ints: no -0.0, and no infinity */
        if (!isfinite(x)) tpl_fail(S->c, a->pos, "cannot convert float infinity or NaN to integer");
        x = (tpl_str_eq(method, "ceil") ? ceil(x) : floor(x)) + 0.0;
    } else {
        tpl_fail(S->c, a->pos, "method must be common, ceil or floor");
    }
    return tpl_float(x / scale);
}

static tpl_value f_default(tpl_state *S, tpl_value v, const tpl_args *a) {
    bool boolean = tpl_truthy(arg(a, 1, "boolean", tpl_bool(false)));
    if (v.type == TPL_UNDEF || (boolean && !tpl_truthy(v))) return arg(a, 0, "default_value", lit(""));
    return v;
}

static tpl_value f_attr(tpl_state *S, tpl_value v, const tpl_args *a) {
    return tpl_getattr(S, a->pos, v, str_of(S, arg(a, 0, "name", lit(""))));
}

static tpl_value f_tojson(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value ensure_ascii = arg(a, 0, "ensure_ascii", tpl_bool(false)), indent = arg(a, 1, "indent", tpl_none());
    tpl_value seps = arg(a, 2, "separators", tpl_none()), sort_keys = arg(a, 3, "sort_keys", tpl_bool(false));
    tpl_json_opts o = {.ensure_ascii = tpl_truthy(ensure_ascii), .sort_keys = tpl_truthy(sort_keys)};
    if (indent.type == TPL_STR) {
        o.indent = tpl_cstr(S->c, indent.s.p, indent.s.len).s.p;
    } else if (indent.type == TPL_INT) {
        int64_t n = indent.i < 0 ? 0 : indent.i;
        if (n > 4096) tpl_fail(S->c, a->pos, "indent too large");
        char *sp = tpl_alloc(S->c, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        o.indent = sp;
    } else if (indent.type != TPL_NONE) {
        tpl_fail(S->c, a->pos, "tojson indent must be an int or a string");
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (seps.type == TPL_LIST && seps.l->n == 2 && seps.l->v[0].type == TPL_STR && seps.l->v[1].type == TPL_STR) {
        o.item_sep = tpl_cstr(S->c, seps.l->v[0].s.p, seps.l->v[0].s.len).s.p;
        o.key_sep = tpl_cstr(S->c, seps.l->v[1].s.p, seps.l->v[1].s.len).s.p;
    } else if (seps.type != TPL_NONE) {
        tpl_fail(S->c, a->pos, "tojson separators must be a pair of strings");
    }
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    if (!tpl_write_json(&b, v, &o)) {
        if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
        tpl_fail(S->c, a->pos, "value of type '%s' (or inside it) is not JSON serializable", tpl_type_name(v));
    }
    return tpl_strv(tpl_sb_str(&b));
}

typedef struct filter {
    const char *name;
    filter_fn fn;
} filter;

static const filter FILTERS[] = {
    {"abs", f_abs},         {"attr", f_attr},           {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length},    {"d", f_default},           {"default", f_default},       {"dictsort", f_dictsort},
    {"e", f_escape},        {"escape", f_escape},       {"first", f_first},           {"float", f_float},
    {"format", f_format},   {"indent", f_indent},       {"int", f_int},               {"items", f_items},
    {"join", f_join},       {"last", f_last},           {"length", f_length},         {"list", f_list},
    {"lower", f_lower},     {"map", f_map},             {"max", f_max},               {"min", f_min},
    {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},     {"reverse", f_reverse},
    {"round", f_round},     {"safe", f_safe},           {"select", f_select},         {"selectattr", f_selectattr},
    {"sort", f_sort},       {"string", f_string},       {"sum", f_sum},               {"title", f_title},
    {"tojson", f_tojson},   {"trim", f_trim},           {"unique", f_unique},         {"upper", f_upper},
    {"wordcount", f_wordcount}, {NULL, NULL},
};

tpl_value tpl_filter(tpl_state *S, tpl_str name, tpl_value v, const tpl_args *a) {
    for (const filter *f = FILTERS; f->name; f++)
        if (tpl_str_eq(name, f->name)) return f->fn(S, v, a);
    tpl_fail(S->c, a->pos, "no filter named '%.*s'", (int)name.len, name.p);
}

/* ---- tests ---- */

static tpl_value test_arg(tpl_state *S, const tpl_args *a) {
    if (!a->n) tpl_fail(S->c, a->pos, "test needs an argument");
    return a->v[0];
}

static bool t_defined(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type != TPL_UNDEF; }
static bool t_undefined(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_UNDEF; }
static bool t_none(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_NONE; }
static bool t_boolean(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_BOOL; }
static bool t_true(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_BOOL && v.b; }
static bool t_false(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_BOOL && !v.b; }
static bool t_integer(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_INT; }
static bool t_float(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_FLOAT; }
static bool t_number(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_is_number(v); }
static bool t_string(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_STR; }
static bool t_mapping(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_DICT && !v.d->is_namespace; }
/* Undefined counts: it has a __call__ (that fails). */
static bool t_callable(tpl_state *S, tpl_value v, const tpl_args *a) { return v.type == TPL_FUNC || v.type == TPL_UNDEF; }
static bool t_escaped(tpl_state *S, tpl_value v, const tpl_args *a) { return false; }
static bool t_iterable(tpl_state *S, tpl_value v, const tpl_args *a) {
    return v.type == TPL_UNDEF || v.type == TPL_STR || v.type == TPL_LIST || (v.type == TPL_DICT && !v.d->is_namespace);
}
static bool t_sequence(tpl_state *S, tpl_value v, const tpl_args *a) {
    return t_iterable(S, v, a) && !(v.type == TPL_LIST && v.l->view);
}
static bool t_eq(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_equal(v, test_arg(S, a)); }
static bool t_ne(tpl_state *S, tpl_value v, const tpl_args *a) { return !tpl_equal(v, test_arg(S, a)); }
static bool t_lt(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_compare(S->c, a->pos, v, test_arg(S, a)) < 0; }
static bool t_le(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_compare(S->c, a->pos, v, test_arg(S, a)) <= 0; }
static bool t_gt(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_compare(S->c, a->pos, v, test_arg(S, a)) > 0; }
static bool t_ge(tpl_state *S, tpl_value v, const tpl_args *a) { return tpl_compare(S->c, a->pos, v, test_arg(S, a)) >= 0; }
static bool t_sameas(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value o = test_arg(S, a);
    return v.type == o.type && (v.type == TPL_NONE || v.type == TPL_UNDEF || tpl_equal(v, o)) &&
           (v.type != TPL_LIST || v.l == o.l) && (v.type != TPL_DICT || v.d == o.d);
}

static bool t_in(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_value seq = test_arg(S, a);
    if (seq.type == TPL_STR && v.type == TPL_STR) {
        for (size_t i = 0; i + v.s.len <= seq.s.len; i++)
            if (!memcmp(seq.s.p + i, v.s.p, v.s.len)) return true;
        return false;
    }
    if (seq.type == TPL_DICT) return tpl_dict_find(seq.d, v) != NULL;
    tpl_list *l = tpl_iter(S, a->pos, seq);
    for (size_t i = 0; i < l->n; i++)
        if (tpl_equal(l->v[i], v)) return true;
    return false;
}

/* Python's value % d, as a double (exact for the small integers these tests see). */
static double py_mod(tpl_state *S, const tpl_args *a, tpl_value v, tpl_value d) {
    if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
    if (!tpl_is_number(v) || !tpl_is_number(d))
        tpl_fail(S->c, a->pos, "test expects numbers, got %s and %s", tpl_type_name(v), tpl_type_name(d));
    double x = tpl_as_double(v), y = tpl_as_double(d);
    if (y == 0.0) tpl_fail(S->c, a->pos, "integer division or modulo by zero");
    double m = fmod(x, y);
    return m != 0.0 && ((m < 0) != (y < 0)) ? m + y : m;
}
static bool t_odd(tpl_state *S, tpl_value v, const tpl_args *a) { return py_mod(S, a, v, tpl_int(2)) == 1.0; }
static bool t_even(tpl_state *S, tpl_value v, const tpl_args *a) { return py_mod(S, a, v, tpl_int(2)) == 0.0; }
static bool t_divisibleby(tpl_state *S, tpl_value v, const tpl_args *a) { return py_mod(S, a, v, test_arg(S, a)) == 0.0; }
static bool t_lower(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    return tpl_equal(tpl_strv(tpl_str_case(S, s, 'l')), tpl_strv(s)) && !tpl_equal(tpl_strv(tpl_str_case(S, s, 'u')), tpl_strv(s));
}
static bool t_upper(tpl_state *S, tpl_value v, const tpl_args *a) {
    tpl_str s = str_of(S, v);
    return tpl_equal(tpl_strv(tpl_str_case(S, s, 'u')), tpl_strv(s)) && !tpl_equal(tpl_strv(tpl_str_case(S, s, 'l')), tpl_strv(s));
}

typedef struct test {
    const char *name;
    test_fn fn;
    size_t n_args; /* beyond the value tested */
} test;

static const test TESTS[] = {
    {"defined", t_defined, 0},   {"undefined", t_undefined, 0}, {"none", t_none, 0},         {"boolean", t_boolean, 0},
    {"true", t_true, 0},         {"false", t_false, 0},         {"integer", t_integer, 0},   {"float", t_float, 0},
    {"number", t_number, 0},     {"string", t_string, 0},       {"mapping", t_mapping, 0},   {"callable", t_callable, 0},
    {"escaped", t_escaped, 0},   {"iterable", t_iterable, 0},   {"sequence", t_sequence, 0}, {"eq", t_eq, 1},
    {"equalto", t_eq, 1},        {"==", t_eq, 1},               {"ne", t_ne, 1},             {"!=", t_ne, 1},
    {"lt", t_lt, 1},             {"lessthan", t_lt, 1},         {"<", t_lt, 1},              {"le", t_le, 1},
    {"<=", t_le, 1},             {"gt", t_gt, 1},               {"greaterthan", t_gt, 1},    {">", t_gt, 1},
    {"ge", t_ge, 1},             {">=", t_ge, 1},               {"sameas", t_sameas, 1},     {"in", t_in, 1},
    {"odd", t_odd, 0},           {"even", t_even, 0},           {"divisibleby", t_divisibleby, 1},
    {"lower", t_lower, 0},       {"upper", t_upper, 0},         {NULL, NULL, 0},
};

bool tpl_test(tpl_state *S, tpl_str name, tpl_value v, const tpl_args *a) {
    for (const test *t = TESTS; t->name; t++) {
        if (!tpl_str_eq(name, t->name)) continue;
        if (a->n + a->n_kw != t->n_args)
            tpl_fail(S->c, a->pos, "test '%s' takes %zu argument(s), got %zu", t->name, t->n_args, a->n + a->n_kw);
        return t->fn(S, v, a);
    }
    tpl_fail(S->c, a->pos, "no test named '%.*s'", (int)name.len, name.p);
}
