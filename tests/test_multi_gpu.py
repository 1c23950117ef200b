"""Two or more GPUs in one process: cudattn's calls on a second device, devices used in turn from
one thread and from a thread each, and the ring (`cudattn.distributed.ring_attention`, one thread a
rank over communicators from ``nccl.core.Communicator.init_all``) against the float64 reference
on the whole sequence. Skipped below two devices; the ring also without nccl4py."""

from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._runtime import device as _device
from cudattn.reference.rule import check_close

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared machines
pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


def _in_threads(body, n: int, timeout: float = 120.0) -> tuple[list, dict]:
    """``body(i)`` in ``n`` threads at once: (results by i, exceptions by i); a thread still running
    after ``timeout`` fails the test."""
    results: list = [None] * n
    errors: dict = {}

    def run(i):
        try:
            results[i] = body(i)
        except Exception as e:  # noqa: BLE001 (returned to the test)
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


def _ranks(world: int, body) -> tuple[list, dict]:
    """``body(rank, comm)`` for each rank of ``world`` GPUs, a thread each, over communicators from
    ``nccl.core.Communicator.init_all``; destroyed after, or aborted if a rank hung in NCCL."""
    nccl = pytest.importorskip("nccl.core")
    comms = nccl.Communicator.init_all(world)
    done = False
    try:
        out = _in_threads(lambda r: body(r, comms[r]), world)
        done = True
        return out
    finally:
        for c in comms:
            if done:
                c.destroy()
            else:
                c.abort()


def _need(n: int) -> None:
    if _device.device_count() < n:
        pytest.skip(f"needs {n} GPUs; this machine has {_device.device_count()}")


def _case(rng, B=2, S=256, Hq=4, Hkv=2, D=64):
    q = rng.standard_normal((B, S, Hq, D)).astype(BF16)
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(BF16) for _ in range(2))
    return q, k, v


def _attend_on(dev: int, q, k, v, causal: bool):
    qd, kd, vd = (cudattn.to_device(x, device=dev) for x in (q, k, v))
    out = cudattn.attention(qd, kd, vd, causal=causal)
    assert out.device_id == dev
    return out


def test_second_device_result_and_dlpack_export():
    """A call on cuda:1 gives the reference's result; its output crosses DLPack to torch (the
    consumer stream waits on an event of cuda:1's own context)."""
    _need(2)
    torch = pytest.importorskip("torch")
    q, k, v = _case(np.random.default_rng(4100))
    out = _attend_on(1, q, k, v, True)
    ref = reference.attention(q, k, v, causal=True)
    naive = reference.attention_naive(q, k, v, causal=True, dtype=BF16)
    t = torch.from_dlpack(out)
    assert t.device == torch.device("cuda", 1)
    ok, err, bound = check_close(t.float().cpu().numpy(), ref, naive)
    assert ok, f"cuda:1 off by {err:.3g} > {bound:.3g}"
    ok, err, bound = check_close(cudattn.to_host(out), ref, naive)
    assert ok


def test_devices_in_turn_from_one_thread_and_a_thread_each():
    _need(2)
    rng = np.random.default_rng(4101)
    cases = [_case(rng) for _ in range(4)]
    refs = [reference.attention(*c) for c in cases]
    naives = [reference.attention_naive(*c, dtype=BF16) for c in cases]
    for rnd in range(3):  # warm calls replay: each device's own kernels, events and streams
        for i, c in enumerate(cases):
            got = cudattn.to_host(_attend_on(i % 2, *c, False))
            assert check_close(got, refs[i], naives[i])[0], f"round {rnd}, case {i} on cuda:{i % 2}"
    def work(dev):
        for _ in range(5):
            for i, c in enumerate(cases):
                got = cudattn.to_host(_attend_on(dev, *c, False))
                assert check_close(got, refs[i], naives[i])[0], f"cuda:{dev}, case {i}"

    _, errors = _in_threads(work, 2)
    assert not errors, errors


