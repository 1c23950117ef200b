// Shared-memory tiles of ROWS x D 16-bit units, stored row-major with an XOR swizzle on
// 16-byte chunks so that ldmatrix (8 rows x 16 B) and the epilogue's stores hit 8 distinct
// bank groups. Rows and chunks are always IN-TILE indices. A unit is one element of a 16-bit
// type, or two e4m3 bytes: the FP8 kernel moves its tiles with the same machinery.
#pragma once
#include "cudattn/ptx.cuh"

namespace cudattn {

// Physical chunk of logical chunk c in row r, for a tile with C chunks (of 8 elements) per row.
template <int C>
__device__ __forceinline__ int swizzle(int r, int c) {
    static_assert(C % 8 == 0 || C == 4, "tile width must be 32 or a multiple of 64 elements");
    if constexpr (C % 8 == 0) {
        return c ^ (r & 7);  // 8+ chunks per row: rows 8 apart share banks, so xor by row mod 8
    } else {
        return c ^ ((r >> 1) & 3);  // 4 chunks (64 B) per row: two rows share a 128 B line
    }
}

template <int D>
__device__ __forceinline__ int tile_offset(int r, int c) {  // element offset of (row r, chunk c)
    return r * D + swizzle<D / 8>(r, c) * 8;
}

// This lane's byte offset in a swizzled tile, for an ldmatrix address at (row r, chunk c0) with
// c0 in {0, 1}, plus cheap offsets to (r + dr, c0 + dc) for compile-time dr % 8 == 0, dc % 2 == 0.
// Moving by 8 rows keeps the swizzle's row bits, and adding an even dc below the 8-chunk group
// boundary commutes with the xor, so every address is one register xor a constant plus an
// immediate: the compiler keeps 4 registers per operand instead of one per (row, chunk).
template <int D>
struct LaneTile {
    static constexpr int C = D / 8;
    u32 off;
    __device__ __forceinline__ LaneTile(int r, int c0) : off(r * D * 2 + swizzle<C>(r, c0) * 16) {}
    __device__ __forceinline__ u32 at(int dr, int dc) const {
        if constexpr (C % 8 == 0) {
            return (off ^ ((dc & 7) * 16)) + (dc & ~7) * 16 + dr * D * 2;
        } else {
            return (off ^ (dc * 16)) + dr * D * 2;  // C == 4: dc in {0, 2}
        }
    }
};

// Copies ROWS x D tiles from global memory (rows `stride` elements apart) into a swizzled shared
// tile with 16-byte cp.async. Rows >= valid_rows and chunks >= valid_chunks are zero-filled (tails
// by predication; zeros also keep 0 * garbage out of P.V). The thread's source pointer is carried
// from tile to tile instead of being recomputed, so the main loop keeps one 64-bit pointer per
// operand live rather than one per chunk.
template <typename T, int ROWS, int D, int NT>
struct TileLoader {
    static constexpr int C = D / 8;
    static constexpr int PER_THREAD = ROWS * C / NT;
    static_assert(ROWS * C % NT == 0, "tile chunks must divide evenly among threads");
    static constexpr bool REGULAR = NT % C == 0;  // each pass covers whole rows
    static constexpr int ROW_STEP = REGULAR ? NT / C : 0;

    // The row stride is passed to each call rather than kept: callers read it from the kernel's
    // parameter space, so it costs no register across the main loop.
    const T* src;  // REGULAR: this thread's first chunk; otherwise the tile's first element
    int tid, row0, chunk;
    bool chunk_ok;

    __device__ __forceinline__ TileLoader(const T* tile, long long stride, int tid_, int valid_chunks) : tid(tid_) {
        row0 = REGULAR ? tid / C : 0;
        chunk = REGULAR ? tid % C : 0;
        chunk_ok = chunk < valid_chunks;
        src = REGULAR ? tile + row0 * stride + chunk * 8 : tile;
    }

    __device__ __forceinline__ void advance_rows(int rows, long long stride) { src += rows * stride; }
    // To the tile `units` columns over, same rows (FP8's Vt: the next key tile).
    __device__ __forceinline__ void advance_cols(int units) { src += units; }

    // Issue the copies of the current tile into the shared tile `dst`.
    template <bool CHECK_ROWS>
    __device__ __forceinline__ void copy(T* dst, long long stride, int valid_rows, int valid_chunks) const {
        if constexpr (REGULAR) {
            const T* g = src;
#pragma unroll
            for (int i = 0; i < PER_THREAD; ++i, g += ROW_STEP * stride) {
                const int r = row0 + i * ROW_STEP;
                const bool ok = chunk_ok && (!CHECK_ROWS || r < valid_rows);
                cp_async_16(smem_addr(dst + tile_offset<D>(r, chunk)), ok ? g : src, ok);
            }
        } else {
#pragma unroll
            for (int i = 0; i < PER_THREAD; ++i) {
                const int id = tid + i * NT;
                const int r = id / C, c = id % C;
                const bool ok = c < valid_chunks && (!CHECK_ROWS || r < valid_rows);
                cp_async_16(smem_addr(dst + tile_offset<D>(r, c)), ok ? src + r * stride + c * 8 : src, ok);
            }
        }
    }
};

}  // namespace cudattn
