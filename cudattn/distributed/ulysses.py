"""All-to-all (Ulysses) attention: swap sequence shards for head shards, attend, swap back.

Each rank holds a contiguous shard of the sequence with every head. One all-to-all (grouped NCCL
send/recv) gives each rank the whole sequence for ``H/world`` of the heads; a single
`cudattn.attention` call on it needs no ring and no merge, so every mask and modifier works as on
one GPU (windows, ALiBi with per-head slopes, sinks). A second all-to-all returns each rank's rows
for every head. The head counts (query and key/value) must be multiples of ``world``.
"""

from __future__ import annotations

import numpy as np

from .._arrays.array import DeviceArray, new_array
from .._ops.attention import attention
from .._runtime.stream import as_stream, stream_wait
from . import copies
from .agree import begin, code as _code


_FIELDS = ("shard length", "batch", "query heads", "key/value heads", "head dim", "dtype", "causal", "softcap",
           "scale", "sinks", "alibi", "window")


def _check(q, k, v, comm):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, DeviceArray):
            raise TypeError(f"ulysses_attention: {name} must be a cudattn DeviceArray on the communicator's GPU, "
                            f"not {type(x).__name__}")
        if x.ndim != 4 or not x.is_c_contiguous:
            raise ValueError(f"ulysses_attention: {name} must be a C-contiguous (B, S/world, H, D) array; got shape "
                             f"{x.shape}")
    if q.dtype != k.dtype or k.dtype != v.dtype or q.dtype.itemsize != 2:
        raise TypeError(f"ulysses_attention: q, k, v must share one 16-bit dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"ulysses_attention: q {q.shape}, k {k.shape}, v {v.shape} are not shards of one "
                         "self-attention (same batch, shard length and head dim; k and v alike)")
    world, dev = int(comm.nranks), int(comm.device.device_id)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device_id != dev:
            raise ValueError(f"ulysses_attention: {name} is on cuda:{x.device_id}, the communicator on cuda:{dev}")
    for name, h in (("query", q.shape[2]), ("key/value", k.shape[2])):
        if h % world:
            raise ValueError(f"ulysses_attention: {h} {name} heads do not split over {world} ranks (the all-to-all "
                             "gives each rank H/world heads); use ring_attention")
    return world, int(comm.rank), dev


def _all_to_all(nb, handle, send: DeviceArray, recv: DeviceArray, world: int, u8: int, stream: int) -> None:
    """Block j of ``send`` (leading axis) to rank j, block j of ``recv`` from rank j: one NCCL group."""
    n = send.nbytes // world
    nb.group_start()
    for j in range(world):
        nb.send(send.ptr + j * n, n, u8, j, handle, stream)
        nb.recv(recv.ptr + j * n, n, u8, j, handle, stream)
    nb.group_end()


