"""Plan one call: which kernel variant, which grid, and the parameter block it is launched with."""

from __future__ import annotations

import ctypes
import math

from dataclasses import dataclass

from . import decode as _decode
from . import sm_margin as _sm_margin
from . import fp8 as _fp8
from .._spec import geometry as _geometry
from . import tma as _tma
from . import traits as _traits
from .._runtime.launch import MAX_GRID_YZ
from .._spec.modifiers import MOD_WINDOW
from .params import fill_params
from .params import FwdParams, FwdSm90Params, scale_log2
from .._spec.problem import Problem
from .._spec.geometry import TensorGeom
from .traits import Variant


@dataclass(frozen=True)
class Plan:
    variant: Variant
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    num_m_blocks: int
    tile_order: int = 0  # sm90: causal, (batch, head) pairs per L2-sized section of the tile order; full, 1
    # where each sequence's last query block is short and comes last (_short_last_block)
    dynamic_order: bool = False  # sm90: tiles taken from the stream's counter (`_uneven_tiles`)


_plans: dict = {}


def _uneven_tiles(problem: Problem, bm: int) -> bool:
    """Whether a Hopper call's tiles (of ``bm`` query rows) differ in length, so that its CTAs take
    them from the stream's counter (the dynamic order, sm90/tile_scheduler.cuh): causal ones;
    packed batches (sequences of different lengths, whose tiles past a shorter one's end the
    producer skips); KV caches of more than one sequence given per-sequence lengths (each
    sequence's tiles read its own number of keys; equal lengths cost nothing measurable, and
    device lengths are not read); and in a padded batch, the last query block of each
    sequence where whole consumer warpgroups (64 rows each) lie past its end: they skip their
    products (sm90/consumer.cuh)."""
    if problem.causal or problem.varlen is not None:
        return True
    kv = problem.kv_cache
    if kv is not None and kv.seqlens_ptr and problem.batch > 1:
        return True
    return _short_last_block(problem, bm)


def _short_last_block(problem: Problem, bm: int) -> bool:
    """A padded batch whose sequences' last query block has whole consumer warpgroups (64 rows each)
    past the end: a shorter tile, which the full tile order puts after all the others
    (sm90/tile_scheduler.cuh, tile_at)."""
    return problem.varlen is None and 0 < problem.seqlen_q % bm <= bm - 64


def make_plan(problem: Problem, props) -> Plan:
    """The plan for this problem's shape on a device with properties ``props`` (memoised: on the
    hot path a repeated shape is one lookup)."""
    family = _traits.family_for(props.arch)
    if family == "sm90" and (problem.seqlen_k == 0 or not tma_can_map(problem)):
        # The portable kernel reads any valid strides; and no keys (a call with sinks: LSE = sink)
        # has no TMA map to describe.
        family = "sm80"
    key = (problem.dtype, problem.out_dtype, problem.head_dim, problem.causal, problem.seqlen_q, problem.seqlen_k, problem.heads_q,
           problem.heads_kv, problem.batch, props.max_shared_memory_per_block_optin, props.sm_count,
           props.l2_cache_size, family, problem.varlen is not None,
           problem.kv_cache is not None and problem.kv_cache.paged,
           problem.kv_cache is not None and bool(problem.kv_cache.seqlens_ptr), problem.window is not None,
           problem.mods.bits if problem.mods is not None else 0, _sm_margin.local.n)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 4096:  # many distinct shapes (variable lengths): keep the table bounded
            _plans.clear()
        sms = max(1, props.sm_count - key[-1])  # SMs left to other streams' kernels (sm_margin.leave_free)
        plan = _plans[key] = _make_plan(problem, props.max_shared_memory_per_block_optin, sms,
                                        props.l2_cache_size, family, margin=key[-1] > 0)
    return plan


# A TMA map takes strides in (0, 2**40) bytes; a size-1 axis may carry any (_tma gives it a dense one).
_TMA_MAX_STRIDE = 1 << 40


def tma_can_map(problem: Problem, q_like: tuple = ()) -> bool:
    """Whether the Hopper kernels' TMA maps can describe q, k and v (and the TensorGeoms ``q_like``
    of more operands shaped as q, e.g. the backward's dout): not when an axis of more than one
    element has stride 0 (a broadcast view, e.g. kv heads expanded from one) or a huge stride."""
    q, k, v = problem.q_strides, problem.k_strides, problem.v_strides
    strides = (q.batch, q.seq, q.head, k.batch, k.seq, k.head, v.batch, v.seq, v.head,
               *(st for g in q_like for st in (g.batch, g.seq, g.head)))
    item = problem.dtype.itemsize
    if min(strides) > 0 and max(strides) * item < _TMA_MAX_STRIDE:  # every call but odd views: one test
        return True
    (sq, bq), (sk, bk) = map_extents(problem)
    return all(_axes_mappable(geom, item, sizes) for geom, sizes in (
        (problem.q_strides, (sq, problem.heads_q, bq)), (problem.k_strides, (sk, problem.heads_kv, bk)),
        (problem.v_strides, (sk, problem.heads_kv, bk)), *((g, (sq, problem.heads_q, bq)) for g in q_like)))


