// FlashAttention-3-style forward for Hopper (sm_90a). One CTA = 1 + CONSUMERS warpgroups:
//   warpgroup 0, the producer: one thread issues TMA loads of Q (once per tile) and of K and V
//     tiles into a STAGES-deep ring, each stage completing on its own "full" mbarrier;
//   warpgroups 1.., the consumers (two or three): 64 query rows each (BM = 64 * CONSUMERS), S = Q K^T with
//     wgmma from shared memory, online softmax in registers, O += P V with P as a register
//     operand; a stage is handed back through its "empty" mbarrier once the product that read it
//     has completed.
// Inside a consumer, the next tile's S = Q K^T is issued before the current P V, so the softmax
// of one tile runs while the tensor cores work on the other (intra-warpgroup overlap). With
// PINGPONG, the consumers also take turns issuing their products (named barriers, round robin),
// so one's softmax runs under the others' GEMMs. Three consumers (head dim 64) give each SM
// scheduler three warps to issue from where two leave the softmax's dependent chains exposed,
// at 160 registers a consumer thread instead of 240.
// The grid is persistent: in round r, CTA c takes tile r * gridDim.x + c. Causal tiles come
// longest first (bottom row blocks of every head before any shorter one) and odd rounds go
// right to left (a snake), so that the CTAs' sums of tile lengths come out nearly equal.
// Tails: the maps are 4-D over (head dim, seq, head, batch), so TMA zero-fills rows past each
// sequence's end and columns past the head dim on load; O is stored from registers, predicated.
// Q is handed back as soon as a tile's last S = Q K^T has completed, so the producer loads the
// next tile's Q while the consumers finish the tile.
// FP8 (T = e4m3_t): the same pipeline on k = 32 wgmma. e4m3 operands in shared memory must be
// K-major, so V arrives transposed (Vt: head-dim rows of keys, keys permuted per 32 as fp8.cuh
// explains) and P goes from the S accumulators to an e4m3 A operand with no lane exchange. The
// descales scale the softmax and the final normalisation, never the elements.
#pragma once
#include "cudattn/mask.cuh"
#include "cudattn/params_sm90.cuh"
#include "cudattn/sm90_sync.cuh"
#include "cudattn/sm90_tma.cuh"
#include "cudattn/sm90_wgmma.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {
namespace sm90 {

// The (batch, head, query block) of the t-th tile of the whole problem.
struct TileCoord {
    int b, h, m_block;
};

// Round r's tile of this CTA (may be >= the tile count in the last round).
template <bool CAUSAL>
__device__ __forceinline__ int tile_of_round(int r) {
    const int c = (CAUSAL && (r & 1)) ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    return r * (int)gridDim.x + c;
}

// Causal: the (batch, head) pairs are cut into sections of `section` pairs whose K and V fit in
// L2 together (the host sizes it); inside a section, every pair's last query block (the longest)
// comes first, then the ones above. Longest-first alone, across all heads, would have the CTAs
// of one round each stream a different head's K/V from HBM (seen: 0.55-0.67x cuDNN at B*H >= 128).
// Full: neighbouring tiles are one head's query blocks, which share its K and V in L2.
// Variable lengths: num_m_blocks covers the longest sequence, and the query blocks past a
// shorter one's end are skipped (a few instructions each). Causal, that keeps the longest rows
// first; full, the head-major order measured faster than longest-first on mixed lengths (the
// latter has every CTA of a round on another head's K/V: up to 14 % slower, H200).
template <bool CAUSAL>
__device__ __forceinline__ TileCoord tile_at(int t, const FwdParams& p, int section) {
    const int heads = p.heads_q, pairs = heads * p.batch, num_m = p.num_m_blocks;
    int bh;
    TileCoord c;
    if (CAUSAL) {
        const int sec = t / (section * num_m), first = sec * section;
        const int in_sec = min(section, pairs - first), r = t - sec * section * num_m;
        c.m_block = num_m - 1 - r / in_sec;
        bh = first + r % in_sec;
    } else {
        c.m_block = t % num_m;
        bh = t / num_m;
    }
    c.h = bh % heads;
    c.b = bh / heads;
    return c;
}

template <int N>
__device__ __forceinline__ float (&flat(float (&a)[1][N / 8][4]))[N / 2] {
    return *reinterpret_cast<float(*)[N / 2]>(&a[0][0][0]);
}

template <typename T, typename OutT, int D, int BN, int STAGES, int Q_STAGES, bool CAUSAL, bool PINGPONG,
          int CONSUMERS, int MODS = 0>
struct FwdSm90 {
    static constexpr bool FP8 = sizeof(T) == 1;
    static constexpr int EB = sizeof(T);      // bytes per element
    static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
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
    static constexpr int SMEM_BYTES = Q_STAGES * Q_BYTES + STAGES * (KV_BYTES + V_BYTES) + 1024;  // + alignment slack
    // Registers a thread after setmaxnreg: 128*24 + 256*240 and 128*24 + 384*160 fit in 64K.
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = CONSUMERS == 2 ? 240 : 160;
    static constexpr int BAR_TURN = 1;  // named barriers 1..CONSUMERS: the ping-pong turns of each consumer
    static constexpr int BAR_ZERO = 8;  // named barriers 8..: one consumer warpgroup (zero_v_tail)
    // Sliding windows: builds with two consumers only (with three, 160 registers, the window's
    // masks spill: the host sends windowed calls to a two-consumer build, _plan); FP8 builds
    // only where MODS has MOD_WINDOW, so that plain FP8 calls keep their leaner code.
    static constexpr bool WINDOW = CONSUMERS == 2 && (!FP8 || (MODS & MOD_WINDOW) != 0);
    static_assert(D * EB % SW == 0 && D <= 256, "head-dim tile: whole swizzle rows, at most 256");
    static_assert(BN % 16 == 0 && BN <= 256, "key tile: a multiple of 16 up to 256");
    static_assert(STAGES >= 2, "the K/V ring needs at least two stages");

