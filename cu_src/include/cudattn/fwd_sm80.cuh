// FlashAttention-2-style forward for sm_80+: one block computes BM query rows of one head,
// streaming BN-key tiles of K and V through a STAGES-deep cp.async ring in shared memory.
// Warps split the rows (MF 16-row fragments each); S = Q.K^T and O += P.V run on mma.sync
// m16n8k16 with fp32 accumulators, P never leaves registers.
//
// FP8 (T = e4m3_t, sm_89+): the same pipeline on m16n8k32 e4m3 products. Tiles are held as
// 16-bit units (two e4m3 bytes; smem_tile.cuh), so a k32 step of e4m3 is the 32 bytes of an f16
// k16 step and Q and K load exactly as in the 16-bit kernel. e4m3 B operands must be K-major, so V
// arrives transposed (Vt: head-dim rows of BN keys, fp8.cuh) and loads like K; P is packed from
// the S accumulators in Vt's key order (fp8.cuh), with no lane exchange. The descales come in
// through fp8_scales, and O is stored from registers as OutT.
#pragma once
#include "cudattn/epilogue.cuh"
#include "cudattn/fp8.cuh"
#include "cudattn/mask.cuh"
#include "cudattn/params.cuh"
#include "cudattn/tile_products.cuh"
#include "cudattn/smem_tile.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {

// The 16-bit unit that shared-memory tiles of T are moved in: T itself, or an e4m3 pair.
template <typename T>
struct Sm80Elem {
    static constexpr bool FP8 = false;
    typedef T unit;
};
template <>
struct Sm80Elem<e4m3_t> {
    static constexpr bool FP8 = true;
    typedef unsigned short unit;
};

template <typename T, int D, int BM, int BN, int NW, int STAGES, bool CAUSAL, typename OutT = T, int MODS = 0>
struct FwdSm80 {
    static constexpr bool FP8 = Sm80Elem<T>::FP8;
    typedef typename Sm80Elem<T>::unit U;
    static constexpr int NT = NW * 32;
    static constexpr int MF = BM / (16 * NW);  // 16-row fragments per warp
    static constexpr int NF = BN / 8;          // 8-column fragments of S
    static constexpr int DF = D / 8;           // 8-column fragments of O
    static constexpr int DU = D * (int)sizeof(T) / 2;  // 16-bit units per row of Q and K
    static constexpr int VW = FP8 ? BN / 2 : D;        // units per row of the V tile (Vt: BN keys)
    static_assert(MF >= 1 && BM == MF * 16 * NW, "BM must be a multiple of 16 * warps");
    static_assert(BN % 16 == 0 && D % 16 == 0, "tile sizes must be multiples of 16");
    static_assert(STAGES >= 2, "the K/V ring needs at least two stages");
    // Vt's keys are zero-padded to a multiple of 128 (fp8.cuh), so key tiles that divide 128 never
    // read past it; and a Vt row of BN bytes must be 64 B or a multiple of 128 B for the swizzle.
    static_assert(!FP8 || BN == 64 || BN == 128, "FP8 key tiles are 64 or 128 keys");
    static_assert(FP8 == (sizeof(T) == 1), "1-byte elements are e4m3");
    static constexpr int SMEM_BYTES = (BM + 2 * STAGES * BN) * D * (int)sizeof(T);

    // A tensor's elements, and a pointer to them as 16-bit units (FP8 tiles start on 16-byte
    // boundaries, so on a whole unit).
    static __device__ __forceinline__ const T* elems(const void* base) { return static_cast<const T*>(base); }
    static __device__ __forceinline__ const U* units(const T* ptr) { return reinterpret_cast<const U*>(ptr); }
    // An element stride in units; strides are multiples of 16 bytes, so halving e4m3's is exact.
    static __device__ __forceinline__ long long ustride(long long s) { return FP8 ? s >> 1 : s; }

