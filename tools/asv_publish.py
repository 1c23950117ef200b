"""`asv publish`, with the dashboard's regressions page right for rates.

asv's regression detection takes an upward step for a regression, which holds for times but not
for rates: a kernel that got faster in TFLOP/s (TB/s, GB/s) would be listed, and one that got
slower would not. Here the steps of rate benchmarks go to asv's detection as their reciprocals
(time per unit of work), and what it finds is turned back into rates for the page: a rate's
regression there is a fall, its factor below 1. Everything else is asv's own publish.

    python tools/asv_publish.py [asv publish options]
"""

from __future__ import annotations

import sys

from asv import main as asv_main
from asv.plugins import regressions as reg

RATES = ("TFLOP/s", "TB/s", "GB/s")
_detect = reg.detect_regressions
_get_graph_data = reg._GraphDataFilter.get_graph_data


class _Reciprocal(list):
    """Steps of a rate benchmark, handed to asv's detection as their reciprocals."""


def _reciprocal(steps):
    out = _Reciprocal()
    for left, right, value, low, err in steps:
        v = 1.0 / value if value else float("inf")
        # the lowest reciprocal is that of the step's highest value, which asv does not keep:
        # the step's own value stands in (the detection compares step values and errors)
        out.append((left, right, v, v, err * v / value if value else 0.0))
    return out


def get_graph_data(self, graph, benchmark):
    rate = benchmark.get("unit") in RATES
    for j, entry_name, steps, threshold in _get_graph_data(self, graph, benchmark):
        if rate and steps:
            steps = _reciprocal(steps)
        yield j, entry_name, steps, threshold


def detect_regressions(steps, threshold=0, min_size=2):
    last_v, best_v, jumps = _detect(steps, threshold, min_size)
    if not isinstance(steps, _Reciprocal) or last_v is None:
        return last_v, best_v, jumps
    back = lambda v: 1.0 / v if v else float("inf")  # noqa: E731
    return back(last_v), back(best_v), [(a, b, back(before), back(after)) for a, b, before, after in jumps]


reg._GraphDataFilter.get_graph_data = get_graph_data
reg.detect_regressions = detect_regressions

if __name__ == "__main__":
    sys.argv = ["asv", "publish", *sys.argv[1:]]
    sys.exit(asv_main.main())
