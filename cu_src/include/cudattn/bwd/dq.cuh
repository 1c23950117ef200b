// dQ of one query block: dQ_part = dS.K over the block's keys, from dS^T in shared memory (the
// warps that computed it own keys, not queries) and K's tile, then added into the float32
// accumulator in global memory that every key block of the head adds into.
//
// Default: float atomics, so the sum's order (and its last bits) depends on which key block gets
// there first. Deterministic: the key blocks that see a query block take turns by index, through a
// counter per (batch, head, query block): block n waits until n - first blocks have added, adds,
// and passes the turn on. Blocks run in grid order, and a key block only waits on lower ones, so
// the turns cannot deadlock.
#pragma once
#include "cudattn/ptx.cuh"
#include "cudattn/smem_tile.cuh"

namespace cudattn {

// dq[DQF][4]: this warp's 16 query rows x DQF*8 columns (row fragment wr, column group wc) of
// dS.K, over BN keys. sdS holds dS^T (BN key rows of BM queries); A = dS is read with
// ldmatrix.trans, B = K (keys x head dim, keys as the reduction) also transposed.
template <typename T, int BM, int BN, int D, int DQF>
__device__ __forceinline__ void dq_product(float (&dq)[DQF][4], u32 sdS_addr, u32 sK_addr, int wr, int wc, int lane) {
#pragma unroll
    for (int df = 0; df < DQF; ++df)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[df][e] = 0.f;
    const LaneTile<BM> ds_lane(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
    const LaneTile<D> k_lane((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        u32 a[4];
        ldmatrix_x4_trans(a, sdS_addr + ds_lane.at(kk * 16, 2 * wr));
#pragma unroll
        for (int dp = 0; dp < DQF / 2; ++dp) {
            u32 b[4];
            ldmatrix_x4_trans(b, sK_addr + k_lane.at(kk * 16, wc * DQF + 2 * dp));
            Mma<T>::run(dq[2 * dp], a, b[0], b[1]);
            Mma<T>::run(dq[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// Adds this warp's part into the accumulator rows (row r of the block at accum + r * row_stride;
// columns from col0), rows >= rows_valid skipped.
template <int DQF>
__device__ __forceinline__ void dq_accumulate(const float (&dq)[DQF][4], float* accum, long long row_stride,
                                              int row0, int col0, int rows_valid, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + g + 8 * h;
        if (r >= rows_valid) continue;
        float* row = accum + r * row_stride + col0 + 2 * t;
#pragma unroll
        for (int df = 0; df < DQF; ++df) {
#if __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(row + df * 8), make_float2(dq[df][2 * h], dq[df][2 * h + 1]));
#else
            atomicAdd(row + df * 8, dq[df][2 * h]);
            atomicAdd(row + df * 8 + 1, dq[df][2 * h + 1]);
#endif
        }
    }
}

// Deterministic turns. One thread waits for the counter to reach `turn`; the block then adds.
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
    if (threadIdx.x == 0) {
        int v;
        do {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
        } while (v != turn);
    }
    __syncthreads();
}
// After every thread's adds: make them visible, then pass the turn on.
__device__ __forceinline__ void pass_turn(int* counter) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace cudattn
