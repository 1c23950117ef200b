// Split-KV forward for decode (flash-decoding), sm_80+: few query tokens against a long KV cache.
//
// Block (split, kv head, batch) reads K/V once for the query heads that share the kv head (GQA
// packing): its BM rows are packed (token, head-in-group) pairs, row r = (token r / group, head
// r % group). Being memory-bound, the block splits KEYS, not rows, among its warps: each BN-key
// tile of the cp.async ring is cut into NW slices of WN keys, one per warp, and every warp runs
// an online softmax over all BM rows for its slices. At the end the warps' states are merged
// through shared memory in a fixed order (deterministic), and the block writes either the final
// output (one split) or its normalised partial output and LSE. With splits, the blocks of one
// block of rows count their arrivals; the last to arrive merges the partials (cudattn/combine.cuh),
// so decode is one launch.
//
// KV8: an FP8 (e4m3) cache, half the bytes. The ring holds the raw e4m3 rows, and the products
// convert them in registers straight into 16-bit operand fragments (exact: every e4m3 value is a
// float16 normal; cudattn/e4m3_operands.cuh), so a stage costs shared memory for its e4m3 bytes
// only and more stages or blocks fit an SM. The k descale scales the scores and the v descale
// the output, as in the FP8 prefill kernels.
//
// The steps, by role: decode/setup.cuh (which rows and keys a block takes; the Q and K/V loads),
// decode/scores.cuh (the scores' scales and each row's key bounds), decode/warp_merge.cuh (the
// warps' states merged) and decode/store.cuh (final or partial output; the last split's merge).
// This file holds the shape of a build, the main loop over the key tiles (products, modifiers,
// masks, online softmax) and the order of the steps. (The main loop stays in run(): as a function
// of its own it changed the SASS of the builds with modifiers.)
#pragma once
#include "cudattn/decode/scores.cuh"
#include "cudattn/decode/setup.cuh"
#include "cudattn/decode/store.cuh"
#include "cudattn/decode/warp_merge.cuh"
#include "cudattn/e4m3_operands.cuh"
#include "cudattn/params_decode.cuh"
#include "cudattn/softmax.cuh"
#include "cudattn/tile_products.cuh"

namespace cudattn {

// MODS: windows, softcap and ALiBi compiled in (their per-row state costs plain calls ~1 %).
// KV8: the cache holds e4m3 (see above). KEYS_M (KV8, no modifiers, at most 8 packed rows): the
// products take the keys as the MMA's 16-wide dimension and the 8 rows as its 8-wide one (S^T =
// K Q^T, O^T += V^T P^T; e4m3_operands.cuh, TransposedSoftmax), half the MMAs and softmax work a
// key of 16-row fragments that would be half padding or more.
template <typename T_, int D_, int NW_, int WN_, int STAGES_, int MF_, bool MODS_ = false, bool KV8_ = false,
          bool KEYS_M_ = false>
struct FwdDecode {
    typedef T_ T;  // the elements of Q and O (and of a 16-bit cache)
    static constexpr int D = D_, NW = NW_, WN = WN_, STAGES = STAGES_, MF = MF_;
    static constexpr bool MODS = MODS_, KV8 = KV8_, KEYS_M = KEYS_M_;
    typedef typename E4m3Products<T>::type PT;  // KV8: the products' type (e4m3_operands.cuh)
    static constexpr int NT = NW * 32;
    static constexpr int BM = KEYS_M ? 8 : 16 * MF;  // packed query rows per block
    static_assert(!KEYS_M || (KV8 && !MODS && MF == 1), "keys-as-M builds: FP8 caches without modifiers");
    static constexpr int BN = NW * WN;  // keys per ring stage
    static constexpr int NF = WN / 8;
    static constexpr int DF = D / 8;
    static constexpr int C = D / 8;     // 16-byte chunks of a 16-bit row (Q, and the products' K/V)
    static constexpr int KB = KV8 ? 1 : (int)sizeof(T);  // bytes of a cache element
    static constexpr int CK = D * KB / 16;  // 16-byte chunks of a cache row
    static constexpr int ROW_STEP = NT / CK;  // K/V rows one pass of the block's copies covers
    static constexpr int KV_PER_THREAD = BN / ROW_STEP;
    static constexpr int RED_STRIDE = D + 4;  // padded fp32 rows of the warp-merge buffer (no bank conflicts)
    static_assert(WN % 16 == 0 && D % 16 == 0 && STAGES >= 2, "tile sizes");
    static_assert(NT % CK == 0 && BN % ROW_STEP == 0, "K/V copies must cover whole rows");
    static constexpr int STEP = 16 / KV_PER_THREAD;  // key distance of a thread's rows (DecodeKvLoader)
    static_assert(16 % KV_PER_THREAD == 0 && ROW_STEP % STEP == 0, "a thread's rows must fill 16-key groups");
    // Q, the K/V ring (cache bytes), and KV8's fragment-ordered copy of Q. The warp merge reuses
    // all of shared memory once the main loop is done with it (and sizes it, where it is larger:
    // small FP8 rings). _decode_traits.DecodeVariant.smem_bytes computes the same.
    static constexpr int RING_BYTES = 2 * STAGES * BN * D * KB;
    static constexpr int MAIN_BYTES = (KV8 ? 2 : 1) * BM * D * (int)sizeof(T) + RING_BYTES;
    static constexpr int RED_BYTES = (2 * NW * BM + NW * BM * RED_STRIDE) * 4;
    static constexpr int SMEM_BYTES = MAIN_BYTES > RED_BYTES ? MAIN_BYTES : RED_BYTES;

