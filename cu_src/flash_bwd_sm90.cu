// Entry points of the Hopper backward pass (sm_90a), one NVRTC program per variant (CUDATTN_*
// macros from cudattn/_kernels/backward.py): the row-wise passes shared with the portable family
// and the main kernel (bwd_sm90.cuh), launched prepare, main, dQ conversion, sinks' gradient.
#include "cudattn/bwd_sm90.cuh"

#if CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 cudattn_elem_t;
#else
typedef __half cudattn_elem_t;
#endif

#include "cudattn/bwd/row_kernels.cuh"

typedef cudattn::sm90::BwdSm90<cudattn_elem_t, CUDATTN_HEAD_DIM, (CUDATTN_CAUSAL != 0)> cudattn_bwd_variant;
// The host sizes the grid, the turn counters and the TMA boxes from the same shape
// (cudattn/_kernels/backward_traits.py, _SM90_TILES): a mismatch would leave the loads' byte
// counts wrong and the kernel waiting, so the build refuses one.
static_assert(CUDATTN_BLOCK_M == cudattn_bwd_variant::BM && CUDATTN_BLOCK_N == cudattn_bwd_variant::BN &&
                  CUDATTN_WARPS * 32 == cudattn_bwd_variant::NT && CUDATTN_STAGES == cudattn_bwd_variant::STAGES &&
                  CUDATTN_SMEM_BYTES == cudattn_bwd_variant::SMEM_BYTES,
              "the host's tiles (CUDATTN_BLOCK_M, _N, _WARPS, _STAGES) and shared memory must be the kernel's");

extern "C" __global__ void __launch_bounds__(cudattn_bwd_variant::NT, 1) flash_bwd_sm90(const __grid_constant__ BwdSm90Params params) {
    cudattn_bwd_variant::run(params);
}
