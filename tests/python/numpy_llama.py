"""An independent llama/qwen2/gemma3 forward pass in numpy, the reference kiln's logits are checked against.

It reads the GGUF with the `gguf` package and its numpy dequantizers, and follows the Hugging Face formulation
rather than kiln's: llama Q/K weights are permuted back to the HF layout (the GGUF converter interleaves them so
that llama.cpp can rotate adjacent pairs) and rope uses HF's rotate_half. Norms, rope and softmax run in float64;
matrix products in float32 BLAS (about 1e-6 relative error, far inside the 1e-4 the tests ask).

Gemma 3 as Hugging Face's Gemma3ForCausalLM computes it: the embedding times sqrt(n_embd), each query and key head
RMS-normalized before rope, each block's output normalized before the residual add, GELU (tanh form) gating, five
sliding-window layers (window of attention.sliding_window positions, rope base 10000) to one global layer. The norm
weights are used as the GGUF holds them: the converter has already added Gemma's 1.

forward(..., fast=True) also rounds what kiln's fast path rounds, so that path can be checked tightly too: the input
of every matrix product is quantized to the 8-bit format kiln's dot product for that weight type takes (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for k-quants; same blocks, scales and rounding as src/quant's
quantize_row_q8_*), and keys and values are rounded to float16 as kiln's default KV cache stores them.

    python3 numpy_llama.py MODEL.gguf 1,2,3 [N]   prints the greedy continuation of N tokens (ids)
"""
import os
import sys

# one BLAS thread: on a shared machine OpenBLAS worker threads spin against other jobs (50x slower here)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# the activation format of each weight type's dot product in kiln's fast path (src/quant's vec_dot_type)
ACTIVATION = {Q.Q4_0: Q.Q8_0, Q.Q5_0: Q.Q8_0, Q.Q8_0: Q.Q8_0, Q.Q4_1: Q.Q8_1, Q.Q5_1: Q.Q8_1,
              Q.Q2_K: Q.Q8_K, Q.Q3_K: Q.Q8_K, Q.Q4_K: Q.Q8_K, Q.Q5_K: Q.Q8_K, Q.Q6_K: Q.Q8_K}
