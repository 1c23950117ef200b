// Online softmax over S tiles held in mma accumulator fragments, in the exp2 domain.
// Each thread owns 2 rows per 16-row fragment (g and g+8); a row is spread over the 4 lanes of
// a quad, so row reductions are two xor-shuffles. The running row sum stays per-thread (partial)
// until finish(), which is valid because every lane of a quad applies the same rescale factor.
#pragma once
#include "cudattn/mods.cuh"
#include "cudattn/ptx.cuh"

namespace cudattn {

// v[0] op v[1] op ... op v[N-1] as a pairwise tree: log2(N) dependent steps instead of N - 1.
// op must be associative (max, min, and + up to rounding); v is overwritten.
template <int N, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) v[i] = op(v[i], v[i + w]);
    return v[0];
}

template <int MF>
struct OnlineSoftmax {
    float m_log2[MF][2];   // running max of scaled scores (score * scale_log2), -inf if none yet
    float sum[MF][2];      // per-thread partial row sums of exp2(scaled - m_log2)

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m_log2[mf][h] = -CUDATTN_INF;
                sum[mf][h] = 0.f;
            }
    }

    // The tile's row maxima of scaled scores, folded into m_log2. Scaling is monotonic, so the
    // max of scaled scores is the scaled max of raw scores (the min when the scale is negative):
    // the reduction runs on raw scores and only its result is multiplied.
    template <bool NEG, int NF>
    __device__ __forceinline__ void update_max(const float (&s)[MF][NF][4], float scale_log2) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[NF];
#pragma unroll
                for (int nf = 0; nf < NF; ++nf)
                    v[nf] = NEG ? fminf(s[mf][nf][2 * h], s[mf][nf][2 * h + 1])
                                : fmaxf(s[mf][nf][2 * h], s[mf][nf][2 * h + 1]);
                float x = tree_reduce(v, [](float a, float b) { return NEG ? fminf(a, b) : fmaxf(a, b); });
                float y = __shfl_xor_sync(0xffffffffu, x, 1);
                x = NEG ? fminf(x, y) : fmaxf(x, y);
                y = __shfl_xor_sync(0xffffffffu, x, 2);
                x = NEG ? fminf(x, y) : fmaxf(x, y);
                m_new[mf][h] = fmaxf(m_log2[mf][h], x * scale_log2);  // masked: +-inf * scale = -inf
            }
    }
    float m_new[MF][2];

    // Turns s into P = exp2(s*scale_log2 - m) in place and returns, per row, the factor
    // exp2(m_old - m_new) that earlier output accumulators must be multiplied by. A row with no
    // visible key so far keeps m = -inf and uses 0 as its offset, so that exp2(-inf - -inf) never
    // makes a NaN. Split from the rescale so that a Hopper consumer can exponentiate while its
    // previous P.V product is still in flight and rescale once that product has landed.
    // CLAMP (FP8): the row max m is rounded to float32 but each exponent is an exact fma, so the
    // max key's P is 2^(+-ulp(m)/2), not 1: at most 2^8 (inside e4m3's 448) while |m| < 2^27.
    // A warp with a larger |m| (scores beyond 2^27 from large descales) caps the exponents at 0,
    // so P stays in [0, 1]; the cap is one more instruction an element, so only such a warp pays it.
    template <int NF, bool CLAMP = false>
    __device__ __forceinline__ void exponentiate(float (&s)[MF][NF][4], float scale_log2, bool neg,
                                                 float (&alpha)[MF][2]) {
        if (neg)
            update_max<true>(s, scale_log2);
        else
            update_max<false>(s, scale_log2);
        float m_use[MF][2];
        bool big = false;
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m_use[mf][h] = (m_new[mf][h] == -CUDATTN_INF) ? 0.f : m_new[mf][h];
                alpha[mf][h] = exp2_approx(m_log2[mf][h] - m_use[mf][h]);
                m_log2[mf][h] = m_new[mf][h];
                big |= !(fabsf(m_use[mf][h]) < 0x1p27f);  // NaN too
            }
        if (CLAMP && __any_sync(0xffffffffu, big))
            exponentiate_rows<NF, CLAMP>(s, scale_log2, m_use, alpha);
        else
            exponentiate_rows<NF, false>(s, scale_log2, m_use, alpha);
    }

    // P and the row sums; the sums are pairwise trees (a chain of 2 NF dependent adds would
    // leave the few warps of a scheduler waiting on FADD latency).
    template <int NF, bool CLAMP>
    __device__ __forceinline__ void exponentiate_rows(float (&s)[MF][NF][4], float scale_log2,
                                                      const float (&m_use)[MF][2], const float (&alpha)[MF][2]) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[NF];
#pragma unroll
                for (int nf = 0; nf < NF; ++nf) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const float x = fmaf(s[mf][nf][2 * h + j], scale_log2, -m_use[mf][h]);
                        s[mf][nf][2 * h + j] = exp2_approx(CLAMP ? min_keep_nan(x, 0.f) : x);
                    }
                    v[nf] = s[mf][nf][2 * h] + s[mf][nf][2 * h + 1];
                }
                sum[mf][h] = fmaf(sum[mf][h], alpha[mf][h], tree_reduce(v, [](float a, float b) { return a + b; }));
            }
    }

    // Output accumulators o[MF][DF][4] times the per-row factors of exponentiate().
    template <int DF>
    static __device__ __forceinline__ void rescale(float (&o)[MF][DF][4], const float (&alpha)[MF][2]) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int df = 0; df < DF; ++df) {
                    o[mf][df][2 * h] *= alpha[mf][h];
                    o[mf][df][2 * h + 1] *= alpha[mf][h];
                }
    }

    template <int NF, int DF, bool CLAMP = false>
    __device__ __forceinline__ void rescale_and_exponentiate(float (&s)[MF][NF][4], float (&o)[MF][DF][4],
                                                             float scale_log2, bool neg) {
        float alpha[MF][2];
        exponentiate<NF, CLAMP>(s, scale_log2, neg, alpha);
        rescale(o, alpha);
    }

    // Completes the row sums across the quad; returns 1/sum (0 for an empty row) in inv and the
    // natural-log LSE (-inf for an empty row) in lse. A row is empty iff its sum is exactly 0 (its
    // max key alone contributes ~1 otherwise): a NaN sum, from a NaN or +inf score, must stay NaN
    // in O and LSE rather than pass for an empty row (the max reductions skip NaN scores).
    // sink_log2: an attention sink's logit times log2 e (mods.cuh), or -inf for none.
    __device__ __forceinline__ void finish(float (&inv)[MF][2], float (&lse)[MF][2],
                                           float sink_log2 = -CUDATTN_INF) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float l = sum[mf][h];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                if (sink_log2 != -CUDATTN_INF) {
                    sink_finish(m_log2[mf][h], l, sink_log2, inv[mf][h], lse[mf][h]);
                    continue;
                }
                const bool empty = l == 0.f;
                inv[mf][h] = empty ? 0.f : __frcp_rn(l);
                lse[mf][h] = empty ? -CUDATTN_INF : (m_log2[mf][h] + log2f(l)) * 0.6931471805599453f;
            }
    }
};

}  // namespace cudattn
