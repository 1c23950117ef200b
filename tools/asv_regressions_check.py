"""Self-check of tools/asv_regressions on made-up results (CI runs it): a timed benchmark 10 %
slower with apart confidence intervals regresses; 10 % slower inside overlapping intervals does
not; a track rate 10 % lower regresses where its history is quiet and not where it is noisy; an
improvement is reported as one; a benchmark the newer commit skipped is n/a."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL = Path(__file__).resolve().parent / "asv_regressions"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat"]


def run(commit, date, results):
    rows = {}
    for name, (vals, lo, hi) in results.items():
        rows[name] = [vals, [["'a'", "'b'"]], "v", 0, 1.0, lo, hi, None, None, None, None]
    return {"commit_hash": commit * 5, "env_name": "gpu", "date": date, "params": {}, "python": "3.12",
            "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": rows, "durations": {}, "version": 2}


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "m").mkdir()
        bench = {"s.T.time_x": {"unit": "seconds"}, "s.T.track_r": {"unit": "TFLOP/s"}, "s.T.time_gone": {"unit": "seconds"}}
        (root / "benchmarks.json").write_text(json.dumps(bench))
        history = [  # track_r: param a quiet (1 % steps), param b noisy (20 % steps)
            ("aaaaaaaa", 1, {"s.T.track_r": ([100.0, 100.0], None, None)}),
            ("bbbbbbbb", 2, {"s.T.track_r": ([101.0, 120.0], None, None)}),
            ("cccccccc", 3, {"s.T.track_r": ([100.0, 100.0], None, None)}),
            ("dddddddd", 4, {"s.T.time_x": ([1.0, 1.0], [0.99, 0.9], [1.01, 1.1]), "s.T.track_r": ([100.0, 100.0], None, None),
                             "s.T.time_gone": ([1.0, 1.0], [0.9, 0.9], [1.1, 1.1])}),
            ("eeeeeeee", 5, {"s.T.time_x": ([1.1, 1.1], [1.09, 1.0], [1.11, 1.2]), "s.T.track_r": ([90.0, 90.0], None, None),
                             "s.T.time_gone": ([None, 0.5], [None, 0.49], [None, 0.51])}),
        ]
        for c, date, res in history:
            (root / "m" / f"{c}-gpu.json").write_text(json.dumps(run(c[0], date, res)))
        out = subprocess.run([sys.executable, str(TOOL), "--results", str(root), "--all"], capture_output=True, text=True)
        lines = out.stdout.splitlines()
        want = {"s.T.time_x('a')": "REGRESSED", "s.T.time_x('b')": "same", "s.T.track_r('a')": "REGRESSED",
                "s.T.track_r('b')": "same", "s.T.time_gone('a')": "n/a", "s.T.time_gone('b')": "improved"}
        bad = []
        for label, verdict in want.items():
            row = next((ln.strip() for ln in lines if f" {label}:" in ln), None)
            if row is None or not row.startswith(verdict):
                bad.append(f"{label}: want {verdict}, got {row!r}")
        if out.returncode != 1:
            bad.append(f"exit status {out.returncode}, want 1 (something regressed)")
        print("\n".join(bad) if bad else "asv_regressions self-check: ok")
        if bad:
            print(out.stdout, out.stderr)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
