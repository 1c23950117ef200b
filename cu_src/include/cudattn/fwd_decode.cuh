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
#pragma once
#include "cudattn/combine.cuh"
#include "cudattn/e4m3_operands.cuh"
#include "cudattn/fp8.cuh"
#include "cudattn/kv_cache.cuh"
#include "cudattn/tile_products.cuh"
#include "cudattn/params_decode.cuh"
#include "cudattn/smem_tile.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {

// MODS: windows, softcap and ALiBi compiled in (their per-row state costs plain calls ~1 %).
// KV8: the cache holds e4m3 (see above). KEYS_M (KV8, no modifiers, at most 8 packed rows): the
// products take the keys as the MMA's 16-wide dimension and the 8 rows as its 8-wide one (S^T =
// K Q^T, O^T += V^T P^T; e4m3_operands.cuh, TransposedSoftmax), half the MMAs and softmax work a
// key of 16-row fragments that would be half padding or more.
template <typename T, int D, int NW, int WN, int STAGES, int MF, bool MODS = false, bool KV8 = false,
          bool KEYS_M = false>
struct FwdDecode {
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
    static constexpr int STEP = 16 / KV_PER_THREAD;  // key distance of a thread's rows (load_kv)
    static_assert(16 % KV_PER_THREAD == 0 && ROW_STEP % STEP == 0, "a thread's rows must fill 16-key groups");
    // Q, the K/V ring (cache bytes), and KV8's fragment-ordered copy of Q. The warp merge reuses
    // all of shared memory once the main loop is done with it (and sizes it, where it is larger:
    // small FP8 rings). _decode_traits.DecodeVariant.smem_bytes computes the same.
    static constexpr int RING_BYTES = 2 * STAGES * BN * D * KB;
    static constexpr int MAIN_BYTES = (KV8 ? 2 : 1) * BM * D * (int)sizeof(T) + RING_BYTES;
    static constexpr int RED_BYTES = (2 * NW * BM + NW * BM * RED_STRIDE) * 4;
    static constexpr int SMEM_BYTES = MAIN_BYTES > RED_BYTES ? MAIN_BYTES : RED_BYTES;

    static __device__ __forceinline__ void run(const DecodeParams& p) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        T* sQ = reinterpret_cast<T*>(smem_raw);
        unsigned char* rK = smem_raw + BM * D * sizeof(T);  // the ring, in cache bytes
        unsigned char* rV = rK + STAGES * BN * D * KB;
        uint4* sQf = reinterpret_cast<uint4*>(rV + STAGES * BN * D * KB);  // KV8: Q's fragments
        uint2* sQf2 = reinterpret_cast<uint2*>(sQf);                       // KEYS_M: Q^T's (B operand)

        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const int split = blockIdx.x % p.num_splits;
        const int m_block = blockIdx.x / p.num_splits;
        const int hkv = blockIdx.y, b = blockIdx.z;
        const int m_start = m_block * BM;
        const int rows_valid = min(BM, p.rows - m_start);
        const int chunks_valid = p.head_dim / 8;
        const int L = kv_seqlen(p.kv, b);
        const int cdiff = L - p.seqlen_q;  // token t's diagonal key: t + cdiff
        const bool window = MODS && p.has_window;
        const int right = p.causal ? 0 : window ? p.window_right : -1;  // -1: open
        const int left = window ? p.window_left : -1;

        // Keys this block must visit: all L, or up to what its last token sees (causal, a
        // window's right edge) from what its first token sees (a window's left edge). The splits
        // cut the tiles from the first such key's tile.
        const int t_first = m_start / p.group, t_last = (m_start + rows_valid - 1) / p.group;
        int n_end = L, n_begin = 0;
        if (right >= 0) n_end = min(L, max(0, t_last + cdiff + right + 1));
        if (left >= 0) n_begin = min(n_end, max(0, t_first + cdiff - left));
        const int t_begin = n_begin / BN + split * p.tiles_per_split;
        const int t_end = min((n_end + BN - 1) / BN, t_begin + p.tiles_per_split);
        const int n_tiles = n_end > n_begin ? t_end - t_begin : 0;

