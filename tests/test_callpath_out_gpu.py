"""GPU: the call path's ``out=``: a DeviceArray ``out`` takes the call's stream and waits for its
producer; ``out`` sharing bytes with q, k or v, and null pointers, are refused (ValueError) before
any GPU work; attention_with_kvcache writes into its ``out``.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from _callpath_cases import (
    F16, NAN, SPIN, _check_attention, _check_kvcache, _from_torch, _kvcache_inputs, _nan_device, _qkv, _rand,
    _rng, _same_bits, _to_torch,
)

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------------------- 4. out=


def test_out_takes_the_call_stream_and_waits_for_its_producer(torch):
    """A DeviceArray out produced on stream A (a NaN fill queued behind a 0.1 s spin), written by
    a call on B: B must wait for A before writing (else A's fill lands on the result: a write
    after write race), and out.stream_handle becomes B, so later readers order after the call."""
    rng = _rng()
    q, k, v = _qkv(rng, 2, 177, 177, 4, 4, 64)
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    qd, kd, vd = (cudattn.to_device(x, stream=B.cuda_stream) for x in (q, k, v))
    cudattn.to_host(cudattn.attention(qd, kd, vd, causal=True, out=_nan_device(q.shape, F16, B.cuda_stream),
                                      stream=B.cuda_stream))  # warm
    od = cudattn.to_device(np.zeros(q.shape, F16), stream=A.cuda_stream)
    assert od.stream_handle == A.cuda_stream
    with torch.cuda.stream(A):
        torch.from_dlpack(od).fill_(0.0)  # torch's fill kernel loaded: a kernel's first (lazy) load waits for the GPU
        torch.cuda._sleep(SPIN)
        torch.from_dlpack(od).fill_(NAN)
    res = cudattn.attention(qd, kd, vd, causal=True, out=od, stream=B.cuda_stream)
    busy = not A.query()
    assert busy, "out's producer stream finished before the call returned: the call synchronized the host"
    assert res.ptr == od.ptr, "attention must write into the given out"
    assert od.stream_handle == B.cuda_stream, "out must take the call's stream"
    torch.cuda.synchronize()  # both streams done: a late NaN fill would now be in out
    _check_attention(cudattn.to_host(od), q, k, v, causal=True)


def _overlap_case(case, rng):
    """(q, k, v, out, snapshot-able buffer written if the check failed) for one overlap case."""
    B, S, H, D = 2, 64, 2, 64
    q, k, v = _qkv(rng, B, S, S, H, H, D)
    if case == "out-is-q":
        qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
        return qd, kd, vd, qd, qd
    if case == "out-is-v":
        qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
        return qd, kd, vd, vd, vd
    if case == "out-shares-half-of-k":
        big = cudattn.to_device(_rand(rng, (B, 2 * S, H, D), F16))
        qd, vd = cudattn.to_device(q), cudattn.to_device(v)
        return qd, big[:, :S], vd, big[:, S // 2:S // 2 + S], big
    if case == "out-shares-one-row-with-q":
        big = cudattn.to_device(_rand(rng, (B, 2 * S, H, D), F16))
        kd, vd = cudattn.to_device(k), cudattn.to_device(v)
        return big[:, :S], kd, vd, big[:, S - 1:2 * S - 1], big
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["out-is-q", "out-is-v", "out-shares-half-of-k", "out-shares-one-row-with-q"])
def test_out_overlapping_an_input_is_refused(case):
    """out sharing bytes with q, k or v would be written while still being read: ValueError
    ("overlap"), raised before any GPU work (the shared buffer is unchanged afterwards)."""
    qd, kd, vd, od, buf = _overlap_case(case, _rng())
    before = cudattn.to_host(buf)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qd, kd, vd, out=od)
    assert _same_bits(cudattn.to_host(buf), before), "the refused call wrote into the buffer"


def test_out_overlapping_a_torch_input_is_refused(torch):
    """The same check for torch tensors: out=q (the very tensor) raises ValueError ("overlap")."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 32, 32, 2, 2, 64)
    qt, kt, vt = (_to_torch(torch, x) for x in (q, k, v))
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qt, kt, vt, out=qt)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention(qt, kt, vt, out=vt[:, :, :])
    assert _same_bits(_from_torch(torch, qt), q)


