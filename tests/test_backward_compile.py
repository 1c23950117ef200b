"""CPU: every backward build (each dtype, head-dim width, causal or not, softcap and ALiBi; on
sm_90a the Hopper kernel's too) compiles for sm_80, sm_89 and sm_90a without register spills or
stack (one stated exception), within the target's shared memory, with the instructions it was
written for in its main kernel (the portable one: mma.sync m16n8k16, ldmatrix, cp.async; the Hopper
one: wgmma with transposed operands, TMA loads and reductions, no wgmma serialized for want of
registers at head dim 128); Hopper is sent the Hopper kernel where it serves the call; and the
ctypes `BwdParams` and `BwdSm90Params` match the headers field for field."""

from __future__ import annotations

import ctypes
import re

import pytest

from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import registry as _kernels
from cudattn._kernels import traits as _traits
from cudattn._kernels.params import BwdParams, BwdSm90Params, FwdParams
from cudattn._spec.modifiers import MOD_SOFTCAP as _MOD_SOFTCAP
import _sass as _sass_mod

ARCHS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="module")
def cache(kernel_cache):
    return kernel_cache


def _builds():
    return [pytest.param(arch, k, id=f"{arch}-{k.describe().replace(' ', '-')}")
            for arch in ARCHS for k in _bt.all_backward_kernels(arch)]


def _spill_allowance(kern) -> int:
    """Bytes a build may spill: none, but the Hopper kernel's head-dim-64 builds, whose 128-query
    S^T and dP^T beside dK and dV fill the 240 registers: one 32-bit value, stored and reloaded
    once per query block (L1), in the causal build. (The portable 192-wide causal ALiBi builds
    spilled two values until ALiBi's distance took one base a tile, bwd/scores.cuh.)"""
    return 8 if kern.family == "sm90" and kern.tile_dim == 64 else 0


@pytest.mark.parametrize("arch,kern", _builds())
def test_backward_build_has_no_spills(cache, arch, kern):
    res = _kernels.compile_variant(kern, arch, cache=cache)
    assert kern.smem_bytes <= _traits.ARCH_SMEM_LIMIT[arch]
    allowed = _spill_allowance(kern)
    for entry in kern.entries:
        rep = res.ptxas.get(entry)
        assert rep is not None, f"{entry} missing from {kern.describe()} on {arch}"
        limit = allowed if entry == kern.main else 0
        assert rep.spill_stores <= limit and rep.spill_loads <= limit and rep.stack_bytes <= limit, \
            f"{kern.describe()} {entry} spills on {arch}: {rep}"


@pytest.mark.parametrize("arch", ARCHS)
def test_backward_sass_uses_tensor_cores(cache, arch, tmp_path):
    kern = _bt.select_backward("bfloat16", 128, True, _traits.ARCH_SMEM_LIMIT[arch])
    sass = _sass_mod.sass(_kernels.compile_variant(kern, arch, cache=cache).cubin, tmp_path)
    main = sass[sass.index("flash_bwd_sm80"):]
    assert "HMMA.16816.F32.BF16" in main and "LDSM" in main and "LDGSTS" in main


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_64_keeps_wgmma_async(cache, dtype, causal):
    """Head dim 64's 128-query blocks hold S^T and dP^T of 64 x 128 in registers: its products
    still run asynchronously (ptxas serializes wgmma where registers run out, warning C7512)."""
    kern = _bt.select_backward(dtype, 64, causal, _traits.ARCH_SMEM_LIMIT["sm_90a"], 0, "sm90")
    res = _kernels.compile_variant(kern, "sm_90a", cache=cache)
    assert "C7512" not in res.log, "wgmma serialized for want of registers"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_hopper_backward_sass_uses_wgmma_and_tma(cache, dtype, tmp_path):
    kern = _bt.select_backward(dtype, 128, True, _traits.ARCH_SMEM_LIMIT["sm_90a"], 0, "sm90")
    res = _kernels.compile_variant(kern, "sm_90a", cache=cache)
    assert "C7512" not in res.log, "wgmma serialized for want of registers"
    sass = _sass_mod.sass(res.cubin, tmp_path)
    main = sass[sass.index("flash_bwd_sm90"):]
    for op in ("HGMMA.64x64x16.F32", ".tnspA.tnspB", "HGMMA.64x128x16.F32", "UTMALDG.4D", "UTMAREDG.4D.ADD"):
        assert op in main, op


