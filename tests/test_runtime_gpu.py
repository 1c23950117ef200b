"""Runtime layer on a real GPU: devices, streams, copies, poisoning, interop, launching.

Every test is marked ``gpu`` and skipped where no CUDA device is present (conftest.py).
"""

from __future__ import annotations

import ctypes
import gc
import threading

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._runtime import launch as _launch
from cudattn._runtime import stream as _stream
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import empty
from cudattn._arrays.importer import as_device_array
from cudattn._arrays.host_io import to_device, to_host
from cudattn._runtime.errors import CudaError, check

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
DTYPES = [np.dtype(np.float16), BF16, FP8]
SHAPES = [(1,), (113,), (3, 203, 5), (2, 1, 1023), (1, 4, 1023, 64)]


def _random(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


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


def _check_copies_on(stream):
    x = _random((3, 203, 7), BF16, seed=3)
    d = to_device(x, stream=stream)
    assert _same_bits(to_host(d, stream=stream), x)
    d.fill_nan(stream=stream)
    assert np.all(np.isnan(to_host(d, stream=stream).astype(np.float32)))


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


# ---------------------------------------------------------------------------- launching

KERNELS = r"""
struct FillParams {
    float* out;
    int n;
    float val;
};

extern "C" __global__ void fill(const FillParams p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) p.out[i] = p.val + (float)i;
}

#define SMEM_FLOATS (100 * 1024 / 4)

// Uses all 100 KiB of dynamic shared memory: only launches after the opt-in.
extern "C" __global__ void smem_reverse(const FillParams p) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < SMEM_FLOATS; i += blockDim.x) buf[i] = p.val + (float)i;
    __syncthreads();
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) p.out[i] = buf[SMEM_FLOATS - 1 - i];
}
"""
SMEM_BYTES = 100 * 1024


class FillParams(ctypes.Structure):
    _fields_ = [("out", ctypes.c_void_p), ("n", ctypes.c_int32), ("val", ctypes.c_float)]


def _compile(src: str, arch: str) -> bytes:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"runtime_test.cu", 0, [], [])
    assert err == 0, err
    try:
        opts = [f"--gpu-architecture={arch}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != 0:
            _, n = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise AssertionError(log.decode(errors="replace"))
        err, n = nvrtc.nvrtcGetCUBINSize(prog)
        assert err == 0, err
        cubin = b" " * n
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        assert err == 0, err
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.fixture(scope="module")
def cubin():
    return _compile(KERNELS, _device.device_properties(0).arch)


def test_launch_fill(cubin):
    dev = _device.get_device(0)
    k = _launch.load_kernel(cubin, "fill", device=dev, key="runtime-test", dynamic_smem=0)
    assert _launch.load_kernel(cubin, "fill", device=0, key="runtime-test") is k  # cached
    n = 1000
    out = empty((n,), np.float32)
    out.fill_nan()
    h = out.stream_handle
    p = FillParams(out.ptr, n, 0.5)
    _launch.launch(k, ((n + 127) // 128, 1, 1), (128, 1, 1), 0, h, p)
    np.testing.assert_array_equal(to_host(out), 0.5 + np.arange(n, dtype=np.float32))


def test_launch_over_48k_dynamic_shared_memory(cubin):
    props = _device.device_properties(0)
    if props.max_shared_memory_per_block_optin < SMEM_BYTES:
        pytest.skip("device cannot opt in to 100 KiB of shared memory")
    k = _launch.load_kernel(cubin, "smem_reverse", device=0, key="runtime-test", dynamic_smem=SMEM_BYTES)
    assert k.max_dynamic_smem == SMEM_BYTES
    n = 5000
    out = empty((n,), np.float32)
    out.fill_nan()
    _launch.launch(k, (1, 1, 1), (256, 1, 1), SMEM_BYTES, out.stream_handle, FillParams(out.ptr, n, 1.0))
    nf = SMEM_BYTES // 4
    np.testing.assert_array_equal(to_host(out), 1.0 + (nf - 1 - np.arange(n)).astype(np.float32))


def test_load_kernel_rejects_more_shared_memory_than_the_device_has(cubin):
    too_much = _device.device_properties(0).max_shared_memory_per_block_optin + 1
    with pytest.raises(ValueError, match="shared memory"):
        _launch.load_kernel(cubin, "fill", device=0, key="runtime-test-too-much", dynamic_smem=too_much)


def test_bad_launch_raises_cuda_error_with_driver_name(cubin):
    k = _launch.load_kernel(cubin, "fill", device=0, key="runtime-test")
    out = empty((16,), np.float32)
    with pytest.raises(CudaError) as info:
        _launch.launch(k, (1, 1, 1), (4096, 1, 1), 0, out.stream_handle, FillParams(out.ptr, 16, 0.0))
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE"
    assert "cuLaunchKernel(fill" in str(info.value)
    # the context is still usable afterwards
    _launch.launch(k, (1, 1, 1), (16, 1, 1), 0, out.stream_handle, FillParams(out.ptr, 16, 2.0))
    np.testing.assert_array_equal(to_host(out), 2.0 + np.arange(16, dtype=np.float32))


def test_launch_on_foreign_stream_and_timing(cubin):
    dev = _device.get_device(0)
    s = dev.create_stream()
    h = int(s.handle)
    k = _launch.load_kernel(cubin, "fill", device=0, key="runtime-test")
    n = 1 << 20
    out = empty((n,), np.float32, stream=s)
    start = _launch.record_event(h)
    _launch.launch(k, (n // 256, 1, 1), (256, 1, 1), 0, h, FillParams(out.ptr, n, -1.0))
    end = _launch.record_event(h)
    ms = _launch.elapsed_ms(start, end)
    assert ms >= 0.0
    t = _launch.time_ms(lambda: _launch.launch(k, (n // 256, 1, 1), (256, 1, 1), 0, h, FillParams(out.ptr, n, 1.0)), s)
    assert t >= 0.0
    _launch.synchronize(h)
    y = to_host(out, stream=s)
    assert y[0] == 1.0 and y[-1] == 1.0 + (n - 1)


def test_launch_params_struct_may_be_dropped_after_launch(cubin):
    k = _launch.load_kernel(cubin, "fill", device=0, key="runtime-test")
    outs = [empty((256,), np.float32) for _ in range(8)]
    for i, o in enumerate(outs):
        _launch.launch(k, (1, 1, 1), (256, 1, 1), 0, o.stream_handle, FillParams(o.ptr, 256, float(i)))
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(to_host(o), i + np.arange(256, dtype=np.float32))
