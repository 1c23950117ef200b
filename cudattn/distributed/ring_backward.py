"""The backward of ring attention: dK and dV travel round the ring with the K/V they belong to.

Each rank keeps its rows' dout, q, out and LSE (the forward's, over the whole sequence), so every
(query chunk, key chunk) call of the forward's schedule gives exact partial gradients through
`cudattn.attention_backward` (its softmax is the whole sequence's, from the LSE). At step ``s`` a
rank holds the K/V of rank ``rank - s`` and that rank's float32 dK/dV accumulators: it adds its
partials into them and into its own dQ accumulator, then passes K/V and accumulators on (K/V at the
step's start, the accumulators after its calls, which overlap their arrival). After the last step
that any rank needs, each accumulator goes straight back to its owner. Sinks' gradients are
summed over the ranks. Each partial comes back from `attention_backward` in the input dtype, so it
is rounded once before it is added in float32: the error grows about as the root of the calls a
gradient sums.
"""

from __future__ import annotations

import numpy as np

from .._arrays import lifetime as _lifetime
from .._arrays.array import DeviceArray, new_array
from .._kernels.accumulate import add_into, store
from .._ops.backward import attention_backward
from .._runtime.device import restores_caller_context
from .._runtime.stream import stream_wait
from .._spec.modifiers import parse_modifiers
from .agree import begin, call_stream, check_slopes, nccl
from .agree import code as _code
from .copies import place
from .ring import _check, _comm_stream, alibi_context, ring_plan
from .schedule import band, chunks_of
from .watch import nccl_call, nccl_group

_FIELDS = ("backward", "shard length", "batch", "query heads", "key/value heads", "head dim", "dtype", "causal",
           "zigzag", "layout", "window", "softcap", "scale", "sinks", "alibi")


