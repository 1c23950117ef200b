// FlashAttention-3-style forward for Hopper (sm_90a). One CTA = 1 + CONSUMERS warpgroups:
//   warpgroup 0, the producer: one thread issues TMA loads of Q (once per tile) and of K and V
//     tiles into a STAGES-deep ring, each stage completing on its own "full" mbarrier;
//   warpgroups 1.., the consumers (one to three): 64 query rows each (BM = 64 * CONSUMERS), S = Q K^T with
//     wgmma from shared memory, online softmax in registers, O += P V with P as a register
//     operand; a stage is handed back through its "empty" mbarrier once the product that read it
//     has completed.
// Inside a consumer, the next tile's S = Q K^T is issued before the current P V, so the softmax
// of one tile runs while the tensor cores work on the other (intra-warpgroup overlap). With
// PINGPONG, the consumers also take turns issuing their products (named barriers, round robin),
// so one's softmax runs under the others' GEMMs. Three consumers give each SM scheduler three
// warps to issue from where two leave the softmax's dependent chains exposed, at 160 registers a
// consumer thread instead of 240; from head dim 128 those hold O and S but not P beside them, so
// there a consumer's P V completes before its next S = Q K^T is issued, and the other two
// consumers' products cover its softmax (consumer.cuh, SERIAL). One consumer (no ping-pong)
// serves grids too small to fill the GPU, where a CTA's chain of key tiles is the call's time,
// and, two CTAs an SM (MIN_BLOCKS), causal rows of medium length: each CTA on tiles of its own.
// The grid is persistent: in round r, CTA c takes tile r * gridDim.x + c. Causal tiles come
// longest first (bottom row blocks of every head before any shorter one) and odd rounds go
// right to left (a snake), so that the CTAs' sums of tile lengths come out nearly equal; given a
// tile counter (the package's calls whose tiles differ in length: the host's rule,
// cudattn/_kernels/plan.py's _uneven_tiles), CTAs take their tiles from it instead, in the same
// order (sm90/tile_scheduler.cuh).
// Tails: the maps are 4-D over (head dim, seq, head, batch), so TMA zero-fills rows past each
// sequence's end and columns past the head dim on load; O is stored from registers, predicated, or
// at head dim 128 through a shared-memory buffer and a TMA store (sm90/epilogue.cuh).
// Q is handed back as soon as a tile's last S = Q K^T has completed, so the producer loads the
// next tile's Q while the consumers finish the tile. The producer walks the tile order and names
// each tile to the consumers with its Q stage (TileMsg); the consumers compute a tile's
// normalisation under its last P V, and read the next tile's name there too where registers
// allow (sm90/consumer.cuh: OVERLAP_TAIL, NEXT_UNDER_TAIL).
// FP8 (T = e4m3_t): the same pipeline on k = 32 wgmma. e4m3 operands in shared memory must be
// K-major, so V arrives transposed (Vt: head-dim rows of keys, keys permuted per 32 as fp8.cuh
// explains) and P goes from the S accumulators to an e4m3 A operand with no lane exchange. The
// descales scale the softmax and the final normalisation, never the elements.
//
// The parts, by role (FlashAttention-3's hopper/ layout): sm90/tile_scheduler.cuh (the persistent
// grid's tile order), sm90/producer.cuh (the TMA loads and the rings), sm90/consumer.cuh (the
// products and the softmax), sm90/epilogue.cuh (O and LSE to global memory). This file holds the
// shape of a build and the entry that splits the CTA into them.
#pragma once
#include "cudattn/sm90/consumer.cuh"
#include "cudattn/sm90/params.cuh"
#include "cudattn/sm90/producer.cuh"
#include "cudattn/sm90/sync.cuh"

#ifndef CUDATTN_MIN_BLOCKS  // CTAs an SM; the host passes it only where it is 2 (traits.py)
#define CUDATTN_MIN_BLOCKS 1
#endif

