"""Host time of one warm attention_with_kvcache call with the extras (FP8 caches and their descales,
softcap, sinks, a window) beside a plain call and torch SDPA, torch tensors on the current stream.
The cache is tiny, so the calls are bound by the host: wall clock of 500 calls without a sync, median
of 5 batches; then a cProfile of the FP8 calls (contiguous and paged).

    PYTHONPATH=. python tools/host_kvcache_extras.py      (needs torch with CUDA)
"""

import cProfile
import pstats
import time

import torch

import cudattn

dev = "cuda"
B, L, Hq, Hkv, D = 2, 256, 8, 2, 128
q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
k, v = (torch.randn(B, L, Hkv, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
k8, v8 = (x.float().div(0.05).clamp(-448, 448).to(torch.float8_e4m3fn) for x in (k, v))
lens = torch.full((B,), L - 1, dtype=torch.int32, device=dev)
dk = torch.full((B, Hkv), 0.05, device=dev)
sinks = torch.randn(Hq, device=dev)
out = torch.empty_like(q)
P = 16  # a paged copy of the caches: pages of 16 keys in order
bt = torch.arange(B * L // P, device=dev, dtype=torch.int32).reshape(B, L // P)
kp, vp, kp8, vp8 = (x.reshape(B * L // P, P, Hkv, D) for x in (k, v, k8, v8))
qh, kh, vh = q.transpose(1, 2), k.repeat_interleave(Hq // Hkv, 2).transpose(1, 2), v.repeat_interleave(Hq // Hkv, 2).transpose(1, 2)
cases = {
    "bf16 cache": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens),
    "bf16 cache, out=": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, out=out),
    "fp8 cache, scalar descales": lambda: cudattn.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_descale=0.05, v_descale=0.05),
    "fp8 cache, (B, Hkv) descales": lambda: cudattn.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_descale=dk, v_descale=dk),
    "bf16 paged cache": lambda: cudattn.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=bt),
    "fp8 paged cache, scalar descales": lambda: cudattn.attention_with_kvcache(q, kp8, vp8, cache_seqlens=lens, block_table=bt, k_descale=0.05, v_descale=0.05),
    "bf16 cache, softcap + sinks": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, softcap=30.0, sinks=sinks),
    "bf16 cache, window 128": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, window_size=(128, 0)),
    "torch SDPA (expanded GQA)": lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh),
}
for name, fn in cases.items():
    for _ in range(200): fn()
    torch.cuda.synchronize()
    res = []
    for rep in range(5):
        t0 = time.perf_counter()
        for i in range(500):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res.append((t1 - t0) / 500 * 1e6)
    res.sort()
    print(f"{name:32s} host us/call median {res[2]:.1f} (min {res[0]:.1f})", flush=True)
for name in ("fp8 cache, scalar descales", "fp8 paged cache, scalar descales"):
    fn = cases[name]
    pr = cProfile.Profile(); pr.enable()
    for i in range(2000):
        fn()
        if i % 200 == 199: torch.cuda.synchronize()
    pr.disable()
    print(f"===== {name}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