    // m_start: the block's first row inside its sequence; sq.q0 adds the sequence's packed offset.
    static __device__ __forceinline__ OutT* out_tile(const FwdParams& p, const SeqSpan& sq, int b, int hq, int m_start) {
        return static_cast<OutT*>(p.o) + b * p.o_stride_b + hq * p.o_stride_h + (long long)(sq.q0 + m_start) * p.o_stride_s;
    }
    // LSE: (batch, heads_q, seqlen_q), or packed (heads_q, total_q) for variable lengths.
    static __device__ __forceinline__ float* lse_tile(const FwdParams& p, const SeqSpan& sq, int b, int hq, int m_start) {
        if (!p.write_lse) return nullptr;
        const long long row0 = p.cu_seqlens_q != nullptr ? (long long)hq * p.seqlen_q + sq.q0
                                                         : ((long long)b * p.heads_q + hq) * p.seqlen_q;
        return p.lse + row0 + m_start;
    }

    // FP8: the A operand of one k32 step of P.V (keys 32kk..32kk+31 of the tile) from the S
    // accumulators, in Vt's key order: fp8.cuh explains why this packing needs no shuffle.
    static __device__ __forceinline__ void pack_p_e4m3(u32 (&pa)[4], const float (&s)[NF][4], int kk) {
        pa[0] = pack_e4m3x4(s[4 * kk][0], s[4 * kk][1], s[4 * kk + 1][0], s[4 * kk + 1][1]);
        pa[1] = pack_e4m3x4(s[4 * kk][2], s[4 * kk][3], s[4 * kk + 1][2], s[4 * kk + 1][3]);
        pa[2] = pack_e4m3x4(s[4 * kk + 2][0], s[4 * kk + 2][1], s[4 * kk + 3][0], s[4 * kk + 3][1]);
        pa[3] = pack_e4m3x4(s[4 * kk + 2][2], s[4 * kk + 2][3], s[4 * kk + 3][2], s[4 * kk + 3][3]);
    }

    // FP8: O += P.V for one key tile, P in s (exponentiated), Vt's tile at v_base.
    static __device__ __forceinline__ void pv_product_e4m3(float (&o)[MF][DF][4], const float (&s)[MF][NF][4],
                                                           u32 v_base, const LaneTile<VW>& v_lane) {
        // All of P packed first: a quarter of the registers of S, which is then dead.
        u32 pa[MF][BN / 32][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int kk = 0; kk < BN / 32; ++kk) pack_p_e4m3(pa[mf][kk], s[mf], kk);
#pragma unroll
        for (int kk = 0; kk < BN / 32; ++kk) {
#pragma unroll
            for (int dp = 0; dp < DF / 2; ++dp) {
                u32 bv[4];  // Vt rows (head dims) 16dp.., keys as K's head dims in Q.K^T: not transposed
                ldmatrix_x4(bv, v_base + v_lane.at(dp * 16, 2 * kk));
#pragma unroll
                for (int mf = 0; mf < MF; ++mf) {
                    Mma<T>::run(o[mf][2 * dp], pa[mf][kk], bv[0], bv[1]);
                    Mma<T>::run(o[mf][2 * dp + 1], pa[mf][kk], bv[2], bv[3]);
                }
            }
        }
    }

    static __device__ __forceinline__ void run(const FwdParams& p) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        U* sQ = reinterpret_cast<U*>(smem_raw);
        U* sK = sQ + BM * DU;
        U* sV = sK + STAGES * BN * DU;  // a V slot holds BN x D elements too (FP8: D rows of BN keys)

        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        // Grid: (m, head, batch), so neighbouring blocks share one head's K/V in L2. Causal: (head,
        // batch, m) with m reversed, so that the scheduler starts every head's longest blocks (the
        // bottom rows see the most keys) before any shorter one: a longest-first order, short tail.
        const int m_block = CAUSAL ? (p.num_m_blocks - 1 - (int)blockIdx.z) : (int)blockIdx.x;
        const int hq = CAUSAL ? blockIdx.x : blockIdx.y;
        const int b = CAUSAL ? blockIdx.y : blockIdx.z;
        const int hkv = hq / p.group;
        const int m_start = m_block * BM;
        const SeqSpan sq = seq_span(p, b);
        if (m_start >= sq.seqlen_q) return;  // variable lengths: the grid covers the longest sequence
        const int rows_valid = min(BM, sq.seqlen_q - m_start);
        const int chunks_valid = p.head_dim / (16 / (int)sizeof(T));  // 16-byte chunks of a Q/K row

