"""`python -m cudattn`: info, demo, bench, selfcheck, and the kernel cache (info | clear | warm --arch ARCH).

A misused command (an unknown option, a bad value) prints one line on stderr and exits with
status 2, never a traceback; every option's help shows its default.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import numpy as np

from .._runtime import device as _device
from .argtypes import at_least

EXIT_USAGE = 2
DEFAULT_ARCH = "sm_90a"  # cache warm's and export's target when --arch is not given


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, except where there is none to show (None, False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class _RawDescriptionDefaults(argparse.RawDescriptionHelpFormatter, _Defaults):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (``prog: error: ...``) and exit status 2, and an
    unknown option named by the (sub)command that met it, before any missing argument."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Defaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        # argparse reports a missing required argument before an unknown one, and a subcommand's
        # unknown ones as the top level's: a first pass with nothing required finds them here.
        args = sys.argv[1:] if args is None else list(args)
        required = [a for a in self._actions if a.required]
        for a in required:
            a.required = False
        try:
            _, extras = super().parse_known_args(args, argparse.Namespace(**vars(namespace or argparse.Namespace())))
        finally:
            for a in required:
                a.required = True
        if extras:
            first = extras[0]
            self.error(f"unrecognized option {first.split('=')[0]}" if first.startswith("-")
                       else f"unexpected argument {first!r}")
        return super().parse_known_args(args, namespace)


def _arch(text: str) -> str:
    from cudattn._kernels.registry import ARCHS

    if text not in ARCHS:
        raise argparse.ArgumentTypeError(f"unknown compile target {text!r}; choose one of {', '.join(ARCHS)}")
    return text


_positive_int = at_least(1, "a positive integer")
_nonneg_int = at_least(0, "an integer >= 0")


def _why_no_gpu() -> str:
    """What the driver said when cudattn looked for a GPU (the NoDeviceError's reason)."""
    from cudattn._runtime.errors import CudaError

    try:
        n = _device.device_count()
    except CudaError as e:
        return e.description or str(e)
    return "the CUDA driver sees no GPU" if n == 0 else f"{n} GPU(s) seen, but the driver did not answer"


def cmd_info(args) -> int:
    import nvrtc_cache

    import cudattn

    print(f"cudattn {cudattn.__version__}")
    print(f"NVRTC {'.'.join(map(str, nvrtc_cache.nvrtc_version()))}")
    from .._calls import warm

    print("warm calls: " + ("compiled path (cudattn._calls._warm)" if warm.available() else
                            "Python path (" + ("CUDATTN_NATIVE=0" if warm._native is not None else
                                               "built without a C compiler") + ")"))
    cache = nvrtc_cache.default_cache()
    info = cache.info()
    print(f"cache: {info['directory']} ({info['entries']} entries, {info['total_bytes'] / 2**20:.1f} MiB)")
    n = _device.gpu_count()
    if n == 0:
        print(f"GPU: none usable: {_why_no_gpu()}")
        print("kernels can still be compiled for any GPU: python -m cudattn cache warm --arch sm_90a")
        return 0
    from cuda.bindings import driver

    err, ver = driver.cuDriverGetVersion()
    print(f"driver: CUDA {ver // 1000}.{ver % 1000 // 10}")
    for i in range(n):
        p = _device.device_properties(i)
        print(f"GPU {i}: {p.name}, compute capability {p.compute_capability[0]}.{p.compute_capability[1]} "
              f"(target {p.arch}), {p.sm_count} SMs, L2 {p.l2_cache_size / 2**20:.0f} MiB, "
              f"{p.max_shared_memory_per_block_optin // 1024} KiB shared memory per block")
    return 0


def cmd_cache(args) -> int:
    import nvrtc_cache

    cache = nvrtc_cache.default_cache()
    if args.action == "info":
        info = cache.info(args.arch)
        which = f" for {args.arch}" if args.arch else ""
        why = f" ({info['why_not_writable']})" if info["why_not_writable"] else ""
        print(f"directory: {info['directory']}\nentries{which}: {info['entries']}\nsize{which}: "
              f"{info['total_bytes'] / 2**20:.2f} MiB\nwritable: {info['writable']}{why}")
    elif args.action == "clear":
        which = f"{args.arch} " if args.arch else ""
        print(f"removed {cache.clear(args.arch)} {which}entries from {cache.directory}")
    else:
        return 0 if warm(args.arch or DEFAULT_ARCH, args.jobs, cache) else 1
    return 0


def cmd_export(args) -> int:
    from cudattn._tools import cbuild as _cbuild
    from cudattn._tools import export as _export

    if args.print_cflags:
        try:
            flags = " ".join(shlex.quote(f) for f in _cbuild.c_flags(args.out))
        except _export.ExportError as e:
            print(f"{args.parser.prog}: {e}", file=sys.stderr)
            return 1
        src = shlex.quote(os.path.join(args.out or "DIR", "examples", "attention.c"))
        print(flags)
        if sys.stdout.isatty():  # a person reading, not $(...) capturing: show the whole line too
            print(f"compile and link the example: cc -std=c11 -O2 {flags}{'' if args.out else ' -I DIR/include'} "
                  f"{src} -ldl -lm -o attention", file=sys.stderr)
        return 0
    if args.out is None:
        args.parser.error("the following arguments are required: --out")
    archs = args.arch or [DEFAULT_ARCH]
    try:
        _export.check_out(args.out, archs)  # before minutes of compiling
        manifest = _export.export(args.out, archs, jobs=args.jobs)
    except _export.OutDirError as e:
        args.parser.error(f"--out {e}")
    except (_export.ExportError, OSError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    for arch, entry in manifest["archs"].items():
        size = sum(os.path.getsize(os.path.join(args.out, arch, k["file"])) for k in entry["kernels"])
        print(f"{arch}: {len(entry['kernels'])} cubins ({size / 2**20:.1f} MiB) in {os.path.join(args.out, arch)}"
              f"{'' if arch in archs else ' (kept from an earlier export)'}")
    print(f"manifest: {os.path.join(args.out, 'manifest.json')} (cudattn {manifest['cudattn']}, format "
          f"{manifest['format']}); parameter structs: {os.path.join(args.out, 'include', 'cudattn_params.h')}")
    print(f"build the example: cc -std=c11 -O2 $({args.parser.prog} --print-cflags --out {shlex.quote(args.out)}) "
          f"{shlex.quote(os.path.join(args.out, 'examples', 'attention.c'))} -ldl -lm -o attention")
    return 0


def warm(arch: str, jobs: int | None = None, cache=None) -> bool:
    """Compile every kernel for ``arch`` into the cache in parallel, with progress; True if all built."""
    from cudattn._tools import warm as _warm

    jobs = jobs or _warm.default_jobs()
    print(f"compiling every cudattn kernel for {arch} into the cache ({jobs} processes; "
          f"later runs load them from disk)", flush=True)
    report = _warm.warm(arch, jobs=jobs, cache=cache)
    print(report.summary(), flush=True)
    for name, error in report.failed:
        print(f"failed: {name}: {error}", file=sys.stderr)
    return not report.failed


def cmd_demo(args) -> int:
    import ml_dtypes

    import cudattn
    from cudattn import reference

    B, H, S, D = args.batch, args.heads, args.seqlen, args.head_dim
    if args.gpus > 1:
        return _demo_ring(args)
    if _device.gpu_count() == 0:
        arch = args.arch or "sm_90a"
        print(f"No CUDA GPU found: no attention ran. Compiling cudattn's kernels for {arch} instead, so that a "
              f"later run on such a GPU starts warm (--arch picks another target).")
        return 0 if warm(arch, args.jobs) else 1
    arch = _device.device_properties(0).arch
    if args.arch and args.arch != arch:
        print(f"note: --arch {args.arch} ignored; this GPU runs {arch} kernels", file=sys.stderr)
    if not warm(arch, args.jobs):
        return 1
    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[args.dtype]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, S, H, D), dtype=np.float32).astype(dtype) for _ in range(3))
    print(f"attention on the GPU: B={B} S={S} H={H} D={D} {args.dtype} causal={args.causal} (bshd)")
    t0 = time.perf_counter()
    out = cudattn.attention(q, k, v, causal=args.causal)
    print(f"first call (compile or cache load, copies, kernel): {time.perf_counter() - t0:.2f} s")
    # The kernel alone, on device arrays, timed with CUDA events.
    from cudattn._runtime import launch as _launch

    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    cudattn.attention(qd, kd, vd, causal=args.causal)
    times = [_launch.time_ms(lambda: cudattn.attention(qd, kd, vd, causal=args.causal)) for _ in range(args.iters)]
    ms = float(np.median(times))
    flops = 4.0 * B * H * S * S * D / (2 if args.causal else 1)
    print(f"kernel: {ms:.3f} ms median of {args.iters}, {flops / ms / 1e9:.1f} TFLOP/s")
    sub = slice(0, min(B, 2))
    ref = reference.attention(q[sub], k[sub], v[sub], causal=args.causal)
    naive = reference.attention_naive(q[sub], k[sub], v[sub], causal=args.causal, dtype=dtype)
    ok, err, bound = reference.check_close(out[sub].astype(np.float64), ref, naive)
    print(f"max |out - ref| = {err:.3g} (bound {bound:.3g}, float64 reference on batch {sub.start}..{sub.stop - 1}): "
          f"{'OK' if ok else 'FAIL'}")
    ok = _demo_backward(args, (q, k, v), (qd, kd, vd), flops, rng) and ok
    return 0 if ok else 1


