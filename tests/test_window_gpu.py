"""GPU: sliding windows (``window_size``) against the float64 reference, DESIGN §6's rule.

Windows of 0, 1 and odd sizes that cross tile edges, left only, right only and both, with and
without causal, Sq < Sk, Sq > Sk and square, GQA, head dims 64 to 256, fp16 and bf16, packed
variable-length batches and the NumPy path; both kernel families on Hopper. Outputs are
poisoned with NaN before each launch.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_family")]

BF16 = np.dtype(ml_dtypes.bfloat16)
_seed = itertools.count(7700)


def _check(q, k, v, window, causal, o, lse):
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
    naive = reference.attention_naive(q, k, v, causal=causal, window_size=window)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"out: max err {err:.3g} > bound {bound:.3g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "LSE must be -inf exactly on rows that see no key"
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)


def _run(q, k, v, window, causal):
    out = cudattn._arrays.array.empty(q.shape, q.dtype, device=None, stream=None)
    out.fill_nan()
    o, lse = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=causal, window_size=window,
                               return_lse=True, out=out)
    return cudattn.to_host(o), cudattn.to_host(lse)


WINDOWS = [(0, 0), (1, 0), (0, 1), (63, 0), (64, 64), (65, 129), (200, -1), (-1, 77), (129, 3)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(300, 300), (200, 500), (333, 150)], ids=["square", "sq<sk", "sq>sk"])
def test_windows(window, causal, shape):
    rng = np.random.default_rng(next(_seed))
    Sq, Sk = shape
    q = rng.standard_normal((2, Sq, 4, 64)).astype(np.float16)
    k = rng.standard_normal((2, Sk, 2, 64)).astype(np.float16)
    v = rng.standard_normal((2, Sk, 2, 64)).astype(np.float16)
    o, lse = _run(q, k, v, window, causal)
    _check(q, k, v, window, causal, o, lse)


@pytest.mark.parametrize("D", [128, 256, 96])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_window_head_dims(D, causal):
    rng = np.random.default_rng(next(_seed))
    q = rng.standard_normal((1, 700, 8, D)).astype(BF16)
    k = rng.standard_normal((1, 900, 8, D)).astype(BF16)
    v = rng.standard_normal((1, 900, 8, D)).astype(BF16)
    o, lse = _run(q, k, v, (257, 31), causal)
    _check(q, k, v, (257, 31), causal, o, lse)


def test_window_varlen_and_numpy():
    rng = np.random.default_rng(next(_seed))
    lens = [130, 1, 0, 257]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q = rng.standard_normal((cu[-1], 4, 64)).astype(np.float16)
    k = rng.standard_normal((cu[-1], 4, 64)).astype(np.float16)
    v = rng.standard_normal((cu[-1], 4, 64)).astype(np.float16)
    o, lse = cudattn.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=257, max_seqlen_k=257,
                               causal=True, window_size=(40, 0), return_lse=True)
    ref, ref_lse = reference.attention_varlen(q, k, v, cu, cu, causal=True, window_size=(40, 0), return_lse=True)
    for b in range(4):
        rows = slice(cu[b], cu[b + 1])
        if lens[b] == 0:
            continue
        naive = reference.attention_naive(q[None, rows], k[None, rows], v[None, rows], causal=True,
                                          window_size=(40, 0))[0]
        ok, err, bound = reference.check_close(o[rows], ref[rows], naive)
        assert ok, (b, err, bound)
        np.testing.assert_allclose(lse[:, rows], ref_lse[:, rows], rtol=1e-4, atol=1e-4)


def test_window_does_not_change_plain_calls():
    """(-1, -1), and causal with an open left side, are the plain calls, bit for bit."""
    rng = np.random.default_rng(next(_seed))
    q = rng.standard_normal((2, 200, 4, 64)).astype(np.float16)
    dq = cudattn.to_device(q)
    for causal, window in ((False, (-1, -1)), (True, (-1, 5))):
        a = cudattn.to_host(cudattn.attention(dq, dq, dq, causal=causal, window_size=window))
        b = cudattn.to_host(cudattn.attention(dq, dq, dq, causal=causal))
        np.testing.assert_array_equal(a, b)
