"""`cudattn bench` without a GPU: grids, accounting, the correctness check it reports, the
as-called and host-overhead timing (on fake launches), the command line. Its outputs are in
test_bench_report.py, real rows on the GPU in test_bench_gpu.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import numpy as np
import pytest

from cudattn.bench import ascalled, check, grids, inputs, overhead, timing


def test_every_peer_prefill_shape_is_in_the_prefill_grid():
    shapes = {(c.B, c.Hq, c.Sq, c.D) for c in grids.named_grid("prefill")}
    assert set(grids._PEER_PREFILL) <= shapes
    # one point per (D, S) so each curve is a function of S
    points = [(d, s) for (_, _, s, d) in grids.prefill_shapes()]
    assert len(points) == len(set(points)) == 18


def test_grids_cover_dtypes_and_causal():
    allc = grids.named_grid("all")
    pre = [c for c in allc if c.kind == "prefill"]
    dec = [c for c in allc if c.kind == "decode"]
    assert {c.dtype for c in pre} == {"float16", "bfloat16"} and {c.causal for c in pre} == {False, True}
    assert len(dec) == 12 and all(c.Sq == 1 and not c.causal and c.dtype == "float16" for c in dec)
    assert sorted({c.page_size for c in dec}) == [0, 16, 256]  # contiguous, and paged at two page sizes
    assert {c.dtype for c in grids.named_grid("prefill", ["bfloat16"], (True,))} == {"bfloat16"}
    with pytest.raises(ValueError, match="unknown grid"):
        grids.named_grid("huge")


@pytest.mark.parametrize("text,expect", [("2,4,128,64", (2, 4, 4, 128, 128, 64)),
                                         ("1x32x8x1x4096x128", (1, 32, 8, 1, 4096, 128))])
def test_parse_shape(text, expect):
    assert grids.parse_shape(text) == expect


@pytest.mark.parametrize("bad", ["1,2,3", "a,b,c,d", "1,0,4,64", ""])
def test_parse_shape_rejects(bad):
    with pytest.raises(ValueError, match="--shape"):
        grids.parse_shape(bad)


def test_flops_and_bytes():
    c = grids.Case("float16", 2, 4, 4, 8, 8, 16, False)
    assert c.flops == 4 * 2 * 4 * 8 * 8 * 16
    assert grids.Case("float16", 2, 4, 4, 8, 8, 16, True).flops == c.flops / 2  # the peers' convention
    # bottom-right causal, Sq < Sk: row i sees i + Sk - Sq + 1 keys
    cc = grids.Case("float16", 1, 1, 1, 2, 5, 8, True)
    assert cc.visible_pairs == 4 + 5
    dec = grids.Case("float16", 3, 8, 2, 1, 100, 64, False)
    assert dec.kind == "decode" and dec.bytes == 2 * 64 * 3 * (2 * 1 * 8 + 2 * 100 * 2)


def test_set_count_exceeds_l2():
    small = grids.Case("float16", 1, 1, 1, 128, 128, 64, False)
    assert inputs.set_count(small, 50 << 20) == inputs.MAX_SETS
    big = grids.Case("float16", 4, 16, 16, 4096, 4096, 128, False)
    n = inputs.set_count(big, 50 << 20)
    assert n >= 2 and n * big.bytes >= 2 * big.bytes


def test_percentile_matches_numpy():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 7.0]
    for q in (0, 50, 90, 100):
        assert timing.percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_sample_rows_cover_both_ends():
    rng = np.random.default_rng(0)
    rows = check.sample_rows(1000, rng)
    assert rows.size == check.MAX_ROWS and len(set(rows)) == rows.size
    assert {0, 15, 984, 999} <= set(rows.tolist())
    assert check.sample_rows(10, rng).tolist() == list(range(10))


def test_check_output_catches_one_wrong_element():
    """The bench's check must be able to fail: one element off in a sampled head and row."""
    case = grids.Case("bfloat16", 3, 4, 2, 90, 130, 32, True)
    rng = np.random.default_rng(1)
    q, k, v = inputs.host_inputs(case, rng)
    from cudattn import reference

    good = reference.attention(q, k, v, causal=True).astype(q.dtype)
    assert check.check_output(case, q, k, v, good, rng)["ok"]
    bad = good.copy()
    bad[2, 89, 3, 5] += 0.5  # last batch, last row (always sampled), last head
    res = check.check_output(case, q, k, v, bad, rng)
    assert not res["ok"] and res["max_err"] > res["bound"]
    nan = good.copy()
    nan[0, 0, 0, 0] = np.nan
    assert not check.check_output(case, q, k, v, nan, rng)["ok"]


