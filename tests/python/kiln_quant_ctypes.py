"""ctypes access to kiln's quant kernels (the kiln_quant_py shared library built from the quant and util modules).

Every function works on numpy arrays and goes through kiln_quant_ops_get(), so the ISA can be chosen per call:
    lib = KilnQuant()                       # finds the library via $KILN_QUANT_LIB or $KILN_BUILD_DIR
    y = lib.dequantize(GGMLQuantizationType.Q4_0, raw_bytes, isa="avx2")
    q = lib.quantize(GGMLQuantizationType.Q8_0, floats)
    s = lib.vec_dot(GGMLQuantizationType.Q4_0, raw_row, quantized_activations)
Types are plain ints (GGUF type ids), so gguf.GGMLQuantizationType members work directly.
"""

import ctypes
import os
import pathlib

import numpy as np
from gguf import GGML_QUANT_SIZES

ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}

# gguf still lists Q8_1 with the old float d and s (40 bytes); ggml and kiln store them as halves (36 bytes).
QUANT_SIZES = dict(GGML_QUANT_SIZES)
QUANT_SIZES[9] = (32, 36)


class Ops(ctypes.Structure):
    _fields_ = [
        ("dequantize", ctypes.c_void_p),
        ("quantize", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
    ]


DEQUANTIZE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
QUANTIZE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT_FN = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


def library_path():
    if "KILN_QUANT_LIB" in os.environ:
        return os.environ["KILN_QUANT_LIB"]
    build = pathlib.Path(os.environ.get("KILN_BUILD_DIR", "build"))
    return str(build / "tests" / "quant" / "libkiln_quant_py.so")


def _ptr(a):
    return ctypes.c_void_p(a.ctypes.data)


class KilnQuant:
    def __init__(self, path=None):
        self.lib = ctypes.CDLL(path or library_path())
        self.lib.kiln_quant_ops_get.restype = ctypes.POINTER(Ops)
        self.lib.kiln_quant_ops_get.argtypes = [ctypes.c_int, ctypes.c_int]
        self.lib.kiln_cpu_isa.restype = ctypes.c_int

    def cpu_isas(self):
        """Names of the ISAs this CPU runs (honouring the KILN_ISA override), lowest first."""
        best = self.lib.kiln_cpu_isa()
        return [name for name, level in ISAS.items() if level <= best]

    def ops(self, qtype, isa="scalar"):
        """The ops struct for a type, or None if kiln has none."""
        p = self.lib.kiln_quant_ops_get(int(qtype), ISAS[isa])
        return p.contents if p else None

    def _fn(self, qtype, isa, what, prototype):
        ops = self.ops(qtype, isa)
        address = getattr(ops, what) if ops is not None else None
        if address is None:
            raise ValueError(f"kiln has no {what} for type {int(qtype)} at ISA {isa}")
        return prototype(address)

    def has(self, qtype, what="dequantize"):
        ops = self.ops(qtype)
        return ops is not None and getattr(ops, what) is not None

    @staticmethod
    def row_bytes(qtype, n):
        block, size = QUANT_SIZES[qtype]
        assert n % block == 0
        return n // block * size

    def dequantize(self, qtype, raw, isa="scalar"):
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        block, size = QUANT_SIZES[qtype]
        assert raw.size % size == 0
        n = raw.size // size * block
        out = np.empty(n, dtype=np.float32)
        self._fn(qtype, isa, "dequantize", DEQUANTIZE_FN)(_ptr(raw), _ptr(out), n)
        return out

    def quantize(self, qtype, x, isa="scalar"):
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        out = np.empty(self.row_bytes(qtype, x.size), dtype=np.uint8)
        self._fn(qtype, isa, "quantize", QUANTIZE_FN)(_ptr(x), _ptr(out), x.size)
        return out

    def vec_dot(self, qtype, x_raw, y_raw, n, isa="scalar"):
        """Dot product of a row of qtype (raw bytes) with activations already in the type's vec_dot_type."""
        x_raw = np.ascontiguousarray(x_raw).reshape(-1).view(np.uint8)
        y_raw = np.ascontiguousarray(y_raw).reshape(-1).view(np.uint8)
        return self._fn(qtype, isa, "vec_dot", VEC_DOT_FN)(n, _ptr(x_raw), _ptr(y_raw))

    def vec_dot_type(self, qtype):
        return self.ops(qtype).vec_dot_type
