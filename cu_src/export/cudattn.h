/* cudattn.h: launch cudattn's exported kernels from C or C++, with only the CUDA driver API.
 *
 * Header-only. `python -m cudattn export --out DIR` writes the cubins, DIR/include/cudattn.h (this
 * file), cudattn_params.h (the kernels' parameter structs) and cudattn_kernels.h (which cubin
 * serves which call: the Python path's choice). Build with -I DIR/include and the CUDA headers
 * (`python -m cudattn export --print-cflags --out DIR` prints both), link with -ldl: libcuda is
 * loaded at run time (see "The driver" below), so nothing of the NVIDIA driver is needed to build.
 *
 *     cudattn_handle h;                     // one per device; its context must be current
 *     cudattn_open(&h, "DIR", device);
 *     cudattn_prefill_args a = cudattn_prefill_defaults();
 *     ... fill a (shapes, pointers, element strides) ...
 *     cudattn_status s = cudattn_prefill(&h, &a, stream);
 *     if (s) fprintf(stderr, "%s: %s\n", cudattn_status_string(s), cudattn_message(&h));
 *     cudattn_close(&h);
 *
 * Nothing is allocated behind the caller's back: FP8 needs a workspace for V transposed, of
 * cudattn_prefill_workspace_bytes(&a) bytes, and a split decode one for its partials, of
 * cudattn_decode_workspace_bytes(&h, &a), passed in the arguments. Every call is asynchronous on
 * the caller's stream. A handle belongs to the context current at cudattn_open, and every call
 * checks that it is current. Kernels load on first use; cudattn_preload loads them all at once,
 * after which calls only read the handle (safe from several threads, and inside a CUDA graph
 * capture). Calls choose the cubin the Python path would for the same kernel, but
 * cudattn_prefill never hands calls of up to 16 query tokens to the decode kernel as
 * cudattn.attention does: call cudattn_decode for those.
 * Served: prefill (float16, bfloat16, FP8 e4m3 with descales; both kernel families) and split-KV
 * decode against contiguous or paged KV caches (float16, bfloat16), with new keys appended in
 * place first; the merge of attention states over disjoint key sets; the backward pass (float16,
 * bfloat16, head_dim up to 256; windows, softcap, ALiBi and sinks; cudattn_backward.h, included
 * below), with a workspace of cudattn_backward_workspace_bytes(&h, &a).
 */
#ifndef CUDATTN_H
#define CUDATTN_H

#include <cuda.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudattn_kernels.h"
#include "cudattn_params.h"

#if CUDATTN_KERNELS_FORMAT != CUDATTN_EXPORT_FORMAT
#error "cudattn_kernels.h and cudattn_params.h come from different exports"
#endif

#if defined(_WIN32) && !defined(CUDATTN_LINK_CUDA)
#define CUDATTN_LINK_CUDA /* no dlopen on Windows: link with cuda.lib */
#endif
#ifndef CUDATTN_LINK_CUDA
#include <dlfcn.h>
#include <stddef.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ the driver
 *
 * libcuda.so.1 comes with the NVIDIA driver, not with the CUDA toolkit or the pip wheels, so
 * where no driver is installed `-lcuda` cannot link. cudattn.h therefore loads it at run time,
 * dlopen("libcuda.so.1") on first use, and calls the functions CUDATTN_DRIVER_FUNCTIONS lists
 * through pointers; after this header those names mean the pointers in the including file too,
 * so a program calls cuInit, cuMemAlloc... as usual and links with -ldl only. Without a
 * driver, cuInit returns CUDA_ERROR_NO_DEVICE and cuGetErrorString says why (the others may
 * not be called then: they print that and abort). cudattn_load_driver() loads it explicitly
 * and says why it could not; cudattn_driver_symbol() finds any other driver function. Load it
 * once before starting threads. Define CUDATTN_LINK_CUDA before the include to call libcuda
 * directly instead (then link with -lcuda).
 */
#define CUDATTN_DRIVER_FUNCTIONS(X)                                                                       \
    X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetCount)                  \
    X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) \
    X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuStreamCreate) X(cuStreamDestroy)       \
    X(cuStreamSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH)                   \
    X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemsetD32Async)     \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)                  \
    X(cuLaunchKernel) X(cuTensorMapEncodeTiled)

#ifdef CUDATTN_LINK_CUDA
static inline const char* cudattn_load_driver(void) { return NULL; }
#else
#ifdef __cplusplus
#define CUDATTN__PFN(f) decltype(&f)
#else
#define CUDATTN__PFN(f) __typeof__(&f)
#endif
#define CUDATTN__STR(x) #x
#define CUDATTN__XSTR(x) CUDATTN__STR(x) /* the name cuda.h maps to: cuMemAlloc -> "cuMemAlloc_v2" */
#define CUDATTN__FIELD(f) CUDATTN__PFN(f) p_##f;
#define CUDATTN__SYMBOL(f) {CUDATTN__XSTR(f), offsetof(cudattn__driver_table, p_##f)},

typedef struct cudattn__driver_table {
    int state; /* 0 not tried, 1 loaded, -1 failed (why says why) */
    void* library;
    CUDATTN_DRIVER_FUNCTIONS(CUDATTN__FIELD)
    char why[600];
} cudattn__driver_table;

static cudattn__driver_table cudattn__driver; /* one per file that includes this header */

/* Loads libcuda.so.1 (once; later calls return the first outcome): NULL when loaded, else why not. */
static inline const char* cudattn_load_driver(void) {
    static const struct { const char* name; size_t offset; } symbols[] = {CUDATTN_DRIVER_FUNCTIONS(CUDATTN__SYMBOL)};
    cudattn__driver_table* d = &cudattn__driver;
    size_t i;
    if (d->state) return d->state > 0 ? NULL : d->why;
    d->state = -1;
    d->library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->library) {
        const char* e = dlerror();
        snprintf(d->why, sizeof d->why, "no CUDA driver: libcuda.so.1 could not be loaded (%s); it comes with the "
                 "NVIDIA driver, which must be installed to run kernels", e ? e : "?");
        return d->why;
    }
    for (i = 0; i < sizeof symbols / sizeof symbols[0]; ++i) {
        void* f = dlsym(d->library, symbols[i].name);
        if (!f) {
            snprintf(d->why, sizeof d->why, "the CUDA driver is too old: libcuda.so.1 has no %s, which the CUDA %d.%d "
                     "headers used to build this program call: update the NVIDIA driver", symbols[i].name,
                     CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
            dlclose(d->library);
            d->library = NULL;
            return d->why;
        }
        memcpy((char*)d + symbols[i].offset, &f, sizeof f); /* POSIX: data and function pointers agree */
    }
    d->state = 1;
    return NULL;
}

/* Any other function of the loaded driver by its exported name ("cuEventCreate"), or NULL. */
static inline void* cudattn_driver_symbol(const char* name) {
    return cudattn_load_driver() ? NULL : dlsym(cudattn__driver.library, name);
}

/* Without a driver, cuInit fails as it does on a machine with a driver and no GPU, and the error
 * strings say why. */
