// Merges the attention states given to cudattn.merge_attention_states (parts over disjoint key
// sets; the math is cudattn/combine.cuh's). One warp per output row, (b, h, t) with t fastest.
#include "cudattn/combine.cuh"
#include "cudattn/params_decode.cuh"

// CUDATTN_IN / CUDATTN_OUT: 0 float32, 1 float16, 2 bfloat16.
typedef cudattn::Elem<CUDATTN_IN> In;
typedef cudattn::Elem<CUDATTN_OUT> Out;

extern "C" __global__ void __launch_bounds__(128) split_kv_combine(const __grid_constant__ CombineParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __shared__ float w_buf[4][32];  // each warp's part weights (combine_row)
    // (b, h, t), t fastest. Fewer than 2^31 rows (the launcher checks): 32-bit division, as a 64-bit
    // one is a call whose saved registers spill the merge's loads in flight.
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= p.batch * p.heads * p.seqlen_q) return;
    const int t = row % p.seqlen_q, bh = row / p.seqlen_q;
    const int h = bh % p.heads, b = bh / p.heads;
    const long long lse_off = b * p.lse_stride_b + h * p.lse_stride_h + t * p.lse_stride_s;
    const long long in_off = b * p.in_stride_b + t * p.in_stride_s + h * p.in_stride_h;
    Out::type* dst = static_cast<Out::type*>(p.o) + b * p.o_stride_b + t * p.o_stride_s + h * p.o_stride_h;
    float lse;
    if (p.use_table) {  // parts anywhere: their addresses from the tables
        lse = cudattn::combine_row<Out>(
            p.num_parts, p.head_dim, lane, [&p, lse_off](int s) { return p.lse_table[s][lse_off]; },
            [&p, in_off](int s, int c) { return In::load4(static_cast<const In::type*>(p.o_table[s]) + in_off + c); },
            dst, w_buf[warp]);
    } else {  // parts stacked at fixed strides
        const float* lse0 = p.lse_parts + lse_off;
        const In::type* o0 = static_cast<const In::type*>(p.o_parts) + in_off;
        const long long ls = p.lse_part_stride, os = p.o_part_stride;
        lse = cudattn::combine_row<Out>(
            p.num_parts, p.head_dim, lane, [lse0, ls](int s) { return lse0[s * ls]; },
            [o0, os](int s, int c) { return In::load4(o0 + s * os + c); }, dst, w_buf[warp]);
    }
    if (p.lse != nullptr && lane == 0) p.lse[row] = lse;  // (B, H, Sq): index row
}