    static __device__ __forceinline__ void run(const DecodeParams& p) {
        typedef DecodeSetup<FwdDecode> Setup;
        typedef DecodeScores<FwdDecode> Scores;
        typedef DecodeStore<FwdDecode> Store;
        typedef DecodeWarpMerge<FwdDecode> Merge;
        extern __shared__ __align__(128) unsigned char smem_raw[];
        T* sQ = reinterpret_cast<T*>(smem_raw);
        unsigned char* rK = smem_raw + BM * D * sizeof(T);  // the ring, in cache bytes
        unsigned char* rV = rK + STAGES * BN * D * KB;
        uint4* sQf = reinterpret_cast<uint4*>(rV + STAGES * BN * D * KB);  // KV8: Q's fragments
        uint2* sQf2 = reinterpret_cast<uint2*>(sQf);                       // KEYS_M: Q^T's (B operand)

        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const DecodeBlock k = Setup::locate(p);
        if (k.n_tiles <= 0) {  // this split (or the whole cache) has no key for these rows
            Store::write_empty(p, k.b, k.hkv, k.m_start, k.rows_valid, k.split, tid);
            Store::combine_if_last(p, k.b, k.hkv, k.m_block, k.m_start, k.rows_valid);
            return;
        }

        Setup::load_q(p, sQ, k, tid);
        const DecodeKvLoader<FwdDecode> load_kv(p, k, rK, rV, tid);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < k.n_tiles) load_kv(k.t_begin + s, s);
            cp_async_commit();
        }
        const int q_exp = Setup::q_fragments(sQ, sQf, sQf2, tid, lane);

        // KV8: the k descale scales the scores (with a softcap, inside the tanh), the v descale O.
        float scale_log2, softcap_pre, kd;
        Scores::score_scales(p, k, q_exp, scale_log2, softcap_pre, kd);
        const bool neg = scale_log2 < 0.f;
        const float masked = neg ? CUDATTN_INF : -CUDATTN_INF;
        const int g = lane >> 2, tq = lane & 3;
        int limit[MF][2], lo[MF][2], min_limit, limit_t[2];  // each row's visible keys (scores.cuh)
        float diag[MF][2], coef[MF][2];
        Scores::row_bounds(p, k, kd, lane, limit, lo, diag, coef, min_limit, limit_t);
        TransposedSoftmax tsm;
        tsm.init();
        float ot[KEYS_M ? D / 16 : 1][4];
#pragma unroll
        for (int c = 0; c < (KEYS_M ? D / 16 : 1); ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) ot[c][e] = 0.f;
        const int max_lo = k.left >= 0 ? k.t_last + k.cdiff - k.left : 0;  // the largest lo

        OnlineSoftmax<MF> softmax;
        softmax.init();
        float o[MF][DF][4];
        zero_fragments(o);

