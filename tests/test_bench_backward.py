"""`cudattn bench --grid backward` without a GPU: the grid, its FLOP accounting, the command line,
the gradient check it reports, and one case run end to end on fakes (NumPy stands in for the device
calls and for torch), through to the text, Markdown and JSON report. Real rows on the GPU are in
test_bench_gpu.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import numpy as np
import pytest

from cudattn import reference
from cudattn.bench import backward, check_backward, cli, grids, inputs, report, runner
from cudattn.bench.timing import Timing

# ---------------------------------------------------------------------- the grid and its FLOPs


def test_backward_grid_cases():
    cases = grids.named_grid("backward")
    shapes = {(c.B, c.Hq, c.Hkv, c.Sq, c.D) for c in cases}
    assert shapes == {(4, 16, 16, 4096, 64), (2, 16, 16, 8192, 64), (4, 16, 16, 4096, 128), (2, 16, 16, 8192, 128),
                      (1, 16, 16, 16384, 128), (1, 64, 8, 8192, 128), (2, 16, 16, 4096, 256)}
    assert len(cases) == 7 * 2 * 2 and len(set(cases)) == len(cases)
    assert {c.dtype for c in cases} == {"float16", "bfloat16"} and {c.causal for c in cases} == {False, True}
    assert all(c.op == "backward" and c.kind == "backward" and c.Sq == c.Sk >= 4096 for c in cases)
    assert max(c.D for c in cases) == 256
    # narrowed like the other grids; "all" stays the forward's
    assert {(c.dtype, c.causal) for c in grids.named_grid("backward", ["bfloat16"], (True,))} == {("bfloat16", True)}
    assert all(c.op == "forward" for c in grids.named_grid("all"))
    with pytest.raises(ValueError, match="FP8"):
        grids.named_grid("backward", [grids.FP8])


def test_backward_flops_and_bytes():
    fwd = grids.Case("bfloat16", 2, 16, 16, 8192, 8192, 128, False)
    assert fwd.flops == fwd.forward_flops == 4 * 2 * 16 * 8192 * 8192 * 128
    expect = {"backward": 2.5, "backward det": 2.5, "train step": 3.5}
    assert grids.BACKWARD_OPS == expect
    for causal in (False, True):
        base = grids.Case("bfloat16", 2, 16, 16, 8192, 8192, 128, causal)
        for op, factor in expect.items():
            c = grids.Case("bfloat16", 2, 16, 16, 8192, 8192, 128, causal, op=op)
            assert c.kind == op and c.forward_flops == base.flops and c.flops == factor * base.flops
            d = c.as_dict()
            assert d["kind"] == op and d["op"] == op and d["flops"] == c.flops and d["forward_flops"] == base.flops
    assert grids.Case("float16", 1, 4, 4, 8, 8, 16, True, op="train step").flops == 3.5 * 4 * 4 * 16 * 8 * 8 / 2
    gqa = grids.Case("bfloat16", 1, 64, 8, 8192, 8192, 128, True, op="backward")
    assert gqa.flops == 2.5 * 4 * 64 * 8192 * 8192 * 128 / 2  # counted on the query heads
    # bytes: q, k, v, out, dout, dq, dk, dv and the LSE
    assert gqa.bytes == 2 * 128 * (4 * 8192 * 64 + 4 * 8192 * 8) + 4 * 64 * 8192
    with pytest.raises(ValueError, match="op"):
        grids.Case("bfloat16", 1, 1, 1, 8, 8, 16, False, op="sideways")


def test_backward_explicit_shapes():
    cases = grids.explicit_cases(["2,4,1,300,300,64"], ["float16"], None, "backward")
    assert [(c.Hq, c.Hkv, c.causal, c.op) for c in cases] == [(4, 1, False, "backward"), (4, 1, True, "backward")]
    assert grids.explicit_cases(["1,4,256,256"], ["float16"], None, "backward")[0].D == 256


# ---------------------------------------------------------------------- the command line


def _args(*argv):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


def test_cli_grid_backward():
    args = _args("--grid", "backward", "--dtype", "bfloat16", "--causal", "1")
    cases = cli._cases(args)
    assert len(cases) == 7 and all(c.op == "backward" and c.causal and c.dtype == "bfloat16" for c in cases)
    # --shape with --grid backward: the backward rows of those shapes
    cases = cli._cases(_args("--grid", "backward", "--shape", "1,8,2,512,512,64", "--causal", "0"))
    assert [(c.Hq, c.Hkv, c.Sq, c.D, c.op) for c in cases] == [(8, 2, 512, 64, "backward")] * 2  # both dtypes
    assert all(c.op == "forward" for c in cli._cases(_args("--shape", "1,8,512,64")))


@pytest.mark.parametrize("argv,message", [
    (["--grid", "backward", "--dtype", "float8_e4m3fn"], "FP8"),
    (["--grid", "prefill", "--shape", "1,4,512,64"], "not both"),
])
def test_cli_refuses_what_the_backward_grid_cannot_run(argv, message, capsys):
    """Refused before anything is measured (so before looking for a GPU), with exit status 2."""
    assert cli.run(_args(*argv), argv) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------- the gradient check


def _problem(case, seed=3):
    rng = np.random.default_rng(seed)
    q, k, v = inputs.host_inputs(case, rng)
    dout = rng.standard_normal(q.shape, dtype=np.float32).astype(q.dtype)
    out, lse = reference.attention(q, k, v, causal=case.causal, return_lse=True)
    grads = [g.astype(q.dtype) for g in reference.attention_backward(dout, q, k, v, causal=case.causal)]
    return rng, (q, k, v, dout, out.astype(q.dtype), lse.astype(np.float32)), grads


@pytest.mark.parametrize("case", [grids.Case("bfloat16", 3, 4, 2, 90, 130, 32, True, op="backward"),
                                  grids.Case("float16", 2, 8, 2, 150, 150, 64, False, op="backward"),
                                  grids.Case("bfloat16", 1, 4, 4, 100, 60, 32, True, op="backward")])
def test_check_grads_passes_right_and_catches_wrong_gradients(case):
    rng, prob, grads = _problem(case)
    res = check_backward.check_grads(case, *prob, grads, rng)
    assert res["ok"] and set(res["grads"]) == {"dq", "dk", "dv"}, res
    assert 0 < res["max_err"] <= res["bound"]
    naive = reference.attention_backward_naive(prob[3], *prob[:3], causal=case.causal)
    assert check_backward.check_grads(case, *prob, naive, rng)["ok"]  # the baseline passes its own rule
    for i, name in enumerate(("dq", "dk", "dv")):
        bad = [g.copy() for g in grads]
        # the last batch, the last (always sampled) row or key, the last head
        bad[i][(case.B - 1, -1, -1, 3)] += 0.5
        res = check_backward.check_grads(case, *prob, bad, rng)
        assert not res["ok"] and not res["grads"][name]["ok"], name
    nan = [g.copy() for g in grads]
    nan[2][0, 0, 0, 0] = np.nan
    assert not check_backward.check_grads(case, *prob, nan, rng)["ok"]


def test_combine_reports_the_worst():
    a = {"ok": True, "max_err": 1.0, "bound": 4.0}
    b = {"ok": True, "max_err": 0.3, "bound": 0.5}
    assert check_backward.combine(a, b) == {"ok": True, "max_err": 0.3, "bound": 0.5}
    c = {"ok": False, "max_err": float("nan"), "bound": 1.0}
    assert check_backward.combine(a, c)["ok"] is False and np.isnan(check_backward.combine(a, c)["max_err"])


# ---------------------------------------------------------------------- one case on fakes


class _Dev(np.ndarray):
    """A NumPy array standing in for a DeviceArray."""

    device_id = 0

    def fill_nan(self, stream=None):
        self[...] = np.nan
        return self


class _FakeGpu:
    """The device calls of bench.backward done in NumPy; each call costs made-up GPU ms (forward 1,
    backward 2) that the fake session's timers read."""

    def __init__(self, monkeypatch, flaky_det=False):
        self.cost, self.calls, self.flaky_det = 0.0, [], flaky_det
        monkeypatch.setattr(backward.inputs, "device_sets", self.device_sets)
        monkeypatch.setattr(backward, "attention", self.attention)
        monkeypatch.setattr(backward, "attention_backward", self.attention_backward)
        monkeypatch.setattr(backward, "to_host", lambda x, stream=None: np.asarray(x))
        monkeypatch.setattr(backward._array, "empty", lambda shape, dtype, device=0, stream=None:
                            np.empty(shape, dtype).view(_Dev))

    @staticmethod
    def device_sets(host, n, h):
        return [tuple(np.array(x).view(_Dev) for x in host) for _ in range(n)]

    def attention(self, q, k, v, *, causal, return_lse, stream):
        assert return_lse
        self.cost += 1.0
        out, lse = reference.attention(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal, return_lse=True)
        return out.astype(q.dtype).view(_Dev), lse.astype(np.float32).view(_Dev)

    def attention_backward(self, dout, q, k, v, out, lse, *, causal, stream, deterministic=False, dq=None, dk=None,
                           dv=None):
        self.cost += 2.0
        self.calls.append(deterministic)
        grads = reference.attention_backward(*(np.asarray(x) for x in (dout, q, k, v)), causal=causal)
        grads = [g.astype(q.dtype) for g in grads]
        if deterministic and self.flaky_det and self.calls.count(True) % 2:
            grads[0].view(np.uint16)[0, 0, 0, 0] ^= 1  # one call in two: the last bit of one element
        if dq is None:
            return tuple(g.view(_Dev) for g in grads)
        for given, g in zip((dq, dk, dv), grads):
            given[...] = g
        return dq, dk, dv