def ulysses_attention(q, k, v, comm, *, causal: bool = False, scale: float | None = None, softcap: float | None = None,
                      sinks=None, window_size=None, alibi_slopes=None, return_lse: bool = False, stream=None):
    """Attention of this rank's rows over the whole sequence by two all-to-alls (``"bshd"`` shards).

    ``q`` ``(B, S/world, Hq, D)``, ``k``/``v`` ``(B, S/world, Hkv, D)``: contiguous shards of the
    sequence (rank r holds rows ``r·S/world ..``; ``shard_sequence(..., zigzag=False)``), C-contiguous
    device arrays on the communicator's GPU, Hq and Hkv multiples of the ranks. ``sinks`` and
    ``alibi_slopes``: float32 ``(Hq,)`` device arrays, every head's (each rank takes its own).
    Returns this rank's output rows ``(B, S/world, Hq, D)`` (and LSE ``(B, Hq, S/world)`` with
    ``return_lse``) on the caller's stream; nothing blocks the host.
    """
    dev = int(comm.device.device_id)
    fields: dict = dict.fromkeys(_FIELDS)
    error, ref = None, None
    try:  # refused here, the call is still refused on every rank (agree): none waits for this one
        world, rank, dev = _check(q, k, v, comm)
        for name, x in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
            if x is not None and (not isinstance(x, DeviceArray) or x.shape != (q.shape[2],)):
                raise ValueError(f"ulysses_attention: {name} must be a float32 ({q.shape[2]},) DeviceArray (every "
                                 "head's; each rank takes its own heads)")
        ref = as_stream(q.stream_handle if stream is None else stream, dev)  # its object kept by the outputs
        fields.update({"shard length": q.shape[1], "batch": q.shape[0], "query heads": q.shape[2],
                       "key/value heads": k.shape[2], "head dim": q.shape[3], "dtype": _code(q.dtype),
                       "causal": bool(causal), "softcap": None if softcap is None else float(softcap),
                       "scale": None if scale is None else float(scale), "sinks": sinks is not None,
                       "alibi": alibi_slopes is not None, "window": _code(window_size)})
    except (TypeError, ValueError) as e:
        error = e
    nb, handle, u8, st = begin(comm, fields, error, ref, "ulysses_attention")
    for x in (q, k, v):
        if x.stream_handle is not None and x.stream_handle != st:
            stream_wait(st, x.stream_handle)
    B, s, Hq, D = q.shape
    Hkv, S, e = k.shape[2], s * world, q.dtype.itemsize
    h = Hq // world

    full = {}
    for name, x, heads in (("q", q, Hq), ("k", k, Hkv), ("v", v, Hkv)):
        send = new_array((world, B, s, heads // world, D), q.dtype, dev, st)
        recv = new_array((world, B, s, heads // world, D), q.dtype, dev, st)
        whole = new_array((B, S, heads // world, D), q.dtype, dev, st)
        copies.run_plan(copies.heads_to_ranks(B, s, heads, D, world, e, "x", "send"), {"x": x.ptr, "send": send.ptr},
                        st)
        _all_to_all(nb, handle, send, recv, world, u8, st)
        copies.run_plan(copies.ranks_to_rows(B, S, heads // world * D * e, world, "recv", "whole"),
                        {"recv": recv.ptr, "whole": whole.ptr}, st)
        whole.stream_handle = st
        full[name] = whole
    mine = slice(rank * h, (rank + 1) * h)
    o, lse = attention(full["q"], full["k"], full["v"], causal=causal, scale=scale, softcap=softcap,
                       window_size=window_size, sinks=None if sinks is None else sinks[mine],
                       alibi_slopes=None if alibi_slopes is None else alibi_slopes[mine], return_lse=True, stream=st)
    send = new_array((world, B, s, h, D), q.dtype, dev, st)
    recv = new_array((world, B, s, h, D), q.dtype, dev, st)
    out = new_array(q.shape, q.dtype, dev, st, ref.obj)
    copies.run_plan(copies.rows_to_ranks(B, S, h * D * e, world, "o", "send"), {"o": o.ptr, "send": send.ptr}, st)
    _all_to_all(nb, handle, send, recv, world, u8, st)
    copies.run_plan(copies.ranks_to_heads(B, s, Hq, D, world, e, "recv", "out"), {"recv": recv.ptr, "out": out.ptr}, st)
    if not return_lse:
        return out
    f32 = np.dtype(np.float32)
    lsend, lrecv = (new_array((world, B, h, s), f32, dev, st) for _ in range(2))
    lse_out = new_array((B, Hq, s), f32, dev, st, ref.obj)
    copies.run_plan(copies.rows_to_ranks(B * h, S, 4, world, "l", "send"), {"l": lse.ptr, "send": lsend.ptr}, st)
    _all_to_all(nb, handle, lsend, lrecv, world, u8, st)
    copies.run_plan(copies.ranks_to_heads(B, 1, Hq, s, world, 4, "recv", "lse"),
                    {"recv": lrecv.ptr, "lse": lse_out.ptr}, st)
    return out, lse_out
