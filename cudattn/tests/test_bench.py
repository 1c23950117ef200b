"""`cudattn bench`: grids, accounting, the correctness check it reports, its outputs; on the GPU, real rows."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cudattn.bench import check, grids, inputs, report, timing


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
                                     **({"tbps": case.bytes / ms / 1e9} if case.kind == "decode"
                                        else {"tflops": case.flops / ms / 1e9})}},
               "ratio": {}, "check": {"ok": True, "max_err": 1e-3, "bound": 2e-3}}
        if with_peers:
            for b, pms in (("cudnn", 0.5), ("flash", 2.0)):
                row["impls"][b] = {"median_ms": pms, "p90_ms": pms, "samples": 3,
                                   **({"tbps": case.bytes / pms / 1e9} if case.kind == "decode"
                                      else {"tflops": case.flops / pms / 1e9})}
                row["ratio"][b] = pms / ms
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


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from cudattn.bench import plot

    out = tmp_path / "p.png"
    plot.plot(_fake_report(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_bench_without_gpu_says_so():
    from cudattn.tests.conftest import gpu_available

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
    assert len(rep["rows"]) == 3 and len(rep["host_rows"]) == 3
    assert all(r["check"]["ok"] for r in rep["rows"] + rep["host_rows"])
    assert rep["ceilings"]["copy_tbps"] > 0 and rep["ceilings"]["h2d_gbps"] > 0
    assert rep["environment"]["sm_count"] > 0 and rep["environment"]["gpu"]
    text = md.read_text()
    assert text.startswith("# Prefill and decode performance\n"), text[:200]
    assert f"Measured on {rep['environment']['gpu']}" in text