def _axes_mappable(geom: TensorGeom, item: int, sizes: tuple, unit: int = 1) -> bool:
    """Whether a TMA map can take ``geom``'s (seq, head, batch) strides for axes of ``sizes``
    elements: on every axis longer than one, a stride in (0, 2**40) bytes, a multiple of ``unit``."""
    return all(0 < st * item < _TMA_MAX_STRIDE and st * item % unit == 0
               for st, n in zip((geom.seq, geom.head, geom.batch), sizes) if n > 1)


def map_extents(problem: Problem) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, batch) of the q and of the k/v tensors as the kernels index them: a packed
    variable-length operand is one batch entry of ``total`` rows (its sequences found through
    cu_seqlens), a padded one ``batch`` entries of ``seqlen`` rows."""
    vl, kv = problem.varlen, problem.kv_cache
    q = (problem.seqlen_q, problem.batch) if vl is None else (vl.total_q, 1)
    if kv is not None and kv.paged:
        k = (kv.page_size, kv.num_pages)  # a page is a map's batch entry
    else:
        k = (vl.total_k, 1) if vl is not None and vl.total_k is not None else (problem.seqlen_k, problem.batch)
    return q, k


def paged_box_rows(problem: Problem, block_n: int) -> int:
    """Rows of a K/V map's box: the key tile, or for a paged cache the largest run of keys whole in
    one page that divides the tile (sm90/producer.cuh, paged_box_rows: the same rule)."""
    kv = problem.kv_cache
    return math.gcd(kv.page_size, block_n) if kv is not None and kv.paged else block_n


def _make_plan(problem: Problem, smem_limit: int, sm_count: int, l2_bytes: int, family: str,
               margin: bool = False) -> Plan:
    windowed = problem.window is not None
    # Windows: Hopper builds of one or two consumer warpgroups only (fwd_sm90.cuh, WINDOW): at head
    # dim 64 the tiles the short-causal rule picks (seqlen_q 1) or the small-grid tiles, else the
    # portable kernel; at head dims 128 and 192 those of the shortest rows (seqlen_q 1: two
    # consumers); FP8 Hopper builds compile the window in only when asked (MOD_WINDOW, with
    # narrower key tiles: _traits).
    mods = (problem.mods.bits if problem.mods is not None else 0) | (MOD_WINDOW if windowed else 0)
    # Tiles of fewer query rows where they fit in a wave or two of the persistent grid (_traits)
    small_rows = _traits.small_grid_rows(problem.dtype, problem.head_dim, problem.causal, family,
                                         problem.heads_q * problem.batch, problem.seqlen_q, sm_count)
    # Two CTAs an SM (_traits, _SM90_TWO_CTAS) as measured: causal self-attention with no window, and
    # no SMs to leave free (two CTAs an SM would leave halves of SMs, not whole ones: sm_margin)
    two_ctas = not (windowed or margin) and problem.seqlen_k <= problem.seqlen_q
    variant = _traits.select(problem.dtype, problem.head_dim, problem.causal, smem_limit, family, problem.out_dtype,
                             1 if windowed and family == "sm90" and problem.head_dim <= 192 else problem.seqlen_q, mods,
                             small_rows, two_ctas)
    if windowed and family == "sm90" and variant.tiles.block_m > 128:
        family = "sm80"
        variant = _traits.select(problem.dtype, problem.head_dim, problem.causal, smem_limit, family,
                                 problem.out_dtype, problem.seqlen_q, mods)
    bm = variant.tiles.block_m
    num_m = -(-problem.seqlen_q // bm)
    if family == "sm90":
        # Persistent: one CTA an SM (two for builds of one consumer made for it: min_blocks), each
        # walking the tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... in the kernel's order
        # (sm90/tile_scheduler.cuh).
        tiles = num_m * problem.heads_q * problem.batch
        if tiles >= 2**31:
            raise ValueError(f"{tiles} tiles of {bm} query rows exceed the kernel's 32-bit tile index; split the call")
        ctas = min(tiles, sm_count * variant.tiles.min_blocks)
        order = _tile_order(problem, bm, l2_bytes, ctas)
        return Plan(variant, (ctas, 1, 1), (variant.threads, 1, 1), variant.smem_bytes, num_m, order,
                    _uneven_tiles(problem, bm))
    # Must match the kernel's reading of blockIdx (fwd_sm80.cuh): causal puts m last (longest first).
    grid = (problem.heads_q, problem.batch, num_m) if problem.causal else (num_m, problem.heads_q, problem.batch)
    if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise ValueError(
            f"batch ({problem.batch}), heads_q ({problem.heads_q}) and, for causal, the {num_m} blocks of "
            f"{bm} query rows must each be at most {MAX_GRID_YZ} (CUDA grid limit); split the call"
        )
    return Plan(variant, grid, (variant.threads, 1, 1), variant.smem_bytes, num_m)


def _tile_order(problem: Problem, bm: int, l2_bytes: int, ctas: int) -> int:
    """The Hopper kernel's ``tile_order`` argument, which shapes its tile order (sm90/tile_scheduler.cuh,
    tile_at): causal, the pairs a section (`_l2_section`); full, 1 where each sequence's last query
    block is short and comes after all the others (`_short_last_block`: 16×16×512×64 −2 %,
    8×16×1024×64 −4.5 %, H200), else 0."""
    return _l2_section(problem, l2_bytes, ctas) if problem.causal else int(_short_last_block(problem, bm))


def _l2_section(problem: Problem, l2_bytes: int, ctas: int) -> int:
    """(batch, head) pairs per section of the causal tile order (sm90/tile_scheduler.cuh, tile_at).

    Longest-first over all pairs is best while the CTAs of a round share heads: CTAs on one head
    read its K/V a few tiles apart, so L2 serves all but the first. Once there are more pairs
    than a quarter of the CTAs and their K/V do not fit in half of L2, each CTA streams its own
    head from HBM (seen: 0.55-0.67x cuDNN at B*H >= 128, S <= 2048), so the order is cut into
    sections of pairs whose K/V fit, but never so few that under 4 CTAs share a head.
    Measured: sections of 1-16 pairs at S >= 8192 cost 7-35 % against one section, but where one
    pair's K/V alone outgrows half of L2 (S >= 64 Ki at head dim 128 on an H200), sections of 2
    pairs ran 9-10 % faster than one of 16 (B 1, H 16: 657 against 599 TFLOP/s at 64 Ki, 625
    against 574 at 128 Ki): the CTAs of a round then stream one K/V in step.

    The sections are then made as even as the kernel's rule allows (all of one size, the rest last):
    each section's tiles come longest first, so a short last section puts long tiles at the very end
    of the call, where a few CTAs run them while the others have nothing left (a per-CTA timeline,
    H200: 256 pairs in sections of 229 and 27 at 512 rows, the CTAs ending 3.2 µs apart on average
    in a call of 42)."""
    pairs = problem.batch * problem.heads_q
    kv_per_pair = 2 * problem.seqlen_k * problem.head_dim * problem.dtype.itemsize / problem.group_size
    budget = l2_bytes // 2
    if pairs * kv_per_pair <= budget:
        return pairs
    if kv_per_pair > budget:
        section = min(pairs, LONG_SECTION)
    else:
        section = max(1, min(pairs, max(int(budget // kv_per_pair), ctas // 4)))
    sections = -(-pairs // section)
    return -(-pairs // sections)


LONG_SECTION = 2  # pairs per section where one pair's K/V outgrows half of L2 (`_l2_section`)


def contiguous_geom(problem: Problem) -> TensorGeom:
    """Element strides of a freshly allocated C-contiguous output in the problem's layout."""
    return _geometry.contiguous_geom(problem.seqlen_q, problem.heads_q, problem.head_dim, problem.layout)


