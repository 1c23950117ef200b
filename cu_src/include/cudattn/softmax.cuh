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
    // BOUNDED (bounded_scores(), mods.cuh): softcapped scores never exceed c = scale_log2, so c
    // stands in for every row's max: no reduction, and no exponent waits on the rest of its row.
    // P = exp2(s c - c) is the same P relative to the row's true max, in [2^-2c, 1]: inside
    // bfloat16's (float32's) normal range for c <= 50. alpha is 0 on a row's first tile, then 1.
    template <int NF, bool CLAMP = false>
    __device__ __forceinline__ void exponentiate(float (&s)[MF][NF][4], float scale_log2, bool neg,
                                                 float (&alpha)[MF][2], bool bounded = false) {
        if (bounded) {
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) m_new[mf][0] = m_new[mf][1] = scale_log2;
        } else if (neg)
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
                                                             float scale_log2, bool neg, bool bounded = false) {
        float alpha[MF][2];
        exponentiate<NF, CLAMP>(s, scale_log2, neg, alpha, bounded);
        if (!bounded) rescale(o, alpha);  // bounded: alpha is 1, or 0 while O is still 0
    }

    // Completes the row sums across the quad; returns 1/sum (0 for an empty row) in inv and the
    // natural-log LSE (-inf for an empty row) in lse. A row is empty iff its sum is exactly 0 (its
    // max key alone contributes ~1 otherwise): a NaN sum, from a NaN or +inf score, must stay NaN
    // in O and LSE rather than pass for an empty row (the max reductions skip NaN scores).
    // sink_log2: an attention sink's logit times log2 e (mods.cuh), or -inf for none. want_lse
    // false (a call that stores no LSE): lse is left 0, without the precise log2f (~30
    // instructions a row at every tile's end).
    __device__ __forceinline__ void finish(float (&inv)[MF][2], float (&lse)[MF][2],
                                           float sink_log2 = -CUDATTN_INF, bool want_lse = true) {
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
                lse[mf][h] = 0.f;  // an if, not a select: the compiler folds a select and keeps the log2f
                if (want_lse) lse[mf][h] = empty ? -CUDATTN_INF : (m_log2[mf][h] + log2f(l)) * 0.6931471805599453f;
            }
    }
};


// The online softmax of a transposed S tile (S^T = K Q^T: keys on the MMA's 16-wide dimension,
// 8 packed rows on its 8-wide one; the split-KV decode kernel's keys-as-M builds). A lane holds
// rows 2t and 2t+1 (t = lane % 4) at keys g and g+8 of each 16-key fragment (g = lane / 4), in
// accumulators (0, 1) and (2, 3): a row's keys are spread over the 8 lanes of equal t, so its
// reductions are three xor-shuffles (4, 8, 16). Same conventions as OnlineSoftmax.
struct TransposedSoftmax {
    float m_log2[2], sum[2];

    __device__ __forceinline__ void init() {
        m_log2[0] = m_log2[1] = -CUDATTN_INF;
        sum[0] = sum[1] = 0.f;
    }

    // s: KF fragments of S^T, turned into P in place; o: the DC chunks of O^T (accumulators 0, 2
    // row 2t, 1, 3 row 2t+1), rescaled.
    template <int KF, int DC>
    __device__ __forceinline__ void rescale_and_exponentiate(float (&s)[KF][4], float (&o)[DC][4], float scale_log2,
                                                             bool neg) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float v[2 * KF];
#pragma unroll
            for (int kf = 0; kf < KF; ++kf) {
                v[2 * kf] = s[kf][j];
                v[2 * kf + 1] = s[kf][2 + j];
            }
            float x = neg ? tree_reduce(v, [](float a, float b) { return fminf(a, b); })
                          : tree_reduce(v, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
            for (int lanes = 4; lanes < 32; lanes *= 2) {
                const float y = __shfl_xor_sync(0xffffffffu, x, lanes);
                x = neg ? fminf(x, y) : fmaxf(x, y);
            }
            const float m_new = fmaxf(m_log2[j], x * scale_log2);  // masked: +-inf * scale = -inf
            const float m_use = m_new == -CUDATTN_INF ? 0.f : m_new;
            const float alpha = exp2_approx(m_log2[j] - m_use);
            m_log2[j] = m_new;
#pragma unroll
            for (int kf = 0; kf < KF; ++kf) {
                s[kf][j] = exp2_approx(fmaf(s[kf][j], scale_log2, -m_use));
                s[kf][2 + j] = exp2_approx(fmaf(s[kf][2 + j], scale_log2, -m_use));
                v[2 * kf] = s[kf][j];
                v[2 * kf + 1] = s[kf][2 + j];
            }
            sum[j] = fmaf(sum[j], alpha, tree_reduce(v, [](float a, float b) { return a + b; }));
#pragma unroll
            for (int dc = 0; dc < DC; ++dc) {
                o[dc][j] *= alpha;
                o[dc][2 + j] *= alpha;
            }
        }
    }
};

}  // namespace cudattn
