"""Where a kernel's instructions and stalls go, from Nsight Compute's source page: by region and by
instruction class, for one kernel or two side by side (cudattn's and a peer's).

    ncu --clock-control none --profile-from-start off -k regex:flash_fwd_sm90 --section SourceCounters \\
        --section WarpStateStats --page source --print-source sass --csv \\
        python tools/ncu_probe.py cudattn bf16 16 16 512 64 1 > ours.csv
    ncu ... -k regex:sdpa ... python tools/ncu_probe.py cudnn bf16 16 16 512 64 1 > cudnn.csv
    python tools/ncu_regions.py ours.csv [cudnn.csv] [--classes 24] [--top 20]

A region is a run of consecutive SASS instructions that executed equally often (a straight-line
stretch of code: a tile's start, the key-tile loop's body, a tile's end, the producer's loop);
runs of fewer than --min-run instructions join their neighbours (a region then shows the highest
count among its runs), so that a predicated instruction or a short branch does not cut a region in
two; instructions that never ran are left out. For each region: its first SASS line,
its length, the times it ran (warp-level: a count of 8,192 is a warp's pass through it 8,192
times over the grid), the warp instructions it issued and its stall samples, with their shares of
the kernel's. Then the instruction classes (the opcode without its modifiers: FFMA, MUFU, HGMMA)
by warp instructions and samples, and the stall reasons by samples. No GPU is needed.

What it cannot say: which tile or iteration a sample came from (a region that runs once a tile
gathers the samples of every tile), nor which stalls delay the whole CTA rather than one warp.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

_PRED = re.compile(r"^@!?U?P\w+\s+")
ALL_SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path: str) -> list[dict]:
    """The SASS rows of a `--page source --csv` report (the first kernel in it)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    try:
        head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except StopIteration:
        raise SystemExit(f"{path}: no 'Address' header: not an ncu --page source --csv report")
    names = rows[head]
    out = []
    for r in rows[head + 1:]:
        if len(r) < len(names):
            break  # the next kernel's block, or the end
        out.append(dict(zip(names, r)))
    return out


def num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    """The instruction class of a SASS line: its opcode without predicate or modifiers."""
    return _PRED.sub("", source.strip()).split(" ")[0].split(".")[0]


def regions(rows: list[dict], min_run: int) -> list[tuple[int, int, float]]:
    """(first row, end row, times run) of each region of instructions that ran (see the docstring)."""
    runs: list[list] = []
    for i, r in enumerate(rows):
        n = num(r[EXECUTED])
        if runs and runs[-1][2] == n and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, n])
    merged: list[list] = []
    for run in runs:
        if run[2] == 0:
            continue
        if merged and (run[1] - run[0] < min_run or merged[-1][1] - merged[-1][0] < min_run) \
                and merged[-1][1] >= run[0] - min_run:
            merged[-1][1] = run[1]
            merged[-1][2] = max(merged[-1][2], run[2])
        else:
            merged.append(run)
    return [tuple(m) for m in merged]


def summary(path: str, min_run: int, classes: int, top: int) -> dict:
    rows = load(path)
    executed = sum(num(r[EXECUTED]) for r in rows)
    samples = sum(num(r[ALL_SAMPLES]) for r in rows)
    print(f"== {path}: {len(rows)} SASS lines, {executed / 1e6:.2f}M warp instructions, {samples:.0f} stall samples")
    print(f"{'first line':>10} {'lines':>6} {'runs':>9} {'warp instr':>11} {'share':>6} {'samples':>8} {'share':>6}  first instruction")
    for a, b, n in regions(rows, min_run):
        e = sum(num(r[EXECUTED]) for r in rows[a:b])
        s = sum(num(r[ALL_SAMPLES]) for r in rows[a:b])
        if e < executed * 0.002 and s < samples * 0.005:
            continue  # a sliver: left out of the listing, kept in the totals
        first = rows[a]["Source"].strip()[:48]
        print(f"{a:>10} {b - a:>6} {n:>9.0f} {e:>11.0f} {100 * e / executed:>5.1f}% {s:>8.0f} {100 * s / samples:>5.1f}%  {first}")
    by_ops: collections.Counter = collections.Counter()
    by_ops_samples: collections.Counter = collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        by_ops[op] += num(r[EXECUTED])
        by_ops_samples[op] += num(r[ALL_SAMPLES])
    stalls = collections.Counter()
    for name in rows[0] if rows else ():
        if name.startswith("stall_") and "Not Issued" not in name:
            stalls[name[len("stall_"):]] = sum(num(r[name]) for r in rows)
    print("instruction classes (warp instructions, samples): " + ", ".join(
        f"{op} {v / 1e6:.2f}M {by_ops_samples[op]:.0f}" for op, v in by_ops.most_common(classes)))
    print("stall reasons (samples): " + ", ".join(
        f"{k} {v:.0f} ({100 * v / samples:.1f}%)" for k, v in stalls.most_common(8) if samples))
    hot = sorted(range(len(rows)), key=lambda i: -num(rows[i][ALL_SAMPLES]))[:top]
    print(f"the {top} lines with most samples (line, samples, runs, instruction):")
    for i in sorted(hot):
        print(f"  {i:>6} {num(rows[i][ALL_SAMPLES]):>6.0f} {num(rows[i][EXECUTED]):>9.0f}  {rows[i]['Source'].strip()[:70]}")
    return {"executed": executed, "ops": by_ops}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="one or two ncu --page source --csv reports")
    ap.add_argument("--min-run", type=int, default=6, help="shortest run of equal counts kept as its own region")
    ap.add_argument("--classes", type=int, default=24, help="instruction classes listed")
    ap.add_argument("--top", type=int, default=20, help="hottest lines listed")
    a = ap.parse_args(argv)
    if len(a.reports) > 2:
        ap.error("one or two reports")
    sums = [summary(p, a.min_run, a.classes, a.top) for p in a.reports]
    if len(sums) == 2:
        one, two = sums
        print(f"== warp instructions by class, {a.reports[0]} against {a.reports[1]} "
              f"({one['executed'] / 1e6:.2f}M against {two['executed'] / 1e6:.2f}M)")
        ops = collections.Counter({k: abs(one["ops"][k] - two["ops"][k]) for k in set(one["ops"]) | set(two["ops"])})
        for op, _ in ops.most_common(a.classes):
            print(f"  {op:<12} {one['ops'][op] / 1e6:>7.2f}M {two['ops'][op] / 1e6:>7.2f}M")
    return 0


if __name__ == "__main__":
    sys.exit(main())
