// Masking of one S tile held in mma accumulator fragments: keys past seqlen_k, and keys after the
// causal diagonal (aligned bottom-right: query i sees key j iff j <= i + causal_offset).
#pragma once
#include "cudattn/seqlen.cuh"

namespace cudattn {

constexpr int CUDATTN_BIG = 1 << 30;  // below any key index

// The key tiles of BN a query block of `rows_valid` rows from m_start must visit: tiles
// [first, first + count), all keys or up to the causal diagonal of its last row, and with a
// sliding window only those some row's window reaches. count 0: it sees none (its rows get O = 0,
// LSE = -inf). Tiles are visited from the last (the key tail and the diagonal) down.
struct TileRange {
    int first, count;
    __device__ __forceinline__ int start(int j) const { return first + count - 1 - j; }  // j-th visited
};

// WINDOW: the kernel honours p.has_window (a build without it ignores the window; the host never
// sends it a windowed call).
template <int BN, bool CAUSAL, bool WINDOW = true>
__device__ __forceinline__ TileRange key_tiles(const FwdParams& p, const SeqSpan& s, int m_start, int rows_valid) {
    int n_end = s.seqlen_k, n_begin = 0;
    const int last_diag = m_start + rows_valid - 1 + s.causal_offset;  // the block's last row's diagonal key
    if (CAUSAL) n_end = min(n_end, last_diag + 1);
    if (WINDOW && p.has_window) {
        if (!CAUSAL && p.window_right >= 0) n_end = min(n_end, last_diag + p.window_right + 1);
        if (p.window_left >= 0) n_begin = max(0, m_start + s.causal_offset - p.window_left);
    }
    if (n_end <= n_begin) return {0, 0};
    const int first = n_begin / BN;
    return {first, (n_end + BN - 1) / BN - first};
}

// Whether a key tile from n_start needs masking for query rows [row0, row0 + rows): the key
// tail, the causal diagonal, or a window's edge crosses it.
template <int BN, bool CAUSAL, bool WINDOW = true>
__device__ __forceinline__ bool tile_needs_mask(const FwdParams& p, const SeqSpan& s, int n_start, int row0, int rows) {
    bool need = n_start + BN > s.seqlen_k || (CAUSAL && n_start + BN - 1 > row0 + s.causal_offset);
    if (WINDOW && p.has_window) {
        if (!CAUSAL && p.window_right >= 0) need |= n_start + BN - 1 > row0 + s.causal_offset + p.window_right;
        if (p.window_left >= 0) need |= n_start < row0 + rows - 1 + s.causal_offset - p.window_left;
    }
    return need;
}

// s[MF][NF][4]: accumulator fragments of a (MF*16) x (NF*8) tile; this thread's element e of
// fragment (mf, nf) sits at row row0 + mf*16 + g + 8*(e/2), column col0 + nf*8 + 2t + (e%2),
// where g = lane/4, t = lane%4. row0/col0 are global query/key indices. Keys at columns >= the
// row's hi and < its lo are masked: lo_off/hi_off relative to the row's diagonal (row +
// causal_offset), or CUDATTN_BIG for none; hi is also capped at seqlen_k.
template <int MF, int NF>
__device__ __forceinline__ void mask_columns(float (&s)[MF][NF][4], int row0, int col0, int seqlen_k, int causal_offset,
                                             int lo_off, int hi_off, int lane, float masked) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int diag = row0 + mf * 16 + g + 8 * h + causal_offset;
            const int hi = min(seqlen_k, diag + hi_off), lo = diag + lo_off;  // visible: lo <= col < hi
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int col = col0 + nf * 8 + 2 * t + j;
                    if (col >= hi || col < lo) s[mf][nf][2 * h + j] = masked;
                }
            }
        }
    }
}

// The key tail and the causal diagonal (the common case: no window, one bound a row), or with
// a window (p.has_window) both of its edges.
template <int MF, int NF, bool CAUSAL, bool WINDOW = true>
__device__ __forceinline__ void apply_mask(float (&s)[MF][NF][4], int row0, int col0, int seqlen_k,
                                           int causal_offset, int lane, float masked, const FwdParams& p) {
    if (WINDOW && p.has_window) {
        const int lo_off = p.window_left >= 0 ? -p.window_left : -CUDATTN_BIG;
        const int hi_off = CAUSAL ? 1 : (p.window_right >= 0 ? p.window_right + 1 : CUDATTN_BIG);
        mask_columns<MF, NF>(s, row0, col0, seqlen_k, causal_offset, lo_off, hi_off, lane, masked);
        return;
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
        // Causal, where no row of the fragment has its limit at the key tail (every row of a causal
        // self-attention inside its sequence): element (nf, h, j) is visible iff
        // 8 * (nf - h) + j < lim, with lim the first row's limit less this thread's first column,
        // so the second row's elements take the first row's comparisons one fragment to the left:
        // one comparison for two elements (half the ISETPs of the diagonal tile; warp-uniform test).
        // Builds of one fragment a warp only (every Hopper consumer, and the portable kernel's tiles
        // of 16 rows a warp): the portable kernel's two fragments at head dim 128 had no registers
        // for both paths (40 bytes of spills on sm_90a).
        if (CAUSAL && MF == 1 && row0 + mf * 16 + 15 + causal_offset + 1 <= seqlen_k) {
            const int lim = row0 + mf * 16 + g + causal_offset + 1 - (col0 + 2 * t);
#pragma unroll
            for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        if (8 * (nf - h) + j >= lim) s[mf][nf][2 * h + j] = masked;
            continue;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mf * 16 + g + 8 * h;
            const int limit = CAUSAL ? min(seqlen_k, row + causal_offset + 1) : seqlen_k;  // cols < limit are visible
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int col = col0 + nf * 8 + 2 * t + j;
                    if (col >= limit) s[mf][nf][2 * h + j] = masked;
                }
            }
        }
    }
}

}  // namespace cudattn
