"""`cudattn.reference.attention_backward` against finite differences of `cudattn.reference.attention`.

The loss is ``L = <dout, attention(q, k, v)>``, so its gradient is what the backward returns. For
a random direction ``u`` the central difference ``(L(x + εu) − L(x − εu)) / 2ε`` (float64, ε = 1e-5)
equals ``<grad, u>`` to about 1e-9 relative; a wrong term in any gradient (a missing softcap
derivative, a GQA sum, a sink's gradient) is off by orders more. Every modifier, both layouts,
GQA and MQA, causal with Sq ≠ Sk, rows that see no key, and packed batches.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cudattn import reference

EPS = 1e-5
RTOL = 1e-6


def _loss(dout, q, k, v, **kw):
    return float((dout * reference.attention(q, k, v, **kw)).sum())


def _loss_packed(dout, q, k, v, cq, ck, **kw):
    return float((dout * reference.attention_varlen(q, k, v, cq, ck, **kw)).sum())


SINK_EPS = 2.0 ** -12  # sinks are float32 (the API's rule): values on a 2^-8 grid, steps of 2^-12, exact


def _check_directional(loss, args: dict, grads: dict, rng):
    """Each named input's gradient against the central difference along a random direction."""
    for name, grad in grads.items():
        if name == "sinks":
            eps, tol = SINK_EPS, 1e-5
            u = rng.choice(np.array([-1.0, 1.0], np.float32), np.shape(args[name]))
        else:
            eps, tol = EPS, RTOL
            u = rng.standard_normal(np.shape(args[name]))
        plus = dict(args, **{name: args[name] + (eps * u).astype(np.asarray(args[name]).dtype)})
        minus = dict(args, **{name: args[name] - (eps * u).astype(np.asarray(args[name]).dtype)})
        numeric = (loss(**plus) - loss(**minus)) / (2 * eps)
        analytic = float((grad * u).sum())
        assert abs(numeric - analytic) <= tol * max(1.0, abs(numeric)), (name, numeric, analytic)


CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, window_size=(3, 0)),
    dict(window_size=(2, 1)),
    dict(softcap=2.5),
    dict(alibi_slopes="h"),
    dict(alibi_slopes="bh", causal=True),
    dict(sinks=True),
    dict(sinks=True, causal=True, window_size=(1, 0)),
    dict(causal=True, softcap=3.0, alibi_slopes="h", sinks=True, window_size=(4, -1)),
]


def _mods(case, rng, B, Hq):
    kw = {k: v for k, v in case.items() if k not in ("alibi_slopes", "sinks")}
    if case.get("alibi_slopes") == "h":
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, Hq).astype(np.float32)
    elif case.get("alibi_slopes") == "bh":
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, (B, Hq)).astype(np.float32)
    if case.get("sinks"):
        kw["sinks"] = (np.round(rng.standard_normal(Hq) * 256) / 256).astype(np.float32)
    return kw


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("layout, Sq, Sk, Hq, Hkv", [("bshd", 5, 7, 4, 2), ("bhsd", 6, 4, 3, 1), ("bshd", 4, 4, 2, 2)])
def test_gradients_match_finite_differences(case, layout, Sq, Sk, Hq, Hkv):
    rng = np.random.default_rng(abs(hash((str(case), layout, Sq))) % 2**32)
    B, D = 2, 8
    shape = (lambda S, H: (B, S, H, D)) if layout == "bshd" else (lambda S, H: (B, H, S, D))
    q, k, v = rng.standard_normal(shape(Sq, Hq)), rng.standard_normal(shape(Sk, Hkv)), rng.standard_normal(shape(Sk, Hkv))
    dout = rng.standard_normal(q.shape)
    kw = dict(_mods(case, rng, B, Hq), layout=layout, scale=0.4)
    got = reference.attention_backward(dout, q, k, v, **kw)
    assert [g.shape for g in got[:3]] == [q.shape, k.shape, v.shape]
    assert all(g.dtype == np.float64 and np.isfinite(g).all() for g in got)
    mods = {n: kw.pop(n) for n in ("sinks",) if n in kw}
    args = dict(q=q, k=k, v=v, **mods)
    grads = dict(q=got[0], k=got[1], v=got[2])
    if "sinks" in mods:
        assert got[3].shape == (Hq,)
        grads["sinks"] = got[3]
    _check_directional(lambda **a: _loss(dout, **a, **kw), args, grads, rng)


