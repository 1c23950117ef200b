"""CPU: the parts of `python -m cudattn selfcheck` that need no GPU: the case lists, the checks
(fed results made from the reference, then broken), sanitizer output parsing and discovery,
the command line, the launch counter and the report tables."""

from __future__ import annotations

import json
import os
import stat

import ml_dtypes
import numpy as np
import pytest

from cudattn import reference
from cudattn._runtime import device as _device
from cudattn._selfcheck import _cases, _check, _coldcache, _counter, _exec, _inputs, _load, _report, _sanitize
from cudattn._selfcheck import _main as selfcheck_main

ALL_CASES = _cases.selfcheck_cases() + _cases.sanitize_cases() + _cases.load_cases(40)
HOPPER, FP8_ARCHS = ("sm_90a",), ("sm_89", "sm_90a", "sm_90")


# ---------------------------------------------------------------------- case lists


def test_case_names_are_unique_and_seeds_stable():
    for cases in (_cases.selfcheck_cases(), _cases.sanitize_cases(), _cases.load_cases(40)):
        names = [c.name for c in cases]
        assert len(set(names)) == len(names)
    c = _cases.selfcheck_cases()[0]
    assert c.seed == _cases.Case(**{f: getattr(c, f) for f in c.__dataclass_fields__}).seed


def test_selfcheck_cases_cover_what_the_issue_asks():
    cases = _cases.selfcheck_cases()
    groups = {c.group for c in cases}
    assert {"portable", "hopper", "fp8-portable", "fp8-hopper", "decode", "kvcache", "merge", "quantize"} <= groups
    prefill = [c for c in cases if c.op == "attention" and not c.decode]
    assert {1, 65, 113, 203} <= {c.Sk for c in prefill} | {c.Sq for c in prefill}
    assert any(c.causal and c.Sq > c.Sk for c in prefill), "fully masked rows"
    assert any(c.causal and c.Sq > c.Sk for c in cases if c.decode), "fully masked rows in decode"
    assert any(c.Hkv == 1 and c.Hq > 1 for c in prefill) and any(1 < c.Hkv < c.Hq for c in prefill), "MQA and GQA"
    assert {"bshd", "bhsd"} <= {c.layout for c in prefill}
    for fam in ("portable", "hopper"):
        fp8 = [c for c in prefill if c.fp8 and c.family == fam]
        assert {"device", "host"} <= {c.quant for c in fp8}
    splits = {c.num_splits for c in cases if c.decode or c.op == "kvcache"}
    assert {2, 3, 4, None} <= splits and all(c.Sq <= 16 for c in cases if c.decode)
    kv = [c for c in cases if c.op == "kvcache"]
    assert any(c.page_size for c in kv) and any(not c.page_size for c in kv) and any(c.s_new for c in kv)
    assert any(not c.lse for c in cases) and any(c.lse for c in cases)
    assert any(c.host for c in cases), "the NumPy path"
    # every portable head-dim tile (32, 64, 128, 192, 256) and a padded one
    dims = {c.D for c in prefill if c.family == "portable" and not c.fp8}
    assert {32, 64, 128, 192, 256} <= dims and dims - {32, 64, 128, 192, 256}


def test_sanitize_list_is_short_and_covers_each_path():
    cases = _cases.sanitize_cases()
    assert len(cases) <= 10
    assert {"portable", "hopper", "fp8-portable", "fp8-hopper", "decode", "kvcache", "merge", "quantize"} == \
        {c.group for c in cases}


def test_load_mix_covers_every_op_even_when_short():
    for n in (11, 40):
        cases = _cases.load_cases(n, seed=3)
        assert len(cases) == n
        assert {"prefill", "fp8-prefill", "decode", "kvcache", "merge", "quantize"} <= {c.group for c in cases}
        assert any(c.host for c in cases)
        assert all(c.family == "any" for c in cases), "load threads share one kernel family"
        assert not any(c.fp8 and c.quant == "device" for c in cases), "building the pool must not run kernels"
    assert [c.name for c in _cases.load_cases(40, 5)] == [c.name for c in _cases.load_cases(40, 5)]


