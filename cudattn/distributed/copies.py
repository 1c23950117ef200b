"""Device-to-device copies of rows of equal pitch (one ``cuMemcpy2DAsync`` each), and the copy
plans of the all-to-all's layout changes as plain (offset, pitch) arithmetic, which the CPU tests
replay on host memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuda.bindings import driver

from .._arrays.array import DeviceArray
from .._runtime.errors import check
from .._runtime.stream import stream_wait


@dataclass(frozen=True)
class Copy2D:
    """``height`` rows of ``width`` bytes from ``src`` + ``src_off`` (rows ``src_pitch`` apart) to
    ``dst`` + ``dst_off`` (rows ``dst_pitch`` apart); ``src``/``dst`` name buffers of a plan."""

    src: str
    src_off: int
    src_pitch: int
    dst: str
    dst_off: int
    dst_pitch: int
    width: int
    height: int


_MAX_PITCH = (1 << 31) - 1  # cuMemcpy2D refuses pitches above the device's limit (2^31 - 1 on these GPUs)


def copy2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream: int) -> None:
    """``height`` rows of ``width`` bytes; plain copies where the rows are one span or the pitches too long."""
    if height == 1 or (src_pitch == dst_pitch == width):
        check(driver.cuMemcpyDtoDAsync(dst, src, width * height, stream), "cuMemcpyDtoDAsync")
        return
    if max(src_pitch, dst_pitch) > _MAX_PITCH:
        for r in range(height):
            check(driver.cuMemcpyDtoDAsync(dst + r * dst_pitch, src + r * src_pitch, width, stream),
                  "cuMemcpyDtoDAsync")
        return
    p = driver.CUDA_MEMCPY2D()
    p.srcMemoryType = p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.dstDevice = src, dst
    p.srcPitch, p.dstPitch, p.WidthInBytes, p.Height = src_pitch, dst_pitch, width, height
    check(driver.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")


def run_plan(plan: list[Copy2D], buffers: dict[str, int], stream: int) -> None:
    """The copies of ``plan`` on ``stream``, ``buffers`` giving each named buffer's device address."""
    for c in plan:
        copy2d(buffers[c.dst] + c.dst_off, c.dst_pitch, buffers[c.src] + c.src_off, c.src_pitch, c.width, c.height,
               stream)


def place(dst: DeviceArray, src: DeviceArray, stream: int) -> None:
    """Copy ``src`` into ``dst`` of the same shape, where one is C-contiguous and the other a slice
    along one axis of a C-contiguous array (either way round): rows of equal pitch up to the last
    axis whose strides differ, so one 2-D copy (or a plain one) on ``stream``."""
    if src.stream_handle is not None and src.stream_handle != stream:
        stream_wait(stream, src.stream_handle)
    differ = [i for i in range(dst.ndim) if dst.strides[i] != src.strides[i]]
    if not differ:  # the same layout: one plain copy
        copy2d(dst.ptr, src.nbytes, src.ptr, src.nbytes, src.nbytes, 1, stream)
        return
    r = differ[-1]
    width = math.prod(src.shape[r + 1:]) * src.dtype.itemsize  # the rows' content, not the sliced side's pitch
    for name, x in (("dst", dst), ("src", src)):  # axes up to r fold into rows of pitch strides[r], dense after
        dense = x.dtype.itemsize
        for i in range(x.ndim - 1, -1, -1):
            if i > r and x.shape[i] > 1 and x.strides[i] != dense:
                raise ValueError(f"place: {name} is not dense past axis {r} (strides {x.strides})")
            if i < r and x.shape[i] > 1 and x.strides[i] != x.strides[i + 1] * x.shape[i + 1]:
                raise ValueError(f"place: {name}'s axes up to {r} do not fold into rows (strides {x.strides})")
            dense *= x.shape[i]
    copy2d(dst.ptr, dst.strides[r], src.ptr, src.strides[r], width, math.prod(src.shape[:r + 1]), stream)


def heads_to_ranks(B: int, S: int, H: int, D: int, world: int, itemsize: int, src: str, dst: str) -> list[Copy2D]:
    """``src`` ``(B, S, H, D)`` into ``dst`` ``(world, B, S, H/world, D)``: rank j's heads packed
    together (what the all-to-all sends rank j)."""
    h = H // world
    row, part = H * D * itemsize, h * D * itemsize
    return [Copy2D(src, j * part, row, dst, j * B * S * part, part, part, B * S) for j in range(world)]


def ranks_to_heads(B: int, S: int, H: int, D: int, world: int, itemsize: int, src: str, dst: str) -> list[Copy2D]:
    """The inverse: ``src`` ``(world, B, S, H/world, D)`` into ``dst`` ``(B, S, H, D)``."""
    return [Copy2D(c.dst, c.dst_off, c.dst_pitch, c.src, c.src_off, c.src_pitch, c.width, c.height)
            for c in heads_to_ranks(B, S, H, D, world, itemsize, dst, src)]


def rows_to_ranks(B: int, S: int, inner: int, world: int, src: str, dst: str) -> list[Copy2D]:
    """``src`` ``(B, S, inner bytes)`` into ``dst`` ``(world, B, S/world, inner)``: rank j's rows of the
    sequence packed together."""
    s = S // world
    return [Copy2D(src, j * s * inner, S * inner, dst, j * B * s * inner, s * inner, s * inner, B)
            for j in range(world)]


def ranks_to_rows(B: int, S: int, inner: int, world: int, src: str, dst: str) -> list[Copy2D]:
    """The inverse: ``src`` ``(world, B, S/world, inner)`` into ``dst`` ``(B, S, inner bytes)``."""
    return [Copy2D(c.dst, c.dst_off, c.dst_pitch, c.src, c.src_off, c.src_pitch, c.width, c.height)
            for c in rows_to_ranks(B, S, inner, world, dst, src)]