def test_every_element_of_a_small_gradient():
    """Not only along random directions: each element of dq, dk and dv (softcap and causal on)."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 3, 2, 4)), rng.standard_normal((1, 4, 1, 4)), rng.standard_normal((1, 4, 1, 4))
    dout = rng.standard_normal(q.shape)
    kw = dict(causal=True, softcap=1.5)
    dq, dk, dv = reference.attention_backward(dout, q, k, v, **kw)
    for name, x, grad in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = EPS
            args = dict(q=q, k=k, v=v)
            up = _loss(dout, **dict(args, **{name: x + e}), **kw)
            down = _loss(dout, **dict(args, **{name: x - e}), **kw)
            assert abs((up - down) / (2 * EPS) - grad[i]) <= 1e-7, (name, i)


def test_rows_that_see_no_key_have_no_gradient():
    """Causal with Sq > Sk: the first Sq − Sk rows see nothing; their dq is 0, and they add nothing to dk, dv."""
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((1, 6, 2, 8)), rng.standard_normal((1, 3, 2, 8)), rng.standard_normal((1, 3, 2, 8))
    dout = rng.standard_normal(q.shape)
    dq, dk, dv = reference.attention_backward(dout, q, k, v, causal=True)
    # (row 3 sees one key: its softmax is 1 whatever the score, so its dq is 0 too; rows 4, 5 see more)
    assert (dq[:, :4] == 0).all() and np.abs(dq[:, 4:]).min() > 0
    dout2 = dout.copy()
    dout2[:, :3] = rng.standard_normal(dout2[:, :3].shape)  # another gradient where no key is seen
    dq2, dk2, dv2 = reference.attention_backward(dout2, q, k, v, causal=True)
    assert np.array_equal(dk, dk2) and np.array_equal(dv, dv2) and np.array_equal(dq, dq2)


@pytest.mark.parametrize("case", [dict(), dict(causal=True), dict(sinks=True, alibi_slopes="bh", softcap=2.0)],
                         ids=["plain", "causal", "sinks,alibi,softcap"])
def test_packed_batch(case):
    """A packed batch (zero-length sequences among them) against finite differences, and equal to
    each sequence differentiated alone."""
    rng = np.random.default_rng(11)
    lq, lk = [3, 0, 5, 2], [4, 2, 5, 0]
    cq, ck = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32), np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    Hq, Hkv, D = 4, 2, 8
    q, k, v = rng.standard_normal((cq[-1], Hq, D)), rng.standard_normal((ck[-1], Hkv, D)), rng.standard_normal((ck[-1], Hkv, D))
    dout = rng.standard_normal(q.shape)
    kw = dict(_mods(case, rng, len(lq), Hq), scale=0.5)
    got = reference.attention_backward(dout, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kw)
    sinks = kw.pop("sinks", None)
    args = dict(q=q, k=k, v=v, **({} if sinks is None else {"sinks": sinks}))
    grads = dict(q=got[0], k=got[1], v=got[2], **({} if sinks is None else {"sinks": got[3]}))
    _check_directional(lambda **a: _loss_packed(dout, cq=cq, ck=ck, **a, **kw), args, grads, rng)
    b = 2  # one sequence alone, as a batch of one
    alone = reference.attention_backward(
        dout[None, cq[b]:cq[b + 1]], q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
        scale=0.5, causal=kw.get("causal", False), softcap=kw.get("softcap"), sinks=sinks,
        alibi_slopes=None if "alibi_slopes" not in kw else kw["alibi_slopes"][b])
    assert np.allclose(alone[0][0], got[0][cq[b]:cq[b + 1]], rtol=0, atol=1e-12)


def test_bad_arguments_are_named():
    q = np.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="dout must have q's shape"):
        reference.attention_backward(np.zeros((1, 4, 2, 4)), q, q, q)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k go together"):
        reference.attention_backward(q[0], q[0], q[0], q[0], cu_seqlens_q=np.array([0, 4], np.int32))
    with pytest.raises(ValueError, match="window"):
        reference.attention_backward(q, q, q, q, window_size=(-3, 0))


@pytest.mark.parametrize("dtype, worst", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 1.5e-2)], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", [dict(), dict(causal=True, softcap=3.0, alibi_slopes="h", sinks=True)],
                         ids=["plain", "modifiers"])
def test_the_naive_baseline_is_the_dtype_s_error_away(dtype, worst, case):
    """`attention_backward_naive`: the gradients of 16-bit inputs done in 16 bits, within the dtype's
    error of the exact ones (relative to the largest gradient), never equal to them; and the rule
    `check_close` built on it refuses a gradient 5 % off."""
    rng = np.random.default_rng(8)
    B, Sq, Sk, Hq, Hkv, D = 2, 67, 93, 4, 2, 64
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)))
    dout = rng.standard_normal(q.shape).astype(dtype)
    kw = _mods(case, rng, B, Hq)
    ref = reference.attention_backward(dout, q, k, v, **kw)
    naive = reference.attention_backward_naive(dout, q, k, v, **kw)
    assert [g.dtype for g in naive[:3]] == [np.dtype(dtype)] * 3
    for r, n in zip(ref, naive):
        rel = np.abs(n.astype(np.float64) - r).max() / np.abs(r).max()
        assert 0 < rel <= worst, rel
        assert reference.check_close(n, r, n)[0]
    ok, err, bound = reference.check_close(ref[0] * 1.05, ref[0], naive[0])
    assert not ok, (err, bound)


def test_the_naive_baseline_wants_a_16_bit_dtype():
    x = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        reference.attention_backward_naive(x, x, x, x)
