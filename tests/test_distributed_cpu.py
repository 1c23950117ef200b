"""The ring's schedule and sharding, without a GPU: every (query, key) pair of the whole sequence
is covered exactly once by the local calls a rank makes (the mask of each call, bottom-right
aligned as `cudattn.attention` has it, compared element by element with the global mask), and
the ring run in float64 (the reference's attention per call, its merge per query chunk) equals
the reference's attention on the whole sequence."""

from __future__ import annotations

import contextlib
import itertools
import types

import numpy as np
import pytest

from cudattn import reference
from cudattn.distributed import gather_sequence, shard_sequence
from cudattn.distributed.ring import _step_calls
from cudattn.distributed.schedule import INF, band, chunks_of, ring_steps

_CASES = [  # world, chunk length, zigzag, causal, window
    (1, 7, False, False, None), (2, 5, True, True, None), (3, 4, True, True, None), (4, 3, True, True, None),
    (2, 6, False, False, None), (4, 5, False, True, None), (3, 6, True, False, (4, 2)), (4, 5, True, True, (3, -1)),
    (2, 9, False, False, (0, 0)), (4, 4, True, False, (-1, 6)), (3, 5, False, True, (11, -1)),
    (2, 8, True, True, (20, 0)),
]


def _local_mask(b, c):
    """The mask of call ``b`` over its chunks' whole extent (rows x keys), bottom-right aligned."""
    m = np.zeros((c, c), bool)
    Sq, Sk = b.qb - b.qa, b.kb - b.ka
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    rel = j - i - (Sk - Sq)
    left, right = (-1, 0) if b.causal else (b.window or (-1, -1))
    ok = np.ones((Sq, Sk), bool)
    if left != -1:
        ok &= rel >= -left
    if right != -1:
        ok &= rel <= right
    m[b.qa:b.qb, b.ka:b.kb] = ok
    return m


@pytest.mark.parametrize("world,c,zigzag,causal,window", _CASES)
def test_every_pair_once(world, c, zigzag, causal, window):
    left, right = band(causal, window)
    n = world * (2 if zigzag else 1)
    S = n * c
    gi = np.arange(S)[:, None]
    gj = np.arange(S)[None, :]
    want = ((gj - gi) <= right) & ((gj - gi) >= -left)
    seen = np.zeros((S, S), int)
    sinks = np.zeros(n, int)
    work = []
    for r in range(world):
        steps = ring_steps(r, world, c, zigzag=zigzag, left=left, right=right)
        assert len(steps) == world
        done = 0
        for s, blocks in enumerate(steps):
            src = (r - s) % world
            for b in blocks:
                assert b.q_chunk in chunks_of(r, world, zigzag) and b.k_chunk in chunks_of(src, world, zigzag)
                assert b.window is None or min(b.window) >= -1
                m = _local_mask(b, c)
                seen[b.q_chunk * c:(b.q_chunk + 1) * c, b.k_chunk * c:(b.k_chunk + 1) * c] += m
                sinks[b.q_chunk] += b.sinks
                assert not b.sinks or (s, b.qa, b.qb) == (0, 0, c), "sinks on a call without every row of its chunk"
                done += int(m.sum())
                assert m.any(), "a call that sees nothing is made"
        work.append(done)
    np.testing.assert_array_equal(seen, want.astype(int))
    assert (sinks == 1).all()
    if zigzag and causal and window is None:
        assert len(set(work)) == 1, f"uneven causal work over ranks: {work}"


def test_zigzag_chunks_and_refusals():
    assert chunks_of(0, 4, True) == (0, 7) and chunks_of(3, 4, True) == (3, 4) and chunks_of(2, 4, False) == (2,)
    with pytest.raises(ValueError, match="rank"):
        chunks_of(4, 4, True)


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("axis", [1, 2])
def test_shard_and_gather_round_trip(zigzag, axis):
    x = np.arange(2 * 24 * 3 * 4).reshape(2, 24, 3, 4)
    if axis == 2:
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    shards = shard_sequence(x, 3, zigzag=zigzag, axis=axis)
    assert len(shards) == 3 and all(s.shape[axis] == 8 for s in shards)
    if zigzag:  # rank 0: chunks 0 and 5 of six
        first = np.take(x, np.r_[0:4, 20:24], axis=axis)
        np.testing.assert_array_equal(shards[0], first)
    np.testing.assert_array_equal(gather_sequence(shards, zigzag=zigzag, axis=axis), x)
    with pytest.raises(ValueError, match="divisible"):
        shard_sequence(x[:, :23] if axis == 1 else x[:, :, :23], 3, zigzag=zigzag, axis=axis)


def _ring_float64(q, k, v, world, *, zigzag, causal, window=None, softcap=None, sinks=None, slopes=None):
    """The ring of `cudattn.distributed.ring_attention` in float64: each rank's calls as the ring
    plans them (one call over the visiting K/V where nothing is masked and no ALiBi, else one per
    chunk pair, ALiBi's diagonal moved by the pair's `Block.alibi_shift`, rows a window leaves out
    given LSE -inf) through the reference's attention, merged by LSE per
    query chunk; the whole output."""
    B, S, Hq, D = q.shape
    n = world * (2 if zigzag else 1)
    c = S // n
    left, right = band(causal, window)
    chunk = lambda x, i: x[:, i * c:(i + 1) * c]  # noqa: E731
    out = np.zeros(q.shape)
    for r in range(world):
        mine = chunks_of(r, world, zigzag)
        parts = {qc: ([], []) for qc in mine}
        for s, blocks in enumerate(ring_steps(r, world, c, zigzag=zigzag, left=left, right=right)):
            src = chunks_of((r - s) % world, world, zigzag)
            for qc, b, ki in _step_calls(blocks, mine, src, c, slopes is None):
                o = np.zeros((B, c, Hq, D))
                lse = np.full((B, Hq, c), -np.inf)
                if b is None:
                    kx, vx = (np.concatenate([chunk(x, i) for i in src], axis=1) for x in (k, v))
                    o, lse = reference.attention(chunk(q, qc), kx, vx, softcap=softcap, return_lse=True)
                else:
                    assert src[ki] == b.k_chunk
                    kx, vx = (chunk(x, b.k_chunk)[:, b.ka:b.kb] for x in (k, v))
                    qx, kw = chunk(q, qc)[:, b.qa:b.qb], dict(causal=b.causal, window_size=b.window, softcap=softcap,
                                                               sinks=sinks if b.sinks else None)
                    o[:, b.qa:b.qb], lse[:, :, b.qa:b.qb] = reference.attention(qx, kx, vx, **kw, return_lse=True) \
                        if slopes is None else _shifted_alibi_call(qx, kx, vx, **kw, slopes=slopes,
                                                                   shift=b.alibi_shift(c))
                parts[qc][0].append(o)
                parts[qc][1].append(lse)
        for qc, (os_, ls) in parts.items():
            out[:, qc * c:(qc + 1) * c] = reference.merge_attention_states(os_, ls)[0]
    return out


@pytest.mark.parametrize("world,zigzag,causal,mods", [
    (2, True, True, {}), (4, True, True, {"softcap": 20.0}), (3, False, False, {}), (2, False, True, {}),
    (4, True, True, {"sinks": True}), (3, True, False, {"window": (9, 3)}), (4, True, True, {"window": (13, -1)}),
    (4, False, False, {"window": (5, 5), "sinks": True}), (2, True, False, {"softcap": 5.0, "sinks": True}),
    (2, True, True, {"window": (3, 0), "sinks": True}), (3, True, False, {"window": (4, 2), "sinks": True}),
    (1, True, True, {"window": (4, 0), "sinks": True}), (2, True, True, {"alibi": True}),
    (3, False, False, {"alibi": True}), (2, True, False, {"alibi": True, "softcap": 5.0}),
    (4, True, True, {"alibi": True, "window": (13, -1), "sinks": True}), (3, True, False, {"alibi": True, "window": (4, 2)}),
    (1, True, False, {"alibi": True}),
])
def test_ring_in_float64_equals_whole_attention(world, zigzag, causal, mods):
    rng = np.random.default_rng(4000 + world)
    B, Hq, Hkv, D = 2, 4, 2, 16
    S = world * (2 if zigzag else 1) * 6
    q = rng.standard_normal((B, S, Hq, D))
    k, v = (rng.standard_normal((B, S, Hkv, D)) for _ in range(2))
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    slopes = rng.uniform(0.05, 0.6, (B, Hq)).astype(np.float32) if mods.get("alibi") else None
    kw = dict(window_size=mods.get("window"), softcap=mods.get("softcap"), sinks=sinks)
    got = _ring_float64(q, k, v, world, zigzag=zigzag, causal=causal, window=kw["window_size"],
                        softcap=kw["softcap"], sinks=sinks, slopes=slopes)
    want = reference.attention(q, k, v, causal=causal, alibi_slopes=slopes, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_last_step_stops_the_ring_where_a_window_ends():
    from cudattn.distributed.schedule import last_step

    assert last_step(4, 8, zigzag=False, left=INF, right=INF) == 3
    assert last_step(4, 8, zigzag=False, left=5.0, right=0.0) == 1  # one chunk back is all a short window sees
    assert last_step(4, 8, zigzag=True, left=INF, right=0.0) == 3


def test_band_of_the_api_arguments():
    assert band(False, None) == (INF, INF) and band(True, None) == (INF, 0.0)
    assert band(True, (5, 7)) == (5.0, 0.0) and band(False, (-1, 3)) == (INF, 3.0)
    for world, zig in itertools.product((1, 2, 3), (False, True)):
        assert sum(len(chunks_of(r, world, zig)) for r in range(world)) == world * (2 if zig else 1)


class _Comm:  # what ring_attention reads of a communicator
    nranks, rank, ptr = 2, 0, 0
    device = type("Device", (), {"device_id": 0})()


def _no_nccl():
    raise ImportError("no NCCL here")  # a refused call then raises its own error (no peer can wait)


def test_ring_attention_refuses_before_any_gpu_work(monkeypatch):
    from cudattn.distributed import agree, ring_attention

    monkeypatch.setattr(agree, "nccl", _no_nccl)  # also where nccl4py is installed
    Comm = _Comm
    x = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(TypeError, match="q must be a cudattn DeviceArray"):
        ring_attention(x, x, x, Comm(), causal=True)
    with pytest.raises(ValueError, match="window_size's left must be >= -1"):
        ring_attention(x, x, x, Comm(), window_size=(-2, 0))
    with pytest.raises(ValueError, match="layout"):
        ring_attention(x, x, x, Comm(), layout="sbhd")
    monkeypatch.setattr(agree, "DeviceArray", _HostArray)
    h = _HostArray(x)
    rule = r"ring_attention: alibi_slopes must be a C-contiguous float32 DeviceArray of shape \(2,\) or \(1, 2\)"
    for bad, got in ((np.ones(2, np.float32), "ndarray"),
                     (_HostArray(np.ones(3, np.float32)), r"a float32 DeviceArray \(3,\) on cuda:0"),
                     (_HostArray(np.ones(2)), r"a float64 DeviceArray \(2,\)"),
                     (_HostArray(np.ones((2, 2), np.float32)[:, 0]), r"a float32 DeviceArray \(2,\) on cuda:0, not C-")):
        with pytest.raises(ValueError, match=rule + ".*; got " + got):
            ring_attention(h, h, h, Comm(), alibi_slopes=bad)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match=rf"sm_margin must be an int >= 0; got {bad!r}"):
            ring_attention(h, h, h, Comm(), sm_margin=bad)


