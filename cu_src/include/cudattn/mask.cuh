// Masking of one S tile held in mma accumulator fragments: keys past seqlen_k, and keys after the
// causal diagonal (aligned bottom-right: query i sees key j iff j <= i + causal_offset).
#pragma once
#include "cudattn/seqlen.cuh"

namespace cudattn {

// Key tiles of BN that a query block of `rows_valid` rows from m_start must visit: all keys, or
// up to the causal diagonal of its last row; 0 when it sees none (its rows get O = 0, LSE = -inf).
template <int BN, bool CAUSAL>
__device__ __forceinline__ int key_tiles(const SeqSpan& s, int m_start, int rows_valid) {
    int n_end = s.seqlen_k;
    if (CAUSAL) n_end = min(n_end, m_start + rows_valid + s.causal_offset);
    return n_end > 0 ? (n_end + BN - 1) / BN : 0;
}

// s[MF][NF][4]: accumulator fragments of a (MF*16) x (NF*8) tile; this thread's element e of
// fragment (mf, nf) sits at row row0 + mf*16 + g + 8*(e/2), column col0 + nf*8 + 2t + (e%2),
// where g = lane/4, t = lane%4. row0/col0 are global query/key indices.
template <int MF, int NF, bool CAUSAL>
__device__ __forceinline__ void apply_mask(float (&s)[MF][NF][4], int row0, int col0, int seqlen_k,
                                           int causal_offset, int lane, float masked) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
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
