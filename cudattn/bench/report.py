"""A run's results as a text table (streamed row by row), Markdown (docs/PERFORMANCE.md) and JSON."""

from __future__ import annotations

import json
import math

from .ascalled import BATCH, ROUNDS, SETTLE_MS
from .grids import BACKWARD_OPS, OVERHEAD_SEQLENS
from .overhead import CALLS, MIN_CALLS, REPEATS
from .peers import BACKENDS

PEER_TITLE = {"cudnn": "cuDNN", "flash": "flash"}
# The row fields holding peer ms / cudattn ms (above 1: cudattn is faster), one per way of timing.
RATIOS = (("ratio", "GPU time"), ("ratio_as_called", "as called"), ("ratio_back_to_back", "back to back"))
# Row kinds in the order reported, with the name of each one's section.
KINDS = {"prefill": "Prefill", "decode": "Decode", "backward": "Backward", "backward det": "Backward, deterministic",
         "train step": "Training step"}
_SECTION = {"prefill": "Prefill (TFLOP/s; FLOPs = 4·B·H·Sq·Sk·D, halved for causal)",
            "decode": "Decode (TB/s of q, k, v and out bytes)",
            "backward": "Backward (TFLOP/s; FLOPs = 2.5 × the forward's)",
            "backward det": "Backward, deterministic (TFLOP/s; FLOPs = 2.5 × the forward's)",
            "train step": "Training step: forward and backward (TFLOP/s; FLOPs = 3.5 × the forward's)"}


def _unit(kind: str) -> tuple[str, str]:
    return ("tbps", "TB/s") if kind == "decode" else ("tflops", "TFLOP/s")


def _f(x, fmt: str = "8.1f") -> str:
    return f"{x:{fmt}}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _check_text(chk: dict) -> str:
    state = "ok" if chk["ok"] else "FAIL"
    return f"{state} {chk['max_err']:.1e}<={chk['bound']:.1e}"


def header(peers: bool) -> str:
    """Columns of `row_line`: GPU ms (p90), speed, % of ceiling, as-called and back-to-back ms; per peer its
    speed and the GPU-time and as-called ratios (peer ms / cudattn ms)."""
    cols = (f"{'kind':12} {'dtype':8} {'shape BxHxSxD':22} {'causal':6} | {'ms':>8} {'p90':>8} {'speed':>8} {'%ceil':>5} "
            f"{'called':>8} {'b2b':>8}")
    if peers:
        cols += "".join(f" | {PEER_TITLE[b]:>8} {'ratio':>6} {'called':>6}" for b in BACKENDS)
    return cols + " | check (max err <= bound)"


def row_line(row: dict, peers: bool) -> str:
    c = row["case"]
    key, unit = _unit(c["kind"])
    ours = row["impls"]["cudattn"]
    line = (f"{c['kind']:12} {c['dtype']:8} {row['label']:22} {str(c['causal']):6} | {ours['median_ms']:8.3f} "
            f"{ours['p90_ms']:8.3f} {_f(ours[key], '8.2f' if unit == 'TB/s' else '8.1f')} "
            f"{_f(ours.get('pct_of_ceiling'), '4.0f'):>4}% {_f(ours.get('as_called_ms'), '8.3f')} "
            f"{_f(ours.get('back_to_back_ms'), '8.3f')}")
    if peers:
        for b in BACKENDS:
            p = row["impls"].get(b, {})
            if "error" in p:
                line += f" | {'n/a':>8} {'-':>6} {'-':>6}"
            else:
                line += (f" | {_f(p.get(key), '8.2f' if unit == 'TB/s' else '8.1f')} {row['ratio'][b]:5.2f}x "
                         f"{_f(row.get('ratio_as_called', {}).get(b), '5.2f')}x")
    return line + " | " + _check_text(row["check"])


