// The Hopper forward kernel's consumers (fwd_sm90.cuh): each warpgroup of 64 query rows waits for
// the producer's stages, issues S = Q K^T and O += P V with wgmma, runs the online softmax in
// registers between them (the next tile's S = Q K^T before the current P V), hands every stage
// back once its product has completed, and stores each tile through the epilogue (epilogue.cuh).
// K is the kernel (FwdSm90): its shape and barriers.
#pragma once
#include "cudattn/mask.cuh"
#include "cudattn/sm90/epilogue.cuh"
#include "cudattn/sm90/params.cuh"
#include "cudattn/sm90/sync.cuh"
#include "cudattn/sm90/tile_scheduler.cuh"
#include "cudattn/sm90/wgmma.cuh"
#include "cudattn/softmax.cuh"

namespace cudattn {
namespace sm90 {

template <class K>
struct Sm90Consumer {
    typedef typename K::T T;
    typedef typename K::Barriers Barriers;
    static constexpr bool FP8 = K::FP8, CAUSAL = K::CAUSAL, PINGPONG = K::PINGPONG, WINDOW = K::WINDOW;
    static constexpr int D = K::D, BM = K::BM, BN = K::BN, STAGES = K::STAGES, Q_STAGES = K::Q_STAGES;
    static constexpr int CONSUMERS = K::CONSUMERS, MODS = K::MODS, SW = K::SW, KB = K::KB;
    static constexpr int Q_BOX = K::Q_BOX, KV_BOX = K::KV_BOX, VT_BOX = K::VT_BOX;
    static constexpr int Q_BYTES = K::Q_BYTES, KV_BYTES = K::KV_BYTES, V_BYTES = K::V_BYTES;
    static constexpr int KSTEPS = K::KSTEPS, BOX_KSTEPS = K::BOX_KSTEPS, PV_K = K::PV_K;
    static constexpr int BAR_TURN = 1;  // named barriers 1..CONSUMERS: the ping-pong turns of each consumer
    static constexpr int BAR_ZERO = 8;  // named barriers 8..: one consumer warpgroup (zero_v_tail)
    static constexpr int BAR_STORE = 12;  // named barriers 12..: one consumer warpgroup (its O buffer)
    static constexpr bool STAGE_O = K::STAGE_O, SKIP_UNSEEN = K::SKIP_UNSEEN;
    // A consumer whose 64 rows all lie past the sequence's end (a tile's last consumers where the
    // rows overrun it: 512 rows in 192-row tiles) sees no key either. Where the producer names no
    // unseen tiles (SKIP_UNSEEN), the consumer finds these rows itself, and skips their products:
    // they would hold the tensor cores the other consumers' products are waiting for.
    static constexpr bool SKIP_PAST_END = !SKIP_UNSEEN && CONSUMERS > 1;
    // The tile's row normalisation computed under its last P V, and with two Q stages the next
    // tile's state (consume); not the normalisation in the FP8 build of 256-key tiles with a
    // softcap, nor the state with three consumers (160 registers): there they spill.
    static constexpr bool OVERLAP_TAIL = !(FP8 && BN >= 256 && (MODS & MOD_SOFTCAP));
    static constexpr bool NEXT_UNDER_TAIL = OVERLAP_TAIL && Q_STAGES > 1 && CONSUMERS < 3;
    // Three consumers from head dim 128 (the builds of 128 and 192 run them): 160 registers hold O
    // and S, or O and P, not all three, so in its turn a consumer issues P V, waits for all but its
    // last k-step, then issues the next S = Q K^T (S and P never live together); the other two
    // consumers' products, not its own P V, cover its softmax.
    static constexpr bool SERIAL = CONSUMERS == 3 && D >= 128 && !FP8;
    typedef Sm90Epilogue<typename K::OutT, D, BM> Epilogue;

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
    template <int K0 = 0, int K1 = BN / PV_K>
    static __device__ __forceinline__ void issue_pv(float (&o)[1][D / 8][4], const unsigned (&pk)[BN / PV_K][4],
                                                    unsigned long long v_desc, bool accumulate) {
        wgmma_fence();
#pragma unroll
        for (int kk = K0; kk < K1; ++kk) {
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
    // Every consumer of a CTA walks the same tiles and takes a tile's key tiles and one turns (one
    // that skips key tiles its rows do not see takes their turns without products), so all take
    // the same number.
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

    // Key tiles it..it+count-1 passed unread: each stage waited for and handed back, and each
    // ping-pong turn taken without products.
    static __device__ __forceinline__ void pass_key_tiles(Barriers& bars, int it, int count, int cw, int lane) {
        for (int j = 0; j < count; ++j) {
            turn_begin(cw);  // first: the other consumers' products need not wait for this stage's V
            turn_end(cw);
            mbar_wait(&bars.k_full[stage(it + j)], phase(it + j));
            release(&bars.k_empty[stage(it + j)], lane);
            mbar_wait(&bars.v_full[stage(it + j)], phase(it + j));
            release(&bars.v_empty[stage(it + j)], lane);
        }
    }

    // What a consumer knows of one of its CTA's tiles. n_tiles < 0: past the CTA's last tile.
    struct Tile {
        TileCoord c;
        SeqSpan sq;
        int n_tiles;
        int first_tile;  // the lowest key tile visited (a window's left edge), n_tiles of them
        int unseen;  // the top key tiles none of this warpgroup's rows sees (TileMsg; SKIP_PAST_END: all, or 0)
        float scale_log2, out_scale;
        float softcap_pre;  // softcap builds: the raw scores' scale inside the tanh (mods.cuh)
        float alibi;  // ALiBi builds: this head's coefficient (mods.cuh)
        __device__ __forceinline__ int m_start() const { return c.m_block * BM; }
        __device__ __forceinline__ bool neg() const { return scale_log2 < 0.f; }
    };

    // The state of the tile whose Q is in stage n of the Q ring, as the producer named it (waits
    // for the stage). The producer names no query block past its sequence's end.
    static __device__ __forceinline__ Tile next_tile(const FwdSm90Params& P, Barriers& bars, int n, int cw) {
        const FwdParams& p = P.p;
        mbar_wait(&bars.q_full[n % Q_STAGES], q_phase(n));
        const auto m = bars.tile[n % Q_STAGES];
        Tile x;
        x.c = TileCoord{m.b, m.h, m.m_block};
        x.n_tiles = m.count;
        x.first_tile = m.first;
        // Through a shuffle: ptxas then keeps what follows from it (the ring's stage, the
        // descriptors) uniform, though it depends on the warpgroup.
        x.unseen = 0;
        if constexpr (SKIP_UNSEEN)  // from shared memory: a local copy indexed by cw would go to the stack
            x.unseen = __shfl_sync(0xffffffffu, bars.tile[n % Q_STAGES].unseen[cw], 0);
        const bool valid = m.count >= 0;
        x.sq = seq_span(p, valid ? x.c.b : 0);
        if constexpr (SKIP_PAST_END)  // all of them, or none (through a shuffle too)
            x.unseen = __shfl_sync(0xffffffffu, valid && x.m_start() + cw * 64 >= x.sq.seqlen_q ? m.count : 0, 0);
        x.scale_log2 = p.scale_log2;
        x.out_scale = 1.f;
        x.softcap_pre = p.softcap_pre;
        x.alibi = (MODS & MOD_ALIBI) ? alibi_coef(p, x.c.b, x.c.h) : 0.f;
        if constexpr (FP8) {
            if (valid) {
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
            apply_mods<MODS, 1, BN / 8>(s, x.softcap_pre, x.alibi, row0 + sq.causal_offset + p.alibi_shift, n_start,
                                        lane);
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

    // A tile's normalisation (times the v descale, FP8) and LSE, from its final row sums.
    static __device__ __forceinline__ void finish_rows(OnlineSoftmax<1>& softmax, float (&inv)[1][2],
                                                       float (&lse)[1][2], const Tile& x, const FwdParams& p) {
        softmax.finish(inv, lse, sink_log2_of(p.sinks, x.c.h), p.write_lse);
        inv[0][0] *= x.out_scale;
        inv[0][1] *= x.out_scale;
    }

    static __device__ __forceinline__ int stage(int i) { return i % STAGES; }
    static __device__ __forceinline__ unsigned q_phase(int n) { return (unsigned)((n / Q_STAGES) & 1); }
    static __device__ __forceinline__ unsigned phase(int i) { return (unsigned)((i / STAGES) & 1); }

    // Each tile's first O += P V starts from zero (scale-d off), so O is never cleared.
    static __device__ __forceinline__ void consume(const FwdSm90Params& P, Barriers& bars, unsigned char* sQ,
                                                   unsigned char* sK, unsigned char* sV, unsigned char* sO, int cw,
                                                   int ltid) {
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
        int n = 0;   // tiles with a Q load (the Q ring's stage and phase), as in produce() (producer.cuh)
        // The producer names each tile with its Q stage (TileMsg); where NEXT_UNDER_TAIL holds, the
        // next tile's name is read, and its state computed, under this tile's last P V.
        Tile ahead = NEXT_UNDER_TAIL ? next_tile(P, bars, 0, cw) : Tile{};  // tile n's, read during tile n-1
        for (;;) {
            Tile cur = NEXT_UNDER_TAIL ? ahead : next_tile(P, bars, n, cw);
            if (cur.n_tiles < 0) break;
            softmax.init();
            // The top key tiles this warpgroup's rows do not see: their stages handed back unread and
            // their ping-pong turns passed without products (every consumer takes each stage and the
            // same number of turns: a tile's key tiles and one); then, rows past the end, the next
            // tile, and SKIP_UNSEEN, the tile as if it had fewer.
            const int unseen = cur.unseen;
            if (SKIP_PAST_END && unseen > 0) {  // rows past the end: nothing to store either
                pass_key_tiles(bars, it, unseen, cw, lane);
                turn_begin(cw);
                turn_end(cw);
                release(&bars.q_empty[n % Q_STAGES], lane);
                it += unseen;
                ++n;
                if (NEXT_UNDER_TAIL) ahead = next_tile(P, bars, n, cw);
                continue;
            }
            if (SKIP_UNSEEN && unseen > 0) {
                pass_key_tiles(bars, it, unseen, cw, lane);
                if (unseen == cur.n_tiles) {
                    turn_begin(cw);
                    turn_end(cw);
                }
                it += unseen;
                cur.n_tiles -= unseen;
            }
            if (cur.n_tiles == 0) {  // sees no key: O = 0, LSE = -inf
                release(&bars.q_empty[n % Q_STAGES], lane);
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[0][i][e] = 0.f;
                float inv[1][2], lse[1][2];
                softmax.finish(inv, lse, sink_log2_of(p.sinks, cur.c.h));
                Epilogue::template store_tile<true>(p, o, inv, lse, cur.c, cur.sq, cw, ltid);
                ++n;
                if (NEXT_UNDER_TAIL) ahead = next_tile(P, bars, n, cw);
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
                if constexpr (SERIAL) {  // P V of tile j-1 done, then S of tile j issued
                    mbar_wait(&bars.v_full[stage(iv)], phase(iv));
                    turn_begin(cw);
                    // The last k-step committed apart: it runs while this consumer learns that the
                    // others are done and issues S, so the tensor cores do not wait for that; its 16
                    // keys of P are all the registers S and O leave free.
                    issue_pv<0, BN / PV_K - 1>(o, pk, v_desc(iv), j > 1);
                    issue_pv<BN / PV_K - 1, BN / PV_K>(o, pk, v_desc(iv), true);
                    wgmma_wait<1>();
                    mbar_wait(&bars.k_full[stage(ik)], phase(ik));
                    issue_qk(s, q_desc(n), k_desc(ik));
                    turn_end(cw);
                    wgmma_wait<1>();
                    fence_operands(flat<D>(o));
                    release(&bars.v_empty[stage(iv)], lane);
                    wgmma_wait<0>();
                } else {  // S of tile j issued before P V of tile j-1
                    mbar_wait(&bars.k_full[stage(ik)], phase(ik));
                    turn_begin(cw);
                    issue_qk(s, q_desc(n), k_desc(ik));
                    mbar_wait(&bars.v_full[stage(iv)], phase(iv));
                    issue_pv(o, pk, v_desc(iv), j > 1);
                    turn_end(cw);
                    wgmma_wait<1>();  // S of tile j is in; P V of tile j-1 may still run
                }
                fence_operands(flat<BN>(s));
                release(&bars.k_empty[stage(ik)], lane);
                if (j == cur.n_tiles - 1) release(&bars.q_empty[n % Q_STAGES], lane);
                mask_tile(p, s, cur, j, cw, warp, lane);
                softmax.template exponentiate<BN / 8, FP8>(s, cur.scale_log2, cur.neg(), alpha, bounded);
                if constexpr (!SERIAL) {
                    wgmma_wait<0>();
                    fence_operands(flat<D>(o));
                    release(&bars.v_empty[stage(iv)], lane);
                }
                if (!bounded) rescale_if_needed(o, alpha);  // bounded: alpha is 1
                to_operand(pk, s);
            }

            // The row sums are final: the normalisation and LSE need not wait for the last P V.
            float inv[1][2], lse[1][2];
            if constexpr (!OVERLAP_TAIL) finish_rows(softmax, inv, lse, cur, p);
            const int iv = it + cur.n_tiles - 1;
            mbar_wait(&bars.v_full[stage(iv)], phase(iv));
            turn_begin(cw);
            issue_pv(o, pk, v_desc(iv), cur.n_tiles > 1);
            turn_end(cw);
            if constexpr (OVERLAP_TAIL) finish_rows(softmax, inv, lse, cur, p);  // under the last P V
            if constexpr (NEXT_UNDER_TAIL) ahead = next_tile(P, bars, n + 1, cw);
            wgmma_wait<0>();
            fence_operands(flat<D>(o));
            release(&bars.v_empty[stage(iv)], lane);
            // Through the O buffer where the build has one and the call's O has a map, for tiles whose
            // 64 rows are all inside the sequence (a packed one's next sequence follows; the map
            // would not stop at its end). The condition through a shuffle: ptxas then keeps it uniform.
            if constexpr (STAGE_O) {
                const bool staged =
                    __shfl_sync(0xffffffffu, P.o_tma != 0 && cur.m_start() + cw * 64 + 64 <= cur.sq.seqlen_q, 0);
                if (staged)
                    Epilogue::store_tile_staged(p, &P.tma_o, o, inv, lse, cur.c, cur.sq, cw, ltid,
                                                sO + cw * K::O_STAGE_BYTES, BAR_STORE + cw);
                else
                    Epilogue::store_tile(p, o, inv, lse, cur.c, cur.sq, cw, ltid);
            } else {
                Epilogue::store_tile(p, o, inv, lse, cur.c, cur.sq, cw, ltid);
            }
            it += cur.n_tiles;
            ++n;
        }
        if (PINGPONG && cw == 0) named_sync(BAR_TURN + 0, 256);  // consume the last consumer's last hand-over
        if (STAGE_O && ltid == 0) bulk_wait<0>();  // the last staged store done before the CTA's memory goes
    }
};

}  // namespace sm90
}  // namespace cudattn
