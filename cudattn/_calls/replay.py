"""Call plans: a call's device work recorded once per call signature, replayed by warm calls.

The full path of a call (validate -> plan -> kernel choice -> params struct -> TMA maps -> launch)
is the only description of what a call does. The first call with a given signature (shapes,
strides, dtypes, flags, device: everything but the addresses) runs it for real, then runs it a
second time with placeholder addresses under a `_runtime.recording.Recorder`, which keeps what it would
have done: the allocations, and for each launch the kernel, grid, block, shared memory and the
bytes of its params struct. Scanning those bytes for the placeholders finds where each address
goes (a pointer field, or the address inside a TMA map). A warm call then only allocates and
launches: each launch's argument block is built once per combination of addresses (the template
copied, the addresses written in, TMA maps re-addressed with ``cuTensorMapReplaceAddress``) and
kept, so a call with addresses seen before (the same inputs, an ``out`` reused, an output the pool
hands back at the same address) passes a ready block to ``cuLaunchKernel``: no validation objects,
no ctypes structs built field by field, no tensor map encoded.

Checks that depend on addresses (alignment, null pointers, `out` overlapping an input) are made
by the caller on every call; everything else a signature determines was checked by the full path.
"""

from __future__ import annotations

import ctypes
import math
import operator
import struct

from .._arrays import alloc as _alloc
from .._arrays import array as _array
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._runtime import stream as _stream
from .._runtime.errors import check
from .._arrays import stream_memory as _stream_memory
from .._kernels import tma as _tma
from .._spec.geometry import c_strides as _c_strides
from .._runtime.recording import BASES, COUNTERS, OPTIONAL_COUNTERS, NotReplayable, Recorder, placeholder, slot_of

__all__ = ["Replay", "record", "NotReplayable"]

launch_prepared = _launch.launch_prepared
_U64 = struct.Struct("<Q")
_pack_u64 = _U64.pack_into
_MAP_BYTES = _tma.TENSOR_MAP_BYTES
_MAP_CACHE_MAX = 256  # addresses remembered per recorded tensor map
_BUILT_MAX = 64  # argument blocks kept per launch
_SCRATCH_ALIGN = 256


class _Step:
    """One launch: its params template, where the addresses go, and the argument blocks already
    built for the address combinations seen (a warm call with the same addresses, the usual case
    for decode loops and reused outputs, launches from one of them as it is)."""

    __slots__ = ("kernel", "name", "args", "launch_args", "template", "pointers", "maps", "slots", "built")

    def __init__(self, kernel, grid, block, smem, template: bytes, pointers, maps):
        self.kernel = kernel
        self.name = kernel.name
        self.args = (kernel.function, *grid, *block, smem)  # cuLaunchKernel's leading arguments
        self.launch_args = (int(kernel.function), *grid, *block, smem)  # the same as plain ints (`warm`)
        self.template = template
        self.pointers = pointers  # (byte offset, slot, offset from the slot's address)
        self.maps = maps  # (byte offset, slot, offset, recorded map bytes, {address: map bytes})
        slots = sorted({p[1] for p in pointers} | {m[1] for m in maps})
        self.slots = operator.itemgetter(*slots) if slots else (lambda ptrs: ())
        self.built: dict = {}  # the slots' addresses -> (argv address, argv, params buffer)

    def build(self, ptrs: list, device_id: int) -> tuple:
        """A new entry of ``built`` for the operands at ``ptrs`` (a combination not in it, where
        `Replay.run` looks first): (address of the ``void*[1]`` kernel-argument array, then what holds
        that array and the params buffer; only the address is read). The caller holds the entry until
        its launch is queued: another thread may drop it from ``built`` meanwhile, and the driver reads
        the buffer during the launch. (The compiled warm path builds an entry of the same form itself
        where every map's address is in its ``seen`` cache already, and comes here for the rest.)"""
        return self._build(ptrs, self.slots(ptrs), device_id)

    def _build(self, ptrs: list, key, device_id: int) -> tuple:
        buf = ctypes.create_string_buffer(self.template, len(self.template))
        base = ctypes.addressof(buf)
        for off, slot, delta in self.pointers:
            _pack_u64(buf, off, ptrs[slot] + delta)
        for off, slot, delta, raw, seen in self.maps:
            addr = ptrs[slot] + delta
            m = seen.get(addr)
            if m is None:
                _device.get_device(device_id)  # the driver wants a current context to re-address a map
                if len(seen) >= _MAP_CACHE_MAX:
                    seen.clear()
                m = seen[addr] = _tma.replace_address(raw, addr)
            ctypes.memmove(base + off, m, _MAP_BYTES)
        argv = _launch.ArgPointers(base)
        entry = (ctypes.addressof(argv), argv, buf)
        if len(self.built) >= _BUILT_MAX:  # many address combinations: start over, bounded
            self.built.clear()
        self.built[key] = entry  # built whole before it is published: other threads only read it
        return entry


