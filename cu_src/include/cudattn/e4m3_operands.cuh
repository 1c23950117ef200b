// 16-bit tensor-core products over e4m3 K/V tiles, converted in registers straight into the
// mma.m16n8k16 operand fragments (the split-KV decode kernel's FP8 caches). No converted copy
// is written back to shared memory, so a ring stage costs its e4m3 bytes only.
//
// Raw tiles: rows of D e4m3 bytes, 16-byte chunks XOR-swizzled by row (raw_offset), so that the
// 8 rows an ldmatrix or a warp's loads touch fall in distinct bank groups (all but K's 16-byte
// loads at D 256, where lanes t and t + 2 of a quarter-warp share one: 2-way).
//
// K (B operand of S = Q K^T, k = head dim): the fragment wants, per 16-wide k-step, key row g's
// elements 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1), t = lane % 4. The head dim is permuted, the same
// way for Q and K (a dot product does not care): k-step kk's logical elements 2t+j and 2t+8+j
// are taken from physical element t * D/4 + 4 kk + j and + 2 + j. A lane's four bytes of a
// k-step are then one 32-bit word, and its words of all k-steps one contiguous run of D/4 bytes
// of the key row: 16-byte loads. Q's fragments are gathered once, in the same permutation, into
// a fragment-ordered copy (build_q_frags), one 16-byte load per k-step.
//
// V (B operand of O += P V, k = keys): the fragment wants two keys' values at one head-dim
// column. ldmatrix.trans on the raw tile read as 16-bit pairs gives a lane, of an 8 x 16-byte
// block, keys 2t and 2t+1 at columns 2g and 2g+1 (one word: [k0 c0, k0 c1, k1 c0, k1 c1]); bytes
// 0 and 2 make the operand of column 2g, bytes 1 and 3 that of column 2g+1. So each 16-column
// chunk c of O is computed as two 8-wide fragments, even (columns 16c + 2n) and odd
// (16c + 2n + 1): o[2c + parity], and a lane's accumulators 0, 1 (rows g; 2, 3: rows g + 8) of
// the pair hold columns 16c + 4t + (0, 2) (even) and 16c + 4t + (1, 3) (odd).
//
// Product type (E4m3Products): float16, for a bfloat16 q too. Every e4m3 value is a float16, so K
// and V reach the products exactly either way, and the e4m3 -> float16 conversion is one
// instruction where bfloat16 takes three more (measured: bfloat16 products up to 25 % slower). A
// bfloat16 q is scaled by 2^-e into float16 (q_exponent: its largest finite magnitude into
// [2^14, 2^15)), exact for every element down to 2^-28 of that largest one (smaller ones round
// as float16 subnormals, off by less than 2^-39 of it: far below the products' float32
// rounding), and the scores are scaled back by 2^e with the scale.
#pragma once
#include "cudattn/fp8.cuh"
#include "cudattn/ptx.cuh"
#include "cudattn/smem_tile.cuh"
#include "cudattn/tile_products.cuh"

