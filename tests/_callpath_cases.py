"""Helpers of the call-path GPU tests (test_callpath_*gpu.py): random inputs, torch conversions,
checks against the float64 reference, NaN-filled device arrays, cuda.core streams.

The hazards are made real with ``torch.cuda._sleep``: a long spin (`SPIN`) queued on the
producer's (or the consumer's) stream keeps a race window open while the call is queued, and inputs
that are not written yet are NaN, so an unordered read gives NaN (which never passes
``reference.check_close``). Each such test also asserts the spinning stream was still busy when the
call returned: that proves the window was open (the test meant something) and that the call did not
block the host.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)

#: GPU clock cycles for torch.cuda._sleep: about 0.1 s at 1.5-2 GHz. Every race window below is
#: this long; the calls queued inside it take microseconds to milliseconds of host time.
SPIN = 200_000_000
NAN = float("nan")
_seed = itertools.count(9000)


# ---------------------------------------------------------------------------- helpers


def _rng():
    return np.random.default_rng(next(_seed))


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype=F16):
    return (_rand(rng, (B, Sq, Hq, D), dtype), _rand(rng, (B, Sk, Hkv, D), dtype),
            _rand(rng, (B, Sk, Hkv, D), dtype))


def _to_torch(torch, x):
    """A NumPy array (float16, bfloat16, int32, float32) as a new CUDA tensor on torch's current stream."""
    if x.dtype == BF16:
        t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to("cuda")


def _from_torch(torch, t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _assert_close(o, ref, naive, what):
    o = np.asarray(o).astype(np.float64)
    assert not np.isnan(o).any(), f"{what}: {np.isnan(o).sum()} outputs NaN (unwritten, or inputs read too early)"
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"{what}: max|out-ref| = {err:.3g} > bound {bound:.3g}"


def _check_attention(o, q, k, v, *, causal=False, what="attention"):
    ref = reference.attention(q, k, v, causal=causal)
    naive = reference.attention_naive(q, k, v, causal=causal, dtype=q.dtype)
    _assert_close(o, ref, naive, what)


def _check_kvcache(o, q, kc, vc, seqlens, *, causal=True, what="attention_with_kvcache"):
    ref = reference.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=causal)
    naive = reference.attention_with_kvcache_naive(q, kc, vc, cache_seqlens=seqlens, causal=causal, dtype=q.dtype)
    _assert_close(o, ref, naive, what)


def _nan_device(shape, dtype, stream=None):
    """A new DeviceArray full of NaN (produced on `stream`)."""
    return cudattn.to_device(np.full(shape, np.nan, dtype), stream=stream)


def _core_stream():
    """(cuda.core Device 0, a new cuda.core Stream on it, its int handle)."""
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    return dev, s, int(s.handle)


def _need_fp8():
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    arch = _device.device_properties(0).arch
    if arch not in _traits.FP8_ARCHS:
        pytest.skip(f"FP8 needs sm_89 or sm_90; this device is {arch}")


def _kvcache_inputs(rng, B=2, cap=300, Hq=8, Hkv=2, D=64, seqlens=(300, 41)):
    q = _rand(rng, (B, 1, Hq, D), F16)
    kc, vc = _rand(rng, (B, cap, Hkv, D), F16), _rand(rng, (B, cap, Hkv, D), F16)
    return q, kc, vc, np.asarray(seqlens, np.int32)
