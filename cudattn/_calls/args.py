"""Argument helpers shared by the attention entry points (`_api`, `_varlen_api`)."""

from __future__ import annotations

import numpy as np

from . import call as _callpath
from .._arrays import foreign as _foreign


def array_or_none(x):
    """A descale that is an array (an operand of the call), else None (a scalar or None: in the key)."""
    return None if x is None or isinstance(x, (int, float, np.number, np.ndarray)) else x


def descale_key(given, adapted):
    if adapted is None:
        return _callpath.tag(given)
    return (adapted.shape, adapted.strides, adapted.dtype, adapted.device_id)


def check_not_mixed(q, k, v) -> None:
    host = [isinstance(x, np.ndarray) for x in (q, k, v)]
    if any(host):
        names = ", ".join(n for n, h in zip("qkv", host) if h)
        raise TypeError(f"q, k, v must all be NumPy arrays or all device arrays; {names} "
                        f"{'is' if sum(host) == 1 else 'are'} NumPy and the rest are not "
                        "(copy with cudattn.to_device or to_host first)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not _foreign.is_device_array_like(x):
            raise TypeError(f"{name} must be a NumPy array or a device array (DeviceArray, or an object with "
                            f"__cuda_array_interface__ or __dlpack__); got {type(x).__name__}")
