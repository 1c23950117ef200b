// FlashAttention-2-style forward for sm_80+: one block computes BM query rows of one head,
// streaming BN-key tiles of K and V through a STAGES-deep cp.async ring in shared memory.
// Warps split the rows (MF 16-row fragments each); S = Q.K^T and O += P.V run on mma.sync
// m16n8k16 with fp32 accumulators, P never leaves registers.
#pragma once
#include "cudattn/epilogue.cuh"
#include "cudattn/mask.cuh"
#include "cudattn/params.cuh"
#include "cudattn/smem_tile.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {

template <typename T, int D, int BM, int BN, int NW, int STAGES, bool CAUSAL>
struct FwdSm80 {
    static constexpr int NT = NW * 32;
    static constexpr int MF = BM / (16 * NW);  // 16-row fragments per warp
    static constexpr int NF = BN / 8;          // 8-column fragments of S
    static constexpr int DF = D / 8;           // 8-column fragments of O
    static constexpr int C = D / 8;            // 16-byte chunks per row
    static_assert(MF >= 1 && BM == MF * 16 * NW, "BM must be a multiple of 16 * warps");
    static_assert(BN % 16 == 0 && D % 16 == 0, "tile sizes must be multiples of 16");
    static_assert(STAGES >= 2, "the K/V ring needs at least two stages");
    static constexpr int SMEM_BYTES = (BM + 2 * STAGES * BN) * D * (int)sizeof(T);

    static __device__ __forceinline__ T* out_tile(const FwdParams& p, int b, int hq, int m_start) {
        return static_cast<T*>(p.o) + b * p.o_stride_b + hq * p.o_stride_h + m_start * p.o_stride_s;
    }
    static __device__ __forceinline__ float* lse_tile(const FwdParams& p, int b, int hq, int m_start) {
        return p.write_lse ? p.lse + ((long long)b * p.heads_q + hq) * p.seqlen_q + m_start : nullptr;
    }

    static __device__ __forceinline__ void run(const FwdParams& p) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        T* sQ = reinterpret_cast<T*>(smem_raw);
        T* sK = sQ + BM * D;
        T* sV = sK + STAGES * BN * D;

        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        // Grid: (m, head, batch), so neighbouring blocks share one head's K/V in L2. Causal: (head,
        // batch, m) with m reversed, so that the scheduler starts every head's longest blocks (the
        // bottom rows see the most keys) before any shorter one: a longest-first order, short tail.
        const int m_block = CAUSAL ? (p.num_m_blocks - 1 - (int)blockIdx.z) : (int)blockIdx.x;
        const int hq = CAUSAL ? blockIdx.x : blockIdx.y;
        const int b = CAUSAL ? blockIdx.y : blockIdx.z;
        const int hkv = hq / p.group;
        const int m_start = m_block * BM;
        const int rows_valid = min(BM, p.seqlen_q - m_start);
        const int chunks_valid = p.head_dim / 8;

        const int n_tiles = key_tiles<BN, CAUSAL>(p, m_start, rows_valid);
        if (n_tiles == 0) {
            store_empty_block<T, BM, D, NT>(out_tile(p, b, hq, m_start), p.o_stride_s, lse_tile(p, b, hq, m_start),
                                            rows_valid, chunks_valid, tid);
            return;
        }

        {
            const T* g_q = static_cast<const T*>(p.q) + b * p.q_stride_b + hq * p.q_stride_h + m_start * p.q_stride_s;
            TileLoader<T, BM, D, NT> q_loader(g_q, p.q_stride_s, tid, chunks_valid);
            q_loader.template copy<true>(sQ, p.q_stride_s, rows_valid, chunks_valid);
            cp_async_commit();
        }

