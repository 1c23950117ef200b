/* The warm call, compiled: a call whose signature has a recorded plan, served without bytecode.
 *
 * `run` does what `call.Call` and the warm branch of `Call.run` do for the common case, in the same
 * order and building the same signature key, so plans recorded by the Python path serve it:
 * operands that are cudattn DeviceArrays, plain CUDA torch tensors, CuPy arrays, or JAX arrays
 * imported before; a stream given as None (the operands' package's current stream), an int handle or
 * a stream object; every operand made on the call's stream (nothing to wait for). It reads each
 * operand's facts (a JAX array's as `known_jax.recall` does: what its import found, and a capsule
 * asked of JAX with the call's stream), builds the key, finds the recorded call, makes the per-call
 * address checks, makes the call's allocations (results, the stream's counters and workspace: as the
 * Python replay makes them outside capture; a call given `out=` that still needs a workspace or
 * counters asks the Python replay), builds an argument block not built before (asking the Python
 * replay where a tensor map's address is new), launches through
 * the driver's `cuLaunchKernel`, and holds JAX operands until the work is done (`lifetime.hold`, whose
 * event calls go through this module's entry points once bound: `event_record`, `event_query`,
 * `capture_mode`).
 * Anything else returns the MISS sentinel before any launch or allocation, having done at most what
 * the Python path then does again (the operands' device made current for stream handles 0-2,
 * cudattn's stream made for a JAX call, JAX capsules exported for the call's stream), and the caller
 * runs the Python path, which also gives every error its message. Errors after that point (an allocation, a
 * launch), and a JAX array's refused export, are raised, as the Python path raises them.
 *
 * Stable ABI (Python 3.10 and newer): one build serves every interpreter. The driver's entry points
 * come as addresses from Python (`cuGetProcAddress`, or a test's stand-in): nothing here links CUDA.
 */
#define Py_LIMITED_API 0x030A0000
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
static int g_armed;
static long long g_first_ns, g_launches;

/* Calls served, and misses by the source line that sent them back (`stats`): for tests and diagnosis. */
#define MISS_LINES 1024
static long long g_served, g_missed[MISS_LINES];
#define MISS() do { miss_line = __LINE__; goto out_miss; } while (0)

static launch_fn g_launch;
static capturing_fn g_capturing;
/* the event calls of `_arrays.lifetime` (`event_record`, `event_query`, `capture_mode`), once bound */
static record_fn g_record;
static query_fn g_query;
static exchange_fn g_exchange;
static int g_unbound = 1;  /* driver entry points not asked for yet (or set to none) */

/* Objects `configure` hands over (strong references, kept for the process). */
static PyObject *g_known_jax_mod, *g_operands_mod;  /* `recall`, `consumer_stream`: looked up per call */
static PyObject *g_alloc_mod, *g_stream_memory_mod;  /* `_arrays.alloc`, `.stream_memory`: looked up per call */
static PyObject *g_jax_seen, *g_default_refs, *g_empty;  /* `known_jax._seen`, `stream._default_stream_refs`, () */
static PyObject *g_miss, *g_device_array, *g_recorded_call, *g_call_mod, *g_traits_mod, *g_margin_local,
    *g_shift_local, *g_recording_mod, *g_lifetime_mod, *g_device_mod, *g_accessors_mod, *g_importer_mod,
    *g_as_stream, *g_cupy_stream, *g_launch_failed, *g_bind, *g_bound_hook, *g_object_new;
static PyObject *g_fixed_types;  /* `stream.FIXED_HANDLE_TYPES` */
static PyObject *g_fixed_stream, *g_fixed_handle;  /* the last `stream=` object of such a type, and its handle */

/* Interned attribute names. */
static PyObject *s_ptr, *s_shape, *s_strides, *s_dtype, *s_device_id, *s_readonly, *s_stream_handle, *s_owner,
    *s_keep, *s_plans, *s_forced, *s_n, *s_active, *s_pending, *s_release_done, *s_restore, *s_torch_plain,
    *s_torch_layouts, *s_cupy_layouts, *s_cupy_types, *s_torch_stream, *s_stride, *s_is_cuda, *s_is_neg,
    *s_data_ptr, *s_get_device, *s_data, *s_handle, *s_obj, *s_allocate, *s_build, *s_get, *s_kinds, *s_recall,
    *s_consumer_stream, *s_hold, *s_dlpack, *s_stream, *s_allocate_block, *s_counters, *s_workspace;

typedef struct {
    PyObject *obj;      /* borrowed: the caller's array */
    PyObject *adapted;  /* a JAX array's DeviceArray (`known_jax.recall`: its capsule for the call's stream) */
    int kind;
    unsigned long long ptr;
    long device_id;
    PyObject *shape, *strides, *dtype, *readonly, *stream;  /* new references (stream: None or int) */
} Operand;

static void operand_clear(Operand *a) {
    Py_CLEAR(a->adapted);
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    Py_CLEAR(a->readonly);
    Py_CLEAR(a->stream);
}

/* Attribute `name` of module-like `o` is truthy: 1, 0, or -1 with an exception set. */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* u64 of an int object; 0 and an exception when it is none or out of range. */
static int as_u64(PyObject *v, unsigned long long *out) {
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
static void soft_clear(void) {
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
}

/* The current stream of a package on a device, remembered for the call (the operands of one call
 * share a device): torch's raw handle, or CuPy's Stream object and its handle. 1 found, 0 miss,
 * -1 error. */
typedef struct {
    int kind;
    long dev;
    PyObject *handle; /* int */
    PyObject *owner;  /* CuPy's Stream, or None */
} Current;

static int current_stream(Current *c, int kind, long dev) {
    if (c->handle != NULL && c->kind == kind && c->dev == dev) return 1;
    Py_CLEAR(c->handle);
    Py_CLEAR(c->owner);
    PyObject *devo = PyLong_FromLong(dev);
    if (devo == NULL) return -1;
    if (kind == K_TORCH) {
        PyObject *getter = PyObject_GetAttr(g_importer_mod, s_torch_stream);
        if (getter == NULL) { Py_DECREF(devo); return -1; }
        if (getter == Py_None) { Py_DECREF(getter); Py_DECREF(devo); return 0; }
        c->handle = PyObject_CallFunctionObjArgs(getter, devo, NULL);
        Py_DECREF(getter);
        Py_INCREF(Py_None);
        c->owner = Py_None;
    } else {
        c->owner = PyObject_CallFunctionObjArgs(g_cupy_stream, devo, NULL);
        c->handle = c->owner == NULL ? NULL : PyObject_GetAttr(c->owner, s_ptr);
    }
    Py_DECREF(devo);
    if (c->handle == NULL || !PyLong_Check(c->handle)) {
        Py_CLEAR(c->handle);
        Py_CLEAR(c->owner);
        soft_clear();
        return 0;
    }
    c->kind = kind;
    c->dev = dev;
    return 1;
}

/* A layout table's entry (shape tuple, byte strides, NumPy dtype) into `a`. 1 found, 0 miss. */
static int take_layout(Operand *a, PyObject *table, PyObject *key) {
    PyObject *f = PyDict_GetItemWithError(table, key);  /* borrowed */
    if (f == NULL || !PyTuple_Check(f) || PyTuple_Size(f) != 3) {
        PyErr_Clear();
        return 0;
    }
    a->shape = PyTuple_GetItem(f, 0);
    a->strides = PyTuple_GetItem(f, 1);
    a->dtype = PyTuple_GetItem(f, 2);
    Py_INCREF(a->shape);
    Py_INCREF(a->strides);
    Py_INCREF(a->dtype);
    Py_INCREF(Py_False);
    a->readonly = Py_False;
    return 1;
}

/* The slots of DeviceArray, RecordedCall, Replay and _Step, read through their member descriptors
 * (`configure`): the attribute lookup (the type's dictionary, then the instance's) is most of a
 * generic getattr's time. A descriptor checks the object's type and raises for another. */
enum {
    F_PTR, F_SHAPE, F_STRIDES, F_DTYPE, F_DEVICE_ID, F_READONLY, F_STREAM_HANDLE, F_OWNER,  /* DeviceArray */
    F_REPLAY, F_NONEMPTY, F_OUT_INDEX, F_OUT_SPAN, F_INPUTS, F_MORE,                         /* RecordedCall */
    F_ALLOCATIONS, F_STEPS, F_RESULTS, F_PAIR, F_NATIVE,                                     /* Replay */
    F_BUILT, F_SLOTS, F_LAUNCH_ARGS, F_TEMPLATE, F_POINTERS, F_MAPS,                         /* _Step */
    F_COUNT
};
static const char *g_field_names[F_COUNT] = {
    "ptr", "shape", "strides", "dtype", "device_id", "readonly", "stream_handle", "owner",
    "replay", "nonempty", "out_index", "out_span", "inputs", "more",
    "allocations", "steps", "results", "pair", "native",
    "built", "slots", "launch_args", "template", "pointers", "maps",
};
static PyObject *g_fields[F_COUNT];
static descrgetfunc g_member_get;
static descrsetfunc g_member_set;

static PyObject *field(PyObject *x, int f) {
    return g_member_get(g_fields[f], x, (PyObject *)Py_TYPE(x));
}

/* Set slot `f` of `x` (borrowed `v`): 0, or -1 with an exception. */
static int set_field(PyObject *x, int f, PyObject *v) {
    return g_member_set(g_fields[f], x, v);
}

/* A DeviceArray of these fields (borrowed), as `object.__new__` and the slots' assignments make one
 * in Python (`_arrays.array.new_array`): a new reference, or NULL with an exception. */
static PyObject *device_array(PyObject *ptr, PyObject *shape, PyObject *strides, PyObject *dtype, PyObject *device_id,
                              PyObject *readonly, PyObject *owner, PyObject *stream) {
    PyObject *a = PyObject_CallFunctionObjArgs(g_object_new, g_device_array, NULL);
    if (a != NULL && (set_field(a, F_PTR, ptr) || set_field(a, F_SHAPE, shape) || set_field(a, F_STRIDES, strides) ||
                      set_field(a, F_DTYPE, dtype) || set_field(a, F_DEVICE_ID, device_id) ||
                      set_field(a, F_READONLY, readonly) || set_field(a, F_OWNER, owner) ||
                      set_field(a, F_STREAM_HANDLE, stream)))
        Py_CLEAR(a);
    return a;
}

/* The importer's kind of `x`'s type (`importer.KINDS`, filled as types are first adapted), or -1. */
static int kind_of(PyObject *x) {
    PyObject *kinds = PyObject_GetAttr(g_importer_mod, s_kinds);
    PyObject *k = kinds && PyDict_Check(kinds) ? PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(x)) : NULL;
    long v = k ? PyLong_AsLong(k) : -1;
    Py_XDECREF(kinds);
    PyErr_Clear();
    return (int)v;
}

