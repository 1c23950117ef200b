"""`python -m cudattn bench`: argument parsing and the order of a run."""

from __future__ import annotations

import os
import shlex
import sys
import time

from . import grids
from .._runtime import device as _device
from .._tools.argtypes import at_least


def _shape(text: str) -> str:
    """An argparse type: a valid ``--shape`` (kept as text; grids.parse_shape reads it again)."""
    import argparse

    try:
        grids.parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _count(minimum: int):
    return at_least(minimum, f"an integer >= {minimum}")


def add_arguments(p) -> None:
    p.add_argument("--grid", choices=grids.GRIDS, default=None,
                   help="named grid: quick (3 shapes), prefill (the peer table's shapes and a curve of "
                        "S = 512..16384 for D = 64, 128, 256), decode (one query token, long KV caches), "
                        "all (prefill + decode), backward (attention_backward alone, deterministic, and a "
                        "training step, beside torch SDPA's backward; S = 4096..16384, D = 64, 128, and a GQA "
                        "shape), overhead (host microseconds per warm call by operand kind: "
                        "cudattn, torch, CuPy, JAX arrays, beside torch SDPA; no kernel rows), distributed (ring "
                        "attention on 1, 2 and 4 GPUs: weak and strong scaling); default quick unless --shape is "
                        "given")
    p.add_argument("--shape", action="append", type=_shape, default=[], metavar="B,H,S,D",
                   help="explicit case, B,H,S,D or B,Hq,Hkv,Sq,Sk,D (repeatable; replaces --grid, except "
                        "with --grid backward: the backward rows of these shapes)")
    p.add_argument("--dtype", action="append", choices=grids.ALL_DTYPES, default=None,
                   help="only these dtypes (repeatable); default: the grid's")
    p.add_argument("--causal", choices=("0", "1", "both"), default=None,
                   help="causal only (1), not (0), or both; default: the grid's")
    p.add_argument("--iters", type=_count(1), default=30,
                   help="timed calls per row (each way of timing), and as-called samples per overhead row")
    p.add_argument("--warmup", type=_count(0), default=5, help="untimed calls before timing")
    p.add_argument("--host", action="store_true",
                   help="also time the NumPy end-to-end call (transfers included) against the "
                        "bytes-moved floor of the pinned host<->device bandwidth, with pageable arrays and with "
                        "arrays from cudattn.empty_pinned")
    p.add_argument("--no-peers", action="store_true", help="do not time torch SDPA even if torch is importable")
    p.add_argument("--json", metavar="FILE", help="write every number and the environment manifest")
    p.add_argument("--device", type=_count(0), default=0, metavar="N",
                   help="time on GPU N (the bench runs again seeing that GPU alone)")
    p.add_argument("--transport", choices=("nccl", "copy", "auto"), default="nccl",
                   help="--grid distributed: how the ring passes K/V (ring_attention's transport)")
    p.add_argument("--sm-margin", type=_count(0), default=0, metavar="N",
                   help="--grid distributed: SMs the ring's attention calls leave free for NCCL's transfers "
                        "(the ranks get NCCL_MAX_CTAS=N unless it is set; 8 measured best on H200s)")
    p.add_argument("--plot", metavar="FILE.png", help="draw TFLOP/s against sequence length (needs matplotlib)")
    p.add_argument("--markdown", metavar="FILE.md",
                   help="write the tables as Markdown (docs/PERFORMANCE.md is made this way)")


def _cases(args) -> list:
    causals = None if args.causal in (None, "both") else (args.causal == "1",)
    if args.causal == "both":
        causals = (False, True)
    if args.shape:
        op = "backward" if args.grid == "backward" else "forward"
        return grids.explicit_cases(args.shape, args.dtype, causals, op)
    return grids.named_grid(args.grid or "quick", args.dtype, causals)


def _progress(i: int, n: int, label: str) -> None:
    sys.stderr.write(f"[{i + 1}/{n}] {label}\n")
    sys.stderr.flush()


