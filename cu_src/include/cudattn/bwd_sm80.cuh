// FlashAttention-2-style backward for sm_80+ (mma.sync, cp.async). One block owns BN keys of one
// KV head and walks every query block that sees them, for each query head of the KV head's group
// (so dK and dV are summed over the group in registers: no expanded K/V, no atomics for them):
//
//   S^T = K.Q^T      P^T = exp2(S^T * scale_log2 - lse2)       (recomputed from the forward's LSE)
//   dP^T = V.dO^T    dS^T = P^T * (dP^T - D)                    (D = rowsum(dO * O), bwd/rows.cuh)
//   dV += P^T.dO     dK += dS^T.Q                               (registers, BN x D per block)
//   dQ += dS.K                                                  (float32 in global memory, bwd/dq.cuh)
//
// Up to head dim 128 each warp owns KF 16-key fragments of the block over every query and every
// column, so the transposed products leave P^T and dS^T in exactly the A-operand layout that dV and
// dK need: neither goes through shared memory. dS^T does, once, for dQ, whose rows are queries.
// Wider heads (192, 256) would need dK and dV of 16 keys x D in two 128+ register arrays per warp:
// there the warps split the block as KW key fragments x CG groups, a group taking BM/CG queries of
// S^T and dP^T and D/CG columns of dK and dV, so P^T and dS^T go through shared memory for the
// products over all queries. Q and dO (and their LSE and D) are double-buffered while K and V stay.
#pragma once
#include "cudattn/bwd/dq.cuh"
#include "cudattn/bwd/params.cuh"
#include "cudattn/bwd/scores.cuh"
#include "cudattn/bwd/walk.cuh"
#include "cudattn/mask.cuh"
#include "cudattn/seqlen.cuh"
#include "cudattn/smem_tile.cuh"
#include "cudattn/tile_products.cuh"

namespace cudattn {

__device__ __forceinline__ void cp_async_4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

// A warp's KF x MF fragments of a transposed score tile (P^T or dS^T), packed to T, into the
// BN x BM tile `dst` at its keys from key_row0 and its query group's columns, from 8-query chunk
// chunk0 (the group's first query is a multiple of 8).
template <typename T, int BM, int KF, int MF>
__device__ __forceinline__ void store_scores_t(T* dst, const float (&x)[KF][MF][4], int key_row0, int chunk0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kf = 0; kf < KF; ++kf)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = key_row0 + kf * 16 + g + 8 * h;
#pragma unroll
            for (int mf = 0; mf < MF; ++mf)
                *reinterpret_cast<u32*>(dst + tile_offset<BM>(r, chunk0 + mf) + 2 * t) =
                    Mma<T>::pack(x[kf][mf][2 * h], x[kf][mf][2 * h + 1]);
        }
}

// acc[0][DFW] (16 keys x DFW 8-column fragments from fragment df0) += A.B over KSTEPS 16-query
// steps, A (16 keys x queries) read from a BN x BM shared tile, B (queries x head dim) from a
// BM x D tile transposed: dV's and dK's products when the warps split the columns.
template <typename T, int KSTEPS, int DFW, int BM, int D>
__device__ __forceinline__ void smem_a_product(float (&acc)[1][DFW][4], u32 a_base, const LaneTile<BM>& a_lane,
                                               u32 b_base, const LaneTile<D>& b_lane, int df0) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 a[4];
        ldmatrix_x4(a, a_base + a_lane.at(0, 2 * kk));
#pragma unroll
        for (int dp = 0; dp < DFW / 2; ++dp) {
            u32 b[4];
            ldmatrix_x4_trans(b, b_base + b_lane.at(kk * 16, df0 + 2 * dp));
            Mma<T>::run(acc[0][2 * dp], a, b[0], b[1]);
            Mma<T>::run(acc[0][2 * dp + 1], a, b[2], b[3]);
        }
    }
}