def test_out_beside_an_input_in_one_allocation_is_accepted():
    """Views that share an allocation but no bytes are not an overlap: q and out as the two halves
    (along the batch axis, so their byte ranges are disjoint) of one buffer, and k passed as both k
    and v (inputs may alias each other: they are only read)."""
    rng = _rng()
    B, S, H, D = 2, 96, 2, 64
    q, k = _rand(rng, (B, S, H, D), F16), _rand(rng, (B, S, H, D), F16)
    big = cudattn.to_device(np.concatenate([q, np.full_like(q, np.nan)], axis=0))
    kd = cudattn.to_device(k)
    res = cudattn.attention(big[:B], kd, kd, causal=True, out=big[B:])
    assert res.ptr == big[B:].ptr
    host = cudattn.to_host(big)
    assert _same_bits(host[:B], q), "q changed"
    _check_attention(host[B:], q, k, k, causal=True)


_NULL_CHILD = r"""
import sys
import numpy as np
import cudattn

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal(s, dtype=np.float32).astype(np.float16) for s in ((1, 16, 2, 64), (1, 32, 2, 64),
                                                                              (1, 32, 2, 64)))
for which in ("q", "k", "v", "out"):
    args = {"q": cudattn.to_device(q), "k": cudattn.to_device(k), "v": cudattn.to_device(v),
            "out": cudattn.to_device(np.full(q.shape, np.nan, np.float16))}
    args[which] = cudattn.DeviceArray(0, args[which].shape, np.float16, device_id=0)
    try:
        cudattn.attention(args["q"], args["k"], args["v"], out=args["out"])
        cudattn.to_host(args["out"] if which != "out" else args["q"])
        print(which, "accepted")
    except ValueError as e:
        print(which, "ValueError", "null" in str(e).lower(), str(e).replace(chr(10), " "))
    except Exception as e:
        print(which, type(e).__name__, False, str(e).replace(chr(10), " ")[:200])
o = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)))
print("healthy", bool(np.isfinite(cudattn.to_host(o).astype(np.float32)).all()))
"""


def test_null_pointer_operand_is_refused():
    """A DeviceArray with pointer 0 and a nonzero size (a bare, unallocated view) as q, k, v or out
    is refused with ValueError ("null") before any GPU work, instead of faulting the context. Run in
    a child process: an implementation that launches anyway kills the CUDA context, which would
    fail every later test of the session for an unrelated reason."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NULL_CHILD], capture_output=True, text=True, timeout=300)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    report = f"child rc={r.returncode}\nstdout:\n{r.stdout}\nstderr (tail):\n{r.stderr[-2000:]}"
    for which in ("q", "k", "v", "out"):
        assert lines.get(which, "").startswith("ValueError True"), f"{which}: {lines.get(which)!r}\n{report}"
    assert lines.get("healthy") == "True", report


@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_kvcache_writes_into_out(num_splits):
    """attention_with_kvcache(out=...): the result lands in the given (NaN-poisoned) out."""
    q, kc, vc, sl = _kvcache_inputs(_rng())
    od = _nan_device(q.shape, F16)
    res = cudattn.attention_with_kvcache(*(cudattn.to_device(x) for x in (q, kc, vc)),
                                         cache_seqlens=cudattn.to_device(sl), causal=True, num_splits=num_splits,
                                         out=od)
    assert res.ptr == od.ptr, "attention_with_kvcache must write into the given out"
    _check_kvcache(cudattn.to_host(od), q, kc, vc, sl)


def test_kvcache_out_overlapping_q_is_refused():
    """attention_with_kvcache(out=q): ValueError ("overlap") before any GPU work."""
    q, kc, vc, sl = _kvcache_inputs(_rng())
    qd = cudattn.to_device(q)
    with pytest.raises(ValueError, match="overlap"):
        cudattn.attention_with_kvcache(qd, cudattn.to_device(kc), cudattn.to_device(vc),
                                       cache_seqlens=cudattn.to_device(sl), out=qd)
    assert _same_bits(cudattn.to_host(qd), q)
