"""CPU: `cudattn.attention_backward` refuses bad input before any GPU work, each error naming the
argument and the rule; the backward tile table fits each target; the call path keys it apart from
the forward."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import traits as _traits
from cudattn._spec.backward import validate_backward

F16 = np.float16


def _case(B=1, Sq=50, Sk=60, Hq=4, Hkv=2, D=64, dtype=F16):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(dtype)
    k, v = (rng.standard_normal((B, Sk, Hkv, D)).astype(dtype) for _ in range(2))
    return dict(dout=q.copy(), q=q, k=k, v=v, out=np.zeros_like(q), lse=np.zeros((B, Hq, Sq), np.float32))


def _check(base=None, **kw):
    a = dict(_case() if base is None else base)
    a.update(kw)
    flags = dict(causal=a.pop("causal", False), scale=None, layout="bshd", window_size=a.pop("window_size", None),
                 softcap=None, sinks=None, alibi_slopes=None, deterministic=a.pop("deterministic", False))
    grads = {n: a.pop(n, None) for n in ("dq", "dk", "dv")}
    return validate_backward(a["dout"], a["q"], a["k"], a["v"], a["out"], a["lse"], grads["dq"], grads["dk"],
                             grads["dv"], host=True, **flags)


def test_a_valid_call_passes():
    problem, bwd = _check(causal=True, deterministic=True)
    assert problem.causal and bwd.deterministic and problem.heads_kv == 2


@pytest.mark.parametrize("kw,exc,words", [
    (dict(dout=np.zeros((1, 50, 4, 32), F16)), ValueError, "dout must have q's shape"),
    (dict(dout=np.zeros((1, 50, 4, 64), np.float32)), TypeError, "dout must have q's dtype"),
    (dict(out=np.zeros((1, 49, 4, 64), F16)), ValueError, "out must have q's shape"),
    (dict(lse=np.zeros((1, 4, 49), np.float32)), ValueError, "lse must be the forward's LSE"),
    (dict(lse=np.zeros((1, 4, 50), np.float16)), TypeError, "lse must be float32"),
    (dict(lse=np.zeros((1, 50, 4), np.float32).transpose(0, 2, 1)), ValueError, "C-contiguous"),
    (dict(deterministic=1), TypeError, "deterministic must be a bool"),
    (dict(deterministic="yes"), TypeError, "deterministic must be a bool"),
    (dict(dk=np.zeros((1, 60, 4, 64), F16)), ValueError, "dk must have k's shape"),
    (dict(dv=np.zeros((1, 60, 2, 64), ml_dtypes.bfloat16)), TypeError, "dv must have v's dtype"),
])
def test_bad_input_is_named(kw, exc, words):
    with pytest.raises(exc, match=words):
        _check(**kw)


def test_gradients_that_overlap_an_input_are_refused():
    a = _case()
    for name, arr in (("dq", a["q"]), ("dq", a["dout"]), ("dk", a["v"]), ("dv", a["k"])):
        with pytest.raises(ValueError, match=f"{name} overlaps"):
            _check(a, **{name: arr})
    buf = np.zeros((1, 60, 4, 64), F16)
    with pytest.raises(ValueError, match="dv overlaps dk"):
        _check(dk=buf[:, :, :2], dv=buf[:, :, 1:3])
    _check(dk=buf[:, :, :2], dv=buf[:, :, 2:])  # interleaved halves of one buffer: no shared byte


def test_gradient_that_aliases_itself_is_refused():
    base = np.zeros((1, 60, 2, 64), F16)
    aliased = np.lib.stride_tricks.as_strided(base, shape=(1, 60, 2, 64), strides=(7680, 0, 128, 2), writeable=True)
    with pytest.raises(ValueError, match="dk has overlapping elements"):
        _check(dk=aliased)


def test_fp8_and_heads_above_256_are_refused():
    q = np.zeros((1, 8, 2, 64), ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="FP8"):
        validate_backward(q, q, q, q, np.zeros((1, 8, 2, 64), ml_dtypes.bfloat16), np.zeros((1, 2, 8), np.float32),
                          None, None, None, host=True, causal=False, scale=None, layout="bshd", window_size=None,
                          softcap=None, sinks=None, alibi_slopes=None, deterministic=False)
    with pytest.raises(ValueError, match="must be a multiple of 8 from 8 to 256"):  # the forward's rule
        _check(**{n: x for n, x in _case(D=264).items()})


def test_varlen_call_needs_its_offsets():
    a = _case()
    with pytest.raises(TypeError, match="missing cu_seqlens_k"):
        cudattn.attention_backward(a["dout"][0], a["q"][0], a["k"][0], a["v"][0], a["out"][0], a["lse"][0],
                                   cu_seqlens_q=np.array([0, 50], np.int32), max_seqlen_q=50, max_seqlen_k=60)


def test_missing_forward_results_are_named():
    a = _case()
    with pytest.raises(TypeError, match="lse"):
        cudattn.attention_backward(a["dout"], a["q"], a["k"], a["v"], a["out"], None)


@pytest.mark.parametrize("arch", sorted(_traits.ARCH_SMEM_LIMIT))
def test_every_build_fits_its_target(arch):
    for k in _bt.all_backward_kernels(arch):
        assert k.smem_bytes <= _traits.ARCH_SMEM_LIMIT[arch]
        t = k.tiles
        if k.family == "sm90":  # a producer warpgroup, two consumers: of 64 keys each, or at 256 of 128
            # columns each over 64 keys (bwd_sm90.cuh)
            assert (t.warps, k.threads) == (12, 384)
            assert (t.block_n, t.block_m) == (64, 64) if k.tile_dim == 256 else \
                t.block_n == 128 and t.block_m in (64, 128)
            assert arch in _traits.HOPPER_ARCHS
        else:
            # 16 keys a warp and more, or (wide heads) warps split the block's columns in two
            assert t.block_n % (16 * t.warps) == 0 or t.block_n * 2 == 16 * t.warps
            assert t.block_m % 16 == 0
