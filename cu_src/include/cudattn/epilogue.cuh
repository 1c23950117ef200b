// Writing a block's results: O (normalised, converted to T) through this warp's own rows of the
// Q tile in shared memory, so global stores are 16-byte and coalesced; LSE from registers. FP8
// kernels write O straight from registers instead (their Q tile is too narrow for the output).
#pragma once
#include "cudattn/fp8.cuh"
#include "cudattn/params.cuh"
#include "cudattn/smem_tile.cuh"

namespace cudattn {

// Each warp owns rows [warp_row0, warp_row0 + MF*16) of the block and, by then, is the only
// reader of those rows of sQ, so reusing them needs only __syncwarp, not a block barrier.
template <typename T, int D, int MF, int DF>
__device__ __forceinline__ void store_output(T* sQ, const float (&o)[MF][DF][4], const float (&inv)[MF][2],
                                             T* g_o, long long o_stride_s, int rows_valid, int chunks_valid,
                                             int warp_row0, int lane) {
    constexpr int C = D / 8;
    const int g = lane >> 2, t = lane & 3;
    __syncwarp();
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp_row0 + mf * 16 + g + 8 * h;
#pragma unroll
            for (int df = 0; df < DF; ++df) {
                const u32 packed = Mma<T>::pack(o[mf][df][2 * h] * inv[mf][h], o[mf][df][2 * h + 1] * inv[mf][h]);
                *reinterpret_cast<u32*>(sQ + tile_offset<D>(r, df) + 2 * t) = packed;
            }
        }
    __syncwarp();
    constexpr int ROWS = MF * 16;
#pragma unroll
    for (int id = lane; id < ROWS * C; id += 32) {
        const int r = id / C, c = id % C;
        if (warp_row0 + r < rows_valid && c < chunks_valid) {
            const uint4 val = *reinterpret_cast<const uint4*>(sQ + tile_offset<D>(warp_row0 + r, c));
            *reinterpret_cast<uint4*>(g_o + (long long)(warp_row0 + r) * o_stride_s + c * 8) = val;
        }
    }
}

// O from the accumulators, two adjacent columns per store (store_pair: any output type). `inv`
// folds the row's 1/sum with any output scale. Rows >= rows_valid and columns >= head_dim (the
// tile's zero padding) are never written; head_dim is a multiple of 8, so whole fragments are in
// or out.
template <typename O, int MF, int DF>
__device__ __forceinline__ void store_output_direct(const float (&o)[MF][DF][4], const float (&inv)[MF][2], O* g_o,
                                                    long long o_stride_s, int rows_valid, int head_dim,
                                                    int warp_row0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp_row0 + mf * 16 + g + 8 * h;
            if (r >= rows_valid) continue;
            O* row = g_o + (long long)r * o_stride_s + 2 * t;
#pragma unroll
            for (int df = 0; df < DF; ++df)
                if (df * 8 < head_dim)
                    store_pair(row + df * 8, o[mf][df][2 * h] * inv[mf][h], o[mf][df][2 * h + 1] * inv[mf][h]);
        }
}

template <int MF>
__device__ __forceinline__ void store_lse(float* g_lse, const float (&lse)[MF][2], int rows_valid, int warp_row0,
                                          int lane) {
    if ((lane & 3) != 0) return;
    const int g = lane >> 2;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp_row0 + mf * 16 + g + 8 * h;
            if (r < rows_valid) g_lse[r] = lse[mf][h];
        }
}

// A block none of whose rows sees any key (causal with seqlen_q > seqlen_k): O = 0, LSE = `lse`
// (-inf, or an attention sink's logit). O is written in 16-byte chunks (D * sizeof(T) / 16 per
// tile row, chunks_valid of them real).
template <typename T, int BM, int D, int NT>
__device__ __forceinline__ void store_empty_block(T* g_o, long long o_stride_s, float* g_lse, int rows_valid,
                                                  int chunks_valid, int tid, float lse) {
    constexpr int PER_CHUNK = 16 / (int)sizeof(T);
    constexpr int C = D / PER_CHUNK;
    for (int id = tid; id < BM * C; id += NT) {
        const int r = id / C, c = id % C;
        if (r < rows_valid && c < chunks_valid)
            *reinterpret_cast<uint4*>(g_o + (long long)r * o_stride_s + c * PER_CHUNK) = make_uint4(0, 0, 0, 0);
    }
    if (g_lse != nullptr)
        for (int r = tid; r < rows_valid && r < BM; r += NT) g_lse[r] = lse;
}

}  // namespace cudattn
