"""`cudattn bench`: grids, accounting, the correctness check it reports, its outputs; on the GPU, real rows."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cudattn.bench import ascalled, check, grids, inputs, overhead, report, timing


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


def _fake_report(with_peers=True):
    """A report with made-up numbers, to test formatting only (no claim about speed)."""
    rows = []
    for case in grids.named_grid("quick"):
        ms = 1.0
        row = {"case": case.as_dict(), "label": case.label(), "sets": 2,
               "impls": {"cudattn": {"median_ms": ms, "p90_ms": 1.1, "samples": 3, "pct_of_ceiling": 40.0,
                                     "as_called_ms": 1.25, "back_to_back_ms": 1.05,
                                     **({"as_called_torch_ms": 1.5} if with_peers else {}),
                                     **({"tbps": case.bytes / ms / 1e9} if case.kind == "decode"
                                        else {"tflops": case.flops / ms / 1e9})}},
               "ratio": {}, "ratio_as_called": {}, "ratio_back_to_back": {},
               "check": {"ok": True, "max_err": 1e-3, "bound": 2e-3}}
        if with_peers:
            for b, pms in (("cudnn", 0.5), ("flash", 2.0)):
                row["impls"][b] = {"median_ms": pms, "p90_ms": pms, "samples": 3, "as_called_ms": 5 * pms,
                                   "back_to_back_ms": 2 * pms,
                                   **({"tbps": case.bytes / pms / 1e9} if case.kind == "decode"
                                      else {"tflops": case.flops / pms / 1e9})}
                row["ratio"][b] = pms / ms
                row["ratio_as_called"][b] = 5 * pms / 1.25
                row["ratio_back_to_back"][b] = 2 * pms / 1.05
        rows.append(row)
    env = {"date": "2026-01-01T00:00:00+00:00", "gpu": "Test GPU", "sm_count": 1, "arch": "sm_90a",
           "driver_cuda": "13.0", "nvrtc": "13.0", "cudattn": "0", "git_commit": "abc",
           "peers": {"torch": "2", "cudnn": 9, "cuda": "13"} if with_peers else None}
    return {"command": "python -m cudattn bench --grid quick", "environment": env, "iters": 3, "rows": rows,
            "ceilings": {"copy_tbps": 4.0, "gemm_bf16_tflops": 800.0}, "host_rows": []}


def test_report_text_markdown_and_ratios():
    rep = _fake_report()
    lines = [report.row_line(r, True) for r in rep["rows"]]
    assert all("0.50x" in ln and "2.00x" in ln and "ok" in ln for ln in lines)
    md = report.markdown(rep, rep["command"], "plot.png")
    assert "python -m cudattn bench --grid quick" in md and "![" in md
    assert "| vs cuDNN |" in md and "| vs flash |" in md
    assert "Geometric mean of cudattn/peer: cuDNN 0.50x, flash 2.00x" in md
    assert "0 failing" in report.summary(rep)
    nopeer = _fake_report(with_peers=False)
    assert "cuDNN" not in report.markdown(nopeer, "x").split("## ")[1]


def test_report_as_called_beside_gpu_time():
    rep = _fake_report()
    # text line: GPU ms, as-called and back-to-back ms, then per peer the GPU-time and as-called ratios
    line = report.row_line(rep["rows"][0], True)
    assert "1.250" in line and "1.050" in line and "0.50x  2.00x" in line and "2.00x  8.00x" in line
    md = report.markdown(rep, rep["command"])
    assert "### Prefill as called (ms: GPU / as called / back to back)" in md
    assert "### Decode as called" in md
    # cudattn and each peer: GPU / as called / back to back; ratios in the same order
    assert "| 1.000 / 1.250 / 1.050 | 1.500 | 0.500 / 2.500 / 1.000 | 0.50x / 2.00x / 0.95x |" in md
    assert "Geometric mean of cudattn/peer, as called: cuDNN 2.00x, flash 8.00x" in md
    assert "geometric mean of cudattn/peer speed, back to back: cuDNN 0.95x" in report.summary(rep)
    nopeer = report.markdown(_fake_report(with_peers=False), "x")
    assert "| dtype | shape | causal | cudattn |\n" in nopeer and "torch tensors" not in nopeer


def test_as_called_report_tolerates_rows_without_it():
    """JSON from before the as-called timings still formats (no as-called table, '-' in the text line)."""
    rep = _fake_report()
    for r in rep["rows"]:
        for impl in r["impls"].values():
            for k in ("as_called_ms", "back_to_back_ms", "as_called_torch_ms"):
                impl.pop(k, None)
        del r["ratio_as_called"], r["ratio_back_to_back"]
    assert "as called (ms" not in report.markdown(rep, "x")
    assert " - " in report.row_line(rep["rows"][0], True)


class _FakeLaunch:
    """Stands in for cudattn._runtime.launch: logs syncs and event records; each event pair measures 2 ms."""

    def __init__(self, log):
        self.log = log
        launch = self

        class Event:
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
    monkeypatch.setattr(ascalled, "_launch", _FakeLaunch(log))
    t = ascalled.single(lambda i: log.append(("call", i)), 7, iters=3, warmup=2)
    assert t.median_ms == 2.0 and t.samples == 3
    warm, timed = log[:2], log[2:]
    assert warm == [("call", 0), ("call", 1)]
    assert timed == [("sync", 7), ("record", 7), ("call", 0), ("record", 7)] + \
        [("sync", 7), ("record", 7), ("call", 1), ("record", 7)] + [("sync", 7), ("record", 7), ("call", 2), ("record", 7)]


def test_as_called_back_to_back_is_per_call_with_no_sync_inside(monkeypatch):
    log = []
    monkeypatch.setattr(ascalled, "_launch", _FakeLaunch(log))
    ms = ascalled.back_to_back(lambda i: log.append(("call", i)), 3, batch=4, repeats=2, warmup=0)
    assert ms == 2.0 / 4
    one = [("sync", 3), ("record", 3)] + [("call", i) for i in range(4)] + [("record", 3)]
    assert log == one + one
    fields = ascalled.measure(lambda i: None, 3, iters=5, warmup=0, tag="_torch")
    assert set(fields) == {"as_called_torch_ms", "as_called_torch_p90_ms", "back_to_back_torch_ms"}


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


def _overhead_rows():
    """Made-up overhead rows: torch SDPA, cudattn on DeviceArrays (with and without out=), torch with a
    batch that outlasted its spin, CuPy skipped, decode with out= skipped."""
    def m(host, called, **kw):
        return {"host_us": host, "host_p90_us": host + 1, "as_called_us": called, "outlasted_spin": False,
                "calls": 200, "repeats": 7, "launch_stream": "cudattn's stream", **kw}

    rows = []
    for problem, case in (("prefill", grids.OVERHEAD_PREFILL), ("decode", grids.OVERHEAD_DECODE)):
        head = {"problem": problem, "function": overhead.row_function(problem), "label": case.label(),
                "case": case.as_dict()}
        rows += [{**head, "impl": "torch_sdpa", "operands": "torch", "stream": "omitted", "out": False,
                  **m(21.5, 40.0, launch_stream="torch's current stream")},
                 {**head, "impl": "cudattn", "operands": "cudattn", "stream": "omitted", "out": False, **m(11.25, 30.0)},
                 {**head, "impl": "cudattn", "operands": "cudattn", "stream": "omitted", "out": True,
                  **(m(9.5, 28.0) if problem == "prefill" else {"skipped": "no out= in this cudattn"})},
                 {**head, "impl": "cudattn", "operands": "torch", "stream": "omitted", "out": False,
                  **m(150.0, 35.0, outlasted_spin=True)},
                 {**head, "impl": "cudattn", "operands": "cupy", "stream": "omitted", "out": False,
                  "skipped": "cupy not installed"}]
    return rows


def test_overhead_markdown_and_lines():
    rows = _overhead_rows()
    md = report.overhead_markdown(rows)
    text = "\n".join(md)
    assert md[0] == "## Host time per call (µs)" and "torch SDPA host µs" in text
    lines = [ln for ln in md if ln.startswith("| prefill") or ln.startswith("| decode")]
    assert len(lines) == 6  # per problem: DeviceArray, torch, cupy (out= beside, on the same line)
    assert "| prefill 1x8x512x64 | cudattn DeviceArray | omitted | cudattn's stream | 11.2 | 9.5 | 30.0 | 28.0 | " \
           "21.5 | 40.0 |" in text
    assert "150.0*" in text and "skipped: cupy not installed" in text
    assert "| decode 4x8x1/1024x128 | cudattn DeviceArray | omitted | cudattn's stream | 11.2 | " \
           "skipped: no out= in this cudattn | 30.0 | - |" in text
    assert "host    11.2" not in text
    assert report.overhead_line(rows[1]).split("|")[1].split()[0] == "11.2"
    assert "outlasted" in report.overhead_line(rows[3]) and "skipped: cupy" in report.overhead_line(rows[4])


def test_report_with_only_overhead_rows():
    """--grid overhead: no kernel rows, no ceilings; the Markdown and summary are about host time."""
    rep = _fake_report()
    rep.update(rows=[], ceilings={}, overhead_rows=_overhead_rows())
    md = report.markdown(rep, "python -m cudattn bench --grid overhead")
    assert md.startswith("# Host overhead\n") and "## Host time per call (µs)" in md
    assert "## Prefill" not in md and "ceilings" not in md
    s = report.summary(rep)
    assert "0 rows" not in s
    assert "overhead, prefill: cudattn (DeviceArray) 11.2 µs per call on the host, torch SDPA 21.5 µs" in s
    assert report.ceilings_text({}) == "not measured (no kernel rows)"


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from cudattn.bench import plot

    out = tmp_path / "p.png"
    plot.plot(_fake_report(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_bench_without_gpu_says_so():
    from conftest import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    res = subprocess.run([sys.executable, "-m", "cudattn", "bench", "--grid", "quick"], capture_output=True, text=True)
    assert res.returncode == 2 and "no CUDA GPU" in res.stderr


# ---------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", [grids.Case("bfloat16", 2, 4, 2, 203, 203, 64, True),
                                  grids.Case("float16", 3, 8, 1, 1, 1023, 128, False)])
def test_run_case_on_gpu(case):
    from cudattn.bench import runner

    s = runner.Session(peers=None, iters=5, warmup=1)
    s.ceilings = {"copy_tbps": 1.0, "gemm_bf16_tflops": None}
    row = runner.run_case(case, s)
    assert row["check"]["ok"], row["check"]
    ours = row["impls"]["cudattn"]
    assert 0 < ours["median_ms"] <= ours["p90_ms"] and ours["samples"] == 5
    assert ("tbps" if case.kind == "decode" else "tflops") in ours


@pytest.mark.gpu
def test_bench_cli_end_to_end(tmp_path):
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    cmd = [sys.executable, "-m", "cudattn", "bench", "--shape", "2,4,300,64", "--shape", "2,8,2,1,777,128",
           "--dtype", "float16", "--iters", "5", "--host", "--json", str(js), "--markdown", str(md)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(js.read_text())
    assert len(rep["rows"]) == 3 and len(rep["host_rows"]) == 6  # each case with pageable and pinned arrays
    assert [r["memory"] for r in rep["host_rows"]] == ["pageable", "pinned"] * 3
    assert all(r["check"]["ok"] for r in rep["rows"] + rep["host_rows"])
    assert rep["ceilings"]["copy_tbps"] > 0 and rep["ceilings"]["h2d_gbps"] > 0
    assert rep["environment"]["sm_count"] > 0 and rep["environment"]["gpu"]
    text = md.read_text()
    assert text.startswith("# Prefill and decode performance\n"), text[:200]
    assert f"Measured on {rep['environment']['gpu']}" in text
    # as called, beside GPU time: cudattn's, and with torch tensors and each peer's where torch runs
    peers = rep["environment"]["peers"]
    for r in rep["rows"]:
        ours = r["impls"]["cudattn"]
        assert ours["as_called_ms"] > 0 and ours["back_to_back_ms"] > 0 and ours["as_called_p90_ms"] >= ours["as_called_ms"]
        if peers:
            assert ours["as_called_torch_ms"] > 0 and ours["back_to_back_torch_ms"] > 0
            for b in ("cudnn", "flash"):
                if "error" not in r["impls"][b]:
                    assert r["impls"][b]["as_called_ms"] > 0 and r["impls"][b]["back_to_back_ms"] > 0
                    assert r["ratio_as_called"][b] > 0 and r["ratio_back_to_back"][b] > 0
    assert "### Prefill as called (ms: GPU / as called / back to back)" in text
    assert "### Decode as called" in text


@pytest.mark.gpu
def test_bench_overhead_grid_end_to_end(tmp_path):
    """--grid overhead alone: no kernel rows; host µs per call for each operand kind that imports, beside
    torch SDPA's where torch runs; kinds that cannot run are skipped with a reason, not failed."""
    js, md = tmp_path / "o.json", tmp_path / "o.md"
    cmd = [sys.executable, "-m", "cudattn", "bench", "--grid", "overhead", "--iters", "5", "--json", str(js),
           "--markdown", str(md)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(js.read_text())
    assert rep["rows"] == [] and rep["overhead_rows"]
    rows = rep["overhead_rows"]
    assert {r["problem"] for r in rows} == {"prefill", "decode"}
    for r in rows:  # measured, or skipped with a reason, or failed with one: exactly one of these
        assert sum(k in r for k in ("host_us", "skipped", "error")) == 1, r
        if "host_us" in r:
            assert r["host_us"] > 0 and r["as_called_us"] > 0 and r["launch_stream"], r
        else:
            assert (r.get("skipped") or r.get("error")).strip(), r
    ours = [r for r in rows if r["impl"] == "cudattn" and r["operands"] == "cudattn" and not r["out"]]
    assert len(ours) == 2 and all("host_us" in r for r in ours)
    assert all("error" not in r for r in rows if r["operands"] in ("cudattn", "torch")), rows
    if rep["environment"]["peers"]:
        sdpa = [r for r in rows if r["impl"] == "torch_sdpa"]
        assert len(sdpa) == 2 and all(r["host_us"] > 0 for r in sdpa)
        assert all("host_us" in r for r in rows if r["operands"] == "torch" and not r["out"])
    text = md.read_text()
    assert text.startswith("# Host overhead\n") and "## Host time per call (µs)" in text
    assert "## Prefill" not in text
    assert "overhead, prefill: cudattn (DeviceArray)" in res.stdout


def test_git_commit_marks_a_tree_that_differs_from_head(tmp_path, monkeypatch):
    """Numbers measured on a modified checkout must not pass for HEAD's."""
    import shutil

    from cudattn.bench import manifest

    if shutil.which("git") is None:
        pytest.skip("no git")
    monkeypatch.delenv("CUDATTN_GIT_COMMIT", raising=False)
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    run("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    run("add", "f.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert manifest.git_commit(tmp_path) == head
    (tmp_path / "g.txt").write_text("untracked files do not count")
    assert manifest.git_commit(tmp_path) == head
    (tmp_path / "f.txt").write_text("b")
    assert manifest.git_commit(tmp_path) == head + "-dirty"
    monkeypatch.setenv("CUDATTN_GIT_COMMIT", "given")
    assert manifest.git_commit(tmp_path) == "given"
