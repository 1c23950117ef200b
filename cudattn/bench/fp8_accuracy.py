"""FP8 accuracy table: relative RMSE and max error of cudattn's FP8 attention against the float64
reference on the dequantised inputs, next to the NumPy emulation of the same FP8 arithmetic and
to cudattn's fp16 / bf16 paths on the same dequantised values.

    python -m cudattn.bench.fp8_accuracy --json docs/fp8_accuracy.json --markdown fp8_accuracy.md  # the table in docs/FP8.md
    python -m cudattn.bench.fp8_accuracy --cpu-only --quick        # no GPU: emulation rows only

Inputs: float32 N(0,1), or "outliers" (N(0,1) with 0.1% of entries set to ±(20..100)),
quantised to e4m3 per tensor or per head (descale = amax / 448; cudattn.quantize_fp8, or
reference.quantize_fp8 under --cpu-only). Every error is measured against
reference.attention in float64 on ``x_fp8 · descale``, so the rows compare arithmetic only; the
quantisation of the inputs themselves is not counted (it is the same for every row).

Rows (errors of the output, and NaN/inf counts):
- ``cudattn fp8 -> bf16`` / ``-> f32``: cudattn.attention on the e4m3 inputs with their descales;
- ``emulated fp8 -> bf16`` / ``-> f32``: reference.attention_fp8_emulated (key tiles of 128);
- ``naive fp8 -> bf16``: reference.attention_naive with FP8 (probabilities normalised *then*
  rounded to e4m3), the baseline FlashAttention's
  rule (2x the naive error) would use, shown to say why it is not used;
- ``cudattn fp16`` / ``cudattn bf16``: cudattn.attention on the dequantised values cast to
  float16 / bfloat16 (that cast is part of their error); ``naive fp16`` the same in NumPy
  (reference.attention_naive), which --cpu-only also shows.
With --portable-too (Hopper), the FP8 rows of the portable sm80 kernel family are added.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from cudattn import reference

BF16 = np.dtype(ml_dtypes.bfloat16)


def make_source(rng, shape, dist: str) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    if dist == "outliers":
        hit = rng.random(shape) < 1e-3
        x[hit] = rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(20, 100, hit.sum())
    elif dist != "normal":
        raise ValueError(dist)
    return x


def configs(D_list, quick: bool):
    """(dist, per, D, causal): every distribution x quantisation x head dim, non-causal, plus one
    causal row."""
    out = [(dist, per, D, False) for D in D_list for dist in ("normal", "outliers") for per in ("tensor", "head")]
    out.append(("normal", "head", D_list[0], True))
    return out[:3] + out[-1:] if quick else out


def measure(cfg, shape, rng, gpu: bool, portable_too: bool = False):
    dist, per, D, causal = cfg
    B, S, H = shape
    xs = [make_source(rng, (B, S, H, D), dist) for _ in range(3)]
    if gpu:
        import cudattn

        quant = [cudattn.quantize_fp8(x, per=per) for x in xs]
    else:
        quant = [reference.quantize_fp8(x, per=per) for x in xs]
    (q, qd), (k, kd), (v, vd) = quant
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    t = time.perf_counter()
    ref = reference.attention(q, k, v, causal=causal, **kw)
    t_ref = time.perf_counter() - t
    rows = []

    def add(method, out):
        st = reference.error_stats(out, ref)
        rows.append(dict(method=method, **st))

    if gpu:
        import cudattn

        from cudattn._kernels import traits as _traits

        families = [("", None)] + ([(" [sm80]", "sm80")] if portable_too else [])
        forced = _traits.FORCED_FAMILY
        try:
            for tag, family in families:
                _traits.FORCED_FAMILY = family or forced
                add(f"cudattn fp8{tag} -> bf16", cudattn.attention(q, k, v, causal=causal, **kw))
                add(f"cudattn fp8{tag} -> f32", cudattn.attention(q, k, v, causal=causal, out_dtype=np.float32,
                                                                  **kw))
        finally:
            _traits.FORCED_FAMILY = forced
    add("emulated fp8 -> bf16", reference.attention_fp8_emulated(q, k, v, causal=causal, **kw))
    add("emulated fp8 -> f32", reference.attention_fp8_emulated(q, k, v, causal=causal, out_dtype=np.float32, **kw))
    add("naive fp8 -> bf16", reference.attention_naive(q, k, v, causal=causal, **kw))
    for name, dt in (("fp16", np.float16), ("bf16", BF16)):
        deq = [reference.dequantize(x, d, out_dtype=dt) for x, d in ((q, qd), (k, kd), (v, vd))]
        if gpu:
            add(f"cudattn {name}", cudattn.attention(*deq, causal=causal))
        if name == "fp16":
            add("naive fp16 (NumPy)", reference.attention_naive(*deq, causal=causal))
    ref_rms = float(np.sqrt(np.mean(ref * ref)))
    return dict(dist=dist, per=per, head_dim=D, causal=causal, batch=B, seqlen=S, heads=H, ref_rms=ref_rms,
                ref_max=float(np.abs(ref).max()), reference_seconds=round(t_ref, 2), rows=rows)


def _fmt(x) -> str:
    if isinstance(x, int):
        return str(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.2e}"


def markdown(result: dict) -> str:
    lines = [
        "# FP8 accuracy",
        "",
        f"Device: {result['device']}. Shape: B={result['batch']}, S={result['seqlen']} (queries = keys), "
        f"H={result['heads']} (MHA); inputs quantised with `{result['quantiser']}`.",
        "Errors of the output against the float64 reference on the dequantised inputs "
        "(`x_fp8 · descale`); rel RMSE = rms(out − ref) / rms(ref), max rel = max|out − ref| / max|ref|.",
        "",
        "| inputs | quant | D | causal | method | rel RMSE | max abs | max rel | NaN/inf |",
        "|---|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for c in result["configs"]:
        for i, r in enumerate(c["rows"]):
            head = (f"| {c['dist']} (rms {c['ref_rms']:.2g}, max {c['ref_max']:.2g}) | {c['per']} | {c['head_dim']} | "
                    f"{'yes' if c['causal'] else 'no'} ") if i == 0 else "| | | | "
            lines.append(head + f"| {r['method']} | {_fmt(r['rel_rmse'])} | {_fmt(r['max_abs'])} | "
                         f"{_fmt(r['max_rel'])} | {r['nonfinite']} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the table as Markdown here")
    ap.add_argument("--cpu-only", "--dry-run", dest="cpu_only", action="store_true",
                    help="no GPU: only the NumPy rows (emulation, naive) against the reference")
    ap.add_argument("--quick", action="store_true", help="a small shape and 4 configurations (a smoke test)")
    ap.add_argument("--portable-too", action="store_true", help="Hopper: also the FP8 rows of the sm80 family")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dims", default="128,256")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shape = (1, 256, 2) if args.quick else (args.batch, args.seqlen, args.heads)
    D_list = [int(d) for d in args.head_dims.split(",")]
    gpu = not args.cpu_only
    if gpu:
        from cudattn._runtime import device as _device

        props = _device.device_properties(0)
        device = f"{props.name} ({props.arch})"
    else:
        device = f"CPU only ({platform.machine()}): no cudattn rows"
    rng = np.random.default_rng(args.seed)
    result = dict(device=device, batch=shape[0], seqlen=shape[1], heads=shape[2], seed=args.seed,
                  quantiser="cudattn.quantize_fp8" if gpu else "reference.quantize_fp8", configs=[])
    for cfg in configs(D_list, args.quick):
        c = measure(cfg, shape, rng, gpu, args.portable_too)
        result["configs"].append(c)
        best = ", ".join(f"{r['method']}: {r['rel_rmse']:.2e}" for r in c["rows"])
        print(f"{cfg[0]:8s} {cfg[1]:6s} D={cfg[2]:3d} causal={cfg[3]!s:5s}  rel RMSE  {best}", flush=True)
    md = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(md)
    if not args.json and not args.markdown:
        print(md)
    nonfinite = sum(r["nonfinite"] for c in result["configs"] for r in c["rows"])
    return 1 if nonfinite else 0


if __name__ == "__main__":
    sys.exit(main())
