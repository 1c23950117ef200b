"""Results of a case against the float64 reference; no GPU.

- 16-bit attention and KV caches: DESIGN §6, ``max|out − ref| ≤ 2·max|naive − ref| + 1e-5``
  (`reference.check_close`), no NaN (outputs were poisoned with NaN, so NaN means unwritten),
  LSE ``-inf`` exactly on the rows that see no key and within 1e-4 elsewhere; appended caches
  bit-identical to `reference.kvcache_append`.
- FP8 attention: `reference.check_close_fp8` against the emulation of the kernel's arithmetic
  with its key tile; rows that see no key exactly 0; LSE bounded as tests/test_fp8_gpu.py
  argues (score errors follow the sum of ``|q_i k_i|`` on Hopper's FP8 tensor cores).
- merge: the float64 `reference.merge_attention_states` of the same parts, to the rounding of
  the output dtype.
- quantize: bit-identical to cudattn's NumPy quantiser (documented: host and device give the
  same bits), whose descales match `reference.quantize_fp8`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import cudattn
from cudattn import reference

from ._cases import Case
from ._inputs import DTYPES

LSE_TOL = 1e-4
FP8_LSE_REL = 2.0**-8  # tests/test_fp8_gpu.py: LSE_REL, with the measurements behind it
# merge: the kernel merges in float32 and rounds once to the output dtype; two such roundings of
# margin (float32: float32 noise on O(1) values).
MERGE_RTOL = {"float32": 1e-5, "float16": 2.0**-10, "bfloat16": 2.0**-7}
MERGE_ATOL = 1e-5


@dataclass
class Verdict:
    ok: bool
    detail: str
    err: float | None = None
    bound: float | None = None


def check(c: Case, ref: dict, got: dict, block_n: int = 128) -> Verdict:
    """``ref``: the host inputs the call used (`_exec.Prepared.ref`); ``got``: its results as
    NumPy (`_exec.fetch`); ``block_n``: the FP8 kernel's key tile."""
    try:
        if c.op == "attention":
            return _attention_fp8(c, ref, got, block_n) if c.fp8 else _attention(c, ref, got)
        return {"kvcache": _kvcache, "merge": _merge, "quantize": _quantize}[c.op](c, ref, got)
    except _Fail as f:
        return Verdict(False, str(f))


class _Fail(Exception):
    pass


def _shape(name: str, a: np.ndarray, want: tuple) -> None:
    if a is None or tuple(a.shape) != tuple(want):
        raise _Fail(f"{name} has shape {None if a is None else tuple(a.shape)}, expected {tuple(want)}")


def _close16(o: np.ndarray, r: np.ndarray, naive: np.ndarray) -> Verdict:
    _shape("out", o, r.shape)
    o = o.astype(np.float64)
    n_nan = int(np.isnan(o).sum())
    if n_nan:
        raise _Fail(f"{n_nan} of {o.size} outputs are NaN (unwritten: out= was poisoned with NaN)")
    ok, err, bound = reference.check_close(o, r, naive)
    if not ok:
        raise _Fail(f"max|out-ref| = {err:.3g} > bound {bound:.3g} (2 x the naive {np.dtype(naive.dtype).name} error)")
    return Verdict(True, f"max|out-ref| {err:.2g} <= {bound:.2g}", err, bound)


def _lse(lse: np.ndarray | None, ref_lse: np.ndarray, c: Case) -> None:
    if not c.lse:
        return
    _shape("lse", lse, ref_lse.shape)
    if lse.dtype != np.float32:
        raise _Fail(f"lse is {lse.dtype}, expected float32")
    l64 = lse.astype(np.float64)
    empty = np.isneginf(ref_lse)
    if not np.array_equal(np.isneginf(l64), empty):
        raise _Fail(f"LSE is -inf on {int(np.isneginf(l64).sum())} rows; the rows that see no key are "
                    f"{int(empty.sum())}")
    if np.isnan(l64).any():
        raise _Fail(f"{int(np.isnan(l64).sum())} LSE values are NaN")
    err = np.abs(l64[~empty] - ref_lse[~empty])
    tol = LSE_TOL + LSE_TOL * np.abs(ref_lse[~empty])
    if err.size and not np.all(err <= tol):
        raise _Fail(f"LSE off by up to {err.max():.3g} (tolerance 1e-4 + 1e-4 |ref|)")


