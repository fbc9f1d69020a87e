"""kiln's k-quant kernels (Q2_K..Q6_K, Q8_K) against gguf's numpy code and numpy transcriptions of the reference
quantizers (through ctypes).

Bounds stated here:
- dequantize: bit-exact with gguf.quants (Q2_K..Q6_K) and with d * q (Q8_K, which gguf lacks), every ISA this CPU runs.
- quantize Q8_K: byte-exact with a numpy transcription of the reference rule (d = max / -127 signed, bsums), every
  ISA.
- quantize Q2_K..Q6_K: gguf has no k-quant quantizer, so the RMSE on normal data is compared with a vectorized numpy
  transcription of the reference algorithms below (same searches, weights and float operation order): kiln's RMSE
  <= 1.01 * numpy's, and, stronger, every dequantized value identical, on normal data and on the default model's
  weights.
- vec_dot with Q8_K activations vs dequantize-then-dot in float64, every ISA:
  |err| <= 1e-5 * sum_i |y_i| (|x_i| + 2 |m_i|), where m_i is the min offset (dmin * min) of x_i's sub-block, so the
  bound covers the cancellation between the scale and min terms of Q2_K/Q4_K/Q5_K.
"""

import os
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq

from kiln_quant_ctypes import KilnQuant

KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
Q8_K = T.Q8_K
QK = 256
# byte offsets of the half scales in each block: d first, then dmin where the type has one
HALF_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
BLOCK_BYTES = {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210, T.Q8_K: 292}
F32 = np.float32

lib = KilnQuant()
ISAS = lib.cpu_isas()


def random_halves(rng, count):
    """Finite halves of both signs over the whole exponent range, subnormals and zero included."""
    magnitude = rng.integers(0, 0x7C00, size=count, dtype=np.uint16)
    return magnitude | (rng.integers(0, 2, size=count, dtype=np.uint16) << 15)


def random_blocks(rng, qtype, n_blocks):
    raw = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype == Q8_K:
        raw[:, 0:4] = (rng.standard_normal(n_blocks).astype(F32) * F32(1e-2)).view(np.uint8).reshape(n_blocks, 4)
    else:
        for off in HALF_FIELDS[qtype]:
            raw[:, off : off + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def q8_k_fields(raw):
    raw = raw.reshape(-1, BLOCK_BYTES[Q8_K])
    d = raw[:, 0:4].copy().view(F32)
    qs = raw[:, 4:260].view(np.int8)
    bsums = raw[:, 260:292].copy().view(np.int16)
    return d, qs, bsums


def reference_dequantize(qtype, raw):
    raw = raw.reshape(-1, BLOCK_BYTES[qtype])
    if qtype == Q8_K:
        d, qs, _ = q8_k_fields(raw)
        return (d * qs.astype(F32)).reshape(-1)
    return gq.dequantize(raw, qtype).reshape(-1).astype(F32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", KQUANTS + [Q8_K], ids=lambda t: t.name)
def test_dequantize_matches_gguf(qtype, isa):
    rng = np.random.default_rng(int(qtype) * 7 + 1)
    raw = random_blocks(rng, qtype, 37)
    ours = lib.dequantize(qtype, raw, isa)
    np.testing.assert_array_equal(ours.view(np.uint32), reference_dequantize(qtype, raw).view(np.uint32))


# ---- numpy transcription of the reference quantizers (vectorized over sub-blocks) ----


# Sums below are running sums (cumsum), in the reference's order, so that float rounding matches it too.


def nearest_int(v):
    return np.rint(np.clip(v, F32(-4194303), F32(4194303))).astype(np.int32)


def extreme(x):
    """The signed value of largest magnitude per row (first on ties)."""
    return x[np.arange(x.shape[0]), np.argmax(np.abs(x), axis=1)]


def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """Affine fit x ~ scale * L - min per row; returns scale, min (>= 0) and L."""
    mn = np.minimum(x.min(axis=1), F32(0))
    mx = x.max(axis=1)
    flat = mx == mn
    span = np.where(flat, F32(1), mx - mn)
    sum_w = w.cumsum(axis=1)[:, -1]
    sum_x = (w * x).cumsum(axis=1)[:, -1]

    def err(scale, m, L):
        diff = scale[:, None] * L + m[:, None] - x
        return (w * (np.abs(diff) if use_mad else diff * diff)).cumsum(axis=1)[:, -1]

    iscale = F32(nmax) / span
    scale = F32(1) / iscale
    L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(F32)
    best = err(scale, mn, L)
    for step in range(nstep + 1):
        # like the reference, each try measures the range from the best min found so far
        span = np.where(flat, F32(1), mx - mn)
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / span
        La = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(F32)
        sum_l = (w * La).cumsum(axis=1)[:, -1]
        sum_l2 = (w * La * La).cumsum(axis=1)[:, -1]
        sum_xl = (w * La * x).cumsum(axis=1)[:, -1]
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, F32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = this_min > 0
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, F32(1)), this_scale)
        e = err(this_scale, this_min, La)
        better = ok & (e < best)
        L = np.where(better[:, None], La, L)
        best = np.where(better, e, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    return np.where(flat, F32(0), scale), -mn, np.where(flat[:, None], F32(0), L)


def make_q3_quants(x, nmax=4):
    """Symmetric fit refined weight by weight (weights x^2); returns scale and signed levels."""
    mx = extreme(x)
    zero = np.abs(mx) < F32(1e-15)
    iscale = F32(-nmax) / np.where(zero, F32(1), mx)
    L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(F32)
    w = x * x
    sumlx = (w * x * L).cumsum(axis=1)[:, -1]
    suml2 = (w * L * L).cumsum(axis=1)[:, -1]
    for _ in range(5):
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i]
            slx = sumlx - wi * xi * li
            ok = slx > 0
            sl2 = suml2 - wi * li * li
            new = np.clip(nearest_int(xi * sl2 / np.where(ok, slx, F32(1))), -nmax, nmax - 1).astype(F32)
            ok &= new != li
            slx2 = slx + wi * xi * new
            sl22 = sl2 + wi * new * new
            take = ok & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(take, new, li)
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F32(1)), F32(0))
    return np.where(zero, F32(0), scale), L


