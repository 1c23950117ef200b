"""GPU: CUDA graphs. Calls on a capturing stream are captured (torch and cuda.core graphs replay
bit for bit); they need ``out=`` (cudattn allocates no output in a graph it does not own), and a
capture call without it raises ValueError (the capture stays usable).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from _callpath_cases import (
    F16, NAN, _check_attention, _check_kvcache, _core_stream, _from_torch, _kvcache_inputs, _nan_device, _qkv,
    _rand, _rng, _same_bits, _to_torch,
)

pytestmark = pytest.mark.gpu


def _capture_status(h: int):
    err, status = driver.cuStreamIsCapturing(h)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return status


_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
#: What the refusal of an allocating call on a capturing stream must mention ("capture", "capturing").
_CAPTURE = r"(?i)captur"


@contextlib.contextmanager
def _building(s):
    """Capture on cuda.core Stream `s` with a graph builder in "global" mode (torch's default: any
    call that could disturb a capture fails); yields the builder. The capture is always ended,
    even when it was invalidated (cuda.core's end_building then raises without ending it, and a
    global capture left open would fail every later test)."""
    gb = s.create_graph_builder()
    gb.begin_building("global")
    try:
        yield gb
    except BaseException:
        _end_building(gb, s)
        raise
    if not _end_building(gb, s):
        raise AssertionError("the capture was invalidated: a captured call did something a capture forbids")


def _end_building(gb, s) -> bool:
    """End `gb`'s capture on `s`; False when it had been invalidated (then ended through the driver)."""
    try:
        gb.end_building()
        return True
    except Exception:
        err, graph = driver.cuStreamEndCapture(int(s.handle))
        if err == driver.CUresult.CUDA_SUCCESS and int(graph):
            driver.cuGraphDestroy(graph)
        return False


def _d2d(dst, src, stream_handle: int) -> None:
    """Queue a dense device-to-device copy src -> dst on the stream (used between graph launches)."""
    assert dst.nbytes == src.nbytes and dst.is_c_contiguous and src.is_c_contiguous
    (err,) = driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, stream_handle)
    assert err == driver.CUresult.CUDA_SUCCESS, err


# ---------------------------------------------------------------------------- 6. CUDA graphs
#
# The captured sequence: a causal GQA prefill with an odd length, a decode against a contiguous KV
# cache with device cache_seqlens (num_splits None, or 4: the split-KV combine), and a second
# attention whose q is the first call's output (a dependency inside the graph).

PRE = (2, 203, 8, 2, 128)  # B, S, Hq, Hkv, D
DEC = (2, 1000, 8, 2, 128)  # B, capacity, Hq, Hkv, D
S3 = 150  # keys of the third call
SEQLENS = ([1000, 377], [1, 731])  # per replay: the graph must read them on the GPU at replay time


def _graph_inputs(rng, seqlens):
    B, S, Hq, Hkv, D = PRE
    Bd, cap, Hdq, Hdkv, Dd = DEC
    return {
        "q1": _rand(rng, (B, S, Hq, D), F16), "k1": _rand(rng, (B, S, Hkv, D), F16),
        "v1": _rand(rng, (B, S, Hkv, D), F16),
        "qd": _rand(rng, (Bd, 1, Hdq, Dd), F16), "kc": _rand(rng, (Bd, cap, Hdkv, Dd), F16),
        "vc": _rand(rng, (Bd, cap, Hdkv, Dd), F16), "sl": np.asarray(seqlens, np.int32),
        "k3": _rand(rng, (B, S3, Hkv, D), F16), "v3": _rand(rng, (B, S3, Hkv, D), F16),
    }


def _graph_out_shapes():
    B, S, Hq, _, D = PRE
    Bd, _, Hdq, _, Dd = DEC
    return [(B, S, Hq, D), (Bd, 1, Hdq, Dd), (B, S, Hq, D)]