# block bytes of the types whose blocks start with halves d and m (weight = d * q + m)
OFFSET_BLOCK_BYTES = {Q.Q4_1: 20, Q.Q5_1: 24}


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.fields = {k: f for k, f in r.fields.items()}
        self.tensors = {t.name: t for t in r.tensors}
        self.cache = {}
        self.arch = self._get("general.architecture")
        a = self.arch
        self.n_embd = int(self._get(f"{a}.embedding_length"))
        self.n_layer = int(self._get(f"{a}.block_count"))
        self.n_head = int(self._get(f"{a}.attention.head_count"))
        self.n_head_kv = int(self._get(f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(self._get(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.eps = float(self._get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(self._get(f"{a}.rope.freq_base", 10000.0))
        self.rope_dim = int(self._get(f"{a}.rope.dimension_count", self.head_dim))
        self.embd = self.weight("token_embd.weight")
        freq_factors = self.weight("rope_freqs.weight") if "rope_freqs.weight" in self.tensors else 1.0
        exps = np.arange(0, self.rope_dim, 2, dtype=np.float64) / self.rope_dim
        self.inv_freq = 1.0 / (self.rope_base ** exps) / freq_factors
        self.gemma3 = a == "gemma3"
        self.n_swa = int(self._get(f"{a}.attention.sliding_window", 0)) if self.gemma3 else 0
        self.inv_freq_swa = 1.0 / (10000.0 ** exps)
        # Gemma 3 27B (62 layers) scales queries by n_embd / n_head, its query_pre_attn_scalar
        self.attn_scale = 1.0 / np.sqrt(self.n_embd // self.n_head if self.gemma3 and self.n_layer == 62
                                        else self.head_dim)

    def sliding(self, layer):
        """Whether a layer attends through the sliding window: all but every sixth, in Gemma 3."""
        return self.n_swa > 0 and (layer + 1) % 6 != 0

    def _get(self, key, default=None):
        f = self.fields.get(key)
        if f is None:
            if default is None:
                raise KeyError(key)
            return default
        return f.contents()

    def weight(self, name):
        """A tensor as float32 numpy, shape (rows, row_length) for matrices (dequantized once, then cached)."""
        if name not in self.cache:
            self.cache[name] = self._dequantize(name)
        return self.cache[name]

    def _dequantize(self, name):
        t = self.tensors[name]
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]
        return w.reshape(shape) if len(shape) > 1 else w.reshape(-1)

    def qk_weight(self, name, n_head):
        """Undoes the llama converter's row interleave, giving the HF layout (rotate_half pairs i, i + d/2)."""
        return self.unpermute(self.weight(name), n_head)

    def unpermute(self, rows_of, n_head):
        """Any per-row array of a Q/K weight, in the HF row order (n_head None: not a Q/K weight)."""
        if n_head is None or self.arch != "llama":
            return rows_of
        return rows_of.reshape(n_head, self.head_dim // 2, 2, -1).swapaxes(1, 2).reshape(rows_of.shape[0], -1)

    def offset_split(self, name):
        """An offset type's weight as d * q (float32, m left out) and its m per row and block."""
        key = name + "#offset"
        if key not in self.cache:
            t = self.tensors[name]
            blocks = np.array(t.data).reshape(-1, OFFSET_BLOCK_BYTES[t.tensor_type])
            m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
            blocks[:, 2:4] = 0
            w = dequantize(blocks.reshape(t.data.shape), t.tensor_type).astype(np.float32)
            rows = int(t.shape[-1]) if len(t.shape) > 1 else 1
            self.cache[key] = (w.reshape(rows, -1), m.reshape(rows, -1))
        return self.cache[key]

    def bias(self, name):
        return self.weight(name).astype(np.float64) if name in self.tensors else 0.0


def mm(x, w):
    """x @ w.T with float32 weights, without converting the weights to float64 on every call."""
    return (x.astype(np.float32) @ w.T).astype(np.float64)


def round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)


def quantize_q8(x):
    """Rows of x as kiln's quantize_row_q8_0/q8_1 make them: per 32 values d = amax / 127 and q = round(x * (1/d)),
    ties away from zero, all in float32. Returns q, d rounded to float16, and Q8_1's s = f16(d * sum(q)), per block."""
    xb = x.astype(np.float32).reshape(len(x), -1, 32)
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = round_half_away(xb * inv)
    s = (q.sum(axis=-1, keepdims=True).astype(np.float32) * d).astype(np.float16)
    return q, d.astype(np.float16).astype(np.float64), s.astype(np.float64)[..., 0]


def quantize_q8_K(x):
    """Rows of x through kiln's quantize_row_q8_K and back: per 256 values, iscale = -127 / (the value of largest
    magnitude, the first one on ties), q = iscale * x rounded half to even, d = 1 / iscale, all in float32."""
    xb = x.astype(np.float32).reshape(len(x), -1, 256)
    top = np.take_along_axis(xb, np.abs(xb).argmax(axis=-1)[..., None], axis=-1)
    iscale = np.divide(np.float32(-127), top, out=np.zeros_like(top), where=top != 0)
    q = np.clip(np.rint(iscale * xb), -127, 127)
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(len(x), -1)


def linear(m, x, name, n_head=None, fast=False):
    """x @ W.T for the weight called name (n_head: a Q/K weight, rows in the HF order). fast: as kiln's fast path
    computes it, with x quantized to the activation format of the weight's type."""
    t = m.tensors[name]
    act = ACTIVATION.get(t.tensor_type) if fast else None
    if act is None:
        return mm(x, m.unpermute(m.weight(name), n_head))
    if act == Q.Q8_K:
        return mm(quantize_q8_K(x), m.unpermute(m.weight(name), n_head))
    q, d, s = quantize_q8(x)
    xq = (q * d).reshape(len(x), -1)  # exact in float32: 8-bit q times an 11-bit d
    if t.tensor_type not in OFFSET_BLOCK_BYTES:
        return mm(xq, m.unpermute(m.weight(name), n_head))
    # offset weights: d_x d_y (q_x . q_y) per block, plus m_x s_y where s_y is the block's own rounded sum
    w, offsets = m.offset_split(name)
    return mm(xq, m.unpermute(w, n_head)) + s @ m.unpermute(offsets, n_head).T.astype(np.float64)


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope(x, positions, inv_freq, rope_dim):
    """HF rotary embedding on the first rope_dim dims of each head; x: (T, heads, head_dim)."""
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    half = rope_dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return np.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(m, ids, fast=False, kv_f16=None, rows=None):
    """Logits (len(ids), n_vocab), float64, for a sequence starting at position 0; rows: only those positions'.
    fast: round as kiln's fast path does (quantized matmul inputs, keys and values through float16 unless kv_f16 is
    False)."""
    kv_f16 = fast if kv_f16 is None else kv_f16
    T = len(ids)
    pos = np.arange(T)
    x = m.embd[np.asarray(ids)].astype(np.float64)
    if m.gemma3:
        x = x * np.sqrt(m.n_embd)
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    window = causal + np.tril(np.full((T, T), -np.inf), k=-m.n_swa) if m.n_swa else causal
    group = m.n_head // m.n_head_kv
    output = "output.weight" if "output.weight" in m.tensors else "token_embd.weight"
    for l in range(m.n_layer):
        p = f"blk.{l}."
        h = rmsnorm(x, m.weight(p + "attn_norm.weight"), m.eps)
        q = linear(m, h, p + "attn_q.weight", m.n_head, fast) + m.bias(p + "attn_q.bias")
        k = linear(m, h, p + "attn_k.weight", m.n_head_kv, fast) + m.bias(p + "attn_k.bias")
        v = linear(m, h, p + "attn_v.weight", fast=fast) + m.bias(p + "attn_v.bias")
        q, k = q.reshape(T, m.n_head, m.head_dim), k.reshape(T, m.n_head_kv, m.head_dim)
        if m.gemma3:
            q = rmsnorm(q, m.weight(p + "attn_q_norm.weight"), m.eps)
            k = rmsnorm(k, m.weight(p + "attn_k_norm.weight"), m.eps)
        inv_freq = m.inv_freq_swa if m.sliding(l) else m.inv_freq
        q = rope(q, pos, inv_freq, m.rope_dim)
        k = rope(k, pos, inv_freq, m.rope_dim)
        v = v.reshape(T, m.n_head_kv, m.head_dim)
        if kv_f16:
            k, v = (a.astype(np.float32).astype(np.float16).astype(np.float64) for a in (k, v))
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) * m.attn_scale + (window if m.sliding(l) else causal)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", scores, v).reshape(T, -1)
        o = linear(m, o, p + "attn_output.weight", fast=fast)
        if m.gemma3:
            o = rmsnorm(o, m.weight(p + "post_attention_norm.weight"), m.eps)
        x = x + o
        h = rmsnorm(x, m.weight(p + "ffn_norm.weight"), m.eps)
        gate = linear(m, h, p + "ffn_gate.weight", fast=fast)
        up = linear(m, h, p + "ffn_up.weight", fast=fast)
        act = gelu_tanh(gate) if m.gemma3 else gate / (1.0 + np.exp(-gate))
        f = linear(m, act * up, p + "ffn_down.weight", fast=fast)
        if m.gemma3:
            f = rmsnorm(f, m.weight(p + "post_ffw_norm.weight"), m.eps)
        x = x + f
    x = rmsnorm(x if rows is None else x[rows], m.weight("output_norm.weight"), m.eps)
    return linear(m, x, output, fast=fast)


def greedy(m, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(forward(m, ids)[-1]))
        out.append(nxt)
        ids.append(nxt)
    return out


if __name__ == "__main__":
    model = Model(sys.argv[1])
    prompt = [int(t) for t in sys.argv[2].split(",")]
    print(",".join(str(t) for t in greedy(model, prompt, int(sys.argv[3]) if len(sys.argv) > 3 else 8)))