def _every_api(dev: int, seed: int) -> dict:
    """Each public operation once on GPU ``dev`` (inputs made from ``seed``): name -> host result."""
    rng = np.random.default_rng(seed)
    up = lambda x: cudattn.to_device(x, device=dev)  # noqa: E731
    q, k, v = _case(rng, 2, 300, 4, 2, 64)
    dq, dk, dv = (up(x) for x in (q, k, v))
    got = {}
    out, lse = cudattn.attention(dq, dk, dv, causal=True, return_lse=True)
    got["attention"], got["lse"] = cudattn.to_host(out), cudattn.to_host(lse)
    lens = np.array([0, 130, 300, 600], np.int32)
    qp = rng.standard_normal((600, 4, 64)).astype(BF16)
    kp, vp = (rng.standard_normal((600, 2, 64)).astype(BF16) for _ in range(2))
    got["varlen"] = cudattn.to_host(cudattn.attention(up(qp), up(kp), up(vp), causal=True, cu_seqlens_q=up(lens),
                                                      cu_seqlens_k=up(lens), max_seqlen_q=300, max_seqlen_k=300))
    kc, vc = (rng.standard_normal((2, 512, 2, 64)).astype(BF16) for _ in range(2))
    q1 = rng.standard_normal((2, 1, 4, 64)).astype(BF16)
    got["kvcache"] = cudattn.to_host(cudattn.attention_with_kvcache(
        up(q1), up(kc), up(vc), cache_seqlens=up(np.array([200, 511], np.int32))))
    parts = [cudattn.attention(dq, dk[:, a:b], dv[:, a:b], return_lse=True) for a, b in ((0, 150), (150, 300))]
    mo, ml = cudattn.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    got["merge"], got["merge_lse"] = cudattn.to_host(mo), cudattn.to_host(ml)
    x8, desc = cudattn.quantize_fp8(dq)
    got["quantize"] = cudattn.to_host(x8).view(np.uint8)
    got["dequantize"] = cudattn.to_host(cudattn.dequantize(x8, desc))
    dout = up(rng.standard_normal(q.shape).astype(BF16))
    grads = cudattn.attention_backward(dout, dq, dk, dv, out, lse, causal=True, deterministic=True)
    for name, g in zip(("dq", "dk", "dv"), grads):
        got[name] = cudattn.to_host(g)
    pinned = cudattn.empty_pinned(q.shape, BF16)
    pinned[...] = q
    got["pinned"] = cudattn.attention(pinned, k, v, device=dev)  # the NumPy path on `dev`, from pinned memory
    for r in got.values():
        assert np.isfinite(np.asarray(r, np.float64)).all() or r.dtype == np.uint8
    return got


def _same(a: dict, b: dict, what: str) -> None:
    for name in a:
        assert np.array_equal(np.asarray(a[name]).view(np.uint8), np.asarray(b[name]).view(np.uint8)), f"{what}: {name}"


def test_every_api_on_the_second_device_as_on_the_first():
    """Every public operation on cuda:1 gives cuda:0's bits (the same kernels on the same GPU model;
    the backward in its deterministic mode), with cuda:0 then cuda:1 then cuda:0 again in one thread."""
    _need(2)
    first = _every_api(0, 4500)
    _same(first, _every_api(1, 4500), "cuda:1")
    _same(first, _every_api(0, 4500), "cuda:0 after cuda:1")


def test_every_api_from_a_thread_per_device():
    _need(2)
    want = _every_api(0, 4501)
    results, errors = _in_threads(lambda dev: [_every_api(dev, 4501) for _ in range(3)], 2)
    assert not errors, errors
    got = {(dev, i): res for dev in (0, 1) for i, res in enumerate(results[dev])}
    for key, res in got.items():
        _same(want, res, f"thread on cuda:{key[0]}, round {key[1]}")


def test_foreign_arrays_on_the_second_device():
    """torch tensors on cuda:1 in (DLPack and CAI import, torch's cuda:1 stream), and out again."""
    _need(2)
    torch = pytest.importorskip("torch")
    q, k, v = _case(np.random.default_rng(4502))
    want = cudattn.to_host(_attend_on(0, q, k, v, True))
    tq, tk, tv = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to("cuda:1") for x in (q, k, v))
    with torch.cuda.device(1):
        out = cudattn.attention(tq, tk, tv, causal=True, stream=torch.cuda.current_stream(1).cuda_stream)
    assert out.device_id == 1
    back = torch.from_dlpack(out)
    np.testing.assert_array_equal(back.view(torch.int16).cpu().numpy(), want.view(np.int16))
    got = cudattn.attention(tq, tk, tv, causal=True)  # no stream given: torch's current stream on cuda:1
    np.testing.assert_array_equal(cudattn.to_host(got).view(np.int16), want.view(np.int16))


