"""Plan one call: which kernel variant, which grid, and the parameter block it is launched with."""

from __future__ import annotations

from dataclasses import dataclass

from . import _traits
from ._params import FwdParams
from ._problem import Problem, TensorGeom
from ._traits import Variant

_LOG2E = 1.4426950408889634
_MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Plan:
    variant: Variant
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    num_m_blocks: int


_plans: dict = {}


def make_plan(problem: Problem, smem_limit: int) -> Plan:
    """The plan for this problem's shape (memoised: on the hot path a repeated shape is one lookup)."""
    key = (problem.dtype, problem.head_dim, problem.causal, problem.seqlen_q, problem.heads_q, problem.batch,
           smem_limit)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 4096:  # many distinct shapes (variable lengths): keep the table bounded
            _plans.clear()
        plan = _plans[key] = _make_plan(problem, smem_limit)
    return plan


def _make_plan(problem: Problem, smem_limit: int) -> Plan:
    variant = _traits.select(problem.dtype, problem.head_dim, problem.causal, smem_limit)
    bm = variant.tiles.block_m
    num_m = -(-problem.seqlen_q // bm)
    # Must match the kernel's reading of blockIdx (fwd_sm80.cuh): causal puts m last (longest first).
    grid = (problem.heads_q, problem.batch, num_m) if problem.causal else (num_m, problem.heads_q, problem.batch)
    if grid[1] > _MAX_GRID_YZ or grid[2] > _MAX_GRID_YZ:
        raise ValueError(
            f"batch ({problem.batch}), heads_q ({problem.heads_q}) and, for causal, the {num_m} blocks of "
            f"{bm} query rows must each be at most {_MAX_GRID_YZ} (CUDA grid limit); split the call"
        )
    return Plan(variant, grid, (variant.threads, 1, 1), variant.smem_bytes, num_m)


def contiguous_geom(problem: Problem) -> TensorGeom:
    """Element strides of a freshly allocated C-contiguous output in the problem's layout."""
    B, S, H, D = problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim
    if problem.layout == "bshd":
        return TensorGeom(batch=S * H * D, seq=H * D, head=D)
    return TensorGeom(batch=H * S * D, seq=D, head=S * D)


def _scale_log2(scale: float) -> float:
    # The kernel masks scores with an infinity that the scale turns into -inf; a zero scale would
    # make NaN of it. 1e-30 gives the same float32 softmax as 0 (every exp2(1e-30 * s) rounds to
    # 1 for |s| < 1e22), so it stands in for zero.
    return scale * _LOG2E if scale != 0 else 1e-30


def make_params(problem: Problem, plan: Plan, q: int, k: int, v: int, o: int, lse: int, o_geom: TensorGeom) -> FwdParams:
    qs, ks, vs = problem.q_strides, problem.k_strides, problem.v_strides
    return FwdParams(
        q, k, v, o, lse,
        qs.batch, qs.seq, qs.head,
        ks.batch, ks.seq, ks.head,
        vs.batch, vs.seq, vs.head,
        o_geom.batch, o_geom.seq, o_geom.head,
        problem.batch, problem.seqlen_q, problem.seqlen_k, problem.heads_q, problem.heads_kv,
        problem.group_size,
        problem.head_dim,
        problem.seqlen_k - problem.seqlen_q,
        _scale_log2(problem.scale),
        plan.num_m_blocks,
        int(lse != 0),
        0,
    )
