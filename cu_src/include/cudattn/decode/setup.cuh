// The setup of a split-KV decode block (fwd_decode.cuh): which packed rows and key tiles it works
// on (locate), its Q load, its K/V loads into the cp.async ring (DecodeKvLoader), and, for an e4m3
// cache, Q's fragments in the order the products read them. K is the kernel (FwdDecode).
#pragma once
#include "cudattn/e4m3_operands.cuh"
#include "cudattn/kv_cache.cuh"
#include "cudattn/params_decode.cuh"
#include "cudattn/smem_tile.cuh"

namespace cudattn {

// The packed rows and the keys of one block: (split, kv head, batch) and its block of rows.
struct DecodeBlock {
    int split, m_block, hkv, b;
    int m_start, rows_valid;  // its first packed row, and how many of its BM rows exist
    int chunks_valid;         // 16-byte chunks of a 16-bit row that exist (head_dim / 8)
    int L, cdiff;             // keys in the cache; token t's diagonal key: t + cdiff
    int right, left;          // the causal or window edges, keys right of and left of the diagonal (-1: open)
    int t_first, t_last;      // the tokens of its first and last rows
    int n_end;                // keys from n_end on are visited by none of its rows
    int t_begin, n_tiles;     // its split's key tiles: n_tiles from tile t_begin
};

template <class K>
struct DecodeSetup {
    typedef typename K::T T;
    static constexpr bool MODS = K::MODS, KV8 = K::KV8, KEYS_M = K::KEYS_M;
    static constexpr int D = K::D, NT = K::NT, BM = K::BM, BN = K::BN, C = K::C, MF = K::MF, STAGES = K::STAGES;

    static __device__ __forceinline__ DecodeBlock locate(const DecodeParams& p) {
        DecodeBlock k;
        k.split = blockIdx.x % p.num_splits;
        k.m_block = blockIdx.x / p.num_splits;
        k.hkv = blockIdx.y, k.b = blockIdx.z;
        k.m_start = k.m_block * BM;
        k.rows_valid = min(BM, p.rows - k.m_start);
        k.chunks_valid = p.head_dim / 8;
        k.L = kv_seqlen(p.kv, k.b);
        k.cdiff = k.L - p.seqlen_q;  // token t's diagonal key: t + cdiff
        const bool window = MODS && p.has_window;
        k.right = p.causal ? 0 : window ? p.window_right : -1;  // -1: open
        k.left = window ? p.window_left : -1;

        // Keys this block must visit: all L, or up to what its last token sees (causal, a
        // window's right edge) from what its first token sees (a window's left edge). The splits
        // cut the tiles from the first such key's tile.
        k.t_first = k.m_start / p.group, k.t_last = (k.m_start + k.rows_valid - 1) / p.group;
        int n_end = k.L, n_begin = 0;
        if (k.right >= 0) n_end = min(k.L, max(0, k.t_last + k.cdiff + k.right + 1));
        if (k.left >= 0) n_begin = min(n_end, max(0, k.t_first + k.cdiff - k.left));
        k.n_end = n_end;
        k.t_begin = n_begin / BN + k.split * p.tiles_per_split;
        const int t_end = min((n_end + BN - 1) / BN, k.t_begin + p.tiles_per_split);
        k.n_tiles = n_end > n_begin ? t_end - k.t_begin : 0;
        return k;
    }

    // Q into shared memory (one cp.async group): each packed row from its own (token, head).
    static __device__ __forceinline__ void load_q(const DecodeParams& p, T* sQ, const DecodeBlock& k, int tid) {
        for (int id = tid; id < BM * C; id += NT) {
            const int r = id / C, c = id % C;
            const int gr = k.m_start + r;
            const bool ok = r < k.rows_valid && c < k.chunks_valid;
            const T* src = static_cast<const T*>(p.q);
            if (ok) src += k.b * p.q_stride_b + (gr / p.group) * p.q_stride_s + (k.hkv * p.group + gr % p.group) * p.q_stride_h + c * 8;
            cp_async_16(smem_addr(sQ + tile_offset<D>(r, c)), src, ok);
        }
        cp_async_commit();
    }

    // KV8: once Q has landed (its group precedes the ring's), its fragments; returns the exponent
    // q_exp with which Q entered the products, as Q * 2^-q_exp (e4m3_operands.cuh). 0 otherwise.
    static __device__ __forceinline__ int q_fragments(const T* sQ, uint4* sQf, uint2* sQf2, int tid, int lane) {
        int q_exp = 0;
        if constexpr (KV8) {
            cp_async_wait<STAGES - 1>();
            __syncthreads();
            q_exp = q_exponent<T, BM, D>(sQ, lane);
            if constexpr (KEYS_M)  // read after the main loop's first barrier
                build_q_frags_keys_m<T, D, NT>(sQ, sQf2, tid, q_exp);
            else
                build_q_frags<T, MF, D, NT>(sQ, sQf, tid, q_exp);
        }
        return q_exp;
    }
};

#ifndef CUDATTN_PAGE_AHEAD
#define CUDATTN_PAGE_AHEAD 1
#endif

// Copies key tiles of the sequence into the K/V ring.
template <class K>
struct DecodeKvLoader {
    // Not the two-fragment builds with modifiers: every register is in use there (the page held
    // across the loop spilled on sm_80).
    static constexpr bool PAGE_AHEAD = CUDATTN_PAGE_AHEAD && !(K::MODS && K::MF > 1);
    typedef typename K::T T;
    static constexpr bool KV8 = K::KV8;
    static constexpr int D = K::D, BN = K::BN, KB = K::KB, CK = K::CK, STEP = K::STEP;
    static constexpr int KV_PER_THREAD = K::KV_PER_THREAD;

