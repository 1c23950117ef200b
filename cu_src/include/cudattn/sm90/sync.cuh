// Hopper (sm_90a) synchronisation: mbarriers that TMA loads complete on, and the fences around them.
//
// An mbarrier counts arrivals and, with expect_tx, bytes of asynchronous copies still in flight;
// its phase flips when both reach zero. Waiters poll try_wait.parity on the phase they expect.
#pragma once

namespace cudattn {
namespace sm90 {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Stores to shared memory by 32-bit shared-window address (a generic pointer would cost 64-bit
// address registers per store).
__device__ __forceinline__ void st_shared(unsigned addr, unsigned v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
// Four 8x8 matrices of 16-bit pairs from the mma accumulator layout (thread 4g+t holds row g, columns
// 2t and 2t+1 of each) into shared memory; thread 8m+r gives the address of row r of matrix m.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
__device__ __forceinline__ void st_shared(unsigned addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// One thread initialises; `count` arrivals (plus the expected bytes) complete each phase.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the initialisation visible to the async proxy (TMA) before any copy names the barrier.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrive once and announce `bytes` that asynchronous copies will deliver in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned phase) {
    unsigned done;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
    return done != 0;
}

// Block until phase `phase` (0 or 1) of `bar` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
    while (!mbar_try_wait(bar, phase)) {
    }
}

// A plain arrival (no bytes announced): consumers release a ring stage this way.
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Named barriers (ids 1..15; 0 is __syncthreads) among `threads` threads, a multiple of 32.
// sync waits for all of them; arrive counts this warp in and goes on.
// Generic-proxy writes to shared memory made visible to the async proxy (wgmma, TMA) that reads next.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Warpgroup register reallocation (sm_90a): producers give registers back, consumers take them.
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

}  // namespace sm90
}  // namespace cudattn
