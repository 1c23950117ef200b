"""A pool of problems called many times (load, soak): inputs uploaded once, the first result of
each problem checked against the float64 reference, every later one required bit-identical to it.

cudattn's kernels are deterministic (same inputs, same bits: no atomics, fixed split and merge
order), so any later difference is a fault of the run itself: a race, cross-talk between
streams or threads, a stale kernel or plan, memory reused too early.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from cudattn._kernels import traits as _traits

from . import _check, _exec
from ._cases import Case
from ._inputs import make_inputs


@dataclass
class Problem:
    case: Case
    preps: list  # one Prepared shared by every user, or one per user when the call writes its inputs
    lock: threading.Lock = field(default_factory=threading.Lock)
    expected: dict | None = None  # the first result (NumPy arrays)
    verdict: _check.Verdict | None = None  # that result against the reference

    def prepared(self, user: int) -> _exec.Prepared:
        return self.preps[user if len(self.preps) > 1 else 0]

    def record(self, user: int, got: dict) -> str | None:
        """Take one result: the first is checked against the reference (outside the lock: the
        float64 reference is slow), later ones are compared bit for bit. Returns what differs."""
        with self.lock:
            first = self.expected is None
            if first:
                self.expected = got
        if first:
            p = self.prepared(user)
            self.verdict = _check.check(self.case, p.ref, got, p.block_n)
            return None
        return _check.first_difference(self.expected, got)


def runnable(cases: list[Case], arch: str) -> list[Case]:
    archs = dict(hopper_archs=_traits.HOPPER_ARCHS, fp8_archs=_traits.FP8_ARCHS)
    return [c for c in cases if c.skip_reason(arch, **archs) is None]


def build(cases: list[Case], users: int, stream=None) -> list[Problem]:
    """Upload every case once (per user when its call writes its inputs). Host work only: no
    kernel runs here except FP8 device quantisation, which the load mix does not use, so a cold
    kernel cache stays cold until the users start."""
    pool = []
    for c in cases:
        inputs = make_inputs(c)
        n = users if c.mutates_inputs else 1
        pool.append(Problem(c, [_exec.prepare(c, inputs, stream) for _ in range(n)]))
    return pool


def unchecked(pool: list[Problem]) -> list[str]:
    return [p.case.name for p in pool if p.verdict is None]


def failed(pool: list[Problem]) -> list[tuple[str, str]]:
    return [(p.case.name, p.verdict.detail) for p in pool if p.verdict is not None and not p.verdict.ok]
