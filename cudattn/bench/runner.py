"""One benchmark row per case: cudattn checked and timed, then each peer timed, on one stream."""

from __future__ import annotations

import contextlib
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
        if peers:
            # The peers' stream is one torch made, known as lasting once seen as torch's (as a torch
            # user's first call shows it): from the first row on, so that cudattn's rows, which pass
            # its handle as an int, are timed alike in every row.
            _stream.as_stream(peers.stream, None)
        self.iters, self.warmup = iters, warmup
        self.rng = np.random.default_rng(seed)
        self.ceilings: dict = {}

    def gpu_times(self, entries: list, refusable: list) -> list:
        """``entries`` (``(fn, scope)``) timed on the GPU in turns (`timing.gpu_times`), on the
        session's stream."""
        return timing.gpu_times(entries, self.stream_handle, self.device_id, iters=self.iters, warmup=self.warmup,
                                refusable=refusable)

    def as_called(self, entries: list, tags: list, refusable: list) -> list[dict]:
        """``entries`` (``(fn, scope)``, each ``fn`` warm already) timed as called in turns
        (`ascalled.interleaved`), on the session's stream."""
        return ascalled.interleaved(entries, self.stream_handle, iters=self.iters, warmup=min(self.warmup, 2),
                                    tags=tags, refusable=refusable, device_id=self.device_id)


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


class Turns:
    """A row's calls, collected while the row is set up (`time_ours`, `time_peer`), then timed in
    turns (`time`): first on the GPU, then as called. Timed one after another, a call timed right
    after an idle moment (the row's check) ran at higher clocks than the calls after it; in turns,
    in a balanced order (`timing.turn_order`), the row's ratios compare figures of the same seconds."""

    def __init__(self, case: Case):
        self.case = case
        self.entries: list = []  # (impl, tag, fn, scope factory, GPU-timed too)

    def add(self, impl: str, fn, scope=contextlib.nullcontext, tag: str = "", gpu: bool = True) -> None:
        self.entries.append((impl, tag, fn, scope, gpu))

    def time(self, row: dict, s: Session) -> None:
        """Time the calls and put their figures and each peer's ratios into ``row``: GPU time with
        throughput (and cudattn's % of ceiling), then as called; a peer that raised meanwhile gets
        its error instead (`error`, or `as_called_error` where it raised only as called)."""
        if not self.entries:
            return
        timed = [e for e in self.entries if e[4]]
        figures = s.gpu_times([(fn, scope) for _, _, fn, scope, _ in timed], [impl != "cudattn" for impl, *_ in timed])
        for (impl, *_), t in zip(timed, figures):
            if isinstance(t, str):  # a peer refused the case
                row["impls"][impl] = {"error": t}
                continue
            row["impls"][impl] = {**t.as_dict(), **throughput(self.case, t.median_ms)}
            if impl == "cudattn":
                row["impls"][impl]["pct_of_ceiling"] = _percent_of_ceiling(self.case, row["impls"][impl], s.ceilings)
        ours = row["impls"]["cudattn"]
        for name, res in row["impls"].items():  # peer ms / cudattn ms: >1 means cudattn is faster
            if name != "cudattn" and "median_ms" in res:
                row["ratio"][name] = res["median_ms"] / ours["median_ms"]
        called = [e for e in self.entries if "error" not in row["impls"][e[0]]]
        figures = s.as_called([(fn, scope) for _, _, fn, scope, _ in called], [t for _, t, *_ in called],
                              [impl != "cudattn" for impl, *_ in called])  # a peer may raise
        for (impl, *_), fig in zip(called, figures):
            row["impls"][impl].update(fig)
        self.entries.clear()
        for name, res in row["impls"].items():
            if name == "cudattn" or "as_called_ms" not in res:
                continue
            row["ratio_as_called"][name] = res["as_called_ms"] / ours["as_called_ms"]
            row["ratio_back_to_back"][name] = res["back_to_back_ms"] / ours["back_to_back_ms"]
            if "as_called_torch_ms" in ours:
                row["ratio_as_called_torch"][name] = res["as_called_ms"] / ours["as_called_torch_ms"]


def time_ours(case: Case, s: Session, call, sets: list, later: Turns) -> dict:
    """cudattn's calls of a row, for ``later`` to time: ``call(st, stream)`` (``stream`` defaults to the
    session's) over the rotated ``sets``, on the GPU and as called, and where torch runs also as called
    with torch views of the same sets on the peers' stream (what a torch user sees). Returns the row's
    cudattn entry, which ``later.time`` fills."""
    n = len(sets)
    later.add("cudattn", lambda i: call(sets[i % n]))
    if s.peers is not None and case.dtype != FP8:
        tours = [tuple(s.peers.torch.from_dlpack(a) for a in st) for st in sets]
        later.add("cudattn", lambda i: call(tours[i % n], s.peers.stream), s.peers.scope, tag="_torch", gpu=False)
    return {}


def time_peer(row: dict, name: str, case: Case, s: Session, make, scope, later: Turns) -> None:
    """Peer ``name``'s calls into ``later``: inside ``scope()`` (a context manager, entered once a turn:
    a torch user pays no context per call), ``fn = make()``, and ``fn(i)`` (call i, on the peers'
    stream) timed in turns with cudattn's. A backend that refuses the case (RuntimeError, from
    ``make`` or a call) leaves its error, shown as n/a."""
    try:
        with scope():
            fn = make()
    except RuntimeError as e:  # backend does not support this case
        row["impls"][name] = {"error": ascalled.refusal(e)}
        return
    row["impls"][name] = {}
    later.add(name, fn, scope)


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

    later = Turns(case)
    row["impls"]["cudattn"] = time_ours(case, s, call, ours_sets, later)
    row["sets"] = len(sets)

    if s.peers is not None:
        why = s.peers.skip_reason(case)
        tsets = None if why else [s.peers.tensors(x) for x in sets]
        for name in BACKENDS:
            if why:
                row["impls"][name] = {"error": why}
                continue
            make = functools.partial(_sdpa_calls, s.peers.bare(case), tsets)
            time_peer(row, name, case, s, make, functools.partial(s.peers.scope, name), later)
    later.time(row, s)  # (the timed calls are dropped: they held the peers' copies)
    if s.peers is not None:
        make = tsets = None
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
