// Parameters of the backward kernels, passed BY VALUE as each kernel's single argument.
// Mirrored field for field by cudattn/_kernels/params.py (BwdParams); change both together.
#pragma once
#include "cudattn/params.cuh"

// The forward's description of the call (q, k, v, the forward's output in `o`, its LSE in `lse`,
// sizes, strides, modifiers, window, packed offsets) plus the gradients and the workspace.
//
// Rows: the row-wise kernels (bwd/rows.cuh) see rows_b batches of rows_s query rows (a packed
// batch: one batch of total_q rows, its batch strides 0). Row (b, i) of head h has LSE, dsum and
// lse2 index (b * heads_q + h) * rows_s + i, and dq_accum row b * rows_s + i: the forward's LSE
// layout, (B, Hq, Sq) or (Hq, total_q).
struct BwdParams {
    FwdParams f;
    const void* dout;
    void* dq;
    void* dk;
    void* dv;
    float* dq_accum;   // (rows_b * rows_s, heads_q, tile_dim) float32: sum of dS.K, unscaled
    float* dsum;       // D = rowsum(dO * O), LSE layout
    float* lse2;       // LSE * log2(e), -inf (a row that saw no key) made +inf so its P is 0
    float* dsinks;     // (heads_q,) float32, or null without sinks
    int* semaphores;   // deterministic: (batch, heads_q, num_m_blocks) zeros; null otherwise
    long long do_stride_b, do_stride_s, do_stride_h;
    long long dq_stride_b, dq_stride_s, dq_stride_h;
    long long dk_stride_b, dk_stride_s, dk_stride_h;
    long long dv_stride_b, dv_stride_s, dv_stride_h;
    int rows_b, rows_s;
    int tile_dim;      // dq_accum's row width (the kernels' padded head dim)
    int num_n_blocks;  // key blocks of the longest sequence
    float scale;       // the softmax scale: dQ = scale * dS.K, dK = scale * dS^T.Q
    int deterministic; // 1: each dQ block is summed in key-block order (semaphores)
};
