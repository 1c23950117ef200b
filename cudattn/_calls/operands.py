"""A call's operands: the stream it runs on, its operands adapted for reading there, what they add to
its signature, and the producers it must be ordered after and keep alive.

1. **Stream** (:func:`consumer_stream`): ``stream=None`` is the current stream of the operands'
   package (torch's or CuPy's current stream, the stream that produced a cudattn DeviceArray,
   else cudattn's own stream); an explicit stream is taken as given.
2. **Operands** (`call.Call`, `_arrays.importer.adapt`): device arrays of any runtime as
   DeviceArrays, each knowing its producer stream, and the call's signature from them (types,
   shapes, strides, dtypes, devices). The call is ordered after every producer that is not the
   call's stream, and those operands are kept alive until the call's work is done
   (:func:`order_and_hold`: `_runtime.stream.stream_wait`, `_arrays.lifetime`); when every operand
   was made on the call's stream there is nothing to do.
3. **Addresses** (:func:`check_addresses`): what the per-call checks refuse by name.
"""

from __future__ import annotations

import numpy as np

from .._arrays import known_jax
from .._arrays.array import DeviceArray
from .._arrays.importer import device_id_of, is_device_array_like
from .._arrays.importer import CUDATTN, JAX, TORCH, adapt, current_stream_owner, kind_of
from .._runtime import device as _device
from .._runtime import stream as _stream
from .._runtime.stream import stream_wait
from .._spec.geometry import share_bytes

__all__ = ["array_key", "array_or_none", "check_addresses", "check_device_arg", "check_not_mixed", "check_one_device",
           "consumer_stream", "order_and_hold", "tag"]


def tag(x):
    """``x`` for a call signature: bools and None as themselves, anything else with its type, so that
    ``True``, ``1`` and ``1.0`` (equal and of equal hash) make different signatures."""
    return x if x is None or x is True or x is False else (type(x), x)


def array_or_none(x):
    """A descale that is an array (an operand of the call), else None (a scalar or None: in the key)."""
    return None if x is None or isinstance(x, (int, float, np.number, np.ndarray)) else x


def array_key(given, adapted):
    """An optional array argument in a call signature: the adapted operand's layout and device, else
    the caller's value tagged (a scalar or None; a NumPy array is unhashable: the full path says why)."""
    if adapted is None:
        return tag(given)
    return (adapted.shape, adapted.strides, adapted.dtype, adapted.device_id)


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
    if kind < JAX:  # torch, CuPy: their current stream
        a = adapt(first, "q", -1)
        h = a.stream_handle
        if h is not None:
            if kind == TORCH and h not in _stream.LASTING_STREAMS:  # one torch made lasts (`note_torch_stream`)
                _stream.note_torch_stream(None, h, a.device_id)
            return h, current_stream_owner(kind, a.device_id), a
    dev = known_jax.device_of(first) if kind == JAX else None
    ref = _stream.as_stream(None, device_id_of(first, name="q") if dev is None else dev)
    return ref.handle, ref.obj, None


def order_and_hold(objs, ops, consumer: int, device_id: int | None = None):
    """Order ``consumer`` after each operand's producer; return what must stay alive (None: nothing).
    ``device_id``: the operands' device, made current before the first wait (None: current already)."""
    held = None
    waited = ()
    for x, a in zip(objs, ops):
        if a is None:
            continue
        p = a.stream_handle
        foreign = p is not None and p != consumer
        if foreign and p not in waited:
            if device_id is not None:  # an event is recorded on the producer: its device current
                _device.get_device(device_id)
                device_id = None
            stream_wait(consumer, p)
            waited += (p,)
        if foreign or kind_of(x) >= JAX:
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
                    o_name = names[out_index]
                    raise ValueError(f"{o_name} overlaps {n} (they share device memory); the kernel would "
                                     f"overwrite an input it still reads: pass a separate {o_name}")


def check_device_arg(device, device_id: int) -> None:
    """``device=`` of a device call: None, or the operands' device ``device_id`` (ValueError naming
    both; it chooses the GPU of NumPy calls only: device arrays run where they live)."""
    if device is None:
        return
    try:
        ordinal = _device._as_ordinal(device)
        if ordinal != device_id:
            raise ValueError(f"device={ordinal} but the operands are on device {device_id}: device= "
                             "chooses the GPU of NumPy calls; device arrays are computed on their own device")
    except (TypeError, ValueError):
        if _device.pending:  # adapting the operands may have switched the context: the caller's back
            _device.restore_caller_context()
        raise


def check_one_device(ops, names) -> None:
    """ValueError naming the first operand that is not on the first operand's device. An operand at
    address 0 (an empty array may carry NULL) has no device of its own to compare: its device id
    was taken from the current device."""
    device_id = ops[0].device_id
    for a, n in zip(ops[1:], names[1:]):
        if a is not None and a.ptr and a.device_id != device_id:
            raise ValueError(f"{n} is on device {a.device_id} but {names[0]} is on device {device_id}; "
                             "all operands must be on one device")


_ARRAY_KINDS = "a DeviceArray, or an object with __cuda_array_interface__ or __dlpack__ on a CUDA device"


def _got(x) -> str:
    return "None" if x is None else type(x).__name__


def _listed(names) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def check_not_mixed(named, prefix: str = "", subject: str | None = None) -> None:
    """TypeError for the array arguments ``named`` (``(name, value)`` pairs) of one call that are not
    all NumPy arrays or all device arrays: first naming each one that is no array, with its type,
    then which are NumPy and which are device arrays (``subject``: what must match, default the
    names; ``prefix`` starts the message). Returns when they are all device arrays."""
    named = tuple(named)
    host, device, other = [], [], []
    for name, x in named:
        (host if isinstance(x, np.ndarray) else device if is_device_array_like(x) else other).append((name, x))
    if other:
        names = [n for n, _ in other]
        what = "a NumPy array or a device array" if len(other) == 1 else "NumPy arrays or device arrays"
        got = _got(other[0][1]) if len(other) == 1 else ", ".join(f"{n}: {_got(x)}" for n, x in other)
        raise TypeError(f"{prefix}{_listed(names)} must be {what} ({_ARRAY_KINDS}); got {got}")
    if host and device:
        hn, dn = [n for n, _ in host], [n for n, _ in device]
        subject = subject or ", ".join(n for n, _ in named)
        raise TypeError(f"{prefix}{subject} must be all NumPy arrays or all device arrays; "
                        f"{_listed(hn)} {'is a NumPy array' if len(hn) == 1 else 'are NumPy arrays'} and "
                        f"{_listed(dn)} {'is a device array' if len(dn) == 1 else 'are device arrays'} "
                        "(copy with cudattn.to_device or cudattn.to_host first)")
