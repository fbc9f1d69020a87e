"""kiln's GGUF writer output read by the reference Python reader (gguf.GGUFReader): metadata and tensor bytes."""
import os
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
VT = gguf.GGUFValueType


def fill(n, seed):
    # the pattern test_gguf_writer.c writes into tensor `seed`
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(131) + np.uint64(seed * 17)) >> np.uint64(1)).astype(np.uint8)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    exe = os.environ.get("KILN_GGUF_WRITER_TEST")
    if not exe:
        pytest.skip("KILN_GGUF_WRITER_TEST not set (run through ctest)")
    path = str(tmp_path_factory.mktemp("gguf") / "all_types.gguf")
    subprocess.run([exe], check=True, capture_output=True, env=dict(os.environ, KILN_GGUF_WRITE_OUT=path))
    return gguf.GGUFReader(path)


def test_scalars(written):
    f = written.fields
    assert f["GGUF.version"].contents() == 3
    expect = {
        "general.architecture": (VT.STRING, "llama"),
        "general.alignment": (VT.UINT32, 64),
        "llama.block_count": (VT.UINT32, 1),
        "test.i32": (VT.INT32, -7),
        "test.u64": (VT.UINT64, 1 << 50),
        "test.f32": (VT.FLOAT32, float(np.float32(0.1))),
        "test.bool": (VT.BOOL, True),
        "test.u8": (VT.UINT8, 255),
        "test.i8": (VT.INT8, -128),
        "test.u16": (VT.UINT16, 65535),
        "test.i16": (VT.INT16, -300),
        "test.i64": (VT.INT64, -(1 << 60)),
        "test.f64": (VT.FLOAT64, 3.141592653589793),
    }
    for key, (vt, value) in expect.items():
        assert f[key].types == [vt], key
        assert f[key].contents() == value, key


def test_arrays(written):
    f = written.fields
    assert f["tokenizer.ggml.tokens"].types == [VT.ARRAY, VT.STRING]
    assert f["tokenizer.ggml.tokens"].contents() == ["<unk>", "<s>", "</s>", "\u2581hello", ""]
    assert f["tokenizer.ggml.scores"].contents() == [0.0, -1.5, 2.25, -1000.0, 7.0]
    assert f["tokenizer.ggml.token_type"].types == [VT.ARRAY, VT.INT32]
    assert f["tokenizer.ggml.token_type"].contents() == [2, 3, 3, 1, 1]
    assert f["test.bools"].contents() == [True, False, True]
    assert f["test.u64s"].contents() == [1, 2**64 - 1]
    assert f["test.empty"].contents() == []
    # gguf's reader flattens nested arrays, so look at the leaf parts it found: [[1, 2, 3] as i16, ["x"]]
    nested = f["test.nested"]
    assert nested.types[:3] == [VT.ARRAY, VT.ARRAY, VT.INT16]
    leaves = [nested.parts[i] for i in nested.data]
    assert [int(p[0]) for p in leaves[:3]] == [1, 2, 3]
    assert bytes(leaves[3]) == b"x"


def test_tensors(written):
    expect = [
        ("token_embd.weight", gguf.GGMLQuantizationType.Q8_0, [64, 10]),
        ("blk.0.attn_norm.weight", gguf.GGMLQuantizationType.F32, [64]),
        ("blk.0.ffn_up.weight", gguf.GGMLQuantizationType.Q4_K, [256, 3]),
        ("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.F16, [5, 3, 2]),
        ("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q6_K, [256, 1, 2, 1]),
        ("output.weight", gguf.GGMLQuantizationType.BF16, [7, 3]),
    ]
    assert len(written.tensors) == len(expect)
    for i, (t, (name, qtype, shape)) in enumerate(zip(written.tensors, expect)):
        assert t.name == name
        assert t.tensor_type == qtype
        assert list(t.shape) == shape
        assert t.data_offset % 64 == 0
        raw = np.frombuffer(written.data[t.data_offset:t.data_offset + t.n_bytes], dtype=np.uint8)
        assert np.array_equal(raw, fill(t.n_bytes, i)), name
