"""GPU time of one-token decode calls by split count and merge sharers, beside cuDNN, in turns.

    PYTHONPATH=. python tools/decode_splits.py 1,32,1,8192 1,8,1,32768,64 --splits 0,32,64 --merge 0,8,16
    PYTHONPATH=. python tools/decode_splits.py 1,8,1,8192 --define "" --define CUDATTN_SPREAD_WAIT_NS=0

Each shape is B,Hq,Hkv,Sk[,D] (one query token; D 128 unless given). Every (split count, sharer
count) pair is a variant, 0 meaning the heuristic's choice (``num_splits=None``; for sharers,
`_kernels.decode_plan.choose_merge_ctas`); the variants of a shape and torch's cuDNN SDPA (where torch
imports) are timed in turns (`bench.timing.gpu_times`: behind a spin kernel, so host time stays out;
inputs rotated over copies 3x the L2) and printed in microseconds with cuDNN's time over each. A
forced sharer count is given to the plan by replacing `choose_merge_ctas` for the variant's turns;
the kernel clamps it to what its counter can hold and to the split count, and the plan's memo and
the recorded calls are cleared at each turn so that the variant's own plan is recorded. Each
``--define`` (repeatable; "" for the plain build) is a build of the decode kernel with those extra
``-D`` options (comma-separated), loaded once and kept apart from the others' (a probe of a
compile-time knob, or of cut points in a scratch copy of the sources). ``--block-rows R`` runs the
build for at most R packed rows a block, the rows split over as many blocks as that takes (0: the
plan's own choice). ``--tiles W,K,S,B,T`` (repeatable; "" for the build's own) runs the build with
W warps of K keys, S ring stages, a launch bound of B blocks an SM and at least T key tiles a
split, its rows as the plan chose them (a probe of a tile table's entry before it is written in).
``--page-size P`` reads the keys from a paged copy of the cache (shuffled pages of P keys, through
``attention_with_kvcache``; cuDNN reads the contiguous one, as in the bench); ``--kv-fp8`` casts the
cache to e4m3 (q stays 16-bit; cuDNN reads the 16-bit cache).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from dataclasses import replace

import ml_dtypes
import numpy as np

import cudattn
from cudattn._calls import call as _call
from cudattn._kernels import decode as _decode
from cudattn._kernels import decode_plan as _decode_plan
from cudattn._kernels import registry as _registry
from cudattn._runtime import device as _device
from cudattn._spec import validate as _validate
from cudattn._spec.kvcache import validate_kvcache
from cudattn.bench import inputs, peers, timing
from cudattn.bench.grids import Case


def _parse(text: str) -> tuple[int, int, int, int, int]:
    nums = [int(x) for x in text.split(",")]
    if len(nums) not in (4, 5):
        raise SystemExit(f"shape {text!r}: B,Hq,Hkv,Sk[,D]")
    b, hq, hkv, sk = nums[:4]
    return b, hq, hkv, sk, nums[4] if len(nums) == 5 else 128


_PLAIN_OPTIONS = _registry.options_for
_LOADED: dict[str, dict] = {}  # the kernels loaded for each build (`--define`)


@contextlib.contextmanager
def _variant(m: int, define: str, block_rows: int = 0, tiles: str = ""):
    """Plans made inside use ``m`` merge sharers (0: the heuristic's), decode kernels built with
    ``define``'s extra options, the build for at most ``block_rows`` packed rows, as given (0:
    the plan's own choice, which may halve 17-32 rows into two blocks), and ``tiles`` (W,K,S,B,T:
    warps, keys a warp, stages, blocks an SM, key tiles a split at least; "": the build's own);
    memoised plans and recorded calls forgotten on the way in and out."""
    real, real_select = _decode_plan.choose_merge_ctas, _decode_plan._decode_traits.select_decode
    real_halve = _decode_plan._halve_row_blocks
    if m:
        _decode_plan.choose_merge_ctas = lambda grid, splits, *a, **k: m if splits > 1 else 1
    if block_rows or tiles:
        w, kk, st, mb, tm = (int(x) for x in tiles.split(",")) if tiles else (0,) * 5

        def select(dtype, head_dim, smem_limit, mods=False, kv_fp8=False, rows=None):
            if block_rows:
                rows = block_rows if rows is None else min(rows, block_rows)
            v = real_select(dtype, head_dim, smem_limit, mods, kv_fp8, rows)
            if tiles:
                v = replace(v, tiles=replace(v.tiles, warps=w, warp_keys=kk, stages=st, min_blocks=mb,
                                             split_tiles_min=tm))
            return v
        _decode_plan._decode_traits.select_decode = select
        if block_rows:
            _decode_plan._halve_row_blocks = lambda *a: False  # the rows a block as given
    extra = [f"-D{d}" for d in define.split(",") if d]
    _registry.options_for = lambda v: _PLAIN_OPTIONS(v) + (extra if v.source == "flash_decode.cu" else [])
    plain_loaded = _registry._loaded
    _registry._loaded = _LOADED.setdefault(define, {})
    _decode._plans.clear()
    _call._plans.clear()
    try:
        yield
    finally:
        _decode_plan.choose_merge_ctas, _decode_plan._decode_traits.select_decode = real, real_select
        _decode_plan._halve_row_blocks = real_halve
        _registry.options_for = _PLAIN_OPTIONS
        _registry._loaded = plain_loaded
        _decode._plans.clear()
        _call._plans.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", help="B,Hq,Hkv,Sk[,D]")
    ap.add_argument("--splits", default="0", help="split counts, 0 = the heuristic's (default: 0)")
    ap.add_argument("--merge", default="0", help="merge sharer counts, 0 = the heuristic's (default: 0)")
    ap.add_argument("--block-rows", default="0", help="builds for at most this many packed rows a block, "
                    "as given; 0 = the plan's choice (default: 0)")
    ap.add_argument("--define", action="append", help="a build's extra -D options, comma-separated "
                    "(repeatable; \"\" for the plain build; default: the plain build alone)")
    ap.add_argument("--tiles", action="append", help="W,K,S,B,T: the build with W warps of K keys, S stages, "
                    "B blocks an SM, T tiles a split at least (repeatable; \"\" for the build's own)")
    ap.add_argument("--kv-fp8", action="store_true", help="the cache in e4m3 (q stays --dtype; cuDNN reads the "
                    "16-bit cache)")
    ap.add_argument("--page-size", type=int, default=0, help="a paged cache of this page size (default: contiguous)")
    ap.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    splits = [int(x) for x in args.splits.split(",")]
    sharers = [int(x) for x in args.merge.split(",")]
    builds = args.define or [""]
    block_rows = [int(x) for x in args.block_rows.split(",")]
    tile_sets = args.tiles or [""]
    torch = None if args.no_peers else peers.load_torch()
    tp = peers.TorchPeers(torch) if torch is not None else None
    h = tp.stream_handle if tp else 0
    props = _device.device_properties(0)
    rng = np.random.default_rng(0)
    print(f"{props.name}, {props.sm_count} SMs; {args.dtype}, one token, GPU us (median of {args.iters}), "
          "x = cuDNN's time over the variant's", flush=True)
    for text in args.shapes:
        B, Hq, Hkv, Sk, D = _parse(text)
        case = Case(args.dtype, B, Hq, Hkv, 1, Sk, D, False)
        host = inputs.host_inputs(case, rng)
        sets = inputs.device_sets(host, inputs.set_count(case, props.l2_cache_size), h)
        n = len(sets)
        ours, ours_problem = sets, lambda s: _validate.validate(*sets[0], num_splits=s or None)
        call = lambda st, s: cudattn.attention(*st, num_splits=s or None, stream=h)  # noqa: E731
        if args.page_size or args.kv_fp8:
            kc, vc, table = (inputs.paged_host(host[1], host[2], args.page_size, rng) if args.page_size
                             else (host[1], host[2], None))
            if args.kv_fp8:
                kc, vc = (x.astype(ml_dtypes.float8_e4m3fn) for x in (kc, vc))
            ours = inputs.device_sets((host[0], kc, vc) + ((table,) if args.page_size else ()), n, h)
            del kc, vc
            ours_problem = lambda s: validate_kvcache(  # noqa: E731
                ours[0][0], ours[0][1], ours[0][2], None, ours[0][3] if args.page_size else None, None, None, False,
                None, False, s or None, host=False)[0]
            call = lambda st, s: cudattn.attention_with_kvcache(  # noqa: E731
                st[0], st[1], st[2], block_table=st[3] if args.page_size else None, num_splits=s or None, stream=h)
        entries, names = [], []
        for define, tl, r, s, m in itertools.product(builds, tile_sets, block_rows, splits, sharers):
            with _variant(m, define, r, tl):
                plan = _decode.make_plan(ours_problem(s), props, _device.get_device(0))[0]
            tag = f"[{define}] " if len(builds) > 1 else ""
            tag += f"<{tl}> " if len(tile_sets) > 1 else ""
            tag += f"{plan.variant.tiles.block_m}r x{plan.num_m_blocks} " if len(block_rows) > 1 else ""
            names.append(f"{tag}s{plan.num_splits}/g{plan.merge_ctas}" + ("*" if not (s or m or r or tl) else ""))
            entries.append((lambda i, s=s: call(ours[i % n], s),
                            lambda m=m, define=define, r=r, tl=tl: _variant(m, define, r, tl)))
        refusable = [False] * len(entries)
        if tp is not None:
            tsets = [tp.tensors(st) for st in sets]
            sdpa = tp.bare(case)
            entries.append((lambda i: sdpa(*tsets[i % n]), lambda: tp.scope("cudnn")))
            refusable.append(True)
        times = timing.gpu_times(entries, h, 0, iters=args.iters, refusable=refusable)
        peer = times[-1] if tp is not None else None
        peer_us = peer.median_ms * 1e3 if peer is not None and not isinstance(peer, str) else None
        cells = []
        for name, t in zip(names, times):
            us = t.median_ms * 1e3
            cells.append(f"{name} {us:.1f}" + (f" ({peer_us / us:.2f}x)" if peer_us else ""))
        tail = f"  cuDNN {peer_us:.1f}" if peer_us else (f"  cuDNN: {peer}" if isinstance(peer, str) else "")
        paged = (f" pages {args.page_size}" if args.page_size else "") + (" kv-e4m3" if args.kv_fp8 else "")
        print(f"{B}x{Hq}/{Hkv} Sk {Sk} D {D}{paged}: " + "  ".join(cells) + tail, flush=True)


if __name__ == "__main__":
    main()