    struct Barriers {
        unsigned long long q_full[Q_STAGES], q_empty[Q_STAGES];
        unsigned long long k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES];
    };

    static __device__ __forceinline__ void run(const FwdSm90Params& P) {
        extern __shared__ unsigned char smem_raw[];
        __shared__ Barriers bars;
        unsigned char* smem = reinterpret_cast<unsigned char*>(
            (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);  // swizzle atoms: 1 KiB
        unsigned char* sQ = smem;
        unsigned char* sK = sQ + Q_STAGES * Q_BYTES;
        unsigned char* sV = sK + STAGES * KV_BYTES;

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
            if (threadIdx.x < 32) produce(P, bars, sQ, sK, sV, threadIdx.x);
        } else {
            setmaxnreg_inc<CONSUMER_REGS>();
            consume(P, bars, sQ, sK, sV, wg - 1, threadIdx.x % 128);
        }
    }

    // ------------------------------------------------------------------ producer (one thread)
    // One warp walks the tiles; lane 0 issues every load. The other lanes only help a paged
    // cache: each reads one page id of a key tile, all at once (one latency, not one per page).
    static __device__ __forceinline__ void produce(const FwdSm90Params& P, Barriers& bars, unsigned char* sQ,
                                                   unsigned char* sK, unsigned char* sV, int lane) {
        const bool leader = lane == 0;
        const FwdParams& p = P.p;
        const int total = p.num_m_blocks * p.heads_q * p.batch;
        // Packed (variable-length) operands are maps of one batch entry: their batch coordinate is 0.
        const int q_b = p.cu_seqlens_q == nullptr, k_b = p.cu_seqlens_k == nullptr;
        const bool paged = p.kv.block_table != nullptr;
        const int page_rows = paged ? paged_box_rows(p.kv.page_size) : BN;
        int it = 0;  // K/V tiles loaded so far by this CTA: ring stage and phase
        int nq = 0;  // tiles whose Q was loaded (the Q ring's stage and phase)
        for (int n = 0;; ++n) {
            const int t = tile_of_round<CAUSAL>(n);
            if (t >= total) break;
            const TileCoord c = tile_at<CAUSAL>(t, p, P.l2_section);
            const SeqSpan sq = seq_span(p, c.b);
            const int m_start = c.m_block * BM;
            if (m_start >= sq.seqlen_q) continue;  // past a shorter sequence's end: no tile
            // Q ring: with two stages, tile nq's Q loads while the consumers still work on tile nq-1.
            const int qs = nq % Q_STAGES;
            if (nq >= Q_STAGES) mbar_wait(&bars.q_empty[qs], ((nq / Q_STAGES) - 1) & 1);
            ++nq;
            if (leader) {
                mbar_arrive_expect_tx(&bars.q_full[qs], Q_BYTES);
#pragma unroll
                for (int kb = 0; kb < KB; ++kb)
                    tma_load_4d(sQ + qs * Q_BYTES + kb * Q_BOX, &P.tma_q, BOX_COLS * kb, sq.q0 + m_start, c.h,
                                c.b * q_b, &bars.q_full[qs]);
            }

            const int hkv = c.h / p.group;
            const TileRange tiles = key_tiles<BN, CAUSAL, WINDOW>(p, sq, m_start, min(BM, sq.seqlen_q - m_start));
            const int n_tiles = tiles.count;
            const long long vt0 = FP8 ? vt_first_key(p, sq, c.b) : 0;
            for (int j = 0; j < n_tiles; ++j, ++it) {  // from the last key tile (tail, diagonal) down
                const int n_start = tiles.start(j) * BN;
                const int st = it % STAGES;
                const unsigned ph = (it / STAGES) & 1;
                // Paged: lane i holds the page of the tile's i-th box (K and V share them), read
                // before the wait for a free stage so that its latency hides behind it.
                const int page = (!FP8 && paged && lane * page_rows < BN) ? cache_page(p.kv, c.b, n_start + lane * page_rows) : 0;
                if (it >= STAGES) mbar_wait(&bars.k_empty[st], ph ^ 1);
                if (leader) mbar_arrive_expect_tx(&bars.k_full[st], KV_BYTES);
                if (!FP8 && paged) {
                    load_pages(sK + st * KV_BYTES, &P.tma_k, p.kv.page_size, page_rows, page, n_start, hkv,
                               &bars.k_full[st], leader);
                } else if (leader) {
#pragma unroll
                    for (int kb = 0; kb < KB; ++kb)
                        tma_load_4d(sK + st * KV_BYTES + kb * KV_BOX, &P.tma_k, BOX_COLS * kb, sq.k0 + n_start, hkv,
                                    c.b * k_b, &bars.k_full[st]);
                }
                if (it >= STAGES) mbar_wait(&bars.v_empty[st], ph ^ 1);
                if (leader) mbar_arrive_expect_tx(&bars.v_full[st], V_BYTES);
                if (!FP8 && paged)
                    load_pages(sV + st * V_BYTES, &P.tma_v, p.kv.page_size, page_rows, page, n_start, hkv,
                               &bars.v_full[st], leader);
                else if (leader)
                    load_v(P, sV + st * V_BYTES, FP8 ? (int)(vt0 + n_start) : sq.k0 + n_start, hkv, c.b * k_b,
                           &bars.v_full[st]);
            }
        }
    }

