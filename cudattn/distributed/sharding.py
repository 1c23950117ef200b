"""Cutting a sequence into the ranks' shards and putting it back together (host arrays).

Zigzag (the causal layout): the sequence is cut into ``2·world`` chunks and rank r gets chunks r
and ``2·world-1-r``, one early and one late, so every rank does the same causal work. Otherwise
rank r gets the r-th of ``world`` contiguous pieces. The sequence axis is 1 for ``"bshd"``
arrays, 2 for ``"bhsd"`` ones and for LSEs ``(B, H, S)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from .schedule import chunks_of


def _chunk_count(length: int, world: int, zigzag: bool, what: str) -> int:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be an int >= 1; got {world!r}")
    n = world * (2 if zigzag else 1)
    if length % n:
        raise ValueError(f"{what}: a sequence of {length} is not divisible into {n} equal chunks "
                         f"({'2 x ' if zigzag else ''}{world} ranks{', zigzag' if zigzag else ''})")
    return n


def shard_sequence(x, world: int, *, zigzag: bool = True, axis: int = 1) -> list[NDArray]:
    """The ``world`` shards of ``x`` along ``axis`` (a list, rank order; contiguous copies)."""
    x = np.asarray(x)
    n = _chunk_count(x.shape[axis], world, zigzag, "shard_sequence")
    pieces = np.split(x, n, axis=axis)
    return [np.ascontiguousarray(np.concatenate([pieces[i] for i in chunks_of(r, world, zigzag)], axis=axis))
            for r in range(world)]


def gather_sequence(shards: Sequence, *, zigzag: bool = True, axis: int = 1) -> NDArray:
    """The whole sequence back from the ranks' shards (as `shard_sequence` cut it)."""
    shards = [np.asarray(s) for s in shards]
    world = len(shards)
    if world == 0:
        raise ValueError("gather_sequence needs at least one shard")
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"gather_sequence: shards of unequal shapes {[s.shape for s in shards]}")
    per = 2 if zigzag else 1
    _chunk_count(shards[0].shape[axis] * world, world, zigzag, "gather_sequence")
    pieces: list = [None] * (world * per)
    for r, s in enumerate(shards):
        for i, part in zip(chunks_of(r, world, zigzag), np.split(s, per, axis=axis)):
            pieces[i] = part
    return np.concatenate(pieces, axis=axis)
