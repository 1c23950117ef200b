"""That every rank called with the same problem: checked once per communicator.

The first call on a communicator gathers each rank's description of its call (shapes, dtype,
flags; an all-gather of a few int64s) and compares them, so uneven shards or mixed arguments are
refused with the rank and the field that differ, on every rank, before any attention work. A rank
whose own arguments were refused takes part too, saying so, and every rank raises: none is left
waiting in NCCL for a peer that raised. Later calls on that communicator are taken to agree:
checking each call would hold the host until the GPU reaches the check.
"""

from __future__ import annotations

import struct
import threading
import weakref
import zlib

import numpy as np

from .._arrays.array import new_array
from .._arrays.host_io import to_device, to_host

_lock = threading.Lock()
_checked: weakref.WeakSet = weakref.WeakSet()  # communicators whose first call agreed (a freed one's
# address may come back for a new communicator: the object, not the address, is what was checked)
_NONE = -(1 << 63)


def code(x) -> int | None:
    """A field's value as an int: a checksum of its text (dtypes, windows); None stays None."""
    return None if x is None else zlib.crc32(repr(tuple(x) if isinstance(x, list) else x).encode())


def _word(x) -> int:
    if x is None:
        return _NONE
    if isinstance(x, float):
        return struct.unpack("<q", struct.pack("<d", x))[0]
    return int(x)


def agree(comm, nb, handle, fields: dict, device: int, stream: int, u8: int, what: str,
          error: Exception | None = None) -> None:
    """Raise on every rank when a rank's arguments were refused (``error``, raised where it arose) or
    the ranks' ``fields`` (name -> int, float, bool or None; the same names on every rank) differ; after
    the communicator's first call, only this rank's ``error``."""
    with _lock:
        first = comm not in _checked
    if first:
        world = int(comm.nranks)
        mine = np.array([_word(error is not None), *(_word(v) for v in fields.values())], np.int64)
        src = to_device(mine, device=device, stream=stream)
        everyone = new_array((world, mine.size), np.dtype(np.int64), device, stream)
        nb.all_gather(src.ptr, everyone.ptr, mine.nbytes, u8, handle, stream)
        rows = to_host(everyone, stream=stream)
        if error is None:
            refused = [r for r in range(world) if rows[r, 0]]
            if refused:
                raise ValueError(f"{what}: rank {refused[0]}'s arguments were refused (its error says why); "
                                 "no rank ran the call")
            for r in range(world):
                for i, name in enumerate(fields, start=1):
                    if rows[r, i] != rows[0, i]:
                        theirs, first_ = _show(rows[r, i], fields[name]), _show(rows[0, i], fields[name])
                        raise ValueError(f"{what}: the ranks were called with different problems: rank {r}'s "
                                         f"{name} is {theirs} where rank 0's is {first_}")
            with _lock:
                _checked.add(comm)
    if error is not None:
        raise error


def _show(word: int, like) -> str:
    if word == _NONE:
        return "None"
    if isinstance(like, float):
        return repr(struct.unpack("<d", struct.pack("<q", int(word)))[0])
    return str(int(word))
