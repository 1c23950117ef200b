"""Score modifiers (softcap, sinks, ALiBi), sliding windows, decode with them, and FP8 KV caches,
against the plain kernel and torch's SDPA backends (needs a GPU and torch).

    python tools/bench_modifiers.py --json docs/modifiers.json

Times (CUDA events on torch's current stream), candidates of a row interleaved round by round:
GPU = medians of calls queued behind a spin kernel (host hidden; cudattn.bench.timing); as
called = one call on an idle stream, and back to back = 10-call batches with no sync
(bench_varlen.interleaved). Modifier rows report each modifier's cost as plain / modified time.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import cudattn
from bench_varlen import causal_pairs, interleaved
from cudattn.bench import timing

DEV = torch.device("cuda")


def gpu_ms(fns: dict, rounds: int = 5) -> dict:
    """Per candidate: the median over rounds of the spin-covered median per call."""
    stream = torch.cuda.current_stream().cuda_stream
    dev = torch.cuda.current_device()
    out = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            out[k].append(timing.gpu_time(lambda i, f=f: f(), stream, dev, iters=20, warmup=2).median_ms)
    return {k: statistics.median(v) for k, v in out.items()}


def _sdpa(backend, qt, kt, vt, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def f():
        with sdpa_kernel([b]):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return f


def rows_of(fns, base, flops, extra):
    g, ab = gpu_ms(fns), interleaved(fns)
    row = dict(extra)
    for c in fns:
        row[f"{c}_gpu_ms"], row[f"{c}_b2b_ms"], row[f"{c}_called_ms"] = g[c], ab[c][0], ab[c][1]
        row[f"{c}_tflops"] = flops / g[c] / 1e9
        if c != base:
            row[f"{base}_over_{c}_gpu"] = g[base] / g[c]
            row[f"{base}_over_{c}_called"] = ab[base][1] / ab[c][1]
    return row


def modifier_row(B, S, H, D, causal):
    q, k, v = (torch.randn(B, S, H, D, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    sinks = torch.randn(H, device=DEV, dtype=torch.float32)
    slopes = 2.0 ** -torch.linspace(1, 8, H, device=DEV, dtype=torch.float32)
    fns = {"plain": lambda: cudattn.attention(q, k, v, causal=causal),
           "softcap": lambda: cudattn.attention(q, k, v, causal=causal, softcap=30.0),
           "sinks": lambda: cudattn.attention(q, k, v, causal=causal, sinks=sinks),
           "softcap_sinks": lambda: cudattn.attention(q, k, v, causal=causal, softcap=30.0, sinks=sinks),
           "alibi": lambda: cudattn.attention(q, k, v, causal=causal, alibi_slopes=slopes)}
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fns["cudnn"] = _sdpa("cudnn", qt, kt, vt, causal)
    fns["flash"] = _sdpa("flash", qt, kt, vt, causal)
    flops = 4.0 * B * H * D * (causal_pairs(S, S) if causal else S * S)
    return rows_of(fns, "plain", flops, {"kind": "modifiers", "B": B, "S": S, "H": H, "D": D, "causal": causal})


def window_row(B, S, H, D, W):
    q, k, v = (torch.randn(B, S, H, D, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    kd, vd = k[:, :W + 1].contiguous(), v[:, :W + 1].contiguous()
    fns = {"window": lambda: cudattn.attention(q, k, v, causal=True, window_size=(W, 0)),
           "dense": lambda: cudattn.attention(q, kd, vd)}
    note = ""
    try:  # torch's own sliding window: flex_attention with a block mask (compiled Triton)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= W), None, None, S, S, device=DEV)
        flex = torch.compile(flex_attention)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        fns["flex"] = lambda: flex(qt, kt, vt, block_mask=mask)
        ref = fns["flex"]().transpose(1, 2).float()
        note = f"flex max |diff| {(ref - torch.as_tensor(fns['window']()).float()).abs().max().item():.2g}"
    except Exception as e:  # noqa: BLE001 (any failure: the row says so)
        note = f"flex_attention unavailable: {type(e).__name__}: {str(e)[:80]}"
    row = {"kind": "window", "B": B, "S": S, "H": H, "D": D, "W": W, "note": note}
    g, ab = _time_window(fns, row, B, S, H, D, W)
    if "flex" in fns:
        row["window_over_flex_gpu"] = g["flex"] / g["window"]
        row["window_over_flex_called"] = ab["flex"][1] / ab["window"][1]
    return row


def _fp8(*shape):
    return (torch.randn(*shape, device=DEV) * 8).to(torch.float8_e4m3fn)


def fp8_modifier_row(B, S, H, D, causal):
    """FP8 inputs (scalar descales): each modifier's cost over the plain FP8 call."""
    q, k, v = (_fp8(B, S, H, D) for _ in range(3))
    ds = dict(q_descale=0.125, k_descale=0.125, v_descale=0.125)
    sinks = torch.randn(H, device=DEV, dtype=torch.float32)
    slopes = 2.0 ** -torch.linspace(1, 8, H, device=DEV, dtype=torch.float32)
    fns = {"plain": lambda: cudattn.attention(q, k, v, causal=causal, **ds),
           "softcap": lambda: cudattn.attention(q, k, v, causal=causal, softcap=30.0, **ds),
           "sinks": lambda: cudattn.attention(q, k, v, causal=causal, sinks=sinks, **ds),
           "alibi": lambda: cudattn.attention(q, k, v, causal=causal, alibi_slopes=slopes, **ds)}
    flops = 4.0 * B * H * D * (causal_pairs(S, S) if causal else S * S)
    return rows_of(fns, "plain", flops, {"kind": "fp8_modifiers", "B": B, "S": S, "H": H, "D": D, "causal": causal})


