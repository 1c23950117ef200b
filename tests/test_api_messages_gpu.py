"""GPU: with a real device q (its kind known by type alone on the warm path), an argument that is no
array is named by the importer as the call adapts it, before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest

import cudattn

pytestmark = pytest.mark.gpu

_NOT_ARRAY = r": expected a NumPy array or a CUDA device array \(.*\), got "


def _dev(shape, rng):
    return cudattn.to_device(rng.standard_normal(shape, dtype=np.float32).astype(np.float16))


def test_a_device_q_with_a_k_or_v_that_is_no_array_names_it(torch):
    rng = np.random.default_rng(3)
    q = _dev((1, 37, 2, 64), rng)
    with pytest.raises(TypeError, match=rf"^k{_NOT_ARRAY}list$"):
        cudattn.attention(q, [1, 2], q)
    with pytest.raises(TypeError, match=rf"^v{_NOT_ARRAY}NoneType$"):
        cudattn.attention(torch.from_dlpack(q), torch.from_dlpack(q), None)
    kc = _dev((1, 64, 2, 64), rng)
    with pytest.raises(TypeError, match=rf"^k_new{_NOT_ARRAY}list$"):
        cudattn.attention_with_kvcache(q[:, :1], kc, kc, cache_seqlens=np.array([3], np.int32), k_new=[1],
                                       v_new=q[:, :1])
