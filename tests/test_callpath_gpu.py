"""GPU: the call path's streams, operand lifetimes, `out=` and CUDA graphs.

The contract under test (nvmath-python's stream rule):

- ``stream=None`` runs on the operands' package's current stream: ``torch.cuda.current_stream()``
  for torch tensors, CuPy's current stream for CuPy arrays, the producing stream
  (``.stream_handle``) of cudattn DeviceArrays; the result's ``.stream_handle`` is that stream.
- An explicit ``stream=`` is ordered after the operands' producer (the package's current stream,
  or a DeviceArray's ``.stream_handle``), FP8 descales and ``out`` included, with no host sync.
- Foreign memory read on a stream its owner does not know stays alive until the kernel is done.
- ``out=``: a DeviceArray ``out`` takes the call's stream; ``out`` sharing bytes with q, k or v,
  and null pointers, are refused (ValueError) before any GPU work.
- Calls on a capturing stream are captured; they need ``out=`` (cudattn allocates no output in
  a graph it does not own), and a capture call without it raises ValueError (the capture stays
  usable).

The hazards are made real with ``torch.cuda._sleep``: a long spin queued on the producer's (or
the consumer's) stream keeps a race window open while the call is queued, and inputs that are not
written yet are NaN, so an unordered read gives NaN (which never passes ``reference.check_close``).
Each such test also asserts the spinning stream was still busy when the call returned: that proves
the window was open (the test meant something) and that the call did not block the host.

Every test is marked ``gpu`` (skipped where no CUDA device is present, conftest.py); tests using
PyTorch or CuPy skip where those are missing.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from cudattn import reference

pytestmark = pytest.mark.gpu

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
DTYPES = pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])

#: GPU clock cycles for torch.cuda._sleep: about 0.1 s at 1.5-2 GHz. Every race window below is
#: this long; the calls queued inside it take microseconds to milliseconds of host time.
SPIN = 200_000_000
NAN = float("nan")
_seed = itertools.count(9000)


# ---------------------------------------------------------------------------- helpers


def _rng():
    return np.random.default_rng(next(_seed))


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype=F16):
    return (_rand(rng, (B, Sq, Hq, D), dtype), _rand(rng, (B, Sk, Hkv, D), dtype),
            _rand(rng, (B, Sk, Hkv, D), dtype))


def _to_torch(torch, x):
    """A NumPy array (float16, bfloat16, int32, float32) as a new CUDA tensor on torch's current stream."""
    if x.dtype == BF16:
        t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to("cuda")


def _from_torch(torch, t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _assert_close(o, ref, naive, what):
    o = np.asarray(o).astype(np.float64)
    assert not np.isnan(o).any(), f"{what}: {np.isnan(o).sum()} outputs NaN (unwritten, or inputs read too early)"
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"{what}: max|out-ref| = {err:.3g} > bound {bound:.3g}"


def _check_attention(o, q, k, v, *, causal=False, what="attention"):
    ref = reference.attention(q, k, v, causal=causal)
    naive = reference.attention_naive(q, k, v, causal=causal, dtype=q.dtype)
    _assert_close(o, ref, naive, what)


def _check_kvcache(o, q, kc, vc, seqlens, *, causal=True, what="attention_with_kvcache"):
    ref = reference.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=causal)
    naive = reference.attention_with_kvcache_naive(q, kc, vc, cache_seqlens=seqlens, causal=causal, dtype=q.dtype)
    _assert_close(o, ref, naive, what)


def _nan_device(shape, dtype, stream=None):
    """A new DeviceArray full of NaN (produced on `stream`)."""
    return cudattn.to_device(np.full(shape, np.nan, dtype), stream=stream)


def _core_stream():
    """(cuda.core Device 0, a new cuda.core Stream on it, its int handle)."""
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    return dev, s, int(s.handle)


def _capture_status(h: int):
    err, status = driver.cuStreamIsCapturing(h)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return status


_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
#: What the refusal of an allocating call on a capturing stream must mention ("capture", "capturing").
_CAPTURE = r"(?i)captur"


@contextlib.contextmanager
def _building(s):
    """Capture on cuda.core Stream `s` with a graph builder in "global" mode (torch's default: any
    call that could disturb a capture fails); yields the builder. The capture is always ended,
    even when it was invalidated (cuda.core's end_building then raises without ending it, and a
    global capture left open would fail every later test)."""
    gb = s.create_graph_builder()
    gb.begin_building("global")
    try:
        yield gb
    except BaseException:
        _end_building(gb, s)
        raise
    if not _end_building(gb, s):
        raise AssertionError("the capture was invalidated: a captured call did something a capture forbids")