        if (n_tiles <= 0) {  // this split (or the whole cache) has no key for these rows
            write_empty(p, b, hkv, m_start, rows_valid, split, tid);
            combine_if_last(p, b, hkv, m_block, m_start, rows_valid);
            return;
        }

        for (int id = tid; id < BM * C; id += NT) {  // Q: each packed row from its own (token, head)
            const int r = id / C, c = id % C;
            const int gr = m_start + r;
            const bool ok = r < rows_valid && c < chunks_valid;
            const T* src = static_cast<const T*>(p.q);
            if (ok) src += b * p.q_stride_b + (gr / p.group) * p.q_stride_s + (hkv * p.group + gr % p.group) * p.q_stride_h + c * 8;
            cp_async_16(smem_addr(sQ + tile_offset<D>(r, c)), src, ok);
        }
        cp_async_commit();

        // Cache pointers in bytes: the strides count elements of KB bytes.
        const unsigned char* k_head = static_cast<const unsigned char*>(p.k) + hkv * p.k_stride_h * KB;
        const unsigned char* v_head = static_cast<const unsigned char*>(p.v) + hkv * p.v_stride_h * KB;
        const int row0 = tid / CK, chunk = tid % CK;
        const bool chunk_ok = chunk * 16 < p.head_dim * KB;
        // Tile `tile` of the sequence into ring slot `slot`; keys past n_end are zero-filled. A
        // thread's KV_PER_THREAD rows are one 16-key group's, STEP apart (row0 picks the group and
        // the first row), and pages hold whole groups (page_size % 16 == 0, tiles start at
        // multiples of 16): one page lookup a thread and tile, and one pointer add a row.
        const int r_first = (row0 / STEP) * 16 + row0 % STEP;
        auto load_kv = [&](int tile, int slot) {
            const int n0 = tile * BN;
            long long k_off = 0, v_off = 0;  // elements from the head's start to the first row
            if (p.kv.block_table == nullptr) {
                k_off = (long long)b * p.k_stride_page + (long long)(n0 + r_first) * p.k_stride_s;
                v_off = (long long)b * p.v_stride_page + (long long)(n0 + r_first) * p.v_stride_s;
            } else if (n0 + (r_first & ~15) < n_end) {
                const int2 loc = kv_locate(p.kv, b, n0 + (r_first & ~15));
                k_off = kv_offset(loc, p.k_stride_page, p.k_stride_s) + (r_first & 15) * p.k_stride_s;
                v_off = kv_offset(loc, p.v_stride_page, p.v_stride_s) + (r_first & 15) * p.v_stride_s;
            }
            const unsigned char* ks = k_head + k_off * KB + chunk * 16;
            const unsigned char* vs = v_head + v_off * KB + chunk * 16;
#pragma unroll
            for (int i = 0; i < KV_PER_THREAD; ++i) {
                const int r = r_first + i * STEP;
                const bool ok = chunk_ok && n0 + r < n_end;
                // 16-bit: the products' swizzled tile; KV8: the raw tile's rows of D bytes
                const int off = slot * BN * D * KB + (KV8 ? raw_offset<D>(r, chunk * 16) : (int)sizeof(T) * tile_offset<D>(r, chunk));
                cp_async_16(smem_addr(rK + off), ok ? ks : k_head, ok);
                cp_async_16(smem_addr(rV + off), ok ? vs : v_head, ok);
                ks += (long long)STEP * p.k_stride_s * KB;
                vs += (long long)STEP * p.v_stride_s * KB;
            }
        };

#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_tiles) load_kv(t_begin + s, s);
            cp_async_commit();
        }

        int q_exp = 0;  // KV8: Q entered the products as Q * 2^-q_exp (e4m3_operands.cuh)
        if constexpr (KV8) {  // Q has landed (its group precedes the ring's): gather its fragments
            cp_async_wait<STAGES - 1>();
            __syncthreads();
            q_exp = q_exponent<T, BM, D>(sQ, lane);
            if constexpr (KEYS_M)  // read after the main loop's first barrier
                build_q_frags_keys_m<T, D, NT>(sQ, sQf2, tid, q_exp);
            else
                build_q_frags<T, MF, D, NT>(sQ, sQf, tid, q_exp);
        }

        // KV8: the k descale scales the scores (with a softcap, inside the tanh), the v descale O.
        float scale_log2 = p.scale_log2, softcap_pre = p.softcap_pre, kd = 1.f;
        if constexpr (KV8) {
            const int i = b * p.heads_kv + hkv;
            kd = p.k_scale * (p.k_descale != nullptr ? p.k_descale[i] : 1.f) * (p.q_descale != nullptr ? p.q_descale[i] : 1.f) *
                 __int_as_float((127 + q_exp) << 23);
            softcap_pre *= kd;
            if (softcap_pre == 0.f) scale_log2 *= kd;  // without a softcap the score scale takes it
            if (scale_log2 == 0.f) scale_log2 = 1e-30f;  // masked scores are +-inf * scale: 0 makes NaN
        }
        const bool neg = scale_log2 < 0.f;
        const float masked = neg ? CUDATTN_INF : -CUDATTN_INF;
        const int g = lane >> 2, tq = lane & 3;
        // Per-row key bounds (visible: lo <= key < limit), fixed for the whole loop; and with
        // ALiBi, each row's diagonal key and coefficient (its query head's slope, mods.cuh).
        int limit[MF][2], lo[MF][2];
        float diag[MF][2], coef[MF][2];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int gr = m_start + mf * 16 + g + 8 * h;
                const int d = gr / p.group + cdiff;
                limit[mf][h] = right >= 0 ? min(L, d + right + 1) : L;
                lo[mf][h] = left >= 0 ? d - left : 0;
                diag[mf][h] = (float)d;
                coef[mf][h] = MODS && p.alibi != nullptr
                                  ? p.alibi_mul * p.alibi[(long long)b * p.alibi_stride_b + hkv * p.group + gr % p.group] /
                                        (p.softcap_pre == 0.f ? kd : 1.f)  // raw-score units (mods.cuh)
                                  : 0.f;
            }
        const int min_limit = right >= 0 ? min(L, t_first + cdiff + right + 1) : L;
        int limit_t[2];  // KEYS_M: rows 2t and 2t + 1 (no window: only the causal edge and L)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            limit_t[j] = right >= 0 ? min(L, (m_start + 2 * tq + j) / p.group + cdiff + right + 1) : L;
        TransposedSoftmax tsm;
        tsm.init();
        float ot[KEYS_M ? D / 16 : 1][4];
