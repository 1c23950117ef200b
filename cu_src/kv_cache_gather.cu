// Copies the used keys and values of a paged KV cache into contiguous (B, capacity, Hkv, D)
// buffers, so that the prefill kernels read them as a contiguous cache: the Hopper kernel's TMA
// moves a page of fewer keys than its key tile as one small box each, which bounds it at a
// fraction of its speed (page 16: 0.36x a dense prefill), where this copy costs one read and one
// write of the cache. The reverse of kv_cache_append.cu, with the same parameter block: k/v the
// cache (source), k_new/v_new the buffers (destination), seqlen_new their rows per sequence.
// One thread per 16-byte chunk of a (batch, key, kv head) row, K and V; rows past a sequence's
// length are not copied (the kernels never read them as keys: they mask them and zero their V
// rows).
#include <cuda_fp16.h>
#include "cudattn/kv_cache.cuh"

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
    const e16* ks = static_cast<const e16*>(p.k) + cudattn::kv_offset(loc, p.k_stride_page, p.k_stride_s) + h * p.k_stride_h;
    const e16* vs = static_cast<const e16*>(p.v) + cudattn::kv_offset(loc, p.v_stride_page, p.v_stride_s) + h * p.v_stride_h;
    e16* kd = const_cast<e16*>(static_cast<const e16*>(p.k_new)) + b * p.kn_stride_b + j * p.kn_stride_s + h * p.kn_stride_h;
    e16* vd = const_cast<e16*>(static_cast<const e16*>(p.v_new)) + b * p.vn_stride_b + j * p.vn_stride_s + h * p.vn_stride_h;
    reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
    reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
}