static inline CUresult CUDAAPI cudattn__no_init(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
static inline CUresult CUDAAPI cudattn__no_error_string(CUresult e, const char** s) {
    (void)e;
    *s = cudattn__driver.why;
    return CUDA_SUCCESS;
}
static inline CUresult CUDAAPI cudattn__no_error_name(CUresult e, const char** s) {
    *s = e == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}

/* The table, loaded on first use; without a driver, `required` functions abort with why. */
static inline cudattn__driver_table* cudattn__cu_fn(int required) {
    if (cudattn_load_driver()) {
        if (required) {
            fprintf(stderr, "cudattn.h: a CUDA driver function was called, but %s\n", cudattn__driver.why);
            abort();
        }
        cudattn__driver.p_cuInit = cudattn__no_init;
        cudattn__driver.p_cuGetErrorString = cudattn__no_error_string;
        cudattn__driver.p_cuGetErrorName = cudattn__no_error_name;
    }
    return &cudattn__driver;
}

/* From here on, in this header and in the file that includes it, the names are the pointers. */
#undef cuInit
#define cuInit (cudattn__cu_fn(0)->p_cuInit)
#undef cuGetErrorName
#define cuGetErrorName (cudattn__cu_fn(0)->p_cuGetErrorName)
#undef cuGetErrorString
#define cuGetErrorString (cudattn__cu_fn(0)->p_cuGetErrorString)
#undef cuDeviceGet
#define cuDeviceGet (cudattn__cu_fn(1)->p_cuDeviceGet)
#undef cuDeviceGetCount
#define cuDeviceGetCount (cudattn__cu_fn(1)->p_cuDeviceGetCount)
#undef cuDeviceGetAttribute
#define cuDeviceGetAttribute (cudattn__cu_fn(1)->p_cuDeviceGetAttribute)
#undef cuDevicePrimaryCtxRetain
#define cuDevicePrimaryCtxRetain (cudattn__cu_fn(1)->p_cuDevicePrimaryCtxRetain)
#undef cuDevicePrimaryCtxRelease
#define cuDevicePrimaryCtxRelease (cudattn__cu_fn(1)->p_cuDevicePrimaryCtxRelease)
#undef cuCtxSetCurrent
#define cuCtxSetCurrent (cudattn__cu_fn(1)->p_cuCtxSetCurrent)
#undef cuCtxGetCurrent
#define cuCtxGetCurrent (cudattn__cu_fn(1)->p_cuCtxGetCurrent)
#undef cuCtxGetDevice
#define cuCtxGetDevice (cudattn__cu_fn(1)->p_cuCtxGetDevice)
#undef cuCtxSynchronize
#define cuCtxSynchronize (cudattn__cu_fn(1)->p_cuCtxSynchronize)
#undef cuStreamCreate
#define cuStreamCreate (cudattn__cu_fn(1)->p_cuStreamCreate)
#undef cuStreamDestroy
#define cuStreamDestroy (cudattn__cu_fn(1)->p_cuStreamDestroy)
#undef cuStreamSynchronize
#define cuStreamSynchronize (cudattn__cu_fn(1)->p_cuStreamSynchronize)
#undef cuMemAlloc
#define cuMemAlloc (cudattn__cu_fn(1)->p_cuMemAlloc)
#undef cuMemFree
#define cuMemFree (cudattn__cu_fn(1)->p_cuMemFree)
#undef cuMemcpyHtoD
#define cuMemcpyHtoD (cudattn__cu_fn(1)->p_cuMemcpyHtoD)
#undef cuMemcpyDtoH
#define cuMemcpyDtoH (cudattn__cu_fn(1)->p_cuMemcpyDtoH)
#undef cuMemcpyHtoDAsync
#define cuMemcpyHtoDAsync (cudattn__cu_fn(1)->p_cuMemcpyHtoDAsync)
#undef cuMemcpyDtoHAsync
#define cuMemcpyDtoHAsync (cudattn__cu_fn(1)->p_cuMemcpyDtoHAsync)
#undef cuMemsetD8
#define cuMemsetD8 (cudattn__cu_fn(1)->p_cuMemsetD8)
#undef cuMemsetD8Async
#define cuMemsetD8Async (cudattn__cu_fn(1)->p_cuMemsetD8Async)
#undef cuMemsetD32Async
#define cuMemsetD32Async (cudattn__cu_fn(1)->p_cuMemsetD32Async)
#undef cuModuleLoadData
#define cuModuleLoadData (cudattn__cu_fn(1)->p_cuModuleLoadData)
#undef cuModuleUnload
#define cuModuleUnload (cudattn__cu_fn(1)->p_cuModuleUnload)
#undef cuModuleGetFunction
#define cuModuleGetFunction (cudattn__cu_fn(1)->p_cuModuleGetFunction)
#undef cuFuncSetAttribute
#define cuFuncSetAttribute (cudattn__cu_fn(1)->p_cuFuncSetAttribute)
#undef cuLaunchKernel
#define cuLaunchKernel (cudattn__cu_fn(1)->p_cuLaunchKernel)
#undef cuTensorMapEncodeTiled
#define cuTensorMapEncodeTiled (cudattn__cu_fn(1)->p_cuTensorMapEncodeTiled)
#endif /* CUDATTN_LINK_CUDA */

typedef enum cudattn_status {
    CUDATTN_OK = 0,
    CUDATTN_ERROR_INVALID_VALUE = 1, /* an argument breaks a rule; cudattn_message says which */
    CUDATTN_ERROR_NOT_SUPPORTED = 2, /* a valid call this export does not serve */
    CUDATTN_ERROR_CUDA = 3,          /* a driver call failed */
    CUDATTN_ERROR_EXPORT = 4         /* the export directory lacks a file, or another version wrote it */
} cudattn_status;

/* Element types (the codes of cudattn_kernels.h). */
enum { CUDATTN_FLOAT32 = 0, CUDATTN_FLOAT16 = 1, CUDATTN_BFLOAT16 = 2, CUDATTN_E4M3 = 3 };

#define CUDATTN_MAX_PATH 4096

typedef struct cudattn_handle {
    char dir[CUDATTN_MAX_PATH];
    char arch[8];
    CUdevice device;
    CUcontext context; /* current at cudattn_open: the modules load into it, every call runs in it */
    int sm_count, smem_optin, smem_per_sm, l2_bytes;
    CUmodule modules[CUDATTN_KERNEL_COUNT]; /* loaded on first use (once a cubin: see cudattn__function) */
    CUfunction functions[CUDATTN_KERNEL_COUNT];
    char message[512]; /* what the last failing call said */
} cudattn_handle;

/* One operand: device address and element strides of its (batch, seq, head) axes; the head-dim
 * axis is contiguous. "bshd" arrays of shape (B, S, H, D): strides (S*H*D, H*D, D). */
typedef struct cudattn_tensor {
    CUdeviceptr ptr;
    long long stride_b, stride_s, stride_h;
} cudattn_tensor;

typedef struct cudattn_prefill_args {
    int dtype;     /* of q, k, v: CUDATTN_FLOAT16, CUDATTN_BFLOAT16 or CUDATTN_E4M3 */
    int out_dtype; /* -1: the input dtype (16-bit) or bfloat16 (FP8); FP8 may also write float16, float32 */
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    cudattn_tensor q, k, v, o;
    CUdeviceptr lse; /* 0, or (batch, heads_q, seqlen_q) float32, contiguous: the natural-log LSE */
    int causal;      /* bottom right: query i sees key j iff j <= i + seqlen_k - seqlen_q */
    int has_scale;   /* 0: scale = 1/sqrt(head_dim) */
    double scale;
    /* FP8: each descale a scalar, times a (batch, heads_kv) float32 device array when its pointer is set */
    double q_descale, k_descale, v_descale;
    CUdeviceptr q_descale_ptr, k_descale_ptr, v_descale_ptr;
    CUdeviceptr workspace; /* FP8: cudattn_prefill_workspace_bytes() bytes, 16-byte aligned */
    size_t workspace_bytes;
    int family; /* 0: as the Python path chooses; 80: the portable kernel, on Hopper too */
} cudattn_prefill_args;

static inline const char* cudattn_status_string(cudattn_status s) {
    switch (s) {
    case CUDATTN_OK: return "CUDATTN_OK";
    case CUDATTN_ERROR_INVALID_VALUE: return "CUDATTN_ERROR_INVALID_VALUE";
    case CUDATTN_ERROR_NOT_SUPPORTED: return "CUDATTN_ERROR_NOT_SUPPORTED";
    case CUDATTN_ERROR_CUDA: return "CUDATTN_ERROR_CUDA";
    case CUDATTN_ERROR_EXPORT: return "CUDATTN_ERROR_EXPORT";
    }
    return "unknown cudattn_status";
}

static inline const char* cudattn_message(const cudattn_handle* h) { return h->message; }

static inline cudattn_prefill_args cudattn_prefill_defaults(void) {
    cudattn_prefill_args a;
    memset(&a, 0, sizeof a);
    a.dtype = CUDATTN_FLOAT16;
    a.out_dtype = -1;
    a.q_descale = a.k_descale = a.v_descale = 1.0;
    return a;
}

/* ------------------------------------------------------------------ internals */

static inline cudattn_status cudattn__fail(cudattn_handle* h, cudattn_status s, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->message, sizeof h->message, fmt, ap);
    va_end(ap);
    return s;
}

static inline cudattn_status cudattn__cu(cudattn_handle* h, CUresult r, const char* what) {
    const char *name = NULL, *text = NULL;
    if (r == CUDA_SUCCESS) return CUDATTN_OK;
    cuGetErrorName(r, &name);
    cuGetErrorString(r, &text);
    return cudattn__fail(h, CUDATTN_ERROR_CUDA, "%s failed: %s (%s)", what, name ? name : "?", text ? text : "?");
}

#define CUDATTN__TRY(expr)                   \
    do {                                     \
        cudattn_status cudattn__s = (expr);  \
        if (cudattn__s != CUDATTN_OK) return cudattn__s; \
    } while (0)

static inline int cudattn__item(int dtype) { return dtype == CUDATTN_FLOAT32 ? 4 : dtype == CUDATTN_E4M3 ? 1 : 2; }

/* A file of the export into memory (the caller frees it). */
static inline cudattn_status cudattn__read(cudattn_handle* h, const char* rel, char** data, size_t* size) {
    char path[CUDATTN_MAX_PATH + 256];
    FILE* f;
    long n;
    snprintf(path, sizeof path, "%s/%s", h->dir, rel);
    f = fopen(path, "rb");
    if (!f) return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "cannot open %s: export again into %s", path, h->dir);
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "cannot read %s", path);
    }
    *data = (char*)malloc((size_t)n + 1);
    if (!*data) {
        fclose(f);
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "no host memory to read %s", path);
    }
    *size = fread(*data, 1, (size_t)n, f);
    (*data)[*size] = 0;
    fclose(f);
    if (*size != (size_t)n) {
        free(*data);
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "short read of %s", path);
    }
    return CUDATTN_OK;
}

/* The value of "key": "..." or "key": N in the manifest's text (its first occurrence). */
static inline int cudattn__json_field(const char* json, const char* key, char* out, size_t cap) {
    char pat[64];
    const char* p;
    size_t n = 0;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ') ++p;
    if (*p == '"') ++p;
    while (*p && *p != '"' && *p != ',' && *p != '\n' && n + 1 < cap) out[n++] = *p++;
    out[n] = 0;
    return 1;
}

