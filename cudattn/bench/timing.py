"""GPU time of a call, with CUDA events, the launches queued behind a spin kernel.

The host enqueues all timed calls while a spin kernel holds the stream, so each event pair
measures GPU time alone, not the host's launch overhead (that is measured separately, as host
overhead). Median and 90th percentile over the timed calls, after warm-up calls. Calls whose
figures are compared (cudattn and its peers on one row) are timed in turns (`gpu_times`): the
GPU's clocks follow its recent load, so a call timed right after an idle moment would otherwise
be favoured over one timed after another's burst.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .._runtime import device as _device
from .._runtime import launch as _launch
from .._runtime.device import restores_caller_context
from .._runtime.spin import spin


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    samples: int

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "p90_ms": self.p90_ms, "samples": self.samples}


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] (NumPy's default method)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def refusal(e: RuntimeError) -> str:
    """What a row keeps of a peer's RuntimeError (refusing the case, out of memory): its first line
    (or its type's name)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


ROUNDS = 3  # turns each call gets at least, where calls are timed in turns


def turn_order(n: int, r: int) -> list[int]:
    """The order of ``n`` entries in round ``r`` of calls timed in turns: a Williams design, the
    sequence 0, 1, n-1, 2, n-2, ... shifted by ``r``, and reversed in rounds n..2n-1, so that over
    2n rounds every entry takes every place twice and follows every other entry twice. The GPU's
    clocks follow the load of the last milliseconds: one 16384-row call timed as called took 7-20 %
    longer right after another call's burst than right after a slower peer's. The order used
    before (rotated every other round, reversed between) balanced only neighbours: of four entries
    the second never followed the fourth, the slowest peer, and read up to 7 % slower as called
    than the same call as the first entry."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    order = [(b + r) % n for b in base]
    return order if (r // n) % 2 == 0 else order[::-1]


def rounds_for(n: int, iters: int | None = None) -> int:
    """Rounds for ``n`` entries timed in turns: enough for `turn_order` to balance places and
    predecessors (2n); no more than ``iters`` (each round takes a sample of each entry)."""
    rounds = max(ROUNDS, 2 * n)
    return rounds if iters is None else max(1, min(rounds, iters))


def share(iters: int, rounds: int, r: int) -> int:
    """Round ``r``'s share of ``iters`` samples over ``rounds`` (at least one): the shares add up to
    ``iters`` where it is at least ``rounds``."""
    return max(1, iters // rounds + (r < iters % rounds))


def in_turns(entries: list, iters: int, refusable, turn) -> list:
    """Calls to be compared with each other, timed in turns: for each of ``entries`` (``(fn, scope)``
    pairs), `rounds_for` rounds in `turn_order`, ``turn(j, fn, r, count)`` inside ``scope()``, ``count``
    round ``r``'s share of ``iters`` samples. An entry marked in ``refusable`` (a peer) that raises
    RuntimeError gets no more turns; any other error propagates. Returns each entry's refusal (its
    error's first line), or None."""
    n = len(entries)
    refusable = refusable or [False] * n
    rounds = rounds_for(n, iters)
    errors: list = [None] * n
    for r in range(rounds):
        for j in turn_order(n, r):
            if errors[j] is not None:
                continue
            fn, scope = entries[j]
            try:
                with scope():
                    turn(j, fn, r, share(iters, rounds, r))
            except RuntimeError as e:
                if not refusable[j]:
                    raise
                errors[j] = refusal(e)
    return errors


@restores_caller_context
def gpu_samples(fn, stream_handle: int, device_id: int, *, iters: int = 30, warmup: int = 5, start: int = 0,
                host_us_per_call: float = 300.0) -> list[float]:
    """ms of each of ``fn(i)`` (which queues work on ``stream_handle``), i = start..start+iters-1,
    queued behind a spin kernel after ``warmup`` calls (the indices before ``start``: ``fn(i)`` reads
    input set ``i``, and the first timed call should not find its set in L2 from a warm-up).

    ``host_us_per_call`` bounds the host time to enqueue one call; the spin kernel covers
    ``iters`` of them so the GPU never waits for the host inside the timed region.
    """
    for k in range(warmup):
        fn(start - 1 - k)
    _device.get_device(device_id)  # the events belong to the stream's device
    _launch.synchronize(stream_handle)
    events = [(_launch.Event(stream_handle), _launch.Event(stream_handle)) for _ in range(iters)]
    spin(stream_handle, min(500.0, max(5.0, iters * host_us_per_call / 1e3)), device_id)
    for i, (start_ev, end_ev) in enumerate(events):
        start_ev.record(stream_handle)
        fn(start + i)
        end_ev.record(stream_handle)
    _launch.synchronize(stream_handle)
    return [_launch.elapsed_ms(s, e) for s, e in events]


def gpu_time(fn, stream_handle: int, device_id: int, *, iters: int = 30, warmup: int = 5,
             host_us_per_call: float = 300.0) -> Timing:
    """`gpu_samples`' median and 90th percentile."""
    ms = gpu_samples(fn, stream_handle, device_id, iters=iters, warmup=warmup, host_us_per_call=host_us_per_call)
    return Timing(statistics.median(ms), percentile(ms, 90), len(ms))


def gpu_times(entries: list, stream_handle: int, device_id: int, *, iters: int = 30, warmup: int = 5,
              refusable=None) -> list:
    """`gpu_time` of calls to be compared with each other, timed in turns: ``entries`` = ``(fn,
    scope)`` pairs (``scope()``, a context manager entered around each turn), `rounds_for` rounds
    in `turn_order`, each turn a share of the ``iters`` samples (``warmup`` calls before an entry's
    first turn). Returns a Timing each, or for an entry marked in ``refusable`` (a peer) that raised
    RuntimeError, that error's first line (it gets no more turns); any other error propagates."""
    ms: list[list[float]] = [[] for _ in entries]

    def turn(j, fn, r, count):
        ms[j] += gpu_samples(fn, stream_handle, device_id, iters=count, warmup=warmup if not ms[j] else 0,
                             start=len(ms[j]))

    errors = in_turns(entries, iters, refusable, turn)
    return [err if err is not None else Timing(statistics.median(m), percentile(m, 90), len(m))
            for m, err in zip(ms, errors)]
