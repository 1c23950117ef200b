// Entry point of the Hopper (sm_90a) forward kernel. One NVRTC program per variant: the variant
// is chosen by the CUDATTN_* macros that cudattn/_kernels/traits.py passes as -D options.
#include "cudattn/fwd_sm90.cuh"

#ifndef CUDATTN_CONSUMERS
#define CUDATTN_CONSUMERS 2
#endif
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
typedef __nv_bfloat16 cudattn_fwd_out_t;
#else
typedef __half cudattn_elem_t;
typedef __half cudattn_fwd_out_t;
#endif

typedef cudattn::sm90::FwdSm90<cudattn_elem_t, cudattn_fwd_out_t, CUDATTN_HEAD_DIM, CUDATTN_BLOCK_N, CUDATTN_STAGES,
                               CUDATTN_Q_STAGES, (CUDATTN_CAUSAL != 0), (CUDATTN_PINGPONG != 0),
                               CUDATTN_CONSUMERS, CUDATTN_MODS>
    cudattn_fwd_variant;

#ifdef CUDATTN_SMEM_BYTES  // the host's count of the dynamic shared memory it launches with (traits.py)
static_assert(cudattn_fwd_variant::SMEM_BYTES == CUDATTN_SMEM_BYTES,
              "the host's smem_bytes and the kernel's layout disagree (fwd_sm90.cuh SMEM_BYTES, traits.py smem_bytes)");
#endif

extern "C" __global__ void __launch_bounds__(cudattn_fwd_variant::NT, cudattn_fwd_variant::MIN_BLOCKS)
    flash_fwd_sm90(const __grid_constant__ FwdSm90Params params) {
    cudattn_fwd_variant::run(params);
}
