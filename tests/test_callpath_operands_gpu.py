"""GPU: the call path's operands: FP8 descales (on another device: refused; produced on another
stream: ordered after it), torch tensors of every form read as they are, and warm calls from a
thread without a current CUDA context.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from _callpath_cases import (F16, F32, SPIN, _check_attention, _nan_device, _need_fp8, _qkv, _rand, _rng, _same_bits,
                             _to_torch)

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------------------- 5. FP8 descales


def _fp8_inputs(rng, B=2, Sq=130, Sk=257, Hq=4, Hkv=2, D=128):
    xs = [rng.standard_normal(s, dtype=np.float32) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D))]
    (q, qd), (k, kd), (v, vd) = (cudattn.quantize_fp8(x, per="head", heads_kv=Hkv) for x in xs)
    return (q, k, v), (qd, kd, vd)


def test_fp8_descales_on_another_device_are_refused():
    """Descale device arrays on another GPU than q, k, v: ValueError naming the device."""
    from cudattn._runtime import device as _device

    _need_fp8()
    if _device.device_count() < 2:
        pytest.skip("needs two GPUs")
    (q, k, v), descales = _fp8_inputs(_rng())
    args = [cudattn.to_device(x) for x in (q, k, v)]
    for i, name in enumerate(("q_descale", "k_descale", "v_descale")):
        kw = {n: cudattn.to_device(d) for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)}
        kw[name] = cudattn.to_device(descales[i], device=1)
        with pytest.raises(ValueError, match="device"):
            cudattn.attention(*args, **kw)


def test_fp8_descales_produced_on_another_stream_are_ordered(torch):
    """FP8 descale DeviceArrays written on stream A behind a 0.1 s spin (NaN until then); the call
    runs on B: B must wait for the descales' producer like for q, k, v. Checked bit for bit against
    the same call made after a full synchronisation (results are deterministic)."""
    _need_fp8()
    (q, k, v), descales = _fp8_inputs(_rng())
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    args = [cudattn.to_device(x, stream=B.cuda_stream) for x in (q, k, v)]
    srcs = [_to_torch(torch, d) for d in descales]
    names = ("q_descale", "k_descale", "v_descale")
    good = {n: cudattn.to_device(d, stream=B.cuda_stream) for n, d in zip(names, descales)}
    want = cudattn.to_host(cudattn.attention(*args, causal=True, stream=B.cuda_stream, **good))  # also warms
    assert np.isfinite(want.astype(np.float32)).all()
    torch.cuda.synchronize()
    late = {n: _nan_device(d.shape, F32, stream=A.cuda_stream) for n, d in zip(names, descales)}
    with torch.cuda.stream(A):
        torch.cuda._sleep(SPIN)
        for n, t in zip(names, srcs):
            torch.from_dlpack(late[n]).copy_(t)
    out = cudattn.attention(*args, causal=True, stream=B.cuda_stream, **late)
    busy = not A.query()
    assert busy, "the descales' producer finished before the call returned: the call synchronized the host"
    got = cudattn.to_host(out)
    assert _same_bits(got, want), f"{np.isnan(got.astype(np.float32)).sum()} NaN; descales read before written?"


def test_fp8_torch_tensors_match_device_arrays(torch):
    """torch float8_e4m3fn tensors (read through torch's attributes, dtype kept) give the DeviceArray
    path's result bit for bit, on the first call (full path) and on warm calls (recorded replay)."""
    _need_fp8()
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    (q, k, v), descales = _fp8_inputs(_rng())
    names = ("q_descale", "k_descale", "v_descale")
    want = cudattn.to_host(cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=True,
                                             **{n: cudattn.to_device(d) for n, d in zip(names, descales)}))
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).cuda().view(torch.float8_e4m3fn)
                  for x in (q, k, v))
    tds = {n: _to_torch(torch, d) for n, d in zip(names, descales)}
    for call in range(3):
        got = cudattn.to_host(cudattn.attention(tq, tk, tv, causal=True, **tds))
        assert _same_bits(got, want), f"call {call}: torch FP8 operands differ from DeviceArray operands"


