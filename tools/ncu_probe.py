"""One profiled prefill call, for Nsight Compute: cudattn's or torch's cuDNN SDPA, between
cudaProfilerStart/Stop so that warm-up calls stay out of the report (needs torch for the
profiler range and the peer).

    ncu --clock-control none --profile-from-start off -k regex:flash_fwd_sm90 \\
        --section WarpStateStats --print-details all python tools/ncu_probe.py cudattn fp8 2 16 8192 128 0
    ncu --clock-control none --profile-from-start off python tools/ncu_probe.py cudnn bf16 16 16 512 128 0

Arguments: which (cudattn | cudnn), dtype (bf16 | fp8; cuDNN: bf16), B H S D, causal (0 | 1).
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import torch

import cudattn


def main(which: str, dtype: str, B: int, H: int, S: int, D: int, causal: bool) -> None:
    rt = torch.cuda.cudart()
    if which == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            rt.cudaProfilerStart()
            call()
            torch.cuda.synchronize()
            rt.cudaProfilerStop()
        return
    rng = np.random.default_rng(0)
    kw = {}
    if dtype == "fp8":
        parts = [cudattn.quantize_fp8(rng.standard_normal((B, S, H, D), dtype=np.float32)) for _ in range(3)]
        q, k, v = (cudattn.to_device(x) for x, _ in parts)
        kw = {f"{n}_descale": cudattn.to_device(d) for n, (_, d) in zip("qkv", parts)}
    else:
        q, k, v = (cudattn.to_device(rng.standard_normal((B, S, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16))
                   for _ in range(3))
    for _ in range(3):
        cudattn.attention(q, k, v, causal=causal, **kw)
    torch.cuda.synchronize()
    rt.cudaProfilerStart()
    cudattn.attention(q, k, v, causal=causal, **kw)
    torch.cuda.synchronize()
    rt.cudaProfilerStop()


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) != 7:
        raise SystemExit(__doc__)
    main(a[0], a[1], *map(int, a[2:6]), a[6] == "1")
