"""cudattn: fused scaled-dot-product attention for Python on NVIDIA GPUs, with no framework underneath.

Kernels are CUDA C++ compiled at run time by NVRTC for the device's exact arch, cached on disk,
and launched through the driver API. Importing makes no CUDA call. Every operation takes NumPy
arrays (a NumPy result, synchronously) or device arrays of any runtime (a cudattn DeviceArray,
CuPy, PyTorch, JAX, Numba: a DeviceArray result, asynchronously on the operands' stream).

Operations
    attention                -- fused attention: causal, GQA/MQA, FP8, windows, softcap, ALiBi, sinks, varlen
    attention_with_kvcache   -- decode against a contiguous or paged KV cache, appending new keys in place
    attention_backward       -- its gradients (dq, dk, dv; dsinks): every modifier, varlen, deterministic mode
    merge_attention_states   -- merge partial attentions over disjoint key sets by their log-sum-exps
    quantize_fp8             -- float to FP8 e4m3 with per-tensor or per-head descales
    dequantize               -- FP8 e4m3 back to float32, float16 or bfloat16

Memory
    DeviceArray              -- a strided view of device memory (exports CUDA Array Interface and DLPack)
    to_device                -- copy a host array into a new DeviceArray
    to_host                  -- copy a device array into a new NumPy array
    empty_pinned             -- a NumPy array in page-locked memory, for the fastest NumPy calls
    empty_cache              -- give the device memory cudattn keeps for reuse back to the driver

Errors
    CudaError                -- a CUDA driver call failed (the driver's error name and the call)
    NoDeviceError            -- no usable GPU: no driver library, or the driver sees no device
    OutOfMemoryError         -- out of device memory (also a MemoryError), naming the bytes asked for

Also
    reference                -- float64 NumPy reference implementations and the correctness rule
    __version__              -- the installed version

``python -m cudattn info`` shows what cudattn finds on this machine.
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("cudattn")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed (PYTHONPATH=.)
    __version__ = "0+unknown"

from . import reference
from ._ops.attention import attention
from ._ops.backward import attention_backward
from ._arrays.array import DeviceArray, empty_cache
from ._arrays.host_io import to_device, to_host
from ._runtime.errors import CudaError, NoDeviceError, OutOfMemoryError
from ._ops.kvcache import attention_with_kvcache
from ._ops.merge import merge_attention_states
from ._arrays.pinned import empty_pinned
from ._ops.quantize import dequantize, quantize_fp8

__all__ = ["attention", "attention_backward", "attention_with_kvcache", "merge_attention_states", "quantize_fp8", "dequantize", "reference", "DeviceArray", "empty_cache", "to_device", "to_host", "empty_pinned", "CudaError", "NoDeviceError", "OutOfMemoryError", "__version__"]
