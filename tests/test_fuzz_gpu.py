"""GPU: random valid attention problems drawn by Hypothesis (issue 7, part 6), each checked against the
float64 reference (`cudattn.reference`) under DESIGN §6's rule, ``max|out - ref| <= 2·max|naive -
ref| + 1e-5`` (FP8: `reference.check_close_fp8` against `reference.attention_fp8_emulated`, the
rule and the LSE bound of tests/test_fp8_gpu.py); and kv heads broadcast with stride 0.

Drawn per example: batch 1-3, Sq and Sk 1-300 (Sq > Sk with causal: rows that see no key must be 0
with LSE -inf), GQA/MQA head counts, head dims from a short list (each head-dim tile and dtype is
a kernel variant compiled on first use, so the list is kept short), float16 / bfloat16 / FP8
(made with cudattn.quantize_fp8 on the host, per tensor or per head, or no descales), causal or
not, both layouts, strided inputs (views of larger buffers: padded rows, every other head or
key, an offset batch, the other layout's buffer transposed; kv heads broadcast with stride 0 in
a test of their own), return_lse, a custom scale, the split-KV decode kernel with forced or
heuristic ``num_splits``, the NumPy path and the device path (cudattn.to_device), and on Hopper the
portable kernel family as well. Inputs are random normal (never zeros); outputs are poisoned with
NaN (device path: a NaN-filled ``out``, strided sometimes, whose elements outside the view must
stay NaN). KV caches are in test_fuzz_kvcache_gpu.py.

No torch needed. Reproducible: ``derandomize=True``, no example database; no shrinking (a failing
example is reported as drawn, and the same draw comes back on the next run).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import cudattn
from cudattn import reference
from _fuzz_gpu_cases import (
    BF16, F16, F32, FP8, FP8_HEAD_DIMS, HEAD_DIMS, SEQLEN, VIEWS, _draw_family, _is_hopper, _random, _shapes,
    check_16bit, gpu_fuzz, heads, kernel_family, make_broadcast_kv, make_tensor, run,
)

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------------------------------------
# float16 / bfloat16, prefill and decode
# ---------------------------------------------------------------------------------------------


@gpu_fuzz(120)
@given(st.data())
def test_fuzz_attention_16bit(data):
    """Prefill-shaped problems (and whatever Sq 1-300 gives), 16-bit, NumPy and device paths."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]), label="layout")
    dtype = data.draw(st.sampled_from([F16, BF16]), label="dtype")
    B = data.draw(st.integers(1, 3), label="B")
    Sq, Sk = data.draw(SEQLEN, label="Sq"), data.draw(SEQLEN, label="Sk")
    Hq, Hkv = data.draw(heads(), label="Hq, Hkv")
    D = data.draw(HEAD_DIMS, label="D")
    causal = data.draw(st.booleans(), label="causal")
    scale = data.draw(st.sampled_from([None, None, None, 0.05, 1.0, -0.3]), label="scale")
    return_lse = data.draw(st.booleans(), label="return_lse")
    host_path = data.draw(st.sampled_from([False, False, True]), label="numpy path")
    family = _draw_family(data)
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q = make_tensor(rng, _random(rng, qs, dtype), data.draw(st.sampled_from(VIEWS), label="q view"), layout)
    k, v = (make_tensor(rng, _random(rng, ks, dtype), data.draw(st.sampled_from(VIEWS), label=f"{n} view"), layout)
            for n in "kv")
    padded_out = data.draw(st.sampled_from([None, False, True]), label="out (None / dense / padded)")
    note(f"q {q.host.shape} strides {q.host.strides}, k strides {k.host.strides}, v strides {v.host.strides}")
    with kernel_family(family):
        o, lse = run(q, k, v, host_path, dtype, padded_out, causal=causal, scale=scale, layout=layout,
                     return_lse=return_lse)
    check_16bit(o, lse, q.host, k.host, v.host, causal=causal, scale=scale, layout=layout, dtype=dtype)