def fp8_window_row(B, S, H, D, W):
    """FP8 inputs: a causal window of W keys against a dense call over W + 1 keys (TFLOP/s of the
    pairs each one computes)."""
    q, k, v = (_fp8(B, S, H, D) for _ in range(3))
    kd, vd = k[:, :W + 1].contiguous(), v[:, :W + 1].contiguous()
    ds = dict(q_descale=0.125, k_descale=0.125, v_descale=0.125)
    fns = {"window": lambda: cudattn.attention(q, k, v, causal=True, window_size=(W, 0), **ds),
           "dense": lambda: cudattn.attention(q, kd, vd, **ds)}
    row = {"kind": "fp8_window", "B": B, "S": S, "H": H, "D": D, "W": W}
    _time_window(fns, row, B, S, H, D, W)
    return row


def _time_window(fns, row, B, S, H, D, W):
    """Times a window row's candidates into ``row`` (GPU, back to back, as called), TFLOP/s of the
    pairs each computes: the dense call's S x (W + 1), the others' the causal window's. Returns
    (GPU ms, (back to back, as called) ms) by candidate."""
    g, ab = gpu_ms(fns), interleaved(fns)
    kept = 4.0 * B * H * D * sum(min(i + 1, W + 1) for i in range(S))
    for c in fns:
        work = 4.0 * B * H * D * S * (W + 1) if c == "dense" else kept
        row[f"{c}_gpu_ms"], row[f"{c}_b2b_ms"], row[f"{c}_called_ms"] = g[c], ab[c][0], ab[c][1]
        row[f"{c}_tflops"] = work / g[c] / 1e9
    row["window_vs_dense_tflops"] = row["window_tflops"] / row["dense_tflops"]
    return g, ab


