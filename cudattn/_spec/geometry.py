"""Geometry of strided views, with no memory behind them: strides, byte spans, overlap.

One home for the arithmetic that the array type, validation, the call path's address checks and
the kernels' parameter structs share: C-contiguous strides, the byte range a view touches, whether
two views share a byte, and the element strides of a freshly allocated attention tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TensorGeom", "c_strides", "span", "is_dense", "share_bytes", "stand_in", "contiguous_geom"]

_TooHardError = getattr(np, "exceptions", np).TooHardError


@dataclass(frozen=True)
class TensorGeom:
    """Element strides of a q/k/v/out tensor, always in (batch, seq, head) order whatever the layout.

    The last (head-dim) axis has unit stride by contract, so it is not stored.
    """

    batch: int
    seq: int
    head: int


def c_strides(shape: tuple, itemsize: int) -> tuple:
    """Byte strides of a C-contiguous array of ``shape`` (a size-0 axis steps as a size-1 one)."""
    out = []
    step = itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def span(shape, strides, itemsize) -> tuple[int, int]:
    """Byte offsets ``[lo, hi)`` relative to the view's address that it touches (``(0, 0)`` if empty)."""
    if 0 in shape:
        return 0, 0
    lo = hi = 0
    for n, s in zip(shape, strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


def is_dense(shape, strides, itemsize) -> bool:
    """True when the view covers its span exactly once: no gaps and no overlap, in any axis order."""
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n != 1)
    expect = itemsize
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True


def share_bytes(aptr, ashape, astrides, aitem, bptr, bshape, bstrides, bitem) -> bool:
    """Whether two views (address, shape, byte strides, itemsize) share a byte: exact, through NumPy
    on stand-ins that are never read, so views interleaved in one buffer (two halves of an axis)
    are not refused. A case too hard to decide quickly counts as no overlap."""
    (alo, ahi), (blo, bhi) = span(ashape, astrides, aitem), span(bshape, bstrides, bitem)
    if aptr + ahi <= bptr + blo or bptr + bhi <= aptr + alo:  # disjoint byte ranges: the usual case
        return False
    try:
        a = stand_in(aptr or 1 << 40, ashape, astrides, aitem)
        b = stand_in(bptr or 1 << 40, bshape, bstrides, bitem)
        return bool(np.shares_memory(a, b, max_work=10**6))
    except (_TooHardError, ValueError):  # ValueError: a view NumPy cannot describe (more bytes than it
        return False  # addresses); validation refuses such shapes


class _ArrayInterface:
    __slots__ = ("__array_interface__",)

    def __init__(self, iface: dict):
        self.__array_interface__ = iface


def stand_in(base: int, shape, strides, itemsize: int) -> np.ndarray:
    """A NumPy array describing the view at address ``base`` without owning or reading it."""
    iface = {"version": 3, "data": (base, True), "shape": shape, "strides": strides, "typestr": f"|V{itemsize}"}
    return np.asarray(_ArrayInterface(iface))


def contiguous_geom(seq: int, heads: int, head_dim: int, layout: str) -> TensorGeom:
    """Element strides (batch, seq, head) of a C-contiguous attention tensor in ``layout``."""
    if layout == "bshd":
        return TensorGeom(batch=seq * heads * head_dim, seq=heads * head_dim, head=head_dim)
    return TensorGeom(batch=heads * seq * head_dim, seq=head_dim, head=seq * head_dim)
