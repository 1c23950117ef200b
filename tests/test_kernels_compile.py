"""CPU: every kernel variant compiles for sm_80, sm_89 and sm_90a without register spills, and
its SASS has the instructions it was written for (the portable family: mma.sync, ldmatrix,
cp.async; the Hopper family: wgmma, TMA loads and stores, setmaxnreg). NVRTC needs no GPU."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

import nvrtc_cache
from cudattn._kernels import registry as _kernels
from cudattn._kernels import traits as _traits
from cudattn._kernels.params import FwdParams, FwdSm90Params
import _sass as _sass_mod

ARCHS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="module")
def cache(kernel_cache):
    return kernel_cache  # conftest: every kernel for sm_80, sm_89 and sm_90a, built in parallel


def _variants():
    seen = []
    for arch in ARCHS:
        for v in _traits.all_variants(arch) + _traits.mods_variants(arch):
            seen.append(pytest.param(arch, v, id=f"{arch}-{v.describe().replace(' ', '-')}"))
    return seen


@pytest.mark.parametrize("arch,variant", _variants())
def test_variant_compiles_without_spills(cache, arch, variant, tmp_path):
    res = _kernels.compile_variant(variant, arch, cache=cache)
    assert res.cubin[:4] == b"\x7fELF"
    assert variant.smem_bytes <= _traits.ARCH_SMEM_LIMIT[arch]
    rep = res.ptxas.get(variant.kernel_name)
    if rep is None:
        # Some NVRTC builds (seen: 13.0 on the GPU machines) intermittently return an empty log
        # for -Xptxas=-v; read the same facts off the cubin instead.
        registers, local = _resource_usage(res.cubin, variant.kernel_name, tmp_path)
        assert local == 0, f"{variant.describe()} uses {local} B of local memory (spills/stack) on {arch}"
    else:
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{variant.describe()} spills on {arch}: {rep}"
        assert rep.stack_bytes == 0, f"{variant.describe()} uses a stack frame on {arch}: {rep}"
        registers = rep.registers
    if variant.family == "sm90":
        # ptxas C7514/C7515: it could not prove the accumulators untouched while a wgmma runs and
        # made every wgmma wait for the one before (seen: a 25 % loss everywhere, correct results).
        assert "serialized" not in res.log, f"{variant.describe()}: wgmma serialized by ptxas:\n{res.log}"
    # Registers x threads x min blocks must fit the 64K register file, or the launch bound lied.
    assert registers * variant.threads * variant.tiles.min_blocks <= 65536


def _resource_usage(cubin: bytes, name: str, tmp_path) -> tuple[int, int]:
    """(registers, local-memory bytes) of the kernel, from `cuobjdump -res-usage`."""
    tool = _sass_mod.tool("cuobjdump")
    if tool is None:
        pytest.skip("NVRTC gave no ptxas report and cuobjdump is not installed")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    text = subprocess.run([tool, "-res-usage", str(path)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"Function " + name + r":\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    assert m, text
    return int(m.group(1)), int(m.group(2)) + int(m.group(3))


def _sass(cache, variant, arch, tmp_path) -> str:
    return _sass_mod.sass(_kernels.compile_variant(variant, arch, cache=cache).cubin, tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_sass_uses_tensor_cores_and_no_local_memory(cache, arch, tmp_path):
    variant = _traits.select("float16", 128, True, _traits.ARCH_SMEM_LIMIT[arch])
    sass = _sass(cache, variant, arch, tmp_path)
    assert "HMMA.16816.F32" in sass, "mma.sync m16n8k16 with fp32 accumulation expected"
    assert "LDSM" in sass and "LDGSTS" in sass, "ldmatrix and cp.async expected"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic in the kernel"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", _traits.SM90_TILE_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_sass(cache, dtype, d, causal, tmp_path):
    """wgmma for both products (S: m64 x BLOCK_N, O: m64 x head-dim tile), TMA loads, register
    reallocation between the roles, and no local memory anywhere."""
    variant = _traits.select(dtype, d, causal, _traits.ARCH_SMEM_LIMIT["sm_90a"], "sm90")
    sass = _sass(cache, variant, "sm_90a", tmp_path)
    ty = r"\.BF16" if dtype == "bfloat16" else r"(?!\.BF16)"  # SASS spells out BF16 only; F16 is the default
    n = variant.tiles.block_n
    assert re.search(rf"HGMMA\.64x{n}x16\.F32{ty}", sass), f"wgmma m64n{n}k16 (S = Q K^T) expected"
    assert re.search(rf"HGMMA\.64x{d}x16\.F32{ty}", sass), f"wgmma m64n{d}k16 (O += P V) expected"
    assert "UTMALDG.4D" in sass, "TMA loads expected"
    assert "USETMAXREG" in sass, "setmaxnreg expected (producer/consumer register split)"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic in the kernel"


def test_hopper_family_needs_sm90a(cache):
    variant = _traits.select("float16", 128, False, 232448, "sm90")
    with pytest.raises(ValueError, match="sm_90a"):
        _kernels.compile_variant(variant, "sm_80", cache=cache)


def test_family_choice():
    assert _traits.family_for("sm_80") == "sm80" and _traits.family_for("sm_89") == "sm80"
    assert _traits.family_for("sm_90a") == ("sm80" if _traits.FORCED_FAMILY == "sm80" else "sm90")


def test_params_struct_matches_header():
    """The ctypes mirror has the header's fields, in order, at the C layout's size."""
    _, headers = _kernels.sources()
    body = headers["cudattn/params.cuh"].split("struct FwdParams {", 1)[1].split("};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        first, *more = decl.split(",")  # "long long a, b, c": the type precedes the first name only
        names += [first.split()[-1].lstrip("*")] + [m.strip() for m in more]
    assert names == [f[0] for f in FwdParams._fields_]
    assert ctypes.sizeof(FwdParams) == 320


def test_sm90_params_struct_matches_header():
    """Four 128-byte tensor maps at 64-byte offsets, then FwdParams; size a multiple of 64."""
    _, headers = _kernels.sources()
    body = headers["cudattn/sm90/params.cuh"].split("struct alignas(64) FwdSm90Params {", 1)[1].split("};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    assert re.sub(r"\s+", " ", body).strip() == ("cudattn::sm90::TmaDescriptor tma_q, tma_k, tma_v, tma_o; FwdParams p; "
                                                 "int tile_order; int o_tma; int* tile_counter;")
    assert [f[0] for f in FwdSm90Params._fields_] == ["tma_q", "tma_k", "tma_v", "tma_o", "p", "tile_order", "o_tma",
                                                      "tile_counter", "pad_"]
    for i, name in enumerate(("tma_q", "tma_k", "tma_v", "tma_o")):
        assert getattr(FwdSm90Params, name).offset == 128 * i
    assert FwdSm90Params.p.offset == 512 and ctypes.sizeof(FwdSm90Params) == 896
    assert FwdSm90Params.tile_counter.offset == 512 + ctypes.sizeof(FwdParams) + 8


def _decode_kernels():
    from cudattn._kernels import decode_traits as _decode_traits

    return [pytest.param(arch, k, id=f"{arch}-{k.describe().replace(' ', '-')}")
            for arch in ARCHS for k in _decode_traits.all_decode_kernels(arch)]


@pytest.mark.parametrize("arch,kernel", _decode_kernels())
def test_decode_kernels_compile_without_spills(cache, arch, kernel, tmp_path):
    """The split-KV kernel, the combine and the append: no spills, no stack, within shared memory,
    and registers that let the decode kernel's blocks fit the register file."""
    res = _kernels.compile_variant(kernel, arch, cache=cache)
    assert kernel.smem_bytes <= _traits.ARCH_SMEM_LIMIT[arch]
    rep = res.ptxas.get(kernel.kernel_name)
    if rep is None:
        registers, local = _resource_usage(res.cubin, kernel.kernel_name, tmp_path)
        assert local == 0
    else:
        assert rep.spill_stores == 0 and rep.spill_loads == 0 and rep.stack_bytes == 0, rep
        registers = rep.registers
    assert registers * kernel.threads <= 65536
    if kernel.family == "decode":
        sass = _sass_of(res.cubin, tmp_path)
        if sass is not None:
            assert "HMMA" in sass and "LDGSTS" in sass and "LDL" not in sass and "STL" not in sass