def _attention(c: Case, ref: dict, got: dict) -> Verdict:
    q, k, v = ref["q"], ref["k"], ref["v"]
    r, rl = reference.attention(q, k, v, causal=c.causal, layout=c.layout, return_lse=True)
    naive = reference.attention_naive(q, k, v, causal=c.causal, layout=c.layout, dtype=q.dtype)
    verdict = _close16(got["out"], r, naive)
    _lse(got.get("lse"), rl, c)
    return verdict


def _attention_fp8(c: Case, ref: dict, got: dict, block_n: int) -> Verdict:
    q, k, v, kw = ref["q"], ref["k"], ref["v"], ref["descales"]
    out_dt = DTYPES[c.out_dtype] if c.out_dtype else None
    r, rl = reference.attention(q, k, v, causal=c.causal, layout=c.layout, return_lse=True, **kw)
    emul = reference.attention_fp8_emulated(q, k, v, causal=c.causal, layout=c.layout, out_dtype=out_dt,
                                            block_n=block_n, **kw)
    o = got["out"]
    _shape("out", o, r.shape)
    if o.dtype != (out_dt or DTYPES["bfloat16"]):
        raise _Fail(f"out is {o.dtype}, expected {out_dt or 'bfloat16'}")
    o32 = o.astype(np.float32)
    bad = int(np.count_nonzero(~np.isfinite(o32)))
    if bad:
        raise _Fail(f"{bad} of {o.size} outputs are NaN or infinite (out= was poisoned with NaN)")
    ok, stats = reference.check_close_fp8(o, r, emul)
    err, bound = stats["out"]["max_abs"], stats["max_bound"]
    if not ok:
        raise _Fail(f"FP8 rule broken ({', '.join(stats['failed'])}): max|out-ref| {err:.3g} (bound {bound:.3g}), "
                    f"rel RMSE {stats['out']['rel_rmse']:.3g} (bound {stats['rmse_bound']:.3g})")
    empty = np.isneginf(rl)  # (B, Hq, Sq)
    if empty.any():
        rows = empty.transpose(0, 2, 1) if c.layout == "bshd" else empty
        if not np.all(o32[rows] == 0):
            raise _Fail("rows that see no key are not exactly 0")
    if c.lse:
        _lse_fp8(got.get("lse"), rl, q, k, v, kw, c)
    return Verdict(True, f"max|out-ref| {err:.2g} <= {bound:.2g} (FP8 rule)", err, bound)


def _lse_fp8(lse, rl, q, k, v, kw, c: Case) -> None:
    """|lse − ref| ≤ 2^-8·A + 1e-4·|ref| + 1e-4, A the LSE of |scale|·|q|·|k|ᵀ (tests/test_fp8_gpu.py)."""
    _shape("lse", lse, rl.shape)
    empty = np.isneginf(rl)
    if not np.array_equal(np.isneginf(lse), empty) or np.isnan(lse).any():
        raise _Fail("LSE must be -inf exactly on the rows that see no key, and never NaN")
    _, abs_lse = reference.attention(np.abs(q), np.abs(k), v, causal=c.causal, layout=c.layout, return_lse=True,
                                     **kw)
    tol = FP8_LSE_REL * np.abs(abs_lse[~empty]) + 1e-4 * np.abs(rl[~empty]) + 1e-4
    err = np.abs(lse[~empty].astype(np.float64) - rl[~empty])
    if err.size and not np.all(err <= tol):
        raise _Fail(f"FP8 LSE off by up to {err.max():.3g} (worst ratio to its bound {np.max(err / tol):.2f})")


def _kvcache(c: Case, ref: dict, got: dict) -> Verdict:
    kw = dict(cache_seqlens=ref["seqlens"], block_table=ref["table"], k_new=ref["k_new"], v_new=ref["v_new"],
              causal=c.causal)
    r, rl = reference.attention_with_kvcache(ref["q"], ref["k_cache"], ref["v_cache"], **kw, return_lse=True)
    naive = reference.attention_with_kvcache_naive(ref["q"], ref["k_cache"], ref["v_cache"], **kw)
    verdict = _close16(got["out"], r, naive)
    _lse(got.get("lse"), rl, c)
    want = (reference.kvcache_append(ref["k_cache"], ref["v_cache"], ref["k_new"], ref["v_new"], ref["seqlens"],
                                     ref["table"]) if c.s_new else (ref["k_cache"], ref["v_cache"]))
    for name, w in zip(("k_cache", "v_cache"), want):
        g = got[name]
        _shape(name, g, w.shape)
        if g.tobytes() != w.tobytes():
            raise _Fail(f"{name} after the call differs from the reference append in "
                        f"{int(np.count_nonzero(g.view(np.uint16) != w.view(np.uint16)))} elements")
    return verdict


