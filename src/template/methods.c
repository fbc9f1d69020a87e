/* Methods templates call on values (Python's str, dict and list methods a sandboxed Jinja allows: none of them
 * mutate) and the global functions HF's environment provides. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "template/eval.h"

tpl_value tpl_arg(const tpl_args *a, size_t i, const char *name, tpl_value def) {
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (tpl_str_eq(a->kw_names[k], name)) return a->kw[k];
    return i < a->n ? a->v[i] : def;
}

static tpl_str need_str(tpl_state *S, const tpl_args *a, tpl_value v, const char *what) {
    if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
    if (v.type != TPL_STR) tpl_fail(S->c, a->pos, "%s must be str, not %s", what, tpl_type_name(v));
    return v.s;
}

/* ---- string operations shared with the filters ---- */

static bool in_chars(uint32_t cp, const tpl_str *chars) {
    if (!chars) return tpl_py_isspace(cp);
    for (size_t i = 0; i < chars->len;) {
        uint32_t c;
        i += tpl_utf8_decode(chars->p + i, chars->len - i, &c);
        if (c == cp) return true;
    }
    return false;
}

tpl_str tpl_str_strip(tpl_str s, const tpl_str *chars, bool left, bool right) {
    size_t start = 0, end = s.len;
    if (left)
        while (start < end) {
            uint32_t cp;
            size_t k = tpl_utf8_decode(s.p + start, end - start, &cp);
            if (!in_chars(cp, chars)) break;
            start += k;
        }
    if (right) {
        size_t keep = start;
        for (size_t i = start; i < end;) {
            uint32_t cp;
            i += tpl_utf8_decode(s.p + i, end - i, &cp);
            if (!in_chars(cp, chars)) keep = i;
        }
        end = keep;
    }
    return (tpl_str){s.p + start, end - start};
}

static bool is_cased_letter(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' str.title, 's' swapcase. */
tpl_str tpl_str_case(tpl_state *S, tpl_str s, int mode) {
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    bool prev_cased = false;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t at = i;
        i += tpl_utf8_decode(s.p + i, s.len - i, &cp);
        int how;
        switch (mode) {
        case 'u': how = 'u'; break;
        case 'l': how = 'l'; break;
        case 'c': how = at == 0 ? 't' : 'l'; break;
        case 't': how = prev_cased ? 'l' : 't'; break;
        default: how = utf8proc_islower((utf8proc_int32_t)cp) ? 'u' : utf8proc_isupper((utf8proc_int32_t)cp) ? 'l' : 0; break;
        }
        if (how) tpl_case_put(&b, s, at, i, cp, how);
        else tpl_sb_put(&b, s.p + at, i - at);
        prev_cased = is_cased_letter(cp);
    }
    return tpl_sb_str(&b);
}

tpl_str tpl_str_replace(tpl_state *S, tpl_str s, tpl_str old, tpl_str rep, int64_t count) {
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    size_t i = 0;
    if (!old.len) { /* Python inserts the replacement before every character and at the end */
        while (count != 0) {
            tpl_sb_put(&b, rep.p, rep.len);
            count--;
            if (i >= s.len) break;
            uint32_t cp;
            size_t k = tpl_utf8_decode(s.p + i, s.len - i, &cp);
            tpl_sb_put(&b, s.p + i, k);
            i += k;
        }
        tpl_sb_put(&b, s.p + i, s.len - i);
        return tpl_sb_str(&b);
    }
    while (i < s.len) {
        if (count != 0 && i + old.len <= s.len && !memcmp(s.p + i, old.p, old.len)) {
            tpl_sb_put(&b, rep.p, rep.len);
            i += old.len;
            count--;
        } else {
            tpl_sb_putc(&b, s.p[i++]);
        }
    }
    return tpl_sb_str(&b);
}

