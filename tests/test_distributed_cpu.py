"""The ring's schedule and sharding, without a GPU: every (query, key) pair of the whole sequence
is covered exactly once by the local calls a rank makes (the mask of each call, bottom-right
aligned as `cudattn.attention` has it, compared element by element with the global mask), and
the ring run in float64 (the reference's attention per call, its merge per query chunk) equals
the reference's attention on the whole sequence."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cudattn import reference
from cudattn.distributed import gather_sequence, shard_sequence
from cudattn.distributed.schedule import INF, band, chunks_of, ring_steps

_CASES = [  # world, chunk length, zigzag, causal, window
    (1, 7, False, False, None), (2, 5, True, True, None), (3, 4, True, True, None), (4, 3, True, True, None),
    (2, 6, False, False, None), (4, 5, False, True, None), (3, 6, True, False, (4, 2)), (4, 5, True, True, (3, -1)),
    (2, 9, False, False, (0, 0)), (4, 4, True, False, (-1, 6)), (3, 5, False, True, (11, -1)), (2, 8, True, True, (20, 0)),
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


def _ring_float64(q, k, v, world, *, zigzag, causal, window=None, softcap=None, sinks=None):
    """The ring of `cudattn.distributed.ring_attention` in float64: each rank's calls from the
    schedule through the reference's attention, merged by LSE per query chunk; the whole output."""
    B, S, Hq, D = q.shape
    n = world * (2 if zigzag else 1)
    c = S // n
    left, right = band(causal, window)
    chunk = lambda x, i: x[:, i * c:(i + 1) * c]  # noqa: E731
    out = np.zeros(q.shape)
    for r in range(world):
        parts = {qc: ([], []) for qc in chunks_of(r, world, zigzag)}
        for blocks in ring_steps(r, world, c, zigzag=zigzag, left=left, right=right):
            for b in blocks:
                o = np.zeros((B, c, Hq, D))
                lse = np.full((B, Hq, c), -np.inf)
                ob, lb = reference.attention(chunk(q, b.q_chunk)[:, b.qa:b.qb], chunk(k, b.k_chunk)[:, b.ka:b.kb],
                                             chunk(v, b.k_chunk)[:, b.ka:b.kb], causal=b.causal,
                                             window_size=b.window, softcap=softcap,
                                             sinks=sinks if b.sinks else None, return_lse=True)
                o[:, b.qa:b.qb], lse[:, :, b.qa:b.qb] = ob, lb
                parts[b.q_chunk][0].append(o)
                parts[b.q_chunk][1].append(lse)
        for qc, (os_, ls) in parts.items():
            out[:, qc * c:(qc + 1) * c] = reference.merge_attention_states(os_, ls)[0]
    return out


@pytest.mark.parametrize("world,zigzag,causal,mods", [
    (2, True, True, {}), (4, True, True, {"softcap": 20.0}), (3, False, False, {}), (2, False, True, {}),
    (4, True, True, {"sinks": True}), (3, True, False, {"window": (9, 3)}), (4, True, True, {"window": (13, -1)}),
])
def test_ring_in_float64_equals_whole_attention(world, zigzag, causal, mods):
    rng = np.random.default_rng(4000 + world)
    B, Hq, Hkv, D = 2, 4, 2, 16
    S = world * (2 if zigzag else 1) * 6
    q = rng.standard_normal((B, S, Hq, D))
    k, v = (rng.standard_normal((B, S, Hkv, D)) for _ in range(2))
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32) if mods.get("sinks") else None
    kw = dict(window_size=mods.get("window"), softcap=mods.get("softcap"), sinks=sinks)
    got = _ring_float64(q, k, v, world, zigzag=zigzag, causal=causal, window=kw["window_size"],
                        softcap=kw["softcap"], sinks=sinks)
    want = reference.attention(q, k, v, causal=causal, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_band_of_the_api_arguments():
    assert band(False, None) == (INF, INF) and band(True, None) == (INF, 0.0)
    assert band(True, (5, 7)) == (5.0, 0.0) and band(False, (-1, 3)) == (INF, 3.0)
    for world, zig in itertools.product((1, 2, 3), (False, True)):
        assert sum(len(chunks_of(r, world, zig)) for r in range(world)) == world * (2 if zig else 1)


def test_ring_attention_refuses_before_any_gpu_work():
    from cudattn.distributed import ring_attention

    class Comm:  # what ring_attention reads of a communicator
        nranks, rank, ptr = 2, 0, 0

    x = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(TypeError, match="q must be a cudattn DeviceArray"):
        ring_attention(x, x, x, Comm(), causal=True)
    with pytest.raises(NotImplementedError, match="window_size"):
        ring_attention(x, x, x, Comm(), window_size=(4, 0))
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        ring_attention(x, x, x, Comm(), alibi_slopes=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="layout"):
        ring_attention(x, x, x, Comm(), layout="sbhd")


def test_importing_cudattn_imports_neither_the_ring_nor_nccl():
    import subprocess
    import sys

    code = "import sys, cudattn; print('cudattn.distributed' in sys.modules, 'nccl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
