"""cudattn._spec.validate / cudattn._spec.dtypes: good arguments become a Problem with element
strides in (batch, seq, head) order, and the dtype tables and spellings. No GPU needed: device
arrays are faked by a class with shape / strides (bytes) / dtype / ptr. The refusals are in
test_validate_errors.py.
"""

from __future__ import annotations

import fractions
import math

import ml_dtypes
import numpy as np
import pytest

from cudattn._spec import dtypes as _dtypes
from cudattn._spec.geometry import TensorGeom
from cudattn._spec.problem import Problem
from cudattn._spec.validate import validate
from _validate_cases import BF16, F16, FP8, FakeDeviceArray, arrays, device


def elem_geom(a: np.ndarray, layout: str) -> TensorGeom:
    s = [x // a.itemsize for x in a.strides]
    return TensorGeom(s[0], s[1], s[2]) if layout == "bshd" else TensorGeom(s[0], s[2], s[1])


# ---- valid calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_valid_problem_fields(host, layout, dtype):
    q, k, v = arrays(layout, B=3, Sq=5, Sk=7, Hq=6, Hkv=2, D=40, dtype=dtype)
    args = (q, k, v) if host else device(q, k, v)
    p = validate(*args, layout=layout, causal=True, return_lse=True, host=host)
    assert isinstance(p, Problem)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim) == (3, 5, 7, 6, 2, 40)
    assert p.group_size == 3
    assert p.dtype == dtype and p.out_dtype == dtype
    assert p.layout == layout and p.causal is True and p.return_lse is True and p.host is host
    assert p.scale == pytest.approx(1 / math.sqrt(40)) and isinstance(p.scale, float)
    assert p.q_strides == elem_geom(q, layout)
    assert p.k_strides == elem_geom(k, layout)
    assert p.v_strides == elem_geom(v, layout)
    assert p.out_strides is None


def test_contiguous_strides_by_layout():
    q, k, v = arrays("bshd", B=2, Sq=5, Sk=7, Hq=4, Hkv=2, D=64)
    p = validate(q, k, v)  # defaults: bshd, not causal, host inferred
    assert p.host is True and p.layout == "bshd" and p.causal is False and p.return_lse is False
    assert p.q_strides == TensorGeom(batch=5 * 4 * 64, seq=4 * 64, head=64)
    assert p.k_strides == TensorGeom(batch=7 * 2 * 64, seq=2 * 64, head=64)
    q, k, v = arrays("bhsd", B=2, Sq=5, Sk=7, Hq=4, Hkv=2, D=64)
    p = validate(q, k, v, layout="bhsd")
    assert p.q_strides == TensorGeom(batch=4 * 5 * 64, seq=64, head=5 * 64)
    assert p.v_strides == TensorGeom(batch=2 * 7 * 64, seq=64, head=7 * 64)


def test_strided_views_keep_their_strides():
    big = np.zeros((2, 5, 8, 64), np.float16)
    q = big[:, :, ::2, :]  # every other head: head stride doubled
    v = np.zeros((2, 7, 2, 128), np.float16)[..., :64]  # half of a wider head dim
    k = np.zeros((2, 7, 2, 64), np.float16)
    p = validate(q, k, v)
    assert p.q_strides == TensorGeom(batch=5 * 8 * 64, seq=8 * 64, head=2 * 64)
    assert p.v_strides == TensorGeom(batch=7 * 2 * 128, seq=2 * 128, head=128)
    # the same views handed over as device arrays
    p2 = validate(*device(q, k, v), host=False)
    assert (p2.q_strides, p2.k_strides, p2.v_strides) == (p.q_strides, p.k_strides, p.v_strides)
    # bhsd: a sequence slice with a stride
    qb = np.zeros((2, 4, 10, 64), np.float16)[:, :, ::2, :]
    kb = np.zeros((2, 2, 7, 64), np.float16)
    p3 = validate(qb, kb, kb, layout="bhsd")
    assert p3.q_strides == TensorGeom(batch=4 * 10 * 64, seq=2 * 64, head=10 * 64)
    # k and v may be transposed views of another layout's buffer, e.g. bshd data read as bhsd
    kt = np.zeros((2, 7, 2, 64), np.float16).transpose(0, 2, 1, 3)
    p4 = validate(qb, kt, kt, layout="bhsd")
    assert p4.k_strides == TensorGeom(batch=7 * 2 * 64, seq=2 * 64, head=64)