def test_skip_reasons():
    hop = _cases.Case("attention", "float16", Sq=65, Sk=65, family="hopper")
    fp8 = _cases.Case("attention", "float8_e4m3fn", Sq=65, Sk=65, quant="host")
    assert hop.skip_reason("sm_90a", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS) is None
    assert "Hopper" in hop.skip_reason("sm_80", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS)
    assert fp8.skip_reason("sm_89", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS) is None
    assert "FP8" in fp8.skip_reason("sm_86", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS)


@pytest.mark.parametrize("kw, match", [
    (dict(op="nope"), "op must be"),
    (dict(Hq=3, Hkv=2), "multiple"),
    (dict(dtype="float8_e4m3fn"), "quant="),
    (dict(op="kvcache", B=2, seqlens=(1,)), "seqlens"),
    (dict(op="kvcache", Sk=64, seqlens=(63,), s_new=2), "overflow"),
    (dict(op="kvcache", Sk=64, seqlens=(1,), page_size=24), "page_size"),
    (dict(op="merge"), "parts"),
])
def test_bad_cases_are_refused(kw, match):
    base = dict(op="attention", dtype="float16")
    with pytest.raises(ValueError, match=match):
        _cases.Case(**{**base, **kw})


def test_inputs_are_seeded_and_never_zero():
    for c in _cases.selfcheck_cases():
        a, b = _inputs.make_inputs(c), _inputs.make_inputs(c)
        for k, x in a.items():
            if x is None:
                continue
            assert x.tobytes() == b[k].tobytes()
            if k in ("q", "k", "v", "x"):
                assert np.count_nonzero(x.astype(np.float32)) > 0.9 * x.size


def test_kvcache_inputs_page_table_is_a_permutation():
    c = _cases.Case("kvcache", "float16", 3, 1, 256, 4, 1, 64, seqlens=(1, 2, 3), page_size=16)
    inp = _inputs.make_inputs(c)
    t = inp["table"]
    assert t.shape == (3, 16) and t.dtype == np.int32 and len(set(t.ravel())) == t.size
    assert inp["k_cache"].shape == (3 * 16 + 2, 16, 1, 64)


# ---------------------------------------------------------------------- checks with made-up results


def _ref_results(c: _cases.Case, inputs: dict) -> tuple[dict, dict, int]:
    """(ref, got, block_n) as a correct GPU run would give them, made on the CPU from the reference."""
    if c.op == "attention" and not c.fp8:
        r, rl = reference.attention(inputs["q"], inputs["k"], inputs["v"], causal=c.causal, layout=c.layout,
                                    return_lse=True)
        return dict(inputs), {"out": r.astype(_exec.out_dtype(c)), "lse": rl.astype(np.float32) if c.lse else None}, 128
    if c.op == "attention":
        import cudattn

        names = ("q", "k", "v")
        quant = [cudattn.quantize_fp8(inputs[n], per=c.per, layout=c.layout, heads_kv=c.Hkv) for n in names]
        ref = dict(zip(names, (q for q, _ in quant)))
        ref["descales"] = {f"{n}_descale": d for n, (_, d) in zip(names, quant)}
        out_dt = _inputs.DTYPES[c.out_dtype] if c.out_dtype else None
        emu, el = reference.attention_fp8_emulated(ref["q"], ref["k"], ref["v"], causal=c.causal, layout=c.layout,
                                                   out_dtype=out_dt, return_lse=True, block_n=64, **ref["descales"])
        return ref, {"out": emu, "lse": el if c.lse else None}, 64
    if c.op == "kvcache":
        kw = dict(cache_seqlens=inputs["seqlens"], block_table=inputs["table"], k_new=inputs["k_new"],
                  v_new=inputs["v_new"], causal=c.causal)
        r, rl = reference.attention_with_kvcache(inputs["q"], inputs["k_cache"], inputs["v_cache"], **kw,
                                                 return_lse=True)
        kc, vc = (reference.kvcache_append(inputs["k_cache"], inputs["v_cache"], inputs["k_new"], inputs["v_new"],
                                           inputs["seqlens"], inputs["table"]) if c.s_new
                  else (inputs["k_cache"], inputs["v_cache"]))
        return dict(inputs), {"out": r.astype(inputs["q"].dtype), "lse": rl.astype(np.float32) if c.lse else None,
                              "k_cache": kc, "v_cache": vc}, 128
    if c.op == "merge":
        o, l = reference.merge_attention_states(list(inputs["outs"]), list(inputs["lses"]), layout=c.layout)
        return dict(inputs), {"out": o.astype(inputs["outs"].dtype), "lse": l.astype(np.float32)}, 128
    import cudattn

    x8, d = cudattn.quantize_fp8(inputs["x"], per=c.per, layout=c.layout, heads_kv=c.Hkv)
    return dict(inputs), {"x8": x8, "descale": d}, 128


