// Where one sequence of a batch lies: a padded batch (every sequence seqlen_q x seqlen_k, at its
// batch stride) or a packed variable-length one (FlashAttention's cu_seqlens: the rows of
// sequence b are cu_seqlens[b] .. cu_seqlens[b + 1] - 1 of the packed tensor), how many of its
// keys are used (a KV cache's lengths), and where a paged cache keeps its keys. Offsets and lengths from device memory are the
// caller's to get right; they are clamped here into the tensors' extents, so a bad value gives a
// wrong result for its sequence but never a read or write outside q, k, v or o.
#pragma once
#include "cudattn/params.cuh"

namespace cudattn {

struct SeqSpan {
    int q0, k0;          // first row of the sequence in packed q/o and k/v (0 in a padded batch)
    int seqlen_q, seqlen_k;
    int causal_offset;   // seqlen_k - seqlen_q: query i sees key j iff j <= i + causal_offset
};

__device__ __forceinline__ void clamp_span(const int* cu, int b, int total, int& start, int& len) {
    const int lo = min(max(cu[b], 0), total);
    const int hi = min(max(cu[b + 1], lo), total);
    start = lo;
    len = hi - lo;
}

__device__ __forceinline__ SeqSpan seq_span(const FwdParams& p, int b) {
    SeqSpan s;
    s.q0 = 0;
    s.seqlen_q = p.seqlen_q;
    s.k0 = 0;
    s.seqlen_k = p.seqlen_k;
    if (p.cu_seqlens_q != nullptr) clamp_span(p.cu_seqlens_q, b, p.seqlen_q, s.q0, s.seqlen_q);
    if (p.cu_seqlens_k != nullptr) clamp_span(p.cu_seqlens_k, b, p.seqlen_k, s.k0, s.seqlen_k);
    if (p.kv.seqlens != nullptr) s.seqlen_k = min(max(p.kv.seqlens[b] + p.kv.seqlen_add, 0), s.seqlen_k);
    s.causal_offset = s.seqlen_k - s.seqlen_q;
    return s;
}

// FP8: the first key of sequence b in a packed Vt (fp8_transpose_v.cu). Each sequence's keys
// start on a multiple of 128 (the key permutation counts from there) and are followed by zeros up
// to VT_SEGMENT_PAD keys past its length rounded up to 128, because a key tile of 192 or 256
// reads that far past it. Segments never overlap: 128 * (ceil(k0 / 128) + 2b) grows by at least
// the rounded length + 128 from one sequence to the next. Packed Vt length: vt_key_start(total, B).
constexpr int VT_SEGMENT_PAD = 128;
__device__ __forceinline__ long long vt_key_start(int k0, int b) { return 128ll * ((k0 + 127) / 128 + 2ll * b); }

// FP8: the offset, along a Vt row, of sequence b's first key (0 in a padded batch, whose Vt has a
// batch stride instead).
__device__ __forceinline__ long long vt_first_key(const FwdParams& p, const SeqSpan& s, int b) {
    return p.cu_seqlens_k != nullptr ? vt_key_start(s.k0, b) : 0;
}

}  // namespace cudattn

namespace cudattn {

// A paged cache's page holding sequence b's key j (clamped, as every index read from memory),
// and j's row in it.
__device__ __forceinline__ int cache_page(const KvCacheGeom& kv, int b, int j) {
    const int col = min(j / kv.page_size, kv.max_pages - 1);
    return min(max(kv.block_table[(long long)b * kv.max_pages + col], 0), kv.num_pages - 1);
}

}  // namespace cudattn
