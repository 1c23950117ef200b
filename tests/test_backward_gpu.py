"""GPU: `cudattn.attention_backward` against the float64 reference under FlashAttention's rule
``max|grad − ref| ≤ 2·max|naive − ref| + eps`` (naive: the same math in the input dtype), with
FlashAttention-3's eps for gradients: twice the rounding of ``ref + 0.3`` to the input dtype,
which allows for the gradient's own rounding to 16 bits (naive's error already holds one such
rounding, but as a maximum over elements, not a bound).

Odd length pairs from (1, 1) to (1023, 1024) (head dims 32–256 in turn) and 4224, head dims 32–256
on fixed lengths, MHA/GQA/MQA, causal and not, both layouts, strided inputs, packed batches, every modifier (softcap, ALiBi, windows, sinks
with their own gradient), the NumPy path, gradients written in place (poisoned with NaN first),
deterministic mode bit for bit over 10 runs, and the portable tiles of GPUs with less shared
memory (chosen as if the device had 163 or 99 KiB).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn.reference.rule import check_close, gradient_eps

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_family")]

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
_seed = itertools.count(39000)


def _inputs(B, Sq, Sk, Hq, Hkv, D, dtype, layout="bshd"):
    rng = np.random.default_rng(next(_seed))
    qs, ks = ((B, Sq, Hq, D), (B, Sk, Hkv, D)) if layout == "bshd" else ((B, Hq, Sq, D), (B, Hkv, Sk, D))
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (qs, ks, ks))
    dout = rng.standard_normal(qs).astype(dtype)
    return dout, q, k, v


def _poisoned(shape, dtype):
    return cudattn.to_device(np.full(shape, np.nan, dtype))


def _sinks_eps(dout, q, k, v, dtype, **mods):
    """The eps of dsinks = −Σ_rows exp(sink − LSE)·D, D = Σ_d dO·O over the forward's O in the
    16-bit dtype. Rounding O moves each O_d by up to u·|O_d| (u: the dtype's unit roundoff),
    independently, and differently in the kernels and in naive, so D drifts by about
    u·sqrt(Σ_d (dO·O)²) and the sum over rows by the root of the sum of the rows' squares; eps is
    4 of those. Naive's own error is a single draw of that drift (only Hq values), too few to
    bound it alone."""
    out, lse = reference.attention(q, k, v, return_lse=True, **mods)  # float64 (B, Sq, Hq, D), (B, Hq, Sq)
    p_sink = np.exp(np.asarray(mods["sinks"], np.float64)[None, :, None] - lse)
    mag = np.sqrt(((np.asarray(dout, np.float64) * out) ** 2).sum(-1)).transpose(0, 2, 1)  # (B, Hq, Sq)
    u = 2.0**-8 if np.dtype(dtype) == BF16 else 2.0**-11
    return 4 * u * float(np.sqrt(((p_sink * mag) ** 2).sum(axis=(0, 2))).max()) + 1e-5


def _check(grads, ref, naive, what, sinks_eps=None):
    for name, g, r, n in zip(("dq", "dk", "dv", "dsinks"), grads, ref, naive):
        g = g if isinstance(g, np.ndarray) else cudattn.to_host(g)
        dt = np.asarray(n).dtype
        eps = sinks_eps if name == "dsinks" and sinks_eps is not None else \
            1e-5 if dt == np.float32 else gradient_eps(r, dt)  # dsinks: float32 sums
        ok, err, bound = check_close(g, r, n, atol=eps)
        assert ok, f"{what}: {name} off by {err:.3g} > {bound:.3g}"


def _run(dout, q, k, v, *, dtype, layout="bshd", deterministic=False, in_place=True, **mods):
    """Forward then backward on device arrays; gradients poisoned and written in place."""
    dev = [cudattn.to_device(x) for x in (dout, q, k, v)]
    out, lse = cudattn.attention(*dev[1:], layout=layout, return_lse=True, **mods)
    given = dict(dq=_poisoned(q.shape, dtype), dk=_poisoned(k.shape, dtype), dv=_poisoned(v.shape, dtype)) \
        if in_place else {}
    res = cudattn.attention_backward(dev[0], *dev[1:], out, lse, layout=layout, deterministic=deterministic,
                                     **given, **mods)
    if in_place:
        assert res[0] is given["dq"] and res[1] is given["dk"] and res[2] is given["dv"]
    return res


def _expect(dout, q, k, v, dtype, layout="bshd", **mods):
    ref = reference.attention_backward(dout, q, k, v, layout=layout, **mods)
    naive = reference.attention_backward_naive(dout, q, k, v, layout=layout, dtype=dtype, **mods)
    return ref, naive


def _skip_if_portable_anyway(kernel_family, D, dtype, causal):
    """On Hopper, a head dim the Hopper kernel does not serve runs the portable kernel in the
    'fastest' family too: the 'portable' run covers it."""
    from cudattn._kernels import backward_traits as _bt
    from cudattn._kernels import traits as _traits
    from cudattn._runtime import device as _device
    props = _device.device_properties(0)
    if (kernel_family == "fastest" and props.arch in _traits.HOPPER_ARCHS
            and _bt.select_for_device(dtype, D, causal, props).family == "sm80"):
        pytest.skip(f"head_dim {D} runs the portable kernel on Hopper too: covered by 'portable'")


_LENGTHS = [(1, 1), (1, 239), (3, 799), (113, 203), (127, 512), (128, 217), (108, 256), (256, 512), (239, 1),
            (512, 256), (799, 3), (1023, 1024), (1024, 1023)]


@pytest.mark.parametrize("Sq,Sk", _LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_lengths(Sq, Sk, causal):
    D = (32, 64, 96, 128, 192, 256)[(Sq + Sk) % 6]
    dtype = (F16, BF16)[(Sq * 7 + Sk) % 2]
    dout, q, k, v = _inputs(1, Sq, Sk, 4, 2, D, dtype)
    _check(_run(dout, q, k, v, dtype=dtype, causal=causal), *_expect(dout, q, k, v, dtype, causal=causal),
           f"Sq={Sq} Sk={Sk} D={D} causal={causal} {dtype}")


@pytest.mark.parametrize("D", [32, 40, 64, 80, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_and_groups(D, heads, dtype, causal, kernel_family):
    _skip_if_portable_anyway(kernel_family, D, dtype, causal)
    Hq, Hkv = heads
    dout, q, k, v = _inputs(2, 203, 301, Hq, Hkv, D, dtype)
    _check(_run(dout, q, k, v, dtype=dtype, causal=causal), *_expect(dout, q, k, v, dtype, causal=causal),
           f"D={D} heads={heads} causal={causal}")


def test_long_4224():
    dout, q, k, v = _inputs(1, 4224, 4224, 2, 1, 128, BF16)
    for causal in (False, True):
        _check(_run(dout, q, k, v, dtype=BF16, causal=causal), *_expect(dout, q, k, v, BF16, causal=causal),
               f"4224 causal={causal}")


_MODS = {
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi="per_head"),
    "alibi_batch": dict(alibi="per_batch"),
    "window": dict(window_size=(61, 17)),
    "window_causal": dict(window_size=(100, -1), causal=True),
    "window_left_open": dict(window_size=(-1, 5)),
    "sinks": dict(sinks=True),
    "sinks_causal_empty_rows": dict(sinks=True, causal=True),
    "all": dict(softcap=20.0, alibi="per_head", window_size=(70, 30), sinks=True),
    "all_causal": dict(softcap=50.0, alibi="per_batch", window_size=(90, 0), sinks=True, causal=True),
}


def _mods(B, Hq, spec, rng):
    out = {k: v for k, v in spec.items() if k not in ("alibi", "sinks")}
    if spec.get("alibi") == "per_head":
        out["alibi_slopes"] = rng.uniform(0.01, 0.3, Hq).astype(np.float32)
    elif spec.get("alibi") == "per_batch":
        out["alibi_slopes"] = rng.uniform(0.01, 0.3, (B, Hq)).astype(np.float32)
    if spec.get("sinks"):
        out["sinks"] = rng.uniform(-1, 3, Hq).astype(np.float32)
    return out


def _dev(mods):
    return {k: cudattn.to_device(v) if isinstance(v, np.ndarray) else v for k, v in mods.items()}


@pytest.mark.parametrize("name", list(_MODS))
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_modifiers(name, D, dtype):
    rng = np.random.default_rng(next(_seed))
    B, Sq, Sk, Hq, Hkv = 2, 301, 250, 4, 2
    dout, q, k, v = _inputs(B, Sq, Sk, Hq, Hkv, D, dtype)
    mods = _mods(B, Hq, _MODS[name], rng)
    res = _run(dout, q, k, v, dtype=dtype, **_dev(mods))
    assert len(res) == (4 if "sinks" in mods else 3)
    eps = _sinks_eps(dout, q, k, v, dtype, **mods) if "sinks" in mods else None
    _check(res, *_expect(dout, q, k, v, dtype, **mods), f"{name} D={D}", eps)


def test_bhsd_and_strided():
    dtype = F16
    dout, q, k, v = _inputs(2, 157, 333, 4, 2, 64, dtype, layout="bhsd")
    _check(_run(dout, q, k, v, dtype=dtype, layout="bhsd", causal=True),
           *_expect(dout, q, k, v, dtype, layout="bhsd", causal=True), "bhsd")
    # strided: every other head of a wider tensor, and gradients allocated by cudattn
    rng = np.random.default_rng(next(_seed))
    wide = [rng.standard_normal((2, 211, 8, 64)).astype(dtype) for _ in range(4)]
    dev = [cudattn.to_device(w)[:, :, ::2] for w in wide]
    host = [w[:, :, ::2] for w in wide]
    out, lse = cudattn.attention(*dev[1:], return_lse=True)
    res = cudattn.attention_backward(dev[0], *dev[1:], out, lse)
    _check(res, *_expect(*host, dtype), "strided")


def test_numpy_path_and_gradients_given():
    dtype = BF16
    dout, q, k, v = _inputs(1, 190, 190, 4, 1, 128, dtype)
    out, lse = cudattn.attention(q, k, v, causal=True, return_lse=True)
    dq = np.full(q.shape, np.nan, dtype)
    res = cudattn.attention_backward(dout, q, k, v, out, lse, causal=True, dq=dq)
    assert res[0] is dq and all(isinstance(r, np.ndarray) for r in res)
    _check(res, *_expect(dout, q, k, v, dtype, causal=True), "numpy")


@pytest.mark.parametrize("D", [64, 128, 192, 256])
def test_varlen(D):
    rng = np.random.default_rng(next(_seed))
    dtype = F16
    lq, lk = [5, 0, 130, 77, 1], [9, 17, 130, 200, 1]
    Hq, Hkv = 4, 2
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = rng.standard_normal((cq[-1], Hq, D)).astype(dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    k, v = (rng.standard_normal((ck[-1], Hkv, D)).astype(dtype) for _ in range(2))
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32)
    for causal in (False, True):
        kw = dict(cu_seqlens_q=cudattn.to_device(cq), cu_seqlens_k=cudattn.to_device(ck), max_seqlen_q=max(lq),
                  max_seqlen_k=max(lk), causal=causal)
        dev = [cudattn.to_device(x) for x in (dout, q, k, v)]
        out, lse = cudattn.attention(*dev[1:], return_lse=True, sinks=cudattn.to_device(sinks), **kw)
        res = cudattn.attention_backward(dev[0], *dev[1:], out, lse, sinks=cudattn.to_device(sinks), **kw)
        ref = reference.attention_backward(dout, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=causal,
                                           sinks=sinks)
        # naive per sequence, packed back
        parts = [reference.attention_backward_naive(dout[None, cq[b]:cq[b + 1]], q[None, cq[b]:cq[b + 1]],
                                                    k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                                    causal=causal, sinks=sinks) for b in range(len(lq))]
        naive = (np.concatenate([p[0][0] for p in parts]), np.concatenate([p[1][0] for p in parts]),
                 np.concatenate([p[2][0] for p in parts]), np.sum([p[3] for p in parts], axis=0))
        eps = np.sqrt(sum(_sinks_eps(dout[None, cq[b]:cq[b + 1]], q[None, cq[b]:cq[b + 1]],
                                     k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], dtype, causal=causal,
                                     sinks=sinks) ** 2 for b in range(len(lq)) if lq[b] > 0))
        _check(res, ref, naive, f"varlen causal={causal}", eps)


@pytest.mark.parametrize("heads,D", [((4, 4), 64), ((8, 2), 64), ((8, 2), 128), ((4, 1), 256), ((6, 2), 192)])
def test_deterministic_bit_identical(heads, D):
    dtype = BF16
    Hq, Hkv = heads
    dout, q, k, v = _inputs(2, 700, 900, Hq, Hkv, D, dtype)
    rng = np.random.default_rng(next(_seed))
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32)
    dev = [cudattn.to_device(x) for x in (dout, q, k, v)]
    out, lse = cudattn.attention(*dev[1:], causal=True, return_lse=True, sinks=cudattn.to_device(sinks))
    runs = [[cudattn.to_host(g) for g in cudattn.attention_backward(
        dev[0], *dev[1:], out, lse, causal=True, sinks=cudattn.to_device(sinks), deterministic=True)]
        for _ in range(10)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert np.array_equal(a.view(np.uint16) if a.dtype != np.float32 else a.view(np.uint32),
                                  b.view(np.uint16) if b.dtype != np.float32 else b.view(np.uint32))
    _check(runs[0], *_expect(dout, q, k, v, dtype, causal=True, sinks=sinks), "deterministic",
           _sinks_eps(dout, q, k, v, dtype, causal=True, sinks=sinks))


@pytest.mark.parametrize("kind", ["full", "window", "packed"])
def test_deterministic_wide_tile(kind):
    """Deterministic mode at the 256-wide tile (on Hopper its own kernel, whose writer warp holds a
    query block's turn over two passes) without a causal mask, with a window, and packed."""
    dtype, Hq, Hkv = BF16, 4, 2
    rng = np.random.default_rng(next(_seed))
    if kind == "packed":
        D, lq, lk = 200, [130, 1, 77, 300], [200, 9, 64, 301]
        cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
        q, dout = (rng.standard_normal((cq[-1], Hq, D)).astype(dtype) for _ in range(2))
        k, v = (rng.standard_normal((ck[-1], Hkv, D)).astype(dtype) for _ in range(2))
        kw = dict(cu_seqlens_q=cudattn.to_device(cq), cu_seqlens_k=cudattn.to_device(ck), max_seqlen_q=max(lq),
                  max_seqlen_k=max(lk))
    else:
        D = 256
        dout, q, k, v = _inputs(2, 333, 517, Hq, Hkv, D, dtype)
        kw = dict(window_size=(96, 40)) if kind == "window" else {}
    dev = [cudattn.to_device(x) for x in (dout, q, k, v)]
    out, lse = cudattn.attention(*dev[1:], return_lse=True, **kw)
    runs = [[cudattn.to_host(g) for g in cudattn.attention_backward(dev[0], *dev[1:], out, lse, deterministic=True,
                                                                      **kw)] for _ in range(5)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    if kind == "packed":
        ref = reference.attention_backward(dout, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
        parts = [reference.attention_backward_naive(dout[None, cq[b]:cq[b + 1]], q[None, cq[b]:cq[b + 1]],
                                                    k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], dtype=dtype)
                 for b in range(len(lq))]
        naive = tuple(np.concatenate([p[i][0] for p in parts]) for i in range(3))
        _check(runs[0], ref, naive, "deterministic packed")
    else:
        _check(runs[0], *_expect(dout, q, k, v, dtype, **kw), f"deterministic {kind}")


@pytest.mark.parametrize("D", [64, 256])
def test_causal_many_head_batch_pairs(D):
    """Causal with more (KV head, batch) pairs than the Hopper kernel puts in one heavy-first group
    (32): 3 x 13 pairs, the last group partial. Deterministic too, bit for bit."""
    dtype = BF16
    dout, q, k, v = _inputs(3, 150, 200, 26, 13, D, dtype)
    ref, naive = _expect(dout, q, k, v, dtype, causal=True)
    _check(_run(dout, q, k, v, dtype=dtype, causal=True), ref, naive, "many pairs")
    runs = [[cudattn.to_host(g) for g in _run(dout, q, k, v, dtype=dtype, causal=True, deterministic=True)]
            for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    _check(runs[0], ref, naive, "many pairs, deterministic")


def test_torch_graph_capture_with_gradients_given():
    """Captured in a torch CUDA graph with dq, dk, dv preallocated (the workspace becomes graph
    memory nodes); a replay on new inputs equals a direct call bit for bit (deterministic)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(3)
    mk = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    q, dout = mk(2, 333, 4, 64), mk(2, 333, 4, 64)
    k, v = mk(2, 333, 2, 64), mk(2, 333, 2, 64)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 333, device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture (compiles, records the call)
        o_, l_ = cudattn.attention(q, k, v, causal=True, return_lse=True, stream=s.cuda_stream)
        out.copy_(torch.from_dlpack(o_))
        lse.copy_(torch.from_dlpack(l_))
        cudattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, dq=dq, dk=dk, dv=dv,
                                   stream=s.cuda_stream)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cudattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True, dq=dq, dk=dk, dv=dv,
                                   stream=torch.cuda.current_stream().cuda_stream)
    dout.copy_(mk(2, 333, 4, 64))  # new upstream gradient, same buffers
    for x in (dq, dk, dv):
        x.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    direct = cudattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for got, want in zip((dq, dk, dv), direct):
        assert torch.equal(got.view(torch.int16), torch.from_dlpack(want).view(torch.int16))


def test_warm_calls_replay_and_still_refuse_overlaps():
    """A second call of a signature replays the recorded launches (new addresses patched in) and
    gives the direct result; gradients that overlap an input or each other are still refused."""
    dtype = F16
    dout, q, k, v = _inputs(1, 257, 257, 4, 2, 64, dtype)
    dev = [cudattn.to_device(x) for x in (dout, q, k, v)]
    out, lse = cudattn.attention(*dev[1:], causal=True, return_lse=True)
    ref, naive = _expect(dout, q, k, v, dtype, causal=True)
    for _ in range(3):  # first: full path and recording; then replays into fresh poisoned buffers
        given = dict(dq=_poisoned(q.shape, dtype), dk=_poisoned(k.shape, dtype), dv=_poisoned(v.shape, dtype))
        res = cudattn.attention_backward(dev[0], *dev[1:], out, lse, causal=True, **given)
        assert res == (given["dq"], given["dk"], given["dv"])
        _check(res, ref, naive, "warm")
    kv = cudattn.to_device(np.zeros((1, 257, 4, 64), dtype))
    with pytest.raises(ValueError, match="dq overlaps q"):
        cudattn.attention_backward(dev[0], *dev[1:], out, lse, causal=True, dq=dev[1], dk=given["dk"], dv=given["dv"])
    with pytest.raises(ValueError, match="dv overlaps dk"):
        cudattn.attention_backward(dev[0], *dev[1:], out, lse, causal=True, dq=given["dq"], dk=kv[:, :, 0:2],
                                   dv=kv[:, :, 1:3])


# The portable tiles that GPUs with less shared memory than this one get (backward_traits: the
# first candidate that fits): 163 KiB (A100, sm_80/87) and 99 KiB (sm_86/89), checked here by
# selecting as if the device had only that much.
_SMALLER_GPUS = {"163KiB": 166912, "99KiB": 101376}


@pytest.mark.parametrize("limit", list(_SMALLER_GPUS), ids=list(_SMALLER_GPUS))
@pytest.mark.parametrize("D,mods", [(64, {}), (128, {}), (128, {"softcap": 20.0}), (192, {}), (256, {}),
                                    (256, {"alibi": "per_head", "window_size": (70, 30)})])
@pytest.mark.parametrize("causal", [False, True])
def test_tiles_of_gpus_with_less_shared_memory(limit, D, mods, causal, kernel_family, monkeypatch):
    if kernel_family == "portable":
        pytest.skip("the same portable tiles as 'fastest' here")
    from cudattn._calls import call as _call
    from cudattn._kernels import backward as _backward
    from cudattn._kernels import backward_traits as _bt
    smem = _SMALLER_GPUS[limit]
    chosen = []

    def select(dtype, head_dim, causal_, props, mods_=0, tma=True):
        k = _bt.select_backward(dtype, head_dim, causal_, smem, mods_, "sm80")
        chosen.append(k)
        return k

    monkeypatch.setattr(_backward, "select_for_device", select)
    monkeypatch.setattr(_call, "_plans", {})  # no replay of a call recorded with this device's own tiles
    rng = np.random.default_rng(next(_seed))
    B, Hq = 2, 4
    dout, q, k, v = _inputs(B, 203, 301, Hq, 2, D, BF16)
    kw = _mods(B, Hq, mods, rng)
    res = _run(dout, q, k, v, dtype=BF16, causal=causal, **_dev(kw))
    assert chosen and all(c.smem_bytes <= smem and c.family == "sm80" for c in chosen)
    _check(res, *_expect(dout, q, k, v, BF16, causal=causal, **kw), f"{limit} D={D} {mods} causal={causal}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
def test_alibi_with_a_shifted_diagonal_gives_a_key_ranges_gradients(dtype, D):
    """The backward with ALiBi's diagonal moved (`_kernels.alibi_shift`, as a ring's local calls use
    it): two key ranges, each call given the whole call's out and LSE and its diagonal moved so that
    its distances are the whole call's; their dK and dV side by side and their dQ summed equal the
    whole call's gradients (dQ: two 16-bit partials, so twice the rule's eps)."""
    from cudattn._kernels import alibi_shift

    B, S, Hq, Hkv, m = 2, 203, 8, 2, 77
    dout, q, k, v = _inputs(B, S, S, Hq, Hkv, D, dtype)
    slopes = np.random.default_rng(next(_seed)).uniform(0.02, 0.5, Hq).astype(np.float32)
    ref, naive = _expect(dout, q, k, v, dtype, alibi_slopes=slopes)
    dod, qd, kd, vd, sd = (cudattn.to_device(x) for x in (dout, q, k, v, slopes))
    out, lse = cudattn.attention(qd, kd, vd, alibi_slopes=sd, return_lse=True)
    grads = []
    for (a, b), shift in (((0, m), S - m), ((m, S), 0)):
        given = dict(dq=_poisoned(q.shape, dtype), dk=_poisoned((B, b - a, Hkv, D), dtype),
                     dv=_poisoned((B, b - a, Hkv, D), dtype))
        with alibi_shift.shifted(shift):
            grads.append([cudattn.to_host(g) for g in cudattn.attention_backward(
                dod, qd, kd[:, a:b], vd[:, a:b], out, lse, alibi_slopes=sd, **given)])
    dq = (grads[0][0].astype(np.float64) + grads[1][0].astype(np.float64))
    dk, dv = (np.concatenate([g[i] for g in grads], axis=1) for i in (1, 2))
    for name, g, r, n, eps in (("dq", dq, ref[0], naive[0], 2 * gradient_eps(ref[0], dtype)),
                               ("dk", dk, ref[1], naive[1], gradient_eps(ref[1], dtype)),
                               ("dv", dv, ref[2], naive[2], gradient_eps(ref[2], dtype))):
        ok, err, bound = check_close(g, r, n, atol=eps)
        assert ok, f"{name} off by {err:.3g} > {bound:.3g}"
