// Entry point of the portable (sm_80+) forward kernel. One NVRTC program per variant: the
// variant is chosen by the CUDATTN_* macros that cudattn/_kernels/traits.py passes as -D options.
#include "cudattn/fwd_sm80.cuh"

#ifndef CUDATTN_MODS
#define CUDATTN_MODS 0
#endif
#ifndef CUDATTN_DTYPE_FP8
#define CUDATTN_DTYPE_FP8 0
#endif

#if CUDATTN_DTYPE_FP8
typedef cudattn::e4m3_t cudattn_elem_t;
typedef cudattn_out_t cudattn_fwd_out_t;  // CUDATTN_OUT (fp8.cuh)
#elif CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 cudattn_elem_t;
typedef cudattn_elem_t cudattn_fwd_out_t;
#else
typedef __half cudattn_elem_t;
typedef cudattn_elem_t cudattn_fwd_out_t;
#endif

typedef cudattn::FwdSm80<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_BLOCK_M, CUDATTN_BLOCK_N, CUDATTN_WARPS,
                         CUDATTN_STAGES, (CUDATTN_CAUSAL != 0), cudattn_fwd_out_t, CUDATTN_MODS>
    cudattn_fwd_variant;

extern "C" __global__ void __launch_bounds__(CUDATTN_WARPS * 32, CUDATTN_MIN_BLOCKS)
    flash_fwd_sm80(const __grid_constant__ FwdParams params) {
    cudattn_fwd_variant::run(params);
}
