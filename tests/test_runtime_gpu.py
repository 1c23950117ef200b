"""Runtime layer on a real GPU: devices, copies, poisoning, foreign streams. Interop is in
test_runtime_interop_gpu.py, launching in test_runtime_launch_gpu.py.

Every test is marked ``gpu`` and skipped where no CUDA device is present (conftest.py).
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._runtime import stream as _stream
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import empty
from cudattn._arrays.host_io import to_device, to_host
from cudattn._runtime.errors import check
from _runtime_gpu_cases import BF16, DTYPES, _check_copies_on, _random, _same_bits

pytestmark = pytest.mark.gpu

SHAPES = [(1,), (113,), (3, 203, 5), (2, 1, 1023), (1, 4, 1023, 64)]


# ---------------------------------------------------------------------------- devices


def test_get_device_is_cached_and_primary():
    dev = _device.get_device(0)
    assert dev.device_id == 0
    assert _device.get_device(0) is dev
    assert _device.get_device() is dev  # the current context is device 0's primary context
    ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    primary_state = check(driver.cuDevicePrimaryCtxGetState(0), "cuDevicePrimaryCtxGetState")
    assert int(ctx) != 0 and primary_state[1] == 1  # active
    with pytest.raises(ValueError, match="does not exist"):
        _device.get_device(_device.device_count())


def test_get_device_restores_context_switched_by_someone_else():
    dev = _device.get_device(0)
    check(driver.cuCtxSetCurrent(driver.CUcontext(0)), "cuCtxSetCurrent(NULL)")
    assert _device.get_device(0) is dev
    assert int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) != 0


def test_get_device_in_another_thread():
    out = {}

    def work():
        d = _device.get_device(0)
        x = _random((257,), np.float16)
        out["ok"] = _same_bits(to_host(to_device(x)), x)
        out["dev"] = d

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["ok"] and out["dev"].device_id == 0


def test_device_properties():
    p = _device.device_properties(0)
    assert p is _device.device_properties(_device.get_device(0))
    assert p.sm_count > 0 and p.l2_cache_size > 0 and p.name
    assert p.compute_capability >= (8, 0)
    assert p.max_shared_memory_per_block_optin >= p.max_shared_memory_per_block == 48 * 1024
    assert p.max_grid_dim[1] == 65535
    assert p.arch == ("sm_90a" if p.compute_capability == (9, 0) else "sm_%d%d" % p.compute_capability)


def test_default_stream_is_library_owned_and_nonblocking():
    s = _stream.default_stream(0)
    assert s is _stream.default_stream(0)
    assert s.is_nonblocking
    ref = _stream.as_stream(None, 0)
    assert ref.handle == int(s.handle) and ref.handle != 0


# ---------------------------------------------------------------------------- copies


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(dtype, shape):
    x = _random(shape, dtype)
    d = to_device(x)
    assert d.shape == shape and d.dtype == dtype and d.is_c_contiguous and d.device_id == 0
    assert _same_bits(to_host(d), x)
    assert _same_bits(d.copy_to_host(), x)


def test_round_trip_large_through_pinned_staging():
    x = _random((4, 8195, 8, 128), BF16)  # more than the whole pinned pool, plus a tail: chunks are reused
    assert x.nbytes > _transfer.STAGING_CHUNKS * _transfer.STAGING_CHUNK and x.nbytes % _transfer.STAGING_CHUNK
    assert _same_bits(to_host(to_device(x)), x)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
def test_non_contiguous_views(dtype):
    x = _random((4, 113, 6, 64), dtype)
    d = to_device(x)
    for key in [(slice(None), slice(None, None, 2)), (Ellipsis, slice(None, None, -1)), (1, slice(3, 100), 2),
                (slice(None), slice(None), slice(1, 5), slice(0, 32))]:
        assert _same_bits(to_host(d[key]), np.ascontiguousarray(x[key])), key
    assert _same_bits(to_host(d.transpose(0, 2, 1, 3)), np.ascontiguousarray(x.transpose(0, 2, 1, 3)))


def test_non_contiguous_input_to_device():
    x = _random((64, 80), np.float16)[:, ::3]
    assert _same_bits(to_host(to_device(x)), np.ascontiguousarray(x))


def test_empty_and_zero_size():
    e = empty((0, 5), np.float16)
    assert e.size == 0 and to_host(e).shape == (0, 5)
    a = empty((7, 9), BF16)
    assert a.ptr != 0 and a.owner is not None and a.stream_handle == _stream.as_stream(None, 0).handle


# ---------------------------------------------------------------------------- poisoning


@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(np.float32)], ids=str)
def test_fill_nan(dtype):
    d = to_device(_random((5, 203), dtype))
    d.fill_nan()
    y = to_host(d)
    assert np.all(np.isnan(y.astype(np.float32)))
    assert np.all(y.view(f"u{dtype.itemsize}") == _array.nan_pattern(dtype))


def test_memset_pattern_and_views():
    d = empty((6, 40), np.float16)
    d.memset(0x3C00)  # 1.0
    assert np.all(to_host(d) == 1.0)
    d.T.memset(0x4000)  # dense in another order: 2.0
    assert np.all(to_host(d) == 2.0)
    with pytest.raises(ValueError, match="dense"):
        d[:, ::2].memset(0)


# ---------------------------------------------------------------------------- foreign streams


def test_stream_int_handle():
    _device.get_device(0)
    s = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    h = int(s)
    try:
        assert _stream.as_stream(h, 0).handle == h
        _check_copies_on(h)
        gc.collect()  # free the buffers (stream-ordered on h) before h goes away
    finally:
        check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")
        check(driver.cuStreamDestroy(h), "cuStreamDestroy")


def test_stream_legacy_default_handle():
    _check_copies_on(0)


def test_stream_cuda_core():
    dev = _device.get_device(0)
    s = dev.create_stream()
    assert _stream.as_stream(s, 0).handle == int(s.handle)
    _check_copies_on(s)


def test_stream_protocol_object():
    dev = _device.get_device(0)
    s = dev.create_stream()

    class Foreign:
        def __cuda_stream__(self):
            return (0, int(s.handle))

    f = Foreign()
    assert _stream.as_stream(f, 0).handle == int(s.handle)
    _check_copies_on(f)


def test_array_stream_is_ordered_before_other_stream():
    """An array produced on one stream, read on another: the reader waits (event), no host sync needed."""
    dev = _device.get_device(0)
    s1, s2 = dev.create_stream(), dev.create_stream()
    x = _random((1 << 20,), np.float16)
    d = to_device(x, stream=s1)
    d.fill_nan(stream=s1)
    y = to_host(d, stream=s2)  # must see the NaNs written on s1
    assert np.all(np.isnan(y))
