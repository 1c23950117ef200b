"""The NumPy path: copy in, run on the device, copy back, synchronously.

It is transfer-bound: PCIe moves bytes far slower than the kernel eats them, and every byte
crosses twice on the host first (pageable NumPy memory <-> pinned staging chunks, see the
pinned-staging section of `_arrays.array`; those host copies run on a few threads), except for arrays
in page-locked memory (:func:`cudattn.empty_pinned`, or any pinned memory): those are DMA'd
straight from and, for a contiguous ``out``, into (`_arrays.pinned`). Two ways through:

- **In sequence** (small problems, ``B == 1``, or no pinned staging): q, k, v to the device,
  the kernel, then out (and LSE) back, all on the caller's stream.
- **Pipelined along the batch axis** (DESIGN §3), when the call moves at least
  :data:`PIPELINE_MIN_BYTES`: B is cut into chunks (:func:`plan_batch_chunks`). Chunk ``i``'s
  q/k/v go up on a copy stream while the kernel runs on chunk ``i - 1`` on the caller's stream
  (which waits for an event after the chunk's uploads), and chunk ``i - 1``'s output comes back
  on a second copy stream (which waits for an event after that chunk's kernel) while later
  chunks go up. Each chunk's kernel is an ordinary device-array attention call on views
  ``qd[b0:b1]`` of the device copies, so results are bit-for-bit those of the device path
  (a block of the kernel computes one (batch, head, query tile) whatever B is).

A fresh result array's page faults (its first touch costs about as much as the copy into it)
are taken ahead of time on a background thread (`_arrays.staging.prefault`) while the inputs go up.
Measured on the H200 machine, the host copies remain the bottleneck (about 85% of the call);
the pipeline hides the kernel and the DMA tails, which is the smaller part.

Either way the call returns when the results are in host memory, and the device work is
ordered after the work already queued on the caller's stream.
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver

from .._kernels import attention as _device_path
from .._arrays import array as _array
from .._runtime import device as _device
from .._kernels import fp8 as _fp8
from .._arrays import pinned as _pinned
from .._arrays import staging as _staging
from .._runtime import stream as _stream
from .._arrays import host_io as _host_io
from .._arrays import transfer as _transfer
from .._runtime.errors import check
from .._spec.validate import validate
from .._runtime.device import restores_caller_context

__all__ = ["attention_host", "plan_batch_chunks", "PIPELINE_MIN_BYTES", "PIPELINE_CHUNK_BYTES"]

#: Calls that move fewer bytes than this (q, k, v up; out and LSE back) run in sequence: the
#: pipeline could hide little more than a short kernel, at a fixed cost per chunk.
PIPELINE_MIN_BYTES = 64 << 20
#: Aim for about this many bytes moved per batch chunk: large next to the per-chunk cost
#: (about 0.1–0.2 ms of Python and driver calls), small enough that the pipeline's fill and
#: drain (one chunk's copies that nothing overlaps) stay short.
PIPELINE_CHUNK_BYTES = 64 << 20
#: At most this many chunks per call.
PIPELINE_MAX_CHUNKS = 32

_F32 = np.dtype(np.float32)


def plan_batch_chunks(batch: int, bytes_per_item: int, *, min_bytes: int | None = None,
                      chunk_bytes: int | None = None, max_chunks: int | None = None) -> list[tuple[int, int]]:
    """Cut ``range(batch)`` into consecutive ``(b0, b1)`` chunks for the pipelined NumPy path.

    ``bytes_per_item``: bytes moved per batch element (q, k, v up, out and LSE back).
    ``batch <= 0`` gives ``[]``. One chunk ``[(0, batch)]`` (run in sequence) when ``batch == 1``
    or the call moves fewer than ``min_bytes`` (default :data:`PIPELINE_MIN_BYTES`). Otherwise
    ``round(total / chunk_bytes)`` chunks (default :data:`PIPELINE_CHUNK_BYTES`), at least 2 and
    at most ``min(batch, max_chunks)`` (default :data:`PIPELINE_MAX_CHUNKS`), whose sizes differ by
    at most one (larger first).
    """
    min_bytes = PIPELINE_MIN_BYTES if min_bytes is None else min_bytes
    chunk_bytes = PIPELINE_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    max_chunks = PIPELINE_MAX_CHUNKS if max_chunks is None else max_chunks
    if batch <= 0:
        return []
    total = batch * max(0, bytes_per_item)
    if batch == 1 or total < min_bytes:
        return [(0, batch)]
    chunk_bytes = max(1, chunk_bytes)
    n = (total + chunk_bytes // 2) // chunk_bytes  # rounded to nearest: the LSE's few bytes add no chunk
    n = max(2, min(n, batch, max(2, max_chunks)))
    size, extra = divmod(batch, n)
    chunks = []
    b0 = 0
    for i in range(n):
        b1 = b0 + size + (i < extra)
        chunks.append((b0, b1))
        b0 = b1
    return chunks


def _bytes_per_item(problem) -> int:
    """Bytes one batch element moves over PCIe: q, k, v up; out (and LSE) back."""
    d = problem.head_dim
    up = (problem.seqlen_q * problem.heads_q + 2 * problem.seqlen_k * problem.heads_kv) * d * problem.dtype.itemsize
    down = problem.seqlen_q * problem.heads_q * d * problem.out_dtype.itemsize
    if problem.return_lse:
        down += problem.heads_q * problem.seqlen_q * _F32.itemsize
    return up + down


@restores_caller_context
def attention_host(q, k, v, *, causal, scale, layout, return_lse, q_descale, k_descale, v_descale, out_dtype,
                   num_splits, out, stream, window_size=None, softcap=None, sinks=None, alibi_slopes=None,
                   device=None):
    kw = dict(causal=causal, scale=scale, layout=layout, return_lse=return_lse, q_descale=q_descale,
              k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, num_splits=num_splits)
    for name, x in (("window_size", window_size), ("softcap", softcap), ("sinks", sinks),
                    ("alibi_slopes", alibi_slopes)):
        if x is not None:
            kw[name] = x
    # The data is copied to the device anyway, so any NumPy strides and alignment are fine: make
    # the copies' source contiguous here (a no-op for contiguous input) rather than refusing views.
    if type(q) is not np.ndarray or type(k) is not np.ndarray or type(v) is not np.ndarray:
        validate(q, k, v, **kw, out=out, host=True)  # subclasses (masked arrays): refused by their own rule
    given = (q, k, v)
    q, k, v = (_copyable(x) for x in given)
    problem = validate(q, k, v, **kw, out=out, host=True)  # every argument error before any GPU work

    device = _device.get_device(device)
    device_id = _device.device_properties(device).device_id
    sref = _stream.as_stream(stream, device)
    pinned = _Pinned(q, k, v, out)
    chunks = plan_batch_chunks(problem.batch, _bytes_per_item(problem))
    staging = _transfer.staging_pool(device_id) if len(chunks) > 1 else None
    if staging is None:
        return _run_in_sequence(problem, q, k, v, kw, out, pinned, device, device_id, sref)
    return _run_pipelined(problem, q, k, v, given, kw, out, pinned, chunks, staging, device, device_id, sref)


class _Pinned:
    """Which of the call's host arrays are page-locked: those go to and from the device by DMA
    alone. ``out`` counts only when contiguous (it is then written in place)."""

    __slots__ = ("q", "k", "v", "out")

    def __init__(self, q, k, v, out):
        self.q, self.k, self.v = (_pinned.is_pinned(x) for x in (q, k, v))
        self.out = out is not None and out.flags.c_contiguous and _pinned.is_pinned(out)

    @property
    def inputs(self) -> tuple[bool, bool, bool]:
        return self.q, self.k, self.v

    @property
    def any(self) -> bool:
        """DMAs from or into the caller's arrays: waited for before the call returns (or raises)."""
        return self.q or self.k or self.v or self.out