def host_header() -> str:
    return (f"{'dtype':8} {'shape BxHxSxD':22} {'causal':6} {'memory':8} | {'ms':>8} {'p90':>8} {'GB/s':>7} | "
            f"{'floor ms':>8} {'of floor':>8} | check")


def host_line(r: dict) -> str:
    c = r["case"]
    return (f"{c['dtype']:8} {r['label']:22} {str(c['causal']):6} {r.get('memory', 'pageable'):8} | "
            f"{r['median_ms']:8.2f} {r['p90_ms']:8.2f} "
            f"{r['gbps']:7.1f} | {r['floor_ms']:8.2f} {100 * r['fraction_of_floor']:7.0f}% | {_check_text(r['check'])}")


def _fp8_vs_fp16(rows: list[dict]) -> list[str]:
    """FP8 rows beside cudattn's own float16 rows of the same shape (no peer has FP8 attention)."""
    def key(c):
        return (c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["causal"], c.get("page_size", 0))
    fp16 = {key(r["case"]): r for r in rows if r["case"]["dtype"] == "float16"}
    pairs = [(r, fp16[key(r["case"])]) for r in rows if r["case"]["dtype"] == "float8_e4m3fn" and key(r["case"]) in fp16]
    if not pairs:
        return []
    k, unit = ("tflops", "TFLOP/s") if pairs[0][0]["case"]["kind"] == "prefill" else ("tbps", "TB/s")
    md = ["FP8 (e4m3, bfloat16 out) against cudattn's float16, same shapes, same run:", "",
          f"| B | Hq | Hkv | Sq | Sk | D | causal | FP8 {unit} | float16 {unit} | FP8 / float16 |", "|" + "---|" * 10]
    ratios = []
    for r8, r16 in pairs:
        c, a, b = r8["case"], r8["impls"]["cudattn"][k], r16["impls"]["cudattn"][k]
        ratios.append(a / b)
        md.append(f"| {c['B']} | {c['Hq']} | {c['Hkv']} | {c['Sq']} | {c['Sk']} | {c['D']} | {int(c['causal'])} | "
                  f"{a:.1f} | {b:.1f} | {a / b:.2f}x |")
    md += ["", f"Geometric mean FP8 / float16: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x", ""]
    return md


def geomean_ratios(rows: list[dict], kind: str | None = None, key: str = "ratio") -> dict:
    """Per peer, the geometric mean of ``row[key]`` (ratio, ratio_as_called, ratio_back_to_back) over rows."""
    out = {}
    for b in BACKENDS:
        rs = [r[key][b] for r in rows if b in r.get(key, {}) and (kind is None or r["case"]["kind"] == kind)]
        if rs:
            out[b] = math.exp(sum(math.log(x) for x in rs) / len(rs))
    return out


def summary(report: dict) -> str:
    rows = report["rows"]
    bad = sum(not r["check"]["ok"] for r in rows + report.get("host_rows", []))
    lines = [f"{len(rows)} rows, {bad} failing the correctness check"] if rows or not report.get("overhead_rows") else []
    for kind in KINDS:
        for key, how in RATIOS:
            g = geomean_ratios(rows, kind, key)
            if g:
                lines.append(f"{kind}: geometric mean of cudattn/peer speed, {how}: " +
                             ", ".join(f"{PEER_TITLE[b]} {v:.2f}x" for b, v in g.items()))
    for problem, ours, sdpa in _overhead_headline(report.get("overhead_rows", [])):
        lines.append(f"overhead, {problem}: cudattn (DeviceArray) {ours} µs per call on the host, torch SDPA {sdpa} µs")
    return "\n".join(lines)