def test_extent_one_axes_ignore_their_strides():
    # batch=1 and heads=1 axes are never stepped along: odd or negative strides there are fine
    q = FakeDeviceArray((1, 5, 1, 64), strides=(8, 128, -2, 2))
    k = FakeDeviceArray((1, 7, 1, 64), strides=(3, 128, 128, 2), ptr=0x1000)
    p = validate(q, k, k, host=False)
    assert p.q_strides == TensorGeom(batch=0, seq=64, head=0)
    assert p.k_strides == TensorGeom(batch=0, seq=64, head=64)
    # a usable stride on an extent-1 axis is kept as is
    q = FakeDeviceArray((1, 5, 1, 64), strides=(5 * 128, 128, 128, 2))
    assert validate(q, k, k, host=False).q_strides == TensorGeom(batch=5 * 64, seq=64, head=64)


def test_broadcast_inputs_are_accepted():
    # stride 0 on an input axis (one kv head read for all) is legal: inputs are only read
    k = np.broadcast_to(np.zeros((2, 7, 1, 64), np.float16), (2, 7, 4, 64))
    q = np.zeros((2, 5, 4, 64), np.float16)
    assert validate(q, k, k).k_strides == TensorGeom(batch=7 * 64, seq=64, head=0)


@pytest.mark.parametrize("D", [8, 16, 72, 128, 200, 256])
def test_supported_head_dims(D):
    q, k, v = arrays(D=D)
    assert validate(q, k, v).head_dim == D


@pytest.mark.parametrize(
    "scale,want",
    [(None, 1 / 8), (0.5, 0.5), (-0.25, -0.25), (0.0, 0.0), (2, 2.0), (np.float32(0.5), 0.5),
     (np.int64(3), 3.0), (fractions.Fraction(1, 4), 0.25)],
)
def test_scale_accepts_real_numbers(scale, want):
    q, k, v = arrays(D=64)
    p = validate(q, k, v, scale=scale)
    assert p.scale == want and type(p.scale) is float


def test_numpy_bools_and_out_dtype_spellings():
    q, k, v = arrays(dtype=BF16)
    p = validate(q, k, v, causal=np.bool_(True), return_lse=np.bool_(False))
    assert p.causal is True and p.return_lse is False
    for spelling in (BF16, ml_dtypes.bfloat16, "bfloat16", "bf16"):
        assert validate(q, k, v, out_dtype=spelling).out_dtype == BF16


@pytest.mark.parametrize("host", [True, False])
def test_valid_out(host):
    q, k, v = arrays("bhsd")
    out = np.zeros((2, 4, 5, 64), np.float16)
    args = (q, k, v, out) if host else device(q, k, v, out)
    p = validate(*args[:3], out=args[3], layout="bhsd", host=host)
    assert p.out_dtype == F16
    assert p.out_strides == elem_geom(out, "bhsd")
    # a strided out is fine too, as long as its elements do not alias
    wide = np.zeros((2, 4, 5, 128), np.float16)[..., 64:]
    validate(q, k, v, out=wide, layout="bhsd")


def test_host_inferred_from_inputs():
    q, k, v = arrays()
    assert validate(q, k, v).host is True
    assert validate(*device(q, k, v)).host is False


# ---- _dtypes ----------------------------------------------------------------------------------


