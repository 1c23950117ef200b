"""CPU: ``device=`` of the attention entries: NumPy calls compute on the device it names (the NumPy
paths ask `get_device` for it); device calls accept None or their operands' device and refuse
another by name; what is no device ordinal is a TypeError."""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn._arrays.array import DeviceArray
from cudattn._numpy import attention as _np_attention
from cudattn._numpy import backward as _np_backward
from cudattn._numpy import kvcache as _np_kvcache
from cudattn._numpy import varlen as _np_varlen

F16 = np.dtype(np.float16)


def _device_array(shape, device_id=0, dtype=F16):
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = 1 << 20, shape, dtype, device_id, None, False
    st, acc = [], dtype.itemsize
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    a.strides, a.stream_handle = tuple(reversed(st)), 0x7000
    return a


class _Chosen(Exception):
    pass


@pytest.fixture
def chosen(monkeypatch):
    """The device each NumPy path asks for, stopping the call there (no GPU needed)."""
    asked = []

    def get_device(device=None):
        asked.append(device)
        raise _Chosen

    for mod in (_np_attention, _np_backward, _np_kvcache, _np_varlen):
        monkeypatch.setattr(mod._device, "get_device", get_device)
    return asked


def test_numpy_calls_compute_on_the_device_named(chosen):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 32, 2, 64)).astype(F16) for _ in range(3))
    cu = np.array([0, 32], np.int32)
    calls = [
        lambda d: cudattn.attention(q, k, v, device=d),
        lambda d: cudattn.attention(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=32,
                                    max_seqlen_k=32, device=d),
        lambda d: cudattn.attention_with_kvcache(q[:, :1], k, v, cache_seqlens=np.array([32], np.int32), device=d),
        lambda d: cudattn.attention_backward(q, q, k, v, q, np.zeros((1, 2, 32), np.float32), device=d),
    ]
    for call in calls:
        for d in (None, 1):
            with pytest.raises(_Chosen):
                call(d)
    assert chosen == [None, 1] * len(calls)


@pytest.mark.parametrize("entry", ["attention", "kvcache", "backward"])
def test_device_calls_refuse_a_device_their_operands_are_not_on(entry):
    q, k, v = (_device_array((1, 32, 2, 64)) for _ in range(3))
    call = {"attention": lambda d: cudattn.attention(q, k, v, device=d),
            "kvcache": lambda d: cudattn.attention_with_kvcache(_device_array((1, 1, 2, 64)), k, v, device=d),
            "backward": lambda d: cudattn.attention_backward(q, q, k, v, q, _device_array((1, 2, 32), dtype=np.dtype(np.float32)),
                                                             device=d)}[entry]
    with pytest.raises(ValueError, match=r"^device=1 but the operands are on device 0: device= chooses the GPU of "
                                         r"NumPy calls"):
        call(1)
    with pytest.raises(TypeError, match="device must be an int device ordinal or a cuda.core Device, not str"):
        call("cuda:1")
