#!/usr/bin/env python3
"""Random-weight GGUF files for the CUDA tests and benchmarks, at real or tiny llama/qwen2 shapes.

Quantized tensors are random block bytes with their scale fields set to halves of a sane size, so every block is a
valid one; speed does not depend on the values, and the GPU is compared with the CPU on the same file. The bytes
depend only on the arguments (the generator is seeded from them), so a test's KILN_TEST_SEED reproduces its run.

usage: make_model.py SHAPE MIX OUT.gguf
  SHAPE: tiny-llama, tiny-qwen2, qwen2-1.5b, llama3-8b
  MIX:   q4_k_m (llama.cpp's Q4_K_M type choice), all (every GPU type in turn), float (F32/F16/BF16 in turn),
         or one type name (q8_0, f16, ...)
"""
import os
import sys
import zlib

import numpy as np
import gguf

SHAPES = {
    #             arch    embd layers head kv  hd   ff     vocab   tied   rope base
    "tiny-llama": ("llama", 256, 2, 4, 2, 64, 768, 1000, False, 10000.0),
    "tiny-qwen2": ("qwen2", 512, 2, 4, 1, 128, 1024, 1200, True, 1000000.0),
    "qwen2-1.5b": ("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, True, 1000000.0),
    "llama3-8b": ("llama", 4096, 32, 32, 8, 128, 14336, 128256, False, 500000.0),
}

T = gguf.GGMLQuantizationType
ALL = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16, T.F32]
FLOAT = [T.F32, T.F16, T.BF16]

# (byte offsets of the half scales, typical |weight| per unit of the scale, offset of a min field or None)
SCALES = {
    T.Q4_0: ([0], 4.6, None), T.Q4_1: ([0], 4.6, 2), T.Q5_0: ([0], 9.2, None), T.Q5_1: ([0], 9.2, 2),
    T.Q8_0: ([0], 74.0, None), T.Q2_K: ([80], 8.0, 82), T.Q3_K: ([108], 37.0, None), T.Q4_K: ([0], 140.0, 2),
    T.Q5_K: ([0], 285.0, 2), T.Q6_K: ([208], 1150.0, None),
}
MIN_RATIO = {T.Q4_1: 8.0, T.Q5_1: 16.0, T.Q2_K: 1.5, T.Q4_K: 7.5, T.Q5_K: 15.5}

rng = None  # main() seeds it from its arguments


def random_tensor(qtype, rows, cols):
    """(array, raw dtype) for a rows x cols weight whose entries are about 1/sqrt(cols) in size."""
    std = 1.0 / np.sqrt(cols)
    if qtype in (T.F32, T.F16, T.BF16):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float32)
        if qtype == T.F32:
            return x, None
        if qtype == T.F16:
            return x.astype(np.float16), None
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2), T.BF16
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // block_elems
    raw = rng.integers(0, 256, size=(rows, nb, block_bytes), dtype=np.uint8)
    offs, per_unit, min_off = SCALES[qtype]
    d = (std / per_unit * (0.5 + rng.random((rows, nb)))).astype(np.float16)
    for o in offs:
        raw[:, :, o:o + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    if min_off is not None:
        m = (d.astype(np.float32) * MIN_RATIO[qtype]).astype(np.float16)
        raw[:, :, min_off:min_off + 2] = m.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * block_bytes), qtype


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def choose(mix, role, layer, n_layer, slot):
    if mix == "q4_k_m":
        if role in ("output", "token_embd_tied"):
            return T.Q6_K
        if role in ("attn_v", "ffn_down") and more_bits(layer, n_layer):
            return T.Q6_K
        return T.Q4_K
    if mix == "all":
        return ALL[slot % len(ALL)]
    if mix == "float":
        return FLOAT[slot % len(FLOAT)]
    return T[mix.upper()]


def main():
    global rng
    shape, mix, out = sys.argv[1:4]
    rng = np.random.default_rng(zlib.crc32(f"{shape} {mix} {os.path.basename(out)}".encode()))
    arch, embd, n_layer, n_head, n_kv, hd, ff, vocab, tied, base = SHAPES[shape]
    w = gguf.GGUFWriter(out, arch)
    w.add_context_length(4096)
    w.add_embedding_length(embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(base)
    slot = 0

    def add(name, qtype, rows, cols):
        nonlocal slot
        slot += 1
        arr, raw = random_tensor(qtype, rows, cols)
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)

    def add_vec(name, n, base_value, spread):
        w.add_tensor(name, (base_value + spread * rng.standard_normal(n)).astype(np.float32))

    add("token_embd.weight", choose(mix, "token_embd_tied" if tied else "token_embd", 0, n_layer, slot), vocab, embd)
    add_vec("output_norm.weight", embd, 1.0, 0.1)
    if not tied:
        add("output.weight", choose(mix, "output", 0, n_layer, slot), vocab, embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        add_vec(p + "attn_norm.weight", embd, 1.0, 0.1)
        add_vec(p + "ffn_norm.weight", embd, 1.0, 0.1)
        add(p + "attn_q.weight", choose(mix, "attn_q", i, n_layer, slot), n_head * hd, embd)
        add(p + "attn_k.weight", choose(mix, "attn_k", i, n_layer, slot), n_kv * hd, embd)
        add(p + "attn_v.weight", choose(mix, "attn_v", i, n_layer, slot), n_kv * hd, embd)
        add(p + "attn_output.weight", choose(mix, "attn_output", i, n_layer, slot), embd, n_head * hd)
        add(p + "ffn_gate.weight", choose(mix, "ffn_gate", i, n_layer, slot), ff, embd)
        add(p + "ffn_up.weight", choose(mix, "ffn_up", i, n_layer, slot), ff, embd)
        add(p + "ffn_down.weight", choose(mix, "ffn_down", i, n_layer, slot), embd, ff)
        if arch == "qwen2":
            add_vec(p + "attn_q.bias", n_head * hd, 0.0, 0.1)
            add_vec(p + "attn_k.bias", n_kv * hd, 0.0, 0.1)
            add_vec(p + "attn_v.bias", n_kv * hd, 0.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