_CHECK_CASES = _cases.sanitize_cases() + [c for c in _cases.selfcheck_cases() if c.op in ("kvcache", "merge",
                                                                                          "quantize")] + [
    _cases.selfcheck_cases()[2],  # Sq > Sk: empty rows, LSE -inf
    next(c for c in _cases.selfcheck_cases() if c.fp8 and c.out_dtype == "float16"),
]


@pytest.mark.parametrize("case", _CHECK_CASES, ids=lambda c: c.name)
def test_check_passes_correct_results(case):
    ref, got, bn = _ref_results(case, _inputs.make_inputs(case))
    v = _check.check(case, ref, got, bn)
    assert v.ok, v.detail


def _break(case, got) -> dict:
    """The most common real fault: one output row left as it was poisoned (NaN), or, where the
    API allocates the output itself, one row wrong."""
    got = {k: None if x is None else x.copy() for k, x in got.items()}
    if case.op == "quantize":
        got["x8"].reshape(-1)[7] = got["x8"].dtype.type(3.0) if got["x8"].reshape(-1)[7] != 3.0 else 0.5
        return got
    o = got["out"]
    if case.op == "merge":
        o[(0,) * (o.ndim - 1)] += o.dtype.type(0.5)
    else:
        o[(-1,) * (o.ndim - 1)] = np.nan
    return got


@pytest.mark.parametrize("case", _CHECK_CASES, ids=lambda c: c.name)
def test_check_fails_broken_results(case):
    ref, got, bn = _ref_results(case, _inputs.make_inputs(case))
    v = _check.check(case, ref, _break(case, got), bn)
    assert not v.ok


def test_check_fails_a_wrong_lse_and_a_wrong_cache_append():
    c = next(c for c in _cases.selfcheck_cases() if c.op == "kvcache" and c.s_new)
    ref, got, _ = _ref_results(c, _inputs.make_inputs(c))
    bad = dict(got, lse=got["lse"] + np.float32(1e-2))
    assert "LSE" in _check.check(c, ref, bad).detail
    bad = dict(got, k_cache=ref["k_cache"])  # the append never happened
    assert "k_cache" in _check.check(c, ref, bad).detail
    empty = _cases.selfcheck_cases()[2]
    ref, got, _ = _ref_results(empty, _inputs.make_inputs(empty))
    lse = got["lse"].copy()
    lse[np.isneginf(lse)] = 0.0  # an empty row must be -inf, not 0
    assert "-inf" in _check.check(empty, ref, dict(got, lse=lse)).detail


def test_check_fails_the_wrong_shape_and_fp8_outputs_of_the_wrong_dtype():
    c = _cases.sanitize_cases()[0]
    ref, got, _ = _ref_results(c, _inputs.make_inputs(c))
    assert "shape" in _check.check(c, ref, dict(got, out=got["out"][:, :-1])).detail
    f = next(c for c in _cases.sanitize_cases() if c.fp8)
    ref, got, bn = _ref_results(f, _inputs.make_inputs(f))
    assert "expected" in _check.check(f, ref, dict(got, out=got["out"].astype(np.float16)), bn).detail


def test_first_difference():
    a = {"out": np.arange(6, dtype=np.float16).reshape(2, 3), "lse": None}
    assert _check.first_difference(a, {"out": a["out"].copy(), "lse": None}) is None
    b = a["out"].copy()
    b[1, 2] = 9
    diff = _check.first_difference(a, {"out": b, "lse": None})
    assert "1 of 6" in diff and "(1, 2)" in diff
    nan = np.full(3, np.nan, ml_dtypes.bfloat16)
    assert _check.first_difference({"x": nan}, {"x": nan.copy()}) is None, "same NaN bits are the same result"
    assert "instead of" in _check.first_difference(a, {"out": b[:1], "lse": None})


