"""The device call path shared by the public entry points: stream -> operands -> plan -> launch.

1. **Stream** (:func:`consumer_stream`): ``stream=None`` is the current stream of the operands'
   package (torch's or CuPy's current stream, the stream that produced a cudattn DeviceArray,
   else cudattn's own stream); an explicit stream is taken as given.
2. **Operands** (:func:`operands`, `_operands.adapt`): device arrays of any runtime as
   DeviceArrays, each knowing its producer stream, and the call's signature from them (types,
   shapes, strides, dtypes, devices). The call is ordered after every producer that is not the
   call's stream, and those operands are kept alive until the call's work is done
   (`_stream.stream_wait`, `_lifetime`); when every operand was made on the call's stream
   there is nothing to do.
3. **Plan** (:func:`run`): the call signature (with the flags; never addresses) finds a recorded
   `_replay.Replay`. The first call of a signature runs the full path (validation with its
   precise errors, planning, the launches), then records it.
4. **Launch**: the replay allocates the outputs on the call's stream and launches.

Address checks run on every call (`_Plan.plain`, from byte spans the signature fixes): no null
pointer, 16-byte alignment, the output's byte range apart from each input's. A call that fails
one goes to the full path, which names the argument (alignment), refuses a null pointer or an
output that shares bytes with an input, and accepts views interleaved in one buffer. While the
call's stream captures a CUDA graph, cudattn cannot allocate an output (the graph is not
cudattn's), so such calls must pass ``out=``.
"""

from __future__ import annotations

from .._runtime import device as _device
from .._arrays import lifetime as _lifetime
from . import replay as _replay
from .._runtime import stream as _stream
from .._kernels import traits as _traits
from .._arrays.array import DeviceArray
from .._arrays.foreign import device_id_of
from .._spec.geometry import share_bytes
from .._spec.geometry import span as _span
from .._arrays.operands import CUDATTN, OTHER, adapt, current_stream_owner, kind_of
from .._runtime.stream import is_capturing, stream_wait

__all__ = ["consumer_stream", "operands", "run", "tag"]

_plans: dict = {}
_PLANS_MAX = 4096
_FULL_ONLY = object()  # a signature the replay cannot serve (empty problems, index uploads)
# Stream handles whose context is the thread's current one (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD and
# 0); any other handle carries its context, so a replay on it needs no current context.
_SPECIAL_STREAMS = (0, 1, 2)


def tag(x):
    """``x`` for a call signature: bools and None as themselves, anything else with its type, so that
    ``True``, ``1`` and ``1.0`` (equal and of equal hash) make different signatures."""
    return x if x is None or x is True or x is False else (type(x), x)


def consumer_stream(first, stream):
    """``(stream handle, stream owner or None, first operand adapted)`` by the rule in the module doc."""
    if stream is not None:
        ref = _stream.as_stream(stream, None)
        return ref.handle, ref.obj, None
    kind = kind_of(first)
    if kind == CUDATTN:
        h = first.stream_handle
        if h is None:
            ref = _stream.as_stream(None, first.device_id)
            return ref.handle, ref.obj, first
        return h, getattr(first.owner, "keep", None), first  # the stream that allocated it stays alive
    if kind != OTHER:
        a = adapt(first, "q", -1)
        if a.stream_handle is not None:
            return a.stream_handle, current_stream_owner(kind, a.device_id), a
    ref = _stream.as_stream(None, device_id_of(first, name="q"))
    return ref.handle, ref.obj, None


def operands(objs, names, stream) -> tuple:
    """The call's stream and its operands: ``(consumer, keep, ops, sig, unordered)``.

    ``consumer``/``keep``: `consumer_stream`; ``ops``: each of ``objs`` (None stays None) adapted
    for reading on ``consumer``; ``sig``: what they contribute to the call's signature (type,
    shape, strides, dtype, device, read-only: everything but the address); ``unordered``: some
    operand was produced on another stream or belongs to a producer that must be kept alive
    (`order_and_hold` has work to do)."""
    x = objs[0]
    t = type(x)
    if stream is None and t is DeviceArray and x.stream_handle is not None:  # `consumer_stream`'s usual case
        consumer, keep, a = x.stream_handle, getattr(x.owner, "keep", None), x
    else:
        consumer, keep, a = consumer_stream(x, stream)
        if a is None:
            a = adapt(x, names[0], consumer)
    ops = [a]
    sig = [(t, a.shape, a.strides, a.dtype, a.device_id, a.readonly)]
    h = a.stream_handle
    unordered = h != consumer and h is not None or t is not DeviceArray and kind_of(x) == OTHER
    current = None if t is DeviceArray else (t, a.device_id, h)  # its package's current stream, asked once
    for i in range(1, len(objs)):
        x = objs[i]
        if x is None:
            ops.append(None)
            sig.append(None)
            continue
        t = type(x)
        a = x if t is DeviceArray else adapt(x, names[i], consumer, current)
        ops.append(a)
        sig.append((t, a.shape, a.strides, a.dtype, a.device_id, a.readonly))
        h = a.stream_handle
        if h != consumer and h is not None or t is not DeviceArray and kind_of(x) == OTHER:
            unordered = True
    return consumer, keep, ops, tuple(sig), unordered


