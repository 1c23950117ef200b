"""`cudattn export` with no GPU: cubins, manifest, selection table, the C header of the parameter
structs, and the kernels' own struct declarations against the same layout."""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import nvrtc_cache
from cudattn import __version__
from cudattn._tools import cabi as _cabi
from cudattn._tools import cbuild as _cbuild
from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import decode_plan as _decode_plan
from cudattn._kernels import decode_traits as _decode_traits
from cudattn._tools import export as _export
from cudattn._kernels import registry as _kernels
from cudattn._kernels import catalog as _catalog
from cudattn._kernels import plan as _plan
from cudattn._kernels import traits as _traits

ARCHS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="module")
def exported(kernel_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    manifest = _export.export(out, ARCHS, cache=kernel_cache, progress=False)
    return out, manifest


def _file_of(entry: dict, spec) -> str:
    """The exported file of the build `spec`, found by its compile options."""
    opts = _kernels.options_for(spec)
    found = [k["file"] for k in entry["kernels"] if k["options"] == opts and k["source"] == spec.source]
    assert len(found) == 1, (spec.describe(), found)
    return found[0]


def test_every_build_is_written_once_and_intact(exported):
    out, manifest = exported
    assert manifest["format"] == _export.FORMAT and manifest["cudattn"] == __version__
    for arch in ARCHS:
        entry = manifest["archs"][arch]
        assert len(entry["kernels"]) == len(_catalog.all_kernels(arch))
        assert len({k["file"] for k in entry["kernels"]}) == len(entry["kernels"])
        for k in entry["kernels"]:
            blob = (out / arch / k["file"]).read_bytes()
            assert blob[:4] == b"\x7fELF" and hashlib.sha256(blob).hexdigest() == k["sha256"]
            assert k["entries"] and all("registers" in k["ptxas"][e] for e in k["entries"])
        kinds = {k["kind"] for k in entry["kernels"]}
        assert {"prefill", "decode", "combine", "append", "dequantize", "backward"} <= kinds
        for k in entry["kernels"]:  # a backward build: one cubin, its four entry points and how each launches
            if k["kind"] == "backward":
                entries = ["flash_bwd_prepare", _bt.MAIN[k["family"]], "flash_bwd_finish_dq", "flash_bwd_dsinks"]
                assert k["entries"] == sorted(entries) and list(k["launch"]) == entries, k["file"]
                assert k["launch"][_bt.MAIN[k["family"]]] == {"threads": k["threads"], "dynamic_smem": k["dynamic_smem"]}
            else:
                assert "launch" not in k
        assert ({"quantize", "transpose"} <= kinds) == (arch in _traits.FP8_ARCHS)
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    digest = hashlib.sha256()
    for arch in ARCHS:
        for k in manifest["archs"][arch]["kernels"]:
            digest.update(f"{arch}/{k['file']}:{k['sha256']}\n".encode())
    assert manifest["id"] == digest.hexdigest()[:32]
    assert f'#define CUDATTN_EXPORT_ID "{manifest["id"]}"' in (out / "include" / "cudattn_kernels.h").read_text()


def _table_row(entry, **want):
    rows = [r for r in entry["selection"] if all(r.get(k) == v for k, v in want.items())]
    assert len(rows) == 1, (want, rows)
    return rows[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_selection_table_picks_what_python_picks(exported, arch):
    """For every input the Python selection distinguishes, the manifest's table names the cubin of
    the variant `select` returns, and the rules reproduce the tile width."""
    _, manifest = exported
    entry = manifest["archs"][arch]
    rules = manifest["rules"]
    limit = _traits.ARCH_SMEM_LIMIT[arch]
    fams = ("sm80", "sm90") if arch in _traits.HOPPER_ARCHS else ("sm80",)
    for fam in fams:
        for dt in ("float16", "bfloat16"):
            dims = rules["tile_dims"][fam]
            for d in _traits.SUPPORTED_HEAD_DIMS:
                tile = min(t for t in dims if t >= d)
                for causal in (False, True):
                    for seqlen in (1, 128, 129, 192, 193, 256, 257, 512, 513, 1024, 1025, 2048, 2049, None):
                        spec = _traits.select(dt, d, causal, limit, fam, seqlen_q=seqlen)
                        rows = [r for r in entry["selection"] if r["kind"] == "prefill" and r["family"] == fam
                                and r["dtype"] == dt and r["tile_dim"] == tile and r["causal"] == causal]
                        short = [r for r in rows if r["seqlen_q_max"] is not None and seqlen is not None
                                 and seqlen <= r["seqlen_q_max"]]
                        row = (min(short, key=lambda r: r["seqlen_q_max"]) if short
                               else next(r for r in rows if r["seqlen_q_max"] is None))
                        assert row["file"] == _file_of(entry, spec), (fam, dt, d, causal, seqlen)
        if arch in _traits.FP8_ARCHS:
            for d in range(16, 257, 16):
                tile = min(t for t in rules["tile_dims"][f"fp8_{fam}"] if t >= d)
                for causal in (False, True):
                    for out in _traits.FP8_OUT_CODES:
                        spec = _traits.select(_traits.FP8, d, causal, limit, fam, out)
                        row = _table_row(entry, kind="prefill", family=fam, dtype=_traits.FP8, out_dtype=out,
                                         tile_dim=tile, causal=causal)
                        assert row["file"] == _file_of(entry, spec)
    for dt in ("float16", "bfloat16"):
        for d in _traits.SUPPORTED_HEAD_DIMS:
            tile = min(t for t in rules["tile_dims"]["decode"] if t >= d)
            for rows_max in (_decode_traits.ONE_FRAG_ROWS, None):
                row = _table_row(entry, kind="decode", dtype=dt, tile_dim=tile, rows_max=rows_max)
                assert row["file"] == _file_of(entry, _decode_traits.select_decode(dt, d, limit, rows=rows_max))
    for i, o in _decode_traits.COMBINE_PAIRS:
        assert _table_row(entry, kind="combine", in_dtype=i, out_dtype=o)["file"] == \
            _file_of(entry, _decode_traits.combine_kernel(i, o))
    tiles = rules["tile_dims"]["backward"]
    for dt in ("float16", "bfloat16"):
        for d in range(8, _bt.BWD_TILE_DIMS[-1] + 1, 8):
            for causal in (False, True):
                for mods in (0, 1, 2, 3):
                    row = _table_row(entry, kind="backward", family="sm80", dtype=dt,
                                     tile_dim=min(t for t in tiles if t >= d), causal=causal, mods=mods)
                    assert row["file"] == _file_of(entry, _bt.select_backward(dt, d, causal, limit, mods))
                    if arch in _traits.HOPPER_ARCHS and mods == 0 and d <= _bt.SM90_BWD_TILE_DIMS[-1]:
                        row = _table_row(entry, kind="backward", family="sm90", dtype=dt, causal=causal, mods=0,
                                         tile_dim=min(t for t in rules["tile_dims"]["backward_sm90"] if t >= d))
                        assert row["file"] == _file_of(entry, _bt.select_backward(dt, d, causal, limit, 0, "sm90"))


def test_manifest_layouts_are_the_mirrors(exported):
    _, manifest = exported
    for cls, name in _cabi.STRUCTS:
        lay = manifest["structs"][_cabi.c_name(name)]
        assert lay["size"] == ctypes.sizeof(cls) and lay["kernel_name"] == name
        assert [(f["name"], f["offset"]) for f in lay["fields"]] == [(f, getattr(cls, f).offset) for f, _ in cls._fields_]


def _compile_c(tmp_path, header: str, compiler: str, lang: str):
    (tmp_path / "cudattn_params.h").write_text(header)
    src = tmp_path / "use.c"
    src.write_text('#include "cudattn_params.h"\n'
                   "int main(void) { cudattn_FwdSm90Params p; cudattn_DecodeParams d; (void)p; (void)d; return 0; }\n")
    std = ["-std=c11"] if lang == "c" else ["-x", "c++", "-std=c++11"]
    return subprocess.run([compiler, *std, "-Wall", "-Werror", "-fsyntax-only", f"-I{tmp_path}", str(src)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("compiler,lang", [("cc", "c"), ("c++", "c++")])
def test_header_compiles_and_its_asserts_bite(exported, tmp_path, compiler, lang):
    """The exported header compiles as C11 and C++ with every warning an error; its offset asserts
    fail a compile the moment one offset is wrong."""
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler}")
    out, _ = exported
    header = (out / "include" / "cudattn_params.h").read_text()
    assert f'#define CUDATTN_VERSION "{__version__}"' in header
    res = _compile_c(tmp_path, header, compiler, lang)
    assert res.returncode == 0, res.stderr
    bad = header.replace("offsetof(cudattn_DecodeParams, kv) == ", "offsetof(cudattn_DecodeParams, kv) == 8 + ")
    assert bad != header
    res = _compile_c(tmp_path, bad, compiler, lang)
    assert res.returncode != 0 and "cudattn_DecodeParams.kv" in res.stderr


def _kernel_probes():
    """(source name, extra options, struct names): where each struct is declared for the kernels."""
    return [(None, [], ["FwdParams", "FwdSm90Params", "KvCacheGeom", "DecodeParams", "CombineParams", "AppendParams",
                        "BwdParams", "BwdSm90Params"]),
            ("fp8_transpose_v.cu", [], ["TransposeVParams"]),
            ("fp8_quantize.cu", ["-DCUDATTN_DQ_OUT=0"], ["Fp8QuantParams"])]


@pytest.mark.parametrize("source,options,names", _kernel_probes())
def test_kernel_declarations_have_the_mirrors_layout(tmp_path, source, options, names):
    """NVRTC compiles static_asserts of every mirror offset against the kernels' own structs (no GPU)."""
    by_name = {n: c for c, n in _cabi.STRUCTS}
    if source is None:
        _, headers = _kernels.sources()
        text = ('#include "cudattn/sm90/params.cuh"\n#include "cudattn/params_decode.cuh"\n'
                '#include "cudattn/bwd/sm90_params.cuh"\n')
    else:
        text, headers = _kernels.sources(source)
    asserts = "".join(_cabi.kernel_asserts(by_name[n], n) for n in names)
    cache = nvrtc_cache.Cache(tmp_path / "kernels")
    nvrtc_cache.compile(text + asserts, name="abi_probe.cu", headers=headers, options=options, arch="sm_90a",
                        cache=cache)
    wrong = asserts.replace(") == ", ") == 4 + ", 2)  # the size and the first offset off by 4
    with pytest.raises(Exception, match=names[0]):
        nvrtc_cache.compile(text + wrong, name="abi_probe.cu", headers=headers, options=options, arch="sm_90a",
                            cache=cache)


def test_read_manifest_refuses_another_version(exported, tmp_path):
    out, manifest = exported
    assert _export.read_manifest(out)["cudattn"] == __version__
    for change, words in (({"cudattn": "0.0.1"}, "cudattn 0.0.1"), ({"format": 999}, "format 999")):
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **change}))
        with pytest.raises(_export.ExportError, match=words) as info:
            _export.read_manifest(tmp_path)
        assert "export again" in str(info.value)
    with pytest.raises(_export.ExportError, match="does not exist"):
        _export.read_manifest(tmp_path / "nowhere")


