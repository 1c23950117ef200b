"""How every collective call starts (:func:`begin`), and that every rank called with the same problem:
checked once per communicator (:func:`agree`).

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

from .._arrays.array import DeviceArray, new_array
from .._arrays.host_io import to_device, to_host
from .._runtime.device import get_device
from .._runtime.stream import StreamRef, as_stream
from .nccl_lib import nccl
from .watch import nccl_call, timeout_s, wait

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
        rows = all_gather_rows(nb, handle, u8, world, mine, device, stream, what)
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


def all_gather_rows(nb, handle, u8: int, world: int, row: np.ndarray, device: int, stream: int, what: str) -> np.ndarray:
    """Every rank's ``row`` (a 1-D array of one dtype and length on every rank), ``(world, len)`` on the
    host, through an NCCL all-gather on ``stream``; the host waits for it, up to the deadline
    (`watch.wait`)."""
    src = to_device(row, device=device, stream=stream)
    everyone = new_array((world, row.size), row.dtype, device, stream)
    with nccl_call(nb, handle, what):
        nb.all_gather(src.ptr, everyone.ptr, row.nbytes, u8, handle, stream)
    wait(nb, handle, stream, what)  # a peer that died after joining would hold a plain synchronisation forever
    return to_host(everyone, stream=stream)


def _show(word: int, like) -> str:
    if word == _NONE:
        return "None"
    if isinstance(like, float):
        return repr(struct.unpack("<d", struct.pack("<q", int(word)))[0])
    return str(int(word))


def begin(comm, fields: dict, error: Exception | None, ref, what: str):
    """The start every collective call shares: nccl4py, the communicator's device current, and
    `agree` (which raises ``error`` or a peer's refusal on every rank). Returns ``(bindings, handle,
    UINT8, stream)``: the stream is ``ref``'s (the call's) or, for a refused call, the device's own."""
    try:
        core, nb = nccl()
    except ImportError:
        if error is not None:  # no NCCL, so no peer can be waiting: this rank's own error
            raise error from None
        raise
    timeout_s()  # a bad CUDATTN_NCCL_TIMEOUT refused before any NCCL call, not in the middle of one
    dev = int(comm.device.device_id)
    get_device(dev)
    stream = (ref or as_stream(None, dev)).handle
    handle, u8 = nb.Comm(int(comm.ptr)), int(core.UINT8)
    agree(comm, nb, handle, fields, dev, stream, u8, what, error)
    return nb, handle, u8, stream


def call_stream(q, stream, device: int) -> StreamRef:
    """The call's stream: ``stream``, or the one ``q`` was made on (else the device's own), with the
    object that keeps it alive (for the outputs to hold, as `attention`'s do)."""
    if stream is None and q.stream_handle is not None:
        return StreamRef(q.stream_handle, getattr(getattr(q, "owner", None), "keep", None))
    return as_stream(stream, device)


def check_shards(what: str, comm, q, k, v) -> int:
    """The rules every collective call's q, k, v shards share, checked by each rank alone: cudattn
    device arrays, 4-D, on the communicator's GPU, of one 16-bit dtype. Returns that GPU."""
    dev = int(comm.device.device_id)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, DeviceArray):
            raise TypeError(f"{what}: {name} must be a cudattn DeviceArray (a rank's shard on the communicator's "
                            f"GPU: cudattn.to_device(shard, device=...)), not {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{what}: {name} must be 4-D; got shape {x.shape}")
        if x.device_id != dev:
            raise ValueError(f"{what}: {name} is on cuda:{x.device_id}, the communicator on cuda:{dev}")
    if q.dtype != k.dtype or k.dtype != v.dtype or q.dtype.itemsize != 2:
        raise TypeError(f"{what}: q, k, v must share one 16-bit dtype (float16 or bfloat16); got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    return dev


def check_slopes(what: str, slopes, q, layout: str) -> None:
    """ALiBi slopes for a call over the whole sequence: None, or a C-contiguous float32 DeviceArray
    ``(Hq,)`` or ``(B, Hq)`` on q's GPU; ValueError naming what is wrong."""
    if slopes is None:
        return
    B, Hq = q.shape[0], q.shape[2 if layout == "bshd" else 1]
    ok = (isinstance(slopes, DeviceArray) and slopes.dtype == np.float32 and slopes.is_c_contiguous
          and slopes.shape in ((Hq,), (B, Hq)) and slopes.device_id == q.device_id)
    if not ok:
        got = (f"a {slopes.dtype} DeviceArray {slopes.shape} on cuda:{slopes.device_id}"
               f"{'' if slopes.is_c_contiguous else ', not C-contiguous'}"
               if isinstance(slopes, DeviceArray) else type(slopes).__name__)
        raise ValueError(f"{what}: alibi_slopes must be a C-contiguous float32 DeviceArray of shape ({Hq},) or "
                         f"({B}, {Hq}) on q's GPU (cuda:{q.device_id}); got {got}")