class _FakeLaunch:
    """Stands in for cudattn._runtime.launch: logs syncs and event records; each event pair measures 2 ms."""

    def __init__(self, log):
        self.log = log
        self.made = []  # the streams events were made for
        launch = self

        class Event:
            def __init__(self, stream_handle=None):  # made in the stream's context
                launch.made.append(stream_handle)

            def record(self, h):
                launch.log.append(("record", h))
                return self

        self.Event = Event

    def synchronize(self, h):
        self.log.append(("sync", h))

    def elapsed_ms(self, start, end):
        return 2.0


def test_as_called_single_drains_the_stream_before_each_sample(monkeypatch):
    log = []
    fake = _FakeLaunch(log)
    monkeypatch.setattr(ascalled, "_launch", fake)
    t = ascalled.single(lambda i: log.append(("call", i)), 7, iters=3, warmup=2)
    assert t.median_ms == 2.0 and t.samples == 3 and fake.made == [7, 7]  # events of the stream's context
    warm, timed = log[:2], log[2:]
    assert warm == [("call", -1), ("call", -2)]  # warm-ups on the sets before the first timed one
    assert timed == [("sync", 7), ("record", 7), ("call", 0), ("record", 7)] + \
        [("sync", 7), ("record", 7), ("call", 1), ("record", 7)] + [("sync", 7), ("record", 7), ("call", 2), ("record", 7)]


def test_as_called_back_to_back_is_per_call_with_no_sync_inside(monkeypatch):
    log = []
    fake = _FakeLaunch(log)
    monkeypatch.setattr(ascalled, "_launch", fake)
    ms = ascalled.back_to_back(lambda i: log.append(("call", i)), 3, batch=4, repeats=2, warmup=0)
    assert ms == 2.0 / 4 and fake.made == [3, 3]
    one = [("sync", 3), ("record", 3)] + [("call", i) for i in range(4)] + [("record", 3)]
    assert log == one + one
    monkeypatch.setattr(ascalled, "spin", lambda h, ms, dev: None)
    fields = ascalled.measure(lambda i: None, 3, iters=5, warmup=0, tag="_torch")
    assert set(fields) == {"as_called_torch_ms", "as_called_torch_p90_ms", "back_to_back_torch_ms"}


def test_as_called_interleaved_takes_turns_inside_each_scope(monkeypatch):
    """Calls compared on one row are timed in turns, a share of the samples each round, in a balanced
    order (`timing.turn_order`), every turn inside the entry's own scope after a settling spin: a
    drift over the row, or the load of the turn before, falls on all of them alike."""
    log = []
    monkeypatch.setattr(ascalled, "_launch", _FakeLaunch(log))
    monkeypatch.setattr(ascalled, "spin", lambda h, ms, dev: log.append(("spin", h, ms, dev)))

    @contextlib.contextmanager
    def scope(name):
        log.append(("enter", name))
        yield
        log.append(("exit", name))

    entries = [(lambda i, n=n: log.append(("call", n)), lambda n=n: scope(n)) for n in ("a", "b")]
    figs = ascalled.interleaved(entries, 5, iters=6, warmup=0, tags=["", "_torch"], device_id=2)
    turns = [e[1] for e in log if e[0] == "enter"]
    assert turns == ["a", "b", "b", "a", "b", "a", "a", "b"]
    for i, e in enumerate(log):  # each turn starts once a spin has settled the clocks
        if e[0] == "enter":
            assert log[i + 1:i + 3] == [("spin", 5, ascalled.SETTLE_MS, 2), ("sync", 5)]
    inside = []
    for e in log:  # every call inside its own entry's scope
        if e[0] == "enter":
            inside.append(e[1])
        elif e[0] == "exit":
            inside.pop()
        elif e[0] == "call":
            assert inside == [e[1]]
    calls_a = sum(1 for e in log if e == ("call", "a"))
    # 6 samples over 4 rounds, a batch a round, and one call to warm each later turn
    assert timing.rounds_for(2) == 4 and calls_a == 6 + 4 * ascalled.BATCH + 3
    assert set(figs[0]) == {"as_called_ms", "as_called_p90_ms", "back_to_back_ms"}
    assert set(figs[1]) == {"as_called_torch_ms", "as_called_torch_p90_ms", "back_to_back_torch_ms"}