def test_calls_on_the_second_device_leave_the_callers_context_current():
    """torch works on cuda:0; cudattn calls on cuda:1 operands (uploads, attention, a DLPack export
    to torch, a copy back, every public operation) give the thread cuda:0's context back each time,
    so torch's current device stays 0."""
    _need(2)
    torch = pytest.importorskip("torch")
    from cuda.bindings import driver

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda:0")  # torch's context current on this thread

    def current() -> int:
        return int(driver.cuCtxGetCurrent()[1])

    ctx0, after = current(), {}
    q, k, v = _case(np.random.default_rng(4503))
    qd = cudattn.to_device(q, device=1)
    after["to_device"] = current()
    kd, vd = (cudattn.to_device(x, device=1) for x in (k, v))
    out = cudattn.attention(qd, kd, vd, causal=True)
    after["attention"] = current()
    t = torch.from_dlpack(out)
    after["DLPack export"] = current()
    host = cudattn.to_host(out)
    after["to_host"] = current()
    cold = _every_api(1, 4503)
    after["every operation"] = current()
    _same(cold, _every_api(1, 4503), "warm calls on cuda:1 from a thread on cuda:0")  # replays, split-KV included
    after["every operation, warm"] = current()
    on_legacy = [cudattn.to_host(cudattn.attention(qd, kd, vd, causal=True, stream=0)) for _ in range(3)]
    after["cuda:1's legacy default stream"] = current()
    assert all(np.array_equal(x.view(np.uint16), host.view(np.uint16)) for x in on_legacy)
    assert all(c == ctx0 for c in after.values()), {name: hex(c) for name, c in after.items() if c != ctx0}
    assert torch.cuda.current_device() == 0 and t.device == torch.device("cuda", 1)
    ok, err, bound = check_close(host, reference.attention(q, k, v, causal=True),
                                 reference.attention_naive(q, k, v, causal=True, dtype=BF16))
    assert ok, f"cuda:1 off by {err:.3g} > {bound:.3g}"


def test_warm_calls_on_the_second_device_take_the_compiled_path():
    """Warm calls on cuda:1 from a thread whose current device is cuda:0 are served by the compiled
    warm path (where this build has it): DeviceArrays on cudattn's stream, with ``out=``, and made on
    and used on cuda:1's legacy stream (handle 0); torch tensors on torch's cuda:1 stream, and a decode step.
    Each gives cuda:0's bits, and the thread keeps cuda:0's context."""
    _need(2)
    torch = pytest.importorskip("torch")
    from cuda.bindings import driver

    from cudattn._calls import warm

    if not warm.available():
        pytest.skip("this build has no compiled warm path (or CUDATTN_NATIVE=0)")
    native = warm._native
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda:0")
    ctx0 = int(driver.cuCtxGetCurrent()[1])
    rng = np.random.default_rng(4504)
    q, k, v = _case(rng)
    kc, vc = (rng.standard_normal((2, 512, 2, 64)).astype(BF16) for _ in range(2))
    q1 = rng.standard_normal((2, 1, 4, 64)).astype(BF16)
    lens = np.array([200, 511], np.int32)

    def inputs(dev):
        up = lambda x: cudattn.to_device(x, device=dev)  # noqa: E731
        return [up(x) for x in (q, k, v)], [up(x) for x in (q1, kc, vc, lens)]

    (p0, d0), (p1, d1) = inputs(0), inputs(1)
    legacy = [cudattn.to_device(x, device=1, stream=0) for x in (q, k, v)]  # made on the stream they are used on
    want = cudattn.to_host(cudattn.attention(*p0, causal=True))
    want_dec = cudattn.to_host(cudattn.attention_with_kvcache(*d0[:3], cache_seqlens=d0[3]))
    out1 = cudattn.to_device(np.full(q.shape, np.nan, BF16), device=1)
    tq, tk, tv = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to("cuda:1") for x in (q, k, v))
    tstream = torch.cuda.current_stream(1).cuda_stream
    calls = {
        "DeviceArray": lambda: cudattn.attention(*p1, causal=True),
        "DeviceArray, out=": lambda: cudattn.attention(*p1, causal=True, out=out1),
        "DeviceArray, stream 0": lambda: cudattn.attention(*legacy, causal=True, stream=0),
        "torch, torch's stream": lambda: cudattn.attention(tq, tk, tv, causal=True, stream=tstream),
        "decode": lambda: cudattn.attention_with_kvcache(*d1[:3], cache_seqlens=d1[3]),
    }
    for name, call in calls.items():
        call()  # the first call records the plan on cuda:1
        native.stats(True)
        got = [call() for _ in range(5)]
        served, missed = native.stats(True)
        assert served == 5, f"{name}: {served} of 5 warm calls compiled; sent back from lines {missed}"
        for g in got:
            g = cudattn.to_host(g) if isinstance(g, cudattn.DeviceArray) else g.view(torch.int16).cpu().numpy()
            ref = want_dec if name == "decode" else want
            assert np.array_equal(np.asarray(g).view(np.uint16), ref.view(np.uint16)), name
        assert int(driver.cuCtxGetCurrent()[1]) == ctx0, f"{name} left another context current"


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("causal,mods", [(False, {}), (True, {}), (True, {"softcap": 15.0}), (True, {"sinks": 1}),
                                         (True, {"window": (100, 0)}), (False, {"window": (150, 40)}),
                                         (True, {"alibi": 1}), (False, {"alibi": 1, "zigzag": True}),
                                         (True, {"alibi": 1, "window": (100, 0), "sinks": 1})])
