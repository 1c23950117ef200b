// Pieces both Hopper backward consumers (bwd/sm90_consumer.cuh, bwd/sm90_wide_consumer.cuh) share:
// the score products, zeroed accumulators, a warp's arrival on a ring's mbarrier,
// and the end of the walk, where dK (times the scale) and dV go from the accumulators straight to
// global memory.
#pragma once
#include "cudattn/bwd/scores.cuh"
#include "cudattn/bwd/sm90_params.cuh"
#include "cudattn/seqlen.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/wgmma.cuh"

namespace cudattn {
namespace sm90 {

// S^T or dP^T: D(64 x N) = A(64 rows of K or V) . B(N rows of Q or dO)^T over the head dim D, both
// K-major in 128-byte boxes of 64 columns (A_BOX, B_BOX bytes apart): k-steps of 32 bytes inside
// each box row.
template <typename T, int N, int D, int A_BOX, int B_BOX>
__device__ __forceinline__ void issue_scores(float (&acc)[1][N / 8][4], unsigned long long a, unsigned long long b) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned step = (kk % 4) * (32 >> 4), box = kk / 4;
        Wgmma<T>::ss(flat<N>(acc), a + step + box * (A_BOX >> 4), b + step + box * (B_BOX >> 4), kk > 0);
    }
}

// Accumulators that a walk adds into, zeroed.
template <int N>
__device__ __forceinline__ void zero(float (&acc)[1][N / 8][4]) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][i][e] = 0.f;
}

// Every lane of the warp is done with the stage: one arrival for the warp.
__device__ __forceinline__ void warp_release(unsigned long long* bar, int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}

// This warp's 16 key rows (from key_row0 of the block at n_start) x N columns (from col0) of dK
// and dV, in the wgmma accumulator layout; rows past the sequence and columns past the head dim
// dropped.
template <typename T, int BN, int N>
__device__ __forceinline__ void store_dk_dv(const BwdParams& bp, const SeqSpan& sq, int hkv, int b, int n_start,
                                            int key_row0, int col0, const float (&dk)[1][N / 8][4],
                                            const float (&dv)[1][N / 8][4], int lane) {
    const FwdParams& p = bp.f;
    const int g = lane >> 2, t = lane & 3;
    const int keys_valid = min(BN, sq.seqlen_k - n_start);
    T* gk = static_cast<T*>(bp.dk) + b * bp.dk_stride_b + hkv * bp.dk_stride_h + (long long)(sq.k0 + n_start) * bp.dk_stride_s;
    T* gv = static_cast<T*>(bp.dv) + b * bp.dv_stride_b + hkv * bp.dv_stride_h + (long long)(sq.k0 + n_start) * bp.dv_stride_s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = key_row0 + g + 8 * h;
        if (r >= keys_valid) continue;
#pragma unroll
        for (int df = 0; df < N / 8; ++df) {
            const int c = col0 + df * 8 + 2 * t;
            if (c >= p.head_dim) continue;
            *reinterpret_cast<unsigned*>(gk + r * bp.dk_stride_s + c) = pack2(dk[0][df][2 * h] * bp.scale, dk[0][df][2 * h + 1] * bp.scale, T());
            *reinterpret_cast<unsigned*>(gv + r * bp.dv_stride_s + c) = pack2(dv[0][df][2 * h], dv[0][df][2 * h + 1], T());
        }
    }
}

}  // namespace sm90
}  // namespace cudattn
