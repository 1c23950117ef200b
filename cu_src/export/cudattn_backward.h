/* cudattn_backward.h: the backward pass of attention through cudattn's exported kernels. Part of
 * the header-only launcher: cudattn.h includes it, so include cudattn.h, not this file.
 *
 *     cudattn_backward_args a = cudattn_backward_defaults();
 *     ... the forward call's shapes, q, k, v, its output o and LSE, its flags; dout; dq, dk, dv ...
 *     a.workspace_bytes = cudattn_backward_workspace_bytes(&h, &a);  // (size_t)-1: a bad call
 *     ... a.workspace: a device allocation of that many bytes, 256-byte aligned ...
 *     cudattn_status s = cudattn_backward(&h, &a, stream);
 *
 * The gradients that cudattn.attention_backward computes, through the same kernels with the same
 * variant, parameters, launches and workspace layout: dq, dk, dv and dsinks equal the Python
 * path's bit for bit (dq only with deterministic = 1; otherwise its float32 sums are added in an
 * order that may change from run to run). Four launches on the caller's stream: the prepare pass,
 * the main kernel over key blocks (on sm_90a the Hopper kernel where it serves the call: no
 * softcap or ALiBi, strides TMA can map; else the portable one), the dQ conversion and, with sinks, their
 * gradient. The workspace needs no clearing: the prepare pass zeroes what must start at zero.
 */
#ifndef CUDATTN_BACKWARD_H
#define CUDATTN_BACKWARD_H

#ifndef CUDATTN_H
#error "include cudattn.h, which includes cudattn_backward.h"
#endif

/* The gradients of one attention call. Shapes as the forward's: (batch, seq, heads, head_dim)
 * with any element strides, the head-dim axis contiguous (see cudattn_tensor). */
typedef struct cudattn_backward_args {
    int dtype; /* of q, k, v, o, dout, dq, dk and dv: CUDATTN_FLOAT16 or CUDATTN_BFLOAT16 */
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int head_dim;              /* a multiple of 8 up to 256 */
    cudattn_tensor q, k, v;    /* the forward's inputs */
    cudattn_tensor o;          /* the forward's output (q's shape) */
    CUdeviceptr lse;           /* the forward's LSE: (batch, heads_q, seqlen_q) float32, contiguous */
    cudattn_tensor dout;       /* the loss's gradient with respect to o (q's shape) */
    cudattn_tensor dq, dk, dv; /* written: q's, k's and v's shapes; sharing no memory with an input or each other */
    /* The forward call's own flags; the backward must be given the ones its forward ran with. */
    int causal;                /* bottom right: query i sees key j iff j <= i + seqlen_k - seqlen_q */
    int has_scale;             /* 0: scale = 1/sqrt(head_dim) */
    double scale;
    int window_left, window_right; /* sliding window, keys i + seqlen_k - seqlen_q - left ..  + right; -1: unbounded */
    double softcap;            /* 0: none; else scores s become softcap * tanh(s / softcap) */
    CUdeviceptr alibi_slopes;  /* 0, or float32 (heads_q,), or (batch, heads_q) with alibi_per_batch */
    int alibi_per_batch;
    CUdeviceptr sinks;         /* 0, or float32 (heads_q,) sink logits */
    CUdeviceptr dsinks;        /* with sinks: written, float32 (heads_q,), their gradient */
    int deterministic;         /* 1: dq is bit-identical run to run (dk, dv and dsinks always are) */
    int family;                /* 0: the kernel the Python path picks; 80: the portable kernel, on Hopper too */
    CUdeviceptr workspace;     /* cudattn_backward_workspace_bytes() bytes, 256-byte aligned */
    size_t workspace_bytes;
} cudattn_backward_args;

static inline cudattn_backward_args cudattn_backward_defaults(void) {
    cudattn_backward_args a;
    memset(&a, 0, sizeof a);
    a.dtype = CUDATTN_FLOAT16;
    a.window_left = a.window_right = -1;
    return a;
}

/* The entry points of a backward cubin, in launch order (the last one only with sinks); the main
 * one is the family's (cudattn__bwd_main). */