def _end_building(gb, s) -> bool:
    """End `gb`'s capture on `s`; False when it had been invalidated (then ended through the driver)."""
    try:
        gb.end_building()
        return True
    except Exception:
        err, graph = driver.cuStreamEndCapture(int(s.handle))
        if err == driver.CUresult.CUDA_SUCCESS and int(graph):
            driver.cuGraphDestroy(graph)
        return False


def _d2d(dst, src, stream_handle: int) -> None:
    """Queue a dense device-to-device copy src -> dst on the stream (used between graph launches)."""
    assert dst.nbytes == src.nbytes and dst.is_c_contiguous and src.is_c_contiguous
    (err,) = driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, stream_handle)
    assert err == driver.CUresult.CUDA_SUCCESS, err


def _need_fp8():
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    arch = _device.device_properties(0).arch
    if arch not in _traits.FP8_ARCHS:
        pytest.skip(f"FP8 needs sm_89 or sm_90; this device is {arch}")


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
    torch.cuda.synchronize()
    B = torch.cuda.Stream()
    qt, kt, vt = (_to_torch(torch, x) for x in (q, k, v))
    with torch.cuda.stream(B):
        torch.cuda._sleep(SPIN)
    out = cudattn.attention(qt, kt, vt, stream=B)
    del qt, kt, vt
    junk = [torch.full(shape, NAN, dtype=torch.float16, device="cuda") for _ in range(6)]
    busy = not B.query()
    torch.cuda.synchronize()
    del junk
    assert busy, "the kernel's stream finished before the inputs were dropped: the hazard was not exercised"
    _check_attention(cudattn.to_host(out), q, k, v)


# ---------------------------------------------------------------------------- 4. out=


def test_out_takes_the_call_stream_and_waits_for_its_producer(torch):
    """A DeviceArray out produced on stream A (a NaN fill queued behind a 0.1 s spin), written by
    a call on B: B must wait for A before writing (else A's fill lands on the result: a write
    after write race), and out.stream_handle becomes B, so later readers order after the call."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 177, 177, 4, 4, 64)
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    qd, kd, vd = (cudattn.to_device(x, stream=B.cuda_stream) for x in (q, k, v))
    cudattn.to_host(cudattn.attention(qd, kd, vd, causal=True, out=_nan_device(q.shape, F16, B.cuda_stream),
                                      stream=B.cuda_stream))  # warm
    od = cudattn.to_device(np.zeros(q.shape, F16), stream=A.cuda_stream)
    assert od.stream_handle == A.cuda_stream
    with torch.cuda.stream(A):
        torch.cuda._sleep(SPIN)
        torch.from_dlpack(od).fill_(NAN)
    res = cudattn.attention(qd, kd, vd, causal=True, out=od, stream=B.cuda_stream)
    busy = not A.query()
    assert busy, "out's producer stream finished before the call returned: the call synchronized the host"
    assert res.ptr == od.ptr, "attention must write into the given out"
    assert od.stream_handle == B.cuda_stream, "out must take the call's stream"
    torch.cuda.synchronize()  # both streams done: a late NaN fill would now be in out
    _check_attention(cudattn.to_host(od), q, k, v, causal=True)


def _overlap_case(case, rng):
    """(q, k, v, out, snapshot-able buffer written if the check failed) for one overlap case."""
    B, S, H, D = 2, 64, 2, 64
    q, k, v = _qkv(rng, B, S, S, H, H, D)
    if case == "out-is-q":
        qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
        return qd, kd, vd, qd, qd
    if case == "out-is-v":
        qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
        return qd, kd, vd, vd, vd
    if case == "out-shares-half-of-k":
        big = cudattn.to_device(_rand(rng, (B, 2 * S, H, D), F16))
        qd, vd = cudattn.to_device(q), cudattn.to_device(v)
        return qd, big[:, :S], vd, big[:, S // 2:S // 2 + S], big
    if case == "out-shares-one-row-with-q":
        big = cudattn.to_device(_rand(rng, (B, 2 * S, H, D), F16))
        kd, vd = cudattn.to_device(k), cudattn.to_device(v)
        return big[:, :S], kd, vd, big[:, S - 1:2 * S - 1], big
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["out-is-q", "out-is-v", "out-shares-half-of-k", "out-shares-one-row-with-q"])
def test_out_overlapping_an_input_is_refused(case):
    """out sharing bytes with q, k or v would be written while still being read: ValueError
    ("overlap"), raised before any GPU work (the shared buffer is unchanged afterwards)."""
    qd, kd, vd, od, buf = _overlap_case(case, _rng())
    before = cudattn.to_host(buf)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qd, kd, vd, out=od)
    assert _same_bits(cudattn.to_host(buf), before), "the refused call wrote into the buffer"


def test_out_overlapping_a_torch_input_is_refused(torch):
    """The same check for torch tensors: out=q (the very tensor) raises ValueError ("overlap")."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 32, 32, 2, 2, 64)
    qt, kt, vt = (_to_torch(torch, x) for x in (q, k, v))
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qt, kt, vt, out=qt)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qt, kt, vt, out=vt[:, :, :])
    assert _same_bits(_from_torch(torch, qt), q)


