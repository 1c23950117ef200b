// Entry points of the backward pass (sm_80+), one NVRTC program per variant (CUDATTN_* macros from
// cudattn/_kernels/backward.py): the row-wise prepare pass, the main kernel over key blocks, the dQ
// conversion and the sinks' gradient, launched in that order on one stream.
#include "cudattn/bwd_sm80.cuh"

#ifndef CUDATTN_MODS
#define CUDATTN_MODS 0
#endif

#if CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 cudattn_elem_t;
#else
typedef __half cudattn_elem_t;
#endif

#include "cudattn/bwd/row_kernels.cuh"

typedef cudattn::BwdSm80<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_BLOCK_M, CUDATTN_BLOCK_N, CUDATTN_WARPS,
                         CUDATTN_STAGES, (CUDATTN_CAUSAL != 0), CUDATTN_MODS>
    cudattn_bwd_variant;
// The host launches with the shared memory it computes from the same tiles
// (cudattn/_kernels/backward_traits.py, BwdKernel.smem_bytes): the build refuses a mismatch.
static_assert(CUDATTN_SMEM_BYTES == cudattn_bwd_variant::SMEM_BYTES, "the host's shared-memory size must be the kernel's");

extern "C" __global__ void __launch_bounds__(CUDATTN_WARPS * 32, CUDATTN_MIN_BLOCKS) flash_bwd_sm80(const __grid_constant__ BwdParams params) {
    cudattn_bwd_variant::run(params);
}
