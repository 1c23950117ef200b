"""SMs the persistent Hopper forward leaves free, for kernels other streams run meanwhile.

That kernel launches one CTA per SM for the whole call, so a kernel queued on another stream
(NCCL's transfers in a ring, say) gets no SM until it ends. Inside :func:`leave_free` the calls of
this thread plan their grids ``n`` CTAs short of the SM count (as FlashAttention-3's
``sm_margin``): the work is the same, spread over fewer SMs. (The builds that run two CTAs an SM
are not taken inside: the spare CTAs would leave halves of SMs, not whole ones, `_plan`.) The margin is part of every plan's
key and of every recorded call's signature, so a call replays only grids planned for its margin.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

class _Margin(threading.local):
    n = 0  # a class default: a thread that never set it reads 0 without a failed lookup (hot path)


local = _Margin()  # `local.n`: this thread's margin, read by every call's plan key


def current() -> int:
    """This thread's margin (0 outside `leave_free`)."""
    return local.n


def check(n) -> int:
    """``n`` if it is a margin (an int >= 0), else ValueError naming the rule."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"sm_margin must be an int >= 0; got {n!r}")
    return n


@contextmanager
def leave_free(n: int) -> Iterator[None]:
    """Plan this thread's persistent grids ``n`` SMs short while inside (at least one CTA)."""
    check(n)
    before = current()
    local.n = n
    try:
        yield
    finally:
        local.n = before
