/* cudattn from C: attention on random inputs through the exported kernels, checked against a
 * float64 CPU reference. Needs only the export and libcuda:
 *
 *     python -m cudattn export --out cudattn_kernels
 *     cc -std=c11 -O2 $(python -m cudattn export --print-cflags --out cudattn_kernels) \
 *         cudattn_kernels/examples/attention.c -ldl -lm -o attention
 *     ./attention cudattn_kernels [--dtype f16|bf16|e4m3] [--causal] [--shape B,Sq,Sk,Hq,Hkv,D] [--portable]
 *     ./attention cudattn_kernels --decode [--dtype f16|bf16] [--shape B,Sq,capacity,Hq,Hkv,D] [--paged PAGE]
 *                 [--new N] [--splits N]     (decode: N keys appended first, default 2)
 *     ./attention cudattn_kernels --merge [--dtype f16|bf16] [--shape B,Sq,Sk,Hq,Hkv,D]   (two halves merged)
 *
 * (--print-cflags: -I for the export's include/ and for cuda.h, from the nvidia-cuda-runtime pip
 * wheel. No -lcuda: cudattn.h loads libcuda.so.1, which the NVIDIA driver installs, at run time.)
 * Exit status: 0 the check passed (or --io wrote its outputs), 1 it failed or cudattn refused the
 * call, 2 bad arguments or a failing driver call, 3 no CUDA driver or no GPU here (nothing ran).
 * With --io DIR it reads its inputs from files instead and writes its outputs, unchecked (the
 * tests compare them with the Python path's): DIR/args.txt is either "prefill dtype out_dtype B Sq
 * Sk Hq Hkv D causal qd kd vd family" (dtype codes of cudattn.h, out_dtype -1 for the default,
 * the FP8 descales 1 for 16-bit inputs, family 0 automatic or 80 the portable kernel) with
 * DIR/{q,k,v}.bin, contiguous (B, S, H, D) element bytes, and for FP8 optionally
 * DIR/{q,k,v}_descale.bin, (B, Hkv) float32 descale arrays; or "decode dtype B Sq Hq Hkv D causal
 * capacity page_size max_pages num_pages seqlen_new num_splits" (page_size 0: contiguous) with
 * DIR/{q,k_cache,v_cache,seqlens}.bin, block_table.bin when paged and {k,v}_new.bin when
 * appending; or "merge dtype N B Sq H D" with DIR/o_parts.bin (N, B, Sq, H, D) and DIR/lse_parts.bin
 * (N, B, H, Sq) float32. It writes DIR/out.bin, DIR/lse.bin (float32) and, for decode, the caches
 * after the append (DIR/{k,v}_cache.out.bin). Exit status 0 when the check passes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudattn.h"

#define CK(call)                                                                         \
    do {                                                                                 \
        CUresult r_ = (call);                                                            \
        if (r_ != CUDA_SUCCESS) {                                                        \
            const char* s_ = NULL;                                                       \
            cuGetErrorString(r_, &s_);                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

/* ---- element conversions (host) ---- */
static float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float bf16_to_float(uint16_t h) { return bits_to_float((uint32_t)h << 16); }
static uint16_t float_to_bf16(float f) { /* round to nearest even; inputs here are finite */
    uint32_t u = float_to_bits(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float f16_to_float(uint16_t h) {
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return (s ? -1.f : 1.f) * ldexpf((float)m, -24);
    if (e == 31) return bits_to_float(s | 0x7f800000u | (m << 13));
    return bits_to_float(s | ((e + 112) << 23) | (m << 13));
}
static uint16_t float_to_f16(float f) { /* nearest even via the float32 bits; |f| small and normal here */
    const uint32_t u = float_to_bits(f), s = (u >> 16) & 0x8000u;
    const int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t m = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)s; /* flush the tiny ones (not produced below) */
    m = m + 0xfffu + ((m >> 13) & 1u);
    return (uint16_t)(s | ((uint32_t)(e << 10) + (m >> 13)));
}
static float e4m3_to_float(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.f + m / 8.f, e - 7);
    return s ? -v : v;
}

typedef struct { int dtype, out_dtype, B, Sq, Sk, Hq, Hkv, D, causal; double qd, kd, vd; int family; } shape_t;

static size_t item_of(int dtype) { return dtype == CUDATTN_FLOAT32 ? 4 : dtype == CUDATTN_E4M3 ? 1 : 2; }