def test_ring_equals_attention_on_the_whole_sequence(world, causal, mods):
    """A world of 1 (one GPU) runs the zigzag schedule's pairs of chunks on one rank: no NCCL transfer,
    but every call of two chunks, ALiBi's shifted diagonals included."""
    _need(world)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import gather_sequence, ring_attention, shard_sequence

    rng = np.random.default_rng(4200 + world)
    B, Hq, Hkv, D = 2, 8, 2, 128
    S = world * 2 * 96
    zig = mods.get("zigzag", causal)
    q, k, v = _case(rng, B, S, Hq, Hkv, D)
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    slopes = rng.uniform(0.01, 0.3, (B, Hq)).astype(np.float32) if mods.get("alibi") else None
    kw = {"softcap": mods.get("softcap"), "sinks": sinks, "window_size": mods.get("window"), "alibi_slopes": slopes}
    shards = [shard_sequence(x, world, zigzag=zig) for x in (q, k, v)]

    def rank(r, comm):
        qd, kd, vd = (cudattn.to_device(s[r], device=r) for s in shards)
        sk, al = (None if x is None else cudattn.to_device(x, device=r) for x in (sinks, slopes))
        return cudattn.to_host(ring_attention(qd, kd, vd, comm, causal=causal, zigzag=zig, softcap=kw["softcap"],
                                              sinks=sk, window_size=kw["window_size"], alibi_slopes=al))

    outs, errors = _ranks(world, rank)
    assert not errors, errors
    got = gather_sequence(outs, zigzag=zig)
    ref = reference.attention(q, k, v, causal=causal, **kw)
    naive = reference.attention_naive(q, k, v, causal=causal, dtype=BF16, **kw)
    ok, err, bound = check_close(got, ref, naive)
    assert ok, f"ring of {world}: off by {err:.3g} > {bound:.3g}"


def test_a_call_nccl_refuses_inside_a_group_leaves_no_group_open():
    """A point-to-point call NCCL refuses inside a group (a peer the communicator does not have)
    raises naming the operation, and the group is ended: NCCL's group depth is the thread's, so
    otherwise the thread's next NCCL calls (a new communicator after the abort, an all-reduce on
    it) would wait in that group instead of running."""
    _need(1)
    nccl = pytest.importorskip("nccl.core")
    from cudattn.distributed import watch
    from cudattn.distributed.nccl_lib import nccl as nccl_lib

    core, nb = nccl_lib()
    x = cudattn.to_device(np.random.default_rng(7).standard_normal(1000).astype(np.float32), device=0)
    stream = x.stream_handle
    comm = nccl.Communicator.init_all(1)[0]
    handle = nb.Comm(int(comm.ptr))
    with pytest.raises(RuntimeError, match=r"^probe: NCCL reported .*; abort the communicator$"):
        with watch.nccl_group(nb, handle, "probe"):
            nb.send(x.ptr, x.nbytes, int(core.UINT8), 5, handle, stream)  # rank 5 of a world of 1
    comm.abort()
    comm = nccl.Communicator.init_all(1)[0]
    try:
        handle = nb.Comm(int(comm.ptr))
        y = cudattn.to_device(np.full(1000, np.nan, np.float32), device=0)  # poison: the sum must land
        with watch.nccl_call(nb, handle, "probe"):
            nb.all_reduce(x.ptr, y.ptr, 1000, int(core.FLOAT32), int(core.SUM), handle, stream)
        watch.wait(nb, handle, stream, "probe", timeout=60)
        np.testing.assert_array_equal(cudattn.to_host(y), cudattn.to_host(x))
    finally:
        comm.destroy()


def test_launcher_ring_in_processes_matches_the_reference():
    """`cudattn.distributed.scaling.measure`: one process a GPU, NCCL's unique id passed by the launcher."""
    _need(2)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import scaling

    case = {"B": 1, "H": 8, "Hkv": 2, "S": 4 * 512, "D": 128, "dtype": "bfloat16", "causal": True, "seed": 3}
    row = scaling.measure(case, 2, 3, want_output=True, timeout=300)
    assert row["ms"] > 0 and row["tflops_per_gpu"] > 0
    ok, err, bound = scaling.check_rows(case, 2, row["out"])
    assert ok, f"off by {err:.3g} > {bound:.3g}"