/* A torch tensor's or CuPy array's layout (dtype, shape, strides: torch's from its stride() method)
 * mapped through its package's table in `accessors` (filled by the Python path) into `a`. 1 read,
 * 0 miss. */
static int read_layout(PyObject *x, Operand *a, int strides_method, PyObject *table_name) {
    PyObject *dtype = PyObject_GetAttr(x, s_dtype);
    PyObject *shape = dtype ? PyObject_GetAttr(x, s_shape) : NULL;
    PyObject *st = !shape ? NULL : strides_method ? PyObject_CallMethodObjArgs(x, s_stride, NULL)
                                                  : PyObject_GetAttr(x, s_strides);
    PyObject *key = st ? PyTuple_Pack(3, dtype, shape, st) : NULL;
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(st);
    PyObject *table = key ? PyObject_GetAttr(g_accessors_mod, table_name) : NULL;
    int ok = table != NULL && PyDict_Check(table) && take_layout(a, table, key);
    Py_XDECREF(table);
    Py_XDECREF(key);
    if (!ok) soft_clear();
    return ok;
}

/* DeviceArray `x`'s fields into `a`. 1 read, 0 miss. */
static int read_device_array(PyObject *x, Operand *a) {
    PyObject *p = field(x, F_PTR);
    if (p == NULL) { soft_clear(); return 0; }
    int ok = as_u64(p, &a->ptr);
    Py_DECREF(p);
    if (!ok) return 0;
    PyObject *d = field(x, F_DEVICE_ID);
    if (d == NULL) { soft_clear(); return 0; }
    a->device_id = PyLong_AsLong(d);
    Py_DECREF(d);
    if (a->device_id == -1 && PyErr_Occurred()) { soft_clear(); return 0; }
    a->shape = field(x, F_SHAPE);
    a->strides = field(x, F_STRIDES);
    a->dtype = field(x, F_DTYPE);
    a->readonly = field(x, F_READONLY);
    a->stream = field(x, F_STREAM_HANDLE);
    if (!a->shape || !a->strides || !a->dtype || !a->readonly || !a->stream) { soft_clear(); return 0; }
    return 1;
}

/* What importing JAX array `x` found (`known_jax._seen`: ptr, shape, strides, dtype, device, readonly), a
 * new reference, or NULL (not imported before, or gone; no exception left but a BaseException). */
static PyObject *jax_facts(PyObject *x) {
    PyObject *id = PyLong_FromVoidPtr(x);  /* id(x) */
    PyObject *e = id ? PyDict_GetItemWithError(g_jax_seen, id) : NULL;
    Py_XDECREF(id);
    if (e == NULL || !PyTuple_Check(e) || PyTuple_Size(e) != 2) { soft_clear(); return NULL; }
    Py_INCREF(e);  /* a weak reference's callback may drop the entry meanwhile */
    PyObject *o = PyObject_CallNoArgs(PyTuple_GetItem(e, 0));  /* the weak reference: x, or None once gone */
    PyObject *f = PyTuple_GetItem(e, 1);
    int same = o == x && f != NULL && PyTuple_Check(f) && PyTuple_Size(f) == 6;
    Py_XDECREF(o);
    if (same) Py_INCREF(f);
    Py_DECREF(e);
    soft_clear();
    return same ? f : NULL;
}

/* `known_jax.recall` in C: a DeviceArray of a JAX array imported before, read on `consumer`, its owner
 * the array and a capsule exported for the stream. 1 done (`a` read), 0 for the Python recall to do
 * (not known here, or the export failed: it asks again and raises naming the operand), -1 a
 * BaseException pending. */
