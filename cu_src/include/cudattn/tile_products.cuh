// The two products of one key tile on mma.sync, as the portable forward and the split-KV decode
// kernels compute them from swizzled shared-memory tiles (ldmatrix; this lane's addresses in
// LaneTile form): S = Q·Kᵀ, and O += P·V with 16-bit operands.
#pragma once
#include "cudattn/ptx.cuh"
#include "cudattn/smem_tile.cuh"

namespace cudattn {

// Every accumulator of M x N mma fragments set to 0.
template <int M, int N>
__device__ __forceinline__ void zero_fragments(float (&a)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) a[m][n][e] = 0.f;
}

// S = Q·Kᵀ for MF 16-row fragments of Q and NF 8-key fragments of K, over KSTEPS steps of 16
// units of the head dim (16-bit types: k16 steps; e4m3: k32 steps, 32 bytes of Q and K rows either way).
template <typename T, int MF, int NF, int KSTEPS, int WQ, int WK>
__device__ __forceinline__ void qk_product(float (&s)[MF][NF][4], u32 q_base, const LaneTile<WQ>& q_lane, u32 k_base,
                                           const LaneTile<WK>& k_lane) {
    zero_fragments(s);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 a[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) ldmatrix_x4(a[mf], q_base + q_lane.at(mf * 16, 2 * kk));
#pragma unroll
        for (int np = 0; np < NF / 2; ++np) {
            u32 bk[4];
            ldmatrix_x4(bk, k_base + k_lane.at(np * 16, 2 * kk));
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) {
                Mma<T>::run(s[mf][2 * np], a[mf], bk[0], bk[1]);
                Mma<T>::run(s[mf][2 * np + 1], a[mf], bk[2], bk[3]);
            }
        }
    }
}

// P's A fragments of 16-key step kk, packed to T from the S accumulators (exponentiated).
template <typename T, int MF, int NF>
__device__ __forceinline__ void pack_p_step(u32 (&pa)[MF][4], const float (&s)[MF][NF][4], int kk) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
        pa[mf][0] = Mma<T>::pack(s[mf][2 * kk][0], s[mf][2 * kk][1]);
        pa[mf][1] = Mma<T>::pack(s[mf][2 * kk][2], s[mf][2 * kk][3]);
        pa[mf][2] = Mma<T>::pack(s[mf][2 * kk + 1][0], s[mf][2 * kk + 1][1]);
        pa[mf][3] = Mma<T>::pack(s[mf][2 * kk + 1][2], s[mf][2 * kk + 1][3]);
    }
}

// O += P·V for one tile of keys with 16-bit operands: P is packed to T, one 16-key step at a time,
// from the S accumulators (already exponentiated), and V's tile is read transposed by ldmatrix.trans.
// MF 16-row fragments, KSTEPS 16-key steps (S holds 2 * KSTEPS 8-key fragments per row fragment),
// DF 8-wide head-dim fragments of O.
template <typename T, int MF, int KSTEPS, int DF, int W>
__device__ __forceinline__ void pv_product_16bit(float (&o)[MF][DF][4], const float (&s)[MF][2 * KSTEPS][4],
                                                 u32 v_base, const LaneTile<W>& v_lane) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 pa[MF][4];
        pack_p_step<T>(pa, s, kk);
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
