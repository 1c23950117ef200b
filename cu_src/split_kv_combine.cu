// Merges attention states computed over disjoint key sets (split-KV partials, or the parts given
// to cudattn.merge_attention_states): O = sum_s w_s O_s / sum_s w_s, LSE = m + log sum_s w_s, with
// m = max_s LSE_s and w_s = exp(LSE_s - m). Each O_s is already normalised over its own keys, so it
// is reweighted by exp(LSE_s - m) only (never by its own row sum too: that counts it twice).
// Parts with LSE -inf saw no key and are skipped (their O may be anything); a row whose parts are
// all -inf gets O = 0, LSE = -inf. One warp per output row; the parts are summed in index order
// and the lanes' partial sums reduced by a fixed shuffle tree, so results are bit-reproducible.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "cudattn/params_decode.cuh"

#define CUDATTN_INF __int_as_float(0x7f800000)

// CUDATTN_IN / CUDATTN_OUT: 0 float32, 1 float16, 2 bfloat16.
template <int K> struct Elem;
template <> struct Elem<0> {
    typedef float type;
    static __device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
    static __device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
};
template <> struct Elem<1> {
    typedef __half type;
    static __device__ __forceinline__ float4 load4(const __half* p) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    static __device__ __forceinline__ void store4(__half* p, float4 v) {
        __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<unsigned*>(&a);
        u.y = *reinterpret_cast<unsigned*>(&b);
        *reinterpret_cast<uint2*>(p) = u;
    }
};
template <> struct Elem<2> {
    typedef __nv_bfloat16 type;
    static __device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    static __device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<unsigned*>(&a);
        u.y = *reinterpret_cast<unsigned*>(&b);
        *reinterpret_cast<uint2*>(p) = u;
    }
};

typedef Elem<CUDATTN_IN> In;
typedef Elem<CUDATTN_OUT> Out;

__device__ __forceinline__ const In::type* part_o(const CombineParams& p, int s) {
    return p.use_table ? static_cast<const In::type*>(p.o_table[s])
                       : static_cast<const In::type*>(p.o_parts) + s * p.o_part_stride;
}
__device__ __forceinline__ float part_lse(const CombineParams& p, int s, long long off) {
    return (p.use_table ? p.lse_table[s] : p.lse_parts + s * p.lse_part_stride)[off];
}

extern "C" __global__ void __launch_bounds__(128) split_kv_combine(const __grid_constant__ CombineParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;  // (b, h, t), t fastest
    if (row >= (long long)p.batch * p.heads * p.seqlen_q) return;
    const int t = (int)(row % p.seqlen_q);
    const long long bh = row / p.seqlen_q;
    const int h = (int)(bh % p.heads), b = (int)(bh / p.heads);
    const long long lse_off = b * p.lse_stride_b + h * p.lse_stride_h + t * p.lse_stride_s;

    float m = -CUDATTN_INF;
    bool nan = false;  // a NaN LSE makes the row NaN rather than being dropped by fmaxf
    for (int s = lane; s < p.num_parts; s += 32) {
        const float x = part_lse(p, s, lse_off);
        m = fmaxf(m, x);
        nan |= x != x;
    }
    if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float wsum = 0.f;
    if (m != -CUDATTN_INF)  // NaN m: expf gives NaN, and so does the row
        for (int s = lane; s < p.num_parts; s += 32) {
            const float x = part_lse(p, s, lse_off);
            if (x != -CUDATTN_INF) wsum += expf(x - m);
        }
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, k);

    const bool empty = m == -CUDATTN_INF;  // every part saw no key: O = 0, LSE = -inf
    const float inv = empty ? 0.f : 1.f / wsum;
    const long long in_off = b * p.in_stride_b + t * p.in_stride_s + h * p.in_stride_h;
    Out::type* dst = static_cast<Out::type*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + h * p.o_stride_h;
    for (int c = lane * 4; c < p.head_dim; c += 128) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!empty)
            for (int s = 0; s < p.num_parts; ++s) {
                const float x = part_lse(p, s, lse_off);
                if (x == -CUDATTN_INF) continue;
                const float w = expf(x - m);
                const float4 v = In::load4(part_o(p, s) + in_off + c);
                acc.x = fmaf(w, v.x, acc.x);
                acc.y = fmaf(w, v.y, acc.y);
                acc.z = fmaf(w, v.z, acc.z);
                acc.w = fmaf(w, v.w, acc.w);
            }
        Out::store4(dst + c, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
    }
    if (p.lse != nullptr && lane == 0)
        p.lse[((long long)b * p.heads + h) * p.seqlen_q + t] = empty ? -CUDATTN_INF : m + logf(wsum);
}