/* Python str.splitlines(): breaks at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029. */
tpl_list *tpl_str_splitlines(tpl_state *S, tpl_str s) {
    tpl_list *out = tpl_list_new(S->c, 0).l;
    size_t start = 0;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s.p + i, s.len - i, &cp);
        bool brk = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                   cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i += k;
            continue;
        }
        tpl_list_push(S->c, out, tpl_strv((tpl_str){s.p + start, i - start}));
        i += k;
        if (cp == '\r' && i < s.len && s.p[i] == '\n') i++;
        start = i;
    }
    if (start < s.len) tpl_list_push(S->c, out, tpl_strv((tpl_str){s.p + start, s.len - start}));
    return out;
}

/* Python str.split(sep, maxsplit) (sep NULL: runs of whitespace). */
static tpl_value str_split(tpl_state *S, tpl_str s, const tpl_str *sep, int64_t maxsplit) {
    tpl_value out = tpl_list_new(S->c, 0);
    if (sep) {
        size_t start = 0;
        for (size_t i = 0; i + sep->len <= s.len;) {
            if (maxsplit != 0 && !memcmp(s.p + i, sep->p, sep->len)) {
                tpl_list_push(S->c, out.l, tpl_strv((tpl_str){s.p + start, i - start}));
                i += sep->len;
                start = i;
                maxsplit--;
            } else {
                i++;
            }
        }
        tpl_list_push(S->c, out.l, tpl_strv((tpl_str){s.p + start, s.len - start}));
        return out;
    }
    size_t i = 0;
    for (;;) {
        tpl_str rest = tpl_str_strip((tpl_str){s.p + i, s.len - i}, NULL, true, false);
        i = (size_t)(rest.p - s.p);
        if (i >= s.len) break;
        if (maxsplit == 0) {
            tpl_str last = tpl_str_strip(rest, NULL, false, true);
            tpl_list_push(S->c, out.l, tpl_strv(last));
            break;
        }
        size_t j = i;
        while (j < s.len) {
            uint32_t cp;
            size_t k = tpl_utf8_decode(s.p + j, s.len - j, &cp);
            if (tpl_py_isspace(cp)) break;
            j += k;
        }
        tpl_list_push(S->c, out.l, tpl_strv((tpl_str){s.p + i, j - i}));
        i = j;
        maxsplit--;
    }
    return out;
}

static bool affix_match(tpl_str s, tpl_str affix, bool at_end) {
    if (affix.len > s.len) return false;
    return !memcmp(at_end ? s.p + s.len - affix.len : s.p, affix.p, affix.len);
}

static tpl_value str_affix(tpl_state *S, tpl_value self, const tpl_args *a, bool at_end) {
    tpl_value x = tpl_arg(a, 0, NULL, tpl_none());
    if (x.type == TPL_LIST && x.l->is_tuple) {
        for (size_t i = 0; i < x.l->n; i++)
            if (affix_match(self.s, need_str(S, a, x.l->v[i], "tuple item"), at_end)) return tpl_bool(true);
        return tpl_bool(false);
    }
    return tpl_bool(affix_match(self.s, need_str(S, a, x, at_end ? "endswith argument" : "startswith argument"), at_end));
}

static tpl_value m_startswith(tpl_state *S, tpl_value self, const tpl_args *a) { return str_affix(S, self, a, false); }
static tpl_value m_endswith(tpl_state *S, tpl_value self, const tpl_args *a) { return str_affix(S, self, a, true); }

static tpl_value strip_method(tpl_state *S, tpl_value self, const tpl_args *a, bool left, bool right) {
    tpl_value chars = tpl_arg(a, 0, "chars", tpl_none());
    tpl_str cs;
    if (chars.type != TPL_NONE) cs = need_str(S, a, chars, "strip argument");
    return tpl_strv(tpl_str_strip(self.s, chars.type == TPL_NONE ? NULL : &cs, left, right));
}
static tpl_value m_strip(tpl_state *S, tpl_value self, const tpl_args *a) { return strip_method(S, self, a, true, true); }
static tpl_value m_lstrip(tpl_state *S, tpl_value self, const tpl_args *a) { return strip_method(S, self, a, true, false); }
static tpl_value m_rstrip(tpl_state *S, tpl_value self, const tpl_args *a) { return strip_method(S, self, a, false, true); }

