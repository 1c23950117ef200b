"""A decode step of LAYERS layers captured once in a CUDA graph and replayed.

Each layer is one ``attention_with_kvcache`` call with ``out=`` (its own q, caches and output,
shared ``cache_seqlens``) on one cuda.core stream. Three timings of the whole step, per layer:

- ``gpu_us``: the eager calls queued behind a spin kernel (`timing.gpu_time`), so only the
  kernels' GPU time counts: the floor;
- ``eager_us``: the eager calls as called, back to back (host time shows where it exceeds the GPU's);
- ``graph_us``: the captured graph launched (events around one launch, the stream idle at the start).

``graph_ratio`` = graph_us / gpu_us (1.0: a replay costs exactly the kernels). The replayed outputs
are compared with the eager ones bit for bit (``bitwise``).
"""

from __future__ import annotations

import numpy as np

from .. import attention_with_kvcache
from .._arrays import array as _array
from .._runtime import launch as _launch
from .._arrays import host_io as _host_io
from . import ascalled, timing

LAYERS = 32
B, HQ, HKV, D, CAPACITY = 8, 32, 8, 128, 4096  # ~64 MiB per cache: 4 GiB for the step's caches


def run(device_id: int, *, iters: int = 20) -> dict:
    from cuda.core import Device

    dev = Device(device_id)
    dev.set_current()
    s = dev.create_stream()  # passed as the object: arrays allocated on it keep it alive until freed
    h = int(s.handle)
    rng = np.random.default_rng(7)

    def up(shape, dtype=np.float16):
        x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        return _host_io.to_device(x, device=device_id, stream=s)

    qs = [up((B, 1, HQ, D)) for _ in range(LAYERS)]
    kcs = [up((B, CAPACITY, HKV, D)) for _ in range(LAYERS)]
    vcs = [up((B, CAPACITY, HKV, D)) for _ in range(LAYERS)]
    outs = [_array.empty((B, 1, HQ, D), np.float16, device=device_id, stream=s) for _ in range(LAYERS)]
    seqlens = _host_io.to_device(rng.integers(CAPACITY // 2, CAPACITY + 1, size=B, dtype=np.int32),
                               device=device_id, stream=s)

    def step(i=0):
        for q, kc, vc, o in zip(qs, kcs, vcs, outs):
            attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, out=o, stream=s)

    step()
    _launch.synchronize(h)
    eager = [_host_io.to_host(o, stream=h) for o in outs]
    gpu = timing.gpu_time(step, h, device_id, iters=iters, warmup=2, host_us_per_call=LAYERS * 200.0)
    b2b = ascalled.back_to_back(step, h, batch=10, repeats=3, warmup=1)

    gb = s.create_graph_builder()
    gb.begin_building("global")
    try:
        step()
    finally:
        gb.end_building()
    graph = gb.complete()
    for o in outs:
        o.memset(0xFFFF, stream=h)  # NaN: the replay must write every output
    graph.launch(s)
    _launch.synchronize(h)
    bitwise = all(np.array_equal(_host_io.to_host(o, stream=h).view(np.uint16), e.view(np.uint16))
                  for o, e in zip(outs, eager))
    replay = ascalled.single(lambda i: graph.launch(s), h, iters=iters, warmup=3)
    per = 1e3 / LAYERS
    return {"layers": LAYERS, "shape": {"B": B, "Hq": HQ, "Hkv": HKV, "D": D, "capacity": CAPACITY},
            "gpu_us": gpu.median_ms * per, "eager_us": b2b * per, "graph_us": replay.median_ms * per,
            "graph_ratio": replay.median_ms / gpu.median_ms, "eager_ratio": b2b / gpu.median_ms,
            "bitwise": bitwise}


def line(r: dict) -> str:
    return (f"{r['layers']}-layer decode step (B={r['shape']['B']}, Hq/Hkv={r['shape']['Hq']}/{r['shape']['Hkv']}, "
            f"D={r['shape']['D']}, capacity {r['shape']['capacity']}), us per layer: kernels alone "
            f"{r['gpu_us']:.1f}, eager back to back {r['eager_us']:.1f} ({r['eager_ratio']:.2f}x), graph replay "
            f"{r['graph_us']:.1f} ({r['graph_ratio']:.2f}x); replay equals eager bit for bit: {r['bitwise']}")
