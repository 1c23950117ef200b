"""The ``stream=`` argument adapted to one ``CUstream`` handle; the library's own streams; capture state.

Accepted (checked in this order, cheapest first, since this runs on every call):

- an ``int``: a raw ``CUstream`` handle. ``0`` is the legacy default stream; the
  special handles ``1`` (``CU_STREAM_LEGACY``) and ``2`` (``CU_STREAM_PER_THREAD``)
  are accepted as the driver accepts them;
- ``None``: the library's own non-blocking stream for the device
  (:func:`default_stream`);
- a :class:`StreamRef` (already adapted: passed through);
- a ``cuda.core.Stream``;
- any object with ``__cuda_stream__()`` returning ``(0, handle)`` (the protocol
  cuda.core defines; CuPy, Numba and recent PyTorch streams implement it);
- any object with an ``int`` attribute ``cuda_stream`` (``torch.cuda.Stream`` and
  ``torch.cuda.ExternalStream``, whatever the PyTorch version).

Anything else raises ``TypeError`` naming ``stream``. No CUDA call is made here
except for ``None`` on first use (creating the library stream). The stream's
device is not checked (that would cost a driver call per launch): passing a
stream of another device than the arrays' is the caller's error, as in CUDA.

Lifetime: the :class:`StreamRef` keeps the object it came from alive. Memory
allocated on a stream is freed on that stream later (stream-ordered), so a raw
``int`` handle must outlive the arrays allocated on it; for stream *objects*
cudattn holds a reference so this is automatic.
"""

from __future__ import annotations

import numbers
import operator
import os
import sys

from cuda.bindings import driver

import threading

from .device import _device_id, get_device
from . import recording as _recording
from .errors import check

__all__ = ["StreamRef", "as_stream", "default_stream", "is_capturing", "stream_wait"]

CU_STREAM_LEGACY = 1
CU_STREAM_PER_THREAD = 2

_CoreStream = None  # cuda.core.Stream, bound on first use so that importing stays light


def _core_stream_type():
    global _CoreStream
    if _CoreStream is None:
        from cuda.core import Stream

        _CoreStream = Stream
    return _CoreStream


class StreamRef:
    """A stream handle (``.handle``, an int ``CUstream``) and the object it came from (``.obj``)."""

    __slots__ = ("handle", "obj")

    def __init__(self, handle: int, obj: object = None):
        self.handle = handle
        self.obj = obj

    def __repr__(self) -> str:
        return f"StreamRef(handle={self.handle:#x}, obj={type(self.obj).__name__})"


# Types whose ``cuda_stream`` attribute is the handle this module finds (torch's streams, whose
# ``__cuda_stream__`` gives the same), noted as they are first adapted: the compiled warm call reads
# that attribute itself instead of calling `as_stream`.
HANDLE_ATTR_TYPES: set[type] = set()
_HANDLE_ATTR_MODULES = ("torch.cuda.streams", "torch.cuda")


_streams_lock = threading.Lock()
_default_streams: dict[int, object] = {}  # device id -> cuda.core Stream
_default_stream_refs: dict[int, StreamRef] = {}  # device id -> StreamRef of that stream

# Stream handles that stay the same stream for the life of the process: the legacy default stream
# (1, and 0 unless cuda-python maps 0 to the per-thread stream) and cudattn's own streams. A handle
# of any other stream may be destroyed and handed to a new stream (`_arrays.alloc` keeps blocks
# for reuse on lasting streams only).
# The streams torch makes itself join them as torch hands them over (`note_torch_stream`).
LASTING_STREAMS: set[int] = {1} if os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0") \
    else {0, 1}
# Handles of streams torch wraps but did not make (``torch.cuda.ExternalStream``): their owner may
# destroy them, whatever holds the torch object (`note_torch_stream` fills it; `_arrays.stream_memory`
# keys their blocks by the stream's id as for a bare handle).
TORCH_EXTERNAL: set[int] = set()


def note_torch_stream(stream, handle: int, device_id: int | None = None) -> None:
    """Note ``handle`` as lasting where it is a stream torch made, or as external where torch only
    wraps it. torch creates its pooled streams once and never destroys them, so their handles name
    the same stream for the life of the process. ``stream``: the torch stream object whose
    ``cuda_stream`` is ``handle``, or None for torch's current stream on ``device_id`` (asked of
    torch, once a handle). torch's note on stream ids (c10/cuda/CUDAStream.cpp, "StreamId
    assignment") tells them apart: a stream torch made has an odd id, an external stream its handle
    (even), the default stream 0; torch keeps the right to renumber, so anything else is left
    alone (neither noted)."""
    if handle in LASTING_STREAMS or handle <= 2:
        return
    if stream is None:
        if handle in TORCH_EXTERNAL:
            return
        torch = sys.modules.get("torch")
        try:
            stream = torch.cuda.current_stream(device_id)
        except Exception:  # no torch, or it cannot say: not noted, asked again next time
            return
    sid = getattr(stream, "stream_id", None)
    if type(sid) is not int or getattr(stream, "cuda_stream", None) != handle:
        return
    if sid & 1 and sid != handle:
        LASTING_STREAMS.add(handle)
        TORCH_EXTERNAL.discard(handle)
    elif sid == handle:
        if len(TORCH_EXTERNAL) >= 4096:  # bounded: a handle left out is noted again at its next call
            TORCH_EXTERNAL.clear()
        TORCH_EXTERNAL.add(handle)