static tpl_value m_split(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_value sep = tpl_arg(a, 0, "sep", tpl_none()), max = tpl_arg(a, 1, "maxsplit", tpl_int(-1));
    tpl_str s;
    if (sep.type != TPL_NONE) {
        s = need_str(S, a, sep, "separator");
        if (!s.len) tpl_fail(S->c, a->pos, "empty separator");
    }
    return str_split(S, self.s, sep.type == TPL_NONE ? NULL : &s, max.type == TPL_INT ? max.i : -1);
}

static tpl_value m_splitlines(tpl_state *S, tpl_value self, const tpl_args *a) {
    return (tpl_value){.type = TPL_LIST, .l = tpl_str_splitlines(S, self.s)};
}

static tpl_value m_upper(tpl_state *S, tpl_value self, const tpl_args *a) { return tpl_strv(tpl_str_case(S, self.s, 'u')); }
static tpl_value m_lower(tpl_state *S, tpl_value self, const tpl_args *a) { return tpl_strv(tpl_str_case(S, self.s, 'l')); }
static tpl_value m_title(tpl_state *S, tpl_value self, const tpl_args *a) { return tpl_strv(tpl_str_case(S, self.s, 't')); }
static tpl_value m_capitalize(tpl_state *S, tpl_value self, const tpl_args *a) { return tpl_strv(tpl_str_case(S, self.s, 'c')); }
static tpl_value m_swapcase(tpl_state *S, tpl_value self, const tpl_args *a) { return tpl_strv(tpl_str_case(S, self.s, 's')); }

static tpl_value m_replace(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_str old = need_str(S, a, tpl_arg(a, 0, NULL, tpl_none()), "replace argument");
    tpl_str rep = need_str(S, a, tpl_arg(a, 1, NULL, tpl_none()), "replace argument");
    tpl_value count = tpl_arg(a, 2, "count", tpl_int(-1));
    return tpl_strv(tpl_str_replace(S, self.s, old, rep, count.type == TPL_INT ? count.i : -1));
}

static tpl_value m_join(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_list *items = tpl_iter(S, a->pos, tpl_arg(a, 0, NULL, tpl_none()));
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    for (size_t i = 0; i < items->n; i++) {
        if (i) tpl_sb_put(&b, self.s.p, self.s.len);
        tpl_str s = need_str(S, a, items->v[i], "join item");
        tpl_sb_put(&b, s.p, s.len);
    }
    return tpl_strv(tpl_sb_str(&b));
}

/* Byte offset of the first (or last) occurrence of sub, or -1. */
static long str_find(tpl_str s, tpl_str sub, bool last) {
    long found = -1;
    for (size_t i = 0; i + sub.len <= s.len; i++)
        if (!memcmp(s.p + i, sub.p, sub.len)) {
            found = (long)i;
            if (!last) break;
        }
    return found;
}

static tpl_value find_method(tpl_state *S, tpl_value self, const tpl_args *a, bool last) {
    tpl_str sub = need_str(S, a, tpl_arg(a, 0, NULL, tpl_none()), "find argument");
    long at = str_find(self.s, sub, last);
    return tpl_int(at < 0 ? -1 : (int64_t)tpl_utf8_count((tpl_str){self.s.p, (size_t)at}));
}
static tpl_value m_find(tpl_state *S, tpl_value self, const tpl_args *a) { return find_method(S, self, a, false); }
static tpl_value m_rfind(tpl_state *S, tpl_value self, const tpl_args *a) { return find_method(S, self, a, true); }

