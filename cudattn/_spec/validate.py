"""Check the arguments of one attention call and describe it as a `Problem`.

Everything here runs before any GPU work, on the per-call hot path for device arrays, so the
valid path uses plain attribute reads and int arithmetic (no NumPy calls). Each error names
the argument and the rule it broke.

Order of checks (the first error should be the one worth fixing first):

1. q, k, v are all NumPy arrays or all device arrays (and match ``host``);
2. ``layout``;
3. rank (4-D) of q, k, v;
4. dtype of q, k, v (supported, then shared);
5. shapes: heads >= 1 (empty batches and sequences are valid), batch agrees, k and v agree, head_dim agrees,
   supported head_dim, heads_q % heads_kv;
6. strides and pointer of q, k, v: unit last stride, no negative strides, strides multiples of
   the element size and of 16 bytes, 16-byte-aligned data pointer;
7. ``causal``, ``return_lse``, ``scale``;
8. the FP8 descales (FP8 inputs only); ``num_splits`` (not with FP8 yet: NotImplementedError);
9. ``out_dtype``, then ``out``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .descales import fp8_descales
from .dtypes import FLOAT8_E4M3, RECOGNIZED, dtype_name, input_dtype_error, resolve_out_dtype
from .modifiers import kernel_mods, window_of
from .problem import Problem
from .tensors import ALIGN_BYTES, _LAYOUT_AXES, _MAX_SIZE, check_no_overlap, describe_array, kind_name, tensor_geom
from .geometry import TensorGeom

__all__ = ["validate", "tensor_geom", "ALIGN_BYTES", "HEAD_DIMS"]

#: Head dims the kernels are built for.
HEAD_DIMS = tuple(range(8, 257, 8))
_HEAD_DIM_TEXT = "a multiple of 8 from 8 to 256 (8, 16, 24, ..., 256)"
#: The kernels take ``scale · log2(e)`` as a float32: at most this in magnitude keeps it finite,
#: and below _SCALE_TINY it would round to 0, which turns masked scores (-inf · 0) into NaN.
_SCALE_MAX = 2.0**127
_SCALE_TINY = 2.0**-126


_MIX_MESSAGE = "q, k, v must all be NumPy arrays or all device arrays"


#: Most splits a call may ask for (the combine merges at most this many partial results per row).
MAX_SPLITS = 128


def check_num_splits(num_splits: object) -> int | None:
    """None (the heuristic chooses), or an int from 1 to MAX_SPLITS."""
    if num_splits is None:
        return None
    if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"num_splits must be None or an int from 1 to {MAX_SPLITS}; got "
                        f"{type(num_splits).__name__} {num_splits!r}")
    n = int(num_splits)
    if not 1 <= n <= MAX_SPLITS:
        raise ValueError(f"num_splits must be from 1 to {MAX_SPLITS} (None: chosen from the GPU's size and the "
                         f"KV length); got {n}")
    return n


def check_bool(name: str, x: object) -> bool:
    if x is True or x is False:
        return x  # type: ignore[return-value]
    if isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(f"{name} must be a bool (True or False); got {type(x).__name__} {x!r}")


def check_scale(scale: object, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    t = type(scale)
    if t is float or t is int:
        s = scale
    elif t is bool or isinstance(scale, np.bool_):
        raise TypeError(f"scale must be a real number (float or int), not a bool; got {scale!r}")
    elif isinstance(scale, (np.floating, np.integer, numbers.Real)):
        s = scale
    else:
        raise TypeError(f"scale must be a real number (float or int) or None; got {type(scale).__name__} {scale!r}")
    try:
        s = float(s)  # type: ignore[arg-type]
    except OverflowError:
        s = math.inf
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite; got {scale!r}")
    if abs(s) > _SCALE_MAX:
        raise ValueError(f"scale must be at most 2**127 in magnitude (the kernels compute in float32); got {scale!r}")
    return s if abs(s) >= _SCALE_TINY else 0.0  # softmax(s · 1e-38 · qk) is uniform, as for 0


def _check_layout(layout: object) -> None:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be the string 'bshd' or 'bhsd'; got {type(layout).__name__} {layout!r}")
    raise ValueError(
        f"layout must be 'bshd' (q (B, Sq, Hq, D), as FlashAttention) or 'bhsd' (q (B, Hq, Sq, D), "
        f"as torch SDPA); got {layout!r}"
    )


def _check_kinds(q: object, k: object, v: object, host: bool | None) -> bool:
    nq, nk, nv = isinstance(q, np.ndarray), isinstance(k, np.ndarray), isinstance(v, np.ndarray)
    if not (nq == nk == nv):
        raise TypeError(f"{_MIX_MESSAGE}; got q: {kind_name(q)}, k: {kind_name(k)}, v: {kind_name(v)}")
    if host is None:
        return nq
    if host != nq:
        raise TypeError(
            f"{_MIX_MESSAGE} matching host={host!r}; got q: {kind_name(q)}, k: {kind_name(k)}, v: {kind_name(v)}"
        )
    return bool(host)


def check_out(out: object, host: bool, q_shape: tuple, out_dtype, layout: str) -> TensorGeom:
    if isinstance(out, np.ndarray) != host:
        want = "a NumPy array (q, k, v are NumPy arrays)" if host else "a device array (q, k, v are device arrays)"
        raise TypeError(f"out must be {want}; got {kind_name(out)}")
    shape, strides, dtype, ptr = describe_array("out", out, host)
    if shape != q_shape:
        raise ValueError(f"out must have q's shape {q_shape}; got {shape}")
    if dtype != out_dtype:
        raise TypeError(f"out must have the output dtype {dtype_name(out_dtype)}; got {dtype_name(dtype)}")
    if host and not out.flags.writeable:  # type: ignore[attr-defined]
        raise ValueError("out must be a writeable NumPy array (it is read-only)")
    if not host and getattr(out, "readonly", False):  # e.g. a DLPack import marked read-only
        raise ValueError("out must be a writeable device array (it is marked read-only)")
    geom = tensor_geom("out", shape, strides, dtype.itemsize, ptr, layout)
    if 0 not in shape:  # an empty out has no elements to alias (and NumPy gives it 0 strides)
        check_no_overlap(shape, geom, layout)
    return geom


def validate(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    layout="bshd",
    return_lse=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
    num_splits=None,
    out=None,
    host: bool | None = None,
    window_size=None,
    softcap=None,
    sinks=None,
    alibi_slopes=None,
) -> Problem:
    """Check one attention call and return its `Problem` (strides in elements, (batch, seq, head) order;
    ``out_strides`` is None unless ``out`` is given).

    ``q, k, v`` are NumPy arrays (``host=True``) or device arrays exposing ``shape``, ``strides``
    (bytes), ``dtype`` (a NumPy dtype) and ``ptr`` (``host=False``); ``host=None`` infers it.
    Raises TypeError / ValueError naming the argument and the rule, NotImplementedError for
    combinations not released yet (FP8 with ``num_splits``, a non-default ``out_dtype`` for 16-bit inputs).
    """
    # 1. host or device, and the same for all three
    host = _check_kinds(q, k, v, host)

    # 2. layout
    if not isinstance(layout, str):  # before ==, which NumPy arrays would answer elementwise
        _check_layout(layout)
    if layout == "bshd":
        bshd = True
    elif layout == "bhsd":
        bshd = False
    else:
        _check_layout(layout)

    qs, qst, qdt, qptr = describe_array("q", q, host)
    ks, kst, kdt, kptr = describe_array("k", k, host)
    vs, vst, vdt, vptr = describe_array("v", v, host)

    # 3. rank
    for name, shp in (("q", qs), ("k", ks), ("v", vs)):
        if len(shp) != 4:
            axes = _LAYOUT_AXES[layout][name != "q"]
            raise ValueError(f"{name} must be 4-D {axes} for layout {layout!r}; got shape {shp} ({len(shp)}-D)")

    # 4. dtype
    if qdt not in RECOGNIZED:
        raise input_dtype_error(qdt, "q")
    if kdt != qdt or vdt != qdt:
        for name, dt in (("k", kdt), ("v", vdt)):
            if dt not in RECOGNIZED:
                raise input_dtype_error(dt, name)
        raise TypeError(
            f"q, k, v must share one dtype; got q {dtype_name(qdt)}, k {dtype_name(kdt)}, v {dtype_name(vdt)}"
        )

    # 5. shapes
    if bshd:
        B, Sq, Hq, D = qs
        Bk, Sk, Hkv, Dk = ks
        Bv, Sv, Hv, Dv = vs
    else:
        B, Hq, Sq, D = qs
        Bk, Hkv, Sk, Dk = ks
        Bv, Hv, Sv, Dv = vs
    # Empty batches and sequences are valid (an empty result; Sk = 0: every row sees no key);
    # zero heads are not: Hq % Hkv has no meaning then.
    if Hq < 1 or Hkv < 1 or Hv < 1:
        for name, n, shp in (("q", Hq, qs), ("k", Hkv, ks), ("v", Hv, vs)):
            if n < 1:
                raise ValueError(f"{name} has heads = {n} (shape {shp}); the heads axis must be >= 1")
    if Bk != B or Bv != B:
        raise ValueError(f"q, k, v must have the same batch size; got q {B}, k {Bk}, v {Bv}")
    if ks != vs:
        differ = [a for a, x, y in (("seqlen_k", Sk, Sv), ("heads_kv", Hkv, Hv), ("head_dim", Dk, Dv)) if x != y]
        raise ValueError(
            f"k and v must have the same shape; got k {ks} and v {vs} ({', '.join(differ)} differ)"
        )
    if Dk != D:
        raise ValueError(f"q, k, v must have the same head_dim (last axis); got q {D}, k and v {Dk}")
    if D % 8 or D < 8 or D > 256:
        raise ValueError(f"head_dim (last axis of q, k, v) must be {_HEAD_DIM_TEXT}; got {D}")
    fp8 = qdt == FLOAT8_E4M3
    if fp8 and D % 16:
        raise ValueError(f"FP8 head_dim (last axis of q, k, v) must be a multiple of 16 from 16 to 256 "
                         f"(rows of whole 16-byte vectors); got {D}")
    if Hq % Hkv:
        raise ValueError(
            f"heads_q ({Hq}, q's heads axis) must be a multiple of heads_kv ({Hkv}, k/v's heads axis): "
            f"with GQA/MQA query head h reads kv head h // (heads_q // heads_kv)"
        )
    if max(B, Sq, Sk, Hq, Hkv) > _MAX_SIZE:  # e.g. a broadcast (stride 0) axis of 2**32 keys
        raise ValueError(f"batch, seqlen and heads must each be at most 2**31 - 1 (the kernels take 32-bit sizes); "
                         f"got q {qs}, k {ks}")

    # 6. strides and pointers
    itemsize = qdt.itemsize
    q_geom = tensor_geom("q", qs, qst, itemsize, qptr, layout)
    k_geom = tensor_geom("k", ks, kst, itemsize, kptr, layout)
    v_geom = tensor_geom("v", vs, vst, itemsize, vptr, layout)

    # 7. flags and scale
    causal = check_bool("causal", causal)
    window = None if window_size is None else window_of(window_size, causal)
    return_lse = check_bool("return_lse", return_lse)
    scale = check_scale(scale, D)
    mods = kernel_mods(softcap, sinks, alibi_slopes, batch=B, heads_q=Hq, host=host)

    # 8. FP8 descales, split-KV
    descales = None
    if fp8:
        descales, scale = fp8_descales(q_descale, k_descale, v_descale, B, Hkv, host, scale)
    elif q_descale is not None or k_descale is not None or v_descale is not None:
        name = "q_descale" if q_descale is not None else "k_descale" if k_descale is not None else "v_descale"
        raise ValueError(f"{name} applies to FP8 (float8_e4m3fn) inputs only; q, k, v are {dtype_name(qdt)}: "
                         f"pass None")
    num_splits = check_num_splits(num_splits)
    if fp8 and num_splits is not None:
        raise NotImplementedError("num_splits (split-KV) is not supported for FP8 inputs yet; pass None "
                                  "(FP8 decode runs the prefill kernel)")

    # 9. output
    odt = resolve_out_dtype(out_dtype, qdt)
    out_geom = None if out is None else check_out(out, host, qs, odt, layout)

    return Problem(
        batch=B,
        seqlen_q=Sq,
        seqlen_k=Sk,
        heads_q=Hq,
        heads_kv=Hkv,
        head_dim=D,
        dtype=qdt,
        out_dtype=odt,
        layout=layout,
        causal=causal,
        scale=scale,
        return_lse=return_lse,
        host=host,
        q_strides=q_geom,
        k_strides=k_geom,
        v_strides=v_geom,
        out_strides=out_geom,
        num_splits=num_splits,
        descales=descales,
        window=window,
        mods=mods,
    )
