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
// or -inf for none. w_buf: 32 floats of shared memory for this warp alone. IN_FLIGHT: the O loads
// a lane keeps in flight (registers: the merge kernel's 4, the decode kernel's tail 16 or 8).
template <class Out, int IN_FLIGHT = 4, bool PAD = true, class LseOf, class Load4>
__device__ __forceinline__ float combine_row(int num_parts, int head_dim, int lane, LseOf lse_of, Load4 load4,
                                             typename Out::type* dst, float* w_buf, float sink = -CUDATTN_INF) {
    // This lane's parts are lane, lane + 32, ...: the first one's LSE is read once, for all passes.
    const float x0 = lane < num_parts ? lse_of(lane) : -CUDATTN_INF;
    float m = lane == 0 ? sink : -CUDATTN_INF;
    bool nan = false;  // a NaN LSE makes the row NaN rather than being dropped by fmaxf
    for (int s = lane; s < num_parts; s += 32) {
        const float x = s < 32 ? x0 : lse_of(s);  // s = lane + 32 k
        m = fmaxf(m, x);
        nan |= x != x;
    }
    if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float wsum = 0.f;
    if (m != -CUDATTN_INF)  // NaN m: expf gives NaN, and so does the row
        for (int s = lane; s < num_parts; s += 32) {
            const float x = s < 32 ? x0 : lse_of(s);  // s = lane + 32 k
            if (x != -CUDATTN_INF) wsum += expf(x - m);
        }
    if (lane == 0 && sink != -CUDATTN_INF && m != -CUDATTN_INF) wsum += expf(sink - m);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, k);

    const bool empty = m == -CUDATTN_INF;  // every part saw no key (and no sink): O = 0, LSE = -inf
    const float inv = empty ? 0.f : 1.f / wsum;
    // O: the weights of 32 parts at a time are computed a lane a part and handed over through
    // w_buf (this warp's 32 floats of shared memory), so that the loads of successive parts do not
    // wait on each other (a part's LSE, then its O, one after the other: two L2 round trips a
    // part, microseconds at the end of every split decode call). An empty part (LSE -inf: its O may
    // hold anything) is loaded too, then dropped by its weight's mark -1; every other part counts,
    // so a NaN or inf in its O or weight reaches the row.
    float4 acc[2];  // columns lane * 4 + 128 k, k < 2: head dims up to 256
#pragma unroll
    for (int k = 0; k < 2; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < num_parts; s0 += 32) {
        const float x = s0 == 0 ? x0 : s0 + lane < num_parts ? lse_of(s0 + lane) : -CUDATTN_INF;
        __syncwarp();  // the previous chunk's reads are done
        w_buf[lane] = (empty || x == -CUDATTN_INF) ? -1.f : expf(x - m);
        __syncwarp();
        const int n = min(32, num_parts - s0);
        // Run to a multiple of IN_FLIGHT, a slot past n re-reading part n - 1 and not summed: the
        // unrolled body issues its loads together, where a remainder loop (a part count not a
        // multiple of IN_FLIGHT) issued them one after another, each waiting for the last.
        // (PAD false: the plain loop, for builds with no register to spare.)
        const int n_pad = PAD ? (n + IN_FLIGHT - 1) / IN_FLIGHT * IN_FLIGHT : n;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int c = lane * 4 + 128 * k;
            if (c >= head_dim) break;
#pragma unroll IN_FLIGHT
            for (int i = 0; i < n_pad; ++i) {
                const int part = PAD ? min(i, n - 1) : i;
                const float w = w_buf[part];
                const float4 v = load4(s0 + part, c);
                const bool use = (!PAD || i < n) && !(w < 0.f);  // NaN too
                acc[k].x = use ? fmaf(w, v.x, acc[k].x) : acc[k].x;
                acc[k].y = use ? fmaf(w, v.y, acc[k].y) : acc[k].y;
                acc[k].z = use ? fmaf(w, v.z, acc[k].z) : acc[k].z;
                acc[k].w = use ? fmaf(w, v.w, acc[k].w) : acc[k].w;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = lane * 4 + 128 * k;
        if (c < head_dim) Out::store4(dst + c, make_float4(acc[k].x * inv, acc[k].y * inv, acc[k].z * inv, acc[k].w * inv));
    }
    return empty ? -CUDATTN_INF : m + logf(wsum);
}

}  // namespace cudattn
