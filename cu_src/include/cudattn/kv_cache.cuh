// Addressing a contiguous or paged KV cache (KvCacheGeom in params_decode.cuh).
#pragma once
#include "cudattn/params_decode.cuh"

namespace cudattn {

// Valid keys of sequence b: seqlens[b] + the appended keys, clamped into [0, capacity] so that a
// bad length read from device memory can never send a load outside the cache.
__device__ __forceinline__ int kv_seqlen(const KvCacheGeom& kv, int b) {
    if (kv.seqlens == nullptr) return kv.capacity;
    return min(max(kv.seqlens[b] + kv.seqlen_add, 0), kv.capacity);
}

// The block table's entry for key j of sequence b of a paged cache, as read (a page id that
// kv_clamp_page must bound before any address is made from it), and the key's row in the page.
__device__ __forceinline__ int2 kv_table_entry(const KvCacheGeom& kv, int b, int j) {
    const int ps = kv.page_size;
    int index, row;
    if ((ps & (ps - 1)) == 0) {  // a power of two (the usual page sizes): a shift, not a division
        index = j >> (__ffs(ps) - 1);
        row = j & (ps - 1);
    } else {
        index = j / ps;
        row = j % ps;
    }
    return make_int2(kv.block_table[(long long)b * kv.max_pages + index], row);
}

// A page id read from the table, clamped into the cache, so that a bad id read from device memory
// can never send a load outside it.
__device__ __forceinline__ int kv_clamp_page(const KvCacheGeom& kv, int page) {
    return min(max(page, 0), kv.num_pages - 1);
}

// Where key j of sequence b lives: (page, row in page). A contiguous cache is one page per
// sequence.
__device__ __forceinline__ int2 kv_locate(const KvCacheGeom& kv, int b, int j) {
    if (kv.block_table == nullptr) return make_int2(b, j);
    const int2 e = kv_table_entry(kv, b, j);
    return make_int2(kv_clamp_page(kv, e.x), e.y);
}

__device__ __forceinline__ long long kv_offset(int2 loc, long long stride_page, long long stride_s) {
    return (long long)loc.x * stride_page + (long long)loc.y * stride_s;
}

// Element offset of key j of sequence b (head and column excluded).
__device__ __forceinline__ long long kv_row_offset(const KvCacheGeom& kv, int b, int j, long long stride_page,
                                                   long long stride_s) {
    return kv_offset(kv_locate(kv, b, j), stride_page, stride_s);
}

}  // namespace cudattn