class _FakeTorch:
    class cuda:
        @staticmethod
        def empty_cache():
            pass

    @staticmethod
    def from_dlpack(a):
        return a


class _FakePeers:
    """torch SDPA's backends on fakes: cuDNN 4 ms a call, flash 8 ms; cuDNN refuses deterministic mode
    (as torch does)."""

    stream = "peers' stream"

    def __init__(self, gpu):
        self.gpu, self.torch, self._det = gpu, _FakeTorch, False

    def skip_reason(self, case):
        return None

    def grad_tensors(self, device_set):
        return tuple(device_set)

    def backward(self, case, tsets, *, train):
        if self._det and self._backend == "cudnn":
            raise RuntimeError("No available kernel. Aborting execution.\nmore text")
        cost = {"cudnn": 4.0, "flash": 8.0}[self._backend] * (1.5 if train else 1.0)

        def f(i):
            self.gpu.cost += cost

        return f

    @contextlib.contextmanager
    def scope(self, backend=None, *, deterministic=False):
        self._backend, self._det = backend, deterministic
        yield


class _FakeSession:
    """runner.Session's interface: each timing reads the fake GPU's cost of one call."""

    def __init__(self, gpu, peers=None):
        self.gpu, self.peers = gpu, peers
        self.stream_handle, self.rng = 7, np.random.default_rng(0)
        self.props = type("P", (), {"l2_cache_size": 1 << 20})()
        self.ceilings = {"gemm_bf16_tflops": 1e-3, "copy_tbps": 1.0}

    def _one(self, fn):
        self.gpu.cost = 0.0
        fn(0)
        return self.gpu.cost

    def gpu_times(self, entries, refusable):
        out = []
        for (fn, scope), may_raise in zip(entries, refusable):
            try:
                with scope():  # each call inside its own scope (a peer's backend), as in the real turns
                    ms = self._one(fn)
            except RuntimeError as e:  # as timing.gpu_times does
                if not may_raise:
                    raise
                out.append(str(e).strip().splitlines()[0])
                continue
            out.append(Timing(ms, ms, 1))
        return out

    def as_called(self, entries, tags, refusable):
        out = []
        for (fn, scope), tag, may_raise in zip(entries, tags, refusable):
            try:
                with scope():  # each call inside its own scope (a peer's backend), as in the real turns
                    ms = self._one(fn) + 0.5  # as called: the host's time on top
            except RuntimeError as e:  # as ascalled.interleaved does
                if not may_raise:
                    raise
                out.append({"as_called_error": str(e).strip().splitlines()[0]})
                continue
            out.append({f"as_called{tag}_ms": ms, f"as_called{tag}_p90_ms": ms, f"back_to_back{tag}_ms": ms - 0.25})
        return out


