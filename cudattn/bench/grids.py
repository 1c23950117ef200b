"""What `cudattn bench` measures: named grids of cases, or cases spelled on the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPES = ("float16", "bfloat16")  # the grids' default
FP8 = "float8_e4m3fn"
ALL_DTYPES = DTYPES + (FP8,)  # --dtype float8_e4m3fn adds FP8 rows (no peer: torch SDPA has no FP8 backend)
GRIDS = ("quick", "prefill", "decode", "all", "backward", "overhead", "distributed")  # overhead: host time per call, no
# rows; distributed: the ring on several GPUs (bench/distributed.py), no rows of this kind either
DECODE_MAX_SQ = 16  # up to this many query tokens a case is decode (bandwidth-bound, reported in TB/s)
# The rows of a backward case (`bench.backward`), each with its FLOPs in forward FLOPs: the backward
# does five matrix products of the forward's size (S = q kᵀ again, dV = Pᵀ dO, dP = dO vᵀ, dQ = dS k,
# dK = dSᵀ q) against the forward's two, so 2.5 forwards; a training step (forward with its LSE, then
# the backward) 3.5. "backward det": the backward with deterministic=True.
BACKWARD_OPS = {"backward": 2.5, "backward det": 2.5, "train step": 3.5}


@dataclass(frozen=True)
class Case:
    """One attention problem: q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)`` (layout "bshd"), and
    what is timed on it, ``op``: "forward" (``attention``), or one of BACKWARD_OPS. The cases of the
    backward grid carry op "backward" and run as one row per BACKWARD_OPS (`bench.backward`)."""

    dtype: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool
    page_size: int = 0  # decode: a paged KV cache of this page size (shuffled pages); 0: contiguous k/v
    op: str = "forward"

    def __post_init__(self):
        if self.op != "forward" and self.op not in BACKWARD_OPS:
            raise ValueError(f"op must be 'forward' or one of {', '.join(BACKWARD_OPS)}; got {self.op!r}")

    @property
    def kind(self) -> str:
        """The row's kind: "prefill" or "decode" for the forward, else the op ("backward", ...)."""
        if self.op != "forward":
            return self.op
        return "decode" if self.Sq <= DECODE_MAX_SQ else "prefill"

    @property
    def itemsize(self) -> int:
        return 1 if self.dtype == FP8 else 2

    @property
    def visible_pairs(self) -> float:
        """(query, key) pairs attended per head: Sq·Sk, halved for causal self-attention (the
        peers' convention), counted exactly for causal with Sq != Sk (bottom-right aligned)."""
        if not self.causal:
            return float(self.Sq * self.Sk)
        if self.Sq == self.Sk:
            return self.Sq * self.Sk / 2.0
        off = self.Sk - self.Sq  # row i sees keys 0..i+off
        return float(sum(min(self.Sk, max(0, i + off + 1)) for i in range(self.Sq)))

    @property
    def forward_flops(self) -> float:
        """4·B·Hq·D per visible pair (two matrix products of 2 FLOPs per multiply-add)."""
        return 4.0 * self.B * self.Hq * self.D * self.visible_pairs

    @property
    def flops(self) -> float:
        """The op's FLOPs: the forward's, times BACKWARD_OPS[op] for the backward rows."""
        return self.forward_flops * BACKWARD_OPS.get(self.op, 1.0)

    @property
    def bytes(self) -> int:
        """Bytes that must cross device memory at least once: q and out, k and v; for the backward
        ops also dout and dq, dk and dv (and the float32 LSE)."""
        if self.op == "forward":
            return self.itemsize * self.D * self.B * (2 * self.Sq * self.Hq + 2 * self.Sk * self.Hkv)
        return self.itemsize * self.D * self.B * (4 * self.Sq * self.Hq + 4 * self.Sk * self.Hkv) + \
            4 * self.B * self.Hq * self.Sq

    def label(self) -> str:
        heads = f"{self.Hq}" if self.Hq == self.Hkv else f"{self.Hq}/{self.Hkv}"
        seq = f"{self.Sq}" if self.Sq == self.Sk else f"{self.Sq}/{self.Sk}"
        return f"{self.B}x{heads}x{seq}x{self.D}" + (f" paged{self.page_size}" if self.page_size else "")

    def as_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind, "flops": self.flops, "forward_flops": self.forward_flops,
                "bytes": self.bytes}


# Prefill: every shape of the peer table (../shared/peers/H200.md), plus shapes that complete a
# curve of sequence lengths 512..16384 for head dims 64, 128 and 256 (16k tokens per batch, 16 heads,
# or 8 heads at D=256), so each (D, S) has one point.
_PEER_PREFILL = [(16, 16, 512, 64), (8, 16, 1024, 64), (4, 16, 4096, 64), (8, 16, 1024, 128),
                 (4, 16, 4096, 128), (2, 16, 8192, 128), (1, 16, 16384, 128), (4, 8, 2048, 256)]
_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# Decode (one query token, fp16, D=128): the peer table's B / Hq / Hkv / S_kv.
_PEER_DECODE = [(32, 32, 8, 4096), (8, 32, 8, 32768), (64, 32, 32, 2048), (1, 32, 8, 131072)]


