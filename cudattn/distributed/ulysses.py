"""All-to-all (Ulysses) attention: swap sequence shards for head shards, attend, swap back.

Each rank holds a contiguous shard of the sequence with every head. One all-to-all (grouped NCCL
send/recv) gives each rank the whole sequence for ``H/world`` of the heads; a single
`cudattn.attention` call on it needs no ring and no merge, so every mask and modifier works as on
one GPU (windows, ALiBi with per-head slopes, sinks). A second all-to-all returns each rank's rows
for every head. The head counts (query and key/value) must be multiples of ``world``.
"""

from __future__ import annotations

import numpy as np

from .._arrays import lifetime as _lifetime
from .._arrays.array import DeviceArray, new_array
from .._ops.attention import attention
from .._ops.backward import attention_backward
from .._runtime.device import restores_caller_context
from .._runtime.stream import stream_wait
from . import copies
from .agree import begin, call_stream, check_shards, code as _code
from .watch import nccl_call, nccl_group


_FIELDS = ("shard length", "batch", "query heads", "key/value heads", "head dim", "dtype", "causal", "softcap",
           "scale", "sinks", "alibi", "window")


def _heads_array(x, heads: int, device: int) -> bool:
    """Sinks or slopes as the call takes them: float32 (heads,), C-contiguous, on ``device``."""
    return (isinstance(x, DeviceArray) and x.shape == (heads,) and x.dtype == np.float32 and x.is_c_contiguous
            and x.device_id == device)


def _fields(q, k, causal, softcap, scale, sinks, alibi_slopes, window_size) -> dict:
    """What the ranks must agree on (`agree`), by the names of ``_FIELDS``."""
    return {"shard length": q.shape[1], "batch": q.shape[0], "query heads": q.shape[2], "key/value heads": k.shape[2],
            "head dim": q.shape[3], "dtype": _code(q.dtype), "causal": bool(causal),
            "softcap": None if softcap is None else float(softcap), "scale": None if scale is None else float(scale),
            "sinks": sinks is not None, "alibi": alibi_slopes is not None, "window": _code(window_size)}


