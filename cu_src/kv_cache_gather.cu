// Copies the used keys and values of a paged KV cache into contiguous (B, capacity, Hkv, D)
// buffers, so that the prefill kernels read them as a contiguous cache: the Hopper kernel's TMA
// moves a page of fewer keys than its key tile as one small box each, which bounds it at a
// fraction of its speed (page 16: 0.36x a dense prefill), where this copy costs one read and one
// write of the cache. The reverse of kv_cache_append.cu, with the same parameter block: k/v the
// cache (source), k_new/v_new the buffers (destination), seqlen_new their rows per sequence.
// One thread per 16-byte chunk of a (batch, key, kv head) row, K and V; rows past a sequence's
// length are not copied (the kernels never read them as keys: they mask them and zero their V
// rows).
// CUDATTN_GATHER_FP8: the cache holds e4m3 (paged or not) and the buffers are 16-bit
// (CUDATTN_DTYPE_BF16 says which): each element times its (batch, kv head)'s descale, rounded to
// the buffer's dtype, so the 16-bit prefill kernels read the dequantized cache.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "cudattn/fp8.cuh"
#include "cudattn/kv_cache.cuh"

#ifndef CUDATTN_GATHER_FP8
#define CUDATTN_GATHER_FP8 0
#endif

#if CUDATTN_GATHER_FP8
#if CUDATTN_DTYPE_BF16
__device__ __forceinline__ unsigned cudattn_pack(float2 s) {
    const __nv_bfloat162 r = __float22bfloat162_rn(s);
    return *reinterpret_cast<const unsigned*>(&r);
}
#else
__device__ __forceinline__ unsigned cudattn_pack(float2 s) {
    const __half2 r = __float22half2_rn(s);
    return *reinterpret_cast<const unsigned*>(&r);
}
#endif
// Eight e4m3 values times d -> eight 16-bit values (one 16-byte chunk).
__device__ __forceinline__ uint4 cudattn_dequant8(uint2 raw, float d) {
    const uint4 h = cudattn::e4m3x8_to<__half>(raw);  // exact
    const unsigned w[4] = {h.x, h.y, h.z, h.w};
    unsigned out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        out[i] = cudattn_pack(make_float2(f.x * d, f.y * d));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}
#endif

extern "C" __global__ void __launch_bounds__(256) kv_cache_gather(const __grid_constant__ AppendParams p) {
    const int chunks = p.head_dim / 8;  // 16-byte chunks of a row (head_dim is a multiple of 8)
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)p.batch * p.seqlen_new * p.heads_kv * chunks) return;
    const int c = (int)(id % chunks);
    const long long row = id / chunks;  // (b, j, h), h fastest
    const int h = (int)(row % p.heads_kv);
    const int j = (int)((row / p.heads_kv) % p.seqlen_new);
    const int b = (int)(row / ((long long)p.heads_kv * p.seqlen_new));
    if (j >= cudattn::kv_seqlen(p.kv, b)) return;
    typedef unsigned short e16;  // 16-bit elements, copied as raw bits
    const int2 loc = cudattn::kv_locate(p.kv, b, j);
#if CUDATTN_GATHER_FP8
    const int i = b * p.heads_kv + h;
    const float kdq = p.k_scale * (p.k_descale != nullptr ? p.k_descale[i] : 1.f) * (p.q_descale != nullptr ? p.q_descale[i] : 1.f);
    const float vdq = p.v_scale * (p.v_descale != nullptr ? p.v_descale[i] : 1.f);
    const unsigned char* k8 = static_cast<const unsigned char*>(p.k) + cudattn::kv_offset(loc, p.k_stride_page, p.k_stride_s) +
                              h * p.k_stride_h;
    const unsigned char* v8 = static_cast<const unsigned char*>(p.v) + cudattn::kv_offset(loc, p.v_stride_page, p.v_stride_s) +
                              h * p.v_stride_h;
    e16* kd = const_cast<e16*>(static_cast<const e16*>(p.k_new)) + b * p.kn_stride_b + j * p.kn_stride_s + h * p.kn_stride_h;
    e16* vd = const_cast<e16*>(static_cast<const e16*>(p.v_new)) + b * p.vn_stride_b + j * p.vn_stride_s + h * p.vn_stride_h;
    reinterpret_cast<uint4*>(kd)[c] = cudattn_dequant8(reinterpret_cast<const uint2*>(k8)[c], kdq);
    reinterpret_cast<uint4*>(vd)[c] = cudattn_dequant8(reinterpret_cast<const uint2*>(v8)[c], vdq);
#else
    const e16* ks = static_cast<const e16*>(p.k) + cudattn::kv_offset(loc, p.k_stride_page, p.k_stride_s) + h * p.k_stride_h;
    const e16* vs = static_cast<const e16*>(p.v) + cudattn::kv_offset(loc, p.v_stride_page, p.v_stride_s) + h * p.v_stride_h;
    e16* kd = const_cast<e16*>(static_cast<const e16*>(p.k_new)) + b * p.kn_stride_b + j * p.kn_stride_s + h * p.kn_stride_h;
    e16* vd = const_cast<e16*>(static_cast<const e16*>(p.v_new)) + b * p.vn_stride_b + j * p.vn_stride_s + h * p.vn_stride_h;
    reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
    reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
#endif
}
