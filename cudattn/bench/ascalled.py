"""Time of a call as its caller sees it: CUDA events around the call on an idle stream.

`timing.gpu_time` hides the host: its calls queue behind a spin kernel. Here nothing hides it.
The stream is drained before each sample, so the start event runs at once on the GPU and the
end event only after the host has got through the call and the GPU through its kernels:

- ``single``: one call per sample, the latency of a lone call (host time included whenever the
  host is slower than the kernel, as it is for small problems);
- ``back_to_back``: ``batch`` calls queued with no sync between them, per call; the host's time
  of later calls overlaps the GPU's work of earlier ones, as in a loop of calls.

Calls compared with each other (cudattn and its peers on one row) are timed in turns
(`interleaved`), in another order each round (`timing.turn_order`).
"""

from __future__ import annotations

import contextlib
import statistics

from .._runtime import launch as _launch
from .._runtime.device import restores_caller_context
from .._runtime.spin import spin
from .timing import ROUNDS, Timing, in_turns, percentile, refusal

__all__ = ["BATCH", "ROUNDS", "back_to_back", "interleaved", "measure", "refusal", "samples", "single"]

BATCH = 10  # calls per back-to-back sample: few enough never to fill the launch queue
SETTLE_MS = 5.0  # the spin before each turn of `interleaved`: the clocks leave the last turn's load behind


@restores_caller_context
def samples(fn, stream_handle: int, *, iters: int = 30, warmup: int = 3, start: int = 0) -> list[float]:
    """Events around ``fn(i)`` alone, ``i`` = start..start+iters-1, the stream drained before each: ms
    each. The warm-up calls take the indices before ``start`` (``fn(i)`` reads input set ``i``, and
    the first timed call should not find its set in L2 from a warm-up)."""
    for k in range(warmup):
        fn(start - 1 - k)
    s_ev, e_ev = _launch.Event(stream_handle), _launch.Event(stream_handle)  # reused: elapsed_ms waits for each pair
    ms = []
    for i in range(start, start + iters):
        _launch.synchronize(stream_handle)
        s_ev.record(stream_handle)
        fn(i)
        e_ev.record(stream_handle)
        ms.append(_launch.elapsed_ms(s_ev, e_ev))
    return ms


def single(fn, stream_handle: int, *, iters: int = 30, warmup: int = 3) -> Timing:
    """`samples`' median and 90th percentile."""
    ms = samples(fn, stream_handle, iters=iters, warmup=warmup)
    return Timing(statistics.median(ms), percentile(ms, 90), len(ms))


@restores_caller_context
def back_to_back(fn, stream_handle: int, *, batch: int = BATCH, repeats: int = 3, warmup: int = 3) -> float:
    """Median over ``repeats`` of (events around ``batch`` queued calls) / ``batch``, in ms."""
    for i in range(warmup):
        fn(i)
    start, end = _launch.Event(stream_handle), _launch.Event(stream_handle)
    per_call = []
    for _ in range(repeats):
        _launch.synchronize(stream_handle)
        start.record(stream_handle)
        for i in range(batch):
            fn(i)
        end.record(stream_handle)
        per_call.append(_launch.elapsed_ms(start, end) / batch)
    return statistics.median(per_call)


def measure(fn, stream_handle: int, *, iters: int = 30, warmup: int = 3, tag: str = "", device_id: int = 0) -> dict:
    """Both ways, as row fields: ``as_called{tag}_ms`` (and its p90), ``back_to_back{tag}_ms``
    (``stream_handle`` on ``device_id``)."""
    return interleaved([(fn, contextlib.nullcontext)], stream_handle, iters=iters, warmup=warmup, tags=[tag],
                       device_id=device_id)[0]


def interleaved(entries: list, stream_handle: int, *, iters: int = 30, warmup: int = 3, tags=None,
                refusable=None, device_id: int = 0) -> list[dict]:
    """`measure` for several calls whose figures will be compared: ``entries`` = ``(fn, scope)``
    pairs (``scope()``: a context manager entered around each turn, as the caller would hold it),
    timed in turns, `timing.rounds_for` rounds of a share of the samples each, in a balanced order
    (`timing.turn_order`), each turn after a spin kernel of SETTLE_MS on the stream
    (``device_id``'s), waited for. The GPU's clocks follow the load of the last milliseconds: one
    16384-row call took 7-20 % longer right after another's burst of calls than right after a
    slower peer's, and a drift over the seconds of a row (seen: 470 -> 545 us for one 4096-key
    causal call within half a second) would fall on whichever comes last; the spin (the GPU-time
    turns start with one too) and the turns make every entry start alike. Returns each entry's
    fields (``tags[i]`` in their names). An entry marked in ``refusable`` (a peer) that raises
    RuntimeError (refusing the case, out of memory) gets no more turns and returns
    ``{"as_called_error": its first line}``; any other error propagates."""
    tags = tags or [""] * len(entries)
    single_ms = [[] for _ in entries]
    b2b_ms = [[] for _ in entries]

    def turn(j, fn, r, count):
        _settle(stream_handle, device_id)
        single_ms[j] += samples(fn, stream_handle, iters=count, warmup=warmup if r == 0 else 1, start=len(single_ms[j]))
        b2b_ms[j].append(back_to_back(fn, stream_handle, repeats=1, warmup=0))

    errors = in_turns(entries, iters, refusable, turn)
    return [{"as_called_error": err} if err is not None else
            {f"as_called{t}_ms": statistics.median(ms), f"as_called{t}_p90_ms": percentile(ms, 90),
             f"back_to_back{t}_ms": statistics.median(b)}
            for t, ms, b, err in zip(tags, single_ms, b2b_ms, errors)]


@restores_caller_context
def _settle(stream_handle: int, device_id: int) -> None:
    spin(stream_handle, SETTLE_MS, device_id)
    _launch.synchronize(stream_handle)
