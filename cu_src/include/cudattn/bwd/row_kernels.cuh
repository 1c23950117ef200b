// The backward's row-wise entry points (bwd/rows.cuh), the same in both families' programs
// (flash_bwd_sm80.cu, flash_bwd_sm90.cu): included once per program, after cudattn_elem_t.
#pragma once
#include "cudattn/bwd/rows.cuh"

#define CUDATTN_ROW_THREADS 128

extern "C" __global__ void __launch_bounds__(CUDATTN_ROW_THREADS) flash_bwd_prepare(const __grid_constant__ BwdParams params) {
    cudattn::bwd_prepare<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_ROW_THREADS>(params);
}

extern "C" __global__ void __launch_bounds__(CUDATTN_ROW_THREADS) flash_bwd_finish_dq(const __grid_constant__ BwdParams params) {
    cudattn::bwd_finish_dq<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_ROW_THREADS>(params);
}

extern "C" __global__ void __launch_bounds__(256) flash_bwd_dsinks(const __grid_constant__ BwdParams params) {
    cudattn::bwd_dsinks<256>(params);
}
