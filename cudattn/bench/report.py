"""A run's results as a text table (streamed row by row), Markdown (docs/PERFORMANCE.md) and JSON."""

from __future__ import annotations

import json
import math

from .peers import BACKENDS

PEER_TITLE = {"cudnn": "cuDNN", "flash": "flash"}


def _unit(kind: str) -> tuple[str, str]:
    return ("tbps", "TB/s") if kind == "decode" else ("tflops", "TFLOP/s")


def _f(x, fmt: str = "8.1f") -> str:
    return f"{x:{fmt}}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _check_text(chk: dict) -> str:
    state = "ok" if chk["ok"] else "FAIL"
    return f"{state} {chk['max_err']:.1e}<={chk['bound']:.1e}"


def header(peers: bool) -> str:
    cols = f"{'kind':7} {'dtype':8} {'shape BxHxSxD':22} {'causal':6} | {'ms':>8} {'p90':>8} {'speed':>8} {'%ceil':>5}"
    if peers:
        cols += "".join(f" | {PEER_TITLE[b]:>8} {'ratio':>6}" for b in BACKENDS)
    return cols + " | check (max err <= bound)"


def row_line(row: dict, peers: bool) -> str:
    c = row["case"]
    key, unit = _unit(c["kind"])
    ours = row["impls"]["cudattn"]
    line = (f"{c['kind']:7} {c['dtype']:8} {row['label']:22} {str(c['causal']):6} | {ours['median_ms']:8.3f} "
            f"{ours['p90_ms']:8.3f} {_f(ours[key], '8.2f' if unit == 'TB/s' else '8.1f')} "
            f"{_f(ours.get('pct_of_ceiling'), '4.0f'):>4}%")
    if peers:
        for b in BACKENDS:
            p = row["impls"].get(b, {})
            if "error" in p:
                line += f" | {'n/a':>8} {'-':>6}"
            else:
                line += f" | {_f(p.get(key), '8.2f' if unit == 'TB/s' else '8.1f')} {row['ratio'][b]:5.2f}x"
    return line + " | " + _check_text(row["check"])


def host_header() -> str:
    return (f"{'dtype':8} {'shape BxHxSxD':22} {'causal':6} | {'ms':>8} {'p90':>8} {'GB/s':>7} | {'floor ms':>8} "
            f"{'of floor':>8} | check")


def host_line(r: dict) -> str:
    c = r["case"]
    return (f"{c['dtype']:8} {r['label']:22} {str(c['causal']):6} | {r['median_ms']:8.2f} {r['p90_ms']:8.2f} "
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


def geomean_ratios(rows: list[dict], kind: str | None = None) -> dict:
    out = {}
    for b in BACKENDS:
        rs = [r["ratio"][b] for r in rows if b in r["ratio"] and (kind is None or r["case"]["kind"] == kind)]
        if rs:
            out[b] = math.exp(sum(math.log(x) for x in rs) / len(rs))
    return out


def summary(report: dict) -> str:
    rows = report["rows"]
    bad = sum(not r["check"]["ok"] for r in rows + report.get("host_rows", []))
    lines = [f"{len(rows)} rows, {bad} failing the correctness check"]
    for kind in ("prefill", "decode"):
        g = geomean_ratios(rows, kind)
        if g:
            lines.append(f"{kind}: geometric mean of cudattn/peer speed: " +
                         ", ".join(f"{PEER_TITLE[b]} {v:.2f}x" for b, v in g.items()))
    return "\n".join(lines)


def ceilings_text(c: dict) -> str:
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
    kinds = [k for k in ("prefill", "decode") if any(r["case"]["kind"] == k for r in report["rows"])]
    title = " and ".join(kinds).capitalize() if kinds else "cudattn"
    md = [f"# {title} performance", "", f"Measured on {env['gpu']} on {env['date']}.", "",
          "Generated by the bench command, not typed by hand; regenerate it with:", "", "```",
          command, "```", "",
          f"- date: {env['date']}",
          f"- GPU: {env['gpu']} ({env['sm_count']} SMs, {env['arch']}), driver CUDA {env['driver_cuda']}, "
          f"NVRTC {env['nvrtc']}",
          f"- cudattn {env['cudattn']}, commit `{env['git_commit'] or 'unknown'}`",
          f"- peers: torch {peers['torch']} SDPA, cuDNN {peers['cudnn']} (backends cudnn and flash)" if peers
          else "- peers: none (torch not importable)",
          f"- ceilings measured in the same run: {ceilings_text(report['ceilings'])}",
          f"- method: CUDA events around each call queued behind a spin kernel, median (and p90) of "
          f"{report['iters']} calls after warm-up, inputs rotated over copies larger than 3x L2; "
          f"ratio = cudattn speed / peer speed (above 1: cudattn is faster); each cudattn row checked "
          f"against the float64 reference on a subsample (FlashAttention's rule: max|out - ref| <= "
          f"2·max|naive - ref| + 1e-5)", ""]
    if plot_name:
        md += [f"![TFLOP/s against sequence length]({plot_name})", ""]
    for kind, title in (("prefill", "Prefill (TFLOP/s; FLOPs = 4·B·H·Sq·Sk·D, halved for causal)"),
                        ("decode", "Decode (TB/s of q, k, v and out bytes)")):
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
        md += _fp8_vs_fp16(rows)
    host = report.get("host_rows")
    if host:
        md += ["## NumPy end to end (`attention(numpy...)`, transfers included)", "",
               "Floor: input bytes at the pinned host->device bandwidth plus output bytes at the device->host "
               "bandwidth, measured in the same run.", "",
               "| dtype | B | Hq | Hkv | Sq | Sk | D | causal | ms | GB/s | floor ms | of floor | check |",
               "|" + "---|" * 13]
        for r in host:
            c = r["case"]
            md.append(f"| {c['dtype']} | {c['B']} | {c['Hq']} | {c['Hkv']} | {c['Sq']} | {c['Sk']} | {c['D']} | "
                      f"{int(c['causal'])} | {r['median_ms']:.2f} | {r['gbps']:.1f} | {r['floor_ms']:.2f} | "
                      f"{100 * r['fraction_of_floor']:.0f}% | {'ok' if r['check']['ok'] else '**FAIL**'} |")
        md.append("")
    return "\n".join(md)


def write_json(path: str, report: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, allow_nan=True)
        fh.write("\n")
