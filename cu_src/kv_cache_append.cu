// Writes k_new / v_new (B, S_new, Hkv, D) into a contiguous or paged KV cache at positions
// seqlens[b] + t, before the decode kernel attends over the grown cache. One warp per
// (batch, token, kv head) row, 16-byte copies; a position outside the cache is skipped (the host
// path refuses such lengths before launching).
// CUDATTN_APPEND_FP8: the cache holds e4m3 and the new rows are 16-bit (CUDATTN_DTYPE_BF16 says
// which): each element is divided by its (batch, kv head)'s descale and rounded to e4m3 (nearest
// even, saturating at +-448; NaN stays NaN), 8 elements a lane step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "cudattn/fp8.cuh"
#include "cudattn/kv_cache.cuh"

#ifndef CUDATTN_APPEND_FP8
#define CUDATTN_APPEND_FP8 0
#endif

#if CUDATTN_DTYPE_BF16
typedef __nv_bfloat162 cudattn_pair_t;
__device__ __forceinline__ float2 cudattn_to_float2(cudattn_pair_t x) { return __bfloat1622float2(x); }
#else
typedef __half2 cudattn_pair_t;
__device__ __forceinline__ float2 cudattn_to_float2(cudattn_pair_t x) { return __half22float2(x); }
#endif

// Eight 16-bit values (one 16-byte chunk) divided by d -> eight e4m3 bytes.
__device__ __forceinline__ uint2 cudattn_quantize8(uint4 v, float d) {
    const cudattn_pair_t* h = reinterpret_cast<const cudattn_pair_t*>(&v);
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = cudattn_to_float2(h[i]);
        f[2 * i] = __fdiv_rn(x.x, d);
        f[2 * i + 1] = __fdiv_rn(x.y, d);
    }
    return make_uint2(cudattn::pack_e4m3x4(f[0], f[1], f[2], f[3]), cudattn::pack_e4m3x4(f[4], f[5], f[6], f[7]));
}

extern "C" __global__ void __launch_bounds__(128) kv_cache_append(const __grid_constant__ AppendParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;  // (b, t, h), h fastest
    if (row >= (long long)p.batch * p.seqlen_new * p.heads_kv) return;
    const int h = (int)(row % p.heads_kv);
    const int t = (int)((row / p.heads_kv) % p.seqlen_new);
    const int b = (int)(row / ((long long)p.heads_kv * p.seqlen_new));
    const int j = p.kv.seqlens[b] + t;
    if (j < 0 || j >= p.kv.capacity) return;
    typedef unsigned short e16;  // 16-bit elements, moved as raw bits
    const e16* kn = static_cast<const e16*>(p.k_new) + b * p.kn_stride_b + t * p.kn_stride_s + h * p.kn_stride_h;
    const e16* vn = static_cast<const e16*>(p.v_new) + b * p.vn_stride_b + t * p.vn_stride_s + h * p.vn_stride_h;
#if CUDATTN_APPEND_FP8
    const int i = b * p.heads_kv + h;
    const float kd = p.k_scale * (p.k_descale != nullptr ? p.k_descale[i] : 1.f);
    const float vd = p.v_scale * (p.v_descale != nullptr ? p.v_descale[i] : 1.f);
    unsigned char* kc = static_cast<unsigned char*>(p.k) + cudattn::kv_row_offset(p.kv, b, j, p.k_stride_page, p.k_stride_s) +
                        h * p.k_stride_h;
    unsigned char* vc = static_cast<unsigned char*>(p.v) + cudattn::kv_row_offset(p.kv, b, j, p.v_stride_page, p.v_stride_s) +
                        h * p.v_stride_h;
    for (int c = lane; c < p.head_dim / 8; c += 32) {  // 8 elements: 16 bytes in, 8 out
        reinterpret_cast<uint2*>(kc)[c] = cudattn_quantize8(reinterpret_cast<const uint4*>(kn)[c], kd);
        reinterpret_cast<uint2*>(vc)[c] = cudattn_quantize8(reinterpret_cast<const uint4*>(vn)[c], vd);
    }
#else
    e16* kd = static_cast<e16*>(p.k) + cudattn::kv_row_offset(p.kv, b, j, p.k_stride_page, p.k_stride_s) + h * p.k_stride_h;
    e16* vd = static_cast<e16*>(p.v) + cudattn::kv_row_offset(p.kv, b, j, p.v_stride_page, p.v_stride_s) + h * p.v_stride_h;
    for (int c = lane; c < p.head_dim / 8; c += 32) {
        reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(kn)[c];
        reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vn)[c];
    }
#endif
}
