// Bring-up test of the Hopper building blocks (DESIGN §8: test each new instruction's layouts
// against a plain computation before building a kernel on them). One CTA, one warpgroup:
//   TMA loads Q (64x128), K (64x128), V (64x128) in the 128-byte swizzle, two 64-column boxes each;
//   S = Q K^T with wgmma SS (both operands K-major), written out in fp32;
//   P = S rounded to the dtype, in registers (the RS A layout), O = P V with wgmma RS and V as an
//   MN-major B operand (trans-b), written out in fp32.
// The V descriptor's byte offsets come from the host, so one launch per candidate tells which
// (lbo, sbo) reading of the PTX ISA is the right one.
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/tma.cuh"
#include "cudattn/sm90/wgmma.cuh"

#ifdef CUDATTN_DTYPE_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef __half elem_t;
#endif

using namespace cudattn::sm90;

struct SelfTestParams {
    TmaDescriptor q, k, v;  // 64 rows x 128 columns each, box 64 x 64, 128-byte swizzle
    float* s_out;           // 64 x 64
    float* o_out;           // 64 x 128
    unsigned v_lbo, v_sbo;
};

constexpr int kBox = 64 * 64 * 2;  // bytes of one 64x64 box of 16-bit elements

// A warpgroup's 64xN fp32 accumulator -> row-major `out` (N columns), in the layout of sm90/wgmma.cuh.
template <int N>
__device__ __forceinline__ void store_accumulator(float* out, const float (&d)[N / 2], int row, int col) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
        out[row * N + 8 * i + col] = d[4 * i];
        out[row * N + 8 * i + col + 1] = d[4 * i + 1];
        out[(row + 8) * N + 8 * i + col] = d[4 * i + 2];
        out[(row + 8) * N + 8 * i + col + 1] = d[4 * i + 3];
    }
}

extern "C" __global__ void __launch_bounds__(128) sm90_selftest(const __grid_constant__ SelfTestParams p) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);  // swizzle atoms: 1 KiB aligned
    unsigned char* sQ = smem;
    unsigned char* sK = smem + 2 * kBox;
    unsigned char* sV = smem + 4 * kBox;
    __shared__ unsigned long long bar;

    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(&bar, 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(&bar, 6 * kBox);
        for (int b = 0; b < 2; ++b) {
            tma_load_2d(sQ + b * kBox, &p.q, 64 * b, 0, &bar);
            tma_load_2d(sK + b * kBox, &p.k, 64 * b, 0, &bar);
            tma_load_2d(sV + b * kBox, &p.v, 64 * b, 0, &bar);
        }
    }
    mbar_wait(&bar, 0);

    const int warp = tid / 32, lane = tid % 32;
    const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);

    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    wgmma_fence();
    fence_operands(s);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {  // head dim 128 = 8 steps of 16; 4 per 64-column box, 32 bytes each
        const int off = (kk / 4) * kBox + (kk % 4) * 32;
        Wgmma<elem_t>::ss(s, smem_desc_sw128(sQ + off, 16, 1024), smem_desc_sw128(sK + off, 16, 1024),
                                    kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);
    store_accumulator<64>(p.s_out, s, row, col);

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    wgmma_fence();
    fence_operands(o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // 64 keys = 4 steps of 16 rows of V (2048 bytes each)
        const unsigned a[4] = {pack2(s[8 * j], s[8 * j + 1], elem_t()), pack2(s[8 * j + 2], s[8 * j + 3], elem_t()),
                               pack2(s[8 * j + 4], s[8 * j + 5], elem_t()), pack2(s[8 * j + 6], s[8 * j + 7], elem_t())};
        Wgmma<elem_t>::rs<1>(o, a, smem_desc_sw128(sV + j * 16 * 128, p.v_lbo, p.v_sbo), j > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    store_accumulator<128>(p.o_out, o, row, col);
}
