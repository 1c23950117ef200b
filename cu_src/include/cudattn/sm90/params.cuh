// Parameters of the Hopper forward kernel, passed BY VALUE as its single __grid_constant__
// argument. The tensor maps come first, each at a 64-byte offset as TMA requires; the shape and
// strides are the portable kernel's FwdParams. Mirrored by cudattn/_kernels/params.py (FwdSm90Params).
#pragma once
#include "cudattn/params.cuh"
#include "cudattn/sm90/tma.cuh"

struct alignas(64) FwdSm90Params {
    // 4-D maps over (head dim, seq, head, batch). Q: boxes of 64 x BLOCK_M; K, V: 64 x BLOCK_N; O: 64 x 64
    // (one consumer's rows), used where o_tma is set.
    cudattn::sm90::TmaDescriptor tma_q, tma_k, tma_v, tma_o;
    FwdParams p;
    // The tile order's argument (sm90/tile_scheduler.cuh, tile_at): causal, the (batch, head) pairs a
    // section of it whose K/V fit in L2; full, nonzero where each sequence's short last query block
    // comes after all the others.
    int tile_order;
    int o_tma;  // 1: O leaves through tma_o from shared memory in builds that stage it (sm90/epilogue.cuh)
    int* tile_counter;  // two zeroed ints for the dynamic tile order (tile_scheduler.cuh); null: rounds
};
