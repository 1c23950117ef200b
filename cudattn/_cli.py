"""`python -m cudattn`: info, demo, bench, selfcheck, and the kernel cache (info | clear | warm --arch ARCH)."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _gpu_count() -> int:
    """Number of CUDA devices, 0 when there is no driver or no GPU (never raises)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:
        return 0


def _progress(i: int, n: int, label: str) -> None:
    width = 30
    done = int(width * i / n)
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {label[:48]:<48}")
    if i == n:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_info(args) -> int:
    import nvrtc_cache

    import cudattn

    print(f"cudattn {cudattn.__version__}")
    print(f"NVRTC {'.'.join(map(str, nvrtc_cache.nvrtc_version()))}")
    cache = nvrtc_cache.default_cache()
    info = cache.info()
    print(f"cache: {info['directory']} ({info['entries']} entries, {info['total_bytes'] / 2**20:.1f} MiB)")
    n = _gpu_count()
    if n == 0:
        print("GPU: none found (kernels can still be compiled: python -m cudattn cache warm --arch sm_90a)")
        return 0
    from cuda.bindings import driver

    from cudattn import _device

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
        info = cache.info()
        print(f"directory: {info['directory']}\nentries: {info['entries']}\nsize: {info['total_bytes'] / 2**20:.2f} MiB"
              f"\nwritable: {info['writable']}")
    elif args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.directory}")
    else:
        warm(args.arch, cache)
    return 0


def warm(arch: str, cache=None) -> None:
    """Compile every kernel variant for `arch` into the cache, with a progress bar."""
    from cudattn import _kernels, _traits

    variants = _traits.all_variants(arch) + _traits.all_fp8_variants(arch)
    t0 = time.perf_counter()
    fresh = 0
    for i, v in enumerate(variants):
        _progress(i, len(variants), v.describe())
        res = _kernels.compile_variant(v, arch, cache=cache)
        fresh += res.source == "compiled"
    _progress(len(variants), len(variants), "done")
    print(f"{len(variants)} variants for {arch}: {fresh} compiled, {len(variants) - fresh} already cached "
          f"({time.perf_counter() - t0:.1f} s)")


def cmd_demo(args) -> int:
    import ml_dtypes

    import cudattn
    from cudattn import reference

    B, H, S, D = args.batch, args.heads, args.seqlen, args.head_dim
    if _gpu_count() == 0:
        print("No CUDA GPU found: nothing ran. Compiling the kernels for sm_90a into the cache instead,")
        print("so that a later run on an H100/H200 starts warm.")
        warm("sm_90a")
        return 0
    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[args.dtype]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, S, H, D), dtype=np.float32).astype(dtype) for _ in range(3))
    print(f"attention on the GPU: B={B} S={S} H={H} D={D} {args.dtype} causal={args.causal} (bshd)")
    t0 = time.perf_counter()
    out = cudattn.attention(q, k, v, causal=args.causal)
    print(f"first call (compile or cache load, copies, kernel): {time.perf_counter() - t0:.2f} s")
    # The kernel alone, on device arrays, timed with CUDA events.
    from cudattn import _launch

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
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudattn", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="GPU, arch, driver, NVRTC version, cache dir and size").set_defaults(fn=cmd_info)
    d = sub.add_parser("demo", help="run attention on random inputs, check against the reference, print TFLOP/s")
    d.add_argument("--batch", type=int, default=4)
    d.add_argument("--heads", type=int, default=16)
    d.add_argument("--seqlen", type=int, default=4096)
    d.add_argument("--head-dim", type=int, default=128)
    d.add_argument("--dtype", choices=("float16", "bfloat16"), default="bfloat16")
    d.add_argument("--causal", action="store_true")
    d.add_argument("--iters", type=int, default=20)
    d.set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="time cudattn against torch SDPA (cuDNN, flash) on a grid of shapes")
    from cudattn.bench import cli as bench_cli

    bench_cli.add_arguments(b)
    b.set_defaults(fn=lambda a: bench_cli.run(a, argv if argv is not None else sys.argv[1:]))
    from cudattn._selfcheck import _main as selfcheck_main

    sc = sub.add_parser("selfcheck", help="every kernel family against the reference; --sanitize, --load, --soak, "
                        "--cold-procs", description=selfcheck_main.__doc__)
    selfcheck_main.add_arguments(sc)
    sc.set_defaults(fn=selfcheck_main.run)
    c = sub.add_parser("cache", help="the on-disk kernel cache")
    c.add_argument("action", choices=("info", "clear", "warm"))
    c.add_argument("--arch", default="sm_90a", help="compile target for warm: sm_80, sm_86, sm_89, sm_90a")
    c.set_defaults(fn=cmd_cache)
    args = ap.parse_args(argv)
    return args.fn(args)