static const char* const cudattn__bwd_entries[4] = {"flash_bwd_prepare", "flash_bwd_sm80", "flash_bwd_finish_dq",
                                                    "flash_bwd_dsinks"};
static inline const char* cudattn__bwd_main(int family) { return family == 90 ? "flash_bwd_sm90" : "flash_bwd_sm80"; }

/* Whether the Hopper kernel's TMA maps can describe a backward call's q, k, v and dout (16-bit). */
static inline int cudattn__bwd_tma_can_map(const cudattn_backward_args* a) {
    const cudattn_tensor* t[4] = {&a->q, &a->k, &a->v, &a->dout};
    const int seq[4] = {a->seqlen_q, a->seqlen_k, a->seqlen_k, a->seqlen_q};
    const int heads[4] = {a->heads_q, a->heads_kv, a->heads_kv, a->heads_q};
    return cudattn__tma_can_map_all(t, seq, heads, 4, a->batch, 2);
}

typedef struct cudattn__backward_plan {
    int empty;      /* no query row or no key: no kernel runs */
    int family;     /* 90: the Hopper kernel (TMA maps of q, k, v, dout and the dQ accumulator); 80 portable */
    int rows[4];    /* the table rows of the four entry points */
    int num_m, num_n, row_blocks; /* query blocks, key blocks, blocks of the row-wise kernels */
    size_t dq_accum, dsum, lse2, semaphores, bytes; /* workspace offsets and size */
} cudattn__backward_plan;

/* The main kernel's row of the build select_backward picks in a family: the smallest tile width
 * that holds head_dim, with the modifiers compiled in (1 softcap, 2 ALiBi); -1 if none. */
static inline int cudattn__select_backward(const cudattn_handle* h, int family, int dtype, int head_dim, int causal,
                                           int mods) {
    int i, best = -1;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i) {
        const cudattn_kernel_row* r = &cudattn_kernel_table[i];
        if (r->kind != 5 || strcmp(r->arch, h->arch) != 0 || r->dtype != dtype || r->causal != causal ||
            r->mods != mods || r->tile_dim < head_dim || strcmp(r->entry, cudattn__bwd_main(family)) != 0)
            continue;
        if (best < 0 || r->tile_dim < cudattn_kernel_table[best].tile_dim) best = i;
    }
    return best;
}

/* The row of an entry point of the cubin of row `of`; -1 if the table has none. */
static inline int cudattn__entry_row(int of, const char* entry) {
    int i;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
        if (cudattn_kernel_table[i].kind == 5 && strcmp(cudattn_kernel_table[i].file, cudattn_kernel_table[of].file) == 0 &&
            strcmp(cudattn_kernel_table[i].entry, entry) == 0)
            return i;
    return -1;
}

/* Lanes a query row in the row-wise kernels (bwd/rows.cuh, RowLanes): a power of two, at most 32,
   that splits the row's 8-element pieces evenly. */
static inline int cudattn__row_lanes(int tile_dim) {
    int pieces = tile_dim / 8;
    return pieces >= 32 ? 32 : pieces % 16 == 0 ? 16 : pieces % 8 == 0 ? 8 : pieces % 4 == 0 ? 4 : 2;
}

/* Checks a call's sizes and flags, picks its kernels and lays out its workspace (as
 * cudattn/_kernels/backward.py run_backward: the float32 dQ accumulator (batch * seqlen_q,
 * heads_q, tile width), dsum and lse2 in the LSE's layout, and with deterministic the int32 turn
 * counters (batch, heads_q, query blocks); each at a 256-byte offset). No driver call. */