def test_as_called_interleaved_drops_a_refusing_peer_and_raises_for_others(monkeypatch):
    log = []
    monkeypatch.setattr(ascalled, "_launch", _FakeLaunch(log))
    monkeypatch.setattr(ascalled, "spin", lambda h, ms, dev: None)

    def refuse(i):
        raise RuntimeError("No available kernel.\nmore")

    ok = (lambda i: None, contextlib.nullcontext)
    figs = ascalled.interleaved([ok, (refuse, contextlib.nullcontext)], 5, iters=3, warmup=0, refusable=[False, True])
    assert figs[1] == {"as_called_error": "No available kernel."} and "as_called_ms" in figs[0]
    with pytest.raises(RuntimeError, match="No available kernel"):
        ascalled.interleaved([ok, (refuse, contextlib.nullcontext)], 5, iters=3, warmup=0)


def test_turn_order_puts_every_entry_in_every_place_and_after_every_other_alike():
    for n in (1, 2, 3, 4, 5, 6):
        rounds = timing.rounds_for(n)
        orders = [timing.turn_order(n, r) for r in range(rounds)]
        assert all(sorted(o) == list(range(n)) for o in orders) and rounds >= timing.ROUNDS
        for place in range(n):  # each entry first, second, ... equally often
            column = [o[place] for o in orders]
            assert all(column.count(j) == rounds // n for j in range(n))
        # within rounds, every entry follows every other entry equally often (twice over 2n rounds):
        # the load of the call before falls on all alike
        after = [(o[k - 1], o[k]) for o in orders for k in range(1, n)]
        assert all(after.count((a, b)) == 2 for a in range(n) for b in range(n) if a != b)


def test_gpu_times_take_turns_behind_a_spin_and_keep_a_refusal(monkeypatch):
    """GPU times of a row's calls are taken in turns, each turn behind its own spin kernel, in the
    entry's scope; warm-up calls only before an entry's first turn; the samples' indices run on
    across turns (each call reads the next input set); a refusing peer keeps its first line."""
    log = []
    monkeypatch.setattr(timing, "_launch", _FakeLaunch(log))
    monkeypatch.setattr(timing, "spin", lambda h, ms, dev: log.append(("spin", h)))
    monkeypatch.setattr(timing._device, "get_device", lambda d: None)

    @contextlib.contextmanager
    def scope(name):
        log.append(("enter", name))
        yield

    def call(name):
        return lambda i: log.append(("call", name, i))

    def refuse(i):
        raise RuntimeError("No available kernel.\nmore")

    entries = [(call("a"), lambda: scope("a")), (call("b"), lambda: scope("b")), (refuse, lambda: scope("c"))]
    figs = timing.gpu_times(entries, 5, 0, iters=7, warmup=1, refusable=[False, False, True])
    # rounds [a b c] [b c a] [c a b] [c b a] [a c b] [b a c], c refused in its first turn
    assert [e[1] for e in log if e[0] == "enter"] == ["a", "b", "c", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    # a warm-up on the set before the first sample's, then 7 samples
    assert [e[2] for e in log if e[:2] == ("call", "a")] == [-1, 0, 1, 2, 3, 4, 5, 6]
    assert figs[0].samples == 7 and figs[0].median_ms == 2.0 and figs[2] == "No available kernel."
    assert [timing.share(7, 6, r) for r in range(6)] == [2, 1, 1, 1, 1, 1] and timing.share(2, 3, 2) == 1
    # fewer samples than rounds: a round a sample, so that an entry gets exactly the samples asked
    assert timing.rounds_for(3, iters=2) == 2 and timing.rounds_for(3) == 6
    figs = timing.gpu_times(entries[:2], 5, 0, iters=2, warmup=0)
    assert [f.samples for f in figs] == [2, 2]
    with pytest.raises(RuntimeError, match="No available kernel"):
        timing.gpu_times(entries, 5, 0, iters=3, warmup=0)


class _FakeGpu:
    """A fake clock and stream for overhead.host_us: calls cost ``cost_ns`` of host time; a call that
    waits for the GPU (``waits``) first sits out what is left of the spin."""

    def __init__(self, monkeypatch, cost_ns=5_000, waits=lambda n: False):
        self.clock, self.spin_ns, self.since_spin, self.spins = 0, 0, 0, []
        self.cost_ns, self.waits = cost_ns, waits
        monkeypatch.setattr(overhead.time, "perf_counter_ns", lambda: self.clock)
        monkeypatch.setattr(overhead.timing, "spin", self.spin)
        monkeypatch.setattr(overhead._launch, "synchronize", lambda h: None)

    def spin(self, h, ms, dev):
        self.spins.append(ms)
        self.spin_ns, self.since_spin, self.start = ms * 1e6, 0, self.clock

    def call(self):
        self.since_spin += 1
        if self.spin_ns and self.waits(self.since_spin):
            self.clock = max(self.clock, self.start + self.spin_ns)
        self.clock += self.cost_ns


def test_overhead_host_us_spins_then_times_the_batch(monkeypatch):
    """Per-call host time = batch wall time / calls, each batch queued behind a spin of calls x 100 us."""
    gpu = _FakeGpu(monkeypatch)
    res = overhead.host_us(gpu.call, 9, 0, calls=50, repeats=3)
    assert res["host_us"] == 5.0 and not res["outlasted_spin"] and res["calls"] == 50
    assert gpu.spins == [50 * overhead.SPIN_US_PER_CALL / 1e3] * 3


def test_overhead_host_us_sizes_the_spin_for_a_slow_host(monkeypatch):
    """A host slower than SPIN_US_PER_CALL per call is host time, not a wait: the spin grows to fit it."""
    gpu = _FakeGpu(monkeypatch, cost_ns=400_000)
    res = overhead.host_us(gpu.call, 9, 0, calls=50, repeats=3)
    assert res["host_us"] == 400.0 and not res["outlasted_spin"] and res["calls"] == 50
    assert res["spin_us_per_call"] == 1200.0


def test_overhead_host_us_retries_a_full_queue_and_flags_a_sync(monkeypatch):
    # the launch queue full after 60 calls: batches of 100 wait for the spin, batches of 50 do not
    gpu = _FakeGpu(monkeypatch, waits=lambda n: n == 61)
    res = overhead.host_us(gpu.call, 9, 0, calls=100, repeats=3)
    assert res["calls"] == 50 and res["host_us"] == 5.0 and not res["outlasted_spin"]
    # a sync in the call: every batch waits for its spin, down to MIN_CALLS, and is flagged
    gpu = _FakeGpu(monkeypatch, waits=lambda n: True)
    res = overhead.host_us(gpu.call, 9, 0, calls=4 * overhead.MIN_CALLS, repeats=3)
    assert res["outlasted_spin"] and res["calls"] == overhead.MIN_CALLS and res["host_us"] > overhead.SPIN_US_PER_CALL
    assert [round(ms * 1e3 / overhead.SPIN_US_PER_CALL) for ms in gpu.spins] == [100] * 3 + [50] * 3 + [25] * 3


def test_overhead_grid_has_no_kernel_rows():
    assert "overhead" in grids.GRIDS and grids.named_grid("overhead") == []
    assert "overhead" not in {c.kind for c in grids.named_grid("all")}  # all stays prefill + decode
    p, d = grids.OVERHEAD_PREFILL, grids.OVERHEAD_DECODE
    assert (p.B, p.Hq, p.Sq, p.D, p.kind) == (1, 8, 512, 64, "prefill")
    assert d.kind == "decode" and len(grids.OVERHEAD_SEQLENS) == d.B and max(grids.OVERHEAD_SEQLENS) <= d.Sk


def test_cli_accepts_grid_overhead():
    import argparse

    from cudattn.bench import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(["--grid", "overhead", "--iters", "5"])
    assert args.grid == "overhead" and args.iters == 5 and cli._cases(args) == []
    with pytest.raises(SystemExit):
        p.parse_args(["--grid", "overheads"])


def test_bench_without_gpu_says_so():
    from conftest import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    res = subprocess.run([sys.executable, "-m", "cudattn", "bench", "--grid", "quick"], capture_output=True, text=True)
    assert res.returncode == 2 and "no CUDA GPU" in res.stderr


def test_overhead_pre_launch_us_stamps_each_calls_first_launch(monkeypatch):
    """Host time to the first cuLaunchKernel of a call (a fake clock: 7 µs before it, 3 between two
    launches, 20 after): 7 µs, two launches a call, and the real launch function put back."""
    clock = {"ns": 0}
    launched = []
    monkeypatch.setattr(overhead.time, "perf_counter_ns", lambda: clock["ns"])
    monkeypatch.setattr(overhead._launch, "synchronize", lambda h: None)
    real = lambda *a: launched.append(a) or (0,)  # noqa: E731
    monkeypatch.setattr(overhead._launch, "_cuLaunchKernel", real)

    def call():
        clock["ns"] += 7_000
        overhead._launch._cuLaunchKernel("k1")
        clock["ns"] += 3_000
        overhead._launch._cuLaunchKernel("k2")
        clock["ns"] += 20_000

    res = overhead.pre_launch_us(call, 9, calls=10, repeats=3)
    assert res["pre_launch_us"] == 7.0 and res["launches_per_call"] == 2.0
    assert len(launched) == 60 and overhead._launch._cuLaunchKernel is real
    with pytest.raises(RuntimeError, match="launched no kernel"):
        overhead.pre_launch_us(lambda: None, 9, calls=2, repeats=1)
    assert overhead._launch._cuLaunchKernel is real


def test_overhead_pre_launch_profiled_pairs_each_marker_with_the_next_launch(monkeypatch):
    """The profiler's view (a fake torch.profiler whose events are what the calls recorded): marker end
    to the first launch after it, per call; a call with no launch before the next marker is left out."""
    import sys
    import types

    clock = {"us": 0.0}
    events = []

    def event(name, dur):
        events.append(types.SimpleNamespace(name=name, time_range=types.SimpleNamespace(
            start=clock["us"], end=clock["us"] + dur)))
        clock["us"] += dur

    class Profile:
        def __init__(self, activities):
            assert activities == ["CUDA"]

        def __enter__(self):
            events.clear()
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return list(events)

    fake_profiler = types.SimpleNamespace(ProfilerActivity=types.SimpleNamespace(CUDA="CUDA"), profile=Profile)
    monkeypatch.setitem(sys.modules, "torch.profiler", fake_profiler)
    stream = types.SimpleNamespace(query=lambda: event("cudaStreamQuery", 1.0))
    torch_mod = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=lambda: stream,
                                                                 synchronize=lambda: event("cudaDeviceSynchronize", 1.0)))
    n = {"calls": 0}

    def call():  # 6 us of host work, a launch, 2 us, a second launch; every 4th call launches nothing
        n["calls"] += 1
        clock["us"] += 6.0
        if n["calls"] % 4:
            event("cuLaunchKernel", 3.0)
            clock["us"] += 2.0
            event("cudaLaunchKernel", 3.0)

    res = overhead.pre_launch_profiled_us(call, torch_mod, calls=20)
    assert res == {"pre_launch_profiled_us": 6.0, "profiled_calls": 15}
    n["calls"] = 0
    assert overhead.pre_launch_profiled_us(lambda: None, torch_mod, calls=20) == {}  # no launches seen


