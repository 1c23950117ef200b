"""`cudattn bench`'s outputs, from made-up rows: the text, markdown and JSON report (kernel and
host-overhead rows), the plot, and the git commit it records.
"""

from __future__ import annotations

import subprocess

import pytest

from cudattn.bench import grids, overhead, report


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
                  **m(21.5, 40.0, launch_stream="torch's current stream", pre_launch_profiled_us=12.0)},
                 {**head, "impl": "cudattn", "operands": "cudattn", "stream": "omitted", "out": False,
                  **m(11.25, 30.0, pre_launch_us=6.0)},
                 {**head, "impl": "cudattn", "operands": "cudattn", "stream": "omitted", "out": True,
                  **(m(9.5, 28.0, pre_launch_us=5.5) if problem == "prefill" else {"skipped": "no out= in this cudattn"})},
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
    assert "| prefill 1x8x512x64 | cudattn DeviceArray | omitted | cudattn's stream | 11.2 | 9.5 | 6.0 | 5.5 | " \
           "30.0 | 28.0 | 21.5 | 12.0 | 40.0 |" in text
    assert "150.0*" in text and "skipped: cupy not installed" in text
    assert "| decode 4x8x1/1024x128 | cudattn DeviceArray | omitted | cudattn's stream | 11.2 | " \
           "skipped: no out= in this cudattn | 6.0 | - | 30.0 | - |" in text
    assert "| prefill 1x8x512x64 | torch.Tensor | omitted | cudattn's stream | 150.0* | - | - | - | 35.0 |" in text
    assert "host    11.2" not in text
    assert report.overhead_line(rows[1]).split("|")[1].split()[0] == "11.2"
    assert report.overhead_line(rows[1]).split("|")[2].strip() == "6.0"  # before the launch
    assert report.overhead_line(rows[0]).split("|")[2].strip() == "12.0p"  # torch SDPA: through its profiler
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
