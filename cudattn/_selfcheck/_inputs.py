"""Seeded random host inputs for a case: fresh N(0,1) values, never zeros (DESIGN §6); no GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ._cases import Case

DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "float32": np.dtype(np.float32)}


def _rand(rng, shape, dtype) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(DTYPES[dtype] if isinstance(dtype, str) else dtype)


def qkv_shapes(c: Case) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if c.layout == "bshd":
        return (c.B, c.Sq, c.Hq, c.D), (c.B, c.Sk, c.Hkv, c.D)
    return (c.B, c.Hq, c.Sq, c.D), (c.B, c.Hkv, c.Sk, c.D)


def make_inputs(c: Case) -> dict[str, np.ndarray | None]:
    """The host arrays a case starts from (same case, same arrays: seeded by its name)."""
    rng = np.random.default_rng(c.seed)
    return {"attention": _attention, "kvcache": _kvcache, "merge": _merge, "quantize": _quantize}[c.op](c, rng)


def _attention(c: Case, rng) -> dict:
    qs, ks = qkv_shapes(c)
    # FP8: float32 sources, quantised later by quantize_fp8 on the case's side (host or device).
    dt = "float32" if c.fp8 else c.dtype
    return {"q": _rand(rng, qs, dt), "k": _rand(rng, ks, dt), "v": _rand(rng, ks, dt)}


def _kvcache(c: Case, rng) -> dict:
    q = _rand(rng, (c.B, c.Sq, c.Hq, c.D), c.dtype)
    table = None
    if c.page_size:
        per = c.Sk // c.page_size
        pages = c.B * per + 2  # two pages no sequence uses: random data the kernel must not read
        table = rng.permutation(pages)[: c.B * per].reshape(c.B, per).astype(np.int32)
        k = _rand(rng, (pages, c.page_size, c.Hkv, c.D), c.dtype)
        v = _rand(rng, (pages, c.page_size, c.Hkv, c.D), c.dtype)
    else:
        k = _rand(rng, (c.B, c.Sk, c.Hkv, c.D), c.dtype)
        v = _rand(rng, (c.B, c.Sk, c.Hkv, c.D), c.dtype)
    new = (c.B, c.s_new, c.Hkv, c.D)
    return {"q": q, "k_cache": k, "v_cache": v, "seqlens": np.asarray(c.seqlens, np.int32), "table": table,
            "k_new": _rand(rng, new, c.dtype) if c.s_new else None,
            "v_new": _rand(rng, new, c.dtype) if c.s_new else None}


def _merge(c: Case, rng) -> dict:
    """Parts whose LSEs include -inf (a part that saw no key: its output is NaN and must be
    skipped) and, with more than one part, a row that no part saw (0 and -inf out)."""
    shape = (c.B, c.Sq, c.Hq, c.D) if c.layout == "bshd" else (c.B, c.Hq, c.Sq, c.D)
    outs = _rand(rng, (c.parts, *shape), c.dtype)
    lses = (2 * rng.standard_normal((c.parts, c.B, c.Hq, c.Sq))).astype(np.float32)
    lses[0, 0, :, 0] = -np.inf
    if c.layout == "bshd":
        outs[0, 0, 0, :, :] = np.nan
    else:
        outs[0, 0, :, 0, :] = np.nan
    if c.parts > 1:
        lses[:, -1, 0, -1] = -np.inf
    return {"outs": outs, "lses": lses}


def _quantize(c: Case, rng) -> dict:
    """N(0,1) with 0.1 % outliers of +-(20..100): per-tensor descales then squeeze the bulk."""
    shape = (c.B, c.Sq, c.Hq, c.D) if c.layout == "bshd" else (c.B, c.Hq, c.Sq, c.D)
    x = rng.standard_normal(shape, dtype=np.float32)
    hit = rng.random(shape) < 1e-3
    x[hit] = rng.choice([-1.0, 1.0], int(hit.sum())) * rng.uniform(20, 100, int(hit.sum()))
    return {"x": x.astype(DTYPES[c.dtype])}
