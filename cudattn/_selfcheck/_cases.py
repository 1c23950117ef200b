"""The cases selfcheck runs: pure data, no GPU.

A `Case` names one call of the public API (``attention``, ``attention_with_kvcache``,
``merge_attention_states`` or ``quantize_fp8``) with its shapes and options. Three lists:

- `selfcheck_cases`: every kernel family on small shapes with tails (S = 1, 17, 65, 113, 203),
  fully masked rows (causal, Sq > Sk), MHA/GQA/MQA, both layouts, every head-dim tile.
- `sanitize_cases`: one small case per path, for the sanitizers (10-100x slower).
- `load_cases`: a seeded mix of small problems for the load and soak runs.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

OPS = ("attention", "kvcache", "merge", "quantize")
FAMILIES = ("any", "portable", "hopper")
FP8 = "float8_e4m3fn"
DECODE_MAX_SQ = 16  # cudattn._kernels.decode.DECODE_MAX_SQ: 16-bit calls up to this many queries take split-KV
_SHORT = {"float16": "fp16", "bfloat16": "bf16", FP8: "fp8", "float32": "fp32"}


@dataclass(frozen=True)
class Case:
    """One API call. Fields an op does not use keep their defaults.

    - attention: q ``(B, Sq, Hq, D)`` (layout bshd) against k/v of ``Sk`` keys and ``Hkv`` heads;
      ``dtype`` FP8 means float32 sources quantised by ``quantize_fp8`` on the ``quant`` side
      ("device" or "host"), with per-head ``(B, Hkv)`` descale arrays or, ``per="tensor"``,
      plain floats (host) / repeated arrays (device).
    - kvcache: a cache of capacity ``Sk`` per sequence, ``seqlens`` valid keys each, contiguous
      or paged (``page_size``), ``s_new`` tokens appended first.
    - merge: ``parts`` partial results ``(B, Sq, Hq, D)`` in ``dtype`` (stacked in one array or
      a list).
    - quantize: x ``(B, Sq, Hq, D)`` in ``dtype`` to e4m3, ``per`` tensor or head, ``Hkv``
      descale columns.

    ``family``: "portable" forces the sm80 kernels, "hopper" needs an sm_90a device (its default),
    "any" leaves the choice to cudattn. ``host``: NumPy in, NumPy out (the synchronous path).
    """

    op: str
    dtype: str
    B: int = 1
    Sq: int = 1
    Sk: int = 1
    Hq: int = 1
    Hkv: int = 1
    D: int = 64
    causal: bool = False
    layout: str = "bshd"
    family: str = "any"
    num_splits: int | None = None
    lse: bool = True
    host: bool = False
    quant: str = ""
    per: str = "head"
    out_dtype: str = ""
    seqlens: tuple[int, ...] = ()
    page_size: int = 0
    s_new: int = 0
    index_on_device: bool = True
    parts: int = 0
    stacked: bool = False
    tag: str = ""  # distinguishes otherwise equal cases (the load mix numbers its problems)

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}; got {self.op!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}; got {self.family!r}")
        if self.layout not in ("bshd", "bhsd"):
            raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {self.layout!r}")
        if self.Hq % self.Hkv:
            raise ValueError(f"Hq ({self.Hq}) must be a multiple of Hkv ({self.Hkv})")
        if self.op == "attention" and self.dtype == FP8 and self.quant not in ("device", "host"):
            raise ValueError("an FP8 attention case says where quantize_fp8 runs: quant='device' or 'host'")
        if self.op == "kvcache":
            if len(self.seqlens) != self.B:
                raise ValueError(f"kvcache: seqlens needs B={self.B} entries; got {self.seqlens}")
            if max(self.seqlens) + self.s_new > self.Sk:
                raise ValueError(f"kvcache: seqlens {self.seqlens} + s_new {self.s_new} overflow capacity {self.Sk}")
            if self.page_size and (self.page_size % 16 or self.Sk % self.page_size):
                raise ValueError(f"kvcache: page_size {self.page_size} must be a multiple of 16 dividing {self.Sk}")
        if self.op == "merge" and self.parts < 1:
            raise ValueError("merge: parts must be >= 1")

    @property
    def fp8(self) -> bool:
        return self.dtype == FP8

    @property
    def decode(self) -> bool:
        """A 16-bit attention call that takes the split-KV kernel, whatever the family."""
        return self.op == "attention" and not self.fp8 and (self.Sq <= DECODE_MAX_SQ or self.num_splits is not None)

    @property
    def mutates_inputs(self) -> bool:
        """Appending to a KV cache writes its inputs: concurrent users each need their own copy."""
        return self.op == "kvcache" and self.s_new > 0

    @property
    def group(self) -> str:
        """The summary table's row: which kernels the case exercises."""
        if self.op != "attention":
            return self.op
        if self.decode:
            return "decode"
        return ("fp8-" if self.fp8 else "") + ("prefill" if self.family == "any" else self.family)

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    @property
    def name(self) -> str:
        parts = [f"{self.group}:", _SHORT[self.dtype]]
        if self.op == "quantize":
            parts += [f"B{self.B} S{self.Sq} H{self.Hq}/{self.Hkv} D{self.D}", f"per-{self.per}", self.layout]
        elif self.op == "merge":
            parts += [f"{self.parts} parts", "stacked" if self.stacked else "list",
                      f"B{self.B} Sq{self.Sq} H{self.Hq} D{self.D}", self.layout]
        else:
            keys = f"cap{self.Sk}" if self.op == "kvcache" else f"Sk{self.Sk}"
            parts += [f"B{self.B} Sq{self.Sq} {keys} H{self.Hq}/{self.Hkv} D{self.D}",
                      "causal" if self.causal else "full", self.layout]
            if self.op == "kvcache":
                parts += [f"lens{list(self.seqlens)}".replace(" ", ""),
                          f"paged{self.page_size}" if self.page_size else "contiguous"]
                if self.s_new:
                    parts.append(f"append{self.s_new}")
                if not self.index_on_device:
                    parts.append("numpy-index")
            if self.num_splits is not None:
                parts.append(f"splits{self.num_splits}")
            if self.fp8:
                parts += [f"quant-{self.quant}", f"per-{self.per}"]
                if self.out_dtype:
                    parts.append(f"->{_SHORT[self.out_dtype]}")
            if not self.lse:
                parts.append("no-lse")
        if self.host:
            parts.append("numpy")
        if self.tag:
            parts.append(self.tag)
        return " ".join(parts)

    def skip_reason(self, arch: str, *, hopper_archs: tuple[str, ...], fp8_archs: tuple[str, ...]) -> str | None:
        """Why this case cannot run on a device of compile target ``arch`` (None: it can)."""
        if self.family == "hopper" and arch not in hopper_archs:
            return f"the Hopper family needs {'/'.join(hopper_archs)}; this device is {arch}"
        if (self.fp8 or self.op == "quantize") and arch not in fp8_archs:
            return f"FP8 needs {'/'.join(fp8_archs)}; this device is {arch}"
        return None


