"""Shared pieces of the FP8 attention GPU tests (test_fp8_gpu.py, test_fp8_paths_gpu.py): the
kernel-family fixture (autouse: every test runs on the family the device picks and, on Hopper, on
the portable one too), FP8 inputs made with cudattn.quantize_fp8, NaN-poisoned outputs, and the key
tile of the kernel that serves a call.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)

_seed = itertools.count(5000)


@pytest.fixture(params=["fastest", "portable"], autouse=True)
def kernel_family(request, monkeypatch):
    """Every test runs on the kernel family the device would pick (Hopper: the sm90 one) and, on
    Hopper, once more on the portable sm80 family, which sm_89 devices run. FP8 needs sm_89+."""
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    arch = _device.device_properties(0).arch
    if arch not in _traits.FP8_ARCHS:
        pytest.skip(f"FP8 tensor cores need sm_89 or sm_90; this device is {arch}")
    if request.param == "portable":
        if arch not in _traits.HOPPER_ARCHS:
            pytest.skip("the portable family is the fastest one on this device: covered by 'fastest'")
        monkeypatch.setattr(_traits, "FORCED_FAMILY", "sm80")
    return request.param


def _block_n(D, causal, out_dtype, mods=None) -> int:
    """The key tile of the FP8 kernel that serves this call (``mods``: its modifier keywords): the
    emulation rounds P against the same running max then."""
    from cudattn._runtime import device as _device
    from cudattn._spec import modifiers as _modifiers
    from cudattn._kernels import traits as _traits

    mods = mods or {}
    bits = ((_modifiers.MOD_WINDOW if mods.get("window_size") is not None else 0)
            | (_modifiers.MOD_ALIBI if mods.get("alibi_slopes") is not None else 0)
            | (_modifiers.MOD_SOFTCAP if mods.get("softcap") else 0))
    return _traits.key_tile(_traits.FP8, D, causal, _device.device_properties(0), out_dtype, bits)


def _shapes(B, Sq, Sk, Hq, Hkv, D, layout):
    if layout == "bshd":
        return (B, Sq, Hq, D), (B, Sk, Hkv, D)
    return (B, Hq, Sq, D), (B, Hkv, Sk, D)


def _source(rng, shape, dist):
    """float32 values to quantise: N(0,1), or N(0,1) with 0.1% of entries set to ±(20..100)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    if dist == "outliers":
        hit = rng.random(shape) < 1e-3
        x[hit] = rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(20, 100, hit.sum())
    elif dist == "large":  # every entry near e4m3's largest, signs random
        x = rng.choice([-1.0, 1.0], shape).astype(np.float32) * rng.uniform(400, 448, shape).astype(np.float32)
    return x


def make_inputs(rng, B, Sq, Sk, Hq, Hkv, D, *, layout="bshd", descales="array", dist="normal"):
    """(q, k, v) e4m3 NumPy arrays and the descale keyword arguments (NumPy / floats / None).

    descales: "array": per-head cudattn.quantize_fp8, (B, Hkv) arrays; "float": per-tensor, one
    float each; "none": the values are cast to e4m3 directly (saturating), no descales."""
    qs, ks = _shapes(B, Sq, Sk, Hq, Hkv, D, layout)
    xs = [_source(rng, s, dist) for s in (qs, ks, ks)]
    if descales == "none":
        return tuple(np.clip(x, -448, 448).astype(FP8) for x in xs) + ({},)
    per = "head" if descales == "array" else "tensor"
    (q, qd), (k, kd), (v, vd) = (cudattn.quantize_fp8(x, per=per, layout=layout, heads_kv=Hkv) for x in xs)
    for x8, d in ((q, qd), (k, kd), (v, vd)):
        assert x8.dtype == FP8 and d.dtype == np.float32 and d.shape == (B, Hkv)
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    if descales == "float":
        kw = {n: float(d[0, 0]) for n, d in kw.items()}
    return q, k, v, kw


def _poisoned_out(shape, dtype, host):
    if host:
        return np.full(shape, np.nan, dtype=dtype)
    out = cudattn._arrays.array.empty(shape, dtype, device=None, stream=None)
    out.fill_nan()
    return out
