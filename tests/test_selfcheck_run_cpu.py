"""CPU: how `python -m cudattn selfcheck` runs, without a GPU: sanitizer output parsing and
discovery, the command line, the launch counter, the load schedule and the report tables.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from cudattn._runtime import device as _device
from cudattn._selfcheck import _coldcache, _counter, _load, _report, _sanitize
from cudattn._selfcheck import _main as selfcheck_main


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
