// The ring backward's float32 accumulators (cudattn/distributed/ring_backward.py):
//   ring_add    dst[r, c] += float(src[r, c])  (src CUDATTN_ADD_IN: 0 float32, 1 float16, 2 bfloat16; dst float32)
//   ring_store  dst[r, c] = src[r, c]          (src float32; dst CUDATTN_STORE_OUT, rounded to nearest even)
// over `rows` rows of `cols` elements, each array's rows `*_pitch` elements apart. Codes: 1 float16,
// 2 bfloat16 (cudattn/elem.cuh); a build defines one of the two switches.
#include "cudattn/elem.cuh"

// Mirrored by cudattn/_kernels/accumulate.py (RingAddParams).
struct RingAddParams {
    const void* src;
    void* dst;
    long long rows, cols, src_pitch, dst_pitch;  // elements
};

namespace ringacc {
constexpr int THREADS = 256;

// f(source offset, destination offset) for every element, in elements, a grid-stride loop.
template <class F>
__device__ __forceinline__ void each(const RingAddParams& p, F&& f) {
    const long long n = p.rows * p.cols, step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long r = i / p.cols, c = i - r * p.cols;
        f(r * p.src_pitch + c, r * p.dst_pitch + c);
    }
}
}  // namespace ringacc

#ifdef CUDATTN_ADD_IN
extern "C" __global__ void __launch_bounds__(ringacc::THREADS) ring_add(const __grid_constant__ RingAddParams p) {
    using In = cudattn::Elem<CUDATTN_ADD_IN>;
    ringacc::each(p, [&](long long s, long long d) {
        static_cast<float*>(p.dst)[d] += In::load1(static_cast<const typename In::type*>(p.src) + s);
    });
}
#endif

#ifdef CUDATTN_STORE_OUT
extern "C" __global__ void __launch_bounds__(ringacc::THREADS) ring_store(const __grid_constant__ RingAddParams p) {
    using Out = cudattn::Elem<CUDATTN_STORE_OUT>;
    ringacc::each(p, [&](long long s, long long d) {
        Out::store1(static_cast<typename Out::type*>(p.dst) + d, static_cast<const float*>(p.src)[s]);
    });
}
#endif