CASE = grids.Case("bfloat16", 2, 4, 2, 64, 64, 32, True, op="backward")


def test_backward_rows_on_fakes(monkeypatch):
    gpu = _FakeGpu(monkeypatch)
    rows = backward.run_case(CASE, _FakeSession(gpu, None))
    assert [r["case"]["kind"] for r in rows] == ["backward", "backward det", "train step"]
    for r, ms in zip(rows, (2.0, 2.0, 3.0)):  # the train step: forward (1) and backward (2)
        c, ours = r["case"], r["impls"]["cudattn"]
        assert r["check"]["ok"], r["check"]
        assert ours["median_ms"] == ms and ours["as_called_ms"] == ms + 0.5 and ours["back_to_back_ms"] == ms + 0.25
        assert ours["tflops"] == pytest.approx(c["flops"] / ms / 1e9)
        assert c["flops"] == grids.BACKWARD_OPS[c["kind"]] * CASE.forward_flops
        assert ours["pct_of_ceiling"] == pytest.approx(100 * ours["tflops"] / 1e-3)
        assert set(r["impls"]) == {"cudattn"} and r["sets"] >= 2
    assert rows[1]["check"]["repeatable"] is True
    assert rows[2]["check"]["forward"]["ok"] and rows[2]["check"]["backward"]["ok"]
    assert True in gpu.calls and False in gpu.calls  # deterministic=True reached the backward calls


