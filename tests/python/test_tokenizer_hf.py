"""kiln against HF tokenizers (the reference the GGUF vectors come from), on random text full of edge cases:
every pre-tokenizer's split, and whole encodings with the gpt-2 and starcoder vocabularies. Skipped without the
`tokenizers` package."""
import os
import random
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

KILN = os.environ.get("KILN_BIN", "build/kiln")
SPLIT = os.environ.get("KILN_TOK_SPLIT", "build/tests/tokenizer/tok_split")
VOCAB = Path(os.environ.get("KILN_SHARED_DIR", Path(__file__).parents[3] / "shared")) / "vocab"

# one name per table entry (src/tokenizer/pretok_table.c)
PRES = ["default", "llama3", "dbrx", "chatglm-bpe", "jais-2", "deepseek-llm", "deepseek-v3", "spark2_5", "youtu",
        "deepseek-coder", "falcon", "starcoder", "gpt-2", "qwen2", "qwen35", "poro-chat", "viking", "tekken",
        "chameleon", "gpt-4o", "granite-embed-multi-97m", "tiny_aya", "superbpe", "bailingmoe", "seed-coder",
        "ufakzeka", "afmoe", "laguna", "exaone-moe", "minicpm5"]

# whitespace kinds, contractions and case-folding traps, digits of several kinds, marks, punctuation and symbols,
# CJK/Hangul/Thai, emoji with modifiers and joiners, private use, unassigned and control characters
POOL = (list(" \n\t\r") * 6 + ["\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\x0b", "\x0c", "\u200b", "\u2009"]
        + list("abcXYZ'sStTmMdDlLreREve") * 3 + ["'", "ſ", "\u212a", "\u212b", "ǅ", "ʰ", "א", "é", "e\u0301", "ß"]
        + list("0123456789") * 2 + ["٣", "３", "²", "Ⅻ", "½"]
        + list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "。", "，", "、", "—", "“", "€", "©", "→", "﹏"]
        + ["中", "文", "龥", "ぁ", "カ", "한", "글", "ㄱ", "ㄅ", "ก", "ក", "က"]
        + ["😀", "👍🏽", "👨\u200d👩", "\U0001F300", "\ue000", "\u0378", "\x01", "\x7f", "Ω", "Ж", "Σ", "ς"]
        + ["<sentinel:12>", "IMGIMGABZ", "    ", "  "])


def random_texts(seed, n, max_len=40):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


@pytest.fixture(scope="module")
def splitter():
    p = subprocess.Popen([SPLIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line):
        p.stdin.write(line + "\n")
        p.stdin.flush()
        return p.stdout.readline().rstrip("\n")

    yield ask
    p.stdin.close()
    p.wait()


@pytest.mark.parametrize("pre", PRES)
def test_split_matches_hf(splitter, pre):
    regexes = [bytes.fromhex(h).decode() for h in splitter("?" + pre).split(",") if h]
    assert regexes
    hf = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    for text in random_texts(zlib.crc32(pre.encode()), 200):
        want = [piece for piece, _ in hf.pre_tokenize_str(text)]
        raw = text.encode()
        out = splitter(pre + "\t" + raw.hex())
        assert not out.startswith("ERR"), out
        spans = [tuple(map(int, s.split(":"))) for s in out.split(",") if s]
        got = [raw[a:a + n].decode() for a, n in spans]
        assert got == want, text


SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_string_arrays(path):
    """The string arrays of a GGUF file's metadata (a small reader: gguf.GGUFReader takes seconds on a vocab)."""
    data = Path(path).read_bytes()
    pos = 24  # magic, version, tensor count, kv count

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos]

    def value(vtype):
        if vtype == 8:
            return string()
        if vtype == 9:
            etype, n = take("I"), take("Q")
            return [value(etype) for _ in range(n)] if etype in (8, 9) else [take(SCALAR[etype]) for _ in range(n)]
        return take(SCALAR[vtype])

    out = {}
    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        key = string().decode()
        v = value(take("I"))
        if isinstance(v, list) and v and isinstance(v[0], bytes):
            out[key] = [x.decode() for x in v]
    return out


def hf_bpe(name, pre):
    arrays = gguf_string_arrays(VOCAB / f"ggml-vocab-{name}.gguf")
    tokens, merges = arrays["tokenizer.ggml.tokens"], arrays["tokenizer.ggml.merges"]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return tok


@pytest.mark.parametrize("name,pre", [
    ("gpt-2", lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
    ("starcoder", lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False)])),
])
def test_encoding_matches_hf(name, pre):
    hf = hf_bpe(name, pre())
    texts = [t.replace("<", "(") for t in random_texts(7, 8, 150)]  # no special-token text
    for text in texts:
        want = hf.encode(text, add_special_tokens=False).ids
        out = subprocess.run([KILN, "tokenize", "-m", str(VOCAB / f"ggml-vocab-{name}.gguf"), "--raw"],
                             input=text.encode(), capture_output=True, check=True).stdout.decode()
        assert [int(x) for x in out.split()] == want, text