static int jax_recall(PyObject *x, long long consumer, Operand *a) {
    PyObject *f = jax_facts(x);
    if (f == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *meth = PyObject_GetAttr(x, s_dlpack), *kw = PyDict_New(),
             *sync = PyLong_FromLongLong(consumer == 0 ? 1 : consumer), *cap = NULL;
    if (meth && kw && sync && PyDict_SetItem(kw, s_stream, sync) == 0)
        cap = PyObject_Call(meth, g_empty, kw);  /* JAX orders its writes before the stream */
    Py_XDECREF(meth);
    Py_XDECREF(kw);
    Py_XDECREF(sync);
    PyObject *owner = cap ? PyTuple_Pack(2, x, cap) : NULL, *c = owner ? PyLong_FromLongLong(consumer) : NULL;
    Py_XDECREF(cap);
    PyObject *w = c ? device_array(PyTuple_GetItem(f, 0), PyTuple_GetItem(f, 1), PyTuple_GetItem(f, 2),
                                   PyTuple_GetItem(f, 3), PyTuple_GetItem(f, 4), PyTuple_GetItem(f, 5), owner, c)
                    : NULL;
    Py_DECREF(f);
    Py_XDECREF(owner);
    Py_XDECREF(c);
    if (w == NULL) {
        soft_clear();
        return PyErr_Occurred() ? -1 : 0;
    }
    a->kind = K_JAX;
    a->adapted = w;
    if (read_device_array(w, a)) return 1;
    operand_clear(a);  /* the Python recall reads it again, and says what is wrong */
    return 0;
}

/* cudattn's stream on a known JAX array's device (`operands.consumer_stream`'s rule): 1 found, 0 for
 * the Python rule to say (no exception left but a BaseException). */
static int jax_consumer(PyObject *x, PyObject **handle, PyObject **keep) {
    PyObject *f = jax_facts(x);
    PyObject *ref = f ? PyDict_GetItemWithError(g_default_refs, PyTuple_GetItem(f, 4)) : NULL;
    Py_XINCREF(ref);
    Py_XDECREF(f);
    *handle = ref ? PyObject_GetAttr(ref, s_handle) : NULL;
    *keep = *handle ? PyObject_GetAttr(ref, s_obj) : NULL;
    Py_XDECREF(ref);
    if (*keep == NULL) Py_CLEAR(*handle);
    soft_clear();
    return *handle != NULL;
}

/* Read operand `x` into `a` as `call.Call` adapts it, for a call on `consumer` (-1: not known yet;
 * JAX arrays need it). 1 read, 0 miss (not a kind served here, or a fact the Python path must
 * judge), -1 an error to raise (a JAX array that refused its export, as the Python path raises). */
static int read_operand(PyObject *x, Operand *a, Current *cur, long long consumer, PyObject *name) {
    a->obj = x;
    if (x == Py_None) { a->kind = K_ABSENT; return 1; }
    PyObject *t = (PyObject *)Py_TYPE(x);
    if (t == g_device_array) {
        a->kind = K_CUDATTN;
        return read_device_array(x, a);
    }
    if (kind_of(x) == K_JAX) {  /* an array imported before: recalled, its capsule asked for with the stream */
        if (consumer < 0) return 0;
        int done = jax_recall(x, consumer, a);
        if (done != 0) return done;
        PyObject *c = PyLong_FromLongLong(consumer), *sync = PyLong_FromLongLong(consumer == 0 ? 1 : consumer);
        PyObject *r = c && sync ? PyObject_CallMethodObjArgs(g_known_jax_mod, s_recall, x, c, sync, name, NULL) : NULL;
        Py_XDECREF(c);
        Py_XDECREF(sync);
        if (r == NULL) return PyErr_ExceptionMatches(PyExc_ValueError) ? -1 : (soft_clear(), 0);
        if (r == Py_None || (PyObject *)Py_TYPE(r) != g_device_array) {
            Py_DECREF(r);
            return 0;  /* not imported before: the Python path imports it */
        }
        a->kind = K_JAX;
        a->adapted = r;
        return read_device_array(r, a);
    }
    /* torch: the accessors' plain tensor types, once torch has been seen */
    PyObject *plain = PyObject_GetAttr(g_accessors_mod, s_torch_plain);
    if (plain == NULL) return -1;
    int is_torch = PySet_Check(plain) ? PySet_Contains(plain, t) : 0;
    Py_DECREF(plain);
    if (is_torch < 0) { soft_clear(); return 0; }
    if (is_torch) {
        a->kind = K_TORCH;
        if (!read_layout(x, a, 1, s_torch_layouts)) return 0;
        int cuda = attr_true(x, s_is_cuda);
        if (cuda != 1) { soft_clear(); return 0; }
        PyObject *neg = PyObject_CallMethodObjArgs(x, s_is_neg, NULL);
        if (neg == NULL) { soft_clear(); return 0; }
        int negated = PyObject_IsTrue(neg);
        Py_DECREF(neg);
        if (negated != 0) { soft_clear(); return 0; }
        PyObject *p = PyObject_CallMethodObjArgs(x, s_data_ptr, NULL);
        if (p == NULL) { soft_clear(); return 0; }
        int okp = as_u64(p, &a->ptr);
        Py_DECREF(p);
        PyObject *d = okp ? PyObject_CallMethodObjArgs(x, s_get_device, NULL) : NULL;
        if (d == NULL) { soft_clear(); return 0; }
        a->device_id = PyLong_AsLong(d);
        Py_DECREF(d);
        if (a->device_id < 0) { soft_clear(); return 0; }
    } else {
        PyObject *types = PyObject_GetAttr(g_accessors_mod, s_cupy_types);
        if (types == NULL) return -1;
        int is_cupy = PyTuple_Check(types) && PyTuple_Size(types) == 1 && PyTuple_GetItem(types, 0) == t;
        Py_DECREF(types);
        if (!is_cupy) return 0;
        a->kind = K_CUPY;
        if (!read_layout(x, a, 0, s_cupy_layouts)) return 0;
        PyObject *mem = PyObject_GetAttr(x, s_data);
        PyObject *p = mem ? PyObject_GetAttr(mem, s_ptr) : NULL;
        PyObject *d = p ? PyObject_GetAttr(mem, s_device_id) : NULL;
        Py_XDECREF(mem);
        int okp = p != NULL && as_u64(p, &a->ptr);
        Py_XDECREF(p);
        if (!okp || d == NULL) { Py_XDECREF(d); soft_clear(); return 0; }
        a->device_id = PyLong_AsLong(d);
        Py_DECREF(d);
        if (a->device_id < 0) { soft_clear(); return 0; }
    }
    int found = current_stream(cur, a->kind, a->device_id);
    if (found <= 0) return found;
    Py_INCREF(cur->handle);
    a->stream = cur->handle;
    return 1;
}

/* The per-call address checks of `RecordedCall.plain`, on the recorded spans. 1 plain, 0 not, -1 error. */
static int span_of(PyObject *t, Py_ssize_t i, long long *v) {
    PyObject *o = PyTuple_GetItem(t, i);
    if (o == NULL) return -1;
    *v = PyLong_AsLongLong(o);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int overlaps_any(PyObject *others, unsigned long long lo, unsigned long long hi, const unsigned long long *ptrs,
                        Py_ssize_t n) {
    Py_ssize_t m = PyTuple_Size(others);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *e = PyTuple_GetItem(others, j);
        long long slot, a, b;
        if (e == NULL || span_of(e, 0, &slot) || span_of(e, 1, &a) || span_of(e, 2, &b)) return -1;
        if (slot < 0 || slot >= n) return -1;
        unsigned long long p = ptrs[slot];
        if (p + (unsigned long long)a < hi && lo < p + (unsigned long long)b) return 1;
    }
    return 0;
}

static int plain(PyObject *rec, const unsigned long long *ptrs, Py_ssize_t n) {
    int r = -1;
    PyObject *nonempty = field(rec, F_NONEMPTY), *out_index = field(rec, F_OUT_INDEX),
             *out_span = field(rec, F_OUT_SPAN), *inputs = field(rec, F_INPUTS), *more = field(rec, F_MORE);
    if (!nonempty || !out_index || !out_span || !inputs || !more || !PyTuple_Check(nonempty) ||
        !PyTuple_Check(inputs) || !PyTuple_Check(more))
        goto done;
    for (Py_ssize_t j = 0; j < PyTuple_Size(nonempty); j++) {
        long long i;
        if (span_of(nonempty, j, &i) || i < 0 || i >= n) goto done;
        if (!ptrs[i] || (ptrs[i] & 15)) { r = 0; goto done; }
    }
    if (out_span != Py_None) {
        long long oi, a, b;
        if (!PyLong_Check(out_index) || !PyTuple_Check(out_span)) goto done;
        oi = PyLong_AsLongLong(out_index);
        if (oi < 0 || oi >= n || span_of(out_span, 0, &a) || span_of(out_span, 1, &b)) goto done;
        int o = overlaps_any(inputs, ptrs[oi] + (unsigned long long)a, ptrs[oi] + (unsigned long long)b, ptrs, n);
        if (o) { r = o < 0 ? -1 : 0; goto done; }
    }
    for (Py_ssize_t j = 0; j < PyTuple_Size(more); j++) {
        PyObject *e = PyTuple_GetItem(more, j);
        long long k, c, d;
        if (e == NULL || span_of(e, 0, &k) || span_of(e, 1, &c) || span_of(e, 2, &d) || k < 0 || k >= n) goto done;
        PyObject *others = PyTuple_GetItem(e, 3);
        if (others == NULL || !PyTuple_Check(others)) goto done;
        int o = overlaps_any(others, ptrs[k] + (unsigned long long)c, ptrs[k] + (unsigned long long)d, ptrs, n);
        if (o) { r = o < 0 ? -1 : 0; goto done; }
    }
    r = 1;
done:
    if (r < 0) PyErr_Clear();
    Py_XDECREF(nonempty);
    Py_XDECREF(out_index);
    Py_XDECREF(out_span);
    Py_XDECREF(inputs);
    Py_XDECREF(more);
    return r;
}

/* The driver's entry points, asked of `bind` until it has them (None where there is no driver yet):
 * (launch, is_capturing, event record, event query, capture-mode exchange). Once they are in place,
 * `bound_hook(True)` hands the event calls to `lifetime` (before then no caller can reach them).
 * 1 bound, 0 not (or an exception pending). */
static int bound(void) {
    if (!g_unbound) return g_launch != NULL;
    PyObject *r = PyObject_CallNoArgs(g_bind);
    unsigned long long a[5] = {0};
    int ok = r != NULL && PyTuple_Check(r) && PyTuple_Size(r) == 5;
    for (Py_ssize_t i = 0; ok && i < 5; i++) ok = as_u64(PyTuple_GetItem(r, i), &a[i]) && a[i];
    Py_XDECREF(r);
    soft_clear();
    if (!ok) return g_launch != NULL;
    g_launch = (launch_fn)(uintptr_t)a[0];
    g_capturing = (capturing_fn)(uintptr_t)a[1];
    g_record = (record_fn)(uintptr_t)a[2];
    g_query = (query_fn)(uintptr_t)a[3];
    g_exchange = (exchange_fn)(uintptr_t)a[4];
    g_unbound = 0;
    PyObject *h = PyObject_CallFunctionObjArgs(g_bound_hook, Py_True, NULL);
    Py_XDECREF(h);
    soft_clear();
    return !PyErr_Occurred();  /* a KeyboardInterrupt from the hook: raised by the caller's MISS */
}

/* Forget the event entry points (a test's stand-ins may go next): `lifetime` back on cuda.bindings'
 * wrappers first, told by `bound_hook(False)`. */
static void unbind_events(void) {
    if (g_record == NULL && g_query == NULL && g_exchange == NULL) return;
    PyObject *h = g_bound_hook ? PyObject_CallFunctionObjArgs(g_bound_hook, Py_False, NULL) : NULL;
    Py_XDECREF(h);
    soft_clear();
    g_record = NULL;
    g_query = NULL;
    g_exchange = NULL;
}

/* A DeviceArray for a foreign operand that the call returns (`out`): what the Python path returns. */
static PyObject *wrap(const Operand *a) {
    PyObject *ptr = PyLong_FromUnsignedLongLong(a->ptr), *dev = PyLong_FromLong(a->device_id);
    PyObject *w = ptr && dev ? device_array(ptr, a->shape, a->strides, a->dtype, dev, a->readonly, a->obj, a->stream)
                             : NULL;
    Py_XDECREF(ptr);
    Py_XDECREF(dev);
    return w;
}

/* A call's allocations on a stream known not to capture (`Replay.native`), made as `Replay._allocate`
 * makes them there: results on blocks of `_arrays.alloc.allocate` (reuse allowed), counters and a kept
 * workspace from `_arrays.stream_memory`, a workspace of the call's own from `allocate`; their addresses
 * appended to `ptrs`. Returns what `_allocate` returns (per slot its array or counters, None for a
 * workspace slice; then the workspace block or None), or NULL with an exception. */
static PyObject *allocate_native(PyObject *native, long device_id, PyObject *stream, PyObject *keep, PyObject *ptrs) {
    if (!PyTuple_Check(native) || PyTuple_Size(native) != 3 || !PyTuple_Check(PyTuple_GetItem(native, 2))) {
        PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded allocation of an unexpected form");
        return NULL;
    }
    PyObject *scratch_bytes = PyTuple_GetItem(native, 0), *items = PyTuple_GetItem(native, 2);
    PyObject *dev = PyLong_FromLong(device_id), *made = dev ? PyList_New(0) : NULL, *scratch = NULL;
    unsigned long long base = 0;
    keep = keep ? keep : Py_None;
    int has_scratch = made ? PyObject_IsTrue(scratch_bytes) : -1;
    if (has_scratch < 0) goto fail;
    if (has_scratch) {  /* one kernel: the stream's kept workspace; more: the call's own (`_allocate`) */
        scratch = PyTuple_GetItem(native, 1) == Py_True
            ? PyObject_CallMethodObjArgs(g_stream_memory_mod, s_workspace, dev, stream, scratch_bytes, keep, Py_False,
                                         NULL)
            : PyObject_CallMethodObjArgs(g_alloc_mod, s_allocate_block, dev, scratch_bytes, stream, keep, Py_True,
                                         NULL);
        PyObject *p = scratch ? PyObject_GetAttr(scratch, s_ptr) : NULL;
        int ok = p != NULL && as_u64(p, &base);
        Py_XDECREF(p);
        if (!ok) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a workspace without an address");
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(items); i++) {
        PyObject *it = PyTuple_GetItem(items, i), *held = NULL, *ptr = NULL;
        if (PyLong_Check(it)) {  /* a slice of the workspace */
            unsigned long long off = PyLong_AsUnsignedLongLong(it);
            if (!(off == (unsigned long long)-1 && PyErr_Occurred())) {
                ptr = PyLong_FromUnsignedLongLong(base + off);
                held = Py_None;
                Py_INCREF(held);
            }
        } else if (PyTuple_Check(it) && PyTuple_Size(it) == 2) {  /* the stream's counters: (count, optional) */
            held = PyObject_CallMethodObjArgs(g_stream_memory_mod, s_counters, dev, stream, PyTuple_GetItem(it, 0),
                                              keep, Py_False, PyTuple_GetItem(it, 1), NULL);
            ptr = held ? PyObject_GetAttr(held, s_ptr) : NULL;
        } else if (PyTuple_Check(it) && PyTuple_Size(it) == 4) {  /* a result: (shape, dtype, strides, bytes) */
            PyObject *block = PyObject_CallMethodObjArgs(g_alloc_mod, s_allocate_block, dev, PyTuple_GetItem(it, 3),
                                                         stream, keep, Py_True, NULL);
            ptr = block ? PyObject_GetAttr(block, s_ptr) : NULL;
            held = ptr ? device_array(ptr, PyTuple_GetItem(it, 0), PyTuple_GetItem(it, 2), PyTuple_GetItem(it, 1), dev,
                                      Py_False, block, stream) : NULL;
            Py_XDECREF(block);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded allocation of an unexpected form");
        }
        int bad = held == NULL || ptr == NULL || PyList_Append(ptrs, ptr) || PyList_Append(made, held);
        Py_XDECREF(held);
        Py_XDECREF(ptr);
        if (bad) goto fail;
    }
    if (PyList_Append(made, scratch ? scratch : Py_None)) goto fail;  /* held until the launches are queued */
    Py_XDECREF(scratch);
    Py_DECREF(dev);
    return made;
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(made);
    Py_XDECREF(dev);
    return NULL;
}

#define MAP_BYTES 128   /* a CUtensorMap (`_kernels.tma.TENSOR_MAP_BYTES`) */
#define BUILT_MAX 64    /* `replay._BUILT_MAX` */

/* `_Step.build` for the operands at `ptrs`, where every tensor map's address was re-addressed before
 * (the maps' `seen` caches): the argument block in one bytes object (the kernel-argument array, one
 * pointer to the params, then the params: the template with the addresses written in), published in
 * `built` under `key` as the Python entry is: (argv address, then what holds it; only the address is
 * read, by either path, and the holders keep the memory while the entry is held). A new reference, or
 * NULL with no exception where a map has not been seen (`_Step.build` asks the driver), or with one. */
static PyObject *build_entry(PyObject *st, PyObject *ptrs, PyObject *key, PyObject *built) {
    PyObject *tpl = field(st, F_TEMPLATE), *pointers = field(st, F_POINTERS), *maps = field(st, F_MAPS);
    PyObject *buf = NULL, *entry = NULL, *addr = NULL;
    if (tpl == NULL || pointers == NULL || maps == NULL) goto done;
    if (!PyBytes_Check(tpl) || !PyTuple_Check(pointers) || !PyTuple_Check(maps)) goto bad;
    Py_ssize_t n = PyBytes_Size(tpl);
    if ((buf = PyBytes_FromStringAndSize(NULL, 8 + 63 + n)) == NULL) goto done;
    /* the params 64-byte aligned, as a CUtensorMap in them is declared (the driver copies them) */
    char *d = PyBytes_AsString(buf), *params = (char *)(((uintptr_t)d + 8 + 63) & ~(uintptr_t)63);
    memset(d, 0, (size_t)(8 + 63 + n));
    memcpy(params, PyBytes_AsString(tpl), (size_t)n);
    for (Py_ssize_t i = 0; i < PyTuple_Size(pointers) + PyTuple_Size(maps); i++) {
        int is_map = i >= PyTuple_Size(pointers);
        PyObject *e = is_map ? PyTuple_GetItem(maps, i - PyTuple_Size(pointers)) : PyTuple_GetItem(pointers, i);
        if (!PyTuple_Check(e) || PyTuple_Size(e) < (is_map ? 5 : 3)) goto bad;
        long long off = PyLong_AsLongLong(PyTuple_GetItem(e, 0)), delta = 0;
        Py_ssize_t slot = -1;
        if (PyErr_Occurred() || ((delta = PyLong_AsLongLong(PyTuple_GetItem(e, 2))) == -1 && PyErr_Occurred()) ||
            ((slot = PyLong_AsSsize_t(PyTuple_GetItem(e, 1))) == -1 && PyErr_Occurred()))
            goto done;
        unsigned long long base = 0;
        if (off < 0 || off + (is_map ? MAP_BYTES : 8) > n || slot < 0 || slot >= PyList_Size(ptrs) ||
            !as_u64(PyList_GetItem(ptrs, slot), &base)) goto bad;
        unsigned long long v = base + (unsigned long long)delta;
        if (!is_map) {
            memcpy(params + off, &v, 8);
            continue;
        }
        PyObject *seen = PyTuple_GetItem(e, 4);
        addr = PyLong_FromUnsignedLongLong(v);
        PyObject *m = addr && PyDict_Check(seen) ? PyDict_GetItemWithError(seen, addr) : NULL;  /* borrowed */
        Py_CLEAR(addr);
        if (m == NULL) goto done;  /* not seen (no exception): the Python build asks the driver */
        if (!PyBytes_Check(m) || PyBytes_Size(m) != MAP_BYTES) goto bad;
        memcpy(params + off, PyBytes_AsString(m), MAP_BYTES);
    }
    {
        unsigned long long pa = (unsigned long long)(uintptr_t)params;
        memcpy(d, &pa, 8);
        PyObject *argv = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)d);
        entry = argv ? PyTuple_Pack(3, argv, buf, buf) : NULL;
        Py_XDECREF(argv);
        if (entry == NULL) goto done;
        if (PyDict_Size(built) >= BUILT_MAX) PyDict_Clear(built);  /* many combinations: start over, bounded */
        if (PyDict_SetItem(built, key, entry) < 0) Py_CLEAR(entry);  /* whole before it is published */
    }
    goto done;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded launch of an unexpected form");
