// The Hopper backward's dQ writer (bwd_sm90.cuh): one warp of the producer warpgroup adds each
// query block's dQ tile, staged in shared memory by the consumers, into the float32 accumulator
// with TMA reductions (one per 32-column slab), so the consumers issue no atomics. Default: the
// reductions of different key blocks meet in L2 in any order. Deterministic: the key blocks that
// see a query block take turns by index (bwd/dq.cuh's counters): the writer waits for its turn,
// adds, waits until the adds are performed, and passes the turn on; only the writer waits.
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
    static constexpr int BM = K::BM, BN = K::BN, D = K::D;

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
            mbar_wait(&bars.dq_full, used & 1);
            if (lane == 0) {
                int* counter = P.p.semaphores != nullptr
                                   ? P.p.semaphores + ((long long)b * p.heads_q + hq) * p.num_m_blocks + m_block
                                   : nullptr;
                if (counter != nullptr) {
                    int v;
                    do {
                        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
                    } while (v != n_block - first);
                    fence_proxy_async_global();  // the reductions below (async proxy) after the acquire
                }
#pragma unroll
                for (int slab = 0; slab < D / 32; ++slab)
                    tma_reduce_add_4d(&P.tma_dq, sm.dq + slab * (BM * 128), 32 * slab, hq, sq.q0 + m_block * BM,
                                      packed ? 0 : b);
                bulk_commit();
                if (counter != nullptr) {
                    bulk_wait<0>();  // the adds performed, then visible before the turn passes
                    fence_proxy_async_global();
                    __threadfence();
                    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
                } else {
                    bulk_wait_read<0>();  // the staging tile may be written again
                }
                mbar_arrive(&bars.dq_empty);
            }
            __syncwarp();
            ++used;
        }
        if (lane == 0) bulk_wait<0>();  // every reduction performed before the CTA's memory goes
    }
};

}  // namespace sm90
}  // namespace cudattn
