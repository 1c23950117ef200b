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
    if _export.cuda_include() is None:
        pytest.skip("no cuda.h in the CUDA pip wheels")
    out = tmp_path_factory.mktemp("export")
    _export.export(out, [_device.device_properties(0).arch], progress=False)
    exe = out / "attention"
    res = subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Werror", *_export.c_flags(out),
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
# head-dim-64 tiles past 2048 query rows, FP8 with scalar descales.
BIT_CASES = [
    ("float16", 2, 333, 333, 8, 2, 128, False, 0),
    ("bfloat16", 2, 200, 513, 6, 3, 64, True, 0),
    ("bfloat16", 1, 2100, 2150, 4, 4, 64, True, 0),
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