static inline cudattn_status cudattn_open(cudattn_handle* h, const char* export_dir, CUdevice device) {
    int major = 0, minor = 0, i, found = 0;
    char *manifest = NULL, version[64], format[16], id[64];
    size_t size = 0;
    CUdevice current;
    memset(h, 0, sizeof *h);
    if (cuCtxGetCurrent(&h->context) != CUDA_SUCCESS || h->context == NULL)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "no current CUDA context: make the device's context "
                             "current first (cuDevicePrimaryCtxRetain, cuCtxSetCurrent)");
    if (cuCtxGetDevice(&current) != CUDA_SUCCESS || current != device)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "the current context is not on the device given");
    if (strlen(export_dir) >= sizeof h->dir)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "export directory path too long");
    strcpy(h->dir, export_dir);
    h->device = device;
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
                             "cuDeviceGetAttribute"));
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
                             "cuDeviceGetAttribute"));
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&h->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                             "cuDeviceGetAttribute"));
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&h->smem_optin,
                                                     CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
                             "cuDeviceGetAttribute"));
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&h->smem_per_sm,
                                                     CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, device),
                             "cuDeviceGetAttribute"));
    CUDATTN__TRY(cudattn__cu(h, cuDeviceGetAttribute(&h->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device),
                             "cuDeviceGetAttribute"));
    if (major == 9 && minor == 0)
        strcpy(h->arch, "sm_90a");
    else if (major == 8 && (minor == 0 || minor == 6 || minor == 7 || minor == 9))
        snprintf(h->arch, sizeof h->arch, "sm_8%d", minor);
    else
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "compute capability %d.%d: cudattn builds for sm_80, "
                             "sm_86, sm_87, sm_89 and sm_90a", major, minor);
    CUDATTN__TRY(cudattn__read(h, "manifest.json", &manifest, &size));
    if (!cudattn__json_field(manifest, "cudattn", version, sizeof version) ||
        !cudattn__json_field(manifest, "format", format, sizeof format) ||
        !cudattn__json_field(manifest, "id", id, sizeof id)) {
        free(manifest);
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "%s/manifest.json is not a cudattn export manifest", h->dir);
    }
    free(manifest);
    if (strcmp(version, CUDATTN_VERSION) != 0 || atoi(format) != CUDATTN_EXPORT_FORMAT)
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "%s was exported by cudattn %s (format %s); these headers are "
                             "cudattn %s (format %d): use the headers of that export, or export again", h->dir,
                             version, format, CUDATTN_VERSION, CUDATTN_EXPORT_FORMAT);
    if (strcmp(id, CUDATTN_EXPORT_ID) != 0)
        return cudattn__fail(h, CUDATTN_ERROR_EXPORT, "%s holds other cubins (export %s) than the ones these headers "
                             "describe (export %s): build against %s/include", h->dir, id, CUDATTN_EXPORT_ID, h->dir);
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i) found |= strcmp(cudattn_kernel_table[i].arch, h->arch) == 0;
    if (!found)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "this export has no kernels for %s: export with --arch %s",
                             h->arch, h->arch);
    return CUDATTN_OK;
}

static inline void cudattn_close(cudattn_handle* h) {
    int i;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
        if (h->modules[i]) cuModuleUnload(h->modules[i]);
    memset(h->modules, 0, sizeof h->modules);
    memset(h->functions, 0, sizeof h->functions);
}

/* Every call checks that the handle's context is current (its functions live there). */
static inline cudattn_status cudattn__in_context(cudattn_handle* h) {
    CUcontext cur = NULL;
    CUDATTN__TRY(cudattn__cu(h, cuCtxGetCurrent(&cur), "cuCtxGetCurrent"));
    if (cur != h->context || cur == NULL)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "the context current now is not the one that was "
                             "current at cudattn_open: make that one current (a handle belongs to one context)");
    return CUDATTN_OK;
}

/* The loaded function of table row i (into the current context), its dynamic shared memory allowed.
 * Rows of one cubin (the entry points of a backward build, the rows of one prefill build) share
 * its module: the row that loaded it holds it in h->modules, the others only their functions. */
static inline cudattn_status cudattn__function(cudattn_handle* h, int i, CUfunction* fn) {
    const cudattn_kernel_row* r = &cudattn_kernel_table[i];
    if (!h->functions[i]) { /* built in locals, kept only once all of it worked */
        CUmodule mod = NULL;
        CUfunction f = NULL;
        cudattn_status st;
        int j, loaded = 0;
        for (j = 0; j < CUDATTN_KERNEL_COUNT && !mod; ++j)
            if (h->modules[j] && strcmp(cudattn_kernel_table[j].file, r->file) == 0) mod = h->modules[j];
        if (!mod) {
            char* image = NULL;
            size_t size = 0;
            CUresult res;
            CUDATTN__TRY(cudattn__read(h, r->file, &image, &size));
            res = cuModuleLoadData(&mod, image);
            free(image);
            CUDATTN__TRY(cudattn__cu(h, res, "cuModuleLoadData"));
            loaded = 1;
        }
        st = cudattn__cu(h, cuModuleGetFunction(&f, mod, r->entry), "cuModuleGetFunction");
        if (st == CUDATTN_OK && r->dynamic_smem > 48 * 1024)
            st = cudattn__cu(h, cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   r->dynamic_smem), "cuFuncSetAttribute");
        if (st != CUDATTN_OK) {
            if (loaded) cuModuleUnload(mod);
            return st;
        }
        if (loaded) h->modules[i] = mod;
        h->functions[i] = f;
    }
    *fn = h->functions[i];
    return CUDATTN_OK;
}

/* Loads every kernel of this export for the device now, so that later calls only read the handle
 * (no file or module work inside a CUDA graph capture, and calls from several threads are safe
 * once nothing is left to load). */
static inline cudattn_status cudattn_preload(cudattn_handle* h) {
    int i;
    CUfunction fn;
    CUDATTN__TRY(cudattn__in_context(h));
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
        if (strcmp(cudattn_kernel_table[i].arch, h->arch) == 0 && cudattn_kernel_table[i].dynamic_smem <= h->smem_optin)
            CUDATTN__TRY(cudattn__function(h, i, &fn));
    return CUDATTN_OK;
}

/* The prefill row the Python path would pick: the smallest tile >= head_dim, and of its rows the
 * one of the tightest query-length bound that holds, where one does. -1 if none. */
static inline int cudattn__select(const cudattn_handle* h, int family, int dtype, int out_dtype, int head_dim,
                                  int causal, int seqlen_q) {
    int i, best = -1;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i) {
        const cudattn_kernel_row* r = &cudattn_kernel_table[i];
        const cudattn_kernel_row* b = best < 0 ? NULL : &cudattn_kernel_table[best];
        if (r->kind != 0 || strcmp(r->arch, h->arch) != 0 || r->family != family || r->dtype != dtype ||
            r->out_dtype != out_dtype || r->causal != causal || r->tile_dim < head_dim)
            continue;
        if (r->seqlen_q_max >= 0 && seqlen_q > r->seqlen_q_max) continue;
        if (!b || r->tile_dim < b->tile_dim ||
            (r->tile_dim == b->tile_dim && r->seqlen_q_max >= 0 &&
             (b->seqlen_q_max < 0 || r->seqlen_q_max < b->seqlen_q_max)))
            best = i;
    }
    return best;
}

static inline int cudattn__transpose_row(const cudattn_handle* h) {
    int i;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
        if (cudattn_kernel_table[i].kind == 4 && strcmp(cudattn_kernel_table[i].arch, h->arch) == 0) return i;
    return -1;
}

static inline long long cudattn__seq_pad(int seqlen_k) { return (seqlen_k + 127LL) / 128 * 128; }

/* Bytes of workspace a call needs: V transposed for FP8 (batch x heads_kv x head_dim x seqlen_k
 * rounded up to 128), 0 for 16-bit inputs. */
static inline size_t cudattn_prefill_workspace_bytes(const cudattn_prefill_args* a) {
    if (a->dtype != CUDATTN_E4M3) return 0;
    return (size_t)a->batch * (size_t)a->heads_kv * (size_t)a->head_dim * (size_t)cudattn__seq_pad(a->seqlen_k);
}

static inline cudattn_status cudattn__check_tensor(cudattn_handle* h, const char* name, const cudattn_tensor* t,
                                                   int item) {
    const long long lim = (1LL << 60) / item;
    if (t->stride_b < 0 || t->stride_s < 0 || t->stride_h < 0 || t->stride_b > lim || t->stride_s > lim ||
        t->stride_h > lim)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "%s: strides must be from 0 to 2^60 bytes", name);
    if (t->ptr % 16 || (t->stride_b * item) % 16 || (t->stride_s * item) % 16 || (t->stride_h * item) % 16)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "%s: the data pointer and the batch, seq and head "
                             "strides must be multiples of 16 bytes (the kernels load 16-byte vectors)", name);
    return CUDATTN_OK;
}

/* Whether TMA maps can describe `count` operands (t[i]: seq[i] rows of heads[i] heads in `batch` entries,
 * `item`-byte elements), as cudattn/_kernels/plan.py tma_can_map: every axis of more than one element has a
 * positive stride below 2^40 bytes. */
