/* Unit tests of the template interpreter on small templates; the expected strings are what Jinja2 renders with
 * HF's environment (trim_blocks, lstrip_blocks). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"

static char *render_vars(const char *src, const char *vars_json, kiln_error *err) {
    kiln_template *t = NULL;
    char *out = NULL;
    if (kiln_template_parse(src, &t, err)) return NULL;
    json_error_t jerr;
    json_t *vars = vars_json ? json_loads(vars_json, 0, &jerr) : json_object();
    assert_non_null(vars);
    json_t *messages = json_object_get(vars, "messages");
    json_incref(messages);
    json_object_del(vars, "messages");
    kiln_chat_opts opts = {.add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>", .extra = vars};
    json_t *empty = json_array();
    int rc = kiln_template_render_json(t, messages ? messages : empty, &opts, &out, err);
    json_decref(empty);
    json_decref(messages);
    json_decref(vars);
    kiln_template_free(t);
    return rc ? NULL : out;
}

static void check_vars(const char *src, const char *vars, const char *expected) {
    kiln_error err = {{0}};
    char *out = render_vars(src, vars, &err);
    if (!out) fail_msg("render of %s failed: %s", src, err.msg);
    if (strcmp(out, expected)) fail_msg("template %s\n  got:      [%s]\n  expected: [%s]", src, out, expected);
    free(out);
}

static void check(const char *src, const char *expected) { check_vars(src, NULL, expected); }

static void check_error(const char *src, const char *vars, const char *needle) {
    kiln_error err = {{0}};
    char *out = render_vars(src, vars, &err);
    if (out) fail_msg("template %s rendered [%s], expected an error", src, out);
    if (!strstr(err.msg, needle)) fail_msg("error [%s] lacks [%s]", err.msg, needle);
}

static void test_whitespace_control(void **state) {
    (void)state;
    check("a\n{% if true %}\n  b\n{% endif %}\nc", "a\n  b\nc");
    check("a  {%- if true -%}  b  {%- endif %}", "ab");
    check("  {% if true %}x{% endif %}\n", "x");
    check("  {{ 'x' }}\n", "  x");
    check("a {#- comment -#} b", "ab");
    check("line\n  {# comment #}\nnext\n", "line\nnext");
    check("{% raw %}{{ not evaluated }}{% endraw %}", "{{ not evaluated }}");
    check("a\r\nb\n", "a\nb");
    check("x {%+ if true %}y{% endif %}", "x y");
}

static void test_expressions(void **state) {
    (void)state;
    check("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }}", "7 3 -4 2 64");
    check("{{ 10 / 4 }} {{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }}", "2.5 1.0 1e+20 0.30000000000000004 1e-05");
    check("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}", "a1None abab [1, 2]");
    check("{{ [1, 'a', none, true, {'k': \"it's\"}] }}", "[1, 'a', None, True, {'k': \"it's\"}]");
    check("{{ 'yes' if 1 < 2 else 'no' }}{{ 'x' if false }}", "yes");
    check("{{ 1 == 1.0 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }} {{ not none }}", "True True True True");
    check("{{ (1, 2) }} {{ (1,) }} {{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ [1, 2, 3][-1] }}", "(1, 2) (1,) cba él 3");
    check("{{ 'a' 'b' }}", "ab");
    check("{{ 0 < 20 < 10 }} {{ 0 < 5 < 10 }} {{ 1 == 1 == 1 }} {{ 'a' in 'abc' in 'xabcx' }}", "False True True True");
}

static void test_statements(void **state) {
    (void)state;
    check("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", "11,22,33");
    check("{% for x in [] %}a{% else %}empty{% endfor %}", "empty");
    check("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    check("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}", "1/2:2 2/2:4 ");
    check("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
          "02");
    check("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", "231");
    check("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "6");
    check("{% set a, b = 1, 2 %}{{ b }}{{ a }}", "21");
    check("{% set block %}in{{ 1 }}{% endset %}[{{ block }}]", "[in1]");
    check("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}{{ greet('bob') }} {{ greet('al', punct='?') }}",
          "hi bob! hi al?");
    check("{% if false %}a{% elif true %}b{% else %}c{% endif %}", "b");
    check("{% generation %}kept{% endgeneration %}", "kept");
    check("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}", "211");
    check("{% filter upper|replace('B', 'x') %}a{{ 'b' }}c{% endfilter %}", "AxC");
    check("{% for i in [1, 2] %}{% filter upper %}x{% break %}{% endfilter %}{% endfor %}", "");
    /* Jinja runs a for loop's else block unless an iteration reached the end of the body */
    check("{% for i in [1, 2] %}{{ i }}{% break %}{% else %}E{% endfor %}", "1E");
    check("{% for i in [1, 2] %}{{ i }}{% continue %}{% else %}E{% endfor %}", "12E");
    check("{% for i in [1, 2] %}{% set x %}{% break %}{% endset %}{{ i }}{% endfor %}", "");
    check("{% if [1]|select('even') %}generators are true{% endif %}", "generators are true");
    check("{% macro m() %}{{ varargs }}{{ kwargs }}{{ caller() }}{% endmacro %}{% call m(1, k=2) %}c{% endcall %}", "(1,){'k': 2}c");
}

