"""cudattn vs torch SDPA (cuDNN and flash backends), same GPU, same run.

CUDA events around each call, median after warm-up; inputs rotated among enough sets to exceed
the L2 cache; a long sleep kernel first so the host queues every timed launch ahead of the GPU
(launch overhead stays out of the kernel numbers; it is measured separately at the end).
FLOPs = 4·B·H·S²·D, halved for causal (the convention of ../shared/peers).

Usage: python benchmarks/bench_vs_torch.py [--json out.json] [--iters 30]
Needs torch with CUDA (the peer); cudattn itself never imports torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import cudattn

SHAPES = [(16, 16, 512, 64), (4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 8192, 128), (4, 8, 2048, 256)]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _sets(B, H, S, D, dtype, l2_bytes):
    one = 4 * B * H * S * D * 2  # q, k, v, out
    n = max(2, min(8, -(-3 * l2_bytes // one)))
    return [[torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3)] for _ in range(n)]


def time_fn(fn, sets, iters):
    """Median ms per call over `iters` calls cycling through input sets."""
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU time: the host enqueues everything meanwhile
    for i in range(iters):
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default="")
    args = ap.parse_args(argv)
    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size / 2**20:.0f} MiB; "
          f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    stream = torch.cuda.current_stream()
    rows = []
    for dname, dt in DTYPES.items():
        for (B, H, S, D) in shapes:
            for causal in (False, True):
                sets = _sets(B, H, S, D, dt, props.L2_cache_size)
                # cudattn reads torch's (B, H, S, D) tensors zero-copy with layout="bhsd".
                ours = lambda q, k, v: cudattn.attention(q, k, v, causal=causal, layout="bhsd", stream=stream)
                res = {"dtype": dname, "B": B, "H": H, "S": S, "D": D, "causal": causal}
                res["cudattn_ms"] = time_fn(ours, sets, args.iters)
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    def peer(q, k, v, backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    try:
                        res[f"{name}_ms"] = time_fn(peer, sets, args.iters)
                    except RuntimeError as e:
                        res[f"{name}_ms"] = None
                        print(f"  {name} unavailable: {str(e).splitlines()[0]}", file=sys.stderr)
                flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
                for key in ("cudattn", "cudnn", "flash"):
                    ms = res[f"{key}_ms"]
                    res[f"{key}_tflops"] = None if ms is None else flops / ms / 1e9
                rows.append(res)
                del sets
    print(f"\n{'dtype':9} {'B':>3} {'H':>3} {'S':>5} {'D':>4} {'causal':>6} | {'cudattn':>8} {'cuDNN':>8} {'flash':>8}"
          f" | {'vs cuDNN':>8} {'vs flash':>8}   (TFLOP/s)")
    for r in rows:
        f = lambda x: "   -    " if x is None else f"{x:8.1f}"
        ratio = lambda k: "   -    " if r[f"{k}_tflops"] is None else f"{r['cudattn_tflops'] / r[f'{k}_tflops']:7.2f}x"
        print(f"{r['dtype']:9} {r['B']:>3} {r['H']:>3} {r['S']:>5} {r['D']:>4} {str(r['causal']):>6} | "
              f"{f(r['cudattn_tflops'])} {f(r['cudnn_tflops'])} {f(r['flash_tflops'])} | {ratio('cudnn')} {ratio('flash')}")
    overhead = host_overhead(stream)
    print(f"\nhost overhead of one warm attention() call on device arrays (call -> launch returned), median: "
          f"{overhead['cudattn_devicearray_us']:.1f} us (cudattn DeviceArray), "
          f"{overhead['cudattn_devicearray_out_us']:.1f} us (DeviceArray with out=), "
          f"{overhead['torch_tensor_us']:.1f} us (torch tensors via DLPack); torch SDPA call: {overhead['torch_sdpa_us']:.1f} us")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": props.name, "rows": rows, "host_overhead": overhead}, fh, indent=1)


def host_overhead(stream, n=2000):
    """Wall time from call to return of a small warm call (the GPU keeps up, so launches don't block)."""
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
    qd = cudattn.to_device(q.cpu().numpy())
    out = {}
    od = cudattn.attention(qd, qd, qd, stream=stream)
    for key, fn in (("cudattn_devicearray_us", lambda: cudattn.attention(qd, qd, qd, stream=stream)),
                    ("cudattn_devicearray_out_us", lambda: cudattn.attention(qd, qd, qd, out=od, stream=stream)),
                    ("torch_tensor_us", lambda: cudattn.attention(q, q, q, layout="bhsd", stream=stream)),
                    ("torch_sdpa_us", lambda: F.scaled_dot_product_attention(q, q, q))):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        ts = []
        for i in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
            if i % 200 == 199:
                torch.cuda.synchronize()
        out[key] = statistics.median(ts) * 1e6
    return out


if __name__ == "__main__":
    main()
