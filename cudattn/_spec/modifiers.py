"""Score modifiers: sliding windows, softcap, attention sinks and ALiBi, with their checks.

The semantics, shared by every path that takes them (FlashAttention's conventions):

- ``window_size=(left, right)``: query ``i`` sees key ``j`` iff
  ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (bottom-right aligned); ``-1`` leaves that
  side unbounded. ``causal=True`` sets ``right = 0``.
- ``softcap``: scores ``s = scale · q·kᵀ`` become ``softcap · tanh(s / softcap)`` (0: off).
- ``alibi_slopes``: ``(Hq,)`` or ``(B, Hq)``; ``-slope · |i + Sk - Sq - j|`` is added to the
  (capped) score of every visible key.
- ``sinks``: ``(Hq,)`` logits, one per query head, that join each row's softmax denominator and
  carry no value: ``out = Σ_j e^{s_j} v_j / (Σ_j e^{s_j} + e^{sink})``,
  ``lse = log(Σ_j e^{s_j} + e^{sink})``. A row that sees no key gets output 0 and LSE ``sink``.

The order: score, softcap, ALiBi, masks (causal, window), softmax with the sink.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .descales import device_meta
from .geometry import c_strides

__all__ = ["ScoreMods", "KernelMods", "parse_modifiers", "kernel_mods", "window_of", "NONE", "MOD_SOFTCAP",
           "MOD_ALIBI", "MOD_WINDOW"]

#: Bits of a kernel build's score modifiers (CUDATTN_MODS, cu_src/include/cudattn/mods.cuh).
#: MOD_WINDOW: a sliding window compiled into an FP8 Hopper build (the other builds always take one).
MOD_SOFTCAP, MOD_ALIBI, MOD_WINDOW = 1, 2, 4

_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class ScoreMods:
    """The modifiers of one call, checked. ``window``: (left, right) with -1 for unbounded, right
    already 0 when causal; ``sinks``: float64 (Hq,) or None; ``alibi``: float64 (B, Hq) or None."""

    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    sinks: np.ndarray | None = None
    alibi: np.ndarray | None = None

    @property
    def active(self) -> bool:
        return self.window != (-1, -1) or self.softcap != 0.0 or self.sinks is not None or self.alibi is not None

    # ---- the reference's use (float64 or float32 score blocks)

    def key_range(self, idx: np.ndarray, Sq: int, Sk: int, causal: bool) -> tuple[int, int]:
        """Keys [lo, hi) hold every key the query rows ``idx`` see (hi <= lo: none)."""
        off = Sk - Sq
        left, right = self.window
        right = 0 if causal else right
        hi = Sk if right < 0 else min(Sk, int(idx.max()) + off + right + 1)
        lo = 0 if left < 0 else max(0, int(idx.min()) + off - left)
        return lo, max(lo, hi)

    def visible(self, idx: np.ndarray, cols: np.ndarray, Sq: int, Sk: int, causal: bool) -> np.ndarray:
        """(rows, cols) bool: which keys ``cols`` each query row ``idx`` sees."""
        d = cols[None, :] - (idx[:, None] + (Sk - Sq))  # key index relative to the row's diagonal
        left, right = self.window
        right = 0 if causal else right
        ok = np.ones(d.shape, bool)
        if right >= 0:
            ok &= d <= right
        if left >= 0:
            ok &= d >= -left
        return ok

    def scores(self, s: np.ndarray, b: int, h: int, idx: np.ndarray, lo: int, Sq: int, Sk: int,
               causal: bool) -> None:
        """In place on the scaled scores ``s`` of rows ``idx`` over keys ``lo ..``: softcap, ALiBi, masks."""
        if self.softcap:
            c = s.dtype.type(self.softcap)
            np.multiply(np.tanh(s / c), c, out=s)
        cols = np.arange(lo, lo + s.shape[1])
        if self.alibi is not None:
            dist = np.abs(idx[:, None] + (Sk - Sq) - cols[None, :]).astype(s.dtype)
            s -= s.dtype.type(self.alibi[b, h]) * dist
        if causal or self.window != (-1, -1):
            s[~self.visible(idx, cols, Sq, Sk, causal)] = -np.inf

    def sink(self, h: int) -> float | None:
        return None if self.sinks is None else float(self.sinks[h])


NONE = ScoreMods()


def parse_modifiers(window_size=None, softcap=None, sinks=None, alibi_slopes=None, *, causal: bool = False,
                    batch: int, heads_q: int) -> ScoreMods:
    """Check the modifiers (NumPy arrays for sinks and slopes) and return them as a ScoreMods.

    Each error names the argument and the rule: a window that is not a pair of ints >= -1, a
    softcap that is negative or not finite, sinks not float32 ``(Hq,)`` of finite values, slopes
    not float32 ``(Hq,)`` or ``(B, Hq)`` of finite values."""
    window = _window(window_size, causal)
    cap = _softcap(softcap)
    sk = None
    if sinks is not None:
        sk = _array("sinks", sinks, ((heads_q,),), f"(heads_q,) = ({heads_q},)")
    al = None
    if alibi_slopes is not None:
        al = _array("alibi_slopes", alibi_slopes, ((heads_q,), (batch, heads_q)),
                    f"(heads_q,) = ({heads_q},) or (batch, heads_q) = ({batch}, {heads_q})")
        al = np.broadcast_to(al, (batch, heads_q))
    return ScoreMods(window, cap, sk, al)


@dataclass(frozen=True)
class KernelMods:
    """Softcap, sinks and ALiBi as the kernels take them (the window travels on its own).
    ``sinks_ptr``/``alibi_ptr``: device addresses of float32 ``(Hq,)`` sinks and of slopes
    ``(Hq,)`` or ``(B, Hq)`` (``alibi_per_batch``), C-contiguous; 0 while they are still NumPy
    arrays (the NumPy path checks them by value and uploads them) or absent."""

    softcap: float = 0.0
    sinks: bool = False
    alibi: bool = False
    alibi_per_batch: bool = False
    sinks_ptr: int = 0
    alibi_ptr: int = 0

    @property
    def bits(self) -> int:
        """The build's compile-time modifiers (sinks are read at run time by every build)."""
        return (MOD_SOFTCAP if self.softcap else 0) | (MOD_ALIBI if self.alibi else 0)


