/* The warm call, compiled: a call whose signature has a recorded plan, served without bytecode.
 *
 * `run` does what `call.Call` and the warm branch of `Call.run` do for the common case, in the same
 * order and building the same signature key, so plans recorded by the Python path serve it:
 * operands that are cudattn DeviceArrays, plain CUDA torch tensors, CuPy arrays, or JAX arrays
 * imported before; a stream given as None (the operands' package's current stream), an int handle or
 * a stream object; operands made on another stream are waited for (`operands.stream_wait`, once a
 * producer, before the launch) and held with the call's work. It reads each
 * operand's facts (a JAX array's as `known_jax.recall` does: what its import found, and a capsule
 * asked of JAX with the call's stream), builds the key, finds the recorded call, makes the per-call
 * address checks, makes the call's allocations on a stream found not capturing (results, the stream's
 * counters and workspace, also for a call given `out=`: as the Python replay makes them outside
 * capture), builds an argument block not built before (asking the Python replay where a tensor map's
 * address is new), launches through the driver's `cuLaunchKernel`, and holds JAX operands and those
 * of another stream until the work is done, then releases earlier holds (lifetime.c, on
 * `_arrays.lifetime`'s state; `lifetime`'s own event calls go through this module's entry points once
 * bound: `event_record`, `event_query`, `capture_mode`).
 * Anything else returns the MISS sentinel before any launch or allocation, having done at most what
 * the Python path then does again (the operands' device made current for stream handles 0-2,
 * cudattn's stream made for a JAX call, JAX capsules exported for the call's stream), and the caller
 * runs the Python path, which also gives every error its message. Errors after that point (an allocation, a
 * launch), and a JAX array's refused export, are raised, as the Python path raises them.
 *
 * Stable ABI (Python 3.10 and newer): one build serves every interpreter. The driver's entry points
 * come as addresses from Python (`cuGetProcAddress`, or a test's stand-in): nothing here links CUDA.
 *
 * The extension in files by role: run.c (the call), operands.c (reading operands and the address
 * checks), replay.c (a recorded call's memory, argument blocks and launches), memory.c (memory kept
 * from earlier calls, served without Python), lifetime.c (the keep-alive holds), driver.c (the driver's
 * entry points, the event calls, the benchmarks' stamp), module.c (the state `configure` hands over,
 * the module), signature.c (the signature key's operand part). Everything but the module's init is
 * hidden from other libraries (-fvisibility=hidden).
 */
#ifndef CUDATTN_WARM_H
#define CUDATTN_WARM_H

#ifndef Py_LIMITED_API  /* setup.py defines it too */
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <limits.h>

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, void *stream, void **params, void **extra);
typedef int (*capturing_fn)(void *stream, int *status);
typedef int (*record_fn)(void *event, void *stream);
typedef int (*query_fn)(void *event);
typedef int (*exchange_fn)(int *mode);

#define MAX_OPERANDS 16
enum { K_ABSENT = -1, K_CUDATTN = 0, K_TORCH = 1, K_CUPY = 2, K_JAX = 3 };  /* importer's kinds */


/* Benchmarks' stamp of the first launch (`arm_stamp`, `take_stamp`): CLOCK_MONOTONIC, time.perf_counter_ns's clock. */
extern int g_armed;
extern long long g_first_ns, g_launches;

/* Calls served, and misses by the source line that sent them back (`stats`): for tests and diagnosis. */
#define MISS_LINES 1024
extern long long g_served, g_missed[MISS_LINES];

extern launch_fn g_launch;
extern capturing_fn g_capturing;
/* the event calls of `_arrays.lifetime` (`event_record`, `event_query`, `capture_mode`), once bound */
extern record_fn g_record;
extern query_fn g_query;
extern exchange_fn g_exchange;
extern int g_unbound;  /* driver entry points not asked for yet (or set to none) */
extern int g_configured;  /* the last configure() succeeded: every object it hands over is in place */

/* Objects `configure` hands over (strong references, kept for the process). */
extern PyObject *g_known_jax_mod, *g_operands_mod;  /* `recall`, `consumer_stream`: looked up per call */
extern PyObject *g_alloc_mod, *g_stream_memory_mod;  /* `_arrays.alloc`, `.stream_memory`: looked up per call */
extern PyObject *g_jax_seen, *g_default_refs, *g_empty;  /* `known_jax._seen`, `stream._default_stream_refs`, () */
extern PyObject *g_miss, *g_device_array, *g_recorded_call, *g_call_mod, *g_traits_mod, *g_margin_local,
    *g_shift_local, *g_recording_mod, *g_lifetime_mod, *g_device_mod, *g_accessors_mod, *g_importer_mod,
    *g_as_stream, *g_cupy_stream, *g_launch_failed, *g_bind, *g_bound_hook, *g_object_new;
