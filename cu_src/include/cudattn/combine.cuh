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
#include "cudattn/ptx.cuh"

#ifndef CUDATTN_INF
#define CUDATTN_INF __int_as_float(0x7f800000)
#endif

namespace cudattn {

// This lane's LSEs: parts lane + 32 j for j < R, read at once (one L2 round trip, where a loop that
// reads each in turn waits one round trip a pass: for 64 parts the max, the sum and the weights each
// took one more, microseconds at the end of a split decode); parts past 32 R are read as needed.
template <int R>
struct LanesLse {
    float x[R];
    template <class LseOf>
    __device__ __forceinline__ void load(int num_parts, int lane, LseOf lse_of) {
#pragma unroll
        for (int j = 0; j < R; ++j) x[j] = lane + 32 * j < num_parts ? lse_of(lane + 32 * j) : -CUDATTN_INF;
    }
    // Part s = lane + 32 j's LSE (s < num_parts): held for j < R (selected without indexing, which
    // would put the array in local memory), else read. One register: the form the merge kernel and
    // the decode builds short of registers compiled to before the others held more (the same SASS).
    template <class LseOf>
    __device__ __forceinline__ float of(int j, int s, LseOf lse_of) const {
        if constexpr (R == 1) {
            return s < 32 ? x[0] : lse_of(s);
        } else {
            float v = x[0];
#pragma unroll
            for (int i = 1; i < R; ++i) v = j == i ? x[i] : v;
            return j < R ? v : lse_of(s);
        }
    }
};

// The row's weights' scale and sum over every lane: m = max of the parts' LSEs and the sink (NaN where
// any LSE is NaN), wsum = sum of exp(LSE - m), each lane's parts in index order.
template <int R, class LseOf>
__device__ __forceinline__ void combine_scale(int num_parts, int lane, LseOf lse_of, float sink, const LanesLse<R>& xs,
                                              float& m_out, float& wsum_out) {
    float m = lane == 0 ? sink : -CUDATTN_INF;
    bool nan = false;  // a NaN LSE makes the row NaN rather than being dropped by fmaxf
    for (int s = lane, j = 0; s < num_parts; s += 32, ++j) {
        const float x = xs.of(j, s, lse_of);
        m = fmaxf(m, x);
        nan |= x != x;
    }
    if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float wsum = 0.f;
    if (m != -CUDATTN_INF)  // NaN m: expf gives NaN, and so does the row
        for (int s = lane, j = 0; s < num_parts; s += 32, ++j) {
            const float x = xs.of(j, s, lse_of);
            if (x != -CUDATTN_INF) wsum += expf(x - m);
        }
    if (lane == 0 && sink != -CUDATTN_INF && m != -CUDATTN_INF) wsum += expf(sink - m);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, k);
    m_out = m;
    wsum_out = wsum;
}

// combine_scale where each part is one lane's (num_parts <= 32; x: this lane's part's LSE, -inf for a
// lane past the last part), without its loops: the same values.
__device__ __forceinline__ void combine_scale_lanes(int lane, float x, float sink, float& m_out, float& wsum_out) {
    float m = fmaxf(lane == 0 ? sink : -CUDATTN_INF, x);
    if (__any_sync(0xffffffffu, x != x)) m = __int_as_float(0x7fffffff);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float wsum = m != -CUDATTN_INF && x != -CUDATTN_INF ? expf(x - m) : 0.f;
    if (lane == 0 && sink != -CUDATTN_INF && m != -CUDATTN_INF) wsum += expf(sink - m);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, k);
    m_out = m;
    wsum_out = wsum;
}

// A part's weight exp(LSE - m), or the mark -1 for a part that saw no key (its O may hold anything)
// or a row of none.
__device__ __forceinline__ float combine_weight(float x, float m, bool empty) {
    return (empty || x == -CUDATTN_INF) ? -1.f : expf(x - m);
}