@gpu_fuzz(80)
@given(st.data())
def test_fuzz_decode_split_kv(data):
    """Few query tokens and the split-KV kernel: forced splits (1 to 128, more splits than keys
    included) or the heuristic, and now and then a longer Sq forced through it."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]), label="layout")
    dtype = data.draw(st.sampled_from([F16, BF16]), label="dtype")
    B = data.draw(st.integers(1, 3), label="B")
    Sq = data.draw(st.one_of(st.integers(1, 16), st.integers(1, 4), st.integers(17, 120)), label="Sq")
    Sk = data.draw(st.one_of(SEQLEN, st.integers(300, 2000)), label="Sk")
    Hq, Hkv = data.draw(heads(), label="Hq, Hkv")
    D = data.draw(HEAD_DIMS, label="D")
    causal = data.draw(st.booleans(), label="causal")
    splits = data.draw(st.one_of(st.none(), st.integers(1, 16), st.sampled_from([64, 128])), label="num_splits")
    if Sq > 16 and splits is None:
        splits = 4  # the prefill kernels would take it otherwise
    return_lse = data.draw(st.booleans(), label="return_lse")
    host_path = data.draw(st.sampled_from([False, False, True]), label="numpy path")
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q = make_tensor(rng, _random(rng, qs, dtype), data.draw(st.sampled_from(VIEWS), label="q view"), layout)
    k, v = (make_tensor(rng, _random(rng, ks, dtype), data.draw(st.sampled_from(VIEWS), label=f"{n} view"), layout)
            for n in "kv")
    padded_out = data.draw(st.sampled_from([None, False, True]), label="out (None / dense / padded)")
    o, lse = run(q, k, v, host_path, dtype, padded_out, causal=causal, layout=layout, return_lse=return_lse,
                 num_splits=splits)
    check_16bit(o, lse, q.host, k.host, v.host, causal=causal, scale=None, layout=layout, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------------------------


def _fp8_block_n(D, causal, out_dtype) -> int:
    """The key tile of the FP8 kernel that serves this call (the emulation rounds P against it)."""
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    return _traits.key_tile(_traits.FP8, D, causal, _device.device_properties(0), out_dtype)


@gpu_fuzz(60)
@given(st.data())
def test_fuzz_attention_fp8(data):
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    if _device.device_properties(0).arch not in _traits.FP8_ARCHS:
        pytest.skip("FP8 tensor cores need sm_89 or sm_90")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]), label="layout")
    B = data.draw(st.integers(1, 3), label="B")
    Sq = data.draw(st.one_of(st.integers(1, 32), st.integers(1, 200)), label="Sq")
    Sk = data.draw(st.one_of(st.integers(1, 32), st.integers(1, 200)), label="Sk")
    Hq, Hkv = data.draw(heads(), label="Hq, Hkv")
    D = data.draw(FP8_HEAD_DIMS, label="D")
    causal = data.draw(st.booleans(), label="causal")
    descales = data.draw(st.sampled_from(["array", "array", "float", "none"]), label="descales")
    per = data.draw(st.sampled_from(["head", "tensor"]), label="per")
    out_dtype = data.draw(st.sampled_from([None, None, None, F16, F32]), label="out_dtype")
    scale = data.draw(st.sampled_from([None, None, 0.05, -0.3]), label="scale")
    return_lse = data.draw(st.booleans(), label="return_lse")
    host_path = data.draw(st.sampled_from([False, False, True]), label="numpy path")
    family = _draw_family(data)
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    xs = [rng.standard_normal(s, dtype=np.float32) for s in (qs, ks, ks)]
    if descales == "none":  # N(0,1) values cast to e4m3 as they are (tests/test_fp8_gpu.py's "none")
        x8s, kw = [np.clip(x, -448, 448).astype(FP8) for x in xs], {}
    else:  # quantize_fp8: per-head (B, Hkv) arrays, or per-tensor floats
        per = "tensor" if descales == "float" else per
        pairs = [cudattn.quantize_fp8(x, per=per, layout=layout, heads_kv=Hkv) for x in xs]
        x8s = [p[0] for p in pairs]
        kw = {f"{n}_descale": p[1] if descales == "array" else float(p[1][0, 0]) for n, p in zip("qkv", pairs)}
    q, k, v = (make_tensor(rng, x8, data.draw(st.sampled_from(VIEWS), label=f"{n} view"), layout)
               for n, x8 in zip("qkv", x8s))
    odt = BF16 if out_dtype is None else out_dtype
    padded_out = data.draw(st.sampled_from([None, False, True]), label="out (None / dense / padded)")
    call_kw = dict(kw)
    if not host_path:
        call_kw = {n: cudattn.to_device(d) if isinstance(d, np.ndarray) else d for n, d in kw.items()}
    with kernel_family(family):
        o, lse = run(q, k, v, host_path, odt, padded_out, causal=causal, scale=scale, layout=layout,
                     return_lse=return_lse, out_dtype=out_dtype, **call_kw)
        block_n = _fp8_block_n(D, causal, out_dtype)
    q8, k8, v8 = q.host, k.host, v.host
    ref, ref_lse = reference.attention(q8, k8, v8, causal=causal, scale=scale, layout=layout, return_lse=True, **kw)
    emul = reference.attention_fp8_emulated(q8, k8, v8, causal=causal, scale=scale, layout=layout,
                                            out_dtype=out_dtype, block_n=block_n, **kw)
    assert o.dtype == odt and o.shape == qs
    n_bad = int(np.count_nonzero(~np.isfinite(o.astype(np.float32))))
    assert n_bad == 0, f"{n_bad} outputs unwritten, NaN or infinite"
    ok, stats = reference.check_close_fp8(o, ref, emul)
    assert ok, stats
    empty = np.isneginf(ref_lse)
    if empty.any():
        rows = empty.transpose(0, 2, 1) if layout == "bshd" else empty
        assert np.all(o.astype(np.float32)[rows] == 0), "rows that see no key must be 0"
    if lse is not None:  # tests/test_fp8_gpu.py's bound: the FP8 tensor cores' accumulation follows sum |q_i k_i|
        assert lse.dtype == F32 and lse.shape == (B, Hq, Sq)
        assert np.array_equal(np.isneginf(lse), empty), "LSE must be -inf exactly on rows that see no key"
        assert not np.isnan(lse).any()
        _, abs_lse = reference.attention(np.abs(q8), np.abs(k8), v8, causal=causal, layout=layout, return_lse=True,
                                         scale=None if scale is None else abs(scale), **kw)
        tol = 2.0**-8 * np.abs(abs_lse[~empty]) + 1e-4 * np.abs(ref_lse[~empty]) + 1e-4
        err = np.abs(lse[~empty].astype(np.float64) - ref_lse[~empty])
        assert np.all(err <= tol), f"LSE error {err.max():.3g} over its bound (worst ratio {np.max(err / tol):.2f})"


# ---------------------------------------------------------------------------------------------
# Broadcast (stride 0) kv heads
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["fastest", "portable"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_broadcast_kv_heads(family, layout, request):
    """k and v with stride 0 along their heads axis (one kv head read by all): validation takes them
    (DESIGN §2: any strides with a unit last stride; tests/test_validate.py), so the kernels must.
    The fuzzing found the Hopper kernel refusing them after the GPU work had begun (its TMA maps
    need positive strides); such calls now take the portable kernel (_plan.tma_can_map)."""
    if family == "portable" and not _is_hopper():
        pytest.skip("the portable family is the default here: covered by 'fastest'")
    rng = np.random.default_rng(11)
    B, Sq, Sk, Hq, Hkv, D = 2, 77, 165, 4, 2, 64
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q = make_tensor(rng, _random(rng, qs, F16), "contiguous", layout)
    k, v = make_broadcast_kv(rng, ks, F16, layout), make_broadcast_kv(rng, ks, F16, layout)
    with kernel_family(family):
        o, lse = run(q, k, v, False, F16, True, causal=True, layout=layout, return_lse=True)
    check_16bit(o, lse, q.host, k.host, v.host, causal=True, scale=None, layout=layout, dtype=F16)


@pytest.mark.parametrize("family", ["fastest", "portable"])
@pytest.mark.parametrize("seed", [3, 11])
def test_fp8_quantized_values_without_their_descales(family, seed):
    """e4m3 values from quantize_fp8 (spread over +-448) passed without their descales: scaled scores
    of about 1e5, a nearly one-hot softmax. The portable kernel meets the FP8 rule. The Hopper kernel
    does not (seen on an H100: relative RMSE 0.06-0.07 and max error ~350 where the emulation has
    3e-4 and ~1): its FP8 products accumulate with about 14 mantissa bits (docs/FP8.md), so score
    errors of ~2^-14 sum|q k| move the weights of near-tied keys; the emulation sums in float32. As in
    tests/test_reliability_gpu.py's extreme scales, that path gets the loose bound there."""
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    arch = _device.device_properties(0).arch
    if arch not in _traits.FP8_ARCHS:
        pytest.skip("FP8 tensor cores need sm_89 or sm_90")
    if family == "portable" and arch not in _traits.HOPPER_ARCHS:
        pytest.skip("the portable family is the default here: covered by 'fastest'")
    rng = np.random.default_rng(seed)
    qs, ks = (1, 164, 2, 64), (1, 164, 1, 64)
    x8s = [cudattn.quantize_fp8(rng.standard_normal(s, dtype=np.float32), per="head", heads_kv=1)[0]
           for s in (qs, ks, ks)]
    q, k, v = (make_tensor(rng, x8, "contiguous", "bshd") for x8 in x8s)
    with kernel_family(family):
        o, _ = run(q, k, v, False, BF16, None, layout="bshd")
        block_n = _fp8_block_n(64, False, None)
        hopper = _traits.family_for(arch) == "sm90"
    ref = reference.attention(*x8s)
    assert np.isfinite(o.astype(np.float32)).all()
    if hopper:
        assert reference.error_stats(o, ref)["rel_rmse"] <= 0.1
    else:
        ok, stats = reference.check_close_fp8(o, ref, reference.attention_fp8_emulated(*x8s, block_n=block_n))
        assert ok, stats
