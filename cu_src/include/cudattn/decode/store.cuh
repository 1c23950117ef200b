// Where a split-KV decode block's results go (fwd_decode.cuh): with one split, the final O and
// LSE; with several, the split's normalised partial O and LSE, and the last split of a block of
// rows to arrive merges the partials into the output (combine.cuh). K is the kernel (FwdDecode).
#pragma once
#include "cudattn/combine.cuh"
#include "cudattn/params_decode.cuh"
#include "cudattn/tile_products.cuh"

namespace cudattn {

template <class K>
struct DecodeStore {
    typedef typename K::T T;
    static constexpr int NT = K::NT, NW = K::NW, SMEM_BYTES = K::SMEM_BYTES;
    // The merge's loads in flight a lane (combine_row): 16, padded to whole batches; FP8-cache builds
    // (several blocks an SM: registers bound them) and the two-fragment builds with modifiers (every
    // register used by their main loop; anything more spilled) keep the plain loop of 8.
    static constexpr bool MERGE_TIGHT = K::KV8 || (K::MODS && K::MF > 1);
    static constexpr int MERGE_IN_FLIGHT = MERGE_TIGHT ? 8 : 16;
    // The most splits a call has (_spec/validate.py's MAX_SPLITS, cudattn.h's CUDATTN_MAX_SPLITS).
    static constexpr int MAX_SPLITS = 128;
    // The LSEs a lane holds in the merge (combine.cuh's LanesLse): every split's, read at once; the
    // tight builds hold one, as they always did (their SASS unchanged).
    static constexpr int MERGE_LSE_REGS = MAX_SPLITS / 32;
    // Where a warp merges more than one row of more than 32 parts and shared memory holds 8 parts or
    // more a warp, the merge stages the parts there (combine_row_staged: after a 128-byte flag,
    // MAX_SPLITS weights a warp, then each warp's MERGE_PARTS parts of head-dim floats), so that a
    // row's copies are all in flight beside its LSEs' round trip rather than each row's round trips
    // in turn: 8 rows of 64 splits on 4 warps merged 3.5-4 us sooner (H200). A warp of one row, or
    // rows of 32 parts or fewer (a round trip or two a row), keep the loads into registers, which were
    // as quick or quicker there. Not the tight builds: their registers are spoken for (the staged
    // sums' unrolled reads spilled in the 8-warp FP8-cache build).
    static constexpr int MERGE_STAGE_OFF = 128 + NW * MAX_SPLITS * 4;
    static constexpr int MERGE_FIT = (SMEM_BYTES - MERGE_STAGE_OFF) / NW / (K::D * 4);
    static constexpr int MERGE_PARTS = MERGE_FIT < MAX_SPLITS ? MERGE_FIT : MAX_SPLITS;
    static constexpr bool MERGE_STAGED = !MERGE_TIGHT && MERGE_PARTS >= 8;

    // With splits: count this block's arrival at its block of rows; the last of the num_splits
    // blocks to arrive merges their partials into the output (and LSE) and resets the counter for
    // the next kernel on the stream. The block barrier orders every thread's partial stores before
    // one thread's arrival, an add with release and acquire (GPU scope), as cooperative groups' and
    // CUTLASS's grid barriers arrive; the last block's threads read the partials from L2 after the
    // barrier that follows it. (Every thread's __threadfence before the arrival and again before the
    // reads, as before, took 0.2-0.5 us more of a 10-27 us call, H200.)
    static __device__ __forceinline__ void combine_if_last(const DecodeParams& p, int b, int hkv, int m_block,
                                                           int m_start, int rows_valid) {
        if (p.num_splits == 1) return;
        extern __shared__ __align__(128) unsigned char smem_raw[];
        volatile int* last = reinterpret_cast<volatile int*>(smem_raw);
        __syncthreads();  // every thread's partial stores made; shared memory (the merge buffer) is free again
        if constexpr (!MERGE_TIGHT) {
            if (p.merge_ctas > 1) return combine_spread(p, b, hkv, m_block, m_start, rows_valid);
        }
        if (threadIdx.x == 0) {
            int* c = p.counters + ((long long)b * p.heads_kv + hkv) * p.num_m_blocks + m_block;
            const bool is_last = atom_add_acq_rel_gpu(c, 1) == p.num_splits - 1;
            if (is_last) *c = 0;  // every split has arrived; nothing else touches it in this kernel
            *last = is_last;
        }
        __syncthreads();
        if (!*last) return;
        static_assert(SMEM_BYTES >= 128 + NW * 32 * 4, "the merge's weight buffers fit in shared memory");
        float* w_all = reinterpret_cast<float*>(smem_raw + 128);  // part weights, per warp
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
            const auto lse_of = [lse_row, part_rows](int s) { return __ldcg(lse_row + s * part_rows); };
            T* dst = static_cast<T*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + hq * p.o_stride_h;
            const float sink = p.sinks != nullptr ? p.sinks[hq] : -CUDATTN_INF;  // the partials exclude it: it joins here, once
            float lse;
            if (MERGE_STAGED && rows_valid > NW && p.num_splits > 32) {
                float* stage = reinterpret_cast<float*>(smem_raw + MERGE_STAGE_OFF) + warp * MERGE_PARTS * K::D;
                lse = combine_row_staged<Out, MERGE_LSE_REGS>(
                    p.num_splits, p.head_dim, lane, lse_of,
                    [o_row, o_part_stride](int s, int c) { return o_row + s * o_part_stride + c; }, dst,
                    w_all + MAX_SPLITS * warp, stage, MERGE_PARTS, sink);
            } else {
                lse = combine_row<Out, MERGE_IN_FLIGHT, !MERGE_TIGHT, MERGE_TIGHT ? 1 : MERGE_LSE_REGS>(
                    p.num_splits, p.head_dim, lane, lse_of,
                    [o_row, o_part_stride](int s, int c) { return Elem<0>::load4_l2(o_row + s * o_part_stride + c); },
                    dst, w_all + 32 * warp, sink);
            }
            if (p.write_lse && lane == 0) p.lse[row] = lse;
        }
    }

