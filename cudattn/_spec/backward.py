"""Check the arguments of one backward call (`cudattn.attention_backward`) and describe it.

q, k, v, the forward's ``out`` and the modifiers are checked by the forward's own rules
(`validate` / `validate_varlen`), so a backward call is refused where the forward call would be.
On top of those: ``dout`` is q's twin, ``lse`` is the forward's float32 LSE, ``deterministic`` is a
bool, and the gradients given (``dq``, ``dk``, ``dv``) have the shapes and dtype of q, k and v,
do not alias themselves, and share no byte with any input or with each other. All before any GPU work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import FLOAT8_E4M3, dtype_name
from .geometry import TensorGeom, c_strides, share_bytes
from .problem import Problem
from .tensors import describe_array, check_no_overlap, kind_name, tensor_geom
from .validate import check_bool, validate
from .varlen import validate_varlen

__all__ = ["Backward", "validate_backward"]

_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Backward:
    """What a backward call adds to its forward `Problem`: element strides of dout and of each
    gradient given (None: cudattn allocates it C-contiguous), and the dQ summation order."""

    deterministic: bool
    dout: TensorGeom
    dq: TensorGeom | None = None
    dk: TensorGeom | None = None
    dv: TensorGeom | None = None


def validate_backward(dout, q, k, v, out, lse, dq, dk, dv, *, host: bool, causal, scale, layout, window_size,
                      softcap, sinks, alibi_slopes, deterministic, varlen=None) -> tuple[Problem, Backward]:
    """(Problem, Backward) of one backward call; ``varlen``: (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k) of a packed batch, else None."""
    for name, x in (("dout", dout), ("out", out), ("lse", lse)):
        if x is None:
            raise TypeError(f"{name} is required: pass what attention(..., return_lse=True) returned "
                            f"(out, lse) and the gradient of the loss with respect to out (dout)")
    if varlen is None:
        problem = validate(q, k, v, causal=causal, scale=scale, layout=layout, out=out, host=host,
                           window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    else:
        cu_q, cu_k, max_q, max_k = varlen
        flags = dict(causal=causal, scale=scale, return_lse=False, out_dtype=None, window_size=window_size)
        problem = validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, (None, None, None), flags, out, host=host,
                                  mods=(softcap, sinks, alibi_slopes))
    if problem.dtype == FLOAT8_E4M3:
        raise NotImplementedError("attention_backward takes float16 or bfloat16 inputs; FP8 (float8_e4m3fn) has "
                                  "no backward pass")
    deterministic = check_bool("deterministic", deterministic)
    packed = varlen is not None
    lay = "bshd" if packed else layout
    wrap = (lambda s: (1, *s)) if packed else (lambda s: s)  # noqa: E731 (packed: one batch entry)

    def tensor(name, x, like_name, like_shape):
        if isinstance(x, np.ndarray) != host:
            want = "a NumPy array" if host else "a device array"
            raise TypeError(f"{name} must be {want}, as q, k, v are; got {kind_name(x)}")
        shape, strides, dt, ptr = describe_array(name, x, host)
        if tuple(shape) != tuple(like_shape):
            raise ValueError(f"{name} must have {like_name}'s shape {tuple(like_shape)}; got {tuple(shape)}")
        if dt != problem.dtype:
            raise TypeError(f"{name} must have {like_name}'s dtype {dtype_name(problem.dtype)}; got {dtype_name(dt)}")
        geom = tensor_geom(name, wrap(tuple(shape)), wrap(tuple(strides)), dt.itemsize, ptr, lay)
        return shape, strides, ptr, geom

    q_shape, k_shape = tuple(q.shape), tuple(k.shape)
    do_geom = tensor("dout", dout, "q", q_shape)[3]

    # lse: the forward's, float32, C-contiguous
    if isinstance(lse, np.ndarray) != host:
        raise TypeError(f"lse must be {'a NumPy array' if host else 'a device array'}, as q, k, v are; got "
                        f"{kind_name(lse)}")
    l_shape, l_strides, l_dt, l_ptr = describe_array("lse", lse, host)
    want = (problem.heads_q, problem.varlen.total_q) if packed else (problem.batch, problem.heads_q, problem.seqlen_q)
    names = "(heads_q, total_q)" if packed else "(batch, heads_q, seqlen_q)"
    if tuple(l_shape) != want:
        raise ValueError(f"lse must be the forward's LSE, float32 {names} = {want}; got shape {tuple(l_shape)}")
    if l_dt != _F32:
        raise TypeError(f"lse must be float32 (the forward's LSE); got {dtype_name(l_dt)}")
    if any(s != e for s, e, n in zip(l_strides, c_strides(want, 4), want) if n > 1):
        raise ValueError(f"lse must be C-contiguous (as attention returns it); got strides {tuple(l_strides)} bytes")

    # the gradients given
    spans = [("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)]
    geoms = {}
    for name, x, like in (("dq", dq, "q"), ("dk", dk, "k"), ("dv", dv, "v")):
        if x is None:
            geoms[name] = None
            continue
        if not host and getattr(x, "readonly", False):
            raise ValueError(f"{name} must be a writeable device array (it is marked read-only)")
        if host and not x.flags.writeable:
            raise ValueError(f"{name} must be a writeable NumPy array (it is read-only)")
        shape, strides, ptr, geom = tensor(name, x, like, q_shape if like == "q" else k_shape)
        if 0 not in shape:
            try:
                check_no_overlap(wrap(tuple(shape)), geom, lay)
            except ValueError:
                raise ValueError(f"{name} has overlapping elements; it must not alias itself") from None
            for other, y in spans:
                if _shares(x, y, host):
                    raise ValueError(f"{name} overlaps {other} (they share memory); the backward would overwrite "
                                     f"an input it still reads: pass a separate {name}")
        spans.append((name, x))
        geoms[name] = geom
    return problem, Backward(deterministic, do_geom, geoms["dq"], geoms["dk"], geoms["dv"])


def _shares(x, y, host: bool) -> bool:
    """Whether two arrays share a byte (empty ones share none)."""
    if host:
        return np.shares_memory(x, y)
    ax, ay = describe_array("x", x, False), describe_array("y", y, False)
    if 0 in ax[0] or 0 in ay[0] or not ax[3] or not ay[3]:
        return False
    return share_bytes(ax[3], ax[0], ax[1], ax[2].itemsize, ay[3], ay[0], ay[1], ay[2].itemsize)
