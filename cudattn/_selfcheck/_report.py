"""Text tables for the terminal and the JSON report file."""

from __future__ import annotations

import json
import math
import platform
import sys


def table(headers: list[str], rows: list[list]) -> str:
    """A plain aligned table: numbers right-aligned, text left-aligned."""
    cells = [[_fmt(x) for x in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) and bool(rows) for i in range(len(headers))]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 or x == 0 else f"{x:.3g}"
    return "-" if x is None else str(x)


def json_safe(x):
    """JSON without NaN/Infinity (not JSON): non-finite floats become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def environment() -> dict:
    """What ran: versions, and the GPU when there is one (never raises)."""
    import cudattn

    env = {"cudattn": cudattn.__version__, "python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import nvrtc_cache

        env["nvrtc"] = ".".join(map(str, nvrtc_cache.nvrtc_version()))
        from cudattn._runtime import device as _device

        p = _device.device_properties(0)
        env["gpu"] = {"name": p.name, "arch": p.arch, "sm_count": p.sm_count}
    except Exception as e:  # no GPU or no driver: the report still says what ran
        env["gpu_error"] = f"{type(e).__name__}: {e}"
    return env


def write_json(path: str, report: dict) -> None:
    with open(path, "w") as f:
        json.dump(json_safe(report), f, indent=1, sort_keys=False)
        f.write("\n")