def test_cli_export(kernel_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(kernel_cache.directory))
    res = subprocess.run([sys.executable, "-m", "cudattn", "export", "--arch", "sm_80", "--out", str(tmp_path / "x"),
                          "--jobs", "1"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "sm_80: " in res.stdout and "cudattn_params.h" in res.stdout
    assert (tmp_path / "x" / "include" / "cudattn_params.h").exists()
    bad = subprocess.run([sys.executable, "-m", "cudattn", "export", "--arch", "sm_70", "--out", str(tmp_path / "y")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown compile target 'sm_70'" in bad.stderr


def test_launcher_and_example_compile(exported, tmp_path):
    """cudattn.h (with the generated tables) and the C example: C11 and C++, every warning an error,
    against the CUDA headers of the pip wheels."""
    inc = _cbuild.cuda_include()
    if inc is None or shutil.which("cc") is None:
        pytest.skip("no cuda.h in the CUDA pip wheels, or no C compiler")
    out, _ = exported
    assert {p.name for p in (out / "include").iterdir()} == {"cudattn.h", "cudattn_backward.h", "cudattn_kernels.h",
                                                            "cudattn_params.h"}
    flags = ["-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{out / 'include'}", f"-I{inc}"]
    res = subprocess.run(["cc", "-std=c11", *flags, str(out / "examples" / "attention.c")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if shutil.which("c++"):
        src = tmp_path / "use.cpp"
        src.write_text('#include "cudattn.h"\nint main() { cudattn_prefill_args a = cudattn_prefill_defaults(); '
                       "return a.out_dtype == -1 ? 0 : 1; }\n")
        res = subprocess.run(["c++", "-std=c++11", *flags, str(src)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    table = (out / "include" / "cudattn_kernels.h").read_text()
    _, manifest = exported
    rows = sum(len(e["selection"]) for e in manifest["archs"].values())
    transposes = sum(any(k["kind"] == "transpose" for k in e["kernels"]) for e in manifest["archs"].values())
    backward = sum(r["kind"] == "backward" for e in manifest["archs"].values() for r in e["selection"])
    assert table.count('\n    {"sm_') == rows + transposes + (len(_bt.ENTRIES) - 1) * backward  # a row per entry point
    assert table.count('"flash_bwd_dsinks", 256, 0, ') == backward


def test_c_selection_and_splits_are_the_python_ones(exported, tmp_path):
    """The launcher's variant choice and split heuristic, compiled and run on the CPU (no CUDA call is
    made), against `_traits.select`, `_decode_traits.select_decode`, `_decode_plan._blocks_per_sm`,
    `_decode_plan.choose_num_splits`, `_decode_plan.choose_merge_ctas` and the Hopper tile order's sections
    (`_plan._tile_order`) over a grid of inputs."""
    inc = _cbuild.cuda_include()
    if inc is None or shutil.which("cc") is None:
        pytest.skip("no cuda.h in the CUDA pip wheels, or no C compiler")
    out, manifest = exported
    arch = "sm_90a"
    src = tmp_path / "probe.c"
    src.write_text(r'''
#include <stdio.h>
#include "cudattn.h"
int main(void) {
    cudattn_handle h;
    int fam, dt, out, d, c, sq, i, w;
    static const int fams[2] = {80, 90}, dts[3] = {1, 2, 3}, sqs[10] = {1, 128, 129, 512, 513, 1024, 1025, 2048, 2049, 100000};
    memset(&h, 0, sizeof h);
    strcpy(h.arch, "sm_90a");
    for (fam = 0; fam < 2; ++fam) for (dt = 0; dt < 3; ++dt) for (out = -1; out < 3; ++out)
        for (d = 8; d <= 256; d += 8) for (c = 0; c < 2; ++c) for (i = 0; i < 10; ++i) {
            int row;
            if ((dts[dt] == 3) != (out >= 0) || (dts[dt] == 3 && out == 3)) continue;
            if (dts[dt] == 3 && d % 16) continue;
            sq = sqs[i];
            row = cudattn__select(&h, fams[fam], dts[dt], out, d, c, sq);
            printf("P %d %d %d %d %d %d %s\n", fams[fam], dts[dt], out, d, c, sq, row < 0 ? "-" : cudattn_kernel_table[row].file);
        }
    for (i = 1; i < 400; i += 3) for (d = 1; d < 600; d += 7) for (c = 1; c < 3; ++c) for (out = 1; out < 5; out += 3)
        for (sq = 1; sq <= 4; sq *= 2) for (w = 0; w < 2; ++w)
            printf("S %d %d %d %d %d %d %d\n", i, d, c, out, sq, w, cudattn__choose_num_splits(i, d, 132, c, out, sq, w));
    {
        static const int grids[5] = {1, 64, 132, 133, 512}, splits[6] = {1, 2, 3, 8, 64, 128}, rows[4] = {1, 8, 16, 32};
        int gi, si, ri;
        for (gi = 0; gi < 5; ++gi) for (si = 0; si < 6; ++si) for (ri = 0; ri < 4; ++ri) for (d = 8; d <= 256; d += 24)
            for (w = 4; w <= 8; w += 4)
                printf("M %d %d %d %d %d %d\n", grids[gi], splits[si], rows[ri], d, w,
                       cudattn__merge_ctas(grids[gi], splits[si], rows[ri], d, w, 132));
    }
    h.smem_per_sm = 233472;
    for (dt = 0; dt < 2; ++dt) for (d = 8; d <= 256; d += 8) for (i = 1; i <= 40; i += 3) for (c = 0; c < 2; ++c) {
        const int row = cudattn__select_decode(&h, dts[dt], d, i);
        printf("D %d %d %d %d %s %d %d\n", dts[dt], d, i, c, row < 0 ? "-" : cudattn_kernel_table[row].file,
               row < 0 ? 0 : cudattn__blocks_per_sm(&h, &cudattn_kernel_table[row], c),
               row < 0 ? 0 : cudattn__split_tiles_min(&cudattn_kernel_table[row]));
    }
    h.sm_count = 132;
    {
        static const int Bs[6] = {1, 2, 4, 8, 16, 48}, Hq[5] = {8, 16, 24, 32, 64}, Hkv[3] = {1, 2, 8}, Sq[2] = {1, 2};
        static const int Ss[6] = {700, 2048, 8192, 32768, 131072, 400000}, Ds[4] = {64, 96, 128, 256};
        int b, hq, hk, q, s, n;
        cudattn_decode_args a;
        cudattn__decode_plan pl;
        for (dt = 0; dt < 2; ++dt) for (b = 0; b < 6; ++b) for (hq = 0; hq < 5; ++hq) for (hk = 0; hk < 3; ++hk)
            for (q = 0; q < 2; ++q) for (s = 0; s < 6; ++s) for (d = 0; d < 4; ++d) for (n = 0; n < 2; ++n) {
                memset(&a, 0, sizeof a);
                a.dtype = dts[dt]; a.batch = Bs[b]; a.heads_q = Hq[hq]; a.heads_kv = Hkv[hk]; a.seqlen_q = Sq[q];
                a.capacity = Ss[s]; a.head_dim = Ds[d]; a.num_splits = n ? 64 : 0;
                if (cudattn__decode_plan_of(&h, &a, &pl) != CUDATTN_OK) { printf("Q fail\n"); continue; }
                printf("Q %d %d %d %d %d %d %d %d %s %d %d %d %d\n", a.dtype, a.batch, a.heads_q, a.heads_kv, a.seqlen_q,
                       a.capacity, a.head_dim, a.num_splits, cudattn_kernel_table[pl.row].file, pl.num_m, pl.splits,
                       pl.tiles_per_split, pl.merge_ctas);
            }
    }
    h.l2_bytes = 62914560;
    {
        static const int Bs[5] = {1, 3, 8, 16, 32}, Hs[3] = {1, 16, 40}, Ss[6] = {512, 1000, 2048, 8192, 65536, 131072};
        static const int Ds[3] = {64, 128, 256}, gs[2] = {1, 8}, ctas[2] = {132, 264}, bms[3] = {64, 128, 192};
        int b, hq, s, g, n, m;
        cudattn_prefill_args a;
        for (b = 0; b < 5; ++b) for (hq = 0; hq < 3; ++hq) for (s = 0; s < 6; ++s) for (d = 0; d < 3; ++d)
            for (g = 0; g < 2; ++g) for (n = 0; n < 2; ++n) for (c = 0; c < 2; ++c) for (m = 0; m < 3; ++m) {
                if (Hs[hq] % gs[g]) continue;
                memset(&a, 0, sizeof a);
                a.batch = Bs[b]; a.heads_q = Hs[hq]; a.heads_kv = Hs[hq] / gs[g]; a.seqlen_k = Ss[s];
                a.seqlen_q = Ss[s] - 40 * m; a.head_dim = Ds[d]; a.dtype = 2; a.causal = c;
                printf("L %d %d %d %d %d %d %d %d %d %d\n", Bs[b], Hs[hq], a.seqlen_q, Ss[s], Ds[d], gs[g], ctas[n],
                       c, bms[m], cudattn__tile_order(&h, &a, bms[m], ctas[n]));
            }
    }
    return 0;
}
''')
    exe = tmp_path / "probe"
    res = subprocess.run(["cc", "-std=c11", "-O0", f"-I{out / 'include'}", f"-I{inc}", str(src), "-lm", "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    entry = manifest["archs"][arch]
    names = {1: "float16", 2: "bfloat16", 3: _traits.FP8}
    outs = {-1: None, 0: "float32", 1: "float16", 2: "bfloat16"}
    by_build = {(k["source"], tuple(k["options"])): k["file"] for k in entry["kernels"]}
    checked = 0
    plans_seen = set()
    unsplit_long = False
    for line in lines:
        f = line.split()
        if f[0] == "P":
            fam, dt, o, d, c, sq, got = int(f[1]), int(f[2]), int(f[3]), int(f[4]), bool(int(f[5])), int(f[6]), f[7]
            spec = _traits.select(names[dt], d, c, _traits.ARCH_SMEM_LIMIT[arch], f"sm{fam}", outs[o], seqlen_q=sq)
            assert got == f"{arch}/{by_build[(spec.source, tuple(_kernels.options_for(spec)))]}", line
        elif f[0] == "D":
            dt, d, rows, paged, got, per_sm, min_tiles = (int(f[1]), int(f[2]), int(f[3]), bool(int(f[4])), f[5],
                                                          int(f[6]), int(f[7]))
            spec = _decode_traits.select_decode(names[dt], d, _traits.ARCH_SMEM_LIMIT[arch], rows=rows)
            assert got == f"{arch}/{by_build[(spec.source, tuple(_kernels.options_for(spec)))]}", line
            props = SimpleNamespace(max_shared_memory_per_multiprocessor=233472)
            kv = SimpleNamespace(paged=paged, fp8=False)
            assert per_sm == _decode_plan._blocks_per_sm(spec, kv, props), line
            assert min_tiles == spec.tiles.split_tiles_min, line
        elif f[0] == "Q":
            dt, B, hq, hkv, sq, cap, d, n = map(int, f[1:9])
            problem = SimpleNamespace(dtype=names[dt], head_dim=d, seqlen_q=sq, heads_q=hq, heads_kv=hkv, batch=B,
                                      group_size=hq // hkv, seqlen_k=cap, num_splits=n or None, kv_cache=None,
                                      window=None, mods=None)
            props = SimpleNamespace(sm_count=132, max_shared_memory_per_block_optin=_traits.ARCH_SMEM_LIMIT[arch],
                                    max_shared_memory_per_multiprocessor=233472)
            plan = _decode_plan.choose_plan(problem, props)
            spec = plan.variant
            assert f[9] == f"{arch}/{by_build[(spec.source, tuple(_kernels.options_for(spec)))]}", line
            assert list(map(int, f[10:])) == [plan.num_m_blocks, plan.num_splits, plan.tiles_per_split,
                                              plan.merge_ctas], line
            halved = plan.variant.tiles.row_frags == 1 and hq // hkv * sq > _decode_traits.ONE_FRAG_ROWS
            plans_seen.add((halved, plan.merge_ctas > 8))
            unsplit_long |= halved and plan.num_splits == 1 and plan.tiles_per_split > _decode_plan.HALVE_MAX_TILES_PER_SPLIT
        elif f[0] == "M":
            grid, splits, rows, d, warps, got = map(int, f[1:])
            assert got == _decode_plan.choose_merge_ctas(grid, splits, rows, d, warps, 132), line
        elif f[0] == "L":
            B, H, Sq, Sk, D, group, ctas, causal, bm, got = map(int, f[1:])
            problem = SimpleNamespace(batch=B, heads_q=H, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, group_size=group,
                                      dtype=np.dtype(ml_dtypes.bfloat16), causal=bool(causal), varlen=None)
            assert got == _plan._tile_order(problem, bm, 62914560, ctas), line
        else:
            blocks, tiles, per_sm, rows_per_warp, min_tiles, spread, got = map(int, f[1:])
            assert got == _decode_plan.choose_num_splits(blocks, tiles, 132, per_sm, rows_per_warp, min_tiles,
                                                    spread_merge=bool(spread)), line
        checked += 1
    assert checked > 5000
    assert {(True, False), (False, True)} <= plans_seen  # rows halved over two blocks; 16 sharers
    assert unsplit_long  # halved blocks that fill more than half the SMs, unsplit with more tiles than a split's


def test_exports_one_target_at_a_time_add_up_to_one_export_of_all(exported, kernel_cache, tmp_path):
    """sm_89, then sm_90a and sm_80 into one directory: the same manifest, id and C table as the
    three in one call, and no file on disk that the manifest does not list."""
    out, manifest = exported
    _export.export(tmp_path, ["sm_89"], cache=kernel_cache, progress=False)
    merged = _export.export(tmp_path, ["sm_90a", "sm_80"], cache=kernel_cache, progress=False)
    assert merged == manifest
    for name in ("manifest.json", "include/cudattn_kernels.h", "include/cudattn_params.h"):
        assert (tmp_path / name).read_text() == (out / name).read_text(), name
    assert {f"{p.parent.name}/{p.name}" for p in tmp_path.glob("*/*.cubin")} == \
        {f"{a}/{k['file']}" for a, e in manifest["archs"].items() for k in e["kernels"]}
