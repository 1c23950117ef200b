"""The call object every public entry point runs through: operands -> stream -> signature key ->
recorded plan (replayed) or the full path (validate, plan, launch; then recorded).

An entry builds a :class:`Call` from its operands (device arrays of any runtime, or None where an
optional one is absent) and the ``stream=`` it was given, and hands :meth:`Call.run` its part of the
signature (its flags, whose types join them, since ``True``, ``1`` and ``1.0`` are equal, hash alike
and validate differently; then anything else it keys on) and its full path: a module-level function
of the call, the entry's arguments and the adapted operands, which validates and launches. A warm
call builds no closure (a closure over an entry's dozen arguments costs as much as the key lookup).
Everything else is here, written once.

**Plan** (:meth:`Call.run`): the call signature (with the flags; never addresses) finds a recorded
`replay.Replay`. The first call of a signature runs the full path (validation with its precise
errors, planning, the launches), then records it. A warm call allocates its outputs on the call's
stream and launches.

Address checks run on every call (`RecordedCall.plain`, from byte spans the signature fixes): no
null pointer, 16-byte alignment, the output's byte range apart from each input's. A call that fails
one goes to the full path, which names the argument (alignment), refuses a null pointer or an
output that shares bytes with an input, and accepts views interleaved in one buffer. While the
call's stream captures a CUDA graph, cudattn cannot allocate an output (the graph is not
cudattn's), so such calls must pass ``out=``.
"""

from __future__ import annotations

import sys

from .._arrays import lifetime as _lifetime
from .._kernels import alibi_shift as _alibi_shift
from .._kernels import sm_margin as _sm_margin
from .._kernels import traits as _traits
from .._runtime import device as _device
from .._runtime.stream import StreamRef, is_capturing
from .._spec.geometry import span as _span
from . import replay as _replay
from . import warm as _warm
from .._arrays.array import DeviceArray
from .._arrays.importer import JAX, KINDS, adapt, kind_of
from .operands import check_addresses, check_one_device, consumer_stream, order_and_hold

__all__ = ["Call", "RecordedCall", "dispatch"]

_plans: dict = {}
_PLANS_MAX = 4096
_MISS = _warm.MISS
_FULL_ONLY = object()  # a signature the replay cannot serve (empty problems, index uploads)
# Stream handles whose context is the thread's current one (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD and
# 0); any other handle carries its context, so a replay on it needs no current context.
_SPECIAL_STREAMS = (0, 1, 2)


def _signature_tuple(sig: tuple, flags: tuple) -> tuple:
    """The operand part of a call's key, and its flags' types (so that ``True``, ``1`` and ``1.0``, equal
    and of equal hash, key apart), where the compiled extension is absent."""
    return sig, (*map(type, flags),)  # (*map(...),) builds the tuple faster than tuple(map(...))


# The compiled extension writes that part as bytes (hashed and compared in a fifth of the nest's time),
# for the Python path as for its own warm calls, which must find the plans the Python path records.
_signature = _warm.signature if _warm.signature is not None else _signature_tuple


