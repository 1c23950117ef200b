"""The inputs and checks of the GPU fuzz tests (test_fuzz_gpu.py, test_fuzz_kvcache_gpu.py): random
values in strided views of larger buffers, on the host and the device; NaN-poisoned outputs; the
checks against the float64 reference; the Hypothesis settings (``derandomize=True``, no example
database, no shrinking).
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import cudattn
from cudattn import reference

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)

#: Head dims: one or two per kernel tile (Hopper tiles 64/128/256, portable 32/64/128/256), weighted
#: to the common ones. FP8 head dims are multiples of 16.
HEAD_DIMS = st.sampled_from([64, 64, 128, 128, 16, 40, 72, 256])
FP8_HEAD_DIMS = st.sampled_from([64, 128, 128, 16, 256])
#: Sequence lengths: tile edges and odd sizes (tails by predication), or anything from 1 to 300.
SEQLEN = st.one_of(st.sampled_from([1, 2, 15, 16, 17, 63, 64, 65, 113, 127, 128, 129, 191, 192, 193, 203, 255, 256,
                                    257, 300]), st.integers(1, 300))


def gpu_fuzz(n: int):
    return settings(max_examples=n, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate))


# ---------------------------------------------------------------------------------------------
# Inputs: random values in strided views, on the host and the device
# ---------------------------------------------------------------------------------------------


def _random(rng, shape, dtype):
    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype == FP8:
        return np.clip(x * 64, -448, 448).astype(FP8)
    return x.astype(dtype)


def _shapes(layout, B, Sq, Sk, Hq, Hkv, D):
    if layout == "bshd":
        return (B, Sq, Hq, D), (B, Sk, Hkv, D)
    return (B, Hq, Sq, D), (B, Hkv, Sk, D)


VIEWS = ["contiguous", "contiguous", "contiguous", "padded", "step_seq", "step_head", "batch_offset", "transposed"]


def _view_plan(shape, mode, layout, itemsize):
    """(buffer shape, index, axes): the view is ``buffer[index].transpose(axes)``, of ``shape``."""
    B, a1, a2, D = shape
    full = (slice(None),) * 4
    seq_axis, head_axis = (1, 2) if layout == "bshd" else (2, 1)
    if mode == "padded":  # rows of D elements inside rows of D + pad (16-byte steps)
        return (B, a1, a2, D + 16 // itemsize * 2), (*full[:3], slice(0, D)), None
    if mode in ("step_seq", "step_head"):  # every other key/query or head, starting at 0 or 1
        ax = seq_axis if mode == "step_seq" else head_axis
        buf = list(shape)
        buf[ax] = 2 * shape[ax] + 1
        idx = list(full)
        idx[ax] = slice(B % 2, B % 2 + 2 * shape[ax], 2)
        return tuple(buf), tuple(idx), None
    if mode == "batch_offset":
        return (B + 1, a1, a2, D), (slice(1, None), *full[1:]), None
    if mode == "transposed":  # the other layout's buffer, axes 1 and 2 swapped
        return (B, a2, a1, D), full, (0, 2, 1, 3)
    return shape, full, None


class Tensor:
    """One input or output: ``host`` (a NumPy view into ``buf``) and, on demand, the same view of a
    device copy of ``buf``."""

    def __init__(self, buf, index, axes, broadcast_shape=None):
        self.buf, self.index, self.axes, self.bshape = buf, index, axes, broadcast_shape
        h = buf[index]
        self.host = np.broadcast_to(h, broadcast_shape) if broadcast_shape else (h.transpose(axes) if axes else h)

    def device(self):
        d = cudattn.to_device(self.buf)
        self.dbuf = d
        if self.bshape:  # stride 0 along the broadcast axes (inputs are only read)
            strides = tuple(0 if n == 1 and m != 1 else s for n, m, s in zip(d.shape, self.bshape, d.strides))
            return cudattn.DeviceArray(d.ptr, self.bshape, d.dtype, strides, device_id=d.device_id, owner=d)
        v = d[self.index]
        return v.transpose(*self.axes) if self.axes else v


def make_tensor(rng, values, mode, layout):
    """``values`` (a logical array) written into a view of a larger random buffer, as ``mode`` says."""
    buf_shape, index, axes = _view_plan(values.shape, mode, layout, values.dtype.itemsize)
    buf = _random(rng, buf_shape, values.dtype)  # the bytes around the view: random, never zeros
    t = Tensor(buf, index, axes)
    t.host[...] = values
    return t


def make_broadcast_kv(rng, shape, dtype, layout):
    """k or v whose kv heads all hold the same values: one head broadcast with stride 0."""
    head_axis = 2 if layout == "bshd" else 1
    one = list(shape)
    one[head_axis] = 1
    return Tensor(_random(rng, tuple(one), dtype), (slice(None),) * 4, None, broadcast_shape=tuple(shape))


def poisoned_out(shape, dtype, padded: bool):
    """A NaN-filled device ``out`` (maybe a view with padded rows); returns (view, whole buffer)."""
    if not padded:
        buf = cudattn._arrays.array.empty(shape, dtype)
        buf.fill_nan()
        return buf, buf
    buf = cudattn._arrays.array.empty(shape[:-1] + (shape[-1] + 16,), dtype)
    buf.fill_nan()
    return buf[..., : shape[-1]], buf


def assert_untouched_padding(buf, D):
    """The elements of a padded ``out`` buffer outside the view must still be NaN."""
    if buf.shape[-1] > D:
        pad = cudattn.to_host(buf)[..., D:].astype(np.float32)
        assert np.isnan(pad).all(), f"{np.count_nonzero(~np.isnan(pad))} elements outside out were written"


@contextlib.contextmanager
def kernel_family(name: str):
    """``"portable"``: force the sm80 family (on Hopper, where it is not the default)."""
    from cudattn._kernels import traits as _traits

    with pytest.MonkeyPatch.context() as mp:
        if name == "portable":
            mp.setattr(_traits, "FORCED_FAMILY", "sm80")
        yield


def _is_hopper() -> bool:
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    return _device.device_properties(0).arch in _traits.HOPPER_ARCHS


def _draw_family(data) -> str:
    fam = data.draw(st.sampled_from(["fastest", "fastest", "fastest", "portable"]), label="family")
    return fam if _is_hopper() else "fastest"


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def check_lse(lse, ref_lse, shape):
    assert lse.dtype == F32 and lse.shape == shape, (lse.dtype, lse.shape)
    lse = lse.astype(np.float64)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "LSE must be -inf exactly on rows that see no key"
    assert not np.isnan(lse).any()
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)


def check_16bit(o, lse, q, k, v, *, causal, scale, layout, dtype):
    ref, ref_lse = reference.attention(q, k, v, causal=causal, scale=scale, layout=layout, return_lse=True)
    naive = reference.attention_naive(q, k, v, causal=causal, scale=scale, layout=layout, dtype=dtype)
    assert o.dtype == dtype and o.shape == q.shape, (o.dtype, o.shape)
    o = o.astype(np.float64)
    assert not np.isnan(o).any(), f"{np.isnan(o).sum()} outputs unwritten or NaN"
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"max|out-ref| = {err:.3g} > bound {bound:.3g}"
    empty = np.isneginf(ref_lse)  # (B, Hq, Sq): rows that see no key give exactly 0
    if empty.any():
        rows = empty.transpose(0, 2, 1) if layout == "bshd" else empty
        assert np.all(o[rows] == 0), "rows that see no key must be 0"
    if lse is not None:
        check_lse(lse, ref_lse, ref_lse.shape)


def run(q, k, v, host_path, odt, padded_out, **kw):
    """cudattn.attention on Tensors q, k, v, by the NumPy path or the device path, into a NaN-poisoned
    out; returns (out, lse or None) as NumPy arrays."""
    shape = q.host.shape
    if host_path:
        out = np.full(shape, np.nan, odt) if padded_out is not None else None
        res = cudattn.attention(q.host, k.host, v.host, out=out, **kw)
        o, lse = res if kw.get("return_lse") else (res, None)
        assert type(o) is np.ndarray and (out is None or o is out)
        return o, lse
    out, buf = poisoned_out(shape, odt, bool(padded_out))
    res = cudattn.attention(q.device(), k.device(), v.device(), out=out, **kw)
    o, lse = res if kw.get("return_lse") else (res, None)
    assert o.ptr == out.ptr, "attention must write into the given out"
    assert_untouched_padding(buf, shape[-1])
    return cudattn.to_host(o), None if lse is None else cudattn.to_host(lse)


@st.composite
def heads(draw):
    Hkv = draw(st.sampled_from([1, 1, 2, 3]))
    return Hkv * draw(st.sampled_from([1, 2, 4])), Hkv