def ceilings_text(c: dict) -> str:
    if not c:
        return "not measured (no kernel rows)"
    parts = [f"device copy {c['copy_tbps']:.2f} TB/s (read+write)"]
    parts.append(f"bf16 GEMM {c['gemm_bf16_tflops']:.0f} TFLOP/s" if c.get("gemm_bf16_tflops")
                 else f"bf16 GEMM not measured ({c.get('gemm_note')})")
    if c.get("gemm_fp8_tflops"):
        parts.append(f"e4m3 GEMM {c['gemm_fp8_tflops']:.0f} TFLOP/s (torch._scaled_mm; FP8 rows' % ceiling)")
    if "h2d_gbps" in c:
        parts.append(f"pinned host->device {c['h2d_gbps']:.1f} GB/s, device->host {c['d2h_gbps']:.1f} GB/s")
    return "; ".join(parts)


def markdown(report: dict, command: str, plot_name: str | None = None) -> str:
    env = report["environment"]
    peers = env.get("peers")
    kinds = [k for k in KINDS if any(r["case"]["kind"] == k for r in report["rows"])]
    named = [k for k in kinds if k not in BACKWARD_OPS] + (["backward"] if set(kinds) & set(BACKWARD_OPS) else [])
    title = (" and ".join(named).capitalize() + " performance" if kinds
             else "Host overhead" if report.get("overhead_rows") else "cudattn performance")
    md = [f"# {title}", "", f"Measured on {env['gpu']} on {env['date']}.", "",
          "Generated by the bench command, not typed by hand; regenerate it with:", "", "```",
          command, "```", "",
          f"- date: {env['date']}",
          f"- GPU: {env['gpu']} ({env['sm_count']} SMs, {env['arch']}), driver CUDA {env['driver_cuda']}, "
          f"NVRTC {env['nvrtc']}",
          f"- cudattn {env['cudattn']}, commit `{env['git_commit'] or 'unknown'}`"
          + {True: ", warm calls on the compiled path", False: ", warm calls on the Python path (no compiled path)",
             None: ""}[env.get("compiled_warm_path")],
          f"- peers: torch {peers['torch']} SDPA, cuDNN {peers['cudnn']} (backends cudnn and flash)" if peers
          else "- peers: none (torch not importable)"]
    if kinds:
        md += [f"- ceilings measured in the same run: {ceilings_text(report['ceilings'])}",
               f"- method: CUDA events around each call queued behind a spin kernel, median (and p90) of "
               f"{report['iters']} calls after warm-up, inputs rotated over copies larger than 3x L2, a row's "
               f"calls (cudattn and each peer) timed in turns, at least {ROUNDS} rounds of a share of the "
               f"samples, in a balanced order (each call first, and right after each other call, equally "
               f"often: the clocks follow the load of the calls before); "
               f"ratio = cudattn speed / peer speed (above 1: cudattn is faster); each cudattn row checked "
               f"against the float64 reference on a subsample (FlashAttention's rule: max|out - ref| <= "
               f"2·max|naive - ref| + 1e-5)",
               "- as called: CUDA events around one call on a stream left idle before it (the host's time of "
               "the call included), median of as many calls; back to back: events around "
               f"{BATCH} calls queued without a sync, per call (the host's time overlaps the GPU's); a row's "
               f"calls (cudattn, also with torch operands, and each peer) timed as called in turns as well, "
               f"each turn after a {SETTLE_MS:g} ms spin, so that a drift of the clocks falls on all alike"]
    if set(kinds) & set(BACKWARD_OPS):
        md.append(_BACKWARD_METHOD)
    md.append("")
    if plot_name:
        md += [f"![TFLOP/s against sequence length]({plot_name})", ""]
    for kind, title in _SECTION.items():
        rows = [r for r in report["rows"] if r["case"]["kind"] == kind]
        if not rows:
            continue
        key, unit = _unit(kind)
        head = ["dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal"] + (["KV cache"] if kind == "decode" else []) + \
            ["cudattn ms", f"cudattn {unit}", "% ceiling"]
        if peers:
            for b in BACKENDS:
                head += [f"{PEER_TITLE[b]} {unit}", f"vs {PEER_TITLE[b]}"]
        head.append("check")
        md += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            c, o = r["case"], r["impls"]["cudattn"]
            cells = [c["dtype"], c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], int(c["causal"])]
            if kind == "decode":  # cudattn reads the paged copy; the peers the contiguous one
                cells.append(f"paged, {c['page_size']}-key pages" if c.get("page_size") else "contiguous")
            cells += [f"{o['median_ms']:.3f}", _f(o[key], ".2f" if kind == "decode" else ".1f"),
                     _f(o.get("pct_of_ceiling"), ".0f")]
            if peers:
                for b in BACKENDS:
                    p = r["impls"].get(b, {})
                    cells += (["n/a", "-"] if "error" in p
                              else [_f(p[key], ".2f" if kind == "decode" else ".1f"), f"{r['ratio'][b]:.2f}x"])
            cells.append("ok" if r["check"]["ok"] else "**FAIL**")
            md.append("| " + " | ".join(map(str, cells)) + " |")
        g = geomean_ratios(report["rows"], kind)
        if g:
            md += ["", "Geometric mean of cudattn/peer: " + ", ".join(f"{PEER_TITLE[b]} {v:.2f}x" for b, v in g.items())]
        md.append("")
        md += _as_called_table(kind, rows, peers)
        md += _fp8_vs_fp16(rows)
    host = report.get("host_rows")
    if host:
        md += ["## NumPy end to end (`attention(numpy...)`, transfers included)", "",
               "Floor: input bytes at the pinned host->device bandwidth plus output bytes at the device->host "
               "bandwidth, measured in the same run.", "",
               "Memory: the caller's arrays as ordinary NumPy arrays (pageable), or q, k, v and `out` from "
               "`cudattn.empty_pinned` (pinned: DMA from and into them, no staging copy).", "",
               "| dtype | B | Hq | Hkv | Sq | Sk | D | causal | memory | ms | GB/s | floor ms | of floor | check |",
               "|" + "---|" * 14]
        for r in host:
            c = r["case"]
            md.append(f"| {c['dtype']} | {c['B']} | {c['Hq']} | {c['Hkv']} | {c['Sq']} | {c['Sk']} | {c['D']} | "
                      f"{int(c['causal'])} | {r.get('memory', 'pageable')} | {r['median_ms']:.2f} | {r['gbps']:.1f} | {r['floor_ms']:.2f} | "
                      f"{100 * r['fraction_of_floor']:.0f}% | {'ok' if r['check']['ok'] else '**FAIL**'} |")
        md.append("")
    md += overhead_markdown(report.get("overhead_rows", []))
    if report.get("graph_step"):
        from .graphstep import line

        md += ["## A decode step replayed from a CUDA graph", "", line(report["graph_step"]), ""]
    return "\n".join(md)


