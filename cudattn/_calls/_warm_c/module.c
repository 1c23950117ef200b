/* The module: the state `configure` hands over, the interned names, the method table, the init. */
#include "warm.h"

/* Benchmarks' stamp of the first launch (`arm_stamp`, `take_stamp`): CLOCK_MONOTONIC, time.perf_counter_ns's clock. */
int g_armed;
long long g_first_ns, g_launches;

/* Calls served, and misses by the source line that sent them back (`stats`): for tests and diagnosis. */
long long g_served, g_missed[MISS_LINES];

launch_fn g_launch;
capturing_fn g_capturing;
/* the event calls of `_arrays.lifetime` (`event_record`, `event_query`, `capture_mode`), once bound */
record_fn g_record;
query_fn g_query;
exchange_fn g_exchange;
int g_unbound = 1;  /* driver entry points not asked for yet (or set to none) */
int g_configured;

/* Objects `configure` hands over (strong references, kept for the process). */
PyObject *g_known_jax_mod, *g_operands_mod;  /* `recall`, `consumer_stream`: looked up per call */
PyObject *g_alloc_mod, *g_stream_memory_mod;  /* `_arrays.alloc`, `.stream_memory`: looked up per call */
PyObject *g_jax_seen, *g_default_refs, *g_empty;  /* `known_jax._seen`, `stream._default_stream_refs`, () */
PyObject *g_miss, *g_device_array, *g_recorded_call, *g_call_mod, *g_traits_mod, *g_margin_local,
    *g_shift_local, *g_recording_mod, *g_lifetime_mod, *g_device_mod, *g_accessors_mod, *g_importer_mod,
    *g_as_stream, *g_cupy_stream, *g_launch_failed, *g_bind, *g_bound_hook, *g_object_new;
PyObject *g_handle_attr_types;  /* `stream.HANDLE_ATTR_TYPES` */
PyObject *g_stream_mod, *g_note_torch;  /* `_runtime.stream` (its sets read each call), `.note_torch_stream` */
PyObject *g_alloc_allocate, *g_sm_counters, *g_sm_workspace, *g_block_class, *g_zero;
PyObject *g_lifetime_hold, *g_lifetime_release;

/* Interned attribute names. */
PyObject *s_ptr, *s_shape, *s_strides, *s_dtype, *s_device_id, *s_readonly, *s_stream_handle, *s_owner,
    *s_keep, *s_plans, *s_forced, *s_n, *s_active, *s_pending, *s_release_done, *s_restore, *s_torch_plain,
    *s_torch_layouts, *s_cupy_layouts, *s_cupy_types, *s_torch_stream, *s_stride, *s_is_cuda, *s_is_neg,
    *s_data_ptr, *s_get_device, *s_data, *s_handle, *s_obj, *s_allocate, *s_build, *s_get, *s_kinds, *s_recall,
    *s_consumer_stream, *s_hold, *s_dlpack, *s_stream, *s_allocate_block, *s_counters, *s_workspace,
    *s_cuda_stream, *s_kept, *s_kept_bytes, *s_kept_lock, *s_acquire, *s_release, *s_blocks, *s_nbytes,
    *s_workspace_kept_max, *s_lasting_streams, *s_stream_module, *s_torch_external, *s_export,
    *s_fully_replicated_shard, *s_stream_wait, *s_sid, *s_free_events, *s_held, *s_lock, *s_append, *s_popleft;

const char *g_field_names[F_COUNT] = {
    "ptr", "shape", "strides", "dtype", "device_id", "readonly", "stream_handle", "owner",
    "replay", "nonempty", "out_index", "out_span", "inputs", "more",
    "allocations", "steps", "results", "pair", "native",
    "built", "slots", "launch_args", "template", "pointers", "maps",
    "ptr", "nbytes", "stream", "keep", "ctx", "device_id",
};
PyObject *g_fields[F_COUNT];
descrgetfunc g_member_get;
descrsetfunc g_member_set;

