// The Hopper backward's dQ writer (bwd_sm90.cuh): one warp of the producer warpgroup adds each
// query block's dQ tile, staged in shared memory by the consumers (whole, or at head dim 256 in
// two passes of half its columns), into the float32 accumulator with TMA reductions (one per
// 32-column slab), so the consumers issue no atomics. Default: the reductions of different key
// blocks meet in L2 in any order. Deterministic: the key blocks that see a query block take turns
// by index (bwd/dq.cuh's counters): the writer waits for its turn, adds, waits until the adds are
// performed, and passes the turn on. Only the writer waits for a turn; the consumers wait for the
// staging tile, which at head dim 256 the writer hands back between a block's two passes, with
// the turn held.
#pragma once
#include "cudattn/bwd/sm90_params.cuh"
#include "cudattn/bwd/walk.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/tma.cuh"

namespace cudattn {
namespace sm90 {

template <class K>
struct BwdSm90DqWriter {
    typedef typename K::Barriers Barriers;
    static constexpr int BM = K::BM, BN = K::BN, D = K::D, PASSES = K::DQ_PASSES, SLABS = K::DQ_SLABS;

    // A consumer warp's part of the staging tile: 16 rows from row0, N columns from col0 (of the
    // staged ones), float32 in slabs of 32 columns x BM rows, 128-byte rows in the 128-byte swizzle
    // (the dQ map's boxes). Column 8i + 2t sits in chunk 2(i % 4) + t / 2 of slab i / 4, at byte
    // 8 (t % 2) of it.
    template <int N>
    static __device__ __forceinline__ void stage(unsigned tile, const float (&dq)[1][N / 8][4], int row0, int col0,
                                                 int lane) {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned base = tile + (col0 / 32) * (BM * 128) + (row0 + g + 8 * h) * 128 + (((t >> 1) ^ g) << 4) + 8 * (t & 1);
#pragma unroll
            for (int i = 0; i < N / 8; ++i)
                st_shared((base ^ ((i % 4) << 5)) + (i / 4) * (BM * 128), dq[0][i][2 * h], dq[0][i][2 * h + 1]);
        }
    }

    static __device__ __forceinline__ void write(const BwdSm90Params& P, Barriers& bars, const typename K::Smem& sm,
                                                 const BwdWalk<BM, BN, K::CAUSAL>& walk, const SeqSpan& sq, int n_block,
                                                 int b, int lane) {
        const FwdParams& p = P.p.f;
        const bool packed = p.cu_seqlens_q != nullptr;  // the map is one batch entry of all rows
        int used = 0;
        for (int it = 0; it < walk.total; ++it) {
            int first;
            if (!walk.sees(p, sq, it, n_block, first)) continue;
            const int hq = walk.head(it), m_block = walk.m_block(it);
#pragma unroll
            for (int pass = 0; pass < PASSES; ++pass) {  // deterministic: the turn held from the first to the last
                mbar_wait(&bars.dq_full, used & 1);
                if (lane == 0) {
                    int* counter = P.p.semaphores != nullptr
                                       ? P.p.semaphores + ((long long)b * p.heads_q + hq) * p.num_m_blocks + m_block
                                       : nullptr;
                    if (counter != nullptr && pass == 0) {
                        int v;
                        do {
                            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
                        } while (v != n_block - first);
                        fence_proxy_async_global();  // the reductions below (async proxy) after the acquire
                    }
#pragma unroll
                    for (int slab = 0; slab < SLABS; ++slab) {
                        // WIDE: head dims below the tile leave slabs of zeros (TMA's fill): not added
                        if (K::WIDE && K::dq_slab_col(slab, pass) >= p.head_dim) continue;
                        tma_reduce_add_4d(&P.tma_dq, sm.dq + slab * (BM * 128), K::dq_slab_col(slab, pass), hq,
                                          sq.q0 + m_block * BM, packed ? 0 : b);
                    }
                    bulk_commit();
                    bulk_wait_read<0>();  // the staging tile may be written again
                    mbar_arrive(&bars.dq_empty);
                    if (counter != nullptr && pass == PASSES - 1) {
                        bulk_wait<0>();  // the adds performed, then visible before the turn passes
                        fence_proxy_async_global();
                        __threadfence();
                        asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
                    }
                }
                __syncwarp();
                ++used;
            }
        }
        if (lane == 0) bulk_wait<0>();  // every reduction performed before the CTA's memory goes
    }
};

}  // namespace sm90
}  // namespace cudattn