def test_dtype_table():
    assert _dtypes.SUPPORTED == {F16, BF16, FP8}
    assert _dtypes.RECOGNIZED == {F16, BF16, FP8}
    assert _dtypes.default_out_dtype(F16) == F16
    assert _dtypes.default_out_dtype(BF16) == BF16
    assert _dtypes.default_out_dtype(FP8) == BF16
    assert _dtypes.check_input_dtype(BF16, "q") == BF16
    assert _dtypes.check_input_dtype(FP8, "k") == FP8
    with pytest.raises(TypeError, match="^v has dtype float32"):
        _dtypes.check_input_dtype(np.dtype(np.float32), "v")


@pytest.mark.parametrize(
    "spelling,want",
    [(np.float16, F16), ("float16", F16), ("fp16", F16), (" Half ", F16), (np.dtype("<f2"), F16),
     (ml_dtypes.bfloat16, BF16), ("bfloat16", BF16), ("BF16", BF16),
     (ml_dtypes.float8_e4m3fn, FP8), ("float8_e4m3fn", FP8), ("e4m3", FP8),
     (np.float32, np.dtype(np.float32)), ("float32", np.dtype(np.float32)), ("f8", np.dtype(np.float64))],
)
def test_as_dtype_spellings(spelling, want):
    assert _dtypes.as_dtype(spelling) == want


@pytest.mark.parametrize("bad", [None, True, "floaty", 3.5, object()])
def test_as_dtype_rejects(bad):
    with pytest.raises(TypeError, match="^out_dtype must be a dtype"):
        _dtypes.as_dtype(bad)


def test_resolve_out_dtype():
    assert _dtypes.resolve_out_dtype(None, F16) == F16
    assert _dtypes.resolve_out_dtype("float16", F16) == F16
    assert _dtypes.resolve_out_dtype(None, FP8) == BF16
    assert _dtypes.resolve_out_dtype("bf16", FP8) == BF16
    assert _dtypes.resolve_out_dtype(np.float16, FP8) == F16
    assert _dtypes.resolve_out_dtype("float32", FP8) == np.float32
    with pytest.raises(TypeError, match="^out_dtype=int8 is not an attention output dtype"):
        _dtypes.resolve_out_dtype(np.int8, BF16)


def test_host_path_accepts_numpy_views_and_refuses_masked_arrays_before_gpu_work(monkeypatch):
    """NumPy data is copied to the device anyway: misaligned or strided views are made contiguous,
    while a masked array is still refused (its mask would be ignored) before anything touches CUDA."""
    import cudattn
    from cudattn._numpy import attention as _host

    seen = {}

    def no_gpu(*a, **k):
        seen["reached_gpu"] = True
        raise RuntimeError("stop before the GPU")

    monkeypatch.setattr(_host._device, "get_device", no_gpu)
    base = np.zeros((1, 8, 2, 66), np.float16) + 1
    q = base[..., 1:65]  # misaligned pointer and rows: fine for NumPy input
    with pytest.raises(RuntimeError, match="stop before the GPU"):
        cudattn.attention(q, q, q)
    assert seen.pop("reached_gpu")
    m = np.ma.masked_array(np.ones((1, 8, 2, 64), np.float16))
    with pytest.raises(TypeError, match="mask"):
        cudattn.attention(m, m, m)
    assert "reached_gpu" not in seen


@pytest.mark.parametrize("dims", [dict(B=0), dict(Sq=0), dict(Sk=0), dict(B=0, Sq=0, Sk=0)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_empty_batches_and_sequences_are_valid(dims, layout):
    """B = 0 or Sq = 0 is an empty result, Sk = 0 a result whose rows see no key (issue 7)."""
    B, Sq, Sk = dims.get("B", 2), dims.get("Sq", 5), dims.get("Sk", 7)
    order = (lambda b, s, h: (b, s, h, 64)) if layout == "bshd" else (lambda b, s, h: (b, h, s, 64))
    q, k = np.zeros(order(B, Sq, 4), np.float16), np.zeros(order(B, Sk, 2), np.float16)
    p = validate(np.ascontiguousarray(q), k, k.copy(), layout=layout, host=True)  # NumPy gives them 0 strides
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv) == (B, Sq, Sk, 4, 2)