def _rank_one_fails(comm):
    """Rank 1 raises at once; rank 0 runs the ring, whose receive never completes, and waits for it."""
    import cudattn
    from cudattn.distributed import ring_attention

    if comm.rank == 1:
        raise ValueError("rank 1 gives up")
    x = cudattn.to_device(np.ones((1, 128, 2, 64), BF16), device=int(comm.device.device_id))
    return cudattn.to_host(ring_attention(x, x, x, comm))


def test_a_failing_rank_stops_the_others():
    _need(2)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import launch

    with pytest.raises(launch.RankError, match="rank 1 failed: ValueError: rank 1 gives up") as e:
        launch.run(_rank_one_fails, 2, timeout=120)
    assert e.value.rank == 1


_PEER_TIMEOUT_S = 5  # CUDATTN_NCCL_TIMEOUT in the ranks of the tests below


def _rank_whose_peer_dies(rank: int, uid: bytes, when: str, blocking: bool, transport: str, results,
                          peer_gone) -> None:
    """A rank of two processes joined by their own communicator (no `launch.run`, which would stop the
    survivor itself). Rank 1 leaves without a word to NCCL (``os._exit``), before any call (``when``
    "before the first call"; "connected first": with NCCL's connections made at its init, so that the
    first call's all-gather is queued and then waits on the GPU) or after a first ring call
    ("mid-ring"). Rank 0 then calls the ring and `synchronize`: it must raise within the timeout,
    and its stream must be free after the abort (a plain call on it completes). ``transport``: the
    ring's (with "copy" the survivor's stream waits on a flag in its own memory, which `synchronize`
    releases after the abort). Rank 0 reports
    (what happened, message, seconds) on ``results``."""
    import time

    os.environ["CUDATTN_NCCL_TIMEOUT"] = str(_PEER_TIMEOUT_S)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if when == "connected first":
        os.environ["NCCL_RUNTIME_CONNECT"] = "0"
    import nccl.core as nccl

    import cudattn
    from cudattn._runtime import device as dev_
    from cudattn.distributed import ring_attention, synchronize

    dev_.get_device(rank)
    config = None if blocking else nccl.NCCLConfig(blocking=False)
    comm = nccl.Communicator.init(2, rank, nccl.UniqueId.from_bytes(uid), config=config)
    deadline = time.monotonic() + 60
    while comm.get_async_error() == 7:  # a non-blocking communicator joins in the background
        assert time.monotonic() < deadline, "the communicator never finished joining"
        time.sleep(0.001)
    rng = np.random.default_rng(4910 + rank)
    x = cudattn.to_device(rng.standard_normal((1, 256, 2, 64)).astype(BF16), device=rank)
    if when == "mid-ring":
        ring_attention(x, x, x, comm, causal=True, transport=transport)
        synchronize(comm)
    if rank == 1:
        os._exit(0)
    peer_gone.wait(120)
    start = time.monotonic()
    try:
        ring_attention(x, x, x, comm, causal=True, transport=transport)
        synchronize(comm)
    except (TimeoutError, RuntimeError) as e:
        took = time.monotonic() - start
        if not str(e).startswith("synchronize"):  # raised by the call itself: aborting is the caller's part
            comm.abort()
        after = cudattn.to_host(cudattn.attention(x, x, x))  # the stream runs again
        results.put((type(e).__name__, f"{e} | finite after: {bool(np.isfinite(after.astype(np.float32)).all())}",
                     took))
        return
    results.put(("finished", "the ring finished without its peer", time.monotonic() - start))


# Not tested: a blocking communicator whose peer exited before the first call. NCCL's own call then
# holds the host while it connects, until NCCL gives up (RemoteError after 59.5 s on 2 H200s), and no
# deadline of cudattn's applies inside it.
@pytest.mark.parametrize("when,blocking,transport", [("before the first call", False, "nccl"),
                                                     ("connected first", True, "nccl"), ("mid-ring", True, "nccl"),
                                                     ("mid-ring", False, "nccl"), ("mid-ring", False, "copy")])
