// Elements of a kernel's 16- or 32-bit input or output, read and written as float: one at a time
// (load1 / store1) or four at a time (load4 / store4, 4-element aligned). Elem<K> by code: 0
// float32, 1 float16, 2 bfloat16 (the CUDATTN_* switches of the helper kernels); ElemOf<T> by type.
// Rounding to 16 bits is to nearest even.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cudattn {

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ void from_float(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void from_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ unsigned pack2(__half, float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned pack2(__nv_bfloat16, float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

// T the element, T2 its pair type.
template <typename T, typename T2> struct Elem16 {
    typedef T type;
    static __device__ __forceinline__ float load1(const T* p) { return to_float(*p); }
    static __device__ __forceinline__ float4 load4(const T* p) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 a = to_float2(*reinterpret_cast<const T2*>(&u.x));
        const float2 b = to_float2(*reinterpret_cast<const T2*>(&u.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    static __device__ __forceinline__ void store1(T* p, float v) { from_float(p, v); }
    static __device__ __forceinline__ void store4(T* p, float4 v) {
        uint2 u;
        u.x = pack2(T(), v.x, v.y);
        u.y = pack2(T(), v.z, v.w);
        *reinterpret_cast<uint2*>(p) = u;
    }
};

template <int K> struct Elem;
template <> struct Elem<0> {
    typedef float type;
    static __device__ __forceinline__ float load1(const float* p) { return *p; }
    static __device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
    // From L2, past this SM's L1: data written by other blocks of the running kernel.
    static __device__ __forceinline__ float4 load4_l2(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
    static __device__ __forceinline__ void store1(float* p, float v) { *p = v; }
    static __device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
};
template <> struct Elem<1> : Elem16<__half, __half2> {};
template <> struct Elem<2> : Elem16<__nv_bfloat16, __nv_bfloat162> {};

template <typename T> struct ElemOf;
template <> struct ElemOf<float> { typedef Elem<0> type; };
template <> struct ElemOf<__half> { typedef Elem<1> type; };
template <> struct ElemOf<__nv_bfloat16> { typedef Elem<2> type; };

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

}  // namespace cudattn
