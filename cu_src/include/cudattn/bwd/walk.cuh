// Which query blocks a key block's CTA visits, in which order: every block whose key range (the
// forward's own rule, mask.cuh key_tiles) may hold the key block, for each query head of the KV
// head's group. Shared by the backward kernels of both families.
#pragma once
#include "cudattn/mask.cuh"
#include "cudattn/seqlen.cuh"

namespace cudattn {

template <int BM, int BN, bool CAUSAL>
struct BwdWalk {
    int m_lo, m_hi, nm, total;  // query blocks m_lo..m_hi (nm of them) for each of the group's heads
    int hkv, group;
    bool top_down;

    // top_down (deterministic): query blocks from the last down, so that every key block of a head
    // starts on the block all of them see and the turns (key blocks in order) cost one step of
    // lag each, not a climb through the blocks below; otherwise upward, key blocks a few steps
    // apart, so their float atomics seldom meet on one address.
    __device__ __forceinline__ BwdWalk(const FwdParams& p, const SeqSpan& sq, int n_start, int hkv_, bool top_down_)
        : hkv(hkv_), group(p.group), top_down(top_down_) {
        const int off = sq.causal_offset;
        const int wl = p.has_window ? p.window_left : -1;
        const int wr = CAUSAL ? 0 : (p.has_window ? p.window_right : -1);
        const int num_m = (sq.seqlen_q + BM - 1) / BM;
        m_lo = 0;
        m_hi = num_m - 1;
        if (wr >= 0) {  // some row i sees the block's first key iff n_start <= i + off + right
            const int need = n_start - off - wr;  // the first row that may see it
            m_lo = need <= 0 ? 0 : need / BM;
        }
        if (wl >= 0) {  // ... and its last key iff n_start + BN - 1 >= i + off - left
            const int last = n_start + BN - 1 - off + wl;  // the last row that may see it
            m_hi = last < 0 ? -1 : min(m_hi, last / BM);
        }
        nm = max(0, m_hi - m_lo + 1);
        total = nm * p.group;
    }
    __device__ __forceinline__ int m_block(int it) const { return top_down ? m_hi - it % nm : m_lo + it % nm; }
    __device__ __forceinline__ int head(int it) const { return hkv * group + it / nm; }
    // Whether pair it's query block has key block n_block in its key range (the walk's blocks miss
    // it only at the range's rounded ends); `first` gets the range's first key block.
    __device__ __forceinline__ bool sees(const FwdParams& p, const SeqSpan& sq, int it, int n_block, int& first) const {
        const int m_start = m_block(it) * BM;
        const TileRange tiles = key_tiles<BN, CAUSAL>(p, sq, m_start, min(BM, sq.seqlen_q - m_start));
        first = tiles.first;
        return n_block >= tiles.first && n_block < tiles.first + tiles.count;
    }
};

// The key block, KV head and batch entry of a Hopper CTA, on a grid of (key blocks, KV heads,
// batch). Causal, the walks differ in length: key block 0 is seen by every query row, the last by
// the fewest. CTAs start in linear order (x fastest), so a causal CTA takes its coordinates from
// its linear index with the key block slowest: every head's block 0 first, then every head's
// block 1, and so on. The long walks start in the first wave and the last holds short ones (+4-8 %
// on an H200; deterministic causal GQA 1.5x, as its turns no longer wait on a late CTA). That
// order runs over (KV head, batch) pairs in groups of HEAVY_GROUP: with every pair in one order,
// a wave held one or two key blocks of 64+ pairs, whose CTAs share no query rows, and the dQ
// adds and Q/dO reads stopped hitting L2 (H200, causal, 64 pairs at head dim 256: 219 TFLOP/s
// against 307 at 32 pairs). Key block n still starts after every lower block of its head, so the
// turns (a block waits only on lower ones) cannot deadlock. Without a mask every walk is as long,
// and the grid's own order measured 3-5 % faster (the heads' dQ rows meet less in L2). The
// portable kernel keeps the grid's order: three more live registers spill its 128-wide build.
constexpr int HEAVY_GROUP = 32;

template <bool HEAVY_FIRST>
struct BwdBlock {
    int n_block, hkv, b;
    __device__ __forceinline__ BwdBlock() {
        if constexpr (HEAVY_FIRST) {
            const int pairs = gridDim.y * gridDim.z;
            const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            const int group = lin / (HEAVY_GROUP * gridDim.x);  // every group before the last is full
            const int first = group * HEAVY_GROUP;
            const int in_group = min(HEAVY_GROUP, pairs - first);
            const int r = lin - first * gridDim.x;
            n_block = r / in_group;
            const int pair = first + r % in_group;
            hkv = pair % gridDim.y;
            b = pair / gridDim.y;
        } else {
            n_block = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
        }
    }
};

// The row of (batch b, query head hq)'s first query in the LSE layout (bwd/params.cuh).
__device__ __forceinline__ long long bwd_lse_row0(const FwdParams& f, const SeqSpan& sq, int b, int hq) {
    return f.cu_seqlens_q != nullptr ? (long long)hq * f.seqlen_q + sq.q0 : ((long long)b * f.heads_q + hq) * f.seqlen_q;
}

}  // namespace cudattn
