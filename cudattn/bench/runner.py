"""One benchmark row per case: cudattn checked and timed, then each peer timed, on one stream."""

from __future__ import annotations

import functools
import gc

import numpy as np

from .. import attention, attention_with_kvcache, to_host
from .._arrays import array as _array
from .._runtime import device as _device
from .._runtime import stream as _stream
from .._spec import dtypes as _dtypes
from . import ascalled, check, inputs, timing
from .grids import FP8, Case
from .peers import BACKENDS


class Session:
    """What every row shares: the device, the stream, the peers, the ceilings, the RNG."""

    def __init__(self, *, peers=None, iters: int = 30, warmup: int = 5, seed: int = 0):
        self.device_id = 0
        self.props = _device.device_properties(self.device_id)
        self.peers = peers
        # One stream for everything, so cudattn and its peers queue behind the same spin kernel.
        self.stream_handle = peers.stream_handle if peers else int(_stream.default_stream(self.device_id).handle)
        self.iters, self.warmup = iters, warmup
        self.rng = np.random.default_rng(seed)
        self.ceilings: dict = {}

    def time(self, fn) -> timing.Timing:
        return timing.gpu_time(fn, self.stream_handle, self.device_id, iters=self.iters, warmup=self.warmup)

    def as_called(self, fn, tag: str = "") -> dict:
        """``fn`` timed as called (ascalled), on the session's stream; ``fn`` is warm already."""
        return ascalled.measure(fn, self.stream_handle, iters=self.iters, warmup=min(self.warmup, 2), tag=tag)


def throughput(case: Case, ms: float) -> dict:
    """TFLOP/s for prefill, TB/s (bytes that must be moved) for decode."""
    if case.kind == "decode":
        return {"tbps": case.bytes / ms / 1e9}
    return {"tflops": case.flops / ms / 1e9}


def _percent_of_ceiling(case: Case, result: dict, ceilings: dict) -> float | None:
    if case.kind == "decode":
        cap = ceilings.get("copy_tbps")
        return None if not cap else 100.0 * result["tbps"] / cap
    cap = ceilings.get("gemm_fp8_tflops" if case.dtype == FP8 else "gemm_bf16_tflops")
    return None if not cap else 100.0 * result["tflops"] / cap


def new_row(case: Case) -> dict:
    """A row with nothing measured yet: the case, and a place for each implementation and ratio."""
    return {"case": case.as_dict(), "label": case.label(), "impls": {}, "ratio": {}, "ratio_as_called": {},
            "ratio_back_to_back": {}, "ratio_as_called_torch": {}}


def time_ours(case: Case, s: Session, call, sets: list) -> dict:
    """cudattn's figures of a row: ``call(st, stream)`` (``stream`` defaults to the session's) over the
    rotated ``sets``, on the GPU (with its throughput and % of ceiling) and as called; where torch runs,
    also as called with torch views of the same sets on the peers' stream (what a torch user sees)."""
    n = len(sets)
    t = s.time(lambda i: call(sets[i % n]))
    ours = {**t.as_dict(), **throughput(case, t.median_ms)}
    ours["pct_of_ceiling"] = _percent_of_ceiling(case, ours, s.ceilings)
    ours.update(s.as_called(lambda i: call(sets[i % n])))
    if s.peers is not None and case.dtype != FP8:
        tours = [tuple(s.peers.torch.from_dlpack(a) for a in st) for st in sets]
        with s.peers.scope():
            ours.update(s.as_called(lambda i: call(tours[i % n], s.peers.stream), tag="_torch"))
        del tours
    return ours


def time_peer(row: dict, name: str, case: Case, s: Session, make, scope) -> None:
    """Peer ``name``'s figures into ``row``: inside ``scope`` (a context manager, entered once: a torch
    user pays no context per call), ``fn = make()`` and ``fn(i)`` (call i, on the peers' stream) timed
    on the GPU and as called; then its ratios to cudattn's figures in ``row``. A backend that refuses
    the case (RuntimeError, from ``make`` or a call) leaves its error, shown as n/a."""
    ours = row["impls"]["cudattn"]
    try:
        with scope:
            fn = make()
            pt = s.time(fn)
            res = {**pt.as_dict(), **throughput(case, pt.median_ms), **s.as_called(fn)}
    except RuntimeError as e:  # backend does not support this case
        row["impls"][name] = {"error": (str(e).strip().splitlines() or [type(e).__name__])[0][:200]}
        return
    row["impls"][name] = res
    # peer ms / cudattn ms: >1 means cudattn is faster, for each way of timing
    row["ratio"][name] = res["median_ms"] / ours["median_ms"]
    row["ratio_as_called"][name] = res["as_called_ms"] / ours["as_called_ms"]
    row["ratio_back_to_back"][name] = res["back_to_back_ms"] / ours["back_to_back_ms"]
    if "as_called_torch_ms" in ours:
        row["ratio_as_called_torch"][name] = res["as_called_ms"] / ours["as_called_torch_ms"]


def run_case(case: Case, s: Session) -> dict:
    row = new_row(case)
    h = s.stream_handle
    host = inputs.host_inputs(case, s.rng)
    sets = inputs.device_sets(host, inputs.set_count(case, s.props.l2_cache_size), h)

    ours_sets, call = sets, lambda st, stream=h: attention(*st, causal=case.causal, stream=stream)
    if case.page_size:  # cudattn reads a paged copy of the same K/V; the peers read the contiguous one
        kp, vp, table = inputs.paged_host(host[1], host[2], case.page_size, s.rng)
        ours_sets = inputs.device_sets((host[0], kp, vp, table), len(sets), h)
        del kp, vp
        call = lambda st, stream=h: attention_with_kvcache(st[0], st[1], st[2], block_table=st[3],  # noqa: E731
                                                           causal=case.causal, stream=stream)

    # Correct first: one call's output, checked on a subsample (contiguous k/v: into a NaN-poisoned out).
    row["check"] = check.check_output(case, *host, to_host(_poison_and_call(call, ours_sets[0], case, h), stream=h),
                                      s.rng)

    ours = time_ours(case, s, call, ours_sets)
    row["impls"]["cudattn"] = ours
    row["sets"] = len(sets)

    if s.peers is not None:
        why = s.peers.skip_reason(case)
        tsets = None if why else [s.peers.tensors(x) for x in sets]
        for name in BACKENDS:
            if why:
                row["impls"][name] = {"error": why}
                continue
            make = functools.partial(_sdpa_calls, s.peers.bare(case), tsets)
            time_peer(row, name, case, s, make, s.peers.scope(name))
        del tsets
        s.peers.torch.cuda.empty_cache()  # give the peers' copies back before the next case
    del sets, ours_sets
    gc.collect()
    return row


def _sdpa_calls(bare, tsets: list):
    """``f(i)``: the peer's forward of set ``i % len(tsets)``."""
    return lambda i: bare(*tsets[i % len(tsets)])


def _poison_and_call(call, st, case: Case, h):
    """One call's output; with contiguous k/v into a NaN-poisoned `out`."""
    if case.page_size:
        return call(st)
    odt = _dtypes.default_out_dtype(st[0].dtype)  # FP8 writes bfloat16
    out = _array.empty(st[0].shape, odt, device=st[0].device_id, stream=h).fill_nan(stream=h)
    attention(*st, causal=case.causal, out=out, stream=h)
    return out
