"""Recording one call's device work instead of doing it, so that `_calls.replay` can repeat it cheaply.

While a :class:`Recorder` is active on this thread, the places where a call touches the device
report to it instead: `_runtime.launch.launch` (kernel, grid, block, shared memory, the bytes of the
params struct), `_arrays.array.new_array` (an allocation: it gets a placeholder address, not memory),
`_arrays.stream_memory.counters` (a stream's zeroed arrival counters: a placeholder too) and `_kernels.tma.encode`
(a tensor map made for a placeholder address). Any other device operation
during a recording (a copy, a memset, a stream wait) raises :class:`NotReplayable`, and that call
signature is then served by the full path every time.

Placeholder addresses: slot ``i`` (an operand or an allocation) is ``base + (i + 1) << 36``, in
the range of ordinary device addresses (tensor-map encoding checks it), with 36 bits of room for
offsets derived from it. `_calls.replay` records twice with two bases and keeps only the fields that
moved with the base, so an integer field that happens to look like a placeholder is never patched.
"""

from __future__ import annotations

import threading

__all__ = ["Recorder", "NotReplayable", "BASES", "COUNTERS", "OPTIONAL_COUNTERS", "active", "current", "placeholder",
           "slot_of", "refuse"]

BASES = (0x5000_0000_0000, 0x6000_0000_0000)
COUNTERS = "arrival counters"  # the dtype of an allocation that is a stream's zeroed counters (`_arrays.stream_memory`)
OPTIONAL_COUNTERS = "optional counters"  # the same, that a kernel can do without: null under graph capture
_SLOT_SHIFT = 36
_OFFSET_MASK = (1 << _SLOT_SHIFT) - 1
# Operands and allocations a recorded call may have: a KV-cache call with every optional array
# (13 operands) and the split-KV path's outputs, partials and counters needs more than 15.
# Placeholders stay far apart from the other base: (MAX_SLOTS + 1) << _SLOT_SHIFT < 2**44.
MAX_SLOTS = 64

#: True while any thread records (a cheap test for the hooks; `current` then says which thread).
active = False
_tls = threading.local()
_lock = threading.Lock()
_count = 0


class NotReplayable(Exception):
    """The call did device work a replay cannot repeat."""


def placeholder(slot: int, base: int) -> int:
    if slot >= MAX_SLOTS:
        raise NotReplayable("too many arrays")
    return base + ((slot + 1) << _SLOT_SHIFT)


def slot_of(value: int, base: int) -> tuple[int, int] | None:
    """``(slot, offset)`` when ``value`` is a placeholder address of ``base`` (plus an offset), else None."""
    d = value - base
    if not 1 << _SLOT_SHIFT <= d < (MAX_SLOTS + 1) << _SLOT_SHIFT:
        return None
    return (d >> _SLOT_SHIFT) - 1, d & _OFFSET_MASK


class Recorder:
    """What one call did, in order: ``launches`` (kernel, grid, block, smem, stream, params bytes),
    ``allocations`` (shape, dtype, strides) whose slots follow the operands', and ``maps``
    (placeholder address -> tensor map bytes)."""

    def __init__(self, n_operands: int, base: int):
        self.n_operands = n_operands
        self.base = base
        self.launches: list = []
        self.allocations: list = []
        self.maps: dict[bytes, int] = {}

    def __enter__(self) -> Recorder:
        global active, _count
        _tls.recorder = self
        with _lock:
            _count += 1
            active = True
        return self

    def __exit__(self, *exc) -> None:
        global active, _count
        _tls.recorder = None
        with _lock:
            _count -= 1
            active = _count > 0

    def allocate(self, shape: tuple, dtype, strides: tuple) -> int:
        self.allocations.append((shape, dtype, strides))
        return placeholder(self.n_operands + len(self.allocations) - 1, self.base)

    def counters(self, count: int, optional: bool = False) -> int:
        """Zeroed arrival counters (`_arrays.stream_memory`): a slot like an allocation, marked COUNTERS
        (OPTIONAL_COUNTERS: null while the stream captures a graph)."""
        return self.allocate((count,), OPTIONAL_COUNTERS if optional else COUNTERS, None)

    def launch(self, kernel, grid, block, smem: int, stream: int, params) -> None:
        self.launches.append((kernel, tuple(grid), tuple(block), smem, stream, bytes(params)))

    def tensor_map(self, ptr: int, raw: bytes) -> None:
        self.maps[bytes(raw)] = ptr


def current() -> Recorder | None:
    return getattr(_tls, "recorder", None)


def refuse(what: str) -> None:
    """Called by device operations a replay cannot repeat: raise when this thread is recording."""
    if active and current() is not None:
        raise NotReplayable(what)
