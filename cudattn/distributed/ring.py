"""Ring attention: each rank attends its query shard to every rank's K/V as they pass around
the ring by NCCL, and merges the partial results by their LSEs on the device.

Per step ``s`` a rank holds the K/V of rank ``(rank - s) % world``. On a communication stream of
its own it sends that K/V on to ``rank + 1`` and receives the next from ``rank - 1`` (one NCCL
group, into the other of two buffers) while the step's attention calls run on the caller's
stream; the caller's stream waits for the receive before the next step, and the communication
stream for the calls that read a buffer before overwriting it. Nothing blocks the host.
"""

from __future__ import annotations

import math

from cuda.bindings import driver
from cuda.core import StreamOptions

from .._arrays.array import DeviceArray, new_array
from .._ops.attention import attention
from .._ops.merge import merge_attention_states
from .._runtime.device import get_device
from .._runtime.errors import check
from .._runtime.stream import as_stream, stream_wait
from .schedule import band, chunks_of, ring_steps

_comm_streams: dict[int, object] = {}  # device id -> the ring's NCCL stream (cuda.core Stream)


def _comm_stream(device_id: int) -> int:
    s = _comm_streams.get(device_id)
    if s is None:
        s = _comm_streams[device_id] = get_device(device_id).create_stream(options=StreamOptions(nonblocking=True))
    return int(s.handle)


def _nccl():
    try:
        import nccl.bindings.nccl as bindings
        import nccl.core as core
    except ImportError as e:  # the optional extra
        raise ImportError('ring_attention needs nccl4py: pip install "cudattn[distributed]"') from e
    return core, bindings


