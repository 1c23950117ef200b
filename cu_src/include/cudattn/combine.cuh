// Merging attention states computed over disjoint key sets: O = sum_s w_s O_s / sum_s w_s,
// LSE = m + log sum_s w_s, with m = max_s LSE_s and w_s = exp(LSE_s - m). Each O_s is already
// normalised over its own keys, so it is reweighted by exp(LSE_s - m) only (never by its own row
// sum too: that counts it twice). Parts with LSE -inf saw no key and are skipped (their O may be
// anything); a row whose parts are all -inf gets O = 0, LSE = -inf. One warp per output row; the
// parts are summed in index order and the lanes' partial sums reduced by a fixed shuffle tree, so
// results are bit-reproducible. Used by the combine kernel (split_kv_combine.cu: the parts given
// to cudattn.merge_attention_states) and by the decode kernel's last split of each block of rows.
#pragma once
#include "cudattn/elem.cuh"

#ifndef CUDATTN_INF
#define CUDATTN_INF __int_as_float(0x7f800000)
#endif

namespace cudattn {

// One output row, merged by one warp (all 32 lanes call it). lse_of(s): part s's LSE; load4(s, c):
// part s's elements c..c+3 as float4; dst: the row's output (head_dim elements). Returns the merged
// LSE (every lane), for the caller to store where it wants. Out: an Elem (elem.cuh). sink: an
// attention sink's logit (a part of LSE `sink` and O = 0, counted once here, never in the parts),
// or -inf for none.
template <class Out, class LseOf, class Load4>
__device__ __forceinline__ float combine_row(int num_parts, int head_dim, int lane, LseOf lse_of, Load4 load4,
                                             typename Out::type* dst, float sink = -CUDATTN_INF) {
    float m = lane == 0 ? sink : -CUDATTN_INF;
    bool nan = false;  // a NaN LSE makes the row NaN rather than being dropped by fmaxf
    for (int s = lane; s < num_parts; s += 32) {
        const float x = lse_of(s);
        m = fmaxf(m, x);
        nan |= x != x;
    }
    if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float wsum = 0.f;
    if (m != -CUDATTN_INF)  // NaN m: expf gives NaN, and so does the row
        for (int s = lane; s < num_parts; s += 32) {
            const float x = lse_of(s);
            if (x != -CUDATTN_INF) wsum += expf(x - m);
        }
    if (lane == 0 && sink != -CUDATTN_INF && m != -CUDATTN_INF) wsum += expf(sink - m);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, k);

    const bool empty = m == -CUDATTN_INF;  // every part saw no key (and no sink): O = 0, LSE = -inf
    const float inv = empty ? 0.f : 1.f / wsum;
    for (int c = lane * 4; c < head_dim; c += 128) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!empty)
            for (int s = 0; s < num_parts; ++s) {
                const float x = lse_of(s);
                if (x == -CUDATTN_INF) continue;
                const float w = expf(x - m);
                const float4 v = load4(s, c);
                acc.x = fmaf(w, v.x, acc.x);
                acc.y = fmaf(w, v.y, acc.y);
                acc.z = fmaf(w, v.z, acc.z);
                acc.w = fmaf(w, v.w, acc.w);
            }
        Out::store4(dst + c, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
    }
    return empty ? -CUDATTN_INF : m + logf(wsum);
}

}  // namespace cudattn
