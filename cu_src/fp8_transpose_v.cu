// V (e4m3, any (batch, seq, head) strides, unit head-dim stride) -> Vt (batch, heads_kv, head_dim,
// seq_pad), the K-major operand that e4m3 tensor-core products need for O += P V. Keys are
// permuted inside each 32-key group (fp8.cuh: fp8_vt_key) so that P packs into its operand with no
// lane exchange; positions past seqlen_k are written as zeros (P is 0 there, and 0 * NaN is NaN).
// One block: 64 keys x the whole head dim of one (batch, kv head), staged in shared memory so
// both the reads (16-byte vectors along the head dim) and the writes (along keys) are coalesced.
// Packed variable-length keys (cu_seqlens): Vt is (1, heads_kv, head_dim, seq_pad), sequence b's
// keys starting at vt_key_start (seqlen.cuh), each sequence followed by zeros (VT_SEGMENT_PAD);
// seqlen_k is then the packed total, and the grid covers the longest sequence.
#include "cudattn/fp8.cuh"
#include "cudattn/seqlen.cuh"

struct TransposeVParams {
    const unsigned char* v;
    unsigned char* vt;
    long long v_stride_b, v_stride_s, v_stride_h;  // bytes = elements
    int seqlen_k, seq_pad, heads_kv, head_dim;
    const int* cu_seqlens;  // null: a padded batch
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
    int k0 = 0, seqlen = p.seqlen_k;
    long long out0 = ((long long)b * p.heads_kv + h) * p.head_dim * (long long)p.seq_pad;
    if (p.cu_seqlens != nullptr) {
        cudattn::clamp_span(p.cu_seqlens, b, p.seqlen_k, k0, seqlen);
        if (key0 >= (seqlen + 127) / 128 * 128 + cudattn::VT_SEGMENT_PAD) return;  // past its zeros
        out0 = (long long)h * p.head_dim * p.seq_pad + cudattn::vt_key_start(k0, b);
    }
    const unsigned char* src = p.v + b * p.v_stride_b + h * p.v_stride_h + (long long)k0 * p.v_stride_s;
    for (int i = threadIdx.x; i < KEYS * chunks; i += THREADS) {
        const int r = i / chunks, c = i % chunks, key = key0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (key < seqlen) val = *reinterpret_cast<const uint4*>(src + key * p.v_stride_s + c * 16);
        *reinterpret_cast<uint4*>(tile + r * PITCH + c * 16) = val;
    }
    __syncthreads();
    unsigned char* dst = p.vt + out0 + key0;
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