def _merge(c: Case, ref: dict, got: dict) -> Verdict:
    want_o, want_l = reference.merge_attention_states(list(ref["outs"]), list(ref["lses"]), layout=c.layout)
    o, lse = got["out"], got["lse"]
    _shape("out", o, want_o.shape)
    _shape("lse", lse, want_l.shape)
    o64 = o.astype(np.float64)
    if np.isnan(o64).any():
        raise _Fail(f"{int(np.isnan(o64).sum())} merged outputs are NaN (a part with LSE -inf must be skipped)")
    rtol = MERGE_RTOL[c.dtype]
    err = np.abs(o64 - want_o)
    bound = MERGE_ATOL + rtol * np.abs(want_o)
    if not np.all(err <= bound):
        raise _Fail(f"merged out off by up to {err.max():.3g} (tolerance {MERGE_ATOL:g} + {rtol:.3g} |ref|)")
    empty = np.isneginf(want_l)
    l64 = lse.astype(np.float64)
    if not np.array_equal(np.isneginf(l64), empty) or np.isnan(l64).any():
        raise _Fail("merged LSE must be -inf exactly where no part saw a key, and never NaN")
    lerr = np.abs(l64[~empty] - want_l[~empty])
    if lerr.size and not np.all(lerr <= 1e-5 + 1e-5 * np.abs(want_l[~empty])):
        raise _Fail(f"merged LSE off by up to {lerr.max():.3g}")
    return Verdict(True, f"max|out-ref| {err.max():.2g} (rtol {rtol:.2g})", float(err.max()), rtol)


def _quantize(c: Case, ref: dict, got: dict) -> Verdict:
    want8, want_d = cudattn.quantize_fp8(ref["x"], per=c.per, layout=c.layout, heads_kv=c.Hkv)
    _shape("x8", got["x8"], want8.shape)
    _shape("descale", got["descale"], want_d.shape)
    if got["descale"].tobytes() != want_d.tobytes():
        raise _Fail("device descales differ from the NumPy quantiser's")
    diff = int(np.count_nonzero(got["x8"].view(np.uint8) != want8.view(np.uint8)))
    if diff:
        raise _Fail(f"{diff} of {want8.size} e4m3 values differ from the NumPy quantiser's bits")
    # the reference takes IEEE floats only; bfloat16 -> float32 is exact
    _, ref_d = reference.quantize_fp8(ref["x"].astype(np.float32), per=c.per, layout=c.layout, heads_kv=c.Hkv)
    if not np.allclose(want_d, ref_d, rtol=1e-6, atol=0):
        raise _Fail("the descales differ from reference.quantize_fp8's (amax / 448)")
    return Verdict(True, "bit-identical to the NumPy quantiser")


def first_difference(expected: dict, got: dict) -> str | None:
    """None when every result is bit-identical to ``expected``; else which one differs and where."""
    for name, want in expected.items():
        g = got.get(name)
        if want is None and g is None:
            continue
        if want is None or g is None or want.shape != g.shape or want.dtype != g.dtype:
            return f"{name}: {None if g is None else (g.shape, str(g.dtype))} instead of " \
                   f"{None if want is None else (want.shape, str(want.dtype))}"
        if want.tobytes() != g.tobytes():
            w8, g8 = want.reshape(-1).view(np.uint8), g.reshape(-1).view(np.uint8)
            first = int(np.flatnonzero(w8 != g8)[0]) // want.itemsize
            n = int(np.count_nonzero((w8 != g8).reshape(-1, want.itemsize).any(axis=1)))
            idx = np.unravel_index(first, want.shape)
            return (f"{name}: {n} of {want.size} elements differ, first at {tuple(int(i) for i in idx)}: "
                    f"{want.reshape(-1)[first]!r} then {g.reshape(-1)[first]!r}")
    return None
