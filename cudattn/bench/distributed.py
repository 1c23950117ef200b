"""``bench --grid distributed``: the ring on 1, 2 and 4 GPUs of this machine (as many as it has).

Weak scaling: 32 Ki tokens a GPU, the whole sequence growing with the GPUs; per-GPU TFLOP/s
against single-GPU `attention` on 32 Ki (the one-GPU rows time `attention`, not a ring of one).
Strong scaling: one sequence of 128 Ki tokens; the speedup over `attention` on one GPU. bfloat16,
16 heads, head dim 128, causal (zigzag shards), B = 1. Each rank is its own process; times are the
slowest rank's median GPU time (CUDA events on its stream, the calls queued behind a spin kernel
so that the host's queueing is not counted), and the communication left exposed per ring step is
the ring's time less the same steps without NCCL, over the steps that pass K/V on. The first
rows' outputs are checked against the float64 reference on 48 query rows.
"""

from __future__ import annotations

import json
import shlex

from .._runtime import device as _device
from ..distributed import scaling

WORLDS = (1, 2, 4)
WEAK_TOKENS = 32768
STRONG_TOKENS = 131072


def cases(gpus: int, sm_margin: int = 0, transport: str = "nccl") -> list[tuple[str, int, dict]]:
    """(kind, world, case) of the grid on a machine with ``gpus`` GPUs; the ring's calls leave
    ``sm_margin`` SMs free and pass K/V by ``transport`` (`ring_attention`'s arguments)."""
    out = []
    for kind in ("weak", "strong"):
        for w in (w for w in WORLDS if w <= gpus):
            S = WEAK_TOKENS * w if kind == "weak" else STRONG_TOKENS
            out.append((kind, w, {"B": 1, "H": 16, "Hkv": 16, "S": S, "D": 128, "dtype": "bfloat16", "causal": True,
                                  "seed": 1, "sm_margin": sm_margin, "transport": transport}))
    return out


def run(args, argv) -> int:
    gpus = _device.gpu_count()
    if gpus < 2:
        print(f"cudattn bench --grid distributed: needs 2 or more GPUs; this machine has {gpus}", flush=True)
        return 2
    rows, base = [], {}
    if args.sm_margin:
        print(f"the ring's attention calls leave {args.sm_margin} SMs free for NCCL", flush=True)
    if args.transport != "nccl":
        print(f"K/V pass by transport {args.transport!r}", flush=True)
    print("kind   | GPUs | tokens | ms | TFLOP/s a GPU | vs 1 GPU | exposed comm ms a step | check")
    ok_all = True
    for kind, world, case in cases(gpus, args.sm_margin, args.transport):
        check = world == 2 and kind == "weak"
        row = scaling.measure(case, world, args.iters, want_output=check)
        row["kind"] = kind
        if world == 1:  # the baseline is `attention` on the whole sequence, not a ring of one
            row["ring_ms"], row["ms"] = row["ms"], row["attention_ms"]
            row["tflops_per_gpu"] = scaling.flops(case) / row["ms"] / 1e9
        if check:
            ok, err, bound = scaling.check_rows(case, world, row.pop("out"))
            row["check"] = {"ok": bool(ok), "max_err": float(err), "bound": float(bound)}
            ok_all &= bool(ok)
        if world == 1:
            base[kind] = row
        b = base.get(kind)
        if b is not None:
            row["vs_one_gpu"] = (row["tflops_per_gpu"] / b["tflops_per_gpu"] if kind == "weak"
                                 else b["ms"] / row["ms"])
        rows.append(row)
        chk = row.get("check")
        print(f"{kind:6} | {world} | {case['S']} | {row['ms']:.3f} | {row['tflops_per_gpu']:.1f} | "
              f"{row.get('vs_one_gpu', float('nan')):.2f}x | {row['exposed_ms_per_step']:.3f} | "
              f"{'-' if chk is None else ('ok' if chk['ok'] else 'FAIL')}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"command": "python -m cudattn " + shlex.join(argv), "rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")
    return 0 if ok_all else 1