def test_overhead_profiler_figures_come_after_every_other_figure(monkeypatch):
    """Once torch's profiler has run, CUPTI stays attached and every later driver call pays for it:
    `_measure` defers the profiled figure, and `_profile` adds it to each row after all rows' host,
    pre-launch and as-called figures were taken."""
    log = []
    monkeypatch.setattr(overhead, "WARM_CALLS", 0)
    monkeypatch.setattr(overhead.driver, "cuCtxSynchronize", lambda: (0,))
    monkeypatch.setattr(overhead, "host_us", lambda fn, h, d: log.append(("host", fn)) or {"host_us": 1.0})
    monkeypatch.setattr(overhead, "pre_launch_us", lambda fn, h: log.append(("pre", fn)) or {"pre_launch_us": 0.5})
    monkeypatch.setattr(overhead.ascalled, "single",
                        lambda f, h, iters, warmup: log.append(("called", None)) or type("R", (), {"median_ms": 0.01}))
    monkeypatch.setattr(overhead, "pre_launch_profiled_us",
                        lambda fn, torch_mod: log.append(("profiled", fn)) or {"pre_launch_profiled_us": 9.0})
    rows, profiled = [{}, {}], []
    for i, row in enumerate(rows):
        overhead._measure(i, 0, 0, 5, row, ours=i == 0, torch_mod=object(), profiled=profiled)
    assert [k for k, _ in log] == ["host", "pre", "called", "host", "called"]
    assert all("pre_launch_profiled_us" not in r for r in rows)
    overhead._profile(profiled)
    assert log[-2:] == [("profiled", 0), ("profiled", 1)]
    assert rows[0] == {"host_us": 1.0, "pre_launch_us": 0.5, "as_called_us": 10.0, "pre_launch_profiled_us": 9.0}
    assert rows[1]["pre_launch_profiled_us"] == 9.0 and "pre_launch_us" not in rows[1]
