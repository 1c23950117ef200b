"""The exported backward with no GPU: `cudattn_backward` (cudattn_backward.h, through cudattn.h)
compiled and run on the CPU up to its first driver call, against the Python path's own
`run_backward` with its allocations and launches captured. For every call of a grid (dtypes, head
dims, GQA, causal, windows, softcap, ALiBi per head and per batch, sinks, deterministic, both
layouts, four targets' shared memory) the C launcher picks the same cubin, fills the same
`BwdParams` byte for byte, lays the workspace out as the Python path allocates it and launches the
same entry points with the same grids, threads and shared memory. The kernel table comes from the
export's own code (`_tools.export`, `_tools.cbuild`), with file names standing in for cubins, so
nothing compiles."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from cudattn import __version__
from cudattn._kernels import backward as _backward
from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import catalog as _catalog
from cudattn._kernels import traits as _traits
from cudattn._kernels.params import BwdParams, BwdSm90Params
from cudattn._spec.backward import validate_backward
from cudattn._tools import cabi as _cabi
from cudattn._tools import cbuild as _cbuild
from cudattn._tools import export as _export

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
DTYPES = {"float16": (1, np.dtype(np.float16)), "bfloat16": (2, np.dtype(ml_dtypes.bfloat16))}
F32 = np.dtype(np.float32)
WORKSPACE = 0x7F0000000000
_POINTERS = ("dq_accum", "dsum", "lse2", "semaphores", "dsinks")


def dry_manifest(archs) -> dict:
    """What `export` writes into the manifest that `kernel_table_header` reads, for every build of
    the catalogue, with no compile (no ptxas report: entries from the spec)."""
    manifest = {"cudattn": __version__, "format": _export.FORMAT, "id": "0" * 32, "archs": {}}
    for arch in archs:
        kernels, files = [], {}
        for spec in _catalog.all_kernels(arch):
            kind = _export._kind(spec)
            name = _export._file_name(spec, kind)
            files[_export._build_key(spec)] = name
            entry = {"file": name, "kind": kind, "family": spec.family, "entries": [spec.kernel_name],
                     "threads": spec.threads, "dynamic_smem": spec.smem_bytes, "select": _export._selection_inputs(spec)}
            if _export._launch(spec):
                entry["launch"] = _export._launch(spec)
            kernels.append(entry)
        manifest["archs"][arch] = {"kernels": kernels, "selection": _export._selection_table(arch, files)}
    return manifest


@pytest.fixture(scope="module")
def dry_export(tmp_path_factory):
    """(export dir with every header and no cubin, its manifest, the -I flags)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    if _cbuild.cuda_include() is None:
        pytest.skip("no cuda.h in the CUDA pip wheels")
    out = tmp_path_factory.mktemp("dry")
    manifest = dry_manifest(ARCHS)
    (out / "include").mkdir()
    (out / "include" / "cudattn_params.h").write_text(_cabi.header(__version__, _export.FORMAT))
    (out / "include" / "cudattn_kernels.h").write_text(_cbuild.kernel_table_header(manifest))
    for name in _export.HEADERS:
        (out / "include" / name).write_text(_export._export_file(name))
    return out, manifest, _cbuild.c_flags(out)


def test_every_backward_build_has_a_row_per_entry_point(dry_export):
    out, manifest, _ = dry_export
    table = (out / "include" / "cudattn_kernels.h").read_text()
    for arch in ARCHS:
        builds = [k for k in manifest["archs"][arch]["kernels"] if k["kind"] == "backward"]
        assert len(builds) == len({(s.source, tuple(sorted(s.defines().items()))) for s in _bt.all_backward_kernels(arch)})
        rows = [r for r in manifest["archs"][arch]["selection"] if r["kind"] == "backward"]
        hopper = 2 * len(_bt.SM90_BWD_TILE_DIMS) * 2 if arch in _traits.HOPPER_ARCHS else 0
        assert len(rows) == 2 * len(_bt.BWD_TILE_DIMS) * 2 * 4 + hopper
        assert {k["family"] for k in builds} == ({"sm80", "sm90"} if hopper else {"sm80"})
        for k in builds:
            entries = ["flash_bwd_prepare", _bt.MAIN[k["family"]], "flash_bwd_finish_dq", "flash_bwd_dsinks"]
            assert list(k["launch"]) == entries
            for e in entries:
                assert table.count(f'"{arch}/{k["file"]}", "{e}", ') == sum(r["file"] == k["file"] for r in rows)