# ---------------------------------------------------------------------- sanitizer


MEMCHECK_CLEAN = """========= COMPUTE-SANITIZER
selfcheck: PASS (8 passed, 0 failed, 0 skipped)
========= LEAK SUMMARY: 0 bytes leaked in 0 allocations
========= ERROR SUMMARY: 0 errors
"""
MEMCHECK_ERRORS = """========= Invalid __global__ read of size 16 bytes
=========     at flash_fwd_sm80+0x1a0 in flash_fwd_sm80.cu:120
========= LEAK SUMMARY: 4096 bytes leaked in 1 allocations
========= ERROR SUMMARY: 3 errors
========= ERROR SUMMARY: 2 errors were not printed. Use --print-limit option to adjust the number of printed errors
"""
RACECHECK = """========= Warning: (Warp Level Programming) Potential RAW hazard detected at __shared__ 0x100
========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)
"""


def test_parse_summary():
    assert _sanitize.parse_summary(MEMCHECK_CLEAN) == _sanitize.Summary(0, 0, 0)
    assert _sanitize.parse_summary(MEMCHECK_ERRORS) == _sanitize.Summary(3, 0, 4096)
    assert _sanitize.parse_summary("========= ERROR SUMMARY: 1 error\n") == _sanitize.Summary(1)
    assert _sanitize.parse_summary(RACECHECK) == _sanitize.Summary(1, 2, 0)
    both = RACECHECK + "========= ERROR SUMMARY: 1 error\n"
    assert _sanitize.parse_summary(both).errors == 1, "racecheck's two summaries count the same error once"
    two_procs = MEMCHECK_ERRORS + MEMCHECK_ERRORS
    assert _sanitize.parse_summary(two_procs).errors == 6
    assert _sanitize.parse_summary("Traceback (most recent call last):\n...").errors is None


def test_judge():
    ok = _sanitize.Summary(0)
    assert _sanitize.judge("memcheck", 0, ok, 120, False)[0] == "pass"
    assert _sanitize.judge("memcheck", 97, _sanitize.Summary(3), 120, False) == ("fail",
                                                                                 "3 error(s) reported: see the log")
    assert "summary" in _sanitize.judge("memcheck", 1, _sanitize.Summary(None), None, False)[1]
    assert "child failed" in _sanitize.judge("memcheck", 1, ok, 120, False)[1]
    assert "timed out" in _sanitize.judge("racecheck", None, ok, None, True)[1]
    assert "launch" in _sanitize.judge("memcheck", 0, ok, 0, False)[1]
    assert _sanitize.judge(_sanitize.BASELINE, 0, _sanitize.Summary(None), 50, False)[0] == "pass"
    assert "warning" in _sanitize.judge("racecheck", 0, _sanitize.Summary(0, 2), 50, False)[1]


def test_tool_options_follow_the_help_text():
    help_text = ("--leak-check arg (=no)\n--track-stream-ordered-races arg (=no)\n"
                 "--racecheck-report arg (=analysis)\n--show-backtrace arg (=yes)\n")
    mem = _sanitize.tool_options("memcheck", help_text, 25)
    assert mem[:6] == ["--tool", "memcheck", "--error-exitcode", "97", "--print-limit", "25"]
    assert mem[6:] == ["--show-backtrace", "device", "--leak-check", "full", "--track-stream-ordered-races", "all"]
    assert _sanitize.tool_options("racecheck", help_text, 5)[-2:] == ["--racecheck-report", "all"]
    assert _sanitize.tool_options("synccheck", help_text, 5)[-2:] == ["--show-backtrace", "device"]
    assert _sanitize.tool_options("memcheck", "", 5) == ["--tool", "memcheck", "--error-exitcode", "97",
                                                         "--print-limit", "5"]
    assert "--leak-check" not in _sanitize.tool_options("initcheck", help_text, 5)


