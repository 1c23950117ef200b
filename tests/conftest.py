"""Shared pytest setup: tests marked ``gpu`` are skipped (never faked) where no CUDA device is present."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when the CUDA driver initialises and sees at least one device (checked once)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == 0 and count > 0
    except Exception:  # no driver library, no cuda-bindings, ...
        return False


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not gpu_available():
        skip = pytest.mark.skip(reason="no CUDA device available")
        for item in gpu_items:
            item.add_marker(skip)