    // The merge spread over the last g = merge_ctas blocks of a block of rows to arrive (the host asks
    // for it where the whole grid fits on the SMs at once and there are few rows: the last block's
    // merge of 64 parts alone was 3-9 us of a 17-35 us call, H200). Each share is a set of (row, 32 columns)
    // pieces, a warp a piece (combine_cols32), or up to four at once where the parts are few
    // (combine_cols32_batch). Arrival ticket t of n: the last (t = n - 1) takes share 0 and resets the
    // counter at once; t >= n - g takes share n - 1 - t after waiting for the last
    // (the counter at n, or reset below its ticket). The counter's low 15 bits count arrivals (128 splits
    // at most), bits 15-30 the shares given up (16 sharers at most); a block
    // that has waited SPREAD_WAIT_NS (a device shared with other work, where the blocks it waits for
    // might not find an SM while it holds one) gives its share to the last by setting bit 15 + share,
    // by compare-and-swap so that it can only do so before the last arrives: the last reads the bits in
    // its own arrival's result, and merges those shares too. Every share is merged once, by one block.
    // (A test builds it with 0, so that the waiting blocks give their shares up at once.)
#ifndef CUDATTN_SPREAD_WAIT_NS
#define CUDATTN_SPREAD_WAIT_NS 20000
#endif
    static constexpr unsigned long long SPREAD_WAIT_NS = CUDATTN_SPREAD_WAIT_NS;
    static constexpr int SHARE_BIT = 15;

    // True once the last block has arrived; false where this block gave its share to the last instead.
    static __device__ __forceinline__ bool wait_for_last(int* c, int ticket, int n, int share) {
        const unsigned long long t0 = globaltimer_ns();
        for (;;) {
            const int v = ld_acquire_gpu(c);
            const int arrived = v & ((1 << SHARE_BIT) - 1);
            if (arrived >= n || arrived <= ticket) return true;
            if (globaltimer_ns() - t0 > SPREAD_WAIT_NS && atomicCAS(c, v, v | (1 << (SHARE_BIT + share))) == v)
                return false;
        }
    }

    // Inline: as a function of its own (its registers apart), the call into code placed after the
    // kernel's, fetched cold by every block, cost 0.5-0.9 us of a 10-17 us call (H200); inlined, the
    // builds that spread their merge take 202-250 registers, none spilled.
    static __device__ __forceinline__ void combine_spread(const DecodeParams& p, int b, int hkv, int m_block,
                                                          int m_start, int rows_valid) {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        volatile int* shares = reinterpret_cast<volatile int*>(smem_raw);  // this block's shares, a bit each
        const int n = p.num_splits, g = min(min(p.merge_ctas, n), 31 - SHARE_BIT);  // a bit each below the sign
        int* c = p.counters + ((long long)b * p.heads_kv + hkv) * p.num_m_blocks + m_block;
        if (threadIdx.x == 0) {
            const int old = atom_add_acq_rel_gpu(c, 1);  // releases this block's partials, acquires theirs
            const int ticket = old & ((1 << SHARE_BIT) - 1);
            int mine = 0;
            if (ticket == n - 1) {
                atomicExch(c, 0);  // every split has arrived; the shares given up are in `old`
                mine = 1 | (old >> SHARE_BIT);
            } else if (ticket >= n - g && wait_for_last(c, ticket, n, n - 1 - ticket)) {
                mine = 1 << (n - 1 - ticket);
            }
            *shares = mine;
        }
        __syncthreads();
        const int mine = *shares;
        if (mine == 0) return;  // (the arrival or the wait's acquiring load, then the barrier, ordered the reads)
        for (int s = 0; s < g; ++s)
            if (mine >> s & 1) merge_share(p, b, hkv, m_start, rows_valid, s, g);
    }