static void test_filters_and_methods(void **state) {
    (void)state;
    check("{{ '  x  '|trim }}|{{ 'ab'|upper }}|{{ 'hello world'|title }}|{{ 'hELLo'|capitalize }}", "x|AB|Hello World|Hello");
    check("{{ [1, 2, 3]|join(', ') }}|{{ 'abc'|length }}|{{ [3, 1, 2]|sort|first }}|{{ [1, 2]|last }}", "1, 2, 3|3|1|2");
    check("{{ {'a': [1, 2.5, 'é\\n\"']}|tojson }}", "{\"a\": [1, 2.5, \"é\\n\\\"\"]}");
    check("{{ {'a': [1, {'b': 2}]}|tojson(indent=2) }}", "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}");
    check("{{ 'a\\nb\\n\\nc'|indent(2) }}", "a\n  b\n\n  c");
    check("{{ [{'r': 'u'}, {'r': 'a'}, {'r': 'u'}]|selectattr('r', 'equalto', 'u')|list|length }}", "2");
    check("{{ [{'r': 'u'}, {'r': 'a'}]|map(attribute='r')|join }}", "ua");
    check("{{ [{'a': 1}]|map('tojson', indent=1)|join }}", "{\n \"a\": 1\n}");
    check("{{ ['a', 'code', 'b']|reject('equalto', 'code')|join(',') }}", "a,b");
    check("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'x.y.z'.split('.', 1) }}", "['a', 'b', '', 'c'] ['a', 'b'] ['x', 'y.z']");
    check("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'xxaxx'.strip('x') }}", "True True a");
    check("{{ 'a{}b{x}'.format(1, x=2) }} {{ '3.7'|float }} {{ '12'|int }} {{ 'x'|int }} {{ 2.5|round }}", "a1b2 3.7 12 0 2.0");
    check("{{ {'a': 1}.get('b', 'none') }} {{ {'a': 1}.keys()|list }} {{ u|default('d') }} {{ ''|default('e', true) }}",
          "none ['a'] d e");
    check("{{ '<a href=\"x\">'|e }}", "&lt;a href=&#34;x&#34;&gt;");
    check("{{ {'b': 1, 'a': 2}|dictsort|first }} {{ [1, 2, 2, 3]|unique|list }}", "('a', 2) [1, 2, 3]");
}

static void test_tests(void **state) {
    (void)state;
    check("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }}",
          "False True True True True");
    check("{{ {} is mapping }} {{ [] is iterable }} {{ 'x' is sequence }} {{ true is boolean }} {{ 3 is odd }}",
          "True True True True True");
    check("{{ 1 is integer }} {{ 1.5 is float }} {{ 'a' is equalto 'a' }} {{ 6 is divisibleby 3 }} {{ x is not defined }}",
          "True True True True True");
}