def _dma_h2d(dst: int, src: int, nbytes: int, stream: int) -> None:
    check(driver.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync(pinned)")


def _dma_d2h(dst: int, src: int, nbytes: int, stream: int) -> None:
    check(driver.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync(pinned)")


def _upload_arrays(kw: dict, device, sref) -> dict:
    """The call's NumPy descales, sinks and slopes as float32 device arrays (checked already)."""
    kw = _fp8.upload_descales(kw, device, sref)
    for name in ("sinks", "alibi_slopes"):
        if isinstance(kw.get(name), np.ndarray):
            kw[name] = _host_io.to_device(np.ascontiguousarray(kw[name]), device=device, stream=sref)
    return kw


def _upload(x: np.ndarray, pinned: bool, device, sref) -> _array.DeviceArray:
    if not pinned:
        return _host_io.to_device(x, device=device, stream=sref)
    d = _array.empty_on(x.shape, x.dtype, device, sref)
    _dma_h2d(d.ptr, x.ctypes.data, x.nbytes, sref.handle)
    return d


def _copyable(x: np.ndarray) -> np.ndarray:
    """``x`` contiguous and 16-byte aligned (a fresh copy when it is not already): the device copy
    is what the kernel reads, so a host view's strides and offset never matter."""
    x = np.ascontiguousarray(x)
    return x if x.ctypes.data % 16 == 0 else x.copy()


def _run_in_sequence(problem, q, k, v, kw, out, pinned, device, device_id, sref):
    # The result's host array first, so that its page faults (a fresh array's first touch) are
    # taken in the background while the inputs go up; a contiguous `out` is written directly.
    direct = out is not None and out.flags.c_contiguous
    o = out if direct else np.empty(q.shape, problem.out_dtype)
    faults = None if direct else _staging.prefault(o)
    try:
        qd, kd, vd = (_upload(x, p, device, sref) for x, p in zip((q, k, v), pinned.inputs))
        kw = _upload_arrays(kw, device, sref)
        res = _device_path.run_device(validate(qd, kd, vd, **kw, out=None, host=False), qd, kd, vd, None, device, device_id,
                         sref)
        o_dev, lse_dev = res if problem.return_lse else (res, None)
        if faults is not None:
            faults.result()
        if o_dev.nbytes and pinned.out:
            _dma_d2h(o.ctypes.data, o_dev.ptr, o_dev.nbytes, sref.handle)
        elif o_dev.nbytes:
            _transfer._copy_d2h(o.ctypes.data, o_dev.ptr, o_dev.nbytes, sref.handle, device_id)
        if pinned.any:
            check(driver.cuStreamSynchronize(sref.handle), "cuStreamSynchronize")
    except BaseException:
        if pinned.any:  # no DMA may touch the caller's arrays after the call has raised
            driver.cuStreamSynchronize(sref.handle)  # unchecked: the error being raised is the one to report
        raise
    if out is not None and not direct:
        out[...] = o
        o = out
    if problem.return_lse:
        return o, _host_io.to_host(lse_dev, stream=sref)
    return o


# ---------------------------------------------------------------------- the pipeline


def _new_event():
    return check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")


class _Pipeline:
    """A device's two copy streams and four events for pipelined calls.

    Made once per device (kept on the device's staging pool, for the life of the process) and
    used only while holding the pool's lock, so one pipelined call at a time re-records the
    events. Re-recording an event is safe once the waits on its previous record are queued:
    ``cuStreamWaitEvent`` waits for the record current when it is called.
    """

    def __init__(self, device):
        from cuda.core import StreamOptions

        opts = StreamOptions(nonblocking=True)  # never serialised against the legacy default stream
        self._streams = (device.create_stream(options=opts), device.create_stream(options=opts))
        self.h2d = int(self._streams[0].handle)  # uploads of q, k, v
        self.d2h = int(self._streams[1].handle)  # downloads of out and LSE
        self.ev_start = _new_event()  # caller's stream -> h2d: allocations and earlier work first
        self.ev_in = _new_event()  # h2d -> caller's stream: a chunk's q, k, v are on the device
        self.ev_done = (_new_event(), _new_event())  # caller's stream -> d2h: chunk j's kernel is done (j % 2)

    @staticmethod
    def record(event, stream: int) -> None:
        check(driver.cuEventRecord(event, stream), "cuEventRecord(pipeline)")

    @staticmethod
    def wait(stream: int, event) -> None:
        check(driver.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent(pipeline)")


def _run_pipelined(problem, q, k, v, given, kw, out, pinned, chunks, st, device, device_id, sref):
    return_lse = problem.return_lse
    # Device copies, allocated stream-ordered on the caller's stream (and freed there when dropped,
    # by which time every copy on the other streams has completed: this function waits for them).
    qd = _array.empty_on(q.shape, q.dtype, device, sref)
    kd = _array.empty_on(k.shape, k.dtype, device, sref)
    vd = _array.empty_on(v.shape, v.dtype, device, sref)
    od = _array.empty_on(q.shape, problem.out_dtype, device, sref)
    # Output chunks land straight in `out` when it is one contiguous block that no input shares
    # (chunk i's output is written while later chunks' inputs are still being read).
    direct = (out is not None and out.flags.c_contiguous
              and not any(np.may_share_memory(out, x) for x in given))
    o = out if direct else np.empty(q.shape, problem.out_dtype)
    # A fresh result array: fault its pages in on a background thread, chunk by chunk, while the
    # inputs go up (each chunk's faults are waited for before its output is downloaded).
    faults = [None] * len(chunks) if direct else [_staging.prefault(o[b0:b1]) for b0, b1 in chunks]
    lse = np.empty((problem.batch, problem.heads_q, problem.seqlen_q), _F32) if return_lse else None
    keep = []  # per-chunk LSE device arrays: dropped (freed on the caller's stream) after their download
    kw = _upload_arrays(kw, device, sref)
    # (B, Hkv) descales and (B, Hq) slopes: each chunk takes its rows
    per_batch = [n for n in ("q_descale", "k_descale", "v_descale") if isinstance(kw.get(n), _array.DeviceArray)]
    if isinstance(kw.get("alibi_slopes"), _array.DeviceArray) and len(kw["alibi_slopes"].shape) == 2:
        per_batch.append("alibi_slopes")

    with st.lock:
        pipe = st.pipeline
        if pipe is None:
            pipe = st.pipeline = _Pipeline(device)

        def download(j, b0, b1, lse_j):
            if faults[j] is not None:
                faults[j].result()
            pipe.wait(pipe.d2h, pipe.ev_done[j & 1])
            oh = o[b0:b1]
            (_dma_d2h if direct and pinned.out else st.d2h)(oh.ctypes.data, od[b0:b1].ptr, oh.nbytes, pipe.d2h)
            if lse_j is not None:
                lh = lse[b0:b1]
                st.d2h(lh.ctypes.data, lse_j.ptr, lh.nbytes, pipe.d2h)

        try:
            pipe.record(pipe.ev_start, sref.handle)
            pipe.wait(pipe.h2d, pipe.ev_start)
            prev = None
            for j, (b0, b1) in enumerate(chunks):
                for h, d, p in zip((q, k, v), (qd, kd, vd), pinned.inputs):
                    hs = h[b0:b1]
                    (_dma_h2d if p else st.h2d)(d[b0:b1].ptr, hs.ctypes.data, hs.nbytes, pipe.h2d)
                pipe.record(pipe.ev_in, pipe.h2d)
                pipe.wait(sref.handle, pipe.ev_in)
                qj, kj, vj, oj = qd[b0:b1], kd[b0:b1], vd[b0:b1], od[b0:b1]
                kwj = dict(kw, **{n: kw[n][b0:b1] for n in per_batch})  # this chunk's rows
                pj = validate(qj, kj, vj, **kwj, out=oj, host=False)
                res = _device_path.run_device(pj, qj, kj, vj, oj, device, device_id, sref)
                lse_j = res[1] if return_lse else None
                if lse_j is not None:
                    keep.append(lse_j)
                pipe.record(pipe.ev_done[j & 1], sref.handle)
                if prev is not None:  # the previous chunk's output goes down while this one computes
                    download(*prev)
                prev = (j, b0, b1, lse_j)
            download(*prev)
            st.flush()  # every staged output byte is in host memory
            if pinned.any:  # and the DMAs straight into `out`, and from pinned inputs (empty outputs)
                check(driver.cuStreamSynchronize(pipe.d2h), "cuStreamSynchronize(pipeline)")
        except BaseException:
            st.discard()
            for s in (pipe.h2d, pipe.d2h):  # let no copy touch buffers about to be freed
                driver.cuStreamSynchronize(s)  # unchecked: the error being raised is the one to report
            raise
    del keep  # every download is done: the LSE buffers may go
    if out is not None and not direct:
        out[...] = o
        o = out
    return (o, lse) if return_lse else o