def kernel_mods(softcap=None, sinks=None, alibi_slopes=None, *, batch: int, heads_q: int,
                host: bool) -> KernelMods | None:
    """Check softcap, sinks and slopes for a kernel call; None when none is given. NumPy arrays
    (``host``) are checked by value; device arrays by shape, dtype and contiguity (their values
    are read by the kernels only)."""
    cap = _softcap(softcap)
    if not cap and sinks is None and alibi_slopes is None:
        return None
    per_batch = False
    s_ptr = a_ptr = 0
    if sinks is not None:
        s_ptr, _ = _kernel_array("sinks", sinks, ((heads_q,),), f"(heads_q,) = ({heads_q},)", host)
    if alibi_slopes is not None:
        a_ptr, shape = _kernel_array("alibi_slopes", alibi_slopes, ((heads_q,), (batch, heads_q)),
                                     f"(heads_q,) = ({heads_q},) or (batch, heads_q) = ({batch}, {heads_q})", host)
        per_batch = len(shape) == 2
    return KernelMods(cap, sinks is not None, alibi_slopes is not None, per_batch, s_ptr, a_ptr)


def _kernel_array(name: str, x, shapes, want: str, host: bool) -> tuple[int, tuple]:
    """(device address or 0 for a NumPy array, shape) of a float32 modifier array."""
    if isinstance(x, np.ndarray):
        if not host:
            raise TypeError(f"{name} is a NumPy array but q, k, v are device arrays; pass a float32 device "
                            f"array of shape {want} (e.g. cudattn.to_device({name}))")
        _array(name, x, shapes, want)
        return 0, x.shape
    if host:
        raise TypeError(f"{name} must be a NumPy float32 array of shape {want} (q, k, v are NumPy arrays); "
                        f"got {type(x).__name__}")
    shape, dtype, strides, ptr = device_meta(x, name, f"a float32 device array of shape {want}")
    if dtype != _F32:
        raise TypeError(f"{name} must be float32; got {dtype}")
    if shape not in shapes:
        raise ValueError(f"{name} must have shape {want}; got {shape}")
    dense = c_strides(shape, 4)
    if strides is not None and any(s != d for s, d, n in zip(strides, dense, shape) if n > 1):
        raise ValueError(f"{name} must be C-contiguous (strides {dense} bytes); got {tuple(strides)}")
    if ptr % 4:
        raise ValueError(f"{name} must be 4-byte aligned; its address is {ptr:#x}")
    return ptr, shape


def window_of(window_size, causal: bool) -> tuple[int, int] | None:
    """The kernels' window: checked ``(left, right)``, or None where it masks nothing more than
    ``causal`` does (None, ``(-1, -1)``, or causal with ``left = -1``)."""
    w = _window(window_size, causal)
    return None if w == (-1, -1) or causal and w[0] == -1 else w


def _window(window_size, causal: bool) -> tuple[int, int]:
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints (-1: unbounded); got {window_size!r}")
    out = []
    for name, x in zip(("left", "right"), window_size):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"window_size's {name} must be an int (-1: unbounded); got {x!r}")
        if x < -1:
            raise ValueError(f"window_size's {name} must be >= -1 (-1: unbounded); got {x}")
        out.append(int(x))
    return (out[0], 0 if causal else out[1])


def _softcap(softcap) -> float:
    if softcap is None:
        return 0.0
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number (0: off); got {softcap!r}")
    v = float(softcap)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"softcap must be finite and >= 0 (0: off); got {softcap!r}")
    return v


def _array(name: str, x, shapes, want: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a float32 array of shape {want}; got {type(x).__name__}")
    if x.dtype != _F32:
        raise TypeError(f"{name} must be float32; got {x.dtype}")
    if x.shape not in shapes:
        raise ValueError(f"{name} must have shape {want}; got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite; it holds NaN or inf")
    return x.astype(np.float64)