def run(args, argv) -> int:
    if args.device:
        from .._tools import on_device

        status = on_device.rerun(args.device, list(argv), _device.gpu_count())
        if status is not None:
            return status
    if args.grid == "distributed":
        from . import distributed

        return distributed.run(args, argv)
    if args.shape and args.grid not in (None, "backward"):
        print("python -m cudattn bench: error: give either --grid or --shape, not both (but --grid backward "
              "with --shape: the backward of those shapes)", file=sys.stderr)
        return 2
    try:
        cases = _cases(args)
    except ValueError as e:
        print(f"python -m cudattn bench: error: {e}", file=sys.stderr)
        return 2
    if _device.gpu_count() == 0:
        print("cudattn bench: no CUDA GPU found; nothing was measured (the bench needs a GPU).", file=sys.stderr)
        return 2
    from . import backward, ceilings, hostmode, manifest, report, runner
    from .peers import TorchPeers, load_torch

    torch_mod = None if args.no_peers else load_torch()
    peers = TorchPeers(torch_mod) if torch_mod is not None else None
    s = runner.Session(peers=peers, iters=args.iters, warmup=args.warmup)
    env = manifest.environment(s.device_id, peers)
    print(f"{env['gpu']} ({env['sm_count']} SMs, {env['arch']}), driver CUDA {env['driver_cuda']}, NVRTC {env['nvrtc']}, "
          f"cudattn {env['cudattn']} ({(env['git_commit'] or 'commit unknown')[:12]}), warm calls on the "
          f"{'compiled' if env['compiled_warm_path'] else 'Python'} path")
    if peers is None:
        print("peers: none (torch not importable, or --no-peers)")
    else:
        print(f"peers: torch {env['peers']['torch']} SDPA cuDNN {env['peers']['cudnn']} and flash backends")
    if not cases:  # --grid overhead: no kernel rows, so no ceilings to measure them against
        s.ceilings = {}
    elif peers is not None:
        with torch_mod.cuda.stream(peers.stream):
            s.ceilings = ceilings.measure(s.stream_handle, s.device_id, torch_mod, host=args.host)
    else:
        s.ceilings = ceilings.measure(s.stream_handle, s.device_id, None, host=args.host)
    print("ceilings: " + report.ceilings_text(s.ceilings))

    t0 = time.perf_counter()
    rows = []
    if cases:
        print("\n" + report.header(peers is not None))
    for i, case in enumerate(cases):
        _progress(i, len(cases), f"{case.kind} {case.dtype} {case.label()} causal={case.causal}")
        for row in backward.run_case(case, s) if case.op != "forward" else [runner.run_case(case, s)]:
            rows.append(row)
            print(report.row_line(row, peers is not None), flush=True)
    overhead_rows, graph_step = [], None
    if args.grid == "overhead":
        from . import overhead

        print("\nHost time per warm call (us), the GPU held by a spin kernel; as called: events around one call\n"
              + report.overhead_header())
        overhead_rows = overhead.run(s.device_id, torch_mod, iters=args.iters,
                                     progress=lambda r: print(report.overhead_line(r), flush=True),
                                     status=lambda line: print(line, file=sys.stderr, flush=True))
        from . import graphstep

        graph_step = graphstep.run(s.device_id)
        print("\n" + graphstep.line(graph_step), flush=True)
    host_rows = []
    host_cases = [c for c in cases if c.op == "forward"]  # the NumPy path of `attention`
    if args.host and host_cases:
        print("\nNumPy end to end (attention(numpy...), transfers included)\n" + report.host_header())
        for i, case in enumerate(host_cases):
            for memory in hostmode.MEMORY:
                _progress(i, len(host_cases), f"host {case.dtype} {case.label()} causal={case.causal} {memory}")
                r = hostmode.run_host_case(case, s, memory=memory)
                host_rows.append(r)
                print(report.host_line(r), flush=True)
    command = "python -m cudattn " + shlex.join(argv)
    rep = {"command": command, "environment": env, "ceilings": s.ceilings, "iters": args.iters,
           "warmup": args.warmup, "rows": rows, "host_rows": host_rows, "overhead_rows": overhead_rows,
           "graph_step": graph_step, "seconds": time.perf_counter() - t0}
    print("\n" + report.summary(rep))
    if args.json:
        report.write_json(args.json, rep)
        print(f"wrote {args.json}")
    plot_name = None
    if args.plot:
        from . import plot

        plot.plot(rep, args.plot)
        print(f"wrote {args.plot}")
        if args.markdown:
            plot_name = os.path.relpath(args.plot, os.path.dirname(os.path.abspath(args.markdown)))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(report.markdown(rep, command, plot_name))
        print(f"wrote {args.markdown}")
    failed = sum(not r["check"]["ok"] for r in rows + host_rows)
    return 1 if failed else 0
