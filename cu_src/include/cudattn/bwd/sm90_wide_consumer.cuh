// The Hopper backward's consumers at head dim 256 (bwd_sm90.cuh, WIDE). dK and dV of 64 keys x 256
// columns would take 256 registers a thread, so the two warpgroups split the head dim, not the
// keys: each holds dK and dV of all 64 keys of the block for its 128 columns. The scores are split
// by queries instead: warpgroup w computes S^T and dP^T for queries 32w..32w+31 of the 64-row
// block, and P^T and dS^T go through shared tiles that both read. Per block, with wgmma:
//   S^T  = K.Q^T,  dP^T = V.dO^T    shared x shared, 64 keys x 32 queries (both K-major)
//   P^T, dS^T in registers          (bwd/scores.cuh), then 16-bit into two 64 x 64 tiles
//   dV  += P^T.dO, dK += dS^T.Q      shared x shared (P^T, dS^T K-major; dO, Q MN-major), 64 x 128
//   dQ   = dS.K                      shared x shared (dS^T MN-major; K MN-major), 64 x 128
// dQ goes to the writer warp (bwd/sm90_dq_writer.cuh) through a staging tile of half its columns,
// in two passes of 64 columns a warpgroup: dO keeps a single stage to make room for it, handed back
// as soon as dV's product has read it. The second pass is staged during the next block, after its
// scores, so that the writer has read the first by then. K is the kernel (BwdSm90): its shape and
// barriers.
#pragma once
#include "cudattn/bwd/scores.cuh"
#include "cudattn/bwd/sm90_consumer_common.cuh"
#include "cudattn/bwd/sm90_dq_writer.cuh"
#include "cudattn/bwd/sm90_params.cuh"
#include "cudattn/bwd/walk.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/wgmma.cuh"

namespace cudattn {
namespace sm90 {

template <class K>
struct BwdSm90WideConsumer {
    typedef typename K::T T;
    typedef typename K::Barriers Barriers;
    static constexpr bool CAUSAL = K::CAUSAL;
    static constexpr int D = K::D, BM = K::BM, BN = K::BN, STAGES = K::STAGES;
    static constexpr int Q_BOX = K::Q_BOX, KV_BOX = K::KV_BOX, Q_BYTES = K::Q_BYTES, PDS_BYTES = K::DS_BYTES;
    static_assert(BM == 64 && BN == 64 && D == 256, "64 x 64 blocks: P^T and dS^T one 128-byte swizzle atom wide");
    static constexpr int QW = BM / 2;  // queries of the scores a warpgroup computes
    static constexpr int DW = D / 2;   // head-dim columns of dK, dV and dQ a warpgroup holds
    static constexpr int DQ_N = 64;    // dQ columns a warpgroup stages a pass
    static_assert(K::DQ_PASSES * DQ_N == DW && K::DO_STAGES == 1, "two passes of dQ, one stage of dO");
    static constexpr int BAR_PDS = 1;  // a named barrier of the 256 consumer threads

    // acc(64 keys x DW) += A(a P^T or dS^T tile: 64 keys x BM queries, K-major) . B(BM query rows
    // of a stage, MN-major, this warpgroup's DW columns): 16 queries a k-step.
    static __device__ __forceinline__ void issue_grad(float (&acc)[1][DW / 8][4], unsigned long long a,
                                                      unsigned long long b) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
            Wgmma<T>::template sst<0, 1>(flat<DW>(acc), a + kk * (32 >> 4), b + kk * (2048 >> 4), true);
    }

    // This warp's 16 key rows of x (this warpgroup's QW queries) into a 64 x 64 tile, 16-bit:
    // 128-byte rows, 16-byte chunk c of row r at chunk c ^ (r % 8). The tile is 1 KiB aligned and
    // r % 8 = g, so the swizzle is an XOR of the chunk into one base a row.
    static __device__ __forceinline__ void store_tile(unsigned tile, const float (&x)[1][QW / 8][4], int row0,
                                                      int chunk0, int lane) {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned base = tile + (row0 + g + 8 * h) * 128 + (g << 4) + 4 * t;
#pragma unroll
            for (int mf = 0; mf < QW / 8; ++mf)
                st_shared(base ^ ((chunk0 + mf) << 4), pack2(x[0][mf][2 * h], x[0][mf][2 * h + 1], T()));
        }
    }