        const LaneTile<D> q_lane(lane & 15, lane >> 4);
        const LaneTile<D> k_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
        const LaneTile<D> v_lane((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
        const u32 sQ_addr = smem_addr(sQ);
        const int warp_off = warp * WN * D * KB;  // this warp's slice of each tile, in bytes

        constexpr bool PAGE_AHEAD = DecodeKvLoader<FwdDecode>::PAGE_AHEAD;
        int next_page = PAGE_AHEAD ? load_kv.page_of(k.t_begin + STAGES - 1) : 0;  // (a paged cache's, a tile ahead)
        for (int it = 0; it < k.n_tiles; ++it) {  // the main loop: each warp on its slice of every tile
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            // The table's entry for the tile after this one, read before this tile's copies: read
            // after them, it waited for them to land (7 % slower with 16-key pages, H200).
            const int page = next_page;
            if (PAGE_AHEAD && it + STAGES < k.n_tiles) next_page = load_kv.page_of(k.t_begin + it + STAGES);
            if (it + STAGES - 1 < k.n_tiles) {
                const int tile = k.t_begin + it + STAGES - 1, slot = (it + STAGES - 1) % STAGES;
                if (PAGE_AHEAD)
                    load_kv(tile, slot, page);
                else
                    load_kv(tile, slot);
            }
            cp_async_commit();

            const int slot_off = (it % STAGES) * BN * D * KB + warp_off;
            if constexpr (KEYS_M) {
                float st[WN / 16][4];
                qk_product_e4m3_keys_m<PT, WN / 16, D>(st, sQf2, rK + slot_off, lane);
                const int col0 = (k.t_begin + it) * BN + warp * WN;
                if (col0 + WN > min_limit) {
#pragma unroll
                    for (int kf = 0; kf < WN / 16; ++kf)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (col0 + kf * 16 + g + 8 * (e >> 1) >= limit_t[e & 1]) st[kf][e] = masked;
                }
                tsm.rescale_and_exponentiate(st, ot, scale_log2, neg);
                pv_product_e4m3_keys_m<PT, WN / 16, D>(ot, st, smem_addr(rV + slot_off), lane);
                continue;
            }
            float s[MF][NF][4];
            if constexpr (KV8) {
                qk_product_e4m3<PT, MF, NF, D>(s, sQf, rK + slot_off, lane);
            } else {
                qk_product<T, MF, NF, D / 16>(s, sQ_addr, q_lane, smem_addr(rK + slot_off), k_lane);
            }

            const int col0 = (k.t_begin + it) * BN + warp * WN;
            // Modifiers before masks (mods.cuh); uniform branches, decode being memory-bound.
            if (MODS && softcap_pre != 0.f) softcap_tile(s, softcap_pre);
            if (MODS && p.alibi != nullptr) {
#pragma unroll
                for (int mf = 0; mf < MF; ++mf)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                            for (int j = 0; j < 2; ++j)
                                s[mf][nf][2 * h + j] = fmaf(
                                    coef[mf][h], fabsf((float)(col0 + nf * 8 + 2 * tq + j) - diag[mf][h]), s[mf][nf][2 * h + j]);
            }
            if (col0 + WN > min_limit || (MODS && col0 < max_lo)) {
#pragma unroll
                for (int mf = 0; mf < MF; ++mf)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                            for (int j = 0; j < 2; ++j) {
                                const int col = col0 + nf * 8 + 2 * tq + j;
                                if (col >= limit[mf][h] || (MODS && col < lo[mf][h])) s[mf][nf][2 * h + j] = masked;
                            }
            }

            softmax.rescale_and_exponentiate(s, o, scale_log2, neg);
            if constexpr (KV8) {
                pv_product_e4m3<PT, MF, WN / 16, D>(o, s, smem_addr(rV + slot_off), lane);
            } else {
                pv_product_16bit<T, MF, WN / 16>(o, s, smem_addr(rV + slot_off), v_lane);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // every warp is done with the ring and Q: shared memory becomes the merge buffer

        // KV8: the v descale, read here rather than held through the loop (a register at 8 warps)
        const float out_scale =
            KV8 ? p.v_scale * (p.v_descale != nullptr ? p.v_descale[k.b * p.heads_kv + k.hkv] : 1.f) : 1.f;
        if constexpr (KEYS_M)
            Merge::merge_warps_and_store_keys_m(p, tsm, ot, k.b, k.hkv, k.m_start, k.rows_valid, k.split, warp, lane,
                                                out_scale);
        else
            Merge::merge_warps_and_store(p, softmax, o, k.b, k.hkv, k.m_start, k.rows_valid, k.split, warp, lane,
                                         out_scale);
        Store::combine_if_last(p, k.b, k.hkv, k.m_block, k.m_start, k.rows_valid);
    }
};

}  // namespace cudattn
