"""Runtime layer on a real GPU, interop: wrapping cudattn's own arrays through CAI and DLPack, and
PyTorch tensors in and out (zero-copy, streams, lifetimes). Every test is marked ``gpu``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from cudattn._runtime import device as _device
from cudattn._runtime import launch as _launch
from cudattn._runtime import stream as _stream
from cudattn._arrays.importer import as_device_array
from cudattn._arrays.host_io import to_device, to_host
from _runtime_gpu_cases import BF16, DTYPES, FP8, _check_copies_on, _random, _same_bits

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------------------- wrapping and exporting


def test_cai_wrap_of_own_array_queries_device():
    d = to_device(_random((4, 5), np.float16))

    class Wrapper:
        __cuda_array_interface__ = d.__cuda_array_interface__

    a = as_device_array(Wrapper(), stream_handle=d.stream_handle)
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device_id) == (d.ptr, d.shape, d.strides, d.dtype, 0)


def test_dlpack_wrap_of_own_array_orders_streams():
    dev = _device.get_device(0)
    other = dev.create_stream()
    x = _random((1 << 20,), BF16)
    d = to_device(x)  # on the library stream

    class Producer:
        def __dlpack__(self, stream=None, max_version=None):
            return d.__dlpack__(stream=stream, max_version=max_version)

        def __dlpack_device__(self):
            return d.__dlpack_device__()

    a = as_device_array(Producer(), stream_handle=int(other.handle))
    assert a.ptr == d.ptr and a.stream_handle == int(other.handle)
    assert _same_bits(to_host(a), x)  # copied on `other`, which waited for the library stream


# ---------------------------------------------------------------------------- PyTorch interop


def test_torch_float16_tensor_is_wrapped_without_copy(torch):
    t = torch.randn(3, 113, 5, device="cuda", dtype=torch.float16)
    h = torch.cuda.current_stream().cuda_stream
    a = as_device_array(t, stream_handle=h, name="q")
    assert a.ptr == t.data_ptr() and a.shape == tuple(t.shape) and a.dtype == np.float16
    assert a.strides == tuple(s * 2 for s in t.stride()) and a.device_id == t.device.index
    assert np.array_equal(to_host(a), t.cpu().numpy())
    v = t[:, ::2].transpose(0, 1)
    b = as_device_array(v, stream_handle=h)
    assert b.ptr == v.data_ptr() and b.strides == tuple(s * 2 for s in v.stride())
    assert np.array_equal(to_host(b), v.cpu().numpy())


def test_torch_bfloat16_tensor_is_wrapped_through_dlpack(torch):
    t = torch.randn(2, 203, 4, 64, device="cuda", dtype=torch.bfloat16)
    a = as_device_array(t, stream_handle=torch.cuda.current_stream().cuda_stream)
    assert a.ptr == t.data_ptr() and a.dtype == BF16 and a.shape == tuple(t.shape)
    assert np.array_equal(to_host(a).astype(np.float32), t.float().cpu().numpy())


def test_torch_side_stream_and_current_stream(torch):
    ts = torch.cuda.Stream()
    ref = _stream.as_stream(ts, 0)
    assert ref.handle == ts.cuda_stream
    _check_copies_on(ts)
    with torch.cuda.stream(ts):
        t = torch.full((1 << 20,), 3.0, device="cuda", dtype=torch.float16)
        a = as_device_array(t, stream_handle=ts.cuda_stream)
        assert np.all(to_host(a) == 3.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_array_to_torch_from_dlpack(torch, dtype):
    x = _random((3, 113, 5), dtype)
    d = to_device(x)
    t = torch.from_dlpack(d)
    assert t.data_ptr() == d.ptr and t.device.type == "cuda" and tuple(t.shape) == x.shape
    want = {np.dtype(np.float16): torch.float16, BF16: torch.bfloat16, FP8: torch.uint8}[dtype]
    assert t.dtype == want
    if dtype == FP8:  # FP8 crosses DLPack as uint8
        assert np.array_equal(t.cpu().numpy(), x.view(np.uint8))
    else:
        assert np.array_equal(t.float().cpu().numpy(), x.astype(np.float32))
    tv = torch.from_dlpack(d[:, ::2])  # strided views go out with their (element) strides
    assert tv.data_ptr() == d.ptr and tv.stride() == tuple(s // dtype.itemsize for s in d[:, ::2].strides)


def test_device_array_to_torch_as_tensor_via_cai(torch):
    x = _random((7, 9), np.float16)
    d = to_device(x)
    _launch.synchronize(d.stream_handle)  # whether torch honours CAI v3 "stream" is not under test here
    t = torch.as_tensor(d, device="cuda")
    assert t.data_ptr() == d.ptr
    assert np.array_equal(t.cpu().numpy(), x)
    assert not hasattr(to_device(_random((3,), BF16)), "__cuda_array_interface__")


def test_torch_keeps_exported_memory_alive(torch):
    x = _random((1 << 16,), np.float16)
    t = torch.from_dlpack(to_device(x))  # the DeviceArray itself is dropped at once
    gc.collect()
    assert np.array_equal(t.cpu().numpy(), x)