namespace cudattn {

// Byte offset of (row, byte) in a raw tile of D-byte rows: 16-byte chunks swizzled by row so
// that 8 consecutive rows at one chunk hit 8 distinct 16-byte bank groups.
template <int D>
__device__ __forceinline__ int raw_offset(int row, int byte) {
    constexpr int CB = D / 16;  // chunks per row
    static_assert(CB == 2 || CB == 4 || CB % 8 == 0, "raw rows of 32, 64 or a multiple of 128 bytes");
    const int x = CB >= 8 ? (row & 7) : CB == 4 ? ((row >> 1) & 3) : ((row >> 2) & 1);
    return row * D + ((((byte >> 4) ^ x)) << 4) + (byte & 15);
}

// The four e4m3 bytes of w as two pairs of T, exactly (every e4m3 value is a normal float16, and
// a bfloat16, reached through float): lo from bytes 0, 1 and hi from 2, 3, or with INTERLEAVED
// lo from bytes 0, 2 and hi from 1, 3 (the first byte of a pair into the low half).
template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void e4m3_word_to(u32 w, u32& lo, u32& hi) {
    if constexpr (INTERLEAVED) w = __byte_perm(w, 0u, 0x3120);
    lo = f16x2_as(e4m3x2_to_f16x2((unsigned short)(w & 0xffffu)), T());
    hi = f16x2_as(e4m3x2_to_f16x2((unsigned short)(w >> 16)), T());
}

template <typename T>
struct E4m3Products {
    typedef __half type;
    static constexpr bool SCALED = true;  // bfloat16 q, float16 products
};
template <>
struct E4m3Products<__half> {
    typedef __half type;
    static constexpr bool SCALED = false;
};

// The exponent e that brings the largest finite magnitude of Q (a ROWS x D tile of T) into
// [2^14, 2^15); 0 where no scaling is needed (float16 q) or possible (no finite nonzero element).
// Infinities and NaNs are left out of the maximum (they pass the scaling unchanged), so one bad
// head cannot push its block's other rows out of float16's range. Every warp computes it over the
// whole tile, so that no barrier is needed.
template <typename T, int ROWS, int D>
__device__ __forceinline__ int q_exponent(const T* sq, int lane) {
    if constexpr (!E4m3Products<T>::SCALED) {
        return 0;
    } else {
        const uint4* v = reinterpret_cast<const uint4*>(sq);
        auto finite = [](u32 w) {  // bfloat16 magnitudes order as their 15-bit patterns; >= 0x7f80: inf, NaN
            const u32 m = w & 0x7fff7fffu;
            return m & __vcmpltu2(m, 0x7f807f80u);
        };
        unsigned m = 0;
        for (int i = lane; i < ROWS * D / 8; i += 32) {
            const uint4 x = v[i];
            m = __vmaxu2(m, __vmaxu2(__vmaxu2(finite(x.x), finite(x.y)), __vmaxu2(finite(x.z), finite(x.w))));
        }
        m = __reduce_max_sync(0xffffffffu, max(m & 0xffffu, m >> 16));
        if (m == 0) return 0;
        // 2^-e and 2^e must both be normal floats: e in [-126, 126]
        return min(max(max((int)(m >> 7), 1) - 127 - 14, -126), 126);
    }
}

// Elements c, c + 1 (c even) of row r of Q (a swizzled 16-bit tile) as one word of the products'
// type: as they are, or a bfloat16 pair times 2^-e (down) as float16.
template <typename T, int D>
__device__ __forceinline__ u32 q_word(const T* sq, int r, int c, float down) {
    const u32 w = *reinterpret_cast<const u32*>(sq + tile_offset<D>(r, c >> 3) + (c & 7));
    if constexpr (!E4m3Products<T>::SCALED) {
        return w;
    } else {
        const __half2 h = __floats2half2_rn(__uint_as_float(w << 16) * down, __uint_as_float(w & 0xffff0000u) * down);
        return *reinterpret_cast<const u32*>(&h);
    }
}

// This lane's bytes h * PIECE .. of its run of D/4 in key rows f * 8 + g (f < F) of a raw tile, as
// words (one a k-step): K's operand words for qk_product_e4m3 and qk_product_e4m3_keys_m.
template <int D, int F, int PIECE>
__device__ __forceinline__ void load_k_words(u32 (&kw)[F][PIECE / 4], const unsigned char* k_tile, int h, int lane) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int f = 0; f < F; ++f) {
        const unsigned char* src = k_tile + raw_offset<D>(f * 8 + g, tq * (D / 4) + h * PIECE);
        if constexpr (PIECE == 16) {
            const uint4 v = *reinterpret_cast<const uint4*>(src);
            kw[f][0] = v.x, kw[f][1] = v.y, kw[f][2] = v.z, kw[f][3] = v.w;
        } else {
            const uint2 v = *reinterpret_cast<const uint2*>(src);
            kw[f][0] = v.x, kw[f][1] = v.y;
        }
    }
}