def _check(q, k, v, comm):
    dev = check_shards("ulysses_attention", comm, q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_c_contiguous:
            raise ValueError(f"ulysses_attention: {name} must be a C-contiguous (B, S/world, H, D) array; got strides "
                             f"{x.strides}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"ulysses_attention: q {q.shape}, k {k.shape}, v {v.shape} are not shards of one "
                         "self-attention (same batch, shard length and head dim; k and v alike)")
    world = int(comm.nranks)
    for name, h in (("query", q.shape[2]), ("key/value", k.shape[2])):
        if h % world:
            raise ValueError(f"ulysses_attention: {h} {name} heads do not split over {world} ranks (the all-to-all "
                             "gives each rank H/world heads); use ring_attention")
    return world, int(comm.rank), dev


def _all_to_all(nb, handle, send: DeviceArray, recv: DeviceArray, world: int, u8: int, stream: int) -> None:
    """Block j of ``send`` (leading axis) to rank j, block j of ``recv`` from rank j: one NCCL group."""
    n = send.nbytes // world
    with nccl_group(nb, handle, "ulysses_attention (all-to-all)"):
        for j in range(world):
            nb.send(send.ptr + j * n, n, u8, j, handle, stream)
            nb.recv(recv.ptr + j * n, n, u8, j, handle, stream)


@restores_caller_context
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
            if x is not None and not _heads_array(x, q.shape[2], dev):
                raise ValueError(f"ulysses_attention: {name} must be a C-contiguous float32 ({q.shape[2]},) "
                                 "DeviceArray on the communicator's GPU (every head's; each rank takes its own heads)")
        ref = call_stream(q, stream, dev)  # its object kept by the outputs
        fields.update(_fields(q, k, causal, softcap, scale, sinks, alibi_slopes, window_size))
    except (TypeError, ValueError) as e:
        error = e
    nb, handle, u8, st = begin(comm, fields, error, ref, "ulysses_attention")
    for x in (q, k, v):
        if x.stream_handle is not None and x.stream_handle != st:
            stream_wait(st, x.stream_handle)
    B, s, Hq, D = q.shape
    h = Hq // world
    x = _Exchange(nb, handle, u8, st, dev, world)
    qf, kf, vf = (x.to_heads(t) for t in (q, k, v))
    mine = slice(rank * h, (rank + 1) * h)
    o, lse = attention(qf, kf, vf, causal=causal, scale=scale, softcap=softcap, window_size=window_size,
                       sinks=None if sinks is None else sinks[mine],
                       alibi_slopes=None if alibi_slopes is None else alibi_slopes[mine], return_lse=True, stream=st)
    out = x.to_rows(o, Hq, ref.obj)
    lse_rows = x.lse_to_rows(lse, Hq, ref.obj) if return_lse else None
    _lifetime.hold(st, (q, k, v), dev)  # the caller's arrays live until the copies queued here have read them
    return (out, lse_rows) if return_lse else out


@restores_caller_context
def ulysses_attention_backward(dout, q, k, v, out, lse, comm, *, causal: bool = False, scale: float | None = None,
                               softcap: float | None = None, sinks=None, window_size=None, alibi_slopes=None,
                               stream=None):
    """Gradients of :func:`ulysses_attention` for this rank's rows: ``(dq, dk, dv)``, and with
    ``sinks`` also ``dsinks`` (float32 ``(Hq,)``, every head's, the same on every rank).

    ``out`` and ``lse`` are what ``ulysses_attention(..., return_lse=True)`` returned on this rank;
    the other arguments are as there. The same all-to-alls bring dout, q, k, v, out and the LSE to
    head shards, one `attention_backward` call runs on the whole sequence for this rank's heads (a
    key/value head's gradient gathers only its own query heads, all on one rank: no sum across
    ranks), and the gradients go back to row shards.
    """
    dev = int(comm.device.device_id)
    fields: dict = dict.fromkeys(("backward",) + _FIELDS)
    error, ref = None, None
    try:  # refused here, the call is still refused on every rank (agree): none waits for this one
        world, rank, dev = _check(q, k, v, comm)
        for name, x in (("dout", dout), ("out", out)):
            if not isinstance(x, DeviceArray) or x.shape != q.shape or x.dtype != q.dtype or not x.is_c_contiguous:
                raise ValueError(f"ulysses_attention_backward: {name} must be a C-contiguous {q.dtype} DeviceArray "
                                 f"of q's shape {q.shape}")
        want = (q.shape[0], q.shape[2], q.shape[1])
        if not isinstance(lse, DeviceArray) or lse.shape != want or lse.dtype != np.float32 or not lse.is_c_contiguous:
            raise ValueError(f"ulysses_attention_backward: lse must be a C-contiguous float32 {want} DeviceArray "
                             "(ulysses_attention's)")
        for name, x in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
            if x is not None and not _heads_array(x, q.shape[2], dev):
                raise ValueError(f"ulysses_attention_backward: {name} must be a C-contiguous float32 "
                                 f"({q.shape[2]},) DeviceArray on the communicator's GPU")
        ref = call_stream(q, stream, dev)
        fields.update(backward=1, **_fields(q, k, causal, softcap, scale, sinks, alibi_slopes, window_size))
    except (TypeError, ValueError) as e:
        error = e
    nb, handle, u8, st = begin(comm, fields, error, ref, "ulysses_attention_backward")
    for x in (dout, q, k, v, out, lse):
        if x.stream_handle is not None and x.stream_handle != st:
            stream_wait(st, x.stream_handle)
    Hq, Hkv = q.shape[2], k.shape[2]
    h = Hq // world
    x = _Exchange(nb, handle, u8, st, dev, world)
    dof, qf, kf, vf, of = (x.to_heads(t) for t in (dout, q, k, v, out))
    mine = slice(rank * h, (rank + 1) * h)
    grads = attention_backward(dof, qf, kf, vf, of, x.lse_to_heads(lse), causal=causal, scale=scale, softcap=softcap,
                               window_size=window_size, sinks=None if sinks is None else sinks[mine],
                               alibi_slopes=None if alibi_slopes is None else alibi_slopes[mine], stream=st)
    res = (x.to_rows(grads[0], Hq, ref.obj), x.to_rows(grads[1], Hkv, ref.obj), x.to_rows(grads[2], Hkv, ref.obj))
    _lifetime.hold(st, (dout, q, k, v, out, lse), dev)  # the caller's arrays live until the copies have read them
    if sinks is None:
        return res
    dsinks = new_array((Hq,), np.dtype(np.float32), dev, st, ref.obj)  # every rank's heads, in rank order
    with nccl_call(nb, handle, "ulysses_attention_backward"):
        nb.all_gather(grads[3].ptr, dsinks.ptr, grads[3].nbytes, u8, handle, st)
    return (*res, dsinks)


class _Exchange:
    """The all-to-alls of one call on stream ``stream``: (B, S/world, H, D) row shards to (B, S, H/world, D)
    head shards and back, and the LSE's (B, H, S/world) to (B, H/world, S) and back."""

    def __init__(self, nb, handle, u8: int, stream: int, dev: int, world: int):
        self.nb, self.handle, self.u8, self.st, self.dev, self.world = nb, handle, u8, stream, dev, world

    def _swap(self, plan_out, src, send_shape, dtype, plan_in, dst) -> None:
        send, recv = (new_array(send_shape, dtype, self.dev, self.st) for _ in range(2))
        copies.run_plan(plan_out, {"x": src.ptr, "send": send.ptr}, self.st)
        _all_to_all(self.nb, self.handle, send, recv, self.world, self.u8, self.st)
        copies.run_plan(plan_in, {"recv": recv.ptr, "y": dst.ptr}, self.st)

    def to_heads(self, t):
        B, s, H, D = t.shape
        W, e, h = self.world, t.dtype.itemsize, t.shape[2] // self.world
        whole = new_array((B, s * W, h, D), t.dtype, self.dev, self.st)
        self._swap(copies.heads_to_ranks(B, s, H, D, W, e, "x", "send"), t, (W, B, s, h, D), t.dtype,
                   copies.ranks_to_rows(B, s * W, h * D * e, W, "recv", "y"), whole)
        return whole

    def to_rows(self, t, heads: int, keep=None):
        B, S, h, D = t.shape
        W, e = self.world, t.dtype.itemsize
        rows = new_array((B, S // W, heads, D), t.dtype, self.dev, self.st, keep)
        self._swap(copies.rows_to_ranks(B, S, h * D * e, W, "x", "send"), t, (W, B, S // W, h, D), t.dtype,
                   copies.ranks_to_heads(B, S // W, heads, D, W, e, "recv", "y"), rows)
        return rows

    def lse_to_rows(self, lse, heads: int, keep=None):
        B, h, S = lse.shape
        W, s = self.world, S // self.world
        rows = new_array((B, heads, s), lse.dtype, self.dev, self.st, keep)
        self._swap(copies.rows_to_ranks(B * h, S, 4, W, "x", "send"), lse, (W, B, h, s), lse.dtype,
                   copies.ranks_to_heads(B, 1, heads, s, W, 4, "recv", "y"), rows)
        return rows

    def lse_to_heads(self, lse):
        B, H, s = lse.shape
        W, h = self.world, H // self.world
        whole = new_array((B, h, s * W), lse.dtype, self.dev, self.st)
        self._swap(copies.heads_to_ranks(B, 1, H, s, W, 4, "x", "send"), lse, (W, B, h, s), lse.dtype,
                   copies.ranks_to_rows(B * h, s * W, 4, W, "recv", "y"), whole)
        return whole
