"""nvrtc_cache: NVRTC compile + on-disk CUBIN cache. CPU only (NVRTC needs no GPU)."""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import nvrtc_cache
from nvrtc_cache import (
    Cache,
    CompileError,
    CompileResult,
    PtxasReport,
    compile,
    default_cache,
    nvrtc_version,
)
from nvrtc_cache import _key, _nvrtc, _sysinclude

ELF_MAGIC = b"\x7fELF"

HEADERS = {"scale.cuh": "#pragma once\n#define SCALE 2.0f\n"}
SOURCE = r"""
#include <cuda_fp16.h>
#include "scale.cuh"

extern "C" __global__ void scale_half(__half* x, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? __half2float(x[i]) * SCALE : 0.f;
    __syncthreads();
    if (i < n) x[i] = __float2half(tile[blockDim.x - 1 - threadIdx.x]);
}

template <int N>
__global__ void add_n(float* x) { x[threadIdx.x] += N; }
"""
BASE = dict(
    source=SOURCE, name="kernel.cu", headers=HEADERS, options=["-DA=1", "-DB=2"], arch="sm_80"
)


@pytest.fixture(autouse=True)
def _private_default_dir(tmp_path, monkeypatch):
    # No test may touch the real ~/.cache, even through default_cache().
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture
def cache(tmp_path):
    return Cache(tmp_path / "cache")


def _compile(cache, **overrides):
    kwargs = {**BASE, **overrides}
    return cache.compile(kwargs.pop("source"), **kwargs)


def _files(directory):
    return sorted(p.name for p in Path(directory).iterdir())


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


# --- memory and disk layers ---------------------------------------------------------


def test_memory_hit(cache):
    first = _compile(cache)
    second = _compile(cache)
    assert (first.source, second.source) == ("compiled", "memory")
    assert second.cubin == first.cubin and second.key == first.key
    assert cache.nvrtc_compiles == 1


def test_results_do_not_share_mutable_state(cache):
    first = _compile(cache, name_expressions=["add_n<3>"])
    # NVRTC 13.0 on the GPU machines sometimes returns an empty log, hence no ptxas report at all.
    had_ptxas = bool(first.ptxas)
    first.lowered_names.clear()
    first.ptxas.clear()
    second = _compile(cache, name_expressions=["add_n<3>"])
    assert second.lowered_names and bool(second.ptxas) == had_ptxas


def test_disk_hit_skips_nvrtc(tmp_path):
    compiled = _compile(Cache(tmp_path), name_expressions=["add_n<3>"])
    fresh = Cache(tmp_path)
    hit = _compile(fresh, name_expressions=["add_n<3>"])
    assert hit.source == "disk" and fresh.nvrtc_compiles == 0
    assert hit.cubin == compiled.cubin
    assert hit.log == compiled.log and hit.ptxas == compiled.ptxas
    assert hit.lowered_names == compiled.lowered_names
    assert _compile(fresh, name_expressions=["add_n<3>"]).source == "memory"


def _damage_flip_payload(path):
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))


def _damage_flip_magic(path):
    blob = bytearray(path.read_bytes())
    blob[0] ^= 0xFF
    path.write_bytes(bytes(blob))


def _damage_truncate_half(path):
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])


def _damage_empty(path):
    path.write_bytes(b"")


def _damage_garbage(path):
    path.write_bytes(b"not an entry at all" * 10)


@pytest.mark.parametrize(
    "damage",
    [
        _damage_flip_payload,
        _damage_flip_magic,
        _damage_truncate_half,
        _damage_empty,
        _damage_garbage,
    ],
    ids=lambda f: f.__name__.removeprefix("_damage_"),
)
def test_damaged_entry_is_a_miss_and_is_rewritten(tmp_path, damage):
    good = _compile(Cache(tmp_path))
    (entry,) = Cache(tmp_path).entries()
    damage(entry.path)

    cache = Cache(tmp_path)
    again = _compile(cache)
    assert again.source == "compiled" and cache.nvrtc_compiles == 1
    assert again.cubin == good.cubin

    healed = Cache(tmp_path)
    assert _compile(healed).source == "disk" and healed.nvrtc_compiles == 0


