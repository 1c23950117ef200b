"""GPU: a warm call's dropped output is kept on the host and serves the next call of that size on
its stream (`_arrays.alloc`), and never while a call on another stream still reads it.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn._arrays import alloc as _alloc
from cudattn._runtime import stream as _stream
from _callpath_cases import F16, SPIN, _check_attention, _qkv, _rng

pytestmark = pytest.mark.gpu


def test_a_dropped_output_serves_the_next_call_on_its_stream():
    rng = _rng()
    q, k, v = _qkv(rng, 2, 193, 193, 4, 2, 64)
    q2, k2, v2 = _qkv(rng, 2, 193, 193, 4, 2, 64)
    qd, kd, vd, qd2, kd2, vd2 = (cudattn.to_device(x) for x in (q, k, v, q2, k2, v2))
    cudattn.attention(qd, kd, vd, causal=True)  # the full path: recorded
    first = cudattn.attention(qd, kd, vd, causal=True)  # warm: from the pool
    ptr, host_first = first.ptr, cudattn.to_host(first)
    del first
    second = cudattn.attention(qd2, kd2, vd2, causal=True)  # warm: the kept block, no driver call
    assert second.ptr == ptr, "a warm call's dropped output must serve the next call of its size on its stream"
    _check_attention(host_first, q, k, v, causal=True)
    _check_attention(cudattn.to_host(second), q2, k2, v2, causal=True)
    del second
    cudattn.empty_cache()
    assert _alloc._kept_bytes.get(qd.device_id, 0) == 0, "empty_cache must give the kept blocks back"


def test_an_output_still_read_on_another_stream_is_not_reused(torch):
    """``a``, made on cudattn's stream (a lasting stream, where dropped outputs are kept), is the
    query of a call on torch stream B queued behind a 0.2 s spin; dropped by the caller at once, it
    stays held until B's call is done, so the next calls on cudattn's stream (same size) must take
    other memory: else they overwrite what B has not read yet."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 256, 256, 4, 4, 64)
    B = torch.cuda.Stream()
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    cudattn.attention(qd, kd, vd)  # the full path
    a = cudattn.attention(qd, kd, vd)  # warm: a block that is kept when dropped
    assert a.stream_handle in _stream.LASTING_STREAMS
    a_ptr, host_a = a.ptr, cudattn.to_host(a)
    with torch.cuda.stream(B):
        torch.cuda._sleep(SPIN)
    b = cudattn.attention(a, kd, vd, stream=B)  # reads a after the spin
    del a
    later = [cudattn.attention(qd, kd, vd) for _ in range(3)]
    assert all(x.ptr != a_ptr for x in later), "a block still read on another stream was handed out again"
    assert not B.query(), "B finished before the check: the test proves nothing (spin too short)"
    torch.cuda.synchronize()
    _check_attention(cudattn.to_host(b), host_a.astype(F16), k, v)
    for x in later:
        _check_attention(cudattn.to_host(x), q, k, v)
    assert np.isfinite(host_a.astype(np.float32)).all()


def test_a_stream_torch_made_keeps_dropped_outputs_and_an_external_one_does_not(torch):
    """A stream torch made (``torch.cuda.Stream()``, or torch's current stream inside
    ``torch.cuda.stream``) is never destroyed by torch, so cudattn counts it lasting: a dropped
    output is kept on the host and serves the next call of its size there, as on cudattn's own
    stream; a warm call on a new such stream notes it too (the compiled path, where built). A stream
    torch only wraps (``torch.cuda.ExternalStream``) may be destroyed by its owner: never counted
    lasting, nothing kept for it."""
    from cuda.core import Device

    from cudattn._calls import warm as _warm

    rng = _rng()
    q, k, v = _qkv(rng, 2, 193, 193, 4, 2, 64)
    q2, k2, v2 = _qkv(rng, 2, 193, 193, 4, 2, 64)
    nbytes = q.nbytes
    S = torch.cuda.Stream()
    qd, kd, vd, qd2, kd2, vd2 = (cudattn.to_device(x, stream=S) for x in (q, k, v, q2, k2, v2))
    cudattn.attention(qd, kd, vd, causal=True, stream=S)  # the full path: recorded
    assert S.cuda_stream in _stream.LASTING_STREAMS
    first = cudattn.attention(qd, kd, vd, causal=True, stream=S)
    ptr, host_first = first.ptr, cudattn.to_host(first)
    del first
    assert _alloc._kept.get((qd.device_id, S.cuda_stream, nbytes)), "a dropped output must be kept on the host"
    second = cudattn.attention(qd2, kd2, vd2, causal=True, stream=S)
    assert second.ptr == ptr, "a dropped output must serve the next call of its size on a stream torch made"
    _check_attention(host_first, q, k, v, causal=True)
    _check_attention(cudattn.to_host(second), q2, k2, v2, causal=True)

    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    torch.cuda.synchronize()
    S2, S3 = torch.cuda.Stream(), torch.cuda.Stream()  # torch tensors, no stream=: torch's current stream
    with torch.cuda.stream(S2):
        for _ in range(2):
            out = cudattn.attention(tq, tk, tv, causal=True)
        assert S2.cuda_stream in _stream.LASTING_STREAMS
        _check_attention(cudattn.to_host(out, stream=S2), q, k, v, causal=True)
    served = _warm._native.stats()[0] if _warm.run is not None else 0
    with torch.cuda.stream(S3):  # a warm call on a stream not seen before
        S3.wait_stream(torch.cuda.default_stream())
        out = cudattn.attention(tq, tk, tv, causal=True)
        assert S3.cuda_stream in _stream.LASTING_STREAMS
        if _warm.run is not None:
            assert _warm._native.stats()[0] == served + 1, "the compiled path must serve (and note) it"
        _check_attention(cudattn.to_host(out, stream=S3), q, k, v, causal=True)

    own = Device().create_stream()  # a stream whose owner may destroy it: torch only wraps it
    try:
        ext = torch.cuda.ExternalStream(int(own.handle))
        ed = [cudattn.to_device(x, stream=ext) for x in (q, k, v)]
        for _ in range(2):
            o = cudattn.attention(*ed, causal=True, stream=ext)
        assert int(own.handle) not in _stream.LASTING_STREAMS
        assert int(own.handle) in _stream.TORCH_EXTERNAL
        _check_attention(cudattn.to_host(o, stream=ext), q, k, v, causal=True)
        del o, ed
        assert not any(key[1] == int(own.handle) and blocks for key, blocks in _alloc._kept.items())
    finally:
        own.sync()
        cudattn.empty_cache()  # nothing of the stream's left in the tables once it is gone
        own.close()
