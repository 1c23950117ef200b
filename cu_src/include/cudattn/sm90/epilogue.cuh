// The Hopper forward kernel's epilogue (fwd_sm90.cuh): a consumer warpgroup's 64 rows of O and
// their LSE, from its accumulators straight to global memory, or (builds with room for it, 16-bit
// O) through shared memory and a TMA store, which leaves the consumer as soon as the rows are in
// shared memory.
#pragma once
#include "cudattn/fp8.cuh"
#include "cudattn/params.cuh"
#include "cudattn/ptx.cuh"
#include "cudattn/seqlen.cuh"
#include "cudattn/sm90/tile_scheduler.cuh"
#include "cudattn/sm90/tma.cuh"
#include "cudattn/sm90/wgmma.cuh"

namespace cudattn {
namespace sm90 {

// OutT: the element O is stored as; D: the head-dim tile; BM: query rows of a CTA's tile.
template <typename OutT, int D, int BM>
struct Sm90Epilogue {
    // O (times inv: normalised, times the v descale; as OutT) and LSE straight from the accumulators,
    // predicated on the sequence and head-dim bounds. Lane t of a quad holds columns 8i+2t, 8i+2t+1
    // of every 8-column block i. A 16-bit pair is 4 bytes, so a warp's store would fill half of
    // each 32-byte sector; the two lanes of a pair swap one word first, so that the even lane
    // holds 4 columns of block i and the odd lane the same 4 of block i+1, and a quad's 8-byte
    // stores cover whole sectors (ncu counted half the sectors of this store wasted before).
    // ZERO: O is known to be 0 (a tile that sees no key), so no lane needs its partner's word: no
    // shuffle in that rarely taken branch, which ptxas would otherwise guard against divergence.
    template <bool ZERO = false>
    static __device__ __forceinline__ void store_tile(const FwdParams& p, const float (&o)[1][D / 8][4],
                                                      const float (&inv)[1][2], const float (&lse)[1][2],
                                                      const TileCoord& c, const SeqSpan& sq, int cw, int ltid) {
        const int warp = ltid / 32, lane = ltid % 32, g = lane / 4, t = lane % 4;
        const int m_start = c.m_block * BM, seqlen_q = sq.seqlen_q;
        OutT* g_o = static_cast<OutT*>(p.o) + c.b * p.o_stride_b + c.h * p.o_stride_h + sq.q0 * p.o_stride_s;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m_start + cw * 64 + warp * 16 + g + 8 * h;
            OutT* g_row = g_o + row * p.o_stride_s;
            if constexpr (sizeof(OutT) == 2) {
                const bool odd = t & 1;
                OutT* dst = g_row + 8 * odd + 4 * (t >> 1);  // block i + odd, the pair's half of it
                const int blocks = row < seqlen_q ? p.head_dim / 8 - odd : 0;  // head_dim: a multiple of 8
#pragma unroll
                for (int i = 0; i < D / 8; i += 2) {
                    const unsigned w0 = pack2(o[0][i][2 * h] * inv[0][h], o[0][i][2 * h + 1] * inv[0][h], OutT());
                    const unsigned w1 = pack2(o[0][i + 1][2 * h] * inv[0][h], o[0][i + 1][2 * h + 1] * inv[0][h], OutT());
                    const unsigned got = ZERO ? 0u : __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);  // every lane
                    st_global_v2_if(i < blocks, dst + 8 * i, odd ? got : w0, odd ? w1 : got);
                }
            } else {
                if (row >= seqlen_q) continue;
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
                    if (8 * i < p.head_dim)  // head_dim is a multiple of 8: pairs never straddle it
                        store_pair(g_row + 8 * i + 2 * t, o[0][i][2 * h] * inv[0][h], o[0][i][2 * h + 1] * inv[0][h]);
            }
        }
        store_lse(p, lse, c, sq, cw, ltid);
    }

