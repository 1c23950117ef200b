"""The warm call, compiled where the wheel carries it: a recorded call served by C (`_warm_c/`).

A warm call in Python spends a few microseconds in bytecode between the caller and
``cuLaunchKernel``: the operands read, the signature key built, the plan found, the addresses
checked, the recorded launch passed to the driver. `_warm.run` does the same steps in C for the
common case (operands that are DeviceArrays, plain CUDA torch tensors, CuPy arrays or JAX arrays
imported before; a recorded plan; addresses that pass the checks) and builds the same key, so the
plans the Python path records serve it. Whatever it does not take (a first call, a graph capture
that would allocate, an address the checks send to the full path) comes back as :data:`MISS`, and
`call.dispatch` runs the Python path, which gives every error its message. Before a MISS the
compiled path may have done what the Python path then does again, and nothing else: made the
operands' device current (stream handles 0-2), created cudattn's stream for a JAX call, asked JAX
arrays for capsules with the call's stream. Operands made on another stream than the call's are
waited for as `operands.order_and_hold` waits (its ``stream_wait``, once a producer, the operands'
device made current first) and held with the call's work (`_warm_c/lifetime.c`, as `lifetime.hold`
holds them). What needs Python's own rules is asked of the Python modules from C: the memory blocks of
a call's results (`_arrays.alloc.allocate`; the arrays around them are made in C, as
`_arrays.array.new_array` makes them), the stream's counters and workspace (`_arrays.stream_memory`;
`replay.Replay.native` lists what a call takes, with ``out=`` given too), each taken in C where an
earlier call left it kept (`_warm_c/memory.c`), argument blocks whose tensor maps need an address not seen before
(`replay._Step.build`; the others are built in C), and the holds and their release where C does not
make them on `lifetime`'s own state (`_warm_c/lifetime.c`: no event free to reuse, say). A JAX
array imported before is recalled in C by `known_jax.recall`'s rule, and a call whose first
operand is one runs on cudattn's stream of its device as `operands.consumer_stream` says, the
Python functions asked where C finds nothing.

The extension is optional: a wheel built without a compiler, or ``CUDATTN_NATIVE=0`` in the
environment, leaves :data:`run` None and every call on the Python path (same results, a few
microseconds more host time a call). The driver's entry points are asked of ``cuGetProcAddress``
at the first warm call (a recorded plan exists only once the driver is up); from then on
`_arrays.lifetime` records and queries its keep-alive events through them too.
"""

from __future__ import annotations

import os

from .._arrays import accessors as _accessors
from .._arrays import alloc as _alloc
from .._arrays import known_jax as _known_jax
from .._arrays import importer as _importer
from .._arrays import lifetime as _lifetime
from .._arrays import stream_memory as _stream_memory
from .._arrays.array import DeviceArray
from .._kernels import alibi_shift as _alibi_shift
from .._kernels import sm_margin as _sm_margin
from .._kernels import traits as _traits
from .._runtime import device as _device
from .._runtime import recording as _recording
from .._runtime import stream as _stream
from .._runtime.stream import as_stream
from . import operands as _operands
from . import replay as _replay

__all__ = ["MISS", "available", "run", "signature", "stamp_launches", "take_stamp"]

MISS = object()  # what `run` returns for a call it leaves to the Python path

try:
    from . import _warm as _native
except ImportError:  # built without a compiler: the Python path serves every call
    _native = None

# The operand part of a call signature's key as bytes (`_warm_c/signature.c`), or None without the
# extension. Used with the extension present even where its calls are turned off: one key form a process.
signature = None if _native is None else _native.signature


_ENTRY_POINTS = ((b"cuLaunchKernel", 4000), (b"cuStreamIsCapturing", 10000), (b"cuEventRecord", 2000),
                 (b"cuEventQuery", 2000), (b"cuThreadExchangeStreamCaptureMode", 10010))


def _bind():
    """The addresses of :data:`_ENTRY_POINTS` from the driver, or None without one."""
    from cuda.bindings import driver

    # stream 0 as cuda.bindings' driver functions (the Python path's) take it: the legacy default stream,
    # or the per-thread one where cuda-python is told so (the rule `_runtime.stream.LASTING_STREAMS` follows)
    flags = driver.CUdriverProcAddress_flags
    flag = flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if _per_thread_default_stream() \
        else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    found = []
    for name, version in _ENTRY_POINTS:
        err, pfn, status = driver.cuGetProcAddress(name, version, flag)
        if err != driver.CUresult.CUDA_SUCCESS or not pfn:
            return None
        found.append(int(pfn))
    return tuple(found)


def _bound(on: bool) -> None:
    """The extension has bound the driver's entry points (``on``): `lifetime`'s event calls go through
    them too; or it is about to drop them: back to cuda.bindings' wrappers."""
    if on:
        _lifetime.use_entry_points(_native.event_record, _native.event_query, _native.capture_mode)
    else:
        _lifetime.use_bindings()


def _per_thread_default_stream() -> bool:
    return os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")


def _cupy_stream(device_id: int):
    return _importer.current_stream_owner(_importer.CUPY, device_id)


def stamp_launches(on: bool) -> None:
    """Benchmarks: note the host time of the compiled path's first launch after each `take_stamp`
    (``time.perf_counter_ns``'s clock), and count its launches."""
    if _native is not None:
        _native.arm_stamp(on)


def take_stamp() -> tuple:
    """(perf_counter_ns of the compiled path's first launch since the last take, or None; its
    launches since `stamp_launches`)."""
    return _native.take_stamp() if _native is not None else (None, 0)


def available() -> bool:
    """Whether warm calls take the compiled path (the extension built, and not turned off)."""
    return run is not None


run = None


def configure(call_module, recorded_call: type) -> None:
    """Hand the extension the objects it reads (`call` does, once its classes exist), and publish
    :data:`run` unless the extension is absent or turned off."""
    global run
    if _native is None or os.environ.get("CUDATTN_NATIVE", "1") == "0":
        return
    _native.configure({
        "miss": MISS, "device_array": DeviceArray, "recorded_call": recorded_call, "call_module": call_module,
        "traits_module": _traits, "margin_local": _sm_margin.local, "shift_local": _alibi_shift.local,
        "recording_module": _recording, "lifetime_module": _lifetime, "device_module": _device,
        "accessors_module": _accessors, "importer_module": _importer, "as_stream": as_stream,
        "cupy_stream": _cupy_stream, "launch_failed": _replay.launch_failed, "bind": _bind, "bound_hook": _bound,
        "object_new": object.__new__, "replay_class": _replay.Replay, "step_class": _replay._Step,
        "known_jax_module": _known_jax, "operands_module": _operands, "jax_seen": _known_jax._seen,
        "default_stream_refs": _stream._default_stream_refs, "alloc_module": _alloc,
        "stream_memory_module": _stream_memory, "handle_attr_types": _stream.HANDLE_ATTR_TYPES,
        "stream_module": _stream, "note_torch_stream": _stream.note_torch_stream,
        "alloc_allocate": _alloc.allocate, "stream_memory_counters": _stream_memory.counters,
        "lifetime_hold": _lifetime.hold, "lifetime_release_done": _lifetime.release_done,
        "stream_memory_workspace": _stream_memory.workspace, "block_class": _alloc.Block,
    })
    run = _native.run
