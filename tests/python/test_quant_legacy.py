"""kiln's float and 32-element block kernels against gguf's numpy reference code (through ctypes).

Bounds stated here:
- dequantize: bit-exact with gguf.quants for every type and every ISA this CPU runs.
- quantize: byte-exact with gguf.quants where it quantizes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16), and with a
  numpy transcription of the reference rules for Q8_1 (which gguf lacks).
- vec_dot against dequantize-then-dot in float64: |err| <= 2e-5 * sum|x_i y_i|, plus, for the offset types
  (Q4_1, Q5_1), the rounding of the stored half s = d * sum(q): sum over blocks of |m_x * s_y| * 2^-11.
"""

import os
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq

from kiln_quant_ctypes import QUANT_SIZES, KilnQuant

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1]
FLOATS = [T.F32, T.F16, T.BF16]
GGUF_QUANTIZES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16]
# byte offsets of the half-precision scales in each block
HALF_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q8_1: [0, 2]}

lib = KilnQuant()
ISAS = lib.cpu_isas()


def random_halves(rng, count):
    """Finite halves of both signs spread over the whole exponent range, subnormals and zero included."""
    magnitude = rng.integers(0, 0x7C00, size=count, dtype=np.uint16)
    return magnitude | (rng.integers(0, 2, size=count, dtype=np.uint16) << 15)


def random_blocks(rng, qtype, n_blocks):
    block, size = QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if qtype == T.F32:
        f = raw.view(np.uint32)
        f[(f & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF  # no inf/NaN
    elif qtype == T.F16:
        raw.view(np.uint16)[:] = random_halves(rng, n_blocks)[:, None]
    elif qtype == T.BF16:
        h = raw.view(np.uint16)
        h[(h & 0x7F80) == 0x7F80] &= 0xBFFF
    else:
        for off in HALF_FIELDS[qtype]:
            raw[:, off : off + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def reference_dequantize(qtype, raw):
    if qtype == T.Q8_1:  # gguf has no Q8_1; x = d * q
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (raw[:, 4:].view(np.int8).astype(np.float32) * d).reshape(-1)
    return gq.dequantize(raw, qtype).reshape(-1).astype(np.float32)


def reference_quantize_q8_1(x):
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = gq.np_roundf(blocks * inv).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d).astype(np.float16)
    return np.concatenate([d.astype(np.float16).view(np.uint8), s.view(np.uint8), q.view(np.uint8)], axis=1).reshape(-1)


def reference_quantize(qtype, x):
    if qtype == T.Q8_1:
        return reference_quantize_q8_1(x)
    return gq.quantize(x.reshape(-1, 256), qtype).view(np.uint8).reshape(-1)


def sample_data(n_rows=16, n=256, seed=0):
    """Normal data with row scales over many orders of magnitude, a zero row, and exact ties at .5."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n)).astype(np.float32) * np.logspace(-6, 3, n_rows, dtype=np.float32)[:, None]
    x[1] = 0
    x[2, :32] = np.arange(32, dtype=np.float32) - 16.5
    x[3, :32] = np.arange(32, dtype=np.float32) - 15.5  # with a 127 in the block, d = 1: exact ties for Q8
    x[3, 0] = 127
    return x.reshape(-1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", LEGACY + FLOATS, ids=lambda t: t.name)
def test_dequantize_matches_gguf(qtype, isa):
    rng = np.random.default_rng(int(qtype) * 7 + 1)
    n_blocks = 1024 // QUANT_SIZES[qtype][0] + 3  # odd counts exercise the SIMD tails
    raw = random_blocks(rng, qtype, n_blocks)
    ours = lib.dequantize(qtype, raw, isa)
    ref = reference_dequantize(qtype, raw)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GGUF_QUANTIZES + [T.Q8_1], ids=lambda t: t.name)
def test_quantize_matches_gguf_bytes(qtype, isa):
    x = sample_data()
    np.testing.assert_array_equal(lib.quantize(qtype, x, isa), reference_quantize(qtype, x))


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES + [T.Q8_1], ids=lambda t: t.name)
def test_quantize_rmse_matches_gguf(qtype):
    x = np.random.default_rng(5).standard_normal(1 << 16).astype(np.float32)
    ours = lib.dequantize(qtype, lib.quantize(qtype, x))
    ref = reference_dequantize(qtype, reference_quantize(qtype, x).reshape(-1, QUANT_SIZES[qtype][1]))
    rmse = np.sqrt(np.mean((ours.astype(np.float64) - x) ** 2))
    rmse_ref = np.sqrt(np.mean((ref.astype(np.float64) - x) ** 2))
    assert rmse <= rmse_ref * 1.01 + 1e-12


def offset_term_bound(qtype, x_raw, y_raw):
    """Sum over blocks of |m_x * s_y| * 2^-11: what the half rounding of s = d * sum(q) can cost."""
    if qtype not in (T.Q4_1, T.Q5_1):
        return 0.0
    m = x_raw.reshape(-1, QUANT_SIZES[qtype][1])[:, 2:4].copy().view(np.float16).astype(np.float64)
    s = y_raw.reshape(-1, 36)[:, 2:4].copy().view(np.float16).astype(np.float64)
    return float(np.sum(np.abs(m * s))) * 2.0**-11


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0] + FLOATS, ids=lambda t: t.name)
def test_vec_dot_matches_dequantized_dot(qtype, isa):
    rng = np.random.default_rng(int(qtype) + 100)
    n = 4096
    for trial in range(4):
        x_raw = lib.quantize(qtype, rng.standard_normal(n).astype(np.float32))
        y_type = lib.vec_dot_type(qtype)
        y_raw = lib.quantize(y_type, rng.standard_normal(n).astype(np.float32) * (trial + 1))
        xd = lib.dequantize(qtype, x_raw).astype(np.float64)
        yd = lib.dequantize(y_type, y_raw).astype(np.float64)
        ref = float(np.dot(xd, yd))
        got = lib.vec_dot(qtype, x_raw, y_raw, n, isa)
        bound = 2e-5 * float(np.sum(np.abs(xd * yd))) + offset_term_bound(qtype, x_raw, y_raw)
        assert abs(got - ref) <= bound, (got, ref, bound)


def model_path():
    script = os.path.join(os.environ.get("KILN_SOURCE_DIR", "."), "scripts", "fetch-model.sh")
    return subprocess.run([script], check=True, capture_output=True, text=True).stdout.strip()


def test_dequantize_every_model_tensor():
    reader = GGUFReader(model_path())
    seen = set()
    for tensor in reader.tensors:
        qtype = T(tensor.tensor_type)
        seen.add(qtype)
        raw = np.asarray(tensor.data).view(np.uint8).reshape(-1)
        ref = reference_dequantize(qtype, raw.reshape(-1, QUANT_SIZES[qtype][1])).view(np.uint32)
        for isa in ISAS:
            ours = lib.dequantize(qtype, raw, isa)
            assert np.array_equal(ours.view(np.uint32), ref), (tensor.name, isa)
    assert {T.Q4_1, T.Q8_0, T.F32} <= seen