static inline cudattn_status cudattn__backward_plan_of(cudattn_handle* h, const cudattn_backward_args* a,
                                                       cudattn__backward_plan* pl) {
    const int mods = (a->softcap != 0 ? 1 : 0) | (a->alibi_slopes ? 2 : 0);
    const cudattn_kernel_row* r;
    size_t rows_all;
    int i, per_block;
    memset(pl, 0, sizeof *pl);
    if (a->dtype == CUDATTN_E4M3)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "the backward takes float16 or bfloat16 inputs; FP8 "
                             "(e4m3) has no backward pass");
    if (a->dtype != CUDATTN_FLOAT16 && a->dtype != CUDATTN_BFLOAT16)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "dtype must be CUDATTN_FLOAT16 or CUDATTN_BFLOAT16; got "
                             "%d", a->dtype);
    if (a->batch < 0 || a->seqlen_q < 0 || a->seqlen_k < 0 || a->heads_q < 1 || a->heads_kv < 1)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "batch and lengths must be >= 0, heads >= 1");
    if (a->heads_q % a->heads_kv)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "heads_q (%d) must be a multiple of heads_kv (%d)",
                             a->heads_q, a->heads_kv);
    if (a->head_dim < 8 || a->head_dim > 256 || a->head_dim % 8)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "head_dim must be a multiple of 8 from 8 to 256; got %d",
                             a->head_dim);
    if (!isfinite(a->softcap) || a->softcap < 0)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "softcap must be finite and >= 0 (0: off); got %g",
                             a->softcap);
    if (a->window_left < -1 || a->window_right < -1)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "window_left and window_right must be >= -1 (-1: "
                             "unbounded); got %d, %d", a->window_left, a->window_right);
    if (a->sinks && !a->dsinks)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "with sinks, dsinks (float32 (heads_q,)) receives their "
                             "gradient: it must be set");
    rows_all = (size_t)a->batch * a->heads_q * a->seqlen_q;
    if (rows_all == 0 || a->seqlen_k == 0) { /* every gradient is 0: nothing to select */
        pl->empty = 1;
        return CUDATTN_OK;
    }
    if (!a->lse) return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "lse (the forward's LSE) is required");
    if (a->family != 0 && a->family != 80)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "family must be 0 (automatic) or 80 (portable); got %d",
                             a->family);
    /* as cudattn/_kernels/backward_traits.py select_for_device: the Hopper kernel where it serves the call */
    pl->family = a->family == 0 && strcmp(h->arch, "sm_90a") == 0 && mods == 0 && cudattn__bwd_tma_can_map(a) ? 90 : 80;
    pl->rows[1] = cudattn__select_backward(h, pl->family, a->dtype, a->head_dim, a->causal != 0, mods);
    if (pl->rows[1] < 0 && pl->family == 90) {
        pl->family = 80;
        pl->rows[1] = cudattn__select_backward(h, 80, a->dtype, a->head_dim, a->causal != 0, mods);
    }
    if (pl->rows[1] < 0)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "no backward kernel of this export serves dtype %d, "
                             "head_dim %d on %s", a->dtype, a->head_dim, h->arch);
    for (i = 0; i < 4; ++i)
        if (i != 1 && (pl->rows[i] = cudattn__entry_row(pl->rows[1], cudattn__bwd_entries[i])) < 0)
            return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "the backward cubin %s has no %s in this export's table",
                                 cudattn_kernel_table[pl->rows[1]].file, cudattn__bwd_entries[i]);
    r = &cudattn_kernel_table[pl->rows[1]];
    pl->num_m = (int)(((long long)a->seqlen_q + r->block_m - 1) / r->block_m);
    pl->num_n = (int)(((long long)a->seqlen_k + r->block_n - 1) / r->block_n);
    /* the row-wise kernels' rows a block: its warps, each 32 / (lanes a row) rows at a time */
    per_block = cudattn_kernel_table[pl->rows[0]].threads / 32 * (32 / cudattn__row_lanes(r->tile_dim));
    pl->row_blocks = (int)(((long long)a->seqlen_q + per_block - 1) / per_block);
    pl->dq_accum = 0;
    pl->dsum = cudattn__align256(rows_all * (size_t)r->tile_dim * 4);
    pl->lse2 = pl->dsum + cudattn__align256(rows_all * 4);
    pl->semaphores = pl->lse2 + cudattn__align256(rows_all * 4);
    pl->bytes = pl->semaphores +
                (a->deterministic ? cudattn__align256((size_t)a->batch * a->heads_q * (size_t)pl->num_m * 4) : 0);
    return CUDATTN_OK;
}

