"""Packed variable-length batches and chunked prefill against their peers (needs a GPU and torch).

    python tools/bench_varlen.py --json docs/varlen.json

Varlen rows: the packed call against the same sequences padded to the longest (cudattn and torch
SDPA's cuDNN backend) and torch's own varlen_attn where this torch has it; TFLOP/s count only the
sequences' own work (no padding). Chunked rows: Sq new tokens against L cached keys (bottom-right
causal), the cache contiguous or paged, against the dense prefill of the same shape. Times are
CUDA events on torch's current stream: GPU time = the median of 10-call back-to-back batches
(host hidden except the first launch), as called = one call on an idle stream; candidates of a
row are interleaved round by round so that clock drift hits them alike. Host µs per call are
wall-clock times of queued calls on a small shape (the GPU never the bottleneck).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

try:
    import torch

    import cudattn

    DEV = torch.device("cuda")
except ImportError:  # --markdown-from needs neither
    torch = cudattn = DEV = None


def _batch_ms(fn, n):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


def interleaved(fns: dict, n=10, rounds=9) -> dict:
    """Per candidate: (GPU ms per call back to back, ms as called), medians over rounds."""
    for f in fns.values():
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    gpu, called = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            gpu[k].append(_batch_ms(f, n))
            torch.cuda.synchronize()
            called[k].append(_batch_ms(f, 1))
    return {k: (statistics.median(gpu[k]), statistics.median(called[k])) for k in fns}


def causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs bottom-right causal keeps: row i sees min(sk, max(0, i + sk - sq + 1)) keys."""
    return sq * (sk - sq + 1) + sq * (sq - 1) // 2 if sk >= sq else sk * (sk + 1) // 2