def test_backward_det_row_fails_when_not_bit_identical(monkeypatch):
    rows = backward.run_case(CASE, _FakeSession(_FakeGpu(monkeypatch, flaky_det=True), None))
    det = rows[1]["check"]
    assert det["repeatable"] is False and det["ok"] is False and rows[0]["check"]["ok"]


def test_backward_rows_with_peers_and_their_report(monkeypatch, tmp_path):
    gpu = _FakeGpu(monkeypatch)
    rows = backward.run_case(CASE, _FakeSession(gpu, _FakePeers(gpu)))
    bwd, det, train = rows
    # cudattn with torch tensors, as called, where torch runs
    assert all(r["impls"]["cudattn"]["as_called_torch_ms"] > 0 for r in rows)
    assert bwd["ratio"] == {"cudnn": 2.0, "flash": 4.0}
    assert bwd["ratio_as_called"] == {"cudnn": 4.5 / 2.5, "flash": 8.5 / 2.5}
    assert bwd["ratio_back_to_back"]["flash"] == pytest.approx(8.25 / 2.25)
    assert train["ratio"] == {"cudnn": 2.0, "flash": 4.0}  # 6 and 12 ms against 3
    assert det["impls"]["cudnn"] == {"error": "No available kernel. Aborting execution."}
    assert "cudnn" not in det["ratio"] and det["ratio"]["flash"] == 4.0
    assert train["impls"]["flash"]["tflops"] == pytest.approx(3.5 * CASE.forward_flops / 12.0 / 1e9)

    # the report: text lines, Markdown sections, summary, JSON
    line = report.row_line(det, True)
    assert line.startswith("backward det ") and "n/a" in line and "4.00x" in line and "ok" in line
    assert report.header(True).startswith("kind         dtype")
    rep = {"command": "python -m cudattn bench --grid backward", "iters": 1, "rows": rows, "host_rows": [],
           "ceilings": {"copy_tbps": 4.0, "gemm_bf16_tflops": 800.0},
           "environment": {"date": "2026-01-01", "gpu": "Test GPU", "sm_count": 1, "arch": "sm_90a",
                           "driver_cuda": "13.0", "nvrtc": "13.0", "cudattn": "0", "git_commit": "abc",
                           "peers": {"torch": "2", "cudnn": 9, "cuda": "13"}}}
    md = report.markdown(rep, rep["command"])
    assert md.startswith("# Backward performance\n")
    for title in ("## Backward (TFLOP/s; FLOPs = 2.5 × the forward's)",
                  "## Backward, deterministic (TFLOP/s; FLOPs = 2.5 × the forward's)",
                  "## Training step: forward and backward (TFLOP/s; FLOPs = 3.5 × the forward's)",
                  "### Backward as called", "### Backward, deterministic as called", "### Training step as called"):
        assert title in md, title
    assert "torch.autograd.grad" in md and "## Prefill" not in md
    summary = report.summary(rep)
    assert "3 rows, 0 failing" in summary
    assert "backward: geometric mean of cudattn/peer speed, GPU time: cuDNN 2.00x, flash 4.00x" in summary
    assert "backward det: geometric mean of cudattn/peer speed, GPU time: flash 4.00x" in summary
    path = tmp_path / "b.json"
    report.write_json(str(path), rep)
    back = json.loads(path.read_text())
    assert [r["case"]["kind"] for r in back["rows"]] == ["backward", "backward det", "train step"]
    # a run of forward and backward rows together is titled by both
    fwd = dict(rows[0], case=dict(rows[0]["case"], kind="prefill"))
    assert report.markdown(dict(rep, rows=[fwd, *rows]), "x").startswith("# Prefill and backward performance\n")