static inline int cudattn__tma_can_map_all(const cudattn_tensor* const* t, const int* seq, const int* heads, int count,
                                           int batch, int item) {
    int i, j;
    for (i = 0; i < count; ++i) {
        const long long st[3] = {t[i]->stride_b, t[i]->stride_s, t[i]->stride_h};
        const int n[3] = {batch, seq[i], heads[i]};
        for (j = 0; j < 3; ++j)
            if (n[j] > 1 && !(st[j] > 0 && st[j] * item < (1LL << 40))) return 0;
    }
    return 1;
}

/* Whether the Hopper kernel's TMA maps can describe a prefill call's q, k and v. */
static inline int cudattn__tma_can_map(const cudattn_prefill_args* a, int item) {
    const cudattn_tensor* t[3] = {&a->q, &a->k, &a->v};
    const int seq[3] = {a->seqlen_q, a->seqlen_k, a->seqlen_k}, heads[3] = {a->heads_q, a->heads_kv, a->heads_kv};
    return cudattn__tma_can_map_all(t, seq, heads, 3, a->batch, item);
}

/* A 4-D map of a (head dim, seq, head, batch) operand: boxes of one swizzle row x box_rows rows;
 * a size-1 axis gets a dense stride (TMA never steps along it). */
static inline cudattn_status cudattn__map(cudattn_handle* h, unsigned char out[128], CUdeviceptr ptr, int dtype,
                                          int head_dim, int seqlen, int heads, int batch, const cudattn_tensor* t,
                                          int box_rows, int row_bytes) {
    CUtensorMap m;
    const int item = cudattn__item(dtype);
    const int sizes[4] = {head_dim, seqlen, heads, batch};
    const long long st[3] = {t->stride_s, t->stride_h, t->stride_b};
    cuuint64_t dims[4], strides[3];
    cuuint32_t box[4], estr[4] = {1, 1, 1, 1};
    long long prev_stride = item, prev_size = head_dim;
    int i;
    for (i = 0; i < 4; ++i) dims[i] = (cuuint64_t)sizes[i];
    for (i = 0; i < 3; ++i) {
        const long long b = sizes[i + 1] > 1 ? st[i] * item : prev_stride * prev_size;
        strides[i] = (cuuint64_t)b;
        prev_stride = b;
        prev_size = sizes[i + 1];
    }
    box[0] = (cuuint32_t)(row_bytes / item);
    box[1] = (cuuint32_t)box_rows;
    box[2] = box[3] = 1;
    CUDATTN__TRY(cudattn__cu(h, cuTensorMapEncodeTiled(&m, dtype == CUDATTN_FLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : dtype == CUDATTN_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                                        4, (void*)ptr, dims, strides, box, estr,
                                                        CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                        row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                                                         : CU_TENSOR_MAP_SWIZZLE_64B,
                                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                             "cuTensorMapEncodeTiled"));
    memcpy(out, &m, 128);
    return CUDATTN_OK;
}

static inline float cudattn__scale_log2(double scale) {
    /* 1e-30 stands in for 0 (a zero scale would make NaN of the masks' infinities); below 2^-126 is 0 */
    return fabs(scale) >= ldexp(1.0, -126) ? (float)(scale * 1.4426950408889634) : 1e-30f;
}

/* A softmax scale (and, for FP8, a descale) the kernels can carry in float32. */
static inline cudattn_status cudattn__check_scale(cudattn_handle* h, const char* name, double x) {
    if (!isfinite(x) || fabs(x) > ldexp(1.0, 127))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "%s must be finite and at most 2^127 in magnitude; got %g",
                             name, x);
    return CUDATTN_OK;
}

/* Query/key pairs per L2 section of the Hopper kernel's causal tile order, as cudattn/_kernels/plan.py _l2_section. */
static inline int cudattn__l2_section(const cudattn_handle* h, const cudattn_prefill_args* a, long long ctas) {
    const long long pairs = (long long)a->batch * a->heads_q;
    const double kv_per_pair = 2.0 * a->seqlen_k * a->head_dim * cudattn__item(a->dtype) /
                               (double)(a->heads_q / a->heads_kv);
    const long long budget = h->l2_bytes / 2;
    long long fit, s, sections;
    if (pairs * kv_per_pair <= (double)budget) return (int)pairs;
    if (kv_per_pair > (double)budget) {
        s = pairs < 2 ? pairs : 2;  /* plan.py's LONG_SECTION */
    } else {
        fit = (long long)floor((double)budget / kv_per_pair);
        s = fit > ctas / 4 ? fit : ctas / 4;
        s = s < pairs ? s : pairs;
        s = s > 1 ? s : 1;
    }
    sections = (pairs + s - 1) / s;  /* as even as one size and a rest allow */
    return (int)((pairs + sections - 1) / sections);
}

/* The Hopper kernel's tile_order argument, as plan.py's _tile_order: causal, the L2 sections; full, 1
   where the last query block leaves whole 64-row consumers past the end (those tiles come last). */
static inline int cudattn__tile_order(const cudattn_handle* h, const cudattn_prefill_args* a, int block_m,
                                      long long ctas) {
    if (a->causal) return cudattn__l2_section(h, a, ctas);
    return a->seqlen_q % block_m > 0 && a->seqlen_q % block_m <= block_m - 64;
}