def _attn(family, dtype, B, Sq, Sk, Hq, Hkv, D, **kw) -> Case:
    return Case("attention", dtype, B, Sq, Sk, Hq, Hkv, D, family=family, **kw)


def _family_cases(fam: str) -> list[Case]:
    """The prefill kernels of one family (Sq > 16, else the split-KV kernel would serve the call)."""
    return [
        _attn(fam, "bfloat16", 2, 65, 65, 4, 2, 128, causal=True),  # GQA, one full tile + a 1-row tail
        _attn(fam, "float16", 2, 113, 203, 4, 1, 96, layout="bhsd"),  # MQA, head dim padded to its tile
        _attn(fam, "bfloat16", 1, 203, 113, 2, 2, 64, causal=True),  # Sq > Sk: the first 90 rows see no key
        _attn(fam, "float16", 1, 65, 1, 2, 2, 64),  # one key
        _attn(fam, "float16", 1, 65, 203, 6, 3, 256, causal=True, layout="bhsd"),
        _attn(fam, "bfloat16", 1, 113, 65, 2, 1, 32, lse=False),
        _attn(fam, "float16", 1, 203, 203, 2, 2, 192, causal=True),
        _attn(fam, "bfloat16", 1, 17, 113, 8, 8, 8, causal=True),  # smallest head dim, one query past decode
        _attn(fam, "float16", 2, 113, 113, 4, 2, 64, causal=True, host=True),
        _attn(fam, FP8, 2, 65, 203, 4, 2, 128, causal=True, quant="device"),
        _attn(fam, FP8, 1, 203, 113, 2, 1, 64, causal=True, layout="bhsd", quant="host", per="tensor",
              out_dtype="float16"),
        _attn(fam, FP8, 1, 113, 65, 2, 2, 256, quant="device", per="tensor", out_dtype="float32", lse=False),
        _attn(fam, FP8, 1, 65, 65, 2, 2, 128, causal=True, quant="host", host=True),
    ]


