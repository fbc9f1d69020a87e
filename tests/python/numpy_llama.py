"""An independent llama/qwen2 forward pass in numpy, the reference kiln's logits are checked against.

It reads the GGUF with the `gguf` package and its numpy dequantizers, and follows the Hugging Face formulation
rather than kiln's: llama Q/K weights are permuted back to the HF layout (the GGUF converter interleaves them so
that llama.cpp can rotate adjacent pairs) and rope uses HF's rotate_half. Norms, rope and softmax run in float64;
matrix products in float32 BLAS (about 1e-6 relative error, far inside the 1e-4 the tests ask).

    python3 numpy_llama.py MODEL.gguf 1,2,3 [N]   prints the greedy continuation of N tokens (ids)
"""
import os
import sys

# one BLAS thread: on a shared machine OpenBLAS worker threads spin against other jobs (50x slower here)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


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
        self.output = self.weight("output.weight") if "output.weight" in self.tensors else self.embd
        freq_factors = self.weight("rope_freqs.weight") if "rope_freqs.weight" in self.tensors else 1.0
        exps = np.arange(0, self.rope_dim, 2, dtype=np.float64) / self.rope_dim
        self.inv_freq = 1.0 / (self.rope_base ** exps) / freq_factors

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
        w = self.weight(name)
        if self.arch != "llama":
            return w
        rows = w.shape[0]
        return w.reshape(n_head, self.head_dim // 2, 2, -1).swapaxes(1, 2).reshape(rows, -1)

    def bias(self, name):
        return self.weight(name).astype(np.float64) if name in self.tensors else 0.0


def mm(x, w):
    """x @ w.T with float32 weights, without converting the weights to float64 on every call."""
    return (x.astype(np.float32) @ w.T).astype(np.float64)


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


def forward(m, ids):
    """Logits (len(ids), n_vocab), float64, for a sequence starting at position 0."""
    T = len(ids)
    pos = np.arange(T)
    x = m.embd[np.asarray(ids)].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    group = m.n_head // m.n_head_kv
    for l in range(m.n_layer):
        p = f"blk.{l}."
        h = rmsnorm(x, m.weight(p + "attn_norm.weight"), m.eps)
        q = mm(h, m.qk_weight(p + "attn_q.weight", m.n_head)) + m.bias(p + "attn_q.bias")
        k = mm(h, m.qk_weight(p + "attn_k.weight", m.n_head_kv)) + m.bias(p + "attn_k.bias")
        v = mm(h, m.weight(p + "attn_v.weight")) + m.bias(p + "attn_v.bias")
        q = rope(q.reshape(T, m.n_head, m.head_dim), pos, m.inv_freq, m.rope_dim)
        k = rope(k.reshape(T, m.n_head_kv, m.head_dim), pos, m.inv_freq, m.rope_dim)
        v = v.reshape(T, m.n_head_kv, m.head_dim)
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(m.head_dim) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", scores, v).reshape(T, -1)
        x = x + mm(o, m.weight(p + "attn_output.weight"))
        h = rmsnorm(x, m.weight(p + "ffn_norm.weight"), m.eps)
        gate = mm(h, m.weight(p + "ffn_gate.weight"))
        up = mm(h, m.weight(p + "ffn_up.weight"))
        x = x + mm(gate / (1.0 + np.exp(-gate)) * up, m.weight(p + "ffn_down.weight"))
    x = rmsnorm(x, m.weight("output_norm.weight"), m.eps)
    return mm(x, m.output)


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