/* Bytes of workspace a backward call needs (0 when no kernel runs); -1 cast to size_t on a bad
 * call (cudattn_message says why). */
static inline size_t cudattn_backward_workspace_bytes(cudattn_handle* h, const cudattn_backward_args* a) {
    cudattn__backward_plan pl;
    h->message[0] = 0;
    if (cudattn__backward_plan_of(h, a, &pl) != CUDATTN_OK) return (size_t)-1;
    return pl.bytes;
}

/* The kernels' parameters, as cudattn/_kernels/backward.py fills BwdParams (the forward's
 * FwdParams, its modifiers as cudattn/_kernels/params.py fill_params sets them). No driver call. */
static inline void cudattn__backward_params(const cudattn_backward_args* a, const cudattn__backward_plan* pl,
                                            cudattn_BwdParams* P) {
    const double log2e = 1.4426950408889634;
    const double given = a->has_scale ? a->scale : 1.0 / sqrt((double)a->head_dim);
    const double scale = fabs(given) >= ldexp(1.0, -126) ? given : 0.0; /* tinier: 0, as the Python path */
    const int left = a->window_left, right = a->causal ? 0 : a->window_right;
    cudattn_FwdParams* f = &P->f;
    memset(P, 0, sizeof *P);
    f->q = a->q.ptr; f->k = a->k.ptr; f->v = a->v.ptr; f->o = a->o.ptr; f->lse = a->lse;
    f->q_stride_b = a->q.stride_b; f->q_stride_s = a->q.stride_s; f->q_stride_h = a->q.stride_h;
    f->k_stride_b = a->k.stride_b; f->k_stride_s = a->k.stride_s; f->k_stride_h = a->k.stride_h;
    f->v_stride_b = a->v.stride_b; f->v_stride_s = a->v.stride_s; f->v_stride_h = a->v.stride_h;
    f->o_stride_b = a->o.stride_b; f->o_stride_s = a->o.stride_s; f->o_stride_h = a->o.stride_h;
    f->batch = a->batch; f->seqlen_q = a->seqlen_q; f->seqlen_k = a->seqlen_k;
    f->heads_q = a->heads_q; f->heads_kv = a->heads_kv; f->group = a->heads_q / a->heads_kv;
    f->head_dim = a->head_dim;
    f->causal_offset = a->seqlen_k - a->seqlen_q;
    f->scale_log2 = scale != 0 ? (float)(scale * log2e) : (float)1e-30;
    f->num_m_blocks = pl->num_m;
    f->write_lse = 1;
    f->out_scale = 1.0f;
    if (!(left == -1 && right == -1) && !(a->causal && left == -1)) { /* a window that masks more than causal */
        f->has_window = 1;
        f->window_left = left;
        f->window_right = right;
    }
    if (a->softcap != 0 || a->sinks || a->alibi_slopes) {
        if (a->softcap != 0 && (float)(scale / a->softcap) != 0.0f) {
            f->softcap_pre = (float)(scale / a->softcap);
            f->scale_log2 = (float)(a->softcap * log2e);
            f->alibi_mul = (float)(-1.0 / a->softcap);
        } else {
            f->alibi_mul = (float)(-log2e / (double)f->scale_log2);
        }
        f->sinks = a->sinks;
        f->alibi = a->alibi_slopes;
        f->alibi_stride_b = a->alibi_per_batch ? a->heads_q : 0;
    }
    P->dout = a->dout.ptr; P->dq = a->dq.ptr; P->dk = a->dk.ptr; P->dv = a->dv.ptr;
    P->dq_accum = a->workspace + pl->dq_accum;
    P->dsum = a->workspace + pl->dsum;
    P->lse2 = a->workspace + pl->lse2;
    P->dsinks = a->sinks ? a->dsinks : 0;
    P->semaphores = a->deterministic ? a->workspace + pl->semaphores : 0;
    P->do_stride_b = a->dout.stride_b; P->do_stride_s = a->dout.stride_s; P->do_stride_h = a->dout.stride_h;
    P->dq_stride_b = a->dq.stride_b; P->dq_stride_s = a->dq.stride_s; P->dq_stride_h = a->dq.stride_h;
    P->dk_stride_b = a->dk.stride_b; P->dk_stride_s = a->dk.stride_s; P->dk_stride_h = a->dk.stride_h;
    P->dv_stride_b = a->dv.stride_b; P->dv_stride_s = a->dv.stride_s; P->dv_stride_h = a->dv.stride_h;
    P->rows_b = a->batch;
    P->rows_s = a->seqlen_q;
    P->tile_dim = cudattn_kernel_table[pl->rows[1]].tile_dim;
    P->num_n_blocks = pl->num_n;
    P->scale = (float)scale;
    P->deterministic = a->deterministic != 0;
}

