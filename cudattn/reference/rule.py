"""The correctness rules GPU results are held to: `check_close` (FlashAttention's rule,
``max|out − ref| ≤ 2·max|naive − ref| + atol``, NaN never passing), `gradient_eps` (its atol for
gradients) and, for FP8, `error_stats` (the accuracy metrics) and `check_close_fp8` (measured
against `attention_fp8_emulated`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._arrays.types import HostArrayLike


def _abs_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b| in float64 where equal infinities (LSE -inf of empty rows) count as 0 and other
    infinities as inf; NaN stays NaN."""
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    same_inf = np.isinf(a) & (a == b)
    if same_inf.any():
        d[same_inf] = 0.0
    return d


def check_close(out: HostArrayLike, ref: HostArrayLike, naive: HostArrayLike, *,
                atol: float = 1e-5) -> tuple[bool, float, float]:
    """FlashAttention's rule: ``max|out − ref| ≤ 2·max|naive − ref| + atol``.

    ``ref`` is the float64 reference, ``naive`` the same math in the input dtype
    (`attention_naive`). NaN in ``out`` never passes; neither does an infinity in ``out`` that
    ``ref`` does not have (equal infinities, such as LSE ``-inf`` of empty rows, agree).

    Returns ``(ok, err, bound)`` with ``err = max|out − ref|`` (NaN if ``out`` has NaN) and
    ``bound = 2·max|naive − ref| + atol``.
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    n = np.asarray(naive).astype(np.float64)
    if o.shape != r.shape or n.shape != r.shape:
        raise ValueError(f"out, ref and naive must have one shape; got {o.shape}, {r.shape}, {n.shape}")
    if np.isnan(r).any():
        raise ValueError("ref contains NaN; the reference must be NaN-free")
    naive_diff = _abs_diff(n, r)
    if not np.isfinite(naive_diff).all():
        raise ValueError("naive is NaN or infinite where ref is not; the bound would be meaningless")
    bound = 2.0 * (float(naive_diff.max()) if naive_diff.size else 0.0) + atol
    if np.isnan(o).any():
        return False, math.nan, bound
    diff = _abs_diff(o, r)
    err = float(diff.max()) if diff.size else 0.0
    ok = bool(math.isfinite(err) and err <= bound)
    return ok, err, bound


def gradient_eps(ref: HostArrayLike, dtype: Any) -> float:
    """FlashAttention-3's atol for gradients in `check_close`: ``2·max|round(ref + 0.3) − 0.3 − ref|``
    with the rounding to the 16-bit ``dtype``, plus 1e-5: room for the gradient's own rounding to
    16 bits (naive's error holds one such rounding, but as a maximum over elements, not a bound)."""
    r = np.asarray(ref, np.float64)
    return 2 * float(np.abs((r + 0.3).astype(dtype).astype(np.float64) - 0.3 - r).max(initial=0)) + 1e-5


def error_stats(out: HostArrayLike, ref: HostArrayLike) -> dict[str, float]:
    """Accuracy of ``out`` against ``ref`` (float64), over all elements:

    - ``rel_rmse`` = ``sqrt(mean((out − ref)²)) / sqrt(mean(ref²))``;
    - ``max_abs`` = ``max|out − ref|``;
    - ``max_rel`` = ``max|out − ref| / max|ref|`` (normwise: elementwise ratios blow up where
      ref is near 0, as attention outputs often are);
    - ``nonfinite``: how many entries of ``out`` are NaN or infinite (then the errors are NaN/inf).

    Returns plain Python floats (and an int), e.g. for JSON.
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if o.shape != r.shape:
        raise ValueError(f"out and ref must have one shape; got {o.shape} and {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ref must be finite")
    nonfinite = int(np.count_nonzero(~np.isfinite(o)))
    if o.size == 0:
        return dict(rel_rmse=0.0, max_abs=0.0, max_rel=0.0, nonfinite=0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(o - r)  # NaN and inf propagate into the statistics
        rmse = float(np.sqrt(np.mean(d * d)))
        max_abs = float(d.max())
    ref_rms = float(np.sqrt(np.mean(r * r)))
    ref_max = float(np.abs(r).max())
    return dict(rel_rmse=_relative(rmse, ref_rms), max_abs=max_abs, max_rel=_relative(max_abs, ref_max),
                nonfinite=nonfinite)


def _relative(err: float, size: float) -> float:
    """err / size; for size 0 (ref all zeros): 0 if err is 0, else inf (NaN stays NaN)."""
    if size > 0 or math.isnan(err):
        return err / size if size > 0 else err
    return 0.0 if err == 0 else math.inf


#: check_close_fp8's factors and floors (see its docstring for why these values).
FP8_MAX_FACTOR = 2.0
FP8_RMSE_FACTOR = 1.5
FP8_MAX_FLOOR = 1e-5  # times max|ref|
FP8_RMSE_FLOOR = 1e-4  # relative RMSE


def check_close_fp8(out: HostArrayLike, ref: HostArrayLike, emulated: HostArrayLike, *,
                    max_factor: float | None = None) -> tuple[bool, dict[str, Any]]:
    """The FP8 correctness rule: the kernel's output ``out`` against the float64 reference ``ref``
    on the dequantised inputs (`attention` with the descales), measured against ``emulated``,
    the same FP8 arithmetic done in NumPy (`attention_fp8_emulated`). All three must hold:

    1. ``out`` has no NaN and no infinity (``ref`` is finite);
    2. ``max|out − ref| ≤ 2·max|emulated − ref| + 1e-5·max|ref|``;
    3. ``rel_rmse(out) ≤ 1.5·rel_rmse(emulated) + 1e-4``.

    Why not DESIGN §6's rule with the "naive" baseline: ``attention_naive`` for FP8 rounds the
    *normalised* probabilities to e4m3, whose smallest subnormal is 2⁻⁹ ≈ 0.002, so at 1k keys
    most probabilities become 0 or one coarse step: a 33% relative RMSE at N(0,1) inputs, where
    the kernels' arithmetic gives 2.4%.
    A bound of twice that would pass a broken kernel. The kernels round the *unnormalised*
    ``P = exp2(x − m) ∈ (0, 1]`` instead, and that rounding (3 mantissa bits, up to 6.25%
    relative per probability) is by far their largest error; only an emulation of it is a
    baseline of the right size.

    Why factors are still needed: the emulation is not bit-exact. (a) P is rounded against the
    *running* row max, which depends on the kernel's key tile (192 keys at head dim 128 and 128 at
    256 on the Hopper FP8 kernel, 64 on the portable one); a different max shifts every P by a non-power-of-two factor, so the
    e4m3 rounding errors are a different draw of the same distribution, not the same errors.
    (b) float32 sums run in another order (tensor cores vs BLAS) and ``ex2.approx`` is not exact,
    so a P near an e4m3 tie can round the other way (one step, 6%). Both change which errors are
    made, not their size: the maximum over many outputs of two such draws differs by tens of
    percent (factor 2 on the max), and the RMSE, an average, much less (factor 1.5).

    Why these floors: they only matter where the emulation is (nearly) exact, e.g. one visible
    key (P = 1) with a float32 output; 1e-5·max|ref| is float32 noise, and a relative RMSE of
    1e-4 is 100x below the e4m3 error of P (about 1e-2 at N(0,1) inputs). Neither lets a real
    bug through: a wrong key permutation, a missing or misapplied descale, a swapped V row, a
    causal diagonal off by one or a dropped key makes errors of the size of the outputs on
    some entries, 1.7x to 1000x the bound over 20 random problems each (tests/
    test_reference_fp8.py shows each one failing). The other way, another key tile (64 or 32
    instead of 128) stays within 0.66 of either bound (0.8 of the RMSE bound with only 16
    outputs): a 1.5x margin. Limit: the bound follows the largest errors, so with outliers (a
    few rows carry errors 100x the rest) a bug that moves one key's weight in ordinary rows,
    such as a dropped key, can hide under it; the N(0,1) cases catch it.

    Returns ``(ok, stats)``: ``stats`` holds ``out`` and ``emulated`` (their `error_stats`),
    ``max_bound``, ``rmse_bound`` and ``failed`` (the rules broken, by name).
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    e = np.asarray(emulated).astype(np.float64)
    if o.shape != r.shape or e.shape != r.shape:
        raise ValueError(f"out, ref and emulated must have one shape; got {o.shape}, {r.shape}, {e.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ref must be finite (the reference of finite inputs is)")
    if not np.isfinite(e).all():
        raise ValueError("emulated has NaN or infinity; the bound would be meaningless")
    so, se = error_stats(o, r), error_stats(e, r)
    ref_max = float(np.abs(r).max()) if r.size else 0.0
    max_bound = (FP8_MAX_FACTOR if max_factor is None else max_factor) * se["max_abs"] + FP8_MAX_FLOOR * ref_max
    rmse_bound = FP8_RMSE_FACTOR * se["rel_rmse"] + FP8_RMSE_FLOOR
    failed = []
    if so["nonfinite"]:
        failed.append("nonfinite")
    if not so["max_abs"] <= max_bound:  # NaN fails
        failed.append("max_abs")
    if not so["rel_rmse"] <= rmse_bound:
        failed.append("rel_rmse")
    stats = dict(out=so, emulated=se, max_bound=max_bound, rmse_bound=rmse_bound, failed=failed)
    return not failed, stats
