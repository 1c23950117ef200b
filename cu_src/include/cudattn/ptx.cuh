// Thin wrappers over the sm_80+ instructions the portable kernel is built from:
// mma.sync m16n8k16 (and m16n8k32 e4m3 on sm_89+), ldmatrix, cp.async and ex2.approx. Fragment
// layouts follow the PTX ISA.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cudattn {

typedef unsigned int u32;

// NVRTC has no <cmath>; __int_as_float(0x7f800000) is +inf.
#define CUDATTN_INF __int_as_float(0x7f800000)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte async global->shared copy; when !valid, zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A 32-bit load that orders this thread's later reads after it (acquire, GPU scope): a wait on a
// flag another block sets.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Fetch-and-add that releases what this thread has seen written (its block's stores, once a block
// barrier has passed) and acquires what earlier adders released (GPU scope): one thread's arrival
// at a count other blocks keep, as CUTLASS's and cooperative groups' grid barriers arrive.
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// The GPU's nanosecond clock (the same on every SM): bounds on waits.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D += A(16x16, row) * B(16x8, col), fp32 accumulate.
template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<u32*>(&h);
    }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<u32*>(&h);
    }
};

// The e4m3 tag type (defined in fp8.cuh): declared here so that Mma can be specialised for it
// without pulling the FP8 parameters into every kernel.
struct e4m3_t;

// D += A(16x32, row) * B(32x8, col), e4m3 operands, fp32 accumulate (sm_89+; on sm_90 ptxas
// lowers it to f16 conversions and HMMA, as Hopper's only native FP8 product is wgmma). Its
// fragments hold, byte for byte, what the f16 m16n8k16 ones hold (a 16-bit element of those is two
// e4m3 here), so the same ldmatrix addressing loads them. P is packed by pack_e4m3x4 (fp8.cuh).
template <> struct Mma<e4m3_t> {
    static __device__ __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// min(x, y) that returns NaN when either is NaN (fminf returns the other operand): one FMNMX.
__device__ __forceinline__ float min_keep_nan(float x, float y) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(x), "f"(y));
    return r;
}

// st.global.v2.b32 under a predicate. A C++ `if` around a store in an unrolled loop becomes a
// branch per store, each with its own address arithmetic; this stays one predicated store at an
// immediate offset from a base pointer.
__device__ __forceinline__ void st_global_v2_if(bool pred, void* ptr, unsigned a, unsigned b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p st.global.v2.b32 [%1], {%2, %3};\n}\n" ::"r"((int)pred),
        "l"(ptr), "r"(a), "r"(b)
        : "memory");
}

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// One MUFU op (sm_75+); max relative error about 2^-11, far inside a 16-bit naive softcap's
// rounding. tanh(+-inf) = +-1, NaN stays NaN.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace cudattn