// acc += w * v where `use` (else acc unchanged): one part's columns into a lane's sums.
__device__ __forceinline__ void add_weighted(float4& acc, float w, const float4& v, bool use) {
    acc.x = use ? fmaf(w, v.x, acc.x) : acc.x;
    acc.y = use ? fmaf(w, v.y, acc.y) : acc.y;
    acc.z = use ? fmaf(w, v.z, acc.z) : acc.z;
    acc.w = use ? fmaf(w, v.w, acc.w) : acc.w;
}

// A merged row's store: this lane's columns of the sums times 1 / wsum; returns the row's LSE.
template <class Out>
__device__ __forceinline__ float combine_store(const float4 (&acc)[2], bool empty, float inv, float m, float wsum,
                                               int head_dim, int lane, typename Out::type* dst) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = lane * 4 + 128 * k;
        if (c < head_dim) Out::store4(dst + c, make_float4(acc[k].x * inv, acc[k].y * inv, acc[k].z * inv, acc[k].w * inv));
    }
    return empty ? -CUDATTN_INF : m + logf(wsum);
}

// Every part's weight (combine_weight) into w_buf (num_parts floats, this warp's), from this lane's
// LSEs read at once; the row's scale m, weight sum, whether it saw no key, and 1 / sum. For the merges
// that compute every weight before their sums (combine_row_staged, combine_cols32).
template <int LSE_REGS, class LseOf>
__device__ __forceinline__ void combine_all_weights(int num_parts, int lane, LseOf lse_of, float sink, float* w_buf,
                                                    float& m, float& wsum, bool& empty, float& inv) {
    LanesLse<LSE_REGS> xs;
    xs.load(num_parts, lane, lse_of);
    combine_scale(num_parts, lane, lse_of, sink, xs, m, wsum);
    empty = m == -CUDATTN_INF;  // every part saw no key (and no sink): O = 0, LSE = -inf
    inv = empty ? 0.f : 1.f / wsum;
    for (int s = lane, j = 0; s < num_parts; s += 32, ++j) w_buf[s] = combine_weight(xs.of(j, s, lse_of), m, empty);
    __syncwarp();
}

// One output row, merged by one warp (all 32 lanes call it). lse_of(s): part s's LSE; load4(s, c):
// part s's elements c..c+3 as float4; dst: the row's output (head_dim elements). Returns the merged
// LSE (every lane), for the caller to store where it wants. Out: an Elem (elem.cuh). sink: an
// attention sink's logit (a part of LSE `sink` and O = 0, counted once here, never in the parts),
// or -inf for none. w_buf: 32 floats of shared memory for this warp alone. IN_FLIGHT: the O loads
// a lane keeps in flight (registers: the merge kernel's 4, the decode kernel's tail 16 or 8).
// LSE_REGS: the LSEs a lane holds (LanesLse).
template <class Out, int IN_FLIGHT = 4, bool PAD = true, int LSE_REGS = 1, class LseOf, class Load4>
__device__ __forceinline__ float combine_row(int num_parts, int head_dim, int lane, LseOf lse_of, Load4 load4,
                                             typename Out::type* dst, float* w_buf, float sink = -CUDATTN_INF) {
    LanesLse<LSE_REGS> xs;
    xs.load(num_parts, lane, lse_of);
    float m, wsum;
    combine_scale(num_parts, lane, lse_of, sink, xs, m, wsum);
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
        float x;
        if constexpr (LSE_REGS == 1)  // (as LanesLse::of: the one-register builds' code as it was)
            x = s0 == 0 ? xs.x[0] : s0 + lane < num_parts ? lse_of(s0 + lane) : -CUDATTN_INF;
        else
            x = s0 + lane < num_parts ? xs.of(s0 / 32, s0 + lane, lse_of) : -CUDATTN_INF;
        __syncwarp();  // the previous chunk's reads are done
        w_buf[lane] = combine_weight(x, m, empty);
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
                add_weighted(acc[k], w, v, use);
            }
        }
    }
    return combine_store<Out>(acc, empty, inv, m, wsum, head_dim, lane, dst);
}

