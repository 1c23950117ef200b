"""The case list, run in this process: one progress line per case, a summary table, launches per
kernel, and a check that the memory the cases took went back to cudattn's pool."""

from __future__ import annotations

import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field

from cudattn._runtime import device as _device
from cudattn._kernels import traits as _traits

from . import _check, _exec, _memory
from ._cases import Case
from ._counter import LaunchCounter
from ._report import table


@dataclass
class CaseResult:
    name: str
    group: str
    status: str  # "pass" | "fail" | "skip"
    detail: str
    seconds: float = 0.0
    launches: dict = field(default_factory=dict)
    err: float | None = None
    bound: float | None = None


@dataclass
class SuiteResult:
    cases: list[CaseResult]
    launches: dict[str, int]
    pool_used_before: int
    pool_used_after: int

    @property
    def leaked(self) -> int:
        return self.pool_used_after - self.pool_used_before

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.cases) and self.leaked == 0

    def as_dict(self) -> dict:
        return {"ok": self.ok, "cases": [asdict(r) for r in self.cases], "launches": self.launches,
                "launches_total": sum(self.launches.values()),
                "pool_used_before": self.pool_used_before, "pool_used_after": self.pool_used_after}


def run_case(c: Case, counter: LaunchCounter, arch: str) -> CaseResult:
    skip = c.skip_reason(arch, hopper_archs=_traits.HOPPER_ARCHS, fp8_archs=_traits.FP8_ARCHS)
    if skip:
        return CaseResult(c.name, c.group, "skip", skip)
    before = counter.snapshot()
    t0 = time.perf_counter()
    try:
        prep, got = _exec.run(c)
        verdict = _check.check(c, prep.ref, got, prep.block_n)
    except Exception as e:  # a crash is this case's failure; the next cases still run
        verdict = _check.Verdict(False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    seconds = time.perf_counter() - t0
    launches = counter.since(before)
    if verdict.ok and not launches:
        verdict = _check.Verdict(False, "no kernel launch was counted (see _counter: did a caller bind launch?)")
    return CaseResult(c.name, c.group, "pass" if verdict.ok else "fail", verdict.detail, seconds, launches,
                      verdict.err, verdict.bound)


def run_cases(cases: list[Case], out=print) -> SuiteResult:
    """Run ``cases`` in order, printing a line per case as it finishes."""
    arch = _device.device_properties(0).arch
    pool_before = _memory.snapshot().pool_used
    results = []
    with LaunchCounter() as counter:
        for i, c in enumerate(cases, 1):
            r = run_case(c, counter, arch)
            results.append(r)
            first, _, rest = r.detail.partition("\n")
            n = sum(r.launches.values())
            extra = f"  [{r.seconds * 1e3:.0f} ms, {n} launches]" if r.status != "skip" else ""
            out(f"[{i:>{len(str(len(cases)))}}/{len(cases)}] {r.status.upper():4}  {r.name}  -- {first}{extra}")
            if rest:
                out(rest.rstrip())
        launches = dict(sorted(counter.snapshot().items()))
    pool_after = _memory.snapshot().pool_used
    return SuiteResult(results, launches, pool_before, pool_after)


def summary(res: SuiteResult) -> str:
    groups: dict[str, Counter] = {}
    for r in res.cases:
        g = groups.setdefault(r.group, Counter())
        g[r.status] += 1
        g["launches"] += sum(r.launches.values())
    rows = [[name, sum(g[s] for s in ("pass", "fail", "skip")), g["pass"], g["fail"], g["skip"], g["launches"]]
            for name, g in groups.items()]
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    text = [table(["group", "cases", "pass", "fail", "skip", "launches"], rows + [["total", *total]]), "",
            table(["kernel", "launches"], [[k, n] for k, n in res.launches.items()]), ""]
    text.append(f"device memory from cudattn's pool: {res.pool_used_before} B in use before the cases, "
                f"{res.pool_used_after} B after" + ("" if res.leaked == 0 else f"  -> {res.leaked} B NOT RETURNED"))
    failed = [r.name for r in res.cases if r.status == "fail"]
    text.append(f"selfcheck: {'PASS' if res.ok else 'FAIL'} ({total[1]} passed, {total[2]} failed, {total[3]} skipped)")
    if failed:
        text += ["failed:"] + [f"  {n}" for n in failed]
    return "\n".join(text)
