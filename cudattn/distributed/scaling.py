"""Timing the ring on several GPUs: each rank's part (:func:`time_rank`, run by
:func:`cudattn.distributed.launch.run`) and the runs behind ``demo --gpus N`` and ``bench --grid
distributed`` (:func:`measure`).

Inputs are random, made chunk by chunk from ``(seed, tensor, chunk)``, so every rank makes only
its own chunks and the parent can rebuild the whole sequence to check rows of the result.
"""

from __future__ import annotations

import statistics

import ml_dtypes
import numpy as np

from .. import reference
from .._arrays.host_io import to_device, to_host
from .._ops.attention import attention
from .._runtime import launch as _launch
from .._runtime.device import restores_caller_context
from .._runtime.spin import spin
from .._runtime.stream import as_stream
from . import launch
from .ring import _ring
from .schedule import chunks_of
from .sharding import gather_sequence

TENSORS = ("q", "k", "v")


def _dtype(name: str):
    return {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}[name]


def chunk_data(seed: int, which: int, chunk: int, shape: tuple, dtype_name: str) -> np.ndarray:
    """Chunk ``chunk`` of tensor ``which`` (0 q, 1 k, 2 v): ``shape`` ``(B, c, H, D)``, standard normal."""
    rng = np.random.default_rng([seed, which, chunk])
    return rng.standard_normal(shape, dtype=np.float32).astype(_dtype(dtype_name))


def whole(seed: int, which: int, n: int, shape: tuple, dtype_name: str, batch: slice = slice(None)) -> np.ndarray:
    """The whole sequence of a tensor (its ``n`` chunks in order), batch entries ``batch``."""
    return np.concatenate([chunk_data(seed, which, i, shape, dtype_name)[batch] for i in range(n)], axis=1)


def time_rank(comm, case: dict, iters: int, want_output: bool) -> dict:
    """This rank's ring on its shard of ``case`` (``B, H, Hkv, S, D, dtype, causal, seed``, and
    optionally ``sm_margin`` and ``transport``): the median GPU ms of the ring and of the same steps without NCCL
    (``exchange=False``), and its output shard. On one rank, also single-GPU `attention` on the
    whole sequence (``attention_ms``): the baseline a user without a ring would have."""
    world, rank, dev = int(comm.nranks), int(comm.rank), int(comm.device.device_id)
    zig = bool(case["causal"])
    n = world * (2 if zig else 1)
    c = case["S"] // n
    heads = (case["H"], case["Hkv"], case["Hkv"])
    shards = [np.concatenate([chunk_data(case["seed"], w, i, (case["B"], c, heads[w], case["D"]), case["dtype"])
                              for i in chunks_of(rank, world, zig)], axis=1) for w in range(3)]
    q, k, v = (to_device(x, device=dev) for x in shards)
    kw = {"causal": zig, "scale": None, "layout": "bshd", "zigzag": zig, "softcap": None, "sinks": None,
          "window_size": None, "alibi_slopes": None, "return_lse": False, "stream": None,
          "sm_margin": int(case.get("sm_margin", 0)), "transport": case.get("transport", "nccl")}
    out = _ring(q, k, v, comm, exchange=True, **kw)  # warm: kernels compiled or loaded
    _ring(q, k, v, comm, exchange=False, **kw)
    row = {"rank": rank,
           "ms": statistics.median(gpu_times(lambda: _ring(q, k, v, comm, exchange=True, **kw), dev, iters)),
           "compute_ms": statistics.median(gpu_times(lambda: _ring(q, k, v, comm, exchange=False, **kw), dev, iters)),
           "out": to_host(out) if want_output else None}
    if world == 1:  # the shard is the whole sequence, in order (one rank's zigzag chunks are 0 and 1)
        one = lambda: attention(q, k, v, causal=bool(case["causal"]))
        one()
        row["attention_ms"] = statistics.median(gpu_times(one, dev, iters))
    return row


@restores_caller_context
def gpu_times(fn, device: int, iters: int, host_ms_per_call: float = 2.0) -> list[float]:
    """GPU ms of each of ``iters`` calls of ``fn`` (work on cudattn's stream of ``device``), queued
    behind a spin kernel so that the host's time to queue them is not counted."""
    h = as_stream(None, device).handle
    _launch.synchronize(h)
    events = [(_launch.Event(h), _launch.Event(h)) for _ in range(iters)]
    spin(h, min(500.0, 5.0 + iters * host_ms_per_call), device)
    for start, end in events:
        start.record(h)
        fn()
        end.record(h)
    _launch.synchronize(h)
    return [_launch.elapsed_ms(s, e) for s, e in events]


def flops(case: dict) -> float:
    return 4.0 * case["B"] * case["H"] * case["S"] ** 2 * case["D"] / (2 if case["causal"] else 1)


def measure(case: dict, world: int, iters: int, *, want_output: bool = False, timeout: float = 900.0) -> dict:
    """The ring of ``case`` on ``world`` GPUs (one process each): the slowest rank's median ms, per-GPU
    TFLOP/s, the communication left exposed per ring step, and (``want_output``) the whole output."""
    margin = int(case.get("sm_margin", 0))
    # NCCL's kernel to fit in the SMs the margin leaves (NCCL reads it when a communicator is made)
    env = {"NCCL_MAX_CTAS": str(margin)} if margin else {}
    ranks = launch.run(time_rank, world, case, iters, want_output, timeout=timeout, env=env)
    ms = max(r["ms"] for r in ranks)
    compute = max(r["compute_ms"] for r in ranks)
    row = {"world": world, **{k: v for k, v in case.items() if k != "seed"}, "ms": ms, "compute_ms": compute,
           "tflops_per_gpu": flops(case) / world / ms / 1e9,
           **({"attention_ms": ranks[0]["attention_ms"]} if world == 1 else {}),
           "exposed_ms_per_step": max(0.0, ms - compute) / (world - 1) if world > 1 else 0.0}
    if want_output:
        row["out"] = gather_sequence([r["out"] for r in ranks], zigzag=bool(case["causal"]))
    return row


def check_rows(case: dict, world: int, out: np.ndarray, count: int = 48):
    """``out`` (the whole output) against the float64 reference on ``count`` query rows of batch entry 0,
    the first and last among them: ``(ok, err, bound)`` under the 16-bit rule."""
    n = world * (2 if case["causal"] else 1)
    c = case["S"] // n
    heads = (case["H"], case["Hkv"], case["Hkv"])
    q, k, v = (whole(case["seed"], w, n, (case["B"], c, heads[w], case["D"]), case["dtype"], slice(0, 1))
               for w in range(3))
    rows = np.unique(np.linspace(0, case["S"] - 1, count).astype(np.int64))
    ref = reference.attention(q, k, v, causal=case["causal"], rows=rows)
    naive = reference.attention_naive(q, k, v, causal=case["causal"], rows=rows, dtype=_dtype(case["dtype"]))
    return reference.check_close(out[:1, rows].astype(np.float64), ref, naive)
