// The Hopper backward's consumers (bwd_sm90.cuh): two warpgroups, 64 keys of the CTA's block each,
// walk the query blocks the producer loads. Per block, with wgmma:
//   S^T  = K.Q^T,  dP^T = V.dO^T    shared x shared (both K-major: the head dim is contiguous)
//   P^T, dS^T in registers           (bwd/scores.cuh: the accumulators have the mma.sync layout)
//   dV  += P^T.dO, dK += dS^T.Q      registers x shared (dO, Q MN-major), accumulated per CTA
//   dQ   = dS.K                      dS^T through shared memory (MN-major A); dQ's tile staged in
//                                    shared memory for the writer warp (bwd/sm90_dq_writer.cuh)
// dQ's BM x D tile is split between the warpgroups: by query rows where the block has 128 (head
// dim 64), by head-dim columns where it has 64 (head dim 128), so each reads a whole swizzle atom
// of dS^T or K. dV's product runs while dS is computed; dK's while dS^T is stored and the two
// warpgroups meet. K is the kernel (BwdSm90): its shape and barriers.
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
struct BwdSm90Consumer {
    typedef typename K::T T;
    typedef typename K::Barriers Barriers;
    static constexpr bool CAUSAL = K::CAUSAL;
    static constexpr int D = K::D, BM = K::BM, BN = K::BN, STAGES = K::STAGES, KB = K::KB;
    static constexpr int Q_BOX = K::Q_BOX, KV_BOX = K::KV_BOX, Q_BYTES = K::Q_BYTES, DS_BOX = K::DS_BOX;
    static constexpr int DS_BYTES = K::DS_BYTES;
    static constexpr bool DQ_BY_ROWS = BM == 128;    // else by columns
    static constexpr int DQ_N = DQ_BY_ROWS ? D : D / 2;  // dQ columns per warpgroup
    static_assert(DQ_N == 64, "dQ: one 64-column swizzle atom per warpgroup");
    static constexpr int BAR_DS = 1;  // a named barrier of the 256 consumer threads

