"""TFLOP/s against sequence length, one panel per (dtype, causal), cudattn beside its peers.

matplotlib is an optional extra (``pip install "cudattn[plot]"``); it is imported only here.
"""

from __future__ import annotations

from .peers import BACKENDS
from .report import PEER_TITLE

_STYLE = {"cudattn": ("-", "o"), "cudnn": ("--", "s"), "flash": (":", "^")}
_COLORS = {64: "tab:blue", 128: "tab:orange", 256: "tab:green"}


def _series(rows: list[dict], dtype: str, causal: bool) -> dict:
    """{(impl, D): [(S, TFLOP/s), ...]} for prefill rows with Sq == Sk."""
    out: dict = {}
    for r in rows:
        c = r["case"]
        if c["kind"] != "prefill" or c["dtype"] != dtype or c["causal"] != causal or c["Sq"] != c["Sk"]:
            continue
        for impl in ("cudattn", *BACKENDS):
            tf = r["impls"].get(impl, {}).get("tflops")
            if tf is not None:
                out.setdefault((impl, c["D"]), []).append((c["Sq"], tf))
    return {k: sorted(v) for k, v in out.items()}


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit('--plot needs matplotlib: pip install "cudattn[plot]"') from None
    rows = report["rows"]
    dtypes = sorted({r["case"]["dtype"] for r in rows if r["case"]["kind"] == "prefill"})
    if not dtypes:
        raise SystemExit("--plot: no prefill rows to draw (TFLOP/s against sequence length)")
    causals = (False, True)
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(13, 4.6 * len(dtypes)), squeeze=False, sharey=True)
    gemm = report["ceilings"].get("gemm_bf16_tflops")
    for i, dt in enumerate(dtypes):
        for j, causal in enumerate(causals):
            ax = axes[i][j]
            for (impl, d), pts in sorted(_series(rows, dt, causal).items(), key=lambda kv: (kv[0][1], kv[0][0])):
                ls, mk = _STYLE[impl]
                name = "cudattn" if impl == "cudattn" else PEER_TITLE[impl]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=ls, marker=mk,
                        color=_COLORS.get(d, "tab:gray"), label=f"{name} D={d}",
                        linewidth=2.2 if impl == "cudattn" else 1.3)
            if gemm:
                ax.axhline(gemm, color="black", linewidth=0.8, alpha=0.5)
                ax.text(0.01, gemm, f" bf16 GEMM {gemm:.0f}", transform=ax.get_yaxis_transform(),
                        va="bottom", fontsize=8, alpha=0.7)
            ax.set_xscale("log", base=2)
            seqs = sorted({p[0] for pts in _series(rows, dt, causal).values() for p in pts})
            ax.set_xticks(seqs, [str(x) for x in seqs])
            ax.minorticks_off()
            ax.set_title(f"{dt}, {'causal' if causal else 'not causal'}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    env = report["environment"]
    fig.suptitle(f"cudattn forward vs torch SDPA backends — {env['gpu']}, {env['date'][:10]}, "
                 f"commit {(env['git_commit'] or 'unknown')[:10]}")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
