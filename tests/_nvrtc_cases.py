"""Shared pieces of the nvrtc_cache tests (test_nvrtc_cache*.py): a kernel source with a header,
a private cache (and default cache) directory per test, and a compile shortcut.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrtc_cache import Cache

ELF_MAGIC = b"\x7fELF"

HEADERS = {"scale.cuh": "#pragma once\n#define SCALE 2.0f\n"}
SOURCE = r"""
#include <cuda_fp16.h>
#include "scale.cuh"

extern "C" __global__ void scale_half(__half* x, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? __half2float(x[i]) * SCALE : 0.f;
    __syncthreads();
    if (i < n) x[i] = __float2half(tile[blockDim.x - 1 - threadIdx.x]);
}

template <int N>
__global__ void add_n(float* x) { x[threadIdx.x] += N; }
"""
BASE = dict(
    source=SOURCE, name="kernel.cu", headers=HEADERS, options=["-DA=1", "-DB=2"], arch="sm_80"
)


@pytest.fixture(autouse=True)
def _private_default_dir(tmp_path, monkeypatch):
    # No test may touch the real ~/.cache, even through default_cache().
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture
def cache(tmp_path):
    return Cache(tmp_path / "cache")


def _compile(cache, **overrides):
    kwargs = {**BASE, **overrides}
    return cache.compile(kwargs.pop("source"), **kwargs)


def _files(directory):
    return sorted(p.name for p in Path(directory).iterdir())
