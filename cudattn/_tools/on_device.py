"""``--device N`` for the commands whose every part assumes device 0 (``selfcheck``, ``bench``):
the command runs again in a child process that sees only GPU N (``CUDA_VISIBLE_DEVICES``), where
it is device 0 for cudattn and for the peers alike."""

from __future__ import annotations

import os
import subprocess
import sys

#: Set in the child: the GPU it was started for, as the parent numbered it.
MARK = "CUDATTN_ON_DEVICE"


def strip_device(argv: list[str]) -> list[str]:
    """``argv`` without ``--device N`` / ``--device=N``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--device":
            skip = True
        elif not a.startswith("--device="):
            out.append(a)
    return out


def visible_id(n: int) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` must say for the child to see this process's GPU ``n`` alone."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is None or not seen.strip():
        return str(n)
    ids = [x.strip() for x in seen.split(",") if x.strip()]
    if n >= len(ids):
        raise ValueError(f"--device {n}: CUDA_VISIBLE_DEVICES={seen!r} shows {len(ids)} GPU(s)")
    return ids[n]


def rerun(n: int, argv: list[str], gpu_count: int) -> int | None:
    """Run ``python -m cudattn argv`` on GPU ``n`` alone and return its exit status; None when this
    process already is that run, or ``n`` is 0 with no narrowing needed (then the caller goes on)."""
    if os.environ.get(MARK) is not None or n == 0:
        return None
    if n >= gpu_count:
        print(f"--device {n}: this machine has {gpu_count} GPU(s)", file=sys.stderr)
        return 2
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible_id(n), **{MARK: str(n)})
    print(f"(on GPU {n}: running again with CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})", flush=True)
    return subprocess.run([sys.executable, "-m", "cudattn", *strip_device(argv)], env=env).returncode