template <typename T, int D, int BM, int BN, int NW, int STAGES, bool CAUSAL, int MODS>
struct BwdSm80 {
    static constexpr int NT = NW * 32;
    static constexpr int KW = BN / 16 < NW ? BN / 16 : NW;  // warps along the keys
    static constexpr int CG = NW / KW;         // ... and groups of queries (S^T) / columns (dK, dV)
    static constexpr int KF = BN / (16 * KW);  // 16-key fragments per warp
    static constexpr int QW = BM / CG;         // a warp's queries of S^T and dP^T
    static constexpr int MF = QW / 8;          // ... in 8-query fragments
    static constexpr int DF = D / 8;
    static constexpr int DFW = DF / CG;        // a warp's 8-column fragments of dK and dV
    static constexpr int RQ = BM / 16;         // dQ: warps as RQ row fragments x CQ column groups,
    static constexpr int CQ = NW / RQ;         // in DQ_PASSES passes of DQF fragments (registers)
    // Wide heads: at most 8 fragments (32 floats) a pass beside dK and dV. Narrower ones keep one
    // pass: in passes, the 128-wide build with 4 warps spilled.
    static constexpr int DQ_PASSES = CG > 1 ? (DF / CQ + 7) / 8 : 1;
    static constexpr int DQF = DF / CQ / DQ_PASSES;
    static constexpr bool SOFTCAP = (MODS & MOD_SOFTCAP) != 0;
    static_assert(KF >= 1 && BN == KF * 16 * KW && NW == KW * CG, "BN must be a multiple of 16 * key warps");
    static_assert(CG == 1 || (KF == 1 && MF >= 2 && MF % 2 == 0 && DF % CG == 0 && DFW % 2 == 0), "column groups");
    static_assert(BM % 16 == 0 && NW % RQ == 0 && DF % CQ == 0 && DF / CQ % DQ_PASSES == 0 && DQF % 2 == 0,
                  "dQ warp tiling");
    static_assert(STAGES == 1 || STAGES == 2, "Q/dO stages");
    static constexpr int SMEM_BYTES =
        (2 * BN * D + 2 * STAGES * BM * D + (CG > 1 ? 2 : 1) * BN * BM) * 2 + 2 * STAGES * BM * 4;