static void test_undefined(void **state) {
    (void)state;
    check("[{{ missing }}]{{ missing|length }}{% for x in missing %}x{% endfor %}", "[]0");
    check("{{ {'a': 1}.b }}|{{ none.x }}|{{ [1][5] }}", "||");
    check_error("{{ missing.attr }}", NULL, "'missing' is undefined");
    check_error("{{ missing + 'a' }}", NULL, "'missing' is undefined");
    check_error("{{ -x|default(3) }}", NULL, "'x' is undefined");
}

static void test_chat_vars(void **state) {
    (void)state;
    const char *vars = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    check_vars("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% endfor %}"
               "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ tools }}",
               vars, "<s>user:hi></s>None");
}

static void test_errors(void **state) {
    (void)state;
    check_error("line one\n{% if x %}\n{% endfor %}", NULL, "template line 3");
    check_error("{{ 1 + }}", NULL, "line 1, column 8");
    check_error("{% for x in y %}", NULL, "expected 'else' or 'endfor'");
    check_error("a\nb {{ raise_exception('roles must alternate') }}", NULL, "line 2, column 6: roles must alternate");
    check_error("{{ 'unterminated }}", NULL, "unterminated string");
    check_error("{% bogus %}", NULL, "unknown tag 'bogus'");
    check_error("{{ x | nosuchfilter }}", NULL, "no filter named 'nosuchfilter'");
    check_error("{{ 1 / 0 }}", NULL, "division by zero");
    check_error("{% for i in range(100000000) %}{% endfor %}", NULL, "range too large");
    check_error("{% for i in [1] %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}", NULL, "'break' outside loop");
    check_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", NULL, "takes not more than 1 argument");
    check_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}", NULL, "takes no keyword argument 'b'");
    check_error("{{ [1, 2]|select('odd')|length }}", NULL, "has no len()");
}

/* Pathological templates fail cleanly instead of exhausting the stack. */
static char *repeat_between(const char *head, const char *unit, size_t n, const char *tail) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1);
    assert_non_null(s);
    memcpy(s, head, hl);
    for (size_t i = 0; i < n; i++) memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * n, tail, tl + 1);
    return s;
}

/* Pathological templates fail cleanly instead of exhausting the stack. */
static void test_deep_chains(void **state) {
    (void)state;
    const size_t n = 100000;
    char *src = repeat_between("{{ 1", "+1", n, " }}");
    check_error(src, NULL, "nested too deep");
    free(src);
    src = repeat_between("{{ x", ".a", n, " }}");
    check_error(src, "{\"x\": {}}", "nested too deep");
    free(src);
    src = repeat_between("{{ ", "-", n, "1 }}");
    check_error(src, NULL, "nesting too deep");
    free(src);
    src = repeat_between("", "{% if true %}", n, "");
    check_error(src, NULL, "nesting too deep");
    free(src);
}

static void test_simple_messages(void **state) {
    (void)state;
    kiln_template *t = NULL;
    kiln_error err = {{0}};
    assert_int_equal(kiln_template_parse(KILN_TEMPLATE_CHATML, &t, &err), 0);
    kiln_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    kiln_chat_opts opts = {.add_generation_prompt = true};
    char *out = NULL;
    assert_int_equal(kiln_template_render(t, msgs, 2, &opts, &out, &err), 0);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    kiln_template_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace_control), cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_statements),         cmocka_unit_test(test_filters_and_methods),
        cmocka_unit_test(test_tests),              cmocka_unit_test(test_undefined),
        cmocka_unit_test(test_chat_vars),          cmocka_unit_test(test_errors),
        cmocka_unit_test(test_simple_messages),    cmocka_unit_test(test_deep_chains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