extern PyObject *g_handle_attr_types;  /* `stream.HANDLE_ATTR_TYPES` */
extern PyObject *g_stream_mod, *g_note_torch;  /* `_runtime.stream`, `.note_torch_stream` */
/* the functions memory.c stands in for (a module whose function was replaced is asked instead), Block, 0 */
extern PyObject *g_alloc_allocate, *g_sm_counters, *g_sm_workspace, *g_block_class, *g_zero;
extern PyObject *g_lifetime_hold, *g_lifetime_release;  /* and lifetime.c: `lifetime.hold`, `.release_done` */

/* Interned attribute names. */
extern PyObject *s_ptr, *s_shape, *s_strides, *s_dtype, *s_device_id, *s_readonly, *s_stream_handle, *s_owner,
    *s_keep, *s_plans, *s_forced, *s_n, *s_active, *s_pending, *s_release_done, *s_restore, *s_torch_plain,
    *s_torch_layouts, *s_cupy_layouts, *s_cupy_types, *s_torch_stream, *s_stride, *s_is_cuda, *s_is_neg,
    *s_data_ptr, *s_get_device, *s_data, *s_handle, *s_obj, *s_allocate, *s_build, *s_get, *s_kinds, *s_recall,
    *s_consumer_stream, *s_hold, *s_dlpack, *s_stream, *s_allocate_block, *s_counters, *s_workspace,
    *s_cuda_stream, *s_kept, *s_kept_bytes, *s_kept_lock, *s_acquire, *s_release, *s_blocks, *s_nbytes,
    *s_workspace_kept_max, *s_lasting_streams, *s_stream_module, *s_torch_external, *s_export,
    *s_fully_replicated_shard, *s_stream_wait, *s_sid, *s_free_events, *s_held, *s_lock, *s_append, *s_popleft;

typedef struct {
    PyObject *obj;      /* borrowed: the caller's array */
    PyObject *adapted;  /* a JAX array's DeviceArray (`known_jax.recall`: its capsule for the call's stream) */
    int kind;
    int foreign;        /* made on another stream than the call's: waited for, and held */
    unsigned long long ptr;
    long device_id;
    PyObject *shape, *strides, *dtype, *readonly, *stream;  /* new references (stream: None or int) */
} Operand;


static inline void operand_clear(Operand *a) {
    Py_CLEAR(a->adapted);
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    Py_CLEAR(a->readonly);
    Py_CLEAR(a->stream);
}

/* A call signature's operand part and its flags' types as bytes (signature.c): both paths key plans so. */
#define SIG_DIMS 16   /* an operand's dimensions, at most */
#define SIG_FLAGS 32  /* an entry's flags, at most */
#define SIG_OPERAND_BYTES (1 + 8 + 10 + 10 + 1 + 2 * (1 + 10 * SIG_DIMS))  /* integers take up to 10 */
#define SIG_FLAGS_BYTES (1 + 8 * SIG_FLAGS)
#define SIG_BYTES(operands) ((operands) * SIG_OPERAND_BYTES + SIG_FLAGS_BYTES)
typedef struct {
    Py_ssize_t n, cap;  /* bytes written; bytes `buf` holds (room for the flags kept past the operands) */
    unsigned char *buf;
} Sig;
void sig_start(Sig *s, unsigned char *buf, Py_ssize_t cap);
int sig_absent(Sig *s);
int sig_operand(Sig *s, PyObject *type, PyObject *shape, PyObject *strides, PyObject *dtype, long long device,
                PyObject *readonly);
int sig_flag_types(Sig *s, PyObject *flags);
PyObject *sig_bytes(const Sig *s);
PyObject *signature_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* The truth of new reference `v`, which it consumes: 1, 0, or -1 with an exception set (also where
 * `v` is NULL, its lookup having failed). */