def make_params(problem: Problem, plan: Plan, q: int, k: int, v: int, o: int, lse: int, o_geom: TensorGeom):
    """The kernel's by-value argument: FwdParams, or for the Hopper family FwdSm90Params, which
    adds the TMA maps of q, k and v (encoded per call: they hold the addresses). FP8: ``v`` is Vt
    (`_kernels.fp8.transpose_v`)."""
    params = _fwd_params(problem, plan, q, k, v, o, lse, o_geom)
    if problem.descales is not None:
        _set_fp8(params, problem)
    if problem.kv_cache is not None:
        params.kv = _decode.kv_geom(problem)
    if problem.window is not None:
        params.has_window = 1
        params.window_left, params.window_right = problem.window
    if problem.mods is not None:  # FP8: the scalar descales scale the scores (the arrays: fp8.cuh)
        d = problem.descales
        fill_params(params, problem.mods, problem.scale if d is None else problem.scale * d.q * d.k)
    if plan.variant.family != "sm90":
        return params
    P = FwdSm90Params()
    P.p = params
    P.tile_order = plan.tile_order
    dt, D = problem.dtype, problem.head_dim
    Hq, Hkv = problem.heads_q, problem.heads_kv
    (Sq, Bq), (Sk, Bk) = map_extents(problem)
    t = plan.variant.tiles
    kv_rows = paged_box_rows(problem, t.block_n)
    maps = [("tma_q", (q, Sq, Hq, Bq, problem.q_strides, t.block_m)),
            ("tma_k", (k, Sk, Hkv, Bk, problem.k_strides, kv_rows))]
    if problem.descales is None:
        maps.append(("tma_v", (v, Sk, Hkv, Bk, problem.v_strides, kv_rows)))
    else:
        raw = _tma.encode_vt(v, dt, D, _fp8.vt_keys(problem), Hkv, Bk, plan.variant.tile_dim)
        ctypes.memmove(ctypes.addressof(P.tma_v), raw, len(raw))
    # O leaves through a TMA store (epilogue.cuh) where a map takes its strides in whole 16-byte units (the
    # call path checks the address's alignment); else the kernel stores from registers
    if plan.variant.stages_o and _axes_mappable(o_geom, dt.itemsize, (Sq, Hq, Bq), 16):
        maps.append(("tma_o", (o, Sq, Hq, Bq, o_geom, 64)))
        P.o_tma = 1
    row_bytes = min(128, plan.variant.tile_dim * plan.variant.elem_bytes)  # the kernel's swizzle row (fwd_sm90.cuh)
    for field, (ptr, seqlen, heads, batch, geom, rows) in maps:
        raw = _tma.encode_attention_operand(ptr, dt, D, seqlen, heads, batch, geom, rows, row_bytes)
        ctypes.memmove(ctypes.addressof(getattr(P, field)), raw, len(raw))
    return P