namespace cudattn {
namespace sm90 {

template <typename T_, typename OutT_, int D_, int BN_, int STAGES_, int Q_STAGES_, bool CAUSAL_, bool PINGPONG_,
          int CONSUMERS_, int MODS_ = 0>
struct FwdSm90 {
    typedef T_ T;        // the elements of Q, K and V
    typedef OutT_ OutT;  // of O
    static constexpr int D = D_, BN = BN_, STAGES = STAGES_, Q_STAGES = Q_STAGES_, CONSUMERS = CONSUMERS_;
    static constexpr int MODS = MODS_;
    static constexpr bool CAUSAL = CAUSAL_, PINGPONG = PINGPONG_;
    static constexpr bool FP8 = sizeof(T) == 1;
    static constexpr int EB = sizeof(T);      // bytes per element
    static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "one, two or three consumer warpgroups");
    static_assert(!PINGPONG || CONSUMERS > 1, "ping-pong takes turns between consumers");
    static constexpr int BM = 64 * CONSUMERS; // query rows per tile: 64 a consumer warpgroup
    static constexpr int NT = 128 * (1 + CONSUMERS);  // the producer warpgroup + the consumers
    // Q and K rows are cut into boxes of one swizzle row: 128 bytes, or 64 where a row is only 64
    // (FP8 at head dim 64: the 64-byte swizzle, so no padding to 128 columns).
    static constexpr int SW = D * EB >= 128 ? 128 : 64;
    static constexpr int BOX_COLS = SW / EB;  // elements in one box row
    static constexpr int KB = D * EB / SW;    // boxes per Q/K row
    static constexpr int Q_BOX = BM * SW;     // bytes of one box of the Q tile
    static constexpr int KV_BOX = BN * SW;    // ... of a K tile, or of a 16-bit V tile
    static constexpr int VT_BOX = D * 128;    // FP8: one box of Vt, D rows of 128 keys
    static constexpr int VT_BOXES = (BN + 127) / 128;  // FP8: a key tile of 192 loads 64 keys it does not use
    static constexpr int Q_BYTES = KB * Q_BOX;
    static constexpr int KV_BYTES = KB * KV_BOX;
    static constexpr int V_BYTES = FP8 ? VT_BOXES * VT_BOX : KV_BYTES;  // one V stage
    static constexpr int KSTEPS = D * EB / 32;      // k-steps of 32 bytes in S = Q K^T
    static constexpr int BOX_KSTEPS = SW / 32;      // ... inside one box row
    static constexpr int PV_K = FP8 ? 32 : 16;      // keys per k-step of O += P V
    static_assert(!FP8 || (BN % 32 == 0 && D % 64 == 0), "FP8: 32-key k-steps; 64- or 128-byte rows");
    static constexpr int RING_BYTES = Q_STAGES * Q_BYTES + STAGES * (KV_BYTES + V_BYTES) + 1024;  // + alignment slack
    // 16-bit builds of head dim 128 and up whose shared memory has room (head dim 128) keep a 64-row O
    // buffer per consumer, from which a TMA store writes the tile (sm90/epilogue.cuh): -1 to -2 % at
    // head dim 128; at 64, where the store is cheaper, its two barriers a tile cost more (+2-3 % on
    // short causal rows). _kernels/traits.py's smem_bytes follows the same rule.
    static constexpr int O_STAGE_BYTES = 64 * D * 2;  // a consumer's rows
    static constexpr int SMEM_OPTIN = 232448, STATIC_RESERVE = 1024;  // a block's limit; the barriers' room
    static constexpr bool STAGE_O = !FP8 && D >= 128 && RING_BYTES + CONSUMERS * O_STAGE_BYTES <= SMEM_OPTIN - STATIC_RESERVE;
    static constexpr int SMEM_BYTES = RING_BYTES + (STAGE_O ? CONSUMERS * O_STAGE_BYTES : 0);
    // CTAs an SM (__launch_bounds__'s minimum): two only for one consumer, whose CTA then takes half the registers.
    static constexpr int MIN_BLOCKS = CUDATTN_MIN_BLOCKS;
    static_assert(MIN_BLOCKS == 1 || (MIN_BLOCKS == 2 && CONSUMERS == 1), "two CTAs an SM: one consumer each");
    // Registers a thread after setmaxnreg: 128*24 + 128*240, 128*24 + 256*240 and 128*24 + 384*160 fit in 64K;
    // two CTAs of 128*24 + 128*232 in 64K.
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = MIN_BLOCKS == 2 ? 232 : CONSUMERS < 3 ? 240 : 160;
    static_assert(MIN_BLOCKS == 1 || MIN_BLOCKS * (SMEM_BYTES + STATIC_RESERVE + 1024) <= 233472,
                  "two CTAs' shared memory (with the driver's 1 KiB each) must fit an SM's 228 KiB");
    // Sliding windows: builds with one or two consumers only (with three, 160 registers, the window's
    // masks spill: the host sends windowed calls to a build of one or two, _plan); FP8 builds
    // only where MODS has MOD_WINDOW, so that plain FP8 calls keep their leaner code.
    static constexpr bool WINDOW = CONSUMERS <= 2 && (!FP8 || (MODS & MOD_WINDOW) != 0);
    // Causal tiles of more query rows than keys a key tile (head dim 64 in 192-row tiles, 192 and 256
    // in 128-row tiles of 64 or 80 keys, FP8 with narrow key tiles): a consumer's 64 rows may see
    // fewer key tiles at the top than the tile's last rows (TileMsg::unseen); it skips them. Elsewhere (the
    // tile's rows and key tiles aligned, or no mask) no consumer skips any in self-attention, and
    // the producer's per-consumer ranges alone cost 1.5-2 % on short rows (H200), so those builds
    // leave them out; their consumers only skip tiles whose 64 rows all lie past the sequence's end
    // (consumer.cuh, SKIP_PAST_END: one comparison a tile).
    static constexpr bool SKIP_UNSEEN = CAUSAL && CONSUMERS > 1 && BM > BN;
    static_assert(D * EB % SW == 0 && D <= 256, "head-dim tile: whole swizzle rows, at most 256");
    static_assert(BN % 16 == 0 && BN <= 256, "key tile: a multiple of 16 up to 256");
    static_assert(STAGES >= 2, "the K/V ring needs at least two stages");