def varlen_row(name, lens, H, Hkv, D, causal):
    lens = [int(x) for x in lens]
    B, S, total = len(lens), max(lens), sum(lens)
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32, device=DEV)
    q = torch.randn(total, H, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(total, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    qp = torch.zeros(B, S, H, D, device=DEV, dtype=q.dtype)
    kp = torch.zeros(B, S, Hkv, D, device=DEV, dtype=q.dtype)
    vp = torch.zeros_like(kp)
    for b in range(B):
        s0, s1 = int(cu[b]), int(cu[b + 1])
        qp[b, :s1 - s0], kp[b, :s1 - s0], vp[b, :s1 - s0] = q[s0:s1], k[s0:s1], v[s0:s1]
    fns = {"varlen": lambda: cudattn.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S,
                                               max_seqlen_k=S, causal=causal),
           "padded": lambda: cudattn.attention(qp, kp, vp, causal=causal)}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (qp, kp, vp))
    if Hkv != H:
        kt, vt = kt.repeat_interleave(H // Hkv, 1), vt.repeat_interleave(H // Hkv, 1)

    def cudnn_padded():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    fns["cudnn_padded"] = cudnn_padded
    note = ""
    try:
        from torch.nn.attention.varlen import varlen_attn

        kk = k if Hkv == H else k.repeat_interleave(H // Hkv, 1)
        vv = v if Hkv == H else v.repeat_interleave(H // Hkv, 1)
        fns["torch_varlen"] = lambda: varlen_attn(q, kk, vv, cu, cu, S, S, window_size=(-1, 0) if causal else (-1, -1))
        diff = (fns["torch_varlen"]().float() - torch.as_tensor(fns["varlen"]()).float()).abs().max().item()
        note = f"torch varlen_attn max |diff| {diff:.2g}"
    except (ImportError, RuntimeError, TypeError) as e:
        note = f"torch varlen_attn unavailable: {str(e)[:80]}"
    t = interleaved(fns)
    useful = 4.0 * H * D * sum(causal_pairs(s, s) if causal else s * s for s in lens)
    row = {"kind": "varlen", "case": name, "lens": lens if B <= 16 else f"{B} sequences", "H": H, "Hkv": Hkv,
           "D": D, "causal": causal, "note": note}
    for c, (g, a) in t.items():
        row[f"{c}_gpu_ms"], row[f"{c}_called_ms"] = g, a
        row[f"{c}_useful_tflops"] = useful / g / 1e9
    for c in t:
        if c != "varlen":
            row[f"varlen_vs_{c}_gpu"] = t[c][0] / t["varlen"][0]
            row[f"varlen_vs_{c}_called"] = t[c][1] / t["varlen"][1]
    return row


def chunked_row(B, Sq, L, H, Hkv, D):
    q = torch.randn(B, Sq, H, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, L, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((B,), L, dtype=torch.int32, device=DEV)
    fns = {"dense": lambda: cudattn.attention(q, k, v, causal=True),
           "contiguous": lambda: cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)}
    for page in (16, 256):
        per = L // page
        table = torch.randperm(B * per, device=DEV).view(B, per).to(torch.int32)
        kp = torch.empty(B * per, page, Hkv, D, device=DEV, dtype=k.dtype)
        vp = torch.empty_like(kp)
        kp[table.view(-1).long()] = k.reshape(-1, page, Hkv, D)
        vp[table.view(-1).long()] = v.reshape(-1, page, Hkv, D)
        fns[f"paged{page}"] = (lambda kp=kp, vp=vp, table=table: cudattn.attention_with_kvcache(
            q, kp, vp, cache_seqlens=lens, block_table=table, causal=True))
    ref = torch.as_tensor(fns["dense"]()).float()
    for c in ("contiguous", "paged16", "paged256"):
        err = (torch.as_tensor(fns[c]()).float() - ref).abs().max().item()
        assert err < 2e-2, (c, err)  # the same keys in another layout: equal up to rounding
    t = interleaved(fns, n=5, rounds=7)
    flops = 4.0 * B * H * D * causal_pairs(Sq, L)
    row = {"kind": "chunked", "B": B, "Sq": Sq, "L": L, "H": H, "Hkv": Hkv, "D": D}
    for c, (g, a) in t.items():
        row[f"{c}_gpu_ms"], row[f"{c}_called_ms"], row[f"{c}_tflops"] = g, a, flops / g / 1e9
        row[f"{c}_vs_dense_gpu"] = t["dense"][0] / g
    return row


def host_us():
    """Wall-clock µs per queued call, small shape, by operand kind (torch tensors, DeviceArrays)."""
    out = {}
    cu_t = torch.tensor([0, 128, 256], dtype=torch.int32, device=DEV)
    q_t = torch.randn(256, 8, 64, device=DEV, dtype=torch.float16)
    q4 = q_t.view(2, 128, 8, 64)
    cases = {"varlen torch": lambda: cudattn.attention(q_t, q_t, q_t, cu_seqlens_q=cu_t, cu_seqlens_k=cu_t,
                                                       max_seqlen_q=128, max_seqlen_k=128),
             "padded torch": lambda: cudattn.attention(q4, q4, q4)}
    qd = cudattn.to_device(q_t.cpu().numpy())
    cud = cudattn.to_device(np.array([0, 128, 256], np.int32))
    outd = cudattn.to_device(np.zeros((256, 8, 64), np.float16))
    cases["varlen DeviceArray out="] = lambda: cudattn.attention(qd, qd, qd, cu_seqlens_q=cud, cu_seqlens_k=cud,
                                                                 max_seqlen_q=128, max_seqlen_k=128, out=outd)
    qd4, outd4 = cudattn.to_device(q4.cpu().numpy()), cudattn.to_device(np.zeros((2, 128, 8, 64), np.float16))
    cases["padded DeviceArray out="] = lambda: cudattn.attention(qd4, qd4, qd4, out=outd4)
    for name, f in cases.items():
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            ts.append((time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        out[name] = statistics.median(ts)
    return out


def markdown(data: dict) -> str:
    """The tables of docs/VARLEN.md from the JSON this tool writes."""
    env = data["env"]
    out = [f"Measured on one {env['gpu']} (torch {env['torch']} for the peers), bfloat16, 16 query heads; "
           "ratios are cudattn's speed over the peer's (above 1: cudattn is faster), back to back / as called.", "",
           "| lengths | H/Hkv, D | causal | cudattn varlen TFLOP/s | padded (cudattn) | cuDNN padded | "
           "torch varlen_attn | vs padded | vs cuDNN padded | vs torch varlen_attn |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if r["kind"] != "varlen":
            continue
        tv = r.get("torch_varlen_useful_tflops")
        vs_tv = (f"{r['varlen_vs_torch_varlen_gpu']:.2f} / {r['varlen_vs_torch_varlen_called']:.2f}"
                 if tv else "n/a")
        out.append(f"| {r['case']} | {r['H']}/{r['Hkv']}, {r['D']} | {'yes' if r['causal'] else 'no'} | "
                   f"{r['varlen_useful_tflops']:.0f} | {r['padded_useful_tflops']:.0f} | "
                   f"{r['cudnn_padded_useful_tflops']:.0f} | {tv:.0f} | " if tv else
                   f"| {r['case']} | {r['H']}/{r['Hkv']}, {r['D']} | {'yes' if r['causal'] else 'no'} | "
                   f"{r['varlen_useful_tflops']:.0f} | {r['padded_useful_tflops']:.0f} | "
                   f"{r['cudnn_padded_useful_tflops']:.0f} | n/a | ")
        out[-1] += (f"{r['varlen_vs_padded_gpu']:.2f} / {r['varlen_vs_padded_called']:.2f} | "
                    f"{r['varlen_vs_cudnn_padded_gpu']:.2f} / {r['varlen_vs_cudnn_padded_called']:.2f} | {vs_tv} |")
    out += ["", "| B, Sq new, L cached, Hq/Hkv, D | dense prefill TFLOP/s | contiguous cache | paged 16 | "
            "paged 256 |", "|---|---|---|---|---|"]
    for r in data["rows"]:
        if r["kind"] != "chunked":
            continue
        cells = [f"{r[c + '_tflops']:.0f} ({r[c + '_vs_dense_gpu']:.2f}x)" for c in ("contiguous", "paged16",
                                                                                      "paged256")]
        out.append(f"| {r['B']}, {r['Sq']}, {r['L']}, {r['H']}/{r['Hkv']}, {r['D']} | {r['dense_tflops']:.0f} | "
                   + " | ".join(cells) + " |")
    h = data.get("host_us", {})
    if h:
        out += ["", "Host µs per warm call (2 sequences of 128, 8 heads, D = 64): " +
                ", ".join(f"{k} {v:.1f}" for k, v in h.items()) + "."]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--markdown-from", metavar="JSON", help="print the tables of a JSON this tool wrote; no GPU")
    args = ap.parse_args()
    if args.markdown_from:
        with open(args.markdown_from) as f:
            print(markdown(json.load(f)), end="")
        return
    torch.manual_seed(0)
    rows = []
    rng = np.random.default_rng(1)
    mixed = [128, 256, 512, 1024, 2048, 4096, 6144, 8192]
    for causal in (False, True):
        for name, lens, Hkv, D in (("equal 8x2048", [2048] * 8, 16, 128), ("equal 4x4096", [4096] * 4, 16, 128),
                                   ("mixed 128..8192", mixed, 16, 128), ("mixed 128..8192 D64", mixed, 16, 64),
                                   ("32 x U(64, 4096) GQA", rng.integers(64, 4096, 32), 4, 128)):
            rows.append(varlen_row(name, lens, 16, Hkv, D, causal))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    for shape in ((1, 2048, 16384, 32, 8, 128), (4, 2048, 16384, 32, 8, 128), (8, 512, 4096, 32, 8, 128),
                  (2, 2048, 16384, 16, 16, 128), (4, 1024, 8192, 32, 8, 64)):
        rows.append(chunked_row(*shape))
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    host = host_us()
    print(json.dumps(host))
    if args.json:
        env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudattn": cudattn.__version__}
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows, "host_us": host}, f, indent=1)


if __name__ == "__main__":
    main()
