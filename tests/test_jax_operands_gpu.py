"""GPU: JAX arrays as operands. They come in through DLPack's handshake, which orders JAX's
pending writes before the call's stream, are held until the call's work is done, and give the
reference's result; a JAX array in host memory is refused naming the argument.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import cudattn
from _callpath_cases import BF16, _check_attention, _qkv, _rng

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def jax():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the others
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX without a CUDA backend")
    return jax


def _put(jax, x):
    return jax.block_until_ready(jax.device_put(x, jax.devices("gpu")[0]))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16])
def test_jax_operands_give_the_reference(jax, dtype):
    rng = _rng()
    q, k, v = _qkv(rng, 2, 211, 211, 4, 2, 64, dtype)
    qj, kj, vj = (_put(jax, x) for x in (q, k, v))
    for _ in range(3):  # the full path, then the recorded one twice
        out = cudattn.attention(qj, kj, vj, causal=True)
        _check_attention(cudattn.to_host(out), q, k, v, causal=True)


@pytest.fixture(scope="module")
def slow_copy(jax):
    """``slow_copy(a)``: a copy of JAX array ``a``, returned while the jitted computation that makes
    it still runs (a chain of large products, its result scaled by 0 and added)."""
    jnp = jax.numpy
    big = _put(jax, _rng().standard_normal((4096, 4096), dtype=np.float32))

    @jax.jit
    def copy(a, m):
        for _ in range(12):  # normalised each step: finite, so 0 * sum stays 0
            m = m @ m
            m = m / jnp.max(jnp.abs(m))
        return (a.astype(jnp.float32) + 0.0 * jnp.sum(m)).astype(a.dtype)

    return lambda a: copy(a, big)


def test_a_pending_jax_computation_is_ordered_before_the_call(jax, slow_copy):
    """q is the output of a jitted computation still running: the call must read it only once JAX
    has written it."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 333, 333, 2, 2, 64)
    qj, kj, vj = (_put(jax, x) for x in (q, k, v))
    slow_copy(qj).block_until_ready()  # compiled
    for _ in range(2):
        pending = slow_copy(qj)
        out = cudattn.attention(pending, kj, vj)
        _check_attention(cudattn.to_host(out), q, k, v, what="attention on a pending JAX array")


def test_a_pending_jax_array_recalled_on_another_stream_is_ordered_there_too(jax, slow_copy):
    """A warm call recalls an array imported before and asks JAX for a capsule with its own stream:
    the array still being written when a second call reads it on another stream, that stream too
    must wait for JAX (the first call's wait orders only the first stream). Each round's q has new
    values, so that a read before JAX's write would not find the last round's equal ones."""
    from cuda.core import Device

    from cudattn._calls import warm

    rng = _rng()
    q, k, v = _qkv(rng, 1, 257, 257, 2, 2, 64)
    qj, kj, vj = (_put(jax, x) for x in (q, k, v))
    dev = Device()
    dev.set_current()  # cuda.core asks it of each thread before its first stream
    streams = [dev.create_stream() for _ in range(2)]
    cudattn.attention(slow_copy(qj).block_until_ready(), kj, vj, stream=streams[0])  # compiled, recorded
    for scale in (2.0, 4.0):  # powers of two: q * scale is exact
        pending = slow_copy(qj * scale)
        if warm.available():
            warm._native.stats(True)
        outs = [cudattn.attention(pending, kj, vj, stream=s) for s in streams]  # imported, then recalled
        if warm.available():
            assert warm._native.stats(True)[0] == 1, "the second stream's call was not the compiled recall"
        want_q = (q.astype(np.float32) * scale).astype(q.dtype)
        for out in outs:
            _check_attention(cudattn.to_host(out), want_q, k, v, what="a pending JAX array read on a second stream")


def test_a_jax_array_in_host_memory_is_refused_naming_it(jax):
    rng = _rng()
    q, k, v = _qkv(rng, 1, 16, 16, 2, 2, 64)
    kd, vd = cudattn.to_device(k), cudattn.to_device(v)
    q_host = jax.device_put(q, jax.devices("cpu")[0])
    with pytest.raises(TypeError, match=r"^q: "):
        cudattn.attention(q_host, kd, vd)


def test_a_jax_array_deleted_after_a_call_is_refused_not_read(jax):
    """A warm call recognises an array imported before (its capsule still asked for); once JAX has
    deleted the array (its buffer freed or donated), the call must refuse it, naming it, not read
    the address an earlier call was given."""
    rng = _rng()
    q, k, v = _qkv(rng, 1, 96, 96, 2, 2, 64)
    qj, kj, vj = (_put(jax, x) for x in (q, k, v))
    for _ in range(2):
        _check_attention(cudattn.to_host(cudattn.attention(qj, kj, vj)), q, k, v)
    qj.delete()
    with pytest.raises(ValueError, match=r"(?is)^q: .*deleted"):
        cudattn.attention(qj, kj, vj)
