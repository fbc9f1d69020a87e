"""`kiln template`: the default model's own template rendered as Jinja2 renders it, the ChatML fallback, errors."""
import json
import os
import struct
import subprocess

import pytest

from test_template_jinja import ENV

KILN = os.environ.get("KILN_BIN", "build/kiln")


def kiln(*args):
    return subprocess.run([KILN, "template", *args], capture_output=True)


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path):
    """The key/value section of a GGUF file (v2/v3), read without touching the tensors."""

    with open(path, "rb") as f:
        def unpack(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def string():
            return f.read(unpack("<Q")).decode("utf-8", errors="replace")

        def value(vtype):
            if vtype == 8:
                return string()
            if vtype == 9:
                elem, n = unpack("<I"), unpack("<Q")
                return [value(elem) for _ in range(n)]
            return unpack(SCALARS[vtype])

        assert f.read(4) == b"GGUF" and unpack("<I") in (2, 3)
        unpack("<Q")  # tensor count
        return {string(): value(unpack("<I")) for _ in range(unpack("<Q"))}


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_default_model_matches_jinja(default_model, tmp_path, generation_prompt):
    meta = gguf_metadata(default_model)
    tokens = meta["tokenizer.ggml.tokens"]
    messages = [
        {"role": "user", "content": "Hi, \"you\"!\n{{ not a tag }}"},
        {"role": "assistant", "content": "Hello 🙂"},
        {"role": "user", "content": "Bye"},
    ]
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages))
    want = ENV.from_string(meta["tokenizer.chat_template"]).render(
        messages=messages,
        add_generation_prompt=generation_prompt,
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
        tools=None,
        documents=None,
    )
    args = ["-m", default_model, "--messages", str(path)] + ([] if generation_prompt else ["--no-generation-prompt"])
    r = kiln(*args)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == want


def test_default_conversation(default_model):
    r = kiln("-m", default_model)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert out.endswith("<|im_start|>assistant\n")


def test_model_without_template_falls_back_to_chatml(shared_dir):
    r = kiln("-m", os.path.join(shared_dir, "vocab", "ggml-vocab-llama-spm.gguf"), "--no-generation-prompt")
    assert r.returncode == 0, r.stderr.decode()
    assert b"using ChatML" in r.stderr
    assert r.stdout.decode().endswith("Hello! What can you do?<|im_end|>\n")


def test_template_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content + }}\n{% endfor %}")
    r = kiln("--template", str(bad))
    assert r.returncode == 1
    assert "bad.jinja" in r.stderr.decode() and "line 2" in r.stderr.decode()


def test_raise_exception_message(tmp_path, shared_dir):
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}))
    r = kiln("--template", os.path.join(shared_dir, "templates", "google-gemma-2-2b-it.jinja"), "--messages", str(messages))
    assert r.returncode == 1
    assert "System role not supported" in r.stderr.decode()