    static __device__ __forceinline__ void run(const BwdParams& P) {
        const FwdParams& p = P.f;
        extern __shared__ __align__(128) unsigned char smem_raw[];
        T* sK = reinterpret_cast<T*>(smem_raw);
        T* sV = sK + BN * D;
        T* sQ = sV + BN * D;               // STAGES x BM x D
        T* sdO = sQ + STAGES * BM * D;     // STAGES x BM x D
        T* sdS = sdO + STAGES * BM * D;    // BN x BM: dS^T
        T* sP = sdS + BN * BM;             // BN x BM: P^T, with column groups only
        float* sLse2 = reinterpret_cast<float*>(sP + (CG > 1 ? BN * BM : 0));  // STAGES x BM
        float* sDsum = sLse2 + STAGES * BM;                      // STAGES x BM

        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const int n_block = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
        const SeqSpan sq = seq_span(p, b);
        const int n_start = n_block * BN;
        if (n_start >= sq.seqlen_k) return;  // the grid covers the longest sequence
        const int keys_valid = min(BN, sq.seqlen_k - n_start);
        const int chunks_valid = p.head_dim / 8;

        // The walk's range (bwd/walk.cuh), held as plain values: the order below reads the
        // deterministic flag from the parameters rather than keep a register for it.
        int m_lo, m_hi, nm, total;
        {
            const BwdWalk<BM, BN, CAUSAL> walk(p, sq, n_start, hkv, false);
            m_lo = walk.m_lo, m_hi = walk.m_hi, nm = walk.nm, total = walk.total;
        }
        const BwdMask mask = bwd_mask<CAUSAL>(p, sq);
        const float alibi_scale = p.alibi_mul;
        const T* q_base = static_cast<const T*>(p.q) + b * p.q_stride_b + (long long)sq.q0 * p.q_stride_s;
        const T* do_base = static_cast<const T*>(P.dout) + b * P.do_stride_b + (long long)sq.q0 * P.do_stride_s;

        // K and V stay for the whole walk.
        {
            const long long k_off = b * p.k_stride_b + hkv * p.k_stride_h + (long long)(sq.k0 + n_start) * p.k_stride_s;
            const long long v_off = b * p.v_stride_b + hkv * p.v_stride_h + (long long)(sq.k0 + n_start) * p.v_stride_s;
            TileLoader<T, BN, D, NT> kl(static_cast<const T*>(p.k) + k_off, p.k_stride_s, tid, chunks_valid);
            kl.template copy<true>(sK, p.k_stride_s, keys_valid, chunks_valid);
            TileLoader<T, BN, D, NT> vl(static_cast<const T*>(p.v) + v_off, p.v_stride_s, tid, chunks_valid);
            vl.template copy<true>(sV, p.v_stride_s, keys_valid, chunks_valid);
        }
        // Pair `it`: query head hkv * group + it / nm, query block as BwdWalk::m_block orders them
        // (top down when deterministic), into slot it % STAGES.
        auto m_of = [&](int it) { return P.semaphores != nullptr ? m_hi - it % nm : m_lo + it % nm; };
        auto load_q = [&](int it) {
            const int hq = hkv * p.group + it / nm, m_start = m_of(it) * BM, slot = it % STAGES;
            const int rows = min(BM, sq.seqlen_q - m_start);
            TileLoader<T, BM, D, NT> ql(q_base + hq * p.q_stride_h + (long long)m_start * p.q_stride_s, p.q_stride_s, tid,
                                        chunks_valid);
            ql.template copy<true>(sQ + slot * BM * D, p.q_stride_s, rows, chunks_valid);
            TileLoader<T, BM, D, NT> dl(do_base + hq * P.do_stride_h + (long long)m_start * P.do_stride_s, P.do_stride_s,
                                        tid, chunks_valid);
            dl.template copy<true>(sdO + slot * BM * D, P.do_stride_s, rows, chunks_valid);
            if (tid < 2 * BM) {
                const int r = tid % BM;
                const long long idx = bwd_lse_row0(p, sq, b, hq) + m_start + min(r, rows - 1);
                const float* src = tid < BM ? P.lse2 + idx : P.dsum + idx;
                float* dst = (tid < BM ? sLse2 : sDsum) + slot * BM + r;
                cp_async_4(smem_addr(dst), src, r < rows);
            }
        };
        if (total > 0) load_q(0);
        cp_async_commit();

        float dk[KF][DFW][4], dv[KF][DFW][4];
        zero_fragments(dk);
        zero_fragments(dv);

        // (CG == 1: every warp has the block's only group; warp < NW is not known to the compiler)
        const int key_row0 = (CG == 1 ? warp : warp % KW) * KF * 16;  // in the tile
        const int grp = CG == 1 ? 0 : warp / KW;  // query group of S^T, column group of dK and dV
        const int q0w = grp * QW;                 // the group's first query in the tile
        const LaneTile<D> a_lane(key_row0 + (lane & 15), lane >> 4);                   // K, V rows as A
        const LaneTile<D> b_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);     // Q, dO rows as B (S^T, dP^T)
        const LaneTile<D> bt_lane((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);   // Q, dO transposed (dK, dV)
        const u32 sK_addr = smem_addr(sK), sV_addr = smem_addr(sV), sQ_addr = smem_addr(sQ), sdO_addr = smem_addr(sdO);
        const u32 sdS_addr = smem_addr(sdS), sP_addr = smem_addr(sP);
        const int wr = warp % RQ, wc = warp / RQ;

        for (int it = 0; it < total; ++it) {
            if constexpr (STAGES == 2) {
                if (it + 1 < total) load_q(it + 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                if (it > 0) {
                    load_q(it);
                    cp_async_commit();
                }
                cp_async_wait<0>();
            }
            __syncthreads();
            const int hq = hkv * p.group + it / nm, m_block = m_of(it), m_start = m_block * BM;
            const int slot = it % STAGES;
            const int rows = min(BM, sq.seqlen_q - m_start);
            const TileRange tiles = key_tiles<BN, CAUSAL>(p, sq, m_start, rows);
            const u32 q_addr = sQ_addr + slot * BM * D * 2, do_addr = sdO_addr + slot * BM * D * 2;
            const float* lse2s = sLse2 + slot * BM + q0w;
            const float* dsums = sDsum + slot * BM + q0w;
            // This pair's query block may lie outside the block's range only at the range's rounded ends.
            const bool seen = n_block >= tiles.first && n_block < tiles.first + tiles.count;

            if (seen) {
                const bool masked = m_start + BM > sq.seqlen_q || tile_needs_mask<BN, CAUSAL>(p, sq, n_start, m_start, rows);
                float s[KF][MF][4];
                qk_product<T, KF, MF, D / 16>(s, sK_addr, a_lane, q_addr + q0w * D * 2, b_lane);
                float dp[KF][MF][4];
                qk_product<T, KF, MF, D / 16>(dp, sV_addr, a_lane, do_addr + q0w * D * 2, b_lane);
                const float alibi = (MODS & MOD_ALIBI) ? alibi_scale * p.alibi[(long long)b * p.alibi_stride_b + hq] : 0.f;
                const int key0 = n_start + key_row0, col0 = m_start + q0w;
                if constexpr (SOFTCAP) {
                    float pr[KF][MF][4];
                    bwd_probs<MODS, KF, MF>(s, pr, lse2s, p.scale_log2, p.softcap_pre, alibi, p.alibi_shift, key0, col0, masked,
                                            mask, lane);
                    if constexpr (CG == 1) pv_product_16bit<T, KF, BM / 16, DF>(dv, pr, do_addr, bt_lane);
                    else store_scores_t<T, BM>(sP, pr, key_row0, q0w / 8, lane);
                    bwd_dscores<MODS, KF, MF>(dp, pr, s, dsums, lane);
                } else {
                    bwd_probs<MODS, KF, MF>(s, s, lse2s, p.scale_log2, p.softcap_pre, alibi, p.alibi_shift, key0, col0, masked,
                                            mask, lane);
                    if constexpr (CG == 1) pv_product_16bit<T, KF, BM / 16, DF>(dv, s, do_addr, bt_lane);
                    else store_scores_t<T, BM>(sP, s, key_row0, q0w / 8, lane);
                    bwd_dscores<MODS, KF, MF>(dp, s, s, dsums, lane);
                }
                if constexpr (CG == 1) pv_product_16bit<T, KF, BM / 16, DF>(dk, dp, q_addr, bt_lane);
                store_scores_t<T, BM>(sdS, dp, key_row0, q0w / 8, lane);  // dS^T (rows: this warp's keys), for dQ
            }
            __syncthreads();
            if (seen) {
                // (the pair's indices again, rather than kept live through the products above)
                const int hq = hkv * p.group + it / nm, m_block = m_of(it), m_start = m_block * BM;
                const int rows = min(BM, sq.seqlen_q - m_start);
                if constexpr (CG > 1) {  // dV += P^T.dO and dK += dS^T.Q over all queries, this group's columns
                    const u32 slot_off = (it % STAGES) * BM * D * 2;
                    const LaneTile<BM> st_lane(key_row0 + (lane & 15), lane >> 4);
                    smem_a_product<T, BM / 16, DFW>(dv, sP_addr, st_lane, sdO_addr + slot_off, bt_lane, grp * DFW);
                    smem_a_product<T, BM / 16, DFW>(dk, sdS_addr, st_lane, sQ_addr + slot_off, bt_lane, grp * DFW);
                }
                const long long row_stride = (long long)p.heads_q * P.tile_dim;
                const long long row0 = (p.cu_seqlens_q != nullptr ? 0 : (long long)b * p.seqlen_q) + sq.q0 + m_start;
                float* accum = P.dq_accum + row0 * row_stride + (long long)hq * P.tile_dim;
                int* counter = P.semaphores != nullptr
                                   ? P.semaphores + ((long long)b * p.heads_q + hq) * p.num_m_blocks + m_block
                                   : nullptr;
                // pass 0's product before the turn, the others' inside it (cgq: a pass's column group)
                float dq[DQF][4];
                dq_product<T, BM, BN, D, DQF>(dq, sdS_addr, sK_addr, wr, wc * DQ_PASSES, lane);
                if (counter != nullptr) wait_turn(counter, n_block - key_tiles<BN, CAUSAL>(p, sq, m_start, rows).first);
                dq_accumulate<DQF>(dq, accum, row_stride, wr * 16, wc * DQ_PASSES * DQF * 8, rows, lane);
#pragma unroll
                for (int pass = 1; pass < DQ_PASSES; ++pass) {
                    const int cgq = wc * DQ_PASSES + pass;
                    dq_product<T, BM, BN, D, DQF>(dq, sdS_addr, sK_addr, wr, cgq, lane);
                    dq_accumulate<DQF>(dq, accum, row_stride, wr * 16, cgq * DQF * 8, rows, lane);
                }
                if (counter != nullptr) pass_turn(counter);
            }
            __syncthreads();  // the slot and sdS are free for the next pair
        }
        cp_async_wait<0>();

        // dK (times the scale) and dV, straight from the accumulators.
        const int g = lane >> 2, t = lane & 3;
        T* gk = static_cast<T*>(P.dk) + b * P.dk_stride_b + hkv * P.dk_stride_h + (long long)(sq.k0 + n_start) * P.dk_stride_s;
        T* gv = static_cast<T*>(P.dv) + b * P.dv_stride_b + hkv * P.dv_stride_h + (long long)(sq.k0 + n_start) * P.dv_stride_s;
#pragma unroll
        for (int kf = 0; kf < KF; ++kf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = key_row0 + kf * 16 + g + 8 * h;
                if (r >= keys_valid) continue;
#pragma unroll
                for (int df = 0; df < DFW; ++df) {
                    const int c = (grp * DFW + df) * 8 + 2 * t;
                    if (c >= p.head_dim) continue;
                    *reinterpret_cast<u32*>(gk + r * P.dk_stride_s + c) =
                        Mma<T>::pack(dk[kf][df][2 * h] * P.scale, dk[kf][df][2 * h + 1] * P.scale);
                    *reinterpret_cast<u32*>(gv + r * P.dv_stride_s + c) = Mma<T>::pack(dv[kf][df][2 * h], dv[kf][df][2 * h + 1]);
                }
            }
    }
};

}  // namespace cudattn