static tpl_value m_str_count(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_str sub = need_str(S, a, tpl_arg(a, 0, NULL, tpl_none()), "count argument");
    if (!sub.len) return tpl_int((int64_t)tpl_utf8_count(self.s) + 1);
    int64_t n = 0;
    for (size_t i = 0; i + sub.len <= self.s.len;) {
        if (!memcmp(self.s.p + i, sub.p, sub.len)) {
            n++;
            i += sub.len;
        } else {
            i++;
        }
    }
    return tpl_int(n);
}

/* mode: 'd' isdigit, 'a' isalpha, 'n' isalnum, 's' isspace, 'l' islower, 'u' isupper. */
static tpl_value str_is(tpl_value self, int mode) {
    if (!self.s.len) return tpl_bool(false);
    bool any_cased = false;
    for (size_t i = 0; i < self.s.len;) {
        uint32_t cp;
        i += tpl_utf8_decode(self.s.p + i, self.s.len - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO, digit = c == UTF8PROC_CATEGORY_ND;
        switch (mode) {
        case 'd': if (!digit) return tpl_bool(false); break;
        case 'a': if (!alpha) return tpl_bool(false); break;
        case 'n': if (!alpha && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return tpl_bool(false); break;
        case 's': if (!tpl_py_isspace(cp)) return tpl_bool(false); break;
        case 'l':
            if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) return tpl_bool(false);
            any_cased = any_cased || c == UTF8PROC_CATEGORY_LL;
            break;
        default:
            if (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) return tpl_bool(false);
            any_cased = any_cased || c == UTF8PROC_CATEGORY_LU;
        }
    }
    return tpl_bool(mode == 'l' || mode == 'u' ? any_cased : true);
}
static tpl_value m_isdigit(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 'd'); }
static tpl_value m_isalpha(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 'a'); }
static tpl_value m_isalnum(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 'n'); }
static tpl_value m_isspace(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 's'); }
static tpl_value m_islower(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 'l'); }
static tpl_value m_isupper(tpl_state *S, tpl_value self, const tpl_args *a) { return str_is(self, 'u'); }

/* str.format with "{}", "{0}", "{name}" fields, "!r"/"!s" conversions and "{{" "}}" escapes; format specs are not
 * supported. */
static tpl_value m_format(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_sb b;
    tpl_sb_init(&b, S->c);
    tpl_str f = self.s;
    size_t auto_index = 0;
    for (size_t i = 0; i < f.len; i++) {
        char ch = f.p[i];
        if ((ch == '{' || ch == '}') && i + 1 < f.len && f.p[i + 1] == ch) {
            tpl_sb_putc(&b, ch);
            i++;
            continue;
        }
        if (ch == '}') tpl_fail(S->c, a->pos, "single '}' encountered in format string");
        if (ch != '{') {
            tpl_sb_putc(&b, ch);
            continue;
        }
        const char *end = memchr(f.p + i, '}', f.len - i);
        if (!end) tpl_fail(S->c, a->pos, "single '{' encountered in format string");
        tpl_str field = {f.p + i + 1, (size_t)(end - f.p) - i - 1};
        char conv = 's';
        const char *bang = memchr(field.p, '!', field.len);
        if (memchr(field.p, ':', field.len)) tpl_fail(S->c, a->pos, "format specs in str.format are not supported");
        if (bang) {
            conv = bang + 1 < field.p + field.len ? bang[1] : 's';
            field.len = (size_t)(bang - field.p);
        }
        tpl_value v;
        if (!field.len) {
            v = tpl_arg(a, auto_index++, NULL, tpl_undef(S->c, "format index out of range"));
        } else if (field.p[0] >= '0' && field.p[0] <= '9') {
            v = tpl_arg(a, (size_t)strtoul(field.p, NULL, 10), NULL, tpl_undef(S->c, "format index out of range"));
        } else {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)field.len, field.p);
            v = tpl_arg(a, SIZE_MAX, name, tpl_undef(S->c, "format key '%s' missing", name));
        }
        if (v.type == TPL_UNDEF) tpl_fail_undefined(S->c, a->pos, v);
        if (conv == 'r') tpl_write_repr(&b, v);
        else tpl_write_str(&b, v);
        i = (size_t)(end - f.p);
    }
    return tpl_strv(tpl_sb_str(&b));
}

