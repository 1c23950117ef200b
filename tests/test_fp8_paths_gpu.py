"""GPU: FP8 (e4m3) attention beyond the accuracy rule: deterministic results (device and NumPy
paths bit-identical), NumPy in and out, cudattn.quantize_fp8 against the reference quantiser, and
threads sharing a stream. Both kernel families run on Hopper.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn import reference
from _fp8_cases import BF16, _block_n, _poisoned_out, _seed, _source, make_inputs
from _fp8_cases import kernel_family as kernel_family  # fixtures

pytestmark = pytest.mark.gpu


def test_deterministic():
    """Same inputs, several launches: bit-identical results (a race would move them)."""
    rng = np.random.default_rng(7)
    q, k, v, kw = make_inputs(rng, 2, 1023, 1023, 4, 4, 128)
    args = tuple(cudattn.to_device(x) for x in (q, k, v))
    dkw = {n: cudattn.to_device(d) for n, d in kw.items()}
    first = cudattn.to_host(cudattn.attention(*args, causal=True, **dkw))
    for _ in range(4):
        out = _poisoned_out(q.shape, BF16, host=False)
        again = cudattn.to_host(cudattn.attention(*args, causal=True, out=out, **dkw))
        assert np.array_equal(first.view(np.uint16), again.view(np.uint16))
    # and the NumPy path computes the very same bits
    host = cudattn.attention(q, k, v, causal=True, **kw)
    assert np.array_equal(first.view(np.uint16), host.view(np.uint16))


def test_numpy_in_numpy_out():
    rng = np.random.default_rng(3)
    q, k, v, kw = make_inputs(rng, 2, 99, 99, 4, 4, 64)
    out, lse = cudattn.attention(q, k, v, causal=True, return_lse=True, **kw)
    assert type(out) is np.ndarray and out.dtype == BF16 and out.shape == q.shape
    assert type(lse) is np.ndarray and lse.dtype == np.float32 and lse.shape == (2, 4, 99)
    ref = reference.attention(q, k, v, causal=True, **kw)
    emul = reference.attention_fp8_emulated(q, k, v, causal=True, block_n=_block_n(64, True, None), **kw)
    ok, stats = reference.check_close_fp8(out, ref, emul)
    assert ok, stats


@pytest.mark.parametrize("per", ["tensor", "head"])
def test_quantize_fp8_matches_the_reference_quantiser(per):
    """cudattn.quantize_fp8 follows the documented rule (descale = amax/448, x/descale rounded
    to nearest e4m3, saturating), which the reference's dequantisation assumes."""
    rng = np.random.default_rng(4)
    x = _source(rng, (2, 77, 6, 64), "outliers")
    x8, d = cudattn.quantize_fp8(x, per=per, heads_kv=3)
    r8, rd = reference.quantize_fp8(x, per=per, heads_kv=3)
    np.testing.assert_allclose(d, rd, rtol=1e-6)
    assert not np.isnan(x8.astype(np.float32)).any()
    # one e4m3 step at most where x/descale sat on a rounding boundary
    a, b = x8.astype(np.float64), r8.astype(np.float64)
    assert np.all(np.abs(a - b) <= np.maximum(2.0**-3 * np.abs(b), 2.0**-9))
    assert np.mean(a != b) < 1e-3


def test_threads_sharing_a_stream_keep_their_transposed_v():
    """Four threads call FP8 attention on one stream at once, each with its own inputs. A warm FP8
    call is two launches (V's transpose into a workspace, then attention reading it): were the
    workspace shared by the stream's calls, another thread's transpose could land between a call's
    two launches and the call would read the wrong V. Every result equals its thread's call alone."""
    import threading

    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    rng = np.random.default_rng(next(_seed))
    inputs = []
    for _ in range(4):
        q, k, v, kw = make_inputs(rng, 1, 256, 1024, 4, 4, 128)
        inputs.append((tuple(cudattn.to_device(x) for x in (q, k, v)), {n: cudattn.to_device(d) for n, d in kw.items()}))
    stream = dev.create_stream()
    alone = []
    for args, dkw in inputs:
        alone.append(cudattn.to_host(cudattn.attention(*args, stream=stream, **dkw)))
    got: dict = {}

    def work(i):
        dev.set_current()
        args, dkw = inputs[i]
        got[i] = [cudattn.attention(*args, stream=stream, **dkw) for _ in range(25)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stream.sync()
    for i in range(4):
        for o in got[i]:
            assert cudattn.to_host(o).view(np.uint16).tobytes() == alone[i].view(np.uint16).tobytes(), \
                f"thread {i}: a call read another call's data"
