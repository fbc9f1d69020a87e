"""kiln's chat-template renderer against real Jinja2, byte for byte, rendering the way transformers'
apply_chat_template does: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls,
HF's tojson, raise_exception and strftime_now, and tools/documents passed as None."""
import copy
import functools
import json
import os
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

SOURCE = Path(os.environ.get("KILN_SOURCE_DIR", Path(__file__).parents[2]))
SHARED = Path(os.environ.get("KILN_SHARED_DIR", SOURCE.parent / "shared"))
RENDER = os.environ.get("KILN_TEMPLATE_RENDER", str(SOURCE / "build" / "tests" / "template" / "template_render"))
NOW = 1721990400  # 2024-07-26 10:40 UTC: strftime_now is pinned so both sides print the same date
os.environ["TZ"] = "UTC"

TEMPLATES = sorted((SHARED / "templates").glob("*.jinja")) + sorted((SOURCE / "tests" / "template" / "templates").glob("*.jinja"))


class TemplateError(Exception):
    pass


def jinja_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = jinja_env()


def sysmsg(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


ODD = 'Quotes \' and " and \\ backslash, {{ braces }} {% tags %}, tabs\tand\nnewlines,\r\n unicode: héllo 世界 🙂, <|im_end|>'
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user_only": {"messages": [user("Hello!")]},
    "system_user": {"messages": [sysmsg("You are a helpful assistant."), user("What is 2+2?")]},
    "multi_turn": {
        "messages": [
            sysmsg("Answer briefly."),
            user("Hi"),
            assistant("Hello! How can I help?"),
            user("Tell me a joke."),
            assistant("Why did the chicken cross the road?"),
            user("Why?"),
        ]
    },
    "multi_turn_no_system": {"messages": [user("one"), assistant("two"), user("three")]},
    "odd_characters": {"messages": [sysmsg("  padded system  \n"), user(ODD), assistant(" " + ODD + " "), user("\n\nend\n")]},
    "empty_content": {"messages": [user("")]},
    "ends_with_assistant": {"messages": [user("Hi"), assistant("Hello")]},
    "not_alternating": {"messages": [user("a"), user("b")]},
    "with_tools": {
        "messages": [sysmsg("Use tools."), user("Weather in Paris?")],
        "tools": [WEATHER_TOOL],
    },
    "tool_call_round_trip": {
        "messages": [
            user("Weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call12345",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call12345", "content": '{"temp": 21}'},
            assistant("It is 21 degrees."),
            user("Thanks"),
        ],
        "tools": [WEATHER_TOOL],
    },
    "thinking": {
        "messages": [
            user("Think first."),
            assistant("<think>\nLet me see.\n</think>\n\nThe answer is 4."),
            user("And again?"),
            {"role": "assistant", "content": "Still 4.", "reasoning_content": "Same sum."},
        ]
    },
    "content_parts": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this."}]}],
    },
    "images": {
        "messages": [
            sysmsg("You see images."),
            {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "What is it?"}]},
            assistant("A cat."),
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "b.png"}}, {"type": "text", "text": "And?"}]},
        ],
        "add_vision_id": True,
    },
}


@functools.lru_cache(maxsize=64)
def compiled(source):
    return ENV.from_string(source)


def jinja_render(source, variables):
    """(rendered, None) or (None, the raise_exception message or "" for any other Jinja failure)."""
    try:  # a copy: some Jinja failures mutate their input first (indent does `s += "\n"` on lists)
        return compiled(source).render(**copy.deepcopy(variables)), None
    except TemplateError as e:
        return None, str(e)
    except Exception:  # noqa: BLE001 - any Jinja failure must be a kiln failure too
        return None, ""