    // Rows of one TMA box of a paged cache: the largest run of keys that is whole in one page and
    // divides the key tile (the host encodes the maps with the same rule: _plan.paged_box_rows).
    static __device__ __forceinline__ int paged_box_rows(int page_size) {
        int a = page_size, b = BN;
        while (b != 0) {
            const int t = a % b;
            a = b;
            b = t;
        }
        return a;
    }

    // One K or V stage of a paged cache (16-bit): BN / rows (at most BN / 16 <= 16) boxes down the
    // tile, each from its own page (the maps are 4-D over (head dim, row in page, head, page)). rows is a multiple of
    // 16 (page sizes and key tiles are), so every box starts on a whole 1 KiB swizzle atom.
    // Called by the whole producer warp: lane i holds the page of box i (lane_page).
    static __device__ __forceinline__ void load_pages(unsigned char* dst, const TmaDescriptor* map, int page_size,
                                                      int rows, int lane_page, int n_start, int hkv,
                                                      unsigned long long* bar, bool leader) {
        for (int i = 0, r0 = 0; r0 < BN; ++i, r0 += rows) {
            const int page = __shfl_sync(0xffffffffu, lane_page, i);
            const int row = (n_start + r0) % page_size;
            if (leader) {
#pragma unroll
                for (int kb = 0; kb < KB; ++kb)
                    tma_load_4d(dst + kb * KV_BOX + r0 * SW, map, BOX_COLS * kb, row, hkv, page, bar);
            }
        }
    }

