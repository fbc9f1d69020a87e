"""`kiln inspect` on the default model (checked against gguf.GGUFReader), the vocab files, and the broken-file
corpus (every case: exit 1 with one `error:` line naming the file)."""
import glob
import json
import os
import subprocess

import pytest

gguf = pytest.importorskip("gguf")


def inspect(kiln_bin, *args):
    return subprocess.run([kiln_bin, "inspect", *args], capture_output=True, text=True, errors="replace")


def test_text_on_default_model(kiln_bin, default_model):
    r = inspect(kiln_bin, default_model)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "architecture     llama" in out
    assert "block_count" in out and "attention.head_count_kv" in out
    assert "vocab size       49152" in out
    assert "chat template    yes" in out
    assert "token_embd.weight" in out and "q8_0" in out
    assert "totals: 272 tensors" in out


def test_json_matches_gguf_reader(kiln_bin, default_model):
    r = inspect(kiln_bin, default_model, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ref = gguf.GGUFReader(default_model)
    f = ref.fields
    assert d["format"] == "gguf" and d["version"] == 3
    assert d["architecture"] == "llama"
    for key, value in d["hyperparameters"].items():
        want = f["llama." + key].contents()
        assert value == pytest.approx(want), key
    tok = d["tokenizer"]
    assert tok["model"] == f["tokenizer.ggml.model"].contents()
    assert tok["vocab_size"] == len(f["tokenizer.ggml.tokens"].data)
    assert tok["bos_id"] == f["tokenizer.ggml.bos_token_id"].contents()
    assert tok["eos_id"] == f["tokenizer.ggml.eos_token_id"].contents()
    assert tok["has_chat_template"] is True
    assert len(d["tensors"]) == len(ref.tensors)
    for mine, theirs in zip(d["tensors"], ref.tensors):
        assert mine["name"] == theirs.name
        assert mine["type"].upper() == theirs.tensor_type.name
        assert mine["shape"] == [int(x) for x in theirs.shape]
        assert mine["bytes"] == int(theirs.n_bytes)
    total = d["totals"]
    assert total["tensors"] == len(ref.tensors)
    assert total["bytes"] == sum(int(t.n_bytes) for t in ref.tensors)
    assert total["parameters"] == sum(int(t.n_elements) for t in ref.tensors)


def test_safetensors_folder(kiln_bin, default_model, source_dir, tmp_path):
    # the default model as a Hugging Face folder (tests/python/gguf_to_hf.py) shows the same model
    folder = tmp_path / "hf"
    script = os.path.join(source_dir, "tests", "python", "gguf_to_hf.py")
    subprocess.run(["python3", script, default_model, str(folder), "--dtype", "bf16"], check=True, capture_output=True)
    r = inspect(kiln_bin, str(folder), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    g = json.loads(inspect(kiln_bin, default_model, "--json").stdout)
    assert d["format"] == "safetensors" and d["architecture"] == "llama"
    assert {t["name"] for t in d["tensors"]} == {t["name"] for t in g["tensors"]}
    # matrices keep the folder's BF16; vectors (norms) are widened to F32, as the reference converter writes them
    assert all(t["type"] == ("bf16" if len(t["shape"]) > 1 else "f32") for t in d["tensors"])
    assert d["totals"]["parameters"] == g["totals"]["parameters"]
    assert d["tokenizer"]["vocab_size"] == g["tokenizer"]["vocab_size"]
    for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv"):
        assert d["hyperparameters"][key] == g["hyperparameters"][key], key


def test_vocab_only_files(kiln_bin, shared_dir):
    files = sorted(glob.glob(os.path.join(shared_dir, "vocab", "*.gguf")))
    if not files:
        pytest.skip("no vocab files")
    for path in files:
        r = inspect(kiln_bin, path, "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["tokenizer"]["vocab_size"] > 0, path


def test_broken_corpus(kiln_bin, tmp_path):
    exe = os.environ.get("KILN_GGUF_CORPUS_TEST")
    if not exe:
        pytest.skip("KILN_GGUF_CORPUS_TEST not set (run through ctest)")
    subprocess.run([exe], check=True, capture_output=True, env=dict(os.environ, KILN_GGUF_CORPUS_OUT=str(tmp_path)))
    files = sorted(glob.glob(str(tmp_path / "*.gguf")))
    assert len(files) > 100
    for path in files:
        r = inspect(kiln_bin, path)
        if path.endswith("/valid.gguf"):
            assert r.returncode == 0, r.stderr
            continue
        lines = r.stderr.splitlines()
        assert r.returncode == 1, path
        assert len(lines) == 1 and lines[0].startswith("error: " + path + ": "), (path, r.stderr)
        assert " at byte " in lines[0], lines[0]
        assert r.stdout == ""


def test_usage_errors(kiln_bin, tmp_path):
    for args in ([str(tmp_path / "missing.gguf")], [str(tmp_path)], [], ["--bogus"]):
        r = inspect(kiln_bin, *args)
        assert r.returncode == 1
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