@pytest.mark.parametrize("causal", [False, True])
def test_wide_hopper_backward_sass(cache, causal, tmp_path):
    """Head dim 256 on Hopper: its own consumers (64 x 32 score products, 64 x 128 and 64 x 64
    gradient products with both operands in shared memory), dQ added by the writer's TMA
    reductions (two passes a block), no atomics, and wgmma not serialized for want of registers."""
    kern = _bt.select_backward("bfloat16", 256, causal, _traits.ARCH_SMEM_LIMIT["sm_90a"], 0, "sm90")
    assert kern.family == "sm90" and (kern.tiles.block_m, kern.tiles.block_n) == (64, 64)
    res = _kernels.compile_variant(kern, "sm_90a", cache=cache)
    assert "C7512" not in res.log, "wgmma serialized for want of registers"
    sass = _sass_mod.sass(res.cubin, tmp_path)
    main = sass[sass.index("flash_bwd_sm90"):]
    main = main[:main.index("Function : ")] if "Function : " in main else main
    for op in ("HGMMA.64x32x16.F32", "HGMMA.64x128x16.F32", "HGMMA.64x64x16.F32", "UTMALDG.4D", "UTMAREDG.4D.ADD"):
        assert op in main, op
    assert "ATOMG" not in main and "REDG.E.ADD.F32" not in main


def test_hopper_gets_the_hopper_kernel_where_it_serves():
    from types import SimpleNamespace
    hopper = SimpleNamespace(arch="sm_90a", max_shared_memory_per_block_optin=_traits.ARCH_SMEM_LIMIT["sm_90a"])
    ampere = SimpleNamespace(arch="sm_80", max_shared_memory_per_block_optin=_traits.ARCH_SMEM_LIMIT["sm_80"])
    assert _bt.select_for_device("bfloat16", 96, True, hopper).family == "sm90"
    assert _bt.select_for_device("bfloat16", 96, True, hopper).tile_dim == 128
    assert _bt.select_for_device("float16", 40, False, hopper).tile_dim == 64
    assert _bt.select_for_device("float16", 64, False, hopper, _MOD_SOFTCAP).family == "sm80"
    assert _bt.select_for_device("float16", 64, False, hopper, tma=False).family == "sm80"
    assert _bt.select_for_device("float16", 64, False, ampere).family == "sm80"


def _header_fields(text: str, struct: str) -> list[str]:
    """Field names of a C struct, in order (``int a, b;`` declares two)."""
    body = re.sub(r"//[^\n]*", "", re.search(r"struct " + struct + r" \{(.*?)\n\};", text, re.S).group(1))
    names = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *rest = (d.strip() for d in decl.split(","))
        names += [re.split(r"[\s*]+", first)[-1], *rest]
    return names


def test_bwd_params_mirror_the_header():
    text = (_kernels.source_root() / "include" / "cudattn" / "bwd" / "params.cuh").read_text()
    assert _header_fields(text, "BwdParams") == [f[0] for f in BwdParams._fields_]
    # by value: the forward's struct first, then 8-byte pointers and strides, ints last
    assert BwdParams.f.offset == 0 and BwdParams.dout.offset == ctypes.sizeof(FwdParams)
    assert ctypes.sizeof(BwdParams) % 8 == 0
    text = (_kernels.source_root() / "include" / "cudattn" / "bwd" / "sm90_params.cuh").read_text()
    assert _header_fields(text, "alignas\\(64\\) BwdSm90Params") == [f[0] for f in BwdSm90Params._fields_ if f[0] != "pad_"]
    assert all(getattr(BwdSm90Params, f"tma_{n}").offset == 128 * i for i, n in enumerate(("q", "k", "v", "do", "dq")))
    assert ctypes.sizeof(BwdSm90Params) % 64 == 0
