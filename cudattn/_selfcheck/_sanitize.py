"""A case list re-run in child processes under compute-sanitizer, one tool each.

Each child is ``python -m cudattn selfcheck --cases sanitize --json FILE`` (or ``--cases full``),
whose JSON report gives the launches it made. It runs once without a tool (the baseline: it
compiles the kernels into the disk cache and shows the cases pass uninstrumented), then under
each tool with ``--error-exitcode 97``, its stdout and stderr in ``LOG_DIR/TOOL.log``; the
tool's own summary line gives the error count. With memcheck, a last run plants an
out-of-bounds read (`PLANTED_OUT_OF_BOUNDS`) and must see memcheck report it: the control that
makes the zeros mean something.

Options, all documented compute-sanitizer options, added only when ``--help`` lists them:

- every tool: ``--show-backtrace device``. Host backtraces include Python frames, and the tool
  keeps a reference to the frames of every launch it records (seen with compute-sanitizer
  2025.3 on an H100: after one kernel launch, the arrays that were locals of the calling frames
  stay alive for the rest of the process), so nothing a launch touched is ever freed: cudattn's
  pool never gets its memory back and ``--leak-check`` reports every such array as leaked.
  Device backtraces (kernel, and source line from ``-lineinfo``) are kept; the case that ran
  is the selfcheck progress line just above an error in the same log.

- memcheck: ``--leak-check full``: device allocations still live when the process's contexts
  go down are leaks. cudattn frees its arrays stream-ordered into cuda.core's pool, and the
  selfcheck run ends with every array dropped, the device synchronized and the pool trimmed
  (`_memory.settle`), so a leak reported here is an allocation nobody freed, not pool slack.
  ``--track-stream-ordered-races all``: a stream-ordered buffer used before its allocation or
  after its free in stream order (cudattn frees workspaces such as FP8's Vt and the split-KV
  partials right after queueing the kernels that read them). The memcheck child runs with
  ``CUDATTN_PINNED_STAGING=0``: the NumPy path's pinned staging chunks (4 x 16 MiB of pinned
  host memory) live with the process by design, and leak-check reports them (seen on an H100);
  without them the NumPy path copies straight from pageable memory, and any leak left is real.
- racecheck: ``--racecheck-report all`` (hazards and the analysis of them). Its summary line is
  ``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)``; errors fail, warnings are
  reported.
- initcheck: reports reads of device memory never written. The FP8 path reads ``Vt``, a
  workspace padded to 128 keys (`_kernels.fp8.transpose_v`); the transpose kernel writes the padding
  with zeros (initcheck on an H100 agrees: no report for key counts 65, 113, 203), so a report
  there is a real finding: nothing is filtered.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from ._report import table

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
ERROR_EXITCODE = 97
ENV_VAR = "CUDATTN_COMPUTE_SANITIZER"
FALLBACK_PATHS = ("/usr/local/cuda/bin/compute-sanitizer",)
BASELINE = "none"


class SanitizerNotFound(RuntimeError):
    pass


def find_sanitizer(env=None, which=shutil.which, fallbacks=FALLBACK_PATHS) -> str:
    """``$CUDATTN_COMPUTE_SANITIZER``, else ``compute-sanitizer`` on PATH, else the CUDA toolkit's."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_VAR)
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise SanitizerNotFound(f"${ENV_VAR} is {explicit!r}, which is not an executable file")
    found = which("compute-sanitizer")
    if found:
        return found
    for p in fallbacks:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise SanitizerNotFound(
        "compute-sanitizer not found: not in $" + ENV_VAR + ", not on PATH, not at " + ", ".join(fallbacks)
        + ". Install the CUDA toolkit and put its bin/ on PATH, or set $" + ENV_VAR + " to the binary")


def parse_tools(text: str) -> tuple[str, ...]:
    """``"memcheck,racecheck"`` -> the tools, in order, once each; ValueError names unknown ones."""
    tools = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tools if t not in TOOLS]
    if bad or not tools:
        raise ValueError(f"unknown sanitizer tool(s) {bad or text!r}; choose from {','.join(TOOLS)}")
    return tuple(dict.fromkeys(tools))


