"""FP8 (e4m3): the NumPy quantiser (`quantize_fp8`, `dequantize`), rounding to e4m3 as the kernels
do (`_round_e4m3`), and `attention_fp8_emulated`, the FP8 kernels' arithmetic done in NumPy (tile
by tile, P rounded to e4m3), the baseline of the FP8 correctness rule (`check_close_fp8`, in
`rule`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import DTypeLike, HostArrayLike, Layout, QuantizePer
from ._common import _BF16, _FP8, _as_bhsd, _descale, _from_bhsd, _parse_mods, _shapes

#: Largest finite e4m3 (NVIDIA's float8_e4m3fn: no infinity, 480 and up is NaN).
E4M3_MAX = 448.0
_LOG2E = 1.4426950408889634
_FP8_OUT_DTYPES = (np.dtype(np.float16), _BF16, np.dtype(np.float32))


def _round_e4m3(x) -> np.ndarray:
    """float32 values rounded to e4m3 (nearest, ties to even) and saturated to ±448, returned as
    float32: what the kernels' ``cvt.rn.satfinite.e4m3x2.f32`` does (infinities saturate, NaN
    stays NaN). NumPy's own cast turns ``|x| > 464`` into NaN, hence the clip first; values in
    (448, 464] round to 448 either way."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(_FP8).astype(np.float32)


def _head_axis(layout: str) -> int:
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
    return 2 if layout == "bshd" else 1