def test_a_rank_whose_peer_died_raises_instead_of_hanging(when, blocking, transport):
    """Without the launcher: a peer that died leaves this rank's NCCL work waiting for ever; the first
    call's check of the ranks' problems and `synchronize` wait with a deadline (CUDATTN_NCCL_TIMEOUT)
    and raise, `synchronize` aborting the communicator so that the stream runs again."""
    _need(2)
    nccl = pytest.importorskip("nccl.core")
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results, peer_gone = ctx.Queue(), ctx.Event()
    uid = bytes(nccl.get_unique_id())
    procs = [ctx.Process(target=_rank_whose_peer_dies, args=(r, uid, when, blocking, transport, results, peer_gone),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    import queue
    import time

    try:
        procs[1].join(120)
        assert procs[1].exitcode == 0, f"rank 1 ended with {procs[1].exitcode}"
        peer_gone.set()
        deadline = time.monotonic() + _PEER_TIMEOUT_S + 90
        got = None
        while got is None:
            try:
                got = results.get(timeout=1)
            except queue.Empty:
                assert procs[0].is_alive(), f"rank 0 ended ({procs[0].exitcode}) without a report"
                assert time.monotonic() < deadline, "rank 0 hung"
        procs[0].join(60)
        assert procs[0].exitcode == 0, f"rank 0 did not end cleanly ({procs[0].exitcode})"
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    what, message, took = got
    print(f"{when}, blocking={blocking}, transport={transport}: {what} after {took:.1f} s: {message}")
    assert what in ("TimeoutError", "RuntimeError"), message
    assert message.startswith("synchronize" if when == "mid-ring" else "ring_attention"), message
    assert took < _PEER_TIMEOUT_S + 30 and "finite after: True" in message


def _ulysses_case(rng, world: int, mods: dict, with_dout: bool = False):
    """q, k, v (B=2, 8 query and 4 key heads, D=64, 160 tokens a rank), dout if asked, then sinks and
    ALiBi slopes where ``mods`` asks for them, drawn in that order."""
    q, k, v = _case(rng, 2, world * 160, 8, 4, 64)
    dout = rng.standard_normal(q.shape).astype(BF16) if with_dout else None
    sinks = rng.uniform(-1, 2, 8).astype(np.float32) if mods.get("sinks") else None
    alibi = rng.uniform(0.01, 0.3, 8).astype(np.float32) if mods.get("alibi") else None
    return q, k, v, dout, sinks, alibi


def _per_head_on(dev: int, sinks, alibi) -> dict:
    """The per-head keyword arrays (``sinks``, ``alibi_slopes``) on GPU ``dev``, None where absent."""
    return {n: None if x is None else cudattn.to_device(x, device=dev)
            for n, x in (("sinks", sinks), ("alibi_slopes", alibi))}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal,mods", [(False, {}), (True, {}), (True, {"window": (90, 0), "softcap": 10.0}),
                                         (False, {"alibi": 1, "sinks": 1})])
def test_ulysses_equals_attention_on_the_whole_sequence(world, causal, mods):
    _need(world)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import gather_sequence, shard_sequence, ulysses_attention

    q, k, v, _, sinks, alibi = _ulysses_case(np.random.default_rng(4400 + world), world, mods)
    kw = {"softcap": mods.get("softcap"), "window_size": mods.get("window"), "sinks": sinks, "alibi_slopes": alibi}
    shards = [shard_sequence(x, world, zigzag=False) for x in (q, k, v)]

    def rank(r, comm):
        dev = [cudattn.to_device(s[r], device=r) for s in shards]
        extra = _per_head_on(r, sinks, alibi)
        o, lse = ulysses_attention(*dev, comm, causal=causal, softcap=kw["softcap"], window_size=kw["window_size"],
                                   return_lse=True, **extra)
        return cudattn.to_host(o), cudattn.to_host(lse)

    outs, errors = _ranks(world, rank)
    assert not errors, errors
    got = gather_sequence([o for o, _ in outs], zigzag=False)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, return_lse=True, **kw)
    naive = reference.attention_naive(q, k, v, causal=causal, dtype=BF16, **kw)
    ok, err, bound = check_close(got, ref, naive)
    assert ok, f"Ulysses on {world}: off by {err:.3g} > {bound:.3g}"
    lse = gather_sequence([lse for _, lse in outs], zigzag=False, axis=2)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-3, atol=1e-3)


def test_ranks_with_different_shards_are_refused_on_every_rank():
    """Uneven shards: the first call's all-gather of each rank's problem refuses them on both ranks,
    naming the field, instead of leaving one waiting in NCCL."""
    _need(2)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import ring_attention

    def rank(r, comm):
        x = cudattn.to_device(np.ones((1, 128 + 64 * r, 2, 64), BF16), device=r)
        return cudattn.to_host(ring_attention(x, x, x, comm, causal=True))

    _, raised = _ranks(2, rank)
    errors = {r: str(e) for r, e in raised.items() if isinstance(e, ValueError)}
    assert set(errors) == {0, 1} and all("rank 1's shard length is 192 where rank 0's is 128" in m
                                         for m in errors.values()), errors


