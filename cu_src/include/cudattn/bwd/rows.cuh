// The backward's row-wise passes, one warp-slice of lanes per query row of one head:
//   bwd_prepare   D = rowsum(dO * O) and lse2 = LSE * log2 e for every row, and the row's dQ
//                 accumulator zeroed (the main kernel adds into it), as are the deterministic
//                 mode's turn counters;
//   bwd_finish_dq dQ = scale * accumulator, converted to the input dtype;
//   bwd_dsinks    the sinks' gradient, -sum over a head's rows of exp(sink - LSE) * D, summed in a
//                 fixed order (one block per head), so it is the same bit for bit run to run.
#pragma once
#include "cudattn/bwd/params.cuh"
#include "cudattn/elem.cuh"
#include "cudattn/ptx.cuh"

namespace cudattn {

// Lanes that share a row: a power of two (their sum is a butterfly of shuffles), at most a warp,
// each with a whole number of 16-byte (8-element) pieces: 8 elements a lane up to width 256,
// except 192 (24 pieces: 8 lanes of 24 elements). The host sizes the row grid by the same rule
// (cudattn/_kernels/backward.py, row_lanes; the export's cudattn_backward.h).
template <int TD>
struct RowLanes {
    static constexpr int PIECES = TD / 8;
    static constexpr int L = PIECES >= 32 ? 32 : PIECES % 16 == 0 ? 16 : PIECES % 8 == 0 ? 8 : PIECES % 4 == 0 ? 4 : 2;
    static constexpr int PER_LANE = TD / L;
    static constexpr int ROWS_PER_WARP = 32 / L;
    static_assert(PIECES % L == 0, "a row's pieces split evenly among its lanes");
};

// This thread's (b, i) row, head, first column; false when it has none. Grid: (row blocks, heads, rows_b).
template <int TD, int NT>
__device__ __forceinline__ bool row_of(const BwdParams& p, int& b, int& h, int& i, int& col) {
    typedef RowLanes<TD> RL;
    constexpr int ROWS = NT / 32 * RL::ROWS_PER_WARP;
    const int lane = threadIdx.x & 31;
    i = blockIdx.x * ROWS + (threadIdx.x >> 5) * RL::ROWS_PER_WARP + lane / RL::L;
    h = blockIdx.y;
    b = blockIdx.z;
    col = (lane % RL::L) * RL::PER_LANE;
    return i < p.rows_s;
}

template <int L>
__device__ __forceinline__ float sum_lanes(float x) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <typename T, int TD, int NT>
__device__ __forceinline__ void bwd_prepare(const BwdParams& p) {
    typedef typename ElemOf<T>::type E;
    typedef RowLanes<TD> RL;
    if (p.semaphores != nullptr) {  // deterministic: every turn counter back to 0 (grid-stride)
        const long long count = (long long)p.f.batch * p.f.heads_q * p.f.num_m_blocks;
        const long long nthreads = (long long)gridDim.x * gridDim.y * gridDim.z * NT;
        for (long long j = ((blockIdx.z * (long long)gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * NT + threadIdx.x;
             j < count; j += nthreads)
            p.semaphores[j] = 0;
    }
    int b, h, i, col;
    const bool ok = row_of<TD, NT>(p, b, h, i, col);
    float acc = 0.f;
    if (ok) {
        const T* o = static_cast<const T*>(p.f.o) + b * p.f.o_stride_b + (long long)i * p.f.o_stride_s + h * p.f.o_stride_h;
        const T* d = static_cast<const T*>(p.dout) + b * p.do_stride_b + (long long)i * p.do_stride_s + h * p.do_stride_h;
#pragma unroll
        for (int c = 0; c < RL::PER_LANE; c += 4) {
            if (col + c < p.f.head_dim) {
                const float4 x = E::load4(o + col + c), y = E::load4(d + col + c);
                acc = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, acc))));
            }
        }
        float* accum = p.dq_accum + ((long long)b * p.rows_s + i) * p.f.heads_q * p.tile_dim + h * p.tile_dim + col;
#pragma unroll
        for (int c = 0; c < RL::PER_LANE; c += 4) *reinterpret_cast<float4*>(accum + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    acc = sum_lanes<RL::L>(acc);
    if (ok && col == 0) {
        const long long r = ((long long)b * p.f.heads_q + h) * p.rows_s + i;
        const float lse = p.f.lse[r];
        p.dsum[r] = acc;
        p.lse2[r] = lse == -CUDATTN_INF ? CUDATTN_INF : lse * 1.4426950408889634f;
    }
}

template <typename T, int TD, int NT>
__device__ __forceinline__ void bwd_finish_dq(const BwdParams& p) {
    typedef typename ElemOf<T>::type E;
    typedef RowLanes<TD> RL;
    int b, h, i, col;
    if (!row_of<TD, NT>(p, b, h, i, col)) return;
    const float* accum = p.dq_accum + ((long long)b * p.rows_s + i) * p.f.heads_q * p.tile_dim + h * p.tile_dim + col;
    T* dq = static_cast<T*>(p.dq) + b * p.dq_stride_b + (long long)i * p.dq_stride_s + h * p.dq_stride_h + col;
#pragma unroll
    for (int c = 0; c < RL::PER_LANE; c += 4) {
        if (col + c < p.f.head_dim) {
            float4 x = *reinterpret_cast<const float4*>(accum + c);
            x.x *= p.scale, x.y *= p.scale, x.z *= p.scale, x.w *= p.scale;
            E::store4(dq + c, x);
        }
    }
}

// One block of NT threads per head: thread t sums rows t, t + NT, ... in order, then a fixed tree.
template <int NT>
__device__ __forceinline__ void bwd_dsinks(const BwdParams& p) {
    __shared__ float part[NT];
    const int h = blockIdx.x;
    const float sink = p.f.sinks[h];
    const long long rows = (long long)p.rows_b * p.rows_s;
    float acc = 0.f;
    for (long long r = threadIdx.x; r < rows; r += NT) {
        const long long b = r / p.rows_s, i = r - b * p.rows_s;
        const long long idx = (b * p.f.heads_q + h) * p.rows_s + i;
        acc += expf(sink - p.f.lse[idx]) * p.dsum[idx];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
#pragma unroll
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) p.dsinks[h] = -part[0];
}

}  // namespace cudattn