// The fragment-ordered copy of Q: entry (mf, kk, lane) holds the lane's A fragment of row
// fragment mf at k-step kk, in the permuted head dim, in the product type (scaled by 2^-e, e
// from q_exponent). sq: Q as a swizzled 16-bit tile (tile_offset<D>); qf: MF * D/16 * 32
// entries of 16 bytes. Every thread of the block helps.
template <typename T, int MF, int D, int NT>
__device__ __forceinline__ void build_q_frags(const T* sq, uint4* qf, int tid, int e) {
    constexpr int KS = D / 16;
    const float down = __int_as_float((127 - e) << 23);  // 2^-e
    for (int id = tid; id < MF * KS * 32; id += NT) {
        const int lane = id % 32, kk = (id / 32) % KS, mf = id / (32 * KS);
        const int r = mf * 16 + (lane >> 2), el = (lane & 3) * (D / 4) + 4 * kk;
        qf[id] = make_uint4(q_word<T, D>(sq, r, el, down), q_word<T, D>(sq, r + 8, el, down),
                            q_word<T, D>(sq, r, el + 2, down), q_word<T, D>(sq, r + 8, el + 2, down));
    }
}

// S = Q K^T for MF row fragments and NF 8-key fragments: qf the fragment-ordered Q, k_tile the
// warp's first key row in a raw tile.
template <typename T, int MF, int NF, int D>
__device__ __forceinline__ void qk_product_e4m3(float (&s)[MF][NF][4], const uint4* qf, const unsigned char* k_tile,
                                                int lane) {
    constexpr int PIECE = D / 4 < 16 ? D / 4 : 16;  // bytes per load of the lane's D/4 (D 32: 8)
    constexpr int WORDS = PIECE / 4;
    zero_fragments(s);
#pragma unroll
    for (int h = 0; h < D / 4 / PIECE; ++h) {
        u32 kw[NF][WORDS];
        load_k_words<D, NF, PIECE>(kw, k_tile, h, lane);
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
            const int kk = h * WORDS + w;
            u32 a[MF][4];
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) {
                const uint4 v = qf[(mf * (D / 16) + kk) * 32 + lane];
                a[mf][0] = v.x, a[mf][1] = v.y, a[mf][2] = v.z, a[mf][3] = v.w;
            }
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
                u32 b0, b1;
                e4m3_word_to<T, false>(kw[nf][w], b0, b1);
#pragma unroll
                for (int mf = 0; mf < MF; ++mf) Mma<T>::run(s[mf][nf], a[mf], b0, b1);
            }
        }
    }
}

// O += P V for one tile of keys (KSTEPS steps of 16), V a raw tile (v_base: the warp's first key
// row). O's fragments are in the even/odd column order above.
template <typename T, int MF, int KSTEPS, int D>
__device__ __forceinline__ void pv_product_e4m3(float (&o)[MF][D / 8][4], const float (&s)[MF][2 * KSTEPS][4],
                                                u32 v_base, int lane) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 pa[MF][4];
        pack_p_step<T>(pa, s, kk);
        // Lane l addresses row (l / 8 % 2) * 8 + l % 8 of the 16 keys, chunk 2 dp + l / 16:
        // registers 0/1 are keys 0-7/8-15 of chunk 2 dp, 2/3 those of chunk 2 dp + 1.
        const int row = kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
            u32 r[4];
            ldmatrix_x4_trans(r, v_base + raw_offset<D>(row, (2 * dp + (lane >> 4)) * 16));
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int f = 2 * (2 * dp + c);  // the chunk's even fragment; f + 1 the odd one
                u32 b0e, b0o, b1e, b1o;  // keys 0-7 and 8-15, even and odd columns
                e4m3_word_to<T, true>(r[2 * c], b0e, b0o);
                e4m3_word_to<T, true>(r[2 * c + 1], b1e, b1o);
#pragma unroll
                for (int mf = 0; mf < MF; ++mf) {
                    Mma<T>::run(o[mf][f], pa[mf], b0e, b1e);
                    Mma<T>::run(o[mf][f + 1], pa[mf], b0o, b1o);
                }
            }
        }
    }
}


// Keys-as-M products (the split-KV decode kernel with at most 8 packed rows): S^T = K Q^T with K
// as the A operand (16 keys x 16 head-dim units) and Q^T as B (8 rows), O^T += V^T P^T with V^T as
// A (16 head-dim columns x 16 keys) and P^T as B: half the MMAs of 16-row fragments, whose rows
// past 8 are padding there. K's A fragment takes the same words as its B fragment above (rows g
// and g+8 of each 16-key fragment, the permuted head dim); V^T's rows g and g+8 are a 16-column
// chunk's even and odd columns (16c + 2g, 16c + 2g + 1), so O^T's accumulators 0, 1 (2, 3) hold
// column 16c + 2g (+1) of rows 2t, 2t+1. P^T's B fragment is P's accumulators packed and moved
// across the quad's lanes by movmatrix (an 8 x 8 transpose).

