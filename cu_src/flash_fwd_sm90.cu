// Entry point of the Hopper (sm_90a) forward kernel. One NVRTC program per variant: the variant
// is chosen by the CUDATTN_* macros that cudattn/_traits.py passes as -D options.
#include "cudattn/fwd_sm90.cuh"

#if CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 cudattn_elem_t;
#else
typedef __half cudattn_elem_t;
#endif

typedef cudattn::sm90::FwdSm90<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_BLOCK_N, CUDATTN_STAGES, CUDATTN_Q_STAGES,
                               (CUDATTN_CAUSAL != 0), (CUDATTN_PINGPONG != 0)>
    cudattn_fwd_variant;

extern "C" __global__ void __launch_bounds__(cudattn_fwd_variant::NT, 1)
    flash_fwd_sm90(const __grid_constant__ FwdSm90Params params) {
    cudattn_fwd_variant::run(params);
}