/* configure(dict): the objects `run` works with (see warm.py). */
static PyObject *configure(PyObject *self, PyObject *d) {
    (void)self;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes a dict");
        return NULL;
    }
    g_configured = 0;  /* until every object below is in place: no entry point reads a half-made state */
    struct { const char *name; PyObject **slot; } items[] = {
        {"miss", &g_miss}, {"device_array", &g_device_array}, {"recorded_call", &g_recorded_call},
        {"call_module", &g_call_mod}, {"traits_module", &g_traits_mod}, {"margin_local", &g_margin_local},
        {"shift_local", &g_shift_local}, {"recording_module", &g_recording_mod}, {"lifetime_module", &g_lifetime_mod},
        {"device_module", &g_device_mod}, {"accessors_module", &g_accessors_mod}, {"importer_module", &g_importer_mod},
        {"as_stream", &g_as_stream}, {"cupy_stream", &g_cupy_stream}, {"launch_failed", &g_launch_failed},
        {"bound_hook", &g_bound_hook}, {"bind", &g_bind}, {"object_new", &g_object_new},
        {"known_jax_module", &g_known_jax_mod}, {"operands_module", &g_operands_mod}, {"jax_seen", &g_jax_seen},
        {"default_stream_refs", &g_default_refs}, {"alloc_module", &g_alloc_mod},
        {"stream_memory_module", &g_stream_memory_mod}, {"handle_attr_types", &g_handle_attr_types},
        {"stream_module", &g_stream_mod}, {"note_torch_stream", &g_note_torch},
        {"alloc_allocate", &g_alloc_allocate}, {"stream_memory_counters", &g_sm_counters},
        {"stream_memory_workspace", &g_sm_workspace}, {"block_class", &g_block_class},
        {"lifetime_hold", &g_lifetime_hold}, {"lifetime_release_done", &g_lifetime_release},
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
    PyObject *owners[5] = {g_device_array, g_recorded_call, PyDict_GetItemString(d, "replay_class"),
                           PyDict_GetItemString(d, "step_class"), g_block_class};
    int first[6] = {F_PTR, F_REPLAY, F_ALLOCATIONS, F_BUILT, F_B_PTR, F_COUNT};
    for (int c = 0; c < 5; c++) {
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
    g_configured = 1;
    Py_RETURN_NONE;
}


/* stats(reset=False) -> (calls served, {source line: misses}) */
static PyObject *stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int reset = nargs > 0 ? PyObject_IsTrue(args[0]) : 0;  /* asked first: its error is the caller's */
    if (reset < 0) return NULL;
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
    if (r != NULL && reset) {
        g_served = 0;
        memset(g_missed, 0, sizeof g_missed);
    }
    return r;
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL,
     "stats(reset=False) -> (calls served, {source line of run.c: calls sent back to the Python path})"},
    {"arm_stamp", arm_stamp, METH_O, "arm_stamp(on: bool): stamp the first launch after each take_stamp()"},
    {"take_stamp", take_stamp, METH_NOARGS, "take_stamp() -> (first launch's perf_counter_ns or None, launches)"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(op, objs, names, stream, flags, key, out_index, more_outs, allocates) -> result, or MISS"},
    {"configure", configure, METH_O, "configure(objects: dict)"},
    {"signature", (PyCFunction)(void (*)(void))signature_py, METH_FASTCALL,
     "signature(sig, flags) -> bytes: a call signature's operand part and its flags' types, as run() keys them"},
    {"bind", bind_now, METH_NOARGS, "bind() -> whether the driver's entry points are in place (asked for if not)"},
    {"event_record", (PyCFunction)(void (*)(void))event_record, METH_FASTCALL,
     "event_record(event, stream) -> CUresult of cuEventRecord"},
    {"event_query", event_query, METH_O, "event_query(event) -> CUresult of cuEventQuery"},
    {"capture_mode", capture_mode, METH_O,
     "capture_mode(mode) -> (CUresult, the thread's mode before) of cuThreadExchangeStreamCaptureMode"},
    {"set_driver", (PyCFunction)(void (*)(void))set_driver, METH_FASTCALL, "set_driver(launch, is_capturing)"},
    {"hold", (PyCFunction)(void (*)(void))hold_py, METH_FASTCALL,
     "hold(consumer, refs, device, outside_capture): lifetime.hold as a warm call makes it (tests)"},
    {"release_holds", release_py, METH_NOARGS, "release_holds(): lifetime.release_done as a warm call makes it (tests)"},
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
    INTERN(s_cuda_stream, "cuda_stream"); INTERN(s_kept, "_kept"); INTERN(s_kept_bytes, "_kept_bytes");
    INTERN(s_kept_lock, "_kept_lock"); INTERN(s_acquire, "acquire"); INTERN(s_release, "release");
    INTERN(s_blocks, "_blocks"); INTERN(s_nbytes, "nbytes"); INTERN(s_workspace_kept_max, "WORKSPACE_KEPT_MAX");
    INTERN(s_lasting_streams, "LASTING_STREAMS"); INTERN(s_stream_module, "_stream");
    INTERN(s_torch_external, "TORCH_EXTERNAL"); INTERN(s_export, "_export");
    INTERN(s_fully_replicated_shard, "_fully_replicated_shard"); INTERN(s_stream_wait, "stream_wait");
    INTERN(s_sid, "sid"); INTERN(s_free_events, "_free_events"); INTERN(s_held, "_held"); INTERN(s_lock, "_lock");
    INTERN(s_append, "append"); INTERN(s_popleft, "popleft");
    if ((g_empty = PyTuple_New(0)) == NULL) return NULL;
    if ((g_zero = PyLong_FromLong(0)) == NULL) return NULL;
    return PyModule_Create(&module);
}