// combine_row with the parts' O rows staged through shared memory (the decode kernel's last split,
// whose shared memory is free by then): this lane's columns of up to `cap` parts at a time are copied
// by cp.async into `stage` (cap * head_dim floats, this warp's alone), the first batch issued before
// the LSEs are read, so that every copy of a batch is in flight at once and beside the LSEs' round
// trip, where loads into registers kept IN_FLIGHT a lane behind it. Each lane reads back only the
// columns it copied, so a lane's own wait orders them. w_buf: num_parts floats for this warp (every
// part's weight, computed once). The same sums in the same order as combine_row: the same bits.
template <class Out, int LSE_REGS, class LseOf, class SrcOf>
__device__ __forceinline__ float combine_row_staged(int num_parts, int head_dim, int lane, LseOf lse_of, SrcOf src_of,
                                                    typename Out::type* dst, float* w_buf, float* stage, int cap,
                                                    float sink = -CUDATTN_INF) {
    auto issue = [&](int s0) {  // parts s0 .. s0 + cap - 1 (those that exist), this lane's columns
        const int n = min(cap, num_parts - s0);
        for (int i = 0; i < n; ++i)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int c = lane * 4 + 128 * k;
                if (c < head_dim) cp_async_16(smem_addr(stage + i * head_dim + c), src_of(s0 + i, c), true);
            }
        cp_async_commit();
    };
    issue(0);
    float m, wsum, inv;
    bool empty;
    combine_all_weights<LSE_REGS>(num_parts, lane, lse_of, sink, w_buf, m, wsum, empty, inv);
    float4 acc[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < num_parts; s0 += cap) {
        const int n = min(cap, num_parts - s0);
        cp_async_wait<0>();  // this lane's copies of the batch have landed
        // Run to a multiple of 8, a slot past n re-reading part n - 1 and not summed, so that the
        // unrolled body's shared-memory reads issue together rather than each after the last's sum.
        const int n_pad = (n + 7) / 8 * 8;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int c = lane * 4 + 128 * k;
            if (c >= head_dim) break;
#pragma unroll 8
            for (int i = 0; i < n_pad; ++i) {
                const int part = min(i, n - 1);
                const float w = w_buf[s0 + part];
                const float4 v = *reinterpret_cast<const float4*>(stage + part * head_dim + c);
                const bool use = i < n && !(w < 0.f);  // NaN too
                add_weighted(acc[k], w, v, use);
            }
        }
        if (s0 + cap < num_parts) issue(s0 + cap);  // (the reads above have completed: their sums used them)
    }
    __syncwarp();  // every lane is done with w_buf before the warp's next row writes it
    return combine_store<Out>(acc, empty, inv, m, wsum, head_dim, lane, dst);
}

// The four part groups' sums of a (row, 32 columns) piece (lanes 8 g + q, g the group) added by a
// fixed shuffle tree, (g0 + g1) + (g2 + g3), into every lane: the same bits every call.
__device__ __forceinline__ void add_part_groups(float4& acc) {
#pragma unroll
    for (int k = 8; k <= 16; k <<= 1) {
        acc.x += __shfl_xor_sync(0xffffffffu, acc.x, k);
        acc.y += __shfl_xor_sync(0xffffffffu, acc.y, k);
        acc.z += __shfl_xor_sync(0xffffffffu, acc.z, k);
        acc.w += __shfl_xor_sync(0xffffffffu, acc.w, k);
    }
}