    // acc(64 x D) += A(registers, 64 keys x BM queries) . B(BM query rows of a stage, MN-major):
    // 16 queries (2048 bytes of rows) per k-step.
    static __device__ __forceinline__ void issue_grad(float (&acc)[1][D / 8][4], const unsigned (&a)[BM / 16][4],
                                                      unsigned long long b) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T>::template rs<1>(flat<D>(acc), a[kk], b + kk * (2048 >> 4), true);
    }

    // fp32 accumulators -> the A operand of the next product (the warp's 16 rows, 16 columns a step).
    static __device__ __forceinline__ void to_operand(unsigned (&a)[BM / 16][4], const float (&s)[1][BM / 8][4]) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            a[kk][0] = pack2(s[0][2 * kk][0], s[0][2 * kk][1], T());
            a[kk][1] = pack2(s[0][2 * kk][2], s[0][2 * kk][3], T());
            a[kk][2] = pack2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1], T());
            a[kk][3] = pack2(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3], T());
        }
    }

    // This warp's dS^T rows into the tile (BN key rows; BM / 64 boxes of 64 queries, 128-byte rows
    // in the 128-byte swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8)). The tile is 1 KiB
    // aligned and r % 8 = g, so the swizzle is an XOR of the chunk bits into one base a row: no
    // address registers per store.
    static __device__ __forceinline__ void store_ds(unsigned tile, const unsigned (&a)[BM / 16][4], int row0,
                                                    int lane) {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned base = tile + (row0 + g + 8 * h) * 128 + (g << 4) + 4 * t;
#pragma unroll
            for (int mf = 0; mf < BM / 8; ++mf)  // query fragment: 8 columns, one 16-byte chunk
                st_shared((base ^ ((mf % 8) << 4)) + (mf / 8) * DS_BOX, a[mf / 2][2 * (mf % 2) + h]);
        }
    }

    static __device__ __forceinline__ void consume(const BwdSm90Params& P, Barriers& bars, const typename K::Smem& sm,
                                                   const BwdWalk<BM, BN, CAUSAL>& walk, const SeqSpan& sq, int n_block,
                                                   int b, int cw, int ltid) {
        const BwdParams& bp = P.p;
        const FwdParams& p = bp.f;
        const int warp = ltid / 32, lane = ltid % 32;
        const int n_start = n_block * BN;
        const int key_row0 = cw * 64 + warp * 16;  // this warp's first key row in the block
        const BwdMask mask = bwd_mask<CAUSAL>(p, sq);

        // Descriptors (a byte offset b is added as b >> 4). K-major: K and V rows of this warpgroup
        // as A, Q and dO rows as B. MN-major: Q and dO as B of dK and dV; dS^T as A and K as B of dQ.
        const unsigned long long k_a = smem_desc_sw128(sm.k + cw * 64 * 128, 16, 1024);
        const unsigned long long v_a = smem_desc_sw128(sm.v + cw * 64 * 128, 16, 1024);
        const unsigned long long q_b = smem_desc_sw128(sm.q, 16, 1024);
        const unsigned long long do_b = smem_desc_sw128(sm.dout, 16, 1024);
        const unsigned long long q_mn = smem_desc_sw128(sm.q, Q_BOX, 1024);
        const unsigned long long do_mn = smem_desc_sw128(sm.dout, Q_BOX, 1024);
        const unsigned long long ds_a = smem_desc_sw128(sm.ds + (DQ_BY_ROWS ? cw * DS_BOX : 0), DS_BOX, 1024);
        const unsigned long long k_mn = smem_desc_sw128(sm.k + (DQ_BY_ROWS ? 0 : cw * KV_BOX), KV_BOX, 1024);
        const int dq_row0 = (DQ_BY_ROWS ? cw * 64 : 0) + warp * 16, dq_col0 = DQ_BY_ROWS ? 0 : cw * 64;

        float dk[1][D / 8][4], dv[1][D / 8][4];
        zero<D>(dk);
        zero<D>(dv);

        mbar_wait(&bars.kv_full, 0);
        int used = 0;  // blocks that went through dS^T's double buffer
        for (int it = 0; it < walk.total; ++it) {
            const int st = it % STAGES;
            const int m_start = walk.m_block(it) * BM;
            const int rows = min(BM, sq.seqlen_q - m_start);
            int first;
            const bool seen = walk.sees(p, sq, it, n_block, first);
            mbar_wait(&bars.q_full[st], (it / STAGES) & 1);
            if (!seen) {
                warp_release(&bars.q_empty[st], lane);
                continue;
            }
            const bool masked = m_start + BM > sq.seqlen_q || tile_needs_mask<BN, CAUSAL>(p, sq, n_start, m_start, rows);
            float s[1][BM / 8][4], dp[1][BM / 8][4];
            wgmma_fence();
            issue_scores<T, BM, D, KV_BOX, Q_BOX>(s, k_a, q_b + st * (Q_BYTES >> 4));
            wgmma_commit();
            issue_scores<T, BM, D, KV_BOX, Q_BOX>(dp, v_a, do_b + st * (Q_BYTES >> 4));
            wgmma_commit();
            wgmma_wait<1>();
            fence_operands(flat<BM>(s));
            bwd_probs<0, 1, BM / 8>(s, s, sm.lse2 + st * BM, p.scale_log2, 0.f, 0.f, 0, n_start + key_row0, m_start,
                                    masked, mask, lane);
            unsigned pk[BM / 16][4], dsk[BM / 16][4];
            if constexpr (!DQ_BY_ROWS) {  // 64 x 64 scores: dV's product runs while dS is computed
                to_operand(pk, s);
                wgmma_fence();
                issue_grad(dv, pk, do_mn + st * (Q_BYTES >> 4));
                wgmma_commit();
                wgmma_wait<1>();  // dP^T is in; dV's product may still run
                fence_operands(flat<BM>(dp));
                bwd_dscores<0, 1, BM / 8>(dp, s, s, sm.dsum + st * BM, lane);
            } else {  // 64 x 128: P^T's operand beside both fp32 tiles would not fit in registers,
                      // nor dS^T's beside dP^T's with dV's product in flight: both operands first
                wgmma_wait<0>();
                fence_operands(flat<BM>(dp));
                bwd_dscores<0, 1, BM / 8>(dp, s, s, sm.dsum + st * BM, lane);
                to_operand(dsk, dp);
                to_operand(pk, s);
                wgmma_fence();
                issue_grad(dv, pk, do_mn + st * (Q_BYTES >> 4));
                wgmma_commit();
            }
            if constexpr (!DQ_BY_ROWS) to_operand(dsk, dp);
            const unsigned ds_tile = smem_u32(sm.ds) + (used & 1) * DS_BYTES;
            store_ds(ds_tile, dsk, key_row0, lane);
            wgmma_fence();
            issue_grad(dk, dsk, q_mn + st * (Q_BYTES >> 4));
            wgmma_commit();
            // dS^T complete from both warpgroups (and visible to wgmma) before dQ reads it. With two
            // buffers, the barrier also keeps a warpgroup from rewriting one the other still reads.
            fence_proxy_async_smem();
            named_sync(BAR_DS, 256);
            // dV's and dK's products done (they mostly are, behind the barrier): their register
            // operands free before dQ's accumulators are live.
            wgmma_wait<0>();
            fence_operands(flat<D>(dv));
            fence_operands(flat<D>(dk));
            float dq[1][DQ_N / 8][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                Wgmma<T>::template sst<1, 1>(flat<DQ_N>(dq), ds_a + (used & 1) * (DS_BYTES >> 4) + kk * (2048 >> 4),
                                             k_mn + kk * (2048 >> 4), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_operands(flat<D>(dv));
            fence_operands(flat<D>(dk));
            fence_operands(flat<DQ_N>(dq));
            warp_release(&bars.q_empty[st], lane);
            // dQ's part to the staging tile once the writer's last reduction has read it; the writer
            // (bwd/sm90_dq_writer.cuh) adds it into the accumulator.
            if (used > 0) mbar_wait(&bars.dq_empty, (used - 1) & 1);
            BwdSm90DqWriter<K>::template stage<DQ_N>(smem_u32(sm.dq), dq, dq_row0, dq_col0, lane);
            fence_proxy_async_smem();
            warp_release(&bars.dq_full, lane);
            ++used;
        }

        store_dk_dv<T, BN, D>(bp, sq, walk.hkv, b, n_start, key_row0, 0, dk, dv, lane);
    }
};

}  // namespace sm90
}  // namespace cudattn