/* Attention over q, k, v into o (and lse), asynchronously on `stream`. */
static inline cudattn_status cudattn_prefill(cudattn_handle* h, const cudattn_prefill_args* a, CUstream stream) {
    const int fp8 = a->dtype == CUDATTN_E4M3;
    const int item = cudattn__item(a->dtype);
    const int out_dtype = a->out_dtype >= 0 ? a->out_dtype : fp8 ? CUDATTN_BFLOAT16 : a->dtype;
    const double scale = a->has_scale ? a->scale : 1.0 / sqrt((double)a->head_dim);
    int family, row, num_m;
    const cudattn_kernel_row* r;
    CUfunction fn;
    cudattn_FwdParams p;
    h->message[0] = 0;
    if (a->dtype != CUDATTN_FLOAT16 && a->dtype != CUDATTN_BFLOAT16 && !fp8)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "dtype must be CUDATTN_FLOAT16, CUDATTN_BFLOAT16 or "
                             "CUDATTN_E4M3; got %d", a->dtype);
    if (fp8 ? !(out_dtype == CUDATTN_FLOAT32 || out_dtype == CUDATTN_FLOAT16 || out_dtype == CUDATTN_BFLOAT16)
            : out_dtype != a->dtype)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, fp8 ? "FP8 writes float32, float16 or bfloat16; got "
                             "out_dtype %d" : "16-bit inputs write their own dtype; got out_dtype %d", out_dtype);
    if (a->batch < 0 || a->seqlen_q < 0 || a->seqlen_k < 0 || a->heads_q < 1 || a->heads_kv < 1)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "batch and lengths must be >= 0, heads >= 1");
    if (a->heads_q % a->heads_kv)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "heads_q (%d) must be a multiple of heads_kv (%d)",
                             a->heads_q, a->heads_kv);
    if (a->head_dim < 8 || a->head_dim > 256 || a->head_dim % (fp8 ? 16 : 8))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "head_dim must be a multiple of %d from %d to 256; "
                             "got %d", fp8 ? 16 : 8, fp8 ? 16 : 8, a->head_dim);
    CUDATTN__TRY(cudattn__in_context(h));
    CUDATTN__TRY(cudattn__check_scale(h, "scale", scale));
    if (fp8) {
        CUDATTN__TRY(cudattn__check_scale(h, "q_descale", a->q_descale));
        CUDATTN__TRY(cudattn__check_scale(h, "k_descale", a->k_descale));
        CUDATTN__TRY(cudattn__check_scale(h, "v_descale", a->v_descale));
        CUDATTN__TRY(cudattn__check_scale(h, "scale * q_descale * k_descale", scale * a->q_descale * a->k_descale));
    }
    CUDATTN__TRY(cudattn__check_tensor(h, "q", &a->q, item));
    CUDATTN__TRY(cudattn__check_tensor(h, "k", &a->k, item));
    CUDATTN__TRY(cudattn__check_tensor(h, "v", &a->v, item));
    CUDATTN__TRY(cudattn__check_tensor(h, "o", &a->o, cudattn__item(out_dtype)));
    if (a->lse % 4) return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "lse must be 4-byte aligned");
    if (a->batch == 0 || a->seqlen_q == 0) return CUDATTN_OK;
    if (a->seqlen_k == 0)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "seqlen_k = 0: no kernel runs; the result is O = 0 "
                             "and LSE = -inf, to be filled by the caller");
    if (fp8 && (a->workspace_bytes < cudattn_prefill_workspace_bytes(a) || a->workspace % 16 || !a->workspace))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "FP8 needs a 16-byte aligned workspace of %zu bytes "
                             "(cudattn_prefill_workspace_bytes); got %zu", cudattn_prefill_workspace_bytes(a),
                             a->workspace_bytes);
    if (a->family != 0 && a->family != 80)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "family must be 0 (automatic) or 80 (portable); got %d",
                             a->family);
    family = a->family == 0 && strcmp(h->arch, "sm_90a") == 0 && cudattn__tma_can_map(a, item) ? 90 : 80;
    row = cudattn__select(h, family, a->dtype, fp8 ? out_dtype : -1, a->head_dim, a->causal != 0, a->seqlen_q);
    if (row < 0)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "no kernel of this export serves dtype %d, head_dim %d "
                             "on %s", a->dtype, a->head_dim, h->arch);
    r = &cudattn_kernel_table[row];
    if (r->dynamic_smem > h->smem_optin)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "the kernel for head_dim %d needs %d bytes of shared "
                             "memory; the device allows %d", a->head_dim, r->dynamic_smem, h->smem_optin);
    CUDATTN__TRY(cudattn__function(h, row, &fn));
    num_m = (a->seqlen_q + r->block_m - 1) / r->block_m;

    memset(&p, 0, sizeof p);
    p.q = a->q.ptr; p.k = a->k.ptr; p.v = a->v.ptr; p.o = a->o.ptr; p.lse = a->lse;
    p.q_stride_b = a->q.stride_b; p.q_stride_s = a->q.stride_s; p.q_stride_h = a->q.stride_h;
    p.k_stride_b = a->k.stride_b; p.k_stride_s = a->k.stride_s; p.k_stride_h = a->k.stride_h;
    p.v_stride_b = a->v.stride_b; p.v_stride_s = a->v.stride_s; p.v_stride_h = a->v.stride_h;
    p.o_stride_b = a->o.stride_b; p.o_stride_s = a->o.stride_s; p.o_stride_h = a->o.stride_h;
    p.batch = a->batch; p.seqlen_q = a->seqlen_q; p.seqlen_k = a->seqlen_k;
    p.heads_q = a->heads_q; p.heads_kv = a->heads_kv; p.group = a->heads_q / a->heads_kv;
    p.head_dim = a->head_dim;
    p.causal_offset = a->seqlen_k - a->seqlen_q;
    p.scale_log2 = cudattn__scale_log2(scale);
    p.num_m_blocks = num_m;
    p.write_lse = a->lse != 0;
    p.out_scale = 1.0f;
    if (fp8) { /* V transposed into the workspace first, on the same stream */
        const long long pad = cudattn__seq_pad(a->seqlen_k);
        const int trow = cudattn__transpose_row(h);
        cudattn_TransposeVParams tp;
        CUfunction tfn;
        void* targs[1];
        if (trow < 0) return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "this export has no FP8 V transpose");
        CUDATTN__TRY(cudattn__function(h, trow, &tfn));
        memset(&tp, 0, sizeof tp);
        tp.v = a->v.ptr; tp.vt = a->workspace;
        tp.v_stride_b = a->v.stride_b; tp.v_stride_s = a->v.stride_s; tp.v_stride_h = a->v.stride_h;
        tp.seqlen_k = a->seqlen_k; tp.seq_pad = (int)pad; tp.heads_kv = a->heads_kv; tp.head_dim = a->head_dim;
        targs[0] = &tp;
        CUDATTN__TRY(cudattn__cu(h, cuLaunchKernel(tfn, (unsigned)(pad / 64), (unsigned)a->heads_kv,
                                                   (unsigned)a->batch, (unsigned)cudattn_kernel_table[trow].threads,
                                                   1, 1, 0, stream, targs, NULL), "cuLaunchKernel(fp8_transpose_v)"));
        p.v = a->workspace;
        p.v_stride_s = pad;
        p.v_stride_h = a->head_dim * pad;
        p.v_stride_b = a->heads_kv * a->head_dim * pad;
        p.scale_log2 = cudattn__scale_log2(scale * a->q_descale * a->k_descale);
        p.out_scale = (float)a->v_descale;
        p.q_descale = a->q_descale_ptr; p.k_descale = a->k_descale_ptr; p.v_descale = a->v_descale_ptr;
    }
    if (family == 90) {
        cudattn_FwdSm90Params P;
        const long long tiles = (long long)num_m * a->heads_q * a->batch;
        const long long ctas = tiles < h->sm_count ? tiles : h->sm_count;
        const int row_bytes = r->tile_dim * item < 128 ? r->tile_dim * item : 128;
        void* args[1];
        if (tiles >= (1LL << 31))
            return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "%lld tiles exceed the kernel's 32-bit tile index; "
                                 "split the call", tiles);
        /* tile_counter null: tiles in fixed rounds (no per-stream counters here); o_tma 0: O stored from
           registers (no map of O is made here) */
        memset(&P, 0, sizeof P);
        P.p = p;
        P.tile_order = cudattn__tile_order(h, a, r->block_m, ctas);
        CUDATTN__TRY(cudattn__map(h, P.tma_q, a->q.ptr, a->dtype, a->head_dim, a->seqlen_q, a->heads_q, a->batch,
                                  &a->q, r->block_m, row_bytes));
        CUDATTN__TRY(cudattn__map(h, P.tma_k, a->k.ptr, a->dtype, a->head_dim, a->seqlen_k, a->heads_kv, a->batch,
                                  &a->k, r->block_n, row_bytes));
        if (fp8) { /* Vt: (keys, head-dim rows, head, batch), boxes of 128 keys x the head-dim tile */
            CUtensorMap m;
            const long long pad = cudattn__seq_pad(a->seqlen_k);
            cuuint64_t dims[4] = {(cuuint64_t)pad, (cuuint64_t)a->head_dim, (cuuint64_t)a->heads_kv,
                                  (cuuint64_t)a->batch};
            cuuint64_t strides[3] = {(cuuint64_t)pad, (cuuint64_t)(pad * a->head_dim),
                                     (cuuint64_t)(pad * a->head_dim * a->heads_kv)};
            cuuint32_t box[4] = {128, (cuuint32_t)r->tile_dim, 1, 1}, estr[4] = {1, 1, 1, 1};
            CUDATTN__TRY(cudattn__cu(h, cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, (void*)a->workspace,
                                                                dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                                CU_TENSOR_MAP_SWIZZLE_128B,
                                                                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                                     "cuTensorMapEncodeTiled(Vt)"));
            memcpy(P.tma_v, &m, 128);
        } else {
            CUDATTN__TRY(cudattn__map(h, P.tma_v, a->v.ptr, a->dtype, a->head_dim, a->seqlen_k, a->heads_kv, a->batch,
                                      &a->v, r->block_n, row_bytes));
        }
        args[0] = &P;
        return cudattn__cu(h, cuLaunchKernel(fn, (unsigned)ctas, 1, 1, (unsigned)r->threads, 1, 1,
                                             (unsigned)r->dynamic_smem, stream, args, NULL),
                           "cuLaunchKernel(flash_fwd_sm90)");
    } else {
        void* args[1];
        unsigned gx = (unsigned)num_m, gy = (unsigned)a->heads_q, gz = (unsigned)a->batch;
        if (a->causal) { gx = (unsigned)a->heads_q; gy = (unsigned)a->batch; gz = (unsigned)num_m; }
        if (gy > 65535 || gz > 65535)
            return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "batch, heads_q and (causal) the %d blocks of query "
                                 "rows must each be at most 65535; split the call", num_m);
        args[0] = &p;
        return cudattn__cu(h, cuLaunchKernel(fn, gx, gy, gz, (unsigned)r->threads, 1, 1, (unsigned)r->dynamic_smem,
                                             stream, args, NULL), "cuLaunchKernel(flash_fwd_sm80)");
    }
}

/* ------------------------------------------------------------------ decode */

#define CUDATTN_MAX_SPLITS 128

/* A few query tokens against a KV cache (FlashAttention's flash_attn_with_kvcache). The cache is
 * contiguous, (batch, capacity, heads_kv, head_dim), or paged, (num_pages, page_size, heads_kv,
 * head_dim) with block_table; stride_b of k_cache / v_cache steps between sequences or pages. */
typedef struct cudattn_decode_args {
    int dtype; /* CUDATTN_FLOAT16 or CUDATTN_BFLOAT16 */
    int batch, seqlen_q, heads_q, heads_kv, head_dim;
    cudattn_tensor q, o;           /* (batch, seqlen_q, heads_q, head_dim) */
    CUdeviceptr lse;               /* 0, or (batch, heads_q, seqlen_q) float32 */
    cudattn_tensor k_cache, v_cache;
    int capacity;                  /* contiguous: keys a sequence holds at most (the cache's second axis) */
    CUdeviceptr block_table;       /* 0: contiguous; else int32 (batch, max_pages) */
    int page_size, max_pages, num_pages; /* paged: page_size a multiple of 16 */
    CUdeviceptr cache_seqlens;     /* 0: every sequence is full; else int32 (batch,) valid keys */
    cudattn_tensor k_new, v_new;   /* (batch, seqlen_new, heads_kv, head_dim), appended at cache_seqlens[b] */
    int seqlen_new;                /* 0: nothing appended */
    int causal;                    /* bottom right per sequence */
    int has_scale;
    double scale;
    int num_splits;                /* 0: chosen from the GPU's size and the cache length */
    CUdeviceptr workspace;         /* cudattn_decode_workspace_bytes(): partial outputs and counters */
    size_t workspace_bytes;
} cudattn_decode_args;

