// Parameters of the split-KV decode kernel (flash_decode.cu), the merge of attention states
// (split_kv_combine.cu) and the KV-cache append (kv_cache_append.cu), each passed BY VALUE as the
// kernel's single argument. Mirrored field for field by cudattn/_kernels/params.py; change both together.
#pragma once

#include "cudattn/params.cuh"  // KvCacheGeom

struct DecodeParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;        // final output (num_splits == 1), in the input dtype
    float* lse;     // (B, Hq, Sq) float32 when write_lse
    float* o_part;  // (num_splits, B, Hq, Sq, head_dim) float32, normalised partial outputs (num_splits > 1)
    float* lse_part;  // (num_splits, B, Hq, Sq) float32 partial LSEs, -inf for a split that saw no key
    // (num_splits > 1) One arrival counter per block of rows, (B, heads_kv, num_m_blocks) int32: zero
    // at launch, and left at zero by the kernel. The last split to arrive merges the block's rows.
    int* counters;

    // Element strides (64-bit). q and o: (batch, seq, head); k and v: (page, seq-in-page, head).
    long long q_stride_b, q_stride_s, q_stride_h;
    long long k_stride_page, k_stride_s, k_stride_h;
    long long v_stride_page, v_stride_s, v_stride_h;
    long long o_stride_b, o_stride_s, o_stride_h;

    KvCacheGeom kv;

    int batch, seqlen_q, heads_q, heads_kv;
    int group;        // heads_q / heads_kv: the query heads packed into one block's rows
    int head_dim;     // the real D (the tile may be wider, zero padded)
    int rows;         // group * seqlen_q: packed query rows per (batch, kv head); row r = (token r / group, head r % group)
    int num_m_blocks; // blocks of BM packed rows
    int num_splits;
    int tiles_per_split;  // key tiles of BN per split
    int causal;       // bottom right per sequence: token t sees key j iff j <= t + L_b - seqlen_q
    float scale_log2;
    int write_lse;
    int alibi_shift;  // ALiBi's diagonal key is d + alibi_shift (FwdParams::alibi_shift)

    // Sliding window (when has_window) around each token's diagonal key d = t + L_b - seqlen_q:
    // it sees keys d - window_left .. d + window_right, -1 leaving a side open (causal: right 0
    // whatever this says).
    int window_left, window_right;
    // Score modifiers as in FwdParams (mods.cuh), read at run time: softcap_pre 0 is no softcap.
    float softcap_pre;
    float alibi_mul;
    const float* sinks;  // (heads_q,) float32, or null
    const float* alibi;  // slopes alibi[b * alibi_stride_b + hq], or null
    int alibi_stride_b;
    int has_window;

    // FP8 (e4m3) caches (KV8 builds): key and value descales, each a scalar (k_scale, v_scale)
    // times an optional (batch, heads_kv) float32 array. The kernel folds k's into the score
    // scale and v's into the output; a 16-bit cache ignores them. An FP8 q reaches the kernel
    // converted to 16 bits exactly; its (batch, heads_kv) descale array, when given, scales the
    // scores with k's (a scalar q descale is folded into k_scale on the host).
    const float* k_descale;
    const float* v_descale;
    float k_scale, v_scale;
    const float* q_descale;
    // With splits: how many of the last blocks of a block of rows to arrive share its merge (0 or 1:
    // the last alone). More only where every block of the grid is resident at once (decode/store.cuh).
    int merge_ctas;
};

// Merges `num_parts` attention states over disjoint key sets: O = sum_s w_s O_s / sum_s w_s with
// w_s = exp(LSE_s - max LSE). Part s of O lives at parts[s] (parts_table) or o_parts + s * part_stride.
#define CUDATTN_MERGE_MAX_TABLE 16
struct CombineParams {
    const void* o_parts;
    const float* lse_parts;
    void* o;
    float* lse;  // (B, H, Sq) float32, or null
    const void* o_table[CUDATTN_MERGE_MAX_TABLE];    // used when use_table
    const float* lse_table[CUDATTN_MERGE_MAX_TABLE];
    long long o_part_stride, lse_part_stride;        // elements between parts (no table)
    long long in_stride_b, in_stride_s, in_stride_h;   // parts' O strides (elements)
    long long lse_stride_b, lse_stride_h, lse_stride_s;  // parts' LSE strides (elements)
    long long o_stride_b, o_stride_s, o_stride_h;
    int batch, seqlen_q, heads, head_dim, num_parts, use_table;
};

// Writes k_new / v_new (B, S_new, Hkv, D) into the cache at positions seqlens[b] + t.
struct AppendParams {
    const void* k_new;
    const void* v_new;
    void* k;
    void* v;
    long long kn_stride_b, kn_stride_s, kn_stride_h;
    long long vn_stride_b, vn_stride_s, vn_stride_h;
    long long k_stride_page, k_stride_s, k_stride_h;
    long long v_stride_page, v_stride_s, v_stride_h;
    KvCacheGeom kv;  // seqlen_add is 0 here: seqlens are the lengths before the append
    int batch, seqlen_new, heads_kv, head_dim;
    // FP8 caches (kv_cache_append.cu built with CUDATTN_APPEND_FP8): new rows are divided by
    // their descale (scalar times the optional (batch, heads_kv) array) and rounded to e4m3,
    // saturating at +-448 (NaN stays NaN). The gather (CUDATTN_GATHER_FP8) multiplies by them,
    // K also by q_descale when given (an FP8 q's (batch, heads_kv) descales; the append ignores it).
    const float* k_descale;
    const float* v_descale;
    float k_scale, v_scale;
    const float* q_descale;
};
