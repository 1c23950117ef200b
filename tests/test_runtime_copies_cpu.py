"""The runtime layer's copy logic without a GPU: to_device / to_host, strided views, memset and
fill_nan on a fake driver (`_transfer.driver`): "device memory" is then host memory, which
exercises the same bookkeeping.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._arrays import array as _array
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from _runtime_cases import BF16, FP8


# ---------------------------------------------------------------------------- copies and memset, on a fake driver


class HostDriver:
    """Just enough of cuda.bindings.driver, with "device memory" that is host memory."""

    CUevent_flags = driver.CUevent_flags
    CUpointer_attribute = driver.CUpointer_attribute
    CU_MEMHOSTALLOC_PORTABLE = driver.CU_MEMHOSTALLOC_PORTABLE

    def __init__(self):
        self.pinned = []
        self.calls = []

    def _ok(self, name, *values):
        self.calls.append(name)
        return (0, *values)

    def cuMemHostAlloc(self, size, flags):
        buf = ctypes.create_string_buffer(size)
        self.pinned.append(buf)
        return self._ok("cuMemHostAlloc", ctypes.addressof(buf))

    def cuEventCreate(self, flags):
        return self._ok("cuEventCreate", object())

    def cuEventRecord(self, ev, stream):
        return self._ok("cuEventRecord")

    def cuEventSynchronize(self, ev):
        return self._ok("cuEventSynchronize")

    def cuStreamSynchronize(self, stream):
        return self._ok("cuStreamSynchronize")

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return self._ok("cuMemcpyHtoDAsync")

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return self._ok("cuMemcpyDtoHAsync")

    def _memset(self, width, dst, value, n):
        np.ctypeslib.as_array((ctypes.c_uint8 * (n * width)).from_address(dst)).view(f"u{width}")[:] = value

    def cuMemsetD8Async(self, dst, value, n, stream):
        self._memset(1, dst, value, n)
        return self._ok("cuMemsetD8Async")

    def cuMemsetD16Async(self, dst, value, n, stream):
        self._memset(2, dst, value, n)
        return self._ok("cuMemsetD16Async")

    def cuMemsetD32Async(self, dst, value, n, stream):
        self._memset(4, dst, value, n)
        return self._ok("cuMemsetD32Async")


@pytest.fixture
def host_driver(monkeypatch):
    fake = HostDriver()
    monkeypatch.setattr(_transfer, "driver", fake)
    monkeypatch.setattr(_transfer, "get_device", lambda device=None: types.SimpleNamespace(device_id=0))
    monkeypatch.setattr(_transfer, "_staging", {})
    monkeypatch.setattr(_transfer, "_staging_enabled", True)
    keep = []

    def fake_empty(shape, dtype, *, device=None, stream=None):
        host = np.empty(shape, dtype)
        keep.append(host)
        return DeviceArray(host.ctypes.data, host.shape, host.dtype, device_id=0, owner=host, stream_handle=7)

    monkeypatch.setattr(_host_io, "empty", fake_empty)
    return fake


def _on_fake_device(x: np.ndarray) -> DeviceArray:
    return DeviceArray(x.ctypes.data, x.shape, x.dtype, x.strides, device_id=0, owner=x, stream_handle=7)


@pytest.mark.parametrize("staged", [False, True])
def test_to_device_to_host_round_trip_logic(host_driver, monkeypatch, staged):
    if staged:  # tiny chunks so that every copy takes several, through both staging buffers
        monkeypatch.setattr(_transfer, "STAGING_CHUNK", 64)
        monkeypatch.setattr(_transfer, "STAGING_MIN", 0)
    else:
        monkeypatch.setattr(_transfer, "STAGING_MIN", 1 << 40)
    rng = np.random.default_rng(0)
    for dtype in (np.float16, BF16, FP8):
        for shape in [(1,), (113,), (3, 41, 5), (2, 1, 203)]:
            x = rng.standard_normal(shape).astype(dtype)
            d = _host_io.to_device(x)
            assert d.ptr != x.ctypes.data
            y = _host_io.to_host(d)
            assert y.dtype == x.dtype and y.shape == x.shape
            assert np.array_equal(y.view(np.uint8), x.view(np.uint8))
    assert ("cuMemHostAlloc" in host_driver.calls) == staged


@pytest.mark.parametrize("staged", [False, True])
def test_to_host_strided_views(host_driver, monkeypatch, staged):
    if staged:
        monkeypatch.setattr(_transfer, "STAGING_CHUNK", 48)
        monkeypatch.setattr(_transfer, "STAGING_MIN", 0)
    x = np.arange(4 * 7 * 9, dtype=np.float32).reshape(4, 7, 9).astype(BF16)
    d = _on_fake_device(x)
    for key in [(slice(None), slice(None, None, 2)), (Ellipsis, slice(None, None, -1)), (1, slice(2, 5), 3),
                (slice(None, None, -2), 0)]:
        got = _host_io.to_host(d[key])
        assert got.flags.c_contiguous
        assert np.array_equal(got.view(np.uint16), x[key].view(np.uint16)), key
    assert np.array_equal(_host_io.to_host(d.T).view(np.uint16), x.T.view(np.uint16))
    assert _host_io.to_host(d[:, 3:3]).shape == (4, 0, 9)


def test_memset_and_fill_nan(host_driver):
    for dtype, width in [(np.float16, 2), (BF16, 2), (np.float32, 4), (FP8, 1)]:
        x = np.ones((3, 5), dtype)
        d = _on_fake_device(x)
        d.fill_nan()
        assert np.all(np.isnan(x.astype(np.float32)))
        assert np.all(x.view(f"u{width}") == _array.nan_pattern(dtype))
    x = np.ones((4, 6), np.float16)
    _on_fake_device(x).T.memset(0x3C00 + 0x400)  # dense in another axis order: 2.0 everywhere
    assert np.all(x == 2.0)
    _on_fake_device(x).memset(0)
    assert np.all(x == 0)
    with pytest.raises(ValueError, match="dense"):
        _on_fake_device(x)[:, ::2].memset(0)
    with pytest.raises(ValueError):
        _on_fake_device(x).memset(1 << 16)
    with pytest.raises(TypeError):
        _on_fake_device(np.ones(3, np.float64)).fill_nan()
