"""Backward rows (`--grid backward`): `attention_backward` and a training step, beside torch SDPA's.

A backward case (a `grids.Case` with op "backward") gives one row per `grids.BACKWARD_OPS`, all on
the same inputs (q, k, v and dout, rotated over copies larger than L2 as the forward rows' are):

- "backward": ``attention_backward(dout, q, k, v, out, lse)`` alone, ``out`` and ``lse`` made once
  per input set by ``attention(q, k, v, return_lse=True)``; dq, dk, dv allocated by the call;
- "backward det": the same with ``deterministic=True``;
- "train step": ``attention(q, k, v, return_lse=True)`` then the backward of its output.

Each is timed as the forward rows are (`runner.time_ours`, `runner.time_peer`): GPU time (calls
queued behind a spin kernel, host time hidden) and as called (events around one call on an idle
stream, and back to back), with the TFLOP/s of `Case.flops` (2.5 forwards for the backward, 3.5 for
a training step). The peers (`peers.TorchPeers.backward`): torch SDPA's cuDNN and flash backends,
``torch.autograd.grad`` of an output made once by the same backend for the backward alone, forward
and grad together for the training step, and torch's deterministic mode for "backward det". A
backend that refuses a case is n/a in its row.

Each row is checked first (`check_backward`): its gradients, written into NaN-poisoned arrays
(the training step: its own, and its forward's output, as `check` checks the forward rows); the
deterministic backward also for bit-identical gradients from two calls.
"""

from __future__ import annotations

import dataclasses
import functools
import gc

import numpy as np

from .. import attention, attention_backward, to_host
from .._arrays import array as _array
from . import check, check_backward, inputs, runner
from .grids import BACKWARD_OPS, Case
from .peers import BACKENDS


def run_case(case: Case, s: runner.Session) -> list[dict]:
    """The rows of one backward case, in the order of BACKWARD_OPS."""
    h, causal = s.stream_handle, case.causal
    host = inputs.host_inputs(case, s.rng)
    dout = s.rng.standard_normal(host[0].shape, dtype=np.float32).astype(host[0].dtype)
    cases = {op: dataclasses.replace(case, op=op) for op in BACKWARD_OPS}
    sets = inputs.device_sets((*host, dout), inputs.set_count(cases["backward"], s.props.l2_cache_size), h)
    # the backward's sets: (dout, q, k, v, out, lse), out and lse from cudattn's forward, once a set
    bsets = [(d, q, k, v, *attention(q, k, v, causal=causal, return_lse=True, stream=h)) for q, k, v, d in sets]

    def backward(det: bool):
        return lambda st, stream=h: attention_backward(*st, causal=causal, deterministic=det, stream=stream)

    def train(st, stream=h):
        q, k, v, d = st
        out, lse = attention(q, k, v, causal=causal, return_lse=True, stream=stream)
        return attention_backward(d, q, k, v, out, lse, causal=causal, stream=stream)

    calls = {"backward": (backward(False), bsets), "backward det": (backward(True), bsets), "train step": (train, sets)}
    checks = _checks(case, s, host, dout, bsets[0], sets[0])
    rows, later = [], []
    for op, (call, op_sets) in calls.items():
        row = runner.new_row(cases[op])
        row["check"] = checks[op]
        later.append(runner.Turns(cases[op]))
        row["impls"]["cudattn"] = runner.time_ours(cases[op], s, call, op_sets, later[-1])
        row["sets"] = len(sets)
        rows.append(row)
    if s.peers is not None:
        _peers(rows, cases, s, sets, later)
    else:
        for row, row_later in zip(rows, later):
            row_later.time(row, s)
    del sets, bsets
    gc.collect()
    return rows


def _peers(rows: list[dict], cases: dict, s: runner.Session, sets: list, later: list) -> None:
    """Each peer's figures into the rows, each row's as-called figures timed in turns after its
    GPU times (torch copies of the sets, given back at the end)."""
    why = s.peers.skip_reason(cases["backward"])
    tsets = None if why else [s.peers.grad_tensors(x) for x in sets]
    for row, row_later, (op, case) in zip(rows, later, cases.items()):
        for name in BACKENDS:
            if why:
                row["impls"][name] = {"error": why}
                continue
            make = functools.partial(s.peers.backward, case, tsets, train=op == "train step")
            scope = functools.partial(s.peers.scope, name, deterministic=op == "backward det")
            runner.time_peer(row, name, case, s, make, scope, row_later)
        row_later.time(row, s)
    make = tsets = None  # the last references to the peers' copies
    s.peers.torch.cuda.empty_cache()  # give the peers' copies back before the next case


def _into_nan(bset, h, **kw):
    """attention_backward of one set into NaN-poisoned dq, dk, dv (unwritten elements cannot pass)."""
    d, q, k, v, out, lse = bset
    grads = {n: _array.empty(x.shape, x.dtype, device=x.device_id, stream=h).fill_nan(stream=h)
             for n, x in (("dq", q), ("dk", k), ("dv", v))}
    return attention_backward(d, q, k, v, out, lse, stream=h, **grads, **kw)


def _checks(case: Case, s: runner.Session, host, dout, bset, tset) -> dict:
    """Each op's check, on the first input set: its gradients, and for the training step its forward."""
    h, causal = s.stream_handle, case.causal
    q, k, v = host
    out, lse = (to_host(x, stream=h) for x in bset[4:])

    def grads(res, fwd=(out, lse)):
        return check_backward.check_grads(case, q, k, v, dout, *fwd, [to_host(g, stream=h) for g in res[:3]], s.rng)

    res = {"backward": grads(_into_nan(bset, h, causal=causal))}
    det = [[to_host(g, stream=h) for g in _into_nan(bset, h, causal=causal, deterministic=True)[:3]]
           for _ in range(2)]
    c = check_backward.check_grads(case, q, k, v, dout, out, lse, det[0], s.rng)
    c["repeatable"] = all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(*det))
    c["ok"] = c["ok"] and c["repeatable"]
    res["backward det"] = c

    tq, tk, tv, td = tset
    t_out, t_lse = attention(tq, tk, tv, causal=causal, return_lse=True, stream=h)
    t_out_h, t_lse_h = to_host(t_out, stream=h), to_host(t_lse, stream=h)
    fwd = check.check_output(case, q, k, v, t_out_h, s.rng)
    bwd = grads(_into_nan((td, tq, tk, tv, t_out, t_lse), h, causal=causal), (t_out_h, t_lse_h))
    res["train step"] = {**check_backward.combine(fwd, bwd), "forward": fwd, "backward": bwd}
    return res
