"""GPU: the call path's streams and operand lifetimes (nvmath-python's stream rule).

- ``stream=None`` runs on the operands' package's current stream: ``torch.cuda.current_stream()``
  for torch tensors, CuPy's current stream for CuPy arrays, the producing stream
  (``.stream_handle``) of cudattn DeviceArrays; the result's ``.stream_handle`` is that stream.
- An explicit ``stream=`` is ordered after the operands' producer (the package's current stream,
  or a DeviceArray's ``.stream_handle``), with no host sync; merge and quantize follow the same rule.
- Foreign memory read on a stream its owner does not know stays alive until the kernel is done.

`out=` is in test_callpath_out_gpu.py, FP8 descales and operand forms in
test_callpath_operands_gpu.py, CUDA graphs in test_callpath_graphs_gpu.py; the race windows are
`_callpath_cases`'s. Every test is marked ``gpu`` (skipped where no CUDA device is present,
conftest.py); tests using PyTorch or CuPy skip where those are missing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import cudattn
from _callpath_cases import (
    BF16, F16, F32, NAN, SPIN, _check_attention, _core_stream, _from_torch, _nan_device, _need_fp8, _qkv, _rand,
    _rng, _same_bits, _to_torch,
)

pytestmark = pytest.mark.gpu

DTYPES = pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])


# ---------------------------------------------------------------------------- 1. stream=None


@DTYPES
@pytest.mark.parametrize("where", ["side-stream", "default-stream"])
def test_stream_none_runs_on_torch_current_stream(torch, dtype, where):
    """torch tensors, stream=None: the call runs on torch.cuda.current_stream() and the result says
    so (stream_handle); torch reads it back zero-copy on that stream. Guards against running on
    cudattn's private stream, which torch knows nothing about (old behaviour)."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 77, 203, 4, 2, 64, dtype)
    s = torch.cuda.Stream() if where == "side-stream" else torch.cuda.current_stream()
    with torch.cuda.stream(s):
        qt, kt, vt = (_to_torch(torch, x) for x in (q, k, v))
        out = cudattn.attention(qt, kt, vt, causal=True)
        want = torch.cuda.current_stream().cuda_stream
        assert want == s.cuda_stream
        # torch's default stream is the legacy one (handle 0); 1 (CU_STREAM_LEGACY) names it too
        assert out.stream_handle == want or (want == 0 and out.stream_handle == 1), \
            f"result on stream {out.stream_handle:#x}, torch's current stream is {want:#x}"
        ot = torch.from_dlpack(out)
        assert ot.data_ptr() == out.ptr and tuple(ot.shape) == q.shape
        o = _from_torch(torch, ot)
    _check_attention(o, q, k, v, causal=True)


def test_stream_none_runs_on_cupy_current_stream():
    """CuPy arrays, stream=None: the call runs on CuPy's current stream (result's stream_handle)."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no device")
    except Exception as e:  # a CuPy built for another CUDA
        pytest.skip(f"CuPy cannot use the device: {e}")
    rng = _rng()
    q, k, v = _qkv(rng, 2, 65, 190, 4, 4, 64)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        qc, kc, vc = (cupy.asarray(x) for x in (q, k, v))
        out = cudattn.attention(qc, kc, vc)
        assert cupy.cuda.get_current_stream().ptr == s.ptr
        assert out.stream_handle == s.ptr, f"result on stream {out.stream_handle:#x}, CuPy's is {s.ptr:#x}"
    _check_attention(cudattn.to_host(out), q, k, v)


def test_stream_none_runs_on_device_array_producer_stream():
    """DeviceArrays produced on a stream, stream=None: out and LSE come back on that stream (not
    cudattn's own). Guards against the old rule (None = cudattn's stream, producer ignored)."""
    _, s, h = _core_stream()
    rng = _rng()
    q, k, v = _qkv(rng, 2, 100, 150, 4, 2, 64, BF16)
    qd, kd, vd = (cudattn.to_device(x, stream=s) for x in (q, k, v))
    assert qd.stream_handle == h
    o, lse = cudattn.attention(qd, kd, vd, causal=True, return_lse=True)
    assert o.stream_handle == h and lse.stream_handle == h
    _check_attention(cudattn.to_host(o), q, k, v, causal=True)


# ---------------------------------------------------------------------------- 2. explicit stream= waits


@DTYPES
@pytest.mark.parametrize("as_int", [False, True], ids=["stream-object", "int-handle"])
def test_explicit_stream_waits_for_torch_producer(torch, dtype, as_int):
    """torch tensors written on torch stream A (behind a 0.1 s spin) while A is torch's current
    stream; the call runs on another stream B: B must wait for A on the GPU (an event), not the
    host. Hazard: reading q, k, v before A has written them (they hold NaN until then)."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 150, 301, 4, 2, 64, dtype)
    srcs = [_to_torch(torch, x) for x in (q, k, v)]
    cudattn.attention(*srcs, causal=True)  # warm: kernels built and loaded before the race window
    torch.cuda.synchronize()
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(A):
        dst = [torch.full_like(t, NAN) for t in srcs]
        torch.cuda._sleep(SPIN)
        for d, t in zip(dst, srcs):
            d.copy_(t)
        out = cudattn.attention(*dst, causal=True, stream=B.cuda_stream if as_int else B)
        busy = not A.query()
    assert busy, "the producer stream finished before the call returned: the call synchronized the host"
    assert out.stream_handle == B.cuda_stream
    _check_attention(cudattn.to_host(out), q, k, v, causal=True)
    torch.cuda.synchronize()


def test_explicit_stream_waits_for_device_array_producer(torch):
    """DeviceArrays whose stream_handle is A, written on A behind a 0.1 s spin; the call runs on B
    (torch's current stream is neither): B must wait for A. Hazard: the old code ignored a
    DeviceArray's producer stream and read NaN."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    srcs = [_to_torch(torch, x) for x in (q, k, v)]
    cudattn.to_host(cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=True))  # warm
    torch.cuda.synchronize()
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    ds = [_nan_device(x.shape, x.dtype, stream=A.cuda_stream) for x in (q, k, v)]
    with torch.cuda.stream(A):
        torch.cuda._sleep(SPIN)
        for d, t in zip(ds, srcs):
            torch.from_dlpack(d).copy_(t)
    assert all(d.stream_handle == A.cuda_stream for d in ds)
    out = cudattn.attention(*ds, causal=True, stream=B.cuda_stream)
    busy = not A.query()
    assert busy, "the producer stream finished before the call returned: the call synchronized the host"
    assert out.stream_handle == B.cuda_stream
    _check_attention(cudattn.to_host(out), q, k, v, causal=True)
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind", ["DeviceArray", "torch"])
def test_warm_calls_on_another_stream_wait_for_the_producer_each_time(torch, kind):
    """Warm calls whose operands are written on stream A (DeviceArrays whose stream_handle is A, or
    torch tensors while A is torch's current stream) and run on stream B: each call is served by the
    compiled warm path where the wheel has it (not sent back to Python), and B waits for A's latest
    writes every time. Each round A writes NaN, spins 0.1 s, then writes new values; a call that did
    not wait would read NaN or the last round's values."""
    from cudattn._calls import warm as _warm

    rng = _rng()
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    shapes = _qkv(rng, 2, 203, 203, 8, 2, 128)
    if kind == "DeviceArray":
        ops = [_nan_device(x.shape, x.dtype, stream=A.cuda_stream) for x in shapes]
        views = [torch.from_dlpack(d) for d in ops]
    else:
        with torch.cuda.stream(A):
            ops = views = [_to_torch(torch, x) for x in shapes]
    with torch.cuda.stream(A):
        cudattn.attention(*ops, causal=True, stream=B.cuda_stream)  # recorded
        cudattn.attention(*ops, causal=True, stream=B.cuda_stream)  # warm
    torch.cuda.synchronize()
    stats = _warm._native.stats if _warm.available() else None
    if stats is not None:
        stats(True)
    for _ in range(3):
        q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
        fresh = [_to_torch(torch, x) for x in (q, k, v)]
        torch.cuda.synchronize()  # (a copy from pageable memory on A would wait for the spin)
        with torch.cuda.stream(A):
            for t in views:
                t.fill_(float("nan"))
            torch.cuda._sleep(SPIN)
            for t, x in zip(views, fresh):
                t.copy_(x)
            out = cudattn.attention(*ops, causal=True, stream=B.cuda_stream)
            busy = not A.query()
        assert busy, "the producer stream finished before the call returned: the call synchronized the host"
        assert out.stream_handle == B.cuda_stream
        _check_attention(cudattn.to_host(out), q, k, v, causal=True)
    if stats is not None:
        assert stats(True)[0] == 3, "warm calls on another stream than their operands' are the compiled path's"
    torch.cuda.synchronize()


def test_a_stream_wrapped_anew_each_call_keeps_its_counters_and_a_new_stream_at_its_handle_does_not():
    """Causal prefill (the Hopper kernel's tile counters, or the decode's) on a stream cudattn did not
    make, passed as a new cuda.core ``Stream.from_handle`` each call: right results, and one kept
    counters block for the handle, noted with the stream's id. After the stream is destroyed and a
    new one made (the driver often hands out the same handle), the new stream's calls get a block of
    their own."""
    from cuda.bindings import driver
    from cuda.core import Stream

    from cudattn._arrays import stream_memory as _sm

    rng = _rng()
    q, k, v = _qkv(rng, 2, 300, 300, 4, 2, 64)
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    cudattn.to_host(qd)  # made on cudattn's stream, which the calls below wait for

    def make():
        err, h = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
        assert err == 0
        return int(h)

    def counters_of(h):
        return [(key, b) for key, b in _sm._blocks.items() if key[1] == h and key[2] == 0]

    h1 = make()
    for _ in range(3):
        out = cudattn.attention(qd, kd, vd, causal=True, stream=Stream.from_handle(h1))
        _check_attention(cudattn.to_host(out), q, k, v, causal=True)
    blocks = counters_of(h1)
    if not blocks:
        pytest.skip("these calls take no counters here (not the Hopper kernel)")
    (_, b1), = blocks
    assert b1.sid == _sm._stream_id(h1)
    del out  # a result made on a stream is freed on it: dropped before the stream goes
    assert driver.cuStreamSynchronize(h1)[0] == 0 and driver.cuStreamDestroy(h1)[0] == 0
    h2 = make()
    try:
        for _ in range(2):
            out = cudattn.attention(qd, kd, vd, causal=True, stream=Stream.from_handle(h2))
            _check_attention(cudattn.to_host(out), q, k, v, causal=True)
        (_, b2), = counters_of(h2)
        assert b2.sid == _sm._stream_id(h2) != b1.sid
        if h2 == h1:  # the handle reused: the old stream's block retired, not handed over
            assert b2 is not b1 and b1 in _sm._retired
        del out
    finally:
        driver.cuStreamSynchronize(h2)
        driver.cuStreamDestroy(h2)


# ---------------------------------------------------------------------------- 3. lifetimes


def test_foreign_inputs_stay_alive_until_the_kernel_is_done(torch):
    """torch tensors made on torch's current stream, read on stream B behind a 0.1 s spin; the
    caller drops them at once and torch's caching allocator hands their blocks to new tensors
    filled with NaN on the current stream (which does not wait for B). cudattn must keep the
    inputs alive (or record them on B) until its kernel is done. Hazard: use after free; the old
    code read the NaN."""
    rng = _rng()
    shape = (2, 1024, 4, 128)  # 2 MiB each: torch's large-block pool, reused best-fit
    q, k, v = (_rand(rng, shape, F16) for _ in range(3))
    cudattn.attention(*(_to_torch(torch, x) for x in (q, k, v)))  # warm
    # torch's pool holds enough free blocks for every tensor below, so none waits on a cudaMalloc
    # (in a fresh process those outlasted the spin, and the hazard went unexercised)
    pool = [torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(9)]
    pool[0].fill_(NAN)  # torch's fill kernel loaded now: a kernel's first (lazy) load waits for the GPU
    del pool
    torch.cuda.synchronize()
    B = torch.cuda.Stream()
    qt, kt, vt = (_to_torch(torch, x) for x in (q, k, v))
    with torch.cuda.stream(B):
        torch.cuda._sleep(SPIN)
    out = cudattn.attention(qt, kt, vt, stream=B)
    del qt, kt, vt
    junk = [torch.full(shape, NAN, dtype=torch.float16, device="cuda") for _ in range(9)]  # the freed blocks too
    busy = not B.query()
    torch.cuda.synchronize()
    del junk
    assert busy, "the kernel's stream finished before the inputs were dropped: the hazard was not exercised"
    _check_attention(cudattn.to_host(out), q, k, v)


def test_earlier_holds_are_released_after_the_launch(torch, monkeypatch):
    """Operands held by earlier calls (DeviceArrays made on cudattn's stream, read on a torch
    stream) are let go by a later call only after its kernel is launched, so that the event queries
    add nothing to the call's latency; the held arrays do go, and the results stay right."""
    from cudattn._arrays import lifetime
    from cudattn._calls import warm as _warm
    from cudattn._runtime import launch

    rng = _rng()
    q, k, v = _qkv(rng, 1, 77, 77, 4, 4, 64)
    qd, kd, vd = (cudattn.to_device(a) for a in (q, k, v))  # produced on cudattn's stream
    S = torch.cuda.Stream()
    hs = S.cuda_stream
    for _ in range(2):  # warm: the next calls replay
        cudattn.attention(qd, kd, vd, stream=hs)
    torch.cuda.synchronize()
    with torch.cuda.stream(S):
        torch.cuda._sleep(SPIN)  # the holds below stay pending while the calls run
    cudattn.attention(qd, kd, vd, stream=hs)
    assert lifetime.pending, "the call held nothing: the case does not exercise the release"
    events, python_launches = [], []
    real_launch, real_hold, real_release = launch._cuLaunchKernel, lifetime.hold, lifetime.release_done

    def launches():  # launches so far: the Python path's (its binding) and the compiled path's (its count)
        return len(python_launches) + _warm.take_stamp()[1]

    def launched(*args):
        python_launches.append(args)
        return real_launch(*args)

    def held(*args, **kwargs):
        events.append(("hold", launches()))
        real_hold(*args, **kwargs)

    def released():
        events.append(("release", launches()))
        real_release()

    monkeypatch.setattr(launch, "_cuLaunchKernel", launched)
    monkeypatch.setattr(lifetime, "hold", held)
    monkeypatch.setattr(lifetime, "release_done", released)
    _warm.stamp_launches(True)
    try:
        out = cudattn.attention(qd, kd, vd, stream=hs)
    finally:
        _warm.stamp_launches(False)
    # after the call's one launch: its own operands held, then the completed holds released
    assert events == [("hold", 1), ("release", 1)], events
    torch.cuda.synchronize()
    assert len(lifetime.pending) >= 1
    cudattn.attention(qd, kd, vd, stream=hs)  # holds its operands, then lets the completed holds go
    assert len(lifetime.pending) <= 1, "the completed holds were not released"
    _check_attention(cudattn.to_host(out), q, k, v)


# ---------------------------------------------------------------------------- 5b. merge and quantize


def test_quantize_and_merge_follow_the_stream_rule(torch):
    """quantize_fp8, dequantize and merge_attention_states take the same call path: with torch
    tensors and stream=None they run on torch's current stream (a side stream here), and give the
    host path's results (quantize: the same bits; merge: within float32 rounding)."""
    _need_fp8()
    rng = _rng()
    x = rng.standard_normal((2, 33, 4, 64), dtype=np.float32).astype(F16)
    parts_o = [_rand(rng, (2, 33, 4, 64), F16) for _ in range(3)]
    parts_l = [rng.standard_normal((2, 4, 33), dtype=np.float32) for _ in range(3)]
    want_q, want_d = cudattn.quantize_fp8(x, per="head")
    want_o, want_l = cudattn.merge_attention_states(parts_o, parts_l)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xt = _to_torch(torch, x)
        q, d = cudattn.quantize_fp8(xt, per="head")
        back = cudattn.dequantize(q, d)
        o, lse = cudattn.merge_attention_states([_to_torch(torch, p) for p in parts_o],
                                                [_to_torch(torch, p) for p in parts_l])
        for name, a in (("quantize_fp8", q), ("descale", d), ("dequantize", back), ("merge out", o),
                        ("merge lse", lse)):
            assert a.stream_handle == side.cuda_stream, f"{name} on {a.stream_handle:#x}, not torch's current stream"
    assert _same_bits(cudattn.to_host(q), want_q) and _same_bits(cudattn.to_host(d), want_d)
    assert _same_bits(cudattn.to_host(back), cudattn.dequantize(want_q, want_d))
    np.testing.assert_allclose(cudattn.to_host(o).astype(np.float32), want_o.astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(cudattn.to_host(lse), want_l, rtol=1e-5, atol=1e-5)


def test_merge_on_an_explicit_stream_waits_for_the_parts_producer(torch):
    """Parts written on stream A behind a 0.1 s spin (NaN until then), merged on stream B: B waits for
    A on the GPU, without a host sync. A first device merge runs before the spin: loading a kernel
    into the context may wait for the device, which is the driver's doing, not the call path's."""
    rng = _rng()
    parts_o = [_rand(rng, (1, 40, 2, 64), F16) for _ in range(2)]
    parts_l = [rng.standard_normal((1, 2, 40), dtype=np.float32) for _ in range(2)]
    want_o, _ = cudattn.merge_attention_states(parts_o, parts_l)
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    late_o = [_nan_device(p.shape, F16, stream=A.cuda_stream) for p in parts_o]
    late_l = [_nan_device(p.shape, F32, stream=A.cuda_stream) for p in parts_l]
    srcs = [_to_torch(torch, p) for p in parts_o + parts_l]
    cudattn.merge_attention_states([cudattn.to_device(p) for p in parts_o], [cudattn.to_device(p) for p in parts_l],
                                   stream=B.cuda_stream)  # the merge kernel loaded
    torch.cuda.synchronize()
    with torch.cuda.stream(A):
        torch.cuda._sleep(SPIN)
        for dst, src in zip(late_o + late_l, srcs):
            torch.from_dlpack(dst).copy_(src)
    o, _ = cudattn.merge_attention_states(late_o, late_l, stream=B.cuda_stream)
    assert not A.query(), "the parts' producer finished before the call returned: the call synchronized the host"
    got = cudattn.to_host(o).astype(np.float32)
    assert not np.isnan(got).any(), "parts read before they were written"
    np.testing.assert_allclose(got, want_o.astype(np.float32), rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------- 7. no host sync


def test_warm_call_does_not_synchronize_the_host(torch):
    """20 warm calls (DeviceArrays, out=, stream = a torch stream busy with a 0.2 s spin) return in
    well under 0.1 s while the GPU is still spinning: the call path queues work and returns; it
    never waits for the stream (a lifetime or ordering scheme that synchronized would show here)."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    S = torch.cuda.Stream()
    hs = S.cuda_stream
    qd, kd, vd = (cudattn.to_device(a, stream=hs) for a in (q, k, v))
    od = _nan_device(q.shape, F16, stream=hs)
    for _ in range(2):  # warm: kernels, plans, first-use allocations
        cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)
    torch.cuda.synchronize()
    with torch.cuda.stream(S):
        torch.cuda._sleep(2 * SPIN)
    t0 = time.perf_counter()
    for _ in range(20):
        cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)
    elapsed = time.perf_counter() - t0
    busy = not S.query()
    torch.cuda.synchronize()
    assert busy, f"the 0.2 s spin was over when the 20 calls returned ({elapsed * 1e3:.1f} ms): a call waited for it"
    assert elapsed < 0.1, f"20 warm calls took {elapsed * 1e3:.1f} ms of host time"
    _check_attention(cudattn.to_host(od), q, k, v, causal=True)
