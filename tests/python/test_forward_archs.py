"""Architectures and rope variants the default model does not exercise, on tiny random-weight models written here
with the gguf package (the default model's tokenizer copied in, so kiln can load them):

- qwen2: QKV biases and NeoX-style rope (no q/k permutation), an untied output head;
- llama with Llama-3 rope scaling, given as rope.scaling.* keys (kiln computes the frequency factors) and as a
  rope_freqs.weight tensor (numpy_llama.py reads that one): both must give numpy's logits;
- gemma3: six layers (five sliding-window ones of 4 positions, so the 12 tokens slide, then a global one), heads of
  64 (q wider than the embedding), query/key norms, post-norms, GELU, the embedding scaled, a tied head.

Weights are F32 (the reference path must match numpy to < 1e-4), then Q8_0, Q4_0 and Q4_1 (the reference path
again < 1e-4; the fast path within 5%, and < 1e-5 from numpy_llama's emulation of its rounding with an F32 KV cache:
two layers are too few for float32-level differences to flip an 8-bit rounding, unlike the default model's 30).
"""
import json
import math
import os
import subprocess
import sys

# one BLAS thread: on a shared machine OpenBLAS worker threads spin against other jobs (50x slower here)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

sys.path.insert(0, os.path.dirname(__file__))
import numpy_llama  # noqa: E402

