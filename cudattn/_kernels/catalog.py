"""Every kernel build the API can launch on a compile target: what `cache warm`, the demo and the export compile."""

from __future__ import annotations

from . import decode_traits, traits
from .accumulate import all_accumulate_kernels
from .backward_traits import all_backward_kernels
from .fp8 import TRANSPOSE_V_KERNEL
from .quantize import all_quantize_kernels
from .registry import ARCHS

__all__ = ["all_kernels"]


def all_kernels(arch: str, *, distributed: bool = False) -> list:
    """Every kernel the API can launch on a device of compile target ``arch``, one entry per
    distinct build: both forward families on Hopper (the portable one serves broadcast kv heads
    and ``CUDATTN_KERNEL_FAMILY=sm80``), FP8 from sm_89, split-KV decode and its combine, the
    KV-cache append, FP8 quantize/dequantize, the FP8 V transpose and the backward (one build per
    variant: its four entry points share a cubin). ``distributed``: also the ring backward's
    accumulators (`cudattn.distributed`, which the C export does not carry)."""
    if arch not in traits.ARCH_SMEM_LIMIT:
        raise ValueError(f"unknown compile target {arch!r}; cudattn builds for {', '.join(ARCHS)}")
    specs = [*traits.all_variants(arch), *traits.all_fp8_variants(arch), *decode_traits.all_decode_kernels(arch),
             *all_quantize_kernels(arch), *all_backward_kernels(arch),
             *(all_accumulate_kernels() if distributed else ())]
    if arch in traits.FP8_ARCHS:
        specs.append(TRANSPOSE_V_KERNEL)
    seen: set = set()
    out = []
    for spec in specs:  # fp8_amax and fp8_quantize are one build (one cubin, two entry points)
        build = (spec.source, tuple(sorted(spec.defines().items())))
        if build not in seen:
            seen.add(build)
            out.append(spec)
    return out
