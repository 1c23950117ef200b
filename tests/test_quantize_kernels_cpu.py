"""The quantize_fp8 / dequantize device kernels without a GPU: their launch geometry, and every
kernel compiled by NVRTC (no spills, the saturating e4m3 conversion, the params struct as in the
source).
"""

from __future__ import annotations

import ctypes
import re

import pytest

import nvrtc_cache
from cudattn._kernels import registry as _kernels
from cudattn._kernels import quantize as _quantize_kernels
from cudattn._spec import quantize as _quantize_rule
from cudattn._kernels.quantize import Fp8QuantParams, all_quantize_kernels
from _quantize_cases import F16
import _sass as _sass_mod


# ---------------------------------------------------------------------------- launch geometry


def test_rows_follow_the_smaller_stride():
    g = _quantize_rule._Geom(2, 5, 6, 64, 2, "bshd")  # r = 3
    st_bsh = _quantize_kernels._contiguous_strides(g)  # (S*H*D, H*D, D)
    assert not _quantize_kernels._inner_is_seq(st_bsh, g)  # bshd: heads of a group are adjacent
    rows = _quantize_kernels._rows(st_bsh, g, False)
    assert (rows.stride_g, rows.stride_outer, rows.stride_inner, rows.n_outer, rows.n_inner) == (3 * 64, 6 * 64, 64,
                                                                                                5, 3)
    g2 = _quantize_rule._Geom(2, 5, 6, 64, 2, "bhsd")
    st2 = _quantize_kernels._contiguous_strides(g2)  # (b, s, h) strides of (B, H, S, D): (H*S*D, D, S*D)
    assert st2 == (6 * 5 * 64, 64, 5 * 64) and _quantize_kernels._inner_is_seq(st2, g2)
    rows2 = _quantize_kernels._rows(st2, g2, True)
    assert (rows2.stride_g, rows2.stride_outer, rows2.stride_inner, rows2.n_outer, rows2.n_inner) == (
        3 * 5 * 64, 5 * 64, 64, 3, 5)
    empty = _quantize_kernels._rows(st2, _quantize_rule._Geom(2, 0, 6, 64, 2, "bhsd"), True)
    assert empty.n_outer == 0 and empty.n_inner == 1


@pytest.mark.parametrize("D,vec,lpr", [(128, True, 32), (64, True, 16), (72, True, 32), (8, True, 2),
                                       (4, True, 1), (5, False, 8), (1, False, 1), (200, False, 32)])
def test_lanes_per_row(D, vec, lpr):
    g = _quantize_rule._Geom(1, 100, 4, D, 4, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    got, grid = _quantize_kernels._launch_shape(g, rows, vec, 132)
    assert got == lpr and grid[0] == 4 and 1 <= grid[1] <= 65535 and grid[2] == 1


def test_grid_stays_within_limits():
    g = _quantize_rule._Geom(1, 10**7, 1, 128, 1, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    _, grid = _quantize_kernels._launch_shape(g, rows, True, 132)
    assert grid == (1, 132 * 8, 1)  # enough blocks for the GPU; each walks many rows
    g = _quantize_rule._Geom(4096, 3, 32, 128, 32, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    _, grid = _quantize_kernels._launch_shape(g, rows, True, 132)
    assert grid == (4096 * 32, 1, 1)


def test_vec_needs_aligned_rows():
    g = _quantize_rule._Geom(1, 4, 2, 8, 2, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    assert _quantize_kernels._vec_ok(0x1000, 2, rows, 8)
    assert not _quantize_kernels._vec_ok(0x1002, 2, rows, 8)  # base 2 elements off
    assert not _quantize_kernels._vec_ok(0x1000, 2, rows, 6)
    odd = _quantize_kernels._Rows(18, 18, 6, 3, 4, 2)
    assert not _quantize_kernels._vec_ok(0x1000, 2, odd, 8)


# ---------------------------------------------------------------------------- kernels compile (NVRTC, no GPU)


@pytest.fixture(scope="module")
def cache(kernel_cache):
    return kernel_cache  # conftest: every kernel for sm_80, sm_89 and sm_90a, built in parallel


def _specs():
    return [pytest.param(arch, k, id=f"{arch}-{k.kernel_name}-{'-'.join(f'{a}{b}' for a, b in k.define_items)}")
            for arch in ("sm_80", "sm_89", "sm_90a") for k in all_quantize_kernels(arch)]


def test_all_quantize_kernels_lists_every_spec():
    names = {(k.kernel_name, k.define_items) for k in all_quantize_kernels()}
    assert len(names) == 9
    assert {n for n, _ in names} == {"fp8_amax", "fp8_quantize", "fp8_dequantize"}
    assert all(k.source == "fp8_quantize.cu" and k.smem_bytes == 0 for k in all_quantize_kernels())
    assert {k.kernel_name for k in all_quantize_kernels("sm_80")} == {"fp8_dequantize"}
    assert len(all_quantize_kernels("sm_89")) == len(all_quantize_kernels("sm_90a")) == 9
    hash(all_quantize_kernels()[0])  # get_kernel keys its in-process cache by the spec


@pytest.mark.parametrize("arch,spec", _specs())
def test_quantize_kernels_compile(cache, arch, spec, tmp_path):
    res = _kernels.compile_variant(spec, arch, cache=cache)
    assert res.cubin[:4] == b"\x7fELF"
    assert "warning" not in res.log, res.log
    rep = res.ptxas.get(spec.kernel_name)
    if rep is not None:
        assert rep.spill_stores == 0 and rep.spill_loads == 0 and rep.stack_bytes == 0, rep
        assert rep.registers * spec.threads <= 65536
    sass = _sass(res.cubin, tmp_path)
    if sass is not None:
        assert "LDL" not in sass and "STL" not in sass
        if spec.kernel_name == "fp8_quantize":
            assert re.search(r"F2FP\.SATFINITE\.E4M3", sass), "the saturating e4m3 conversion is missing"


def test_quantize_kernels_need_sm89(cache):
    with pytest.raises(nvrtc_cache.CompileError):
        _kernels.compile_variant(_quantize_kernels.quantize_kernel(F16), "sm_80", cache=cache)


def _sass(cubin: bytes, tmp_path) -> str | None:
    return _sass_mod.sass_or_none(cubin, tmp_path)


def test_params_struct_matches_source():
    source, _ = _kernels.sources("fp8_quantize.cu")
    body = source.split("struct Fp8QuantParams {", 1)[1].split("};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        first, *more = decl.split(",")
        names += [first.split()[-1].lstrip("*")] + [m.strip() for m in more]
    assert names == [f[0] for f in Fp8QuantParams._fields_]
    assert ctypes.sizeof(Fp8QuantParams) == 4 * 8 + 12 * 8 + 5 * 4 + 4  # padded to 8 bytes, as in C


def test_threads_match_source():
    source, _ = _kernels.sources("fp8_quantize.cu")
    assert re.search(r"constexpr int THREADS = (\d+);", source).group(1) == str(_quantize_kernels.THREADS)
