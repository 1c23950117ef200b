"""The environment a benchmark ran in, written with its numbers (`--json`)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import pathlib
import platform
import subprocess

from cuda.bindings import driver

from .. import __version__
from .._calls import warm as _warm
from .._runtime import device as _device


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _attr(dev, name: str):
    """A device attribute by enum name, or None where this driver binding lacks it."""
    attr = getattr(driver.CUdevice_attribute, name, None)
    if attr is None:
        return None
    err, value = driver.cuDeviceGetAttribute(attr, dev)
    return int(value) if err == driver.CUresult.CUDA_SUCCESS else None


def _clocks(device_id: int) -> dict:
    """Current and maximum SM / memory clocks in MHz from NVML when present, else the driver's
    (deprecated) rated clocks."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            hnd = pynvml.nvmlDeviceGetHandleByIndex(device_id)
            return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(hnd, pynvml.NVML_CLOCK_SM),
                    "sm_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(hnd, pynvml.NVML_CLOCK_SM),
                    "mem_mhz": pynvml.nvmlDeviceGetClockInfo(hnd, pynvml.NVML_CLOCK_MEM),
                    "mem_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(hnd, pynvml.NVML_CLOCK_MEM),
                    "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(hnd) / 1000.0, "source": "nvml"}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        err, dev = driver.cuDeviceGet(device_id)
        sm = _attr(dev, "CU_DEVICE_ATTRIBUTE_CLOCK_RATE")
        mem = _attr(dev, "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE")
        return {"sm_max_mhz": sm and sm // 1000, "mem_max_mhz": mem and mem // 1000, "source": "driver"}


def git_commit(root: pathlib.Path | None = None) -> str | None:
    """$CUDATTN_GIT_COMMIT, else HEAD of the checkout cudattn was imported from (with "-dirty" when
    tracked files differ from it: the numbers are then not HEAD's), else None."""
    env = os.environ.get("CUDATTN_GIT_COMMIT")
    if env:
        return env
    root = root or pathlib.Path(__file__).resolve().parents[2]

    def git(*args):
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return res.stdout.strip() if res.returncode == 0 else None

    try:
        head = git("rev-parse", "HEAD")
        if not head:
            return None
        return head + "-dirty" if git("status", "--porcelain", "--untracked-files=no") else head
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device_id: int, peers=None) -> dict:
    import nvrtc_cache

    p = _device.device_properties(device_id)
    err, drv = driver.cuDriverGetVersion()
    err2, dev = driver.cuDeviceGet(device_id)
    err3, total = driver.cuDeviceTotalMem(dev)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": p.name, "arch": p.arch, "sm_count": p.sm_count, "l2_bytes": p.l2_cache_size,
        "memory_bytes": int(total), "clocks": _clocks(device_id),
        "driver_cuda": f"{drv // 1000}.{drv % 1000 // 10}",
        "nvrtc": ".".join(map(str, nvrtc_cache.nvrtc_version())),
        "cudattn": __version__, "git_commit": git_commit(),
        "cuda_bindings": _dist_version("cuda-bindings"), "cuda_core": _dist_version("cuda-core"),
        "numpy": _dist_version("numpy"), "ml_dtypes": _dist_version("ml_dtypes"),
        "python": platform.python_version(), "host": platform.node(),
        "peers": peers.version() if peers is not None else None,
        "compiled_warm_path": _warm.available(),
    }
