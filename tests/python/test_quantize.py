"""kiln quantize and kiln synth, checked with the gguf package: per-tensor types follow llama.cpp's policy
(docs/quantize.md), values survive within each type's error, metadata is carried over, and synthetic models have the
shape, keys and tokenizer llama.cpp expects."""
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(__file__))
from gguf_to_hf import field  # noqa: E402


def run(kiln_bin, *args):
    return subprocess.run([kiln_bin, *args], capture_output=True, text=True, timeout=300)


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256,
         "Q5_K": 256, "Q6_K": 256, "F16": 1, "F32": 1}
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def expected_type(base, mixed, name, shape, n_layer, has_output):
    """docs/quantize.md, written out independently of the C code."""
    if len(shape) < 2 or not name.endswith(".weight"):
        return "F32"
    if base in ("F16", "F32"):
        return base
    t = base
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        t = "Q8_0" if shape[0] % BLOCK[base] else ("Q6_K" if base != "Q8_0" else "Q8_0")
    elif mixed and (name.endswith(".attn_v.weight") or name.endswith(".ffn_down.weight")):
        if use_more_bits(int(name.split(".")[1]), n_layer):
            t = "Q6_K"
    if shape[0] % BLOCK[t]:
        t = FALLBACK.get(t, "F16")
        if shape[0] % BLOCK[t]:
            t = "F16"
    return t


@pytest.mark.parametrize("preset,base,mixed,ftype,max_rel_rmse", [
    ("q8_0", "Q8_0", False, 7, 0.01),
    ("q4_0", "Q4_0", False, 2, 0.15),
    ("q4_k_m", "Q4_K", True, 15, 0.15),
])
def test_quantize_default_model(kiln_bin, default_model, tmp_path, preset, base, mixed, ftype, max_rel_rmse):
    out = str(tmp_path / f"{preset}.gguf")
    r = run(kiln_bin, "quantize", default_model, out, preset)
    assert r.returncode == 0, r.stderr
    assert "272/272" in r.stderr and "MB/s" in r.stderr  # the progress line
    src, dst = GGUFReader(default_model), GGUFReader(out)
    n_layer = field(src, "llama.block_count")
    has_output = any(t.name == "output.weight" for t in src.tensors)
    src_t = {t.name: t for t in src.tensors}
    for i, t in enumerate(dst.tensors):
        shape = [int(x) for x in t.shape]
        assert t.tensor_type.name == expected_type(base, mixed, t.name, shape, n_layer, has_output), t.name
        if len(shape) < 2 or i % 5:
            continue  # values of every fifth tensor: enough to see each type, quick on a busy machine
        a = dequantize(src_t[t.name].data, src_t[t.name].tensor_type)
        b = dequantize(t.data, t.tensor_type)
        rel = np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(a ** 2))
        limit = 0.01 if t.tensor_type.name == "Q8_0" else max_rel_rmse  # an already-Q8_0 tensor is near exact
        assert rel < limit, (t.name, t.tensor_type.name, rel)
    assert field(dst, "general.file_type") == ftype
    assert field(dst, "general.quantization_version") == 2
    for k in src.fields:
        if not k.startswith("GGUF.") and k != "general.file_type":
            assert field(dst, k) == field(src, k), k


def test_quantize_mix_counts(kiln_bin, default_model, tmp_path):
    """q5_k_m on the 30-layer default model: Q6_K in exactly the use_more_bits layers' ffn_down; the Q5_K and Q6_K
    fallbacks for 576-wide rows."""
    out = str(tmp_path / "q5km.gguf")
    assert run(kiln_bin, "quantize", default_model, out, "q5_k_m", "--quiet").returncode == 0
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    six = sorted(int(n.split(".")[1]) for n, ty in types.items() if n.endswith("ffn_down.weight") and ty == "Q6_K")
    assert six == [i for i in range(30) if use_more_bits(i, 30)]
    assert types["blk.4.ffn_down.weight"] == "Q5_K"
    assert types["blk.4.attn_q.weight"] == "Q5_1"  # 576 is not a multiple of 256: Q5_K falls back
    assert types["blk.0.attn_v.weight"] == "Q8_0"  # and so does the mix's Q6_K


def test_quantize_errors(kiln_bin, default_model, tmp_path):
    r = run(kiln_bin, "quantize", default_model, str(tmp_path / "x.gguf"), "q9_z")
    assert r.returncode == 1 and r.stderr.startswith("error: unknown type")
    r = run(kiln_bin, "quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "x.gguf"), "q8_0")
    assert r.returncode == 1 and r.stderr.startswith("error:")
    assert not os.path.exists(tmp_path / "x.gguf")
    assert run(kiln_bin, "quantize", default_model).returncode == 1


def test_synth_smollm2(kiln_bin, default_model, tmp_path):
    out = str(tmp_path / "synth.gguf")
    r = run(kiln_bin, "synth", "--shape", "smollm2-135m", "--type", "q4_k_m", "-o", out, "--seed", "5",
            "--vocab-from", default_model)
    assert r.returncode == 0, r.stderr
    g, ref = GGUFReader(out), GGUFReader(default_model)
    assert field(g, "general.architecture") == "llama" and field(g, "general.file_type") == 15
    for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "context_length", "rope.dimension_count", "vocab_size"):
        assert field(g, f"llama.{k}") == field(ref, f"llama.{k}"), k
    assert field(g, "llama.rope.freq_base") == 100000.0
    for k in ref.fields:
        if k.startswith("tokenizer."):
            assert field(g, k) == field(ref, k), k
    ref_shapes = {t.name: [int(x) for x in t.shape] for t in ref.tensors}
    shapes = {t.name: [int(x) for x in t.shape] for t in g.tensors}
    assert shapes == ref_shapes
    for t in g.tensors:
        assert t.tensor_type.name == expected_type("Q4_K", True, t.name, shapes[t.name], 30, False), t.name
    w = dequantize(g.tensors[2].data, g.tensors[2].tensor_type)  # blk.0.attn_q.weight
    assert abs(float(w.std()) - 0.02) < 0.002 and abs(float(w.mean())) < 0.001
    norm = next(t for t in g.tensors if t.name == "blk.0.attn_norm.weight")
    assert np.all(np.array(norm.data) == 1.0)


def test_synth_pads_vocab(kiln_bin, shared_dir, tmp_path):
    """A 32000-token SentencePiece vocabulary padded to SmolLM2's 49152, with f16 weights."""
    vocab = os.path.join(shared_dir, "vocab", "ggml-vocab-llama-spm.gguf")
    out = str(tmp_path / "pad.gguf")
    r = run(kiln_bin, "synth", "--shape", "smollm2-135m", "--type", "f16", "-o", out, "--vocab-from", vocab,
            "--quiet")
    assert r.returncode == 0, r.stderr
    g, v = GGUFReader(out), GGUFReader(vocab)
    tokens, types = field(g, "tokenizer.ggml.tokens"), field(g, "tokenizer.ggml.token_type")
    assert len(tokens) == 49152 and tokens[:32000] == field(v, "tokenizer.ggml.tokens")
    assert tokens[40000] == "[PAD40000]" and types[40000] == 5
    assert len(field(g, "tokenizer.ggml.scores")) == 49152
    assert field(g, "tokenizer.ggml.model") == "llama"
    r = run(kiln_bin, "synth", "--shape", "smollm2-135m", "--type", "f16", "-o", str(tmp_path / "x.gguf"),
            "--vocab-from", os.path.join(shared_dir, "vocab", "ggml-vocab-gpt-2.gguf"))
    assert r.returncode == 1 and "do not fit" in r.stderr