# (arch, dtype, B, Sq, Sk, Hq, Hkv, D, causal, scale, window, softcap, alibi, sinks, deterministic, layout)
CASES = [
    ("sm_90a", "float16", 2, 333, 333, 8, 2, 128, True, None, None, 0.0, None, False, True, "bshd"),
    ("sm_80", "bfloat16", 1, 77, 1000, 4, 1, 64, False, 0.3, (100, 20), 0.0, None, False, False, "bshd"),
    ("sm_86", "float16", 3, 129, 257, 6, 3, 128, True, None, (64, -1), 30.0, "head", True, True, "bhsd"),
    ("sm_89", "bfloat16", 2, 50, 60, 4, 4, 40, False, 1e-40, None, 5.0, "batch", True, False, "bshd"),
    ("sm_90a", "float16", 1, 1, 1, 1, 1, 8, True, -0.5, None, 0.0, "head", False, True, "bshd"),
    ("sm_80", "float16", 2, 1000, 17, 16, 4, 96, True, None, (-1, 5), 0.0, None, True, False, "bshd"),
    ("sm_86", "bfloat16", 1, 200, 300, 4, 2, 128, False, 0.0, (0, 0), 2.0, None, False, True, "bhsd"),
    ("sm_90a", "bfloat16", 4, 64, 64, 2, 1, 32, False, None, None, 1e-30, "batch", False, True, "bshd"),
    ("sm_89", "float16", 1, 513, 2049, 3, 1, 72, True, 2.0, (300, 7), 50.0, "head", True, True, "bshd"),
    ("sm_80", "bfloat16", 2, 1, 4096, 8, 8, 128, False, None, None, 0.0, None, True, True, "bhsd"),
    ("sm_90a", "bfloat16", 1, 150, 211, 4, 2, 160, True, None, None, 0.0, None, False, True, "bshd"),
    ("sm_89", "float16", 2, 99, 130, 2, 1, 256, False, None, (40, 3), 10.0, "head", True, True, "bhsd"),
]


class _Addresses:
    """Fake device addresses, 256-byte aligned, none shared."""

    def __init__(self):
        self.next = 0x100000

    def take(self, nbytes: int) -> int:
        p = self.next
        self.next += (max(nbytes, 1) + 255) // 256 * 256 + 256
        return p


def _array(addr, shape, dtype):
    """A C-contiguous device array as the call path sees one: shape, byte strides, dtype, address."""
    dtype = np.dtype(dtype)
    strides = tuple(int(s) * dtype.itemsize for s in np.empty(shape, np.uint8).strides)
    n = int(np.prod(shape)) * dtype.itemsize
    return SimpleNamespace(shape=tuple(shape), strides=strides, dtype=dtype, ptr=addr.take(n))


def _operands(case):
    arch, dt, B, Sq, Sk, Hq, Hkv, D, causal, scale, window, softcap, alibi, sinks, det, layout = case
    addr = _Addresses()
    dtype = DTYPES[dt][1]
    qs, ks = ((B, Sq, Hq, D), (B, Sk, Hkv, D)) if layout == "bshd" else ((B, Hq, Sq, D), (B, Hkv, Sk, D))
    ops = {n: _array(addr, qs if n in ("q", "out", "dout", "dq") else ks, dtype)
           for n in ("q", "k", "v", "out", "dout", "dq", "dk", "dv")}
    ops["lse"] = _array(addr, (B, Hq, Sq), F32)
    ops["sinks"] = _array(addr, (Hq,), F32) if sinks else None
    ops["alibi"] = None if alibi is None else _array(addr, (Hq,) if alibi == "head" else (B, Hq), F32)
    ops["dsinks"] = addr.take(4 * Hq) if sinks else 0
    return ops