static inline cudattn_decode_args cudattn_decode_defaults(void) {
    cudattn_decode_args a;
    memset(&a, 0, sizeof a);
    a.dtype = CUDATTN_FLOAT16;
    return a;
}

typedef struct cudattn__decode_plan {
    int row, rows, num_m, splits, tiles_per_split, capacity, merge_ctas;
    size_t o_part, lse_part, counters, bytes; /* workspace offsets and size */
} cudattn__decode_plan;

/* The split heuristic's constants, as cudattn/_kernels/decode_plan.py's of the same names. */
#define CUDATTN__FULL_GRID_FRACTION 0.8
#define CUDATTN__EFFICIENCY_TOLERANCE 0.95
#define CUDATTN__MIN_TILES_PER_SPLIT 4
#define CUDATTN__MERGE_COST_PER_SPLIT_ROW 8
#define CUDATTN__WAVE_COST 200
#define CUDATTN__SINGLE_BLOCK_SM_DIVISOR 2
#define CUDATTN__ONE_BLOCK_SPLIT_TILES 8
#define CUDATTN__SMEM_RESERVED_PER_BLOCK 1024
#define CUDATTN__MERGE_SPREAD_MAX 16
#define CUDATTN__MERGE_ALONE_PARTS 32
#define CUDATTN__ONE_FRAG_ROWS 16
#define CUDATTN__HALVE_MAX_TILES_PER_SPLIT 8 /* decode_plan.py HALVE_MAX_TILES_PER_SPLIT */
#define CUDATTN__HALVE_MAX_TILES_UNSPLIT 16 /* decode_plan.py HALVE_MAX_TILES_UNSPLIT */

/* How many of a block of rows' last blocks to arrive share its merge, as cudattn/_kernels/decode_plan.py
 * choose_merge_ctas (this launcher's builds are never the tight ones: 16-bit caches, no modifiers). */
static inline int cudattn__merge_ctas(long long grid_blocks, int splits, int rows_in_block, int head_dim, int warps,
                                      int sm_count) {
    long long g;
    if (splits < 2 || grid_blocks > sm_count) return 1;
    if (splits <= CUDATTN__MERGE_ALONE_PARTS && rows_in_block <= warps) return 1;
    g = ((long long)rows_in_block * ((head_dim + 31) / 32) + warps - 1) / warps;
    if (g > CUDATTN__MERGE_SPREAD_MAX) g = CUDATTN__MERGE_SPREAD_MAX;
    if (g > splits) g = splits;
    return g < 1 ? 1 : (int)g;
}

static inline int cudattn__fewest_splits_of_as_many_tiles(long long key_tiles, long long splits) {
    const long long per_split = (key_tiles + splits - 1) / splits;
    return (int)((key_tiles + per_split - 1) / per_split);
}

/* The splits of a plan whose rows were halved into one-fragment blocks, as decode_plan.py splits_filling_the_sms:
 * a split a key tile, up to a block an SM, then the fewest splits of as many tiles. */
static inline int cudattn__splits_filling_the_sms(long long blocks, long long key_tiles, int sm_count) {
    long long s = sm_count / blocks;
    if (s > key_tiles) s = key_tiles;
    if (s > CUDATTN_MAX_SPLITS) s = CUDATTN_MAX_SPLITS;
    if (s < 1) s = 1;
    return cudattn__fewest_splits_of_as_many_tiles(key_tiles, s);
}

/* The lower of FlashAttention's wave model (with the tiles' rounding) and the merge's cost against
 * the tiles (the cost alone where one row block of a build of one or two blocks an SM is capped at
 * half the SMs; a split a key tile where that block's merge may be spread: spread_merge), as
 * cudattn/_kernels/decode_plan.py choose_num_splits (the same double and integer math). */
static inline int cudattn__choose_num_splits(long long blocks, long long key_tiles, int sm_count, int blocks_per_sm,
                                             int merge_rows_per_warp, int min_tiles, int spread_merge) {
    const long long slots = (long long)sm_count * blocks_per_sm;
    double eff[CUDATTN_MAX_SPLITS + 1], best = 0;
    long long top, s, cost, best_cost = -1, per_block, half;
    int cheapest = 1, capped;
    if ((double)blocks >= CUDATTN__FULL_GRID_FRACTION * sm_count || key_tiles < 2 * min_tiles) return 1;
    half = sm_count / CUDATTN__SINGLE_BLOCK_SM_DIVISOR > 1 ? sm_count / CUDATTN__SINGLE_BLOCK_SM_DIVISOR : 1;
    if (blocks == 1 && blocks_per_sm <= 2 && spread_merge) {
        s = key_tiles / CUDATTN__ONE_BLOCK_SPLIT_TILES > half ? key_tiles / CUDATTN__ONE_BLOCK_SPLIT_TILES : half;
        if (s > CUDATTN_MAX_SPLITS) s = CUDATTN_MAX_SPLITS;
        if (s > sm_count) s = sm_count;
        if (s > key_tiles) s = key_tiles;
        return cudattn__fewest_splits_of_as_many_tiles(key_tiles, s);
    }
    top = key_tiles / min_tiles < CUDATTN_MAX_SPLITS ? key_tiles / min_tiles : CUDATTN_MAX_SPLITS;
    capped = blocks == 1 && blocks_per_sm <= 2 && top > half;
    if (capped) top = half;
    for (s = 1; s <= top; ++s) {
        const double waves = (double)(blocks * s) / (double)slots;
        per_block = (key_tiles + s - 1) / s;
        eff[s] = (waves / ceil(waves)) * (((double)key_tiles / (double)s) / (double)per_block);
        if (eff[s] > best) best = eff[s];
        cost = ((blocks * s + slots - 1) / slots) * (100 * per_block + CUDATTN__WAVE_COST);
        if (s > 1) cost += (long long)CUDATTN__MERGE_COST_PER_SPLIT_ROW * merge_rows_per_warp * s;
        if (best_cost < 0 || cost < best_cost) cheapest = (int)s, best_cost = cost;
    }
    if (capped) return cheapest; /* every count a part of one wave: the cost model alone */
    for (s = 1; s <= top; ++s)
        if (eff[s] >= CUDATTN__EFFICIENCY_TOLERANCE * best) return (int)s < cheapest ? (int)s : cheapest;
    return cheapest;
}

static inline size_t cudattn__align256(size_t n) { return (n + 255) / 256 * 256; }

/* The decode row for a dtype, head dim and packed rows (group x seqlen_q): the smallest tile that
 * holds head_dim, and of its rows the one bounded by the rows where one applies; -1 if none. */
static inline int cudattn__select_decode(const cudattn_handle* h, int dtype, int head_dim, int rows) {
    int i, best = -1;
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i) {
        const cudattn_kernel_row* r = &cudattn_kernel_table[i];
        const cudattn_kernel_row* b = best < 0 ? NULL : &cudattn_kernel_table[best];
        if (r->kind != 1 || strcmp(r->arch, h->arch) != 0 || r->dtype != dtype || r->tile_dim < head_dim) continue;
        if (r->seqlen_q_max >= 0 && rows > r->seqlen_q_max) continue;
        if (!b || r->tile_dim < b->tile_dim || (r->tile_dim == b->tile_dim && r->seqlen_q_max >= 0)) best = i;
    }
    return best;
}

/* Blocks an SM the split heuristic aims for, as cudattn/_kernels/decode_plan.py _blocks_per_sm (16-bit caches). */
static inline int cudattn__blocks_per_sm(const cudattn_handle* h, const cudattn_kernel_row* r, int paged) {
    const int fit = h->smem_per_sm / (r->dynamic_smem + CUDATTN__SMEM_RESERVED_PER_BLOCK);
    if (paged) return fit >= 2 ? 2 : 1;
    return r->block_m == 16 && fit >= 2 ? 2 : 1;
}

/* The fewest key tiles a split takes: the row's build's DecodeTiles.split_tiles_min
 * (cudattn/_kernels/decode_traits.py), exported as a column of the kernel table. */
static inline int cudattn__split_tiles_min(const cudattn_kernel_row* r) {
    return r->split_tiles_min > 0 ? r->split_tiles_min : CUDATTN__MIN_TILES_PER_SPLIT;
}

/* The most key tiles one block of packed rows visits, as cudattn/_kernels/decode_plan.py _tiles_seen (no windows here). */
static inline long long cudattn__tiles_seen(int capacity, int block_n) { return (capacity + block_n - 1) / block_n; }