def _expand_descale(descale: np.ndarray, shape: tuple, layout: str) -> np.ndarray:
    """A (B, G) descale broadcast against x of ``shape`` (head h uses entry h // (H // G))."""
    axis = _head_axis(layout)
    B, H = shape[0], shape[axis]
    d = np.asarray(descale)
    if d.ndim != 2 or d.shape[0] != B or d.shape[1] < 1 or H % d.shape[1]:
        raise ValueError(f"descale must have shape (batch, G) with heads ({H}) a multiple of G; got {d.shape}")
    d = np.repeat(d, H // d.shape[1], axis=1)  # (B, H)
    return d[:, None, :, None] if layout == "bshd" else d[:, :, None, None]


def quantize_fp8(x: HostArrayLike, *, per: QuantizePer = "tensor", layout: Layout = "bshd",
                 heads_kv: int | None = None) -> tuple[NDArray[Any], NDArray[np.float32]]:
    """NumPy counterpart of ``cudattn.quantize_fp8``: ``(x_fp8, descale)``.

    ``descale`` is float32 ``(B, G)``, ``G = heads_kv`` (default: x's head count); head ``h`` of
    x belongs to group ``h // (H // G)``. ``per="tensor"``: one amax over all of x, repeated in
    every entry; ``per="head"``: the amax of each (batch, group). ``descale = amax / 448`` (1 where
    amax is 0) and ``x_fp8 = e4m3(x / descale)``, rounded to nearest even and saturated (never
    NaN). Dequantised values are ``x_fp8.astype(float64) * descale`` (`dequantize`).
    """
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D; got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a floating-point array; got dtype {x.dtype}")
    axis = _head_axis(layout)
    B, H = x.shape[0], x.shape[axis]
    G = H if heads_kv is None else int(heads_kv)
    if G < 1 or H % G:
        raise ValueError(f"heads ({H}) must be a multiple of heads_kv ({heads_kv})")
    xf = x.astype(np.float64)
    if not np.isfinite(xf).all():
        raise ValueError("x must be finite to be quantised")
    a = np.abs(xf)
    if per == "tensor":
        amax = np.full((B, G), a.max() if a.size else 0.0)
    elif per == "head":
        ab = a if layout == "bhsd" else a.transpose(0, 2, 1, 3)  # (B, H, S, D)
        amax = ab.reshape(B, G, -1).max(axis=2) if a.size else np.zeros((B, G))
    else:
        raise ValueError(f"per must be 'tensor' or 'head'; got {per!r}")
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    scaled = xf / _expand_descale(descale.astype(np.float64), x.shape, layout)
    return np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(_FP8), descale


def dequantize(x_fp8: HostArrayLike, descale: HostArrayLike, *, layout: Layout = "bshd",
               out_dtype: DTypeLike = np.float32) -> NDArray[Any]:
    """``x_fp8.astype(float64) * descale`` (descale: a number or ``(B, G)``), cast to ``out_dtype``."""
    x = np.asarray(x_fp8).astype(np.float64)
    d = np.asarray(descale, dtype=np.float64)
    if d.ndim == 0:
        return (x * d).astype(out_dtype)
    return (x * _expand_descale(d, x.shape, layout)).astype(out_dtype)


def attention_fp8_emulated(q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *, causal: bool = False,
                           scale: float | None = None, layout: Layout = "bshd", q_descale: HostArrayLike | None = None,
                           k_descale: HostArrayLike | None = None, v_descale: HostArrayLike | None = None,
                           out_dtype: DTypeLike | None = None, return_lse: bool = False, block_n: int = 128,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
                           ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[np.float32]]:
    """The FP8 kernels' arithmetic in NumPy (cu_src/include/cudattn/fp8.cuh, softmax.cuh).

    q, k, v are ``ml_dtypes.float8_e4m3fn`` (shapes, layouts, GQA and bottom-right causal as in
    `attention`); descales as in `attention`. Per (batch, query head), over key tiles
    ``[t·block_n, (t+1)·block_n)`` taken from the **last tile to the first** (as the kernels do):

    - ``S = q·kᵀ`` in float32 from the e4m3 values (products exact, float32 sums);
      ``x = S · scale·log2(e)·q_descale·k_descale`` (the exp2 domain; masked keys ``-inf``);
    - running row max ``m`` (float32); ``alpha = exp2(m_old − m)``;
      ``P = exp2(x − m)`` in float32 (one rounding, as the kernels' ``fma``);
    - ``l = l·alpha + Σ P`` from the float32 P;
    - ``O = O·alpha + e4m3(P) · V`` with P rounded to e4m3 (nearest even, saturating) relative
      to the **running** max, float32 accumulation;

    then ``out = O · (1/l) · v_descale`` rounded to ``out_dtype`` (default bfloat16; float16,
    bfloat16 or float32) and ``lse = (m + log2 l)·ln 2`` (float32). Rows that see no key give 0
    and ``-inf``.

    Score modifiers as in `attention`, where the kernels apply them: a softcap takes the raw
    scores through ``tanh(S · p)`` with ``p = scale·q_descale·k_descale / softcap`` (float32), and
    the exp2 domain is ``x = tanh(...) · softcap·log2(e)``; ALiBi adds ``-slope·|i + Sk - Sq - j|·
    log2(e)`` to ``x``; the window and causal masks make ``x = -inf``; a sink joins at the end,
    ``M = max(m, sink·log2 e)``, ``l' = l·2^(m−M) + 2^(sink·log2 e − M)``, ``out = O·2^(m−M)/l'``,
    ``lse = (M + log2 l')·ln 2`` (a row that sees no key: 0 and the sink). The kernels' tanh is
    ``tanh.approx`` (relative error about 2^-11), not NumPy's.

    Differences left from the kernels: float32 summation order (NumPy's matmul and
    pairwise sums vs the tensor cores' and the quads'), the descales folded into the score scale
    in float64 then rounded once, and exact ``exp2`` instead of ``ex2.approx``: an e4m3 rounding
    of P that lands on a tie can go the other way, nothing more. ``block_n`` is the kernel's key
    tile (128 for the Hopper FP8 kernel, 64 for the portable one): it decides the running max P
    is rounded against, so it changes *which* rounding errors are made, not their size.

    Limit (the kernels' too): the row max ``m`` is the float32 rounding of the largest scaled
    score while ``P`` takes the exact one (``fma``), so the largest ``P`` is ``exp2(±½ ulp(m))``
    rather than 1: a common factor of every P, cancelled by ``l``, while ``|m| < 2²⁸`` (P ≤ 256).
    Beyond, the largest P saturates at 448 in e4m3 (the output shrinks towards 0), and beyond
    ``2³¹`` P overflows to inf (output 0 or NaN). With descales of 1 and the default scale the
    largest possible ``|m|`` is ``448²·sqrt(D)·log2(e) ≈ 4.6e6`` (D = 256): it takes
    ``scale·q_descale·k_descale`` about 60x larger than ``1/sqrt(D)`` to reach the limit.

    Vectorised over batch and heads: memory is a few float64 copies of one key tile's scores,
    ``B·Hq·Sq·block_n``.
    """
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != _FP8:
            raise TypeError(f"attention_fp8_emulated takes float8_e4m3fn inputs; {name} is {x.dtype} "
                            f"(quantise with quantize_fp8)")
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    block_n = int(block_n)
    if block_n < 1:
        raise ValueError(f"block_n must be positive; got {block_n}")
    out_dt = _BF16 if out_dtype is None else np.dtype(out_dtype)
    if out_dt not in _FP8_OUT_DTYPES:
        raise ValueError(f"FP8 output dtype must be float16, bfloat16 or float32; got {out_dt}")
    f32 = np.dtype(np.float32)
    G = Hq // Hkv
    qb = np.ascontiguousarray(_as_bhsd(q, f32, layout)).reshape(B, Hkv, G, Sq, D)
    kb = np.ascontiguousarray(_as_bhsd(k, f32, layout))[:, :, None]  # (B, Hkv, 1, Sk, D)
    vb = np.ascontiguousarray(_as_bhsd(v, f32, layout))[:, :, None]

    ones = np.ones((B, Hkv))
    dq = _descale(q_descale, "q_descale", B, Hkv)
    dk = _descale(k_descale, "k_descale", B, Hkv)
    dv = _descale(v_descale, "v_descale", B, Hkv)
    mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)
    folded = scale * (ones if dq is None else dq) * (ones if dk is None else dk)
    cap = mods.softcap
    if cap:  # the scores' scale goes inside the tanh; the softmax takes the cap's
        pre = (folded / cap).astype(np.float32).astype(np.float64)[:, :, None, None, None]
        sl2 = np.full((B, Hkv), np.float32(cap * _LOG2E), np.float32)
    else:
        sl2 = (folded * _LOG2E).astype(np.float32)
        sl2[sl2 == 0] = np.float32(1e-30)  # as the kernels: a zero scale would make NaN of masked scores
    sl2 = sl2.astype(np.float64)[:, :, None, None, None]  # float32 values; float64 for exact products
    out_scale = (ones if dv is None else dv).astype(np.float32)[:, :, None, None]
    slopes = None if mods.alibi is None else (mods.alibi.reshape(B, Hkv, G)[:, :, :, None, None] * _LOG2E)

    m = np.full((B, Hkv, G, Sq), -np.inf, dtype=np.float32)
    l = np.zeros((B, Hkv, G, Sq), dtype=np.float32)
    o = np.zeros((B, Hkv, G, Sq, D), dtype=np.float32)
    off = Sk - Sq  # causal: row i sees key j iff j <= i + off
    # Past the limit in the docstring P overflows to inf (and l·alpha may make NaN), as in the
    # kernels: the emulation shows it rather than warn.
    with np.errstate(over="ignore", invalid="ignore"):
        for t in reversed(range(-(-Sk // block_n))):
            j0, j1 = t * block_n, min(Sk, (t + 1) * block_n)
            i0 = max(0, j0 - off) if causal else 0  # rows before i0 see no key of this tile: unchanged
            if i0 >= Sq:
                continue
            s = np.matmul(qb[:, :, :, i0:], kb[:, :, :, j0:j1].swapaxes(-1, -2))  # float32
            if cap:
                x = np.tanh(s.astype(np.float64) * pre) * sl2
            else:
                x = s.astype(np.float64) * sl2  # exact: a product of two float32
            rows_i, cols = np.arange(i0, Sq), np.arange(j0, j1)
            if slopes is not None:
                x = x - slopes * np.abs(rows_i[:, None] + off - cols[None, :])
            if causal or mods.window != (-1, -1):
                x = np.where(mods.visible(rows_i, cols, Sq, Sk, causal), x, -np.inf)
            m_old = m[..., i0:]
            m_new = np.maximum(m_old, x.max(axis=-1).astype(np.float32))  # rounding is monotonic
            m_use = np.where(m_new == -np.inf, np.float32(0), m_new)  # no key yet: exp2(-inf - 0) = 0
            alpha = np.exp2(m_old - m_use)
            p = np.exp2((x - m_use[..., None]).astype(np.float32))
            l[..., i0:] = l[..., i0:] * alpha + p.sum(axis=-1, dtype=np.float32)
            o[..., i0:, :] = o[..., i0:, :] * alpha[..., None] + np.matmul(_round_e4m3(p), vb[:, :, :, j0:j1])
            m[..., i0:] = m_new

        if mods.sinks is not None:  # one more term of the denominator, carrying no value
            sink = (mods.sinks.reshape(Hkv, G) * _LOG2E).astype(np.float32)[None, :, :, None]
            M = np.maximum(m, sink)
            a = np.where(m == -np.inf, np.float32(0), np.exp2(m - M))
            l = l * a + np.exp2(sink - M)
            inv = a / l
            m = M
            nonempty = np.ones(l.shape, bool)
        else:
            nonempty = l != 0  # as the kernels: a row is empty iff its sum is exactly 0 (NaN stays NaN)
            inv = np.where(nonempty, np.float32(1) / np.where(nonempty, l, np.float32(1)), np.float32(0))
        out = o * (inv * out_scale)[..., None]
        out = _from_bhsd(out.reshape(B, Hq, Sq, D), layout).astype(out_dt)
        log_l = np.log2(np.where(nonempty, l, np.float32(1)))
        lse = np.where(nonempty, (m + log_l) * np.float32(math.log(2)), np.float32(-np.inf)).astype(np.float32)
    return (out, lse.reshape(B, Hq, Sq)) if return_lse else out
