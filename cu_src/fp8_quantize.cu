// FP8 (e4m3) quantization for cudattn.quantize_fp8 / cudattn.dequantize (cudattn/_kernels/quantize.py).
//
// x is 4-D, (B, S, H, D) ("bshd") or (B, H, S, D) ("bhsd"), unit stride along D. Its heads are cut
// into G groups (group g: heads g*H/G .. (g+1)*H/G - 1); group t = b*G + g is n_outer x n_inner rows
// of D elements. The host makes the axis of smaller stride the inner one (bshd: outer = seq, inner
// = head in the group; bhsd: the reverse), so consecutive rows of a warp lie close in memory.
// Grid: x = group t (B*G blocks), y = slices of the group's rows; each block walks its rows, a warp
// holding 32 / lanes_per_row rows at a time and lanes_per_row lanes sharing a row.
//
//   fp8_amax      amax[t] = max |x| over group t (per tensor: every group into amax[0]), kept as
//                 the bits of a non-negative float (they order like unsigned ints) and combined by
//                 atomicMax on a zeroed buffer, so the result does not depend on block order. |NaN|
//                 has bits above +inf's, so a NaN anywhere makes amax NaN, and an inf makes it inf.
//   fp8_quantize  descale = amax / 448 (IEEE division), raised to FLT_MIN (2^-126) when smaller (only
//                 for amax < 5.3e-36: keeps descale normal so x / descale cannot leave e4m3's range),
//                 and 1 when amax == 0; y = e4m3(x / descale): IEEE float32 division (not a product
//                 with a rounded reciprocal), then cvt.rn.satfinite (round to nearest even, saturate
//                 to +-448, NaN stays NaN). Block (t, 0) writes descale[t].
//   fp8_dequantize y = float(x) * descale[b, g] in float32, rounded to nearest even into the output
//                 dtype (a null descale: 1, an exact conversion). e4m3 is decoded arithmetically (exact), so this one runs on sm_80 too.
//
// The host path does the same float32 operations in NumPy; the two give bit-identical results.
// Compile-time switches: CUDATTN_QX (input of fp8_amax / fp8_quantize) and CUDATTN_DQ_OUT (output
// of fp8_dequantize), each 0 float32, 1 float16, 2 bfloat16; a build defines one of the two. The
// e4m3 conversion instruction needs sm_89+, so CUDATTN_QX builds are for sm_89 and newer only.
#include "cudattn/elem.cuh"

// One parameter struct for the three kernels; mirrored by cudattn/_kernels/quantize.py (Fp8QuantParams).
struct Fp8QuantParams {
    const void* x;
    void* y;           // C-contiguous in x's layout: e4m3 (quantize) or the output dtype (dequantize)
    unsigned* amax;    // fp8_amax / fp8_quantize: float bits, B*G entries (per head) or 1 (per tensor)
    float* descale;    // fp8_quantize: written, (B, G) contiguous; fp8_dequantize: read, strides below
    long long x_stride_b, x_stride_g, x_stride_outer, x_stride_inner;  // elements
    long long y_stride_b, y_stride_g, y_stride_outer, y_stride_inner;  // elements
    long long descale_stride_b, descale_stride_g;                      // elements (fp8_dequantize)
    long long n_outer, n_inner;  // rows per group = n_outer * n_inner (n_inner >= 1)
    int groups;                  // G
    int head_dim;                // D
    int per_head;                // 1: amax per group; 0: one amax for the whole tensor
    int vec;                     // 1: rows are read and written 4 elements at a time (aligned)
    int lanes_per_row;           // a power of two from 1 to 32
};

// A named namespace, not an anonymous one: each build uses only some of these (no unused warnings).
namespace fp8q {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

// Element types by code: 0 float32, 1 float16, 2 bfloat16 (cudattn/elem.cuh).
using cudattn::Elem;

// Calls f(x_offset, y_offset, lane_in_row) for every row of group blockIdx.x that this thread
// shares: rows j = j0, j0 + step, ... (j = outer * n_inner + inner), stepped without a division
// per row. Offsets are in elements, from the group's first element.
template <class F>
__device__ __forceinline__ void for_each_row(const Fp8QuantParams& p, long long b, long long g, F&& f) {
    const int lpr = p.lanes_per_row, rows_per_warp = 32 / lpr;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long x0 = b * p.x_stride_b + g * p.x_stride_g, y0 = b * p.y_stride_b + g * p.y_stride_g;
    const long long j0 = ((long long)blockIdx.y * WARPS + warp) * rows_per_warp + lane / lpr;
    const long long step = (long long)gridDim.y * WARPS * rows_per_warp;
    long long outer = j0 / p.n_inner, inner = j0 - outer * p.n_inner;
    const long long d_outer = step / p.n_inner, d_inner = step - d_outer * p.n_inner;
    const int sub = lane & (lpr - 1);
    while (outer < p.n_outer) {
        f(x0 + outer * p.x_stride_outer + inner * p.x_stride_inner,
          y0 + outer * p.y_stride_outer + inner * p.y_stride_inner, sub);
        inner += d_inner;
        outer += d_outer;
        if (inner >= p.n_inner) {
            inner -= p.n_inner;
            ++outer;
        }
    }
}

}  // namespace fp8q

using fp8q::THREADS;
using fp8q::WARPS;
using fp8q::for_each_row;