def _python_launches(case, ops, monkeypatch):
    """run_backward on the operands, its allocations and launches recorded instead of made."""
    arch, dt, B, Sq, Sk, Hq, Hkv, D, causal, scale, window, softcap, alibi, sinks, det, layout = case
    problem, bwd = validate_backward(ops["dout"], ops["q"], ops["k"], ops["v"], ops["out"], ops["lse"], ops["dq"],
                                     ops["dk"], ops["dv"], host=False, causal=causal, scale=scale, layout=layout,
                                     window_size=window, softcap=softcap or None, sinks=ops["sinks"],
                                     alibi_slopes=ops["alibi"], deterministic=det)
    allocs, launches, addr = [], [], _Addresses()
    addr.next = 0x500000000000

    def empty_on(shape, dtype, device, sref):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        allocs.append(nbytes)
        return SimpleNamespace(ptr=addr.take(nbytes), shape=tuple(shape))

    monkeypatch.setattr(_backward._array, "empty_on", empty_on)
    monkeypatch.setattr(_backward._device, "device_properties", lambda i: SimpleNamespace(
        max_shared_memory_per_block_optin=_traits.ARCH_SMEM_LIMIT[arch], arch=arch))
    monkeypatch.setattr(_backward._kernels, "get_kernel", lambda variant, device, device_id, a: variant)
    # the Hopper kernel's TMA maps need the driver: stand-ins (their fields are the C side's own code)
    monkeypatch.setattr(_backward._tma, "encode_attention_operand", lambda *a, **k: bytes(128))
    monkeypatch.setattr(_backward._tma, "encode_dq_accum", lambda *a, **k: bytes(128))
    monkeypatch.setattr(_backward._launch, "launch", lambda kernel, grid, block, smem, h, P: launches.append(
        (kernel, tuple(grid), block, smem, BwdParams.from_buffer_copy(bytes(P.p if isinstance(P, BwdSm90Params) else P)))))
    _backward.run_backward(problem, bwd, ops["dout"], ops["q"], ops["k"], ops["v"], ops["out"], ops["lse"], ops["dq"],
                           ops["dk"], ops["dv"], None, 0, SimpleNamespace(handle=0))
    return allocs[1:] if sinks else allocs, launches  # the first allocation with sinks: dsinks, the caller's in C