done:
    Py_XDECREF(buf);
    Py_XDECREF(tpl);
    Py_XDECREF(pointers);
    Py_XDECREF(maps);
    return entry;
}

/* Launch the recorded steps; returns the result or NULL with an exception. */
static PyObject *replay(PyObject *rep, Operand *ops, Py_ssize_t n, PyObject *ptrs, long device_id,
                        unsigned long long consumer, PyObject *consumer_o, PyObject *keep, int allocates) {
    PyObject *made = NULL, *result = NULL, *steps = NULL, *results = NULL, *allocations = NULL;
    allocations = field(rep, F_ALLOCATIONS);
    if (allocations == NULL) goto done;
    if (PyObject_IsTrue(allocations)) {
        PyObject *native = allocates ? field(rep, F_NATIVE) : NULL;  /* known outside capture */
        if (allocates && native == NULL) goto done;
        if (native != NULL && native != Py_None) {
            made = allocate_native(native, device_id, consumer_o, keep, ptrs);
        } else {
            PyObject *dev = PyLong_FromLong(device_id);
            PyObject *capturing = allocates ? Py_False : Py_None;
            made = dev ? PyObject_CallMethodObjArgs(rep, s_allocate, ptrs, dev, consumer_o, keep, capturing, NULL)
                       : NULL;
            Py_XDECREF(dev);
        }
        Py_XDECREF(native);
        if (made == NULL) goto done;
    }
    steps = field(rep, F_STEPS);
    if (steps == NULL || !PyList_Check(steps)) goto bad;
    for (Py_ssize_t s = 0; s < PyList_Size(steps); s++) {
        PyObject *st = PyList_GetItem(steps, s);
        PyObject *built = field(st, F_BUILT), *slots = field(st, F_SLOTS);
        PyObject *key = slots ? PyObject_CallFunctionObjArgs(slots, ptrs, NULL) : NULL;
        /* the entry (argv address, argv, params buffer) is held until the launch is queued: another
         * thread may drop it from `built` while this one waits for the driver without the GIL */
        PyObject *entry = key && built ? PyDict_GetItemWithError(built, key) : NULL;
        Py_XINCREF(entry);
        if (entry == NULL && !PyErr_Occurred() && key != NULL && built != NULL && PyDict_Check(built))
            entry = build_entry(st, ptrs, key, built);
        if (entry == NULL && !PyErr_Occurred() && key != NULL) {
            PyObject *dev = PyLong_FromLong(device_id);
            entry = dev ? PyObject_CallMethodObjArgs(st, s_build, ptrs, dev, NULL) : NULL;
            Py_XDECREF(dev);
        }
        unsigned long long argv = 0;
        int ok = entry != NULL && PyTuple_Check(entry) && PyTuple_Size(entry) == 3 &&
                 as_u64(PyTuple_GetItem(entry, 0), &argv);
        Py_XDECREF(built);
        Py_XDECREF(slots);
        Py_XDECREF(key);
        if (!ok) {
            Py_XDECREF(entry);
            goto bad;
        }
        PyObject *la = field(st, F_LAUNCH_ARGS);
        unsigned long long v[8];
        int okl = la != NULL && PyTuple_Check(la) && PyTuple_Size(la) == 8;
        for (int i = 0; okl && i < 8; i++) okl = as_u64(PyTuple_GetItem(la, i), &v[i]);
        Py_XDECREF(la);
        if (!okl) {
            Py_DECREF(entry);
            goto bad;
        }
        if (g_armed) {
            if (!g_first_ns) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                g_first_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            }
            g_launches++;
        }
        int err;
        launch_fn launch = g_launch;  /* read with the GIL held (set_driver may change it) */
        Py_BEGIN_ALLOW_THREADS
        err = launch((void *)(uintptr_t)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                       (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (void *)(uintptr_t)consumer,
                       (void **)(uintptr_t)argv, NULL);
        Py_END_ALLOW_THREADS
        Py_DECREF(entry);  /* the driver copied the params */
        if (err) {
            PyObject *e = PyLong_FromLong(err);
            PyObject *r = e ? PyObject_CallFunctionObjArgs(g_launch_failed, e, st, NULL) : NULL;
            Py_XDECREF(e);
            Py_XDECREF(r);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cuLaunchKernel failed");
            goto done;
        }
    }
    results = field(rep, F_RESULTS);
    PyObject *pair_o = field(rep, F_PAIR);
    int pair = pair_o == NULL ? -1 : PyObject_IsTrue(pair_o);
    Py_XDECREF(pair_o);
    if (results == NULL || !PyList_Check(results) || pair < 0) goto bad;
    Py_ssize_t nr = PyList_Size(results);
    PyObject *outs = PyTuple_New(nr);
    if (outs == NULL) goto done;
    for (Py_ssize_t i = 0; i < nr; i++) {
        long long slot = PyLong_AsLongLong(PyList_GetItem(results, i));
        PyObject *r = NULL;
        if (slot >= 0 && slot < n) {
            if (ops[slot].kind == K_CUDATTN || ops[slot].kind == K_JAX) {  /* the array, or JAX's adapted one */
                r = ops[slot].kind == K_JAX ? ops[slot].adapted : ops[slot].obj;
                Py_INCREF(r);
            } else if (ops[slot].kind != K_ABSENT) {
                r = wrap(&ops[slot]);
            }
        } else if (slot >= n && made != NULL && PyList_Check(made) && slot - n < PyList_Size(made)) {
            r = PyList_GetItem(made, slot - n);
            Py_XINCREF(r);
        }
        if (r == NULL) {
            Py_DECREF(outs);
            goto bad;
        }
        PyTuple_SetItem(outs, i, r);
    }
    if (pair) {
        result = outs;
    } else {
        result = PyTuple_GetItem(outs, 0);
        Py_XINCREF(result);
        Py_DECREF(outs);
    }
    goto done;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded call of an unexpected form");
done:
    Py_XDECREF(made);
    Py_XDECREF(steps);
    Py_XDECREF(results);
    Py_XDECREF(allocations);
    return result;
}

