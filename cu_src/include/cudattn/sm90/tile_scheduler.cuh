// The Hopper forward kernel's tile scheduler (fwd_sm90.cuh): which (batch, head, query block) tile
// each CTA of the persistent grid takes next. The CTA's producer computes it (from the round
// number, or from a tile counter where the host gives one) and names each tile to the consumers
// with its Q stage (TileMsg).
#pragma once
#include "cudattn/params.cuh"

namespace cudattn {
namespace sm90 {

// The (batch, head, query block) of the t-th tile of the whole problem.
struct TileCoord {
    int b, h, m_block;
};

// A tile as the producer names it to the consumers, with its Q stage: its coordinates and its key
// tiles. The tile order is a chain of integer divisions (~800 cycles a tile, a per-CTA timeline
// showed); the producer computes it anyway and runs ahead, so the consumers compute none.
// count < 0: no tile left.
struct TileMsg {
    int b, h, m_block;
    int first, count;  // key tiles first .. first + count - 1 (key_tiles, mask.cuh)
};
// Builds whose consumers skip the key tiles their rows do not see (fwd_sm90.cuh's SKIP_UNSEEN):
// unseen[w], the top key tiles (visited first) that none of consumer w's 64 rows sees, all of them
// for rows past the sequence's end. Other builds keep the plain message (their consumers find
// rows past the end themselves: consumer.cuh, SKIP_PAST_END).
struct TileMsgUnseen : TileMsg {
    int unseen[3];
};
template <bool UNSEEN>
struct TileMsgOf {
    typedef TileMsg type;
};
template <>
struct TileMsgOf<true> {
    typedef TileMsgUnseen type;
};

// Round r's tile of this CTA (may be >= the tile count in the last round).
template <bool CAUSAL>
__device__ __forceinline__ int tile_of_round(int r) {
    const int c = (CAUSAL && (r & 1)) ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    return r * (int)gridDim.x + c;
}

// `order` is FwdSm90Params::tile_order, set by the host. Causal: the (batch, head) pairs are cut
// into sections of `order` pairs whose K and V fit in L2 together; inside a section, every pair's
// last query block (the longest) comes first, then the ones above. Longest-first alone, across all
// heads, would have the CTAs of one round each stream a different head's K/V from HBM (seen:
// 0.55-0.67x cuDNN at B*H >= 128).
// Full: neighbouring tiles are one head's query blocks, which share its K and V in L2; where the
// host says each sequence's last query block is short (`order` nonzero: whole consumers past the
// sequence's end), those blocks come after all the others, so that the last tiles taken are the
// shortest.
// Variable lengths: num_m_blocks covers the longest sequence, and the query blocks past a
// shorter one's end are skipped (a few instructions each). Causal, that keeps the longest rows
// first; full, the head-major order measured faster than longest-first on mixed lengths (the
// latter has every CTA of a round on another head's K/V: up to 14 % slower, H200).
template <bool CAUSAL>
__device__ __forceinline__ TileCoord tile_at(int t, const FwdParams& p, int order) {
    const int heads = p.heads_q, pairs = heads * p.batch, num_m = p.num_m_blocks;
    int bh;
    TileCoord c;
    if (CAUSAL) {
        const int section = order, sec = t / (section * num_m), first = sec * section;
        const int in_sec = min(section, pairs - first), r = t - sec * section * num_m;
        c.m_block = num_m - 1 - r / in_sec;
        bh = first + r % in_sec;
    } else if (order != 0 && t >= pairs * (num_m - 1)) {  // the short last blocks, after all the others
        c.m_block = num_m - 1;
        bh = t - pairs * (num_m - 1);
    } else {
        const int per = order != 0 ? num_m - 1 : num_m;
        c.m_block = t % per;
        bh = t / per;
    }
    c.h = bh % heads;
    c.b = bh / heads;
    return c;
}

// Dynamic order (calls given a tile counter, those whose tiles differ in length by the host's rule,
// cudattn/_kernels/plan.py's _uneven_tiles; the C export gives none and keeps the rounds):
// a CTA's first tile is its own (blockIdx.x), every later one the next tile of the order above
// that no CTA has taken yet, taken once the CTA's producer has issued its previous tile's loads.
// Causal, the order comes longest first, so a CTA that drew shorter tiles, or met a warmer L2,
// takes more, and the last tiles taken are the shortest. In fixed rounds the CTAs of a short
// causal call ended 5 us apart on average (a per-CTA timeline, 16x16x512x64 causal: 12 % of the
// call). Full, a head's last query block is the short one where a consumer skips; in fixed rounds
// a grid that is a multiple of the blocks a head (132 CTAs: 3, 6, 11 or 22 blocks) gives each CTA
// the same block of every head, so all the short ones would fall to the same CTAs.
// counter[0]: takes past the first round (each CTA's last one finds no tile left); counter[1]:
// CTAs that have taken their last. The last CTA to finish taking zeroes both for the next kernel
// on the stream (the stream's counters are handed out zeroed: cudattn/_arrays/stream_memory.py).
// Called by one thread a CTA.
__device__ __forceinline__ int take_tile(int* counter) { return (int)gridDim.x + atomicAdd(counter, 1); }

__device__ __forceinline__ void tiles_taken(int* counter) {
    __threadfence();  // this CTA's last take before its count
    if (atomicAdd(counter + 1, 1) == (int)gridDim.x - 1) {
        __threadfence();  // every other CTA's takes before the zeroing
        counter[0] = 0;
        counter[1] = 0;
    }
}

}  // namespace sm90
}  // namespace cudattn
