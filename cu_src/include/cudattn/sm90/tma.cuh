// Hopper TMA: tiled bulk copies global -> shared described by a tensor map, and reductions back.
//
// The tensor map (cuTensorMapEncodeTiled, 128 opaque bytes, 64-byte aligned) is encoded on the
// host (cudattn/_kernels/tma.py) and passed by value inside the kernel's __grid_constant__ params struct;
// the copy takes its generic address. Completion is signalled on an mbarrier as bytes (complete_tx).
#pragma once

#include "cudattn/sm90/sync.cuh"

namespace cudattn {
namespace sm90 {

struct alignas(64) TmaDescriptor {
    unsigned long long opaque[16];
};

// Box at element coordinates (c0 innermost, c1 outer) of `desc` -> `dst` (shared; 128 B aligned,
// 1024 B for the 128-byte swizzle), completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaDescriptor* desc, int c0, int c1,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(desc)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
        : "memory");
}

// Box at (c0 innermost, c1, c2, c3) of a 4-D map: attention tiles address (head dim, seq, head,
// batch), so the sequence tail of each (batch, head) is zero-filled on load.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDescriptor* desc, int c0, int c1, int c2, int c3,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
        ::"r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
          "r"(smem_u32(bar))
        : "memory");
}

// Shared -> global: adds a box of float32 (the layout a load of the same map would write) into the
// tensor at (c0 innermost, c1, c2, c3) of a 4-D map; elements outside the map are dropped. Tracked
// by bulk groups (bulk_commit, bulk_wait_read / bulk_wait), not by an mbarrier.
__device__ __forceinline__ void tma_reduce_add_4d(const TmaDescriptor* desc, const void* src, int c0, int c1, int c2,
                                                  int c3) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
        ::"l"(reinterpret_cast<unsigned long long>(desc)), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
// Shared -> global: a box (laid out as a load of the same map would write it) stored into the tensor
// at (c0 innermost, c1, c2, c3) of a 4-D map; elements outside the map are not written. Tracked by
// bulk groups, as tma_reduce_add_4d.
__device__ __forceinline__ void tma_store_4d(const TmaDescriptor* desc, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
        ::"l"(reinterpret_cast<unsigned long long>(desc)), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// At most N committed groups still reading their shared source (its buffer may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// At most N committed groups not yet complete (their writes performed).
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
// Writes of the async proxy (TMA) ordered before this thread's later generic-proxy operations.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace sm90
}  // namespace cudattn