def kiln_render(source_path, variables):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump({**variables, "now": NOW}, f, ensure_ascii=False)
        path = f.name
    try:
        r = subprocess.run([RENDER, str(source_path), path], capture_output=True)
    finally:
        os.unlink(path)
    if r.returncode not in (0, 1):
        pytest.fail(f"renderer crashed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    return r.returncode == 0, r.stdout.decode() if r.returncode == 0 else r.stderr.decode()


def kiln_render_many(cases):
    """[(source, variables)] -> [(ok, output or error)], all rendered by one process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump([{"template": s, "vars": {**v, "now": NOW}} for s, v in cases], f, ensure_ascii=False)
        path = f.name
    try:
        r = subprocess.run([RENDER, "--batch", path], capture_output=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        pytest.fail(f"renderer failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    results = json.loads(r.stdout)
    assert len(results) == len(cases)
    return [(x["ok"], x["out"]) for x in results]


def differences(cases):
    """Renders [(label, source, variables)] with Jinja2 and with kiln: the cases where they disagree, and how many
    rendered. Agreeing means equal bytes, or both failing with the template's own raise_exception message."""
    results = kiln_render_many([(source, variables) for _, source, variables in cases])
    mismatches, rendered = [], 0
    for (label, source, variables), (ok, got) in zip(cases, results):
        want, raised = jinja_render(source, variables)
        rendered += raised is None
        if raised is None and not ok:
            mismatches.append(f"{label}: kiln failed: {got}")
        elif raised is None and got != want:
            mismatches.append(f"{label}:\n  jinja: {want!r}\n  kiln:  {got!r}")
        elif raised is not None and ok:
            mismatches.append(f"{label}: jinja failed ({raised!r}) but kiln rendered {got!r}")
        elif raised and raised not in got:
            mismatches.append(f"{label}: kiln's error {got!r} lacks the template's message {raised!r}")
    return mismatches, rendered


def variables_for(conversation, add_generation_prompt):
    v = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": add_generation_prompt, "tools": None, "documents": None}
    v.update(conversation)
    return v


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_matches_jinja(template):
    source = template.read_text(encoding="utf-8")
    cases = [(f"{name} add_generation_prompt={gen}", source, variables_for(conversation, gen))
             for name, conversation in CONVERSATIONS.items() for gen in (True, False)]
    mismatches, rendered = differences(cases)
    assert not mismatches, "\n".join(mismatches)
    assert rendered >= 4  # some templates need tools, some refuse system messages


def test_templates_present():
    names = {p.stem for p in TEMPLATES}
    assert len(names) >= 15, names


def test_syntax_error_names_line():
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
        path = f.name
    try:
        ok, err = kiln_render(path, variables_for(CONVERSATIONS["user_only"], True))
    finally:
        os.unlink(path)
    assert not ok and "line 2" in err, err


def test_raise_exception_reported():
    gemma = SHARED / "templates" / "google-gemma-2-2b-it.jinja"
    ok, err = kiln_render(gemma, variables_for(CONVERSATIONS["not_alternating"], True))
    assert not ok and "Conversation roles must alternate user/assistant/user/assistant/..." in err, err


def random_whitespace_template(rng, depth=0):
    """Text with spaces, tabs, newlines and Unicode whitespace around tags with random '-'/'+' markers."""
    texts = ["", " ", "  ", "\t", "\n", "\n\n", " \n ", "a", " b ", "\n  c\n", "x\n\t", "\u3000", "\xa0z", "\r\n", "d\r", "\n \n"]

    def sign(plus=True):
        return rng.choice(["", "", "-", "+" if plus else ""])

    def block(body):
        return "{%" + sign() + " " + body + " " + sign() + "%}"

    out = []
    for _ in range(rng.randint(1, 5)):
        out.append(rng.choice(texts))
        r = rng.random()
        if r < 0.25:
            out.append("{{" + sign(False) + " " + rng.choice(["x", "'q'", "' s '", "'\\n'"]) + " " + sign(False) + "}}")
        elif r < 0.35:
            out.append("{#" + sign() + " comment " + sign() + "#}")
        elif r < 0.5 and depth < 3:
            out.append(block("if " + rng.choice(["true", "false"])) + random_whitespace_template(rng, depth + 1))
            if rng.random() < 0.5:
                out.append(block("else") + random_whitespace_template(rng, depth + 1))
            out.append(block("endif"))
        elif r < 0.65 and depth < 3:
            out.append(block("for i in [1, 2]") + random_whitespace_template(rng, depth + 1) + block("endfor"))
        elif r < 0.72:
            out.append(block("set y = 1"))
        elif r < 0.78:
            out.append(block("raw") + rng.choice(texts) + "{{ kept }}" + rng.choice(texts) + block("endraw"))
        out.append(rng.choice(texts))
    return "".join(out)


def test_whitespace_control_random():
    import random

    rng = random.Random(1234)
    variables = {"x": "X", "messages": []}
    cases = []
    for i in range(300):
        source = random_whitespace_template(rng) + rng.choice(["", "\n", "\n\n", " \n"])
        cases.append((f"case {i} {source!r}", source, variables))
    mismatches, rendered = differences(cases)
    assert not mismatches, "\n".join(mismatches[:5])
    assert rendered > 200  # "{% raw +%}" is no raw tag, so those fail in both


def random_statement_template(rng, depth=0):
    """Nested for/if/set/macro/call/break/continue statements: scoping, loop variables and for-else semantics."""
    exprs = ["a", "b", "x", "1", "'s'", "a + 1", "loop.index", "loop.first", "loop.last", "loop.length",
             "loop.revindex0", "loop.previtem", "loop.nextitem", "loop.cycle(1, 2)", "ns.v", "ns.v ~ a", "m.role",
             "messages|length", "i", "k", "v", "mac(1)", "mac(b=2, a=3)"]
    if depth > 3:
        return "{{ " + rng.choice(exprs) + " }}"
    parts = []
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.25:
            parts.append("{{ " + rng.choice(exprs) + " }}")
        elif r < 0.35:
            parts.append("{% set " + rng.choice("abmx") + " = " + rng.choice(exprs) + " %}")
        elif r < 0.42:
            parts.append("{% set ns.v = " + rng.choice(exprs) + " %}")
        elif r < 0.55:
            iterable = rng.choice(["[1, 2, 3]", "messages", "range(2)", "[]", "'ab'"]) + rng.choice(["", " if i"])
            else_part = rng.choice(["", "{% else %}E"])
            parts.append("{% for i in " + iterable + " %}" + random_statement_template(rng, depth + 1) + else_part + "{% endfor %}")
        elif r < 0.62:
            pairs = rng.choice(["{'p': 1, 'q': 2}.items()", "[[1, 2], [3, 4]]", "d|items"])
            parts.append("{% for k, v in " + pairs + " %}" + random_statement_template(rng, depth + 1) + "{% endfor %}")
        elif r < 0.72:
            tail = rng.choice(["", "{% elif b %}B", "{% else %}" + random_statement_template(rng, depth + 1)])
            parts.append("{% if " + rng.choice(exprs) + " %}" + random_statement_template(rng, depth + 1) + tail + "{% endif %}")
        elif r < 0.78:
            parts.append(rng.choice(["{% break %}", "{% continue %}"]) if "{% for" in "".join(parts) or depth else ".")
        elif r < 0.85:
            parts.append("{% macro mac(a, b=5) %}[" + random_statement_template(rng, depth + 1) + "{{ varargs }}]{% endmacro %}")
        elif r < 0.9:
            parts.append("{% call mac(7) %}C" + random_statement_template(rng, depth + 1) + "{% endcall %}")
        elif r < 0.94:
            parts.append("{% set x %}" + random_statement_template(rng, depth + 1) + "{% endset %}")
        elif r < 0.97:
            parts.append("{% with a = " + rng.choice(exprs) + " %}" + random_statement_template(rng, depth + 1) + "{% endwith %}")
        else:
            parts.append("{% filter upper|replace('S', '$') %}" + random_statement_template(rng, depth + 1) + "{% endfilter %}")
    return " ".join(parts)


def test_statements_random():
    import random

    rng = random.Random(99)
    variables = {"messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}], "d": {"z": 9}}
    cases = []
    for i in range(300):
        source = "{% set ns = namespace(v=0) %}{% set a = 10 %}" + random_statement_template(rng) + " {{ a }} {{ b }} {{ x }} {{ ns.v }}"
        cases.append((f"case {i} {source}", source, variables))
    mismatches, rendered = differences(cases)
    assert not mismatches, "\n".join(mismatches[:5])
    assert rendered > 60  # the rest must fail in both (break outside a loop, bad macro calls, ...)


EXPRESSION_VARIABLES = {
    "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}],
    "zero": 0, "one": 1, "neg": -3, "seven": 7, "half": 2.5, "big": 1e3, "tenth": 0.1,
    "word": "abc", "title": "Hello World", "padded": " x y ", "uni": "é世🙂", "empty": "", "csv": "a,b,,c",
    "quote": "it's \"q\"", "fmt": "%s-%s", "nl": "\n", "nums": [1, 2, 3], "letters": ["b", "a", "c"], "nothing": [],
    "mixed": [1, "a", None], "dct": {"a": 1, "b": [2, 3]}, "nodict": {}, "pair": [1, 2], "none_": None, "yes": True,
    "no": False,
}


def random_expression(rng, depth=0):
    """Operators, filters, tests, methods and subscripts over context variables (no constant-only subexpressions:
    Jinja folds those at compile time, where some failures turn into Undefined)."""
    names = [n for n in EXPRESSION_VARIABLES if n != "messages"] + ["messages", "messages[0]", "undefined_name"]
    binops = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
    filters = ["trim", "length", "tojson", "tojson(indent=2)", "upper", "lower", "first", "last", "join", "join(', ')",
               "default('D')", "string", "int", "float", "list", "capitalize", "title", "escape", "indent(2)",
               "sort", "abs", "round", "round(1, 'floor')", "sum", "min", "max", "wordcount", "replace('a', 'X')",
               "dictsort", "center(9)", "tojson(sort_keys=true)", "tojson(separators=(',', ':'))", "unique|list",
               "selectattr('role', 'equalto', 'user')|list", "map(attribute='role')|list", "reject('none')|list",
               "select('string')|list", "items|list", "reverse|list", "count", "safe", "format(1, 2)"]
    tests = ["defined", "undefined", "none", "string", "number", "mapping", "iterable", "sequence", "boolean", "true",
             "false", "integer", "float", "odd", "even", "equalto 1", "in nums", "lower", "upper", "divisibleby 2",
             "sameas none", "callable"]
    methods = [".upper()", ".lower()", ".strip()", ".split(',')", ".split()", ".title()", ".startswith('a')",
               ".endswith(('c', 'd'))", ".items()|list", ".keys()|list", ".values()|list", ".get('a')", ".get('z', 5)",
               ".replace('b', 'Q')", ".lstrip('a')", ".rstrip()", ".count('a')", ".find('c')", ".splitlines()",
               ".format(1, 2)", ".isdigit()", ".capitalize()", ".join(letters)", ".index(2)"]
    subscripts = ["[0]", "[-1]", "[1:]", "[:2]", "[::-1]", "[1:3:2]", "['a']", ".a", ".role"]
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(names)
    sub = random_expression(rng, depth + 1)
    if r < 0.5:
        return f"{sub} {rng.choice(binops)} {random_expression(rng, depth + 1)}"
    if r < 0.65:
        return f"({sub})|{rng.choice(filters)}"
    if r < 0.75:
        return f"({sub}) is {rng.choice(['', 'not '])}{rng.choice(tests)}"
    if r < 0.85:
        return f"({sub}){rng.choice(methods)}"
    if r < 0.92:
        return f"({sub}){rng.choice(subscripts)}"
    if r < 0.96:
        return f"{sub} if {random_expression(rng, depth + 1)} else {random_expression(rng, depth + 1)}"
    return f"not {sub}"


def test_expressions_random():
    import random

    rng = random.Random(7)
    cases = []
    for i in range(600):
        source = "{{ " + random_expression(rng) + " }}"
        cases.append((f"case {i} {source}", source, EXPRESSION_VARIABLES))
    mismatches, rendered = differences(cases)
    # printed generators and Markup reprs carry Python object details no renderer can match
    mismatches = [m for m in mismatches if "<generator object" not in m and "Markup(" not in m and "iterator object" not in m]
    assert not mismatches, "\n".join(mismatches[:8])
    assert rendered > 250


def test_float_spelling_random():
    """Python's shortest repr, json.dumps and round() on random doubles (bit patterns and decimals)."""
    import math
    import random
    import struct

    rng = random.Random(5)
    values = [0.0, -0.0, 1.0, 1e16, 1e15, 1e22, 0.0001, 1e-05, 5e-324, 1.7976931348623157e308, 0.1, 2 / 3, 2.5, -2.5, 23.585]
    for _ in range(150):
        values.append(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
        values.append(rng.uniform(-1e6, 1e6))
        values.append(round(rng.uniform(-100, 100), rng.randint(0, 6)))
    source = "{{ x }}|{{ x|tojson }}|{{ [x] }}|{{ x * 3 }}|{{ x|round(2) }}|{{ x|round }}|{{ x|round(1, 'ceil') }}"
    cases = [(f"{v!r}", source + ("|{{ x|int }}" if abs(v) < 9e18 else ""), {"x": v, "messages": []})
             for v in values if math.isfinite(v)]
    mismatches, rendered = differences(cases)
    assert not mismatches, "\n".join(mismatches[:5])
    assert rendered > 400


def test_unicode_strings_random():
    """Case mapping (ß -> SS, İ -> i̇, final sigma, titlecase digraphs), Unicode whitespace, code-point indexing."""
    import random

    rng = random.Random(3)
    pool = "aZ é世🙂ßǆİıŉΣσςﬁ \t\n\u3000\xa0\u2028-_(.,!'\"{}[]<>&Ωω1２٣ÀÉÎÕÜᾳΐ"
    values = ["ß straße", "ǆemal", "İstanbul", "ΣΑΣ σας", "ﬁne", "hello-world (x) [y] {z} <w>", "ΟΔΟΣ.", "aΣ'", "ΣΑΣ'S"]
    values += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    source = ("{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ s|capitalize }}|{{ s.title() }}|{{ s.swapcase() }}|"
              "{{ s|trim }}|{{ s.split() }}|{{ s|length }}|{{ s|reverse }}|{{ s[1:4] }}|{{ s|wordcount }}|{{ [s] }}|"
              "{{ s|tojson }}|{{ s.isalpha() }}|{{ s.islower() }}|{{ s.isupper() }}|{{ s.isspace() }}|{{ s|escape }}|"
              "{{ s.splitlines() }}|{{ s|center(20) }}|{{ s|indent(2, true) }}")
    mismatches, rendered = differences([(repr(v), source, {"s": v, "messages": []}) for v in values])
    assert not mismatches, "\n".join(mismatches[:5])
    assert rendered == len(values)