def test_out_beside_an_input_in_one_allocation_is_accepted():
    """Views that share an allocation but no bytes are not an overlap: q and out as the two halves
    (along the batch axis, so their byte ranges are disjoint) of one buffer, and k passed as both k
    and v (inputs may alias each other: they are only read)."""
    rng = _rng()
    B, S, H, D = 2, 96, 2, 64
    q, k = _rand(rng, (B, S, H, D), F16), _rand(rng, (B, S, H, D), F16)
    big = cudattn.to_device(np.concatenate([q, np.full_like(q, np.nan)], axis=0))
    kd = cudattn.to_device(k)
    res = cudattn.attention(big[:B], kd, kd, causal=True, out=big[B:])
    assert res.ptr == big[B:].ptr
    host = cudattn.to_host(big)
    assert _same_bits(host[:B], q), "q changed"
    _check_attention(host[B:], q, k, k, causal=True)


_NULL_CHILD = r"""
import sys
import numpy as np
import cudattn

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal(s, dtype=np.float32).astype(np.float16) for s in ((1, 16, 2, 64), (1, 32, 2, 64),
                                                                              (1, 32, 2, 64)))
for which in ("q", "k", "v", "out"):
    args = {"q": cudattn.to_device(q), "k": cudattn.to_device(k), "v": cudattn.to_device(v),
            "out": cudattn.to_device(np.full(q.shape, np.nan, np.float16))}
    args[which] = cudattn.DeviceArray(0, args[which].shape, np.float16, device_id=0)
    try:
        cudattn.attention(args["q"], args["k"], args["v"], out=args["out"])
        cudattn.to_host(args["out"] if which != "out" else args["q"])
        print(which, "accepted")
    except ValueError as e:
        print(which, "ValueError", "null" in str(e).lower(), str(e).replace(chr(10), " "))
    except Exception as e:
        print(which, type(e).__name__, False, str(e).replace(chr(10), " ")[:200])
o = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)))
print("healthy", bool(np.isfinite(cudattn.to_host(o).astype(np.float32)).all()))
"""


def test_null_pointer_operand_is_refused():
    """A DeviceArray with pointer 0 and a nonzero size (a bare, unallocated view) as q, k, v or out
    is refused with ValueError ("null") before any GPU work, instead of faulting the context. Run in
    a child process: an implementation that launches anyway kills the CUDA context, which would
    fail every later test of the session for an unrelated reason."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NULL_CHILD], capture_output=True, text=True, timeout=300)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    report = f"child rc={r.returncode}\nstdout:\n{r.stdout}\nstderr (tail):\n{r.stderr[-2000:]}"
    for which in ("q", "k", "v", "out"):
        assert lines.get(which, "").startswith("ValueError True"), f"{which}: {lines.get(which)!r}\n{report}"
    assert lines.get("healthy") == "True", report


def _kvcache_inputs(rng, B=2, cap=300, Hq=8, Hkv=2, D=64, seqlens=(300, 41)):
    q = _rand(rng, (B, 1, Hq, D), F16)
    kc, vc = _rand(rng, (B, cap, Hkv, D), F16), _rand(rng, (B, cap, Hkv, D), F16)
    return q, kc, vc, np.asarray(seqlens, np.int32)


@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_kvcache_writes_into_out(num_splits):
    """attention_with_kvcache(out=...): the result lands in the given (NaN-poisoned) out."""
    q, kc, vc, sl = _kvcache_inputs(_rng())
    od = _nan_device(q.shape, F16)
    res = cudattn.attention_with_kvcache(*(cudattn.to_device(x) for x in (q, kc, vc)),
                                         cache_seqlens=cudattn.to_device(sl), causal=True, num_splits=num_splits,
                                         out=od)
    assert res.ptr == od.ptr, "attention_with_kvcache must write into the given out"
    _check_kvcache(cudattn.to_host(od), q, kc, vc, sl)


def test_kvcache_out_overlapping_q_is_refused():
    """attention_with_kvcache(out=q): ValueError ("overlap") before any GPU work."""
    q, kc, vc, sl = _kvcache_inputs(_rng())
    qd = cudattn.to_device(q)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention_with_kvcache(qd, cudattn.to_device(kc), cudattn.to_device(vc),
                                       cache_seqlens=cudattn.to_device(sl), out=qd)
    assert _same_bits(cudattn.to_host(qd), q)


# ---------------------------------------------------------------------------- 5. FP8 descales


def _fp8_inputs(rng, B=2, Sq=130, Sk=257, Hq=4, Hkv=2, D=128):
    xs = [rng.standard_normal(s, dtype=np.float32) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D))]
    (q, qd), (k, kd), (v, vd) = (cudattn.quantize_fp8(x, per="head", heads_kv=Hkv) for x in xs)
    return (q, k, v), (qd, kd, vd)


def test_fp8_descales_on_another_device_are_refused():
    """Descale device arrays on another GPU than q, k, v: ValueError naming the device."""
    from cudattn._runtime import device as _device

    _need_fp8()
    if _device.device_count() < 2:
        pytest.skip("needs two GPUs")
    (q, k, v), descales = _fp8_inputs(_rng())
    args = [cudattn.to_device(x) for x in (q, k, v)]
    for i, name in enumerate(("q_descale", "k_descale", "v_descale")):
        kw = {n: cudattn.to_device(d) for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)}
        kw[name] = cudattn.to_device(descales[i], device=1)
        with pytest.raises(ValueError, match="device"):
            cudattn.attention(*args, **kw)


def test_fp8_descales_produced_on_another_stream_are_ordered(torch):
    """FP8 descale DeviceArrays written on stream A behind a 0.1 s spin (NaN until then); the call
    runs on B: B must wait for the descales' producer like for q, k, v. Checked bit for bit against
    the same call made after a full synchronisation (results are deterministic)."""
    _need_fp8()
    (q, k, v), descales = _fp8_inputs(_rng())
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    args = [cudattn.to_device(x, stream=B.cuda_stream) for x in (q, k, v)]
    srcs = [_to_torch(torch, d) for d in descales]
    names = ("q_descale", "k_descale", "v_descale")
    good = {n: cudattn.to_device(d, stream=B.cuda_stream) for n, d in zip(names, descales)}
    want = cudattn.to_host(cudattn.attention(*args, causal=True, stream=B.cuda_stream, **good))  # also warms
    assert np.isfinite(want.astype(np.float32)).all()
    torch.cuda.synchronize()
    late = {n: _nan_device(d.shape, F32, stream=A.cuda_stream) for n, d in zip(names, descales)}
    with torch.cuda.stream(A):
        torch.cuda._sleep(SPIN)
        for n, t in zip(names, srcs):
            torch.from_dlpack(late[n]).copy_(t)
    out = cudattn.attention(*args, causal=True, stream=B.cuda_stream, **late)
    busy = not A.query()
    assert busy, "the descales' producer finished before the call returned: the call synchronized the host"
    got = cudattn.to_host(out)
    assert _same_bits(got, want), f"{np.isnan(got.astype(np.float32)).sum()} NaN; descales read before written?"


def test_fp8_torch_tensors_match_device_arrays(torch):
    """torch float8_e4m3fn tensors (read through torch's attributes, dtype kept) give the DeviceArray
    path's result bit for bit, on the first call (full path) and on warm calls (recorded replay)."""
    _need_fp8()
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    (q, k, v), descales = _fp8_inputs(_rng())
    names = ("q_descale", "k_descale", "v_descale")
    want = cudattn.to_host(cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=True,
                                             **{n: cudattn.to_device(d) for n, d in zip(names, descales)}))
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).cuda().view(torch.float8_e4m3fn)
                  for x in (q, k, v))
    tds = {n: _to_torch(torch, d) for n, d in zip(names, descales)}
    for call in range(3):
        got = cudattn.to_host(cudattn.attention(tq, tk, tv, causal=True, **tds))
        assert _same_bits(got, want), f"call {call}: torch FP8 operands differ from DeviceArray operands"


def test_torch_operands_of_every_form_are_read_as_they_are(torch):
    """torch tensors read through their own accessors: a strided slice, an nn.Parameter, a tensor
    that requires grad and a tensor subclass give the DeviceArray path's result bit for bit, cold
    and warm; a negated view (torch._neg_view: its memory holds -x) is refused, where cuda.core's
    view hands over its bytes as if they were x (a wrong result, silently)."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 77, 77, 4, 2, 64)
    want = cudattn.to_host(cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v))))
    wide = _to_torch(torch, np.concatenate([q, _rand(rng, q.shape, F16)], axis=-1))
    sliced = wide[..., :64]  # rows 256 bytes apart, unit stride last
    assert not sliced.is_contiguous()

    class Sub(torch.Tensor):
        pass

    tk, tv = _to_torch(torch, k), _to_torch(torch, v)
    forms = {"slice": sliced, "parameter": torch.nn.Parameter(_to_torch(torch, q)),
             "requires-grad": _to_torch(torch, q).requires_grad_(), "subclass": _to_torch(torch, q).as_subclass(Sub)}
    for name, tq in forms.items():
        for call in range(3):
            got = cudattn.to_host(cudattn.attention(tq, tk, tv))
            assert _same_bits(got, want), f"{name}, call {call}: differs from the DeviceArray result"
    neg = torch._neg_view(_to_torch(torch, -q.astype(np.float32)).to(torch.float16))  # its values are q
    assert neg.is_neg()
    for where in ("q", "k"):  # as the first operand (it picks the stream) and as another
        with pytest.raises(TypeError, match="negated"):
            cudattn.attention(neg, tk, tv) if where == "q" else cudattn.attention(forms["slice"], neg, tv)


def test_warm_call_from_a_thread_without_a_current_context():
    """A new thread has no current CUDA context; a warm call there (a replay on cudattn's stream,
    which carries its context) must still run and give the first call's result bit for bit."""
    import threading

    rng = _rng()
    q, k, v = (cudattn.to_device(x) for x in _qkv(rng, 1, 77, 130, 4, 2, 64))
    want = cudattn.to_host(cudattn.attention(q, k, v, causal=True))
    got, errors = [], []

    def worker():
        try:
            ctx = driver.cuCtxGetCurrent()[1]
            got.append((int(ctx), cudattn.to_host(cudattn.attention(q, k, v, causal=True))))
        except Exception as e:  # reported in the main thread
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    ctx, res = got[0]
    assert ctx == 0, "the new thread had a current context: the test did not test what it says"
    assert _same_bits(res, want)


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
    A on the GPU, without a host sync."""
    rng = _rng()
    parts_o = [_rand(rng, (1, 40, 2, 64), F16) for _ in range(2)]
    parts_l = [rng.standard_normal((1, 2, 40), dtype=np.float32) for _ in range(2)]
    want_o, _ = cudattn.merge_attention_states(parts_o, parts_l)
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    late_o = [_nan_device(p.shape, F16, stream=A.cuda_stream) for p in parts_o]
    late_l = [_nan_device(p.shape, F32, stream=A.cuda_stream) for p in parts_l]
    srcs = [_to_torch(torch, p) for p in parts_o + parts_l]
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


# ---------------------------------------------------------------------------- 6. CUDA graphs
#
# The captured sequence: a causal GQA prefill with an odd length, a decode against a contiguous KV
# cache with device cache_seqlens (num_splits None, or 4: the split-KV combine), and a second
# attention whose q is the first call's output (a dependency inside the graph).

PRE = (2, 203, 8, 2, 128)  # B, S, Hq, Hkv, D
DEC = (2, 1000, 8, 2, 128)  # B, capacity, Hq, Hkv, D
S3 = 150  # keys of the third call
SEQLENS = ([1000, 377], [1, 731])  # per replay: the graph must read them on the GPU at replay time


def _graph_inputs(rng, seqlens):
    B, S, Hq, Hkv, D = PRE
    Bd, cap, Hdq, Hdkv, Dd = DEC
    return {
        "q1": _rand(rng, (B, S, Hq, D), F16), "k1": _rand(rng, (B, S, Hkv, D), F16),
        "v1": _rand(rng, (B, S, Hkv, D), F16),
        "qd": _rand(rng, (Bd, 1, Hdq, Dd), F16), "kc": _rand(rng, (Bd, cap, Hdkv, Dd), F16),
        "vc": _rand(rng, (Bd, cap, Hdkv, Dd), F16), "sl": np.asarray(seqlens, np.int32),
        "k3": _rand(rng, (B, S3, Hkv, D), F16), "v3": _rand(rng, (B, S3, Hkv, D), F16),
    }


def _graph_out_shapes():
    B, S, Hq, _, D = PRE
    Bd, _, Hdq, _, Dd = DEC
    return [(B, S, Hq, D), (Bd, 1, Hdq, Dd), (B, S, Hq, D)]


def _run_sequence(x, outs, num_splits, stream):
    """The three calls, each into its out (x: device inputs by name)."""
    cudattn.attention(x["q1"], x["k1"], x["v1"], causal=True, out=outs[0], stream=stream)
    cudattn.attention_with_kvcache(x["qd"], x["kc"], x["vc"], cache_seqlens=x["sl"], causal=True,
                                   num_splits=num_splits, out=outs[1], stream=stream)
    cudattn.attention(outs[0], x["k3"], x["v3"], out=outs[2], stream=stream)


def _check_sequence(h, outs):
    """The three host outputs against the float64 reference of the host inputs h."""
    _check_attention(outs[0], h["q1"], h["k1"], h["v1"], causal=True, what="captured prefill")
    _check_kvcache(outs[1], h["qd"], h["kc"], h["vc"], h["sl"], what="captured decode")
    _check_attention(outs[2], outs[0], h["k3"], h["v3"], what="captured attention on the first output")


@pytest.mark.parametrize("num_splits", [None, 4], ids=["splits-auto", "splits-4"])
def test_torch_graph_capture_replays_bit_for_bit(torch, num_splits):
    """torch.cuda.graph captures three calls made with torch tensors, stream=None (torch's capture
    stream) and out=; replayed twice on new inputs written in place (new cache_seqlens too), the
    graph's outputs equal eager calls on the same inputs bit for bit, and the reference."""
    rng = _rng()
    h = _graph_inputs(rng, SEQLENS[0])
    x = {n: _to_torch(torch, a) for n, a in h.items()}
    g_outs = [torch.empty(s, dtype=torch.float16, device="cuda") for s in _graph_out_shapes()]
    e_outs = [torch.empty(s, dtype=torch.float16, device="cuda") for s in _graph_out_shapes()]
    _run_sequence(x, e_outs, num_splits, None)  # warm-up (kernels loaded, plans made), as torch asks
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _run_sequence(x, g_outs, num_splits, None)
    for i, seqlens in enumerate(SEQLENS):
        h = _graph_inputs(rng, seqlens)
        for n, a in h.items():
            x[n].copy_(torch.from_numpy(a))
        for o in g_outs + e_outs:
            o.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        _run_sequence(x, e_outs, num_splits, None)
        torch.cuda.synchronize()
        for j, (go, eo) in enumerate(zip(g_outs, e_outs)):
            assert torch.equal(go, eo), f"replay {i}, call {j}: graph and eager results differ " \
                                        f"({int(go.isnan().sum())} NaN in the graph's)"
        if i == 0:
            _check_sequence(h, [_from_torch(torch, o) for o in g_outs])
    del g


