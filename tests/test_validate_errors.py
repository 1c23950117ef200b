"""cudattn._spec.validate: every bad argument is refused, naming the argument and the rule, the same
way for host and (faked) device arrays, with the most useful error first and no data touched. No
GPU needed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cudattn._spec.validate import validate
from _validate_cases import BF16, FP8, FakeDeviceArray, arrays, device


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
