"""GPU: the modules a warm call passes through, in one direction.

A warm call (its signature recorded by an earlier call) is traced with ``sys.setprofile``: every
Python call from one cudattn module into another is an edge. Each edge must go down the imports
(the callee's module is one the caller's module imports, directly or through others: no callback
into an upper module, which is how a call comes back to a module it had left), and no argument
checking or NumPy path may run again. The modules in the order the call first enters them are the
path docs/DESIGN.md lists; `python -m pytest tests/test_warm_path_gpu.py -s` prints it.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn._calls import warm as _warm

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)


def _trace(fn):
    """``(modules in the order first entered, edges (caller module, callee module), calls the compiled
    warm path served)`` of ``fn()``."""
    order: list[str] = []
    edges: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith("cudattn"):
            return
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__", "") if caller_frame is not None else ""
        if callee not in order:
            order.append(callee)
        if caller.startswith("cudattn") and caller != callee:
            edges.add((caller, callee))

    stats = _warm._native.stats if _warm.available() else None  # calls the compiled path served
    if stats is not None:
        stats(True)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return order, edges, (stats(True)[0] if stats is not None else 0)


def _rand(shape, dtype, rng):
    return cudattn.to_device(rng.standard_normal(shape, dtype=np.float32).astype(dtype))


def _below(module: str) -> set[str]:
    """The cudattn modules ``module`` imports, directly or through others (the layers test's walk)."""
    from test_layers_cpu import GRAPH

    seen, todo = set(), [module]
    while todo:
        for t, _, _ in GRAPH.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _replayed(order, served) -> bool:
    """The recorded plan ran: through `_calls.replay` (the Python path), or served by the compiled
    warm path, which enters Python only for the call's memory and for argument blocks whose tensor
    maps need an address it has not seen."""
    return "cudattn._calls.replay" in order or served == 1


def _check_one_direction(order, edges):
    up = sorted((a, b) for a, b in edges if b not in _below(a))
    assert not up, f"calls into a module the caller does not import (a way back up): {up}; order {order}"


def test_a_warm_attention_call_goes_down_the_layers_once():
    rng = np.random.default_rng(7)
    q, k, v = (_rand((2, 203, 4, 64), BF16, rng) for _ in range(3))
    cudattn.attention(q, k, v, causal=True)  # cold: validates, plans, records
    order, edges, served = _trace(lambda: cudattn.attention(q, k, v, causal=True))
    print("\nattention, warm:", " -> ".join(order))
    assert order[0] == "cudattn._ops.attention" and _replayed(order, served), order
    assert not any(m.startswith(("cudattn._spec", "cudattn._numpy")) for m in order), \
        f"a warm call validated or took the NumPy path again: {order}"
    _check_one_direction(order, edges)


def test_a_warm_kvcache_call_goes_down_the_layers_once():
    rng = np.random.default_rng(8)
    q = _rand((2, 1, 8, 128), BF16, rng)
    kc, vc = (_rand((2, 1024, 2, 128), BF16, rng) for _ in range(2))
    lens = cudattn.to_device(np.array([700, 1013], np.int32))
    cudattn.attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
    order, edges, served = _trace(lambda: cudattn.attention_with_kvcache(q, kc, vc, cache_seqlens=lens))
    print("\nattention_with_kvcache, warm:", " -> ".join(order))
    assert order[0] == "cudattn._ops.kvcache" and _replayed(order, served), order
    assert not any(m.startswith(("cudattn._spec", "cudattn._numpy")) for m in order), order
    _check_one_direction(order, edges)