def decode_row(B, L, Hq, Hkv, D):
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(B, L, Hkv, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((B,), L, dtype=torch.int32, device=DEV)
    sinks = torch.randn(Hq, device=DEV, dtype=torch.float32)
    slopes = 2.0 ** -torch.linspace(1, 8, Hq, device=DEV, dtype=torch.float32)
    kv = lambda **kw: (lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, **kw))  # noqa
    fns = {"plain": kv(), "softcap_sinks": kv(softcap=30.0, sinks=sinks), "alibi": kv(alibi_slopes=slopes),
           "window1024": kv(window_size=(1023, 0))}
    qt = q.transpose(1, 2)
    kt, vt = (x.transpose(1, 2).repeat_interleave(Hq // Hkv, 1) for x in (k, v))
    fns["flash"] = _sdpa("flash", qt, kt, vt, False)
    row = rows_of(fns, "plain", 0.0, {"kind": "decode", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D})
    nbytes = 2 * B * L * Hkv * D * 2
    for c in fns:
        keys = min(L, 1024) if c == "window1024" else L
        row[f"{c}_tbps"] = nbytes * keys / L / row[f"{c}_gpu_ms"] / 1e9
        row.pop(f"{c}_tflops")
    return row


def copy_tbps() -> float:
    """The device's copy bandwidth (read + write bytes), a 2 GiB device-to-device copy."""
    x = torch.empty(2**30, device=DEV, dtype=torch.float16)
    y = torch.empty_like(x)
    ms = gpu_ms({"copy": lambda: y.copy_(x)})["copy"]
    return 2 * x.numel() * 2 / ms / 1e9


def fp8_cache_row(B, L, Hq, Hkv, D, copy, page=None):
    """Decode (one token) against a 16-bit and an FP8 cache of the same keys: tokens/s and TB/s.
    ``page``: a paged cache of that page size, its pages in a random order."""
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(B, L, Hkv, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    k8, v8 = (x.float().div(0.05).clamp(-448, 448).to(torch.float8_e4m3fn) for x in (k, v))
    lens = torch.full((B,), L, dtype=torch.int32, device=DEV)
    kw = {}
    if page:  # logical page i of the flattened sequences lives at physical page perm[i]
        n = B * L // page
        perm = torch.randperm(n, device=DEV)
        kw["block_table"] = perm.to(torch.int32).reshape(B, L // page)
        inv = torch.argsort(perm)  # physical page j holds logical page inv[j]
        k, v, k8, v8 = (x.reshape(n, page, Hkv, D)[inv].contiguous() for x in (k, v, k8, v8))
    fns = {"bf16_cache": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, **kw),
           "fp8_cache": lambda: cudattn.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_descale=0.05,
                                                               v_descale=0.05, **kw)}
    row = rows_of(fns, "bf16_cache", 0.0, {"kind": "fp8_cache", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D,
                                           "page": page, "copy_tbps": copy})
    for c, eb in (("bf16_cache", 2), ("fp8_cache", 1)):
        row.pop(f"{c}_tflops")
        row[f"{c}_tbps"] = 2 * B * L * Hkv * D * eb / row[f"{c}_gpu_ms"] / 1e9
        row[f"{c}_of_copy"] = row[f"{c}_tbps"] / copy
        row[f"{c}_tokens_per_s"] = B / (row[f"{c}_gpu_ms"] / 1e3)
    row["fp8_over_bf16_tokens"] = row["bf16_cache_gpu_ms"] / row["fp8_cache_gpu_ms"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["decode", "fp8"],
                    help="only the decode rows (modifiers and FP8 caches), or only the FP8-input rows")
    a = ap.parse_args()
    rows = []
    if a.only:
        (_decode_rows if a.only == "decode" else _fp8_rows)(rows)
        _write(a.json, rows)
        return
    for causal in (False, True):
        rows.append(modifier_row(4, 4096, 16, 128, causal))
        print(json.dumps(rows[-1]), flush=True)
    if not a.quick:
        rows.append(modifier_row(4, 4096, 16, 64, True))
        print(json.dumps(rows[-1]), flush=True)
    for shape in ((4, 4096, 16, 128, 512), (2, 8192, 16, 128, 512)):
        rows.append(window_row(*shape))
        print(json.dumps(rows[-1]), flush=True)
    _fp8_rows(rows)
    _decode_rows(rows)
    _write(a.json, rows)


def _fp8_rows(rows: list) -> None:
    for causal in (False, True):
        rows.append(fp8_modifier_row(4, 4096, 16, 128, causal))
        print(json.dumps(rows[-1]), flush=True)
    rows.append(fp8_window_row(4, 4096, 16, 128, 512))
    print(json.dumps(rows[-1]), flush=True)


def _decode_rows(rows: list) -> None:
    rows.append(decode_row(8, 8192, 32, 8, 128))
    print(json.dumps(rows[-1]), flush=True)
    copy = copy_tbps()
    for shape in ((8, 8192, 32, 8, 128), (1, 131072, 32, 8, 128), (64, 2048, 32, 8, 128), (16, 16384, 64, 8, 64)):
        rows.append(fp8_cache_row(*shape, copy))
        print(json.dumps(rows[-1]), flush=True)
    for page in (16, 256):
        rows.append(fp8_cache_row(8, 8192, 32, 8, 128, copy, page))
        print(json.dumps(rows[-1]), flush=True)


def _write(path, rows) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
