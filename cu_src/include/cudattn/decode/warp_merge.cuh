// The warp merge of a split-KV decode block (fwd_decode.cuh): its warps each ran an online softmax
// over their own key slices; their states meet in shared memory, are merged in warp order
// (deterministic) and stored through DecodeStore (store.cuh). K is the kernel (FwdDecode).
#pragma once
#include "cudattn/decode/store.cuh"
#include "cudattn/params_decode.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {

template <class K>
struct DecodeWarpMerge {
    static constexpr bool KV8 = K::KV8;
    static constexpr int D = K::D, NT = K::NT, NW = K::NW, MF = K::MF, DF = K::DF, BM = K::BM;
    static constexpr int RED_STRIDE = K::RED_STRIDE;
    typedef DecodeStore<K> Store;

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
        const float sink_log2 = p.num_splits == 1 ? Store::sink_log2_of_row(p, hkv, m_start + r) : -CUDATTN_INF;
        if (sink_log2 != -CUDATTN_INF) {
            const float M2 = fmaxf(M, sink_log2);
            total = fmaf(total, M == -CUDATTN_INF ? 0.f : exp2_approx(M - M2), exp2_approx(sink_log2 - M2));
            M = M2;
        }
        if (write_lse) {
            const float lse = (total != 0.f) ? (M + log2f(total)) * 0.6931471805599453f : -CUDATTN_INF;
            if (float* dl = Store::lse_out(p, b, hkv, m_start + r, split)) *dl = lse;
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
            Store::store_row4(p, b, hkv, m_start + r, split, c, acc);
        }
    }
};

}  // namespace cudattn
