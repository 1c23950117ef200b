"""Parse the ``-Xptxas=-v`` report that NVRTC appends to its log.

What ptxas (CUDA 13.x) prints, one block per function::

    ptxas info    : Compiling entry function '_Z1kP6__half' for 'sm_90a'
    ptxas info    : Function properties for _Z1kP6__half
    ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 9 registers, used 1 barriers, 128 bytes cumulative stack size, 4096 bytes smem, 364 bytes cmem[0]

Quirks this parser tolerates: fields in the "Used" line come and go (no smem line
without static shared memory; no cmem on sm_90a; "cumulative stack size" only with
calls; older ptxas omits "barriers"), so every field is matched on its own and
defaults to 0. Non-inlined device functions get a "Function properties" block with
no "Compiling entry function" and no "Used" line, and it may come before or after
the entry that calls it (``-G``, ``-rdc``; rdc may add clones such as ``_Z3devPfi$1``).
Every detail line therefore belongs to the most recent "Function properties" name.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class PtxasReport:
    registers: int = 0
    shared_bytes: int = 0  # static __shared__ only; dynamic smem is a launch parameter
    stack_bytes: int = 0  # this function's own frame
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    cumulative_stack_bytes: int = 0  # frame including callees (non-inlined calls)
    entry: bool = True  # False for a non-inlined __device__ function


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"\bUsed (\d+) registers")
_NUMBER_BEFORE = {
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "cumulative_stack_bytes": re.compile(r"(\d+) bytes cumulative stack size"),
}


def _numbers(line: str, fields: tuple[str, ...]) -> dict[str, int]:
    found = {}
    for field in fields:
        match = _NUMBER_BEFORE[field].search(line)
        if match:
            found[field] = int(match.group(1))
    return found


def parse_ptxas(log: str) -> dict[str, PtxasReport]:
    """Map each function's mangled name (as ptxas prints it) to its report."""
    reports: dict[str, dict] = {}
    current = None  # last function named by ptxas
    # No "ptxas" prefix filter: older ptxas printed the stack-frame line bare.
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            reports.setdefault(current, {})["entry"] = True
        elif m := _PROPERTIES.search(line):
            current = m.group(1)
            reports.setdefault(current, {}).setdefault("entry", False)
        elif current is None:
            continue
        elif "bytes stack frame" in line:
            reports[current].update(
                _numbers(line, ("stack_bytes", "spill_stores", "spill_loads"))
            )
        elif m := _USED.search(line):
            reports[current]["registers"] = int(m.group(1))
            reports[current].update(
                _numbers(line, ("barriers", "shared_bytes", "cumulative_stack_bytes"))
            )
    return {fn: PtxasReport(**fields) for fn, fields in reports.items()}
