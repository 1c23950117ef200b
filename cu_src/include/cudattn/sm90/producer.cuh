// The Hopper forward kernel's producer mainloop (fwd_sm90.cuh): one warp of warpgroup 0 walks the
// CTA's tiles (tile_scheduler.cuh) and issues the TMA loads of Q into its ring and of the K and V
// tiles into the STAGES-deep ring, each stage completing on its "full" mbarrier once the consumers
// have handed it back through its "empty" one. K is the kernel (FwdSm90): its shape and barriers.
#pragma once
#include "cudattn/mask.cuh"
#include "cudattn/sm90/params.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/tile_scheduler.cuh"
#include "cudattn/sm90/tma.cuh"

namespace cudattn {
namespace sm90 {

template <class K>
struct Sm90Producer {
    typedef typename K::Barriers Barriers;
    static constexpr bool FP8 = K::FP8, CAUSAL = K::CAUSAL, WINDOW = K::WINDOW;
    static constexpr int BM = K::BM, BN = K::BN, STAGES = K::STAGES, Q_STAGES = K::Q_STAGES, SW = K::SW;
    static constexpr int CONSUMERS = K::CONSUMERS;
    static constexpr bool SKIP_UNSEEN = K::SKIP_UNSEEN;
    static constexpr int KB = K::KB, BOX_COLS = K::BOX_COLS, Q_BOX = K::Q_BOX, KV_BOX = K::KV_BOX;
    static constexpr int VT_BOX = K::VT_BOX, VT_BOXES = K::VT_BOXES;
    static constexpr int Q_BYTES = K::Q_BYTES, KV_BYTES = K::KV_BYTES, V_BYTES = K::V_BYTES;

    // One warp walks the tiles; lane 0 issues every load. The other lanes only help a paged
    // cache: each reads one page id of a key tile, all at once (one latency, not one per page).
    static __device__ __forceinline__ void produce(const FwdSm90Params& P, Barriers& bars, unsigned char* sQ,
                                                   unsigned char* sK, unsigned char* sV, int lane) {
        const bool leader = lane == 0;
        const FwdParams& p = P.p;
        const int total = p.num_m_blocks * p.heads_q * p.batch;
        // Packed (variable-length) operands are maps of one batch entry: their batch coordinate is 0.
        const int q_b = p.cu_seqlens_q == nullptr, k_b = p.cu_seqlens_k == nullptr;
        const bool paged = p.kv.block_table != nullptr;
        const int page_rows = paged ? paged_box_rows(p.kv.page_size) : BN;
        int it = 0;  // K/V tiles loaded so far by this CTA: ring stage and phase
        int nq = 0;  // tiles whose Q was loaded (the Q ring's stage and phase)
        int* const counter = P.tile_counter;  // given (tiles of uneven lengths): the dynamic order
        int t = blockIdx.x;  // (either order: a CTA's first tile is its own)
        for (int n = 0;; ++n) {
            if (counter == nullptr)
                t = tile_of_round<CAUSAL>(n);
            else if (n > 0)
                t = __shfl_sync(0xffffffffu, leader ? take_tile(counter) : 0, 0);
            if (t >= total) break;
            const TileCoord c = tile_at<CAUSAL>(t, p, P.tile_order);
            const SeqSpan sq = seq_span(p, c.b);
            const int m_start = c.m_block * BM;
            if (m_start >= sq.seqlen_q) continue;  // past a shorter sequence's end: no tile
            const TileRange tiles = key_tiles<BN, CAUSAL, WINDOW>(p, sq, m_start, min(BM, sq.seqlen_q - m_start));
            // Q ring: with two stages, tile nq's Q loads while the consumers still work on tile nq-1.
            const int qs = nq % Q_STAGES;
            if (nq >= Q_STAGES) mbar_wait(&bars.q_empty[qs], ((nq / Q_STAGES) - 1) & 1);
            ++nq;
            if (leader) {
                auto& m = bars.tile[qs];  // seen once q_full completes
                static_cast<TileMsg&>(m) = TileMsg{c.b, c.h, c.m_block, tiles.first, tiles.count};
                if constexpr (SKIP_UNSEEN) {  // each consumer's own key range (its 64 rows'), at the top
#pragma unroll
                    for (int w = 0; w < CONSUMERS; ++w) {
                        const int row0 = m_start + 64 * w;
                        const TileRange mine = row0 < sq.seqlen_q
                            ? key_tiles<BN, CAUSAL, WINDOW>(p, sq, row0, min(64, sq.seqlen_q - row0)) : TileRange{0, 0};
                        m.unseen[w] = mine.count > 0 ? tiles.first + tiles.count - (mine.first + mine.count) : tiles.count;
                    }
                }
                mbar_arrive_expect_tx(&bars.q_full[qs], Q_BYTES);
#pragma unroll
                for (int kb = 0; kb < KB; ++kb)
                    tma_load_4d(sQ + qs * Q_BYTES + kb * Q_BOX, &P.tma_q, BOX_COLS * kb, sq.q0 + m_start, c.h,
                                c.b * q_b, &bars.q_full[qs]);
            }

            const int hkv = c.h / p.group;
            const int n_tiles = tiles.count;
            const long long vt0 = FP8 ? vt_first_key(p, sq, c.b) : 0;
            for (int j = 0; j < n_tiles; ++j, ++it) {  // from the last key tile (tail, diagonal) down
                const int n_start = tiles.start(j) * BN;
                const int st = it % STAGES;
                const unsigned ph = (it / STAGES) & 1;
                // Paged: lane i holds the page of the tile's i-th box (K and V share them), read
                // before the wait for a free stage so that its latency hides behind it.
                const int page = (!FP8 && paged && lane * page_rows < BN) ? cache_page(p.kv, c.b, n_start + lane * page_rows) : 0;
                if (it >= STAGES) mbar_wait(&bars.k_empty[st], ph ^ 1);
                if (leader) mbar_arrive_expect_tx(&bars.k_full[st], KV_BYTES);
                if (!FP8 && paged) {
                    load_pages(sK + st * KV_BYTES, &P.tma_k, p.kv.page_size, page_rows, page, n_start, hkv,
                               &bars.k_full[st], leader);
                } else if (leader) {
#pragma unroll
                    for (int kb = 0; kb < KB; ++kb)
                        tma_load_4d(sK + st * KV_BYTES + kb * KV_BOX, &P.tma_k, BOX_COLS * kb, sq.k0 + n_start, hkv,
                                    c.b * k_b, &bars.k_full[st]);
                }
                if (it >= STAGES) mbar_wait(&bars.v_empty[st], ph ^ 1);
                if (leader) mbar_arrive_expect_tx(&bars.v_full[st], V_BYTES);
                if (!FP8 && paged)
                    load_pages(sV + st * V_BYTES, &P.tma_v, p.kv.page_size, page_rows, page, n_start, hkv,
                               &bars.v_full[st], leader);
                else if (leader)
                    load_v(P, sV + st * V_BYTES, FP8 ? (int)(vt0 + n_start) : sq.k0 + n_start, hkv, c.b * k_b,
                           &bars.v_full[st]);
            }
        }
        // No tile left: the consumers learn it from the next Q stage (arrived on, no bytes).
        const int qs = nq % Q_STAGES;
        if (nq >= Q_STAGES) mbar_wait(&bars.q_empty[qs], ((nq / Q_STAGES) - 1) & 1);
        if (leader) {
            static_cast<TileMsg&>(bars.tile[qs]) = TileMsg{0, 0, 0, 0, -1};
            mbar_arrive(&bars.q_full[qs]);
            if (counter != nullptr) tiles_taken(counter);
        }
    }

