"""nvrtc_cache: NVRTC compile (CUBIN, ptxas reports, compile errors), the cache key, and
inspection. The memory and disk layers are in test_nvrtc_cache_layers.py. CPU only (NVRTC needs no
GPU).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import nvrtc_cache
from nvrtc_cache import (
    CompileError,
    CompileResult,
    PtxasReport,
    nvrtc_version,
)
from nvrtc_cache import _key, _nvrtc, _sysinclude
from _nvrtc_cases import ELF_MAGIC, HEADERS, SOURCE, _compile, _files
from _nvrtc_cases import _private_default_dir as _private_default_dir, cache as cache  # fixtures


# --- compiling ------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a"])
def test_compiles_cubin_with_ptxas_report(cache, arch):
    res = _compile(cache, arch=arch, name_expressions=["add_n<3>"])
    assert isinstance(res, CompileResult)
    assert res.cubin.startswith(ELF_MAGIC)
    assert res.arch == arch and res.source == "compiled"
    assert f"for '{arch}'" in res.log  # ptxas compiled for exactly this target
    assert len(res.key) == 64 and int(res.key, 16) >= 0

    scale = res.ptxas["scale_half"]  # extern "C": ptxas prints it unmangled
    assert isinstance(scale, PtxasReport)
    assert scale.registers > 0
    assert scale.shared_bytes == 256 * 4
    assert scale.barriers == 1
    assert (scale.spill_stores, scale.spill_loads, scale.stack_bytes) == (0, 0, 0)
    assert scale.entry

    lowered = res.lowered_names["add_n<3>"]
    assert lowered == "_Z5add_nILi3EEvPf"
    assert res.ptxas[lowered].registers > 0 and res.ptxas[lowered].shared_bytes == 0


def test_ptxas_reports_spills_and_stack(cache):
    source = r"""
    __global__ void spills(float* out, const float* in) {
        float a[64];
        #pragma unroll
        for (int i = 0; i < 64; ++i) a[i] = in[i * blockDim.x + threadIdx.x];
        float acc = 0.f;
        #pragma unroll
        for (int i = 0; i < 64; ++i)
            #pragma unroll
            for (int j = 0; j < 64; ++j) acc += a[i] * a[(j * 7 + i) % 64];
        out[threadIdx.x] = acc;
    }
    """
    res = cache.compile(source, options=["-maxrregcount=32"], arch="sm_90a")
    report = res.ptxas["_Z6spillsPfPKf"]
    assert report.registers <= 32
    assert report.spill_stores > 0 and report.spill_loads > 0 and report.stack_bytes > 0


def test_parse_ptxas_tolerates_format_variants():
    log = "\n".join(
        [
            "k.cu(4): warning #177-D: variable \"x\" was declared but never referenced",
            "ptxas info    : 0 bytes gmem",
            # -G / -rdc: a non-inlined device function may come before its caller.
            "ptxas info    : Function properties for _Z3devPfi",
            "ptxas         .     128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
            "ptxas info    : Compile time = 4.737 ms",
            "ptxas info    : Compiling entry function '_Z1kPfi' for 'sm_90a'",
            "ptxas info    : Function properties for _Z1kPfi",
            "ptxas         .     0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads",
            "ptxas info    : Used 26 registers, used 2 barriers, 128 bytes cumulative stack size, "
            "24 bytes smem, 364 bytes cmem[0]",
            # Older ptxas: no barriers, bare stack-frame line.
            "ptxas info    : Compiling entry function 'old' for 'sm_80'",
            "ptxas info    : Function properties for old",
            "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
            "ptxas info    : Used 8 registers, 356 bytes cmem[0]",
        ]
    )
    reports = nvrtc_cache.parse_ptxas(log)
    assert reports["_Z3devPfi"] == PtxasReport(stack_bytes=128, entry=False)
    assert reports["_Z1kPfi"] == PtxasReport(
        registers=26, shared_bytes=24, spill_stores=8, spill_loads=12, barriers=2,
        cumulative_stack_bytes=128,
    )
    assert reports["old"] == PtxasReport(registers=8, stack_bytes=16)


def test_compile_error_carries_log_and_options(cache):
    with pytest.raises(CompileError) as info:
        cache.compile("__global__ void k( { }", name="broken.cu", options=["-DFOO=1"], arch="sm_80")
    err = info.value
    assert "error" in err.log
    assert err.name == "broken.cu"
    assert "-arch=sm_80" in err.options and "-DFOO=1" in err.options
    assert "-Xptxas=-v" in err.options and "--std=c++17" in err.options
    text = str(err)
    assert "NVRTC_ERROR_COMPILATION" in text and "-DFOO=1" in text and err.log.strip() in text
    assert list(cache.entries()) == []  # failures are not cached


def test_invalid_option_is_a_compile_error(cache):
    with pytest.raises(CompileError, match="NVRTC_ERROR_INVALID_OPTION") as info:
        cache.compile("__global__ void k() {}", options=["--no-such-flag"], arch="sm_80")
    assert "--no-such-flag" in info.value.log


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(arch="compute_90"), ValueError),
        (dict(arch="sm90"), ValueError),
        (dict(arch="sm_80", options=["-arch=sm_90"]), ValueError),
        (dict(arch="sm_80", options="-DA=1"), TypeError),
    ],
)
def test_rejects_bad_arguments(cache, kwargs, exc):
    with pytest.raises(exc):
        cache.compile("__global__ void k() {}", **kwargs)
    assert cache.nvrtc_compiles == 0


def test_caller_std_replaces_default(cache):
    source = 'static_assert(__cplusplus >= 202002L, "c++20");'
    res = cache.compile(source, options=["-std=c++20"], arch="sm_80")
    assert res.cubin.startswith(ELF_MAGIC)


# --- the key ------------------------------------------------------------------------


KEY_AXES = {
    "source": dict(source=SOURCE + "\n// edited\n"),
    "source name": dict(name="other.cu"),
    "header contents": dict(headers={"scale.cuh": HEADERS["scale.cuh"] + "// edited\n"}),
    "new header": dict(headers={**HEADERS, "unused.cuh": "// never included\n"}),
    "option added": dict(options=["-DA=1", "-DB=2", "-lineinfo"]),
    "option changed": dict(options=["-DA=1", "-DB=3"]),
    "option reordered": dict(options=["-DB=2", "-DA=1"]),
    "arch": dict(arch="sm_89"),
    "name expressions": dict(name_expressions=["add_n<3>"]),
}

PATCHED_AXES = {
    "nvrtc version": (_nvrtc, "nvrtc_version", lambda: (99, 9)),
    "package version": (nvrtc_cache, "__version__", "999.0"),
    "schema version": (_key, "SCHEMA_VERSION", _key.SCHEMA_VERSION + 1),
    "system headers": (_sysinclude, "fingerprint", lambda directory: "other headers"),
}


@pytest.mark.parametrize("axis", sorted(KEY_AXES))
def test_every_input_axis_invalidates(cache, axis):
    base = _compile(cache)
    changed = _compile(cache, **KEY_AXES[axis])
    assert changed.key != base.key
    assert changed.source == "compiled"
    assert cache.nvrtc_compiles == 2


@pytest.mark.parametrize("axis", sorted(PATCHED_AXES))
def test_every_environment_axis_invalidates(cache, axis, monkeypatch):
    base = _compile(cache)
    module, attribute, value = PATCHED_AXES[axis]
    monkeypatch.setattr(module, attribute, value)
    changed = _compile(cache)
    assert changed.key != base.key
    assert changed.source == "compiled"
    assert cache.nvrtc_compiles == 2


def test_key_ignores_header_order_and_duplicate_name_expressions(cache):
    a = _compile(
        cache, headers={"a.cuh": "", **HEADERS}, name_expressions=["add_n<1>", "add_n<2>"]
    )
    b = _compile(
        cache, headers={**HEADERS, "a.cuh": ""}, name_expressions=["add_n<2>", "add_n<1>", "add_n<1>"]
    )
    assert a.key == b.key and b.source == "memory"


def test_key_fields_are_length_prefixed():
    def key(options, source=b"s"):
        return _key.compute_key(
            schema_version=1, package_version="v", nvrtc_version=(13, 0), arch="sm_80",
            options=options, source=source, name="k.cu", headers=(),
            sysinclude_fingerprint="f", name_expressions=(),
        )

    assert key(["ab", "c"]) != key(["a", "bc"])
    assert key(["-DA"]) != key([], source=b"-DAs")
    assert key(["x"]) == key(["x"])


def test_sysinclude_fingerprint_follows_contents(tmp_path):
    (tmp_path / "cuda_fp16.h").write_text("v1")
    fingerprint = _sysinclude.fingerprint.__wrapped__  # bypass the per-process memo
    first = fingerprint(str(tmp_path))
    (tmp_path / "cuda_fp16.h").write_text("v2")
    assert fingerprint(str(tmp_path)) != first
    assert _sysinclude.include_dir() is not None  # the wheel's headers are found


# --- inspection -------------------------------------------------------------------------


def test_info_entries_and_clear(cache):
    assert cache.info()["entries"] == 0 and cache.clear() == 0
    a, b = _compile(cache), _compile(cache, arch="sm_90a")

    info = cache.info()
    assert info["directory"] == str(cache.directory)
    assert info["entries"] == 2 and info["writable"] is True
    assert info["total_bytes"] == sum(p.stat().st_size for p in cache.directory.iterdir()) > 0
    assert {e.key for e in cache.entries()} == {a.key, b.key}

    assert cache.clear() == 2
    assert cache.info()["entries"] == 0 and _files(cache.directory) == []
    assert _compile(cache).source == "compiled"  # memory was cleared too


def test_import_does_no_nvrtc_work():
    code = "import sys, nvrtc_cache; print(sorted(m for m in sys.modules if m.startswith('cuda')))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True,
        cwd=Path(nvrtc_cache.__file__).parents[1],
    ).stdout
    assert out.strip() == "[]"


def test_nvrtc_version():
    major, minor = nvrtc_version()
    assert major >= 12 and minor >= 0