def _decode_cases() -> list[Case]:
    return [
        _attn("any", "float16", 2, 1, 203, 8, 2, 128, num_splits=2),
        _attn("any", "bfloat16", 2, 3, 1000, 8, 1, 64, causal=True, num_splits=3, layout="bhsd"),
        _attn("any", "float16", 1, 16, 65, 4, 4, 256, causal=True, num_splits=4),
        _attn("any", "bfloat16", 2, 16, 5, 4, 1, 128, causal=True, num_splits=2),  # 11 rows see no key
        _attn("any", "float16", 1, 1, 113, 6, 3, 40),  # num_splits chosen by the heuristic
        _attn("any", "bfloat16", 3, 1, 17, 4, 4, 64, num_splits=4),  # 17 keys in one tile: 3 splits empty
    ]


def _kvcache_cases() -> list[Case]:
    kv = lambda *a, **kw: Case("kvcache", *a, **kw)  # noqa: E731
    return [
        kv("float16", 3, 1, 300, 8, 2, 128, causal=True, seqlens=(0, 65, 203), s_new=2, num_splits=2),
        kv("bfloat16", 3, 2, 256, 4, 1, 64, causal=True, seqlens=(113, 0, 203), page_size=16, s_new=3,
           num_splits=3),
        kv("float16", 2, 4, 512, 8, 8, 128, causal=True, seqlens=(65, 449), page_size=32, num_splits=4,
           index_on_device=False),
        kv("bfloat16", 2, 1, 128, 4, 2, 64, causal=True, seqlens=(1, 65), s_new=1, num_splits=2, host=True),
    ]


def _merge_cases() -> list[Case]:
    return [
        Case("merge", "float16", 2, 3, 0, 4, 1, 64, parts=3),
        Case("merge", "bfloat16", 2, 5, 0, 2, 1, 128, parts=2, stacked=True, layout="bhsd"),
        Case("merge", "float32", 1, 4, 0, 3, 1, 64, parts=5, stacked=True),
    ]


def _quantize_cases() -> list[Case]:
    return [
        Case("quantize", "float32", 2, 65, 0, 4, 2, 64, per="head"),
        Case("quantize", "bfloat16", 1, 113, 0, 2, 2, 128, per="tensor", layout="bhsd"),
    ]


def selfcheck_cases() -> list[Case]:
    return (_family_cases("portable") + _family_cases("hopper") + _decode_cases() + _kvcache_cases()
            + _merge_cases() + _quantize_cases())


def sanitize_cases() -> list[Case]:
    """One small case per path: sanitizers run 10-100x slower (racecheck the slowest)."""
    return [
        _attn("portable", "bfloat16", 1, 65, 113, 2, 1, 64, causal=True),
        _attn("hopper", "bfloat16", 1, 113, 65, 2, 1, 64, causal=True),  # 48 rows see no key
        _attn("portable", FP8, 1, 65, 65, 2, 2, 64, causal=True, quant="device"),
        _attn("hopper", FP8, 1, 65, 113, 2, 2, 128, quant="device"),
        _attn("any", "float16", 1, 3, 203, 4, 2, 64, causal=True, num_splits=3),
        Case("kvcache", "float16", 2, 1, 64, 2, 1, 64, causal=True, seqlens=(17, 0), page_size=16, s_new=2,
             num_splits=2),
        Case("merge", "float16", 1, 2, 0, 2, 1, 64, parts=3),
        Case("quantize", "float32", 1, 65, 0, 2, 2, 64, per="head"),
    ]