    // One V stage. 16-bit: KB boxes of 64 columns x BN keys (MN-major for the product). FP8: Vt,
    // BN / 128 boxes of D head-dim rows x 128 keys (K-major); Vt's rows past the head dim and keys
    // past its padded length are outside the map, so TMA zero-fills them. n_start: the map's row
    // (16-bit) or key (Vt) coordinate of the tile's first key.
    static __device__ __forceinline__ void load_v(const FwdSm90Params& P, unsigned char* dst, int n_start, int hkv,
                                                  int b, unsigned long long* bar) {
        if constexpr (FP8) {
#pragma unroll
            for (int kb = 0; kb < VT_BOXES; ++kb) tma_load_4d(dst + kb * VT_BOX, &P.tma_v, n_start + 128 * kb, 0, hkv, b, bar);
        } else {
#pragma unroll
            for (int kb = 0; kb < KB; ++kb) tma_load_4d(dst + kb * KV_BOX, &P.tma_v, BOX_COLS * kb, n_start, hkv, b, bar);
        }
    }

    // ------------------------------------------------------------------ consumers
    // S = Q K^T for this warpgroup's 64 rows against one key stage (issued and committed, not waited).
    // Descriptors advance by byte offsets >> 4 (the address field's unit).
    static __device__ __forceinline__ void issue_qk(float (&s)[1][BN / 8][4], unsigned long long q_desc,
                                                    unsigned long long k_desc) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {  // k-steps of 32 bytes inside each box row
            const unsigned step = (kk % BOX_KSTEPS) * (32 >> 4);
            const unsigned box = kk / BOX_KSTEPS;
            Wgmma<T>::ss(flat<BN>(s), q_desc + step + box * (Q_BOX >> 4), k_desc + step + box * (KV_BOX >> 4), kk > 0);
        }
        wgmma_commit();
    }

    // O += P V for one value stage (O = P V when not `accumulate`). 16-bit: 16 keys (2048 bytes of
    // V rows) per k-step. FP8: 32 keys, 32 bytes along each Vt row, 4 steps per 128-key box.
    static __device__ __forceinline__ void issue_pv(float (&o)[1][D / 8][4], const unsigned (&pk)[BN / PV_K][4],
                                                    unsigned long long v_desc, bool accumulate) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / PV_K; ++kk) {
            if constexpr (FP8)
                Wgmma<T>::rs(flat<D>(o), pk[kk], v_desc + (kk % 4) * (32 >> 4) + (kk / 4) * (VT_BOX >> 4),
                             accumulate || kk > 0);
            else
                Wgmma<T>::template rs<1>(flat<D>(o), pk[kk], v_desc + kk * (2048 >> 4), accumulate || kk > 0);
        }
        wgmma_commit();
    }

    // P (fp32 accumulators) -> the A operand of P V. FP8: keys packed in Vt's order (fp8.cuh).
    static __device__ __forceinline__ void to_operand(unsigned (&pk)[BN / PV_K][4], const float (&s)[1][BN / 8][4]) {
        if constexpr (FP8) {
#pragma unroll
            for (int kk = 0; kk < BN / 32; ++kk)
#pragma unroll
                for (int h = 0; h < 2; ++h) {  // h: row g (0) or g + 8 (1)
                    pk[kk][h] = pack_e4m3x4(s[0][4 * kk][2 * h], s[0][4 * kk][2 * h + 1], s[0][4 * kk + 1][2 * h],
                                            s[0][4 * kk + 1][2 * h + 1]);
                    pk[kk][2 + h] = pack_e4m3x4(s[0][4 * kk + 2][2 * h], s[0][4 * kk + 2][2 * h + 1],
                                                s[0][4 * kk + 3][2 * h], s[0][4 * kk + 3][2 * h + 1]);
                }
        } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                pk[kk][0] = pack2(s[0][2 * kk][0], s[0][2 * kk][1], T());
                pk[kk][1] = pack2(s[0][2 * kk][2], s[0][2 * kk][3], T());
                pk[kk][2] = pack2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1], T());
                pk[kk][3] = pack2(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3], T());
            }
        }
    }

    // O *= alpha, skipped when no row of the warp changed its max (alpha == 1 throughout): after
    // the first tiles of a long row that is most tiles, and the multiply is 1/4 of the softmax work.
    static __device__ __forceinline__ void rescale_if_needed(float (&o)[1][D / 8][4], const float (&alpha)[1][2]) {
        if (__any_sync(0xffffffffu, alpha[0][0] != 1.f || alpha[0][1] != 1.f)) OnlineSoftmax<1>::rescale(o, alpha);
    }

    // Ping-pong: wait for this warpgroup's turn to issue products; then hand the turn to the next.
    // Every consumer of a CTA walks the same tiles, so all take the same number of turns.
    static __device__ __forceinline__ void turn_begin(int cw) {
        if (PINGPONG) named_sync(BAR_TURN + cw, 256);
    }
    static __device__ __forceinline__ void turn_end(int cw) {
        if (PINGPONG) named_arrive(BAR_TURN + (cw + 1) % CONSUMERS, 256);
    }

    // One arrival per warp on a stage's empty barrier, once this warp's product has completed.
    static __device__ __forceinline__ void release(unsigned long long* bar, int lane) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    }

    // What a consumer knows of one of its CTA's tiles. n_tiles < 0: past the CTA's last tile;
    // skip: a query block past its sequence's end (variable lengths), which the producer skips too.
    struct Tile {
        TileCoord c;
        SeqSpan sq;
        int n_tiles;
        int first_tile;  // the lowest key tile visited (a window's left edge), n_tiles of them
        bool skip;
        float scale_log2, out_scale;
        float softcap_pre;  // softcap builds: the raw scores' scale inside the tanh (mods.cuh)
        float alibi;  // ALiBi builds: this head's coefficient (mods.cuh)
        __device__ __forceinline__ int m_start() const { return c.m_block * BM; }
        __device__ __forceinline__ bool neg() const { return scale_log2 < 0.f; }
    };

    static __device__ __forceinline__ Tile tile_state(const FwdSm90Params& P, int n) {
        const FwdParams& p = P.p;
        Tile x;
        const int t = tile_of_round<CAUSAL>(n);
        const bool valid = t < p.num_m_blocks * p.heads_q * p.batch;
        x.c = tile_at<CAUSAL>(valid ? t : 0, p, P.l2_section);
        x.sq = seq_span(p, x.c.b);
        x.skip = x.m_start() >= x.sq.seqlen_q;
        const TileRange tiles = (valid && !x.skip) ? key_tiles<BN, CAUSAL, WINDOW>(p, x.sq, x.m_start(),
                                                                            min(BM, x.sq.seqlen_q - x.m_start()))
                                                   : TileRange{0, 0};
        x.n_tiles = valid ? tiles.count : -1;
        x.first_tile = tiles.first;
        x.scale_log2 = p.scale_log2;
        x.out_scale = 1.f;
        x.softcap_pre = p.softcap_pre;
        x.alibi = (MODS & MOD_ALIBI) ? alibi_coef(p, x.c.b, x.c.h) : 0.f;
        if constexpr (FP8) {
            if (valid && !x.skip) {
                const Fp8Scales sc = fp8_scales<(MODS & MOD_SOFTCAP) != 0>(p, x.c.b, x.c.h / p.group);
                x.scale_log2 = sc.scale_log2;
                x.out_scale = sc.out_scale;
                x.softcap_pre = sc.softcap_pre;
                x.alibi *= sc.alibi_factor;
            }
        }
        return x;
    }

    // Score modifiers, then masks, of key tile j of a tile (visited from the last, the key tail,
    // down): keys past the sequence, and causal, keys past this warp's first row's diagonal.
    static __device__ __forceinline__ void mask_tile(const FwdParams& p, float (&s)[1][BN / 8][4], const Tile& x, int j,
                                                     int cw, int warp, int lane) {
        const int n_start = (x.first_tile + x.n_tiles - 1 - j) * BN;
        const int row0 = x.m_start() + cw * 64 + warp * 16;  // this warp's first query row
        const float masked = x.neg() ? CUDATTN_INF : -CUDATTN_INF;  // times scale_log2: -inf either way
        const SeqSpan& sq = x.sq;
        if constexpr (MODS != 0)
            apply_mods<MODS, 1, BN / 8>(s, x.softcap_pre, x.alibi, row0 + sq.causal_offset, n_start, lane);
        if (tile_needs_mask<BN, CAUSAL, WINDOW>(p, sq, n_start, row0, 16))
            apply_mask<1, BN / 8, CAUSAL, WINDOW>(s, row0, n_start, sq.seqlen_k, sq.causal_offset, lane, masked, p);
    }

    // 16-bit V rows past the sequence's last key, in the tile's last key tile, set to zero. In a
    // padded batch TMA zero-fills them (past the map's end), but packed sequences are followed by
    // the next one's keys, and a KV cache by stale slots, and P = 0 times a NaN there is NaN. Every
    // consumer zeroes the same bytes before its own P V reads the stage (the values agree), then
    // makes the writes visible to wgmma. FP8's Vt has zeros there already (fp8_transpose_v.cu).
    static __device__ __forceinline__ void zero_v_tail(unsigned char* v_stage, const Tile& x, int cw, int ltid) {
        if constexpr (!FP8) {
            const int valid = x.sq.seqlen_k - (x.first_tile + x.n_tiles - 1) * BN;  // keys of the last tile that exist
            if (valid >= BN) return;  // uniform over the warpgroup: the barrier below is reached by all or none
            constexpr int CHUNKS = SW / 16;  // 16-byte chunks of a row; a row stays whole under the swizzle
            for (int i = ltid; i < KB * (BN - valid) * CHUNKS; i += 128) {
                const int kb = i / ((BN - valid) * CHUNKS), r = valid + (i / CHUNKS) % (BN - valid), ch = i % CHUNKS;
                *reinterpret_cast<uint4*>(v_stage + kb * KV_BOX + r * SW + ch * 16) = make_uint4(0, 0, 0, 0);
            }
            fence_proxy_async_smem();
            named_sync(BAR_ZERO + cw, 128);
        }
    }

    static __device__ __forceinline__ int stage(int i) { return i % STAGES; }
    static __device__ __forceinline__ unsigned q_phase(int n) { return (unsigned)((n / Q_STAGES) & 1); }
    static __device__ __forceinline__ unsigned phase(int i) { return (unsigned)((i / STAGES) & 1); }

    // Each tile's first O += P V starts from zero (scale-d off), so O is never cleared.
    static __device__ __forceinline__ void consume(const FwdSm90Params& P, Barriers& bars, unsigned char* sQ,
                                                   unsigned char* sK, unsigned char* sV, int cw, int ltid) {
        const FwdParams& p = P.p;
        const int warp = ltid / 32, lane = ltid % 32;
        // Descriptors of the first box of each buffer; a byte offset b is added as b >> 4.
        const unsigned long long q_desc0 = smem_desc_sw<SW>(sQ + cw * 64 * SW, 16, 8 * SW);
        const unsigned long long k_desc0 = smem_desc_sw<SW>(sK, 16, 8 * SW);
        const unsigned long long v_desc0 = smem_desc_sw128(sV, FP8 ? 16 : KV_BOX, 1024);
        auto q_desc = [&](int n) { return q_desc0 + (n % Q_STAGES) * (Q_BYTES >> 4); };
        auto k_desc = [&](int i) { return k_desc0 + stage(i) * (KV_BYTES >> 4); };
        auto v_desc = [&](int i) { return v_desc0 + stage(i) * (V_BYTES >> 4); };

        float o[1][D / 8][4];
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[0][i][e] = 0.f;  // defined before the first "+f" operand use
        float s[1][BN / 8][4];
        unsigned pk[BN / PV_K][4];
        float alpha[1][2];
        OnlineSoftmax<1> softmax;

        if (PINGPONG && cw == CONSUMERS - 1) named_arrive(BAR_TURN + 0, 256);  // consumer 0 goes first
        // Packed keys or a KV cache: the V rows past a sequence's end hold other data (zero_v_tail).
        const bool zero_tail = !FP8 && (p.cu_seqlens_k != nullptr || p.kv.seqlens != nullptr || p.kv.block_table != nullptr);
        int it = 0;  // key tiles consumed so far: ring stage and phase
        int n = 0;   // tiles with a Q load (the Q ring's stage and phase), as in produce()
        for (int r = 0;; ++r) {
            const Tile cur = tile_state(P, r);
            if (cur.n_tiles < 0) break;
            if (cur.skip) continue;
            mbar_wait(&bars.q_full[n % Q_STAGES], q_phase(n));
            softmax.init();
            if (cur.n_tiles == 0) {  // sees no key: O = 0, LSE = -inf
                release(&bars.q_empty[n % Q_STAGES], lane);
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[0][i][e] = 0.f;
                float inv[1][2], lse[1][2];
                softmax.finish(inv, lse, sink_log2_of(p.sinks, cur.c.h));
                store_tile<true>(p, o, inv, lse, cur, cw, ltid);
                ++n;
                continue;
            }
            mbar_wait(&bars.k_full[stage(it)], phase(it));
            turn_begin(cw);
            issue_qk(s, q_desc(n), k_desc(it));
            turn_end(cw);
            wgmma_wait<0>();
            fence_operands(flat<BN>(s));
            release(&bars.k_empty[stage(it)], lane);
            if (cur.n_tiles == 1) release(&bars.q_empty[n % Q_STAGES], lane);
            mask_tile(p, s, cur, 0, cw, warp, lane);
            const bool bounded = bounded_scores<T, MODS>(cur.scale_log2);  // softcapped bf16 (softmax.cuh)
            softmax.template exponentiate<BN / 8, FP8>(s, cur.scale_log2, cur.neg(), alpha, bounded);
            to_operand(pk, s);
            if (zero_tail) {  // the first key tile is the sequence's last
                mbar_wait(&bars.v_full[stage(it)], phase(it));
                zero_v_tail(sV + stage(it) * V_BYTES, cur, cw, ltid);
            }

            for (int j = 1; j < cur.n_tiles; ++j) {
                const int ik = it + j, iv = it + j - 1;
                mbar_wait(&bars.k_full[stage(ik)], phase(ik));
                turn_begin(cw);
                issue_qk(s, q_desc(n), k_desc(ik));
                mbar_wait(&bars.v_full[stage(iv)], phase(iv));
                issue_pv(o, pk, v_desc(iv), j > 1);
                turn_end(cw);
                wgmma_wait<1>();  // S of tile j is in; P V of tile j-1 may still run
                fence_operands(flat<BN>(s));
                release(&bars.k_empty[stage(ik)], lane);
                if (j == cur.n_tiles - 1) release(&bars.q_empty[n % Q_STAGES], lane);
                mask_tile(p, s, cur, j, cw, warp, lane);
                softmax.template exponentiate<BN / 8, FP8>(s, cur.scale_log2, cur.neg(), alpha, bounded);
                wgmma_wait<0>();
                fence_operands(flat<D>(o));
                release(&bars.v_empty[stage(iv)], lane);
                if (!bounded) rescale_if_needed(o, alpha);  // bounded: alpha is 1
                to_operand(pk, s);
            }

            // The row sums are final: normalisation and LSE are known before the last P V lands.
            float inv[1][2], lse[1][2];
            softmax.finish(inv, lse, sink_log2_of(p.sinks, cur.c.h));
            inv[0][0] *= cur.out_scale;  // the v descale (FP8)
            inv[0][1] *= cur.out_scale;
            const int iv = it + cur.n_tiles - 1;
            mbar_wait(&bars.v_full[stage(iv)], phase(iv));
            turn_begin(cw);
            issue_pv(o, pk, v_desc(iv), cur.n_tiles > 1);
            turn_end(cw);
            wgmma_wait<0>();
            fence_operands(flat<D>(o));
            release(&bars.v_empty[stage(iv)], lane);
            store_tile(p, o, inv, lse, cur, cw, ltid);
            it += cur.n_tiles;
            ++n;
        }
        if (PINGPONG && cw == 0) named_sync(BAR_TURN + 0, 256);  // consume the last consumer's last hand-over
    }

    // O (times inv: normalised, times the v descale; as OutT) and LSE straight from the accumulators,
    // predicated on the sequence and head-dim bounds. Lane t of a quad holds columns 8i+2t, 8i+2t+1
    // of every 8-column block i. A 16-bit pair is 4 bytes, so a warp's store would fill half of
    // each 32-byte sector; the two lanes of a pair swap one word first, so that the even lane
    // holds 4 columns of block i and the odd lane the same 4 of block i+1, and a quad's 8-byte
    // stores cover whole sectors (ncu counted half the sectors of this store wasted before).
    // ZERO: O is known to be 0 (a tile that sees no key), so no lane needs its partner's word: no
    // shuffle in that rarely taken branch, which ptxas would otherwise guard against divergence.
    template <bool ZERO = false>
    static __device__ __forceinline__ void store_tile(const FwdParams& p, const float (&o)[1][D / 8][4],
                                                      const float (&inv)[1][2], const float (&lse)[1][2],
                                                      const Tile& x, int cw, int ltid) {
        const int warp = ltid / 32, lane = ltid % 32, g = lane / 4, t = lane % 4;
        const TileCoord& c = x.c;
        const int m_start = c.m_block * BM, seqlen_q = x.sq.seqlen_q;
        OutT* g_o = static_cast<OutT*>(p.o) + c.b * p.o_stride_b + c.h * p.o_stride_h + x.sq.q0 * p.o_stride_s;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m_start + cw * 64 + warp * 16 + g + 8 * h;
            OutT* g_row = g_o + row * p.o_stride_s;
            if constexpr (sizeof(OutT) == 2) {
                const bool odd = t & 1;
                OutT* dst = g_row + 8 * odd + 4 * (t >> 1);  // block i + odd, the pair's half of it
                const int blocks = row < seqlen_q ? p.head_dim / 8 - odd : 0;  // head_dim: a multiple of 8
#pragma unroll
                for (int i = 0; i < D / 8; i += 2) {
                    const unsigned w0 = pack2(o[0][i][2 * h] * inv[0][h], o[0][i][2 * h + 1] * inv[0][h], OutT());
                    const unsigned w1 = pack2(o[0][i + 1][2 * h] * inv[0][h], o[0][i + 1][2 * h + 1] * inv[0][h], OutT());
                    const unsigned got = ZERO ? 0u : __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);  // every lane
                    st_global_v2_if(i < blocks, dst + 8 * i, odd ? got : w0, odd ? w1 : got);
                }
            } else {
                if (row >= seqlen_q) continue;
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
                    if (8 * i < p.head_dim)  // head_dim is a multiple of 8: pairs never straddle it
                        store_pair(g_row + 8 * i + 2 * t, o[0][i][2 * h] * inv[0][h], o[0][i][2 * h + 1] * inv[0][h]);
            }
        }
        if (p.write_lse && t == 0) {
            // (batch, heads_q, seqlen_q), or packed (heads_q, total_q) for variable lengths
            float* g_lse = p.lse + (p.cu_seqlens_q != nullptr ? (long long)c.h * p.seqlen_q + x.sq.q0
                                                               : ((long long)c.b * p.heads_q + c.h) * p.seqlen_q);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m_start + cw * 64 + warp * 16 + g + 8 * h;
                if (row < seqlen_q) g_lse[row] = lse[0][h];
            }
        }
    }
};

}  // namespace sm90
}  // namespace cudattn
