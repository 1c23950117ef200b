"""Host µs per warm call of several versions of cudattn, interleaved in one process.

    python tools/host_ab.py prepare --base 5a88854 [--base COMMIT ...] [--dir .ab/pkgs]   # here (.ab/ is ignored)
    python tools/host_ab.py run [--dir .ab/pkgs] [--rounds 12] [--opcodes]              # on the GPU

A host-time change of a microsecond or two cannot be told apart by timing two versions one after
another on a shared GPU machine: its CPUs drift by more than that between processes. Here every
version runs in the same process, on the same operands' kinds, in rounds of alternating order,
so drift hits them alike. ``prepare`` copies each base commit's ``cudattn`` package (``git
archive``) into ``DIR/cudattn_<commit>`` (its relative imports keep it whole under a new name), the first
given being the base the others are compared with;
carry ``DIR`` to the GPU machine. ``run`` imports those and the working tree's ``cudattn``, and
for prefill and decode (the overhead grid's shapes) with DeviceArray, torch and CuPy operands,
with and without ``out=``, times ``bench.overhead.host_us`` of one warm call per version and
round (the GPU held by a spin kernel). It prints the medians and minimums over rounds and their
differences from the first base. ``--opcodes`` also counts the bytecodes and C calls one warm
call executes per version: a noise-free measure of the Python work.

All versions launch kernels compiled from the working tree's ``cu_src`` (a version that read its
headers from a flat folder gets the working tree's reader); that is exact only while the kernels
are the same, which ``tools/sass_diff.py`` checks.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [(p, k) for p in ("prefill", "decode") for k in ("dev", "dev-out", "torch", "torch-out", "cupy")]


def prepare(bases: list[str], folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    shas = []
    for base in bases:
        sha = subprocess.run(["git", "rev-parse", "--short", base], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
        blob = subprocess.run(["git", "archive", sha, "cudattn"], cwd=ROOT, check=True, capture_output=True).stdout
        target = os.path.join(folder, f"cudattn_{sha}")
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            members = [m for m in tar.getmembers() if "/tests/" not in m.name]
            for m in members:
                m.name = f"cudattn_{sha}" + m.name[len("cudattn"):]
            tar.extractall(folder, members, filter="data")
        shas.append(sha)
        print(f"{base} -> {target}")
    with open(os.path.join(folder, "versions.txt"), "w") as f:  # the order given: the first is the base
        f.write("\n".join(shas) + "\n")


def _versions(folder: str) -> dict:
    sys.path.insert(0, ROOT)
    sys.path.insert(0, folder)
    import cudattn
    from cudattn._kernels import registry

    versions = {}
    with open(os.path.join(folder, "versions.txt")) as f:
        shas = f.read().split()
    for sha in shas:
        name = f"cudattn_{sha}"
        pkg = importlib.import_module(name)
        flat = sys.modules.get(f"{name}._kernels")
        if flat is not None and hasattr(flat, "sources"):  # headers read from one flat folder
            flat.sources = registry.sources
        versions[sha] = (pkg, importlib.import_module(f"{name}.bench.overhead"))
    versions["work"] = (cudattn, importlib.import_module("cudattn.bench.overhead"))
    return versions


def _calls(versions: dict) -> dict:
    """``{(problem, kind): {version: (warm fn, stream handle)}}``, each called five times already."""
    import cupy
    import torch

    ref = versions["work"][1]
    out = {}
    for prob, kind in CONFIGS:
        ins, out_h = ref._host_operands(prob)
        fns = {}
        for name, (pkg, mod) in versions.items():
            if kind == "cupy":
                ops, o, h = [cupy.asarray(x) for x in ins], cupy.asarray(out_h), cupy.cuda.get_current_stream().ptr
            elif kind.startswith("torch"):
                ops, o = [torch.as_tensor(x).cuda() for x in ins], torch.as_tensor(out_h).cuda()
                h = torch.cuda.current_stream().cuda_stream
            else:
                ops, o = [pkg.to_device(x) for x in ins], pkg.to_device(out_h)
                h = ops[0].stream_handle or 0
            fn = mod._call(prob, ops, o if kind.endswith("out") else None, {})
            for _ in range(5):
                fn()
            fns[name] = (fn, int(h))
        out[(prob, kind)] = fns
    return out


def _opcodes(fn) -> tuple[int, int]:
    """(bytecodes, C calls) of one ``fn()``: the least of three (a call may also release the memory of
    earlier ones; the first trace of a process can miss its frames)."""
    return min(_opcodes_once(fn) for _ in range(3))


def _opcodes_once(fn) -> tuple[int, int]:
    counts = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts["op"] += 1
        return trace

    def profile(frame, event, arg):
        if event == "c_call":
            counts["c"] += 1

    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return counts["op"], counts["c"]


def run(folder: str, rounds: int, opcodes: bool) -> None:
    versions = _versions(folder)
    calls = _calls(versions)
    host_us = versions["work"][1].host_us
    names = list(versions)
    times = {c: {n: [] for n in names} for c in calls}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for c, fns in calls.items():
            for n in order:
                fn, h = fns[n]
                times[c][n].append(host_us(fn, h, 0, calls=200, repeats=3)["host_us"])
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    base = names[0]
    print(f"host µs a warm call, {rounds} rounds; median (min); difference from {base}")
    print(f"{'call':18s}" + "".join(f"{n:>18s}" for n in names))
    for c, per in times.items():
        med = {n: statistics.median(v) for n, v in per.items()}
        low = {n: min(v) for n, v in per.items()}
        cells = [f"{med[n]:7.2f} ({low[n]:6.2f})" if n == base else
                 f"{med[n] - med[base]:+7.2f} ({low[n] - low[base]:+6.2f})" for n in names]
        print(f"{' '.join(c):18s}" + "".join(f"{x:>18s}" for x in cells))
    if opcodes:
        print("bytecodes / C calls of one warm call")
        for c, fns in calls.items():
            print(f"{' '.join(c):18s}" + "".join(f"{'%d / %d' % _opcodes(fns[n][0]):>18s}" for n in names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="copy base commits' packages into --dir")
    p.add_argument("--base", action="append", required=True, help="a commit (repeatable)")
    p.add_argument("--dir", default=os.path.join(ROOT, ".ab", "pkgs"))
    r = sub.add_parser("run", help="time every version in --dir and the working tree")
    r.add_argument("--dir", default=os.path.join(ROOT, ".ab", "pkgs"))
    r.add_argument("--rounds", type=int, default=12)
    r.add_argument("--opcodes", action="store_true", help="also count the bytecodes of one warm call")
    a = ap.parse_args()
    if a.command == "prepare":
        prepare(a.base, a.dir)
    else:
        run(a.dir, a.rounds, a.opcodes)


if __name__ == "__main__":
    main()