static double to_double(int dtype, const void* p, size_t i) {
    switch (dtype) {
    case CUDATTN_FLOAT16: return f16_to_float(((const uint16_t*)p)[i]);
    case CUDATTN_BFLOAT16: return bf16_to_float(((const uint16_t*)p)[i]);
    case CUDATTN_E4M3: return e4m3_to_float(((const uint8_t*)p)[i]);
    default: return ((const float*)p)[i];
    }
}

/* A 32-bit linear congruential generator: the same inputs on every platform. */
static uint32_t next_random(uint32_t* seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return *seed;
}

/* Random elements, about N(0, 1/2) for 16-bit; for e4m3 a uniform pick of the codes within +-2. */
static void fill_random(int dtype, void* p, size_t n, uint32_t* seed) {
    size_t i;
    for (i = 0; i < n; ++i) {
        double u1 = ((next_random(seed) >> 8) + 1.0) / 16777218.0, u2 = (next_random(seed) >> 8) / 16777216.0;
        float x = (float)(0.7 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        if (dtype == CUDATTN_FLOAT16) ((uint16_t*)p)[i] = float_to_f16(x);
        else if (dtype == CUDATTN_BFLOAT16) ((uint16_t*)p)[i] = float_to_bf16(x);
        else {
            uint8_t b;
            do b = (uint8_t)(next_random(seed) >> 24); while ((b & 0x7f) == 0x7f || fabsf(e4m3_to_float(b)) > 2.f);
            ((uint8_t*)p)[i] = b;
        }
    }
}

/* float64 attention of batch b (all heads), bottom-right causal, on the dequantised inputs. */
/* Where key j of sequence b lives in a cache: page table[b][j / page_size] (or page b when
 * contiguous), row j % page_size; (page * page_size + row) rows of Hkv x D elements before it. */
typedef struct { const void *k, *v; const int* table; int page_size, max_pages; } cache_t;

static size_t cache_row(const cache_t* c, int b, int j) {
    const int page = c->table ? c->table[(size_t)b * c->max_pages + j / c->page_size] : b;
    return (size_t)page * c->page_size + j % c->page_size;
}

/* float64 attention of batch b (all heads) over its first L keys, bottom-right causal, on the
 * dequantised inputs; out: (Sq, Hq, D). */
static void reference(const shape_t* s, const void* q, const cache_t* c, int L, int b, double* out) {
    const double scale = 1.0 / sqrt((double)s->D);
    double* w = (double*)malloc(sizeof(double) * (size_t)(L > 0 ? L : 1));
    int h, i, j, d;
    for (h = 0; h < s->Hq; ++h) {
        const int hk = h / (s->Hq / s->Hkv);
        for (i = 0; i < s->Sq; ++i) {
            double mx = -INFINITY, sum = 0;
            for (j = 0; j < L; ++j) {
                double dot = 0;
                if (s->causal && j > i + L - s->Sq) { w[j] = -INFINITY; continue; }
                for (d = 0; d < s->D; ++d)
                    dot += to_double(s->dtype, q, (((size_t)b * s->Sq + i) * s->Hq + h) * s->D + d) * s->qd *
                           to_double(s->dtype, c->k, (cache_row(c, b, j) * s->Hkv + hk) * s->D + d) * s->kd;
                w[j] = dot * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (j = 0; j < L; ++j) { w[j] = w[j] == -INFINITY ? 0 : exp(w[j] - mx); sum += w[j]; }
            for (d = 0; d < s->D; ++d) {
                double acc = 0;
                for (j = 0; j < L; ++j)
                    acc += w[j] * to_double(s->dtype, c->v, (cache_row(c, b, j) * s->Hkv + hk) * s->D + d) * s->vd;
                out[((size_t)i * s->Hq + h) * s->D + d] = sum > 0 ? acc / sum : 0;
            }
        }
    }
    free(w);
}

/* max |out - ref| over batches 0 and B-1 (sequence b's keys: lens[b], or all Sk), and max |ref|. */
static void compare(const shape_t* s, int out_dtype, const void* out, const void* q, const cache_t* c,
                    const int* lens, double* worst, double* peak) {
    const size_t n = (size_t)s->Sq * s->Hq * s->D;
    double* ref = (double*)malloc(sizeof(double) * n);
    int bs[2] = {0, s->B - 1}, nb = s->B > 1 ? 2 : 1, bi;
    size_t e;
    *worst = *peak = 0;
    for (bi = 0; bi < nb; ++bi) {
        reference(s, q, c, lens ? lens[bs[bi]] : s->Sk, bs[bi], ref);
        for (e = 0; e < n; ++e) {
            const double d = fabs(to_double(out_dtype, out, (size_t)bs[bi] * n + e) - ref[e]);
            if (!(d <= *worst)) *worst = d; /* NaN sticks */
            if (fabs(ref[e]) > *peak) *peak = fabs(ref[e]);
        }
    }
    free(ref);
}

static void* read_file(const char* dir, const char* name, size_t want) {
    char path[4200];
    FILE* f;
    void* p = malloc(want ? want : 1);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f || fread(p, 1, want, f) != want) { fprintf(stderr, "cannot read %zu bytes of %s\n", want, path); exit(2); }
    fclose(f);
    return p;
}

static void write_file(const char* dir, const char* name, const void* p, size_t n) {
    char path[4200];
    FILE* f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

#define EXIT_NO_GPU 3

/* The first device's primary context made current, and a stream on it; exit EXIT_NO_GPU, with
 * why, where there is no driver or no device. */
static CUstream start_cuda(CUdevice* dev) {
    CUcontext ctx;
    CUstream stream;
    CUresult r;
    int count = 0;
    const char* why = cudattn_load_driver();
    if (why) {
        fprintf(stderr, "%s\n", why);
        exit(EXIT_NO_GPU);
    }
    r = cuInit(0);
    if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && cuDeviceGetCount(&count) == CUDA_SUCCESS && count == 0)) {
        fprintf(stderr, "no CUDA device: the NVIDIA driver sees no GPU\n");
        exit(EXIT_NO_GPU);
    }
    CK(r);
    CK(cuDeviceGet(dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, *dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    return stream;
}

/* OK or FAIL for a check; the exit status to return. */
static int verdict(double worst, double bound) {
    const int ok = worst <= bound; /* false for NaN */
    printf(ok ? "OK\n" : "FAIL\n");
    return ok ? 0 : 1;
}

/* Unloads the handle's modules and lets the stream and the context go. */
static void finish(cudattn_handle* h, CUstream stream, CUdevice dev) {
    cudattn_close(h);
    cuStreamDestroy(stream);
    cuDevicePrimaryCtxRelease(dev);
}

typedef struct { int capacity, page_size, max_pages, num_pages, seqlen_new, num_splits; } decode_t;

/* Decode: Sq tokens against a KV cache (contiguous, or paged when page_size > 0), seqlen_new keys
 * appended in place first. Self-check on random data, or --io files (see the top). */
static int run_decode(const char* dir, const char* io, shape_t s, decode_t d) {
    CUdevice dev;
    CUstream stream;
    cudattn_handle h;
    cudattn_decode_args a = cudattn_decode_defaults();
    cudattn_status st;
    const size_t nq = (size_t)s.B * s.Sq * s.Hq * s.D, row = (size_t)s.Hkv * s.D;
    size_t ncache, nnew, ws_bytes;
    void *hq, *hkc, *hvc, *hkn = NULL, *hvn = NULL, *ho = malloc(nq * 2);
    int *lens, *table = NULL, b, j;
    float* hlse = (float*)malloc((size_t)s.B * s.Hq * s.Sq * 4);
    CUdeviceptr dq, dkc, dvc, dkn = 0, dvn = 0, dout, dlse, dlens, dtable = 0, ws = 0;
    uint32_t seed = 4321;
    if (d.page_size > 0) {
        if (!io) { d.max_pages = (d.capacity + d.page_size - 1) / d.page_size; d.num_pages = s.B * d.max_pages; }
        d.capacity = d.page_size * d.max_pages;
        ncache = (size_t)d.num_pages * d.page_size * row;
    } else {
        ncache = (size_t)s.B * d.capacity * row;
    }
    nnew = (size_t)s.B * d.seqlen_new * row;
    if (io) {
        hq = read_file(io, "q.bin", nq * 2);
        hkc = read_file(io, "k_cache.bin", ncache * 2);
        hvc = read_file(io, "v_cache.bin", ncache * 2);
        lens = (int*)read_file(io, "seqlens.bin", (size_t)s.B * 4);
        if (d.page_size > 0) table = (int*)read_file(io, "block_table.bin", (size_t)s.B * d.max_pages * 4);
        if (d.seqlen_new) { hkn = read_file(io, "k_new.bin", nnew * 2); hvn = read_file(io, "v_new.bin", nnew * 2); }
    } else {
        hq = malloc(nq * 2); hkc = malloc(ncache * 2); hvc = malloc(ncache * 2);
        fill_random(s.dtype, hq, nq, &seed);
        fill_random(s.dtype, hkc, ncache, &seed);
        fill_random(s.dtype, hvc, ncache, &seed);
        lens = (int*)malloc((size_t)s.B * 4);
        for (b = 0; b < s.B; ++b) {
            lens[b] = d.capacity - d.seqlen_new - (b % 5) * 7;
            if (lens[b] < 0) lens[b] = 0;
        }
        if (d.page_size > 0) { /* pages handed out in reverse order */
            table = (int*)malloc((size_t)s.B * d.max_pages * 4);
            for (j = 0; j < s.B * d.max_pages; ++j) table[j] = d.num_pages - 1 - j;
        }
        if (d.seqlen_new) {
            hkn = malloc(nnew * 2); hvn = malloc(nnew * 2);
            fill_random(s.dtype, hkn, nnew, &seed);
            fill_random(s.dtype, hvn, nnew, &seed);
        }
    }
    stream = start_cuda(&dev);
    CK(cuMemAlloc(&dq, nq * 2)); CK(cuMemcpyHtoD(dq, hq, nq * 2));
    CK(cuMemAlloc(&dkc, ncache * 2)); CK(cuMemcpyHtoD(dkc, hkc, ncache * 2));
    CK(cuMemAlloc(&dvc, ncache * 2)); CK(cuMemcpyHtoD(dvc, hvc, ncache * 2));
    CK(cuMemAlloc(&dlens, (size_t)s.B * 4)); CK(cuMemcpyHtoD(dlens, lens, (size_t)s.B * 4));
    if (table) { CK(cuMemAlloc(&dtable, (size_t)s.B * d.max_pages * 4)); CK(cuMemcpyHtoD(dtable, table, (size_t)s.B * d.max_pages * 4)); }
    if (d.seqlen_new) {
        CK(cuMemAlloc(&dkn, nnew * 2)); CK(cuMemcpyHtoD(dkn, hkn, nnew * 2));
        CK(cuMemAlloc(&dvn, nnew * 2)); CK(cuMemcpyHtoD(dvn, hvn, nnew * 2));
    }
    CK(cuMemAlloc(&dout, nq * 2)); CK(cuMemsetD8(dout, 0xff, nq * 2));
    CK(cuMemAlloc(&dlse, (size_t)s.B * s.Hq * s.Sq * 4)); CK(cuMemsetD8(dlse, 0xff, (size_t)s.B * s.Hq * s.Sq * 4));
    if ((st = cudattn_open(&h, dir, dev)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_open: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    a.dtype = s.dtype;
    a.batch = s.B; a.seqlen_q = s.Sq; a.heads_q = s.Hq; a.heads_kv = s.Hkv; a.head_dim = s.D;
    a.q.ptr = dq; a.q.stride_b = (long long)s.Sq * s.Hq * s.D; a.q.stride_s = (long long)s.Hq * s.D; a.q.stride_h = s.D;
    a.o = a.q; a.o.ptr = dout;
    a.lse = dlse;
    a.k_cache.ptr = dkc;
    a.k_cache.stride_b = (long long)(d.page_size > 0 ? d.page_size : d.capacity) * (long long)row;
    a.k_cache.stride_s = (long long)row; a.k_cache.stride_h = s.D;
    a.v_cache = a.k_cache; a.v_cache.ptr = dvc;
    a.capacity = d.capacity;
    a.block_table = dtable; a.page_size = d.page_size; a.max_pages = d.max_pages; a.num_pages = d.num_pages;
    a.cache_seqlens = dlens;
    if (d.seqlen_new) {
        a.k_new.ptr = dkn; a.k_new.stride_b = (long long)d.seqlen_new * row; a.k_new.stride_s = (long long)row;
        a.k_new.stride_h = s.D;
        a.v_new = a.k_new; a.v_new.ptr = dvn;
        a.seqlen_new = d.seqlen_new;
    }
    a.causal = s.causal;
    a.num_splits = d.num_splits;
    ws_bytes = cudattn_decode_workspace_bytes(&h, &a);
    if (ws_bytes == (size_t)-1) { fprintf(stderr, "cudattn_decode_workspace_bytes: %s\n", cudattn_message(&h)); return 1; }
    if (ws_bytes) CK(cuMemAlloc(&ws, ws_bytes));
    a.workspace = ws; a.workspace_bytes = ws_bytes;
    if ((st = cudattn_decode(&h, &a, stream)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_decode: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    CK(cuStreamSynchronize(stream));
    CK(cuMemcpyDtoH(ho, dout, nq * 2));
    CK(cuMemcpyDtoH(hlse, dlse, (size_t)s.B * s.Hq * s.Sq * 4));
    if (io) {
        void *kc = malloc(ncache * 2), *vc = malloc(ncache * 2);
        CK(cuMemcpyDtoH(kc, dkc, ncache * 2));
        CK(cuMemcpyDtoH(vc, dvc, ncache * 2));
        write_file(io, "out.bin", ho, nq * 2);
        write_file(io, "lse.bin", hlse, (size_t)s.B * s.Hq * s.Sq * 4);
        write_file(io, "k_cache.out.bin", kc, ncache * 2);
        write_file(io, "v_cache.out.bin", vc, ncache * 2);
        printf("wrote %s/out.bin, lse.bin and the caches\n", io);
        free(kc); free(vc);
    } else {
        const double rel = s.dtype == CUDATTN_BFLOAT16 ? 0.02 : 0.005;
        const cache_t c = {hkc, hvc, table, d.page_size > 0 ? d.page_size : d.capacity, d.max_pages > 0 ? d.max_pages : 1};
        double worst, peak;
        int t;
        for (b = 0; b < s.B; ++b) /* the append, on the host copies, then the lengths it leaves */
            for (t = 0; t < d.seqlen_new; ++t) {
                const size_t dst = cache_row(&c, b, lens[b] + t) * row * 2, src = ((size_t)b * d.seqlen_new + t) * row * 2;
                memcpy((char*)hkc + dst, (char*)hkn + src, row * 2);
                memcpy((char*)hvc + dst, (char*)hvn + src, row * 2);
            }
        for (b = 0; b < s.B; ++b) lens[b] += d.seqlen_new;
        compare(&s, s.dtype, ho, hq, &c, lens, &worst, &peak);
        printf("decode %s B=%d Sq=%d capacity=%d Hq=%d Hkv=%d D=%d causal=%d %s, %d appended on %s: max |out - ref| = "
               "%.3g (bound %.3g)\n", s.dtype == CUDATTN_BFLOAT16 ? "bf16" : "f16", s.B, s.Sq, d.capacity, s.Hq, s.Hkv,
               s.D, s.causal, d.page_size > 0 ? "paged" : "contiguous", d.seqlen_new, h.arch, worst, rel * peak + 1e-3);
        finish(&h, stream, dev);
        return verdict(worst, rel * peak + 1e-3);
    }
    finish(&h, stream, dev);
    return 0;
}

/* Merge: with --io, N parts from files merged as they are; otherwise one random (non-causal)
 * problem attended in two halves of its keys (two prefill calls writing their LSEs) and merged,
 * checked against the float64 attention over all keys. */
static int run_merge(const char* dir, const char* io, shape_t s, int nparts) {
    CUdevice dev;
    CUstream stream;
    cudattn_handle h;
    cudattn_merge_args m;
    cudattn_status st;
    const size_t it = item_of(s.dtype), no = (size_t)s.B * s.Sq * s.Hq * s.D, nl = (size_t)s.B * s.Hq * s.Sq;
    void *hq = NULL, *hk = NULL, *hv = NULL, *ho = malloc(no * it);
    float* hl = (float*)malloc(nl * 4);
    CUdeviceptr dparts, dlparts, dout, dlse;
    uint32_t seed = 777;
    int part;
    if (!io) nparts = 2;
    stream = start_cuda(&dev);
    if ((st = cudattn_open(&h, dir, dev)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_open: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    CK(cuMemAlloc(&dparts, nparts * no * it));
    CK(cuMemAlloc(&dlparts, nparts * nl * 4));
    if (io) {
        void* op = read_file(io, "o_parts.bin", nparts * no * it);
        void* lp = read_file(io, "lse_parts.bin", nparts * nl * 4);
        CK(cuMemcpyHtoD(dparts, op, nparts * no * it));
        CK(cuMemcpyHtoD(dlparts, lp, nparts * nl * 4));
        free(op); free(lp);
    } else { /* the parts: attention over keys [0, Sk/2) and [Sk/2, Sk) */
        const size_t nq = no, nk = (size_t)s.B * s.Sk * s.Hkv * s.D, half = (size_t)(s.Sk / 2);
        CUdeviceptr dq, dk, dv;
        hq = malloc(nq * it); hk = malloc(nk * it); hv = malloc(nk * it);
        fill_random(s.dtype, hq, nq, &seed);
        fill_random(s.dtype, hk, nk, &seed);
        fill_random(s.dtype, hv, nk, &seed);
        CK(cuMemAlloc(&dq, nq * it)); CK(cuMemcpyHtoD(dq, hq, nq * it));
        CK(cuMemAlloc(&dk, nk * it)); CK(cuMemcpyHtoD(dk, hk, nk * it));
        CK(cuMemAlloc(&dv, nk * it)); CK(cuMemcpyHtoD(dv, hv, nk * it));
        for (part = 0; part < 2; ++part) {
            cudattn_prefill_args a = cudattn_prefill_defaults();
            const size_t first = part ? half : 0;
            a.dtype = s.dtype;
            a.batch = s.B; a.seqlen_q = s.Sq; a.seqlen_k = (int)(part ? (size_t)s.Sk - half : half);
            a.heads_q = s.Hq; a.heads_kv = s.Hkv; a.head_dim = s.D;
            a.q.ptr = dq; a.q.stride_b = (long long)s.Sq * s.Hq * s.D; a.q.stride_s = (long long)s.Hq * s.D; a.q.stride_h = s.D;
            a.k.ptr = dk + first * s.Hkv * s.D * it;
            a.k.stride_b = (long long)s.Sk * s.Hkv * s.D; a.k.stride_s = (long long)s.Hkv * s.D; a.k.stride_h = s.D;
            a.v = a.k; a.v.ptr = dv + first * s.Hkv * s.D * it;
            a.o = a.q; a.o.ptr = dparts + part * no * it;
            a.lse = dlparts + part * nl * 4;
            if ((st = cudattn_prefill(&h, &a, stream)) != CUDATTN_OK) {
                fprintf(stderr, "cudattn_prefill: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
                return 1;
            }
        }
    }
    CK(cuMemAlloc(&dout, no * it)); CK(cuMemsetD8(dout, 0xff, no * it));
    CK(cuMemAlloc(&dlse, nl * 4)); CK(cuMemsetD8(dlse, 0xff, nl * 4));
    memset(&m, 0, sizeof m);
    m.dtype = s.dtype; m.num_parts = nparts; m.batch = s.B; m.seqlen_q = s.Sq; m.heads = s.Hq; m.head_dim = s.D;
    m.o_parts = dparts; m.lse_parts = dlparts;
    m.o_part_stride = (long long)no; m.lse_part_stride = (long long)nl;
    m.in_stride_b = (long long)s.Sq * s.Hq * s.D; m.in_stride_s = (long long)s.Hq * s.D; m.in_stride_h = s.D;
    m.lse_stride_b = (long long)s.Hq * s.Sq; m.lse_stride_h = s.Sq; m.lse_stride_s = 1;
    m.o.ptr = dout; m.o.stride_b = m.in_stride_b; m.o.stride_s = m.in_stride_s; m.o.stride_h = m.in_stride_h;
    m.lse = dlse;
    if ((st = cudattn_merge(&h, &m, stream)) != CUDATTN_OK) {
        fprintf(stderr, "cudattn_merge: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
        return 1;
    }
    CK(cuStreamSynchronize(stream));
    CK(cuMemcpyDtoH(ho, dout, no * it));
    CK(cuMemcpyDtoH(hl, dlse, nl * 4));
    if (io) {
        write_file(io, "out.bin", ho, no * it);
        write_file(io, "lse.bin", hl, nl * 4);
        printf("wrote %s/out.bin and %s/lse.bin\n", io, io);
    } else {
        const double rel = s.dtype == CUDATTN_BFLOAT16 ? 0.02 : 0.005;
        const cache_t c = {hk, hv, NULL, s.Sk, 1};
        double worst, peak;
        compare(&s, s.dtype, ho, hq, &c, NULL, &worst, &peak);
        printf("merge of two halves of %d keys: %s B=%d Sq=%d Hq=%d Hkv=%d D=%d on %s: max |out - ref| = %.3g "
               "(bound %.3g)\n", s.Sk, s.dtype == CUDATTN_BFLOAT16 ? "bf16" : "f16", s.B, s.Sq, s.Hq, s.Hkv, s.D, h.arch,
               worst, rel * peak + 1e-3);
        finish(&h, stream, dev);
        return verdict(worst, rel * peak + 1e-3);
    }
    finish(&h, stream, dev);
    return 0;
}

int main(int argc, char** argv) {
    shape_t s = {CUDATTN_FLOAT16, -1, 2, 333, 333, 8, 2, 128, 0, 1.0, 1.0, 1.0, 0};
    decode_t dc = {0, 0, 0, 0, 2, 0};
    const char *dir = NULL, *io = NULL;
    int i, decode = 0, merge = 0, nparts = 0;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--causal")) s.causal = 1;
        else if (!strcmp(argv[i], "--portable")) s.family = 80;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--merge")) merge = 1;
        else if (!strcmp(argv[i], "--paged") && i + 1 < argc) dc.page_size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) dc.seqlen_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) dc.num_splits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char* t = argv[++i];
            s.dtype = !strcmp(t, "bf16") ? CUDATTN_BFLOAT16 : !strcmp(t, "e4m3") ? CUDATTN_E4M3 : CUDATTN_FLOAT16;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d,%d,%d,%d,%d", &s.B, &s.Sq, &s.Sk, &s.Hq, &s.Hkv, &s.D) != 6) {
                fprintf(stderr, "--shape takes B,Sq,Sk,Hq,Hkv,D\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--io") && i + 1 < argc) io = argv[++i];
        else if (!dir && argv[i][0] != '-') dir = argv[i];
        else { fprintf(stderr, "usage: %s EXPORT_DIR [--dtype f16|bf16|e4m3] [--causal] [--shape B,Sq,Sk,Hq,Hkv,D] [--portable] [--io DIR]\n", argv[0]); return 2; }
    }
    if (!dir) { fprintf(stderr, "usage: %s EXPORT_DIR ...\n", argv[0]); return 2; }
    if (io) {
        FILE* f;
        char path[4200], mode[16] = "";
        int ok;
        snprintf(path, sizeof path, "%s/args.txt", io);
        f = fopen(path, "r");
        ok = f && fscanf(f, "%15s", mode) == 1;
        decode = ok && !strcmp(mode, "decode");
        if (ok && !strcmp(mode, "prefill"))
            ok = fscanf(f, "%d %d %d %d %d %d %d %d %d %lf %lf %lf %d", &s.dtype, &s.out_dtype, &s.B, &s.Sq, &s.Sk,
                        &s.Hq, &s.Hkv, &s.D, &s.causal, &s.qd, &s.kd, &s.vd, &s.family) == 13;
        else if (ok && !strcmp(mode, "merge")) {
            merge = 1;
            ok = fscanf(f, "%d %d %d %d %d %d", &s.dtype, &nparts, &s.B, &s.Sq, &s.Hq, &s.D) == 6;
            s.Hkv = s.Hq;
        } else if (decode)
            ok = fscanf(f, "%d %d %d %d %d %d %d %d %d %d %d %d %d", &s.dtype, &s.B, &s.Sq, &s.Hq, &s.Hkv, &s.D,
                        &s.causal, &dc.capacity, &dc.page_size, &dc.max_pages, &dc.num_pages, &dc.seqlen_new,
                        &dc.num_splits) == 13;
        else
            ok = 0;
        if (f) fclose(f);
        if (!ok) {
            fprintf(stderr, "bad %s\n", path);
            return 2;
        }
    }
    if (merge) return run_merge(dir, io, s, nparts);
    if (decode) {
        if (!io) dc.capacity = s.Sk;
        return run_decode(dir, io, s, dc);
    }
    if (!io && s.dtype == CUDATTN_E4M3) {
        s.qd = 0.5; s.kd = 0.25; s.vd = 2.0; /* scalar descales, so that they are exercised */
    }

    {
        CUdevice dev;
        CUstream stream;
        cudattn_handle h;
        cudattn_prefill_args a = cudattn_prefill_defaults();
        cudattn_status st;
        const size_t it = item_of(s.dtype), nq = (size_t)s.B * s.Sq * s.Hq * s.D, nk = (size_t)s.B * s.Sk * s.Hkv * s.D;
        const int out_dtype = s.out_dtype >= 0 ? s.out_dtype : s.dtype == CUDATTN_E4M3 ? CUDATTN_BFLOAT16 : s.dtype;
        const size_t ot = item_of(out_dtype), nlse = (size_t)s.B * s.Hq * s.Sq;
        void *hq, *hk, *hv, *ho = malloc(nq * ot);
        float* hlse = (float*)malloc(nlse * sizeof(float));
        CUdeviceptr dq, dk, dv, dout, dlse, ws = 0;
        uint32_t seed = 1234;
        if (io) {
            hq = read_file(io, "q.bin", nq * it);
            hk = read_file(io, "k.bin", nk * it);
            hv = read_file(io, "v.bin", nk * it);
        } else {
            hq = malloc(nq * it); hk = malloc(nk * it); hv = malloc(nk * it);
            fill_random(s.dtype, hq, nq, &seed);
            fill_random(s.dtype, hk, nk, &seed);
            fill_random(s.dtype, hv, nk, &seed);
        }
        stream = start_cuda(&dev);
        CK(cuMemAlloc(&dq, nq * it));
        CK(cuMemAlloc(&dk, nk * it));
        CK(cuMemAlloc(&dv, nk * it));
        CK(cuMemAlloc(&dout, nq * ot));
        CK(cuMemAlloc(&dlse, nlse * sizeof(float)));
        CK(cuMemcpyHtoD(dq, hq, nq * it));
        CK(cuMemcpyHtoD(dk, hk, nk * it));
        CK(cuMemcpyHtoD(dv, hv, nk * it));
        CK(cuMemsetD8(dout, 0xff, nq * ot)); /* poison: NaN in every float format */
        CK(cuMemsetD8(dlse, 0xff, nlse * sizeof(float)));

        if ((st = cudattn_open(&h, dir, dev)) != CUDATTN_OK) {
            fprintf(stderr, "cudattn_open: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
            return 1;
        }
        a.dtype = s.dtype;
        a.out_dtype = out_dtype;
        a.batch = s.B; a.seqlen_q = s.Sq; a.seqlen_k = s.Sk; a.heads_q = s.Hq; a.heads_kv = s.Hkv; a.head_dim = s.D;
        a.q.ptr = dq; a.q.stride_b = (long long)s.Sq * s.Hq * s.D; a.q.stride_s = (long long)s.Hq * s.D; a.q.stride_h = s.D;
        a.k.ptr = dk; a.k.stride_b = (long long)s.Sk * s.Hkv * s.D; a.k.stride_s = (long long)s.Hkv * s.D; a.k.stride_h = s.D;
        a.v = a.k; a.v.ptr = dv;
        a.o = a.q; a.o.ptr = dout;
        a.lse = dlse;
        a.causal = s.causal;
        a.family = s.family;
        a.q_descale = s.qd; a.k_descale = s.kd; a.v_descale = s.vd;
        if (io && s.dtype == CUDATTN_E4M3) { /* optional (B, Hkv) float32 descale arrays */
            const char* names[3] = {"q_descale.bin", "k_descale.bin", "v_descale.bin"};
            CUdeviceptr* ptrs[3] = {&a.q_descale_ptr, &a.k_descale_ptr, &a.v_descale_ptr};
            int t;
            for (t = 0; t < 3; ++t) {
                char path[4200];
                FILE* f;
                snprintf(path, sizeof path, "%s/%s", io, names[t]);
                if ((f = fopen(path, "rb")) != NULL) {
                    void* x;
                    fclose(f);
                    x = read_file(io, names[t], (size_t)s.B * s.Hkv * 4);
                    CK(cuMemAlloc(ptrs[t], (size_t)s.B * s.Hkv * 4));
                    CK(cuMemcpyHtoD(*ptrs[t], x, (size_t)s.B * s.Hkv * 4));
                    free(x);
                }
            }
        }
        a.workspace_bytes = cudattn_prefill_workspace_bytes(&a);
        if (a.workspace_bytes) CK(cuMemAlloc(&ws, a.workspace_bytes));
        a.workspace = ws;
        if ((st = cudattn_prefill(&h, &a, stream)) != CUDATTN_OK) {
            fprintf(stderr, "cudattn_prefill: %s: %s\n", cudattn_status_string(st), cudattn_message(&h));
            return 1;
        }
        CK(cuStreamSynchronize(stream));
        CK(cuMemcpyDtoH(ho, dout, nq * ot));
        CK(cuMemcpyDtoH(hlse, dlse, nlse * sizeof(float)));
        if (io) {
            write_file(io, "out.bin", ho, nq * ot);
            write_file(io, "lse.bin", hlse, nlse * sizeof(float));
            printf("wrote %s/out.bin and %s/lse.bin\n", io, io);
        } else {
            /* Check batch 0 (and the last) against float64; bound: the output's rounding and, for FP8, P in e4m3. */
            const double rel = s.dtype == CUDATTN_E4M3 ? 0.06 : s.dtype == CUDATTN_BFLOAT16 ? 0.02 : 0.005;
            const cache_t c = {hk, hv, NULL, s.Sk, 1};
            double worst, peak;
            compare(&s, out_dtype, ho, hq, &c, NULL, &worst, &peak);
            printf("%s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d causal=%d on %s%s: max |out - ref| = %.3g (bound %.3g)\n",
                   s.dtype == CUDATTN_E4M3 ? "e4m3" : s.dtype == CUDATTN_BFLOAT16 ? "bf16" : "f16", s.B, s.Sq,
                   s.Sk, s.Hq, s.Hkv, s.D, s.causal, h.arch, s.family == 80 ? " (portable kernel)" : "", worst,
                   rel * peak + 1e-3);
            if (verdict(worst, rel * peak + 1e-3)) return 1;
        }
        cudattn_close(&h);
        free(hq); free(hk); free(hv); free(ho); free(hlse);
        cuMemFree(dq); cuMemFree(dk); cuMemFree(dv); cuMemFree(dout); cuMemFree(dlse);
        if (ws) cuMemFree(ws);
        cuStreamDestroy(stream);
        cuDevicePrimaryCtxRelease(dev);
    }
    return 0;
}
