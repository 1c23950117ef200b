"""JAX arrays imported before, recognised again without parsing a DLPack capsule.

A JAX array never changes its shape, dtype, device or buffer, so what its first import found
(through cuda.core's view of its DLPack capsule: about 8 us on an H200 host, with the asks of its
device) holds for every later call. What is remembered here is that import's facts (address,
shape, strides, dtype, device), keyed by the array's identity and held through a weak reference
(nothing here keeps an array alive). A later call still asks the array for a capsule with the
call's stream (`export`, about 2.3 us an operand): JAX then orders its pending writes
before that stream on the GPU, and the capsule, held with the call's operands (`lifetime`) until
a later cudattn call finds their work done, is the external reference that keeps JAX from
freeing or donating the buffer meanwhile (so until then a donation may copy or be refused).
A deleted or donated array refuses the capsule, and the call raises, naming the operand.

The capsule is asked of the function JAX's ``__dlpack__`` ends in, with the object that method
hands it (the array's one shard, `_export`): the same capsule, the same ordering, without the
Python checks around it, which cost nearly as much as the export itself (2.5 of 5.9 us an operand on
an H200 host). Where JAX has no such function, or it refuses, ``__dlpack__`` is asked as before.
"""

from __future__ import annotations

import weakref

from .array import DeviceArray

__all__ = ["device_of", "export", "recall", "remember"]

_MAX = 4096  # entries leave with their arrays; past this many live ones, forget all (cheaper than an LRU)
_seen: dict = {}  # id(array) -> (weak reference, (ptr, shape, strides, dtype, device, readonly))
# (export, array type): JAX's ``buffer_to_dlpack_managed_tensor`` (what ``jax.Array.__dlpack__`` calls
# with the array's shard, ``_fully_replicated_shard()``) and the array type it serves; None until a
# JAX array is remembered, False where this JAX has no such function. The compiled warm path reads it.
_export = None


def _find_export(obj):
    """(export, type(obj)) where ``obj``'s JAX exports through ``buffer_to_dlpack_managed_tensor`` of the
    array's one shard, as its ``__dlpack__`` does (``jax._src.dlpack`` reaches it as ``_jax`` from JAX
    0.8, as ``xla_client._xla`` before); else False."""
    import sys

    mod = sys.modules.get("jax._src.dlpack")
    lib = getattr(mod, "_jax", None) or getattr(getattr(mod, "xla_client", None), "_xla", None)
    fn = getattr(lib, "buffer_to_dlpack_managed_tensor", None)
    t = type(obj)
    if not callable(fn) or not callable(getattr(t, "_fully_replicated_shard", None)):
        return False
    return fn, t


def export(obj, sync: int):
    """A DLPack capsule of JAX array ``obj`` (one device) for stream ``sync``, which waits for the
    array's pending writes: through `_export` where it serves, else ``__dlpack__``."""
    e = _export
    if e and type(obj) is e[1]:
        try:
            return e[0](obj._fully_replicated_shard(), stream=sync)
        except Exception:  # deleted, donated, or a JAX that changed: its own method says what is wrong
            pass
    return obj.__dlpack__(stream=sync)


def remember(obj, a: DeviceArray) -> None:
    """Keep what importing ``obj`` found (``a``); arrays without weak references are not kept."""
    key = id(obj)

    def forget(ref, key=key, seen=_seen):  # `seen` bound here: the compiled warm path holds the dict, whose
        if seen.get(key, (None,))[0] is ref:  # references may outlive this module's globals at exit
            seen.pop(key, None)

    try:
        ref = weakref.ref(obj, forget)
    except TypeError:
        return
    global _export
    if _export is None:
        _export = _find_export(obj)
    if len(_seen) >= _MAX:
        _seen.clear()
    _seen[key] = (ref, (a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly))


def recall(obj, consumer: int, sync: int, name: str) -> DeviceArray | None:
    """``obj`` as a DeviceArray read on ``consumer`` from an earlier import, its owner holding the
    array and a fresh capsule exported for ``sync`` (``consumer`` as DLPack names it); None when
    there is no earlier import. An array that refuses the capsule raises a ValueError naming
    ``name`` (deleted or donated, or JAX's reason), JAX's exception chained."""
    e = _seen.get(id(obj))
    if e is None or e[0]() is not obj:
        return None
    try:
        capsule = export(obj, sync)
    except Exception as exc:
        if _deleted(obj):
            raise ValueError(f"{name}: the JAX array has been deleted or donated ({exc}); it cannot be read") from exc
        raise ValueError(f"{name}: the JAX array refused its DLPack export for stream {sync:#x}: {exc}") from exc
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly = e[1]
    a.owner, a.stream_handle = (obj, capsule), consumer
    return a


def _deleted(obj) -> bool:
    try:
        return bool(obj.is_deleted())
    except Exception:  # not a jax.Array after all: say what the export said
        return False


def device_of(obj) -> int | None:
    """The device of a live array imported before (None: not known)."""
    e = _seen.get(id(obj))
    if e is None or e[0]() is not obj:
        return None
    return e[1][4]