def test_torch_operands_of_every_form_are_read_as_they_are(torch):
    """torch tensors read through their own accessors: a strided slice, an nn.Parameter, a tensor
    that requires grad and a tensor subclass give the DeviceArray path's result bit for bit, cold
    and warm; a negated view (torch._neg_view: its memory holds -x) is refused, where cuda.core's
    view hands over its bytes as if they were x (a wrong result, silently)."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 77, 77, 4, 2, 64)
    want = cudattn.to_host(cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v))))
    wide = _to_torch(torch, np.concatenate([q, _rand(rng, q.shape, F16)], axis=-1))
    sliced = wide[..., :64]  # rows 256 bytes apart, unit stride last
    assert not sliced.is_contiguous()

    class Sub(torch.Tensor):
        pass

    tk, tv = _to_torch(torch, k), _to_torch(torch, v)
    forms = {"slice": sliced, "parameter": torch.nn.Parameter(_to_torch(torch, q)),
             "requires-grad": _to_torch(torch, q).requires_grad_(), "subclass": _to_torch(torch, q).as_subclass(Sub)}
    for name, tq in forms.items():
        for call in range(3):
            got = cudattn.to_host(cudattn.attention(tq, tk, tv))
            assert _same_bits(got, want), f"{name}, call {call}: differs from the DeviceArray result"
    neg = torch._neg_view(_to_torch(torch, -q.astype(np.float32)).to(torch.float16))  # its values are q
    assert neg.is_neg()
    for where in ("q", "k"):  # as the first operand (it picks the stream) and as another
        with pytest.raises(TypeError, match="negated"):
            cudattn.attention(neg, tk, tv) if where == "q" else cudattn.attention(forms["slice"], neg, tv)


def test_a_torch_tensor_changed_in_place_between_calls_is_read_as_it_is_now(torch):
    """The accessors' layout table maps layouts, never tensors: after ``set_`` (another storage and
    shape) and ``.data =`` (a strided view of other memory), a warm call computes on what the
    tensor is now."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 64, 64, 2, 2, 64)
    q2 = _rand(rng, (1, 80, 2, 64), F16)
    tk, tv = _to_torch(torch, k), _to_torch(torch, v)
    tq = _to_torch(torch, q)
    for _ in range(2):
        _check_attention(cudattn.to_host(cudattn.attention(tq, tk, tv)), q, k, v)
    tq.set_(_to_torch(torch, q2))  # another storage, 80 query rows
    _check_attention(cudattn.to_host(cudattn.attention(tq, tk, tv)), q2, k, v, what="after set_")
    wide = _to_torch(torch, np.concatenate([q, q], axis=-1))
    tq.data = wide[..., 64:]  # a strided view of other memory holding q
    _check_attention(cudattn.to_host(cudattn.attention(tq, tk, tv)), q, k, v, what="after .data =")


def test_warm_call_from_a_thread_without_a_current_context():
    """A new thread has no current CUDA context; a warm call there (a replay on cudattn's stream,
    which carries its context) must still run and give the first call's result bit for bit."""
    import threading

    rng = _rng()
    q, k, v = (cudattn.to_device(x) for x in _qkv(rng, 1, 77, 130, 4, 2, 64))
    want = cudattn.to_host(cudattn.attention(q, k, v, causal=True))
    got, errors = [], []

    def worker():
        try:
            ctx = driver.cuCtxGetCurrent()[1]
            got.append((int(ctx), cudattn.to_host(cudattn.attention(q, k, v, causal=True))))
        except Exception as e:  # reported in the main thread
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    ctx, res = got[0]
    assert ctx == 0, "the new thread had a current context: the test did not test what it says"
    assert _same_bits(res, want)
