"""Call plans: a call's device work recorded once per call signature, replayed by warm calls.

The full path of a call (validate -> plan -> kernel choice -> params struct -> TMA maps -> launch)
is the only description of what a call does. The first call with a given signature (shapes,
strides, dtypes, flags, device: everything but the addresses) runs it for real, then runs it a
second time with placeholder addresses under a `_recording.Recorder`, which keeps what it would
have done: the allocations, and for each launch the kernel, grid, block, shared memory and the
bytes of its params struct. Scanning those bytes for the placeholders finds where each address
goes (a pointer field, or the address inside a TMA map). A warm call then only allocates, copies
each params template, writes its addresses in, and launches: no validation objects, no ctypes
structs built field by field, no tensor map encoded (``cuTensorMapReplaceAddress`` on a copy of
the recorded map, memoised per address).

Checks that depend on addresses (alignment, null pointers, `out` overlapping an input) are made
by the caller on every call; everything else a signature determines was checked by the full path.
"""

from __future__ import annotations

import ctypes
import struct

from . import _array, _launch, _tma
from ._recording import BASES, NotReplayable, Recorder, placeholder, slot_of

__all__ = ["Replay", "record", "NotReplayable"]

_U64 = struct.Struct("<Q")
_pack_u64 = _U64.pack_into
_MAP_BYTES = _tma.TENSOR_MAP_BYTES
_MAP_CACHE_MAX = 256  # addresses remembered per recorded tensor map


class _Step:
    """One launch: its params template and where the addresses go."""

    __slots__ = ("kernel", "grid", "block", "smem", "buffer_type", "template", "pointers", "maps", "name")

    def __init__(self, kernel, grid, block, smem, template: bytes, pointers, maps):
        self.kernel = kernel
        self.name = kernel.name
        self.grid, self.block, self.smem = grid, block, smem
        self.buffer_type = ctypes.c_char * len(template)
        self.template = template
        self.pointers = pointers  # (byte offset, slot, offset from the slot's address)
        self.maps = maps  # (byte offset, slot, offset, recorded map bytes, {address: map bytes})


class Replay:
    """A recorded call: ``allocations`` (shape, dtype, strides) in slot order after the operands,
    ``steps``, and ``results``: the slots of the returned arrays (an operand slot for `out`)."""

    __slots__ = ("n_operands", "allocations", "steps", "results", "pair")

    def __init__(self, n_operands, allocations, steps, results, pair):
        self.n_operands = n_operands
        self.allocations = allocations
        self.steps = steps
        self.results = results
        self.pair = pair  # the call returned (out, lse)

    def run(self, operands: list, device_id: int, stream: int, keep: object):
        """Launch the recorded work for ``operands`` (DeviceArrays, None for absent ones) on ``stream``."""
        ptrs = [0 if a is None else a.ptr for a in operands]
        made = []
        for shape, dtype, strides in self.allocations:
            a = _array.new_array(shape, dtype, device_id, stream, keep, strides)
            made.append(a)
            ptrs.append(a.ptr)
        for st in self.steps:
            buf = st.buffer_type.from_buffer_copy(st.template)
            for off, slot, delta in st.pointers:
                _pack_u64(buf, off, ptrs[slot] + delta)
            for off, slot, delta, raw, seen in st.maps:
                addr = ptrs[slot] + delta
                m = seen.get(addr)
                if m is None:
                    if len(seen) >= _MAP_CACHE_MAX:
                        seen.clear()
                    m = seen[addr] = _tma.replace_address(raw, addr)
                buf[off:off + _MAP_BYTES] = m
            _launch.launch(st.kernel, st.grid, st.block, st.smem, stream, buf)  # the one way to launch
        n = self.n_operands
        res = [operands[s] if s < n else made[s - n] for s in self.results]  # made on `stream` already
        return (res[0], res[1]) if self.pair else res[0]


def placeholders(operands: list, base: int) -> list:
    """Stand-ins for ``operands``: same shape, strides, dtype and device, a placeholder address."""
    out = []
    for i, a in enumerate(operands):
        if a is None:
            out.append(None)
            continue
        p = object.__new__(_array.DeviceArray)
        p.ptr, p.shape, p.strides, p.dtype, p.device_id = placeholder(i, base), a.shape, a.strides, a.dtype, a.device_id
        p.owner, p.stream_handle, p.readonly = None, a.stream_handle, a.readonly
        out.append(p)
    return out


def _run_recorded(fn, operands: list, base: int):
    with Recorder(len(operands), base) as rec:
        result = fn(*placeholders(operands, base))
    results = []
    pair = isinstance(result, tuple)
    for r in (result if pair else (result,)):
        found = slot_of(r.ptr, base) if r is not None and r.ptr else None
        if found is None or found[1] != 0:
            raise NotReplayable("a result is not one of the call's arrays")
        results.append(found[0])
    return rec, results, pair


def record(fn, operands: list, stream: int) -> Replay:
    """Run ``fn`` on placeholders twice (two bases) under a recorder and turn what it did into a
    :class:`Replay`. Raises NotReplayable when the call did anything a replay cannot repeat."""
    a, b = (_run_recorded(fn, operands, base) for base in BASES)
    if a[1:] != b[1:] or len(a[0].launches) != len(b[0].launches) or \
            [x[:3] for x in a[0].allocations] != [x[:3] for x in b[0].allocations]:
        raise NotReplayable("two recordings differ")
    steps = [_step(a[0], b[0], la, lb, stream) for la, lb in zip(a[0].launches, b[0].launches)]
    return Replay(len(operands), a[0].allocations, steps, a[1], a[2])


def _step(ra: Recorder, rb: Recorder, la, lb, stream: int) -> _Step:
    kernel, grid, block, smem, launch_stream, params = la
    if la[:5] != lb[:5] or launch_stream != stream:
        raise NotReplayable("launches differ between recordings, or run on another stream")
    other = lb[5]
    if len(other) != len(params):
        raise NotReplayable("params of different sizes")
    explained = bytearray(len(params))  # bytes that differ between the recordings and are accounted for
    maps = []
    maps_b = {slot_of(addr, rb.base): raw for raw, addr in rb.maps.items()}
    for raw, addr in ra.maps.items():
        found = slot_of(addr, ra.base)
        off = params.find(raw)
        if off < 0:
            continue
        if found is None or other[off:off + _MAP_BYTES] != maps_b.get(found):
            raise NotReplayable("a tensor map of an address that is no operand")
        maps.append((off, found[0], found[1], raw, {}))
        explained[off:off + _MAP_BYTES] = b"\1" * _MAP_BYTES
    pointers = []
    for off in range(0, len(params) - 7, 8):
        if explained[off]:
            continue
        fa = slot_of(_U64.unpack_from(params, off)[0], ra.base)
        if fa is not None and fa == slot_of(_U64.unpack_from(other, off)[0], rb.base):
            pointers.append((off, *fa))
            explained[off:off + 8] = b"\1" * 8
    if any(x != y and not e for x, y, e in zip(params, other, explained)):
        raise NotReplayable("params bytes that depend on an address in an unknown way")
    return _Step(kernel, grid, block, smem, params, tuple(pointers), tuple(maps))