    // A consumer's 64 rows of O (all inside the sequence) through its staging buffer `stage` (KB
    // boxes of 64 rows x 128 bytes, 1 KiB aligned, in the 128-byte swizzle the map `tma_o` reads)
    // and one TMA store a box, issued by the warpgroup's first thread; bar: the warpgroup's named
    // barrier. The buffer is written again only once the previous store has read it.
    static __device__ __forceinline__ void store_tile_staged(const FwdParams& p, const TmaDescriptor* tma_o,
                                                             const float (&o)[1][D / 8][4], const float (&inv)[1][2],
                                                             const float (&lse)[1][2], const TileCoord& c,
                                                             const SeqSpan& sq, int cw, int ltid,
                                                             unsigned char* stage, int bar) {
        static_assert(sizeof(OutT) == 2 && D % 64 == 0, "16-bit O in whole 128-byte rows");
        const int warp = ltid / 32, lane = ltid % 32;
        if (ltid == 0) bulk_wait_read<0>();  // the last tile's store has read the buffer
        named_sync(bar, 128);
        // stmatrix: four 8x8 matrices an instruction, (block i, rows 0-7), (i, 8-15), (i+1, 0-7), (i+1, 8-15)
        // of the warp's 16 rows; this lane names row r of matrix m. A matrix row is one 16-byte chunk
        // of a 128-byte box row, placed by the 128-byte swizzle (chunk ^ row % 8).
        const int m = lane / 8, r = warp * 16 + 8 * (m % 2) + lane % 8;  // the row in the consumer's 64
        const unsigned row_base = smem_u32(stage) + r * 128;
#pragma unroll
        for (int i = 0; i < D / 8; i += 2) {
            const int blk = i + m / 2;  // this lane's matrix's 8-column block
            const unsigned addr = row_base + (blk / 8) * (64 * 128) + (unsigned)(((blk % 8) ^ (r % 8)) * 16);
            stmatrix_x4(addr, pack2(o[0][i][0] * inv[0][0], o[0][i][1] * inv[0][0], OutT()),
                        pack2(o[0][i][2] * inv[0][1], o[0][i][3] * inv[0][1], OutT()),
                        pack2(o[0][i + 1][0] * inv[0][0], o[0][i + 1][1] * inv[0][0], OutT()),
                        pack2(o[0][i + 1][2] * inv[0][1], o[0][i + 1][3] * inv[0][1], OutT()));
        }
        fence_proxy_async_smem();  // the generic writes visible to the TMA unit
        named_sync(bar, 128);
        if (ltid == 0) {
            const int q_b = p.cu_seqlens_q == nullptr;  // packed operands: batch coordinate 0
#pragma unroll
            for (int kb = 0; kb < D / 64; ++kb)
                tma_store_4d(tma_o, stage + kb * (64 * 128), 64 * kb, sq.q0 + c.m_block * BM + cw * 64, c.h,
                             c.b * q_b);
            bulk_commit();
        }
        store_lse(p, lse, c, sq, cw, ltid);
    }

    static __device__ __forceinline__ void store_lse(const FwdParams& p, const float (&lse)[1][2], const TileCoord& c,
                                                     const SeqSpan& sq, int cw, int ltid) {
        const int warp = ltid / 32, lane = ltid % 32, g = lane / 4, t = lane % 4;
        const int m_start = c.m_block * BM, seqlen_q = sq.seqlen_q;
        if (p.write_lse && t == 0) {
            // (batch, heads_q, seqlen_q), or packed (heads_q, total_q) for variable lengths
            float* g_lse = p.lse + (p.cu_seqlens_q != nullptr ? (long long)c.h * p.seqlen_q + sq.q0
                                                               : ((long long)c.b * p.heads_q + c.h) * p.seqlen_q);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m_start + cw * 64 + warp * 16 + g + 8 * h;
                if (row < seqlen_q) g_lse[row] = lse[0][h];
            }
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
