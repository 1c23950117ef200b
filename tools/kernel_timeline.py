"""Per-CTA timeline of the Hopper forward kernel: where each CTA's time goes, tile by tile.

    PYTHONPATH=. python tools/kernel_timeline.py --out /tmp/tl 16,16,512,64,1 8,16,1024,64,1

Each shape is B,H,S,D,causal (bfloat16; --dtype float16 too). The kernel sources are copied to a
scratch folder and `kernel_timeline.patch` applied there (sm90/probe.cuh: clock stamps at each phase
of every tile, by the producer and each consumer warpgroup, and the CTA's SM and start and end
times); cudattn then compiles and calls that build, once warm, and the stamps are read back from
the module's globals. Printed per shape: the spread of the CTAs' ends (the last wave's balance),
each consumer's cycles by phase of a tile (by the tile's key tiles: waiting for its name, for the
first key stage (passing the key tiles its rows do not see on the way), for its turn, for the first
S; the key loop, the last P·V, the store) and their share of its time, the waits at tile boundaries
(where the next tile's name is read under the last P·V, its "name" and "first K" phases run beside
the previous tile's tail, and the boundary line is the one to read),
the producer's phases, and how far ahead of the consumers it names each tile. The raw stamps go to
``--out`` as ``tl_<shape>.npz`` (T: CTA x role x tile x slot, C: CTA x slot, as probe.cuh lists).
The probe build runs within a few per cent of the plain kernel's time (32-bit stamps in shared
memory, copied out once a role ends); it needs a GPU, the `patch` program and ml_dtypes.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

PATCH = pathlib.Path(__file__).with_name("kernel_timeline.patch")
CTAS, ROLES, TILES, SLOTS = 264, 4, 32, 12  # probe.cuh's TL_CTAS, roles, TL_TILES, TL_EV
PHASES = ("name", "first K", "turn", "first S", "key loop", "last PV", "store")


def probe_sources(dest: pathlib.Path, root=None, tiles: int = TILES) -> pathlib.Path:
    """The kernel sources (cudattn's, or ``root``) copied to ``dest/cu_src`` with the probe applied,
    stamping the first ``tiles`` tiles of each CTA."""
    from cudattn._kernels import registry

    src = pathlib.Path(str(root or registry.source_root()))
    shutil.copytree(src, dest / "cu_src", ignore=shutil.ignore_patterns("__pycache__"))
    if shutil.which("patch") is None:
        raise SystemExit("kernel_timeline: needs the patch program")
    res = subprocess.run(["patch", "-p1", "--forward", "--no-backup-if-mismatch", "-i", str(PATCH)], cwd=dest,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"kernel_timeline.patch no longer applies to the sources:\n{res.stdout}{res.stderr}")
    probe = dest / "cu_src" / "include" / "cudattn" / "sm90" / "probe.cuh"
    probe.write_text(probe.read_text().replace(f"#define TL_TILES {TILES}\n", f"#define TL_TILES {tiles}\n"))
    return dest / "cu_src"


def use_sources(folder: pathlib.Path) -> None:
    """Make cudattn compile its kernels from ``folder`` (the probe build) in this process."""
    from cudattn._kernels import registry

    registry.source_root = lambda: folder
    registry.sources.cache_clear()


def _check(res):
    from cuda.bindings import driver

    if res[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA call failed: {res[0]}")
    return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)


def _globals(loaded):
    from cuda.bindings import driver

    lib = _check(driver.cuKernelGetLibrary(driver.CUkernel(int(loaded.kernel_handle))))
    return (_check(driver.cuLibraryGetGlobal(lib, b"cudattn_tl")),
            _check(driver.cuLibraryGetGlobal(lib, b"cudattn_tl_cta")))


def _read(ptr, size, dtype):
    from cuda.bindings import driver

    a = np.zeros(size // np.dtype(dtype).itemsize, dtype)
    _check(driver.cuMemcpyDtoH(a.ctypes.data, ptr, size))
    return a


def record(B, H, S, D, causal, dtype, tiles: int = TILES):
    """One warm call's stamps: (T, C) of the CTAs that ran, or None if no probe build ran."""
    from cuda.bindings import driver

    import cudattn
    from cudattn._kernels import registry

    rng = np.random.default_rng(1)
    q, k, v = (cudattn.to_device(rng.standard_normal((B, S, H, D), dtype=np.float32).astype(dtype))
               for _ in range(3))
    for _ in range(3):
        cudattn.attention(q, k, v, causal=causal)
    _check(driver.cuCtxSynchronize())
    found = [_globals(lk) for (variant, _), lk in registry._loaded.items() if variant.family == "sm90"
             and lk.name.startswith("flash_fwd")]
    for (tl, tl_size), (cta, cta_size) in found:
        _check(driver.cuMemsetD8(tl, 0, tl_size))
        _check(driver.cuMemsetD8(cta, 0, cta_size))
    _check(driver.cuCtxSynchronize())
    cudattn.attention(q, k, v, causal=causal)
    _check(driver.cuCtxSynchronize())
    for (tl, tl_size), (cta, cta_size) in found:
        C = _read(cta, cta_size, np.uint64).reshape(CTAS, 8)
        ran = np.nonzero(C[:, 1])[0]
        if len(ran):
            T = _read(tl, tl_size, np.uint32).reshape(CTAS, ROLES, tiles, SLOTS)
            return T[ran], C[ran]
    return None


def analyse(name: str, T, C) -> None:
    C = C.astype(np.int64)
    start = C[:, 2] & 0xFFFFFFFF
    # cycles since the CTA's start; -1 where a slot was never stamped
    R = np.where(T == 0, -1, (T.astype(np.int64) - start[:, None, None, None]) % (1 << 32))
    ends = (C[:, 3:7] - start[:, None]) % (1 << 32)
    t0, t1 = C[:, 1], C[:, 7]
    mhz = np.median(ends[:, 1] / ((t1 - t0) / 1e3))
    sms = np.unique(C[:, 0])
    sm_end = np.array([t1[C[:, 0] == s].max() for s in sms])
    print(f"== {name}: {len(C)} CTAs on {len(sms)} SMs, span {(t1.max() - t0.min()) / 1e3:.1f} us at ~{mhz:.0f} MHz; "
          f"starts within {(t0.max() - t0.min()) / 1e3:.2f} us; SMs end {(t1.max() - sm_end).mean() / 1e3:.2f} us "
          f"before the last on average (at most {(t1.max() - sm_end).max() / 1e3:.2f})")
    key_tiles = T[:, 0, :, 7].astype(np.int64)
    named = (T[:, 0, :, 3] != 0).sum(1)
    print(f"tiles a CTA {named.min()}-{named.max()} (mean {named.mean():.2f}), key tiles a CTA "
          f"{key_tiles.sum(1).min()}-{key_tiles.sum(1).max()} (mean {key_tiles.sum(1).mean():.1f})")
    first = R[:, 0, 0]
    print(f"first tile: producer's coordinates at {np.median(first[:, 1]):.0f} cycles, Q issued {np.median(first[:, 3]):.0f}; "
          f"consumer 0 sees the name at {np.median(R[:, 1, 0, 1]):.0f}, its first S done at {np.median(R[:, 1, 0, 4]):.0f}")
    for role in range(1, ROLES):
        Rr = R[:, role]
        if not (Rr[:, :, 0] >= 0).any():
            continue
        print(f"consumer {role - 1}: cycles a tile by phase (mean), by the tile's key tiles")
        print("  key tiles  tiles " + " ".join(f"{p:>9s}" for p in PHASES) + "     total")
        for kt in sorted(set(key_tiles[key_tiles > 0].tolist())):
            m = (key_tiles == kt) & (Rr[:, :, 0] >= 0) & (Rr[:, :, 2] >= 0) & (Rr[:, :, 7] >= 0)
            if m.any():
                cells = " ".join(f"{(Rr[:, :, i + 1] - Rr[:, :, i])[m].mean():9.0f}" for i in range(len(PHASES)))
                print(f"  {kt:9d} {m.sum():6d} {cells} {(Rr[:, :, 7] - Rr[:, :, 0])[m].mean():9.0f}")
        share = []
        for i in range(len(PHASES)):
            ok = (Rr[:, :, i + 1] >= 0) & (Rr[:, :, i] >= 0)
            share.append((np.where(ok, Rr[:, :, i + 1] - Rr[:, :, i], 0).sum(1) / ends[:, role]).mean())
        print("  share of its time: " + ", ".join(f"{p} {s * 100:.1f} %" for p, s in zip(PHASES, share)))
        # Tile boundaries: from this consumer's store of tile n to the first K of tile n+1 (its wait
        # there: builds that read the next tile's name under the last P V have stamped that earlier),
        # and when the producer issued that K, from the start of this consumer's last P V of tile n
        # (negative: before it).
        end, nxt, issue = Rr[:, :-1, 7], Rr[:, 1:, 2], R[:, 0, 1:, 8]
        b = (end >= 0) & (nxt >= 0) & (issue >= 0) & (Rr[:, :-1, 5] >= 0)
        if b.any():
            print(f"  at a tile boundary: the next tile's first K arrives {np.median((nxt - end)[b]):.0f} cycles "
                  f"(median) after its store; the producer issued it {np.median((issue - Rr[:, :-1, 5])[b]):+.0f} "
                  f"cycles from the start of its last P V, {np.median((nxt - issue)[b]):.0f} before it arrived")
        m = (Rr[:, :, 0] >= 0) & (R[:, 0, :, 3] >= 0)
        m[:, 0] = False
        if m.any():
            lead = (Rr[:, :, 0] - R[:, 0, :, 3])[m]
            print(f"  after its first tile it reaches a tile {np.median(lead):.0f} cycles (median) after the producer "
                  f"named it; before it in {(lead < 0).mean() * 100:.0f} % of tiles")
    P = R[:, 0]
    ok = P[:, :, 0] >= 0
    parts = {"coordinates": (0, 1), "Q stage free": (1, 2), "Q issued": (2, 3), "first K stage free": (3, 8),
             "K/V loads": (3, 4)}
    print("producer, cycles a tile (mean): " + ", ".join(
        f"{k} {(P[:, :, b] - P[:, :, a])[ok & (P[:, :, b] >= 0)].mean():.0f}" for k, (a, b) in parts.items()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", help="B,H,S,D,causal")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--out", help="folder for the raw stamps (tl_<shape>.npz)")
    ap.add_argument("--tiles", type=int, default=TILES,
                    help=f"tiles stamped a CTA (default {TILES}; fewer where the stamps' shared memory does not fit "
                         "beside the build's, as in the 128-row head-dim-128 tiles)")
    args = ap.parse_args(argv)
    dtype = ml_dtypes.bfloat16 if args.dtype == "bfloat16" else np.float16
    with tempfile.TemporaryDirectory() as tmp:
        use_sources(probe_sources(pathlib.Path(tmp), tiles=args.tiles))
        for spec in args.shapes:
            B, H, S, D, causal = map(int, spec.split(","))
            got = record(B, H, S, D, bool(causal), dtype, args.tiles)
            name = f"{B}x{H}x{S}x{D}{' causal' if causal else ''}"
            if got is None:
                print(f"== {name}: no Hopper forward build ran", file=sys.stderr)
                continue
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                np.savez(os.path.join(args.out, f"tl_{B}x{H}x{S}x{D}{'c' if causal else 'n'}.npz"), T=got[0], C=got[1])
            analyse(name, *got)


if __name__ == "__main__":
    main()