class Call:
    """One device call of a public entry point: its operands adapted for reading on the call's
    stream, and :meth:`run`, which finds its recorded plan or runs its full path.

    ``objs``: the caller's arrays in the entry's order (None where absent); ``names``: theirs, for
    errors. ``consumer``: the call's stream handle (`operands.consumer_stream`), ``keep`` the
    object that owns it; ``ops``: each of ``objs`` (None stays None) adapted for reading on
    ``consumer``; ``sig``: what they add to the call's signature (type, shape, strides, dtype,
    device, read-only: everything but the address); ``unordered``: some operand was produced on
    another stream or belongs to a producer that must be kept alive (`operands.order_and_hold`
    has work to do)."""

    __slots__ = ("op", "objs", "names", "consumer", "keep", "ops", "sig", "unordered")

    def __init__(self, op: str, objs, names, stream):
        try:
            self.op = op
            self.objs = objs
            self.names = names
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
            unordered = h != consumer and h is not None or t is not DeviceArray and kind_of(x) >= JAX
            current = None if t is DeviceArray else (t, a.device_id, h)  # its package's current stream, asked once
            for i in range(1, len(objs)):
                x = objs[i]
                if x is None:
                    ops.append(None)
                    sig.append(None)
                    continue
                t = type(x)
                if t is DeviceArray:
                    a = x
                else:
                    a = adapt(x, names[i], consumer, current)
                    if KINDS[t] >= JAX:  # known once adapted: held until the call's work is done
                        unordered = True
                ops.append(a)
                sig.append((t, a.shape, a.strides, a.dtype, a.device_id, a.readonly))
                h = a.stream_handle
                if h != consumer and h is not None:
                    unordered = True
            self.consumer, self.keep, self.ops, self.sig, self.unordered = consumer, keep, ops, tuple(sig), unordered
        except BaseException:  # a refused operand after a context switch: the caller's context back
            if _device.pending:
                _device.restore_caller_context()
            raise

    def stream_ref(self) -> StreamRef:
        """The call's stream, holding the object that owns it (what launches and allocations take)."""
        return StreamRef(self.consumer, self.keep)

    def run(self, flags: tuple, key, full, args, *, tensors: int, out_index: int | None, allocates: bool,
            force_full: bool = False, more_outs: tuple = ()):
        """This call: its recorded plan when there is one, else its full path (then recorded).

        The signature is the operation, the operands' part, ``flags`` with their types, and ``key``
        (the entry's other parts; never addresses). ``full(call, args, *ops)`` is the full path
        (validate, plan, launch) on the adapted operands, ``args`` what it needs of the entry's
        arguments; ``tensors``: the leading operands that are attention tensors
        (checked for null pointers and overlap with the output at ``out_index``); ``allocates``: the
        call returns arrays cudattn allocates (no ``out=``, or an LSE); ``force_full``: an
        address-dependent case the entry wants the full path to judge; ``more_outs``: the slots of further
        outputs after ``out_index`` (the backward's dk and dv), checked as ``out_index``'s is and apart
        from it. Returns what ``full`` returns."""
        try:
            objs, ops, names, consumer, keep = self.objs, self.ops, self.names, self.consumer, self.keep
            # tests may force the portable kernels, and a ring leaves SMs free (sm_margin) and moves ALiBi's
            # diagonal (alibi_shift): all change what a call launches
            try:
                key = (self.op, _signature(self.sig, flags), flags, key, _traits.FORCED_FAMILY, _sm_margin.local.n,
                       _alibi_shift.local.n)
                plan = _plans.get(key)
            except TypeError:  # an unhashable argument: the full path says which
                key, plan = None, _FULL_ONLY
            device_id = ops[0].device_id
            if consumer in _SPECIAL_STREAMS:  # handles 0-2 name the current context's streams: the operands'
                _device.get_device(device_id)
            if allocates and is_capturing(consumer):
                raise ValueError("the stream is in CUDA graph capture, and cudattn cannot allocate the output inside "
                                 "a graph it does not own: pass out= (and call without return_lse)")
            ptrs = [0 if a is None else a.ptr for a in ops]
            if plan.__class__ is RecordedCall and not force_full and plan.plain(ptrs):
                # a producer's wait makes the operands' device current (`order_and_hold`), as does a
                # hold that must make an event (`_lifetime.hold`); the launch and the event record take
                # the consumer stream's context
                held = order_and_hold(objs, ops, consumer, device_id) if self.unordered else None
                # a call that allocates has just learnt that its stream does not capture (else it raised)
                result = plan.replay.run(ops, ptrs, device_id, consumer, keep, False if allocates else None)
            else:
                _device.get_device(device_id)
                _device.nest()  # the public helpers it calls (copies, memsets) leave the context to this call
                try:
                    check_one_device(ops, names)
                    check_addresses(ops, names, tensors, out_index)
                    held = order_and_hold(objs, ops, consumer)

                    def full_path(*adapted):
                        return full(self, args, *adapted)

                    result = full_path(*ops)
                    if key is not None and plan is None:
                        if len(_plans) >= _PLANS_MAX:  # many distinct shapes (variable lengths): keep it bounded
                            _plans.clear()
                        try:
                            _plans[key] = RecordedCall(_replay.record(full_path, ops, consumer), ops, tensors,
                                                       out_index, more_outs, self.sig)
                        except _replay.NotReplayable:
                            _plans[key] = _FULL_ONLY
                finally:
                    _device.unnest()
            if out_index is not None and ops[out_index] is not None:
                ops[out_index].stream_handle = consumer  # consumers of `out` now order after this call
            for i in more_outs:
                if ops[i] is not None:
                    ops[i].stream_handle = consumer
            if held is not None:  # a call that allocated knows that its stream does not capture
                _lifetime.hold(consumer, held, device_id, False if allocates else None)
            if _lifetime.pending:  # earlier calls' holds whose work is done: after the launch, off its latency
                _lifetime.release_done()
            return result
        finally:  # the thread's context as the caller had it (`_runtime.device`)
            if _device.pending:
                _device.restore_caller_context()