def _run_sequence(x, outs, num_splits, stream):
    """The three calls, each into its out (x: device inputs by name)."""
    cudattn.attention(x["q1"], x["k1"], x["v1"], causal=True, out=outs[0], stream=stream)
    cudattn.attention_with_kvcache(x["qd"], x["kc"], x["vc"], cache_seqlens=x["sl"], causal=True,
                                   num_splits=num_splits, out=outs[1], stream=stream)
    cudattn.attention(outs[0], x["k3"], x["v3"], out=outs[2], stream=stream)


def _check_sequence(h, outs):
    """The three host outputs against the float64 reference of the host inputs h."""
    _check_attention(outs[0], h["q1"], h["k1"], h["v1"], causal=True, what="captured prefill")
    _check_kvcache(outs[1], h["qd"], h["kc"], h["vc"], h["sl"], what="captured decode")
    _check_attention(outs[2], outs[0], h["k3"], h["v3"], what="captured attention on the first output")


@pytest.mark.parametrize("num_splits", [None, 4], ids=["splits-auto", "splits-4"])
def test_torch_graph_capture_replays_bit_for_bit(torch, num_splits):
    """torch.cuda.graph captures three calls made with torch tensors, stream=None (torch's capture
    stream) and out=; replayed twice on new inputs written in place (new cache_seqlens too), the
    graph's outputs equal eager calls on the same inputs bit for bit, and the reference."""
    rng = _rng()
    h = _graph_inputs(rng, SEQLENS[0])
    x = {n: _to_torch(torch, a) for n, a in h.items()}
    g_outs = [torch.empty(s, dtype=torch.float16, device="cuda") for s in _graph_out_shapes()]
    e_outs = [torch.empty(s, dtype=torch.float16, device="cuda") for s in _graph_out_shapes()]
    _run_sequence(x, e_outs, num_splits, None)  # warm-up (kernels loaded, plans made), as torch asks
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _run_sequence(x, g_outs, num_splits, None)
    for i, seqlens in enumerate(SEQLENS):
        h = _graph_inputs(rng, seqlens)
        for n, a in h.items():
            x[n].copy_(torch.from_numpy(a))
        for o in g_outs + e_outs:
            o.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        _run_sequence(x, e_outs, num_splits, None)
        torch.cuda.synchronize()
        for j, (go, eo) in enumerate(zip(g_outs, e_outs)):
            assert torch.equal(go, eo), f"replay {i}, call {j}: graph and eager results differ " \
                                        f"({int(go.isnan().sum())} NaN in the graph's)"
        if i == 0:
            _check_sequence(h, [_from_torch(torch, o) for o in g_outs])
    del g


@pytest.mark.parametrize("producer", ["capture-stream", "library-stream"])
@pytest.mark.parametrize("num_splits", [None, 4], ids=["splits-auto", "splits-4"])
def test_cuda_core_graph_capture_replays_bit_for_bit(producer, num_splits):
    """cuda.core's graph builder ("global" capture mode, like torch's) captures the same three calls
    on cudattn DeviceArrays with stream= the builder's stream handle; launched twice on new inputs
    (device-to-device copies into the captured buffers), it equals eager calls bit for bit.
    producer="library-stream": the operands and outs were made on cudattn's own stream, so the
    captured calls must not wait on that stream with a plain event (illegal inside a capture)."""
    dev, s, hs = _core_stream()
    rng = _rng()
    h = _graph_inputs(rng, SEQLENS[0])
    made_on = s if producer == "capture-stream" else None
    x = {n: cudattn.to_device(a, stream=made_on) for n, a in h.items()}
    g_outs = [_nan_device(sh, F16, stream=made_on) for sh in _graph_out_shapes()]
    e_outs = [_nan_device(sh, F16, stream=made_on) for sh in _graph_out_shapes()]
    _run_sequence(x, e_outs, num_splits, hs)  # warm-up
    dev.sync()
    with _building(s) as gb:
        assert _capture_status(hs) == _ACTIVE
        _run_sequence(x, g_outs, num_splits, hs)
        assert _capture_status(hs) == _ACTIVE, "a captured call invalidated the capture"
    graph = gb.complete()
    try:
        assert all(o.stream_handle == hs for o in g_outs), "out must take the call's stream"
        graph.upload(s)
        for i, seqlens in enumerate(SEQLENS):
            h = _graph_inputs(rng, seqlens)
            srcs = [cudattn.to_device(a, stream=s) for a in h.values()]
            for n, src in zip(h, srcs):
                _d2d(x[n], src, hs)
            for o in g_outs + e_outs:
                o.fill_nan(stream=s)
            graph.launch(s)
            s.sync()
            _run_sequence(x, e_outs, num_splits, hs)
            s.sync()
            got = [cudattn.to_host(o, stream=s) for o in g_outs]
            want = [cudattn.to_host(o, stream=s) for o in e_outs]
            for j, (go, eo) in enumerate(zip(got, want)):
                assert _same_bits(go, eo), f"replay {i}, call {j}: graph and eager results differ " \
                                           f"({np.isnan(go.astype(np.float32)).sum()} NaN in the graph's)"
            if i == 0:
                _check_sequence(h, got)
            del srcs
    finally:
        dev.sync()
        graph.close()
        gb.close()