def make_qx_quants(x, nmax=32):
    """Symmetric fit over 19 candidate scales (weights x^2); returns scale and signed levels."""
    mx = extreme(x)
    zero = np.abs(mx) < F32(1e-15)
    mx = np.where(zero, F32(1), mx)
    w = x * x

    def levels(iscale):
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(F32)
        return L, (w * x * L).cumsum(axis=1)[:, -1], (w * L * L).cumsum(axis=1)[:, -1]

    L, sumlx, suml2 = levels(F32(-nmax) / mx)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F32(1)), F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        La, slx, sl2 = levels(-(F32(nmax) + F32(0.1) * F32(step)) / mx)
        take = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(take[:, None], La, L)
        scale = np.where(take, slx / np.where(take, sl2, F32(1)), scale)
        best = np.where(take, scale * slx, best)
    return np.where(zero, F32(0), scale), L


def half(v):
    return v.astype(np.float16).astype(F32)


def requantize(x, dl, dm, L, lo, hi):
    """Levels recomputed with the scale the decoder will use; sub-blocks whose scale decodes to 0 keep theirs."""
    safe = np.where(dl == 0, F32(1), dl)
    new = np.clip(nearest_int((x + dm[..., None]) / safe[..., None]), lo, hi).astype(F32)
    return np.where((dl == 0)[..., None], L, new)