def _demo_ring(args) -> int:
    """``demo --gpus N``: ring attention over N GPUs (one process each), timed against one GPU on the
    whole sequence, and rows of it checked against the float64 reference."""
    import cudattn
    from cudattn.distributed import scaling

    n_gpus = _device.gpu_count()
    if n_gpus < args.gpus:
        print(f"demo --gpus {args.gpus}: this machine has {n_gpus} GPU(s)", file=sys.stderr)
        return 2
    per = args.gpus * (2 if args.causal else 1)
    if args.seqlen % per:
        print(f"demo --gpus {args.gpus}: --seqlen {args.seqlen} must be a multiple of {per} (the ring's "
              f"{'zigzag ' if args.causal else ''}chunks)", file=sys.stderr)
        return 2
    case = {"B": args.batch, "H": args.heads, "Hkv": args.heads, "S": args.seqlen, "D": args.head_dim,
            "dtype": args.dtype, "causal": bool(args.causal), "seed": 0, "sm_margin": args.sm_margin,
            "transport": args.transport}
    print(f"ring attention on {args.gpus} GPUs, one process each: B={args.batch} S={args.seqlen} "
          f"({args.seqlen // args.gpus} a GPU) H={args.heads} D={args.head_dim} {args.dtype} causal={args.causal}"
          f"{' (zigzag shards)' if args.causal else ''}", flush=True)
    t0 = time.perf_counter()
    row = scaling.measure(case, args.gpus, args.iters, want_output=True)
    print(f"ring: {row['ms']:.3f} ms median of {args.iters} (slowest rank), {row['tflops_per_gpu']:.1f} TFLOP/s a GPU; "
          f"the same steps without NCCL {row['compute_ms']:.3f} ms, so {row['exposed_ms_per_step']:.3f} ms of "
          f"communication left exposed a step ({time.perf_counter() - t0:.1f} s with start-up)", flush=True)
    n = args.gpus * (2 if args.causal else 1)
    shape = lambda w: (args.batch, args.seqlen // n, args.heads, args.head_dim)  # noqa: E731
    q, k, v = (cudattn.to_device(scaling.whole(0, w, n, shape(w), args.dtype)) for w in range(3))
    cudattn.attention(q, k, v, causal=args.causal)
    one = float(np.median(scaling.gpu_times(lambda: cudattn.attention(q, k, v, causal=args.causal), 0, args.iters)))
    print(f"one GPU, the whole sequence: {one:.3f} ms, {scaling.flops(case) / one / 1e9:.1f} TFLOP/s; the ring is "
          f"{one / row['ms']:.2f}x faster on {args.gpus} GPUs")
    ok, err, bound = scaling.check_rows(case, args.gpus, row["out"])
    print(f"max |out - ref| = {err:.3g} (bound {bound:.3g}, float64 reference on 48 rows of batch 0): "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


def _demo_backward(args, host, dev, flops: float, rng) -> bool:
    """The gradients of the demo's attention: timed, and checked on batch 0's first two heads."""
    import cudattn
    from cudattn import reference
    from cudattn._runtime import launch as _launch

    q, k, v = host
    dout = rng.standard_normal(q.shape, dtype=np.float32).astype(q.dtype)
    dd = cudattn.to_device(dout)
    out, lse = cudattn.attention(*dev, causal=args.causal, return_lse=True)

    def step():
        return cudattn.attention_backward(dd, *dev, out, lse, causal=args.causal)

    grads = step()
    ms = float(np.median([_launch.time_ms(step) for _ in range(args.iters)]))
    print(f"backward (dq, dk, dv): {ms:.3f} ms median of {args.iters}, {2.5 * flops / ms / 1e9:.1f} TFLOP/s")
    part = (slice(0, 1), slice(None), slice(0, 2))
    args_ = [x[part] for x in (dout, q, k, v)]
    ref = reference.attention_backward(*args_, causal=args.causal)
    naive = reference.attention_backward_naive(*args_, causal=args.causal)
    worst = []
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        ok, err, bound = reference.check_close(cudattn.to_host(g)[part].astype(np.float64), r, n,
                                               atol=reference.gradient_eps(r, q.dtype))
        worst.append((ok, name, err, bound))
    ok = all(w[0] for w in worst)
    print("max |grad - ref| " + ", ".join(f"{n} {e:.3g} (bound {b:.3g})" for _, n, e, b in worst) +
          f", float64 reference on batch 0, heads 0..1: {'OK' if ok else 'FAIL'}")
    return ok


def build_parser(argv=None) -> argparse.ArgumentParser:
    import cudattn

    prog = "cudattn" if os.path.basename(sys.argv[0]) == "cudattn" else "python -m cudattn"  # console script or -m
    ap = _Parser(prog=prog, description="cudattn: fused scaled-dot-product attention on NVIDIA GPUs. "
                 "Run the demo, time it against peers, check every kernel, manage the kernel cache, or export the "
                 "kernels for programs without Python.")
    ap.add_argument("--version", action="version", version=f"cudattn {cudattn.__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("info", help="GPU, arch, driver, NVRTC version, cache dir and size").set_defaults(fn=cmd_info)
    d = sub.add_parser("demo", help="compile every kernel for this GPU (in parallel), run attention on random "
                       "inputs, check it against the float64 reference, print TFLOP/s",
                       description="With no GPU, compile every kernel for --arch instead.")
    d.add_argument("--batch", type=_positive_int, default=4, help="batch size B")
    d.add_argument("--heads", type=_positive_int, default=16, help="heads H (query and key/value)")
    d.add_argument("--seqlen", type=_positive_int, default=4096, help="sequence length S (queries and keys)")
    d.add_argument("--head-dim", type=_positive_int, default=128, help="head dim D (8 to 256, a multiple of 8)")
    d.add_argument("--dtype", choices=("float16", "bfloat16"), default="bfloat16", help="input and output dtype")
    d.add_argument("--causal", action="store_true", help="causal mask (bottom right)")
    d.add_argument("--iters", type=_positive_int, default=20, help="timed calls (the median is printed)")
    d.add_argument("--gpus", type=_positive_int, default=1,
                   help="ring attention over this many GPUs of this machine, one process each (needs the "
                        "'distributed' extra); --seqlen is the whole sequence")
    d.add_argument("--transport", choices=("nccl", "copy", "auto"), default="nccl",
                   help="with --gpus: how the ring passes K/V (ring_attention's transport)")
    d.add_argument("--sm-margin", type=_nonneg_int, default=0, metavar="N",
                   help="with --gpus: SMs the ring's attention calls leave free for NCCL's transfers "
                        "(the ranks get NCCL_MAX_CTAS=N unless it is set)")
    d.add_argument("--arch", type=_arch, default=None,
                   help="compile target when there is no GPU (default sm_90a); with a GPU, the GPU's own")
    d.add_argument("--jobs", type=_positive_int, default=None, help="compile processes (default: the CPU count)")
    d.set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="time cudattn against torch SDPA (cuDNN, flash) on a grid of shapes")
    from cudattn.bench import cli as bench_cli

    bench_cli.add_arguments(b)
    b.set_defaults(fn=lambda a: bench_cli.run(a, argv if argv is not None else sys.argv[1:]))
    from cudattn._selfcheck import _main as selfcheck_main

    sc = sub.add_parser("selfcheck", help="every kernel family against the reference; --sanitize, --load, --soak, "
                        "--cold-procs", description=selfcheck_main.DESCRIPTION,
                        formatter_class=_RawDescriptionDefaults)
    selfcheck_main.add_arguments(sc)
    sc.set_defaults(fn=lambda a: selfcheck_main.run(a, argv if argv is not None else sys.argv[1:]))
    e = sub.add_parser("export", help="write every kernel's cubin, a JSON manifest and the C header of the "
                       "parameter structs, to launch the kernels from a program without Python",
                       description="No GPU needed: the kernels are compiled (in parallel, through the cache) "
                       "for each --arch. Exports into one --out add up: each --arch replaces its own kernels, "
                       "and the manifest lists every target there. --print-cflags prints (compiling nothing) "
                       "the -I options that build the exported C launcher and example: DIR/include and the "
                       "directory of cuda.h (the nvidia-cuda-runtime pip wheel's; $CUDATTN_CUDA_INCLUDE "
                       "overrides it), and on a terminal a compile line; link with -ldl -lm, no -lcuda: the "
                       "launcher loads libcuda.so.1 from the NVIDIA driver when it runs. Example: "
                       "cc -std=c11 -O2 $(python -m cudattn export --print-cflags --out DIR) "
                       "DIR/examples/attention.c -ldl -lm -o attention")
    e.add_argument("--arch", type=_arch, action="append", default=None,
                   help=f"compile target, repeatable (default: {DEFAULT_ARCH})")
    e.add_argument("--out", default=None, help="directory to write (created; files of the same names replaced); "
                   "required but with --print-cflags")
    e.add_argument("--jobs", type=_positive_int, default=None, help="compile processes (default: the CPU count)")
    e.add_argument("--print-cflags", action="store_true", help="print the C compiler's -I options for the export "
                   "in --out (or cuda.h's alone) on one line, and on a terminal a compile line, then exit")
    e.set_defaults(fn=cmd_export, parser=e)
    c = sub.add_parser("cache", help="the on-disk kernel cache: info, clear, or warm (compile every kernel)")
    c.add_argument("action", choices=("info", "clear", "warm"), help="what to do")
    c.add_argument("--arch", type=_arch, default=None,
                   help=f"warm: the target to compile for ({DEFAULT_ARCH} when not given); info, clear: only the "
                   "entries of this target (every entry when not given)")
    c.add_argument("--jobs", type=_positive_int, default=None, help="compile processes for warm (default: the CPU count)")
    c.set_defaults(fn=cmd_cache)
    return ap


def main(argv=None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