def _sass_of(cubin: bytes, tmp_path) -> str | None:
    return _sass_mod.sass_or_none(cubin, tmp_path)


def test_decode_params_structs_match_header():
    """Field names of the ctypes mirrors equal the header's, in order."""
    from cudattn._kernels import params as _params

    _, headers = _kernels.sources()
    text = re.sub(r"//[^\n]*", "", headers["cudattn/params.cuh"] + headers["cudattn/params_decode.cuh"])
    for cname, cls in (("KvCacheGeom", _params.KvCacheGeom), ("DecodeParams", _params.DecodeParams),
                       ("CombineParams", _params.CombineParams), ("AppendParams", _params.AppendParams)):
        body = text.split(f"struct {cname} {{", 1)[1].split("};", 1)[0]
        names = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            first, *more = decl.split(",")
            names += [first.split()[-1].lstrip("*").split("[")[0]] + [m.strip() for m in more]
        assert names == [f[0] for f in cls._fields_], cname
    assert ctypes.sizeof(_params.KvCacheGeom) == 40


def test_decode_merge_knows_the_most_splits():
    """The decode merge holds every split's LSE and weight (decode/store.cuh's MAX_SPLITS): the same
    count as the call path's limit and the C export's."""
    from cudattn._spec.validate import MAX_SPLITS

    _, headers = _kernels.sources()
    store = re.search(r"static constexpr int MAX_SPLITS = (\d+);", headers["cudattn/decode/store.cuh"])
    assert store is not None and int(store.group(1)) == MAX_SPLITS
    exported = _kernels.source_root().joinpath("export", "cudattn.h").read_text(encoding="utf-8")
    assert re.search(rf"#define CUDATTN_MAX_SPLITS {MAX_SPLITS}\b", exported)


