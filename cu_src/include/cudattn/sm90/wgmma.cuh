// Hopper warpgroup MMA (wgmma): shared-memory matrix descriptors and the instructions, fp32 accumulate.
//
// A warpgroup (4 warps, 128 threads) computes a 64xN tile; lane t of warp w holds, for each n8
// block i, d[4i..4i+3] = rows 16w + t/4 (+8), columns 8i + 2(t%4) (+1): the mma.sync C layout
// repeated along N. A register A operand (the "RS" form) is the mma.sync m16n8k16 A fragment of
// the warp's 16 rows, so an fp32 accumulator converts to the next product's A in registers.
// Issue order: wgmma_fence(); the MMAs; wgmma_commit(); wgmma_wait<k>() before the accumulators
// (or the shared tiles) are touched again.
//
// Operand lists are written out in full by tools/gen_wgmma.py (sm90/wgmma_ops.cuh): PTX names every
// register. `ss`/`rs` overloads pick the shape N from the accumulator array (N/2 floats).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cudattn/fp8.cuh"

namespace cudattn {
namespace sm90 {

// Shared-memory matrix descriptor for a tile in the 128-byte swizzle layout (what TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B; tile base 1024-byte aligned). Byte offsets: `lbo` between swizzle
// atoms along the leading dimension (MN-major operands wider than 64 halves), `sbo` between groups
// of 8 rows (1024 for 128-byte rows). Moving along K inside a K-major atom adds bytes to `tile`.
// smem_desc_sw<64>: the same for the 64-byte swizzle (CU_TENSOR_MAP_SWIZZLE_64B: 64-byte rows,
// `sbo` 512 between groups of 8 rows).
template <int SWIZZLE_BYTES>
__device__ __forceinline__ unsigned long long smem_desc_sw(const void* tile, unsigned lbo, unsigned sbo) {
    static_assert(SWIZZLE_BYTES == 128 || SWIZZLE_BYTES == 64, "128- or 64-byte swizzle");
    const unsigned long long addr = static_cast<unsigned long long>(__cvta_generic_to_shared(tile));
    unsigned long long d = (addr & 0x3FFFFull) >> 4;
    d |= static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16;
    d |= static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32;
    d |= (SWIZZLE_BYTES == 128 ? 1ull : 2ull) << 62;  // layout type: 1 128-byte swizzle, 2 64-byte
    return d;
}
__device__ __forceinline__ unsigned long long smem_desc_sw128(const void* tile, unsigned lbo, unsigned sbo) {
    return smem_desc_sw<128>(tile, lbo, sbo);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A 64xN accumulator tile as fragments [1][N/8][4] (the mma.sync C layout's shape), as the flat
// N/2 floats the instruction wrappers take.
template <int N>
__device__ __forceinline__ float (&flat(float (&a)[1][N / 8][4]))[N / 2] {
    return *reinterpret_cast<float(*)[N / 2]>(&a[0][0][0]);
}

// Two 16-bit values (lo = the lower column) packed for a register A operand.
__device__ __forceinline__ unsigned pack2(float lo, float hi, __half) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, __nv_bfloat16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

#include "cudattn/sm90/wgmma_ops.cuh"

template <typename T>
struct Wgmma;
template <>
struct Wgmma<__half> {
    CUDATTN_SM90_WGMMA_OPS("f16")
};
template <>
struct Wgmma<__nv_bfloat16> {
    CUDATTN_SM90_WGMMA_OPS("bf16")
};
// e4m3 (k = 32): both shared operands K-major (no transpose for 8-bit types), so V is read as Vt.
template <>
struct Wgmma<e4m3_t> {
    CUDATTN_SM90_WGMMA_FP8_OPS
};
#undef CUDATTN_SM90_WGMMA_OPS
#undef CUDATTN_SM90_WGMMA_FP8_OPS

}  // namespace sm90
}  // namespace cudattn