#pragma unroll
        for (int c = 0; c < (KEYS_M ? D / 16 : 1); ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) ot[c][e] = 0.f;
        const int max_lo = left >= 0 ? t_last + cdiff - left : 0;

        OnlineSoftmax<MF> softmax;
        softmax.init();
        float o[MF][DF][4];
        zero_fragments(o);

        const LaneTile<D> q_lane(lane & 15, lane >> 4);
        const LaneTile<D> k_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
        const LaneTile<D> v_lane((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
        const u32 sQ_addr = smem_addr(sQ);
        const int warp_off = warp * WN * D * KB;  // this warp's slice of each tile, in bytes

        for (int it = 0; it < n_tiles; ++it) {
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            if (it + STAGES - 1 < n_tiles) load_kv(t_begin + it + STAGES - 1, (it + STAGES - 1) % STAGES);
            cp_async_commit();

            const int slot_off = (it % STAGES) * BN * D * KB + warp_off;
            if constexpr (KEYS_M) {
                float st[WN / 16][4];
                qk_product_e4m3_keys_m<PT, WN / 16, D>(st, sQf2, rK + slot_off, lane);
                const int col0 = (t_begin + it) * BN + warp * WN;
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

            const int col0 = (t_begin + it) * BN + warp * WN;
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
            KV8 ? p.v_scale * (p.v_descale != nullptr ? p.v_descale[b * p.heads_kv + hkv] : 1.f) : 1.f;
        if constexpr (KEYS_M)
            merge_warps_and_store_keys_m(p, tsm, ot, b, hkv, m_start, rows_valid, split, warp, lane, out_scale);
        else
            merge_warps_and_store(p, softmax, o, b, hkv, m_start, rows_valid, split, warp, lane, out_scale);
        combine_if_last(p, b, hkv, m_block, m_start, rows_valid);
    }

    // With splits: count this block's arrival at its block of rows; the last of the num_splits
    // blocks to arrive merges their partials into the output (and LSE) and resets the counter for
    // the next kernel on the stream. Release/acquire through fences around the atomic, as in the
    // CUDA programming guide's last-block reduction: each thread fences its partial stores before
    // the arrival is counted, and the last block reads the partials from L2 after its own fence.
    static __device__ __forceinline__ void combine_if_last(const DecodeParams& p, int b, int hkv, int m_block,
                                                           int m_start, int rows_valid) {
        if (p.num_splits == 1) return;
        extern __shared__ __align__(128) unsigned char smem_raw[];
        volatile int* last = reinterpret_cast<volatile int*>(smem_raw);
        __threadfence();
        __syncthreads();  // every thread fenced; shared memory (the merge buffer) is free again
        if (threadIdx.x == 0) {
            int* c = p.counters + ((long long)b * p.heads_kv + hkv) * p.num_m_blocks + m_block;
            const bool is_last = atomicAdd(c, 1) == p.num_splits - 1;
            if (is_last) *c = 0;  // every split has arrived; nothing else touches it in this kernel
            *last = is_last;
        }
        __syncthreads();
        if (!*last) return;
        __threadfence();
        static_assert(SMEM_BYTES >= 128 + NW * 32 * 4, "the merge's weight buffers fit in shared memory");
        float* w_buf = reinterpret_cast<float*>(smem_raw + 128);  // 32 part weights a warp (combine_row)
        typedef typename ElemOf<T>::type Out;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const long long part_rows = (long long)p.batch * p.heads_q * p.seqlen_q;
        for (int r = warp; r < rows_valid; r += NW) {
            const int gr = m_start + r;
            const int t = gr / p.group, hq = hkv * p.group + gr % p.group;
            const long long row = ((long long)b * p.heads_q + hq) * p.seqlen_q + t;  // (b, hq, t) of each part
            const float* lse_row = p.lse_part + row;
            const float* o_row = p.o_part + row * p.head_dim;
            const long long o_part_stride = part_rows * p.head_dim;
            const float lse = combine_row<Out, 8>(  // the partials exclude the sink: it joins here, once
                p.num_splits, p.head_dim, lane, [lse_row, part_rows](int s) { return __ldcg(lse_row + s * part_rows); },
                [o_row, o_part_stride](int s, int c) { return Elem<0>::load4_l2(o_row + s * o_part_stride + c); },
                static_cast<T*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + hq * p.o_stride_h, w_buf + 32 * warp,
                p.sinks != nullptr ? p.sinks[hq] : -CUDATTN_INF);
            if (p.write_lse && lane == 0) p.lse[row] = lse;
        }
    }

    // The block's warps each hold (max, sum, unnormalised O) over their key slices. Rescaled to the
    // common row max, summed in warp order, and normalised: O = sum_w e^(m_w - M) O_w / sum_w e^(m_w - M) l_w.
    static __device__ __forceinline__ void merge_warps_and_store(const DecodeParams& p, OnlineSoftmax<MF>& sm,
                                                                 const float (&o)[MF][DF][4], int b, int hkv,
                                                                 int m_start, int rows_valid, int split, int warp,
                                                                 int lane, float out_scale = 1.f) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        float* red_o = reinterpret_cast<float*>(smem_raw) + 2 * NW * BM;  // [NW][BM][RED_STRIDE] scaled outputs
        const int g = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = sm.sum[mf][h];
                x += __shfl_xor_sync(0xffffffffu, x, 1);
                x += __shfl_xor_sync(0xffffffffu, x, 2);
                if (tq == 0) publish_row(mf * 16 + g + 8 * h, warp, sm.m_log2[mf][h], x);
            }
        __syncthreads();

#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = mf * 16 + g + 8 * h;
                const float f = row_factor(p, b, hkv, m_start, r, sm.m_log2[mf][h], split,
                                           warp == 0 && tq == 0 && r < rows_valid, out_scale);
                float* dst = red_o + (warp * BM + r) * RED_STRIDE;
                if constexpr (KV8) {  // even/odd fragments of each 16-column chunk (e4m3_operands.cuh)
#pragma unroll
                    for (int c = 0; c < DF / 2; ++c)
                        *reinterpret_cast<float4*>(dst + 16 * c + 4 * tq) =
                            make_float4(o[mf][2 * c][2 * h] * f, o[mf][2 * c + 1][2 * h] * f,
                                        o[mf][2 * c][2 * h + 1] * f, o[mf][2 * c + 1][2 * h + 1] * f);
                } else {
#pragma unroll
                    for (int df = 0; df < DF; ++df)
                        *reinterpret_cast<float2*>(dst + df * 8 + 2 * tq) =
                            make_float2(o[mf][df][2 * h] * f, o[mf][df][2 * h + 1] * f);
                }
            }
        __syncthreads();
        sum_warps_and_store(p, b, hkv, m_start, rows_valid, split);
    }

    // The same for keys-as-M builds (TransposedSoftmax; O^T's chunks: column 16c + 2g, + 1).
    static __device__ __forceinline__ void merge_warps_and_store_keys_m(const DecodeParams& p, TransposedSoftmax& sm,
                                                                        const float (&o)[D / 16][4], int b, int hkv,
                                                                        int m_start, int rows_valid, int split,
                                                                        int warp, int lane, float out_scale) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        float* red_o = reinterpret_cast<float*>(smem_raw) + 2 * NW * BM;
        const int g = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float x = sm.sum[j];