@restores_caller_context
def ring_attention_backward(dout, q, k, v, out, lse, comm, *, causal: bool = False, scale: float | None = None,
                            layout: str = "bshd", zigzag: bool | None = None, softcap: float | None = None,
                            sinks=None, window_size=None, alibi_slopes=None, stream=None):
    """Gradients of :func:`ring_attention` for this rank's shards: ``(dq, dk, dv)``, and with ``sinks``
    also ``dsinks`` (float32 ``(Hq,)``, the whole sequence's, the same on every rank).

    ``out`` and ``lse`` are what ``ring_attention(..., return_lse=True)`` returned on this rank; the
    other arguments are as there (every rank calls at once). Nothing blocks the host.
    """
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
        for name, x, shape in (("dout", dout, q.shape), ("out", out, q.shape)):
            if not isinstance(x, DeviceArray) or x.shape != shape or x.dtype != q.dtype:
                raise ValueError(f"ring_attention_backward: {name} must be a {q.dtype} DeviceArray of q's shape "
                                 f"{q.shape}")
        hax = 2 if layout == "bshd" else 1
        want = (q.shape[0], q.shape[hax], q.shape[3 - hax])
        if not isinstance(lse, DeviceArray) or lse.shape != want or lse.dtype != np.float32 or \
                not lse.is_c_contiguous:
            raise ValueError(f"ring_attention_backward: lse must be a C-contiguous float32 {want} DeviceArray "
                             "(ring_attention's)")
        if sinks is not None and (not isinstance(sinks, DeviceArray) or sinks.shape != (q.shape[hax],)
                                  or sinks.dtype != np.float32):
            raise ValueError(f"ring_attention_backward: sinks must be a float32 ({q.shape[hax]},) DeviceArray")
        check_slopes("ring_attention_backward", alibi_slopes, q, layout)
        ref = call_stream(q, stream, dev)
        fields.update({"backward": 1, "shard length": q.shape[3 - hax], "batch": q.shape[0],
                       "query heads": q.shape[hax], "key/value heads": k.shape[hax], "head dim": q.shape[3],
                       "dtype": _code(q.dtype), "causal": bool(causal), "zigzag": zigzag, "layout": layout == "bshd",
                       "window": _code(window), "softcap": None if softcap is None else float(softcap),
                       "scale": None if scale is None else float(scale), "sinks": sinks is not None,
                       "alibi": alibi_slopes is not None})
    except (TypeError, ValueError) as e:
        error = e
    nb, handle, u8, s_main = begin(comm, fields, error, ref, "ring_attention_backward")
    s_comm = _comm_stream(dev, comm)
    sax = 1 if layout == "bshd" else 2
    f32 = np.dtype(np.float32)

    def rows(x, a, b):  # a slice of the sequence axis
        return x[:, a:b] if sax == 1 else x[:, :, a:b]

    def zeros(shape, st=s_main):
        x = new_array(shape, f32, dev, st, ref.obj)
        x.memset(0, stream=st)
        return x

    for x in (dout, q, k, v, out, lse):  # the caller's stream after the producers
        if x.stream_handle is not None and x.stream_handle != s_main:
            stream_wait(s_main, x.stream_handle)
    last, plan = ring_plan(rank, world, c, zigzag, *band(causal, window), alibi=alibi_slopes is not None) \
        if c else (0, ())
    mine = chunks_of(rank, world, zigzag)
    dq_acc = zeros(q.shape)
    acc = (zeros(k.shape), zeros(k.shape))  # the dK/dV of the K/V held now (this rank's own at step 0)
    dsinks = zeros((q.shape[3 - sax],)) if sinks is not None else None
    kv_bufs: list = [None, None]
    acc_bufs: list = [None, None]
    cur_k, cur_v = k, v
    kw = {"scale": scale, "layout": layout, "softcap": softcap, "stream": ref}
    alibi = {} if alibi_slopes is None else {"alibi_slopes": alibi_slopes}
    lse_rows: dict = {}  # contiguous copies of the LSE's row ranges (attention_backward takes a C-contiguous LSE)

    def lse_of(r0, r1):
        if (r0, r1) not in lse_rows:
            if (r0, r1) == (0, lse.shape[2]):
                lse_rows[r0, r1] = lse
            else:
                part = new_array(lse.shape[:2] + (r1 - r0,), f32, dev, s_main, ref.obj)
                place(part, lse[:, :, r0:r1], s_main)
                lse_rows[r0, r1] = part
        return lse_rows[r0, r1]

    for s, calls in enumerate(plan):
        kv_next = acc_next = None
        if s < last:
            if kv_bufs[(s + 1) % 2] is None:
                kv_bufs[(s + 1) % 2] = tuple(new_array(k.shape, k.dtype, dev, s_comm) for _ in range(2))
                acc_bufs[(s + 1) % 2] = tuple(new_array(k.shape, f32, dev, s_comm) for _ in range(2))
            kv_next, acc_next = kv_bufs[(s + 1) % 2], acc_bufs[(s + 1) % 2]
            stream_wait(s_comm, s_main)  # step s-1's calls read kv_next: done before it is overwritten
            _exchange(nb, handle, u8, s_comm, (cur_k, cur_v), kv_next, (rank + 1) % world, (rank - 1) % world)
        partials = []
        for qc, blk, ki in calls:  # the products first: they overlap the accumulators' arrival
            qi = mine.index(qc)
            qa, qb = (0, c) if blk is None else (blk.qa, blk.qb)
            r0, r1 = qi * c + qa, qi * c + qb
            if blk is None:
                kx, vx, keys = cur_k, cur_v, None
                mods = {}
            else:
                keys = (ki * c + blk.ka, ki * c + blk.kb)
                kx, vx = (rows(x, *keys) for x in (cur_k, cur_v))
                mods = {"causal": blk.causal, "window_size": blk.window, "sinks": sinks if blk.sinks else None,
                        **alibi}
            args = (rows(dout, r0, r1), rows(q, r0, r1), kx, vx, rows(out, r0, r1), lse_of(r0, r1))
            with alibi_context(blk, c, alibi_slopes):  # with ALiBi a call per chunk pair (ring_plan): blk is set
                grads = attention_backward(*args, **mods, **kw)
            partials.append((r0, r1, keys, grads))
        stream_wait(s_main, s_comm)  # this step's accumulators have arrived (and the next step's K/V)
        for r0, r1, keys, grads in partials:
            add_into(rows(dq_acc, r0, r1), grads[0], s_main)
            ak, av = acc if keys is None else (rows(x, *keys) for x in acc)
            add_into(ak, grads[1], s_main)
            add_into(av, grads[2], s_main)
            if len(grads) == 4:
                add_into(dsinks, grads[3], s_main)
        del partials
        if s < last:
            for x in kv_next:
                x.stream_handle = s_main
            stream_wait(s_comm, s_main)  # this step's partials are in the accumulators it passes on
            _exchange(nb, handle, u8, s_comm, acc, acc_next, (rank + 1) % world, (rank - 1) % world)
            for x in acc_next:  # the next step waits for them after its products
                x.stream_handle = s_main
            cur_k, cur_v = kv_next
            acc = acc_next
    if last > 0:  # the accumulators held now are rank - last's: straight home, this rank's from rank + last
        home = tuple(new_array(k.shape, f32, dev, s_comm) for _ in range(2))
        stream_wait(s_comm, s_main)
        _exchange(nb, handle, u8, s_comm, acc, home, (rank - last) % world, (rank + last) % world)
        stream_wait(s_main, s_comm)
        acc = home
    dq, dk, dv = (new_array(x.shape, q.dtype, dev, s_main, ref.obj) for x in (q, k, v))
    store(dq, dq_acc, s_main)
    store(dk, acc[0], s_main)
    store(dv, acc[1], s_main)
    if last > 0:
        stream_wait(s_comm, s_main)  # the buffers made on the NCCL stream are freed there: after their last reads
        _lifetime.hold(s_main, (k, v), dev)  # and the caller's k, v live until the sends that read them are done
    if dsinks is None:
        return dq, dk, dv
    if world > 1:  # every rank's rows: summed over the ranks
        core, _ = nccl()
        with nccl_call(nb, handle, "ring_attention_backward"):
            nb.all_reduce(dsinks.ptr, dsinks.ptr, dsinks.size, int(core.FLOAT32), int(core.SUM), handle, s_main)
    return dq, dk, dv, dsinks


def _exchange(nb, handle, u8: int, stream: int, send, recv, to: int, frm: int) -> None:
    """``send``'s arrays to rank ``to`` and ``recv``'s from rank ``frm``, one NCCL group."""
    with nccl_group(nb, handle, "ring_attention_backward"):
        for x in send:
            nb.send(x.ptr, x.nbytes, u8, to, handle, stream)
        for x in recv:
            nb.recv(x.ptr, x.nbytes, u8, frm, handle, stream)
