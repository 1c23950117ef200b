"""Merging partial attention states (reference.merge_attention_states, _numpy.merge.merge_host):
hand-computed and edge cases, split-KV merges against whole-key attention, input checks. CPU only.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from cudattn._numpy.merge import merge_host
from cudattn._spec.merge import parse_merge_inputs
from cudattn.reference import (
    attention,
    merge_attention_states,
)
from _merge_cases import NINF
from _merge_cases import _warnings_are_errors as _warnings_are_errors  # fixtures

BF16 = np.dtype(ml_dtypes.bfloat16)


def _row(values, dtype=np.float64):
    """One part's output for B=1, Sq=1, H=1 (bshd (1, 1, 1, D))."""
    return np.array(values, dtype=dtype).reshape(1, 1, 1, -1)


def _lse(value, dtype=np.float64):
    return np.array(value, dtype=dtype).reshape(1, 1, 1)


def _both(outs, lses, layout="bshd"):
    """(reference result, merge_host result in float32) for the same float inputs."""
    ref = merge_attention_states(outs, lses, layout=layout)
    host = merge_host([np.asarray(o, np.float32) for o in outs], [np.asarray(x, np.float32) for x in lses], layout)
    return ref, host


# --------------------------------------------------------------------------------------------
# Hand-computed cases
# --------------------------------------------------------------------------------------------


