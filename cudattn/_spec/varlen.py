"""Packed variable-length batches, FlashAttention's ``cu_seqlens`` convention: the offsets' checks, and a
packed call described as a Problem.

Sequence ``b`` of a packed ``(total, H, D)`` array is rows ``cu[b] .. cu[b+1] - 1``; ``cu`` is
int32 ``(B + 1,)``, starts at 0, never decreases and ends at ``total``. Offsets held in NumPy
arrays are checked here before any GPU work; offsets in device memory cannot be read without a
sync, so their values are the caller's duty (the kernels clamp them, as for KV caches).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .descales import fp8_descales
from .dtypes import FLOAT8_E4M3
from .geometry import TensorGeom
from .modifiers import kernel_mods
from .problem import Varlen
from .tensors import describe_array
from .validate import validate

_I32 = np.dtype(np.int32)

__all__ = ["check_cu_seqlens", "check_device_offsets", "check_max_seqlen", "check_varlen_call", "validate_varlen"]


def check_cu_seqlens(cu, name: str, total: int, batch: int | None = None) -> np.ndarray:
    """The offsets as int64 values, or a ValueError/TypeError naming ``name`` and the rule broken.

    ``total``: the packed array's row count, which the last offset must equal; ``batch``: the
    number of sequences when another argument has fixed it (``len(cu) == batch + 1``)."""
    if not isinstance(cu, np.ndarray):
        raise TypeError(f"{name} must be an int32 NumPy array of shape (batch + 1,); got {type(cu).__name__}")
    if cu.dtype != np.int32:
        raise TypeError(f"{name} must be int32 (FlashAttention's cu_seqlens); got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 1 entries; got shape {cu.shape}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} must have batch + 1 = {batch + 1} entries; got {cu.shape[0]}")
    vals = cu.astype(np.int64)
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0; got {vals[0]}")
    steps = np.diff(vals)
    if steps.size and steps.min() < 0:
        b = int(np.argmin(steps))
        raise ValueError(f"{name} must not decrease; {name}[{b + 1}] = {vals[b + 1]} < {name}[{b}] = {vals[b]}")
    if vals[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total}; got {vals[-1]}")
    return vals


def check_max_seqlen(max_seqlen, name: str, lengths: np.ndarray | None) -> int:
    """``max_seqlen`` (an int >= 0, at least every sequence's length where the lengths are known)."""
    if isinstance(max_seqlen, (bool, np.bool_)) or not isinstance(max_seqlen, (int, np.integer)):
        raise TypeError(f"{name} must be an int (the longest sequence, as in FlashAttention); got "
                        f"{type(max_seqlen).__name__}")
    n = int(max_seqlen)
    if n < 0:
        raise ValueError(f"{name} must be >= 0; got {n}")
    if lengths is not None and lengths.size and n < int(lengths.max()):
        raise ValueError(f"{name} = {n} is shorter than sequence {int(np.argmax(lengths))} ({int(lengths.max())} rows)")
    return n


def check_device_offsets(cu, name: str, batch: int | None) -> int:
    """The sequence count ``len(cu) - 1`` of a device offsets array, checked for dtype, rank and
    contiguity (its values are the caller's duty)."""
    shape, strides, dtype, _ = describe_array(name, cu, False)
    if dtype != _I32:
        raise TypeError(f"{name} must be int32 (FlashAttention's cu_seqlens); got {dtype}")
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 1 entries; got shape {tuple(shape)}")
    if batch is not None and shape[0] != batch + 1:
        raise ValueError(f"{name} must have batch + 1 = {batch + 1} entries (as cu_seqlens_q); got {shape[0]}")
    if shape[0] > 1 and tuple(strides) != (4,):
        raise ValueError(f"{name} must be contiguous (stride 4 bytes); got strides {tuple(strides)}")
    return shape[0] - 1

_MAX_GRID_YZ = 65535


def check_varlen_call(cu_q, cu_k, max_q, max_k, layout, num_splits) -> None:
    if type(max_q) is int and type(max_k) is int and max_q >= 0 and max_k >= 0 and layout == "bshd" and \
            num_splits is None and cu_q is not None and cu_k is not None:
        return  # the usual call: nothing to say
    given = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": max_q, "max_seqlen_k": max_k}
    missing = [n for n, x in given.items() if x is None]
    if missing:
        raise TypeError(f"a packed variable-length call takes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and "
                        f"max_seqlen_k together (as FlashAttention's varlen functions); missing {', '.join(missing)}")
    if layout != "bshd":
        raise ValueError(f"packed variable-length inputs are (total, heads, head_dim); layout must be 'bshd', "
                         f"got {layout!r}")
    if num_splits is not None:
        raise NotImplementedError("num_splits (the split-KV decode kernel) does not take packed variable-length "
                                  "batches; pass None")
    for name, x in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        check_max_seqlen(x, name, None)


def validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags: dict, out, *, host: bool,
                    mods=(None, None, None)):
    """The Problem of a packed call: checked as one batch entry of the packed rows by `validate`,
    then described as ``B`` sequences of at most ``max_seqlen_q``/``max_seqlen_k`` rows.
    ``mods``: (softcap, sinks, alibi_slopes), checked once the sequence count is known."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape = describe_array(name, x, host)[0]
        if len(shape) != 3:
            total = "total_q, heads_q" if name == "q" else "total_k, heads_kv"
            raise ValueError(f"{name} must be 3-D ({total}, head_dim) in a packed variable-length call; "
                             f"got shape {tuple(shape)}")
    total_q, total_k = q.shape[0], k.shape[0]
    lengths_q = lengths_k = None
    if isinstance(cu_q, np.ndarray):
        lengths_q = np.diff(check_cu_seqlens(cu_q, "cu_seqlens_q", total_q))
        batch = len(lengths_q)
    else:
        batch = check_device_offsets(cu_q, "cu_seqlens_q", None)
    if isinstance(cu_k, np.ndarray):
        lengths_k = np.diff(check_cu_seqlens(cu_k, "cu_seqlens_k", total_k, batch))
    else:
        check_device_offsets(cu_k, "cu_seqlens_k", batch)
    max_q = check_max_seqlen(max_q, "max_seqlen_q", lengths_q)
    max_k = check_max_seqlen(max_k, "max_seqlen_k", lengths_k)
    for name, m, total in (("max_seqlen_q", max_q, total_q), ("max_seqlen_k", max_k, total_k)):
        if m == 0 and total > 0:
            raise ValueError(f"{name} is 0 but the packed tensor has {total} rows: some sequence is longer")
    fp8 = q.dtype == FLOAT8_E4M3
    q_d, k_d, v_d = descales
    if out is not None:
        o_shape = describe_array("out", out, host)[0]
        if tuple(o_shape) != tuple(q.shape):
            raise ValueError(f"out must have q's shape {tuple(q.shape)} (total_q, heads_q, head_dim); got "
                             f"{tuple(o_shape)}")
    problem = validate(q[None], k[None], v[None], layout="bshd", num_splits=None, host=host,
                       q_descale=None if fp8 else q_d, k_descale=None if fp8 else k_d,
                       v_descale=None if fp8 else v_d, out=None if out is None else out[None], **flags)
    scale, ds = problem.scale, problem.descales
    if fp8:  # (batch, heads_kv) descale arrays: batch is the sequence count, known only here
        given = problem.scale if flags["scale"] is None else float(flags["scale"])  # validate checked it
        ds, scale = fp8_descales(q_d, k_d, v_d, batch, problem.heads_kv, host, given)
    if fp8 and 128 * (-(-total_k // 128) + 2 * batch) >= 2**31:  # _fp8.vt_keys: TMA takes 32-bit coordinates
        raise ValueError(f"FP8 packed keys: {total_k} keys in {batch} sequences need a V workspace row of more than "
                         f"2**31 keys; split the call")
    if fp8 and batch > _MAX_GRID_YZ:  # the V transpose's grid has a block row per sequence
        raise ValueError(f"FP8 packed batches take at most {_MAX_GRID_YZ} sequences a call; got {batch}: split the "
                         f"call")
    km = kernel_mods(*mods, batch=batch, heads_q=problem.heads_q, host=host)
    zero = lambda g: TensorGeom(0, g.seq, g.head)  # noqa: E731 (packed: no batch axis)
    return replace(problem, mods=km, batch=batch, seqlen_q=min(max_q, total_q), seqlen_k=min(max_k, total_k),
                   q_strides=zero(problem.q_strides), k_strides=zero(problem.k_strides),
                   v_strides=zero(problem.v_strides),
                   out_strides=None if problem.out_strides is None else zero(problem.out_strides),
                   descales=ds, scale=scale, varlen=Varlen(total_q, total_k))
