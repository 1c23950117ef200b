"""`cudattn bench` on the GPU (tests marked ``gpu``): real rows, the command line end to end, the
overhead grid.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudattn.bench import grids


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


@pytest.mark.gpu
def test_backward_rows_on_gpu():
    """The backward grid's rows on one tiny shape (GQA, causal): checked, timed both ways; with torch's
    peers where torch runs (a backend that refuses the shape is n/a, not a failure)."""
    from cudattn.bench import backward, runner
    from cudattn.bench.peers import TorchPeers, load_torch

    torch_mod = load_torch()
    s = runner.Session(peers=TorchPeers(torch_mod) if torch_mod is not None else None, iters=3, warmup=1)
    s.ceilings = {"copy_tbps": 1.0, "gemm_bf16_tflops": 800.0}
    case = grids.Case("bfloat16", 2, 8, 2, 256, 256, 64, True, op="backward")
    rows = backward.run_case(case, s)
    assert [r["case"]["kind"] for r in rows] == ["backward", "backward det", "train step"]
    for r in rows:
        assert r["check"]["ok"], (r["case"]["kind"], r["check"])
        ours = r["impls"]["cudattn"]
        assert 0 < ours["median_ms"] <= ours["p90_ms"] and ours["samples"] == 3
        assert ours["tflops"] > 0 and ours["as_called_ms"] > 0 and ours["back_to_back_ms"] > 0
        assert r["case"]["flops"] == grids.BACKWARD_OPS[r["case"]["kind"]] * case.forward_flops
        for b in ("cudnn", "flash") if s.peers is not None else ():
            p = r["impls"][b]
            assert "error" in p or (p["median_ms"] > 0 and r["ratio"][b] > 0 and r["ratio_as_called"][b] > 0), p
    assert rows[1]["check"]["repeatable"]
    if torch_mod is not None:  # the peers left torch's deterministic mode as they found it
        assert not torch_mod.are_deterministic_algorithms_enabled()


@pytest.mark.gpu
def test_bench_backward_cli_end_to_end(tmp_path):
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    cmd = [sys.executable, "-m", "cudattn", "bench", "--grid", "backward", "--shape", "1,4,300,64", "--dtype",
           "float16", "--causal", "1", "--iters", "3", "--json", str(js), "--markdown", str(md)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(js.read_text())
    assert [r["case"]["kind"] for r in rep["rows"]] == ["backward", "backward det", "train step"]
    assert all(r["check"]["ok"] for r in rep["rows"])
    text = md.read_text()
    assert text.startswith("# Backward performance\n") and "## Training step: forward and backward" in text
    assert "backward: geometric mean" in res.stdout or not rep["environment"]["peers"]