    const DecodeParams& p;
    unsigned char *rK, *rV;                  // the ring, in cache bytes
    const unsigned char *k_head, *v_head;    // the kv head's K and V
    int b, n_end, chunk, r_first;
    bool chunk_ok;

    __device__ __forceinline__ DecodeKvLoader(const DecodeParams& p_, const DecodeBlock& k, unsigned char* rK_,
                                              unsigned char* rV_, int tid)
        : p(p_), rK(rK_), rV(rV_), b(k.b), n_end(k.n_end) {
        // Cache pointers in bytes: the strides count elements of KB bytes.
        k_head = static_cast<const unsigned char*>(p.k) + k.hkv * p.k_stride_h * KB;
        v_head = static_cast<const unsigned char*>(p.v) + k.hkv * p.v_stride_h * KB;
        const int row0 = tid / CK;
        chunk = tid % CK;
        chunk_ok = chunk * 16 < p.head_dim * KB;
        // A thread's KV_PER_THREAD rows are one 16-key group's, STEP apart (row0 picks the group
        // and the first row), and pages hold whole groups (page_size % 16 == 0, tiles start at
        // multiples of 16): one page lookup a thread and tile, and one pointer add a row.
        r_first = (row0 / STEP) * 16 + row0 % STEP;
    }

    // The block table's entry for this thread's 16-key group of tile `tile`, as read, unclamped (0
    // where the group is past the keys; unused with a contiguous cache). The main loop reads it a
    // tile before the tile's copies (PAGE_AHEAD), and clamps it only there, at its use (a clamp at
    // the read waited for it): read at the copies, the table's round trip held every warp before
    // the products of the tile in hand (H200, bf16, one token, 16-key pages, 64 sequences of 32
    // heads, 2048 keys: 506.7 -> 491.1 us, an e4m3 cache 263.6 -> 259.8; 8 kv heads of 32 query
    // heads even). (CUDATTN_PAGE_AHEAD=0 builds the read at the copies, for comparison.)
    __device__ __forceinline__ int page_of(int tile) const {
        const int j = tile * BN + (r_first & ~15);
        return p.kv.block_table != nullptr && j < n_end ? kv_table_entry(p.kv, b, j).x : 0;
    }

    // Tile `tile` of the sequence into ring slot `slot`, its page read here; keys past n_end are zero-filled.
    __device__ __forceinline__ void operator()(int tile, int slot) const { (*this)(tile, slot, page_of(tile)); }

    // The same, with the table's entry read before (page_of).
    __device__ __forceinline__ void operator()(int tile, int slot, int page) const {
        const int n0 = tile * BN;
        long long k_off, v_off;  // elements from the head's start to the first row
        if (p.kv.block_table == nullptr) {
            k_off = (long long)b * p.k_stride_page + (long long)(n0 + r_first) * p.k_stride_s;
            v_off = (long long)b * p.v_stride_page + (long long)(n0 + r_first) * p.v_stride_s;
        } else {  // the row in the page: pages hold whole 16-key groups
            const int ps = p.kv.page_size, j = n0 + r_first;
            const int row = (ps & (ps - 1)) == 0 ? j & (ps - 1) : j % ps;
            const long long pg = kv_clamp_page(p.kv, page);
            k_off = pg * p.k_stride_page + (long long)row * p.k_stride_s;
            v_off = pg * p.v_stride_page + (long long)row * p.v_stride_s;
        }
        const unsigned char* ks = k_head + k_off * KB + chunk * 16;
        const unsigned char* vs = v_head + v_off * KB + chunk * 16;
#pragma unroll
        for (int i = 0; i < KV_PER_THREAD; ++i) {
            const int r = r_first + i * STEP;
            const bool ok = chunk_ok && n0 + r < n_end;
            // 16-bit: the products' swizzled tile; KV8: the raw tile's rows of D bytes
            const int off = slot * BN * D * KB + (KV8 ? raw_offset<D>(r, chunk * 16) : (int)sizeof(T) * tile_offset<D>(r, chunk));
            cp_async_16(smem_addr(rK + off), ok ? ks : k_head, ok);
            cp_async_16(smem_addr(rV + off), ok ? vs : v_head, ok);
            ks += (long long)STEP * p.k_stride_s * KB;
            vs += (long long)STEP * p.v_stride_s * KB;
        }
    }
};

}  // namespace cudattn
