"""GPU: memory limits (issue 7 part 5): out-of-memory (named, a MemoryError, nothing leaked, the
pool given back) and tensors of more than 2**31 elements.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

import cudattn
from cudattn import reference
from _reliability_cases import FP8, _inputs, _seed

pytestmark = [pytest.mark.gpu, pytest.mark.solo]  # fills the GPU, or reads its free memory


# ---------------------------------------------------------------------- out of memory


def _pool_used(device_id: int = 0) -> int:
    from cudattn._runtime import device as _device

    return int(_device.get_device(device_id).memory_resource.attributes.used_mem_current)


def test_out_of_memory_names_the_bytes_and_is_a_memory_error():
    with pytest.raises(cudattn.OutOfMemoryError) as info:
        cudattn._arrays.array.empty((1 << 40,), np.uint8)
    e = info.value
    assert isinstance(e, MemoryError) and isinstance(e, cudattn.CudaError)
    assert e.nbytes == 1 << 40 and str(1 << 40) in str(e) and e.name == "CUDA_ERROR_OUT_OF_MEMORY"


def test_out_of_memory_mid_call_leaks_nothing_and_the_next_call_works():
    """Fill the GPU, leave less than a call needs, and make the call: OutOfMemoryError, the
    memory it had taken back in the pool, and the same call correct once memory is free."""
    from cudattn._runtime import launch as _launch

    rng = np.random.default_rng(next(_seed))
    q, k, v = _inputs(rng, 8, 4096, 4096, 16, 128, np.float16)  # 128 MiB each; out too
    gc.collect()  # earlier tests' arrays in reference cycles: freed now, not during the count
    _launch.synchronize()
    base = _pool_used()
    hog, chunk = [], 64 << 20
    try:
        while True:
            hog.append(cudattn._arrays.array.empty((chunk,), np.uint8))
    except cudattn.OutOfMemoryError:
        pass
    assert len(hog) > 16
    del hog[-5:]  # under 384 MiB free: some of the four 128 MiB buffers fit, not all
    _launch.synchronize()
    try:
        cudattn.attention(q, k, v)
    except cudattn.OutOfMemoryError as e:  # no ExceptionInfo: its traceback would keep the call's frames
        nbytes = e.nbytes
    else:
        pytest.fail("the call fit in the memory left")
    assert nbytes == q.nbytes
    _launch.synchronize()
    used_after_error = _pool_used() - len(hog) * chunk
    del hog
    _launch.synchronize()
    assert used_after_error == base, "the failed call kept device memory"
    assert _pool_used() == base
    out = cudattn.attention(q[:1, :512], k[:1, :512], v[:1, :512])
    ref = reference.attention(q[:1, :512], k[:1, :512], v[:1, :512])
    assert np.abs(out.astype(np.float64) - ref).max() < 1e-2


def test_empty_cache_gives_freed_memory_back_to_the_driver():
    from cuda.bindings import driver

    cudattn._runtime.device.get_device()  # the context current (empty_cache alone initialises nothing)
    cudattn.empty_cache()
    free0 = driver.cuMemGetInfo()[1]
    x = cudattn._arrays.array.empty((1 << 30,), np.uint8)
    del x  # back in cudattn's pool, not in the driver's free memory
    cudattn.empty_cache()
    assert driver.cuMemGetInfo()[1] >= free0 - (64 << 20)


# ---------------------------------------------------------------------- more than 2**31 elements


def _random_bits(rng, shape, dtype):
    """Fast random finite values of `dtype` straight from random bytes: the top exponent bit
    cleared (fp16/bf16: bit 14; e4m3: bit 6), so |x| < 2 and no NaN or inf."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.frombuffer(rng.bytes(math.prod(shape) * itemsize), np.uint16 if itemsize == 2 else np.uint8)
    mask = 0xBF if itemsize == 1 else 0xBFFF
    return (raw & raw.dtype.type(mask)).view(dtype).reshape(shape)


def _free_bytes() -> int:
    from cuda.bindings import driver

    cudattn._runtime.device.get_device()  # the context current: the test may be the process's first
    cudattn.empty_cache()  # earlier tests' freed arrays sit in the pool
    err, free, total = driver.cuMemGetInfo()
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return int(free)


def _fill_batches(dst, chunks) -> None:
    """Fill a device array of shape (B, ...) batch entry by batch entry from host chunks of shape
    (1, ...): entry b gets ``chunks[b]`` (a dict, b -> chunk) or else one of the shared fillers,
    so a multi-GiB device tensor needs only a few hundred MiB of host memory."""
    from cuda.bindings import driver

    fillers, own = chunks
    step = dst.strides[0]
    for b in range(dst.shape[0]):
        src = own.get(b, fillers[b % len(fillers)])
        assert src.nbytes == step
        (err,) = driver.cuMemcpyHtoD(dst.ptr + b * step, src.ctypes.data, src.nbytes)
        assert err == driver.CUresult.CUDA_SUCCESS, err


@pytest.mark.parametrize("dtype,kw", [(np.float16, {}), (np.float16, {"num_splits": 2}), (FP8, {})],
                         ids=["prefill-fp16", "decode-fp16", "prefill-fp8"])
def test_more_than_2_31_elements(dtype, kw):
    """k and v (and, for prefill, q and out) hold more than 2**31 elements, so every element offset
    past 2**31 must be 64-bit; the last batch entries (the farthest offsets) are checked against
    the reference. The tensors are filled on the device one batch entry at a time: the checked
    entries hold their own random values, the others share one filler entry, so an offset
    that wraps at 2**31 or 2**32 reads different data and fails the check."""
    B, S, H, D = 65, 2048, 128, 128  # 2.18e9 elements per tensor
    decode = "num_splits" in kw
    Sq = 1 if decode else S
    itemsize = np.dtype(dtype).itemsize
    need = (3 if decode else 4) * B * S * H * D * itemsize + (B * S * H * D if dtype == FP8 else 0)
    if _free_bytes() < need + (4 << 30):
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free device memory")
    assert B * S * H * D > 2**31
    rng = np.random.default_rng(next(_seed))
    checked = (B - 1, B // 2)
    host = {}
    devs = []
    for name, rows in (("q", Sq), ("k", S), ("v", S)):
        shape = (1, rows, H, D)
        chunks = ([_random_bits(rng, shape, dtype)],
                  {b: _random_bits(rng, shape, dtype) for b in checked})
        host[name] = chunks[1]
        dev = cudattn._arrays.array.empty((B, rows, H, D), dtype)
        _fill_batches(dev, chunks)
        devs.append(dev)
    out = cudattn.attention(*devs, causal=True, **kw)
    del devs
    heads = [0, 1, H - 2, H - 1]  # MHA: query head h reads kv head h
    for b in checked:
        qs, ks, vs = (host[name][b][:, :, heads] for name in ("q", "k", "v"))
        ref = reference.attention(qs, ks, vs, causal=True)
        got = cudattn.to_host(out[b:b + 1]).astype(np.float64)[:, :, heads]
        assert np.isfinite(got).all()
        if dtype == FP8:
            ok, stats = reference.check_close_fp8(got, ref, reference.attention_fp8_emulated(qs, ks, vs, causal=True))
            assert ok, stats
        else:
            ok, err, bound = reference.check_close(got, ref, reference.attention_naive(qs, ks, vs, causal=True,
                                                                                        dtype=dtype))
            assert ok, f"batch {b}: max|out-ref| = {err:.3g} > bound {bound:.3g}"
