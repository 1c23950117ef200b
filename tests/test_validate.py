"""cudattn._spec.validate / cudattn._spec.dtypes: every bad argument is refused, naming the argument and the rule;
good ones become a Problem with element strides in (batch, seq, head) order. No GPU needed: device
arrays are faked by a class with shape / strides (bytes) / dtype / ptr."""

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

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F16 = np.dtype(np.float16)


class FakeDeviceArray:
    """What validate() reads from a device array: shape, byte strides, dtype, ptr."""

    def __init__(self, shape, dtype=np.float16, strides=None, ptr=0x7F00_0000_0000):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        if strides is None:
            strides, step = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(step)
                step *= n
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.ptr = ptr

    @classmethod
    def like(cls, a: np.ndarray, ptr=0x7F00_0000_0000):
        return cls(a.shape, a.dtype, a.strides, ptr)


def arrays(layout="bshd", B=2, Sq=5, Sk=7, Hq=4, Hkv=2, D=64, dtype=np.float16):
    if layout == "bshd":
        shapes = (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
    else:
        shapes = (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)
    return tuple(np.zeros(s, dtype=dtype) for s in shapes)


def device(*xs):
    return tuple(FakeDeviceArray.like(x, ptr=0x7F00_0000_0000 + 0x1000_0000 * i) for i, x in enumerate(xs))


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


# ---- bad calls: type, rule and the argument named ------------------------------------------------


def call(host=True, layout="bshd", q=None, k=None, v=None, dims=None, **kw):
    """validate() on default arrays with some replaced; dims= overrides arrays() sizes."""
    dq, dk, dv = arrays(layout, **(dims or {}))
    q, k, v = (dq if q is None else q), (dk if k is None else k), (dv if v is None else v)
    if not host:
        q, k, v = (FakeDeviceArray.like(x) if isinstance(x, np.ndarray) else x for x in (q, k, v))
    return validate(q, k, v, layout=layout, host=host, **kw)


def z(shape, dtype=np.float16):
    return np.zeros(shape, dtype)


def misaligned_host(shape, dtype=np.float16):
    """A C-contiguous NumPy array whose data pointer is 8 bytes past a 16-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 32, np.uint8)
    off = (8 - raw.ctypes.data) % 16
    a = raw[off:off + n].view(dtype).reshape(shape)
    assert a.ctypes.data % 16 == 8
    return a


def readonly_device(shape):
    a = FakeDeviceArray(shape)
    a.readonly = True
    return a


BAD = [
    # id, call kwargs, exception, regex the message must match
    ("rank-q", dict(q=z((2, 5, 4))), ValueError, r"^q must be 4-D \(batch, seqlen_q, heads_q, head_dim\).*3-D"),
    ("rank-k", dict(k=z((2, 7, 2, 64, 1))), ValueError, r"^k must be 4-D .*5-D"),
    ("rank-v-bhsd", dict(layout="bhsd", v=z((7, 64))), ValueError, r"^v must be 4-D \(batch, heads_kv, seqlen_k"),
    ("layout", dict(layout="sbhd"), ValueError, r"^layout must be 'bshd' .* or 'bhsd'.*'sbhd'"),
    ("layout-type", dict(layout=None), TypeError, r"^layout must be the string"),
    ("q-float32", dict(q=z((2, 5, 4, 64), np.float32)), TypeError,
     r"^q has dtype float32; cudattn computes in float16, bfloat16 or FP8 e4m3 — cast first with q\.astype\(np\.float16\) "
     r"or q\.astype\(ml_dtypes\.bfloat16\), or quantize with cudattn\.quantize_fp8 \(this never happens silently "
     r"because it loses precision\)"),
    ("k-float64", dict(k=z((2, 7, 2, 64), np.float64)), TypeError, r"^k has dtype float64; .*k\.astype\(np\.float16\)"),
    ("v-int", dict(v=z((2, 7, 2, 64), np.int16)), TypeError, r"^v has dtype int16.*float16.*bfloat16"),
    ("q-complex", dict(q=z((2, 5, 4, 64), np.complex64)), TypeError, r"^q has dtype complex64"),
    ("q-bool", dict(q=z((2, 5, 4, 64), np.bool_)), TypeError, r"^q has dtype bool"),
    ("q-byteorder", dict(q=z((2, 5, 4, 64), ">f2")), TypeError, r"^q has dtype .*byte order"),
    ("q-e5m2", dict(q=z((2, 5, 4, 64), ml_dtypes.float8_e5m2)), TypeError, r"^q has dtype float8_e5m2"),
    ("mixed", dict(k=z((2, 7, 2, 64), BF16)), TypeError, r"^q, k, v must share one dtype; got q float16, k bfloat16, v float16"),
    ("fp8-head-dim", dict(q=z((2, 5, 4, 72), FP8), k=z((2, 7, 2, 72), FP8), v=z((2, 7, 2, 72), FP8)),
     ValueError, r"^FP8 head_dim .* must be a multiple of 16 from 16 to 256 .*; got 72"),
    ("fp8-splits", dict(q=z((2, 5, 4, 64), FP8), k=z((2, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8), num_splits=2),
     NotImplementedError, r"^num_splits \(split-KV\) is not supported for FP8 inputs yet"),
    ("fp8-descale-shape", dict(q=z((2, 5, 4, 64), FP8), k=z((2, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8),
                               q_descale=np.ones((2, 4), np.float32)),
     ValueError, r"^q_descale must have shape \(batch, heads_kv\) = \(2, 2\); got \(2, 4\)"),
    ("fp8-descale-nan", dict(q=z((2, 5, 4, 64), FP8), k=z((2, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8),
                             v_descale=float("nan")), ValueError, r"^v_descale must be finite"),
    ("fp8-descale-int", dict(q=z((2, 5, 4, 64), FP8), k=z((2, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8),
                             k_descale=np.ones((2, 2), np.int32)), TypeError, r"^k_descale must be a float32 array"),
    ("fp8-descale-bool", dict(q=z((2, 5, 4, 64), FP8), k=z((2, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8),
                              k_descale=True), TypeError, r"^k_descale must be None, a float"),
    ("zero-heads-q", dict(dims=dict(Hq=0)), ValueError, r"^q has heads = 0"),
    ("zero-batch-k", dict(k=z((0, 7, 2, 64))), ValueError, r"^q, k, v must have the same batch size"),
    ("zero-heads-v-bhsd", dict(layout="bhsd", v=z((2, 0, 7, 64))), ValueError, r"^v has heads = 0"),
    ("batch", dict(k=z((3, 7, 2, 64)), v=z((3, 7, 2, 64))), ValueError, r"^q, k, v must have the same batch size; got q 2, k 3, v 3"),
    ("kv-seqlen", dict(v=z((2, 8, 2, 64))), ValueError, r"^k and v must have the same shape.*\(seqlen_k differ\)"),
    ("kv-heads", dict(v=z((2, 7, 1, 64))), ValueError, r"^k and v must have the same shape.*\(heads_kv differ\)"),
    ("kv-head-dim", dict(v=z((2, 7, 2, 32))), ValueError, r"^k and v must have the same shape.*\(head_dim differ\)"),
    ("q-head-dim", dict(q=z((2, 5, 4, 32))), ValueError, r"^q, k, v must have the same head_dim.*got q 32, k and v 64"),
    ("head-dim-12", dict(dims=dict(D=12)), ValueError, r"^head_dim .* must be a multiple of 8 from 8 to 256 .*got 12"),
    ("head-dim-264", dict(dims=dict(D=264)), ValueError, r"^head_dim .*got 264"),
    ("head-dim-0", dict(dims=dict(D=0)), ValueError, r"^head_dim .*got 0"),
    ("gqa", dict(dims=dict(Hq=6, Hkv=4)), ValueError, r"^heads_q \(6, q's heads axis\) must be a multiple of heads_kv \(4"),
    ("gqa-fewer-q-heads", dict(dims=dict(Hq=2, Hkv=4)), ValueError, r"^heads_q \(2"),
    ("q-last-stride", dict(q=z((2, 5, 4, 128))[..., ::2]), ValueError,
     r"^q must have unit stride in its last \(head_dim\) axis; got stride 2 elements; pass np\.ascontiguousarray\(q\) "
     r"or a view whose last axis is contiguous"),
    ("k-last-stride-bhsd", dict(layout="bhsd", k=z((2, 64, 7, 2)).transpose(0, 3, 2, 1)), ValueError,
     r"^k must have unit stride in its last \(head_dim\) axis; got stride 14 elements"),
    ("q-negative", dict(q=z((2, 5, 4, 64))[:, ::-1]), ValueError, r"^q has a negative stride .* seqlen axis"),
    ("v-16B-stride", dict(v=z((2, 7, 2, 68))[..., :64]), ValueError,
     r"^v's heads stride \(136 bytes\) is not a multiple of 16 bytes: the kernel loads 16-byte vectors"),
    ("q-misaligned-host", dict(q=misaligned_host((2, 5, 4, 64))), ValueError, r"^q's data pointer 0x[0-9a-f]+ is not a multiple of 16 bytes: the kernel loads 16-byte vectors"),
    ("causal-int", dict(causal=1), TypeError, r"^causal must be a bool \(True or False\); got int 1"),
    ("causal-str", dict(causal="yes"), TypeError, r"^causal must be a bool"),
    ("return_lse", dict(return_lse=None), TypeError, r"^return_lse must be a bool"),
    ("scale-nan", dict(scale=float("nan")), ValueError, r"^scale must be finite; got nan"),
    ("scale-inf", dict(scale=-np.inf), ValueError, r"^scale must be finite"),
    ("scale-huge-int", dict(scale=10**400), ValueError, r"^scale must be finite"),
    ("scale-np-inf", dict(scale=np.float16(np.inf)), ValueError, r"^scale must be finite"),
    ("scale-bool", dict(scale=True), TypeError, r"^scale must be a real number .*not a bool"),
    ("scale-np-bool", dict(scale=np.bool_(True)), TypeError, r"^scale must be a real number .*not a bool"),
    ("scale-str", dict(scale="0.1"), TypeError, r"^scale must be a real number"),
    ("scale-complex", dict(scale=1j), TypeError, r"^scale must be a real number"),
    ("scale-array", dict(scale=np.array([0.1])), TypeError, r"^scale must be a real number"),
    ("q_descale", dict(q_descale=1.0), ValueError, r"^q_descale applies to FP8 \(float8_e4m3fn\) inputs only; q, k, v are float16: pass None"),
    ("k_descale", dict(k_descale=np.ones((2, 2), np.float32)), ValueError, r"^k_descale applies to FP8"),
    ("v_descale", dict(v_descale=0.5), ValueError, r"^v_descale .*pass None"),
    ("num_splits-0", dict(num_splits=0), ValueError, r"^num_splits must be from 1 to 128 \(None: chosen .*\); got 0"),
    ("num_splits-big", dict(num_splits=129), ValueError, r"^num_splits must be from 1 to 128"),
    ("num_splits-float", dict(num_splits=2.0), TypeError, r"^num_splits must be None or an int from 1 to 128; got float"),
    ("num_splits-bool", dict(num_splits=True), TypeError, r"^num_splits must be None or an int"),
    ("out_dtype-bf16", dict(out_dtype="bfloat16"), NotImplementedError,
     r"^out_dtype=bfloat16 is not supported yet: for now the output dtype is float16 for float16 inputs; pass out_dtype=None"),
    ("out_dtype-f32", dict(out_dtype=np.float32), NotImplementedError, r"^out_dtype=float32 is not supported yet"),
    ("out_dtype-int", dict(out_dtype=np.int32), TypeError, r"^out_dtype=int32 is not an attention output dtype"),
    ("out_dtype-junk", dict(out_dtype="floaty"), TypeError, r"^out_dtype must be a dtype"),
    ("out_dtype-bool", dict(out_dtype=True), TypeError, r"^out_dtype must be a dtype"),
    ("out-shape", dict(out=z((2, 5, 4, 32))), ValueError, r"^out must have q's shape \(2, 5, 4, 64\); got \(2, 5, 4, 32\)"),
    ("out-dtype", dict(out=z((2, 5, 4, 64), BF16)), TypeError, r"^out must have the output dtype float16; got bfloat16"),
    ("out-readonly", dict(out=np.broadcast_to(z((1, 5, 4, 64)), (2, 5, 4, 64))), ValueError, r"^out must be a writeable"),
    ("out-device-for-host", dict(out=FakeDeviceArray((2, 5, 4, 64))), TypeError, r"^out must be a NumPy array"),
    ("out-last-stride", dict(out=z((2, 5, 4, 128))[..., ::2]), ValueError, r"^out must have unit stride in its last"),
    ("out-16B", dict(out=z((2, 5, 4, 68))[..., :64]), ValueError, r"^out's heads stride .* 16 bytes"),
    ("masked", dict(q=np.ma.zeros((2, 5, 4, 64), np.float16)), TypeError, r"^q is a masked array"),
]


@pytest.mark.parametrize("kw,exc,pattern", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_host_inputs(kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(**kw)


DEVICE_ONLY = [
    ("q-misaligned", dict(q=FakeDeviceArray((2, 5, 4, 64), ptr=0x7F00_0000_0008)), ValueError,
     r"^q's data pointer 0x7f0000000008 is not a multiple of 16 bytes: the kernel loads 16-byte vectors, so the "
     r"data pointer and every stride but the last must be 16-byte aligned"),
    ("v-misaligned", dict(v=FakeDeviceArray((2, 7, 2, 64), ptr=0x7F00_0000_0002)), ValueError, r"^v's data pointer"),
    ("q-stride-not-elements", dict(q=FakeDeviceArray((2, 5, 4, 64), strides=(5 * 512, 513, 128, 2))), ValueError,
     r"^q's seqlen stride \(513 bytes\) is not a multiple of its element size \(2 bytes\)"),
    ("k-last-stride-bytes", dict(k=FakeDeviceArray((2, 7, 2, 64), strides=(7 * 384, 384, 192, 3))), ValueError,
     r"^k must have unit stride in its last \(head_dim\) axis; got stride 3 bytes"),
    ("k-negative", dict(k=FakeDeviceArray((2, 7, 2, 64), strides=(7 * 256, 256, -128, 2))), ValueError,
     r"^k has a negative stride \(-128 bytes\) in its heads axis"),
    ("q-batch-8B", dict(q=FakeDeviceArray((2, 5, 4, 64), strides=(5 * 512 + 8, 512, 128, 2))), ValueError,
     r"^q's batch stride \(2568 bytes\) is not a multiple of 16 bytes"),
    ("not-an-array", dict(q=FakeDeviceArray((2, 5, 4, 64)), k=object(), v=object()), TypeError,
     r"^k must be a NumPy array or a device array exposing shape, strides \(bytes\), dtype and ptr; got builtins\.object"),
    ("huge", dict(q=FakeDeviceArray((2, 5, 4, 64), strides=(2**63, 512, 128, 2))), ValueError, r"^q spans more than 2\*\*62"),
    ("out-host-for-device", dict(out=z((2, 5, 4, 64))), TypeError, r"^out must be a device array"),
    ("out-overlap", dict(out=FakeDeviceArray((2, 5, 4, 64), strides=(5 * 512, 512, 0, 2))), ValueError,
     r"^out has overlapping elements"),
    ("out-overlap-interleaved", dict(out=FakeDeviceArray((2, 5, 4, 64), strides=(5 * 512, 512, 64, 2))), ValueError,
     r"^out has overlapping elements"),
    ("out-misaligned", dict(out=FakeDeviceArray((2, 5, 4, 64), ptr=0x7F00_0000_0004)), ValueError,
     r"^out's data pointer"),
    ("out-not-an-array", dict(out=[1, 2]), TypeError, r"^out must be a NumPy array or a device array"),
    ("out-readonly", dict(out=readonly_device((2, 5, 4, 64))), ValueError, r"^out must be a writeable device array"),
]


@pytest.mark.parametrize("kw,exc,pattern", [b[1:] for b in DEVICE_ONLY], ids=[b[0] for b in DEVICE_ONLY])
def test_bad_device_inputs(kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(host=False, **kw)


# Everything that is not about NumPy specifically (pointers from ctypes, writeable flags, masks,
# fancy host views) is refused the same way for device arrays.
HOST_SPECIFIC = {"q-misaligned-host", "out-readonly", "out-device-for-host", "masked"}


@pytest.mark.parametrize(
    "kw,exc,pattern", [b[1:] for b in BAD if b[0] not in HOST_SPECIFIC], ids=[b[0] for b in BAD if b[0] not in HOST_SPECIFIC]
)
def test_bad_inputs_same_for_device(kw, exc, pattern):
    kw = {key: (FakeDeviceArray.like(val) if isinstance(val, np.ndarray) else val) for key, val in kw.items()}
    with pytest.raises(exc, match=pattern):
        call(host=False, **kw)


def test_host_device_mix():
    q, k, v = arrays()
    dq, dk, dv = device(q, k, v)
    pat = r"^q, k, v must all be NumPy arrays or all device arrays"
    for args in ((q, dk, dv), (dq, k, dv), (dq, dk, v), (q, k, dv)):
        with pytest.raises(TypeError, match=pat):
            validate(*args)
    with pytest.raises(TypeError, match=pat + r" matching host=True"):
        validate(dq, dk, dv, host=True)
    with pytest.raises(TypeError, match=pat + r" matching host=False"):
        validate(q, k, v, host=False)


def test_first_error_is_the_most_useful():
    # host/device mix before anything else
    with pytest.raises(TypeError, match="^q, k, v must all be NumPy arrays or all device arrays"):
        validate(z((2, 5, 4), np.float32), FakeDeviceArray((2, 7, 2, 64)), z((2, 7, 2, 64)), layout="bad")
    # layout before rank (shapes are read through the layout)
    with pytest.raises(ValueError, match="^layout"):
        call(layout="bad", q=z((2, 5, 4)))
    # rank before dtype
    with pytest.raises(ValueError, match="^q must be 4-D"):
        call(q=z((2, 5, 4), np.float32))
    # dtype before shape rules: a float32 q with a GQA mismatch is told to cast first
    with pytest.raises(TypeError, match="^q has dtype float32"):
        call(q=z((2, 5, 6, 64), np.float32))
    # an unsupported k dtype is named before "must share one dtype"
    with pytest.raises(TypeError, match="^k has dtype float32"):
        call(k=z((2, 7, 2, 64), np.float32))
    # an FP8 call with a batch mismatch is told about the shapes, not the FP8 rules
    with pytest.raises(ValueError, match="^q, k, v must have the same batch size"):
        call(q=z((2, 5, 4, 64), FP8), k=z((3, 7, 2, 64), FP8), v=z((2, 7, 2, 64), FP8))
    # zero heads before cross-tensor mismatches
    with pytest.raises(ValueError, match="^q has heads = 0"):
        call(q=z((3, 5, 0, 64)))
    # shapes before strides
    with pytest.raises(ValueError, match="^heads_q"):
        call(q=z((2, 5, 5, 128))[..., ::2])
    # tensors before scalar arguments, and the unimplemented parameters last but one
    with pytest.raises(ValueError, match="^q must have unit stride"):
        call(q=z((2, 5, 4, 128))[..., ::2], causal=1, num_splits=2)
    with pytest.raises(TypeError, match="^causal"):
        call(causal=1, num_splits=2)
    with pytest.raises(ValueError, match="^num_splits"):
        call(num_splits=0, out=z((1, 1, 1, 1)))


def test_validation_touches_no_data():
    # device arrays are only described, never read: a bogus (aligned) pointer is fine
    q = FakeDeviceArray((1, 3, 2, 64), ptr=16)
    k = FakeDeviceArray((1, 4, 1, 64), ptr=2**48)
    assert validate(q, k, k, host=False).seqlen_k == 4


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