/* MISS, or NULL where a BaseException that is no ordinary error (a KeyboardInterrupt) is pending. */
static PyObject *miss(void) {
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear();
    }
    Py_INCREF(g_miss);
    return g_miss;
}

/* run(op, objs, names, stream, flags, key, out_index, more_outs, allocates) -> result or MISS */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9 || g_miss == NULL) {
        PyErr_SetString(PyExc_TypeError, "run() takes 9 arguments, after configure()");
        return NULL;
    }
    PyObject *op = args[0], *objs = args[1], *names = args[2], *stream = args[3], *flags = args[4], *ekey = args[5],
             *out_index_o = args[6], *more_outs = args[7];
    int allocates = PyObject_IsTrue(args[8]);
    int is_list = PyList_Check(objs);
    if (!(is_list || PyTuple_Check(objs)) || !PyTuple_Check(names) || !PyTuple_Check(flags) ||
        !PyTuple_Check(more_outs) || allocates < 0)
        return miss();
    Py_ssize_t n = is_list ? PyList_Size(objs) : PyTuple_Size(objs);
    if (n < 1 || n > MAX_OPERANDS || PyTuple_Size(names) < n) return miss();

    Operand ops[MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    Current cur;
    memset(&cur, 0, sizeof cur);
    PyObject *keep = NULL, *consumer_o = NULL, *key = NULL, *sig = NULL, *types = NULL, *rec = NULL, *rep = NULL,
             *ptrs = NULL, *result = NULL;
    unsigned long long consumer = 0;
    int st, miss_line = 0;

    /* The consumer stream (`operands.consumer_stream`) */
    PyObject *first = is_list ? PyList_GetItem(objs, 0) : PyTuple_GetItem(objs, 0);
    int jax_first = stream == Py_None && (PyObject *)Py_TYPE(first) != g_device_array && kind_of(first) == K_JAX;
    if (jax_first && jax_consumer(first, &consumer_o, &keep)) {  /* cudattn's stream on the array's device */
    } else if (jax_first) {  /* not known here: the Python rule, asked of it */
        if (PyErr_Occurred()) MISS();
        PyObject *r = PyObject_CallMethodObjArgs(g_operands_mod, s_consumer_stream, first, Py_None, NULL);
        if (r == NULL || !PyTuple_Check(r) || PyTuple_Size(r) != 3) {
            Py_XDECREF(r);
            MISS();
        }
        consumer_o = PyTuple_GetItem(r, 0);
        keep = PyTuple_GetItem(r, 1);
        Py_INCREF(consumer_o);
        Py_INCREF(keep);
        Py_DECREF(r);
    } else if (stream == Py_None) {
        st = read_operand(first, &ops[0], &cur, -1, NULL);
        if (st <= 0 || ops[0].kind == K_ABSENT) MISS();
        if (ops[0].kind == K_CUDATTN) {
            if (ops[0].stream == Py_None) MISS();  /* cudattn's default stream: the Python path */
            PyObject *owner = field(first, F_OWNER);
            if (owner == NULL) MISS();
            keep = owner == Py_None ? NULL : PyObject_GetAttr(owner, s_keep);
            Py_DECREF(owner);
            if (keep == NULL) {  /* getattr(owner, "keep", None) */
                soft_clear();
                if (PyErr_Occurred()) MISS();
                Py_INCREF(Py_None);
                keep = Py_None;
            }
        } else {
            Py_INCREF(cur.owner);
            keep = cur.owner;
        }
        Py_INCREF(ops[0].stream);
        consumer_o = ops[0].stream;
    } else if (PyLong_CheckExact(stream)) {
        Py_INCREF(stream);
        consumer_o = stream;
        Py_INCREF(Py_None);
        keep = Py_None;
    } else if (stream == g_fixed_stream) {  /* the stream object seen last, of a type whose handle is fixed */
        Py_INCREF(g_fixed_handle);
        consumer_o = g_fixed_handle;
        Py_INCREF(stream);
        keep = stream;
    } else {
        PyObject *ref = PyObject_CallFunctionObjArgs(g_as_stream, stream, Py_None, NULL);
        if (ref == NULL) MISS();
        consumer_o = PyObject_GetAttr(ref, s_handle);
        keep = PyObject_GetAttr(ref, s_obj);
        Py_DECREF(ref);
        if (consumer_o == NULL || keep == NULL) MISS();
        int fixed = PyLong_CheckExact(consumer_o) && keep == stream ? PySet_Contains(g_fixed_types, (PyObject *)Py_TYPE(stream)) : 0;
        if (fixed < 0) MISS();
        if (fixed) {  /* remembered while held here: its address cannot pass to another object meanwhile */
            PyObject *old_s = g_fixed_stream, *old_h = g_fixed_handle;
            Py_INCREF(stream);
            Py_INCREF(consumer_o);
            g_fixed_stream = stream;
            g_fixed_handle = consumer_o;
            Py_XDECREF(old_s);
            Py_XDECREF(old_h);
        }
    }
    if (!as_u64(consumer_o, &consumer) || consumer > (unsigned long long)LLONG_MAX) MISS();
    if (stream != Py_None || jax_first) {
        st = read_operand(first, &ops[0], &cur, (long long)consumer, PyTuple_GetItem(names, 0));
        if (st < 0) goto out_error;
        if (st == 0 || ops[0].kind == K_ABSENT) MISS();
    }

    /* The operands, their part of the signature; every one made on the call's stream */
    sig = PyTuple_New(n);
    if (sig == NULL) goto out_error;
    for (Py_ssize_t i = 0; i < n; i++) {
        Operand *a = &ops[i];
        if (i > 0) {
            st = read_operand(is_list ? PyList_GetItem(objs, i) : PyTuple_GetItem(objs, i), a, &cur,
                              (long long)consumer, PyTuple_GetItem(names, i));
            if (st < 0) goto out_error;
            if (st == 0) MISS();
        }
        if (a->kind == K_ABSENT) {
            Py_INCREF(Py_None);
            PyTuple_SetItem(sig, i, Py_None);
            continue;
        }
        if (a->stream != Py_None) {
            unsigned long long h;
            if (!as_u64(a->stream, &h) || h != consumer) MISS();  /* a producer to wait for: Python */
        }
        PyObject *dev = PyLong_FromLong(a->device_id);
        PyObject *e = dev ? PyTuple_Pack(6, (PyObject *)Py_TYPE(a->obj), a->shape, a->strides, a->dtype, dev,
                                         a->readonly) : NULL;
        Py_XDECREF(dev);
        if (e == NULL) goto out_error;
        PyTuple_SetItem(sig, i, e);
    }

    /* The key, as `Call.run` builds it */
    {
        Py_ssize_t nf = PyTuple_Size(flags);
        types = PyTuple_New(nf);
        if (types == NULL) goto out_error;
        for (Py_ssize_t i = 0; i < nf; i++) {
            PyObject *t = (PyObject *)Py_TYPE(PyTuple_GetItem(flags, i));
            Py_INCREF(t);
            PyTuple_SetItem(types, i, t);
        }
        PyObject *forced = PyObject_GetAttr(g_traits_mod, s_forced);
        PyObject *margin = forced ? PyObject_GetAttr(g_margin_local, s_n) : NULL;
        PyObject *shift = margin ? PyObject_GetAttr(g_shift_local, s_n) : NULL;
        if (shift != NULL)
            key = PyTuple_Pack(8, op, sig, flags, types, ekey, forced, margin, shift);
        Py_XDECREF(forced);
        Py_XDECREF(margin);
        Py_XDECREF(shift);
        if (key == NULL) MISS();
    }
    {
        int recording = attr_true(g_recording_mod, s_active);
        if (recording != 0) MISS();  /* inside a recording: the Python path */
        PyObject *plans = PyObject_GetAttr(g_call_mod, s_plans);
        if (plans == NULL) MISS();
        rec = PyObject_CallMethodObjArgs(plans, s_get, key, NULL);  /* a dict, or a test's stand-in */
        Py_DECREF(plans);
        if (rec == NULL || (PyObject *)Py_TYPE(rec) != g_recorded_call) MISS();
    }
    if (!bound()) MISS();
    unsigned long long p[MAX_OPERANDS];  /* the addresses, checked first: they need no context */
    ptrs = PyList_New(n);
    if (ptrs == NULL) goto out_error;
    for (Py_ssize_t i = 0; i < n; i++) {
        p[i] = ops[i].kind == K_ABSENT ? 0 : ops[i].ptr;
        PyObject *v = PyLong_FromUnsignedLongLong(p[i]);
        if (v == NULL) goto out_error;
        PyList_SetItem(ptrs, i, v);
    }
    if (plain(rec, p, n) != 1) MISS();
    if (consumer <= 2) {  /* handles 0-2 name the current context's streams: the operands' device's */
        PyObject *dev = PyLong_FromLong(ops[0].device_id);
        PyObject *r = dev ? PyObject_CallMethodObjArgs(g_device_mod, s_get_device, dev, NULL) : NULL;
        Py_XDECREF(dev);
        if (r == NULL) goto out_error;
        Py_DECREF(r);
    }
    if (allocates) {
        int status = 0;
        int err;
        capturing_fn capturing = g_capturing;
        Py_BEGIN_ALLOW_THREADS
        err = capturing((void *)(uintptr_t)consumer, &status);
        Py_END_ALLOW_THREADS
        if (err || status) MISS();  /* the Python path says why */
    }
    rep = field(rec, F_REPLAY);
    if (rep == NULL) MISS();

    /* From here on, the call's work: errors are raised */
    result = replay(rep, ops, n, ptrs, ops[0].device_id, consumer, consumer_o, keep, allocates);
    if (result == NULL) goto out_error;
    {
        long oi = out_index_o == Py_None ? -1 : PyLong_AsLong(out_index_o);
        if (oi == -1 && PyErr_Occurred()) goto out_error;
        Py_ssize_t nm = PyTuple_Size(more_outs);
        for (Py_ssize_t j = -1; j < nm; j++) {
            long i = j < 0 ? oi : PyLong_AsLong(PyTuple_GetItem(more_outs, j));
            if (i == -1 && PyErr_Occurred()) goto out_error;
            if (i >= 0 && i < n && (ops[i].kind == K_CUDATTN || ops[i].kind == K_JAX) &&
                PyObject_SetAttr(ops[i].kind == K_JAX ? ops[i].adapted : ops[i].obj, s_stream_handle, consumer_o) < 0)
                goto out_error;
        }
        /* a foreign `out` is returned wrapped: the wrapper carries the call's stream (set in `wrap` from the
         * operand's stream, the consumer's) */
    }
    {  /* JAX arrays (their capsules) held until the call's work is done (`operands.order_and_hold`) */
        Py_ssize_t nh = 0;
        for (Py_ssize_t i = 0; i < n; i++) nh += ops[i].kind == K_JAX;
        if (nh) {
            PyObject *held = PyTuple_New(nh), *dev = PyLong_FromLong(ops[0].device_id);
            if (held == NULL || dev == NULL) {
                Py_XDECREF(held);
                Py_XDECREF(dev);
                goto out_error;
            }
            for (Py_ssize_t i = 0, j = 0; i < n; i++) {
                if (ops[i].kind != K_JAX) continue;
                Py_INCREF(ops[i].adapted);
                PyTuple_SetItem(held, j++, ops[i].adapted);
            }
            PyObject *r = PyObject_CallMethodObjArgs(g_lifetime_mod, s_hold, consumer_o, held, dev,
                                                     allocates ? Py_False : Py_None, NULL);
            Py_DECREF(held);
            Py_DECREF(dev);
            if (r == NULL) goto out_error;
            Py_DECREF(r);
        }
    }
    {
        int pending = attr_true(g_lifetime_mod, s_pending);
        if (pending < 0) goto out_error;
        if (pending) {
            PyObject *r = PyObject_CallMethodObjArgs(g_lifetime_mod, s_release_done, NULL);
            if (r == NULL) goto out_error;
            Py_DECREF(r);
        }
    }
    g_served++;
    goto out;

out_miss:  /* nothing done: the Python path runs the call, and gives the context back itself */
    g_missed[miss_line % MISS_LINES]++;
    Py_CLEAR(result);
    result = miss();  /* NULL: an interrupt to raise */
    goto out;
out_error:
    Py_CLEAR(result);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: warm call failed");
out:
    for (Py_ssize_t i = 0; i < n; i++) operand_clear(&ops[i]);
    Py_XDECREF(cur.handle);
    Py_XDECREF(cur.owner);
    Py_XDECREF(keep);
    Py_XDECREF(consumer_o);
    Py_XDECREF(key);
    Py_XDECREF(sig);
    Py_XDECREF(types);
    Py_XDECREF(rec);
    Py_XDECREF(rep);
    Py_XDECREF(ptrs);
    /* the thread's context as the caller had it (`_runtime.device`), once the call did its work */
    if (result != g_miss) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int pending = attr_true(g_device_mod, s_pending);
        if (pending > 0) {
            PyObject *r = PyObject_CallMethodObjArgs(g_device_mod, s_restore, NULL);
            if (r == NULL) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                Py_CLEAR(result);
                return NULL;
            }
            Py_DECREF(r);
        } else if (pending < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(et, ev, tb);
    }
    return result;
}