def _set_fp8(params: FwdParams, problem: Problem) -> None:
    """Vt's strides in place of V's, and the descales: scalars folded into the softmax scale and the
    output scale, arrays passed by address (the kernel multiplies them in per (batch, kv head))."""
    d = problem.descales
    pad = _fp8.vt_keys(problem)
    params.v_stride_s = pad  # between Vt's head-dim rows
    params.v_stride_h = problem.head_dim * pad
    params.v_stride_b = 0 if _fp8.packed_vt(problem) else problem.heads_kv * problem.head_dim * pad
    params.scale_log2 = scale_log2(problem.scale * d.q * d.k)
    params.out_scale = d.v
    params.q_descale, params.k_descale, params.v_descale = d.q_ptr, d.k_ptr, d.v_ptr


def _fwd_params(problem: Problem, plan: Plan, q: int, k: int, v: int, o: int, lse: int, o_geom: TensorGeom) -> FwdParams:
    if problem.varlen is not None:
        return _varlen_params(problem, plan, q, k, v, o, lse, o_geom)
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
        scale_log2(problem.scale),
        plan.num_m_blocks,
        int(lse != 0),
        0,
        0, 0, 0,
        1.0,
    )


def _varlen_params(problem: Problem, plan: Plan, q: int, k: int, v: int, o: int, lse: int,
                   o_geom: TensorGeom) -> FwdParams:
    """FwdParams of a packed batch (seqlen.cuh): seqlen_q/seqlen_k are the packed extents the
    kernels clamp offsets into, the packed operands' batch strides are 0, and each sequence's
    rows and lengths come from the offsets."""
    vl = problem.varlen
    qs, ks, vs = problem.q_strides, problem.k_strides, problem.v_strides
    packed_k = vl.total_k is not None
    Sq, Sk = vl.total_q, vl.total_k if packed_k else problem.seqlen_k  # a KV cache: its capacity
    p = FwdParams(
        q, k, v, o, lse,
        0, qs.seq, qs.head,
        0 if packed_k else ks.batch, ks.seq, ks.head,
        0 if packed_k else vs.batch, vs.seq, vs.head,
        0, o_geom.seq, o_geom.head,
        problem.batch, Sq, Sk, problem.heads_q, problem.heads_kv,
        problem.group_size,
        problem.head_dim,
        0,  # per sequence (seqlen.cuh)
        scale_log2(problem.scale),
        plan.num_m_blocks,
        int(lse != 0),
        0,
        0, 0, 0,
        1.0,
    )
    p.cu_seqlens_q, p.cu_seqlens_k = vl.cu_q_ptr, vl.cu_k_ptr
    return p
