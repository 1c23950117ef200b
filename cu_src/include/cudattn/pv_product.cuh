// O += P·V for one tile of keys with 16-bit operands on mma.sync m16n8k16, as the portable forward
// and the split-KV decode kernels compute it: P is packed to T, one 16-key step at a time, from the
// S accumulators (already exponentiated), and V's tile is read transposed from shared memory by
// ldmatrix.trans at v_base (this lane's addresses: v_lane).
#pragma once
#include "cudattn/ptx.cuh"
#include "cudattn/smem_tile.cuh"

namespace cudattn {

// MF 16-row fragments, KSTEPS 16-key steps (S holds 2 * KSTEPS 8-key fragments per row fragment),
// DF 8-wide head-dim fragments of O.
template <typename T, int MF, int KSTEPS, int DF, int W>
__device__ __forceinline__ void pv_product_16bit(float (&o)[MF][DF][4], const float (&s)[MF][2 * KSTEPS][4],
                                                 u32 v_base, const LaneTile<W>& v_lane) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 pa[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
            pa[mf][0] = Mma<T>::pack(s[mf][2 * kk][0], s[mf][2 * kk][1]);
            pa[mf][1] = Mma<T>::pack(s[mf][2 * kk][2], s[mf][2 * kk][3]);
            pa[mf][2] = Mma<T>::pack(s[mf][2 * kk + 1][0], s[mf][2 * kk + 1][1]);
            pa[mf][3] = Mma<T>::pack(s[mf][2 * kk + 1][2], s[mf][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < DF / 2; ++dp) {
            u32 bv[4];
            ldmatrix_x4_trans(bv, v_base + v_lane.at(kk * 16, 2 * dp));
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) {
                Mma<T>::run(o[mf][2 * dp], pa[mf], bv[0], bv[1]);
                Mma<T>::run(o[mf][2 * dp + 1], pa[mf], bv[2], bv[3]);
            }
        }
    }
}

}  // namespace cudattn