    // A warp's pieces merged together (combine_cols32_batch) where it has two or more of few parts:
    // MERGE_BATCH at a time, each lane summing at most MERGE_BATCH_PER parts of each (H200, bf16, one
    // token, 32 query heads on one kv head, GPU us: 32 sequences at 2048 keys, 2 splits, four pieces a
    // warp, 25.6 -> 21.8; head dim 64 19.7 -> 17.3; 32 sequences at 8192 keys, 4 splits of two
    // fragments, 50.3 -> 46.6). (A test builds it with CUDATTN_MERGE_BATCH=0, a piece at a time: the
    // same bits.)
#ifndef CUDATTN_MERGE_BATCH
#define CUDATTN_MERGE_BATCH 1
#endif
    static constexpr bool MERGE_BATCHED = CUDATTN_MERGE_BATCH;
    static constexpr int MERGE_BATCH = 4;
    static constexpr int MERGE_BATCH_PER = 2;
    static constexpr int MERGE_BATCH_PARTS = 4 * MERGE_BATCH_PER;

    // Share `share` of g: pieces (row, 32 columns) share * NW + warp, then every g * NW after it.
    static __device__ __forceinline__ void merge_share(const DecodeParams& p, int b, int hkv, int m_start,
                                                       int rows_valid, int share, int g) {
        static_assert(SMEM_BYTES >= 128 + NW * MAX_SPLITS * 4, "every part's weight, a warp's, fits in shared memory");
        extern __shared__ __align__(128) unsigned char smem_raw[];
        typedef typename ElemOf<T>::type Out;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        float* w_buf = reinterpret_cast<float*>(smem_raw + 128) + MAX_SPLITS * warp;
        const int col_pieces = (p.head_dim + 31) / 32;
        const long long part_rows = (long long)p.batch * p.heads_q * p.seqlen_q;
        const long long o_part_stride = part_rows * p.head_dim;
        const int pieces = rows_valid * col_pieces, first = share * NW + warp, step = g * NW;
        // Piece it's output row (b, hq, t), its columns' start and where its merged columns go.
        const auto piece = [&](int it, long long& row, int& c0, T*& dst, float& sink) {
            const int gr = m_start + it / col_pieces;
            c0 = it % col_pieces * 32;
            const int t = gr / p.group, hq = hkv * p.group + gr % p.group;
            row = ((long long)b * p.heads_q + hq) * p.seqlen_q + t;
            dst = static_cast<T*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + hq * p.o_stride_h;
            sink = p.sinks != nullptr ? p.sinks[hq] : -CUDATTN_INF;
        };
        if (MERGE_BATCHED && p.num_splits <= MERGE_BATCH_PARTS && first + step < pieces) {
            for (int it0 = first; it0 < pieces; it0 += MERGE_BATCH * step) {
                long long row[MERGE_BATCH];
                int c0[MERGE_BATCH];
                T* dst[MERGE_BATCH];
                float sink[MERGE_BATCH], lse[MERGE_BATCH];
                bool valid[MERGE_BATCH];
#pragma unroll
                for (int k = 0; k < MERGE_BATCH; ++k) {
                    valid[k] = it0 + k * step < pieces;  // one past the end reads the batch's first piece
                    piece(valid[k] ? it0 + k * step : it0, row[k], c0[k], dst[k], sink[k]);
                }
                combine_cols32_batch<Out, MERGE_BATCH, MERGE_BATCH_PER>(
                    p.num_splits, p.head_dim, c0, valid, lane,
                    [&](int k, int s) { return __ldcg(p.lse_part + row[k] + s * part_rows); },
                    [&](int k, int s, int c) {
                        return Elem<0>::load4_l2(p.o_part + row[k] * p.head_dim + s * o_part_stride + c);
                    },
                    sink, [&](int k, int c, float4 v) { Out::store4(dst[k] + c, v); }, lse);
                if (p.write_lse && lane == 0)
#pragma unroll
                    for (int k = 0; k < MERGE_BATCH; ++k)
                        if (valid[k] && c0[k] == 0) p.lse[row[k]] = lse[k];
            }
            return;
        }
        for (int it = first; it < pieces; it += step) {
            long long row;
            int c0;
            T* dst;
            float sink;
            piece(it, row, c0, dst, sink);
            const float* lse_row = p.lse_part + row;
            const float* o_row = p.o_part + row * p.head_dim;
            const float lse = combine_cols32<Out, MERGE_IN_FLIGHT, MERGE_LSE_REGS>(
                p.num_splits, p.head_dim, c0, lane, [lse_row, part_rows](int s) { return __ldcg(lse_row + s * part_rows); },
                [o_row, o_part_stride](int s, int c) { return Elem<0>::load4_l2(o_row + s * o_part_stride + c); }, dst,
                w_buf, sink);
            if (p.write_lse && c0 == 0 && lane == 0) p.lse[row] = lse;
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
