// What the scores of a split-KV decode block's main loop (fwd_decode.cuh) take, fixed before it
// starts: their scale (and an e4m3 cache's k descale), and each packed row's key bounds (causal
// and window edges) and ALiBi terms. Results go to the caller's registers (by reference). K is
// the kernel (FwdDecode).
#pragma once
#include "cudattn/decode/setup.cuh"
#include "cudattn/params_decode.cuh"

namespace cudattn {

template <class K>
struct DecodeScores {
    static constexpr bool MODS = K::MODS, KV8 = K::KV8;
    static constexpr int MF = K::MF;

    // The scores' scale (log2 domain) and the softcap's; KV8: the k descale kd scales the scores
    // (with a softcap, inside the tanh: then the score scale does not take it).
    static __device__ __forceinline__ void score_scales(const DecodeParams& p, const DecodeBlock& k, int q_exp,
                                                        float& scale_log2, float& softcap_pre, float& kd) {
        scale_log2 = p.scale_log2, softcap_pre = p.softcap_pre, kd = 1.f;
        if constexpr (KV8) {
            const int i = k.b * p.heads_kv + k.hkv;
            kd = p.k_scale * (p.k_descale != nullptr ? p.k_descale[i] : 1.f) * (p.q_descale != nullptr ? p.q_descale[i] : 1.f) *
                 __int_as_float((127 + q_exp) << 23);
            softcap_pre *= kd;
            if (softcap_pre == 0.f) scale_log2 *= kd;  // without a softcap the score scale takes it
            if (scale_log2 == 0.f) scale_log2 = 1e-30f;  // masked scores are +-inf * scale: 0 makes NaN
        }
    }

    // Per-row key bounds (visible: lo <= key < limit) of this lane's rows, fixed for the whole
    // loop; and with ALiBi, each row's diagonal key and coefficient (its query head's slope,
    // mods.cuh). min_limit: the block's first token's limit; limit_t (KEYS_M): rows 2t and 2t + 1
    // (no window: only the causal edge and L).
    static __device__ __forceinline__ void row_bounds(const DecodeParams& p, const DecodeBlock& k, float kd, int lane,
                                                      int (&limit)[MF][2], int (&lo)[MF][2], float (&diag)[MF][2],
                                                      float (&coef)[MF][2], int& min_limit, int (&limit_t)[2]) {
        const int g = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int gr = k.m_start + mf * 16 + g + 8 * h;
                const int d = gr / p.group + k.cdiff;
                limit[mf][h] = k.right >= 0 ? min(k.L, d + k.right + 1) : k.L;
                lo[mf][h] = k.left >= 0 ? d - k.left : 0;
                diag[mf][h] = (float)(d + p.alibi_shift);  // ALiBi's diagonal (params_decode.cuh)
                coef[mf][h] = MODS && p.alibi != nullptr
                                  ? p.alibi_mul * p.alibi[(long long)k.b * p.alibi_stride_b + k.hkv * p.group + gr % p.group] /
                                        (p.softcap_pre == 0.f ? kd : 1.f)  // raw-score units (mods.cuh)
                                  : 0.f;
            }
        min_limit = k.right >= 0 ? min(k.L, k.t_first + k.cdiff + k.right + 1) : k.L;
#pragma unroll
        for (int j = 0; j < 2; ++j)
            limit_t[j] = k.right >= 0 ? min(k.L, (k.m_start + 2 * tq + j) / p.group + k.cdiff + k.right + 1) : k.L;
    }
};

}  // namespace cudattn