static inline int truth_of(PyObject *v) {
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* Attribute `name` of `o` is truthy: 1, 0, or -1 with an exception set. */
static inline int attr_true(PyObject *o, PyObject *name) { return truth_of(PyObject_GetAttr(o, name)); }

/* u64 of an int object; 0 and an exception when it is none or out of range. */
static inline int as_u64(PyObject *v, unsigned long long *out) {
    if (!PyLong_Check(v)) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

/* Clear an ordinary exception (the Python path will meet it again, and name it); leave a
 * KeyboardInterrupt, SystemExit or other BaseException set, for `miss` to raise. */
static inline void soft_clear(void) {
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
}

/* Module global `name` of `mod` (borrowed; NULL with no exception where absent). Read each call:
 * tests rebind some of them. */
static inline PyObject *module_global(PyObject *mod, PyObject *name) {
    PyObject *v = PyDict_GetItemWithError(PyModule_GetDict(mod), name);
    if (v == NULL) soft_clear();
    return v;
}

/* Module global `name` of `mod`, a new reference, read from the module's dictionary (half a getattr's
 * time); another object's attribute where `mod` is no module. NULL with an exception where absent. */
static inline PyObject *global_of(PyObject *mod, PyObject *name) {
    if (!PyModule_Check(mod)) return PyObject_GetAttr(mod, name);
    PyObject *v = PyDict_GetItemWithError(PyModule_GetDict(mod), name);
    if (v == NULL && !PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, name);
    Py_XINCREF(v);
    return v;
}

/* Module global `name` of `mod` is truthy: 1, 0, or -1 with an exception set. */
static inline int global_true(PyObject *mod, PyObject *name) { return truth_of(global_of(mod, name)); }


/* The current stream of a package on a device, remembered for the call (the operands of one call
 * share a device): torch's raw handle, or CuPy's Stream object and its handle. 1 found, 0 miss,
 * -1 error. */
typedef struct {
    int kind;
    long dev;
    PyObject *handle; /* int */
    PyObject *owner;  /* CuPy's Stream, or None */
} Current;


/* The slots of DeviceArray, RecordedCall, Replay and _Step, read through their member descriptors
 * (`configure`): the attribute lookup (the type's dictionary, then the instance's) is most of a
 * generic getattr's time. A descriptor checks the object's type and raises for another. */
enum {
    F_PTR, F_SHAPE, F_STRIDES, F_DTYPE, F_DEVICE_ID, F_READONLY, F_STREAM_HANDLE, F_OWNER,  /* DeviceArray */
    F_REPLAY, F_NONEMPTY, F_OUT_INDEX, F_OUT_SPAN, F_INPUTS, F_MORE,                         /* RecordedCall */
    F_ALLOCATIONS, F_STEPS, F_RESULTS, F_PAIR, F_NATIVE,                                     /* Replay */
    F_BUILT, F_SLOTS, F_LAUNCH_ARGS, F_TEMPLATE, F_POINTERS, F_MAPS,                         /* _Step */
    F_B_PTR, F_B_NBYTES, F_B_STREAM, F_B_KEEP, F_B_CTX, F_B_DEVICE_ID,                       /* alloc.Block */
    F_COUNT
};
extern const char *g_field_names[F_COUNT];
extern PyObject *g_fields[F_COUNT];
extern descrgetfunc g_member_get;
extern descrsetfunc g_member_set;

static inline PyObject *field(PyObject *x, int f) {
    return g_member_get(g_fields[f], x, (PyObject *)Py_TYPE(x));
}

/* Set slot `f` of `x` (borrowed `v`): 0, or -1 with an exception. */
static inline int set_field(PyObject *x, int f, PyObject *v) {
    return g_member_set(g_fields[f], x, v);
}

/* operands.c */
int current_stream(Current *c, int kind, long dev);
PyObject *device_array(PyObject *ptr, PyObject *shape, PyObject *strides, PyObject *dtype, PyObject *device_id,
                       PyObject *readonly, PyObject *owner, PyObject *stream);
int kind_of(PyObject *x);
int jax_consumer(PyObject *x, PyObject **handle, PyObject **keep);
int read_operand(PyObject *x, Operand *a, Current *cur, long long consumer, PyObject *name);
int plain(PyObject *rec, const unsigned long long *ptrs, Py_ssize_t n);
PyObject *wrap(const Operand *a, PyObject *stream);

/* memory.c */
PyObject *take_block(PyObject *dev, PyObject *nbytes, PyObject *stream, PyObject *keep);
PyObject *take_stream_memory(int kind, PyObject *dev, PyObject *stream, PyObject *size, PyObject *keep,
                             PyObject *optional);

/* lifetime.c */
int hold_refs(PyObject *consumer_o, unsigned long long consumer, PyObject *refs, PyObject *dev, int outside_capture);
int release_holds(void);
PyObject *hold_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *release_py(PyObject *self, PyObject *unused);

/* replay.c */
PyObject *replay(PyObject *rep, Operand *ops, Py_ssize_t n, PyObject *ptrs, long device_id,
                 unsigned long long consumer, PyObject *consumer_o, PyObject *keep);

/* driver.c */
int bound(void);
void unbind_events(void);
PyObject *set_driver(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *event_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *event_query(PyObject *self, PyObject *arg);
PyObject *capture_mode(PyObject *self, PyObject *arg);
PyObject *bind_now(PyObject *self, PyObject *unused);
PyObject *arm_stamp(PyObject *self, PyObject *on);
PyObject *take_stamp(PyObject *self, PyObject *unused);

/* run.c */
PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
