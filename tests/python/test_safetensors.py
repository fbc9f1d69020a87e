"""Safetensors folders through the kiln binary: the default model converted to an HF folder and back must give the
GGUF's weights and metadata exactly; small hand-made folders (qwen2 with biases, BF16, shards; llama3 rope scaling)
translate as llama.cpp's converter would; broken folders fail with one clear line and exit 1."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(__file__))
import gguf_to_hf  # noqa: E402


def run(kiln_bin, *args):
    return subprocess.run([kiln_bin, *args], capture_output=True, text=True, timeout=120)


def inspect_json(kiln_bin, path):
    r = run(kiln_bin, "inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def fields(reader):
    return {k: gguf_to_hf.field(reader, k) for k in reader.fields if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def smol_hf(tmp_path_factory, default_model):
    out = str(tmp_path_factory.mktemp("smol_hf"))
    gguf_to_hf.convert(default_model, out, dtype="f16")
    return out


def test_default_model_round_trip(kiln_bin, default_model, smol_hf, tmp_path):
    """GGUF → HF folder (F16, q/k un-permuted) → kiln quantize f16 → the same tensors, names and tokenizer."""
    out = str(tmp_path / "back.gguf")
    r = run(kiln_bin, "quantize", smol_hf, out, "f16", "--quiet")
    assert r.returncode == 0, r.stderr
    src, back = GGUFReader(default_model), GGUFReader(out)
    src_t = {t.name: t for t in src.tensors}
    assert sorted(src_t) == sorted(t.name for t in back.tensors)
    for t in back.tensors:
        want = dequantize(src_t[t.name].data, src_t[t.name].tensor_type).astype(np.float16).astype(np.float32)
        got = dequantize(t.data, t.tensor_type)
        assert got.shape == want.shape, t.name
        assert np.array_equal(got, want), t.name
        assert t.tensor_type.name == ("F32" if len(t.shape) == 1 else "F16"), t.name
    a, b = fields(src), fields(back)
    for k, v in a.items():
        if k.startswith("general."):
            continue  # name, license, ... live outside config.json; file_type differs by design
        assert b.get(k) == v, k
    assert b["general.file_type"] == 1


def test_inspect_folder_matches_gguf(kiln_bin, default_model, smol_hf):
    d, g = inspect_json(kiln_bin, smol_hf), inspect_json(kiln_bin, default_model)
    assert d["format"] == "safetensors" and d["architecture"] == "llama"
    for k, v in g["hyperparameters"].items():
        assert d["hyperparameters"][k] == pytest.approx(v), k
    for k in ("model", "pre", "vocab_size", "bos_id", "eos_id", "has_chat_template"):
        assert d["tokenizer"][k] == g["tokenizer"][k], k
    shapes = {t["name"]: t["shape"] for t in g["tensors"]}
    assert {t["name"]: t["shape"] for t in d["tensors"]} == shapes


# --- small hand-made folders --------------------------------------------------------------------------------------

QWEN_TOKENIZER = {
    "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": True},
                     {"id": 6, "content": "<|im_start|>", "special": True},
                     {"id": 7, "content": "<|im_end|>", "special": True}],
    "pre_tokenizer": gguf_to_hf.PRE_TOKENIZERS["qwen2"],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
              "merges": [["a", "b"], ["Ġ", "ab"]]},
}


def tiny_qwen2(rng, n_embd=64, n_head=4, n_kv=2, n_ff=96, vocab=10):
    hd = n_embd // n_head
    w = {"model.embed_tokens.weight": (vocab, n_embd), "model.norm.weight": (n_embd,)}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": (n_embd,), p + "post_attention_layernorm.weight": (n_embd,),
                  p + "self_attn.q_proj.weight": (n_embd, n_embd), p + "self_attn.q_proj.bias": (n_embd,),
                  p + "self_attn.k_proj.weight": (n_kv * hd, n_embd), p + "self_attn.k_proj.bias": (n_kv * hd,),
                  p + "self_attn.v_proj.weight": (n_kv * hd, n_embd), p + "self_attn.v_proj.bias": (n_kv * hd,),
                  p + "self_attn.o_proj.weight": (n_embd, n_embd), p + "mlp.gate_proj.weight": (n_ff, n_embd),
                  p + "mlp.up_proj.weight": (n_ff, n_embd), p + "mlp.down_proj.weight": (n_embd, n_ff)})
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in w.items()}


def write_folder(path, config, tokenizer, named, dtype="f32", shards=1, tokenizer_config=None):
    os.makedirs(path, exist_ok=True)
    gguf_to_hf.write_model(str(path), list(named.items()), dtype, shards)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    if tokenizer_config is not None:
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config, f)


QWEN_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 12,
               "tie_word_embeddings": True, "eos_token_id": 5}


def bf16_round(a):
    u = a.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def test_qwen2_bf16_shards(kiln_bin, tmp_path):
    rng = np.random.default_rng(7)
    named = tiny_qwen2(rng)
    d = tmp_path / "qwen"
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, named, dtype="bf16", shards=3,
                 tokenizer_config={"eos_token": "<|im_end|>", "chat_template": "{{ x }}", "add_bos_token": False})
    info = inspect_json(kiln_bin, str(d))
    assert info["architecture"] == "qwen2"
    hp = info["hyperparameters"]
    assert hp["block_count"] == 2 and hp["attention.head_count_kv"] == 2 and hp["rope.freq_base"] == 1e6
    assert info["tokenizer"]["model"] == "gpt2" and info["tokenizer"]["pre"] == "qwen2"
    assert info["tokenizer"]["vocab_size"] == 12 and info["tokenizer"]["eos_id"] == 7
    types = {t["name"]: t["type"] for t in info["tensors"]}
    assert types["blk.1.attn_k.weight"] == "bf16" and "output.weight" not in types
    assert types["blk.1.attn_k.bias"] == "f32"  # vectors are widened, as in a GGUF

    out = str(tmp_path / "q.gguf")
    r = run(kiln_bin, "quantize", str(d), out, "f32", "--quiet")
    assert r.returncode == 0, r.stderr
    got = {t.name: t for t in GGUFReader(out).tensors}
    for hf, a in named.items():
        name = next(g for g, h in [(g, gguf_to_hf.hf_name(g)) for g in got] if h == hf)
        v = dequantize(got[name].data, got[name].tensor_type)
        assert np.array_equal(v, bf16_round(a)), hf  # qwen2: no permutation
    f = fields(GGUFReader(out))
    assert f["tokenizer.ggml.tokens"][10] == "[PAD10]" and f["tokenizer.ggml.token_type"][10] == 5
    assert f["tokenizer.ggml.token_type"][6] == 3 and f["tokenizer.ggml.merges"] == ["a b", "Ġ ab"]
    assert f["tokenizer.chat_template"] == "{{ x }}" and f["tokenizer.ggml.add_bos_token"] is False


def test_llama3_rope_scaling(kiln_bin, tmp_path):
    rng = np.random.default_rng(3)
    named = {k: v for k, v in tiny_qwen2(rng).items() if "bias" not in k}
    named["lm_head.weight"] = rng.standard_normal((10, 64)).astype(np.float32)
    cfg = dict(QWEN_CONFIG, architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False,
               rope_theta=500000.0, rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    d = tmp_path / "l3"
    write_folder(d, cfg, QWEN_TOKENIZER, named, dtype="f32")
    out = str(tmp_path / "l3.gguf")
    r = run(kiln_bin, "quantize", str(d), out, "f32", "--quiet")
    assert r.returncode == 0, r.stderr
    got = {t.name: t for t in GGUFReader(out).tensors}
    freqs = np.array(got["rope_freqs.weight"].data)
    # llama.cpp's converter, recomputed here
    dim, base = 16, 500000.0
    want = []
    for fq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wl = 2 * np.pi / fq
        if wl < 8192 / 4:
            want.append(1.0)
        elif wl > 8192 / 1:
            want.append(8.0)
        else:
            s = (8192 / wl - 1) / (4 - 1)
            want.append(1 / ((1 - s) / 8 + s))
    assert np.allclose(freqs, want, rtol=1e-5)
    q = dequantize(got["blk.0.attn_q.weight"].data, got["blk.0.attn_q.weight"].tensor_type)
    assert np.array_equal(q, gguf_to_hf.permute(named["model.layers.0.self_attn.q_proj.weight"], 4))
    k = dequantize(got["blk.1.attn_k.weight"].data, got["blk.1.attn_k.weight"].tensor_type)
    assert np.array_equal(k, gguf_to_hf.permute(named["model.layers.1.self_attn.k_proj.weight"], 2))
    assert "output.weight" in got


# --- broken folders -----------------------------------------------------------------------------------------------

def raw_file(path, header, data=b""):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


GOOD_TENSOR = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def broken_cases():
    yield "length past end", lambda p: open(p, "wb").write(struct.pack("<Q", 1000) + b"{}"), "header length"
    yield "short file", lambda p: open(p, "wb").write(b"\x01\x00"), "header length"
    yield "bad json", lambda p: raw_file(p, b"{\"a\":"), "header JSON"
    yield "offsets outside", lambda p: raw_file(p, {"model.norm.weight": dict(GOOD_TENSOR, data_offsets=[0, 80])},
                                                b"\0" * 8), "past the data area"
    yield "overlap", lambda p: raw_file(p, {"model.norm.weight": GOOD_TENSOR,
                                            "model.embed_tokens.weight": dict(GOOD_TENSOR, data_offsets=[4, 12])},
                                        b"\0" * 12), "overlap"
    yield "wrong size", lambda p: raw_file(p, {"model.norm.weight": dict(GOOD_TENSOR, shape=[3])}, b"\0" * 8), \
        "need 12"
    yield "unknown dtype", lambda p: raw_file(p, {"model.norm.weight": dict(GOOD_TENSOR, dtype="I64", shape=[1])},
                                              b"\0" * 8), "dtype I64"
    yield "duplicate", lambda p: raw_file(p, b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                             b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8), \
        "duplicate"
    yield "zero-size", lambda p: raw_file(p, {"model.norm.weight": dict(GOOD_TENSOR, shape=[0], data_offsets=[0, 0])}),\
        "zero-size dimension"
    yield "unknown name", lambda p: raw_file(p, {"vision.weight": GOOD_TENSOR}, b"\0" * 8), "no GGUF name"


@pytest.mark.parametrize("case", list(broken_cases()), ids=lambda c: c[0])
def test_broken_file(kiln_bin, tmp_path, case):
    _, make, needle = case
    d = tmp_path / "bad"
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, {})
    make(str(d / "model.safetensors"))
    r = run(kiln_bin, "inspect", str(d))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def test_broken_folders(kiln_bin, tmp_path):
    rng = np.random.default_rng(1)
    d = tmp_path / "shards"
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, tiny_qwen2(rng), shards=2)
    os.remove(d / "model-00002-of-00002.safetensors")
    r = run(kiln_bin, "inspect", str(d))
    assert r.returncode == 1 and "model-00002-of-00002.safetensors" in r.stderr

    d = tmp_path / "dup"  # one tensor in two shards, neither named by the index
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, {})
    os.remove(d / "model.safetensors")
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        gguf_to_hf.write_safetensors(str(d / shard), [("model.norm.weight", "F32", (64,), b"\0" * 256)])
    with open(d / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"x": "model-00001-of-00002.safetensors",
                                  "y": "model-00002-of-00002.safetensors"}}, f)
    r = run(kiln_bin, "inspect", str(d))
    assert r.returncode == 1 and "appears twice" in r.stderr, r.stderr

    d = tmp_path / "noconfig"
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, tiny_qwen2(rng))
    os.remove(d / "config.json")
    r = run(kiln_bin, "inspect", str(d))
    assert r.returncode == 1 and "config.json" in r.stderr

    d = tmp_path / "arch"
    write_folder(d, dict(QWEN_CONFIG, model_type="gemma", architectures=["GemmaForCausalLM"]), QWEN_TOKENIZER,
                 tiny_qwen2(rng))
    r = run(kiln_bin, "inspect", str(d))
    assert r.returncode == 1 and "gemma" in r.stderr


def test_folder_without_tokenizer_runs_on_token_ids(kiln_bin, tmp_path):
    """No tokenizer.json: the weights load (bench, inspect, quantize), text commands name what is missing."""
    d = tmp_path / "weights-only"
    write_folder(d, QWEN_CONFIG, QWEN_TOKENIZER, tiny_qwen2(np.random.default_rng(3)))
    os.remove(d / "tokenizer.json")
    r = run(kiln_bin, "bench", "-m", str(d), "-p", "4", "-n", "2", "-r", "1", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tg_tok_s"] > 0
    assert inspect_json(kiln_bin, str(d))["tokenizer"]["model"] is None
    out = str(tmp_path / "weights-only.gguf")
    r = run(kiln_bin, "quantize", str(d), out, "q8_0", "--quiet")
    assert r.returncode == 0, r.stderr
    assert not any(k.startswith("tokenizer.") for k in GGUFReader(out).fields)
    r = run(kiln_bin, "run", "-m", str(d), "-p", "hello")
    assert r.returncode == 1 and "tokenizer.json" in r.stderr, r.stderr