static tpl_value dict_view(tpl_state *S, tpl_dict *d, int what) {
    tpl_value out = tpl_list_new(S->c, d->n);
    out.l->view = what == 'k' ? TPL_DICT_KEYS : what == 'v' ? TPL_DICT_VALUES : TPL_DICT_ITEMS;
    for (size_t i = 0; i < d->n; i++) {
        if (what == 'k') {
            tpl_list_push(S->c, out.l, d->keys[i]);
        } else if (what == 'v') {
            tpl_list_push(S->c, out.l, d->vals[i]);
        } else {
            tpl_value pair = tpl_list_new(S->c, 2);
            pair.l->is_tuple = true;
            tpl_list_push(S->c, pair.l, d->keys[i]);
            tpl_list_push(S->c, pair.l, d->vals[i]);
            tpl_list_push(S->c, out.l, pair);
        }
    }
    return out;
}

tpl_value tpl_dict_items(tpl_state *S, tpl_dict *d) { return dict_view(S, d, 'i'); }
static tpl_value m_items(tpl_state *S, tpl_value self, const tpl_args *a) { return dict_view(S, self.d, 'i'); }
static tpl_value m_keys(tpl_state *S, tpl_value self, const tpl_args *a) { return dict_view(S, self.d, 'k'); }
static tpl_value m_values(tpl_state *S, tpl_value self, const tpl_args *a) { return dict_view(S, self.d, 'v'); }

static tpl_value m_get(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_value *v = tpl_dict_find(self.d, tpl_arg(a, 0, NULL, tpl_none()));
    return v ? *v : tpl_arg(a, 1, NULL, tpl_none());
}

static tpl_value m_list_count(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_value x = tpl_arg(a, 0, NULL, tpl_none());
    int64_t n = 0;
    for (size_t i = 0; i < self.l->n; i++) n += tpl_equal(self.l->v[i], x);
    return tpl_int(n);
}

static tpl_value m_list_index(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_value x = tpl_arg(a, 0, NULL, tpl_none());
    for (size_t i = 0; i < self.l->n; i++)
        if (tpl_equal(self.l->v[i], x)) return tpl_int((int64_t)i);
    tpl_fail(S->c, a->pos, "value is not in list");
}

typedef struct method {
    const char *name;
    tpl_native fn;
} method;

static const method STR_METHODS[] = {
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"strip", m_strip},       {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},         {"split", m_split},       {"splitlines", m_splitlines}, {"upper", m_upper},
    {"lower", m_lower},           {"title", m_title},       {"capitalize", m_capitalize}, {"swapcase", m_swapcase},
    {"replace", m_replace},       {"join", m_join},         {"find", m_find},         {"rfind", m_rfind},
    {"count", m_str_count},       {"format", m_format},     {"isdigit", m_isdigit},   {"isalpha", m_isalpha},
    {"isalnum", m_isalnum},       {"isspace", m_isspace},   {"islower", m_islower},   {"isupper", m_isupper},
    {NULL, NULL},
};
static const method DICT_METHODS[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get}, {NULL, NULL},
};
static const method LIST_METHODS[] = {{"count", m_list_count}, {"index", m_list_index}, {NULL, NULL}};

tpl_value tpl_method(tpl_state *S, tpl_value obj, tpl_str name) {
    const method *table = obj.type == TPL_STR ? STR_METHODS
                          : obj.type == TPL_DICT && !obj.d->is_namespace ? DICT_METHODS
                          : obj.type == TPL_LIST && !obj.l->view ? LIST_METHODS : NULL;
    for (const method *m = table; m && m->name; m++)
        if (tpl_str_eq(name, m->name)) return tpl_native_func(S, m->name, m->fn, obj);
    return (tpl_value){.type = TPL_UNDEF, .s = {"", 0}};
}