// A share of a row's merge: its columns c0 .. c0 + 31, merged by one warp, for a merge spread over
// several warps or blocks (the split decode's, store.cuh). Lane 8 g + q sums parts g, g + 4, g + 8, ...
// of columns c0 + 4 q .. c0 + 4 q + 3, in index order, with its first IN_FLIGHT loads issued before the
// LSEs are read (their round trips overlap); the four part groups' sums are then added by a fixed
// shuffle tree ((g0 + g1) + (g2 + g3)), so a part count gives the same bits every call (not those of
// combine_row, whose order differs). w_buf: num_parts floats, this warp's alone. Returns the row's LSE.
template <class Out, int IN_FLIGHT, int LSE_REGS, class LseOf, class Load4>
__device__ __forceinline__ float combine_cols32(int num_parts, int head_dim, int c0, int lane, LseOf lse_of, Load4 load4,
                                                typename Out::type* dst, float* w_buf, float sink = -CUDATTN_INF) {
    const int g = lane >> 3;
    const int c = c0 + (lane & 7) * 4;
    const int c_read = c < head_dim ? c : c0;  // a lane past the row's end reads a column that exists, stores none
    const int per_lane = (num_parts + 3) >> 2;  // the most parts a lane sums (the same for every lane)
    float4 v[IN_FLIGHT];
    const auto issue = [&](int i0) {  // a slot past the last part re-reads it and is not summed
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u) v[u] = load4(min(g + 4 * (i0 + u), num_parts - 1), c_read);
    };
    issue(0);
    float m, wsum, inv;
    bool empty;
    combine_all_weights<LSE_REGS>(num_parts, lane, lse_of, sink, w_buf, m, wsum, empty, inv);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = 0; i0 < per_lane; i0 += IN_FLIGHT) {
        if (i0 > 0) issue(i0);
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u) {
            const int s = g + 4 * (i0 + u);
            const float w = w_buf[min(s, num_parts - 1)];
            add_weighted(acc, w, v[u], s < num_parts && !(w < 0.f));  // NaN weights count
        }
    }
    add_part_groups(acc);
    __syncwarp();  // every lane is done with w_buf before the warp's next share writes it
    if (g == 0 && c < head_dim) Out::store4(dst + c, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
    return empty ? -CUDATTN_INF : m + logf(wsum);
}

// combine_cols32 for K pieces at once where a lane sums at most PER parts of each (num_parts <=
// min(32, 4 PER)): every piece's O loads and LSEs are issued before any piece's sums, so that the
// pieces' round trips overlap where, one piece after another, each waited for its own (a warp with
// four pieces of two parts took about 3 us more than with one, H200). The weights pass lane to lane
// by shuffles (part s's at lane s). Each piece's sums are combine_cols32's, in its order: the same
// bits. lse_of(k, s), load4(k, s, c): piece k's part s; store4(k, c, v): piece k's columns c..c+3
// (called only where valid[k]; a piece not valid must still load from addresses that exist). lse:
// each piece's LSE (every lane).
template <class Out, int K, int PER, class LseOf, class Load4, class Store4>
__device__ __forceinline__ void combine_cols32_batch(int num_parts, int head_dim, const int (&c0)[K],
                                                     const bool (&valid)[K], int lane, LseOf lse_of, Load4 load4,
                                                     const float (&sink)[K], Store4 store4, float (&lse)[K]) {
    const int g = lane >> 3;
    float4 v[K][PER];
    int c[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        c[k] = c0[k] + (lane & 7) * 4;
        const int c_read = c[k] < head_dim ? c[k] : c0[k];
#pragma unroll
        for (int u = 0; u < PER; ++u) v[k][u] = load4(k, min(g + 4 * u, num_parts - 1), c_read);
    }
    float x[K];
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = lane < num_parts ? lse_of(k, lane) : -CUDATTN_INF;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float m, wsum;
        combine_scale_lanes(lane, x[k], sink[k], m, wsum);
        const bool empty = m == -CUDATTN_INF;
        const float inv = empty ? 0.f : 1.f / wsum;
        const float w_lane = combine_weight(x[k], m, empty);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int s = g + 4 * u;
            const float w = __shfl_sync(0xffffffffu, w_lane, min(s, num_parts - 1));
            add_weighted(acc, w, v[k][u], s < num_parts && !(w < 0.f));  // NaN weights count
        }
        add_part_groups(acc);
        if (valid[k] && g == 0 && c[k] < head_dim)
            store4(k, c[k], make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
        lse[k] = empty ? -CUDATTN_INF : m + logf(wsum);
    }
}

}  // namespace cudattn
