"""`kiln tokenize` on the reference vocabularies: ids on one line, --pieces, BOS per the model's flags."""
import os
import subprocess
from pathlib import Path

import pytest

KILN = os.environ.get("KILN_BIN", "build/kiln")
VOCAB = Path(os.environ.get("KILN_SHARED_DIR", Path(__file__).parents[3] / "shared")) / "vocab"
SEPARATOR = b"\n__ggml_vocab_test__\n"


def tokenize(model, text, *flags):
    r = subprocess.run([KILN, "tokenize", "-m", str(model), *flags], input=text, capture_output=True, check=True)
    return r.stdout.decode()


def cases(name):
    """(text, expected ids) pairs: .inp cases end with the separator line; .out has one line of ids per case."""
    texts = (VOCAB / f"ggml-vocab-{name}.gguf.inp").read_bytes().split(SEPARATOR)
    assert texts[-1] == b""
    lines = (VOCAB / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    return list(zip(texts[:-1], lines))


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2", "falcon", "starcoder", "deepseek-llm"])
def test_raw_ids_match_reference(name):
    # every 7th case keeps the test quick; the C test (test_tokenizer_vocab) checks all of them
    for text, line in cases(name)[::7]:
        out = tokenize(VOCAB / f"ggml-vocab-{name}.gguf", text, "--raw")
        assert out.endswith("\n") and "  " not in out
        assert out.split() == line.split(), text


def test_bos_follows_model_flag():
    spm = VOCAB / "ggml-vocab-llama-spm.gguf"
    assert tokenize(spm, b"Hello world").split() == ["1", "15043", "3186"]
    assert tokenize(spm, b"Hello world", "--raw").split() == ["15043", "3186"]
    gpt2 = VOCAB / "ggml-vocab-gpt-2.gguf"  # no add_bos_token in the file: gpt2 models add none
    assert tokenize(gpt2, b"Hello world").split() == ["15496", "995"]


def test_special_text_is_plain_with_raw():
    gpt2 = VOCAB / "ggml-vocab-gpt-2.gguf"
    assert tokenize(gpt2, b"a<|endoftext|>").split() == ["64", "50256"]
    assert "50256" not in tokenize(gpt2, b"a<|endoftext|>", "--raw").split()


def test_pieces():
    out = tokenize(VOCAB / "ggml-vocab-llama-spm.gguf", b"Hello world", "--raw", "--pieces")
    assert out == "15043\t\u2581Hello\n3186\t\u2581world\n"


def test_bad_usage():
    r = subprocess.run([KILN, "tokenize", "--bogus"], capture_output=True)
    assert r.returncode != 0 and b"unknown argument" in r.stderr
    r = subprocess.run([KILN, "tokenize", "-m", "/nonexistent.gguf"], input=b"x", capture_output=True)
    assert r.returncode != 0 and b"nonexistent" in r.stderr