/* configure(dict): the objects `run` works with (see warm.py). */
static PyObject *configure(PyObject *self, PyObject *d) {
    (void)self;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes a dict");
        return NULL;
    }
    struct { const char *name; PyObject **slot; } items[] = {
        {"miss", &g_miss}, {"device_array", &g_device_array}, {"recorded_call", &g_recorded_call},
        {"call_module", &g_call_mod}, {"traits_module", &g_traits_mod}, {"margin_local", &g_margin_local},
        {"shift_local", &g_shift_local}, {"recording_module", &g_recording_mod}, {"lifetime_module", &g_lifetime_mod},
        {"device_module", &g_device_mod}, {"accessors_module", &g_accessors_mod}, {"importer_module", &g_importer_mod},
        {"as_stream", &g_as_stream}, {"cupy_stream", &g_cupy_stream}, {"launch_failed", &g_launch_failed},
        {"bound_hook", &g_bound_hook}, {"bind", &g_bind}, {"object_new", &g_object_new},
        {"known_jax_module", &g_known_jax_mod}, {"operands_module", &g_operands_mod}, {"jax_seen", &g_jax_seen},
        {"default_stream_refs", &g_default_refs}, {"alloc_module", &g_alloc_mod},
        {"stream_memory_module", &g_stream_memory_mod}, {"fixed_handle_types", &g_fixed_types},
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        PyObject *v = PyDict_GetItemString(d, items[i].name);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "configure(): %s missing", items[i].name);
            return NULL;
        }
        Py_INCREF(v);
        PyObject *old = *items[i].slot;
        *items[i].slot = v;
        Py_XDECREF(old);
    }
    PyObject *owners[4] = {g_device_array, g_recorded_call, PyDict_GetItemString(d, "replay_class"),
                           PyDict_GetItemString(d, "step_class")};
    int first[5] = {F_PTR, F_REPLAY, F_ALLOCATIONS, F_BUILT, F_COUNT};
    for (int c = 0; c < 4; c++) {
        if (owners[c] == NULL) {
            PyErr_SetString(PyExc_KeyError, "configure(): replay_class and step_class missing");
            return NULL;
        }
        for (int f = first[c]; f < first[c + 1]; f++) {
            PyObject *descr = PyObject_GetAttrString(owners[c], g_field_names[f]);
            descrgetfunc get = descr ? (descrgetfunc)PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_get) : NULL;
            descrsetfunc set = descr ? (descrsetfunc)PyType_GetSlot(Py_TYPE(descr), Py_tp_descr_set) : NULL;
            if (get == NULL || set == NULL || (g_member_get != NULL && get != g_member_get) ||
                (g_member_set != NULL && set != g_member_set)) {  /* slots, all of them */
                Py_XDECREF(descr);
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_TypeError, "configure(): %s is no slot", g_field_names[f]);
                return NULL;
            }
            Py_XDECREF(g_fields[f]);
            g_fields[f] = descr;
            g_member_get = get;
            g_member_set = set;
        }
    }
    g_unbound = 1;
    g_launch = NULL;
    g_capturing = NULL;
    unbind_events();
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* set_driver(launch, is_capturing): entry-point addresses (a test's stand-ins); 0, 0 asks `bind` again. */
static PyObject *set_driver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned long long l, c;
    if (nargs != 2 || !as_u64(args[0], &l) || !as_u64(args[1], &c)) {
        PyErr_SetString(PyExc_TypeError, "set_driver(launch: int, is_capturing: int)");
        return NULL;
    }
    g_launch = (launch_fn)(uintptr_t)l;
    g_capturing = (capturing_fn)(uintptr_t)c;
    g_unbound = !(l && c);
    unbind_events();  /* bound again with the real ones, from `bind`, once `set_driver(0, 0)` */
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The event calls of `_arrays.lifetime`, on integer handles, each returning the CUresult as an int
 * (`capture_mode`: (CUresult, the mode before)). Reachable only after `bound` (`bound_hook`). */
static PyObject *event_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned long long ev, st;
    if (nargs != 2 || !as_u64(args[0], &ev) || !as_u64(args[1], &st) || g_record == NULL) {
        PyErr_SetString(PyExc_TypeError, "event_record(event: int, stream: int), once bound");
        return NULL;
    }
    record_fn record = g_record;
    int err;
    Py_BEGIN_ALLOW_THREADS  /* a full launch queue can hold the record */
    err = record((void *)(uintptr_t)ev, (void *)(uintptr_t)st);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *event_query(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long ev;
    if (!as_u64(arg, &ev) || g_query == NULL) {
        PyErr_SetString(PyExc_TypeError, "event_query(event: int), once bound");
        return NULL;
    }
    return PyLong_FromLong(g_query((void *)(uintptr_t)ev));
}

static PyObject *capture_mode(PyObject *self, PyObject *arg) {
    (void)self;
    long mode = PyLong_Check(arg) ? PyLong_AsLong(arg) : -1;
    if (mode < 0 || mode > 2 || g_exchange == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "capture_mode(mode: 0, 1 or 2), once bound");
        return NULL;
    }
    int m = (int)mode;
    int err = g_exchange(&m);
    return Py_BuildValue("(ii)", err, m);
}