        // Tiles go from the last (the only one with a key tail, and the causal diagonal) to the first.
        const int last_start = (n_tiles - 1) * BN;
        const int last_rows = p.seqlen_k - last_start;  // in [1, BN]; earlier tiles are full
        TileLoader<T, BN, D, NT> k_loader(
            static_cast<const T*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h + last_start * p.k_stride_s,
            p.k_stride_s, tid, chunks_valid);
        TileLoader<T, BN, D, NT> v_loader(
            static_cast<const T*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h + last_start * p.v_stride_s,
            p.v_stride_s, tid, chunks_valid);
        // Loads tile `it` (counted from the last) into its ring slot and steps to the tile before.
        auto load_kv = [&](int it) {
            const int slot = it % STAGES;
            if (it == 0 && last_rows < BN) {
                k_loader.template copy<true>(sK + slot * BN * D, p.k_stride_s, last_rows, chunks_valid);
                v_loader.template copy<true>(sV + slot * BN * D, p.v_stride_s, last_rows, chunks_valid);
            } else {
                k_loader.template copy<false>(sK + slot * BN * D, p.k_stride_s, BN, chunks_valid);
                v_loader.template copy<false>(sV + slot * BN * D, p.v_stride_s, BN, chunks_valid);
            }
            k_loader.advance_rows(-BN, p.k_stride_s);
            v_loader.advance_rows(-BN, p.v_stride_s);
        };

#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_tiles) load_kv(s);
            cp_async_commit();  // empty groups keep the wait_group arithmetic uniform
        }

        const bool neg = p.scale_log2 < 0.f;
        const float masked = neg ? CUDATTN_INF : -CUDATTN_INF;  // scaled by scale_log2, both become -inf
        OnlineSoftmax<MF> softmax;
        softmax.init();
        float o[MF][DF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int df = 0; df < DF; ++df)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mf][df][e] = 0.f;

        const int warp_row0 = warp * MF * 16;
        // ldmatrix row addresses: Q (A operand) rows by lane%16, chunk +lane/16; K (B operand, not
        // transposed) and V (B operand, transposed) 8x8 matrices by lane/8.
        const LaneTile<D> q_lane(warp_row0 + (lane & 15), lane >> 4);
        const LaneTile<D> k_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
        const LaneTile<D> v_lane((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
        const u32 sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);

        for (int it = 0; it < n_tiles; ++it) {
            cp_async_wait<STAGES - 2>();
            __syncthreads();  // tile `it` is in; every warp is done with the slot we refill next
            if (it + STAGES - 1 < n_tiles) load_kv(it + STAGES - 1);
            cp_async_commit();

            const int slot = it % STAGES;
            const u32 k_base = sK_addr + slot * BN * D * (int)sizeof(T);
            const u32 v_base = sV_addr + slot * BN * D * (int)sizeof(T);

            float s[MF][NF][4];
#pragma unroll
            for (int mf = 0; mf < MF; ++mf)
#pragma unroll
                for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mf][nf][e] = 0.f;

#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 a[MF][4];
#pragma unroll
                for (int mf = 0; mf < MF; ++mf)
                    ldmatrix_x4(a[mf], sQ_addr + q_lane.at(mf * 16, 2 * kk));
#pragma unroll
                for (int np = 0; np < NF / 2; ++np) {
                    u32 bk[4];
                    ldmatrix_x4(bk, k_base + k_lane.at(np * 16, 2 * kk));
#pragma unroll
                    for (int mf = 0; mf < MF; ++mf) {
                        Mma<T>::run(s[mf][2 * np], a[mf], bk[0], bk[1]);
                        Mma<T>::run(s[mf][2 * np + 1], a[mf], bk[2], bk[3]);
                    }
                }
            }

            const int n_start = (n_tiles - 1 - it) * BN;
            const bool need_mask = (n_start + BN > p.seqlen_k) ||
                                   (CAUSAL && n_start + BN - 1 > m_start + warp_row0 + p.causal_offset);
            if (need_mask)
                apply_mask<MF, NF, CAUSAL>(s, m_start + warp_row0, n_start, p.seqlen_k, p.causal_offset, lane, masked);

            softmax.rescale_and_exponentiate(s, o, p.scale_log2, neg);

#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                u32 pa[MF][4];
#pragma unroll
                for (int mf = 0; mf < MF; ++mf) {
                    pa[mf][0] = Mma<T>::pack(s[mf][2 * kk][0], s[mf][2 * kk][1]);
                    pa[mf][1] = Mma<T>::pack(s[mf][2 * kk][2], s[mf][2 * kk][3]);
                    pa[mf][2] = Mma<T>::pack(s[mf][2 * kk + 1][0], s[mf][2 * kk + 1][1]);
                    pa[mf][3] = Mma<T>::pack(s[mf][2 * kk + 1][2], s[mf][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DF / 2; ++dp) {
                    u32 bv[4];
                    ldmatrix_x4_trans(bv, v_base + v_lane.at(kk * 16, 2 * dp));
#pragma unroll
                    for (int mf = 0; mf < MF; ++mf) {
                        Mma<T>::run(o[mf][2 * dp], pa[mf], bv[0], bv[1]);
                        Mma<T>::run(o[mf][2 * dp + 1], pa[mf], bv[2], bv[3]);
                    }
                }
            }
        }
        cp_async_wait<0>();  // no copy may still target shared memory when the block exits

        float inv[MF][2], lse[MF][2];
        softmax.finish(inv, lse);
        store_output<T, D, MF, DF>(sQ, o, inv, out_tile(p, b, hq, m_start), p.o_stride_s, rows_valid, chunks_valid,
                                   warp_row0, lane);
        if (p.write_lse) store_lse<MF>(lse_tile(p, b, hq, m_start), lse, rows_valid, warp_row0, lane);
    }
};

}  // namespace cudattn