KILN = os.environ.get("KILN_BIN", "build/kiln")
SOURCE = os.environ.get("KILN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
N_EMBD, N_HEAD, N_KV, N_FF, N_LAYER = 128, 4, 2, 256, 2
TOKENS = [504, 3575, 282, 4649, 314, 253, 2115, 804, 288, 5125, 253, 1502]


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer.* keys (no chat template) as (name, value type, value)."""
    path = subprocess.run([os.path.join(SOURCE, "scripts", "fetch-model.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()
    return [(name, f.types[0], f.contents()) for name, f in GGUFReader(path).fields.items()
            if name.startswith("tokenizer.") and name != "tokenizer.chat_template"]


def copy_tokenizer(tok, w):
    for name, vtype, value in tok:
        if vtype == GGUFValueType.ARRAY:
            w.add_array(name, value)
        elif vtype == GGUFValueType.STRING:
            w.add_string(name, value)
        elif vtype == GGUFValueType.BOOL:
            w.add_bool(name, value)
        else:
            w.add_uint32(name, int(value))


def llama3_factors(base, dim, factor=8.0, low=1.0, high=4.0, orig=64.0):
    """The Hugging Face llama3 rope frequency divisors (orig is small so that all three regimes occur here)."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / base ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_model(path, arch, tok, qtype, rope_keys=False, rope_tensor=False, n_vocab=512):
    """tok: tokenizer.* keys to copy; n_vocab counts the tokens where they list none."""
    rng = np.random.default_rng(7)
    n_vocab = next((len(v) for name, _, v in tok if name == "tokenizer.ggml.tokens"), n_vocab)
    gemma = arch == "gemma3"
    head_dim, base, n_layer = (64, 1e6, 6) if gemma else (N_EMBD // N_HEAD, 10000.0, N_LAYER)
    q_dim = N_HEAD * head_dim
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(base)
    if gemma:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(4)
    if rope_keys:
        w.add_string(f"{arch}.rope.scaling.type", "llama3")
        w.add_float32(f"{arch}.rope.scaling.factor", 8.0)
        w.add_float32(f"{arch}.rope.scaling.low_freq_factor", 1.0)
        w.add_float32(f"{arch}.rope.scaling.high_freq_factor", 4.0)
        w.add_float32(f"{arch}.rope.scaling.original_context_length", 64.0)
    copy_tokenizer(tok, w)

    def mat(name, rows, cols, scale=0.05):
        a = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def vec(name, n, mean=1.0, scale=0.1):
        w.add_tensor(name, (mean + rng.standard_normal(n) * scale).astype(np.float32))

    mat("token_embd.weight", n_vocab, N_EMBD, 0.1 if gemma else 1.0)
    if not gemma:
        mat("output.weight", n_vocab, N_EMBD, 0.1)
    vec("output_norm.weight", N_EMBD)
    if rope_tensor:
        w.add_tensor("rope_freqs.weight", llama3_factors(base, head_dim))
    kv = N_KV * head_dim
    for l in range(n_layer):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight", N_EMBD)
        vec(p + "ffn_norm.weight", N_EMBD)
        mat(p + "attn_q.weight", q_dim, N_EMBD, 0.2)
        mat(p + "attn_k.weight", kv, N_EMBD, 0.2)
        mat(p + "attn_v.weight", kv, N_EMBD)
        mat(p + "attn_output.weight", N_EMBD, q_dim)
        mat(p + "ffn_gate.weight", N_FF, N_EMBD)
        mat(p + "ffn_up.weight", N_FF, N_EMBD)
        mat(p + "ffn_down.weight", N_EMBD, N_FF)
        if gemma:
            vec(p + "attn_q_norm.weight", head_dim)
            vec(p + "attn_k_norm.weight", head_dim)
            vec(p + "post_attention_norm.weight", N_EMBD, 0.5)
            vec(p + "post_ffw_norm.weight", N_EMBD, 0.5)
        if arch == "qwen2":
            vec(p + "attn_q.bias", N_EMBD, 0.0, 0.5)
            vec(p + "attn_k.bias", kv, 0.0, 0.5)
            vec(p + "attn_v.bias", kv, 0.0, 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kiln_logits(model, ids, tmp_path, *extra):
    out = tmp_path / "logits.bin"
    subprocess.run([KILN, "run", "-m", str(model), "--token-ids", ",".join(map(str, ids)), "--dump-logits", str(out),
                    "-t", "1", *extra], check=True, capture_output=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def rel(got, want):
    return (np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)).max()


@pytest.mark.parametrize("arch,rope", [("qwen2", "none"), ("llama", "tensor"), ("llama", "keys"), ("gemma3", "none")])
def test_tiny_model_matches_numpy(tokenizer, tmp_path, arch, rope):
    f32 = tmp_path / "f32.gguf"
    write_model(f32, arch, tokenizer, GGMLQuantizationType.F32, rope_keys=rope == "keys",
                rope_tensor=rope != "none")
    want = numpy_llama.forward(numpy_llama.Model(str(f32)), TOKENS)
    if rope == "keys":  # numpy reads factors only from the tensor: give it the same model with one
        ref = tmp_path / "ref.gguf"
        write_model(ref, arch, tokenizer, GGMLQuantizationType.F32, rope_tensor=True)
        want = numpy_llama.forward(numpy_llama.Model(str(ref)), TOKENS)
    assert rel(kiln_logits(f32, TOKENS, tmp_path, "--reference"), want) < 1e-4
    assert rel(kiln_logits(f32, TOKENS, tmp_path), want) < 1e-3  # F32 weights: only the F16 KV cache rounds

    for qtype in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        q = tmp_path / f"{qtype.name}.gguf"
        write_model(q, arch, tokenizer, qtype, rope_keys=rope == "keys", rope_tensor=rope != "none")
        got_ref = kiln_logits(q, TOKENS, tmp_path, "--reference")
        if rope != "keys":
            model = numpy_llama.Model(str(q))
            assert rel(got_ref, numpy_llama.forward(model, TOKENS)) < 1e-4
            # the fast path's rounding emulated (8-bit activations as kiln quantizes them; an F32 cache, so no
            # float16 rounding of K/V can fall the other way): the same logits up to float32 sums (measured < 7e-7).
            # gemma3's six layers quantize ~70,000 values for the 12 tokens, enough that float32-level differences
            # (norms and softmax run in float64 here) flip one or two roundings, each ~1% of the logits from that
            # row on (measured: Q4_0 2.8e-7; Q8_0 1.1e-2 from row 9, Q4_1 1.0e-2 from row 1; the rows before 2e-7)
            emulated = numpy_llama.forward(model, TOKENS, fast=True, kv_f16=False)
            assert rel(kiln_logits(q, TOKENS, tmp_path, "--kv-f32"), emulated) < (2e-2 if arch == "gemma3" else 1e-5)
        # the fast path: 8-bit activations; a batch (multi-token kernels) and token-by-token steps
        assert rel(kiln_logits(q, TOKENS, tmp_path), got_ref) < 0.05
        assert rel(kiln_logits(q, TOKENS, tmp_path, "-b", "1"), got_ref) < 0.05


@pytest.mark.parametrize("marker", [None, "none"])
def test_a_file_without_tokenizer_runs_on_token_ids(tmp_path, marker):
    """No tokenizer.ggml.model (or "none", as llama.cpp marks it): bench runs the weights; text commands refuse."""
    path = tmp_path / "no-vocab.gguf"
    write_model(path, "llama", [] if marker is None else [("tokenizer.ggml.model", GGUFValueType.STRING, marker)],
                GGMLQuantizationType.Q4_0)
    r = subprocess.run([KILN, "bench", "-m", str(path), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tg_tok_s"] > 0
    for cmd in (["run", "-p", "hello"], ["run", "--token-ids", "1,2,3"], ["chat"], ["perplexity", "-f", __file__],
                ["serve", "--port", "0"]):
        r = subprocess.run([KILN, *cmd, "-m", str(path)], capture_output=True, text=True, input="", timeout=60)
        assert r.returncode != 0 and "has no tokenizer" in r.stderr, (cmd, r.stderr)


def test_gemma3_stays_off_the_gpu(tokenizer, tmp_path):
    """The CUDA executor does not run gemma3 yet: --device cuda says so (GPU or not), auto runs it on the CPU."""
    path = tmp_path / "gemma3.gguf"
    write_model(path, "gemma3", tokenizer, GGMLQuantizationType.Q8_0)
    r = subprocess.run([KILN, "run", "-m", str(path), "-p", "hello", "-n", "2", "--device", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "does not run gemma3" in r.stderr, r.stderr
    r = subprocess.run([KILN, "run", "-m", str(path), "-p", "hello", "-n", "2", "--device", "auto", "-t", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "on the CPU" in r.stderr, r.stderr
