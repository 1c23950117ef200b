"""Packed variable-length batches on the CPU: the offsets' checks and the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from cudattn import reference
from cudattn._spec.varlen import check_cu_seqlens, check_max_seqlen


def _packed(rng, lens_q, lens_k, Hq, Hkv, D):
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cq[-1], Hq, D))
    k = rng.standard_normal((ck[-1], Hkv, D))
    v = rng.standard_normal((ck[-1], Hkv, D))
    return q, k, v, cq, ck


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (6, 1)])
def test_reference_is_each_sequence_on_its_own(causal, Hq, Hkv):
    """Every sequence's rows and LSE equal `attention` on that sequence alone (bottom-right causal
    per sequence), whatever its neighbours; zero-length sequences and rows with no key included."""
    rng = np.random.default_rng(Hq * 10 + Hkv + causal)
    lens_q, lens_k = [5, 0, 1, 17, 3, 9], [7, 4, 0, 17, 1, 130]
    q, k, v, cq, ck = _packed(rng, lens_q, lens_k, Hq, Hkv, 32)
    out, lse = reference.attention_varlen(q, k, v, cq, ck, causal=causal, return_lse=True, max_seqlen_q=17,
                                          max_seqlen_k=130)
    assert out.shape == q.shape and lse.shape == (Hq, q.shape[0])
    for b in range(len(lens_q)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:
            assert np.all(out[qs] == 0) and np.all(lse[:, qs] == -np.inf)
            continue
        o_b, l_b = reference.attention(q[None, qs], k[None, ks], v[None, ks], causal=causal, return_lse=True)
        np.testing.assert_array_equal(out[qs], o_b[0])
        np.testing.assert_array_equal(lse[:, qs], l_b[0])
    # causal with Sq > Sk: the first rows of sequence 4 (3 queries, 1 key) see nothing
    if causal:
        assert np.all(out[cq[4]:cq[4] + 2] == 0) and np.all(lse[:, cq[4]:cq[4] + 2] == -np.inf)


def test_reference_equal_lengths_is_the_padded_batch():
    rng = np.random.default_rng(3)
    q, k, v, cq, ck = _packed(rng, [64] * 3, [80] * 3, 4, 2, 16)
    out, lse = reference.attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
    o4, l4 = reference.attention(q.reshape(3, 64, 4, 16), k.reshape(3, 80, 2, 16), v.reshape(3, 80, 2, 16),
                                 causal=True, return_lse=True)
    np.testing.assert_allclose(out, o4.reshape(192, 4, 16), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, l4.transpose(1, 0, 2).reshape(4, 192), rtol=1e-12)


def test_reference_descale_rows_follow_the_sequences():
    rng = np.random.default_rng(5)
    q, k, v, cq, ck = _packed(rng, [3, 4], [5, 6], 2, 1, 8)
    dk = np.array([[0.5], [2.0]], dtype=np.float32)
    out = reference.attention_varlen(q, k, v, cq, ck, k_descale=dk, v_descale=3.0)
    for b in range(2):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        want = reference.attention(q[None, qs], k[None, ks] * dk[b, 0], v[None, ks] * 3.0)
        np.testing.assert_allclose(out[qs], want[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cu,total,batch,err,words", [
    ([0, 3, 5], 5, None, None, None),
    ([0], 0, 0, None, None),
    ([0, 3, 2, 5], 5, None, ValueError, "must not decrease; cu[2] = 2 < cu[1] = 3"),
    ([1, 3, 5], 5, None, ValueError, "must start at 0; got 1"),
    ([0, 3, 6], 5, None, ValueError, "must end at the packed length 5; got 6"),
    ([0, 3, 5], 5, 3, ValueError, "batch + 1 = 4 entries; got 3"),
    ([[0, 5]], 5, None, ValueError, "must be 1-D"),
    ("int64", 5, None, TypeError, "must be int32"),
    ("list", 5, None, TypeError, "int32 NumPy array"),
])
def test_offsets_are_checked(cu, total, batch, err, words):
    if cu == "int64":
        arr = np.array([0, 5], dtype=np.int64)
    elif cu == "list":
        arr = [0, 5]
    else:
        arr = np.array(cu, dtype=np.int32)
    if err is None:
        assert list(check_cu_seqlens(arr, "cu", total, batch)) == list(np.asarray(cu).ravel())
        return
    with pytest.raises(err, match=words.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
        check_cu_seqlens(arr, "cu", total, batch)


def test_max_seqlen_is_checked():
    lens = np.array([3, 9, 0])
    assert check_max_seqlen(9, "max_seqlen_q", lens) == 9
    with pytest.raises(ValueError, match="shorter than sequence 1"):
        check_max_seqlen(8, "max_seqlen_q", lens)
    with pytest.raises(TypeError, match="must be an int"):
        check_max_seqlen(9.0, "max_seqlen_q", lens)
    with pytest.raises(ValueError, match=">= 0"):
        check_max_seqlen(-1, "max_seqlen_q", None)
    rng = np.random.default_rng(0)
    q, k, v, cq, ck = _packed(rng, [3, 9], [4, 4], 2, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen_q = 5 is shorter"):
        reference.attention_varlen(q, k, v, cq, ck, max_seqlen_q=5)


# ---------------------------------------------------------------- the API's checks (no GPU needed)

import cudattn  # noqa: E402

_F16 = np.float16


def _api_args():
    q = np.zeros((10, 4, 64), _F16)
    k = np.zeros((12, 2, 64), _F16)
    return q, k, k.copy(), np.array([0, 4, 10], np.int32), np.array([0, 5, 12], np.int32)


@pytest.mark.parametrize("change, error, words", [
    (dict(cu_seqlens_k=None), TypeError, "together"),
    (dict(max_seqlen_q=None), TypeError, "missing max_seqlen_q"),
    (dict(max_seqlen_q=5), ValueError, "shorter than sequence 1"),
    (dict(max_seqlen_k=2.0), TypeError, "must be an int"),
    (dict(cu_seqlens_q=np.array([0, 4, 10], np.int64)), TypeError, "int32"),
    (dict(cu_seqlens_q=np.array([0, 11, 10], np.int32)), ValueError, "must not decrease"),
    (dict(cu_seqlens_k=np.array([0, 5, 11], np.int32)), ValueError, "end at the packed length 12"),
    (dict(cu_seqlens_k=np.array([0, 12], np.int32)), ValueError, r"batch \+ 1 = 3 entries"),
    (dict(cu_seqlens_q=np.array([1, 4, 10], np.int32)), ValueError, "start at 0"),
    (dict(layout="bhsd"), ValueError, "layout must be 'bshd'"),
    (dict(num_splits=2), NotImplementedError, "num_splits"),
])
def test_attention_refuses_bad_offsets_before_gpu_work(change, error, words):
    """Every rule is checked before the device is touched (this machine has none)."""
    q, k, v, cq, ck = _api_args()
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=6, max_seqlen_k=7)
    kw.update(change)
    with pytest.raises(error, match=words):
        cudattn.attention(q, k, v, **kw)


def test_attention_refuses_padded_operands_in_a_packed_call():
    q, k, v, cq, ck = _api_args()
    with pytest.raises(ValueError, match="3-D"):
        cudattn.attention(q[None], k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=6, max_seqlen_k=7)
    with pytest.raises(ValueError, match="out must have q's shape"):
        cudattn.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=6, max_seqlen_k=7,
                          out=np.zeros((10, 4, 32), _F16))


def test_kvcache_packed_q_checks():
    q = np.zeros((10, 4, 64), _F16)
    cache = np.zeros((2, 64, 2, 64), _F16)
    cu = np.array([0, 4, 10], np.int32)
    with pytest.raises(TypeError, match="together"):
        cudattn.attention_with_kvcache(q, cache, cache, cu_seqlens_q=cu)
    with pytest.raises(NotImplementedError, match="k_new"):
        cudattn.attention_with_kvcache(q, cache, cache, cu_seqlens_q=cu, max_seqlen_q=6, k_new=cache, v_new=cache)
    with pytest.raises(ValueError, match="end at the packed length"):
        cudattn.attention_with_kvcache(q, cache, cache, cu_seqlens_q=cu[:2], max_seqlen_q=6)


def test_fp8_sequence_count_limit():
    import ml_dtypes

    fp8 = np.dtype(ml_dtypes.float8_e4m3fn)
    n = 65536
    q = np.zeros((n, 1, 16), fp8)
    cu = np.arange(n + 1, dtype=np.int32)
    with pytest.raises(ValueError, match="at most 65535 sequences"):
        cudattn.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1, max_seqlen_k=1)
