// Copies the used keys and values of a paged KV cache into contiguous (B, capacity, Hkv, D)
// buffers, so that the prefill kernels read them as a contiguous cache: the Hopper kernel's TMA
// moves a page of fewer keys than its key tile as one small box each, which bounds it at a
// fraction of its speed (page 16: 0.36x a dense prefill), where this copy costs one read and one
// write of the cache. The reverse of kv_cache_append.cu, with the same parameter block: k/v the
// cache (source), k_new/v_new the buffers (destination), seqlen_new their rows per sequence.
// One warp per (batch, key, kv head) row; rows past a sequence's length are not copied (the
// kernels never read them as keys: they mask them and zero their V rows).
#include <cuda_fp16.h>
#include "cudattn/kv_cache.cuh"

extern "C" __global__ void __launch_bounds__(128) kv_cache_gather(const __grid_constant__ AppendParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;  // (b, j, h), h fastest
    if (row >= (long long)p.batch * p.seqlen_new * p.heads_kv) return;
    const int h = (int)(row % p.heads_kv);
    const int j = (int)((row / p.heads_kv) % p.seqlen_new);
    const int b = (int)(row / ((long long)p.heads_kv * p.seqlen_new));
    if (j >= cudattn::kv_seqlen(p.kv, b)) return;
    typedef unsigned short e16;  // 16-bit elements, copied as raw bits
    const e16* ks = static_cast<const e16*>(p.k) + cudattn::kv_row_offset(p.kv, b, j, p.k_stride_page, p.k_stride_s) +
                    h * p.k_stride_h;
    const e16* vs = static_cast<const e16*>(p.v) + cudattn::kv_row_offset(p.kv, b, j, p.v_stride_page, p.v_stride_s) +
                    h * p.v_stride_h;
    e16* kd = const_cast<e16*>(static_cast<const e16*>(p.k_new)) + b * p.kn_stride_b + j * p.kn_stride_s + h * p.kn_stride_h;
    e16* vd = const_cast<e16*>(static_cast<const e16*>(p.v_new)) + b * p.vn_stride_b + j * p.vn_stride_s + h * p.vn_stride_h;
    for (int c = lane; c < p.head_dim / 8; c += 32) {
        reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
        reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
    }
}
