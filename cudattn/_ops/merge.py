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
from .._calls.operands import check_not_mixed
from .._kernels import merge as _merge
from .._kernels.params import MERGE_MAX_TABLE
from .._numpy.merge import merge_host



def merge_attention_states(outs: ArrayLike | Sequence[ArrayLike], lses: ArrayLike | Sequence[ArrayLike], *,
                           layout: Layout = "bshd", stream: StreamLike = None) -> tuple[ArrayResult, ArrayResult]:
    """Merge N partial attentions over disjoint key sets into the attention over their union.

    Per row, with ``m = max_s lse_s`` and ``w_s = exp(lse_s − m)``: ``out = Σ w_s out_s / Σ w_s``,
    ``lse = m + log Σ w_s``; a part whose LSE is ``-inf`` (it saw no key) is skipped whatever its
    output holds, and a row whose parts are all ``-inf`` gets 0 and ``-inf``. Uses: cascade /
    shared-prefix attention, attention spread over several GPUs, a cache plus new tokens.

    NumPy parts give NumPy results (float32 math, on the host); device parts give DeviceArrays,
    computed on ``stream`` by the combine kernel of the split-KV decode path. Device parts given
    as a list must share their strides and be at most 16; more must come as one stacked array.

    Parameters
    ----------
    outs : sequence of arrays, or one array with a leading N axis
        Each ``(B, Sq, H, D)`` ("bshd") or ``(B, H, Sq, D)`` ("bhsd"), all float16, all bfloat16
        or all float32: the normalised attention over its keys.
    lses : sequence of arrays, or one array with a leading N axis
        Their float32 log-sum-exps ``(B, H, Sq)``, as ``attention(..., return_lse=True)`` gives.
    layout : "bshd" or "bhsd"
    stream : optional
        Device parts: the stream to run on, as in :func:`cudattn.attention`.

    Returns
    -------
    out : NumPy array or DeviceArray
        ``(B, Sq, H, D)`` or ``(B, H, Sq, D)`` in ``layout``, in the parts' dtype.
    lse : NumPy array or DeviceArray
        float32 ``(B, H, Sq)``.

    Raises
    ------
    TypeError
        A part that is no array, NumPy and device parts mixed (each named), or a wrong dtype.
    ValueError
        No parts, unequal counts of outs and lses, or shapes that do not match.
    cudattn.NoDeviceError, cudattn.OutOfMemoryError, cudattn.CudaError
        Device parts only, as in :func:`cudattn.attention`.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> q = np.random.randn(1, 4, 8, 64).astype(np.float16)
    >>> k = np.random.randn(1, 512, 8, 64).astype(np.float16)
    >>> v = np.random.randn(1, 512, 8, 64).astype(np.float16)
    >>> o1, l1 = cudattn.attention(q, k[:, :256], v[:, :256], return_lse=True)
    >>> o2, l2 = cudattn.attention(q, k[:, 256:], v[:, 256:], return_lse=True)
    >>> out, lse = cudattn.merge_attention_states([o1, o2], [l1, l2])   # attention over all 512 keys
    >>> out.shape, lse.shape
    ((1, 4, 8, 64), (1, 8, 4))
    """
    named = _named_parts(outs, "outs") + _named_parts(lses, "lses")
    if all(isinstance(x, np.ndarray) for _, x in named):  # NumPy parts, or no arrays: the host path's checks
        return merge_host(outs, lses, layout)
    check_not_mixed(named, "merge_attention_states: ", "the parts of outs and lses")  # all device arrays after
    _first_part(outs, "outs")
    _first_part(lses, "lses")
    o_stacked, l_stacked = _is_array(outs), _is_array(lses)
    n_o = 1 if o_stacked else len(outs)
    call = Call("merge", tuple(x for _, x in named), tuple(n for n, _ in named), stream)
    # more separate parts than the kernel's pointer table holds are merged by the distance between
    # them, an address-dependent choice a replay cannot repeat: the full path judges each such call
    many = (not o_stacked and n_o > MERGE_MAX_TABLE) or (not l_stacked and len(lses) > MERGE_MAX_TABLE)
    return call.run((n_o, o_stacked, l_stacked, layout), None, _full, (n_o, o_stacked, l_stacked, layout),
                    tensors=len(call.ops), out_index=None, allocates=True, force_full=many)


def _full(call: Call, args, *ops):
    n_o, o_stacked, l_stacked, layout = args
    outs_d = ops[0] if o_stacked else list(ops[:n_o])
    lses_d = ops[n_o] if l_stacked else list(ops[n_o:])
    return _merge.merge_device(outs_d, lses_d, layout, call.stream_ref())


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or (not isinstance(x, Sequence) and _importer.is_device_array_like(x))


def _named_parts(parts, name: str) -> tuple:
    """``(name, part)`` for each part of ``outs`` or ``lses`` (one for a stacked array; none when
    ``parts`` is no sequence: `_first_part` or the host path reports that)."""
    if _is_array(parts):
        return ((name, parts),)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
        return ()
    return tuple((f"{name}[{i}]", p) for i, p in enumerate(parts))


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