static inline cudattn_status cudattn__decode_plan_of(cudattn_handle* h, const cudattn_decode_args* a,
                                                     cudattn__decode_plan* pl) {
    long long key_tiles, blocks;
    const cudattn_kernel_row* r;
    memset(pl, 0, sizeof *pl);
    if (a->dtype != CUDATTN_FLOAT16 && a->dtype != CUDATTN_BFLOAT16)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "decode takes float16 or bfloat16 (no FP8 decode yet)");
    if (a->batch < 0 || a->seqlen_q < 1 || a->heads_q < 1 || a->heads_kv < 1 || a->heads_q % a->heads_kv)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "batch >= 0, seqlen_q >= 1; heads_q a multiple of "
                             "heads_kv >= 1");
    if ((long long)(a->heads_q / a->heads_kv) * a->seqlen_q >= (1LL << 31))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "(heads_q / heads_kv) x seqlen_q must be below 2^31");
    if (a->head_dim < 8 || a->head_dim > 256 || a->head_dim % 8)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "head_dim must be a multiple of 8 from 8 to 256; got %d",
                             a->head_dim);
    if (a->block_table) {
        if (a->page_size < 16 || a->page_size % 16 || a->max_pages < 1 || a->num_pages < 1)
            return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "a paged cache needs page_size a multiple of 16, "
                                 "max_pages >= 1 and num_pages >= 1");
        if ((long long)a->page_size * a->max_pages >= (1LL << 31))
            return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "a sequence's capacity (page_size x max_pages) must "
                                 "be below 2^31 keys");
        pl->capacity = a->page_size * a->max_pages;
    } else {
        if (a->capacity < 1) return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "a contiguous cache needs capacity >= 1");
        pl->capacity = a->capacity;
    }
    if (a->num_splits < 0 || a->num_splits > CUDATTN_MAX_SPLITS)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "num_splits must be 0 (chosen) or 1..%d; got %d",
                             CUDATTN_MAX_SPLITS, a->num_splits);
    if (a->seqlen_new < 0 || a->seqlen_new > pl->capacity || (a->seqlen_new > 0 && !a->cache_seqlens))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "seqlen_new must be 0..capacity, and appending needs "
                             "cache_seqlens (where each sequence's new keys go)");
    pl->rows = (a->heads_q / a->heads_kv) * a->seqlen_q;
    pl->row = cudattn__select_decode(h, a->dtype, a->head_dim, pl->rows);
    if (pl->row < 0) return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "no decode kernel for head_dim %d", a->head_dim);
    r = &cudattn_kernel_table[pl->row];
    pl->num_m = (pl->rows + r->block_m - 1) / r->block_m;
    key_tiles = cudattn__tiles_seen(pl->capacity, r->block_n);
    if (key_tiles < 1) key_tiles = 1;
    blocks = (long long)pl->num_m * a->heads_kv * a->batch;
    pl->splits = a->num_splits ? a->num_splits
                               : cudattn__choose_num_splits(blocks, key_tiles, h->sm_count,
                                                            cudattn__blocks_per_sm(h, r, a->block_table != 0),
                                                            ((pl->rows < r->block_m ? pl->rows : r->block_m) +
                                                             r->threads / 32 - 1) / (r->threads / 32),
                                                            cudattn__split_tiles_min(r), 1);
    if (r->block_m == 32 && (r->threads == 256 || r->tile_dim == 64)) {
        /* the two-fragment build on 8 warps (or at head dim 64): one-fragment row blocks, twice as many,
         * their splits filling the SMs, where they fit one wave with at most CUDATTN__HALVE_MAX_TILES_PER_SPLIT
         * key tiles a split, or CUDATTN__HALVE_MAX_TILES_UNSPLIT unsplit (decode_plan.py _halve_row_blocks) */
        const int one = cudattn__select_decode(h, a->dtype, a->head_dim, CUDATTN__ONE_FRAG_ROWS);
        if (one >= 0) {
            const cudattn_kernel_row* r1 = &cudattn_kernel_table[one];
            const int num_m1 = (pl->rows + r1->block_m - 1) / r1->block_m;
            long long tiles1 = cudattn__tiles_seen(pl->capacity, r1->block_n);
            if (tiles1 < 1) tiles1 = 1;
            const long long blocks1 = (long long)num_m1 * a->heads_kv * a->batch;
            const int splits1 = a->num_splits ? a->num_splits : cudattn__splits_filling_the_sms(blocks1, tiles1, h->sm_count);
            const int bound = splits1 == 1 ? CUDATTN__HALVE_MAX_TILES_UNSPLIT : CUDATTN__HALVE_MAX_TILES_PER_SPLIT;
            if (blocks1 * splits1 <= h->sm_count && (tiles1 + splits1 - 1) / splits1 <= bound) {
                pl->row = one;
                r = r1;
                pl->num_m = num_m1;
                key_tiles = tiles1;
                blocks = blocks1;
                pl->splits = splits1;
            }
        }
    }
    pl->tiles_per_split = (int)((key_tiles + pl->splits - 1) / pl->splits);
    pl->merge_ctas = cudattn__merge_ctas((long long)pl->num_m * pl->splits * a->heads_kv * a->batch, pl->splits,
                                         pl->rows < r->block_m ? pl->rows : r->block_m, a->head_dim, r->threads / 32,
                                         h->sm_count);
    if (pl->splits > 1) {
        const size_t rows_all = (size_t)a->batch * a->heads_q * a->seqlen_q;
        pl->o_part = 0;
        pl->lse_part = cudattn__align256(pl->splits * rows_all * a->head_dim * 4);
        pl->counters = pl->lse_part + cudattn__align256(pl->splits * rows_all * 4);
        pl->bytes = pl->counters + cudattn__align256((size_t)blocks * 4);
    }
    return CUDATTN_OK;
}

/* Bytes of workspace a decode call needs (0 when it runs unsplit); -1 cast to size_t on a bad call
 * (cudattn_message says why). */
static inline size_t cudattn_decode_workspace_bytes(cudattn_handle* h, const cudattn_decode_args* a) {
    cudattn__decode_plan pl;
    if (cudattn__decode_plan_of(h, a, &pl) != CUDATTN_OK) return (size_t)-1;
    return pl.bytes;
}

static inline cudattn_status cudattn_decode(cudattn_handle* h, const cudattn_decode_args* a, CUstream stream) {
    cudattn__decode_plan pl;
    cudattn_KvCacheGeom g;
    cudattn_DecodeParams p;
    const cudattn_kernel_row* r;
    CUfunction fn;
    void* args[1];
    const double scale = a->has_scale ? a->scale : 1.0 / sqrt((double)a->head_dim);
    h->message[0] = 0;
    CUDATTN__TRY(cudattn__in_context(h));
    CUDATTN__TRY(cudattn__check_scale(h, "scale", scale));
    CUDATTN__TRY(cudattn__decode_plan_of(h, a, &pl));
    CUDATTN__TRY(cudattn__check_tensor(h, "q", &a->q, 2));
    CUDATTN__TRY(cudattn__check_tensor(h, "o", &a->o, 2));
    CUDATTN__TRY(cudattn__check_tensor(h, "k_cache", &a->k_cache, 2));
    CUDATTN__TRY(cudattn__check_tensor(h, "v_cache", &a->v_cache, 2));
    if (a->batch == 0) return CUDATTN_OK;
    if (pl.bytes && (a->workspace_bytes < pl.bytes || a->workspace % 256 || !a->workspace))
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "this call runs %d splits and needs a 256-byte aligned "
                             "workspace of %zu bytes (cudattn_decode_workspace_bytes); got %zu", pl.splits, pl.bytes,
                             a->workspace_bytes);
    r = &cudattn_kernel_table[pl.row];
    if (r->dynamic_smem > h->smem_optin)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "the decode kernel needs %d bytes of shared memory; the "
                             "device allows %d", r->dynamic_smem, h->smem_optin);
    if ((long long)pl.num_m * pl.splits > 2147483647LL || a->heads_kv > 65535 || a->batch > 65535)
        return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "the decode grid exceeds the CUDA limits; split the call");
    CUDATTN__TRY(cudattn__function(h, pl.row, &fn)); /* before anything is queued: a failure changes nothing */
    memset(&g, 0, sizeof g);
    g.block_table = a->block_table;
    g.seqlens = a->cache_seqlens;
    g.page_size = a->block_table ? a->page_size : pl.capacity;
    g.max_pages = a->block_table ? a->max_pages : 1;
    g.num_pages = a->block_table ? a->num_pages : a->batch;
    g.capacity = pl.capacity;
    if (a->seqlen_new > 0) { /* the new keys into the cache first, on the same stream */
        int arow = -1, i;
        cudattn_AppendParams ap;
        CUfunction afn;
        void* aargs[1];
        const long long rows = (long long)a->batch * a->seqlen_new * a->heads_kv;
        CUDATTN__TRY(cudattn__check_tensor(h, "k_new", &a->k_new, 2));
        CUDATTN__TRY(cudattn__check_tensor(h, "v_new", &a->v_new, 2));
        for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
            if (cudattn_kernel_table[i].kind == 3 && strcmp(cudattn_kernel_table[i].arch, h->arch) == 0) arow = i;
        if (arow < 0) return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "this export has no KV-cache append");
        CUDATTN__TRY(cudattn__function(h, arow, &afn));
        memset(&ap, 0, sizeof ap);
        ap.k_new = a->k_new.ptr; ap.v_new = a->v_new.ptr; ap.k = a->k_cache.ptr; ap.v = a->v_cache.ptr;
        ap.kn_stride_b = a->k_new.stride_b; ap.kn_stride_s = a->k_new.stride_s; ap.kn_stride_h = a->k_new.stride_h;
        ap.vn_stride_b = a->v_new.stride_b; ap.vn_stride_s = a->v_new.stride_s; ap.vn_stride_h = a->v_new.stride_h;
        ap.k_stride_page = a->k_cache.stride_b; ap.k_stride_s = a->k_cache.stride_s; ap.k_stride_h = a->k_cache.stride_h;
        ap.v_stride_page = a->v_cache.stride_b; ap.v_stride_s = a->v_cache.stride_s; ap.v_stride_h = a->v_cache.stride_h;
        ap.kv = g;
        ap.batch = a->batch; ap.seqlen_new = a->seqlen_new; ap.heads_kv = a->heads_kv; ap.head_dim = a->head_dim;
        aargs[0] = &ap;
        CUDATTN__TRY(cudattn__cu(h, cuLaunchKernel(afn, (unsigned)((rows + 3) / 4), 1, 1,
                                                   (unsigned)cudattn_kernel_table[arow].threads, 1, 1, 0, stream,
                                                   aargs, NULL), "cuLaunchKernel(kv_cache_append)"));
        g.seqlen_add = a->seqlen_new;
    }
    memset(&p, 0, sizeof p);
    p.q = a->q.ptr; p.k = a->k_cache.ptr; p.v = a->v_cache.ptr; p.o = a->o.ptr; p.lse = a->lse;
    if (pl.splits > 1) {
        p.o_part = a->workspace + pl.o_part;
        p.lse_part = a->workspace + pl.lse_part;
        p.counters = a->workspace + pl.counters;
        /* the kernel leaves its arrival counters at zero; they start there */
        CUDATTN__TRY(cudattn__cu(h, cuMemsetD32Async(p.counters, 0, (pl.bytes - pl.counters) / 4, stream),
                                 "cuMemsetD32Async"));
    }
    p.q_stride_b = a->q.stride_b; p.q_stride_s = a->q.stride_s; p.q_stride_h = a->q.stride_h;
    p.k_stride_page = a->k_cache.stride_b; p.k_stride_s = a->k_cache.stride_s; p.k_stride_h = a->k_cache.stride_h;
    p.v_stride_page = a->v_cache.stride_b; p.v_stride_s = a->v_cache.stride_s; p.v_stride_h = a->v_cache.stride_h;
    p.o_stride_b = a->o.stride_b; p.o_stride_s = a->o.stride_s; p.o_stride_h = a->o.stride_h;
    p.kv = g;
    p.batch = a->batch; p.seqlen_q = a->seqlen_q; p.heads_q = a->heads_q; p.heads_kv = a->heads_kv;
    p.group = a->heads_q / a->heads_kv; p.head_dim = a->head_dim; p.rows = pl.rows; p.num_m_blocks = pl.num_m;
    p.num_splits = pl.splits; p.tiles_per_split = pl.tiles_per_split; p.causal = a->causal != 0;
    p.scale_log2 = cudattn__scale_log2(scale);
    p.write_lse = a->lse != 0;
    p.merge_ctas = pl.merge_ctas;
    args[0] = &p;
    return cudattn__cu(h, cuLaunchKernel(fn, (unsigned)(pl.num_m * pl.splits), (unsigned)a->heads_kv,
                                         (unsigned)a->batch, (unsigned)r->threads, 1, 1, (unsigned)r->dynamic_smem,
                                         stream, args, NULL), "cuLaunchKernel(flash_decode)");
}