/* ---- globals ---- */

static tpl_value g_range(tpl_state *S, tpl_value self, const tpl_args *a) {
    int64_t p[3] = {0, 0, 1};
    if (a->n < 1 || a->n > 3) tpl_fail(S->c, a->pos, "range expected 1 to 3 arguments, got %zu", a->n);
    for (size_t i = 0; i < a->n; i++) {
        if (a->v[i].type != TPL_INT && a->v[i].type != TPL_BOOL)
            tpl_fail(S->c, a->pos, "'%s' object cannot be interpreted as an integer", tpl_type_name(a->v[i]));
        p[a->n == 1 ? 1 : i] = a->v[i].type == TPL_BOOL ? a->v[i].b : a->v[i].i;
    }
    if (p[2] == 0) tpl_fail(S->c, a->pos, "range() arg 3 must not be zero");
    tpl_value out = tpl_list_new(S->c, 0);
    for (int64_t i = p[0]; p[2] > 0 ? i < p[1] : i > p[1]; i += p[2]) {
        if (out.l->n >= 1000000) tpl_fail(S->c, a->pos, "range too large");
        tpl_list_push(S->c, out.l, tpl_int(i));
    }
    return out;
}

static tpl_value kwargs_dict(tpl_state *S, const tpl_args *a, bool is_namespace) {
    tpl_value d = tpl_dict_new(S->c);
    d.d->is_namespace = is_namespace;
    for (size_t i = 0; i < a->n; i++) {
        if (a->v[i].type != TPL_DICT) tpl_fail(S->c, a->pos, "expected a mapping as positional argument");
        for (size_t k = 0; k < a->v[i].d->n; k++) tpl_dict_set(S->c, d.d, a->v[i].d->keys[k], a->v[i].d->vals[k]);
    }
    for (size_t i = 0; i < a->n_kw; i++) tpl_dict_set(S->c, d.d, tpl_strv(a->kw_names[i]), a->kw[i]);
    return d;
}

static tpl_value g_namespace(tpl_state *S, tpl_value self, const tpl_args *a) { return kwargs_dict(S, a, true); }
static tpl_value g_dict(tpl_state *S, tpl_value self, const tpl_args *a) { return kwargs_dict(S, a, false); }

static tpl_value g_raise_exception(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_str msg = tpl_to_str(S, tpl_arg(a, 0, NULL, tpl_strv((tpl_str){"", 0})));
    tpl_fail(S->c, a->pos, "%.*s", (int)msg.len, msg.p);
}

static tpl_value g_strftime_now(tpl_state *S, tpl_value self, const tpl_args *a) {
    tpl_str fmt = need_str(S, a, tpl_arg(a, 0, NULL, tpl_none()), "strftime format");
    char cfmt[256], out[512];
    if (fmt.len >= sizeof cfmt) tpl_fail(S->c, a->pos, "strftime format too long");
    memcpy(cfmt, fmt.p, fmt.len);
    cfmt[fmt.len] = '\0';
    time_t now = S->now ? (time_t)S->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t n = strftime(out, sizeof out, cfmt, &tm);
    return tpl_cstr(S->c, out, n);
}

static const method GLOBALS[] = {
    {"range", g_range}, {"namespace", g_namespace}, {"dict", g_dict},
    {"raise_exception", g_raise_exception}, {"strftime_now", g_strftime_now}, {NULL, NULL},
};

tpl_value tpl_builtin_global(tpl_state *S, tpl_str name) {
    for (const method *m = GLOBALS; m->name; m++)
        if (tpl_str_eq(name, m->name)) return tpl_native_func(S, m->name, m->fn, tpl_none());
    return (tpl_value){.type = TPL_UNDEF, .s = {"", 0}};
}
