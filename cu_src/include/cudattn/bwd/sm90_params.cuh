// Parameters of the Hopper backward kernel, passed BY VALUE as its single __grid_constant__
// argument: the TMA maps of q, k, v, dout and the dQ accumulator (each at a 64-byte offset), then
// the portable kernels' BwdParams. Mirrored by cudattn/_kernels/params.py (BwdSm90Params).
#pragma once
#include "cudattn/bwd/params.cuh"
#include "cudattn/sm90/tma.cuh"

struct alignas(64) BwdSm90Params {
    // 4-D maps over (head dim, seq, head, batch), boxes of 64 columns: q and dout BLOCK_M rows,
    // k and v BLOCK_N rows.
    cudattn::sm90::TmaDescriptor tma_q, tma_k, tma_v, tma_do;
    // The float32 dQ accumulator as (tile_dim, heads_q, rows_s, rows_b), boxes of 32 columns x
    // BLOCK_M rows of one head (bwd/params.cuh: its layout), for the reductions that add into it.
    cudattn::sm90::TmaDescriptor tma_dq;
    BwdParams p;
};
