"""cudattn: fused scaled-dot-product attention for Python on NVIDIA GPUs, with no framework underneath.

Kernels are CUDA C++ compiled at run time by NVRTC for the device's exact arch, cached on disk,
and launched through the driver API. Importing makes no CUDA call.
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("cudattn")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed (PYTHONPATH=.)
    __version__ = "0+unknown"

from . import reference
from ._ops.attention import attention
from ._arrays.array import DeviceArray, empty_cache
from ._arrays.host_io import to_device, to_host
from ._runtime.errors import CudaError, NoDeviceError, OutOfMemoryError
from ._ops.kvcache import attention_with_kvcache
from ._ops.merge import merge_attention_states
from ._arrays.pinned import empty_pinned
from ._ops.quantize import dequantize, quantize_fp8

__all__ = ["attention", "attention_with_kvcache", "merge_attention_states", "quantize_fp8", "dequantize", "reference", "DeviceArray", "empty_cache", "to_device", "to_host", "empty_pinned", "CudaError", "NoDeviceError", "OutOfMemoryError", "__version__"]