CASE_SETS = {"full": selfcheck_cases, "sanitize": sanitize_cases}

# The load mix draws from these.
_LOAD_SEQ = (1, 17, 65, 113, 203, 256, 511)
_LOAD_HEADS = ((2, 2), (4, 2), (4, 1), (8, 2))
_LOAD_DIMS = (64, 64, 128, 128, 32, 256)
_LOAD_OPS = ("attention",) * 8 + ("fp8",) * 3 + ("decode",) * 3 + ("kvcache",) * 3 + ("merge", "quantize", "host")


def load_cases(n: int = 40, seed: int = 0) -> list[Case]:
    """``n`` small problems drawn from every path (family "any": the device's own), seeded.

    The first ones take each kind of `_LOAD_OPS` once, so a mix of 7 or more covers them all; the
    rest are drawn with `_LOAD_OPS`'s weights."""
    rng = np.random.default_rng(seed)
    distinct = sorted(set(_LOAD_OPS))
    kinds = [distinct[i] for i in rng.permutation(len(distinct))]
    kinds += [_LOAD_OPS[i] for i in rng.integers(0, len(_LOAD_OPS), max(0, n - len(kinds)))]
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    cases = []
    for i, kind in enumerate(kinds[:n]):
        Hq, Hkv = pick(_LOAD_HEADS)
        D = pick(_LOAD_DIMS)
        dt = pick(("float16", "bfloat16"))
        causal = bool(rng.integers(2))
        layout = pick(("bshd", "bhsd"))
        B = int(rng.integers(1, 3))
        tag = f"#{i:02d}"
        if kind == "attention":
            c = _attn("any", dt, B, max(17, pick(_LOAD_SEQ)), pick(_LOAD_SEQ), Hq, Hkv, D, causal=causal,
                      layout=layout, lse=bool(rng.integers(2)), tag=tag)
        elif kind == "fp8":
            c = _attn("any", FP8, B, max(17, pick(_LOAD_SEQ)), pick(_LOAD_SEQ), Hq, Hkv, pick((64, 128, 256)),
                      causal=causal, layout=layout, quant="host", per=pick(("head", "tensor")), tag=tag)
        elif kind == "decode":
            c = _attn("any", dt, B, pick((1, 2, 5, 16)), pick(_LOAD_SEQ[2:]) * 2 + 1, Hq, Hkv, D, causal=causal,
                      layout=layout, num_splits=int(rng.integers(2, 5)), tag=tag)
        elif kind == "kvcache":
            cap = 256
            lens = tuple(int(x) for x in rng.integers(0, cap - 4, B))
            c = Case("kvcache", dt, B, pick((1, 3)), cap, Hq, Hkv, D, causal=causal, seqlens=lens,
                     page_size=pick((0, 16, 64)), s_new=pick((0, 2)), num_splits=pick((None, 2, 3)), tag=tag)
        elif kind == "merge":
            c = Case("merge", pick(("float16", "bfloat16", "float32")), B, 3, 0, Hq, 1, D,
                     parts=int(rng.integers(2, 5)), stacked=bool(rng.integers(2)), layout=layout, tag=tag)
        elif kind == "quantize":
            c = Case("quantize", pick(("float32", "bfloat16")), B, pick(_LOAD_SEQ), 0, Hq, Hkv, D,
                     per=pick(("head", "tensor")), layout=layout, tag=tag)
        else:  # the NumPy path, large enough (2 MiB a tensor) to go through the pinned staging chunks
            c = _attn("any", "float16", 1, 1024, 1024, 8, 2, 128, causal=causal, host=True, tag=tag)
        cases.append(c)
    return cases
