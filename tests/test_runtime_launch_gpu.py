"""Runtime layer on a real GPU, launching: a small fill kernel compiled with NVRTC, launched with
over 48 KiB of dynamic shared memory, on foreign streams, with bad arguments. Every test is marked
``gpu``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudattn._runtime import device as _device
from cudattn._runtime import launch as _launch
from cudattn._arrays.array import empty
from cudattn._arrays.host_io import to_host
from cudattn._runtime.errors import CudaError

pytestmark = pytest.mark.gpu


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