#ifdef CUDATTN_QX
#include "cudattn/fp8.cuh"  // cudattn::pack_e4m3x4

namespace {

constexpr float E4M3_MAX = 448.f;
constexpr float FLOAT_MIN_NORMAL = 1.17549435e-38f;  // 2^-126
typedef fp8q::Elem<CUDATTN_QX> In;

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// One float -> one e4m3 byte, as pack_e4m3x4 does four (cvt's second source lands in the low byte).
__device__ __forceinline__ unsigned char e4m3_of(float v) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(v));
    return (unsigned char)(r & 0xffu);
}

// The descale of a group from its amax; the host's _quantize.descale_from_amax is the same.
__device__ __forceinline__ float descale_of(float amax) {
    float d = __fdiv_rn(amax, E4M3_MAX);
    if (d < FLOAT_MIN_NORMAL) d = FLOAT_MIN_NORMAL;  // a NaN compares false and stays
    return amax == 0.f ? 1.f : d;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) fp8_amax(const __grid_constant__ Fp8QuantParams p) {
    const long long t = blockIdx.x, b = t / p.groups, g = t - b * p.groups;
    const int D = p.head_dim, lpr = p.lanes_per_row;
    unsigned m = 0;
    for_each_row(p, b, g, [&](long long xo, long long, int sub) {
        const In::type* row = static_cast<const In::type*>(p.x) + xo;
        if (p.vec) {
            for (int c = sub * 4; c < D; c += lpr * 4) {
                const float4 v = In::load4(row + c);
                m = max(max(m, abs_bits(v.x)), max(abs_bits(v.y), max(abs_bits(v.z), abs_bits(v.w))));
            }
        } else {
            for (int c = sub; c < D; c += lpr) m = max(m, abs_bits(In::load1(row + c)));
        }
    });
    __shared__ unsigned warp_max[WARPS];
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int w = 1; w < WARPS; ++w) m = max(m, warp_max[w]);
        if (m != 0u) atomicMax(p.amax + (p.per_head ? t : 0), m);  // the buffer starts at 0
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_quantize(const __grid_constant__ Fp8QuantParams p) {
    const long long t = blockIdx.x, b = t / p.groups, g = t - b * p.groups;
    const int D = p.head_dim, lpr = p.lanes_per_row;
    const float descale = descale_of(__uint_as_float(p.amax[p.per_head ? t : 0]));
    if (blockIdx.y == 0 && threadIdx.x == 0) p.descale[t] = descale;
    for_each_row(p, b, g, [&](long long xo, long long yo, int sub) {
        const In::type* row = static_cast<const In::type*>(p.x) + xo;
        unsigned char* out = static_cast<unsigned char*>(p.y) + yo;
        if (p.vec) {
            for (int c = sub * 4; c < D; c += lpr * 4) {
                const float4 v = In::load4(row + c);
                *reinterpret_cast<unsigned*>(out + c) =
                    cudattn::pack_e4m3x4(__fdiv_rn(v.x, descale), __fdiv_rn(v.y, descale),
                                         __fdiv_rn(v.z, descale), __fdiv_rn(v.w, descale));
            }
        } else {
            for (int c = sub; c < D; c += lpr) out[c] = e4m3_of(__fdiv_rn(In::load1(row + c), descale));
        }
    });
}
#endif  // CUDATTN_QX

#ifdef CUDATTN_DQ_OUT
namespace {

typedef fp8q::Elem<CUDATTN_DQ_OUT> Out;

// e4m3 bits (low 8 of v) -> float, exactly: (1 + m/8) 2^(e-7), subnormals m 2^-9, 0x7f/0xff NaN.
__device__ __forceinline__ float e4m3_to_float(unsigned v) {
    const unsigned sign = (v & 0x80u) << 24, e = (v >> 3) & 0xfu, m = v & 7u;
    unsigned bits;
    if ((v & 0x7fu) == 0x7fu) bits = 0x7fc00000u;
    else if (e == 0u) bits = __float_as_uint((float)m * 0.001953125f);
    else bits = ((e + 120u) << 23) | (m << 20);
    return __uint_as_float(bits | sign);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) fp8_dequantize(const __grid_constant__ Fp8QuantParams p) {
    const long long t = blockIdx.x, b = t / p.groups, g = t - b * p.groups;
    const int D = p.head_dim, lpr = p.lanes_per_row;
    const float s = p.descale != nullptr ? p.descale[b * p.descale_stride_b + g * p.descale_stride_g] : 1.f;
    for_each_row(p, b, g, [&](long long xo, long long yo, int sub) {
        const unsigned char* row = static_cast<const unsigned char*>(p.x) + xo;
        Out::type* out = static_cast<Out::type*>(p.y) + yo;
        if (p.vec) {
            for (int c = sub * 4; c < D; c += lpr * 4) {
                const unsigned w = *reinterpret_cast<const unsigned*>(row + c);
                Out::store4(out + c, make_float4(e4m3_to_float(w) * s, e4m3_to_float(w >> 8) * s,
                                                 e4m3_to_float(w >> 16) * s, e4m3_to_float(w >> 24) * s));
            }
        } else {
            for (int c = sub; c < D; c += lpr) Out::store1(out + c, e4m3_to_float(row[c]) * s);
        }
    });
}
#endif  // CUDATTN_DQ_OUT
