"""GPU: `python -m cudattn selfcheck` itself: its cases pass, a short load (4 threads x 30 calls,
cold kernel cache), a short soak, a few cold processes, the CLI's JSON report and, where
compute-sanitizer is installed, one tool over a few cases."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudattn._selfcheck import _cases, _coldprocs, _load, _sanitize, _soak, _suite

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    return _device.device_properties(0).arch in _traits.HOPPER_ARCHS


def test_sanitize_cases_pass_and_every_kernel_is_counted():
    res = _suite.run_cases(_cases.sanitize_cases(), out=lambda s: None)
    assert res.ok, _suite.summary(res)
    expected = {"flash_fwd_sm80", "flash_decode", "split_kv_combine", "kv_cache_append"}
    if _hopper():
        expected |= {"flash_fwd_sm90", "fp8_transpose_v", "fp8_amax", "fp8_quantize"}
    assert expected <= set(res.launches), res.launches
    assert all(sum(r.launches.values()) > 0 for r in res.cases if r.status == "pass")


def test_full_case_list_passes():
    lines = []
    res = _suite.run_cases(_cases.selfcheck_cases(), out=lines.append)
    assert len(lines) >= len(res.cases)
    assert res.ok, _suite.summary(res)
    if _hopper():
        assert not [r.name for r in res.cases if r.status == "skip"]


def test_load_four_threads_cold_cache():
    res = _load.run_load(threads=4, calls=30, problems=12, cold=True, stall_s=120, out=lambda s: None)
    assert res.ok, _load.summary(res)
    assert res.completed == 120 and res.checked == res.problems
    assert res.compiles and res.cache_entries, "a cold start must compile and write the kernels"


@pytest.mark.solo  # judges the device's memory in use, which other processes move
def test_short_soak():
    res = _soak.run_soak(300, problems=12, out=lambda s: None)
    assert res.ok, _soak.summary(res)
    assert res.growth["pool_used"] == 0


def test_cold_processes():
    res = _coldprocs.run_cold_procs(3, timeout=300, out=lambda s: None)
    assert res.ok, _coldprocs.summary(res)
    assert len(res.cache_keys) == 2, "a prefill kernel and the decode kernel (which merges its own splits)"


def test_cli_json_report(tmp_path):
    path = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "cudattn", "selfcheck", "-k", "merge:", "--json", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "split_kv_combine" in r.stdout
    data = json.loads(path.read_text())
    assert data["ok"] and data["selfcheck"]["launches"]["split_kv_combine"] >= 3
    assert all(c["status"] == "pass" for c in data["selfcheck"]["cases"])


def test_one_sanitizer_tool(tmp_path):
    try:
        binary = _sanitize.find_sanitizer()
    except _sanitize.SanitizerNotFound as e:
        pytest.skip(str(e))
    runs = _sanitize.run_all(("memcheck",), binary, str(tmp_path), print_limit=20, timeout=600,
                             case_filter="quantize", out=lambda s: None)
    assert [r.tool for r in runs] == [_sanitize.BASELINE, "memcheck", _sanitize.CONTROL]
    assert all(r.status == "pass" for r in runs), _sanitize.summary_table(runs, str(tmp_path))
    assert runs[1].errors == 0 and runs[1].launches > 0
