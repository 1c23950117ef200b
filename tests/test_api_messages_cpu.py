"""The public entry points' messages for arguments that are no arrays or mix host and device arrays
(each argument named, with its type or its kind, in one line, before any GPU work), the FP8
quantiser's messages with every symbol named, and `empty_cache` where no GPU was ever used.

No GPU needed: device arrays here are DeviceArrays at made-up addresses and objects with a
``__cuda_array_interface__``, which the checks refuse or accept before any CUDA call.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from cudattn._arrays import array as _array
from cudattn._runtime import device as _device

F16 = np.dtype(np.float16)
SHAPE = (1, 4, 2, 64)
_OFFSETS = np.array([0, 4], np.int32)
_VARLEN = dict(cu_seqlens_q=_OFFSETS, cu_seqlens_k=_OFFSETS, max_seqlen_q=4, max_seqlen_k=4)


def _host(shape=SHAPE):
    return np.zeros(shape, F16)


def _dev(shape=SHAPE):
    return _array.DeviceArray(0x7F00_0000_0000, shape, F16, device_id=0)


class _CAI:
    """A foreign device array: only a ``__cuda_array_interface__``."""

    def __init__(self, shape=SHAPE):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (0x7F00_0000_0000, False),
                                         "version": 3, "strides": None}


def _raises(fn, exc, pattern: str) -> str:
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert re.search(pattern, msg), f"{msg!r} does not match {pattern!r}"
    assert "\n" not in msg, f"not one line: {msg!r}"
    return msg


_NOT_ARRAY = r"must be a NumPy array or a device array \(a DeviceArray, or an object with __cuda_array_interface__"


# ---------------------------------------------------------------- attention (and its varlen form)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("bad, got", [(lambda a: a.tolist(), "list"), (lambda a: None, "None"),
                                      (lambda a: 3.0, "float"), (lambda a: object(), "object")])
def test_attention_names_q_when_it_is_no_array(varlen, bad, got):
    shape = SHAPE[1:] if varlen else SHAPE
    k, v = _host(shape), _host(shape)
    kw = _VARLEN if varlen else {}
    msg = _raises(lambda: cudattn.attention(bad(_host(shape)), k, v, **kw), TypeError,
                  rf"^q {_NOT_ARRAY}.*; got {got}$")
    # the old message blamed k and v ("k, v are NumPy and the rest are not") and never named q's type
    assert "the rest" not in msg and "k, v" not in msg


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_attention_names_every_argument_that_is_no_array(varlen):
    shape = SHAPE[1:] if varlen else SHAPE
    kw = _VARLEN if varlen else {}
    _raises(lambda: cudattn.attention(_host(shape), _host(shape).tolist(), None, **kw), TypeError,
            r"^k and v must be NumPy arrays or device arrays \(.*\); got k: list, v: None$")


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_attention_with_a_device_q_names_the_argument_that_is_no_array(varlen):
    # a q of a producer cudattn does not know (CAI here) sends the call through the argument check;
    # a DeviceArray, torch or CuPy q does not (the warm path asks q alone): there the importer names
    # a k or v that is no array as it adapts it, on the call's stream
    # (test_importer_names_what_is_no_array below)
    q_kind = _CAI
    shape = SHAPE[1:] if varlen else SHAPE
    kw = _VARLEN if varlen else {}
    _raises(lambda: cudattn.attention(q_kind(shape), [1, 2], q_kind(shape), **kw), TypeError,
            rf"^k {_NOT_ARRAY}.*; got list$")
    _raises(lambda: cudattn.attention(q_kind(shape), q_kind(shape), None, **kw), TypeError,
            rf"^v {_NOT_ARRAY}.*; got None$")


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_attention_host_device_mix_names_both_sides(varlen):
    shape = SHAPE[1:] if varlen else SHAPE
    kw = _VARLEN if varlen else {}
    head = r"^q, k, v must be all NumPy arrays or all device arrays; "
    tail = r" \(copy with cudattn.to_device or cudattn.to_host first\)$"
    _raises(lambda: cudattn.attention(_dev(shape), _host(shape), _host(shape), **kw), TypeError,
            head + "k and v are NumPy arrays and q is a device array" + tail)
    _raises(lambda: cudattn.attention(_host(shape), _dev(shape), _CAI(shape), **kw), TypeError,
            head + "q is a NumPy array and k and v are device arrays" + tail)
    _raises(lambda: cudattn.attention(_host(shape), _dev(shape), _host(shape), **kw), TypeError,
            head + "q and v are NumPy arrays and k is a device array" + tail)


def test_attention_reports_no_array_before_a_mix():
    _raises(lambda: cudattn.attention(_dev(), _host(), "v"), TypeError, rf"^v {_NOT_ARRAY}.*; got str$")


# ---------------------------------------------------------------- attention_with_kvcache


def test_kvcache_names_q_when_it_is_no_array():
    for bad, got in ((_host().tolist(), "list"), (None, "None")):
        msg = _raises(lambda: cudattn.attention_with_kvcache(bad, _host(), _host()), TypeError,
                      rf"^q {_NOT_ARRAY}.*; got {got}$")
        assert "k_cache" not in msg


def test_kvcache_names_new_keys_that_are_no_arrays():
    _raises(lambda: cudattn.attention_with_kvcache(_CAI(), _CAI(), _CAI(), k_new=[1], v_new=_CAI()), TypeError,
            rf"^k_new {_NOT_ARRAY}.*; got list$")
    _raises(lambda: cudattn.attention_with_kvcache(_host(), _host(), _host(), k_new=_host(), v_new=(1,)), TypeError,
            rf"^v_new {_NOT_ARRAY}.*; got tuple$")


def test_kvcache_host_device_mix_names_both_sides():
    _raises(lambda: cudattn.attention_with_kvcache(_dev(), _host(), _host()), TypeError,
            r"^q, k_cache, v_cache must be all NumPy arrays or all device arrays; k_cache and v_cache are NumPy "
            r"arrays and q is a device array \(copy with cudattn.to_device or cudattn.to_host first\)$")
    _raises(lambda: cudattn.attention_with_kvcache(_host(), _host(), _host(), k_new=_dev(), v_new=_CAI()),
            TypeError, r"^q, k_cache, v_cache, k_new, v_new must be all NumPy arrays or all device arrays; "
                       r"q, k_cache and v_cache are NumPy arrays and k_new and v_new are device arrays")


def test_kvcache_refuses_out_on_the_numpy_path():
    # was silently ignored: the NumPy path returns a new array and never wrote out
    q, cache = _host((1, 1, 2, 64)), _host((1, 8, 2, 64))
    _raises(lambda: cudattn.attention_with_kvcache(q, cache, cache, out=np.empty_like(q)), TypeError,
            r"^out is taken by device calls only")


# ---------------------------------------------------------------- merge_attention_states

_O = np.zeros((1, 4, 2, 8), np.float32)
_L = np.zeros((1, 2, 4), np.float32)


def _dev_o():
    return _array.DeviceArray(0x7F00_0000_0000, _O.shape, np.float32, device_id=0)


def _dev_l():
    return _array.DeviceArray(0x7F00_0001_0000, _L.shape, np.float32, device_id=0)


def test_merge_names_a_part_that_is_no_array():
    # the host path's np.asarray used to turn it into a float64 or 0-d array and report that instead
    _raises(lambda: cudattn.merge_attention_states([_O.tolist()], [_L]), TypeError,
            rf"^merge_attention_states: outs\[0\] {_NOT_ARRAY}.*; got list$")
    _raises(lambda: cudattn.merge_attention_states([_O, _O], [_L, None]), TypeError,
            rf"^merge_attention_states: lses\[1\] {_NOT_ARRAY}.*; got None$")
    _raises(lambda: cudattn.merge_attention_states([_dev_o(), 3], [_dev_l(), _dev_l()]), TypeError,
            rf"^merge_attention_states: outs\[1\] {_NOT_ARRAY}.*; got int$")


def test_merge_host_device_mix_names_both_sides():
    _raises(lambda: cudattn.merge_attention_states([_O, _dev_o()], [_L, _L]), TypeError,
            r"^merge_attention_states: the parts of outs and lses must be all NumPy arrays or all device arrays; "
            r"outs\[0\], lses\[0\] and lses\[1\] are NumPy arrays and outs\[1\] is a device array")
    _raises(lambda: cudattn.merge_attention_states(np.stack([_O, _O]), [_dev_l(), _dev_l()]), TypeError,
            r"outs is a NumPy array and lses\[0\] and lses\[1\] are device arrays")


def test_merge_of_numpy_parts_still_works():
    out, lse = cudattn.merge_attention_states([_O, _O], [_L, _L])
    assert out.shape == _O.shape and lse.shape == _L.shape
    assert np.allclose(lse, np.log(2))


# ---------------------------------------------------------------- quantize_fp8 / dequantize


def test_quantize_heads_message_names_every_symbol():
    x = np.ones((2, 5, 3, 16), np.float32)
    msg = _raises(lambda: cudattn.quantize_fp8(x, per="head", heads_kv=2), ValueError,
                  r"^x has 3 heads, which is not a multiple of heads_kv=2: heads_kv is the number of descale "
                  r"columns, .* so it must divide 3 \(one of 1, 3\)$")
    assert "H/G" not in msg and "h*" not in msg  # the old message's symbols, never defined


def test_dequantize_descale_message_names_every_symbol():
    x8, _ = cudattn.quantize_fp8(np.ones((2, 5, 3, 16), np.float32))
    _raises(lambda: cudattn.dequantize(x8, np.ones((2, 2), np.float32)), ValueError,
            r"^descale has shape \(2, 2\); it must be \(B, G\) = \(2, G\): B x_fp8's batch and G >= 1 descale "
            r"columns dividing x_fp8's 3 heads")
    _raises(lambda: cudattn.dequantize(x8, np.ones((2, 3), np.float64)), TypeError,
            r"^descale has dtype float64; it must be float32, shape \(B, G\): batch by descale columns$")


def test_quantize_heads_message_stays_short_for_huge_head_counts():
    x = np.ones((0, 0, 2**40 + 1, 16), np.float32)  # empty, so no memory: only the shape is huge
    msg = _raises(lambda: cudattn.quantize_fp8(x, heads_kv=2), ValueError, r"so it must divide 1099511627777$")
    assert len(msg) < 300


# ---------------------------------------------------------------- empty_cache


class _NoCuda:
    """A driver module that fails the test if cudattn so much as looks at it."""

    def __getattr__(self, name):
        raise AssertionError(f"empty_cache touched the CUDA driver ({name}) with nothing to free")


def test_empty_cache_is_a_no_op_on_this_machine():
    if _device._initialized and _device._device_count:
        pytest.skip("this process has initialised CUDA on a GPU: empty_cache has work to do")
    assert cudattn.empty_cache() is None
    assert cudattn.empty_cache(0) is None


def test_empty_cache_never_initialises_cuda_to_find_nothing(monkeypatch):
    monkeypatch.setattr(_device, "_initialized", False)
    monkeypatch.setattr(_device, "driver", _NoCuda())
    monkeypatch.setattr(_array, "driver", _NoCuda())
    assert cudattn.empty_cache() is None
    assert cudattn.empty_cache(1) is None
    assert _device._initialized is False


def test_empty_cache_with_a_driver_that_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(_device, "_initialized", True)
    monkeypatch.setattr(_device, "_device_count", 0)
    monkeypatch.setattr(_array, "driver", _NoCuda())
    assert cudattn.empty_cache() is None


def test_empty_cache_still_checks_its_argument(monkeypatch):
    monkeypatch.setattr(_device, "_initialized", False)
    monkeypatch.setattr(_device, "driver", _NoCuda())
    with pytest.raises(TypeError, match="device must be an int device ordinal or a cuda.core Device, not str"):
        cudattn.empty_cache("cuda:0")


def test_empty_cache_still_frees_where_cuda_is_in_use(monkeypatch):
    """Once cudattn has initialised CUDA on a GPU, empty_cache synchronises the device, frees what
    streams keep and trims the pool, in that order."""
    done = []

    class _Dev:
        device_id = 1

    class _Driver:
        def cuCtxSynchronize(self):
            done.append("sync")
            return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(_device, "_initialized", True)
    monkeypatch.setattr(_device, "_device_count", 2)
    monkeypatch.setattr(_array, "get_device", lambda device: done.append(("device", device)) or _Dev())
    monkeypatch.setattr(_array, "driver", _Driver())
    monkeypatch.setattr(_array._stream_memory, "release", lambda device_id: done.append(("release", device_id)))
    monkeypatch.setattr(_array._alloc, "trim", lambda device_id: done.append(("trim", device_id)))
    monkeypatch.setattr(_array._alloc, "release_kept", lambda device_id: done.append(("kept", device_id)))
    assert cudattn.empty_cache(1) is None
    assert done == [("device", 1), ("kept", 1), "sync", ("release", 1), ("trim", 1)]


def test_importer_names_what_is_no_array():
    """What a call with a device q says of a k, v or new rows that are no array (the importer's
    words, as the call adapts them)."""
    from cudattn._arrays.importer import as_device_array

    for name, x, got in (("k", [1, 2], "list"), ("v", None, "NoneType"), ("k_new", (1,), "tuple")):
        _raises(lambda: as_device_array(x, name=name, stream_handle=0), TypeError,
                rf"^{name}: expected a NumPy array or a CUDA device array \(.*\), got {got}$")