def _check(q, k, v, comm, layout: str, zigzag: bool):
    """The rules a rank can check alone, before any GPU work; returns (world, rank, chunk length)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, DeviceArray):
            raise TypeError(f"ring_attention: {name} must be a cudattn DeviceArray (a rank's shard on its GPU: "
                            f"cudattn.to_device(shard)), not {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"ring_attention: {name} must be 4-D ({layout}); got shape {x.shape}")
    if q.dtype != k.dtype or k.dtype != v.dtype or q.dtype.itemsize != 2:
        raise TypeError(f"ring_attention: q, k, v must share one 16-bit dtype (float16 or bfloat16); got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (k.is_c_contiguous and v.is_c_contiguous):
        raise ValueError("ring_attention: k and v must be C-contiguous (they travel whole by NCCL)")
    if k.shape != v.shape:
        raise ValueError(f"ring_attention: k and v must share one shape; got {k.shape} and {v.shape}")
    sax = 1 if layout == "bshd" else 2
    if q.shape[sax] != k.shape[sax]:
        raise ValueError(f"ring_attention: q and k must hold shards of one length (self-attention); got "
                         f"{q.shape[sax]} and {k.shape[sax]}")
    world, rank = int(comm.nranks), int(comm.rank)
    dev = int(comm.device.device_id)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device_id != dev:
            raise ValueError(f"ring_attention: {name} is on cuda:{x.device_id}, the communicator on cuda:{dev}")
    per = 2 if zigzag else 1
    if q.shape[sax] % per:
        raise ValueError(f"ring_attention: a zigzag shard holds two chunks, so its length must be even; got "
                         f"{q.shape[sax]}")
    return world, rank, q.shape[sax] // per


def ring_attention(q, k, v, comm, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
                   zigzag: bool | None = None, softcap: float | None = None, sinks=None, window_size=None,
                   alibi_slopes=None, return_lse: bool = False, stream=None):
    """Attention of this rank's query shard over the whole sequence, K/V shards passing round the ring.

    Every rank calls it at once with its own shards (``q`` ``(B, S/world, Hq, D)``, ``k``/``v``
    ``(B, S/world, Hkv, D)`` in ``"bshd"``; device arrays on the communicator's GPU) and a
    ``nccl.core.Communicator`` of all ranks. ``zigzag`` (default: ``causal``) says how the
    sequence was cut (:func:`cudattn.distributed.shard_sequence`): zigzag for causal attention,
    so that every rank does the same work. GQA, ``B > 1``, ``softcap`` and ``sinks`` (counted
    once) work as in :func:`cudattn.attention`; ``window_size`` and ``alibi_slopes`` are not
    supported yet. Returns this rank's output shard (and its LSE ``(B, Hq, S/world)`` with
    ``return_lse``) on the caller's stream (``stream``, or q's); nothing blocks the host.
    """
    zigzag = bool(causal) if zigzag is None else bool(zigzag)
    if window_size is not None:
        raise NotImplementedError("ring_attention: window_size is not supported yet (the schedule has it; "
                                  "the device merge of row-trimmed calls does not)")
    if alibi_slopes is not None:
        raise NotImplementedError("ring_attention: alibi_slopes is not supported yet (the bias depends on "
                                  "positions the local calls do not know)")
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
    world, rank, c = _check(q, k, v, comm, layout, zigzag)
    core, nb = _nccl()
    dev = q.device_id
    get_device(dev)
    s_main = as_stream(q.stream_handle if stream is None else stream, dev).handle
    s_comm = _comm_stream(dev)
    handle = nb.Comm(int(comm.ptr))
    u8 = int(core.UINT8)
    left, right = band(causal, None)
    steps = ring_steps(rank, world, c, zigzag=zigzag, left=left, right=right)
    sax = 1 if layout == "bshd" else 2

    def rows(x, a, b):  # a slice of the sequence axis
        return x[:, a:b] if sax == 1 else x[:, :, a:b]

    bufs = [tuple(new_array(k.shape, k.dtype, dev, s_comm) for _ in range(2)) for _ in range(2)] if world > 1 else []
    kw = dict(scale=scale, layout=layout, softcap=softcap, return_lse=True, stream=s_main)
    mine = list(chunks_of(rank, world, zigzag))  # the local query chunks, in the shard's order
    parts = {qc: ([], []) for qc in mine}
    cur_k, cur_v = k, v
    for x in (q, k, v):  # the caller's stream after the shards' producers, the NCCL stream after it
        if x.stream_handle is not None and x.stream_handle != s_main:
            stream_wait(s_main, x.stream_handle)
    stream_wait(s_comm, s_main)
    for s, blocks in enumerate(steps):
        src = (rank - s) % world
        nxt = None
        if s + 1 < world:
            nxt = bufs[(s + 1) % 2]
            stream_wait(s_comm, s_main)  # the calls of step s-1 read nxt: done before it is overwritten
            nb.group_start()
            for x in (cur_k, cur_v):
                nb.send(x.ptr, x.nbytes, u8, (rank + 1) % world, handle, s_comm)
            for x in nxt:
                nb.recv(x.ptr, x.nbytes, u8, (rank - 1) % world, handle, s_comm)
            nb.group_end()
        src_chunks = (src, 2 * world - 1 - src) if zigzag else (src,)
        for qc in mine:
            mine_blocks = [b for b in blocks if b.q_chunk == qc]
            if not mine_blocks:
                continue
            qi = mine.index(qc)
            qx = rows(q, qi * c, (qi + 1) * c)
            if len(mine_blocks) == len(src_chunks) and all(b.full(c) for b in mine_blocks) and not any(
                    b.sinks for b in mine_blocks):
                calls = [(None, cur_k, cur_v, False, False)]  # every key of the step: one call over the buffer
            else:
                calls = []
                for b in mine_blocks:
                    ki = src_chunks.index(b.k_chunk)
                    calls.append((b, rows(cur_k, ki * c, (ki + 1) * c), rows(cur_v, ki * c, (ki + 1) * c), b.causal,
                                  b.sinks))
            for b, kx, vx, is_causal, with_sinks in calls:
                if b is not None and (b.qa, b.qb, b.ka, b.kb) != (0, c, 0, c):
                    raise AssertionError("ring_attention: a row-trimmed call without a window")  # schedule's contract
                o, lse = attention(qx, kx, vx, causal=is_causal, sinks=sinks if with_sinks else None, **kw)
                parts[qc][0].append(o)
                parts[qc][1].append(lse)
        if nxt is not None:
            stream_wait(s_main, s_comm)  # the next step's K/V has arrived
            for x in nxt:  # ready on the caller's stream now: the calls need not wait on the NCCL stream again
                x.stream_handle = s_main
            cur_k, cur_v = nxt
    if bufs:  # the buffers are freed on the NCCL stream: after the calls that read them
        stream_wait(s_comm, s_main)
    outs, lses = [], []
    for qc in mine:
        os_, ls = parts[qc]
        if len(os_) == 1:
            o, lse = os_[0], ls[0]
        elif len(os_) <= 16:
            o, lse = merge_attention_states(os_, ls, layout=layout, stream=s_main)
        else:
            raise NotImplementedError(f"ring_attention: {len(os_)} partial results for one chunk; at most 16 "
                                      "(8 ranks zigzag, 16 contiguous) for now")
        outs.append(o)
        lses.append(lse)
    if len(outs) == 1:
        out, lse = outs[0], lses[0]
    else:  # zigzag: the two chunks side by side along the sequence axis
        out = new_array(q.shape, q.dtype, dev, s_main)
        lse = new_array(lses[0].shape[:2] + (2 * c,), lses[0].dtype, dev, s_main)
        for i in range(2):
            _place(rows(out, i * c, (i + 1) * c), outs[i], s_main)
            _place(lse[:, :, i * c:(i + 1) * c], lses[i], s_main)
    return (out, lse) if return_lse else out


def _place(dst: DeviceArray, src: DeviceArray, stream: int) -> None:
    """Copy C-contiguous ``src`` into ``dst``, a slice along one axis of a C-contiguous array: rows of
    equal pitch up to the last axis whose strides differ, so one 2-D copy on ``stream``."""
    r = max(i for i in range(dst.ndim) if dst.strides[i] != src.strides[i])
    p = driver.CUDA_MEMCPY2D()
    p.srcMemoryType = p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.dstDevice = src.ptr, dst.ptr
    p.WidthInBytes = p.srcPitch = src.strides[r]
    p.dstPitch = dst.strides[r]
    p.Height = math.prod(src.shape[:r + 1])
    if src.stream_handle is not None and src.stream_handle != stream:
        stream_wait(stream, src.stream_handle)
    check(driver.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")
