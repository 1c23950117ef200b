"""A case on the GPU through the public API: `prepare` (upload once), `call` (into NaN-poisoned
outputs where the API takes ``out=``), `fetch` (to NumPy). Load and soak call one prepared case
many times; `run` does all three once.

Nothing here checks results (`_check` does); a failed call raises.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

import cudattn
from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._kernels import traits as _traits
from cudattn._arrays import host_io as _host_io

from ._cases import Case
from ._inputs import DTYPES, make_inputs

_F32 = np.dtype(np.float32)


class SelfcheckError(AssertionError):
    """The API broke its contract in a way no reference comparison would show (e.g. ignored out=)."""


@contextlib.contextmanager
def kernel_family(family: str):
    """Run the case's kernel family: "portable" forces sm80, "hopper" clears any forcing (the
    device's default then, which `Case.skip_reason` made sure is Hopper), "any" leaves it alone.

    `_kernels.traits.FORCED_FAMILY` is process-wide: concurrent callers must agree on it (load runs
    "any" only)."""
    if family == "any":
        yield
        return
    old = _traits.FORCED_FAMILY
    _traits.FORCED_FAMILY = "sm80" if family == "portable" else None
    try:
        yield
    finally:
        _traits.FORCED_FAMILY = old


@dataclass
class Prepared:
    """A case ready to call: ``args`` the operands (device arrays, or NumPy for host cases),
    ``ref`` the host arrays the reference reads, ``block_n`` the FP8 kernel's key tile."""

    case: Case
    args: dict = field(default_factory=dict)
    ref: dict = field(default_factory=dict)
    block_n: int = 128


def out_dtype(c: Case) -> np.dtype:
    if c.fp8:
        return DTYPES[c.out_dtype or "bfloat16"]
    return DTYPES[c.dtype]


def prepare(c: Case, inputs: dict, stream=None) -> Prepared:
    """Upload a case's inputs (FP8 device cases also quantise them on the device); ``inputs``
    from `make_inputs`, never modified. Run under the case's `kernel_family`."""
    return {"attention": _prepare_attention, "kvcache": _prepare_kvcache, "merge": _prepare_merge,
            "quantize": _prepare_quantize}[c.op](c, inputs, stream)


def _up(x, stream):
    return None if x is None else cudattn.to_device(x, stream=stream)


def _prepare_attention(c: Case, inp: dict, stream) -> Prepared:
    p = Prepared(c)
    if not c.fp8:
        p.ref = {k: inp[k] for k in "qkv"}
        p.args = dict(p.ref) if c.host else {k: _up(inp[k], stream) for k in "qkv"}
        p.args["descales"] = {}
        return p
    p.block_n = fp8_block_n(c)
    names = ("q", "k", "v")
    if c.quant == "device":
        quant = [cudattn.quantize_fp8(_up(inp[n], stream), per=c.per, layout=c.layout, heads_kv=c.Hkv, stream=stream)
                 for n in names]
        p.args = dict(zip(names, (x8 for x8, _ in quant)))
        p.args["descales"] = {f"{n}_descale": d for n, (_, d) in zip(names, quant)}
        p.ref = {n: _host_io.to_host(x8, stream=stream) for n, (x8, _) in zip(names, quant)}
        p.ref["descales"] = {f"{n}_descale": _host_io.to_host(d, stream=stream) for n, (_, d) in zip(names, quant)}
        return p
    quant = [cudattn.quantize_fp8(inp[n], per=c.per, layout=c.layout, heads_kv=c.Hkv) for n in names]
    p.ref = dict(zip(names, (x8 for x8, _ in quant)))
    # per-tensor descales go in as plain floats; per-head as (B, Hkv) arrays
    ds = {f"{n}_descale": float(d[0, 0]) if c.per == "tensor" else d for n, (_, d) in zip(names, quant)}
    p.ref["descales"] = ds
    if c.host:
        p.args = {**p.ref}
    else:
        p.args = {n: _up(p.ref[n], stream) for n in names}
        p.args["descales"] = {n: d if isinstance(d, float) else _up(d, stream) for n, d in ds.items()}
    return p


