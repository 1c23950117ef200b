"""Ring attention: each rank attends its query shard to every rank's K/V as they pass around
the ring by NCCL, and merges the partial results by their LSEs on the device.

Per step ``s`` a rank holds the K/V of rank ``(rank - s) % world``. On a communication stream of
its own it sends that K/V on to ``rank + 1`` and receives the next from ``rank - 1`` (one NCCL
group, into the other of two buffers) while the step's attention calls run on the caller's
stream; the caller's stream waits for the receive before the next step, and the communication
stream for the calls that read a buffer before overwriting it. Nothing blocks the host. With
``transport="copy"`` the copy engine writes the K/V into the next rank's buffers instead, ordered
by flags in the ranks' memory (`peer_copy`): no SM and no NCCL in the steps.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import numpy as np
from cuda.core import StreamOptions

from .._arrays import lifetime as _lifetime
from .._arrays.array import new_array
from .._kernels import alibi_shift as _alibi_shift
from .._kernels import sm_margin as _sm_margin
from .._ops.attention import attention
from .._ops.merge import merge_attention_states
from .._runtime.device import get_device, restores_caller_context
from .._runtime.stream import stream_wait
from .._spec.modifiers import parse_modifiers
from .agree import begin, call_stream, check_shards, check_slopes, code as _code
from . import peer_copy as _peer_copy
from .copies import place
from .schedule import band, chunks_of, last_step, ring_steps
from .watch import nccl_group

# communicator -> the ring's NCCL stream (cuda.core Stream) on its device: one a communicator, so that
# rings on two communicators never share a stream (their ranks could queue them in different orders);
# dropped with the communicator object (a new one may reuse a freed one's address)
_comm_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FIELDS = ("shard length", "batch", "query heads", "key/value heads", "head dim", "dtype", "causal", "zigzag",
           "layout", "window", "softcap", "scale", "sinks", "alibi", "exchange", "transport")


def _comm_stream(device_id: int, comm) -> int:
    s = _comm_streams.get(comm)
    if s is None:
        s = _comm_streams[comm] = get_device(device_id).create_stream(options=StreamOptions(nonblocking=True))
    return int(s.handle)


def _check(q, k, v, comm, layout: str, zigzag: bool):
    """The rules a rank can check alone, before any GPU work; returns (world, rank, chunk length)."""
    check_shards("ring_attention", comm, q, k, v)
    if not (k.is_c_contiguous and v.is_c_contiguous):
        raise ValueError("ring_attention: k and v must be C-contiguous (they travel whole by NCCL)")
    if k.shape != v.shape:
        raise ValueError(f"ring_attention: k and v must share one shape; got {k.shape} and {v.shape}")
    sax = 1 if layout == "bshd" else 2
    if q.shape[sax] != k.shape[sax]:
        raise ValueError(f"ring_attention: q and k must hold shards of one length (self-attention); got "
                         f"{q.shape[sax]} and {k.shape[sax]}")
    world, rank = int(comm.nranks), int(comm.rank)
    per = 2 if zigzag else 1
    if q.shape[sax] % per:
        raise ValueError(f"ring_attention: a zigzag shard holds two chunks, so its length must be even; got "
                         f"{q.shape[sax]}")
    return world, rank, q.shape[sax] // per


@restores_caller_context
def ring_attention(q, k, v, comm, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
                   zigzag: bool | None = None, softcap: float | None = None, sinks=None, window_size=None,
                   alibi_slopes=None, return_lse: bool = False, stream=None, sm_margin: int = 0,
                   transport: str = "nccl"):
    """Attention of this rank's query shard over the whole sequence, K/V shards passing round the ring.

    Every rank calls it at once with its own shards (``q`` ``(B, S/world, Hq, D)``, ``k``/``v``
    ``(B, S/world, Hkv, D)`` in ``"bshd"``; device arrays on the communicator's GPU) and a
    ``nccl.core.Communicator`` of all ranks. ``zigzag`` (default: ``causal``) says how the
    sequence was cut (:func:`cudattn.distributed.shard_sequence`): zigzag for causal attention,
    so that every rank does the same work. GQA, ``B > 1``, ``softcap`` and ``sinks`` (counted
    once), ``window_size`` (pairs of chunks a window leaves empty are skipped) and
    ``alibi_slopes`` (float32 ``(Hq,)`` or ``(B, Hq)`` DeviceArrays, the same on every rank;
    distances are the whole sequence's) work as in :func:`cudattn.attention`. Returns this rank's output
    shard (and its LSE ``(B, Hq, S/world)`` with ``return_lse``) on the caller's stream
    (``stream``, or q's); nothing blocks the host.

    ``sm_margin``: SMs the Hopper kernel's persistent grid leaves free during the ring's calls, for
    NCCL's transfers to run beside them (with none free, the call beside a transfer waits for
    NCCL's CTAs); NCCL's kernel needs as many SMs as it launches CTAs (``NCCL_MAX_CTAS`` or
    ``max_ctas`` in the communicator's config bound them). Measured on 4 H200s: 8 with
    ``NCCL_MAX_CTAS=8`` is best (docs/DISTRIBUTED.md, Speed).

    ``transport``: how K/V move. ``"nccl"``: NCCL's send and receive. ``"copy"``: the copy engine
    into the next rank's buffers (shared by CUDA IPC between processes of one host, by address
    between threads; `peer_copy`), ordered by stream memory operations on flags: no SM and no NCCL
    in the steps; RuntimeError on every rank, saying why, when the ranks cannot share buffers.
    ``"auto"``: the copy engine where the ranks can share buffers, else NCCL.
    """
    return _ring(q, k, v, comm, causal=causal, scale=scale, layout=layout, zigzag=zigzag, softcap=softcap,
                 sinks=sinks, window_size=window_size, alibi_slopes=alibi_slopes, return_lse=return_lse,
                 stream=stream, exchange=True, sm_margin=sm_margin, transport=transport)


_TRANSPORTS = ("nccl", "copy", "auto")
_NO_SHIFT = contextlib.nullcontext()  # the calls of a ring without ALiBi (reusable)


def alibi_context(blk, c: int, slopes):
    """What a chunk pair's call runs inside: ALiBi's diagonal moved by the pair's `Block.alibi_shift`
    (chunks of length ``c``); nothing without ALiBi (``slopes`` None)."""
    return _NO_SHIFT if slopes is None else _alibi_shift.shifted(blk.alibi_shift(c))


def _ring(q, k, v, comm, *, causal, scale, layout, zigzag, softcap, sinks, window_size, alibi_slopes, return_lse,
          stream, exchange: bool, sm_margin: int = 0, transport: str = "nccl"):
    """`ring_attention`; ``exchange=False`` runs the same steps on the rank's own K/V without NCCL (the
    bench's compute-only time, from which it tells the communication left exposed)."""
    zigzag = bool(causal) if zigzag is None else bool(zigzag)
    fields: dict = dict.fromkeys(_FIELDS)
    dev = int(comm.device.device_id)
    error, ref = None, None
    try:  # refused here, the call is still refused on every rank (agree): none waits for this one
        if layout not in ("bshd", "bhsd"):
            raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
        window = None if window_size is None else parse_modifiers(window_size, causal=causal, batch=1,
                                                                  heads_q=1).window
        world, rank, c = _check(q, k, v, comm, layout, zigzag)
        check_slopes("ring_attention", alibi_slopes, q, layout)
        _sm_margin.check(sm_margin)
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(map(repr, _TRANSPORTS))}; got {transport!r}")
        ref = call_stream(q, stream, dev)  # its object kept by the outputs
        hax = 2 if layout == "bshd" else 1
        fields.update({"shard length": q.shape[3 - hax], "batch": q.shape[0], "query heads": q.shape[hax],
                       "key/value heads": k.shape[hax], "head dim": q.shape[3], "dtype": _code(q.dtype),
                       "causal": bool(causal), "zigzag": zigzag, "layout": layout == "bshd", "window": _code(window),
                       "softcap": None if softcap is None else float(softcap),
                       "scale": None if scale is None else float(scale), "sinks": sinks is not None,
                       "alibi": alibi_slopes is not None, "exchange": exchange, "transport": _code(transport)})
    except (TypeError, ValueError, NotImplementedError) as e:
        error = e
    nb, handle, u8, s_main = begin(comm, fields, error, ref, "ring_attention")
    s_comm = _comm_stream(dev, comm)
    sax = 1 if layout == "bshd" else 2
    B, H = q.shape[0], q.shape[3 - sax]
    f32 = np.dtype(np.float32)
    if c == 0:  # empty shards: nothing to attend, nothing to send
        out, lse = new_array(q.shape, q.dtype, dev, s_main, ref.obj), new_array((B, H, 0), f32, dev, s_main, ref.obj)
        return (out, lse) if return_lse else out
    last, plan = ring_plan(rank, world, c, zigzag, *band(causal, window), exchange, alibi=alibi_slopes is not None)

    def rows(x, a, b):  # a slice of the sequence axis
        return x[:, a:b] if sax == 1 else x[:, :, a:b]

    kw = {"scale": scale, "layout": layout, "softcap": softcap, "return_lse": True, "stream": ref}
    alibi = {} if alibi_slopes is None else {"alibi_slopes": alibi_slopes}  # with a call per chunk pair (ring_plan)

    xc = None  # the copy engine's buffers (transport "copy" or "auto"), else NCCL into `bufs`
    if exchange and last > 0 and transport != "nccl":
        xc, why = _peer_copy.buffers_for(comm, nb, handle, u8, dev, s_main, _peer_copy.layout(k, v)[1],
                                         "ring_attention")
        if xc is None and transport == "copy":
            raise RuntimeError(f"ring_attention: transport='copy' cannot run here: {why}; use 'nccl' or 'auto'")
    bufs: list = [None, None]  # the two K/V buffers the ring receives into, made when first needed
    mine = chunks_of(rank, world, zigzag)  # the local query chunks, in the shard's order
    # every call's output and LSE go to a slot of its query chunk's stack, merged once at the end
    count = {qc: sum(call[0] == qc for calls in plan for call in calls) for qc in mine}
    chunk_shape = (B, c, H, q.shape[3]) if sax == 1 else (B, H, c, q.shape[3])
    outs = {qc: new_array((count[qc], *chunk_shape), q.dtype, dev, s_main, ref.obj) for qc in mine}
    lses = {qc: new_array((count[qc], B, H, c), f32, dev, s_main, ref.obj) for qc in mine}
    used = dict.fromkeys(mine, 0)
    cur_k, cur_v = k, v
    for x in (q, k, v):  # the caller's stream after the shards' producers, the NCCL stream after it
        if x.stream_handle is not None and x.stream_handle != s_main:
            stream_wait(s_main, x.stream_handle)
    with _sm_margin.leave_free(sm_margin):  # NCCL's kernel finds SMs free beside the calls
        for s, calls in enumerate(plan):
            nxt = None
            if s < last and exchange and xc is not None:
                stream_wait(s_comm, s_main)  # the calls of step s-1 read buffer (s+1) % 2: done before it is free
                xc.pass_on((cur_k, cur_v), (s + 1) % 2, s_comm, "ring_attention")
                nxt = xc.views((s + 1) % 2, (k, v))
            elif s < last and exchange:
                if bufs[(s + 1) % 2] is None:
                    bufs[(s + 1) % 2] = tuple(new_array(k.shape, k.dtype, dev, s_comm) for _ in range(2))
                nxt = bufs[(s + 1) % 2]
                stream_wait(s_comm, s_main)  # the calls of step s-1 read nxt: done before it is overwritten
                with nccl_group(nb, handle, "ring_attention"):
                    for x in (cur_k, cur_v):
                        nb.send(x.ptr, x.nbytes, u8, (rank + 1) % world, handle, s_comm)
                    for x in nxt:
                        nb.recv(x.ptr, x.nbytes, u8, (rank - 1) % world, handle, s_comm)
            for qc, blk, ki in calls:
                qi = mine.index(qc)
                o_slot, l_slot = outs[qc][used[qc]], lses[qc][used[qc]]
                used[qc] += 1
                if blk is None:  # every key the step brought, in one call (never with ALiBi: ring_plan)
                    assert alibi_slopes is None
                    o, lse = attention(rows(q, qi * c, (qi + 1) * c), cur_k, cur_v, out=o_slot, **kw)
                    place(l_slot, lse, s_main)
                    continue
                qx = rows(q, qi * c + blk.qa, qi * c + blk.qb)
                kx, vx = (rows(x, ki * c + blk.ka, ki * c + blk.kb) for x in (cur_k, cur_v))
                mods = {"causal": blk.causal, "window_size": blk.window, "sinks": sinks if blk.sinks else None,
                        **alibi}
                shift = alibi_context(blk, c, alibi_slopes)
                if (blk.qa, blk.qb) == (0, c):
                    with shift:
                        o, lse = attention(qx, kx, vx, out=o_slot, **mods, **kw)
                    place(l_slot, lse, s_main)
                else:  # rows outside [qa, qb) see no key of this pair: LSE -inf, so the merge skips them
                    l_slot.memset(_NEG_INF_BITS, stream=s_main)
                    with shift:
                        o, lse = attention(qx, kx, vx, **mods, **kw)
                    place(rows(o_slot, blk.qa, blk.qb), o, s_main)
                    place(l_slot[:, :, blk.qa:blk.qb], lse, s_main)
            if nxt is not None:
                stream_wait(s_main, s_comm)  # the next step's K/V has arrived
                for x in nxt:  # ready on the caller's stream now: the calls need not wait on the NCCL stream again
                    x.stream_handle = s_main
                cur_k, cur_v = nxt
    if last > 0 and exchange:
        stream_wait(s_comm, s_main)  # the buffers are freed on the NCCL stream: after the calls that read them
        _lifetime.hold(s_main, (k, v), dev)  # and the caller's k, v live until the sends that read them are done
    merged = [(outs[qc][0], lses[qc][0]) if count[qc] == 1 else
              merge_attention_states(outs[qc], lses[qc], layout=layout, stream=ref) for qc in mine]
    if len(merged) == 1:
        out, lse = merged[0]
    else:  # zigzag: the two chunks side by side along the sequence axis
        out = new_array(q.shape, q.dtype, dev, s_main, ref.obj)
        lse = new_array((B, H, 2 * c), f32, dev, s_main, ref.obj)
        for i, (o, lc) in enumerate(merged):
            place(rows(out, i * c, (i + 1) * c), o, s_main)
            place(lse[:, :, i * c:(i + 1) * c], lc, s_main)
    return (out, lse) if return_lse else out


_NEG_INF_BITS = 0xFF800000  # float32 -inf


@functools.lru_cache(maxsize=256)
def ring_plan(rank: int, world: int, c: int, zigzag: bool, left: float, right: float, exchange: bool = True, *,
              alibi: bool = False):
    """``(last step, each step's calls)`` of a rank (`_step_calls`), up to the last step any rank needs
    when K/V travel (``exchange``), else every step: pure, so one problem's calls share it. ``alibi``:
    a call per chunk pair (ALiBi's distances differ from pair to pair)."""
    last = last_step(world, c, zigzag=zigzag, left=left, right=right) if exchange else world - 1
    steps = ring_steps(rank, world, c, zigzag=zigzag, left=left, right=right)[:last + 1]
    mine = chunks_of(rank, world, zigzag)
    return last, tuple(tuple(_step_calls(blocks, mine, chunks_of((rank - s) % world, world, zigzag), c, not alibi))
                       for s, blocks in enumerate(steps))


def _step_calls(blocks, mine, src_chunks, c: int, whole: bool = True):
    """A step's calls as (query chunk, block or None, key chunk's index in the K/V buffer or None):
    one call over the whole buffer for a query chunk that sees all of it without a mask or sinks
    (``whole``: such calls allowed)."""
    calls = []
    for qc in mine:
        own = [b for b in blocks if b.q_chunk == qc]
        if whole and own and len(own) == len(src_chunks) and all(b.full(c) and not b.sinks for b in own):
            calls.append((qc, None, None))
        else:
            calls += [(qc, b, src_chunks.index(b.k_chunk)) for b in own]
    return calls
