"""What the GPU can do at best, measured in the same run as the kernels it bounds.

- device copy bandwidth: ``cuMemcpyDtoDAsync`` of 1 GiB, counted as read + write (TB/s), the
  ceiling of bandwidth-bound kernels (decode);
- pinned host<->device bandwidth (GB/s, each way), the floor of the NumPy end-to-end call;
- a large bf16 GEMM through cuBLAS (torch), the ceiling of compute-bound kernels (prefill),
  when torch is importable.
"""

from __future__ import annotations

from cuda.bindings import driver

from .._arrays import array as _array
from .._runtime import launch as _launch
from .._runtime.errors import check
from .timing import gpu_time


def _median_ms(op, stream_handle: int, device_id: int, iters: int) -> float:
    """Median GPU ms of ``op()``, timed as the benchmark rows are (one warm-up call)."""
    return gpu_time(lambda i: op(), stream_handle, device_id, iters=iters, warmup=1).median_ms


def copy_tbps(stream_handle: int, device_id: int, nbytes: int = 1 << 30, iters: int = 10) -> float:
    src = _array.empty((nbytes,), "uint8", device=device_id, stream=stream_handle)
    dst = _array.empty((nbytes,), "uint8", device=device_id, stream=stream_handle)
    ms = _median_ms(lambda: check(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, stream_handle),
                                  "cuMemcpyDtoDAsync"), stream_handle, device_id, iters)
    return 2 * nbytes / ms / 1e9


def pinned_gbps(stream_handle: int, device_id: int, nbytes: int = 256 << 20, iters: int = 5) -> tuple[float, float]:
    """(host->device, device->host) GB/s between pinned host memory and the device."""
    dev = _array.empty((nbytes,), "uint8", device=device_id, stream=stream_handle)
    host = check(driver.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc")
    try:
        h2d = _median_ms(lambda: check(driver.cuMemcpyHtoDAsync(dev.ptr, host, nbytes, stream_handle),
                                       "cuMemcpyHtoDAsync"), stream_handle, device_id, iters)
        d2h = _median_ms(lambda: check(driver.cuMemcpyDtoHAsync(host, dev.ptr, nbytes, stream_handle),
                                       "cuMemcpyDtoHAsync"), stream_handle, device_id, iters)
    finally:
        _launch.synchronize(stream_handle)
        check(driver.cuMemFreeHost(host), "cuMemFreeHost")
    return nbytes / h2d / 1e6, nbytes / d2h / 1e6


def gemm_bf16_tflops(torch_mod, device_id: int, n: int = 8192, iters: int = 10) -> float:
    """cuBLAS bf16 GEMM n×n×n via torch, on torch's current stream."""
    torch = torch_mod
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    h = torch.cuda.current_stream().cuda_stream
    for _ in range(3):
        a @ b
    ms = _median_ms(lambda: a @ b, h, device_id, iters)
    return 2.0 * n ** 3 / ms / 1e9


def gemm_fp8_tflops(torch_mod, device_id: int, n: int = 8192, iters: int = 10) -> float | None:
    """cuBLAS e4m3 GEMM n×n×n (bf16 out) via ``torch._scaled_mm``; None where torch lacks it."""
    torch = torch_mod
    if not hasattr(torch, "_scaled_mm"):
        return None
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major B, as cuBLAS FP8 wants
    one = torch.ones((), device="cuda")
    h = torch.cuda.current_stream().cuda_stream
    mm = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    try:
        for _ in range(3):
            mm()
    except (RuntimeError, TypeError):
        return None
    ms = _median_ms(mm, h, device_id, iters)
    return 2.0 * n ** 3 / ms / 1e9


def measure(stream_handle: int, device_id: int, torch_mod=None, *, host: bool = False) -> dict:
    out = {"copy_tbps": copy_tbps(stream_handle, device_id), "gemm_bf16_tflops": None,
           "gemm_note": "torch not importable: no GEMM library to measure the compute ceiling"}
    if torch_mod is not None:
        out["gemm_bf16_tflops"] = gemm_bf16_tflops(torch_mod, device_id)
        out["gemm_fp8_tflops"] = gemm_fp8_tflops(torch_mod, device_id)
        out["gemm_note"] = f"torch {torch_mod.__version__} matmul (cuBLAS), bf16 8192^3"
    if host:
        out["h2d_gbps"], out["d2h_gbps"] = pinned_gbps(stream_handle, device_id)
    return out