def fp8_block_n(c: Case) -> int:
    """The key tile of the FP8 kernel that serves this case on device 0 under the current family:
    the emulation in the reference rounds P against the running max of the same key tiles."""
    return _traits.key_tile(_traits.FP8, c.D, c.causal, _device.device_properties(0), c.out_dtype or None)


def _prepare_kvcache(c: Case, inp: dict, stream) -> Prepared:
    p = Prepared(c, ref=dict(inp))
    if c.host:  # the NumPy caches are written in place: the call gets its own copies
        p.args = {k: None if v is None else v.copy() for k, v in inp.items()}
        return p
    p.args = {k: _up(inp[k], stream) for k in ("q", "k_cache", "v_cache", "k_new", "v_new")}
    for k in ("seqlens", "table"):
        p.args[k] = _up(inp[k], stream) if c.index_on_device else inp[k]
    return p


def _prepare_merge(c: Case, inp: dict, stream) -> Prepared:
    p = Prepared(c, ref=dict(inp))
    if c.stacked:
        p.args = {"outs": _up(inp["outs"], stream), "lses": _up(inp["lses"], stream)}
    else:
        p.args = {"outs": [_up(x, stream) for x in inp["outs"]], "lses": [_up(x, stream) for x in inp["lses"]]}
    return p


def _prepare_quantize(c: Case, inp: dict, stream) -> Prepared:
    return Prepared(c, args={"x": _up(inp["x"], stream)}, ref=dict(inp))


def call(p: Prepared, stream=None) -> dict:
    """One call of the API on ``stream``; the results (device arrays, or NumPy for host cases).
    A KV cache case's results include its caches, which the call may have appended to."""
    c, a = p.case, p.args
    if c.op == "attention":
        return _call_attention(c, a, stream)
    if c.op == "kvcache":
        res = cudattn.attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], cache_seqlens=a["seqlens"],
                                             block_table=a["table"], k_new=a["k_new"], v_new=a["v_new"],
                                             causal=c.causal, return_lse=c.lse, num_splits=c.num_splits,
                                             stream=stream)
        o, lse = res if c.lse else (res, None)
        return {"out": o, "lse": lse, "k_cache": a["k_cache"], "v_cache": a["v_cache"]}
    if c.op == "merge":
        o, lse = cudattn.merge_attention_states(a["outs"], a["lses"], layout=c.layout, stream=stream)
        return {"out": o, "lse": lse}
    x8, d = cudattn.quantize_fp8(a["x"], per=c.per, layout=c.layout, heads_kv=c.Hkv, stream=stream)
    return {"x8": x8, "descale": d}


def _call_attention(c: Case, a: dict, stream) -> dict:
    shape = a["q"].shape
    odt = out_dtype(c)
    if c.host:
        out = np.full(shape, np.nan, odt)
    else:
        out = _array.empty(shape, odt, stream=stream)
        out.fill_nan(stream=stream)
    kw = dict(causal=c.causal, layout=c.layout, return_lse=c.lse, num_splits=c.num_splits, out=out, stream=stream)
    if c.fp8 and c.out_dtype:
        kw["out_dtype"] = odt
    res = cudattn.attention(a["q"], a["k"], a["v"], **kw, **a["descales"])
    o, lse = res if c.lse else (res, None)
    same = o is out if c.host else o.ptr == out.ptr
    if not same:
        raise SelfcheckError("attention returned a new array instead of writing into the given out=")
    return {"out": o, "lse": lse}


def fetch(results: dict, stream=None) -> dict:
    """The results as NumPy arrays (copies), waiting for them."""
    got = {}
    for k, x in results.items():
        if x is None:
            got[k] = None
        elif isinstance(x, np.ndarray):
            got[k] = x.copy()
        else:
            got[k] = _host_io.to_host(x, stream=stream)
    return got


def run(c: Case, stream=None) -> tuple[Prepared, dict]:
    """Prepare, call and fetch one case under its kernel family. The returned Prepared keeps only
    what the check reads (its device operands are dropped, so their memory goes back)."""
    with kernel_family(c.family):
        p = prepare(c, make_inputs(c), stream)
        got = fetch(call(p, stream), stream)
    p.args = {}
    return p, got
