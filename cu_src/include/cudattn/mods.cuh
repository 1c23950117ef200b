// Score modifiers on S tiles held in mma accumulator fragments (layout: mask.cuh), applied to the
// raw scores before masking: softcap (s -> tanh(s * softcap_pre), the softmax's scale then
// carrying softcap * log2 e) and ALiBi (+ coef * |key - diagonal|, coef in raw-score units). Both
// keep the softmax's view of s as "raw score times scale_log2", so the online softmax, the masks
// and the LSE are unchanged. Attention sinks only touch the final normalisation (sink_finish).
#pragma once
#include "cudattn/elem.cuh"
#include "cudattn/params.cuh"
#include "cudattn/ptx.cuh"

namespace cudattn {

// Bits of a build's MODS (CUDATTN_MODS). MOD_WINDOW: FP8 Hopper builds that take a sliding
// window (the other builds honour p.has_window without it; fwd_sm90.cuh, WINDOW).
constexpr int MOD_SOFTCAP = 1, MOD_ALIBI = 2, MOD_WINDOW = 4;

// The ALiBi coefficient of query head h of sequence b, in raw-score units (0 without slopes).
__device__ __forceinline__ float alibi_coef(const FwdParams& p, int b, int h) {
    return p.alibi != nullptr ? p.alibi_mul * p.alibi[(long long)b * p.alibi_stride_b + h] : 0.f;
}

// Query head h's sink logit (natural log), or -inf without sinks; and that times log2 e.
__device__ __forceinline__ float sink_of(const float* sinks, int h) { return sinks != nullptr ? sinks[h] : -CUDATTN_INF; }
__device__ __forceinline__ float sink_log2_of(const float* sinks, int h) {
    return sinks != nullptr ? sinks[h] * 1.4426950408889634f : -CUDATTN_INF;
}

// Softcap on a tile of raw scores: s -> tanh(s * softcap_pre).
template <int MF, int NF>
__device__ __forceinline__ void softcap_tile(float (&s)[MF][NF][4], float softcap_pre) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mf][nf][e] = tanh_approx(s[mf][nf][e] * softcap_pre);
}

// Whether a build's softmax takes the bound of softcapped scores as every row's max
// (OnlineSoftmax::exponentiate, bounded): softcap without ALiBi (whose bias is unbounded), P in
// bfloat16, and 2^-2c inside float32's normal range by a wide margin (c = softcap * log2 e).
template <typename T, int MODS>
__device__ __forceinline__ bool bounded_scores(float scale_log2) {
    return MODS == MOD_SOFTCAP && IsBf16<T>::value && scale_log2 > 0.f && scale_log2 <= 50.f;
}

// warp_diag: the diagonal key (row + causal_offset) of the warp's first row; this thread's rows
// are g, g + 8, g + 16, ... below it (fragment layout). col0: the tile's first key.
template <int MODS, int MF, int NF>
__device__ __forceinline__ void apply_mods(float (&s)[MF][NF][4], float softcap_pre, float coef, int warp_diag,
                                           int col0, int lane) {
    if constexpr ((MODS & MOD_SOFTCAP) != 0) softcap_tile(s, softcap_pre);
    if constexpr ((MODS & MOD_ALIBI) != 0) {
        // key - diagonal as a float: exact below 2^24 keys. One add and one fma an element.
        const float base = (float)(col0 + 2 * (lane & 3) - warp_diag - (lane >> 2));
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float rb = base - (float)(mf * 16 + 8 * h);
#pragma unroll
                for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        s[mf][nf][2 * h + j] = fmaf(coef, fabsf(rb + (float)(nf * 8 + j)), s[mf][nf][2 * h + j]);
            }
    }
}

// The sink joins a row's softmax as one more term e^sink carrying no value. m_log2: the row's max
// of scaled scores (log2 domain, -inf: no key), l: its full row sum; sink_log2 = sink * log2 e.
// Returns 1 / (l + e^(sink - m)) relative to m, as the factor O's accumulators take, and the
// natural-log LSE of the whole denominator. A row with no key gets inv 0 and LSE = sink; a NaN
// sum stays NaN in both.
__device__ __forceinline__ void sink_finish(float m_log2, float l, float sink_log2, float& inv, float& lse) {
    const float M = fmaxf(m_log2, sink_log2);
    const float a = m_log2 == -CUDATTN_INF ? 0.f : exp2_approx(m_log2 - M);  // the keys' weight
    const float total = fmaf(l, a, exp2_approx(sink_log2 - M));
    inv = a / total;
    lse = (M + log2f(total)) * 0.6931471805599453f;
}

}  // namespace cudattn