#pragma unroll
            for (int lanes = 4; lanes < 32; lanes *= 2) x += __shfl_xor_sync(0xffffffffu, x, lanes);
            if (g == 0) publish_row(2 * tq + j, warp, sm.m_log2[j], x);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = 2 * tq + j;
            const float f = row_factor(p, b, hkv, m_start, r, sm.m_log2[j], split,
                                       warp == 0 && g == 0 && r < rows_valid, out_scale);
            float* dst = red_o + (warp * BM + r) * RED_STRIDE + 2 * g;
#pragma unroll
            for (int c = 0; c < D / 16; ++c)
                *reinterpret_cast<float2*>(dst + 16 * c) = make_float2(o[c][j] * f, o[c][2 + j] * f);
        }
        __syncthreads();
        sum_warps_and_store(p, b, hkv, m_start, rows_valid, split);
    }

    // This warp's row max (log2 domain) and row sum of row r, for the other warps to read.
    static __device__ __forceinline__ void publish_row(int r, int warp, float m_log2, float sum) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        float* red_m = reinterpret_cast<float*>(smem_raw);  // [NW][BM] row maxima (log2 domain)
        red_m[warp * BM + r] = m_log2;
        red_m[NW * BM + warp * BM + r] = sum;  // [NW][BM] row sums
    }

    // The factor this warp's unnormalised O of row r takes, from every warp's (max, sum) and the
    // row's sink; the row's LSE (or partial LSE) is written where write_lse.
    static __device__ __forceinline__ float row_factor(const DecodeParams& p, int b, int hkv, int m_start, int r,
                                                       float mine, int split, bool write_lse, float out_scale) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        const float* red_m = reinterpret_cast<const float*>(smem_raw);
        const float* red_l = red_m + NW * BM;
        float M = -CUDATTN_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, red_m[w * BM + r]);
        // A warp whose keys were all masked has max -inf and sum 0 (weight 0); one whose scores
        // were all NaN has max -inf too (fmaxf skips NaN) but a NaN sum, which the 0 weight keeps
        // NaN. The row is empty iff the total is exactly 0.
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float mw = red_m[w * BM + r];
            total += red_l[w * BM + r] * (mw == -CUDATTN_INF ? 0.f : exp2_approx(mw - M));
        }
        // One split: a sink joins the denominator here (with splits, in the combine), as one more
        // warp of max sink_log2 and sum 1.
        const float sink_log2 = p.num_splits == 1 ? sink_log2_of_row(p, hkv, m_start + r) : -CUDATTN_INF;
        if (sink_log2 != -CUDATTN_INF) {
            const float M2 = fmaxf(M, sink_log2);
            total = fmaf(total, M == -CUDATTN_INF ? 0.f : exp2_approx(M - M2), exp2_approx(sink_log2 - M2));
            M = M2;
        }
        if (write_lse) {
            const float lse = (total != 0.f) ? (M + log2f(total)) * 0.6931471805599453f : -CUDATTN_INF;
            if (float* dl = lse_out(p, b, hkv, m_start + r, split)) *dl = lse;
        }
        return (mine == -CUDATTN_INF || total == 0.f) ? 0.f : exp2_approx(mine - M) / total * out_scale;
    }

    // The warps' scaled outputs summed in warp order and stored (final O or the split's partial).
    static __device__ __forceinline__ void sum_warps_and_store(const DecodeParams& p, int b, int hkv, int m_start,
                                                               int rows_valid, int split) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        const float* red_o = reinterpret_cast<const float*>(smem_raw) + 2 * NW * BM;
        const int cols4 = p.head_dim / 4;
        for (int id = threadIdx.x; id < rows_valid * cols4; id += NT) {
            const int r = id / cols4, c = (id % cols4) * 4;
            float4 acc = *reinterpret_cast<const float4*>(red_o + r * RED_STRIDE + c);
#pragma unroll
            for (int w = 1; w < NW; ++w) {
                const float4 x = *reinterpret_cast<const float4*>(red_o + (w * BM + r) * RED_STRIDE + c);
                acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w;
            }
            store_row4(p, b, hkv, m_start + r, split, c, acc);
        }
    }

    // Packed row gr's sink logit times log2 e, or -inf without sinks.
    static __device__ __forceinline__ float sink_log2_of_row(const DecodeParams& p, int hkv, int gr) {
        return p.sinks != nullptr ? p.sinks[hkv * p.group + gr % p.group] * 1.4426950408889634f : -CUDATTN_INF;
    }

    // Where row gr's LSE goes: the final LSE (one split, if asked for) or the split's partial LSE.
    static __device__ __forceinline__ float* lse_out(const DecodeParams& p, int b, int hkv, int gr, int split) {
        const int t = gr / p.group, hq = hkv * p.group + gr % p.group;
        const long long idx = ((long long)b * p.heads_q + hq) * p.seqlen_q + t;
        if (p.num_splits == 1) return p.write_lse ? p.lse + idx : nullptr;
        return p.lse_part + (long long)split * p.batch * p.heads_q * p.seqlen_q + idx;
    }

    static __device__ __forceinline__ void store_row4(const DecodeParams& p, int b, int hkv, int gr, int split, int c,
                                                      float4 v) {
        const int t = gr / p.group, hq = hkv * p.group + gr % p.group;
        if (p.num_splits == 1) {
            T* dst = static_cast<T*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + hq * p.o_stride_h + c;
            uint2 packed;
            packed.x = Mma<T>::pack(v.x, v.y);
            packed.y = Mma<T>::pack(v.z, v.w);
            *reinterpret_cast<uint2*>(dst) = packed;
        } else {
            const long long row = (((long long)split * p.batch + b) * p.heads_q + hq) * p.seqlen_q + t;
            *reinterpret_cast<float4*>(p.o_part + row * p.head_dim + c) = v;
        }
    }

    // No key for this block's rows in this split: LSE -inf (the combine skips the split), and with
    // one split the final O = 0 and LSE -inf or the row's sink.
    static __device__ __forceinline__ void write_empty(const DecodeParams& p, int b, int hkv, int m_start,
                                                       int rows_valid, int split, int tid) {
        for (int r = tid; r < rows_valid; r += NT)
            if (float* dl = lse_out(p, b, hkv, m_start + r, split))
                *dl = p.num_splits == 1 && p.sinks != nullptr ? p.sinks[hkv * p.group + (m_start + r) % p.group]
                                                              : -CUDATTN_INF;
        if (p.num_splits != 1) return;
        const int cols4 = p.head_dim / 4;
        for (int id = tid; id < rows_valid * cols4; id += NT)
            store_row4(p, b, hkv, m_start + id / cols4, split, (id % cols4) * 4, make_float4(0.f, 0.f, 0.f, 0.f));
    }
};

}  // namespace cudattn
