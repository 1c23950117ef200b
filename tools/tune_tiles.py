"""Try tile configurations of a kernel family on one shape, against torch's flash or cuDNN backend.

    PYTHONPATH=. python tools/tune_tiles.py --shape 4x8x2048x256 --causal --tiles 128x64w8s2,64x32w4s2
    PYTHONPATH=. python tools/tune_tiles.py --family sm90 --peer cudnn --shape 4x16x4096x128 --tiles 128x128w12s2q2p,128x128w12s2q1p

Each `BMxBNwWARPSsSTAGES[mMINBLOCKS][qQ_STAGES][p]` (sm90: Q stages, p: ping-pong) is forced (by replacing the traits'
tiles for the shape's tile width in this process only), checked once against the peer's output,
and timed with CUDA events (median after warm-up, inputs rotated past 3x L2, a sleep kernel first
so host overhead stays out). Needs torch with CUDA, as the peer; not part of the asv suite.
"""

from __future__ import annotations

import argparse
import re
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import cudattn
from cudattn._calls import call as _callpath
from cudattn._kernels import registry as _kernels
from cudattn._kernels import plan as _plan
from cudattn._kernels import traits as _traits


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


def parse_tiles(spec: str) -> _traits.Tiles:
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(?:m(\d+))?(?:q(\d+))?(p?)", spec)
    if not m:
        raise SystemExit(f"bad tiles {spec!r}: want BMxBNwWARPSsSTAGES[mMIN][qQ_STAGES][p] (p: ping-pong)")
    bm, bn, w, s, mb, qs, pp = m.groups()
    return _traits.Tiles(int(bm), int(bn), int(w), int(s), int(mb) if mb else (2 if int(w) == 4 else 1), pp == "p",
                         int(qs) if qs else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiles", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--family", choices=_traits.FAMILIES, default="sm80")
    ap.add_argument("--peer", choices=("flash", "cudnn"), default="flash")
    args = ap.parse_args()
    B, H, S, D = map(int, args.shape.split("x"))
    dt = getattr(torch, args.dtype)
    sets = _sets(B, H, S, D, dt, torch.cuda.get_device_properties(0).L2_cache_size)
    stream = torch.cuda.current_stream()
    flops = 4.0 * B * H * S * S * D / (2 if args.causal else 1)

    backend = SDPBackend.FLASH_ATTENTION if args.peer == "flash" else SDPBackend.CUDNN_ATTENTION

    def flash(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    ref = flash(*sets[0]).float()
    t_flash = time_fn(flash, sets, args.iters)
    print(f"{args.shape} {args.dtype} causal={args.causal}: {args.peer} {flops / t_flash / 1e9:.1f} TFLOP/s")
    if args.family == "sm80":
        _traits.FORCED_FAMILY = "sm80"
        d = _traits.tile_dim_for(D)
    else:
        d = _traits.tile_dim_for(D, _traits.SM90_TILE_DIMS)
    for spec in args.tiles.split(","):
        if args.family == "sm80":
            _traits._CANDIDATES[(d, args.causal)] = (parse_tiles(spec),)
        else:  # every table the Hopper selection reads for such a call (short causal rows, one wave)
            t = parse_tiles(spec)
            _traits._SM90_TILES[(d, args.causal)] = t
            for key in [k for k in _traits._SM90_SMALL_GRID if k[:2] == (d, args.causal)]:
                _traits._SM90_SMALL_GRID[key] = t
            if args.causal and d in _traits._SM90_SHORT_CAUSAL:
                _traits._SM90_SHORT_CAUSAL[d] = (_traits._SM90_SHORT_CAUSAL[d][0], t)
            if args.causal and d in _traits._SM90_TWO_CTAS:
                _traits._SM90_TWO_CTAS[d] = _traits._SM90_TWO_CTAS[d]._replace(tiles=t)
            if d in _traits._SM90_SHORT_ROWS:
                _traits._SM90_SHORT_ROWS[d] = tuple(r._replace(tiles=t) for r in _traits._SM90_SHORT_ROWS[d])
        _plan._plans.clear(); _callpath._plans.clear()
        _kernels._loaded.clear()
        ours = lambda q, k, v: cudattn.attention(q, k, v, causal=args.causal, layout="bhsd", stream=stream)
        try:
            out = torch.from_dlpack(ours(*sets[0])).float()
            err = (out - ref).abs().max().item()
            t = time_fn(ours, sets, args.iters)
        except Exception as e:  # a config that does not fit or compile: say so and go on
            print(f"  {spec:14} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        variant = _traits.select(dt is torch.bfloat16 and "bfloat16" or "float16", D, args.causal, 232448,
                                 args.family)
        res = _kernels.compile_variant(variant, "sm_90a").ptxas[variant.kernel_name]
        print(f"  {spec:14} {flops / t / 1e9:7.1f} TFLOP/s  {t_flash / t:5.2f}x {args.peer}  max|diff| {err:.2e}  "
              f"regs {res.registers} spill {res.spill_stores}")


if __name__ == "__main__":
    main()