def numpy_roundtrip_affine(x, qtype):
    """Quantize then dequantize Q2_K / Q4_K / Q5_K the reference way."""
    B = x.shape[0]
    if qtype == T.Q2_K:
        groups, n, nmax, qmax = 16, 16, 3, 15
        xs = x.reshape(-1, n)
        sc, mins, L = make_qkx2_quants(xs, np.abs(xs), nmax, -0.5, 0.1, 15, True)
    else:
        groups, n, qmax = 8, 32, 63
        nmax, rmin, nstep = (15, -1.0, 20) if qtype == T.Q4_K else (31, -0.5, 15)
        xs = x.reshape(-1, n)
        av = np.sqrt((xs * xs).cumsum(axis=1)[:, -1] / F32(n))
        sc, mins, L = make_qkx2_quants(xs, av[:, None] + np.abs(xs), nmax, rmin, 0.1, nstep, False)
    sc, mins, L = sc.reshape(B, groups), mins.reshape(B, groups), L.reshape(B, groups, n)
    max_scale = np.maximum(sc.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_s = np.where(max_scale > 0, F32(qmax) / np.where(max_scale > 0, max_scale, F32(1)), F32(0))
    inv_m = np.where(max_min > 0, F32(qmax) / np.where(max_min > 0, max_min, F32(1)), F32(0))
    ls = np.clip(nearest_int(inv_s[:, None] * sc), 0, qmax).astype(F32)
    lm = np.clip(nearest_int(inv_m[:, None] * mins), 0, qmax).astype(F32)
    d, dmin = half(max_scale / F32(qmax)), half(max_min / F32(qmax))
    dl, dm = d[:, None] * ls, dmin[:, None] * lm
    L = requantize(x.reshape(B, groups, n), dl, dm, L, 0, nmax)
    return (dl[..., None] * L - dm[..., None]).reshape(-1)


def numpy_roundtrip_symmetric(x, qtype):
    """Quantize then dequantize Q3_K / Q6_K the reference way."""
    B = x.shape[0]
    xs = x.reshape(-1, 16)
    if qtype == T.Q3_K:
        sc, L = make_q3_quants(xs)
        smax, lmin, lmax, nq = 32, -4, 3, 4
    else:
        sc, L = make_qx_quants(xs)
        smax, lmin, lmax, nq = 128, -32, 31, 32
    sc, L = sc.reshape(B, 16), L.reshape(B, 16, 16)
    max_scale = extreme(sc)
    zero = np.abs(max_scale) < F32(1e-15)
    iscale = F32(-smax) / np.where(zero, F32(1), max_scale)
    ls = np.clip(nearest_int(iscale[:, None] * sc), -smax, smax - 1).astype(F32)
    d = np.where(zero, F32(0), half(F32(1) / iscale))
    dl = d[:, None] * ls
    L = requantize(x.reshape(B, 16, 16), dl, np.zeros_like(dl), L, lmin, lmax)
    return (dl[..., None] * L).reshape(-1)


def numpy_roundtrip(x, qtype):
    x = x.reshape(-1, QK).astype(F32)
    if qtype in (T.Q3_K, T.Q6_K):
        return numpy_roundtrip_symmetric(x, qtype)
    return numpy_roundtrip_affine(x, qtype)


def reference_quantize_q8_k(x):
    blocks = x.reshape(-1, QK).astype(F32)
    mx = extreme(blocks)
    zero = mx == 0
    iscale = F32(-127) / np.where(zero, F32(1), mx)
    qs = np.clip(nearest_int(iscale[:, None] * blocks), -127, 127).astype(np.int8)
    qs[zero] = 0
    d = np.where(zero, F32(0), F32(1) / iscale).astype(F32)
    bsums = qs.reshape(-1, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    return np.concatenate([d[:, None].view(np.uint8), qs.view(np.uint8), bsums.view(np.uint8)], axis=1).reshape(-1)


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_q8_k_matches_reference_bytes(isa):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, QK)).astype(F32) * np.logspace(-6, 3, 16, dtype=F32)[:, None]
    x[1] = 0
    x[2, 5], x[2, 9] = 7.0, -7.0  # a tie of magnitudes: the first wins
    np.testing.assert_array_equal(lib.quantize(Q8_K, x, isa), reference_quantize_q8_k(x))


