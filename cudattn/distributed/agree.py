"""That every rank called with the same problem: checked once per communicator.

The first call on a communicator gathers each rank's description of its call (shapes, dtype,
flags; an all-gather of a few int64s) and compares them, so uneven shards or mixed arguments are
refused with the rank and the field that differ, on every rank, before any attention work; a
rank cannot wait in NCCL for a peer that raised instead. Later calls on that communicator are
taken to agree: checking each call would hold the host until the GPU reaches the check.
"""

from __future__ import annotations

import struct
import threading
import zlib

import numpy as np

from .._arrays.array import new_array
from .._arrays.host_io import to_device, to_host

_lock = threading.Lock()
_checked: set[int] = set()  # communicators (their NCCL handles) whose first call agreed


def code(x) -> int | None:
    """A field's value as an int: a checksum of its text (dtypes, windows); None stays None."""
    return None if x is None else zlib.crc32(repr(tuple(x) if isinstance(x, list) else x).encode())


def _word(x) -> int:
    if x is None:
        return -(1 << 63)
    if isinstance(x, float):
        return struct.unpack("<q", struct.pack("<d", x))[0]
    return int(x)


def agree(comm, nb, handle, fields: dict, device: int, stream: int, u8: int, what: str) -> None:
    """Raise ValueError on every rank when the ranks' ``fields`` (name -> int, float, bool or None)
    differ; a no-op after the communicator's first call."""
    key = int(comm.ptr)
    with _lock:
        if key in _checked:
            return
    world = int(comm.nranks)
    mine = np.array([_word(v) for v in fields.values()], np.int64)
    src = to_device(mine, device=device, stream=stream)
    everyone = new_array((world, mine.size), np.dtype(np.int64), device, stream)
    nb.all_gather(src.ptr, everyone.ptr, mine.nbytes, u8, handle, stream)
    rows = to_host(everyone, stream=stream)
    for r in range(world):
        for i, name in enumerate(fields):
            if rows[r, i] != rows[0, i]:
                theirs, first = _show(rows[r, i], fields[name]), _show(rows[0, i], fields[name])
                raise ValueError(f"{what}: the ranks were called with different problems: rank {r}'s {name} is "
                                 f"{theirs} where rank 0's is {first}")
    with _lock:
        _checked.add(key)


def _show(word: int, like) -> str:
    if word == -(1 << 63):
        return "None"
    if isinstance(like, float):
        return repr(struct.unpack("<d", struct.pack("<q", int(word)))[0])
    return str(int(word))