/* The Hopper kernel's argument, as cudattn/_kernels/backward.py _sm90_params: P behind the maps of
 * q, k, v and dout (boxes of 64 columns x the block's rows) and of the float32 dQ accumulator
 * (tile width, heads_q, seqlen_q, batch), boxes of 32 columns x the query block. */
static inline cudattn_status cudattn__backward_maps(cudattn_handle* h, const cudattn_backward_args* a,
                                                    const cudattn__backward_plan* pl, const cudattn_BwdParams* P,
                                                    cudattn_BwdSm90Params* S) {
    const cudattn_kernel_row* r = &cudattn_kernel_table[pl->rows[1]];
    const cuuint64_t row = (cuuint64_t)r->tile_dim * 4;
    cuuint64_t dims[4], strides[3];
    cuuint32_t box[4], estr[4] = {1, 1, 1, 1};
    CUtensorMap m;
    memset(S, 0, sizeof *S);
    S->p = *P;
    CUDATTN__TRY(cudattn__map(h, S->tma_q, a->q.ptr, a->dtype, a->head_dim, a->seqlen_q, a->heads_q, a->batch, &a->q,
                              r->block_m, 128));
    CUDATTN__TRY(cudattn__map(h, S->tma_k, a->k.ptr, a->dtype, a->head_dim, a->seqlen_k, a->heads_kv, a->batch, &a->k,
                              r->block_n, 128));
    CUDATTN__TRY(cudattn__map(h, S->tma_v, a->v.ptr, a->dtype, a->head_dim, a->seqlen_k, a->heads_kv, a->batch, &a->v,
                              r->block_n, 128));
    CUDATTN__TRY(cudattn__map(h, S->tma_do, a->dout.ptr, a->dtype, a->head_dim, a->seqlen_q, a->heads_q, a->batch,
                              &a->dout, r->block_m, 128));
    dims[0] = (cuuint64_t)r->tile_dim; dims[1] = (cuuint64_t)a->heads_q;
    dims[2] = (cuuint64_t)a->seqlen_q; dims[3] = (cuuint64_t)a->batch;
    strides[0] = row; strides[1] = row * (cuuint64_t)a->heads_q; strides[2] = strides[1] * (cuuint64_t)a->seqlen_q;
    box[0] = 32; box[1] = 1; box[2] = (cuuint32_t)r->block_m; box[3] = 1;
    CUDATTN__TRY(cudattn__cu(h, cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (void*)P->dq_accum, dims,
                                                        strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                             "cuTensorMapEncodeTiled(dQ accumulator)"));
    memcpy(S->tma_dq, &m, 128);
    return CUDATTN_OK;
}

/* The grid of launch i (cudattn__bwd_entries[i]), as run_backward: the row-wise kernels over (row
 * blocks, heads_q, batch), the main one over (key blocks, heads_kv, batch), the sinks' over heads_q;
 * each launches with its table row's threads and dynamic shared memory. */
static inline void cudattn__backward_grid(const cudattn_backward_args* a, const cudattn__backward_plan* pl, int i,
                                          unsigned grid[3]) {
    grid[0] = (unsigned)(i == 1 ? pl->num_n : i == 3 ? a->heads_q : pl->row_blocks);
    grid[1] = (unsigned)(i == 1 ? a->heads_kv : i == 3 ? 1 : a->heads_q);
    grid[2] = (unsigned)(i == 3 ? 1 : a->batch);
}

