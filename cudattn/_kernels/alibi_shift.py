"""ALiBi's diagonal for calls on slices of a longer sequence (a ring's local calls).

ALiBi adds ``-slope · |j - i - (Sk - Sq)|`` to the score of query ``i`` and key ``j`` of a call:
distances measured from the call's own bottom-right diagonal. A ring cuts the sequence into
chunks and attends a slice of one chunk's queries to a slice of another chunk's keys, so the
distance it needs is the one in the whole sequence. Inside :func:`shifted` the calls of this
thread move ALiBi's diagonal ``n`` keys right (``FwdParams::alibi_shift``); masks are not
moved. The shift is part of every recorded call's signature, so a call replays only a launch
recorded for its shift.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Shift(threading.local):
    n = 0  # a class default: a thread that never set it reads 0 without a failed lookup (hot path)


local = _Shift()  # `local.n`: this thread's shift, read by every call's key and by the kernels' parameters


@contextmanager
def shifted(n: int) -> Iterator[None]:
    """Move ALiBi's diagonal ``n`` keys right (left for ``n < 0``) for this thread's calls while inside."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"the ALiBi shift must be an int; got {n!r}")
    before = local.n
    local.n = n
    try:
        yield
    finally:
        local.n = before