/* bind() -> whether the driver's entry points are in place, asking `bind` for them if not yet */
static PyObject *bind_now(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (g_bind == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind() after configure()");
        return NULL;
    }
    int ok = bound();
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* arm_stamp(on): note the time of the first launch after each take_stamp, and count launches. */
static PyObject *arm_stamp(PyObject *self, PyObject *on) {
    (void)self;
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    g_armed = v;
    g_first_ns = 0;
    g_launches = 0;
    Py_RETURN_NONE;
}

/* take_stamp() -> (perf_counter_ns of the first launch since the last take, or None; launches so far) */
static PyObject *take_stamp(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long long first = g_first_ns;
    g_first_ns = 0;
    if (first) return Py_BuildValue("(LL)", first, g_launches);
    return Py_BuildValue("(OL)", Py_None, g_launches);
}

/* stats(reset=False) -> (calls served, {source line: misses}) */
static PyObject *stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (int i = 0; i < MISS_LINES; i++) {
        if (!g_missed[i]) continue;
        PyObject *k = PyLong_FromLong(i), *v = PyLong_FromLongLong(g_missed[i]);
        if (!k || !v || PyDict_SetItem(d, k, v)) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    PyObject *r = Py_BuildValue("(LN)", g_served, d);
    if (nargs > 0 && PyObject_IsTrue(args[0]) == 1) {
        g_served = 0;
        memset(g_missed, 0, sizeof g_missed);
    }
    return r;
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL,
     "stats(reset=False) -> (calls served, {source line of _warm.c: calls sent back to the Python path})"},
    {"arm_stamp", arm_stamp, METH_O, "arm_stamp(on: bool): stamp the first launch after each take_stamp()"},
    {"take_stamp", take_stamp, METH_NOARGS, "take_stamp() -> (first launch's perf_counter_ns or None, launches)"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(op, objs, names, stream, flags, key, out_index, more_outs, allocates) -> result, or MISS"},
    {"configure", configure, METH_O, "configure(objects: dict)"},
    {"bind", bind_now, METH_NOARGS, "bind() -> whether the driver's entry points are in place (asked for if not)"},
    {"event_record", (PyCFunction)(void (*)(void))event_record, METH_FASTCALL,
     "event_record(event, stream) -> CUresult of cuEventRecord"},
    {"event_query", event_query, METH_O, "event_query(event) -> CUresult of cuEventQuery"},
    {"capture_mode", capture_mode, METH_O,
     "capture_mode(mode) -> (CUresult, the thread's mode before) of cuThreadExchangeStreamCaptureMode"},
    {"set_driver", (PyCFunction)(void (*)(void))set_driver, METH_FASTCALL, "set_driver(launch, is_capturing)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_warm", "The warm call, compiled (see warm.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__warm(void) {
    INTERN(s_ptr, "ptr"); INTERN(s_shape, "shape"); INTERN(s_strides, "strides"); INTERN(s_dtype, "dtype");
    INTERN(s_device_id, "device_id"); INTERN(s_readonly, "readonly"); INTERN(s_stream_handle, "stream_handle");
    INTERN(s_owner, "owner"); INTERN(s_keep, "keep"); INTERN(s_plans, "_plans"); INTERN(s_forced, "FORCED_FAMILY");
    INTERN(s_n, "n"); INTERN(s_active, "active"); INTERN(s_pending, "pending"); INTERN(s_release_done, "release_done");
    INTERN(s_restore, "restore_caller_context"); INTERN(s_torch_plain, "_torch_plain");
    INTERN(s_torch_layouts, "_torch_layouts"); INTERN(s_cupy_layouts, "_cupy_layouts");
    INTERN(s_cupy_types, "_cupy_types"); INTERN(s_torch_stream, "_torch_stream"); INTERN(s_stride, "stride");
    INTERN(s_is_cuda, "is_cuda"); INTERN(s_is_neg, "is_neg"); INTERN(s_data_ptr, "data_ptr");
    INTERN(s_get_device, "get_device"); INTERN(s_data, "data"); INTERN(s_handle, "handle"); INTERN(s_obj, "obj");
    INTERN(s_allocate, "_allocate"); INTERN(s_build, "build"); INTERN(s_get, "get");
    INTERN(s_kinds, "KINDS"); INTERN(s_recall, "recall"); INTERN(s_consumer_stream, "consumer_stream");
    INTERN(s_hold, "hold"); INTERN(s_dlpack, "__dlpack__"); INTERN(s_stream, "stream");
    INTERN(s_allocate_block, "allocate"); INTERN(s_counters, "counters"); INTERN(s_workspace, "workspace");
    if ((g_empty = PyTuple_New(0)) == NULL) return NULL;
    return PyModule_Create(&module);
}