def test_child_command():
    cmd = _sanitize.child_command("/x/compute-sanitizer", "synccheck", "", 10, "/l/synccheck.json", "sanitize",
                                  "hopper")
    assert cmd[0] == "/x/compute-sanitizer" and cmd[1:3] == ["--tool", "synccheck"]
    i = cmd.index("-m")
    assert cmd[i + 1:] == ["cudattn", "selfcheck", "--cases", "sanitize", "--json", "/l/synccheck.json", "-k", "hopper"]
    base = _sanitize.child_command("/x/compute-sanitizer", _sanitize.BASELINE, "", 10, "/l/none.json", "full", None)
    assert base[1:3] == ["-m", "cudattn"] and "-k" not in base and base[base.index("--cases") + 1] == "full"


def test_memcheck_child_runs_without_the_pinned_staging_pool():
    assert _sanitize.child_env("memcheck") == {"CUDATTN_PINNED_STAGING": "0"}
    assert _sanitize.child_env("racecheck") == {} and _sanitize.child_env(_sanitize.BASELINE) == {}


def _fake_binary(path):
    path.write_text("#!/bin/sh\necho ok\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_find_sanitizer(tmp_path):
    exe = _fake_binary(tmp_path / "compute-sanitizer")
    assert _sanitize.find_sanitizer({_sanitize.ENV_VAR: exe}, which=lambda n: None) == exe
    assert _sanitize.find_sanitizer({}, which=lambda n: "/on/path") == "/on/path"
    assert _sanitize.find_sanitizer({}, which=lambda n: None, fallbacks=(exe,)) == exe
    with pytest.raises(_sanitize.SanitizerNotFound, match="not an executable"):
        _sanitize.find_sanitizer({_sanitize.ENV_VAR: str(tmp_path / "missing")})
    with pytest.raises(_sanitize.SanitizerNotFound, match="CUDATTN_COMPUTE_SANITIZER"):
        _sanitize.find_sanitizer({}, which=lambda n: None, fallbacks=(str(tmp_path / "none"),))


def test_missing_sanitizer_is_a_clear_error_before_any_gpu_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(_sanitize.ENV_VAR, str(tmp_path / "no-such-binary"))
    from cudattn._tools import cli as _cli

    monkeypatch.setattr(_device, "gpu_count", lambda: pytest.fail("the GPU was looked for before the binary"))
    assert _cli.main(["selfcheck", "--sanitize"]) == selfcheck_main.EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert "compute-sanitizer" in err or _sanitize.ENV_VAR in err


def test_run_tool_with_a_fake_sanitizer(tmp_path):
    """run_tool end to end with a stand-in for compute-sanitizer that prints a summary, writes
    the child's JSON report and exits as the real one would on errors."""
    fake = tmp_path / "fake-sanitizer"
    fake.write_text(f"""#!{os.sys.executable}
import json, sys
args = sys.argv[1:]
path = args[args.index("--json") + 1]
json.dump({{"selfcheck": {{"launches_total": 42}}}}, open(path, "w"))
print("========= ERROR SUMMARY: 2 errors")
sys.exit({_sanitize.ERROR_EXITCODE})
""")
    fake.chmod(0o755)
    r = _sanitize.run_tool("memcheck", str(fake), "", str(tmp_path), 10, 60, "sanitize", None)
    assert (r.status, r.errors, r.launches, r.returncode) == ("fail", 2, 42, 97)
    log = open(r.log).read()
    assert "ERROR SUMMARY" in log and log.startswith("$ PYTHONUNBUFFERED=1 CUDATTN_PINNED_STAGING=0 ")
    assert "memcheck" in _sanitize.summary_table([r], str(tmp_path))


def test_control_passes_only_when_memcheck_reports_the_planted_read(tmp_path):
    seen = "========= Invalid __global__ read of size 16 bytes\n========= ERROR SUMMARY: 9 errors"
    for printed, status in ((seen, "pass"), ("========= ERROR SUMMARY: 0 errors", "fail")):
        fake = tmp_path / "fake-sanitizer"
        fake.write_text(f"#!{os.sys.executable}\nimport sys\nassert '-c' in sys.argv\nprint({printed!r})\n"
                        "sys.exit(97)\n")
        fake.chmod(0o755)
        r = _sanitize.run_control(str(fake), "", str(tmp_path), 10, 60)
        assert r.tool == _sanitize.CONTROL and r.status == status, r.detail


# ---------------------------------------------------------------------- command line


def test_cli_arguments():
    import argparse

    p = argparse.ArgumentParser()
    selfcheck_main.add_arguments(p)
    a = p.parse_args([])
    assert (a.cases, a.sanitize, a.load, a.soak, a.cold_procs, a.tools) == (None, False, False, None, None,
                                                                            _sanitize.TOOLS)
    a = p.parse_args(["--sanitize", "--tools", "racecheck, memcheck,racecheck", "--log-dir", "/tmp/x"])
    assert a.tools == ("racecheck", "memcheck") and a.log_dir == "/tmp/x"
    a = p.parse_args(["--load", "--threads", "4", "--calls", "30", "--cold", "--soak", "--cold-procs"])
    assert (a.threads, a.calls, a.cold, a.soak, a.cold_procs) == (4, 30, True, 10000, 8)
    assert p.parse_args(["--soak", "500", "--cold-procs", "3"]).soak == 500
    for bad in (["--tools", "helgrind"], ["--threads", "0"], ["--cases", "huge"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_cli_without_a_gpu_says_nothing_ran(monkeypatch, capsys):
    from cudattn._tools import cli as _cli

    monkeypatch.setattr(_device, "gpu_count", lambda: 0)
    assert _cli.main(["selfcheck"]) == selfcheck_main.EXIT_CANNOT_RUN
    assert "no CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------- counter, load schedule, reports


def test_launch_counter_wraps_and_restores():
    from cudattn._runtime import launch as _launch

    original = _launch.launch
    calls = []
    _launch_stub = lambda kernel, *a, **kw: calls.append(kernel.name)  # noqa: E731
    _launch.launch = _launch_stub
    try:
        k = type("K", (), {"name": "flash_decode"})()
        with _counter.LaunchCounter() as lc:
            before = lc.snapshot()
            _launch.launch(k, (1, 1, 1))
            _launch.launch(k, (1, 1, 1))
            assert lc.since(before) == {"flash_decode": 2}
        assert _launch.launch is _launch_stub and calls == ["flash_decode"] * 2
    finally:
        _launch.launch = original


def test_launch_counter_counts_only_launches_that_went_out():
    from cudattn._runtime import launch as _launch

    original = _launch.launch

    def failing(kernel, *a, **kw):
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")

    _launch.launch = failing
    try:
        with _counter.LaunchCounter() as lc:
            with pytest.raises(RuntimeError):
                _launch.launch(type("K", (), {"name": "x"})())
            assert lc.snapshot() == {}
    finally:
        _launch.launch = original


def test_load_schedule_covers_the_pool_then_mixes():
    plans = [_load.schedule(t, 8, 1000, 40, 0) for t in range(8)]
    assert all(len(p) == 1000 for p in plans)
    assert {p[0] for p in plans} | {p[i] for p in plans for i in range(5)} == set(range(40))
    assert sorted(x for p in plans for x in p[:5]) == list(range(40)), "the first round calls each problem once"
    short = [_load.schedule(t, 4, 3, 40, 0) for t in range(4)]
    assert all(len(p) == 3 for p in short)


def test_report_table_and_json(tmp_path):
    t = _report.table(["tool", "errors", "wall s"], [["memcheck", 0, 12.34], ["racecheck", None, 0.5]])
    lines = t.splitlines()
    assert lines[0].startswith("tool") and "12.3" in t and "-" in lines[3]
    path = tmp_path / "r.json"
    _report.write_json(str(path), {"lse": float("-inf"), "x": [1.5, float("nan")], "ok": True})
    data = json.loads(path.read_text())
    assert data == {"lse": "-inf", "x": [1.5, "nan"], "ok": True}


def test_cold_cache_points_the_cache_at_an_empty_dir_and_back(tmp_path, monkeypatch):
    import nvrtc_cache

    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "warm"))
    cold = tmp_path / "cold"
    cold.mkdir()
    with _coldcache.cold_cache(str(cold)) as cache:
        assert cache.directory == cold.resolve() and nvrtc_cache.default_cache() is cache
    assert os.environ["CUDATTN_CACHE_DIR"] == str(tmp_path / "warm")
    (cold / "x").write_text("")
    with pytest.raises(ValueError, match="empty"):
        with _coldcache.cold_cache(str(cold)):
            pass
    assert _coldcache.stray_files(str(cold)) == ["x"] and _coldcache.cache_keys(str(cold)) == set()