def rmse(a, x):
    return float(np.sqrt(np.mean((a.astype(np.float64) - x) ** 2)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_quantize_rmse_matches_reference(qtype, isa):
    x = np.random.default_rng(5).standard_normal(QK * 128).astype(F32)
    ours_values = lib.dequantize(qtype, lib.quantize(qtype, x, isa))
    ref_values = numpy_roundtrip(x, qtype)
    ours, ref = rmse(ours_values, x), rmse(ref_values, x)
    same = float(np.mean(ours_values == ref_values))
    print(f"{qtype.name}: rmse kiln {ours:.6f} numpy reference {ref:.6f}, identical values {same:.4f}")
    assert ours <= ref * 1.01
    # the same algorithm, not just as good a one: with sums in the same order every value comes out the same
    assert same == 1.0


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_quantize_edge_rows(qtype):
    """All-zero, constant, tiny and huge rows decode to finite values close to the input."""
    x = np.zeros((5, QK), dtype=F32)
    x[1] = 3.0
    x[2] = np.linspace(-1e-30, 1e-30, QK)
    x[3] = np.linspace(-6e4, 6e4, QK)
    x[4, 7] = -1.0
    y = lib.dequantize(qtype, lib.quantize(qtype, x)).reshape(5, QK)
    assert np.all(np.isfinite(y))
    assert np.all(y[0] == 0)
    assert np.max(np.abs(y[3] - x[3])) < 0.25 * 6e4


def min_offsets(qtype, raw):
    """|m_i| per weight: dequantizing with d zeroed leaves -dmin * min."""
    if qtype not in (T.Q2_K, T.Q4_K, T.Q5_K):
        return 0.0
    raw = raw.reshape(-1, BLOCK_BYTES[qtype]).copy()
    off = HALF_FIELDS[qtype][0]
    raw[:, off : off + 2] = 0
    return np.abs(gq.dequantize(raw, qtype).reshape(-1).astype(np.float64))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_vec_dot_matches_dequantized_dot(qtype, isa):
    rng = np.random.default_rng(int(qtype) + 100)
    n = 4096
    assert lib.vec_dot_type(qtype) == Q8_K
    for trial in range(4):
        if trial < 2:
            x_raw = lib.quantize(qtype, rng.standard_normal(n).astype(F32))
        else:
            x_raw = random_blocks(rng, qtype, n // QK).reshape(-1)
        y_raw = lib.quantize(Q8_K, rng.standard_normal(n).astype(F32) * F32(trial + 1))
        xd = reference_dequantize(qtype, x_raw).astype(np.float64)
        yd = reference_dequantize(Q8_K, y_raw).astype(np.float64)
        ref = float(np.dot(xd, yd))
        got = lib.vec_dot(qtype, x_raw, y_raw, n, isa)
        bound = 1e-5 * float(np.sum(np.abs(yd) * (np.abs(xd) + 2 * min_offsets(qtype, x_raw))))
        assert abs(got - ref) <= bound, (got, ref, bound)


def test_vec_dot_q8_k_with_itself():
    rng = np.random.default_rng(8)
    n = 4096
    x_raw = lib.quantize(Q8_K, rng.standard_normal(n).astype(F32))
    y_raw = lib.quantize(Q8_K, rng.standard_normal(n).astype(F32))
    xd = reference_dequantize(Q8_K, x_raw).astype(np.float64)
    yd = reference_dequantize(Q8_K, y_raw).astype(np.float64)
    got = lib.vec_dot(Q8_K, x_raw, y_raw, n, ISAS[-1])
    assert abs(got - float(np.dot(xd, yd))) <= 1e-5 * float(np.sum(np.abs(xd * yd)))


def model_path():
    script = os.path.join(os.environ.get("KILN_SOURCE_DIR", "."), "scripts", "fetch-model.sh")
    return subprocess.run([script], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def model_rows():
    """Real weights: slices of a few tensors of the default model, dequantized by gguf."""
    reader = GGUFReader(model_path())
    tensors = {t.name: t for t in reader.tensors}
    rows = {}
    for name, n_rows in (("token_embd.weight", 256), ("blk.0.attn_q.weight", 128), ("blk.0.ffn_down.weight", 64)):
        t = tensors[name]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        row_bytes = raw.size // int(np.prod(t.shape[1:]))
        x = gq.dequantize(raw[: n_rows * row_bytes], t.tensor_type).reshape(n_rows, int(t.shape[0]))
        # 576-wide rows are no multiple of 256: regroup the same weights as rows of 1536
        rows[name] = np.ascontiguousarray(x, dtype=F32).reshape(-1, 1536)
    return rows


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_model_tensors_roundtrip(qtype, model_rows):
    """On real weights: gguf decodes kiln's blocks bit for bit, the quantizer matches the numpy transcription, and the
    fastest vec_dot stays within its bound."""
    rng = np.random.default_rng(11)
    for name, x in model_rows.items():
        raw = lib.quantize(qtype, x, ISAS[-1])
        ours = lib.dequantize(qtype, raw, ISAS[-1])
        np.testing.assert_array_equal(ours.view(np.uint32), reference_dequantize(qtype, raw).view(np.uint32))
        ref = numpy_roundtrip(x.reshape(-1), qtype)
        assert rmse(ours, x.reshape(-1)) <= rmse(ref, x.reshape(-1)) * 1.01, name
        np.testing.assert_array_equal(ours, ref, err_msg=name)
        n = x.shape[1]
        row_bytes = raw.size // x.shape[0]
        y_raw = lib.quantize(Q8_K, rng.standard_normal(n).astype(F32))
        yd = reference_dequantize(Q8_K, y_raw).astype(np.float64)
        for r in range(0, x.shape[0], 16):
            x_row = raw[r * row_bytes : (r + 1) * row_bytes]
            xd = reference_dequantize(qtype, x_row).astype(np.float64)
            got = lib.vec_dot(qtype, x_row, y_raw, n, ISAS[-1])
            bound = 1e-5 * float(np.sum(np.abs(yd) * (np.abs(xd) + 2 * min_offsets(qtype, x_row))))
            assert abs(got - float(np.dot(xd, yd))) <= bound, (name, r)
