"""The export on the GPU: the C example, built with the system compiler against the exported
headers and libcuda only, passes its own float64 check, and its outputs equal the Python path's
bit for bit (the same cubins, the same parameters)."""

from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn._calls import call as _callpath
from cudattn._runtime import device as _device
from cudattn._tools import cbuild as _cbuild
from cudattn._tools import export as _export
from cudattn._kernels import plan as _plan
from cudattn._kernels import traits as _traits

pytestmark = pytest.mark.gpu

CODES = {"float16": 1, "bfloat16": 2, "e4m3": 3}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """(export dir, the example's binary), built once as docs/C_API.md says: the flags that
    ``export --print-cflags`` prints, and ``-ldl -lm`` (the launcher loads libcuda at run time)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    if _cbuild.cuda_include() is None:
        pytest.skip("no cuda.h in the CUDA pip wheels")
    out = tmp_path_factory.mktemp("export")
    _export.export(out, [_device.device_properties(0).arch], progress=False)
    exe = out / "attention"
    res = subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Werror", *_cbuild.c_flags(out),
                          str(out / "examples" / "attention.c"), "-o", str(exe), "-ldl", "-lm"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"the example does not build: {res.stderr}")
    return out, exe


SELF_CHECKS = [
    ["--dtype", "f16"],
    ["--dtype", "bf16", "--causal", "--shape", "2,200,513,6,3,64"],
    ["--dtype", "f16", "--causal", "--shape", "1,77,1000,4,1,256"],
    ["--dtype", "e4m3", "--shape", "2,300,300,4,2,128"],
    ["--dtype", "e4m3", "--causal", "--shape", "1,129,257,2,2,64"],
    ["--dtype", "bf16", "--portable", "--shape", "2,130,99,4,2,96"],
    ["--decode", "--dtype", "f16", "--shape", "3,1,1000,8,2,128"],
    ["--decode", "--dtype", "bf16", "--causal", "--shape", "2,4,700,6,3,64", "--paged", "16", "--new", "3"],
    ["--decode", "--dtype", "f16", "--shape", "1,2,5000,4,1,256", "--paged", "256", "--splits", "7"],
    ["--merge", "--dtype", "bf16", "--shape", "2,100,700,4,2,128"],
]


@pytest.mark.parametrize("args", SELF_CHECKS, ids=lambda a: " ".join(a))
def test_example_passes_its_float64_check(program, args):
    out, exe = program
    res = subprocess.run([str(exe), str(out), *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


# (dtype, B, Sq, Sk, Hq, Hkv, D, causal, family): odd lengths, GQA, both families, the three-warpgroup
# head-dim-64 tiles (causal from 129 query rows), FP8 with scalar descales. Small problems take other tiles
# in Python (the small-grid builds of one or two consumers) than in the launcher: the same results
# bit for bit.
BIT_CASES = [
    ("float16", 2, 333, 333, 8, 2, 128, False, 0),
    ("bfloat16", 2, 200, 513, 6, 3, 64, True, 0),
    ("bfloat16", 2, 2100, 2150, 8, 8, 64, True, 0),
    ("bfloat16", 1, 2100, 2150, 4, 4, 64, True, 0),
    ("float16", 1, 512, 512, 8, 8, 64, False, 0),
    ("bfloat16", 1, 700, 900, 8, 2, 128, True, 0),
    ("bfloat16", 4, 600, 600, 16, 4, 64, True, 0),  # Python: 64-row tiles two CTAs an SM; the launcher: 192-row
    # (whose consumers skip the key tiles their rows do not see: the same bits as visiting them)
    ("float16", 8, 500, 500, 8, 8, 256, True, 0),  # head dim 256 causal up to 512 rows: 64-key tiles
    ("bfloat16", 1, 300, 333, 4, 2, 256, False, 0),
    ("float16", 1, 77, 1000, 4, 1, 256, True, 0),
    ("float16", 2, 130, 99, 4, 2, 96, False, 80),
    ("bfloat16", 1, 257, 300, 4, 4, 40, True, 80),
    ("e4m3", 2, 300, 300, 4, 2, 128, False, 0),
    ("e4m3", 1, 129, 257, 2, 2, 64, True, 0),
    ("e4m3", 2, 200, 333, 6, 3, 256, True, 80),  # with (B, Hkv) descale arrays, below
]


@pytest.mark.parametrize("case", BIT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_example_equals_the_python_path_bit_for_bit(program, case, tmp_path, monkeypatch):
    out, exe = program
    dt, B, Sq, Sk, Hq, Hkv, D, causal, family = case
    fp8 = dt == "e4m3"
    rng = np.random.default_rng(sum(case[1:8]))
    mk = lambda S, H: (rng.standard_normal((B, S, H, D), dtype=np.float32) * (1.0 if fp8 else 0.7)).astype(NP[dt])
    q, k, v = mk(Sq, Hq), mk(Sk, Hkv), mk(Sk, Hkv)
    descales = (0.5, 0.25, 2.0) if fp8 else (1.0, 1.0, 1.0)
    arrays = {}
    if fp8 and family == 80:  # (batch, kv head) descale arrays: Python takes a scalar or an array, so scalars 1
        descales = (1.0, 1.0, 1.0)
        arrays = {n: rng.uniform(0.25, 2.0, size=(B, Hkv)).astype(np.float32) for n in ("q", "k", "v")}
        for n, x in arrays.items():
            (tmp_path / f"{n}_descale.bin").write_bytes(x.tobytes())
    for name, x in (("q", q), ("k", k), ("v", v)):
        (tmp_path / f"{name}.bin").write_bytes(x.tobytes())
    (tmp_path / "args.txt").write_text(f"prefill {CODES[dt]} -1 {B} {Sq} {Sk} {Hq} {Hkv} {D} {int(causal)} "
                                       f"{descales[0]} {descales[1]} {descales[2]} {family}\n")
    res = subprocess.run([str(exe), str(out), "--io", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr

    if family == 80:
        monkeypatch.setattr(_traits, "FORCED_FAMILY", "sm80")
    _plan._plans.clear()
    _callpath._plans.clear()
    kw = dict(q_descale=descales[0], k_descale=descales[1], v_descale=descales[2]) if fp8 else {}
    kw.update({f"{n}_descale": cudattn.to_device(x) for n, x in arrays.items()})
    o, lse = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=causal, return_lse=True, **kw)
    o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    _plan._plans.clear()
    _callpath._plans.clear()
    assert (tmp_path / "out.bin").read_bytes() == o.tobytes()
    assert (tmp_path / "lse.bin").read_bytes() == lse.astype(np.float32).tobytes()


# (dtype, B, Sq, Hq, Hkv, D, causal, capacity, page_size, seqlen_new, num_splits): contiguous and
# paged caches, appends, the split heuristic and explicit splits.
DECODE_CASES = [
    ("float16", 3, 1, 8, 2, 128, False, 1000, 0, 0, 0),
    ("bfloat16", 2, 4, 6, 3, 64, True, 700, 16, 3, 0),
    ("float16", 1, 2, 4, 1, 256, False, 5000, 256, 1, 7),
    ("bfloat16", 4, 16, 8, 8, 96, True, 333, 0, 5, 0),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_example_decode_equals_the_python_path_bit_for_bit(program, case, tmp_path):
    """cudattn_decode against attention_with_kvcache: the output, the LSE and both caches after the append."""
    out, exe = program
    dt, B, Sq, Hq, Hkv, D, causal, cap, page, new, splits = case
    rng = np.random.default_rng(sum(case[1:6]) + cap)
    mk = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * 0.7).astype(NP[dt])
    if page:
        max_pages = -(-cap // page)
        num_pages = B * max_pages + 3
        table = rng.permutation(num_pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
        cap = page * max_pages
        k_cache, v_cache = mk(num_pages, page, Hkv, D), mk(num_pages, page, Hkv, D)
    else:
        max_pages, num_pages, table = 1, B, None
        k_cache, v_cache = mk(B, cap, Hkv, D), mk(B, cap, Hkv, D)
    seqlens = rng.integers(0, cap - new + 1, size=B).astype(np.int32)
    q = mk(B, Sq, Hq, D)
    k_new, v_new = (mk(B, new, Hkv, D), mk(B, new, Hkv, D)) if new else (None, None)
    files = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seqlens": seqlens, "block_table": table,
             "k_new": k_new, "v_new": v_new}
    for name, x in files.items():
        if x is not None:
            (tmp_path / f"{name}.bin").write_bytes(x.tobytes())
    (tmp_path / "args.txt").write_text(f"decode {CODES[dt]} {B} {Sq} {Hq} {Hkv} {D} {int(causal)} {cap} {page} "
                                       f"{max_pages} {num_pages} {new} {splits}\n")
    res = subprocess.run([str(exe), str(out), "--io", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr

    _callpath._plans.clear()
    dev = {n: None if x is None else cudattn.to_device(x) for n, x in files.items()}
    o, lse = cudattn.attention_with_kvcache(dev["q"], dev["k_cache"], dev["v_cache"], cache_seqlens=dev["seqlens"],
                                           block_table=dev["block_table"], k_new=dev["k_new"], v_new=dev["v_new"],
                                           causal=causal, return_lse=True, num_splits=splits or None)
    assert (tmp_path / "out.bin").read_bytes() == cudattn.to_host(o).tobytes()
    assert (tmp_path / "lse.bin").read_bytes() == cudattn.to_host(lse).astype(np.float32).tobytes()
    assert (tmp_path / "k_cache.out.bin").read_bytes() == cudattn.to_host(dev["k_cache"]).tobytes()
    assert (tmp_path / "v_cache.out.bin").read_bytes() == cudattn.to_host(dev["v_cache"]).tobytes()


@pytest.mark.parametrize("dt,n", [("float16", 3), ("bfloat16", 2)])
def test_example_merge_equals_the_python_path_bit_for_bit(program, dt, n, tmp_path):
    out, exe = program
    B, Sq, H, D = 2, 37, 4, 64
    rng = np.random.default_rng(n)
    o_parts = rng.standard_normal((n, B, Sq, H, D), dtype=np.float32).astype(NP[dt])
    lse_parts = (rng.standard_normal((n, B, H, Sq), dtype=np.float32) * 3).astype(np.float32)
    lse_parts[0, 0, 0, :5] = -np.inf  # parts that saw no key
    (tmp_path / "o_parts.bin").write_bytes(o_parts.tobytes())
    (tmp_path / "lse_parts.bin").write_bytes(lse_parts.tobytes())
    (tmp_path / "args.txt").write_text(f"merge {CODES[dt]} {n} {B} {Sq} {H} {D}\n")
    res = subprocess.run([str(exe), str(out), "--io", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    o, lse = cudattn.merge_attention_states(cudattn.to_device(o_parts), cudattn.to_device(lse_parts))
    assert (tmp_path / "out.bin").read_bytes() == cudattn.to_host(o).tobytes()
    assert (tmp_path / "lse.bin").read_bytes() == cudattn.to_host(lse).astype(np.float32).tobytes()


def test_example_refuses_other_cubins_of_the_same_version(program, tmp_path):
    out, exe = program
    shutil.copytree(out, tmp_path / "x", ignore=shutil.ignore_patterns("attention"))
    text = (tmp_path / "x" / "manifest.json").read_text()
    (tmp_path / "x" / "manifest.json").write_text(text.replace('"id": "', '"id": "0', 1))
    res = subprocess.run([str(exe), str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "CUDATTN_ERROR_EXPORT" in res.stderr and "holds other cubins" in res.stderr


def test_example_refuses_an_export_of_another_version(program, tmp_path):
    out, exe = program
    shutil.copytree(out, tmp_path / "x", ignore=shutil.ignore_patterns("attention"))
    text = (tmp_path / "x" / "manifest.json").read_text()
    (tmp_path / "x" / "manifest.json").write_text(text.replace(f'"cudattn": "{cudattn.__version__}"',
                                                               '"cudattn": "0.0.0-other"', 1))
    res = subprocess.run([str(exe), str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "CUDATTN_ERROR_EXPORT" in res.stderr and "0.0.0-other" in res.stderr


BACKWARD_PROGRAM = r'''
/* The exported backward on inputs from files: DIR/args.txt "dtype B Sq Sk Hq Hkv D causal deterministic
 * window_left window_right softcap alibi sinks" (alibi 0 none, 1 (Hq,), 2 (B, Hq); sinks 0 or 1), the
 * forward's inputs and results DIR/{q,k,v,out,dout}.bin (contiguous (B, S, H, D)) and DIR/lse.bin,
 * DIR/{alibi,sinks}.bin when used; writes DIR/{dq,dk,dv}.c.bin and with sinks DIR/dsinks.c.bin. */
#include <stdio.h>
#include <stdlib.h>
#include "cudattn.h"

static void* slurp(const char* dir, const char* name, size_t n) {
    char path[4200];
    void* p = malloc(n);
    FILE* f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f || fread(p, 1, n, f) != n) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}

static void spill(const char* dir, const char* name, CUdeviceptr d, size_t n) {
    char path[4200];
    void* p = malloc(n);
    FILE* f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (cuMemcpyDtoH(p, d, n) != CUDA_SUCCESS) { fprintf(stderr, "cuMemcpyDtoH failed\n"); exit(2); }
    f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
    free(p);
}

static CUdeviceptr device(const void* host, size_t n) { /* a copy of host, or n poison bytes (NaN) */
    CUdeviceptr d;
    if (cuMemAlloc(&d, n ? n : 1) != CUDA_SUCCESS) { fprintf(stderr, "cuMemAlloc failed\n"); exit(2); }
    if ((host ? cuMemcpyHtoD(d, host, n) : cuMemsetD8(d, 0xff, n)) != CUDA_SUCCESS) exit(2);
    return d;
}

static cudattn_tensor bshd(CUdeviceptr p, int S, int H, int D) {
    cudattn_tensor t;
    t.ptr = p; t.stride_b = (long long)S * H * D; t.stride_s = (long long)H * D; t.stride_h = D;
    return t;
}

int main(int argc, char** argv) {
    const char* io = argc > 2 ? argv[2] : ".";
    cudattn_backward_args a = cudattn_backward_defaults();
    cudattn_handle h;
    cudattn_status st;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    int B, Sq, Sk, Hq, Hkv, D, alibi, sinks;
    size_t nq, nk, nl;
    FILE* f;
    char path[4200];
    if (argc < 3 || cudattn_load_driver() || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 3;
    snprintf(path, sizeof path, "%s/args.txt", io);
    f = fopen(path, "r");
    if (!f || fscanf(f, "%d %d %d %d %d %d %d %d %d %d %d %lf %d %d", &a.dtype, &B, &Sq, &Sk, &Hq, &Hkv, &D, &a.causal,
                     &a.deterministic, &a.window_left, &a.window_right, &a.softcap, &alibi, &sinks) != 14) return 2;
    fclose(f);
    if (cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 2;
    nq = (size_t)B * Sq * Hq * D * 2; nk = (size_t)B * Sk * Hkv * D * 2; nl = (size_t)B * Hq * Sq * 4;
    a.batch = B; a.seqlen_q = Sq; a.seqlen_k = Sk; a.heads_q = Hq; a.heads_kv = Hkv; a.head_dim = D;
    a.q = bshd(device(slurp(io, "q.bin", nq), nq), Sq, Hq, D);
    a.k = bshd(device(slurp(io, "k.bin", nk), nk), Sk, Hkv, D);
    a.v = bshd(device(slurp(io, "v.bin", nk), nk), Sk, Hkv, D);
    a.o = bshd(device(slurp(io, "out.bin", nq), nq), Sq, Hq, D);
    a.dout = bshd(device(slurp(io, "dout.bin", nq), nq), Sq, Hq, D);
    a.lse = device(slurp(io, "lse.bin", nl), nl);
    a.dq = bshd(device(NULL, nq), Sq, Hq, D);
    a.dk = bshd(device(NULL, nk), Sk, Hkv, D);
    a.dv = bshd(device(NULL, nk), Sk, Hkv, D);
    if (alibi) {
        const size_t n = (size_t)(alibi == 2 ? B : 1) * Hq * 4;
        a.alibi_slopes = device(slurp(io, "alibi.bin", n), n);
        a.alibi_per_batch = alibi == 2;
    }
    if (sinks) {
        a.sinks = device(slurp(io, "sinks.bin", (size_t)Hq * 4), (size_t)Hq * 4);
        a.dsinks = device(NULL, (size_t)Hq * 4);
    }
    if ((st = cudattn_open(&h, argv[1], dev)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_open: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    a.workspace_bytes = cudattn_backward_workspace_bytes(&h, &a);
    if (a.workspace_bytes == (size_t)-1) { fprintf(stderr, "%s\n", cudattn_message(&h)); return 1; }
    a.workspace = device(NULL, a.workspace_bytes); /* poisoned: the kernels must clear what they add into */
    if ((st = cudattn_backward(&h, &a, stream)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_backward: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    if (cuStreamSynchronize(stream) != CUDA_SUCCESS) { fprintf(stderr, "the kernels failed\n"); return 2; }
    spill(io, "dq.c.bin", a.dq.ptr, nq);
    spill(io, "dk.c.bin", a.dk.ptr, nk);
    spill(io, "dv.c.bin", a.dv.ptr, nk);
    if (sinks) spill(io, "dsinks.c.bin", a.dsinks, (size_t)Hq * 4);
    printf("workspace %zu bytes\n", a.workspace_bytes);
    cudattn_close(&h);
    return 0;
}
'''


@pytest.fixture(scope="module")
def backward_program(program):
    """The program above, built against the export like the example."""
    out, _ = program
    src = out / "backward.c"
    src.write_text(BACKWARD_PROGRAM)
    exe = out / "backward"
    res = subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *_cbuild.c_flags(out), str(src),
                          "-o", str(exe), "-ldl", "-lm"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"the backward program does not build: {res.stderr}")
    return out, exe


# (dtype, B, Sq, Sk, Hq, Hkv, D, causal, deterministic, window, softcap, alibi, sinks): a small causal
# GQA case and a head dim short of its tile (on Hopper both run the Hopper kernel); every modifier
# at once; a non-deterministic one (dk, dv and dsinks compared only); the wide heads' tiles (192,
# whose row-wise passes take 8 lanes a row, and 256).
BACKWARD_CASES = [
    ("float16", 2, 200, 333, 8, 2, 64, True, True, None, 0.0, None, False),
    ("bfloat16", 1, 257, 513, 4, 2, 96, False, True, None, 0.0, None, False),
    ("bfloat16", 1, 129, 129, 6, 3, 128, True, True, (64, -1), 20.0, "head", True),
    ("float16", 2, 77, 300, 4, 1, 40, False, False, (50, 30), 0.0, "batch", True),
    ("bfloat16", 1, 150, 211, 4, 2, 160, True, True, None, 0.0, None, False),
    ("float16", 1, 99, 130, 2, 1, 256, False, True, None, 10.0, None, True),
]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_exported_backward_equals_the_python_path_bit_for_bit(backward_program, case, tmp_path):
    """cudattn_backward against cudattn.attention_backward on the forward's own out and lse."""
    out, exe = backward_program
    dt, B, Sq, Sk, Hq, Hkv, D, causal, det, window, softcap, alibi, sinks = case
    rng = np.random.default_rng(sum(case[1:7]))
    mk = lambda S, H: (rng.standard_normal((B, S, H, D), dtype=np.float32) * 0.7).astype(NP[dt])
    q, k, v, dout = mk(Sq, Hq), mk(Sk, Hkv), mk(Sk, Hkv), mk(Sq, Hq)
    slopes = None if alibi is None else rng.uniform(0.01, 0.2, size=(Hq,) if alibi == "head" else (B, Hq)).astype(
        np.float32)
    sink = rng.standard_normal(Hq).astype(np.float32) if sinks else None
    dev = {n: cudattn.to_device(x) for n, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}
    mods = dict(causal=causal, window_size=window, softcap=softcap or None,
                alibi_slopes=None if slopes is None else cudattn.to_device(slopes),
                sinks=None if sink is None else cudattn.to_device(sink))
    o, lse = cudattn.attention(dev["q"], dev["k"], dev["v"], return_lse=True, **mods)
    files = {"q": q, "k": k, "v": v, "dout": dout, "out": cudattn.to_host(o), "lse": cudattn.to_host(lse),
             "alibi": slopes, "sinks": sink}
    for name, x in files.items():
        if x is not None:
            (tmp_path / f"{name}.bin").write_bytes(np.ascontiguousarray(x).tobytes())
    w = window or (-1, -1)
    (tmp_path / "args.txt").write_text(f"{CODES[dt]} {B} {Sq} {Sk} {Hq} {Hkv} {D} {int(causal)} {int(det)} {w[0]} {w[1]} "
                                       f"{softcap!r} {0 if alibi is None else 1 if alibi == 'head' else 2} {int(sinks)}\n")
    res = subprocess.run([str(exe), str(out), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr

    grads = cudattn.attention_backward(dev["dout"], dev["q"], dev["k"], dev["v"], o, lse, deterministic=det, **mods)
    names = ("dq", "dk", "dv", "dsinks")[:len(grads)]
    for name, g in zip(names, grads):
        if name == "dq" and not det:
            continue  # atomics: its last bits may differ run to run
        assert (tmp_path / f"{name}.c.bin").read_bytes() == cudattn.to_host(g).tobytes(), name