@pytest.mark.parametrize("producer", ["capture-stream", "library-stream"])
@pytest.mark.parametrize("num_splits", [None, 4], ids=["splits-auto", "splits-4"])
def test_cuda_core_graph_capture_replays_bit_for_bit(producer, num_splits):
    """cuda.core's graph builder ("global" capture mode, like torch's) captures the same three calls
    on cudattn DeviceArrays with stream= the builder's stream handle; launched twice on new inputs
    (device-to-device copies into the captured buffers), it equals eager calls bit for bit.
    producer="library-stream": the operands and outs were made on cudattn's own stream, so the
    captured calls must not wait on that stream with a plain event (illegal inside a capture)."""
    dev, s, hs = _core_stream()
    rng = _rng()
    h = _graph_inputs(rng, SEQLENS[0])
    made_on = s if producer == "capture-stream" else None
    x = {n: cudattn.to_device(a, stream=made_on) for n, a in h.items()}
    g_outs = [_nan_device(sh, F16, stream=made_on) for sh in _graph_out_shapes()]
    e_outs = [_nan_device(sh, F16, stream=made_on) for sh in _graph_out_shapes()]
    _run_sequence(x, e_outs, num_splits, hs)  # warm-up
    dev.sync()
    with _building(s) as gb:
        assert _capture_status(hs) == _ACTIVE
        _run_sequence(x, g_outs, num_splits, hs)
        assert _capture_status(hs) == _ACTIVE, "a captured call invalidated the capture"
    graph = gb.complete()
    try:
        assert all(o.stream_handle == hs for o in g_outs), "out must take the call's stream"
        graph.upload(s)
        for i, seqlens in enumerate(SEQLENS):
            h = _graph_inputs(rng, seqlens)
            srcs = [cudattn.to_device(a, stream=s) for a in h.values()]
            for n, src in zip(h, srcs):
                _d2d(x[n], src, hs)
            for o in g_outs + e_outs:
                o.fill_nan(stream=s)
            graph.launch(s)
            s.sync()
            _run_sequence(x, e_outs, num_splits, hs)
            s.sync()
            got = [cudattn.to_host(o, stream=s) for o in g_outs]
            want = [cudattn.to_host(o, stream=s) for o in e_outs]
            for j, (go, eo) in enumerate(zip(got, want)):
                assert _same_bits(go, eo), f"replay {i}, call {j}: graph and eager results differ " \
                                           f"({np.isnan(go.astype(np.float32)).sum()} NaN in the graph's)"
            if i == 0:
                _check_sequence(h, got)
            del srcs
    finally:
        dev.sync()
        graph.close()
        gb.close()