_BACKWARD_METHOD = (
    "- backward rows, one set of inputs each: `attention_backward(dout, q, k, v, out, lse)` alone (out and lse "
    "from `attention(..., return_lse=True)`, made once), the same with `deterministic=True`, and a training "
    "step (`attention` with its LSE, then `attention_backward`); the peers: `torch.autograd.grad(o, (q, k, v), "
    "dout, retain_graph=True)` of an SDPA output made once by the same backend, the same under torch's "
    "deterministic mode (`torch.use_deterministic_algorithms(True)`), and SDPA with the grad, together; "
    "gradients checked against the float64 reference on a subsample (dq on the first and last rows, dk and "
    "dv on sampled keys), the deterministic ones also for bit-identical results from two calls")


def _triple(d: dict, keys=("median_ms", "as_called_ms", "back_to_back_ms"), fmt=".3f", suffix="") -> str:
    return " / ".join(_f(d.get(k), fmt) + (suffix if isinstance(d.get(k), (int, float)) else "") for k in keys)


def _as_called_table(kind: str, rows: list[dict], peers) -> list[str]:
    """GPU time beside the two as-called times, ms as "GPU / as called / back to back", for cudattn and
    each peer, with the three ratios; and cudattn called with torch tensors (what torch users see)."""
    if not any("as_called_ms" in r["impls"]["cudattn"] for r in rows):
        return []  # a report from before the as-called timings
    head = ["dtype", "shape", "causal", "cudattn"]
    if peers:
        head.append("cudattn, torch tensors, as called")
        for b in BACKENDS:
            head += [PEER_TITLE[b], f"vs {PEER_TITLE[b]}"]
    md = [f"### {KINDS.get(kind, kind.capitalize())} as called (ms: GPU / as called / back to back)", "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        o = r["impls"]["cudattn"]
        cells = [r["case"]["dtype"], r["label"], int(r["case"]["causal"]), _triple(o)]
        if peers:
            cells.append(_f(o.get("as_called_torch_ms"), ".3f"))
            for b in BACKENDS:
                p = r["impls"].get(b, {})
                ratios = {k: r.get(k, {}).get(b) for k, _ in RATIOS}
                cells += (["n/a", "-"] if "error" in p else
                          [_triple(p), _triple(ratios, tuple(k for k, _ in RATIOS), ".2f", "x")])
        md.append("| " + " | ".join(map(str, cells)) + " |")
    for key, how in RATIOS[1:]:
        g = geomean_ratios(rows, None, key)
        if g:
            md += ["", f"Geometric mean of cudattn/peer, {how}: " +
                   ", ".join(f"{PEER_TITLE[b]} {v:.2f}x" for b, v in g.items())]
    return md + [""]


# ---------------------------------------------------------------------- --grid overhead

OVERHEAD_KINDS = {"cudattn": "cudattn DeviceArray", "torch": "torch.Tensor", "cupy": "cupy.ndarray", "jax": "jax.Array"}


def _us_cell(r: dict | None, key: str, why: bool = True) -> str:
    """``r[key]`` in µs; for a row not measured, why not (or "-" when ``why`` is False: said once is enough)."""
    if r is None:
        return "-"
    if "skipped" in r or "error" in r:
        if not why:
            return "-"
        return ("skipped: " + r["skipped"]) if "skipped" in r else "error: " + r["error"]
    if key not in r:  # a figure this row has no way to measure (torch's own launches)
        return "-"
    return f"{r[key]:.1f}" + ("*" if key == "host_us" and r.get("outlasted_spin") else "")


def overhead_header() -> str:
    return (f"{'problem':8} {'impl':10} {'operands':8} {'stream=':28} {'out=':5} | {'host us':>8} {'p90':>7} | "
            f"{'pre-launch':>10} | {'called us':>9} | runs on")


def overhead_line(r: dict) -> str:
    line = f"{r['problem']:8} {r['impl']:10} {r['operands']:8} {r['stream']:28} {str(r['out']):5} | "
    if "skipped" in r or "error" in r:
        return line + _us_cell(r, "host_us")
    if "pre_launch_us" in r:
        pre = f"{r['pre_launch_us']:10.1f}"
    elif "pre_launch_profiled_us" in r:  # torch's launches, seen through its profiler only
        pre = f"{r['pre_launch_profiled_us']:9.1f}p"
    else:
        pre = f"{'-':>10}"
    return (line + f"{r['host_us']:8.1f} {r['host_p90_us']:7.1f} | {pre} | {r['as_called_us']:9.1f} | "
            f"{r['launch_stream']}"
            + ("  (outlasted its spin: the call waits for the GPU)" if r["outlasted_spin"] else ""))


def _overhead_headline(rows: list[dict]):
    """(problem, cudattn DeviceArray host µs, torch SDPA host µs) per problem, as text."""
    for problem in dict.fromkeys(r["problem"] for r in rows):
        ours = next((r for r in rows if r["problem"] == problem and r["impl"] == "cudattn"
                     and r["operands"] == "cudattn" and not r["out"]), None)
        sdpa = next((r for r in rows if r["problem"] == problem and r["impl"] == "torch_sdpa"), None)
        yield problem, _us_cell(ours, "host_us"), _us_cell(sdpa, "host_us")


def overhead_markdown(rows: list[dict]) -> list[str]:
    """"Host time per call (µs)": one line per problem, operand kind and stream=, out= beside; torch SDPA's
    figures repeated on each line of its problem, so each cudattn figure has its peer beside it."""
    if not rows:
        return []
    md = ["## Host time per call (µs)", "",
          f"Host µs: wall clock of {CALLS} back-to-back warm calls over {CALLS}, the GPU held by a spin kernel "
          f"so that every launch is only queued, median of {REPEATS} batches (fewer calls per batch where "
          f"{CALLS} fill the launch queue: the row's `calls` in the JSON). As called µs: CUDA events around "
          "one call on an idle stream. Before launch µs: host time from the call's start to its first kernel "
          "launch, the part that delays the GPU (cudattn's rows: its launch function wrapped, or the compiled warm "
          "path's own stamp of its first launch; median over calls of 7 batches). torch SDPA's launches are seen "
          "only through torch's profiler (CUPTI): from a cudaStreamQuery just before the call to its first "
          "launch, median of 100 calls, CUPTI's own cost included (the JSON has the same figure for cudattn's "
          "rows, `pre_launch_profiled_us`); these profiled figures are taken after every other figure of the "
          "grid (so after JAX's runtime has started, for the JAX rows), since CUPTI, once attached, slows "
          "every later driver call of the process. "
          "Prefill: `attention`, float16, q, k, v (B, S, H, D) for cudattn, "
          "(B, H, S, D) for torch SDPA (its default backend choice; it takes no out=). Decode: "
          f"`attention_with_kvcache`, contiguous cache, cache_seqlens {list(OVERHEAD_SEQLENS)} (a device "
          "array of the operands' kind); torch SDPA attends to the whole cache. \"runs on\": the stream "
          f"the call's output was made on. *: batches outlasted their spin even at {MIN_CALLS} calls, so the "
          "call waits for the GPU (a sync in its path): more than host time.", "",
          "| problem | operands | stream= | runs on | host µs | host µs, out= | before launch µs | "
          "before launch µs, out= | as called µs | as called µs, out= | torch SDPA host µs | "
          "torch SDPA before launch µs (profiler) | torch SDPA as called µs |",
          "|" + "---|" * 13]
    groups: dict = {}
    for r in rows:
        if r["impl"] == "cudattn":
            groups.setdefault((r["problem"], r["label"], r["operands"], r["stream"]), {})[r["out"]] = r
    for (problem, label, kind, stream), g in groups.items():
        sdpa = next((r for r in rows if r["problem"] == problem and r["impl"] == "torch_sdpa"), None)
        plain, out = g.get(False), g.get(True)
        first = plain or out
        if "skipped" in first and out is None:  # the whole kind is missing: one cell says why
            cells = [_us_cell(first, "host_us"), "-", "-", "-", "-", "-"]
        else:
            cells = [_us_cell(plain, "host_us"), _us_cell(out, "host_us"), _us_cell(plain, "pre_launch_us", False),
                     _us_cell(out, "pre_launch_us", False), _us_cell(plain, "as_called_us", False),
                     _us_cell(out, "as_called_us", False)]
        md.append(f"| {problem} {label} | {OVERHEAD_KINDS.get(kind, kind)} | {stream} | "
                  f"{first.get('launch_stream', '-')} | " + " | ".join(cells) +
                  f" | {_us_cell(sdpa, 'host_us')} | {_us_cell(sdpa, 'pre_launch_profiled_us', False)} | "
                  f"{_us_cell(sdpa, 'as_called_us', False)} |")
    return md + [""]


def write_json(path: str, report: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, allow_nan=True)
        fh.write("\n")