    static __device__ __forceinline__ void consume(const BwdSm90Params& P, Barriers& bars, const typename K::Smem& sm,
                                                   const BwdWalk<BM, BN, CAUSAL>& walk, const SeqSpan& sq, int n_block,
                                                   int b, int cw, int ltid) {
        const BwdParams& bp = P.p;
        const FwdParams& p = bp.f;
        const int warp = ltid / 32, lane = ltid % 32;
        const int n_start = n_block * BN;
        const int key_row0 = warp * 16;  // this warp's first key row in the block (both warpgroups: all 64)
        const BwdMask mask = bwd_mask<CAUSAL>(p, sq);

        // Descriptors (a byte offset b is added as b >> 4). K-major: K and V as A, this warpgroup's
        // QW rows of Q and dO as B of the scores; P^T and dS^T as A of dV and dK. MN-major: this
        // warpgroup's columns of dO and Q (B of dV, dK) and of K (B of dQ); dS^T as A of dQ.
        const unsigned long long k_a = smem_desc_sw128(sm.k, 16, 1024);
        const unsigned long long v_a = smem_desc_sw128(sm.v, 16, 1024);
        const unsigned long long q_b = smem_desc_sw128(sm.q + cw * QW * 128, 16, 1024);
        const unsigned long long do_b = smem_desc_sw128(sm.dout + cw * QW * 128, 16, 1024);  // dO: one stage
        const unsigned long long q_mn = smem_desc_sw128(sm.q + cw * (DW / 64) * Q_BOX, Q_BOX, 1024);
        const unsigned long long do_mn = smem_desc_sw128(sm.dout + cw * (DW / 64) * Q_BOX, Q_BOX, 1024);
        const unsigned long long k_mn = smem_desc_sw128(sm.k + cw * (DW / 64) * KV_BOX, KV_BOX, 1024);  // + a box a pass
        const unsigned long long p_a = smem_desc_sw128(sm.p, 16, 1024);
        const unsigned long long ds_a = smem_desc_sw128(sm.ds, 16, 1024);
        const unsigned long long ds_mn = smem_desc_sw128(sm.ds, K::DS_BOX, 1024);
        const unsigned dq_tile = smem_u32(sm.dq);

        float dk[1][DW / 8][4], dv[1][DW / 8][4];
        zero<DW>(dk);
        zero<DW>(dv);

        // dQ's second pass of the last block, until it is staged during the next (or after the walk)
        float dq1[1][DQ_N / 8][4];
        bool pending = false;
        int staged = 0;  // passes through the staging tile
        // Stages a pass once the writer has read the one before (the tile is single).
        auto stage = [&](const float (&dq)[1][DQ_N / 8][4]) {
            if (staged > 0) mbar_wait(&bars.dq_empty, (staged - 1) & 1);
            BwdSm90DqWriter<K>::template stage<DQ_N>(dq_tile, dq, warp * 16, cw * DQ_N, lane);
            fence_proxy_async_smem();  // the stores before the writer's reductions (async proxy) read them
            warp_release(&bars.dq_full, lane);
            ++staged;
        };

        mbar_wait(&bars.kv_full, 0);
        int used = 0;  // blocks that went through the P^T and dS^T double buffers
        for (int it = 0; it < walk.total; ++it) {
            const int st = it % STAGES;
            const int m_start = walk.m_block(it) * BM;
            const int rows = min(BM, sq.seqlen_q - m_start);
            int first;
            const bool seen = walk.sees(p, sq, it, n_block, first);
            mbar_wait(&bars.q_full[st], (it / STAGES) & 1);
            if (!seen) {  // its dO was not loaded (bwd/sm90_producer.cuh)
                warp_release(&bars.q_empty[st], lane);
                continue;
            }
            const bool masked = m_start + BM > sq.seqlen_q || tile_needs_mask<BN, CAUSAL>(p, sq, n_start, m_start, rows);
            float s[1][QW / 8][4], dp[1][QW / 8][4];
            wgmma_fence();
            issue_scores<T, QW, D, KV_BOX, Q_BOX>(s, k_a, q_b + st * (Q_BYTES >> 4));
            wgmma_commit();
            mbar_wait(&bars.do_full, used & 1);
            issue_scores<T, QW, D, KV_BOX, Q_BOX>(dp, v_a, do_b);
            wgmma_commit();
            wgmma_wait<1>();
            fence_operands(flat<QW>(s));
            bwd_probs<0, 1, QW / 8>(s, s, sm.lse2 + st * BM + cw * QW, p.scale_log2, 0.f, 0.f, 0, n_start + key_row0,
                                    m_start + cw * QW, masked, mask, lane);
            // Both tiles double-buffered: the barrier of the block before, one a block, orders these
            // stores after the other warpgroup's products of two blocks back (it waited for them
            // before arriving there).
            const unsigned buf = (used & 1) * PDS_BYTES;
            store_tile(smem_u32(sm.p) + buf, s, key_row0, cw * (QW / 8), lane);
            wgmma_wait<0>();
            fence_operands(flat<QW>(dp));
            bwd_dscores<0, 1, QW / 8>(dp, s, s, sm.dsum + st * BM + cw * QW, lane);
            store_tile(smem_u32(sm.ds) + buf, dp, key_row0, cw * (QW / 8), lane);
            if (pending) {  // the block before's second pass: the writer has read its first by now
                stage(dq1);
                pending = false;
            }
            fence_proxy_async_smem();  // the generic stores before wgmma (async proxy) reads them
            named_sync(BAR_PDS, 256);
            // dV, dK, then dQ's two passes (this warpgroup's columns of K: a box each), in groups of
            // their own so that dO and Q go back as soon as their last products have read them.
            float dq0[1][DQ_N / 8][4];
            wgmma_fence();
            issue_grad(dv, p_a + (buf >> 4), do_mn);
            wgmma_commit();
            issue_grad(dk, ds_a + (buf >> 4), q_mn + st * (Q_BYTES >> 4));
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                Wgmma<T>::template sst<1, 1>(flat<DQ_N>(dq0), ds_mn + (buf >> 4) + kk * (2048 >> 4),
                                             k_mn + kk * (2048 >> 4), kk > 0);
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                Wgmma<T>::template sst<1, 1>(flat<DQ_N>(dq1), ds_mn + (buf >> 4) + kk * (2048 >> 4),
                                             k_mn + (KV_BOX >> 4) + kk * (2048 >> 4), kk > 0);
            wgmma_commit();
            wgmma_wait<3>();
            fence_operands(flat<DW>(dv));
            warp_release(&bars.do_empty, lane);
            wgmma_wait<1>();
            fence_operands(flat<DW>(dk));
            fence_operands(flat<DQ_N>(dq0));
            warp_release(&bars.q_empty[st], lane);
            stage(dq0);
            wgmma_wait<0>();
            fence_operands(flat<DQ_N>(dq1));
            pending = true;
            ++used;
        }
        if (pending) stage(dq1);

        store_dk_dv<T, BN, DW>(bp, sq, walk.hkv, b, n_start, key_row0, cw * DW, dk, dv, lane);
    }
};

}  // namespace sm90
}  // namespace cudattn