/* dq, dk, dv (and dsinks) of one attention call, asynchronous on `stream`. A call with no query
 * row or no key runs no kernel: with batch = 0 it only zeroes dsinks; otherwise every gradient is
 * 0 and CUDATTN_ERROR_NOT_SUPPORTED says so, the caller to fill them. */
static inline cudattn_status cudattn_backward(cudattn_handle* h, const cudattn_backward_args* a, CUstream stream) {
    static const char* const what[4] = {"cuLaunchKernel(flash_bwd_prepare)", "cuLaunchKernel(main backward kernel)",
                                        "cuLaunchKernel(flash_bwd_finish_dq)", "cuLaunchKernel(flash_bwd_dsinks)"};
    cudattn__backward_plan pl;
    cudattn_BwdParams P;
    cudattn_BwdSm90Params S;
    CUfunction fn[4];
    void* args[1];
    const cudattn_kernel_row* r;
    const int launches = a->sinks ? 4 : 3;
    int i;
    h->message[0] = 0;
    CUDATTN__TRY(cudattn__backward_plan_of(h, a, &pl));
    CUDATTN__TRY(cudattn__in_context(h));
    CUDATTN__TRY(cudattn__check_scale(h, "scale", a->has_scale ? a->scale : 1.0 / sqrt((double)a->head_dim)));
    {
        const cudattn_tensor* t[8] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
        static const char* const names[8] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
        for (i = 0; i < 8; ++i) CUDATTN__TRY(cudattn__check_tensor(h, names[i], t[i], 2));
    }
    if (a->lse % 4 || a->sinks % 4 || a->dsinks % 4 || a->alibi_slopes % 4)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "lse, sinks, dsinks and alibi_slopes must be 4-byte "
                             "aligned");
    if (pl.empty) {
        if (a->batch > 0)
            return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "seqlen_q = 0 or seqlen_k = 0: no kernel runs; every "
                                 "gradient (dq, dk, dv%s) is 0, to be filled by the caller", a->sinks ? ", dsinks" : "");
        return a->sinks ? cudattn__cu(h, cuMemsetD32Async(a->dsinks, 0, (size_t)a->heads_q, stream), "cuMemsetD32Async")
                        : CUDATTN_OK;
    }
    if (a->workspace_bytes < pl.bytes || a->workspace % 256 || !a->workspace)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "the backward needs a 256-byte aligned workspace of %zu "
                             "bytes (cudattn_backward_workspace_bytes); got %zu", pl.bytes, a->workspace_bytes);
    r = &cudattn_kernel_table[pl.rows[1]];
    if (r->dynamic_smem > h->smem_optin)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "the backward kernel for head_dim %d needs %d bytes of "
                             "shared memory; the device allows %d", a->head_dim, r->dynamic_smem, h->smem_optin);
    if (a->batch > 65535 || a->heads_q > 65535)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "batch and heads_q must each be at most 65535 (CUDA grid "
                             "limit); split the call");
    for (i = 0; i < launches; ++i) CUDATTN__TRY(cudattn__function(h, pl.rows[i], &fn[i])); /* before anything is queued */
    cudattn__backward_params(a, &pl, &P);
    if (pl.family == 90) CUDATTN__TRY(cudattn__backward_maps(h, a, &pl, &P, &S));
    for (i = 0; i < launches; ++i) {
        const cudattn_kernel_row* e = &cudattn_kernel_table[pl.rows[i]];
        unsigned g[3];
        args[0] = i == 1 && pl.family == 90 ? (void*)&S : (void*)&P;
        cudattn__backward_grid(a, &pl, i, g);
        CUDATTN__TRY(cudattn__cu(h, cuLaunchKernel(fn[i], g[0], g[1], g[2], (unsigned)e->threads, 1, 1,
                                                   (unsigned)e->dynamic_smem, stream, args, NULL), what[i]));
    }
    return CUDATTN_OK;
}

#endif /* CUDATTN_BACKWARD_H */