def test_capture_without_out_is_refused_and_capture_survives_cuda_core():
    """On a capturing stream (cuda.core builder, "global" mode) a call without out= raises ValueError
    ("capture"), attention and attention_with_kvcache alike; the capture is not invalidated: a call
    with out= after it is captured, the capture ends cleanly, and the graph computes the result."""
    dev, s, hs = _core_stream()
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    qk, kc, vc, sl = _kvcache_inputs(rng)
    qd, kd, vd = (cudattn.to_device(a, stream=s) for a in (q, k, v))
    cache = [cudattn.to_device(a, stream=s) for a in (qk, kc, vc, sl)]
    od = _nan_device(q.shape, F16, stream=s)
    cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)  # warm-up
    cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3], out=_nan_device(qk.shape, F16, s), stream=hs)
    s.sync()
    od.fill_nan(stream=s)
    s.sync()
    with _building(s) as gb:
        assert _capture_status(hs) == _ACTIVE
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention(qd, kd, vd, causal=True, stream=hs)
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3], stream=hs)
        assert _capture_status(hs) == _ACTIVE, "the refused call invalidated the capture"
        cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)
    graph = gb.complete()
    try:
        assert np.isnan(cudattn.to_host(od, stream=s).astype(np.float32)).all(), "captured work ran during capture"
        graph.launch(s)
        s.sync()
        _check_attention(cudattn.to_host(od, stream=s), q, k, v, causal=True, what="graph after a refused call")
    finally:
        dev.sync()
        graph.close()
        gb.close()


def test_capture_without_out_is_refused_and_capture_survives_torch(torch):
    """The same inside torch.cuda.graph with torch tensors and stream=None: the refusal leaves
    torch's capture valid (its exit would raise otherwise) and the graph replays correctly."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    qk, kc, vc, sl = _kvcache_inputs(rng)
    qt, kt, vt = (_to_torch(torch, a) for a in (q, k, v))
    cache = [_to_torch(torch, a) for a in (qk, kc, vc, sl)]
    ot = torch.empty(q.shape, dtype=torch.float16, device="cuda")
    cudattn.attention(qt, kt, vt, causal=True, out=ot)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        hs = torch.cuda.current_stream().cuda_stream
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention(qt, kt, vt, causal=True)
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3])
        assert _capture_status(hs) == _ACTIVE, "the refused call invalidated the capture"
        cudattn.attention(qt, kt, vt, causal=True, out=ot)
    ot.fill_(NAN)
    g.replay()
    torch.cuda.synchronize()
    _check_attention(_from_torch(torch, ot), q, k, v, causal=True, what="graph after a refused call")
    del g


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
