"""The ``selfcheck`` subcommand: arguments, which runs to make, the exit code and the JSON report.

With no mode flag it runs the case list in process. ``--sanitize``, ``--load``, ``--soak`` and
``--cold-procs`` each run their own check instead (several may be given; they run in that
order). Exit code: 0 when everything passed, 1 when something failed, 2 when nothing could run
(no GPU, no compute-sanitizer, no case matching ``-k``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile

from ._cases import CASE_SETS
from ._sanitize import TOOLS, SanitizerNotFound, find_sanitizer, parse_tools
from .._runtime import device as _device

EXIT_OK, EXIT_FAIL, EXIT_CANNOT_RUN = 0, 1, 2

DESCRIPTION = """Run every kernel family against the float64 reference (the default), or, with a mode flag,
under compute-sanitizer (--sanitize), from many threads (--load), for many calls (--soak) or in
many cold processes at once (--cold-procs); several modes may be given and run in that order.
Exit status: 0 when everything passed, 1 when something failed, 2 when nothing could run (no GPU,
no compute-sanitizer, no case matching -k)."""


def _tools(text: str) -> tuple[str, ...]:
    try:
        return parse_tools(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {n}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", choices=sorted(CASE_SETS),
                   help="case list: full (the default in process), or sanitize (the default under --sanitize)")
    p.add_argument("-k", dest="filter", metavar="TEXT", help="only cases whose name contains TEXT")
    p.add_argument("--json", metavar="FILE", help="write the report (cases, launches per kernel, every mode's figures)")
    p.add_argument("--seed", type=int, default=0, help="seed of the load/soak problem mix and call order")
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="check GPU N (selfcheck runs again seeing that GPU alone)")
    s = p.add_argument_group("sanitizers")
    s.add_argument("--sanitize", action="store_true",
                   help="re-run the sanitize case list in child processes under compute-sanitizer")
    s.add_argument("--tools", type=_tools, default=",".join(TOOLS), metavar="LIST",
                   help="comma-separated compute-sanitizer tools")
    s.add_argument("--log-dir", help="where each tool's log and JSON go (default: a new temp dir, printed)")
    s.add_argument("--print-limit", type=_positive, default=50, help="compute-sanitizer --print-limit")
    s.add_argument("--tool-timeout", type=float, default=1800.0, help="seconds per tool run")
    ld = p.add_argument_group("load")
    ld.add_argument("--load", action="store_true", help="threads, each on its own stream, calling a pool of problems")
    ld.add_argument("--threads", type=_positive, default=8, help="threads calling at once")
    ld.add_argument("--calls", type=_positive, default=1000, help="calls per thread")
    ld.add_argument("--problems", type=_positive, default=40, help="problems in the load/soak mix")
    ld.add_argument("--cold", action="store_true", help="start the load on an empty kernel cache")
    ld.add_argument("--stall-timeout", type=float, default=120.0,
                    help="seconds without progress after which a load thread counts as stuck")
    ot = p.add_argument_group("soak and cold start")
    ot.add_argument("--soak", type=_positive, nargs="?", const=10000, metavar="N",
                    help="N calls in one thread (N = 10000 if omitted), device/pool/host memory before and after")
    ot.add_argument("--cold-procs", type=_positive, nargs="?", const=8, metavar="N",
                    help="N processes (N = 8 if omitted) started together on an empty kernel cache")


def run(args, argv=None) -> int:
    if args.device:
        from .._tools import on_device

        if args.device < 0:
            print(f"selfcheck --device: must be >= 0; got {args.device}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        status = on_device.rerun(args.device, list(sys.argv[1:] if argv is None else argv), _device.gpu_count())
        if status is not None:
            return status
    out = functools.partial(print, flush=True)
    sanitizer = None
    if args.sanitize:
        try:
            sanitizer = find_sanitizer()
        except SanitizerNotFound as e:
            print(f"selfcheck --sanitize: {e}", file=sys.stderr)
            return EXIT_CANNOT_RUN
    if _device.gpu_count() == 0:
        print("selfcheck: no CUDA GPU found; nothing ran (every check runs kernels)", file=sys.stderr)
        return EXIT_CANNOT_RUN
    from . import _report

    report = {"environment": _report.environment()}
    ok = True
    modes = args.sanitize or args.load or args.soak or args.cold_procs
    if not modes:
        cases = [c for c in CASE_SETS[args.cases or "full"]() if not args.filter or args.filter in c.name]
        if not cases:
            print(f"selfcheck: no case name contains {args.filter!r}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        from . import _suite

        res = _suite.run_cases(cases, out)
        out("\n" + _suite.summary(res))
        report["selfcheck"] = res.as_dict()
        ok &= res.ok
    if args.sanitize:
        from . import _sanitize

        log_dir = args.log_dir or tempfile.mkdtemp(prefix="cudattn-sanitize-")
        runs = _sanitize.run_all(args.tools, sanitizer, log_dir, case_set=args.cases or "sanitize",
                                 print_limit=args.print_limit, timeout=args.tool_timeout, case_filter=args.filter,
                                 out=out)
        out("\n" + _sanitize.summary_table(runs, log_dir))
        report["sanitize"] = _sanitize.as_dict(runs, log_dir)
        ok &= report["sanitize"]["ok"]
    if args.load:
        from . import _load

        res = _load.run_load(threads=args.threads, calls=args.calls, problems=args.problems, cold=args.cold,
                             seed=args.seed, stall_s=args.stall_timeout, out=out)
        out("\n" + _load.summary(res))
        report["load"] = res.as_dict()
        ok &= res.ok
        if res.stuck:  # hung threads may never return: leave without waiting for them
            _finish(args, report)
            os._exit(EXIT_FAIL)
    if args.soak:
        from . import _soak

        res = _soak.run_soak(args.soak, problems=args.problems, seed=args.seed, out=out)
        out("\n" + _soak.summary(res))
        report["soak"] = res.as_dict()
        ok &= res.ok
    if args.cold_procs:
        from . import _coldprocs

        res = _coldprocs.run_cold_procs(args.cold_procs, out=out)
        out("\n" + _coldprocs.summary(res))
        report["cold_procs"] = res.as_dict()
        ok &= res.ok
    _finish(args, report)
    return EXIT_OK if ok else EXIT_FAIL


def _finish(args, report: dict) -> None:
    report["ok"] = all(v.get("ok", True) for v in report.values() if isinstance(v, dict))
    if args.json:
        from ._report import write_json

        write_json(args.json, report)
        print(f"report: {args.json}", flush=True)
    sys.stdout.flush()