def _c_call(i, case, ops) -> str:
    """C statements that fill `a` for case i and print the plan, the launches and the parameters."""
    arch, dt, B, Sq, Sk, Hq, Hkv, D, causal, scale, window, softcap, alibi, sinks, det, layout = case
    lines = ["a = cudattn_backward_defaults();", f"a.dtype = {DTYPES[dt][0]};",
             f"a.batch = {B}; a.seqlen_q = {Sq}; a.seqlen_k = {Sk}; a.heads_q = {Hq}; a.heads_kv = {Hkv}; "
             f"a.head_dim = {D};"]
    axes = (0, 1, 2) if layout == "bshd" else (0, 2, 1)  # (batch, seq, head) among the array's axes
    for name, field in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"), ("dout", "dout"), ("dq", "dq"),
                        ("dk", "dk"), ("dv", "dv")):
        x = ops[name]
        st = [x.strides[ax] // x.dtype.itemsize for ax in axes]
        lines.append(f"a.{field}.ptr = {x.ptr}ULL; a.{field}.stride_b = {st[0]}; a.{field}.stride_s = {st[1]}; "
                     f"a.{field}.stride_h = {st[2]};")
    lines.append(f"a.lse = {ops['lse'].ptr}ULL; a.causal = {int(causal)}; a.deterministic = {int(det)};")
    if scale is not None:
        lines.append(f"a.has_scale = 1; a.scale = {float(scale)!r};")
    if window is not None:
        lines.append(f"a.window_left = {window[0]}; a.window_right = {window[1]};")
    lines.append(f"a.softcap = {float(softcap)!r};")
    if alibi is not None:
        lines.append(f"a.alibi_slopes = {ops['alibi'].ptr}ULL; a.alibi_per_batch = {int(alibi == 'batch')};")
    if sinks:
        lines.append(f"a.sinks = {ops['sinks'].ptr}ULL; a.dsinks = {ops['dsinks']}ULL;")
    lines += [f"h.smem_optin = {_traits.ARCH_SMEM_LIMIT[arch]}; strcpy(h.arch, \"{arch}\");",
              f"a.workspace = {WORKSPACE}ULL; show({i}, &h, &a);"]
    return "    " + "\n    ".join(lines)


PROBE = r'''
#include <stdio.h>
#include "cudattn.h"

static void show(int i, cudattn_handle* h, cudattn_backward_args* a) {
    cudattn__backward_plan pl;
    cudattn_BwdParams P;
    const unsigned char* b = (const unsigned char*)&P;
    size_t n;
    int e;
    a->workspace_bytes = cudattn_backward_workspace_bytes(h, a);
    if (cudattn__backward_plan_of(h, a, &pl) != CUDATTN_OK) { printf("E %d %s\n", i, cudattn_message(h)); return; }
    printf("W %d %zu %zu %zu %zu %zu\n", i, pl.dq_accum, pl.dsum, pl.lse2, pl.semaphores, pl.bytes);
    for (e = 0; e < (a->sinks ? 4 : 3); ++e) {
        const cudattn_kernel_row* r = &cudattn_kernel_table[pl.rows[e]];
        unsigned g[3];
        cudattn__backward_grid(a, &pl, e, g);
        printf("L %d %s %s %u %u %u %d %d\n", i, r->entry, r->file, g[0], g[1], g[2], r->threads, r->dynamic_smem);
    }
    cudattn__backward_params(a, &pl, &P);
    printf("P %d ", i);
    for (n = 0; n < sizeof P; ++n) printf("%02x", b[n]);
    printf("\n");
}

int main(void) {
    cudattn_handle h;
    cudattn_backward_args a;
    memset(&h, 0, sizeof h);
    (void)show;
'''


def _run_probe(tmp_path, flags, body: str) -> list[list[str]]:
    src = tmp_path / "probe.c"
    src.write_text(PROBE + body + "\n    return 0;\n}\n")
    exe = tmp_path / "probe"
    res = subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", *flags, str(src), "-ldl", "-lm",
                          "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split(" ", 2) for line in out.splitlines()]


def test_the_c_backward_is_the_python_backward(dry_export, tmp_path, monkeypatch):
    out, manifest, flags = dry_export
    ops = [_operands(c) for c in CASES]
    lines = _run_probe(tmp_path, flags, "\n".join(_c_call(i, c, o) for i, (c, o) in enumerate(zip(CASES, ops))))
    by_case: dict = {}
    for kind, i, rest in lines:
        by_case.setdefault(int(i), []).append((kind, rest))
    assert sorted(by_case) == list(range(len(CASES))), lines[:3]
    for i, case in enumerate(CASES):
        arch, sinks, det = case[0], case[13], case[14]
        with monkeypatch.context() as m:
            allocs, launches = _python_launches(case, ops[i], m)
        got = by_case[i]
        assert got[0][0] == "W", got[0]
        dq_accum, dsum, lse2, sems, total = map(int, got[0][1].split())
        # the workspace: the Python path's allocations in order, each at a 256-byte offset
        offsets = np.cumsum([0] + [(n + 255) // 256 * 256 for n in allocs]).tolist()
        assert [dq_accum, dsum, lse2] + ([sems] if det else []) == offsets[:len(allocs)], case
        assert total == offsets[len(allocs)], case
        c_launches = [x[1].split() for x in got if x[0] == "L"]
        assert len(c_launches) == len(launches) == (4 if sinks else 3)
        files = {_export._build_key(s): _export._file_name(s, "backward") for s in _bt.all_backward_kernels(arch)}
        for (kern, grid, block, smem, _), (entry, file, gx, gy, gz, threads, csmem) in zip(launches, c_launches):
            assert (entry, file) == (kern.entry, f"{arch}/{files[_export._build_key(kern)]}"), case
            assert (int(gx), int(gy), int(gz)) == grid and (int(threads), 1, 1) == block and int(csmem) == smem, case
        c_params = BwdParams.from_buffer_copy(bytes.fromhex(next(x[1] for x in got if x[0] == "P")))
        py_params = launches[0][4]
        assert all(bytes(la[4]) == bytes(py_params) for la in launches)  # one struct for every launch
        assert c_params.dq_accum == WORKSPACE + dq_accum and c_params.dsum == WORKSPACE + dsum
        assert c_params.lse2 == WORKSPACE + lse2 and c_params.semaphores == (WORKSPACE + sems if det else 0)
        assert c_params.dsinks == ops[i]["dsinks"] and bool(py_params.dsinks) == sinks
        for name in _POINTERS:  # the workspace's addresses differ; everything else is the same bytes
            setattr(c_params, name, getattr(py_params, name))
        assert bytes(c_params) == bytes(py_params), (case, _differs(c_params, py_params))


def _differs(a, b) -> list[str]:
    """The fields of two BwdParams that differ (the forward's by their own names), for the message."""
    pairs = [(f"f.{n}", getattr(a.f, n), getattr(b.f, n)) for n, _ in a.f._fields_ if n != "kv"]
    pairs += [(n, getattr(a, n), getattr(b, n)) for n, _ in BwdParams._fields_ if n != "f"]
    return [f"{n}: {x!r} != {y!r}" for n, x, y in pairs if x != y]


# (what is changed from a valid call, the message's words); every one refused before any driver call
BAD = [
    ("a.dtype = 3;", "FP8 (e4m3) has no backward pass"),
    ("a.dtype = 0;", "dtype must be CUDATTN_FLOAT16 or CUDATTN_BFLOAT16"),
    ("a.head_dim = 264;", "head_dim must be a multiple of 8 from 8 to 256"),
    ("a.head_dim = 60;", "head_dim must be a multiple of 8"),
    ("a.heads_kv = 3;", "must be a multiple of heads_kv"),
    ("a.softcap = -1;", "softcap must be finite and >= 0"),
    ("a.window_left = -2;", "window_left and window_right must be >= -1"),
    ("a.sinks = 4096;", "dsinks"),
    ("a.lse = 0;", "lse (the forward's LSE) is required"),
    ("a.family = 90;", "family must be 0 (automatic) or 80 (portable)"),
]


def test_bad_calls_are_named_and_cost_no_workspace(dry_export, tmp_path):
    _, _, flags = dry_export
    base = ("a = cudattn_backward_defaults(); a.batch = 1; a.seqlen_q = 10; a.seqlen_k = 10; a.heads_q = 4; "
            "a.heads_kv = 2; a.head_dim = 64; a.lse = 256;")
    body = "".join(f'    {base} {change}\n    printf("X {i} %zu %s\\n", cudattn_backward_workspace_bytes(&h, &a), '
                   f"cudattn_message(&h));\n" for i, (change, _) in enumerate(BAD))
    body = '    strcpy(h.arch, "sm_90a"); h.smem_optin = 232448;\n' + body
    body += f'    {base} a.seqlen_k = 0; printf("X empty %zu %s\\n", cudattn_backward_workspace_bytes(&h, &a), ' \
            'cudattn_message(&h));\n'
    lines = _run_probe(tmp_path, flags, body)
    for (kind, i, rest), (_, words) in zip(lines, BAD):
        size, msg = rest.split(" ", 1)
        assert int(size) == 2**64 - 1 and words in msg, (i, msg)
    assert lines[-1][1:] == ["empty", "0 "]  # no query row or no key: no kernel, no workspace


def test_the_header_refuses_to_be_included_alone(dry_export, tmp_path):
    _, _, flags = dry_export
    (tmp_path / "alone.c").write_text('#include "cudattn_backward.h"\nint main(void) { return 0; }\n')
    res = subprocess.run(["cc", "-std=c11", "-fsyntax-only", *flags, str(tmp_path / "alone.c")], capture_output=True,
                         text=True)
    assert res.returncode != 0 and "include cudattn.h" in res.stderr


def test_the_launcher_compiles_as_c_and_cpp_with_every_warning(dry_export, tmp_path):
    _, _, flags = dry_export
    src = tmp_path / "use.c"
    src.write_text('#include "cudattn.h"\nint main(void) { cudattn_backward_args a = cudattn_backward_defaults(); '
                   "return a.window_left == -1 ? 0 : 1; }\n")
    for cmd in (["cc", "-std=c11"], ["c++", "-std=c++11", "-x", "c++"]):
        if shutil.which(cmd[0]) is None:
            continue
        res = subprocess.run([*cmd, "-Wall", "-Wextra", "-Werror", *flags, str(src), "-fsyntax-only"],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr

