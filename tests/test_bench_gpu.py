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