def test_capture_without_out_is_refused_and_capture_survives_cuda_core():
    """On a capturing stream (cuda.core builder, "global" mode) a call without out= raises ValueError
    ("capture"), attention and attention_with_kvcache alike; the capture is not invalidated: a call
    with out= after it is captured, the capture ends cleanly, and the graph computes the result."""
    dev, s, hs = _core_stream()
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    qk, kc, vc, sl = _kvcache_inputs(rng)
    qd, kd, vd = (cudattn.to_device(a, stream=s) for a in (q, k, v))
    cache = [cudattn.to_device(a, stream=s) for a in (qk, kc, vc, sl)]
    od = _nan_device(q.shape, F16, stream=s)
    cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)  # warm-up
    cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3], out=_nan_device(qk.shape, F16, s), stream=hs)
    s.sync()
    od.fill_nan(stream=s)
    s.sync()
    with _building(s) as gb:
        assert _capture_status(hs) == _ACTIVE
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention(qd, kd, vd, causal=True, stream=hs)
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3], stream=hs)
        assert _capture_status(hs) == _ACTIVE, "the refused call invalidated the capture"
        cudattn.attention(qd, kd, vd, causal=True, out=od, stream=hs)
    graph = gb.complete()
    try:
        assert np.isnan(cudattn.to_host(od, stream=s).astype(np.float32)).all(), "captured work ran during capture"
        graph.launch(s)
        s.sync()
        _check_attention(cudattn.to_host(od, stream=s), q, k, v, causal=True, what="graph after a refused call")
    finally:
        dev.sync()
        graph.close()
        gb.close()


def test_capture_without_out_is_refused_and_capture_survives_torch(torch):
    """The same inside torch.cuda.graph with torch tensors and stream=None: the refusal leaves
    torch's capture valid (its exit would raise otherwise) and the graph replays correctly."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 203, 203, 8, 2, 128)
    qk, kc, vc, sl = _kvcache_inputs(rng)
    qt, kt, vt = (_to_torch(torch, a) for a in (q, k, v))
    cache = [_to_torch(torch, a) for a in (qk, kc, vc, sl)]
    ot = torch.empty(q.shape, dtype=torch.float16, device="cuda")
    cudattn.attention(qt, kt, vt, causal=True, out=ot)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        hs = torch.cuda.current_stream().cuda_stream
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention(qt, kt, vt, causal=True)
        with pytest.raises(ValueError, match=_CAPTURE):
            cudattn.attention_with_kvcache(*cache[:3], cache_seqlens=cache[3])
        assert _capture_status(hs) == _ACTIVE, "the refused call invalidated the capture"
        cudattn.attention(qt, kt, vt, causal=True, out=ot)
    ot.fill_(NAN)
    g.replay()
    torch.cuda.synchronize()
    _check_attention(_from_torch(torch, ot), q, k, v, causal=True, what="graph after a refused call")
    del g