def test_ring_attention_backward_refuses_bad_slopes_before_any_gpu_work(monkeypatch):
    from cudattn.distributed import agree, ring_backward

    monkeypatch.setattr(agree, "nccl", _no_nccl)
    monkeypatch.setattr(agree, "DeviceArray", _HostArray)
    monkeypatch.setattr(ring_backward, "DeviceArray", _HostArray)
    h = _HostArray(np.zeros((1, 8, 2, 64), np.float16))
    lse = _HostArray(np.zeros((1, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"^ring_attention_backward: alibi_slopes must be a C-contiguous float32 "
                                         r"DeviceArray of shape \(2,\) or \(1, 2\).*; got a float32 DeviceArray \(4,\)"):
        ring_backward.ring_attention_backward(h, h, h, h, h, lse, _Comm(), alibi_slopes=_HostArray(np.ones(4, np.float32)))


def test_importing_cudattn_imports_neither_the_ring_nor_nccl():
    import subprocess
    import sys

    code = "import sys, cudattn; print('cudattn.distributed' in sys.modules, 'nccl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_scaling_inputs_are_the_same_chunks_on_every_rank_and_rows_check():
    from cudattn.distributed import scaling

    case = {"B": 1, "H": 4, "Hkv": 2, "S": 96, "D": 32, "dtype": "bfloat16", "causal": True, "seed": 5}
    world, n = 3, 6
    c = case["S"] // n
    shape = (1, c, 2, 32)
    shards = [np.concatenate([scaling.chunk_data(5, 1, i, shape, "bfloat16") for i in chunks_of(r, world, True)],
                             axis=1) for r in range(world)]
    np.testing.assert_array_equal(gather_sequence(shards, zigzag=True), scaling.whole(5, 1, n, shape, "bfloat16"))
    q, k, v = (scaling.whole(5, w, n, (1, c, h, 32), "bfloat16") for w, h in enumerate((4, 2, 2)))
    out = reference.attention(q, k, v, causal=True).astype(q.dtype)
    assert scaling.check_rows(case, world, out)[0]
    assert not scaling.check_rows(case, world, out * 2)[0]


def test_launcher_refuses_bad_worlds_before_starting_anything():
    from cudattn.distributed import launch

    with pytest.raises(ValueError, match="world"):
        launch.run(print, 0)
    with pytest.raises(ValueError, match="distinct"):
        launch.run(print, 2, devices=[0, 0])


def _replay(plan, buffers):
    """`copies.run_plan` on host bytes: ``buffers`` maps names to flat uint8 arrays."""
    for c in plan:
        for r in range(c.height):
            s, d = c.src_off + r * c.src_pitch, c.dst_off + r * c.dst_pitch
            buffers[c.dst][d:d + c.width] = buffers[c.src][s:s + c.width]


def _bytes(x):
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8).copy()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_to_all_copy_plans_against_numpy(world):
    from cudattn.distributed import copies

    B, s, H, D = 2, 3, 8, 4
    x = np.arange(B * s * H * D, dtype=np.float32).reshape(B, s, H, D)
    buf = {"x": _bytes(x), "send": np.zeros(x.nbytes, np.uint8)}
    _replay(copies.heads_to_ranks(B, s, H, D, world, 4, "x", "send"), buf)
    want = x.reshape(B, s, world, H // world, D).transpose(2, 0, 1, 3, 4)
    np.testing.assert_array_equal(buf["send"].view(np.float32).reshape(want.shape), want)
    buf["back"] = np.zeros(x.nbytes, np.uint8)
    _replay(copies.ranks_to_heads(B, s, H, D, world, 4, "send", "back"), buf)
    np.testing.assert_array_equal(buf["back"].view(np.float32).reshape(x.shape), x)
    S, inner = s * world, 12
    y = np.arange(world * B * s * inner // 4, dtype=np.float32).reshape(world, B, s, inner // 4)
    buf = {"y": _bytes(y), "whole": np.zeros(y.nbytes, np.uint8), "again": np.zeros(y.nbytes, np.uint8)}
    _replay(copies.ranks_to_rows(B, S, inner, world, "y", "whole"), buf)
    np.testing.assert_array_equal(buf["whole"].view(np.float32).reshape(B, S, -1),
                                  y.transpose(1, 0, 2, 3).reshape(B, S, -1))
    _replay(copies.rows_to_ranks(B, S, inner, world, "whole", "again"), buf)
    np.testing.assert_array_equal(buf["again"], _bytes(y))


@pytest.mark.parametrize("world,causal", [(2, True), (4, False), (4, True)])
def test_ulysses_in_float64_equals_whole_attention(world, causal):
    """Both all-to-alls of `ulysses_attention` replayed on host bytes (each rank's plans, the exchange
    done by hand), the reference's attention between them, LSEs too."""
    from cudattn.distributed import copies

    rng = np.random.default_rng(4300 + world)
    B, Hq, Hkv, D = 2, 8, 4, 8
    s = 5
    S = s * world
    q = rng.standard_normal((B, S, Hq, D))
    k, v = (rng.standard_normal((B, S, Hkv, D)) for _ in range(2))
    e, h = 8, Hq // world
    shards = {n: shard_sequence(x, world, zigzag=False) for n, x in (("q", q), ("k", k), ("v", v))}
    sent = {}
    for r in range(world):
        for n, heads in (("q", Hq), ("k", Hkv), ("v", Hkv)):
            buf = {"x": _bytes(shards[n][r]), "send": np.zeros(shards[n][r].nbytes, np.uint8)}
            _replay(copies.heads_to_ranks(B, s, heads, D, world, e, "x", "send"), buf)
            sent[r, n] = buf["send"].reshape(world, -1)
    outs, lses = {}, {}
    for r in range(world):
        full = {}
        for n, heads in (("q", Hq), ("k", Hkv), ("v", Hkv)):
            recv = np.concatenate([sent[j, n][r] for j in range(world)])  # block j from rank j
            buf = {"recv": recv, "whole": np.zeros(recv.size, np.uint8)}
            _replay(copies.ranks_to_rows(B, S, heads // world * D * e, world, "recv", "whole"), buf)
            full[n] = buf["whole"].view(np.float64).reshape(B, S, heads // world, D)
        o, lse = reference.attention(full["q"], full["k"], full["v"], causal=causal, return_lse=True)
        buf = {"o": _bytes(o), "send": np.zeros(o.nbytes, np.uint8), "l": _bytes(lse),
               "lsend": np.zeros(lse.nbytes, np.uint8)}
        _replay(copies.rows_to_ranks(B, S, h * D * e, world, "o", "send"), buf)
        _replay(copies.rows_to_ranks(B * h, S, e, world, "l", "lsend"), buf)
        outs[r], lses[r] = buf["send"].reshape(world, -1), buf["lsend"].reshape(world, -1)
    want, want_lse = reference.attention(q, k, v, causal=causal, return_lse=True)
    for r in range(world):
        recv = np.concatenate([outs[j][r] for j in range(world)])
        lrecv = np.concatenate([lses[j][r] for j in range(world)])
        buf = {"recv": recv, "out": np.zeros(recv.size, np.uint8), "lrecv": lrecv,
               "lse": np.zeros(lrecv.size, np.uint8)}
        _replay(copies.ranks_to_heads(B, s, Hq, D, world, e, "recv", "out"), buf)
        _replay(copies.ranks_to_heads(B, 1, Hq, s, world, e, "lrecv", "lse"), buf)
        np.testing.assert_allclose(buf["out"].view(np.float64).reshape(B, s, Hq, D), want[:, r * s:(r + 1) * s],
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(buf["lse"].view(np.float64).reshape(B, Hq, s), want_lse[:, :, r * s:(r + 1) * s],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backward", [False, True])
def test_ulysses_refuses_before_any_gpu_work(backward, monkeypatch):
    from cudattn.distributed import agree, ulysses_attention, ulysses_attention_backward

    monkeypatch.setattr(agree, "nccl", _no_nccl)  # also where nccl4py is installed
    Comm = _Comm

    x = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(TypeError, match="q must be a cudattn DeviceArray"):
        if backward:
            ulysses_attention_backward(x, x, x, x, x, np.zeros((1, 2, 8), np.float32), Comm())
        else:
            ulysses_attention(x, x, x, Comm())


class _HostArray:
    """What the ring reads of a DeviceArray, over a NumPy array (views included)."""

    def __init__(self, a):
        self.a = a
        self.ptr, self.device_id, self.stream_handle = id(a), 0, None

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    strides = property(lambda self: self.a.strides)
    ndim = property(lambda self: self.a.ndim)
    nbytes = property(lambda self: self.a.nbytes)
    is_c_contiguous = property(lambda self: self.a.flags.c_contiguous)

    def __getitem__(self, key):
        return _HostArray(self.a[key])

    def memset(self, pattern, *, stream=None):
        self.a.view(np.uint32)[...] = pattern


def _ring_inputs(seed: int, world: int, causal: bool, mods: dict):
    """A small ring problem: q, k, v (B=2, 4 query and 2 key heads, D=16, 6 tokens a chunk), sinks,
    and the window and softcap keywords."""
    rng = np.random.default_rng(seed)
    B, Hq, Hkv, D = 2, 4, 2, 16
    S = world * (2 if causal else 1) * 6
    q = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(np.float16) for _ in range(2))
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    kw = {"window_size": mods.get("window"), "softcap": mods.get("softcap")}
    if mods.get("alibi"):
        kw["alibi_slopes"] = rng.uniform(0.05, 0.6, mods.get("alibi_shape", (Hq,))).astype(np.float32)
    return q, k, v, sinks, kw


def _on_host(monkeypatch, mod, **fakes) -> None:
    """A ring module's (``ring`` or ``ring_backward``) GPU work stood in for on host arrays: copies by
    NumPy, no streams, and ``fakes`` (its ``begin``, ``new_array``, calls...) as given."""
    import types

    from cudattn.distributed import agree

    monkeypatch.setattr(agree, "DeviceArray", _HostArray)
    monkeypatch.setattr(mod, "place", lambda dst, src, stream: dst.a.__setitem__(Ellipsis, src.a))
    monkeypatch.setattr(mod, "stream_wait", lambda *a, **k: None)
    monkeypatch.setattr(mod, "call_stream", lambda q, s, d: types.SimpleNamespace(handle=0, obj=None))
    monkeypatch.setattr(mod, "_comm_stream", lambda d, c: 1)
    monkeypatch.setattr(mod._lifetime, "hold", lambda *a: None)
    for name, fake in fakes.items():
        monkeypatch.setattr(mod, name, fake)


def _alibi_bias(slopes, B: int, Hq: int, Sq: int, Sk: int, shift: int) -> np.ndarray:
    """``(B, Hq, Sq, Sk)``: ALiBi's ``-slope * |j - i - (Sk - Sq) - shift|`` (shift: `_kernels.alibi_shift`)."""
    s = np.broadcast_to(np.asarray(slopes, np.float64), (B, Hq))
    rel = np.arange(Sk)[None, :] - np.arange(Sq)[:, None] - (Sk - Sq) - shift
    return -s[:, :, None, None] * np.abs(rel)[None, None]


def _shifted_alibi_call(q, k, v, *, causal, window_size, softcap, sinks, slopes, shift):
    """(output, LSE) in float64 of one call whose ALiBi diagonal is moved ``shift`` keys right (as
    the kernels do inside `alibi_shift.shifted`), masks as `attention`'s (bottom right)."""
    B, Sq, Hq, D = q.shape
    Sk, g = k.shape[1], Hq // k.shape[2]
    Q, K, V = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bihd,bjhd->bhij", Q, np.repeat(K, g, axis=2)) / np.sqrt(D)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = s + _alibi_bias(slopes, B, Hq, Sq, Sk, shift)
    rel = np.arange(Sk)[None, :] - np.arange(Sq)[:, None] - (Sk - Sq)
    left, right = window_size if window_size is not None else (-1, -1)
    right = 0 if causal else right
    ok = ((rel >= -left) | (left == -1)) & ((rel <= right) | (right == -1))
    s = np.where(ok, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(np.asarray(sinks, np.float64)[None, :, None, None] - m)
    out = np.einsum("bhij,bjhd->bihd", p / np.where(den > 0, den, 1), np.repeat(V, g, axis=2))
    lse = np.where(den[..., 0] > 0, m[..., 0] + np.log(np.where(den[..., 0] > 0, den[..., 0], 1)), -np.inf)
    return out, lse


def test_the_shifted_alibi_call_is_the_references_at_no_shift():
    rng = np.random.default_rng(4590)
    q, k, v = (rng.standard_normal((2, n, 4, 16)) for n in (5, 9, 9))
    v = v[:, :, :2]
    k = k[:, :, :2]
    slopes = rng.uniform(0.05, 0.6, 4).astype(np.float32)
    for causal, window, sinks in ((False, None, None), (True, None, rng.uniform(-1, 2, 4).astype(np.float32)),
                                  (False, (3, 2), None)):
        got = _shifted_alibi_call(q, k, v, causal=causal, window_size=window, softcap=5.0, sinks=sinks,
                                  slopes=slopes, shift=0)
        want = reference.attention(q, k, v, causal=causal, window_size=window, softcap=5.0, sinks=sinks,
                                   alibi_slopes=slopes, return_lse=True)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def _reference_call(q_, k_, v_, causal, window_size, softcap, sinks, out):
    """The ring's `attention` call on host arrays, by the float64 reference: (output, LSE)."""
    o, lse = reference.attention(q_.a, k_.a, v_.a, causal=causal, window_size=window_size, softcap=softcap,
                                 sinks=sinks, return_lse=True)
    target = out if out is not None else _HostArray(np.empty(q_.shape, q_.dtype))
    target.a[...] = o
    return target, _HostArray(lse.astype(np.float32))


def _reference_merge(outs, lses, *, layout, stream):
    o, lse = reference.merge_attention_states(list(outs.a), list(lses.a))
    return _HostArray(o.astype(outs.dtype)), _HostArray(lse.astype(np.float32))


@pytest.mark.parametrize("world,causal,mods", [(2, True, {}), (4, True, {"sinks": 1}), (3, False, {}),
                                               (4, True, {"window": (9, 0), "sinks": 1}),
                                               (4, False, {"window": (7, 3)}),
                                               (2, True, {"softcap": 7.0}), (2, True, {"alibi": 1}),
                                               (3, False, {"alibi": 1, "window": (7, 3)}),
                                               (4, True, {"alibi": 1, "sinks": 1, "alibi_shape": (2, 4)})])
def test_the_ring_driver_on_host_arrays(world, causal, mods, monkeypatch):
    """`ring._ring` itself, each rank in turn, on host arrays: attention, merge and copies by the float64
    reference and NumPy, a rank's receives filled with what its neighbour sends at that step."""
    import types

    from cudattn._kernels import alibi_shift, sm_margin
    from cudattn.distributed import ring

    q, k, v, sinks, kw = _ring_inputs(4600 + world, world, causal, mods)
    slopes = kw.pop("alibi_slopes", None)
    zig = causal
    shards = {n: shard_sequence(x, world, zigzag=zig) for n, x in (("k", k), ("v", v))}

    margins = []  # the SMs each call leaves free (ring_attention's sm_margin, here the world size)

    # A non-blocking communicator: a group's end leaves it in progress for two queries, and NCCL's
    # rule holds (no NCCL call, no work on its streams, before it reports success).
    nccl_state = {"pending": False, "n": 0, "settled": 0}

    def group_start():
        assert not nccl_state["pending"], "an NCCL call while the last one was in progress"

    def group_end():
        nccl_state["pending"] = True

    def query(handle):
        nccl_state["n"] += 1
        if nccl_state["pending"] and nccl_state["n"] % 3:
            return 7
        nccl_state["settled"] += nccl_state["pending"]
        nccl_state["pending"] = False
        return 0

    def attention(q_, k_, v_, *, scale, layout, softcap, return_lse, stream, causal=False, window_size=None,
                  sinks=None, out=None, alibi_slopes=None):
        margins.append(sm_margin.current())
        assert not nccl_state["pending"], "attention queued while an NCCL call was in progress"
        if alibi_slopes is None:
            assert alibi_shift.local.n == 0
            return _reference_call(q_, k_, v_, causal, window_size, softcap, sinks, out)
        o, lse = _shifted_alibi_call(q_.a, k_.a, v_.a, causal=causal, window_size=window_size, softcap=softcap,
                                     sinks=sinks, slopes=alibi_slopes.a, shift=alibi_shift.local.n)
        target = out if out is not None else _HostArray(np.empty(q_.shape, q_.dtype))
        target.a[...] = o
        return target, _HostArray(lse.astype(np.float32))

    bufs = {}
    outs = []
    for r in range(world):
        calls = {"n": 0}

        def recv(ptr, nbytes, dtype, peer, handle, stream, r=r, calls=calls):
            step, which = divmod(calls["n"], 2)  # at step s the K/V of rank r-s-1 arrives, k then v
            calls["n"] += 1
            bufs[ptr].a[...] = shards["kv"[which]][(r - step - 1) % world]

        nb = types.SimpleNamespace(group_start=group_start, group_end=group_end, Comm=lambda p: p,
                                   send=lambda *a: None, recv=recv, comm_get_async_error=query)

        def new_array(shape, dtype, dev, stream, keep=None):
            x = _HostArray(np.empty(shape, dtype))
            bufs[x.ptr] = x
            return x

        _on_host(monkeypatch, ring, begin=lambda comm, fields, error, ref, what, nb=nb: (nb, 0, 1, 0),
                 new_array=new_array, attention=attention, merge_attention_states=_reference_merge)
        comm = types.SimpleNamespace(nranks=world, rank=r, ptr=0, device=types.SimpleNamespace(device_id=0))
        mine = [_HostArray(shard_sequence(x, world, zigzag=zig)[r]) for x in (q, k, v)]
        out = ring.ring_attention(*mine, comm, causal=causal, zigzag=zig, sinks=sinks, sm_margin=world,
                                  alibi_slopes=None if slopes is None else _HostArray(slopes), **kw)
        outs.append(out.a)
    assert margins and set(margins) == {world} and sm_margin.current() == 0 and alibi_shift.local.n == 0
    assert nccl_state["settled"] and not nccl_state["pending"]
    got = gather_sequence(outs, zigzag=zig).astype(np.float64)
    want = reference.attention(q, k, v, causal=causal, sinks=sinks, alibi_slopes=slopes, **kw)
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3)


def _per_rank(world: int, body) -> list:
    """``body(rank, comm)`` a thread per rank, over a stand-in communicator; the results by rank."""
    import threading
    import types

    results, errors = [None] * world, []

    def run(r):
        try:
            comm = types.SimpleNamespace(nranks=world, rank=r, ptr=0, device=types.SimpleNamespace(device_id=0))
            results[r] = body(r, comm)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append((r, e))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    return results


def _block_backward(dout, q, k, v, out, lse, *, causal=False, window_size=None, softcap=None, sinks=None,
                    scale=None, slopes=None, shift=0):
    """Gradients of one block of keys under the whole sequence's softmax (``out``, ``lse``), float64,
    bottom-right aligned masks: what `attention_backward` gives on a block with those out and lse
    (ALiBi's diagonal moved ``shift`` keys right, as inside `alibi_shift.shifted`)."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    sc = 1 / np.sqrt(D) if scale is None else scale
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    dO, Q, K, V, O, L = f(dout), f(q), f(k), f(v), f(out), f(lse)
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    rel = j - i - (Sk - Sq)
    left, right = (-1, 0) if causal else (window_size or (-1, -1))
    if window_size is not None and causal:
        left = window_size[0]
    ok = np.ones((Sq, Sk), bool)
    if left != -1:
        ok &= rel >= -left
    if right != -1:
        ok &= rel <= right
    dq, dk, dv = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    dsinks = np.zeros(Hq)
    bias = np.zeros((B, Hq, Sq, Sk)) if slopes is None else _alibi_bias(slopes, B, Hq, Sq, Sk, shift)
    for b in range(B):
        for h in range(Hq):
            s = sc * Q[b, :, h] @ K[b, :, h // g].T
            t = np.tanh(s / softcap) if softcap else None
            s2 = (softcap * t if softcap else s) + bias[b, h]
            p = np.where(ok, np.exp(s2 - L[b, h][:, None]), 0.0)
            dv[b, :, h // g] += p.T @ dO[b, :, h]
            dp = dO[b, :, h] @ V[b, :, h // g].T
            Dr = (dO[b, :, h] * O[b, :, h]).sum(1)
            ds = p * (dp - Dr[:, None])
            if softcap:
                ds = ds * (1 - t * t)
            dq[b, :, h] = sc * ds @ K[b, :, h // g]
            dk[b, :, h // g] += sc * ds.T @ Q[b, :, h]
            if sinks is not None:
                dsinks[h] -= (np.exp(np.float64(sinks[h]) - L[b, h]) * Dr).sum()
    res = (dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype))
    return res + (dsinks.astype(np.float32),) if sinks is not None else res


@pytest.mark.parametrize("world,causal,mods", [(2, True, {}), (4, True, {"sinks": 1}), (3, False, {}),
                                               (4, True, {"window": (9, 0)}), (2, False, {"softcap": 6.0}),
                                               (2, True, {"alibi": 1}), (3, False, {"alibi": 1, "softcap": 6.0}),
                                               (4, True, {"alibi": 1, "window": (9, 0), "sinks": 1})])
def test_the_ring_backward_driver_on_host_arrays(world, causal, mods, monkeypatch):
    """`ring_attention_backward` itself, a thread per rank, on host arrays: NCCL by queues between the
    threads, each block's gradients under the whole softmax in float64, the accumulators as NumPy
    float32; the gradients of the whole sequence by the float64 reference."""
    import queue
    import threading
    import types

    from cudattn._kernels import alibi_shift
    from cudattn.distributed import ring_backward

    rng = np.random.default_rng(4700 + world)
    B, Hq, Hkv, D = 1, 4, 2, 8
    zig = causal
    S = world * (2 if zig else 1) * 4
    q = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    k, v, = (rng.standard_normal((B, S, Hkv, D)).astype(np.float16) for _ in range(2))
    dout = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    kw = {"window_size": mods.get("window"), "softcap": mods.get("softcap")}
    slopes = rng.uniform(0.05, 0.6, Hq).astype(np.float32) if mods.get("alibi") else None
    out, lse = reference.attention(q, k, v, causal=causal, sinks=sinks, alibi_slopes=slopes, return_lse=True, **kw)
    shard = lambda x, r, axis=1: shard_sequence(x, world, zigzag=zig, axis=axis)[r]  # noqa: E731
    reg, chans = {}, {(a, b): queue.Queue() for a in range(world) for b in range(world)}
    summed, barrier = {}, threading.Barrier(world)

    def host(a):
        x = _HostArray(a)
        reg[x.ptr] = x
        return x

    # each rank's communicator non-blocking: a group's end or a collective is in progress for one
    # query, and nothing NCCL or attention may be queued before it settles
    local = threading.local()

    def taken():
        assert not getattr(local, "pending", False), "queued while an NCCL call was in progress"

    def in_progress():
        local.pending, local.queries = True, 0

    def query(me):
        local.queries = getattr(local, "queries", 0) + 1
        if getattr(local, "pending", False) and local.queries < 2:
            return 7
        local.pending = False
        return 0

    def send(ptr, nbytes, dt, peer, me, stream):
        taken()
        chans[me, peer].put(reg[ptr].a.copy())

    def recv(ptr, nbytes, dt, peer, me, stream):
        reg[ptr].a[...] = chans[peer, me].get(timeout=10)

    def all_reduce(sptr, rptr, count, dt, op, me, stream):
        taken()
        in_progress()
        summed[me] = reg[sptr].a.copy()
        barrier.wait()
        total = sum(summed[r] for r in range(world))
        barrier.wait()
        reg[rptr].a[...] = total

    nb = types.SimpleNamespace(group_start=taken, group_end=in_progress, send=send, recv=recv, all_reduce=all_reduce,
                               comm_get_async_error=query)

    def backward(do, q_, k_, v_, o_, l_, *, scale, layout, softcap, stream, causal=False, window_size=None,
                 sinks=None, alibi_slopes=None):
        taken()
        assert alibi_slopes is not None or alibi_shift.local.n == 0
        return tuple(host(g) for g in _block_backward(do.a, q_.a, k_.a, v_.a, o_.a, l_.a, causal=causal,
                                                      window_size=window_size, softcap=softcap,
                                                      sinks=None if sinks is None else sinks.a,
                                                      slopes=None if alibi_slopes is None else alibi_slopes.a,
                                                      shift=alibi_shift.local.n))

    def new_array(shape, dtype, dev, stream, keep=None):
        return host(np.empty(shape, dtype))

    def add_into(dst, src, stream):
        dst.a[...] += src.a.astype(np.float32)

    def store(dst, src, stream):
        dst.a[...] = src.a

    _on_host(monkeypatch, ring_backward, DeviceArray=_HostArray, new_array=new_array, attention_backward=backward,
             add_into=add_into, store=store, nccl=lambda: (types.SimpleNamespace(FLOAT32=7, SUM=0), nb),
             begin=lambda comm, fields, error, ref, what: (
                 error is None or (_ for _ in ()).throw(error)) and (nb, comm.rank, 1, 0))
    monkeypatch.setattr(_HostArray, "memset", lambda self, pattern, stream=None: self.a.fill(0))
    monkeypatch.setattr(_HostArray, "size", property(lambda self: self.a.size), raising=False)
    def rank(r, comm):
        args = [host(shard(x, r)) for x in (dout, q, k, v, out.astype(np.float16))]
        lse_r = host(np.ascontiguousarray(shard(lse, r, axis=2)).astype(np.float32))
        return ring_backward.ring_attention_backward(*args, lse_r, comm, causal=causal, zigzag=zig,
                                                     sinks=None if sinks is None else host(sinks),
                                                     alibi_slopes=None if slopes is None else host(slopes), **kw)

    results = _per_rank(world, rank)
    want = reference.attention_backward(dout, q, k, v, causal=causal, sinks=sinks, alibi_slopes=slopes, **kw)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = gather_sequence([res[i].a for res in results], zigzag=zig).astype(np.float64)
        np.testing.assert_allclose(got, want[i], rtol=0, atol=2e-2, err_msg=name)
    if sinks is not None:
        for res in results:
            np.testing.assert_allclose(res[3].a, want[3], rtol=1e-3, atol=1e-3)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a"])
def test_ring_accumulators_compile_without_spills(arch, kernel_cache):
    """The ring backward's float32 adds and stores (cu_src/ring_accumulate.cu), every element type."""
    from cudattn._kernels import accumulate, registry

    for spec in accumulate.all_accumulate_kernels():
        rep = registry.compile_variant(spec, arch, cache=kernel_cache).ptxas.get(spec.kernel_name)
        assert rep is not None and rep.spill_stores == rep.spill_loads == rep.stack_bytes == 0, (spec.describe(), rep)


def test_accumulator_rows_pair_a_dense_array_with_a_slice():
    """`accumulate._launch_rows` splits a dense side into the rows of a sliced one (a contiguous
    partial added into a slice of the accumulator), for bshd and bhsd slices."""
    from cudattn._kernels import accumulate

    seen = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(accumulate._device, "get_device", lambda d: None)
    monkey.setattr(accumulate._device, "device_properties",
                   lambda d: type("P", (), {"sm_count": 132, "arch": "sm_90a"})())
    monkey.setattr(accumulate._kernels, "get_kernel", lambda *a: None)
    monkey.setattr(accumulate._launch, "launch", lambda k, grid, block, smem, stream, p: seen.append(
        (p.rows, p.cols, p.src_pitch, p.dst_pitch)))
    try:
        acc = np.zeros((2, 10, 4, 8), np.float32)
        for dst, part in ((acc[:, 3:7], np.zeros((2, 4, 4, 8), np.float16)),
                          (acc.transpose(0, 2, 1, 3).copy()[:, :, 3:7], np.zeros((2, 4, 4, 8), np.float16))):
            accumulate.add_into(_HostArray(dst), _HostArray(part), 0)
    finally:
        monkey.undo()
    assert seen == [(2, 128, 128, 320), (8, 32, 32, 80)]


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_backward_lse_to_heads_plan(world):
    """The backward's LSE path: each rank's (B, Hq, S/world) rows to (B, Hq/world, S) for its heads,
    the plans replayed on host bytes with the exchange done by hand."""
    from cudattn.distributed import copies

    rng = np.random.default_rng(4900 + world)
    B, Hq, s = 2, 8, 3
    S, h, e = s * world, Hq // world, 8
    lse = rng.standard_normal((B, Hq, S))
    shards = shard_sequence(lse, world, zigzag=False, axis=2)
    sent = {}
    for r in range(world):
        buf = {"x": _bytes(shards[r]), "send": np.zeros(shards[r].nbytes, np.uint8)}
        _replay(copies.heads_to_ranks(B, 1, Hq, s, world, e, "x", "send"), buf)
        sent[r] = buf["send"].reshape(world, -1)
    for r in range(world):
        recv = np.concatenate([sent[j][r] for j in range(world)])
        buf = {"recv": recv, "y": np.zeros(recv.size, np.uint8)}
        _replay(copies.ranks_to_rows(B * h, S, e, world, "recv", "y"), buf)
        np.testing.assert_array_equal(buf["y"].view(np.float64).reshape(B, h, S), lse[:, r * h:(r + 1) * h])


class _HostAllGather:
    """NCCL's all-gather among ``world`` rank threads, on host memory: ``(send, recv, nbytes, dtype,
    rank, stream)`` with host addresses (the rank stands in for the communicator handle)."""

    def __init__(self, world: int):
        import threading

        self.world, self.rows, self.barrier = world, {}, threading.Barrier(world)

    def __call__(self, sptr, rptr, nbytes, u8, me, stream):
        import ctypes

        self.rows[me] = ctypes.string_at(sptr, nbytes)
        self.barrier.wait()
        for j in range(self.world):
            ctypes.memmove(rptr + j * nbytes, self.rows[j], nbytes)
        self.barrier.wait()


class _HostMem(_HostArray):
    """A `_HostArray` whose ``ptr`` is its data's host address, for code that copies by address."""

    def __init__(self, a):
        super().__init__(a)
        self.ptr = a.ctypes.data if a.size else 0

    def __getitem__(self, key):
        return _HostMem(self.a[key])


@pytest.mark.parametrize("world,causal,mods", [(2, True, {}), (4, False, {"sinks": 1}), (4, True, {"window": (7, 0)}),
                                               (2, False, {"softcap": 5.0})])
def test_ulysses_forward_and_backward_drivers_on_host_memory(world, causal, mods, monkeypatch):
    """`ulysses_attention` and its backward themselves, a thread per rank: their 2-D copies as row
    moves in host memory, the all-to-alls by queues between the threads, attention and each rank's
    gradients by the float64 reference (the whole sequence for the rank's heads)."""
    import ctypes
    import queue
    import types

    from cudattn.distributed import agree, copies, ulysses

    rng = np.random.default_rng(5000 + world)
    B, Hq, Hkv, D = 2, 8, 4, 8
    S = world * 5
    q = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(np.float16) for _ in range(2))
    dout = rng.standard_normal(q.shape).astype(np.float16)
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    kw = {"window_size": mods.get("window"), "softcap": mods.get("softcap")}
    chans = {(a, b): queue.Queue() for a in range(world) for b in range(world)}

    def copy2d(dst, dpitch, src, spitch, width, height, stream):
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

    def all_to_all(nb, me, send, recv, world_, u8, st):
        n = send.nbytes // world_
        for j in range(world_):
            chans[me, j].put(ctypes.string_at(send.ptr + j * n, n))
        for j in range(world_):
            ctypes.memmove(recv.ptr + j * n, chans[j, me].get(timeout=10), n)

    all_gather = _HostAllGather(world)

    def attention(q_, k_, v_, *, return_lse, stream, causal=False, scale=None, softcap=None, window_size=None,
                  sinks=None, alibi_slopes=None):
        o, lse = reference.attention(q_.a, k_.a, v_.a, causal=causal, window_size=window_size, softcap=softcap,
                                     sinks=None if sinks is None else sinks.a, return_lse=True)
        return _HostMem(o.astype(q_.dtype)), _HostMem(lse.astype(np.float32))

    def attention_backward(do, q_, k_, v_, o_, l_, *, stream, causal=False, scale=None, softcap=None,
                           window_size=None, sinks=None, alibi_slopes=None):
        g = _block_backward(do.a, q_.a, k_.a, v_.a, o_.a, l_.a, causal=causal, window_size=window_size,
                            softcap=softcap, sinks=None if sinks is None else sinks.a)
        return tuple(_HostMem(np.ascontiguousarray(x)) for x in g)

    nb = types.SimpleNamespace(all_gather=all_gather, comm_get_async_error=lambda h: 0)
    monkeypatch.setattr(ulysses, "DeviceArray", _HostArray)
    monkeypatch.setattr(agree, "DeviceArray", _HostArray)
    monkeypatch.setattr(ulysses, "new_array", lambda shape, dtype, dev, st, keep=None: _HostMem(np.zeros(shape, dtype)))
    monkeypatch.setattr(ulysses, "attention", attention)
    monkeypatch.setattr(ulysses, "attention_backward", attention_backward)
    monkeypatch.setattr(ulysses, "_all_to_all", all_to_all)
    monkeypatch.setattr(ulysses, "begin", lambda comm, fields, error, ref, what: (
        error is None or (_ for _ in ()).throw(error)) and (nb, comm.rank, 1, 0))
    monkeypatch.setattr(ulysses, "stream_wait", lambda *a, **k: None)
    monkeypatch.setattr(ulysses, "call_stream", lambda q, s, d: types.SimpleNamespace(handle=0, obj=None))
    monkeypatch.setattr(copies, "copy2d", copy2d)
    monkeypatch.setattr(ulysses._lifetime, "hold", lambda *a: None)
    shards = [shard_sequence(x, world, zigzag=False) for x in (dout, q, k, v)]
    def rank(r, comm):
        do, qd, kd, vd = (_HostMem(np.ascontiguousarray(s[r])) for s in shards)
        sk = None if sinks is None else _HostMem(sinks)
        out, lse = ulysses.ulysses_attention(qd, kd, vd, comm, causal=causal, sinks=sk, return_lse=True, **kw)
        grads = ulysses.ulysses_attention_backward(do, qd, kd, vd, out, lse, comm, causal=causal, sinks=sk, **kw)
        return out.a.copy(), lse.a.copy(), [g.a.copy() for g in grads]

    results = _per_rank(world, rank)
    want, want_lse = reference.attention(q, k, v, causal=causal, sinks=sinks, return_lse=True, **kw)
    np.testing.assert_allclose(gather_sequence([r[0] for r in results], zigzag=False), want, atol=2e-3)
    np.testing.assert_allclose(gather_sequence([r[1] for r in results], zigzag=False, axis=2), want_lse,
                               rtol=1e-5, atol=1e-5)
    gw = reference.attention_backward(dout, q, k, v, causal=causal, sinks=sinks, **kw)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = gather_sequence([r[2][i] for r in results], zigzag=False).astype(np.float64)
        np.testing.assert_allclose(got, gw[i], rtol=0, atol=2e-2, err_msg=name)
    if sinks is not None:
        for r in results:
            np.testing.assert_allclose(r[2][3], gw[3], rtol=1e-3, atol=1e-3)


class _HostBytes:
    """A NumPy array seen as `copies.place` sees a DeviceArray: its address, shape, strides, dtype."""

    def __init__(self, a):
        self.a, self.ptr, self.stream_handle = a, a.ctypes.data, None

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    strides = property(lambda self: self.a.strides)
    ndim = property(lambda self: self.a.ndim)
    nbytes = property(lambda self: self.a.nbytes)


@pytest.mark.parametrize("shape,axis", [((2, 3, 40), 2), ((2, 24, 3, 8), 1), ((3, 2, 24, 8), 2)])
@pytest.mark.parametrize("into_slice", [True, False])
def test_place_copies_a_slice_either_way_under_cuMemcpy2D_rules(shape, axis, into_slice, monkeypatch):
    """`place` between a contiguous array and a slice of another along one axis (the ring backward
    copies the LSE's row ranges out; the forward copies into place), with cuMemcpy2D's rules
    enforced on host bytes: a row no wider than either pitch."""
    import ctypes

    from cudattn.distributed import copies

    def copy2d(dst, dpitch, src, spitch, width, height, stream):
        if height > 1 and not (width <= dpitch and width <= spitch):
            raise ValueError(f"cuMemcpy2D refuses width {width} over pitches {dpitch}, {spitch}")
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

    monkeypatch.setattr(copies, "copy2d", copy2d)
    rng = np.random.default_rng(len(shape) + axis)
    whole = rng.standard_normal(shape).astype(np.float32)
    idx = [slice(None)] * len(shape)
    idx[axis] = slice(5, 17)
    if into_slice:
        target = np.full_like(whole, np.nan)
        part = np.ascontiguousarray(whole[tuple(idx)])
        copies.place(_HostBytes(target[tuple(idx)]), _HostBytes(part), 0)
        assert np.array_equal(target[tuple(idx)], whole[tuple(idx)])
        rest = np.ones(shape, bool)
        rest[tuple(idx)] = False
        assert np.isnan(target[rest]).all(), "wrote outside the slice"
    else:
        out = np.full(whole[tuple(idx)].shape, np.nan, np.float32)
        copies.place(_HostBytes(out), _HostBytes(whole[tuple(idx)]), 0)
        assert np.array_equal(out, whole[tuple(idx)])


def test_place_refuses_arrays_whose_axes_do_not_fold_into_rows():
    """A slice of an array that is itself not C-contiguous (an LSE view of some heads) would be read
    as rows of the wrong pitch: refused, naming the array."""
    from cudattn.distributed import copies

    big = np.zeros((2, 3, 16), np.float32)
    out = np.zeros((2, 2, 6), np.float32)
    with pytest.raises(ValueError, match="src's axes up to 1 do not fold into rows"):
        copies.place(_HostBytes(out), _HostBytes(big[:, :2, 4:10]), 0)
    every_other = np.zeros((2, 2, 12), np.float32)[:, :, ::2]  # rows whose elements are not adjacent
    with pytest.raises(ValueError, match="dst is not dense past axis 0"):
        copies.place(_HostBytes(every_other), _HostBytes(np.zeros((2, 3, 12), np.float32)[:, :2, ::2]), 0)


def _nccl_states(states):
    """A stand-in for nccl4py's bindings whose `comm_get_async_error` answers ``states`` in turn (the
    last one from then on); returns it and the handles it was asked about."""
    import enum
    import types

    class Result(enum.IntEnum):
        Success, SystemError, RemoteError, InProgress = 0, 2, 6, 7

    seen = []

    def query(handle):
        seen.append(handle)
        return states.pop(0) if len(states) > 1 else states[0]

    return types.SimpleNamespace(comm_get_async_error=query, Result=Result, Comm=lambda p: p), seen


def test_settle_waits_for_a_non_blocking_communicator_and_times_out(monkeypatch):
    """`watch.settle` after each NCCL call: one query on a blocking communicator; on a non-blocking
    one, queries until NCCL has taken the call; TimeoutError when it never does (a peer that never
    joins) after CUDATTN_NCCL_TIMEOUT seconds, and NCCL's own error named."""
    from cudattn.distributed import watch

    nb, seen = _nccl_states([0])
    watch.settle(nb, 5, "x")
    assert seen == [5]
    nb, seen = _nccl_states([7, 7, 7, 0])
    watch.settle(nb, 5, "x")
    assert len(seen) == 4
    monkeypatch.setenv("CUDATTN_NCCL_TIMEOUT", "0.05")
    nb, _ = _nccl_states([7])
    with pytest.raises(TimeoutError, match=r"ring_attention: NCCL had not taken the call after 0.05 s"):
        watch.settle(nb, 5, "ring_attention")
    nb, _ = _nccl_states([7, 6])
    with pytest.raises(RuntimeError, match=r"ring_attention: NCCL reported RemoteError \(6\); abort"):
        watch.settle(nb, 5, "ring_attention")
    nb, _ = _nccl_states([2])
    with pytest.raises(RuntimeError, match=r"NCCL reported SystemError \(2\)"):
        watch.settle(nb, 5, "ring_attention")


def test_an_error_nccl_raises_from_a_call_names_the_call():
    """`watch.nccl_call`: nccl4py's NCCLError from a call (a peer NCCL saw exit while connecting)
    comes out as RuntimeError naming the operation; other errors pass as they are; a call that goes
    through is settled after."""
    from cudattn.distributed import watch

    class NCCLError(Exception):
        pass

    nb, seen = _nccl_states([0])
    nb.NCCLError = NCCLError
    with pytest.raises(RuntimeError, match=r"^ring_attention: NCCL reported RemoteError \(6\): remote process "
                                           r"exited; abort the communicator$") as e:
        with watch.nccl_call(nb, 3, "ring_attention"):
            raise NCCLError("RemoteError (6): remote process exited")
    assert isinstance(e.value.__cause__, NCCLError) and seen == []
    with pytest.raises(KeyError):
        with watch.nccl_call(nb, 3, "ring_attention"):
            raise KeyError("not NCCL's")
    with watch.nccl_call(nb, 3, "ring_attention"):
        pass
    assert seen == [3]

    def failing_query(handle):
        raise NCCLError("InvalidUsage (5): the communicator was aborted")

    nb.comm_get_async_error = failing_query  # the state query itself fails: named too
    with pytest.raises(RuntimeError, match=r"^ulysses_attention: NCCL reported InvalidUsage \(5\)"):
        watch.settle(nb, 3, "ulysses_attention")
    nb, _ = _nccl_states([99])  # a code NCCL's enum does not know
    with pytest.raises(RuntimeError, match=r"^x: NCCL reported an error \(99\); abort the communicator$"):
        watch.settle(nb, 3, "x")


def test_a_group_whose_call_fails_is_ended_and_the_first_error_raised():
    """`watch.nccl_group`: NCCL's group depth is the thread's, so a group left open by a failing
    send would take in every later NCCL call of the thread. The group is ended either way: the
    call's own error raised (named), an error of the group's end after it not in its place; an
    error not NCCL's named with the abort it calls for, an interrupt as it is; an error of the end
    alone named; a group that goes through ended once and settled."""
    from cudattn.distributed import watch

    class NCCLError(Exception):
        pass

    nb, seen = _nccl_states([0])
    nb.NCCLError = NCCLError
    calls = []
    nb.group_start = lambda: calls.append("start")

    def group_end():
        calls.append("end")
        if fail_end:
            raise NCCLError("RemoteError (6): the group's end too")

    nb.group_end = group_end
    for fail_end in (False, True):
        calls.clear()
        with pytest.raises(RuntimeError, match=r"^ring_attention: NCCL reported RemoteError \(6\): remote process "
                                               r"exited; abort the communicator$"):
            with watch.nccl_group(nb, 3, "ring_attention"):
                calls.append("send")
                raise NCCLError("RemoteError (6): remote process exited")
        assert calls == ["start", "send", "end"] and seen == []
    fail_end = False
    calls.clear()
    with pytest.raises(RuntimeError, match=r"^ring_attention: KeyError inside an NCCL group, whose calls so far "
                                           r"were queued; abort the communicator$") as e:
        with watch.nccl_group(nb, 3, "ring_attention"):  # not NCCL's error: the group ended all the same
            raise KeyError("a bad shard")
    assert isinstance(e.value.__cause__, KeyError) and calls == ["start", "end"] and seen == []
    calls.clear()
    with pytest.raises(KeyboardInterrupt):  # passes as it is
        with watch.nccl_group(nb, 3, "ring_attention"):
            raise KeyboardInterrupt
    assert calls == ["start", "end"] and seen == []
    calls.clear()
    fail_end = True  # the calls went through, NCCL refused the group's end: named, not settled
    with pytest.raises(RuntimeError, match=r"^ring_attention: NCCL reported RemoteError \(6\): the group's end too"):
        with watch.nccl_group(nb, 3, "ring_attention"):
            calls.append("send")
    assert calls == ["start", "send", "end"] and seen == []
    fail_end = False
    calls.clear()
    with watch.nccl_group(nb, 3, "ring_attention"):
        calls.append("send")
    assert calls == ["start", "send", "end"] and seen == [3]


@pytest.mark.parametrize("text", ["0", "-3", "soon", "nan"])
def test_a_bad_nccl_timeout_is_named(monkeypatch, text):
    from cudattn.distributed import watch

    monkeypatch.setenv("CUDATTN_NCCL_TIMEOUT", text)
    with pytest.raises(ValueError, match=r"CUDATTN_NCCL_TIMEOUT must be a positive number of seconds; got"):
        watch.timeout_s()
    monkeypatch.setenv("CUDATTN_NCCL_TIMEOUT", "2.5")
    assert watch.timeout_s() == 2.5
    monkeypatch.delenv("CUDATTN_NCCL_TIMEOUT")
    assert watch.timeout_s() == 600.0


def _fake_events(monkeypatch, polls_until_done: int | None) -> list:
    """`watch.Event` and `watch.event_done` stood in for: the event is done after ``polls_until_done``
    queries (None: never); returns the streams events were recorded on."""
    from cudattn.distributed import watch

    recorded, polls = [], [0]

    class Event:
        def __init__(self, stream):
            self.stream = stream

        def record(self, stream):
            recorded.append(stream)
            return self

    def done(ev):
        polls[0] += 1
        return polls_until_done is not None and polls[0] > polls_until_done

    monkeypatch.setattr(watch, "Event", Event)
    monkeypatch.setattr(watch, "event_done", done)
    return recorded


def test_wait_ends_when_the_stream_is_done_or_nccl_fails_or_time_runs_out(monkeypatch):
    """`watch.wait` (the first call's all-gather, `synchronize`): returns once an event recorded on the
    stream is done; raises NCCL's error as soon as it is reported (a peer NCCL saw fail), and
    TimeoutError at the deadline (a peer that died with its transfers queued), never waiting for ever."""
    import time

    from cudattn.distributed import watch

    recorded = _fake_events(monkeypatch, 3)
    nb, seen = _nccl_states([0])
    watch.wait(nb, 9, 42, "ring_attention")
    assert recorded == [42] and seen == [9, 9, 9]
    _fake_events(monkeypatch, None)
    nb, _ = _nccl_states([0, 0, 6])
    with pytest.raises(RuntimeError, match=r"ring_attention: NCCL reported RemoteError \(6\); abort the comm"):
        watch.wait(nb, 9, 42, "ring_attention")
    nb, _ = _nccl_states([0])
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ring_attention: the stream's work had not finished after 0.05 s "
                                           r"\(a rank that never joined, or one that failed\); abort the comm"):
        watch.wait(nb, 9, 42, "ring_attention", timeout=0.05)
    assert time.monotonic() - start < 5


def test_first_call_check_waits_with_a_deadline(monkeypatch):
    """The first call's all-gather of the ranks' fields is waited for by `watch.wait` before its copy
    to the host: a peer that joined and died makes that call raise instead of hanging."""
    from cudattn.distributed import agree

    order = []
    monkeypatch.setattr(agree, "to_device", lambda a, device, stream: _HostMem(np.ascontiguousarray(a)))
    monkeypatch.setattr(agree, "new_array", lambda shape, dtype, dev, st: _HostMem(np.zeros(shape, dtype)))
    monkeypatch.setattr(agree, "to_host", lambda x, stream: order.append("to_host") or x.a.copy())

    def wait(nb, handle, stream, what):
        order.append(("wait", handle, stream, what))
        raise TimeoutError(f"{what}: the stream's work had not finished")

    monkeypatch.setattr(agree, "wait", wait)
    nb = types.SimpleNamespace(all_gather=lambda *a: order.append("all_gather"),
                               comm_get_async_error=lambda h: order.append("settle") or 0)
    with pytest.raises(TimeoutError, match="ring_attention: the stream's work had not finished"):
        agree.all_gather_rows(nb, 3, 1, 2, np.zeros(4, np.int64), 0, 77, "ring_attention")
    assert order == ["all_gather", "settle", ("wait", 3, 77, "ring_attention")]


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "5", True])
def test_synchronize_refuses_a_timeout_that_is_not_a_positive_number(timeout):
    from cudattn.distributed import synchronize

    with pytest.raises(ValueError, match=r"synchronize: timeout must be a positive number of seconds \(or None\); got"):
        synchronize(types.SimpleNamespace(), timeout=timeout)


@pytest.mark.parametrize("abort", [True, False])
def test_synchronize_aborts_the_communicator_when_its_wait_fails(monkeypatch, abort):
    """`synchronize`'s wait, once its stream is known: a timeout or an NCCL error aborts the
    communicator before it goes on (``abort=False``: left to the caller), and says which; a wait that
    ends well aborts nothing."""
    from cudattn.distributed import recover

    aborted = []
    comm = types.SimpleNamespace(ptr=11, abort=lambda: aborted.append(True))
    _fake_events(monkeypatch, 1)
    nb, seen = _nccl_states([0])
    recover.wait_or_abort(nb, comm, 5, 1.0, abort)
    assert not aborted and seen == [11]
    _fake_events(monkeypatch, None)
    then = "the communicator was aborted" if abort else "abort the communicator"
    with pytest.raises(TimeoutError, match=f"synchronize: the stream's work had not finished after 0.02 s .*; {then}"):
        recover.wait_or_abort(nb, comm, 5, 0.02, abort)
    assert aborted == ([True] if abort else [])
    nb, _ = _nccl_states([6])
    with pytest.raises(RuntimeError, match=f"synchronize: NCCL reported RemoteError \\(6\\); {then}"):
        recover.wait_or_abort(nb, comm, 5, 1.0, abort)
    assert aborted == ([True, True] if abort else [])


class _StreamSim:
    """The GPU of every rank as streams of deferred operations: the host code queues, `run` then
    executes the queues in a random interleaving that keeps each stream's order, a stream wait (an
    event: the other stream's length when it was queued), and the flags' waits. Kernels and copies
    read their inputs when they run, so an order the streams do not enforce shows as wrong data.
    A wait no operation can satisfy fails (a deadlock on the GPU)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.queues: dict = {}
        self.done: dict = {}
        self.flags: dict = {}
        self.speed: dict = {}

    def put(self, stream, fn, ready=lambda: True):
        self.queues.setdefault(stream, []).append((fn, ready))

    def stream_wait(self, waiter, waited, *a):
        n = len(self.queues.get(waited, []))
        self.put(waiter, lambda: None, lambda: self.done.get(waited, 0) >= n)

    def write_value(self, addr, value, stream):
        self.put(stream, lambda: self.flags.__setitem__(addr, value))

    def wait_value(self, addr, value, stream):
        self.put(stream, lambda: None, lambda: self.flags.get(addr, 0) >= value)

    def run(self, stuck_ok: bool = False):
        """Runs every stream as far as it can; a deadlock fails, or with ``stuck_ok`` returns the
        operations each stream has left."""
        while True:
            heads = [st for st, q in self.queues.items() if self.done.get(st, 0) < len(q)
                     and q[self.done.get(st, 0)][1]()]
            if not heads:
                left = {st: len(q) - self.done.get(st, 0) for st, q in self.queues.items()}
                assert stuck_ok or not any(left.values()), f"the streams deadlocked: {left}"
                return {st: n for st, n in left.items() if n}
            # each stream a speed of its own, drawn once: some ranks run far ahead of others
            w = np.array([self.speed.setdefault(h, self.rng.exponential()) for h in heads])
            st = heads[self.rng.choice(len(heads), p=w / w.sum())]
            self.queues[st][self.done.get(st, 0)][0]()
            self.done[st] = self.done.get(st, 0) + 1


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("world,causal,mods", [(2, True, {}), (3, False, {}), (4, True, {"sinks": 1}),
                                               (4, False, {"window": (7, 3)})])
def test_the_ring_by_copy_engine_on_simulated_streams(world, causal, mods, seed, monkeypatch):
    """`ring._ring` with ``transport="copy"``: every rank's host code queues its work, then the streams
    of all ranks run in a random interleaving (`_StreamSim`), copies and flags included. Two calls
    in a row on two caller streams (the buffers and flag counts carry over), each equal to the
    float64 reference; and the steps use no NCCL."""
    import types

    from cudattn.distributed import peer_copy, ring

    sim = _StreamSim(seed)
    calls_in = [_ring_inputs(4700 + world + i, world, causal, mods) for i in range(2)]
    B, S, Hkv, D = calls_in[0][0].shape[0], calls_in[0][0].shape[1], calls_in[0][1].shape[2], calls_in[0][0].shape[3]
    arrays: dict = {}  # id -> array, for the copies' sources
    regions: dict = {}  # fake device address -> bytes of a rank's region

    def host(a):
        x = _HostArray(a)
        arrays[x.ptr] = a
        return x

    def region_view(ptr, nbytes):
        base = max(b for b in regions if b <= ptr)
        assert ptr - base + nbytes <= regions[base].size, "outside a region"
        return regions[base][ptr - base:ptr - base + nbytes]

    def fake_copy(dst, src, nbytes, stream):
        def run():
            a = np.ascontiguousarray(arrays[src])
            region_view(dst, nbytes)[...] = a.reshape(-1).view(np.uint8)
        sim.put(stream, run)

    def view_array(ptr, shape, dtype, *, device_id, owner):
        return host(region_view(ptr, int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape))

    def attention(q_, k_, v_, *, scale, layout, softcap, return_lse, stream, causal=False, window_size=None,
                  sinks=None, out=None):
        target = out if out is not None else _HostArray(np.empty(q_.shape, q_.dtype))
        lse = _HostArray(np.empty((q_.shape[0], q_.shape[2], q_.shape[1]), np.float32))

        def run():
            assert not np.isnan(k_.a.astype(np.float32)).any(), "a call read a buffer before its K/V arrived"
            o, ls = _reference_call(q_, k_, v_, causal, window_size, softcap, sinks, None)
            target.a[...], lse.a[...] = o.a, ls.a
        sim.put(stream.handle, run)
        return target, lse

    def merge(outs, lses, *, layout, stream):
        o = _HostArray(np.empty(outs.shape[1:], outs.dtype))
        ls = _HostArray(np.empty(lses.shape[1:], np.float32))

        def run():
            a, b = _reference_merge(outs, lses, layout=layout, stream=stream)
            o.a[...], ls.a[...] = a.a, b.a
        sim.put(stream.handle, run)
        return o, ls

    nbytes = peer_copy.layout(*(host(np.empty((B, S // world, Hkv, D), np.float16)) for _ in range(2)))[1]
    base = lambda r: (r + 1) << 32  # noqa: E731
    for r in range(world):
        regions[base(r)] = np.full(peer_copy._DATA + 2 * nbytes, 0xFF, np.uint8)  # NaN bits until a copy lands

    def buffers_for(comm, nb, handle, u8, dev, stream, n, what):
        r = int(comm.rank)
        assert n == nbytes
        return bufs[r], None

    bufs = [peer_copy.PeerBuffers(0, nbytes, base(r), base((r - 1) % world), base((r + 1) % world))
            for r in range(world)]
    results: list = []
    no_nccl = types.SimpleNamespace(group_start=None, group_end=None, send=None, recv=None)
    main = lambda r: (f"main{len(results)}", r)  # noqa: E731 (each call its own caller stream)
    _on_host(monkeypatch, ring, begin=lambda comm, fields, error, ref, what: (no_nccl, 0, 1, main(int(comm.rank))),
             new_array=lambda shape, dtype, dev, stream, keep=None: _HostArray(np.empty(shape, dtype)),
             attention=attention, merge_attention_states=merge, stream_wait=sim.stream_wait,
             place=lambda dst, src, stream: sim.put(stream, lambda: dst.a.__setitem__(Ellipsis, src.a)),
             _comm_stream=lambda d, c: ("comm", int(c.rank)))
    monkeypatch.setattr(ring, "call_stream", lambda q, st, d: types.SimpleNamespace(handle=main(q.rank), obj=None))
    monkeypatch.setattr(_HostArray, "memset", lambda self, pattern, *, stream=None: sim.put(
        stream, lambda: self.a.view(np.uint32).__setitem__(Ellipsis, pattern)))
    for name, fake in (("buffers_for", buffers_for), ("copy", fake_copy), ("DeviceArray", view_array),
                       ("write_value", sim.write_value), ("wait_value", sim.wait_value)):
        monkeypatch.setattr(peer_copy, name, fake)

    for q, k, v, sinks, kw in calls_in:
        outs = []
        for r in range(world):
            mine = [host(shard_sequence(x, world, zigzag=causal)[r]) for x in (q, k, v)]
            mine[0].rank = r
            outs.append(ring.ring_attention(*mine, types.SimpleNamespace(nranks=world, rank=r, ptr=0,
                                            device=types.SimpleNamespace(device_id=0)), causal=causal,
                                            zigzag=causal, sinks=sinks, transport="copy", **kw))
        results.append((outs, q, k, v, sinks, kw))
    sim.run()
    for outs, q, k, v, sinks, kw in results:
        got = gather_sequence([o.a for o in outs], zigzag=causal).astype(np.float64)
        want = reference.attention(q, k, v, causal=causal, sinks=sinks, **kw)
        np.testing.assert_allclose(got, want, rtol=0, atol=4e-3)
    assert all(b.uses == bufs[0].uses for b in bufs) and sum(bufs[0].uses) > 0


@pytest.mark.parametrize("steps", [1, 3])
def test_released_copy_buffers_let_a_stuck_stream_run(steps, monkeypatch):
    """A rank whose ring peer died: its stream waits on a flag the peer never writes (on the
    simulated streams), until `peer_copy.release` (synchronize's, before its abort) writes its own
    flags past every queued count from a side stream; the stream then runs to its end, and the
    buffers refuse any later step."""
    from cudattn.distributed import peer_copy

    sim = _StreamSim(3)
    monkeypatch.setattr(peer_copy, "write_value", sim.write_value)
    monkeypatch.setattr(peer_copy, "wait_value", sim.wait_value)
    monkeypatch.setattr(peer_copy, "copy", lambda dst, src, n, stream: sim.put(stream, lambda: None))
    @contextlib.contextmanager
    def side_stream(device_id):
        assert device_id == 0
        yield "side"

    monkeypatch.setattr(peer_copy, "side_stream", side_stream)
    kv = tuple(_HostArray(np.zeros((1, 8, 2, 16), np.float16)) for _ in range(2))
    nbytes = peer_copy.layout(*kv)[1]
    mine = peer_copy.PeerBuffers(0, nbytes, 1 << 32, 2 << 32, 2 << 32)  # two ranks: the peer is prev and next
    for s in range(steps):
        mine.pass_on(kv, (s + 1) % 2, "comm0", "ring_attention")
    sim.put("comm0", lambda: sim.flags.__setitem__("finished", True))
    # stuck at the first wait (the peer never freed its buffer): 6 operations a step, the first write done
    assert sim.run(stuck_ok=True) == {"comm0": 6 * steps}
    comm = type("Comm", (), {})()
    monkeypatch.setattr(peer_copy, "_by_comm", {comm: mine})
    assert peer_copy.release(comm)
    assert sim.run() == {} and sim.flags["finished"]
    for b in (0, 1):
        for kind in (peer_copy._FREE, peer_copy._DONE):
            assert sim.flags[(1 << 32) + kind + 4 * b] == mine.uses[b] + (1 << 30)
    with pytest.raises(RuntimeError, match="ring_attention: this communicator's copy-engine buffers were released"):
        mine.pass_on(kv, 0, "comm0", "ring_attention")
    assert not peer_copy.release(type("Comm", (), {})())  # a communicator without buffers: nothing to do
    assert not peer_copy.release(types.SimpleNamespace())  # nor one no weak reference holds


def test_ring_transport_is_checked_before_any_gpu_work(monkeypatch):
    from cudattn.distributed import agree, ring

    seen = []

    def begin(comm, fields, error, ref, what):
        seen.append(error)
        raise error

    monkeypatch.setattr(agree, "DeviceArray", _HostArray)
    monkeypatch.setattr(ring, "begin", begin)
    monkeypatch.setattr(ring, "call_stream", lambda q, s, d: None)
    x = _HostArray(np.zeros((1, 4, 2, 8), np.float16))
    comm = type("C", (), {"nranks": 2, "rank": 0, "ptr": 0, "device": type("D", (), {"device_id": 0})()})()
    with pytest.raises(ValueError, match="transport must be one of 'nccl', 'copy', 'auto'; got 'ipc'"):
        ring.ring_attention(x, x, x, comm, transport="ipc")
    assert isinstance(seen[0], ValueError)


@pytest.mark.parametrize("case", ["one process", "processes", "two ranks", "two hosts", "one cannot map",
                                  "no memops", "one cannot allocate"])
def test_copy_engine_buffers_are_decided_by_every_rank_together(case, monkeypatch):
    """`peer_copy.buffers_for` on a thread per rank, the all-gathers and the driver stood in for: every
    rank takes the same path and says why not; a rank maps its neighbours' regions (by address in
    one process, by IPC handle across processes) and frees its own when the ranks cannot share;
    buffers are reused by smaller calls and replaced together by a larger one."""
    import threading

    from cudattn.distributed import peer_copy

    world = 2 if case == "two ranks" else 3  # two: the previous rank is the next, mapped once
    gathered: dict = {}
    barrier = threading.Barrier(world)
    freed, closed, synced = [], [], []

    def all_gather_rows(nb, handle, u8, world_, row, dev, stream, what):
        gathered[(len(gathered) // world, nb)] = row.copy()  # the rank stands in for the bindings
        barrier.wait()
        rows = np.stack([gathered[(len(gathered) // world - 1, i)] for i in range(world)])
        barrier.wait()
        return rows

    local = threading.local()
    sizes = {}

    def allocate(n, stream):
        if case == "one cannot allocate" and local.r == 2:
            return None, None
        sizes[local.r] = n
        return 1000 * (local.r + 1) + n, bytes([local.r]) * peer_copy._HANDLE

    def ipc_open(h, flag):  # the handle names its rank: mapped at 50_000 + 10 * rank
        import ctypes

        r = ctypes.string_at(h.getPtr(), 1)[0]
        if case == "one cannot map" and local.r == 1:
            return (peer_copy.driver.CUresult.CUDA_ERROR_INVALID_VALUE, 0)
        return (peer_copy.driver.CUresult.CUDA_SUCCESS, 50_000 + 10 * r)

    monkeypatch.setattr(peer_copy, "all_gather_rows", all_gather_rows)
    monkeypatch.setattr(peer_copy, "host_id", lambda: [5, 5, 6][local.r] if case == "two hosts" else 5)
    monkeypatch.setattr(peer_copy, "_PROCESS", 7)
    monkeypatch.setattr(peer_copy, "get_device", lambda d: None)
    monkeypatch.setattr(peer_copy, "_allocate", allocate)
    monkeypatch.setattr(peer_copy, "_memops", lambda region, stream: not (case == "no memops" and local.r == 0))
    monkeypatch.setattr(peer_copy, "_enable_peer", lambda me, peer: True)
    monkeypatch.setattr(peer_copy, "_unmap", lambda dev, opened: (closed.extend(opened), opened.clear()))
    fake_driver = type("D", (), {
        "CUresult": peer_copy.driver.CUresult, "CUipcMemHandle": peer_copy.driver.CUipcMemHandle,
        "CUipcMem_flags": peer_copy.driver.CUipcMem_flags, "cuIpcOpenMemHandle": staticmethod(ipc_open),
        "cuIpcCloseMemHandle": staticmethod(lambda p: closed.append(p)),
        "cuMemFree": staticmethod(lambda p: freed.append(p) or (peer_copy.driver.CUresult.CUDA_SUCCESS,)),
        "cuCtxSynchronize": staticmethod(lambda: synced.append(local.r) or (peer_copy.driver.CUresult.CUDA_SUCCESS,))})
    monkeypatch.setattr(peer_copy, "driver", fake_driver)
    processes = case != "one process"

    class Comm:  # the buffers are kept per communicator object (weakly)
        nranks = world

        def __init__(self, r):
            self.rank = r

    comms = [Comm(r) for r in range(world)]

    def call(n):
        def body(r, _):
            local.r = r
            return peer_copy.buffers_for(comms[r], r, 0, 1, r, 0, n, "test")
        return _per_rank(world, body)

    if processes:  # each rank a process of its own: the rows carry distinct tokens
        real = all_gather_rows

        def all_gather_rows(nb, handle, u8, world_, row, dev, stream, what):  # noqa: F811
            if row.size == peer_copy._WORDS:
                row = row.copy()
                row[2] = 100 + nb
            return real(nb, handle, u8, world_, row, dev, stream, what)

        monkeypatch.setattr(peer_copy, "all_gather_rows", all_gather_rows)
    got = call(4096)
    whys = {w for _, w in got}
    if case in ("two hosts", "one cannot map", "no memops", "one cannot allocate"):
        assert [b for b, _ in got] == [None] * world and len(whys) == 1 and None not in whys, got
        assert {"two hosts": "one host", "one cannot map": "map", "no memops": "stream memory",
                "one cannot allocate": "allocate"}[case] in whys.pop()
        made = [1000 * (r + 1) + sizes[r] for r in sizes]
        assert sorted(freed) == sorted(made)  # every rank freed the region it made
        if case == "one cannot map":  # ranks 0 and 2 closed what they had opened: their neighbours' regions
            assert sorted(closed) == [50_000, 50_010, 50_010, 50_020]  # rank 0: 2 and 1; rank 2: 1 and 0
        before = len(gathered)
        again = call(4096)
        if case == "one cannot allocate":  # may pass next time: asked again
            assert len(gathered) > before
        else:  # decided once: a later call takes NCCL at once, with no all-gather
            assert [b for b, _ in again] == [None] * world and len(gathered) == before
        return
    for r, (bufs, why) in enumerate(got):
        p, s = (r - 1) % world, (r + 1) % world
        assert why is None and bufs.mine == 1000 * (r + 1) + sizes[r]
        want = ((1000 * (p + 1) + sizes[p], 1000 * (s + 1) + sizes[s]) if not processes
                else (50_000 + 10 * p, 50_000 + 10 * s))
        assert (bufs.prev, bufs.succ) == want, (r, bufs.prev, bufs.succ)
        assert sorted(bufs.opened) == ([] if not processes else sorted(set(want)))
    assert not freed and not closed
    opened = sorted(p for b, _ in got for p in b.opened)
    before = len(gathered)  # a call of the same size or smaller reuses them
    assert [b for b, _ in call(1024)] == [b for b, _ in got] and len(gathered) == before
    bigger = call(8192)  # a larger one replaces them: every rank idle, old mappings closed, old regions freed
    assert all(b is not None and b.nbytes == 8192 for b, _ in bigger)
    assert sorted(synced) == list(range(world))
    assert sorted(freed) == sorted(b.mine for b, _ in got)
    assert sorted(closed) == opened and all(not b.opened for b, _ in got)


def test_first_call_check_gathers_every_ranks_fields_and_names_the_difference(monkeypatch):
    """`agree.agree` through `all_gather_rows` (the all-gather stood in for on host memory, a thread
    per rank): ranks whose fields match pass and the communicator is marked checked; a rank whose
    head dim differs makes every rank raise, naming it and the field."""

    from cudattn.distributed import agree

    world = 3
    all_gather = _HostAllGather(world)

    nb = type("NB", (), {"all_gather": staticmethod(all_gather), "comm_get_async_error": staticmethod(lambda h: 0)})
    monkeypatch.setattr(agree, "to_device", lambda a, device, stream: _HostMem(np.ascontiguousarray(a)))
    monkeypatch.setattr(agree, "new_array", lambda shape, dtype, dev, st: _HostMem(np.zeros(shape, dtype)))
    monkeypatch.setattr(agree, "to_host", lambda x, stream: x.a.copy())
    monkeypatch.setattr(agree, "wait", lambda nb, handle, stream, what: None)  # the host gather is done at once

    class Comm:
        nranks = world

    for dims, want in (((64, 64, 64), None), ((64, 128, 64), "rank 1's head dim is 128 where rank 0's is 64")):
        comms = [Comm() for _ in range(world)]

        def body(r, _, dims=dims, comms=comms):
            try:
                agree.agree(comms[r], nb, r, {"batch": 2, "head dim": dims[r], "scale": 0.5}, 0, 0, 1, "test")
            except ValueError as e:
                return str(e)
            return None

        got = _per_rank(world, body)
        if want is None:
            assert got == [None] * world and all(c in agree._checked for c in comms)
        else:
            assert all(want in g for g in got), got