def prefill_shapes() -> list[tuple[int, int, int, int]]:
    """(B, H, S, D), one per (D, S), sorted by D then S; a peer-table shape where there is one."""
    by_point = {(d, s): (b, h, s, d) for b, h, s, d in _PEER_PREFILL}
    for d in (64, 128, 256):
        for s in _SEQLENS:
            by_point.setdefault((d, s), (max(1, 16384 // s), 16 if d <= 128 else 8, s, d))
    return [by_point[k] for k in sorted(by_point)]


def _prefill(dtypes, causals) -> list[Case]:
    return [Case(dt, b, h, h, s, s, d, c) for dt in dtypes for (b, h, s, d) in prefill_shapes() for c in causals]


# Page sizes of the paged decode rows: vLLM's default (16) and FlashAttention's (256).
DECODE_PAGE_SIZES = (16, 256)


def _decode(dtypes) -> list[Case]:
    return [Case(dt, b, hq, hkv, 1, s, 128, False, ps) for dt in dtypes for ps in (0, *DECODE_PAGE_SIZES)
            for (b, hq, hkv, s) in _PEER_DECODE]


# Backward (--grid backward): (B, Hq, Hkv, S, D), long sequences (S >= 4096) at head dims 64, 128
# and 256, and one GQA shape (64 query heads on 8 KV heads).
_BACKWARD = [(4, 16, 16, 4096, 64), (2, 16, 16, 8192, 64), (4, 16, 16, 4096, 128), (2, 16, 16, 8192, 128),
             (1, 16, 16, 16384, 128), (1, 64, 8, 8192, 128), (2, 16, 16, 4096, 256)]


def _backward(dtypes, causals) -> list[Case]:
    _no_fp8(dtypes)
    return [Case(dt, b, hq, hkv, s, s, d, c, op="backward") for dt in dtypes for (b, hq, hkv, s, d) in _BACKWARD
            for c in causals]


def _no_fp8(dtypes) -> None:
    if FP8 in dtypes:
        raise ValueError("the backward grid takes float16 and bfloat16 only (attention_backward has no FP8)")


# --grid overhead: problems small enough that the host, not the GPU, bounds a call. Prefill runs
# `attention` (B, H, S, D = 1, 8, 512, 64); decode `attention_with_kvcache` on a contiguous cache of
# OVERHEAD_DECODE.Sk keys per sequence, with the lengths in OVERHEAD_SEQLENS (one per sequence).
OVERHEAD_PREFILL = Case("float16", 1, 8, 8, 512, 512, 64, False)
OVERHEAD_DECODE = Case("float16", 4, 8, 8, 1, 1024, 128, False)
OVERHEAD_SEQLENS = (1024, 1000, 700, 513)


def named_grid(name: str, dtypes=None, causals=None) -> list[Case]:
    """The cases of grid ``name``. ``dtypes``/``causals`` (None: the grid's own) narrow it.
    ``backward``'s cases carry op "backward" (each runs as the rows of BACKWARD_OPS; no FP8).
    ``overhead`` has no cases: its problems are fixed (OVERHEAD_*), and it makes no kernel rows."""
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    pdt = tuple(dtypes or DTYPES)
    ddt = tuple(dtypes or ("float16",))  # the peers' decode figures are fp16
    pc = tuple((False, True) if causals is None else causals)
    if name == "quick":
        return [Case(dt, b, h, h, s, s, d, c) for dt in (dtypes or ("bfloat16",))
                for (b, h, s, d) in ((16, 16, 512, 64), (4, 16, 4096, 128)) for c in pc] + \
               [Case(dt, 32, 32, 8, 1, 4096, 128, False) for dt in ddt]
    cases = []
    if name in ("prefill", "all"):
        cases += _prefill(pdt, pc)
    if name in ("decode", "all"):
        cases += _decode(ddt)
    if name == "backward":
        cases += _backward(pdt, pc)
    return cases


def parse_shape(text: str) -> tuple[int, int, int, int, int, int]:
    """``B,H,S,D`` (self-attention) or ``B,Hq,Hkv,Sq,Sk,D`` -> (B, Hq, Hkv, Sq, Sk, D)."""
    try:
        nums = [int(x) for x in text.replace("x", ",").split(",") if x.strip()]
    except ValueError:
        nums = []
    if len(nums) == 4:
        b, h, s, d = nums
        nums = [b, h, h, s, s, d]
    if len(nums) != 6 or min(nums) < 1:
        raise ValueError(f"--shape takes B,H,S,D or B,Hq,Hkv,Sq,Sk,D with positive integers; got {text!r}")
    b, hq, hkv, sq, sk, d = nums
    if hq % hkv:
        raise ValueError(f"--shape {text!r}: query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if d > 256 or d % 8:
        raise ValueError(f"--shape {text!r}: head dim must be a multiple of 8 from 8 to 256; got {d}")
    return tuple(nums)


def explicit_cases(shapes, dtypes=None, causals=None, op: str = "forward") -> list[Case]:
    """Cases from ``--shape`` strings; decode-like shapes (Sq <= 16) default to non-causal.
    ``op="backward"``: the backward rows of those shapes (no FP8)."""
    out = []
    if op != "forward":
        _no_fp8(dtypes or DTYPES)
    for text in shapes:
        b, hq, hkv, sq, sk, d = parse_shape(text)
        cs = causals if causals is not None else ((False,) if sq <= DECODE_MAX_SQ else (False, True))
        out += [Case(dt, b, hq, hkv, sq, sk, d, c, op=op) for dt in (dtypes or DTYPES) for c in cs]
    return out