// Q's B fragments: entry (kk, lane) holds row g's elements of k-step kk (b0, b1), in the permuted
// head dim and the product type. sq: 8 rows of Q as a swizzled tile; every thread helps.
template <typename T, int D, int NT>
__device__ __forceinline__ void build_q_frags_keys_m(const T* sq, uint2* qf, int tid, int e) {
    const float down = __int_as_float((127 - e) << 23);  // 2^-e
    for (int id = tid; id < D / 16 * 32; id += NT) {
        const int lane = id % 32, kk = id / 32;
        const int r = lane >> 2, el = (lane & 3) * (D / 4) + 4 * kk;
        qf[id] = make_uint2(q_word<T, D>(sq, r, el, down), q_word<T, D>(sq, r, el + 2, down));
    }
}

// S^T for KF 16-key fragments: s[kf] holds keys 16 kf + g (accumulators 0, 1) and + 8 (2, 3) of
// rows 2t, 2t + 1. k_tile: the warp's first key row in a raw tile.
template <typename T, int KF, int D>
__device__ __forceinline__ void qk_product_e4m3_keys_m(float (&s)[KF][4], const uint2* qf,
                                                       const unsigned char* k_tile, int lane) {
    constexpr int PIECE = D / 4 < 16 ? D / 4 : 16;
    constexpr int WORDS = PIECE / 4;
#pragma unroll
    for (int kf = 0; kf < KF; ++kf)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[kf][e] = 0.f;
#pragma unroll
    for (int h = 0; h < D / 4 / PIECE; ++h) {
        u32 kw[2 * KF][WORDS];  // rows 16 kf + g and 16 kf + 8 + g
        load_k_words<D, 2 * KF, PIECE>(kw, k_tile, h, lane);
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
            const uint2 b = qf[(h * WORDS + w) * 32 + lane];
#pragma unroll
            for (int kf = 0; kf < KF; ++kf) {
                u32 a[4];
                e4m3_word_to<T, false>(kw[2 * kf][w], a[0], a[2]);
                e4m3_word_to<T, false>(kw[2 * kf + 1][w], a[1], a[3]);
                Mma<T>::run(s[kf], a, b.x, b.y);
            }
        }
    }
}

// O^T += V^T P^T for one tile of KF 16-key fragments (P in s, exponentiated): o[c] is 16-column
// chunk c. v_base: the warp's first key row in a raw tile.
template <typename T, int KF, int D>
__device__ __forceinline__ void pv_product_e4m3_keys_m(float (&o)[D / 16][4], const float (&s)[KF][4], u32 v_base,
                                                       int lane) {
#pragma unroll
    for (int kf = 0; kf < KF; ++kf) {
        u32 b0, b1;  // P^T's B fragment: keys 2t, 2t+1 (+8) of row g, from P's rows 2t, 2t+1 at key g (+8)
        asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(b0) : "r"(Mma<T>::pack(s[kf][0], s[kf][1])));
        asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(b1) : "r"(Mma<T>::pack(s[kf][2], s[kf][3])));
        const int row = kf * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
            u32 r[4];  // keys 0-7 / 8-15 of chunk 2 dp (0, 1), of chunk 2 dp + 1 (2, 3)
            ldmatrix_x4_trans(r, v_base + raw_offset<D>(row, (2 * dp + (lane >> 4)) * 16));
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                u32 a[4];  // rows: even columns (a0 keys 0-7, a2 keys 8-15), odd columns (a1, a3)
                e4m3_word_to<T, true>(r[2 * c], a[0], a[1]);
                e4m3_word_to<T, true>(r[2 * c + 1], a[2], a[3]);
                Mma<T>::run(o[2 * dp + c], a, b0, b1);
            }
        }
    }
}

}  // namespace cudattn