def dispatch(op: str, objs, names, stream, flags: tuple, key, full, args, *, tensors: int, out_index: int | None,
             allocates: bool, more_outs: tuple = ()):
    """One call of a public entry whose signature needs nothing of the adapted operands: the compiled
    warm path (`warm`) when it serves the call, else ``Call(op, objs, names, stream).run(...)`` (see
    :meth:`Call.run` for the arguments)."""
    run = _warm.run
    if run is not None:
        result = run(op, objs, names, stream, flags, key, out_index, more_outs, allocates)
        if result is not _MISS:
            return result
    return Call(op, objs, names, stream).run(flags, key, full, args, tensors=tensors, out_index=out_index,
                                            allocates=allocates, more_outs=more_outs)


class RecordedCall:
    """A recorded call signature: its replay, and what the per-call checks need, fixed by the
    signature: which operands are non-empty tensors, and the byte spans of the outputs and inputs."""

    __slots__ = ("replay", "nonempty", "out_index", "out_span", "inputs", "more", "sig")

    def __init__(self, replay, ops, tensors: int, out_index: int | None, more_outs: tuple = (), sig: tuple = ()):
        self.replay = replay
        self.sig = sig  # the types and dtypes its key names by address or code, held while the plan lives
        spans = [None if a is None or 0 in a.shape else _span(a.shape, a.strides, a.dtype.itemsize)
                 for a in ops[:tensors]]
        self.nonempty = tuple(i for i, sp in enumerate(spans) if sp is not None)
        self.out_index = out_index
        self.out_span = None if out_index is None or spans[out_index] is None else spans[out_index]
        # (slot, span start, span end) of each non-empty input, checked against the output's span
        self.inputs = () if self.out_span is None else tuple(
            (i, *spans[i]) for i in range(out_index) if spans[i] is not None)
        # further outputs: (slot, span start, span end, the inputs' and earlier outputs' (slot, start, end))
        more = []
        if out_index is not None:
            earlier = [(j, *spans[j]) for j in range(out_index + 1) if spans[j] is not None]
            for i in more_outs:
                if spans[i] is not None:
                    more.append((i, *spans[i], tuple(earlier)))
                    earlier.append((i, *spans[i]))
        self.more = tuple(more)

    def plain(self, ptrs: list) -> bool:
        """True when the addresses need no closer look: non-null, 16-byte aligned, each output's byte
        range apart from every input's and from the other outputs'. False sends the call to `check_addresses` and the full path."""
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
        for k, c, d, others in self.more:
            o = ptrs[k]
            lo, hi = o + c, o + d
            for i, a, b in others:
                p = ptrs[i]
                if p + a < hi and lo < p + b:
                    return False
        return True


_warm.configure(sys.modules[__name__], RecordedCall)