        const TileRange tiles = key_tiles<BN, CAUSAL>(p, sq, m_start, rows_valid);
        const int n_tiles = tiles.count;
        if (n_tiles == 0) {  // LSE: the sink's logit, or -inf
            store_empty_block<OutT, BM, D, NT>(out_tile(p, sq, b, hq, m_start), p.o_stride_s, lse_tile(p, sq, b, hq, m_start),
                                               rows_valid, p.head_dim / (16 / (int)sizeof(OutT)), tid,
                                               sink_of(p.sinks, hq));
            return;
        }

        {
            TileLoader<U, BM, DU, NT> q_loader(
                units(elems(p.q) + b * p.q_stride_b + hq * p.q_stride_h + (long long)(sq.q0 + m_start) * p.q_stride_s),
                ustride(p.q_stride_s), tid, chunks_valid);
            q_loader.template copy<true>(sQ, ustride(p.q_stride_s), rows_valid, chunks_valid);
            cp_async_commit();
        }

        // Tiles go from the last (the only one with a key tail, and the causal diagonal) to the first.
        const int last_start = tiles.start(0) * BN;
        const int last_rows = sq.seqlen_k - last_start;  // >= 1; below BN only at the key tail
        TileLoader<U, BN, DU, NT> k_loader(
            units(elems(p.k) + b * p.k_stride_b + hkv * p.k_stride_h + (long long)(sq.k0 + last_start) * p.k_stride_s),
            ustride(p.k_stride_s), tid, chunks_valid);
        // 16-bit: BN key rows of D. FP8: Vt's D head-dim rows of BN keys, starting at key last_start.
        TileLoader<U, (FP8 ? D : BN), VW, NT> v_loader(
            units(elems(p.v) + b * p.v_stride_b + hkv * p.v_stride_h +
                  (FP8 ? vt_first_key(p, sq, b) + last_start : (long long)(sq.k0 + last_start) * p.v_stride_s)),
            ustride(p.v_stride_s), tid, FP8 ? VW / 8 : chunks_valid);
        // Loads tile `it` (counted from the last) into its ring slot and steps to the tile before.
        auto load_kv = [&](int it) {
            const int slot = it % STAGES;
            U* k_dst = sK + slot * BN * DU;
            U* v_dst = sV + slot * BN * DU;
            if (it == 0 && last_rows < BN) {
                k_loader.template copy<true>(k_dst, ustride(p.k_stride_s), last_rows, chunks_valid);
                if constexpr (!FP8) v_loader.template copy<true>(v_dst, p.v_stride_s, last_rows, chunks_valid);
            } else {
                k_loader.template copy<false>(k_dst, ustride(p.k_stride_s), BN, chunks_valid);
                if constexpr (!FP8) v_loader.template copy<false>(v_dst, p.v_stride_s, BN, chunks_valid);
            }
            k_loader.advance_rows(-BN, ustride(p.k_stride_s));
            if constexpr (FP8) {
                // Rows past head_dim are zero-filled; keys past seqlen_k are zeros in Vt already.
                v_loader.template copy<true>(v_dst, ustride(p.v_stride_s), p.head_dim, VW / 8);
                v_loader.advance_cols(-VW);
            } else {
                v_loader.advance_rows(-BN, p.v_stride_s);
            }
        };

#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_tiles) load_kv(s);
            cp_async_commit();  // empty groups keep the wait_group arithmetic uniform
        }

        // FP8: the q and k descales fold into the softmax scale, the v descale into the output.
        // With a softcap they scale the raw scores inside the tanh (fp8_scales).
        float scale_log2 = p.scale_log2, out_scale = 1.f, softcap_pre = p.softcap_pre;
        float alibi = (MODS & MOD_ALIBI) ? alibi_coef(p, b, hq) : 0.f;
        if constexpr (FP8) {
            const Fp8Scales sc = fp8_scales<(MODS & MOD_SOFTCAP) != 0>(p, b, hkv);
            scale_log2 = sc.scale_log2;
            out_scale = sc.out_scale;
            softcap_pre = sc.softcap_pre;
            alibi *= sc.alibi_factor;
        }
        const bool neg = scale_log2 < 0.f;
        const float masked = neg ? CUDATTN_INF : -CUDATTN_INF;  // scaled by scale_log2, both become -inf
        OnlineSoftmax<MF> softmax;
        softmax.init();
        float o[MF][DF][4];
        zero_fragments(o);

        const int warp_row0 = warp * MF * 16;
        // ldmatrix row addresses: Q (A operand) rows by lane%16, chunk +lane/16; K (B operand, not
        // transposed) and V (B operand, transposed; FP8: Vt, not transposed, as K) 8x8 matrices by lane/8.
        const LaneTile<DU> q_lane(warp_row0 + (lane & 15), lane >> 4);
        const LaneTile<DU> k_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
        const LaneTile<VW> v_lane = FP8 ? LaneTile<VW>(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1)
                                        : LaneTile<VW>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
        const u32 sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);

        const bool bounded = bounded_scores<T, MODS>(scale_log2);  // softcapped bf16 (softmax.cuh)
        for (int it = 0; it < n_tiles; ++it) {
            cp_async_wait<STAGES - 2>();
            __syncthreads();  // tile `it` is in; every warp is done with the slot we refill next
            if (it + STAGES - 1 < n_tiles) load_kv(it + STAGES - 1);
            cp_async_commit();

            const int slot = it % STAGES;
            const u32 k_base = sK_addr + slot * BN * DU * 2;
            const u32 v_base = sV_addr + slot * BN * DU * 2;

            float s[MF][NF][4];
            qk_product<T, MF, NF, DU / 16>(s, sQ_addr, q_lane, k_base, k_lane);

            const int n_start = tiles.start(it) * BN;
            if constexpr (MODS != 0)
                apply_mods<MODS, MF, NF>(s, softcap_pre, alibi, m_start + warp_row0 + sq.causal_offset + p.alibi_shift,
                                         n_start, lane);
            if (tile_needs_mask<BN, CAUSAL>(p, sq, n_start, m_start + warp_row0, MF * 16))
                apply_mask<MF, NF, CAUSAL>(s, m_start + warp_row0, n_start, sq.seqlen_k, sq.causal_offset, lane, masked,
                                           p);

            softmax.template rescale_and_exponentiate<NF, DF, FP8>(s, o, scale_log2, neg, bounded);
            if constexpr (FP8) {
                pv_product_e4m3(o, s, v_base, v_lane);
            } else {  // P packed per k16 step; V read transposed
                pv_product_16bit<T, MF, BN / 16>(o, s, v_base, v_lane);
            }
        }
        cp_async_wait<0>();  // no copy may still target shared memory when the block exits

        float inv[MF][2], lse[MF][2];
        softmax.finish(inv, lse, sink_log2_of(p.sinks, hq), p.write_lse);
        if constexpr (FP8) {
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) {
                inv[mf][0] *= out_scale;
                inv[mf][1] *= out_scale;
            }
            store_output_direct<OutT, MF, DF>(o, inv, out_tile(p, sq, b, hq, m_start), p.o_stride_s, rows_valid,
                                              p.head_dim, warp_row0, lane);
        } else {
            store_output<T, D, MF, DF>(sQ, o, inv, out_tile(p, sq, b, hq, m_start), p.o_stride_s, rows_valid,
                                       chunks_valid, warp_row0, lane);
        }
        if (p.write_lse) store_lse<MF>(lse_tile(p, sq, b, hq, m_start), lse, rows_valid, warp_row0, lane);
    }
};

}  // namespace cudattn