def order_and_hold(objs, ops, consumer: int):
    """Order ``consumer`` after each operand's producer; return what must stay alive (None: nothing)."""
    held = None
    waited = ()
    for x, a in zip(objs, ops):
        if a is None:
            continue
        p = a.stream_handle
        foreign = p is not None and p != consumer
        if foreign and p not in waited:
            stream_wait(consumer, p)
            waited += (p,)
        if foreign or kind_of(x) == OTHER:
            held = (held or ()) + (a,)
    return held


def check_addresses(ops, names, tensors: int, out_index: int | None) -> None:
    """Per-call checks of the first ``tensors`` operands: ValueError for a null pointer or an output
    overlapping an input. (A misaligned address is the full path's to report, naming the argument.)"""
    for a, n in zip(ops[:tensors], names):
        if a is not None and not a.ptr and 0 not in a.shape:
            raise ValueError(f"{n} is a null pointer (device address 0) with shape {a.shape}")
    if out_index is not None and ops[out_index] is not None:
        o = ops[out_index]
        if o.ptr and 0 not in o.shape:
            for a, n in zip(ops[:out_index], names):
                if a is not None and a.ptr and 0 not in a.shape and share_bytes(
                        o.ptr, o.shape, o.strides, o.dtype.itemsize, a.ptr, a.shape, a.strides, a.dtype.itemsize):
                    raise ValueError(f"out overlaps {n} (they share device memory); the kernel would overwrite "
                                     f"an input it still reads: pass a separate out")


class _Plan:
    """A recorded call signature: its replay, and what the per-call checks need, fixed by the
    signature: which operands are non-empty tensors, and the byte spans of the output and inputs."""

    __slots__ = ("replay", "nonempty", "out_index", "out_span", "inputs")

    def __init__(self, replay, ops, tensors: int, out_index: int | None):
        self.replay = replay
        spans = [None if a is None or 0 in a.shape else _span(a.shape, a.strides, a.dtype.itemsize)
                 for a in ops[:tensors]]
        self.nonempty = tuple(i for i, sp in enumerate(spans) if sp is not None)
        self.out_index = out_index
        self.out_span = None if out_index is None or spans[out_index] is None else spans[out_index]
        # (slot, span start, span end) of each non-empty input, checked against the output's span
        self.inputs = () if self.out_span is None else tuple(
            (i, *spans[i]) for i in range(out_index) if spans[i] is not None)

    def plain(self, ptrs: list) -> bool:
        """True when the addresses need no closer look: non-null, 16-byte aligned, the output's byte
        range apart from every input's. False sends the call to `check_addresses` and the full path."""
        for i in self.nonempty:
            p = ptrs[i]
            if not p or p & 15:
                return False
        if self.out_span is not None:
            o = ptrs[self.out_index]
            lo, hi = o + self.out_span[0], o + self.out_span[1]
            for i, a, b in self.inputs:
                p = ptrs[i]
                if p + a < hi and lo < p + b:
                    return False
        return True


def run(key, objs, ops, names, consumer: int, keep, full, *, tensors: int, out_index: int | None,
        allocates: bool, unordered: bool = True, force_full: bool = False):
    """One call: the recorded plan for ``key`` when there is one (``full(*ops)`` records it on a miss).

    ``key``: the call's signature (``sig`` from `operands` and the other arguments, tagged);
    ``full(*operands)`` is the full path (validate, plan, launch) on DeviceArrays; ``objs`` the
    caller's arrays, ``ops`` them adapted; ``tensors``: the leading operands that are attention
    tensors (checked for null pointers and overlap with the output at ``out_index``);
    ``allocates``: the call returns arrays cudattn allocates (no ``out=``, or an LSE);
    ``unordered``: from `operands`; ``force_full``: an address-dependent case the caller wants the
    full path to judge. Returns what ``full`` returns."""
    if _lifetime.pending:
        _lifetime.release_done()
    key = (key, _traits.FORCED_FAMILY)  # tests may force the portable kernels
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable argument: the full path says which
        key, plan = None, _FULL_ONLY
    if allocates and is_capturing(consumer):
        raise ValueError("the stream is in CUDA graph capture, and cudattn cannot allocate the output inside "
                         "a graph it does not own: pass out= (and call without return_lse)")
    device_id = ops[0].device_id
    ptrs = [0 if a is None else a.ptr for a in ops]
    if plan.__class__ is _Plan and not force_full and plan.plain(ptrs):
        held = order_and_hold(objs, ops, consumer) if unordered else None
        if consumer in _SPECIAL_STREAMS:  # the legacy / per-thread stream: the current context decides
            _device.get_device(device_id)
        # a call that allocates has just learnt that its stream does not capture (else it raised)
        result = plan.replay.run(ops, ptrs, device_id, consumer, keep, False if allocates else None)
    else:
        _device.get_device(device_id)
        check_addresses(ops, names, tensors, out_index)
        held = order_and_hold(objs, ops, consumer)
        result = full(*ops)
        if key is not None and plan is None:
            if len(_plans) >= _PLANS_MAX:  # many distinct shapes (variable lengths): keep the table bounded
                _plans.clear()
            try:
                _plans[key] = _Plan(_replay.record(full, ops, consumer), ops, tensors, out_index)
            except _replay.NotReplayable:
                _plans[key] = _FULL_ONLY
    if out_index is not None and ops[out_index] is not None:
        ops[out_index].stream_handle = consumer  # consumers of `out` now order after this call
    if held is not None:
        _lifetime.hold(consumer, held)
    return result