def test_entry_under_another_keys_name_is_a_miss(tmp_path):
    a = _compile(Cache(tmp_path))
    b_key = _compile(Cache(tmp_path / "elsewhere"), arch="sm_89").key
    cache = Cache(tmp_path)
    (cache.directory / f"{b_key}.cubin-entry").write_bytes(
        (cache.directory / f"{a.key}.cubin-entry").read_bytes()
    )
    assert _compile(cache, arch="sm_89").source == "compiled"


def _race_worker(directory, barrier, results):
    try:
        cache = Cache(directory)
        barrier.wait(timeout=60)
        res = _compile(cache)
        results.put((res.key, res.cubin, res.source))
    except BaseException as exc:  # report, don't hang the parent
        results.put(("error", repr(exc), ""))


def test_processes_racing_on_one_key(tmp_path):
    directory = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    workers = [
        ctx.Process(target=_race_worker, args=(str(directory), barrier, results)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    assert all(key != "error" for key, _, _ in outcomes), outcomes
    keys, cubins, _ = zip(*outcomes)
    assert len(set(keys)) == 1 and len(set(cubins)) == 1
    assert cubins[0].startswith(ELF_MAGIC)
    assert _files(directory) == [f"{keys[0]}.cubin-entry"]  # one entry, no temp files
    loaded = Cache(directory).load(keys[0])
    assert loaded is not None and loaded.cubin == cubins[0]


def test_threads_racing_on_one_key_compile_once(cache):
    barrier = threading.Barrier(8)
    results = []

    def work():
        barrier.wait()
        results.append(_compile(cache))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.nvrtc_compiles == 1
    assert len({r.cubin for r in results}) == 1 and len(results) == 8
    assert sorted(r.source for r in results) == ["compiled"] + ["memory"] * 7


# --- unwritable directories ---------------------------------------------------------


def _compile_twice_counting_warnings(cache):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _compile(cache)
        second = _compile(cache, source=SOURCE + "// another kernel\n")
    assert first.source == second.source == "compiled"
    assert first.cubin.startswith(ELF_MAGIC) and second.cubin.startswith(ELF_MAGIC)
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]
    assert str(cache.directory) in str(runtime[0].message)
    assert _compile(cache).source == "memory"
    assert cache.info()["writable"] is False


def test_directory_under_a_regular_file_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _compile_twice_counting_warnings(Cache(blocker / "cache"))


def test_read_only_directory_falls_back_to_memory(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("this process ignores permission bits (root with CAP_DAC_OVERRIDE)")
        _compile_twice_counting_warnings(Cache(directory))
    finally:
        directory.chmod(0o700)


# --- where the cache lives ----------------------------------------------------------


def test_created_directory_is_private(tmp_path):
    cache = Cache(tmp_path / "new" / "cache")
    assert not cache.directory.exists()  # nothing happens until the first compile
    _compile(cache)
    assert stat.S_IMODE(cache.directory.stat().st_mode) == 0o700


def test_environment_chooses_the_default_directory(tmp_path, monkeypatch):
    chosen = tmp_path / "chosen"
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(chosen))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Cache().directory == chosen
    res = compile(BASE["source"], headers=HEADERS, arch="sm_80")  # the module-level entry point
    assert res.source == "compiled"
    assert _files(chosen) == [f"{res.key}.cubin-entry"]
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700
    assert compile(BASE["source"], headers=HEADERS, arch="sm_80").source == "memory"
    assert default_cache() is default_cache()

    monkeypatch.delenv("CUDATTN_CACHE_DIR")
    assert Cache().directory == tmp_path / "xdg" / "cudattn"
    assert default_cache().directory == (tmp_path / "xdg" / "cudattn").resolve()

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Cache().directory == tmp_path / "home" / ".cache" / "cudattn"


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