def default_stream(device=None):
    """The library's own non-blocking ``cuda.core.Stream`` for ``device`` (created on first use).

    Non-blocking, so it never serialises against the legacy default stream that
    other code may be using. Kept for the life of the process.
    """
    dev_id = _device_id(device)
    s = _default_streams.get(dev_id)
    if s is None:
        s = _create_default_stream(dev_id)
    return s


def _default_stream_ref(device_id: int):
    """The :class:`StreamRef` of the library stream (hot path: one dict lookup)."""
    ref = _default_stream_refs.get(device_id)
    if ref is None:
        _create_default_stream(device_id)
        ref = _default_stream_refs[device_id]
    return ref


def _create_default_stream(dev_id: int):
    from cuda.core import StreamOptions

    with _streams_lock:
        s = _default_streams.get(dev_id)
        if s is None:
            dev = get_device(dev_id)
            s = dev.create_stream(options=StreamOptions(nonblocking=True))
            _default_stream_refs[dev_id] = StreamRef(int(s.handle), s)
            _default_streams[dev_id] = s
            LASTING_STREAMS.add(int(s.handle))
    return s


_NOT_CAPTURING = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def is_capturing(stream: int) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (one driver query)."""
    return check(driver.cuStreamIsCapturing(stream), "cuStreamIsCapturing") != _NOT_CAPTURING


def _type_error(stream) -> TypeError:
    return TypeError(
        "stream must be None, an int CUstream handle, a cuda.core Stream, or an object with "
        f"__cuda_stream__() or an int .cuda_stream attribute (a torch.cuda.Stream); got {type(stream).__name__}"
    )


def as_stream(stream, device) -> StreamRef:
    """Adapt ``stream`` (see the module docstring) to a :class:`StreamRef`.

    ``device`` (ordinal int or cuda.core Device) is only used for ``stream=None``.
    """
    t = type(stream)
    if t is int:
        if not 0 <= stream < 1 << 64:  # a CUstream is a 64-bit handle
            raise ValueError(f"stream handle must be from 0 to 2**64 - 1, got {stream}")
        return StreamRef(stream, None)
    if stream is None:
        return _default_stream_ref(device if type(device) is int else _device_id(device))
    if t is StreamRef:
        return stream
    if t is bool:
        raise _type_error(stream)
    Stream = _CoreStream or _core_stream_type()
    if isinstance(stream, Stream):
        return StreamRef(int(stream.handle), stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        info = proto() if callable(proto) else proto  # a few early adopters made it a property
        try:
            version, handle = info
        except (TypeError, ValueError):
            raise TypeError(
                f"stream: {type(stream).__name__}.__cuda_stream__() must return (version, handle), got {info!r}"
            ) from None
        if version != 0:
            raise TypeError(f"stream: unsupported __cuda_stream__ protocol version {version!r} (expected 0)")
        return _object_ref(_handle_int(handle, stream), stream, t)
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None and not isinstance(handle, bool) and isinstance(handle, int):
        return _object_ref(_handle_int(handle, stream), stream, t)
    # NumPy integers and other int-likes, last so that the common cases stay fast.
    if isinstance(stream, numbers.Integral):
        return as_stream(operator.index(stream), device)
    raise _type_error(stream)


def _object_ref(handle: int, stream, t: type) -> StreamRef:
    if t.__module__ in _HANDLE_ATTR_MODULES:
        if t not in HANDLE_ATTR_TYPES and type(getattr(stream, "cuda_stream", None)) is int and \
                stream.cuda_stream == handle:
            HANDLE_ATTR_TYPES.add(t)
        note_torch_stream(stream, handle)
    return StreamRef(handle, stream)


def _handle_int(handle, stream) -> int:
    try:
        h = operator.index(handle)
    except TypeError:
        raise TypeError(f"stream: {type(stream).__name__} gave a non-integer stream handle {handle!r}") from None
    if not 0 <= h < 1 << 64:
        raise ValueError(f"stream: {type(stream).__name__} gave the stream handle {h}, not a 64-bit handle")
    return h


# Reusable events, per context (an event recorded on another device's stream is an invalid handle):
# re-recording one is safe once its waits are queued.
_free_events: dict[int, list] = {}


def stream_wait(consumer: int, producer: int) -> None:
    """Make stream ``consumer`` wait for the work queued so far on stream ``producer``.

    An event recorded on ``producer`` and waited on by ``consumer``; nothing is
    blocked on the host. A no-op when they are the same stream, and while ``consumer``
    captures a CUDA graph that ``producer`` is not part of (a graph cannot depend on work
    outside it: the driver would invalidate the capture; that work was queued before).
    The producer's device must be current (see :func:`cudattn._runtime.device.get_device`).
    """
    if consumer == producer:
        return
    _recording.refuse("stream_wait")
    if is_capturing(consumer) and not is_capturing(producer):
        return
    free = _free_events.setdefault(int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")), [])
    try:
        ev = free.pop()
    except IndexError:
        ev = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        check(driver.cuEventRecord(ev, producer), "cuEventRecord(producer stream)")
        check(driver.cuStreamWaitEvent(consumer, ev, 0), "cuStreamWaitEvent(consumer stream)")
    finally:
        free.append(ev)
