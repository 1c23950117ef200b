// FP8 (e4m3) pieces shared by the FP8 kernels: packing P into an e4m3 A operand, the key order of
// the transposed V they read, and the per-head descales.
//
// The PV product's A operand (P) comes from the QK^T accumulators without any lane shuffle. For a
// k32 step (32 keys), lane (g, t) = (lane / 4, lane % 4) holds in its accumulators, per row, the
// keys {2t, 2t+1, 8+2t, 9+2t, 16+2t, 17+2t, 24+2t, 25+2t}; the e4m3 A fragment wants, per row,
// k = 4t..4t+3 (register 0/1) and 16+4t..16+4t+3 (register 2/3). Packing the held keys in that
// order gives P with its k axis permuted inside each 32-key group:
//     k = 16 * half + 4 * t + j   holds key   16 * half + 2 * t + (j < 2 ? j : 6 + j)
// (fp8_vt_key below). The same permutation applied to V's keys makes P V exact: the V transpose
// (fp8_transpose_v.cu) writes Vt[b][h][d][k] = V[b][key(k)][h][d], keys grouped by 32 from 0.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cudattn/params.cuh"

namespace cudattn {

// The key stored at position k (0..31) of a 32-key group of Vt (see above).
__host__ __device__ __forceinline__ int fp8_vt_key(int k) {
    const int half = k >> 4, t = (k >> 2) & 3, j = k & 3;
    return 16 * half + 2 * t + (j < 2 ? j : 6 + j);
}

// Four floats -> four e4m3 bytes (a in the lowest), rounded to nearest even, saturating to +-448
// (NaN stays NaN). cvt's first source lands in the upper byte of its pair.
__device__ __forceinline__ unsigned pack_e4m3x4(float a, float b, float c, float d) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
    return (unsigned)lo | ((unsigned)hi << 16);
}

// The scales of one (batch, kv head): q and k descales folded into the softmax scale, the v
// descale into the output's normalisation. Scalars were folded on the host (p.scale_log2,
// p.out_scale, p.softcap_pre); (batch, heads_kv) arrays are read here. SOFTCAP builds with a
// softcap (p.softcap_pre != 0) scale the raw scores inside the tanh instead (softcap_pre), the
// softmax keeping the cap's scale (mods.cuh). alibi_factor turns an ALiBi coefficient made for
// p.scale_log2 (alibi_coef) into one for this head's score scale: 1 without descale arrays.
struct Fp8Scales {
    float scale_log2, out_scale, softcap_pre, alibi_factor;
};
template <bool SOFTCAP = false>
__device__ __forceinline__ Fp8Scales fp8_scales(const FwdParams& p, int b, int hkv) {
    const int i = b * p.heads_kv + hkv;
    const bool capped = SOFTCAP && p.softcap_pre != 0.f;
    float s = capped ? p.softcap_pre : p.scale_log2, o = p.out_scale;
    if (p.q_descale != nullptr) s *= p.q_descale[i];
    if (p.k_descale != nullptr) s *= p.k_descale[i];
    if (p.v_descale != nullptr) o *= p.v_descale[i];
    if (capped) return {p.scale_log2, o, s, 1.f};
    if (s == 0.f) s = 1e-30f;  // masked scores are +-inf * scale: 0 would make NaN (see _plan._scale_log2)
    return {s, o, 0.f, p.scale_log2 / s};
}

}  // namespace cudattn

namespace cudattn {

// Eight e4m3 bytes (the first at the lowest address) -> eight 16-bit values of T, exactly (every
// e4m3 value is a normal float16). cvt's upper byte becomes the upper half.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short v) {
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
    return r;
}
__device__ __forceinline__ unsigned f16x2_as(unsigned h, __half) { return h; }
__device__ __forceinline__ unsigned f16x2_as(unsigned h, __nv_bfloat16) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const unsigned*>(&b);
}
template <typename T>
__device__ __forceinline__ uint4 e4m3x8_to(uint2 v) {
    return make_uint4(f16x2_as(e4m3x2_to_f16x2((unsigned short)(v.x & 0xffffu)), T()),
                      f16x2_as(e4m3x2_to_f16x2((unsigned short)(v.x >> 16)), T()),
                      f16x2_as(e4m3x2_to_f16x2((unsigned short)(v.y & 0xffffu)), T()),
                      f16x2_as(e4m3x2_to_f16x2((unsigned short)(v.y >> 16)), T()));
}

// Tag type of e4m3 operands (one byte each); the kernels only move them and hand them to the
// tensor cores, so no arithmetic type is needed.
struct e4m3_t {
    unsigned char bits;
};

// Two adjacent output values (lo at the lower address) stored as one 4- or 8-byte word.
__device__ __forceinline__ void store_pair(__half* dst, float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    *reinterpret_cast<__half2*>(dst) = h;
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    *reinterpret_cast<__nv_bfloat162*>(dst) = h;
}
__device__ __forceinline__ void store_pair(float* dst, float lo, float hi) {
    *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
}

}  // namespace cudattn

// The output element type of an FP8 variant (CUDATTN_OUT: 0 float32, 1 float16, 2 bfloat16).
#if defined(CUDATTN_OUT) && CUDATTN_OUT == 0
typedef float cudattn_out_t;
#elif defined(CUDATTN_OUT) && CUDATTN_OUT == 1
typedef __half cudattn_out_t;
#else
typedef __nv_bfloat16 cudattn_out_t;
#endif