    // Rows of one TMA box of a paged cache: the largest run of keys that is whole in one page and
    // divides the key tile (the host encodes the maps with the same rule: _plan.paged_box_rows).
    static __device__ __forceinline__ int paged_box_rows(int page_size) {
        int a = page_size, b = BN;
        while (b != 0) {
            const int t = a % b;
            a = b;
            b = t;
        }
        return a;
    }

    // One K or V stage of a paged cache (16-bit): BN / rows (at most BN / 16 <= 16) boxes down the
    // tile, each from its own page (the maps are 4-D over (head dim, row in page, head, page)). rows is a multiple of
    // 16 (page sizes and key tiles are), so every box starts on a whole 1 KiB swizzle atom.
    // Called by the whole producer warp: lane i holds the page of box i (lane_page).
    static __device__ __forceinline__ void load_pages(unsigned char* dst, const TmaDescriptor* map, int page_size,
                                                      int rows, int lane_page, int n_start, int hkv,
                                                      unsigned long long* bar, bool leader) {
        for (int i = 0, r0 = 0; r0 < BN; ++i, r0 += rows) {
            const int page = __shfl_sync(0xffffffffu, lane_page, i);
            const int row = (n_start + r0) % page_size;
            if (leader) {
#pragma unroll
                for (int kb = 0; kb < KB; ++kb)
                    tma_load_4d(dst + kb * KV_BOX + r0 * SW, map, BOX_COLS * kb, row, hkv, page, bar);
            }
        }
    }

    // One V stage. 16-bit: KB boxes of 64 columns x BN keys (MN-major for the product). FP8: Vt,
    // BN / 128 boxes of D head-dim rows x 128 keys (K-major); Vt's rows past the head dim and keys
    // past its padded length are outside the map, so TMA zero-fills them. n_start: the map's row
    // (16-bit) or key (Vt) coordinate of the tile's first key.
    static __device__ __forceinline__ void load_v(const FwdSm90Params& P, unsigned char* dst, int n_start, int hkv,
                                                  int b, unsigned long long* bar) {
        if constexpr (FP8) {
#pragma unroll
            for (int kb = 0; kb < VT_BOXES; ++kb) tma_load_4d(dst + kb * VT_BOX, &P.tma_v, n_start + 128 * kb, 0, hkv, b, bar);
        } else {
#pragma unroll
            for (int kb = 0; kb < KB; ++kb) tma_load_4d(dst + kb * KV_BOX, &P.tma_v, BOX_COLS * kb, n_start, hkv, b, bar);
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