@pytest.mark.parametrize("seqlen_q,causal,block_m,per_sm", [
    (None, True, 192, 1), (512, True, 192, 1), (513, True, 192, 1), (576, True, 192, 1), (577, True, 64, 2),
    (640, True, 64, 2), (641, True, 192, 1), (768, True, 192, 1), (800, True, 64, 2), (896, True, 192, 1),
    (1000, True, 64, 2), (1024, True, 64, 2), (1025, True, 192, 1),
    (2048, True, 192, 1), (128, True, 128, 1), (1, True, 128, 1), (512, False, 192, 1), (1024, False, 192, 1),
    (None, False, 192, 1), (129, True, 192, 1), (192, True, 192, 1), (193, True, 128, 1), (256, True, 128, 1),
    (257, True, 192, 1), (192, False, 192, 1), (193, False, 128, 1), (256, False, 128, 1), (257, False, 192, 1),
    (384, True, 192, 1), (513, False, 192, 1)])
def test_hopper_head_dim_64_tiles_follow_the_query_length(seqlen_q, causal, block_m, per_sm):
    """Head dim 64 runs three consumer warpgroups (BM = 192; causal, each skips the key tiles its
    rows do not see), except causal calls of at most 128 query rows a sequence (one 128-row tile),
    calls of 193 to 256 rows (two 128-row tiles, causal or not) and causal calls of 513 to 1024
    rows whose last 192-row tile would hold at most 64 rows (64-row tiles of one consumer, two CTAs
    an SM: their build is told so, CUDATTN_MIN_BLOCKS), each with the same 128-key tiles; from 193
    to 1024 rows with three K/V stages (but the two-CTA tiles)."""
    for dt in ("float16", "bfloat16"):
        v = _traits.select(dt, 64, causal, 232448, "sm90", seqlen_q=seqlen_q, two_ctas=True)
        d = v.defines()
        assert (v.tiles.block_m, v.threads, d["CUDATTN_CONSUMERS"]) == (block_m, 128 * (block_m // 64 + 1), block_m // 64)
        assert (v.tiles.min_blocks, d.get("CUDATTN_MIN_BLOCKS", 1), v.tiles.block_n) == (per_sm, per_sm, 128)
        # three K/V stages: the short causal rows' tiles, and the rule of 193-1024 rows a sequence
        rows = seqlen_q or 0
        three = per_sm == 1 and (192 < rows <= 1024 or causal and 0 < rows <= 128)
        assert v.tiles.stages == (3 if three else 2), (seqlen_q, causal, v.tiles)
        if per_sm == 2:  # two CTAs' shared memory (and the driver's 1 KiB each) in one SM's 228 KiB
            assert 2 * (v.smem_bytes + 1024 + 1024) <= 233472
            # without two_ctas (the C launcher's choice, whose grids are one CTA an SM): the 192-row build
            launcher = _traits.select(dt, 64, causal, 232448, "sm90", seqlen_q=seqlen_q)
            assert (launcher.tiles.block_m, launcher.tiles.block_n, launcher.tiles.min_blocks) == (192, 128, 1)


def test_hopper_head_dim_256_causal_short_rows_take_64_key_tiles():
    """Causal head dim 256 of at most 512 query rows a sequence: 128x64 tiles (fewer masked keys on
    the diagonal than 80-key tiles); longer rows and full attention keep 128x80."""
    for dt in ("float16", "bfloat16"):
        pick = lambda causal, rows: _traits.select(dt, 256, causal, 232448, "sm90", seqlen_q=rows).tiles
        assert (pick(True, 512).block_m, pick(True, 512).block_n) == (128, 64)
        assert [pick(True, r).block_n for r in (1, 513, 2048, None)] == [64, 80, 80, 80]
        assert [pick(False, r).block_n for r in (1, 512, None)] == [80, 80, 80]
