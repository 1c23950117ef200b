"""Hopper building blocks (issue 4 groundwork): TMA loads on mbarriers, wgmma SS and RS.

CPU: the bring-up kernel compiles for sm_90a with no spills, and its SASS holds the Hopper
instructions (HGMMA, UTMALDG) and no local memory. GPU (sm_90 only): one warpgroup computes
S = Q Kᵀ and O = bf16(S) V on TMA-loaded, 128-byte-swizzled tiles; checked against NumPy.
"""

from __future__ import annotations

import ctypes
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

import nvrtc_cache
from cudattn._kernels import registry as _kernels
import _sass as _sass_mod

SOURCE = pathlib.Path(__file__).with_name("cuda") / "sm90_selftest.cu"
DTYPES = {"float16": (np.float16, []), "bfloat16": (ml_dtypes.bfloat16, ["-DCUDATTN_DTYPE_BF16"])}


def _compile(dtype: str, cache=None):
    _, headers = _kernels.sources()
    return nvrtc_cache.compile(SOURCE.read_text(), name=SOURCE.name, headers=headers,
                               options=["-lineinfo", *DTYPES[dtype][1]], arch="sm_90a", cache=cache)


@pytest.mark.parametrize("dtype", DTYPES)
def test_selftest_compiles_to_hopper_instructions(dtype, tmp_path):
    res = _compile(dtype, nvrtc_cache.Cache(str(tmp_path / "cache")))
    rep = res.ptxas.get("sm90_selftest")
    if rep is not None:
        assert rep.spill_stores == 0 and rep.spill_loads == 0 and rep.stack_bytes == 0
    sass = _sass_mod.sass(res.cubin, tmp_path)
    assert "HGMMA.64x64x16.F32" in sass and "HGMMA.64x128x16.F32" in sass, "wgmma m64n64 and m64n128 expected"
    assert "UTMALDG" in sass, "TMA loads expected"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic"


class _Params(ctypes.Structure):
    _fields_ = [("q", ctypes.c_uint8 * 128), ("k", ctypes.c_uint8 * 128), ("v", ctypes.c_uint8 * 128),
                ("s_out", ctypes.c_uint64), ("o_out", ctypes.c_uint64), ("v_lbo", ctypes.c_uint32),
                ("v_sbo", ctypes.c_uint32), ("_pad", ctypes.c_uint8 * 40)]  # struct of 64-byte alignment: 448 B


def _run(dtype: str, lbo: int, sbo: int, seed: int = 0):
    import cudattn
    from cudattn._arrays import array as _array
    from cudattn._runtime import device as _device
    from cudattn._runtime import stream as _stream
    from cudattn._runtime import launch as _launch
    from cudattn._kernels import tma as _tma

    dev = _device.get_device(0)
    if _device.device_properties(0).compute_capability != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    dt = DTYPES[dtype][0]
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((64, 128), dtype=np.float32).astype(dt) for _ in range(3))
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    s_out = _array.empty((64, 64), np.float32).fill_nan()
    o_out = _array.empty((64, 128), np.float32).fill_nan()
    p = _Params()
    for name, arr in (("q", qd), ("k", kd), ("v", vd)):
        raw = _tma.encode_2d(arr.ptr, arr.dtype, 64, 128, 128 * arr.itemsize, 64, 64)
        ctypes.memmove(ctypes.addressof(getattr(p, name)), raw, len(raw))
    p.s_out, p.o_out, p.v_lbo, p.v_sbo = s_out.ptr, o_out.ptr, lbo, sbo
    res = _compile(dtype)
    smem = 6 * 64 * 64 * 2 + 1024  # six 8 KiB boxes, plus slack to align them to 1 KiB
    kern = _launch.load_kernel(res.cubin, "sm90_selftest", device=dev, key=res.key, dynamic_smem=smem)
    h = _stream.default_stream(0).handle
    _launch.launch(kern, (1, 1, 1), (128, 1, 1), smem, h, p)
    s, o = cudattn.to_host(s_out), cudattn.to_host(o_out)
    s_ref = q.astype(np.float64) @ k.astype(np.float64).T
    o_ref = s.astype(dt).astype(np.float64) @ v.astype(np.float64)  # P rounded as the kernel rounds it
    return s, s_ref, o, o_ref


def test_params_mirror_is_64_byte_aligned():
    assert ctypes.sizeof(_Params) == 448 and _Params.s_out.offset == 384


def _err(a, b) -> float:
    return float(np.abs(a - b).max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_and_wgmma_ss_and_rs(dtype):
    # V is MN-major (head dim contiguous): lbo steps between the two 64-column swizzle atoms
    # (8 KiB apart), sbo between groups of 8 key rows (1 KiB).
    s, s_ref, o, o_ref = _run(dtype, lbo=8192, sbo=1024)
    assert np.allclose(s, s_ref, rtol=1e-4, atol=1e-2), f"S = Q K^T (SS, K-major): max err {_err(s, s_ref)}"
    assert np.allclose(o, o_ref, rtol=1e-4, atol=1e-2), f"O = P V (RS, trans-b): max err {_err(o, o_ref)}"


@pytest.mark.gpu
def test_wrong_v_descriptor_is_caught():
    """The O check can fail: swapped byte offsets give wrong numbers (the test above is not vacuous)."""
    s, s_ref, o, o_ref = _run("bfloat16", lbo=1024, sbo=8192)
    assert np.allclose(s, s_ref, rtol=1e-4, atol=1e-2), f"S max err {_err(s, s_ref)}"
    assert not np.allclose(o, o_ref, rtol=1e-4, atol=1e-2), f"swapped offsets matched too: max err {_err(o, o_ref)}"