def test_runner_time_peer_keeps_a_refusal_as_n_a():
    """The peer loop the forward and backward rows share: a RuntimeError (from making the calls or from a
    call) is the peer's n/a, never the run's end."""
    gpu = _FakeGpu.__new__(_FakeGpu)
    gpu.cost = 0.0
    s = _FakeSession(gpu)
    row = runner.new_row(CASE)
    row["impls"]["cudattn"] = {"median_ms": 1.0, "as_called_ms": 2.0, "back_to_back_ms": 1.5}

    def refuse():
        raise RuntimeError("")

    later = runner.Turns(CASE)
    runner.time_peer(row, "cudnn", CASE, s, refuse, contextlib.nullcontext, later)
    assert row["impls"]["cudnn"] == {"error": "RuntimeError"} and row["ratio"] == {} and not later.entries


def test_turns_keep_a_peer_that_raises_as_its_error():
    """A peer that raises RuntimeError while timed (out of memory, say) leaves its error in the row: on
    the GPU, in place of its figures and with no ratio; as called only, beside its GPU figures with no
    as-called ratio. cudattn's figures and the other peers' stand."""
    gpu = _FakeGpu.__new__(_FakeGpu)
    gpu.cost = 0.0
    s = _FakeSession(gpu)
    row = runner.new_row(CASE)
    later = runner.Turns(CASE)
    calls = {"cudnn": 0}

    def ours(i):
        gpu.cost += 1.0

    def flash(i):
        gpu.cost += 3.0

    def cudnn(i):  # times on the GPU, then runs out of memory
        calls["cudnn"] += 1
        if calls["cudnn"] > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate\nmore")
        gpu.cost += 2.0

    def refuse(i):
        raise RuntimeError("No available kernel.\nmore")

    row["impls"]["cudattn"] = runner.time_ours(CASE, s, lambda st, stream=None: ours(0), [None], later)
    for name, fn in (("cudnn", cudnn), ("flash", flash), ("other", refuse)):
        runner.time_peer(row, name, CASE, s, lambda fn=fn: fn, contextlib.nullcontext, later)
    later.time(row, s)
    assert row["impls"]["cudnn"]["median_ms"] == 2.0
    assert row["impls"]["cudnn"]["as_called_error"] == "CUDA out of memory. Tried to allocate"
    assert row["impls"]["other"] == {"error": "No available kernel."}
    assert row["impls"]["cudattn"]["median_ms"] == 1.0 and row["impls"]["cudattn"]["as_called_ms"] == 1.5
    assert row["impls"]["flash"]["as_called_ms"] == 3.5
    assert row["ratio"] == {"cudnn": 2.0, "flash": 3.0}
    assert row["ratio_as_called"] == {"flash": 3.5 / 1.5} and not later.entries
