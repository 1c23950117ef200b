// FlashAttention-3-style backward for Hopper (sm_90a): TMA, wgmma and warp specialization. One CTA
// owns BN keys of one KV head (grid: key blocks x KV heads x batch) and walks every query block
// that sees them, for each query head of the group (bwd/walk.cuh), as the portable kernel
// (bwd_sm80.cuh) does; the products are those of bwd_sm80.cuh on wgmma. 1 + 2 warpgroups:
//   warpgroup 0: two producer warps (bwd/sm90_producer.cuh) load K and V once, then Q, dO and
//     the blocks' lse2 and D rows into a two-stage ring; the dQ writer warp
//     (bwd/sm90_dq_writer.cuh) adds each block's dQ tile into the float32 accumulator with TMA
//     reductions (in key-block turns when deterministic);
//   warpgroups 1 and 2, the consumers: dK and dV stay in registers for the whole walk.
// Head dims 64 and 128 (bwd/sm90_consumer.cuh): BN = 128 keys, 64 a consumer; query blocks of 128
// rows at 64 (S^T and dP^T of 64 x 128 beside dK and dV of 64 x 64), 64 at 128 (dK and dV of
// 64 x 128 leave room for 64 x 64 scores); dQ's tile goes to shared memory for the writer.
// Head dim 256 (WIDE, bwd/sm90_wide_consumer.cuh): 64 x 64 blocks, the consumers split the head
// dim and share P^T and dS^T through shared memory; dO keeps one stage, which leaves room to stage
// half of dQ's tile at a time for the writer (two passes a block).
// The row-wise passes (bwd/rows.cuh) are the portable kernel's.
#pragma once
#include "cudattn/bwd/sm90_consumer.cuh"
#include "cudattn/bwd/sm90_dq_writer.cuh"
#include "cudattn/bwd/sm90_params.cuh"
#include "cudattn/bwd/sm90_producer.cuh"
#include "cudattn/bwd/sm90_wide_consumer.cuh"
#include "cudattn/bwd/walk.cuh"
#include "cudattn/sm90/sync.cuh"

namespace cudattn {
namespace sm90 {

// WIDE: dO's own stage has mbarriers of its own (an empty base elsewhere: no shared memory).
template <bool>
struct BwdDoBarriers {};
template <>
struct BwdDoBarriers<true> {
    unsigned long long do_full, do_empty;
};

template <typename T_, int D_, bool CAUSAL_>
struct BwdSm90 {
    typedef T_ T;
    static constexpr int D = D_;
    static constexpr bool CAUSAL = CAUSAL_;
    static_assert(D == 64 || D == 128 || D == 256, "head-dim tiles of 64, 128 or 256");
    static constexpr bool WIDE = D == 256;  // the consumers split the head dim (bwd/sm90_wide_consumer.cuh)
    static constexpr int BM = D == 64 ? 128 : 64, BN = WIDE ? 64 : 128, STAGES = 2;
    static constexpr int NT = 384;  // the producer warpgroup + two consumers
    static constexpr int KB = D / 64;               // 128-byte boxes per Q/K/V/dO row
    static constexpr int Q_BOX = BM * 128, KV_BOX = BN * 128;
    static constexpr int Q_BYTES = KB * Q_BOX, KV_BYTES = KB * KV_BOX;  // one tile of Q or dO; of K or V
    static constexpr int DS_BOX = BN * 128, DS_BYTES = BM / 64 * DS_BOX;  // dS^T (and WIDE, P^T): BN key rows, boxes of 64 queries
    static constexpr int DO_STAGES = WIDE ? 1 : STAGES;  // WIDE: dO handed back after dV's product
    // dQ's float32 tile for the writer, staged DQ_PASSES times a block: slabs of 32 columns x BM
    // rows (the dQ map's boxes); dq_slab_col gives a slab's column in the head dim
    static constexpr int DQ_PASSES = WIDE ? 2 : 1, DQ_SLABS = D / DQ_PASSES / 32;
    static constexpr int DQ_BYTES = DQ_SLABS * BM * 128;
    static constexpr int SMEM_BYTES = 2 * KV_BYTES + (STAGES + DO_STAGES) * Q_BYTES + (WIDE ? 4 : 2) * DS_BYTES +
                                      DQ_BYTES + 2 * STAGES * BM * 4 + 1024;
    // WIDE: each consumer's 64 columns of a pass, consumer w's at slabs 2w and 2w + 1.
    static __device__ __forceinline__ constexpr int dq_slab_col(int slab, int pass) {
        return WIDE ? (slab / 2) * (D / 2) + pass * 64 + (slab % 2) * 32 : 32 * slab;
    }
    // Registers a thread after setmaxnreg: the launch holds 384 x 168; 128 x 24 + 256 x 240 is the
    // same total (the consumers' increase waits until the producers have given that many back).
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;