/* ------------------------------------------------------------------ merge */

#define CUDATTN_MERGE_MAX_LIST 16

/* num_parts partial attentions over disjoint key sets -> the attention over their union (as
 * merge_attention_states): per row, w_s = exp(lse_s - max lse), out = sum w_s out_s / sum w_s,
 * lse = max + log sum w_s; a part whose LSE is -inf is skipped. Parts are evenly spaced in memory
 * (part s at o_parts + s * o_part_stride elements) or listed (o_list, up to 16). */
typedef struct cudattn_merge_args {
    int dtype; /* of the parts and of o: CUDATTN_FLOAT32, CUDATTN_FLOAT16 or CUDATTN_BFLOAT16 */
    int num_parts, batch, seqlen_q, heads, head_dim;
    CUdeviceptr o_parts, lse_parts;
    long long o_part_stride, lse_part_stride;
    const CUdeviceptr *o_list, *lse_list;             /* used instead when not NULL */
    long long in_stride_b, in_stride_s, in_stride_h;   /* each O part's element strides */
    long long lse_stride_b, lse_stride_h, lse_stride_s; /* each LSE part's (float32) */
    cudattn_tensor o;
    CUdeviceptr lse; /* 0, or (batch, heads, seqlen_q) float32 */
} cudattn_merge_args;

static inline cudattn_status cudattn_merge(cudattn_handle* h, const cudattn_merge_args* a, CUstream stream) {
    int i, row = -1;
    cudattn_CombineParams p;
    CUfunction fn;
    void* args[1];
    long long rows;
    h->message[0] = 0;
    if (a->dtype != CUDATTN_FLOAT32 && a->dtype != CUDATTN_FLOAT16 && a->dtype != CUDATTN_BFLOAT16)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "merge takes float32, float16 or bfloat16 parts");
    if (a->num_parts < 1 || (a->o_list && a->num_parts > CUDATTN_MERGE_MAX_LIST) || !a->o_list != !a->lse_list)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "num_parts >= 1; listed parts (o_list and lse_list "
                             "together) at most %d", CUDATTN_MERGE_MAX_LIST);
    if (a->batch < 0 || a->seqlen_q < 0 || a->heads < 1 || a->head_dim < 8 || a->head_dim > 256 || a->head_dim % 8)
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "batch, seqlen_q >= 0; heads >= 1; head_dim a multiple "
                             "of 8 from 8 to 256");
    CUDATTN__TRY(cudattn__in_context(h));
    {   /* the kernel moves 4 elements at a time: every part and the output as aligned as attention's operands */
        const int item = cudattn__item(a->dtype);
        cudattn_tensor t = {a->o_parts, a->in_stride_b, a->in_stride_s, a->in_stride_h};
        const long long ls[3] = {a->lse_stride_b, a->lse_stride_h, a->lse_stride_s};
        CUDATTN__TRY(cudattn__check_tensor(h, "o", &a->o, item));
        for (i = 0; i < a->num_parts; ++i) {
            t.ptr = a->o_list ? a->o_list[i] : a->o_parts + (CUdeviceptr)(i * a->o_part_stride * item);
            CUDATTN__TRY(cudattn__check_tensor(h, "an O part", &t, item));
            if ((a->lse_list ? a->lse_list[i] : a->lse_parts) % 4)
                return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "LSE parts must be 4-byte aligned");
        }
        for (i = 0; i < 3; ++i)
            if (ls[i] < 0) return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "LSE strides must be >= 0");
        if (a->o_part_stride < 0 || a->lse_part_stride < 0 || a->lse % 4)
            return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "part strides must be >= 0 and lse 4-byte aligned");
    }
    for (i = 0; i < CUDATTN_KERNEL_COUNT; ++i)
        if (cudattn_kernel_table[i].kind == 2 && strcmp(cudattn_kernel_table[i].arch, h->arch) == 0 &&
            cudattn_kernel_table[i].dtype == a->dtype && cudattn_kernel_table[i].out_dtype == a->dtype)
            row = i;
    if (row < 0) return cudattn__fail(h, CUDATTN_ERROR_NOT_SUPPORTED, "no merge kernel for dtype %d", a->dtype);
    rows = (long long)a->batch * a->heads * a->seqlen_q;
    if (rows == 0) return CUDATTN_OK;
    if (rows >= (1LL << 31)) /* the kernel counts rows in 32 bits */
        return cudattn__fail(h, CUDATTN_ERROR_INVALID_VALUE, "merge takes fewer than 2^31 rows (batch x heads x "
                             "seqlen_q); merge in pieces");
    CUDATTN__TRY(cudattn__function(h, row, &fn));
    memset(&p, 0, sizeof p);
    p.o_parts = a->o_parts; p.lse_parts = a->lse_parts; p.o = a->o.ptr; p.lse = a->lse;
    if (a->o_list) {
        p.use_table = 1;
        for (i = 0; i < a->num_parts; ++i) { p.o_table[i] = a->o_list[i]; p.lse_table[i] = a->lse_list[i]; }
    }
    p.o_part_stride = a->o_part_stride; p.lse_part_stride = a->lse_part_stride;
    p.in_stride_b = a->in_stride_b; p.in_stride_s = a->in_stride_s; p.in_stride_h = a->in_stride_h;
    p.lse_stride_b = a->lse_stride_b; p.lse_stride_h = a->lse_stride_h; p.lse_stride_s = a->lse_stride_s;
    p.o_stride_b = a->o.stride_b; p.o_stride_s = a->o.stride_s; p.o_stride_h = a->o.stride_h;
    p.batch = a->batch; p.seqlen_q = a->seqlen_q; p.heads = a->heads; p.head_dim = a->head_dim;
    p.num_parts = a->num_parts;
    args[0] = &p;
    return cudattn__cu(h, cuLaunchKernel(fn, (unsigned)((rows + 3) / 4), 1, 1,
                                         (unsigned)cudattn_kernel_table[row].threads, 1, 1, 0, stream, args, NULL),
                       "cuLaunchKernel(split_kv_combine)");
}

/* ------------------------------------------------------------------ backward */

#include "cudattn_backward.h"

#undef CUDATTN__TRY

#ifdef __cplusplus
}
#endif
#endif /* CUDATTN_H */
