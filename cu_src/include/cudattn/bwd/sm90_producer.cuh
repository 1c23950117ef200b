// The Hopper backward's producers (bwd_sm90.cuh): one warp loads the CTA's K and V block once, then
// walks its query blocks (bwd/walk.cuh), loading Q and dO by TMA into a STAGES-deep ring (at head
// dim 256 dO has one stage of its own, with its own "full" and "empty" mbarriers); another
// stores the blocks' lse2 and D rows beside them with plain loads. A stage completes on its "full"
// mbarrier: the TMA bytes and the first warp's arrival, plus one arrival of each lane of the other
// after its stores (release order); the consumers hand it back through its "empty" one. K is the
// kernel (BwdSm90): its shape and barriers.
#pragma once
#include "cudattn/bwd/sm90_params.cuh"
#include "cudattn/bwd/walk.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/tma.cuh"

namespace cudattn {
namespace sm90 {

template <class K>
struct BwdSm90Producer {
    typedef typename K::Barriers Barriers;
    static constexpr int BM = K::BM, BN = K::BN, KB = K::KB, STAGES = K::STAGES;
    static constexpr int Q_BOX = K::Q_BOX, KV_BOX = K::KV_BOX, Q_BYTES = K::Q_BYTES, KV_BYTES = K::KV_BYTES;

    static __device__ __forceinline__ void produce(const BwdSm90Params& P, Barriers& bars, const typename K::Smem& sm,
                                                   const BwdWalk<BM, BN, K::CAUSAL>& walk, const SeqSpan& sq, int n_start,
                                                   int b, int lane) {
        const FwdParams& p = P.p.f;
        const bool leader = lane == 0;
        // Packed (variable-length) operands are maps of one batch entry: their batch coordinate is 0.
        const int qb = p.cu_seqlens_q == nullptr ? b : 0, kb_ = p.cu_seqlens_k == nullptr ? b : 0;
        if (leader) {
            mbar_arrive_expect_tx(&bars.kv_full, 2 * KV_BYTES);
#pragma unroll
            for (int kb = 0; kb < KB; ++kb) {
                tma_load_4d(sm.k + kb * KV_BOX, &P.tma_k, 64 * kb, sq.k0 + n_start, walk.hkv, kb_, &bars.kv_full);
                tma_load_4d(sm.v + kb * KV_BOX, &P.tma_v, 64 * kb, sq.k0 + n_start, walk.hkv, kb_, &bars.kv_full);
            }
        }
        int seen = 0;  // WIDE: blocks whose dO was loaded (the others' is not: the consumers skip them)
        for (int it = 0; it < walk.total; ++it) {
            const int s = it % STAGES;
            if (it >= STAGES) mbar_wait(&bars.q_empty[s], ((it / STAGES) - 1) & 1);
            const int hq = walk.head(it), m_start = walk.m_block(it) * BM;
            if constexpr (K::DO_STAGES == STAGES) {  // Q and dO share the stage
                if (leader) {
                    mbar_arrive_expect_tx(&bars.q_full[s], 2 * Q_BYTES);
#pragma unroll
                    for (int kb = 0; kb < KB; ++kb) {
                        tma_load_4d(sm.q + s * Q_BYTES + kb * Q_BOX, &P.tma_q, 64 * kb, sq.q0 + m_start, hq, qb,
                                    &bars.q_full[s]);
                        tma_load_4d(sm.dout + s * Q_BYTES + kb * Q_BOX, &P.tma_do, 64 * kb, sq.q0 + m_start, hq, qb,
                                    &bars.q_full[s]);
                    }
                }
            } else {  // dO's one stage, once the consumers' dV product of the block before has read it
                static_assert(K::DO_STAGES == 1, "dO: a stage a block, or one");
                if (leader) {
                    mbar_arrive_expect_tx(&bars.q_full[s], Q_BYTES);
#pragma unroll
                    for (int kb = 0; kb < KB; ++kb)
                        tma_load_4d(sm.q + s * Q_BYTES + kb * Q_BOX, &P.tma_q, 64 * kb, sq.q0 + m_start, hq, qb,
                                    &bars.q_full[s]);
                }
                int first;
                if (walk.sees(p, sq, it, n_start / BN, first)) {
                    if (seen >= 1) mbar_wait(&bars.do_empty, (seen - 1) & 1);
                    if (leader) {
                        mbar_arrive_expect_tx(&bars.do_full, Q_BYTES);
#pragma unroll
                        for (int kb = 0; kb < KB; ++kb)
                            tma_load_4d(sm.dout + kb * Q_BOX, &P.tma_do, 64 * kb, sq.q0 + m_start, hq, qb, &bars.do_full);
                    }
                    ++seen;
                }
            }
        }
    }

    // Another warp of the producer warpgroup: each block's lse2 and D rows into the stage beside
    // its Q and dO (a warp of its own: the TMA warp's 24 registers hold no more).
    static __device__ __forceinline__ void load_rows(const BwdSm90Params& P, Barriers& bars, const typename K::Smem& sm,
                                                     const BwdWalk<BM, BN, K::CAUSAL>& walk, const SeqSpan& sq, int b,
                                                     int lane) {
        const FwdParams& p = P.p.f;
        for (int it = 0; it < walk.total; ++it) {
            const int s = it % STAGES;
            if (it >= STAGES) mbar_wait(&bars.q_empty[s], ((it / STAGES) - 1) & 1);
            const int m_start = walk.m_block(it) * BM;
            const int rows = min(BM, sq.seqlen_q - m_start);
            const long long row0 = bwd_lse_row0(p, sq, b, walk.head(it)) + m_start;
            const unsigned l_dst = smem_u32(sm.lse2 + s * BM), d_dst = smem_u32(sm.dsum + s * BM);
#pragma unroll
            for (int r = lane; r < BM; r += 32) {  // rows past the sequence repeat its last (masked)
                const int i = min(r, rows - 1);
                st_shared(l_dst + 4 * r, __float_as_uint(P.p.lse2[row0 + i]));
                st_shared(d_dst + 4 * r, __float_as_uint(P.p.dsum[row0 + i]));
            }
            mbar_arrive(&bars.q_full[s]);  // release: the stores before the consumers' wait returns
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
