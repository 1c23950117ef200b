"""The command line and first use without a GPU: misuse is one line and exit status 2, every
option's help shows its default, the warm-up covers every kernel the API can launch, and a call
with no driver raises cudattn's own error."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import cudattn
from cudattn._tools import cli as _cli
from cudattn._runtime import device as _device
from cudattn._kernels import registry as _kernels
from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import catalog as _catalog
from cudattn._kernels import traits as _traits
from cudattn._tools import warm as _warm

MISUSES = [
    ["cache", "warm", "--arch", "sm_75"],
    ["cache", "warm", "--arch", "sm_100"],
    ["cache", "warm", "--arch", "bogus"],
    ["cache", "frob"],
    ["cache", "warm", "--jobs", "0"],
    ["bench", "--shape", "1,2,3"],
    ["bench", "--shape", "1,3,2,64,64,64"],
    ["bench", "--shape", "1,2,64,300"],
    ["bench", "--iters", "0"],
    ["bench", "--grid", "quick", "--shape", "1,2,64,64"],
    ["bench", "--grid", "huge"],
    ["demo", "--batch", "x"],
    ["demo", "--head-dim", "-8"],
    ["demo", "--dtype", "float32"],
    ["demo", "--arch", "sm_75"],
    ["selfcheck", "--threads", "0"],
    ["selfcheck", "--tools", "nosuchtool"],
    ["nosuchcommand"],
    ["--nosuchoption"],
    [],
]


@pytest.mark.parametrize("argv", MISUSES, ids=lambda a: " ".join(a) or "(nothing)")
def test_misuse_is_one_line_and_status_2(argv):
    proc = subprocess.run([sys.executable, "-m", "cudattn", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_version():
    proc = subprocess.run([sys.executable, "-m", "cudattn", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"cudattn {cudattn.__version__}"
    assert cudattn.__version__ != ""


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action.choices, dict):  # the subcommands
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help_that_shows_its_default():
    seen = 0
    for parser in _parsers(_cli.build_parser([])):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            seen += 1
            name = f"{parser.prog} {action.option_strings[-1]}"
            assert action.help, f"{name} has no help"
            if action.default not in (None, False, []):
                assert "%(default)s" in formatter._get_help_string(action), f"{name}: default not shown"
                assert "(default" not in action.help, f"{name}: default written by hand too"
    assert seen > 30


@pytest.mark.parametrize("arch", _kernels.ARCHS)
def test_warm_covers_every_kernel_the_api_can_select(arch):
    """all_kernels (what warm and demo compile) holds every variant the selection can return."""
    builds = {(s.source, tuple(sorted(s.defines().items()))) for s in _catalog.all_kernels(arch)}
    limit = _traits.ARCH_SMEM_LIMIT[arch]
    families = ("sm80", "sm90") if arch in _traits.HOPPER_ARCHS else ("sm80",)
    dtypes = ["float16", "bfloat16"] + (["float8_e4m3fn"] if arch in _traits.FP8_ARCHS else [])
    for fam in families:
        for dt in dtypes:
            for d in _traits.SUPPORTED_HEAD_DIMS:
                if dt == "float8_e4m3fn" and d % 16:
                    continue
                for causal in (False, True):
                    outs = list(_traits.FP8_OUT_CODES) if dt == "float8_e4m3fn" else [None]
                    for out in outs:
                        for seqlen_q in (None, 1, 128, 129, 1024, 1025, 2048, 2049):
                            v = _traits.select(dt, d, causal, limit, fam, out, seqlen_q)
                            assert (v.source, tuple(sorted(v.defines().items()))) in builds, v.describe()
    for dt in ("float16", "bfloat16"):  # the backward: its four entry points share the build
        for d in range(8, _bt.BWD_TILE_DIMS[-1] + 1, 8):
            for causal in (False, True):
                for mods in (0, 1, 2, 3):
                    b = _bt.select_backward(dt, d, causal, limit, mods)
                    assert (b.source, tuple(sorted(b.defines().items()))) in builds, b.describe()
    sources = {s.source for s in _catalog.all_kernels(arch)}
    assert {"flash_decode.cu", "split_kv_combine.cu", "kv_cache_append.cu", "fp8_quantize.cu",
            "flash_bwd_sm80.cu"} <= sources
    assert ("fp8_transpose_v.cu" in sources) == (arch in _traits.FP8_ARCHS)
    # the ring's accumulators: warmed with the rest, left out of the C export (which has no ring)
    assert "ring_accumulate.cu" not in sources
    assert "ring_accumulate.cu" in {s.source for s in _catalog.all_kernels(arch, distributed=True)}


def test_warm_compiles_in_parallel_then_finds_everything_cached(tmp_path, monkeypatch):
    """A small warm-up through the real process pool: a cold cache compiles, a warm one compiles nothing."""
    import nvrtc_cache

    few = [s for s in _catalog.all_kernels("sm_80") if s.family == "helper"][:3]
    monkeypatch.setattr(_catalog, "all_kernels", lambda arch, **kw: few)
    cache = nvrtc_cache.Cache(tmp_path / "cache")
    cold = _warm.warm("sm_80", jobs=2, cache=cache, progress=False)
    assert (cold.kernels, cold.compiled, cold.cached, cold.failed, cold.jobs) == (3, 3, 0, [], 2)
    warm = _warm.warm("sm_80", jobs=2, cache=nvrtc_cache.Cache(tmp_path / "cache"), progress=False)
    assert (warm.compiled, warm.cached) == (0, 3)
    assert "3 kernels for sm_80: 0 compiled, 3 already cached" in warm.summary()


class _NoDriver:
    """cuda.bindings.driver as it behaves without libcuda: the first call raises (cuda.pathfinder's
    DynamicLibNotFoundError is a RuntimeError)."""

    def cuInit(self, flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search.')


def _no_driver(monkeypatch):
    monkeypatch.setattr(_device, "driver", _NoDriver())
    monkeypatch.setattr(_device, "_initialized", False)


@pytest.mark.parametrize("call", ["attention", "empty problem", "to_device", "kvcache"])
def test_no_driver_raises_no_device_error(monkeypatch, call):
    _no_driver(monkeypatch)
    q = np.random.default_rng(0).standard_normal((1, 8, 2, 64)).astype(np.float16)
    calls = {
        "attention": lambda: cudattn.attention(q, q, q),
        "empty problem": lambda: cudattn.attention(q[:0], q[:0], q[:0]),
        "to_device": lambda: cudattn.to_device(q),
        "kvcache": lambda: cudattn.attention_with_kvcache(q[:, :1], q, q, cache_seqlens=np.array([3], np.int32)),
    }
    with pytest.raises(cudattn.NoDeviceError) as info:
        calls[call]()
    assert isinstance(info.value, cudattn.CudaError)
    assert "libcuda" in str(info.value) and "python -m cudattn info" in str(info.value)


def test_empty_cache_without_a_driver_has_nothing_to_free(monkeypatch):
    _no_driver(monkeypatch)
    assert cudattn.empty_cache() is None


def test_no_device_seen_raises_no_device_error(monkeypatch):
    monkeypatch.setattr(_device, "_initialized", True)
    monkeypatch.setattr(_device, "_device_count", 0)
    monkeypatch.setattr(_device, "_tls", type(_device._tls)())
    monkeypatch.setattr(_device.driver, "cuCtxGetCurrent", lambda: (0, 0))
    with pytest.raises(cudattn.NoDeviceError, match="sees no GPU"):
        _device.get_device(None)
