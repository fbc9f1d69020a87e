#!/usr/bin/env python3
"""Turns a GGUF model (llama or qwen2) into a Hugging Face folder: config.json, tokenizer.json,
tokenizer_config.json and model.safetensors (or shards with model.safetensors.index.json).

Weights are dequantized with the gguf package's numpy code and stored as F32, F16 or BF16; the llama q/k rows are
permuted back to HF's rotate-halves layout, so opening the folder in kiln must give the GGUF's weights again (up to
the storage dtype's rounding). Written without torch, safetensors or tokenizers: safetensors is a u64 header
length, a JSON header and raw little-endian data.

usage: gguf_to_hf.py MODEL.gguf OUT_DIR [--dtype f32|f16|bf16] [--shards N]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "llama-bpe": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                               "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                               "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "gpt-2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def hf_name(gguf_name):
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        if rest in LAYER_NAMES:
            return f"model.layers.{layer}.{LAYER_NAMES[rest]}"
    return None


def unpermute(w, n_head):
    """Inverse of llama.cpp's converter permutation: GGUF row h*d + 2j + s goes back to HF row h*d + s*d/2 + j."""
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w, n_head):
    """llama.cpp's converter permutation (HF rotate-halves rows → GGUF interleaved pairs)."""
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_bf16_bytes(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even, as kiln_float_to_bf16
    return rounded.astype(np.uint16).tobytes()


def encode(a, dtype):
    if dtype == "f32":
        return "F32", np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "f16":
        return "F16", np.ascontiguousarray(a, dtype="<f2").tobytes()
    return "BF16", to_bf16_bytes(a)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, raw bytes). Offsets follow the list order."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)


def write_model(out_dir, named, dtype, shards):
    """named: list of (hf name, float array). Writes one file or N shards plus the index."""
    encoded = []
    for name, a in named:
        st_dtype, raw = encode(a, dtype)
        encoded.append((name, st_dtype, a.shape, raw))
    if shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), encoded, {"format": "pt"})
        return
    per = (len(encoded) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        part = encoded[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fname), part, {"format": "pt"})
        for name, _, _, raw in part:
            weight_map[name] = fname
            total += len(raw)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def convert_tensors(reader, arch, n_head, n_head_kv):
    named = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue  # rope_freqs and other GGUF-only tensors have no HF counterpart
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if arch == "llama" and (t.name.endswith("attn_q.weight") or t.name.endswith("attn_q.bias")):
            w = unpermute(w, n_head)
        elif arch == "llama" and (t.name.endswith("attn_k.weight") or t.name.endswith("attn_k.bias")):
            w = unpermute(w, n_head_kv)
        named.append((name, w))
    return named


def make_config(reader, arch, tied):
    a = arch
    n_embd = field(reader, f"{a}.embedding_length")
    n_head = field(reader, f"{a}.attention.head_count")
    cfg = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "hidden_size": n_embd,
        "intermediate_size": field(reader, f"{a}.feed_forward_length"),
        "num_hidden_layers": field(reader, f"{a}.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": field(reader, f"{a}.attention.head_count_kv", n_head),
        "max_position_embeddings": field(reader, f"{a}.context_length"),
        "rms_norm_eps": field(reader, f"{a}.attention.layer_norm_rms_epsilon"),
        "rope_theta": field(reader, f"{a}.rope.freq_base", 10000.0),
        "vocab_size": len(field(reader, "tokenizer.ggml.tokens")),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key, hf in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")):
        if field(reader, key) is not None:
            cfg[hf] = field(reader, key)
    return cfg


def make_tokenizer(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    model = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    byte_fallback = model == "llama"
    vocab, added = {}, []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):  # control, user-defined: HF lists them as added tokens (and in the vocab)
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ty == 4, "special": ty == 3})
        if ty != 5:  # unused (padding) ids are simply absent
            vocab[tok] = i
    merges = field(reader, "tokenizer.ggml.merges", [])
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS.get(pre),
        "post_processor": None,
        "decoder": ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
                    if not byte_fallback else None),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
                  "vocab": vocab, "merges": merges},
    }
    if byte_fallback:
        tok["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                                  {"type": "Replace", "pattern": {"String": " "},
                                                                   "content": "\u2581"}]}
        unk = field(reader, "tokenizer.ggml.unknown_token_id")
        if unk is not None:
            tok["model"]["unk_token"] = tokens[unk]
    return tok


def make_tokenizer_config(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    cfg = {}
    for key, hf in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"),
                    ("unknown_token_id", "unk_token"), ("padding_token_id", "pad_token")):
        i = field(reader, f"tokenizer.ggml.{key}")
        if i is not None:
            cfg[hf] = tokens[i]
    for key in ("add_bos_token", "add_eos_token"):
        v = field(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            cfg[key] = bool(v)
    v = field(reader, "tokenizer.ggml.add_space_prefix")
    if v is not None:
        cfg["add_prefix_space"] = bool(v)
    tmpl = field(reader, "tokenizer.chat_template")
    if tmpl is not None:
        cfg["chat_template"] = tmpl
    return cfg


def convert(gguf_path, out_dir, dtype="f32", shards=1):
    reader = GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise SystemExit(f"{gguf_path}: architecture {arch} is not supported (llama, qwen2 are)")
    n_head = field(reader, f"{arch}.attention.head_count")
    n_head_kv = field(reader, f"{arch}.attention.head_count_kv", n_head)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    os.makedirs(out_dir, exist_ok=True)
    write_model(out_dir, convert_tensors(reader, arch, n_head, n_head_kv), dtype, shards)
    for name, obj in (("config.json", make_config(reader, arch, tied)),
                      ("tokenizer.json", make_tokenizer(reader)),
                      ("tokenizer_config.json", make_tokenizer_config(reader))):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32")
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args(argv)
    convert(args.gguf, args.out_dir, args.dtype, args.shards)


if __name__ == "__main__":
    main(sys.argv[1:])