def test_hand_2_parts_d2():
    # 2 parts, 1 row, D=2.
    # lse1 = log 2, lse2 = log 6: row sums 2 and 6, total 8 -> weights 2/8 = 1/4 and 6/8 = 3/4.
    # out1 = (4, 8), out2 = (0, -4): out = 1/4·(4, 8) + 3/4·(0, -4) = (1, 2 - 3) = (1, -1).
    # lse = log(2 + 6) = log 8.
    outs = [_row([4.0, 8.0]), _row([0.0, -4.0])]
    lses = [_lse(math.log(2)), _lse(math.log(6))]
    (ro, rl), (ho, hl) = _both(outs, lses)
    np.testing.assert_allclose(ro.ravel(), [1.0, -1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(rl.ravel(), [math.log(8)], rtol=1e-15)
    assert ro.dtype == rl.dtype == np.float64
    assert ho.dtype == hl.dtype == np.float32
    np.testing.assert_allclose(ho.ravel(), [1.0, -1.0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(hl.ravel(), [math.log(8)], rtol=1e-6)


def test_hand_3_parts_d2():
    # 3 parts (the "2x3" case is done as 3 parts), 1 row, D=2.
    # lse = log 1, log 3, log 4: row sums 1, 3, 4, total 8 -> weights 1/8, 3/8, 4/8.
    # out1 = (8, 0), out2 = (0, 8), out3 = (2, -2):
    # out = (8/8 + 0 + 8/8, 0 + 24/8 - 8/8) = (2, 2); lse = log 8.
    outs = [_row([8.0, 0.0]), _row([0.0, 8.0]), _row([2.0, -2.0])]
    lses = [_lse(0.0), _lse(math.log(3)), _lse(math.log(4))]
    (ro, rl), (ho, hl) = _both(outs, lses)
    np.testing.assert_allclose(ro.ravel(), [2.0, 2.0], rtol=1e-15)
    np.testing.assert_allclose(rl.ravel(), [math.log(8)], rtol=1e-15)
    np.testing.assert_allclose(ho.ravel(), [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(hl.ravel(), [math.log(8)], rtol=1e-6)


def test_hand_2_parts_d3_with_empty_row():
    # 2 parts, D=3, Sq=2 rows (bshd (1, 2, 1, 3), lse (1, 1, 2)).
    # row 0: lse 5 and 5 (equal sums) -> weights 1/2, 1/2: out = ((1,2,3) + (3,2,1))/2 = (2, 2, 2);
    #        lse = 5 + log 2.
    # row 1: part 0 empty (lse -inf, out NaN), part 1 lse -1, out (7, -7, 0) -> taken as is, lse -1.
    nan = np.nan
    o0 = np.array([[1.0, 2.0, 3.0], [nan, nan, nan]]).reshape(1, 2, 1, 3)
    o1 = np.array([[3.0, 2.0, 1.0], [7.0, -7.0, 0.0]]).reshape(1, 2, 1, 3)
    l0 = np.array([5.0, NINF]).reshape(1, 1, 2)
    l1 = np.array([5.0, -1.0]).reshape(1, 1, 2)
    (ro, rl), (ho, hl) = _both([o0, o1], [l0, l1])
    want_o = np.array([[2.0, 2.0, 2.0], [7.0, -7.0, 0.0]]).reshape(1, 2, 1, 3)
    want_l = np.array([5.0 + math.log(2), -1.0]).reshape(1, 1, 2)
    np.testing.assert_allclose(ro, want_o, rtol=1e-15)
    np.testing.assert_allclose(rl, want_l, rtol=1e-15)
    np.testing.assert_allclose(ho, want_o, rtol=1e-6)
    np.testing.assert_allclose(hl, want_l, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_one_part_is_returned_unchanged(dtype):
    rng = np.random.default_rng(0)
    out = rng.standard_normal((2, 3, 4, 8)).astype(dtype)
    lse = (rng.standard_normal((2, 4, 3)) * 10).astype(np.float32)
    lse[0, 1, 2] = NINF
    out[0, 2, 1] = 0  # an empty row's output is 0
    ho, hl = merge_host([out], [lse])
    assert ho.dtype == np.dtype(dtype) and hl.dtype == np.float32
    np.testing.assert_array_equal(ho, out)
    np.testing.assert_array_equal(hl, lse)
    ro, rl = merge_attention_states([out.astype(np.float64)], [lse.astype(np.float64)])
    np.testing.assert_array_equal(ro, out.astype(np.float64))
    np.testing.assert_array_equal(rl, lse.astype(np.float64))


def test_minus_inf_part_with_nan_output_is_ignored():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 2, 4))
    la = rng.standard_normal((2, 2, 3))
    junk = np.full_like(a, np.nan)
    ljunk = np.full_like(la, NINF)
    for parts in ([a, junk], [junk, a], [junk, a, junk]):
        lparts = [la if p is a else ljunk for p in parts]
        ro, rl = merge_attention_states(parts, lparts)
        np.testing.assert_array_equal(ro, a)
        np.testing.assert_array_equal(rl, la)
        ho, hl = merge_host([p.astype(np.float32) for p in parts], [x.astype(np.float32) for x in lparts])
        assert not np.isnan(ho).any()
        np.testing.assert_allclose(ho, a, rtol=1e-6)
        np.testing.assert_allclose(hl, la, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_all_parts_minus_inf_give_zero_and_minus_inf(dtype):
    outs = [np.full((1, 2, 3, 4), np.nan, dtype=dtype) for _ in range(3)]
    lses = [np.full((1, 3, 2), NINF, dtype=np.float32) for _ in range(3)]
    ho, hl = merge_host(outs, lses)
    assert ho.dtype == np.dtype(dtype)
    assert np.all(ho.astype(np.float32) == 0) and np.all(np.isneginf(hl))
    ro, rl = merge_attention_states(outs, lses)
    assert np.all(ro == 0) and np.all(np.isneginf(rl))


# --------------------------------------------------------------------------------------------
# Split-KV: merging chunk results reproduces whole-key attention (catches double counting,
# e.g. multiplying a chunk's normalized output by its local row sum a second time).
# --------------------------------------------------------------------------------------------


def _split_problem(layout):
    rng = np.random.default_rng(2)
    B, Sq, Sk, Hq, Hkv, D = 2, 5, 23, 4, 2, 16
    if layout == "bshd":
        shapes = (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
    else:
        shapes = (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)
    q, k, v = (rng.standard_normal(s) * 2 for s in shapes)  # *2: peakier softmax, distinct row sums
    return q, k, v


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("cuts", [(9,), (4, 15)], ids=["2chunks", "3chunks"])
def test_split_kv_merge_equals_whole(cuts, layout):
    q, k, v = _split_problem(layout)
    axis = 1 if layout == "bshd" else 2
    whole, whole_lse = attention(q, k, v, layout=layout, return_lse=True)
    parts = [attention(q, kc, vc, layout=layout, return_lse=True)
             for kc, vc in zip(np.split(k, cuts, axis=axis), np.split(v, cuts, axis=axis))]
    outs, lses = [p[0] for p in parts], [p[1] for p in parts]
    # the chunks differ from the whole (otherwise the test proves nothing)
    assert np.abs(outs[0] - whole).max() > 1e-2

    ro, rl = merge_attention_states(outs, lses, layout=layout)
    np.testing.assert_allclose(ro, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rl, whole_lse, rtol=0, atol=1e-12)

    ho, hl = merge_host([o.astype(np.float32) for o in outs], [x.astype(np.float32) for x in lses], layout)
    assert ho.shape == whole.shape and hl.shape == whole_lse.shape
    np.testing.assert_allclose(ho, whole, rtol=0, atol=1e-5)
    np.testing.assert_allclose(hl, whole_lse, rtol=0, atol=1e-5)

    # the same parts given as one array with a leading N axis
    ho2, hl2 = merge_host(np.stack(outs).astype(np.float32), np.stack(lses).astype(np.float32), layout)
    np.testing.assert_array_equal(ho2, ho)
    np.testing.assert_array_equal(hl2, hl)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_merge_host_low_precision_outputs(dtype):
    q, k, v = _split_problem("bshd")
    whole = attention(q, k, v)
    parts = [attention(q, kc, vc, return_lse=True) for kc, vc in zip(np.split(k, [11], 1), np.split(v, [11], 1))]
    ho, hl = merge_host([p[0].astype(dtype) for p in parts], [p[1].astype(np.float32) for p in parts])
    assert ho.dtype == np.dtype(dtype) and hl.dtype == np.float32
    eps = 2.0**-8 if dtype == BF16 else 2.0**-11  # unit roundoff of the dtype
    np.testing.assert_allclose(ho.astype(np.float64), whole, rtol=0, atol=4 * eps * np.abs(whole).max())


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------

_O = np.zeros((1, 2, 3, 4), np.float16)  # bshd: B=1, Sq=2, H=3, D=4
_L = np.zeros((1, 3, 2), np.float32)


@pytest.mark.parametrize(
    "outs, lses, layout, exc, match",
    [
        ([], [], "bshd", ValueError, r"at least one part"),
        ([_O, _O], [_L], "bshd", ValueError, r"same number of parts.*2 outs and 1 lses"),
        ([_O, _O[:, :1]], [_L, _L], "bshd", ValueError, r"all outs must have the same shape"),
        ([_O, _O], [_L, _L[..., :1]], "bshd", ValueError, r"all lses must have the same shape"),
        ([_O], [_L.transpose(0, 2, 1)], "bshd", ValueError, r"lses must be \(B, H, Sq\) = \(1, 3, 2\)"),
        ([_O], [_L], "bhsd", ValueError, r"lses must be \(B, H, Sq\) = \(1, 2, 3\)"),
        ([_O[0]], [_L], "bshd", ValueError, r"each of outs must be 4-D"),
        ([_O], [_L[0]], "bshd", ValueError, r"each of lses must be 3-D"),
        ([_O], [_L], "bsdh", ValueError, r"layout must be 'bshd' or 'bhsd'"),
        ([_O.astype(np.float64)], [_L], "bshd", TypeError, r"outs must be float16, bfloat16.*float64"),
        ([_O, _O.astype(np.float32)], [_L, _L], "bshd", TypeError, r"same dtype.*float16.*float32"),
        ([_O], [_L.astype(np.float64)], "bshd", TypeError, r"lses must be float32.*float64"),
        (_O, [_L], "bshd", ValueError, r"outs must be a sequence of N arrays or one 5-D array"),
        ([_O], _L, "bshd", ValueError, r"lses must be a sequence of N arrays or one 4-D array"),
        (3, [_L], "bshd", TypeError, r"outs must be a sequence"),
    ],
)
def test_merge_host_errors(outs, lses, layout, exc, match):
    with pytest.raises(exc, match=match):
        merge_host(outs, lses, layout)


def test_parse_merge_inputs_uses_only_shape_and_dtype():
    class Fake:  # a device array stand-in: no data, no __array__
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)

        def __getitem__(self, i):
            return Fake(self.shape[1:], self.dtype)

    outs, lses, B, Sq, H, D, dtype = parse_merge_inputs(
        [Fake((2, 3, 4, 8), BF16)] * 3, Fake((3, 2, 4, 3), np.float32), "bshd")
    assert (len(outs), len(lses), B, Sq, H, D, dtype) == (3, 3, 2, 3, 4, 8, BF16)
    outs, lses, B, Sq, H, D, dtype = parse_merge_inputs(
        Fake((2, 2, 4, 3, 8), np.float16), [Fake((2, 4, 3), np.float32)] * 2, "bhsd")
    assert (len(outs), len(lses), B, Sq, H, D, dtype) == (2, 2, 2, 3, 4, 8, np.float16)


@pytest.mark.parametrize("which", ["outs", "lses"])
def test_device_merge_refuses_stacked_parts_in_reverse(which):
    """A stacked operand with a negative stride along N (``x[::-1]``) puts parts below the array's
    address, where a replayed call would take them for another operand: refused before any GPU
    work, naming the operand."""
    from cudattn._arrays.array import DeviceArray
    from cudattn._kernels.merge import merge_device

    base = 0x7F00_0000_0000
    outs = DeviceArray(base, (3, 1, 4, 2, 64), np.dtype(np.float32), device_id=0)
    lses = DeviceArray(base + (1 << 20), (3, 1, 2, 4), np.dtype(np.float32), device_id=0)
    if which == "outs":
        outs = DeviceArray(base + 2 * 2048 * 4, (3, 1, 4, 2, 64), np.dtype(np.float32),
                           (-2048 * 4, 2048 * 4, 512, 256, 4), device_id=0)
    else:
        lses = DeviceArray(base + (1 << 20) + 2 * 32, (3, 1, 2, 4), np.dtype(np.float32), (-32, 32, 16, 4),
                           device_id=0)
    with pytest.raises(ValueError, match=rf"stacked {which} must have a positive stride along N"):
        merge_device(outs, lses, "bshd", None)