def tool_options(tool: str, help_text: str, print_limit: int) -> list[str]:
    opts = ["--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(print_limit)]
    if "--show-backtrace" in help_text:
        opts += ["--show-backtrace", "device"]
    if tool == "memcheck" and "--leak-check" in help_text:
        opts += ["--leak-check", "full"]
    if tool == "memcheck" and "--track-stream-ordered-races" in help_text:
        opts += ["--track-stream-ordered-races", "all"]
    if tool == "racecheck" and "--racecheck-report" in help_text:
        opts += ["--racecheck-report", "all"]
    return opts


# "ERROR SUMMARY: 70 errors", but not its follow-up "ERROR SUMMARY: 20 errors were not printed"
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?\s*$", re.MULTILINE)
_RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\(\s*(\d+)\s+errors?,\s*"
                                r"(\d+)\s+warnings?\s*\)")
_LEAK_SUMMARY = re.compile(r"LEAK SUMMARY:\s*(\d+)\s+bytes? leaked")


@dataclass
class Summary:
    errors: int | None  # None: no summary line (the tool did not run to the end)
    warnings: int = 0
    leaked_bytes: int = 0


def parse_summary(text: str) -> Summary:
    """Counts from compute-sanitizer's summary lines (one per process it watched: summed)."""
    errors = [int(m) for m in _ERROR_SUMMARY.findall(text)]
    race = [tuple(map(int, m)) for m in _RACECHECK_SUMMARY.findall(text)]
    leaks = [int(m) for m in _LEAK_SUMMARY.findall(text)]
    if not errors and not race:
        return Summary(None)
    # racecheck may print both lines; its ERROR SUMMARY then counts the same errors again
    n_err = max(sum(errors), sum(r[1] for r in race))
    return Summary(n_err, sum(r[2] for r in race), sum(leaks))


@dataclass
class ToolRun:
    tool: str
    status: str  # "pass" | "fail"
    detail: str
    returncode: int | None
    errors: int | None
    warnings: int
    leaked_bytes: int
    launches: int | None
    seconds: float
    log: str


def child_command(sanitizer: str | None, tool: str, help_text: str, print_limit: int, json_path: str,
                  case_set: str, case_filter: str | None) -> list[str]:
    cmd = [] if tool == BASELINE else [sanitizer, *tool_options(tool, help_text, print_limit)]
    cmd += [sys.executable, "-m", "cudattn", "selfcheck", "--cases", case_set, "--json", json_path]
    if case_filter:
        cmd += ["-k", case_filter]
    return cmd


def child_env(tool: str) -> dict[str, str]:
    """memcheck's leak check would report the pinned staging chunks, kept for the process's life."""
    return {"CUDATTN_PINNED_STAGING": "0"} if tool == "memcheck" else {}


def judge(tool: str, returncode: int | None, summary: Summary, launches: int | None,
          timed_out: bool) -> tuple[str, str]:
    """(status, detail) of one child run."""
    if timed_out:
        return "fail", "timed out (killed)"
    if tool != BASELINE and summary.errors is None:
        return "fail", f"no summary line from compute-sanitizer (exit code {returncode}): see the log"
    if summary.errors:
        return "fail", f"{summary.errors} error(s) reported: see the log"
    if returncode == ERROR_EXITCODE:
        return "fail", "compute-sanitizer exited with the error exit code"
    if returncode != 0:
        return "fail", f"the selfcheck child failed (exit code {returncode}): see the log"
    if not launches:
        return "fail", "the child's JSON report is missing or counts no launch"
    warn = f", {summary.warnings} warning(s)" if summary.warnings else ""
    return "pass", f"clean{warn}"


def _run_child(cmd: list[str], log: str, timeout: float,
               env_extra: dict | None = None) -> tuple[int, bool, float, str]:
    """Run ``cmd`` with its output in ``log``: (exit code, timed out, seconds, the log's text)."""
    env_extra = {"PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env = dict(os.environ, **env_extra)
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w") as f:
        f.write("$ " + " ".join([*(f"{k}={v}" for k, v in env_extra.items()), *cmd]) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            timed_out = True
    seconds = time.perf_counter() - t0
    with open(log, errors="replace") as f:
        return rc, timed_out, seconds, f.read()


def run_tool(tool: str, sanitizer: str | None, help_text: str, log_dir: str, print_limit: int, timeout: float,
             case_set: str, case_filter: str | None) -> ToolRun:
    log = os.path.join(log_dir, f"{tool}.log")
    json_path = os.path.join(log_dir, f"{tool}.json")
    cmd = child_command(sanitizer, tool, help_text, print_limit, json_path, case_set, case_filter)
    rc, timed_out, seconds, text = _run_child(cmd, log, timeout, child_env(tool))
    summary = parse_summary(text)
    launches = None
    try:
        with open(json_path) as f:
            launches = json.load(f)["selfcheck"]["launches_total"]
    except (OSError, ValueError, KeyError):
        pass
    status, detail = judge(tool, rc, summary, launches, timed_out)
    return ToolRun(tool, status, detail, rc, summary.errors, summary.warnings, summary.leaked_bytes, launches,
                   seconds, log)


CONTROL = "memcheck-control"
# A planted bug: k and v claim 1024 times the keys their buffer holds, so the split-KV kernel
# reads up to 16 MiB past the end of a 16 KiB allocation. Zero errors from the tools prove
# something only if memcheck, as configured, sees this in a kernel cudattn loaded from NVRTC.
PLANTED_OUT_OF_BOUNDS = """
import numpy as np, cudattn
from cudattn._arrays import array as _array
from cudattn._runtime import launch as _launch
q = cudattn.to_device(np.ones((1, 1, 2, 64), np.float16))
small = cudattn.to_device(np.ones((1, 64, 2, 64), np.float16))
big = _array.DeviceArray(small.ptr, (1, 65536, 2, 64), np.float16, device_id=small.device_id, owner=small)
cudattn.attention(q, big, big, num_splits=2)
_launch.synchronize()
"""
_INVALID_READ = re.compile(r"Invalid __global__ read")


def run_control(sanitizer: str, help_text: str, log_dir: str, print_limit: int, timeout: float) -> ToolRun:
    """memcheck on `PLANTED_OUT_OF_BOUNDS`: passes when memcheck reports the invalid reads."""
    log = os.path.join(log_dir, f"{CONTROL}.log")
    opts = tool_options("memcheck", help_text, print_limit)
    rc, timed_out, seconds, text = _run_child([sanitizer, *opts, sys.executable, "-c", PLANTED_OUT_OF_BOUNDS], log,
                                              timeout)
    summary = parse_summary(text)
    seen = bool(_INVALID_READ.search(text)) and bool(summary.errors)
    detail = ("memcheck reported the planted out-of-bounds read" if seen else
              "memcheck did NOT report the planted out-of-bounds read: the zero counts above prove nothing")
    return ToolRun(CONTROL, "pass" if seen and not timed_out else "fail", detail, rc, summary.errors, summary.warnings,
                   summary.leaked_bytes, None, seconds, log)


def sanitizer_help(sanitizer: str) -> str:
    try:
        r = subprocess.run([sanitizer, "--help"], capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_all(tools: tuple[str, ...], sanitizer: str, log_dir: str, *, case_set: str = "sanitize", print_limit: int,
            timeout: float, case_filter: str | None, out=print) -> list[ToolRun]:
    """The baseline, each tool, then (with memcheck) the control; a line per run as it finishes."""
    os.makedirs(log_dir, exist_ok=True)
    help_text = sanitizer_help(sanitizer)
    runs = []
    for tool in (BASELINE, *tools):
        out(f"selfcheck --cases {case_set} under {'no tool (baseline)' if tool == BASELINE else tool} ...")
        r = run_tool(tool, sanitizer, help_text, log_dir, print_limit, timeout, case_set, case_filter)
        out(f"  {r.status.upper()}: {r.detail} ({r.seconds:.0f} s, {r.launches} launches) -> {r.log}")
        runs.append(r)
    if "memcheck" in tools:
        out("memcheck on a planted out-of-bounds read (the control) ...")
        r = run_control(sanitizer, help_text, log_dir, print_limit, timeout)
        out(f"  {r.status.upper()}: {r.detail} ({r.seconds:.0f} s) -> {r.log}")
        runs.append(r)
    return runs


def summary_table(runs: list[ToolRun], log_dir: str) -> str:
    rows = [[r.tool, r.launches, r.errors, r.warnings, r.seconds, r.status.upper(), r.detail] for r in runs]
    ok = all(r.status == "pass" for r in runs)
    return "\n".join([table(["tool", "launches checked", "errors", "warnings", "wall s", "status", "detail"], rows),
                      f"logs: {log_dir}", f"sanitize: {'PASS' if ok else 'FAIL'}"])


def as_dict(runs: list[ToolRun], log_dir: str) -> dict:
    return {"ok": all(r.status == "pass" for r in runs), "log_dir": log_dir, "runs": [asdict(r) for r in runs]}