def test_demo_on_two_gpus():
    """`python -m cudattn demo --gpus 2`: the launcher, the ring and the check, as a user runs them."""
    _need(2)
    pytest.importorskip("nccl.core")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "cudattn", "demo", "--gpus", "2", "--causal", "--seqlen", "4096",
                        "--batch", "1", "--heads", "8", "--iters", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ring:" in r.stdout and ": OK" in r.stdout, r.stdout


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("causal,mods", [(True, {}), (False, {}), (True, {"sinks": 1}), (True, {"window": (100, 0)}),
                                         (True, {"alibi": 1}), (False, {"alibi": 1})])
def test_ring_backward_equals_the_whole_sequence_gradients(world, causal, mods):
    _need(world)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import gather_sequence, ring_attention, ring_attention_backward, shard_sequence
    from cudattn.reference.rule import gradient_eps

    rng = np.random.default_rng(4800 + world)
    B, Hq, Hkv, D = 2, 8, 2, 64  # B > 1: the accumulators' row slices are strided
    S = world * 2 * 96
    q, k, v = _case(rng, B, S, Hq, Hkv, D)
    dout = rng.standard_normal(q.shape).astype(BF16)
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    slopes = rng.uniform(0.01, 0.3, Hq).astype(np.float32) if mods.get("alibi") else None
    kw = {"window_size": mods.get("window")}
    shards = [shard_sequence(x, world, zigzag=causal) for x in (dout, q, k, v)]

    def rank(r, comm):
        do, qd, kd, vd = (cudattn.to_device(s[r], device=r) for s in shards)
        sk, al = (None if x is None else cudattn.to_device(x, device=r) for x in (sinks, slopes))
        out, lse = ring_attention(qd, kd, vd, comm, causal=causal, sinks=sk, alibi_slopes=al, return_lse=True, **kw)
        return [cudattn.to_host(g) for g in ring_attention_backward(do, qd, kd, vd, out, lse, comm, causal=causal,
                                                                    sinks=sk, alibi_slopes=al, **kw)]

    outs, errors = _ranks(world, rank)
    assert not errors, errors
    ref = reference.attention_backward(dout, q, k, v, causal=causal, sinks=sinks, alibi_slopes=slopes, **kw)
    naive = reference.attention_backward_naive(dout, q, k, v, causal=causal, sinks=sinks, alibi_slopes=slopes,
                                               dtype=BF16, **kw)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = gather_sequence([o[i] for o in outs], zigzag=causal)
        ok, err, bound = check_close(got, ref[i], naive[i], atol=gradient_eps(ref[i], BF16))
        assert ok, f"ring of {world}: {name} off by {err:.3g} > {bound:.3g}"
    if sinks is not None:
        for o in outs:
            np.testing.assert_allclose(o[3], ref[3], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal,mods", [(True, {}), (False, {"alibi": 1, "sinks": 1}), (True, {"window": (90, 0)})])
def test_ulysses_backward_equals_the_whole_sequence_gradients(world, causal, mods):
    _need(world)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import gather_sequence, shard_sequence, ulysses_attention, ulysses_attention_backward
    from cudattn.reference.rule import gradient_eps

    q, k, v, dout, sinks, alibi = _ulysses_case(np.random.default_rng(4950 + world), world, mods, with_dout=True)
    kw = {"window_size": mods.get("window")}
    shards = [shard_sequence(x, world, zigzag=False) for x in (dout, q, k, v)]

    def rank(r, comm):
        do, qd, kd, vd = (cudattn.to_device(s[r], device=r) for s in shards)
        extra = _per_head_on(r, sinks, alibi)
        out, lse = ulysses_attention(qd, kd, vd, comm, causal=causal, return_lse=True, **extra, **kw)
        return [cudattn.to_host(g) for g in ulysses_attention_backward(do, qd, kd, vd, out, lse, comm,
                                                                       causal=causal, **extra, **kw)]

    outs, errors = _ranks(world, rank)
    assert not errors, errors
    ref = reference.attention_backward(dout, q, k, v, causal=causal, sinks=sinks, alibi_slopes=alibi, **kw)
    naive = reference.attention_backward_naive(dout, q, k, v, causal=causal, sinks=sinks, alibi_slopes=alibi,
                                               dtype=BF16, **kw)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = gather_sequence([o[i] for o in outs], zigzag=False)
        ok, err, bound = check_close(got, ref[i], naive[i], atol=gradient_eps(ref[i], BF16))
        assert ok, f"Ulysses of {world}: {name} off by {err:.3g} > {bound:.3g}"
    if sinks is not None:
        for o in outs:
            np.testing.assert_allclose(o[3], ref[3], rtol=2e-2, atol=2e-2)


def test_ring_on_non_blocking_communicators():
    """Communicators made with NCCLConfig(blocking=False), a thread per rank: every NCCL operation is
    settled on the host before the next (watch.settle), and the result equals the reference."""
    _need(2)
    nccl = pytest.importorskip("nccl.core")
    import time

    from cudattn.distributed import gather_sequence, ring_attention, shard_sequence

    rng = np.random.default_rng(4900)
    world, B, S = 2, 1, 2 * 2 * 128
    q, k, v = _case(rng, B, S, 4, 2, 64)
    shards = [shard_sequence(x, world, zigzag=True) for x in (q, k, v)]
    uid = nccl.get_unique_id()
    comms: list = [None] * world

    def rank(r):
        _device.get_device(r)
        comm = comms[r] = nccl.Communicator.init(world, r, uid, config=nccl.NCCLConfig(blocking=False))
        deadline = time.monotonic() + 60
        while comm.get_async_error() == 7:  # ncclInProgress: joining
            assert time.monotonic() < deadline, "the communicator never finished joining"
            time.sleep(0.001)
        qd, kd, vd = (cudattn.to_device(x[r], device=r) for x in shards)
        return cudattn.to_host(ring_attention(qd, kd, vd, comm, causal=True))

    try:
        outs, errors = _in_threads(rank, world)
    finally:
        for c in comms:
            if c is not None:
                c.abort()
    assert not errors, errors
    got = gather_sequence(outs, zigzag=True)
    ref = reference.attention(q, k, v, causal=True)
    ok, err, bound = check_close(got, ref, reference.attention_naive(q, k, v, causal=True, dtype=BF16))
    assert ok, f"off by {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("world", [2, 4])
def test_ring_by_copy_engine_equals_the_ring_by_nccl(world):
    """transport="copy" (K/V by the copy engine into the next rank's buffers, ordered by flags; ranks
    as threads of one process, so by address with peer access) gives the same bits as NCCL's
    send/receive: calls queued back to back without a host sync, on two caller streams, buffers
    that grow (a larger shard after a smaller one), causal, full and windowed."""
    _need(world)
    pytest.importorskip("nccl.core")
    from cuda.core import Device

    from cudattn.distributed import ring_attention, shard_sequence

    rng = np.random.default_rng(5100 + world)
    cases = [(True, 2 * world * 64, None), (True, 2 * world * 160, None), (False, world * 200, None),
             (True, 2 * world * 160, (150, 0)), (True, 2 * world * 160, None)]
    data = [(causal, win, [shard_sequence(x, world, zigzag=causal) for x in _case(rng, 2, S, 8, 2, 128)])
            for causal, S, win in cases]

    def rank(r, comm):
        dev = Device(r)
        dev.set_current()  # cuda.core's rule: a thread makes a device current before it makes streams on it
        streams = [dev.create_stream() for _ in range(2)]
        outs = []
        for i, (causal, win, shards) in enumerate(data):
            qd, kd, vd = (cudattn.to_device(s[r], device=r) for s in shards)
            st = streams[i % 2]
            outs.append({t: ring_attention(qd, kd, vd, comm, causal=causal, window_size=win, transport=t, stream=st)
                         for t in ("copy", "nccl", "auto")})
        return [{t: cudattn.to_host(o) for t, o in by.items()} for by in outs]  # the first host sync

    outs, errors = _ranks(world, rank)
    assert not errors, errors
    for r, per_case in enumerate(outs):
        for i, by in enumerate(per_case):
            assert np.isfinite(by["nccl"].astype(np.float32)).all(), (r, i)
            for t in ("copy", "auto"):
                assert np.array_equal(by[t].view(np.uint16), by["nccl"].view(np.uint16)), (r, i, t)


@pytest.mark.parametrize("world", [2, 4])
def test_launcher_ring_by_copy_engine_in_processes(world):
    """transport="copy" across processes (CUDA IPC), through the launcher: the rows match the reference."""
    _need(world)
    pytest.importorskip("nccl.core")
    from cudattn.distributed import scaling

    case = {"B": 1, "H": 8, "Hkv": 2, "S": 2 * world * 256, "D": 128, "dtype": "bfloat16", "causal": True,
            "seed": 5, "transport": "copy"}
    row = scaling.measure(case, world, 3, want_output=True, timeout=300)
    ok, err, bound = scaling.check_rows(case, world, row["out"])
    assert ok, f"off by {err:.3g} > {bound:.3g}"
