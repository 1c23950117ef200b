/* cudattn from C: attention on random inputs through the exported kernels, checked against a
 * float64 CPU reference. Needs only the export and libcuda:
 *
 *     python -m cudattn export --out cudattn_kernels
 *     cc -std=c11 -O2 -I cudattn_kernels/include -I "$CUDA_INCLUDE" cudattn_kernels/examples/attention.c -lcuda -lm -o attention
 *     ./attention cudattn_kernels [--dtype f16|bf16|e4m3] [--causal] [--shape B,Sq,Sk,Hq,Hkv,D] [--portable]
 *
 * ($CUDA_INCLUDE: a directory holding cuda.h, e.g. the nvidia/cu13/include of the CUDA pip wheels.)
 * With --io DIR it reads DIR/args.txt ("dtype out_dtype B Sq Sk Hq Hkv D causal qd kd vd": dtype codes of
 * cudattn.h, out_dtype -1 for the default, the three FP8 descales 1 for 16-bit inputs, then the family:
 * 0 automatic, 80 the portable kernel)
 * and DIR/{q,k,v}.bin (contiguous (B, S, H, D) element bytes) instead of making inputs, and
 * writes DIR/out.bin (the output dtype's bytes) and DIR/lse.bin (float32), unchecked: the tests
 * compare those with the Python path's. Exit status 0 when the check passes.
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
static void reference(const shape_t* s, const void* q, const void* k, const void* v, int b, double* out) {
    const double scale = 1.0 / sqrt((double)s->D);
    double* w = (double*)malloc(sizeof(double) * (size_t)(s->Sk > 0 ? s->Sk : 1));
    int h, i, j, d;
    for (h = 0; h < s->Hq; ++h) {
        const int hk = h / (s->Hq / s->Hkv);
        for (i = 0; i < s->Sq; ++i) {
            double mx = -INFINITY, sum = 0;
            for (j = 0; j < s->Sk; ++j) {
                double dot = 0;
                if (s->causal && j > i + s->Sk - s->Sq) { w[j] = -INFINITY; continue; }
                for (d = 0; d < s->D; ++d)
                    dot += to_double(s->dtype, q, (((size_t)b * s->Sq + i) * s->Hq + h) * s->D + d) * s->qd *
                           to_double(s->dtype, k, (((size_t)b * s->Sk + j) * s->Hkv + hk) * s->D + d) * s->kd;
                w[j] = dot * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (j = 0; j < s->Sk; ++j) { w[j] = w[j] == -INFINITY ? 0 : exp(w[j] - mx); sum += w[j]; }
            for (d = 0; d < s->D; ++d) {
                double acc = 0;
                for (j = 0; j < s->Sk; ++j)
                    acc += w[j] * to_double(s->dtype, v, (((size_t)b * s->Sk + j) * s->Hkv + hk) * s->D + d) * s->vd;
                out[((size_t)i * s->Hq + h) * s->D + d] = sum > 0 ? acc / sum : 0;
            }
        }
    }
    free(w);
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

int main(int argc, char** argv) {
    shape_t s = {CUDATTN_FLOAT16, -1, 2, 333, 333, 8, 2, 128, 0, 1.0, 1.0, 1.0, 0};
    const char *dir = NULL, *io = NULL;
    int i;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--causal")) s.causal = 1;
        else if (!strcmp(argv[i], "--portable")) s.family = 80;
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
        char path[4200];
        snprintf(path, sizeof path, "%s/args.txt", io);
        f = fopen(path, "r");
        if (!f || fscanf(f, "%d %d %d %d %d %d %d %d %d %lf %lf %lf %d", &s.dtype, &s.out_dtype, &s.B, &s.Sq, &s.Sk,
                         &s.Hq, &s.Hkv, &s.D, &s.causal, &s.qd, &s.kd, &s.vd, &s.family) != 13) {
            fprintf(stderr, "bad %s\n", path);
            return 2;
        }
        fclose(f);
    } else if (s.dtype == CUDATTN_E4M3) {
        s.qd = 0.5; s.kd = 0.25; s.vd = 2.0; /* scalar descales, so that they are exercised */
    }

    {
        CUdevice dev;
        CUcontext ctx;
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
        CK(cuInit(0));
        CK(cuDeviceGet(&dev, 0));
        CK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CK(cuCtxSetCurrent(ctx));
        CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
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
            double* ref = (double*)malloc(sizeof(double) * (size_t)s.Sq * s.Hq * s.D);
            double worst = 0, peak = 0;
            int bs[2] = {0, s.B - 1}, nb = s.B > 1 ? 2 : 1, bi;
            size_t e, n = (size_t)s.Sq * s.Hq * s.D;
            for (bi = 0; bi < nb; ++bi) {
                reference(&s, hq, hk, hv, bs[bi], ref);
                for (e = 0; e < n; ++e) {
                    const double got = to_double(out_dtype, ho, (size_t)bs[bi] * n + e);
                    const double d = fabs(got - ref[e]);
                    if (!(d <= worst)) worst = d; /* NaN sticks */
                    if (fabs(ref[e]) > peak) peak = fabs(ref[e]);
                }
            }
            printf("%s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d causal=%d on %s%s: max |out - ref| = %.3g (bound %.3g)\n",
                   s.dtype == CUDATTN_E4M3 ? "e4m3" : s.dtype == CUDATTN_BFLOAT16 ? "bf16" : "f16", s.B, s.Sq,
                   s.Sk, s.Hq, s.Hkv, s.D, s.causal, h.arch, s.family == 80 ? " (portable kernel)" : "", worst,
                   rel * peak + 1e-3);
            if (!(worst <= rel * peak + 1e-3)) { printf("FAIL\n"); return 1; }
            printf("OK\n");
            free(ref);
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
