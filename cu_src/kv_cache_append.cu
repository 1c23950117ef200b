// Writes k_new / v_new (B, S_new, Hkv, D) into a contiguous or paged KV cache at positions
// seqlens[b] + t, before the decode kernel attends over the grown cache. One warp per
// (batch, token, kv head) row, 16-byte copies; a position outside the cache is skipped (the host
// path refuses such lengths before launching).
#include <cuda_fp16.h>
#include "cudattn/kv_cache.cuh"

extern "C" __global__ void __launch_bounds__(128) kv_cache_append(const __grid_constant__ AppendParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;  // (b, t, h), h fastest
    if (row >= (long long)p.batch * p.seqlen_new * p.heads_kv) return;
    const int h = (int)(row % p.heads_kv);
    const int t = (int)((row / p.heads_kv) % p.seqlen_new);
    const int b = (int)(row / ((long long)p.heads_kv * p.seqlen_new));
    const int j = p.kv.seqlens[b] + t;
    if (j < 0 || j >= p.kv.capacity) return;
    typedef unsigned short e16;  // 16-bit elements, copied as raw bits
    const e16* kn = static_cast<const e16*>(p.k_new) + b * p.kn_stride_b + t * p.kn_stride_s + h * p.kn_stride_h;
    const e16* vn = static_cast<const e16*>(p.v_new) + b * p.vn_stride_b + t * p.vn_stride_s + h * p.vn_stride_h;
    e16* kd = static_cast<e16*>(p.k) + cudattn::kv_row_offset(p.kv, b, j, p.k_stride_page, p.k_stride_s) + h * p.k_stride_h;
    e16* vd = static_cast<e16*>(p.v) + cudattn::kv_row_offset(p.kv, b, j, p.v_stride_page, p.v_stride_s) + h * p.v_stride_h;
    for (int c = lane; c < p.head_dim / 8; c += 32) {
        reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(kn)[c];
        reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vn)[c];
    }
}
