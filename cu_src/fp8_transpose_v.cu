// V (e4m3, any (batch, seq, head) strides, unit head-dim stride) -> Vt (batch, heads_kv, head_dim,
// seq_pad), the K-major operand that e4m3 tensor-core products need for O += P V. Keys are
// permuted inside each 32-key group (fp8.cuh: fp8_vt_key) so that P packs into its operand with no
// lane exchange; positions past seqlen_k are written as zeros (P is 0 there, and 0 * NaN is NaN).
// One block: 64 keys x the whole head dim of one (batch, kv head), staged in shared memory so
// both the reads (16-byte vectors along the head dim) and the writes (along keys) are coalesced.
#include "cudattn/fp8.cuh"

struct TransposeVParams {
    const unsigned char* v;
    unsigned char* vt;
    long long v_stride_b, v_stride_s, v_stride_h;  // bytes = elements
    int seqlen_k, seq_pad, heads_kv, head_dim;
};

namespace {
constexpr int KEYS = 64;          // keys per block
constexpr int PITCH = 256 + 16;   // bytes per staged key row (head dim <= 256); +16 spreads banks
constexpr int THREADS = 256;
}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) fp8_transpose_v(const __grid_constant__ TransposeVParams p) {
    __shared__ __align__(16) unsigned char tile[KEYS * PITCH];
    const int key0 = blockIdx.x * KEYS, h = blockIdx.y, b = blockIdx.z;
    const int chunks = p.head_dim / 16;  // head_dim is a multiple of 16
    const unsigned char* src = p.v + b * p.v_stride_b + h * p.v_stride_h;
    for (int i = threadIdx.x; i < KEYS * chunks; i += THREADS) {
        const int r = i / chunks, c = i % chunks, key = key0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (key < p.seqlen_k) val = *reinterpret_cast<const uint4*>(src + key * p.v_stride_s + c * 16);
        *reinterpret_cast<uint4*>(tile + r * PITCH + c * 16) = val;
    }
    __syncthreads();
    unsigned char* dst = p.vt + ((long long)b * p.heads_kv + h) * p.head_dim * (long long)p.seq_pad + key0;
    for (int i = threadIdx.x; i < p.head_dim * (KEYS / 16); i += THREADS) {
        const int d = i / (KEYS / 16), part = i % (KEYS / 16);  // 16 output positions k0 .. k0 + 15
        const int k0 = part * 16, group = k0 & ~31;
        unsigned w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            unsigned x = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = k0 + 4 * q + j;
                x |= (unsigned)tile[(group + cudattn::fp8_vt_key(k & 31)) * PITCH + d] << (8 * j);
            }
            w[q] = x;
        }
        *reinterpret_cast<uint4*>(dst + d * (long long)p.seq_pad + k0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