    struct Barriers {
        unsigned long long q_full[Q_STAGES], q_empty[Q_STAGES];
        unsigned long long k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES];
        typename TileMsgOf<SKIP_UNSEEN>::type tile[Q_STAGES];  // the tile whose Q each Q stage holds (tile_scheduler.cuh)
    };

    static __device__ __forceinline__ void run(const FwdSm90Params& P) {
        extern __shared__ unsigned char smem_raw[];
        __shared__ Barriers bars;
        unsigned char* smem = reinterpret_cast<unsigned char*>(
            (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);  // swizzle atoms: 1 KiB
        unsigned char* sQ = smem;
        unsigned char* sK = sQ + Q_STAGES * Q_BYTES;
        unsigned char* sV = sK + STAGES * KV_BYTES;
        unsigned char* sO = sV + STAGES * V_BYTES;  // STAGE_O: the consumers' O buffers (1 KiB multiples)

        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < Q_STAGES; ++s) {
                mbar_init(&bars.q_full[s], 1);
                mbar_init(&bars.q_empty[s], 4 * CONSUMERS);  // every consumer warp, after its last S = Q K^T
            }
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(&bars.k_full[s], 1);
                mbar_init(&bars.v_full[s], 1);
                mbar_init(&bars.k_empty[s], 4 * CONSUMERS);  // every consumer warp, after its product completed
                mbar_init(&bars.v_empty[s], 4 * CONSUMERS);
            }
            fence_mbar_init();
        }
        __syncthreads();

        const int wg = threadIdx.x / 128;
        if (wg == 0) {
            setmaxnreg_dec<PRODUCER_REGS>();
            if (threadIdx.x < 32) Sm90Producer<FwdSm90>::produce(P, bars, sQ, sK, sV, threadIdx.x);
        } else {
            setmaxnreg_inc<CONSUMER_REGS>();
            Sm90Consumer<FwdSm90>::consume(P, bars, sQ, sK, sV, sO, wg - 1, threadIdx.x % 128);
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