class Replay:
    """A recorded call: ``allocations`` (shape, dtype, strides) in slot order after the operands,
    ``steps``, and ``results``: the slots of the returned arrays (an operand slot for `out`).

    Allocations that are not results (workspaces: split-KV partials, FP8's transposed V) share one
    block, carved at 256-byte offsets: for a single-launch call the stream's kept workspace
    (`_arrays.stream_memory`: no allocation per call; the call's own when large, past the budget or
    captured), else the call's own, dropped after the launches (its free is stream-ordered, so it
    waits for them). Arrival counters (dtype COUNTERS) are the stream's too, or the graph's while
    the stream captures one."""

    __slots__ = ("n_operands", "allocations", "steps", "results", "pair", "scratch_bytes", "kept_scratch", "counters",
                 "native")

    def __init__(self, n_operands, allocations, steps, results, pair):
        self.n_operands = n_operands
        self.steps = steps
        self.results = results
        self.pair = pair  # the call returned a tuple: (out, lse), or the backward's gradients
        self.allocations = []  # (shape, dtype, strides, offset in the scratch block or None: a result)
        offset = 0
        for i, (shape, dtype, strides) in enumerate(allocations):
            if n_operands + i in results or dtype is COUNTERS or dtype is OPTIONAL_COUNTERS:
                self.allocations.append((shape, dtype, strides, None))
            else:
                self.allocations.append((shape, dtype, strides, offset))
                offset += -(-math.prod(shape) * dtype.itemsize // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
        self.scratch_bytes = offset
        # one kernel writes and reads the scratch: the stream's kept workspace serves it (`_allocate`)
        self.kept_scratch = bool(offset) and len(steps) == 1
        self.counters = any(dtype is COUNTERS or dtype is OPTIONAL_COUNTERS for _, dtype, _, _ in self.allocations)
        # What the compiled warm call (`_warm_c/replay.c`) allocates itself on a stream known not to
        # capture, as `_allocate` does there: (scratch bytes, whether the stream's kept workspace serves them,
        # per allocation in slot order a result's (shape, dtype, strides, bytes), a counters slot's
        # (count, optional) or a workspace slice's offset). None where a result is empty: `_allocate`.
        self.native = None
        items = []
        for shape, dtype, strides, offset in self.allocations:
            if dtype is COUNTERS or dtype is OPTIONAL_COUNTERS:
                items.append((shape[0], dtype is OPTIONAL_COUNTERS))
            elif offset is not None:
                items.append(offset)
            elif math.prod(shape):
                items.append((shape, dtype, _c_strides(shape, dtype.itemsize) if strides is None else strides,
                              math.prod(shape) * dtype.itemsize))
            else:
                break
        else:
            self.native = (self.scratch_bytes, self.kept_scratch, tuple(items))

    def run(self, operands: list, ptrs: list, device_id: int, stream: int, keep: object,
            capturing: bool | None = None):
        """Launch the recorded work for ``operands`` (DeviceArrays, None for absent ones; ``ptrs``
        their addresses, 0 for absent ones, extended here) on ``stream``.

        The launches were checked when the call was recorded (grid, shared memory): here they go
        straight to ``cuLaunchKernel``. The params block is copied by the driver at the launch."""
        made = self._allocate(ptrs, device_id, stream, keep, capturing) if self.allocations else None
        for st in self.steps:
            entry = st.built.get(st.slots(ptrs))
            if entry is None:
                entry = st.build(ptrs, device_id)
            launch_prepared(st.args, stream, entry[0], st.name)
        if made is None:  # out= given, no workspace: the results are operands
            res = self.results
            if self.pair:  # (out, lse), or the backward's gradients
                return (operands[res[0]], operands[res[1]]) if len(res) == 2 else tuple(operands[s] for s in res)
            return operands[res[0]]
        n = self.n_operands
        res = [operands[s] if s < n else made[s - n] for s in self.results]  # made on `stream` already
        return ((res[0], res[1]) if len(res) == 2 else tuple(res)) if self.pair else res[0]

    def _allocate(self, ptrs: list, device_id: int, stream: int, keep: object, capturing: bool | None = None) -> list:
        """Take the call's allocations, their addresses appended to ``ptrs``; returns what each slot
        holds (results, and counters until the launches are queued; None for workspace slices).
        ``capturing``: whether ``stream`` captures a graph (None: not asked yet; asked once here
        when the stream's kept memory is wanted)."""
        made = []
        scratch = None
        kept = self.kept_scratch
        if capturing is None and (kept or self.counters):
            capturing = _stream.is_capturing(stream)
        reuse = capturing is False  # known outside capture: blocks kept on the host may serve (`_arrays.alloc`)
        if kept:  # one kernel writes and reads it: the stream's
            scratch = _stream_memory.workspace(device_id, stream, self.scratch_bytes, keep, capturing)
        elif self.scratch_bytes:  # read by a later kernel of the call: its own (`_arrays.stream_memory`)
            scratch = _alloc.allocate(device_id, self.scratch_bytes, stream, keep, reuse)
        for shape, dtype, strides, offset in self.allocations:
            if dtype is COUNTERS or dtype is OPTIONAL_COUNTERS:  # the stream's zeroed counters; a capturing
                a = _stream_memory.counters(device_id, stream, shape[0], keep, capturing,  # stream's are the
                                            dtype is OPTIONAL_COUNTERS)  # graph's (or none, if optional)
            elif offset is None:
                a = _array.new_array(shape, dtype, device_id, stream, keep, strides, reuse)
            else:
                made.append(None)
                ptrs.append(scratch.ptr + offset)
                continue
            made.append(a)
            ptrs.append(a.ptr)
        made.append(scratch)  # held until the launches are queued (a call's own: freed stream-ordered)
        return made


def launch_failed(err: int, st: _Step) -> None:
    """Raise the error of a failed launch of ``st`` (the compiled warm call's launches: `warm`)."""
    args = st.args
    check(err, f"cuLaunchKernel({st.name}, grid={args[1:4]}, block={args[4:7]}, smem={args[7]})")


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