    struct Barriers : BwdDoBarriers<WIDE> {
        unsigned long long kv_full, q_full[STAGES], q_empty[STAGES], dq_full, dq_empty;
    };
    struct Smem {
        unsigned char *k, *v, *q, *dout, *ds, *p, *dq;  // 1 KiB aligned (swizzle atoms); p: WIDE only
        float *lse2, *dsum;                   // STAGES x BM each
    };

    static __device__ __forceinline__ void run(const BwdSm90Params& P) {
        extern __shared__ unsigned char smem_raw[];
        __shared__ Barriers bars;
        const FwdParams& p = P.p.f;
        const BwdBlock<CAUSAL> blk;
        const int n_block = blk.n_block, hkv = blk.hkv, b = blk.b;
        const SeqSpan sq = seq_span(p, b);
        const int n_start = n_block * BN;
        if (n_start >= sq.seqlen_k) return;  // the grid covers the longest sequence (uniform: the whole CTA)

        Smem sm;
        sm.k = reinterpret_cast<unsigned char*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
        sm.v = sm.k + KV_BYTES;
        sm.q = sm.v + KV_BYTES;
        sm.dout = sm.q + STAGES * Q_BYTES;
        sm.ds = sm.dout + DO_STAGES * Q_BYTES;
        sm.p = sm.ds + 2 * DS_BYTES;
        sm.dq = sm.p + (WIDE ? 2 * DS_BYTES : 0);
        sm.lse2 = reinterpret_cast<float*>(sm.dq + DQ_BYTES);
        sm.dsum = sm.lse2 + STAGES * BM;

        if (threadIdx.x == 0) {
            mbar_init(&bars.kv_full, 1);
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(&bars.q_full[s], 33);  // the TMA warp's leader, and every lane of the rows warp
                mbar_init(&bars.q_empty[s], 8);  // every consumer warp, after the block's last product
            }
            mbar_init(&bars.dq_full, 8);  // every consumer warp, after its part of the dQ tile
            mbar_init(&bars.dq_empty, 1);  // the writer, once its reductions have read the tile
            if constexpr (WIDE) {
                mbar_init(&bars.do_full, 1);   // the TMA warp's leader (the bytes)
                mbar_init(&bars.do_empty, 8);  // every consumer warp, after dV's product
            }
            fence_mbar_init();
        }
        __syncthreads();

        const BwdWalk<BM, BN, CAUSAL> walk(p, sq, n_start, hkv, P.p.semaphores != nullptr);
        const int wg = threadIdx.x / 128;
        if (wg == 0) {
            setmaxnreg_dec<PRODUCER_REGS>();
            const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
            if (warp == 0)
                BwdSm90Producer<BwdSm90>::produce(P, bars, sm, walk, sq, n_start, b, lane);
            else if (warp == 1)
                BwdSm90DqWriter<BwdSm90>::write(P, bars, sm, walk, sq, n_block, b, lane);
            else if (warp == 2)
                BwdSm90Producer<BwdSm90>::load_rows(P, bars, sm, walk, sq, b, lane);
        } else {
            setmaxnreg_inc<CONSUMER_REGS>();
            if constexpr (WIDE)
                BwdSm90WideConsumer<BwdSm90>::consume(P, bars, sm, walk, sq, n_block, b, wg - 1, threadIdx.x % 128);
            else
                BwdSm90Consumer<BwdSm90>::consume(P, bars, sm, walk, sq, n_block, b, wg - 1, threadIdx.x % 128);
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
