// P and dS of one transposed score tile: the backward computes S^T = K.Q^T, so a warp's
// accumulator fragments hold KF 16-key row fragments by MF 8-query column fragments (thread
// element e of fragment (kf, mf): key key0 + kf*16 + g + 8*(e/2), query col0 + mf*8 + 2t + e%2,
// g = lane/4, t = lane%4). Keys are rows here, so the modifiers and masks of mods.cuh / mask.cuh
// are applied with the roles of rows and columns swapped.
#pragma once
#include "cudattn/mods.cuh"
#include "cudattn/ptx.cuh"
#include "cudattn/seqlen.cuh"

namespace cudattn {

// Where a query column and a key row of a tile meet, what the mask rules say: the query exists,
// the key exists, causal (bottom right), and the window's two edges (-1: open).
struct BwdMask {
    int seqlen_q, seqlen_k, causal_offset, left, right;  // left/right: -1 open; right already 0 for causal
    __device__ __forceinline__ bool visible(int key, int q) const {
        const int diag = q + causal_offset;
        return q < seqlen_q && key < seqlen_k && (right < 0 || key <= diag + right) && (left < 0 || key >= diag - left);
    }
};

// A call's mask rules (the forward's description of it, one sequence's span): causal's right
// edge is 0, a window's edges where it has one.
template <bool CAUSAL>
__device__ __forceinline__ BwdMask bwd_mask(const FwdParams& p, const SeqSpan& sq) {
    const int wl = p.has_window ? p.window_left : -1;
    const int wr = CAUSAL ? 0 : (p.has_window ? p.window_right : -1);
    return BwdMask{sq.seqlen_q, sq.seqlen_k, sq.causal_offset, wl, wr};
}

// p = exp2(z * scale_log2 - lse2[query]) with z the score after the modifiers; masked entries 0.
// alibi_shift: ALiBi's diagonal past the mask's (FwdParams::alibi_shift), passed from the kernel's
// parameters, not kept in BwdMask. ALiBi's distance is one base a tile plus each element's constant
// offsets: with the distance from key and q (and the shift a register more), the portable causal
// ALiBi builds at head dims 64 and 192 spilled on sm_80.
// SOFTCAP: s keeps t = tanh(x * softcap_pre) for dS (p is then another array); otherwise p may be s.
// lse2s: the block's lse2 in shared memory, indexed by the query's column in the tile.
template <int MODS, int KF, int MF>
__device__ __forceinline__ void bwd_probs(float (&s)[KF][MF][4], float (&p)[KF][MF][4], const float* lse2s,
                                          float scale_log2, float softcap_pre, float alibi, int alibi_shift, int key0,
                                          int col0, bool masked, const BwdMask& mask, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int adiag = key0 - col0 - mask.causal_offset - alibi_shift;  // ALiBi: key - q - its diagonal, at (key0, col0)
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2s + mf * 8 + 2 * t);
#pragma unroll
        for (int kf = 0; kf < KF; ++kf)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + kf * 16 + g + 8 * (e >> 1), q = col0 + mf * 8 + 2 * t + (e & 1);
                float x = s[kf][mf][e];
                if constexpr ((MODS & MOD_SOFTCAP) != 0) {
                    x = tanh_approx(x * softcap_pre);
                    s[kf][mf][e] = x;
                }
                if constexpr ((MODS & MOD_ALIBI) != 0) x = fmaf(alibi, fabsf((float)(adiag + (kf * 16 + g + 8 * (e >> 1)) - (mf * 8 + 2 * t + (e & 1)))), x);
                float v = exp2_approx(fmaf(x, scale_log2, -((e & 1) ? l2.y : l2.x)));
                if (masked && !mask.visible(key, q)) v = 0.f;
                p[kf][mf][e] = v;
            }
    }
}

// dS = P * (dP - D) (times dtanh = 1 - t^2 with a softcap), in place of dP. dsums: the block's D.
template <int MODS, int KF, int MF>
__device__ __forceinline__ void bwd_dscores(float (&dp)[KF][MF][4], const float (&p)[KF][MF][4],
                                            const float (&s)[KF][MF][4], const float* dsums, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
        const float2 d = *reinterpret_cast<const float2*>(dsums + mf * 8 + 2 * t);
#pragma unroll
        for (int kf = 0; kf < KF; ++kf)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = p[kf][mf][e] * (dp[kf][mf][e] - ((e & 1) ? d.y : d.x));
                if constexpr ((MODS & MOD_SOFTCAP) != 0) v *= fmaf(-s[kf][mf][e], s[kf][mf][e], 1.f);
                dp[kf][mf][e] = v;
            }
    }
}

}  // namespace cudattn
