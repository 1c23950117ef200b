// Kernel parameters, passed BY VALUE as the single kernel argument.
// Mirrored field for field by cudattn/_kernels/params.py (ctypes); change both together.
#pragma once

// A KV cache, contiguous or paged. Key j of sequence b lives at
//   base + page(b, j) * stride_page + (j % page_size) * stride_s + head * stride_h
// with page(b, j) = block_table[b * max_pages + j / page_size] when paged. A contiguous cache is
// one "page" per sequence: page(b, j) = b and page_size = capacity, so the same formula serves.
struct KvCacheGeom {
    const int* block_table;  // (B, max_pages) int32, or null: contiguous
    const int* seqlens;      // (B,) int32 valid keys per sequence before appending, or null: capacity
    int page_size;           // keys per page (a multiple of 16); the capacity when contiguous
    int max_pages;           // columns of block_table (1 when contiguous)
    int num_pages;           // pages in the cache; page ids are clamped into [0, num_pages)
    int capacity;            // keys a sequence can hold: max_pages * page_size
    int seqlen_add;          // keys appended before attending (k_new's length): added to seqlens[b]
    int pad_;
};

struct FwdParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;  // (B, Hq, Sq) float32, contiguous; written only when write_lse != 0

    // Element strides (64-bit) in (batch, seq, head) order; the head-dim axis has unit stride.
    long long q_stride_b, q_stride_s, q_stride_h;
    long long k_stride_b, k_stride_s, k_stride_h;
    long long v_stride_b, v_stride_s, v_stride_h;
    long long o_stride_b, o_stride_s, o_stride_h;

    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int group;          // heads_q / heads_kv: query head h reads kv head h / group
    int head_dim;       // the real D; the kernel's tile width may be larger (zero padded)
    int causal_offset;  // seqlen_k - seqlen_q: query i sees key j iff j <= i + causal_offset
    float scale_log2;   // softmax scale * log2(e); nonzero, either sign
    int num_m_blocks;
    int write_lse;
    int pad_;

    // FP8 only (ignored by the 16-bit kernels). v then points at Vt (batch, heads_kv, head_dim,
    // seqlen_k rounded up to 128), keys contiguous and permuted per 32 (fp8.cuh); v_stride_s is
    // the stride between its head-dim rows. Descale arrays: (batch, heads_kv) float32,
    // C-contiguous, or null (scalars are folded into scale_log2 and out_scale on the host).
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    float out_scale;  // multiplies O with 1/rowsum: the scalar v_descale, else 1
    int pad2_;

    // Variable lengths (seqlen.cuh); null for a padded batch. cu_seqlens_q / cu_seqlens_k:
    // (batch + 1) int32 offsets of each sequence's rows in packed q and o / k and v, whose batch
    // strides are then 0 and whose seqlen_q / seqlen_k are the packed totals (the LSE is then
    // (heads_q, total_q)). Every value read is clamped into the tensors.
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    // k and v as a KV cache (chunked prefill): per-sequence lengths (kv.seqlens, plus
    // kv.seqlen_add appended keys) and, paged, the block table; k/v_stride_b then step pages.
    // All zero otherwise.
    KvCacheGeom kv;

    // Sliding window (mask.cuh), when has_window: query i sees key j iff
    // i + causal_offset - window_left <= j <= i + causal_offset + window_right, a bound of -1
    // leaving that side open (causal kernels take right = 0 whatever window_right says).
    int has_window, window_left, window_right, pad4_;

    // Score modifiers (mods.cuh). sinks: (heads_q,) float32 logits joining every row's softmax
    // denominator, or null. alibi: slopes, alibi[b * alibi_stride_b + h] (stride 0: one per
    // head), read by ALIBI builds. softcap_pre (SOFTCAP builds): raw scores s become
    // tanh(s * softcap_pre), softcap_pre = scale / softcap, and scale_log2 is then
    // softcap * log2(e). alibi_mul turns slope * distance into raw-score units: -1 / scale, or
    // -1 / softcap with a softcap. alibi_shift: ALiBi's diagonal key is i + causal_offset +
    // alibi_shift for query i (0: the mask's diagonal); a call on a slice of a longer sequence (a
    // ring's local call) names where its slices lie in that sequence.
    const float* sinks;
    const float* alibi;
    int alibi_stride_b;
    float softcap_pre;
    float alibi_mul;
    int alibi_shift;
};
