// Entry point of the split-KV decode kernel (cudattn/fwd_decode.cuh). One NVRTC program per
// variant, chosen by the CUDATTN_* macros that cudattn/_kernels/traits.py passes as -D options.
#include "cudattn/fwd_decode.cuh"

#if CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 cudattn_elem_t;
#else
typedef __half cudattn_elem_t;
#endif

#ifndef CUDATTN_DECODE_MODS
#define CUDATTN_DECODE_MODS 0
#endif
#ifndef CUDATTN_KV_FP8
#define CUDATTN_KV_FP8 0
#endif
#ifndef CUDATTN_KEYS_AS_M
#define CUDATTN_KEYS_AS_M 0
#endif

typedef cudattn::FwdDecode<cudattn_elem_t, CUDATTN_HEAD_DIM, CUDATTN_WARPS, CUDATTN_WARP_KEYS, CUDATTN_STAGES,
                           CUDATTN_ROW_FRAGS, (CUDATTN_DECODE_MODS != 0), (CUDATTN_KV_FP8 != 0),
                           (CUDATTN_KEYS_AS_M != 0)>
    cudattn_decode_variant;

// At least two blocks an SM (what the split heuristic aims for): without a minimum, ptxas held some
// one-fragment builds to 96-128 registers and spilled a few values around the epilogue's division.
// Builds whose ring fills an SM alone ask for one (at 8 warps, two would cap them at 128 registers).
#ifndef CUDATTN_DECODE_MIN_BLOCKS
#define CUDATTN_DECODE_MIN_BLOCKS 2
#endif
extern "C" __global__ void __launch_bounds__(CUDATTN_WARPS * 32, CUDATTN_DECODE_MIN_BLOCKS)
    flash_decode(const __grid_constant__ DecodeParams params) {
    cudattn_decode_variant::run(params);
}
