"""Random inputs for a case: one set on the host (for the correctness check), and device copies
rotated between timed calls so that no call finds its operands in L2."""

from __future__ import annotations

import math

import numpy as np
from cuda.bindings import driver

from .._arrays import array as _array
from .._spec import dtypes as _dtypes
from .._arrays import host_io as _host_io
from .._runtime.errors import check
from .grids import Case

MAX_SETS = 8
SET_BUDGET_BYTES = 8 << 30  # rotated copies never take more device memory than this


def host_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q ``(B, Sq, Hq, D)``, k and v ``(B, Sk, Hkv, D)``: standard normal, rounded to the dtype."""
    dt = _dtypes.as_dtype(case.dtype, arg="dtype")
    q = rng.standard_normal((case.B, case.Sq, case.Hq, case.D), dtype=np.float32).astype(dt)
    k = rng.standard_normal((case.B, case.Sk, case.Hkv, case.D), dtype=np.float32).astype(dt)
    v = rng.standard_normal((case.B, case.Sk, case.Hkv, case.D), dtype=np.float32).astype(dt)
    return q, k, v


def set_count(case: Case, l2_bytes: int) -> int:
    """Enough sets that one pass over them is 3x the L2 cache; at least 2."""
    one = case.bytes
    n = max(2, math.ceil(3 * l2_bytes / max(one, 1)))
    return int(max(2, min(n, MAX_SETS, SET_BUDGET_BYTES // max(one, 1))))


def duplicate(arr: _array.DeviceArray, stream_handle: int) -> _array.DeviceArray:
    """A new device array with ``arr``'s bytes (same shape and dtype), copied on ``stream_handle``."""
    out = _array.empty(arr.shape, arr.dtype, device=arr.device_id, stream=stream_handle)
    if arr.nbytes:
        check(driver.cuMemcpyDtoDAsync(out.ptr, arr.ptr, arr.nbytes, stream_handle), "cuMemcpyDtoDAsync")
    return out


def device_sets(host: tuple, n: int, stream_handle: int) -> list[tuple]:
    """``n`` device copies of the host set (the first uploaded, the rest copied on the device)."""
    first = tuple(_host_io.to_device(x, stream=stream_handle) for x in host)
    return [first] + [tuple(duplicate(a, stream_handle) for a in first) for _ in range(n - 1)]


def paged_host(k: np.ndarray, v: np.ndarray, page_size: int, rng: np.random.Generator):
    """k, v ``(B, S, H, D)`` scattered into shuffled pages ``(B * S / page_size, page_size, H, D)``,
    with the int32 block table ``(B, S / page_size)`` that reads them back in order."""
    B, S, H, D = k.shape
    per = -(-S // page_size)
    table = rng.permutation(B * per).astype(np.int32).reshape(B, per)
    kp = np.empty((B * per, page_size, H, D), k.dtype)
    vp = np.empty_like(kp)
    pad = per * page_size - S
    kk = np.concatenate([k, np.zeros((B, pad, H, D), k.dtype)], 1) if pad else k
    vv = np.concatenate([v, np.zeros((B, pad, H, D), v.dtype)], 1) if pad else v
    kp[table.reshape(-1)] = kk.reshape(B * per, page_size, H, D)
    vp[table.reshape(-1)] = vv.reshape(B * per, page_size, H, D)
    return kp, vp, table
