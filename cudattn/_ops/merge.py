"""`cudattn.merge_attention_states`: merge attentions computed over disjoint key sets.

NumPy parts -> `_numpy.merge` (float32 math); device parts -> `_kernels.merge` (the `split_kv_combine`
kernel, whose math, `combine.cuh`, is the one the split-KV decode kernel merges its partials with),
so both paths share one rule; `_spec.merge` checks the parts for both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._arrays import importer as _importer
from .._arrays.types import ArrayLike, Layout, StreamLike
from .._arrays.array import ArrayResult
from .._calls.call import Call
from .._kernels import merge as _merge
from .._numpy.merge import merge_host



def merge_attention_states(outs: ArrayLike | Sequence[ArrayLike], lses: ArrayLike | Sequence[ArrayLike], *,
                           layout: Layout = "bshd", stream: StreamLike = None) -> tuple[ArrayResult, ArrayResult]:
    """Merge N partial attentions over disjoint key sets into the attention over their union.

    ``outs``: N arrays (a list, or one array with a leading N axis), each ``(B, Sq, H, D)``
    ("bshd") or ``(B, H, Sq, D)`` ("bhsd"), all float16, all bfloat16 or all float32; each is the
    normalised attention over its keys. ``lses``: their float32 log-sum-exps ``(B, H, Sq)`` (as
    ``attention(..., return_lse=True)`` returns them). Per row, with ``m = max_s lse_s`` and
    ``w_s = exp(lse_s − m)``: ``out = Σ w_s out_s / Σ w_s``, ``lse = m + log Σ w_s``; a part whose
    LSE is ``-inf`` (it saw no key) is skipped whatever its output holds, and a row whose parts
    are all ``-inf`` gets 0 and ``-inf``. Uses: cascade / shared-prefix attention, attention
    spread over several GPUs, a cache plus new tokens.

    Returns ``(out, lse)``: out in the parts' dtype, in ``layout``; lse float32 ``(B, H, Sq)``.
    NumPy parts give NumPy results (float32 math); device parts give DeviceArrays, computed on
    ``stream`` by the combine kernel of the split-KV path. Device parts given as a list must share
    their strides and be at most 16; more parts must come as one stacked array.
    """
    if not _any_device(outs) and not _any_device(lses):  # NumPy parts, or no arrays: the host path's checks
        return merge_host(outs, lses, layout)
    _first_part(outs, "outs")
    _first_part(lses, "lses")
    o_stacked, l_stacked = _is_array(outs), _is_array(lses)
    objs = (*((outs,) if o_stacked else tuple(outs)), *((lses,) if l_stacked else tuple(lses)))
    n_o = 1 if o_stacked else len(outs)
    names = (("outs",) if o_stacked else tuple(f"outs[{i}]" for i in range(n_o))) + \
        (("lses",) if l_stacked else tuple(f"lses[{i}]" for i in range(len(objs) - n_o)))
    for x, name in zip(objs, names):
        if not _importer.is_device_array_like(x) or isinstance(x, np.ndarray):
            raise TypeError(f"merge_attention_states: {name} must be a device array like the other parts (all "
                            f"NumPy or all device arrays); got {type(x).__name__}")
    call = Call("merge", objs, names, stream)
    return call.run((n_o, o_stacked, l_stacked, layout), None, _full, (n_o, o_stacked, l_stacked, layout),
                    tensors=len(objs), out_index=None, allocates=True)


def _full(call: Call, args, *ops):
    n_o, o_stacked, l_stacked, layout = args
    outs_d = ops[0] if o_stacked else list(ops[:n_o])
    lses_d = ops[n_o] if l_stacked else list(ops[n_o:])
    return _merge.merge_device(outs_d, lses_d, layout, call.stream_ref())


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or (not isinstance(x, Sequence) and _importer.is_device_array_like(x))


def _any_device(x) -> bool:
    """A device array, or a sequence holding one."""
    if _is_array(x):
        return not isinstance(x, np.ndarray)
    return (isinstance(x, Sequence) and not isinstance(x, (str, bytes))
            and any(not isinstance(p, np.ndarray) and _importer.is_device_array_like(p) for p in x))


def _first_part(parts, name: str):
    """The stacked device array, or the first of a sequence of parts (TypeError / ValueError otherwise)."""
    if _is_array(parts):
        return parts
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
        raise TypeError(f"merge_attention_states: {name} must be a sequence (list/tuple) of arrays or one array "
                        f"with a leading N axis; got {type(parts).__name__}")
    if not parts:
        raise ValueError(f"merge_attention_states: {name} must hold at least one part (N >= 1); got 0")
    return parts[0]


